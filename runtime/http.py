"""The HTTP and WebSocket API (``docs/http-api.md``) and the Effects pane, as a Starlette app.

`create_app` builds the application; the `runtime.Runtime` is created and started in the
app's lifespan and closed (with its shutdown grace) when the server stops. `runtime.serve`
(``server.py``, ``thread-effects serve``) only parses options and runs uvicorn's server
as `Server` (the runtime closes before the connections, so streams get their last frames)
with `server_options` (header, keep-alive and WebSocket close timeouts).

Every route lives here in one style: the built-in thread, run, effect and agent routes,
a thread's messages (`message_routes`) and the app's file-routed thread endpoints
(`thread_endpoint_routes`; `runtime.endpoints` discovers them). They share one runtime
getter (``app.state.runtime``), one body reader (`read_body`/`read_json`/`read_object`:
``Content-Length`` checked first, a chunked body read only up to the limit, JSON parsed
with the limits of `runtime._limits`) and one error mapping (`ApiError`, and
`runtime._http_errors.runtime_error_status` for runtime errors). `BodyLimitMiddleware`
bounds the body of every route, the host's own included.

Guards, in this order, on every request:

1. *Host* (only when ``trusted_hosts`` is given — ``server.py`` does for loopback without a
   token): the ``Host`` header must name one of them, so a DNS-rebinding page cannot talk to
   a server on 127.0.0.1 as if it were its own origin.
2. *Origin*: a browser request that changes something (POST, DELETE, …) or opens the
   WebSocket must come from the server's own origin. Other clients send no ``Origin``.
3. *Token* (when ``api_token`` is set): every ``/api/...`` path (the WebSocket too) and
   every other route (``extra_routes``, such as a webhook, and ``/metrics``) need it; the
   pane's static files (``/``, ``/web/...``) and the probes ``/api/health`` and
   ``/api/ready`` do not (they hold no data), and a path outside ``/api/`` that no route
   serves is answered a JSON 404 without it.

Errors are JSON ``{"error": {"code": "<snake_case>", "message": "..."}}``; the WebSocket is
refused by closing it with a 44xx code after accepting (browsers cannot see an HTTP status
of a refused handshake): 4400 malformed thread id, 4401 token, 4403 origin or host, 4404
unknown thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.applications import Starlette
from starlette.datastructures import Headers, QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage
from starlette.websockets import WebSocket, WebSocketDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State as WebSocketState

from runtime._http_errors import error_response, runtime_error_status
from runtime._limits import (
    cut,
    delay_seconds,
    instant_seconds,
    may_hold_surrogates,
    parse_json,
    run_at_seconds,
)
from runtime._limits import quoted as _quoted
from runtime._text import NUL, find_invalid_text, no_nul_message
from runtime.alarms import Clock
from runtime.config import Settings
from runtime.effect_records import listed_record_json
from runtime.effects import iso
from runtime.endpoints import REST_PARAM, ThreadEndpoint, discover_thread_endpoints
from runtime.errors import (
    AgentNotFound,
    DatabaseUnavailable,
    EffectsError,
    InvalidDelay,
    InvalidThreadId,
    RuntimeClosed,
    SubscriptionOverflow,
    ThreadNotFound,
    ThreadStorageError,
)
from runtime.frames import Subscription, ThreadEvent
from runtime.ids import validate_thread_id
from runtime.messages import MAX_CONTENT_CHARS
from runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from runtime.metrics import RuntimeMetrics
from runtime.recurrence import Recurrence
from runtime.storage.base import ThreadInfo
from runtime.storage.records import MAX_PAGE as MAX_RECORDS_PAGE
from runtime.supervisor import Runtime
from runtime.telemetry import TRACER_NAME
from runtime.thread import ThreadState

log = logging.getLogger("runtime.http")

DEFAULT_WEB_DIR = Path(__file__).resolve().parent.parent / "web"
"""The pane's static files in a source checkout (``<repo>/web``)."""

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
"""Largest request body read (2 MiB); a larger one is refused with 413 before parsing."""

BODY_IDLE_TIMEOUT_SECONDS = 30.0
"""A request body that sends nothing for this long is answered 408 and dropped."""

BODY_TIMEOUT_SECONDS = 60.0
"""A whole request body must arrive within this long of its first read, else 408 (so a
client dripping a byte at a time cannot hold a connection open)."""

HEADER_TIMEOUT_SECONDS = 10.0
"""A connection must send a complete request head this soon after it opens (or after its
previous answer), else it is closed (`server_options`)."""

KEEP_ALIVE_SECONDS = 5
"""An idle keep-alive connection is closed after this long (uvicorn's own timer)."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""Host names a loopback-only server answers to (see the *Host* guard above)."""

CLOSE_INVALID_THREAD_ID = 4400
CLOSE_POLICY = 4403
CLOSE_TOKEN = 4401
CLOSE_UNKNOWN_THREAD = 4404
CLOSE_THREAD_STORAGE = 4500  # the thread's file cannot be used (HTTP: 500 thread_storage_error)
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_SERVICE_RESTART = 1012

WS_CLOSE_REASON_BYTES = 123
"""Longest close reason a WebSocket close frame can carry, in bytes of UTF-8."""

WS_CLOSE_TIMEOUT_SECONDS = 10.0

WS_PING_INTERVAL_SECONDS = 20.0
"""Seconds between the server's keepalive pings on each WebSocket (uvicorn's default)."""
WS_PING_TIMEOUT_SECONDS = 20.0
"""Seconds a WebSocket has to answer a keepalive ping before it is closed (1011)."""

FRAME_BATCH_SECONDS = 0.05
"""After a write round to a thread's stream clients, the next one comes at most this much
later (seconds; earlier once a quarter of a client's queue is pending): frames published
meanwhile go out together, in one socket write per client. After a quiet spell the next
frame goes out at once. With more than 100 clients the bound grows with their number
(`frame_batch_seconds`)."""

FRAME_BATCH_SECONDS_PER_CLIENT = 0.0005
"""How much later the next write round may come per client of the thread (seconds): a
round costs one socket write per client (≈ 10 to 20 µs of the event loop each, nearly
whatever it carries), so with many clients rounds come less often (`frame_batch_seconds`)."""

FRAME_BATCH_MAX_SECONDS = 0.25
"""The longest a frame waits for its write round, whatever the number of clients (seconds;
earlier once a quarter of a client's queue is pending)."""

FANOUT_SLICE_CLIENTS = 32
"""A thread's write round lets the event loop run what is ready after writing to this many
clients (about 0.5 to 1 ms of the loop): a round to hundreds of clients does not hold up
the runs (a schedule's commit coming back, a drain's next step), the other threads' frames
and the HTTP requests for its whole length."""

SEND_FRAMES_EXTENSION = "thread_effects.send_frames"
"""The ASGI scope extension of this server's WebSocket protocol (`server_options`): its
``"writable"`` is ``writable() -> bool`` (whether the socket takes more now, i.e. its
transport is not paused by flow control; raises ``ClientDisconnected`` once the connection
is closed or closing) and its ``"write"`` is ``write(wire: bytes, payloads: list[bytes])``,
which writes the text messages ``wire`` holds (each payload framed, unmasked, in order) in
one socket write, or sends each payload itself when an extension (compression) changes
the bytes. Without it (another server, the test client), a stream sends its frames one
``send_text`` at a time."""
# How long a request cancelled at the end of the shutdown grace period has to answer 503.
REQUEST_CANCEL_SECONDS = 2.0
"""How long the stream waits to get its close frame (or last frames) out to a client."""

_CLOSE = {"Connection": "close"}  # the rest of the body is not read: end the connection
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_THREAD_FIELDS = frozenset({"id", "agent_id", "user_id", "tags"})
_SCHEDULE_FIELDS = frozenset({"name", "args", "delay_seconds", "key", "run_at"})
_MESSAGE_FIELDS = frozenset({"content", "run_id"})
_CANCEL_FIELDS = frozenset({"by"})
_RECURRING_FIELDS = frozenset({"name", "args", "cron", "timezone", "every_seconds", "key"})

MAX_MESSAGE_BODY_BYTES = 1 << 20
"""Largest ``POST .../messages`` body (1 MiB)."""

_MESSAGES_PATH = re.compile(r"^/api/threads/[^/]+/messages/?\Z")


class ApiError(Exception):
    """An HTTP error answer: ``status`` with the JSON body ``{"error": {code, message}}``.

    Args:
        status: The HTTP status.
        code: The snake_case error code.
        message: Text for people, naming the thing and the limit.
        headers: Extra response headers (``Connection: close`` when the rest of a body
            will not be read).
    """

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        super().__init__(message)


# --------------------------------------------------------------------------- guards


def _host_name(host: str) -> str:
    """``"[::1]:8000"`` → ``"::1"``, ``"Example.org:80"`` → ``"example.org"``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


_PROBES = frozenset({"/api/health", "/api/ready"})


def _is_public_path(path: str) -> bool:
    # The probes hold no data: a load balancer or an orchestrator asks them without a token.
    return path == "/" or path.startswith("/web/") or path in _PROBES


def _is_unrouted(scope: Scope) -> bool:
    """Whether ``scope`` is for a path outside ``/api/`` that no route of the app serves.

    Such a path is answered 404 without the token (it holds nothing to protect); every
    ``/api/...`` path, served or not, and every route mounted elsewhere still need it.
    """
    path: str = scope["path"]
    if path == "/api" or path.startswith("/api/"):
        return False
    routes = getattr(getattr(scope.get("app"), "router", None), "routes", None)
    if routes is None:
        return False  # cannot tell: keep the token check
    return all(route.matches(scope)[0] is Match.NONE for route in routes)


def _close_reason(text: str) -> str:
    """``text`` cut to fit a WebSocket close frame (at most 123 bytes of UTF-8)."""
    data = text.encode()
    if len(data) <= WS_CLOSE_REASON_BYTES:
        return text
    return data[: WS_CLOSE_REASON_BYTES - 3].decode(errors="ignore") + "…"


class _Refusal(Exception):
    def __init__(self, status: int, code: str, message: str, ws_code: int) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.ws_code = ws_code
        super().__init__(message)


class GuardMiddleware:
    """Host, Origin and token checks before any route runs (see the module docstring).

    Args:
        app: The wrapped ASGI app.
        api_token: The token every API call and the WebSocket must carry, or None.
        trusted_hosts: Host names the ``Host`` header may name, or None for any.
    """

    def __init__(
        self, app: ASGIApp, *, api_token: str | None, trusted_hosts: Sequence[str] | None
    ) -> None:
        self.app = app
        self._token = api_token.encode() if api_token is not None else None
        self._hosts = (
            frozenset(_host_name(h) for h in trusted_hosts) if trusted_hosts is not None else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse the request (JSON error or WebSocket close code) or pass it on."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            self._check(scope)
        except _Refusal as refusal:
            if scope["type"] == "http":
                headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
                response = error_response(
                    refusal.status, refusal.code, refusal.message, headers
                )
                await response(scope, receive, send)
            else:
                websocket = WebSocket(scope, receive, send)
                await websocket.accept()
                await websocket.close(refusal.ws_code, _close_reason(refusal.message))
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope) -> None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if self._hosts is not None and _host_name(host) not in self._hosts:
            raise _Refusal(
                400, "untrusted_host",
                f"Host {_quoted(host)} is not served here; "
                f"use one of: {', '.join(sorted(self._hosts))}",
                CLOSE_POLICY,
            )
        origin = headers.get("origin")
        is_ws = scope["type"] == "websocket"
        if origin is not None and (is_ws or scope["method"] in _UNSAFE_METHODS):
            if urlsplit(origin).netloc.lower() != host.lower():
                raise _Refusal(
                    403, "forbidden_origin",
                    f"Cross-origin request from {cut(origin)} refused",
                    CLOSE_POLICY,
                )
        if self._token is None or _is_public_path(scope["path"]) or _is_unrouted(scope):
            return
        if is_ws:
            given = QueryParams(scope.get("query_string", b"")).get("token")
            if given is None:
                given = _bearer(headers.get("authorization"))
        else:
            given = _bearer(headers.get("authorization"))
        if given is None or not hmac.compare_digest(given.encode(), self._token):
            what = "?token=<token>" if is_ws else "Authorization: Bearer <token>"
            problem = "is missing" if given is None else "is wrong"
            raise _Refusal(
                401, "unauthorized",
                f"This server requires an API token ({what}); the token {problem}",
                CLOSE_TOKEN,
            )


class TracingMiddleware:
    """A span per HTTP request (``HTTP <method>``), continuing the caller's ``traceparent``.

    Effects a request schedules are children of its span (`runtime.telemetry`). With only
    ``opentelemetry-api`` installed (no SDK configured) the span is a no-op.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._propagator = TraceContextTextMapPropagator()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve ``scope`` inside its span (HTTP only; WebSockets and lifespan as they are)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        parent = self._propagator.extract({
            k: v for k in ("traceparent", "tracestate") if (v := headers.get(k)) is not None
        })
        status: dict[str, int] = {}

        async def tracking_send(message: ASGIMessage) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        with trace.get_tracer(TRACER_NAME).start_as_current_span(
            f"HTTP {scope['method']}",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
        ) as span:
            await self.app(scope, receive, tracking_send)
            if "code" in status:
                span.set_attribute("http.response.status_code", status["code"])
                if status["code"] >= 500:
                    span.set_status(trace.Status(trace.StatusCode.ERROR))


class InterruptedRequestMiddleware:
    """Answer JSON 503 ``shutting_down`` for a request cancelled before it answered.

    On SIGINT/SIGTERM, `Server` gives open requests the runtime's grace period, then
    cancels them (it tracks them in ``app.state.requests``, filled here); uncaught, the
    cancellation would reach uvicorn, which logs a traceback and sends a plain-text 500.
    A request (a long turn, say) that had not started its answer gets
    ``{"error": {"code": "shutting_down", ...}}`` with ``Retry-After`` instead; what it
    stored before stays stored.

    Args:
        app: The wrapped ASGI app.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the request; turn its cancellation into a 503 if nothing was sent yet."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        # `Server` waits for these at shutdown (not for streams, which close themselves).
        requests = getattr(getattr(scope.get("app"), "state", None), "requests", None)
        task = asyncio.current_task()
        if isinstance(requests, set) and task is not None:
            requests.add(task)

        async def tracking_send(message: ASGIMessage) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if started:
                raise
            where = f"{scope.get('method', '')} {scope.get('path', '')}"
            where = cut(where)
            log.warning("%s interrupted: the server is shutting down", where)
            response = error_response(
                503, "shutting_down",
                f"The server is shutting down: {where} was interrupted before it answered; "
                f"retry once it is back",
                {"Retry-After": "5", "Connection": "close"},
            )
            # Not re-raised: uvicorn would log a crash and answer a plain-text 500. The
            # task is being torn down anyway; it ends once the answer is sent.
            await response(scope, receive, send)
        finally:
            if isinstance(requests, set):
                requests.discard(task)


class BodyLimitMiddleware:
    """Bound every request body (built-in routes, thread endpoints, extra routes alike).

    A ``Content-Length`` over ``max_body_bytes`` is answered 413 at once, before the route
    runs or a byte of the body is read. A chunked body is counted as the route reads it:
    the read that passes the limit raises 413 ``body_too_large``, so nothing buffers more
    than the limit. A route with a smaller limit of its own (``POST .../messages``) is
    answered with that limit. A client that stops sending in the middle of its body for
    ``body_idle_timeout_seconds``, or whose whole body takes over ``body_timeout_seconds``
    from the route's first read, gets 408 ``request_timeout`` (the connection is closed).

    Args:
        app: The wrapped ASGI app.
        max_body_bytes: Largest request body, in bytes.
        body_idle_timeout_seconds: Longest wait for the next piece of a body.
        body_timeout_seconds: Longest time for a whole body to arrive.
    """

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, body_idle_timeout_seconds: float,
        body_timeout_seconds: float = BODY_TIMEOUT_SECONDS,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.idle_timeout = body_idle_timeout_seconds
        self.body_timeout = body_timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse an over-long declared body, or pass on a counting ``receive``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        if scope.get("method") == "POST" and _MESSAGES_PATH.match(scope.get("path", "")):
            limit = min(limit, MAX_MESSAGE_BODY_BYTES)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            response = error_response(
                413, "body_too_large",
                f"Request body is {cut(declared, 20)} bytes; the limit is {limit} bytes",
                {"Connection": "close"},
            )
            await response(scope, receive, send)
            return
        total = 0
        body_done = False
        loop = asyncio.get_running_loop()
        deadline: float | None = None

        async def counting_receive() -> ASGIMessage:
            nonlocal total, body_done, deadline
            if body_done:  # after the body: waiting for a disconnect has no time limit
                return await receive()
            now = loop.time()
            if deadline is None:
                deadline = now + self.body_timeout
            left = deadline - now
            try:
                async with asyncio.timeout(min(self.idle_timeout, max(left, 0.0))):
                    message = await receive()
            except TimeoutError:
                if left <= self.idle_timeout:
                    why = f"the whole body did not arrive within {self.body_timeout:g} s"
                else:
                    why = f"nothing arrived for {self.idle_timeout:g} s"
                raise ApiError(
                    408, "request_timeout", f"The request body stalled: {why}", _CLOSE
                ) from None
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > limit:
                    raise ApiError(
                        413, "body_too_large",
                        f"Request body exceeds the limit of {limit} bytes", _CLOSE,
                    )
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        try:
            await self.app(scope, counting_receive, send)
        except ClientDisconnect:
            # The client left in the middle of its body: no one is there to answer.
            log.info("%s %s: the client disconnected before sending its whole body",
                     scope.get("method"), cut(scope.get("path", ""), 200))


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


# -------------------------------------------------------------------------- helpers


def _runtime(conn: HTTPConnection) -> Runtime:
    rt: Runtime = conn.app.state.runtime
    return rt


async def read_body(request: Request, limit: int | None = None) -> bytes:
    """Read a request body of at most ``limit`` bytes, stopping as soon as it is over.

    ``Content-Length`` is checked before anything is read; a chunked body is counted while
    it streams in, and reading stops at the first chunk over the limit, so memory stays
    bounded by the limit whatever the client sends.

    Args:
        request: The request.
        limit: Largest body in bytes; default the app's ``max_body_bytes`` (2 MiB).

    Raises:
        ApiError: 413 ``body_too_large`` over the limit; 400 ``invalid_body`` for a
            malformed ``Content-Length``.
    """
    if limit is None:
        limit = int(request.app.state.max_body_bytes)
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit() or len(declared) > 19:
            raise ApiError(400, "invalid_body", f"Invalid Content-Length {_quoted(declared)}")
        if int(declared) > limit:
            raise ApiError(
                413, "body_too_large",
                f"Request body is {int(declared)} bytes; the limit is {limit} bytes", _CLOSE,
            )
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(
                413, "body_too_large", f"Request body exceeds the limit of {limit} bytes", _CLOSE
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(
    request: Request, limit: int | None = None, *, required: bool = True
) -> Any:
    r"""Read and parse a JSON request body of at most ``limit`` bytes (see `read_body`).

    Args:
        request: The request.
        limit: Largest body in bytes; default the app's ``max_body_bytes`` (2 MiB).
        required: Whether an empty body is an error (else it gives None).

    Returns:
        The parsed value, or None for an empty body when ``required`` is False.

    Raises:
        ApiError: 413 over the limit; 400 ``invalid_body`` when empty (and required);
            400 ``invalid_json`` when not valid JSON, nested deeper than
            `MAX_JSON_DEPTH` levels, holding a number beyond the float range, or holding
            a string that is not valid Unicode (a lone surrogate such as ``"\ud800"``).
    """
    body = await read_body(request, limit)
    if not body.strip():
        if required:
            raise ApiError(400, "invalid_body", "Request body must be a JSON object")
        return None
    return _parse_body(body)


def _parse_body(body: bytes) -> Any:
    try:
        value = parse_json(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, "invalid_json", f"Request body is not valid JSON: {exc}") from None
    # JSON may spell lone surrogates ("\ud800"), which are not text: nothing could store
    # or answer them, so the body is refused before any route sees it.
    problem = find_invalid_text(value) if may_hold_surrogates(body) else None
    if problem is not None:
        raise ApiError(
            400, "invalid_json",
            f"Request body is not valid JSON text: {problem}, which is not valid Unicode",
        )
    return value


async def read_object(
    request: Request, allowed: frozenset[str], what: str, *, limit: int | None = None,
    required: bool = True,
) -> dict[str, Any]:
    """Read a JSON object body holding only the ``allowed`` fields.

    An empty body is ``{}`` when ``required`` is False; any other body must be an object
    (``[]``, ``0``, ``null`` or ``""`` are refused, not taken for "no body").

    Raises:
        ApiError: as `read_json`; 400 ``invalid_body`` for a body that is not an object
            or has an unknown field (naming it and the allowed ones).
    """
    body = await read_body(request, limit)
    if not body.strip():
        if required:
            raise ApiError(400, "invalid_body", f"{what}: the body must be a JSON object")
        return {}
    return _object(_parse_body(body), allowed, what)


def _object(value: Any, allowed: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_body", f"{what}: the body must be a JSON object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ApiError(
            400, "invalid_body",
            f"{what}: unknown field(s) {', '.join(cut(u, 40) for u in unknown[:5])}"
            f"{' and more' if len(unknown) > 5 else ''}; "
            f"allowed: {', '.join(sorted(allowed)) or 'none'}",
        )
    return value


async def _no_fields(request: Request) -> None:
    """Check the optional body of a route that takes none: empty, or ``{}``."""
    what = f"{request.method} {request.url.path}"
    await read_object(request, frozenset(), cut(what), required=False)


_LIMIT_RE = re.compile(r"^[0-9]{1,19}\Z")  # ASCII digits only: int() also takes "5_0", "+5"


def _query_limit(request: Request, max_limit: int = 500) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return 50
    if not _LIMIT_RE.match(raw):
        raise ApiError(
            400, "invalid_parameter",
            f"limit must be an integer from 1 to {max_limit}, got {_quoted(raw)}",
        )
    return int(raw)


def _optional_str(body: dict[str, Any], key: str, what: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, "invalid_body", f"{what}: {key} must be a string or null")
    return value


def _from_iso(text: str) -> datetime:
    """``datetime.fromisoformat`` of ``text``, which must hold no control character.

    CPython's parser stops at a NUL and ignores what follows (``"...Z<NUL>x"`` parsed as
    ``"...Z"``); such a text is refused instead. RFC 3339 allows a lowercase ``t`` and
    ``z`` (section 5.6, NOTE), so they are read as ``T`` and ``Z``.

    Raises:
        ValueError: not an ISO 8601 date-time, or a control character in it.
    """
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError("a control character in a date-time")
    return datetime.fromisoformat(text.replace("t", "T").replace("z", "Z"))


def _rfc3339(text: str | None, name: str) -> datetime | None:
    """An RFC 3339 date-time with its offset (``2026-12-01T09:00:00Z``), or None."""
    if text is None:
        return None
    try:
        value = _from_iso(text)
    except ValueError:
        raise ApiError(
            422, "invalid_delay",
            f"{name} must be an RFC 3339 date-time such as 2026-12-01T09:00:00Z, got "
            f"{_quoted(text)}",
        ) from None
    if value.tzinfo is None:
        raise ApiError(
            422, "invalid_delay",
            f"{name} must carry its offset (Z or +03:00), got {_quoted(text)}",
        )
    return value


def _param(request: Request, key: str) -> str | None:
    """A query parameter given at most once (None when absent or empty).

    A filter takes one value: ``user_id=a&user_id=b`` would otherwise keep one of them
    silently, so a repeat is refused (``status`` alone takes several values).

    Raises:
        ApiError: 400 ``invalid_parameter`` naming the parameter when it is repeated.
    """
    values = request.query_params.getlist(key)
    if len(values) > 1:
        raise ApiError(
            400, "invalid_parameter",
            f"{key} is given {len(values)} times; give it once (a filter takes one value)",
        )
    return values[0] or None if values else None


def _check_query(request: Request, known: frozenset[str]) -> None:
    """Refuse a query parameter the route does not know, or one given with no value.

    An unknown name (``user=ann`` for ``user_id=ann``) or an empty value (``user_id=``)
    would otherwise filter nothing, silently: a list of every run rather than one user's.

    Raises:
        ApiError: 400 ``invalid_parameter`` naming the parameter (and, when unknown, the
            known ones); 400 ``invalid_thread_id`` for an empty ``thread_id``.
    """
    for key in request.query_params.keys():
        if key not in known:
            raise ApiError(
                400, "invalid_parameter",
                f"Unknown query parameter {_quoted(key)}; known: {', '.join(sorted(known))}",
            )
    for key, value in request.query_params.multi_items():
        if NUL in value:
            raise ApiError(400, "invalid_parameter", no_nul_message(key))
        if value == "":
            if key == "thread_id":
                validate_thread_id(value)  # raises InvalidThreadId (400 invalid_thread_id)
            raise ApiError(
                400, "invalid_parameter",
                f"{key} is given without a value; leave it out to not filter by it",
            )


def _page_params(request: Request, max_limit: int = 500) -> tuple[int, str | None]:
    _param(request, "limit")  # given once
    limit = _query_limit(request, max_limit)
    return limit, _param(request, "cursor")


def thread_json(info: ThreadInfo) -> dict[str, Any]:
    """A thread's wire form: ``{"id", "createdAt", "agentId", "userId", "tags", "paused"}``."""
    return {
        "id": info.id,
        "createdAt": iso(info.created_at_ts),
        "agentId": info.agent_id,
        "userId": info.user_id,
        "tags": list(info.tags),
        "paused": info.paused,
    }


def listed_thread_json(info: ThreadInfo) -> dict[str, Any]:
    """A thread as `GET /api/threads` lists it: `thread_json` and ``"lastActivityAt"``."""
    activity = info.last_activity_ts
    return {
        **thread_json(info),
        "lastActivityAt": iso(activity if activity is not None else info.created_at_ts),
    }


async def _thread(request: Request) -> ThreadState:
    return await _runtime(request).get_thread(request.path_params["tid"])


# --------------------------------------------------------------------------- routes


async def _create_thread(request: Request) -> Response:
    what = "POST /api/threads"
    body = await read_object(request, _THREAD_FIELDS, what, required=False)
    tags = body.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ApiError(400, "invalid_body", f"{what}: tags must be a list of strings")
    thread_id = _optional_str(body, "id", what)
    state = await _runtime(request).create_thread(
        thread_id,
        agent_id=_optional_str(body, "agent_id", what),
        user_id=_optional_str(body, "user_id", what),
        tags=tags,
    )
    info = ThreadInfo(
        id=state.thread_id,
        created_at_ts=state.created_at.timestamp(),
        agent_id=state.agent_id,
        user_id=state.user_id,
        tags=state.tags,
    )
    return JSONResponse(thread_json(info), status_code=201)


_THREAD_LIST_PARAMS = frozenset({"limit", "cursor", "user_id", "agent_id", "tag", "sort"})
_RUN_LIST_PARAMS = frozenset({
    "status", "name", "thread_id", "user_id", "tag", "since", "until", "replayed", "limit",
    "cursor",
})


async def _list_threads(request: Request) -> Response:
    _check_query(request, _THREAD_LIST_PARAMS)
    limit, cursor = _page_params(request)
    sort = _param(request, "sort") or "activity"
    if sort not in ("activity", "created"):
        raise ApiError(
            400, "invalid_parameter",
            f"sort must be activity or created, got {_quoted(sort)}",
        )
    try:
        page = await _runtime(request).list_threads(
            limit=limit, cursor=cursor, user_id=_param(request, "user_id"),
            agent_id=_param(request, "agent_id"), tag=_param(request, "tag"),
            by_activity=sort == "activity",
        )
    except ValueError as exc:  # a bad limit or a malformed cursor
        raise ApiError(400, "invalid_parameter", str(exc)) from None
    return JSONResponse(
        {"threads": [listed_thread_json(t) for t in page.threads],
         "nextCursor": page.next_cursor}
    )


async def _get_thread(request: Request) -> Response:
    state = await _thread(request)
    info = ThreadInfo(
        id=state.thread_id,
        created_at_ts=state.created_at.timestamp(),
        agent_id=state.agent_id,
        user_id=state.user_id,
        tags=state.tags,
        paused=state.paused,
        last_activity_ts=await _runtime(request).last_activity(state.thread_id),
    )
    return JSONResponse(listed_thread_json(info))


async def _pause_thread(request: Request) -> Response:
    return await _set_paused(request, paused=True)


async def _resume_thread(request: Request) -> Response:
    return await _set_paused(request, paused=False)


async def _set_paused(request: Request, *, paused: bool) -> Response:
    tid = request.path_params["tid"]
    # No fields: an empty body, ``{}`` or none at all.
    await read_object(
        request, frozenset(), f"POST /api/threads/{{tid}}/{'pause' if paused else 'resume'}",
        required=False,
    )
    rt = _runtime(request)
    state = await (rt.pause_thread(tid) if paused else rt.resume_thread(tid))
    info = replace(state.info, last_activity_ts=await rt.last_activity(tid))
    return JSONResponse(listed_thread_json(info))


async def _delete_thread(request: Request) -> Response:
    await _no_fields(request)
    tid = request.path_params["tid"]
    if not await _runtime(request).delete_thread(tid):
        raise ThreadNotFound(tid)
    return JSONResponse({"deleted": True})


async def _list_runs(request: Request) -> Response:
    state = await _thread(request)
    limit, cursor = _page_params(request)
    statuses = [
        s.strip()
        for raw in request.query_params.getlist("status")
        for s in raw.split(",")
        if s.strip()
    ]
    name = _param(request, "name")
    try:
        page = await state.list_runs(
            status=statuses or None, name=name, limit=limit, cursor=cursor
        )
    except EffectsError:
        raise
    except ValueError as exc:  # unknown status, bad limit, malformed cursor
        raise ApiError(400, "invalid_parameter", str(exc)) from None
    return JSONResponse(
        {
            "runs": [r.to_json() for r in page.runs],
            "nextCursor": page.next_cursor,
            "counts": {str(s): n for s, n in page.counts.items()},
        }
    )


async def _list_effect_records(request: Request) -> Response:
    state = await _thread(request)
    limit, cursor = _page_params(request, MAX_RECORDS_PAGE)
    status = request.query_params.get("status") or None
    try:
        page = await state.list_effect_records(status=status, limit=limit, cursor=cursor)
    except EffectsError:
        raise
    except ValueError as exc:  # unknown status, bad limit, malformed cursor
        raise ApiError(400, "invalid_parameter", str(exc)) from None
    records = [listed_record_json(record) for record in page.records]
    return JSONResponse({"records": records, "nextCursor": page.next_cursor})


def _instant(request: Request, key: str) -> float | None:
    raw = _param(request, key)
    return _parse_instant(key, raw) if raw else None


def _time_range(since: float | None, until: float | None) -> None:
    if since is not None and until is not None and since > until:
        raise ApiError(
            400, "invalid_parameter",
            "since must not be after until (runs due at or after since and before until)",
        )


def _filter_thread_id(value: str | None) -> str | None:
    # As a path names a thread: a malformed id is refused, not "matches nothing".
    return validate_thread_id(value) if value is not None else None


def _parse_instant(key: str, raw: str) -> float:
    try:
        when = _from_iso(raw)
    except ValueError:
        raise ApiError(
            400, "invalid_parameter",
            f"{key} must be an ISO 8601 time such as 2026-11-30T05:40:00Z, got {_quoted(raw)}",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # the API speaks UTC
    try:
        ts = instant_seconds(when, name=key)
    except InvalidDelay as exc:
        raise ApiError(400, "invalid_parameter", str(exc)) from None
    # The API shows times to the microsecond (rounded): a bound names every run shown at
    # that microsecond, so `since=<a run's runAt>` includes that run.
    return ts - 0.5e-6


async def _list_all_runs(request: Request) -> Response:
    """``GET /api/runs``: runs across threads, with filters, counts and a cursor."""
    rt = _runtime(request)
    _check_query(request, _RUN_LIST_PARAMS)
    limit, cursor = _page_params(request)
    q = request.query_params
    statuses = [s.strip() for raw in q.getlist("status") for s in raw.split(",") if s.strip()]
    since, until = _instant(request, "since"), _instant(request, "until")
    _time_range(since, until)
    replayed = _param(request, "replayed")
    if replayed not in (None, "true", "false"):
        raise ApiError(
            400, "invalid_parameter", f"replayed must be true or false, got {_quoted(replayed)}"
        )
    try:
        page = await rt.list_runs(
            status=statuses or None,
            name=_param(request, "name"),
            thread_id=_filter_thread_id(_param(request, "thread_id")),
            user_id=_param(request, "user_id"),
            tag=_param(request, "tag"),
            since=since,
            until=until,
            replayed=None if replayed is None else replayed == "true",
            limit=limit,
            cursor=cursor,
        )
    except EffectsError:
        raise
    except ValueError as exc:  # unknown status, bad limit, malformed cursor
        raise ApiError(400, "invalid_parameter", str(exc)) from None
    return JSONResponse(
        {
            "runs": [r.to_json() for r in page.runs],
            "nextCursor": page.next_cursor,
            "counts": {str(s): n for s, n in page.counts.items()},
            "complete": page.complete,
        }
    )


async def _get_effect_record(request: Request) -> Response:
    state = await _thread(request)
    key = request.path_params["key"]
    record = await state.get_effect_record(key)
    if record is None:
        raise ApiError(404, "effect_record_not_found",
                       f"Thread {state.thread_id} has no effect record under the key "
                       f"{_quoted(key)}")
    wire = record.to_json()
    wire.pop("threadId", None)
    wire["resultTruncated"] = False
    return JSONResponse(wire)


async def _schedule(request: Request) -> Response:
    what = f"POST /api/threads/{request.path_params['tid']}/effects"
    state = await _thread(request)
    body = await read_object(request, _SCHEDULE_FIELDS, what)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "invalid_body", f"{what}: name must be a non-empty string")
    delay = body.get("delay_seconds")
    seconds = 0.0 if delay is None else delay_seconds(delay, name="delay_seconds")
    key = _optional_str(body, "key", what)
    at = _rfc3339(_optional_str(body, "run_at", what), "run_at")
    if at is not None and delay is not None:
        raise ApiError(400, "invalid_body", f"{what}: give delay_seconds or run_at, not both")
    if at is not None:  # checked here too so the message names run_at, not at
        run_at_seconds(at, _runtime(request).clock.now(), name="run_at")
    scheduled = await state.schedule(name, body.get("args"), seconds, key=key, at=at)
    # 200: the key was held by a live run, whose id this is (nothing was stored).
    return JSONResponse({"id": scheduled.run_id}, status_code=201 if scheduled.created else 200)


async def _get_run(request: Request) -> Response:
    state = await _thread(request)
    run = await state.get_run(request.path_params["run_id"])
    attempts = await state.get_run_attempts(run.id)
    return JSONResponse(
        {**run.to_json(include_args=True), "attemptDetails": [a.to_json() for a in attempts]}
    )


async def _run_now(request: Request) -> Response:
    await _no_fields(request)
    state = await _thread(request)
    run = await state.run_now(request.path_params["run_id"])
    return JSONResponse({"id": run.id, "status": str(run.status)})


async def _replay(request: Request) -> Response:
    await _no_fields(request)
    state = await _thread(request)
    new_id = await state.replay(request.path_params["run_id"])
    return JSONResponse({"id": new_id}, status_code=201)


async def _cancel(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    what = f"POST /api/threads/{request.path_params['tid']}/effects/{cut(run_id, 40)}/cancel"
    # The one route of a run that takes a body: an optional {"by": ...}, checked first.
    body = await read_object(request, _CANCEL_FIELDS, what, required=False)
    state = await _thread(request)
    by = _by(body, what)
    canceled = await state.remove_scheduled_effect(run_id, canceled_by=by)
    if not canceled:
        await state.get_run(run_id)  # RunNotFound (404) for an id the thread never had
    return JSONResponse({"canceled": canceled})


async def _create_schedule(request: Request) -> Response:
    what = f"POST /api/threads/{request.path_params['tid']}/schedules"
    state = await _thread(request)
    body = await read_object(request, _RECURRING_FIELDS, what)
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "invalid_body", f"{what}: name must be a non-empty string")
    every = body.get("every_seconds")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)):
        raise ApiError(
            422, "invalid_schedule", f"every_seconds must be a number, got {_quoted(every)}"
        )
    cron, timezone = body.get("cron"), body.get("timezone")
    # Checked here first so each message names the HTTP field (every_seconds, not every)
    # and a field of the wrong type (a number as cron) is invalid_schedule like the rest.
    Recurrence.parse(cron=cron, timezone=timezone, every=every, every_name="every_seconds")
    made = await state.schedule_recurring(
        name, body.get("args"),
        cron=cron,
        timezone=timezone,
        every=every,
        key=_optional_str(body, "key", what),
    )
    # 200: the key was held by a schedule, which this is (nothing was stored).
    return JSONResponse(
        made.schedule.to_json(include_args=True), status_code=201 if made.created else 200
    )


async def _list_schedules(request: Request) -> Response:
    state = await _thread(request)
    found = await state.list_schedules()
    return JSONResponse({"schedules": [s.to_json() for s in found]})


async def _get_schedule(request: Request) -> Response:
    state = await _thread(request)
    found = await state.get_schedule(request.path_params["sid"])
    return JSONResponse(found.to_json(include_args=True))


async def _pause_schedule(request: Request) -> Response:
    await _no_fields(request)
    state = await _thread(request)
    return JSONResponse((await state.pause_schedule(request.path_params["sid"])).to_json())


async def _resume_schedule(request: Request) -> Response:
    await _no_fields(request)
    state = await _thread(request)
    return JSONResponse((await state.resume_schedule(request.path_params["sid"])).to_json())


async def _cancel_schedule(request: Request) -> Response:
    await _no_fields(request)
    state = await _thread(request)
    return JSONResponse((await state.cancel_schedule(request.path_params["sid"])).to_json())


def _by(body: dict[str, Any], what: str) -> str:
    """Who cancels: ``by`` (1 to 256 characters) or ``"http"`` when absent or null."""
    by = _optional_str(body, "by", what)
    if by is None:
        return "http"
    if not by:
        raise ApiError(
            400, "invalid_argument", f"{what}: by must be 1 to 256 characters, got an empty one"
        )
    return by


async def _list_effects(request: Request) -> Response:
    registry = _runtime(request).registry
    return JSONResponse(
        {
            "effects": [
                {
                    "name": d.qualified_name,
                    "description": d.description,
                    "argsSchema": d.args_json_schema(),
                }
                for d in registry.all()
            ]
        }
    )


async def _list_agents(request: Request) -> Response:
    app = _runtime(request).agents
    default = app.default_agent_id()
    agents: list[dict[str, Any]] = []
    for name in sorted(app.agents):
        item: dict[str, Any] = {"id": name, "default": name == default}
        if app.agents[name].description:
            item["description"] = app.agents[name].description
        agents.append(item)
    return JSONResponse({"agents": agents})


_PANE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}


def _pane_route(web_dir: Path) -> Callable[[Request], Any]:
    index = web_dir / "index.html"

    async def pane(request: Request) -> Response:
        return FileResponse(index, media_type="text/html", headers=_PANE_HEADERS)

    return pane


class _PaneFiles(StaticFiles):
    """`StaticFiles` that asks browsers to revalidate (the pane has no build step/hashes)."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(_PANE_HEADERS)
        return response


# ------------------------------------------------------------------ messages


async def _post_message(request: Request) -> Response:
    what = f"POST /api/threads/{cut(request.path_params['tid'], 64)}/messages"
    body = await read_object(
        request, _MESSAGE_FIELDS, what, limit=MAX_MESSAGE_BODY_BYTES
    )
    content = body.get("content")
    if not isinstance(content, str) or not content.strip():
        raise ApiError(
            400, "invalid_body", f'{what}: the body must be {{"content": "<non-empty text>"}}'
        )
    if len(content) > MAX_CONTENT_CHARS:
        raise ApiError(
            413, "content_too_large",
            f"content is {len(content)} characters; the limit is {MAX_CONTENT_CHARS}",
        )
    run_id = body.get("run_id")
    if run_id is not None:
        from runtime.turns import RUN_ID_RE

        if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
            raise ApiError(
                400, "invalid_body",
                f"{what}: run_id must be 1-64 characters of letters, digits, '_', '-', '.' "
                f"or ':', got {cut(repr(run_id), 80)}",
            )
    state = await _thread(request)
    try:
        result = await state.send_message(content, run_id=run_id)
    except AgentNotFound as exc:
        # A thread whose agent is gone cannot take messages: a conflict with the thread's
        # state here (409 no_agent), where elsewhere an unknown agent is a 404.
        raise ApiError(409, "no_agent", str(exc)) from None
    return JSONResponse(result.to_json())


_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}
_MAX_ID_CHARS = 64


async def _list_messages(request: Request) -> Response:
    limit = _query_limit(request)
    state = await _thread(request)
    raw_latest = request.query_params.get("latest", "false").lower()
    if raw_latest not in _BOOLEANS:
        raise ApiError(
            400, "invalid_parameter", f"latest must be true or false, got {_quoted(raw_latest)}"
        )
    cursors = {key: request.query_params.get(key) or None for key in ("after", "before")}
    for key, cursor in cursors.items():
        if cursor is not None and len(cursor) > _MAX_ID_CHARS:  # no message has such an id
            raise ApiError(
                400, "invalid_parameter",
                f"Invalid cursor {key}={_quoted(cursor)}: no such message in thread "
                f"{state.thread_id}",
            )
    try:
        page = await state.get_messages(
            limit=limit,
            after=cursors["after"],
            before=cursors["before"],
            latest=_BOOLEANS[raw_latest],
        )
    except EffectsError:
        raise
    except ValueError as exc:  # a bad limit or a cursor that names no message
        raise ApiError(400, "invalid_parameter", str(exc)) from None
    return JSONResponse(
        {
            "messages": [m.to_json() for m in page.messages],
            "nextCursor": page.next_cursor,
            "prevCursor": page.prev_cursor,
        }
    )


async def _get_message(request: Request) -> Response:
    state = await _thread(request)
    message = await state.get_message(request.path_params["mid"])
    return JSONResponse(message.to_json())


async def _list_turns(request: Request) -> Response:
    from runtime.turns import load_turns

    state = await _thread(request)
    rows = await load_turns(state.runtime, state.thread_id)
    return JSONResponse({"turns": [row.to_json() for row in rows.values()]})


def message_routes() -> list[BaseRoute]:
    """Starlette routes for a thread's conversation (``docs/http-api.md``, Messages).

    ``POST /api/threads/{tid}/messages`` ``{"content": "...", "run_id": "..."}`` runs one
    turn and answers 200 ``{"runId", "reply", "messages"}``; posted again with the same
    ``run_id``, it is the same turn (resumed if unfinished, its stored answer if finished);
    409 ``turn_in_progress`` while another turn of the thread runs (one at a time; the
    client retries after the answer), 409 ``run_id_conflict`` for a ``run_id`` of a turn
    with another message, 409 ``no_agent`` when no agent serves the thread, 502
    ``turn_failed`` when the model fails.
    ``GET /api/threads/{tid}/turns`` lists the thread's turns (running, failed, the
    latest finished), least recently changed first: ``{"turns": [{"runId", "status", "attempts",
    "resumed", "error", "startedAt", "updatedAt"}]}``.
    ``GET /api/threads/{tid}/messages?limit=50&after=<message id>`` lists messages oldest
    first: ``{"messages": [...], "nextCursor", "prevCursor"}``; ``before=<message id>``
    gives the page before a message, ``latest=true`` the newest page.
    ``GET .../messages/{mid}`` gives one.

    Errors are answered by the app's error handlers (`create_app`).
    """
    return [
        _route("/api/threads/{tid}/messages", GET=_list_messages, POST=_post_message),
        _route("/api/threads/{tid}/messages/{mid}", GET=_get_message),
        _route("/api/threads/{tid}/turns", GET=_list_turns),
    ]


# ---------------------------------------------------------- thread endpoints


def _endpoint_view(endpoint: ThreadEndpoint) -> Endpoint:
    where = f"{endpoint.method} /api/threads/{{tid}}{endpoint.path} ({endpoint.file.name})"

    async def view(request: Request) -> Response:
        state = await _thread(request)
        params = {
            ("*" if key == REST_PARAM else key): str(value)
            for key, value in request.path_params.items()
            if key != "tid"
        }
        try:
            result = await endpoint.definition.call(request, state, params)
        except (ApiError, EffectsError):
            raise  # one mapping: a corrupt thread file is thread_storage_error everywhere
        except HTTPException as exc:
            raise ApiError(exc.status_code, f"http_{exc.status_code}", str(exc.detail)) from None
        except Exception:
            log.exception("thread endpoint %s failed (thread %s)", where, state.thread_id)
            raise ApiError(
                500, "endpoint_error", f"Thread endpoint {where} failed; see the server log"
            ) from None
        if isinstance(result, Response):
            return result
        if result is None:
            return Response(status_code=204)
        try:
            return JSONResponse(result)
        except (TypeError, ValueError):
            log.exception("thread endpoint %s returned a value that is not JSON", where)
            raise ApiError(
                500, "endpoint_error",
                f"Thread endpoint {where} returned a value that is not JSON",
            ) from None

    return view


def thread_endpoint_routes(app_dir: str | os.PathLike[str] | None) -> list[BaseRoute]:
    """Starlette routes for the thread endpoints of an app folder (`runtime.endpoints`).

    Mount them after the built-in routes (which win on an overlap such as a top-level
    ``[name].py``). Errors are answered by the app's error handlers (`create_app`).

    Args:
        app_dir: The application folder (its ``api/`` holds the endpoint files).

    Raises:
        AgentDefinitionError: see `runtime.endpoints.discover_thread_endpoints`.
    """
    endpoints = discover_thread_endpoints(Path(app_dir) if app_dir is not None else None)
    return [
        Route(
            f"/api/threads/{{tid}}{e.path}",
            _endpoint_view(e),
            methods=[e.method],
            name=f"thread_endpoint:{e.method}:{e.path}",
        )
        for e in endpoints
    ]


# ------------------------------------------------------------------------ the stream


class FrameStream:
    """One WebSocket client of a thread's frames (or of every thread's run changes).

    A writer sends the subscription's events as they come; the subscription is this
    client's bounded queue, filled without ever waiting for the client. If it holds more
    than its ``maxsize`` unsent events (the client reads too slowly) the client is closed
    with 1013 — the runtime and the other clients never wait for it. Frames are the events'
    ``frame_text()``: serialized once per event, the same string for every client.

    Args:
        websocket: The accepted socket.
        subscription: The thread's subscription (closed when the stream ends); its
            ``maxsize`` is how many frames are buffered for this client before it is dropped.
        close_timeout_seconds: How long to try to deliver the final frames and the close.
        metrics: Where connected clients and dropped frames are counted, if anywhere.
    """

    def __init__(
        self,
        websocket: WebSocket,
        subscription: Subscription,
        close_timeout_seconds: float = WS_CLOSE_TIMEOUT_SECONDS,
        metrics: RuntimeMetrics | None = None,
    ) -> None:
        self.metrics = metrics
        self.websocket = websocket
        self.subscription = subscription
        self.close_timeout_seconds = close_timeout_seconds
        self._fanout: _FanOut | None = None

    async def _write(self) -> None:
        # Without this server's protocol (the test client): one `send_text` per frame.
        with contextlib.suppress(SubscriptionOverflow):  # `run` sees it and closes with 1013
            send = self.websocket.send_text
            async for event in self.subscription:
                await send(event.frame_text())

    def _start_writer(self) -> asyncio.Future[None]:
        """The writer of this client: its thread's `_FanOut` here, else a task of its own."""
        extension = self.websocket.scope.get("extensions", {}).get(SEND_FRAMES_EXTENSION)
        fanouts: dict[object, _FanOut] | None = getattr(
            self.websocket.app.state, "fanouts", None
        )
        if extension is None or fanouts is None:
            return asyncio.create_task(self._write(), name="frames-writer")
        source = self.subscription.source
        fanout = fanouts.get(source)
        if fanout is None:
            fanout = fanouts[source] = _FanOut(source, fanouts)
        self._fanout = fanout
        return fanout.add(self.subscription, extension["writable"], extension["write"])

    async def _read(self) -> None:
        # The pane sends nothing; reading is how a disconnect is noticed.
        while (await self.websocket.receive())["type"] != "websocket.disconnect":
            pass

    async def run(self, on_closed: Callable[[], Awaitable[tuple[int, str]]]) -> None:
        """Stream until the client leaves, falls behind or the subscription ends.

        Args:
            on_closed: Called when the subscription ended (thread deleted or runtime
                shutting down); gives the ``(code, reason)`` to close with.
        """
        sub = self.subscription
        ended = asyncio.create_task(sub.wait_closed(), name="frames-ended")
        writer = self._start_writer()
        reader = asyncio.create_task(self._read(), name="frames-reader")
        tasks: tuple[asyncio.Future[Any], ...] = (ended, writer, reader)
        if self.metrics is not None:
            self.metrics.ws_clients.inc()
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if sub.overflowed:
                writer.cancel()
                if self.metrics is not None:
                    self.metrics.frames_dropped.inc(sub.dropped)
                client = _peer_text(self.websocket.client)
                if sub.lost is not None:
                    log.info("closing a client (%s) of thread %s: %s", client, sub.thread_id,
                             sub.lost)
                    await self._close(CLOSE_TRY_AGAIN_LATER,
                                      f"{sub.lost}; reload and reconnect")
                    return
                log.info(
                    "closing a slow client (%s) of thread %s: %d frames unsent",
                    client, sub.thread_id, sub.dropped,
                )
                await self._close(
                    CLOSE_TRY_AGAIN_LATER,
                    f"Too slow: over {sub.maxsize} frames queued; reload and reconnect",
                )
                return
            if not sub.closed or reader.done() or (
                writer.done() and (writer.cancelled() or writer.exception() is not None)
            ):
                return  # the client left, or sending failed: nothing more to do
            # The subscription ended: deliver what is queued, then say why.
            await asyncio.wait(
                (writer, reader),
                timeout=self.close_timeout_seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if writer.done() and not writer.cancelled() and writer.exception() is None:
                code, reason = await on_closed()
                await self._close(code, reason)
        finally:
            if self.metrics is not None:
                self.metrics.ws_clients.dec()
            if self._fanout is not None:
                self._fanout.remove(sub)
            sub.close()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect):
                    await task

    async def _close(self, code: int, reason: str) -> None:
        # A client that does not read cannot receive the close frame either: give up after
        # the timeout (the server then closes the connection without it).
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError, TimeoutError):
            async with asyncio.timeout(self.close_timeout_seconds):
                await self.websocket.close(code, _close_reason(reason))


_WriteFrames = Callable[[bytes, list[bytes]], None]


def _peer_text(peer: tuple[str, int] | None) -> str:
    """A stream client's address for a log line (``host:port``; ``?`` when unknown)."""
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def frame_batch_seconds(clients: int) -> float:
    """The longest a frame waits for its write round to a thread's ``clients`` stream clients.

    `FRAME_BATCH_SECONDS` (50 ms) up to 100 clients, then `FRAME_BATCH_SECONDS_PER_CLIENT`
    (0.5 ms) per client (100 ms for 200), at most `FRAME_BATCH_MAX_SECONDS` (250 ms, from
    500 clients on). A round comes earlier once a quarter of a client's queue is pending,
    and at once for the first frame after a quiet spell.

    Args:
        clients: How many clients the thread's writer serves (0 or more).

    Returns:
        Seconds.
    """
    return min(FRAME_BATCH_MAX_SECONDS,
               max(FRAME_BATCH_SECONDS, clients * FRAME_BATCH_SECONDS_PER_CLIENT))


class _FanOut:
    """The one writer of every stream client that reads the same event log on this server.

    A thread's clients (or those of every thread's run changes) share one log of its
    events (`Subscription.source`); this writes to all of them from one task instead of a
    writer task per client. At most every `frame_batch_seconds` of its number of clients
    (50 ms up to 100 clients, 100 ms for 200, at most 250 ms; earlier once a quarter of a
    client's queue is pending; at once after a quiet spell) it gives every client whose
    socket takes more (its transport is not paused by flow control) everything it has not
    sent yet, as text messages in one socket write, yielding to the event loop after every
    `FANOUT_SLICE_CLIENTS` writes. Clients at the same position get the same bytes, built
    once per position. A client whose socket does not drain is
    skipped and falls behind; past its queue size its subscription overflows and its
    `FrameStream` closes it with 1013, as before.
    """

    def __init__(self, source: object, registry: dict[object, _FanOut]) -> None:
        self._source = source
        self._registry = registry
        self._clients: dict[
            Subscription, tuple[Callable[[], bool], _WriteFrames, asyncio.Future[None]]
        ] = {}
        self._task: asyncio.Task[None] | None = None

    def add(
        self, sub: Subscription, writable: Callable[[], bool], write: _WriteFrames
    ) -> asyncio.Future[None]:
        """Write ``sub``'s events to a client from now on.

        Returns:
            A future: done once the subscription is closed and everything it held was
            written; its exception is the one writing raised (the client is gone).
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._clients[sub] = (writable, write, done)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="frames-fanout")
        return done

    def remove(self, sub: Subscription) -> None:
        """Stop writing to ``sub``'s client (it left or was closed)."""
        self._clients.pop(sub, None)

    async def _run(self) -> None:
        clock = asyncio.get_running_loop().time
        try:
            while self._clients:
                behind = await self._write_round()
                sent_at = clock()
                interval = frame_batch_seconds(len(self._clients))
                lead = next((s for s in self._clients if not s.closed and not s.pending), None)
                if lead is None:
                    # Every socket is paused (or the clients written last were, and the
                    # others got events while the round yielded): try again a bit later.
                    await asyncio.sleep(FRAME_BATCH_SECONDS)
                    continue
                if behind:
                    # A paused socket: no event says when it drains, so retry it at the
                    # next round or after the interval, whichever comes first.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(interval):
                            await lead.wait(1)
                else:
                    await lead.wait(1)  # a new event (every open client has it), or it closed
                fill = lead.linger_fill
                remaining = sent_at + frame_batch_seconds(len(self._clients)) - clock()
                if remaining > 0 and fill and not lead.closed:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(remaining):
                            await lead.wait(fill)
        except BaseException as exc:
            for _, _, done in self._clients.values():
                if not done.done():
                    if isinstance(exc, asyncio.CancelledError):
                        done.cancel()
                    else:
                        done.set_exception(exc)
            raise
        finally:
            if self._registry.get(self._source) is self:
                del self._registry[self._source]

    async def _write_round(self) -> bool:
        """One write round; whether a client with unsent events could not take them now.

        After every `FANOUT_SLICE_CLIENTS` clients written to, the loop runs what is ready
        first; a client that left meanwhile is skipped, one that came waits for the next
        round.
        """
        behind = False
        shared: dict[tuple[int, int], tuple[bytes, list[bytes]]] = {}
        clients = self._clients
        written = 0
        for sub, (writable, write, done) in list(clients.items()):
            if written >= FANOUT_SLICE_CLIENTS:
                written = 0
                await asyncio.sleep(0)
            if sub not in clients or sub.overflowed or done.done():
                # It left while the round yielded, or its `FrameStream` closes it with
                # 1013 (or saw it fail).
                continue
            try:
                pending = sub.pending
                if pending:
                    if not writable():
                        behind = True
                        continue
                    position = sub.position
                    key = (position, pending) if position is not None else None
                    frames = shared.get(key) if key is not None else None
                    events = sub.take()
                    if frames is None:
                        frames = _wire_frames(events)
                        if key is not None:
                            shared[key] = frames
                    write(*frames)
                    written += 1
                if sub.closed and not sub.pending:
                    del self._clients[sub]
                    done.set_result(None)
            except Exception as exc:  # the connection is gone (ClientDisconnected)
                self._clients.pop(sub, None)
                done.set_exception(exc)
        return behind


def _wire_frames(events: list[ThreadEvent]) -> tuple[bytes, list[bytes]]:
    """The unmasked text messages of ``events`` in one buffer, and their payloads."""
    payloads = [event.frame_bytes() for event in events]
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(_text_frame_header(len(payload)))
        parts.append(payload)
    return b"".join(parts), payloads


async def _close_database_unavailable(websocket: WebSocket) -> None:
    """Refuse a stream while the database cannot be reached: 1013, try again later.

    HTTP answers 503 ``database_unavailable`` then; one log line, no traceback.
    """
    log.warning("stream %s refused: the database cannot be reached", websocket.url.path)
    await websocket.accept()
    await websocket.close(CLOSE_TRY_AGAIN_LATER,
                          "Database unavailable; try again later")


async def _stream(websocket: WebSocket) -> None:
    rt = _runtime(websocket)
    tid = websocket.path_params["tid"]
    try:
        state = await rt.get_thread(tid)
    except InvalidThreadId as exc:
        await websocket.accept()
        await websocket.close(CLOSE_INVALID_THREAD_ID, _close_reason(str(exc)))
        return
    except ThreadNotFound:
        await websocket.accept()
        await websocket.close(CLOSE_UNKNOWN_THREAD, _close_reason(f"Thread not found: {tid}"))
        return
    except RuntimeClosed:
        await websocket.accept()
        await websocket.close(CLOSE_SERVICE_RESTART, "The server is shutting down")
        return
    except DatabaseUnavailable:
        await _close_database_unavailable(websocket)
        return
    try:  # a thread whose file cannot be used would accept and then never say anything
        await state.list_runs(limit=1)
    except DatabaseUnavailable:
        await _close_database_unavailable(websocket)
        return
    except ThreadStorageError as exc:
        if exc.unavailable:  # the database server, not the thread's data (HTTP: 503)
            await _close_database_unavailable(websocket)
            return
        # The reason stays short (a close frame holds 123 bytes); HTTP answers the details.
        await websocket.accept()
        await websocket.close(
            CLOSE_THREAD_STORAGE,
            _close_reason(f"Thread storage error: thread {tid}'s database cannot be used"),
        )
        return
    # Subscribed before accepting: the client misses nothing from the moment it is open.
    subscription = state.subscribe()
    streams: set[asyncio.Task[Any]] = websocket.app.state.streams
    task = asyncio.current_task()
    assert task is not None
    streams.add(task)  # `Server.shutdown` lets it deliver its last frames

    async def why_closed() -> tuple[int, str]:
        if not rt.shutting_down:
            # A thread's subscriptions end while the server runs only when the thread is
            # deleted: here, or on another node (its registry row may be read here before
            # that node's deletion is visible, so it is not asked).
            return CLOSE_UNKNOWN_THREAD, f"Thread deleted: {tid}"
        try:
            await rt.get_thread(tid)
        except (ThreadNotFound, InvalidThreadId):
            return CLOSE_UNKNOWN_THREAD, f"Thread deleted: {tid}"
        except RuntimeClosed:
            pass
        return CLOSE_SERVICE_RESTART, "The server is shutting down"

    try:
        await websocket.accept()
        stream = FrameStream(
            websocket, subscription, websocket.app.state.ws_close_timeout_seconds,
            getattr(websocket.app.state, "metrics", None),
        )
        await stream.run(why_closed)
    finally:
        streams.discard(task)
        subscription.close()


async def _stream_runs(websocket: WebSocket) -> None:
    """``WS /api/stream``: the ``effect_changed`` frames of every thread."""
    rt = _runtime(websocket)
    try:
        subscription = rt.subscribe_runs()
    except RuntimeClosed:
        await websocket.accept()
        await websocket.close(CLOSE_SERVICE_RESTART, "The server is shutting down")
        return

    async def why_closed() -> tuple[int, str]:
        return CLOSE_SERVICE_RESTART, "The server is shutting down"

    try:
        await websocket.accept()
        stream = FrameStream(
            websocket, subscription, websocket.app.state.ws_close_timeout_seconds,
            getattr(websocket.app.state, "metrics", None),
        )
        await stream.run(why_closed)
    finally:
        subscription.close()


_BULK_FIELDS = frozenset({"name", "thread_id", "user_id", "tag", "since", "until"})


async def _bulk(request: Request, action: str) -> Response:
    """``POST /api/runs/cancel`` and ``/api/runs/replay``: one action on every match."""
    rt = _runtime(request)
    what = f"POST /api/runs/{action}"
    fields = _BULK_FIELDS | _CANCEL_FIELDS if action == "cancel" else _BULK_FIELDS
    body = await read_object(request, fields, what)
    filters: dict[str, Any] = {}
    for key in ("name", "thread_id", "user_id", "tag", "since", "until"):
        value = _optional_str(body, key, what)
        if value == "" and key == "thread_id":
            validate_thread_id(value)  # raises InvalidThreadId (400 invalid_thread_id)
        if value == "":
            raise ApiError(
                400, "invalid_argument",
                f"{what}: {key} must not be empty; leave it out (or null) to not filter by it",
            )
        filters[key] = value
    filters["thread_id"] = _filter_thread_id(filters["thread_id"])
    for key in ("since", "until"):
        raw = filters[key]
        filters[key] = _parse_instant(key, raw) if raw is not None else None
    _time_range(filters["since"], filters["until"])
    try:
        if action == "cancel":
            result = await rt.cancel_runs(canceled_by=_by(body, what), **filters)
        else:
            result = await rt.replay_runs(**filters)
    except EffectsError:
        raise
    except ValueError as exc:
        raise ApiError(400, "invalid_parameter", str(exc)) from None
    if action == "cancel":
        return JSONResponse({"canceled": result.count, "ids": result.ids, "more": result.more})
    return JSONResponse({
        "replayed": result.count, "ids": result.ids, "more": result.more,
        "skipped": result.skipped_count,
        "skippedRuns": [
            {"id": s.run_id, "threadId": s.thread_id,
             "error": runtime_error_status(s.error)[1], "message": str(s.error)}
            for s in result.skipped
        ],
    })


async def _cancel_all(request: Request) -> Response:
    return await _bulk(request, "cancel")


async def _replay_all(request: Request) -> Response:
    return await _bulk(request, "replay")


# ------------------------------------------------------- metrics and probes


async def _metrics(request: Request) -> Response:
    metrics: RuntimeMetrics = request.app.state.metrics
    try:
        await metrics.refresh()
    except RuntimeClosed:  # shutting down: the other figures still count
        pass
    except (DatabaseUnavailable, ThreadStorageError) as exc:
        if isinstance(exc, ThreadStorageError) and not exc.unavailable:
            raise
        # The database cannot be reached: the figures kept in this process still count
        # (exactly when an operator looks at them); only the pending gauge is left out.
        log.warning("metrics: thread_effects_pending_runs left out: %s", exc)
    return Response(metrics.exposition(), media_type=METRICS_CONTENT_TYPE)


async def _health(request: Request) -> Response:
    """Liveness: the process serves requests (no store is asked).

    Also names the storage backend, whether it holds a database connection (None for
    SQLite files), from what the backend last saw, and this process's node id.
    """
    body: dict[str, Any] = {"status": "ok"}
    rt: Runtime | None = getattr(request.app.state, "runtime", None)
    if rt is not None:
        body["backend"] = rt.storage.kind
        body["databaseConnected"] = rt.storage.connection_held()
        body["nodeId"] = rt.node_id
    return JSONResponse(body)


READY_LOG_REPEAT_SECONDS = 60.0
"""While readiness keeps failing for the same reason, its warning is repeated at most this
often (a probe every second would otherwise log a line a second per node)."""


class _ReadinessLog:
    """The log lines of failed readiness checks: one per reason, then one a minute.

    A WARNING at the first failure and whenever the reason changes, then at most one per
    `READY_LOG_REPEAT_SECONDS` while it lasts (saying how many checks failed since), and
    one INFO line when a check passes again.
    """

    def __init__(self) -> None:
        self._reason: str | None = None
        self._logged_at = 0.0
        self._since = 0

    def failed(self, reason: str) -> None:
        now = time.monotonic()
        if reason != self._reason:
            log.warning("readiness check failed: %s", reason)
            self._reason, self._logged_at, self._since = reason, now, 0
        elif now - self._logged_at >= READY_LOG_REPEAT_SECONDS:
            log.warning("readiness check still fails (%d check(s) since the last line): %s",
                        self._since, reason)
            self._logged_at, self._since = now, 0
        else:
            self._since += 1

    def ok(self) -> None:
        if self._reason is not None:
            log.info("readiness check passes again")
            self._reason, self._since = None, 0


async def _ready(request: Request) -> Response:
    """Readiness: the runtime runs and its stores answer; 503 otherwise."""
    rt: Runtime | None = getattr(request.app.state, "runtime", None)
    if rt is None:
        return error_response(503, "not_ready", "The runtime has not started")
    lines: _ReadinessLog | None = getattr(request.app.state, "readiness_log", None)
    if lines is None:
        lines = request.app.state.readiness_log = _ReadinessLog()
    try:
        await rt.check_ready()
    except RuntimeClosed as exc:
        return error_response(503, "not_ready", str(exc))
    except Exception as exc:  # a store that fails in any way is not ready
        lines.failed(str(exc))
        return error_response(503, "not_ready", f"{type(exc).__name__}: {exc}")
    lines.ok()
    return JSONResponse({"status": "ready"})


# -------------------------------------------------------------------------- errors


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def _runtime_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EffectsError)
    status, code = runtime_error_status(exc)
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc)
    headers = {"Retry-After": "5"} if code == "shutting_down" else None
    return error_response(status, code, str(exc), headers)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    message = exc.detail
    if exc.status_code == 404:
        message = f"No such path: {cut(request.method, 20)} {cut(request.url.path)}"
    elif exc.status_code == 405:
        message = f"Method {cut(request.method, 20)} is not allowed on {cut(request.url.path)}"
    return error_response(exc.status_code, code, message, dict(exc.headers or {}))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(
        500, "internal_error",
        f"Internal error while handling {cut(request.method, 20)} {cut(request.url.path)}: "
        f"{type(exc).__name__}; see the server log",
    )


# ---------------------------------------------------------------------------- app

Endpoint = Callable[[Request], Awaitable[Response]]


def _route(path: str, **by_method: Endpoint) -> Route:
    """One route per path, so a wrong method gets 405 with the full ``Allow`` list."""

    async def dispatch(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        for name, value in request.path_params.items():  # no id, key or name holds NUL
            if name != "tid" and isinstance(value, str) and NUL in value:  # tid: its own rule
                raise ApiError(400, "invalid_parameter", no_nul_message(f"path segment {name}"))
        return await by_method[method](request)

    return Route(path, dispatch, methods=list(by_method))



class _HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that does not send a request head in time.

    uvicorn times out idle keep-alive connections only after a response; a client that
    opens a connection and sends half a request head (or nothing) would hold it forever.
    """

    header_timeout_seconds = HEADER_TIMEOUT_SECONDS
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._header_timer is not None:
            self._header_timer.cancel()

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        waiting_for = self.cycle  # a new request head makes a new cycle
        self._header_timer = self.loop.call_later(
            self.header_timeout_seconds, self._header_timeout, waiting_for
        )

    def _header_timeout(self, waiting_for: object) -> None:
        if (
            self.cycle is waiting_for
            and self.transport.get_protocol() is self  # not upgraded to a WebSocket
            and not self.transport.is_closing()
        ):
            self.transport.close()


class _AbortingTransport:
    """A transport whose ``close()`` becomes ``abort()`` if the buffer has not gone out in time.

    ``close()`` of an asyncio transport waits until its write buffer drains; for a client
    that never reads, that is forever, and the connection (with every unsent frame) stays
    up. This one aborts it ``timeout_seconds`` after the close.
    """

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, timeout: float
    ) -> None:
        self._transport = transport
        self._loop = loop
        self._timeout = timeout
        self._abort: asyncio.TimerHandle | None = None

    def close(self) -> None:
        self._transport.close()
        if self._abort is None:
            self._abort = self._loop.call_later(self._timeout, self._reset)

    def _reset(self) -> None:
        # Still connected (connection_lost cancels this): the close is stuck behind
        # unsent bytes.
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            # Linger 0: the kernel drops the unsent bytes and sends a reset, rather than
            # keeping an orphaned socket alive for minutes retrying a peer that won't read.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._transport.abort()

    def cancel_abort(self) -> None:
        if self._abort is not None:
            self._abort.cancel()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _AbortingWebSockets(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol; a connection it closes is really gone after a timeout.

    A slow client dropped by `FrameStream` (or any socket whose close frame cannot be
    sent) is aborted `WS_CLOSE_TIMEOUT_SECONDS` after the close: its socket and its unsent
    frames are released.
    """

    close_timeout_seconds = WS_CLOSE_TIMEOUT_SECONDS

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(
            _AbortingTransport(
                transport, self.loop, self.close_timeout_seconds  # type: ignore[arg-type]
            )
        )
        self.close_timeout = self.close_timeout_seconds

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.transport.cancel_abort()  # type: ignore[attr-defined]

    def keepalive_timeout(self) -> None:
        """No pong within the ping timeout: say so in one line, then uvicorn's close (1011).

        A client that reads too slowly for its pong to come back in time (the frames ahead
        of the ping fill the kernel's buffers, so `FrameStream`'s queue never fills and it
        never sends 1013) or whose network is gone. Its close frame waits behind those
        frames; what cannot be delivered within ``close_timeout_seconds`` is aborted.
        """
        if not (self.close_sent or self.transport.is_closing()):
            client = _peer_text(self.client)
            scope = getattr(self, "scope", None)
            log.info("closing WebSocket %s (%s): no answer to a keepalive ping within "
                     "%.1f s: it reads too slowly, or its network is gone", client,
                     scope.get("path", "?") if scope is not None else "?",
                     self.ping_timeout or 0)
        super().keepalive_timeout()

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:  # the ASGI app gets this dict when its task first runs
            scope["extensions"][SEND_FRAMES_EXTENSION] = {
                "writable": self.frames_writable, "write": self.write_frames,
            }

    def frames_writable(self) -> bool:
        """Whether the socket takes more now (its transport is not paused).

        Raises:
            ClientDisconnected: the connection is closed or closing.
        """
        if self.disconnected or self.close_sent or self.conn.state is not WebSocketState.OPEN:
            raise ClientDisconnected()
        return self.writable.is_set()

    def write_frames(self, wire: bytes, payloads: list[bytes]) -> None:
        """Write ``wire``: each UTF-8 payload of ``payloads`` as a text message, in order.

        Without a negotiated extension (the server offers no compression, `server_options`)
        a server's text message is the same bytes for every client (a 2-to-10-byte header
        and the payload): ``wire`` is built once for every client at the same position.
        With one, each payload goes through the protocol object.

        Raises:
            ClientDisconnected: the connection is closed or closing.
        """
        conn = self.conn
        if self.disconnected or self.close_sent or conn.state is not WebSocketState.OPEN:
            raise ClientDisconnected()
        if conn.extensions:
            for payload in payloads:
                conn.send_text(payload)
            self.transport.write(b"".join(conn.data_to_send()))
            return
        self.transport.write(wire)


def _text_frame_header(length: int) -> bytes:
    """The header of an unmasked, final text frame (RFC 6455, 5.2) of ``length`` bytes."""
    if length < 126:
        return bytes((0x81, length))
    if length < 1 << 16:
        return b"\x81\x7e" + length.to_bytes(2, "big")
    return b"\x81\x7f" + length.to_bytes(8, "big")


class Server(uvicorn.Server):
    """uvicorn's server, shutting the runtime down before the connections (SIGINT/SIGTERM).

    uvicorn, on its own, closes every WebSocket (1012) at once, waits for open requests,
    and only then runs the lifespan shutdown, where the runtime gives running effects
    their grace period and re-queues the interrupted ones: their ``requeued`` frames would
    reach no client. This server stops listening, closes the runtime first (open requests
    and streams are still served during its grace period), gives open HTTP requests that
    same grace period counted from the signal and then cancels them (each answers 503
    ``shutting_down`` with ``Retry-After``, `InterruptedRequestMiddleware`), lets every
    stream deliver its last frames and close itself (1012, "The server is shutting down"),
    then does uvicorn's own shutdown (the lifespan's close of the runtime is then a
    no-op). Use it as ``uvicorn.Server``.
    """

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop listening, close the runtime and its streams, then shut uvicorn down."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = getattr(self.config.app, "state", None)
        rt = getattr(state, "runtime", None)
        if rt is not None:
            # Open requests (a long turn) get the runtime's grace period too, counted from
            # now, while the runtime closes; then they are cancelled and answer 503.
            requests = asyncio.ensure_future(
                self._finish_requests(rt.settings.shutdown_grace_seconds)
            )
            try:
                await rt.close()
            except Exception:
                log.exception("the runtime failed to close")
            await requests
            # Each stream now sends what it still holds, then its close frame.
            streams: set[asyncio.Task[Any]] = set(getattr(state, "streams", ()))
            if streams:
                await asyncio.wait(
                    streams,
                    timeout=getattr(
                        state, "ws_close_timeout_seconds", WS_CLOSE_TIMEOUT_SECONDS
                    ),
                )
        await super().shutdown(sockets)

    async def _finish_requests(self, grace_seconds: float) -> None:
        """Wait up to ``grace_seconds`` for open requests; cancel the rest and let them answer.

        A cancelled request answers 503 ``shutting_down`` (`InterruptedRequestMiddleware`)
        within `REQUEST_CANCEL_SECONDS`; uvicorn alone would cancel it and exit without
        waiting, leaving the client an empty reply.
        """
        state = getattr(self.config.app, "state", None)
        tasks = set(getattr(state, "requests", ()))
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_seconds)
        if not pending:
            return
        log.warning("%d request(s) still open after the %gs grace period: interrupting them",
                    len(pending), grace_seconds)
        for task in pending:
            task.cancel(msg="the server is shutting down")
        await asyncio.wait(pending, timeout=REQUEST_CANCEL_SECONDS)


def server_options(
    *,
    header_timeout_seconds: float = HEADER_TIMEOUT_SECONDS,
    ws_close_timeout_seconds: float = WS_CLOSE_TIMEOUT_SECONDS,
    ws_ping_interval_seconds: float = WS_PING_INTERVAL_SECONDS,
    ws_ping_timeout_seconds: float = WS_PING_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """The uvicorn settings this app is meant to run with: ``uvicorn.Config(app, **these)``.

    - a connection must send a complete request head within ``header_timeout_seconds``
      of opening (or of its previous answer), else it is closed;
    - an idle keep-alive connection is closed after `KEEP_ALIVE_SECONDS`;
    - request heads over 16 KiB are refused (uvicorn's 400);
    - a WebSocket the server closes is aborted ``ws_close_timeout_seconds`` later if its
      close could not be delivered (a client that does not read): socket and unsent
      frames are released;
    - WebSocket messages are not compressed (no permessage-deflate): a frame is the same
      bytes for every client, and several go out in one socket write (`FrameStream`);
    - every ``ws_ping_interval_seconds`` the server pings each WebSocket; one whose pong
      has not come back ``ws_ping_timeout_seconds`` later is closed (1011, logged in one
      line): a client that reads too slowly for its pong to come back, or is gone.

    Bodies are bounded by `BodyLimitMiddleware` (size, and `BODY_IDLE_TIMEOUT_SECONDS`).

    Args:
        header_timeout_seconds: See above (tests make it short).
        ws_close_timeout_seconds: See above; give `create_app` the same value.
        ws_ping_interval_seconds: See above (uvicorn's default, 20 s).
        ws_ping_timeout_seconds: See above (uvicorn's default, 20 s).

    Returns:
        Keyword arguments for ``uvicorn.Config``.
    """
    protocol = type(
        "HeaderTimeoutH11", (_HeaderTimeoutH11,),
        {"header_timeout_seconds": header_timeout_seconds},
    )
    ws_protocol = type(
        "AbortingWebSockets", (_AbortingWebSockets,),
        {"close_timeout_seconds": ws_close_timeout_seconds},
    )
    return {
        "http": protocol,
        "ws": ws_protocol,
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,  # uvicorn wants an int
        # Frames go out uncompressed: the same bytes for every client, made once
        # (compressing is per connection, per frame, on the loop).
        "ws_per_message_deflate": False,
        "ws_ping_interval": ws_ping_interval_seconds,
        "ws_ping_timeout": ws_ping_timeout_seconds,
        "h11_max_incomplete_event_size": 16 * 1024,
    }


class _App(Starlette):
    """The app; a start-up refused for a known reason is reported in one line.

    A data directory in use, a bad effect file, a model that cannot be used: the server
    logs ``DataDirLocked: Data directory data is in use by pid 123; ...`` and exits, not
    a traceback of the lifespan machinery around that line.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve ``scope``; for the lifespan, shorten a known start-up failure's message."""
        if scope["type"] != "lifespan":
            await super().__call__(scope, receive, send)
            return

        async def lifespan_send(message: ASGIMessage) -> None:
            error = getattr(self.state, "startup_error", None)
            if message["type"] == "lifespan.startup.failed" and error is not None:
                message = {**message, "message": f"{type(error).__name__}: {error}"}
            await send(message)

        await super().__call__(scope, receive, lifespan_send)


def create_app(
    *,
    data_dir: str | os.PathLike[str],
    app_dir: str | os.PathLike[str] | None = None,
    api_token: str | None = None,
    trusted_hosts: Sequence[str] | None = None,
    web_dir: str | os.PathLike[str] | None = DEFAULT_WEB_DIR,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_idle_timeout_seconds: float = BODY_IDLE_TIMEOUT_SECONDS,
    body_timeout_seconds: float = BODY_TIMEOUT_SECONDS,
    ws_close_timeout_seconds: float = WS_CLOSE_TIMEOUT_SECONDS,
    clock: Clock | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    **settings: Any,
) -> Starlette:
    """Build the Starlette app: the API of ``docs/http-api.md``, the stream and the pane.

    The `Runtime` is created and started in the lifespan (``app.state.runtime``) and closed
    on shutdown: runs still going after ``shutdown_grace_seconds`` are re-queued.

    Args:
        data_dir: The runtime's data directory.
        app_dir: The application folder (its ``effects/`` holds the effects).
        api_token: When set, every ``/api/...`` call needs ``Authorization: Bearer <token>``
            and the WebSocket ``?token=<token>``. Must not be empty.
        trusted_hosts: When set, requests whose ``Host`` names another host get 400.
        web_dir: The pane's static files (``index.html`` at ``/``, the rest at
            ``/web/<file>``); None serves no pane.
        max_body_bytes: Largest request body of any route, in bytes (over it: 413 at
            once, see `BodyLimitMiddleware`).
        body_idle_timeout_seconds: A request whose body stalls this long gets 408.
        body_timeout_seconds: A request whose whole body takes longer than this (from
            the route's first read) gets 408.
        ws_close_timeout_seconds: How long the stream tries to deliver its last frames
            and close frame to a client (see `server_options`).
        clock: The runtime's clock (`runtime.testing.FakeClock` in tests).
        extra_routes: More routes, after the built-in ones (which win on a collision).
            The messages routes and the app's thread endpoints (``agents/api/``,
            see `runtime.endpoints`) are always mounted.
        **settings: Any other field of `runtime.config.Settings`.

    Returns:
        The ASGI application.

    Raises:
        ValueError: an empty ``api_token``, a ``max_body_bytes`` below 1, or a timeout
            that is not above 0.
        AgentDefinitionError: a thread endpoint file is invalid or collides with a route.
        pydantic.ValidationError: an unknown or invalid setting.
    """
    if api_token is not None and not api_token:
        raise ValueError("api_token must not be empty (use None for no token)")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
    for name, seconds in (
        ("body_idle_timeout_seconds", body_idle_timeout_seconds),
        ("body_timeout_seconds", body_timeout_seconds),
        ("ws_close_timeout_seconds", ws_close_timeout_seconds),
    ):
        if not seconds > 0:
            raise ValueError(f"{name} must be above 0 seconds, got {seconds!r}")
    # Validated now, so a bad setting fails at startup of the program, not of the server.
    Settings(
        data_dir=Path(data_dir),
        app_dir=Path(app_dir) if app_dir is not None else None,
        **settings,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        rt = Runtime(data_dir=data_dir, app_dir=app_dir, clock=clock, **settings)
        # Before the start, so nothing the runtime does is missed by the counters.
        metrics = RuntimeMetrics(rt)
        try:
            await rt.start()
        except EffectsError as exc:
            app.state.startup_error = exc  # reported in one line (`_App`)
            raise
        try:
            app.state.metrics = metrics
            app.state.runtime = rt
            yield
        finally:
            await rt.close()
            metrics.close()

    routes: list[BaseRoute] = [
        _route("/api/threads", GET=_list_threads, POST=_create_thread),
        _route("/api/threads/{tid}", GET=_get_thread, DELETE=_delete_thread),
        _route("/api/threads/{tid}/pause", POST=_pause_thread),
        _route("/api/threads/{tid}/resume", POST=_resume_thread),
        _route("/api/threads/{tid}/effects", GET=_list_runs, POST=_schedule),
        _route("/api/threads/{tid}/effects/{run_id}", GET=_get_run),
        _route("/api/threads/{tid}/effects/{run_id}/run", POST=_run_now),
        _route("/api/threads/{tid}/effects/{run_id}/replay", POST=_replay),
        _route("/api/threads/{tid}/effects/{run_id}/cancel", POST=_cancel),
        _route("/api/threads/{tid}/schedules", GET=_list_schedules, POST=_create_schedule),
        _route("/api/threads/{tid}/schedules/{sid}", GET=_get_schedule),
        _route("/api/threads/{tid}/schedules/{sid}/pause", POST=_pause_schedule),
        _route("/api/threads/{tid}/schedules/{sid}/resume", POST=_resume_schedule),
        _route("/api/threads/{tid}/schedules/{sid}/cancel", POST=_cancel_schedule),
        _route("/api/threads/{tid}/effect-records", GET=_list_effect_records),
        _route("/api/threads/{tid}/effect-records/{key:path}", GET=_get_effect_record),
        _route("/api/effects", GET=_list_effects),
        _route("/api/runs", GET=_list_all_runs),
        _route("/api/runs/cancel", POST=_cancel_all),
        _route("/api/runs/replay", POST=_replay_all),
        _route("/api/agents", GET=_list_agents),
        _route("/api/health", GET=_health),
        _route("/api/ready", GET=_ready),
        _route("/metrics", GET=_metrics),
        WebSocketRoute("/api/threads/{tid}/stream", _stream),
        WebSocketRoute("/api/stream", _stream_runs),
    ]
    # Conversations and the app's thread endpoints (runtime/endpoints.py, docs/agents.md),
    # after the built-in routes, which win on an overlap. A bad file in <app_dir>/api/
    # raises AgentDefinitionError here, naming it.
    routes.extend(message_routes())
    routes.extend(thread_endpoint_routes(Path(app_dir) if app_dir is not None else None))
    if web_dir is not None and Path(web_dir).is_dir():
        pane_dir = Path(web_dir).resolve()
        routes.append(Route("/", _pane_route(pane_dir), methods=["GET"]))
        routes.append(Mount("/web", app=_PaneFiles(directory=pane_dir), name="web"))
    routes.extend(extra_routes)

    app = _App(
        routes=routes,
        middleware=[
            Middleware(TracingMiddleware),
            Middleware(InterruptedRequestMiddleware),
            Middleware(GuardMiddleware, api_token=api_token, trusted_hosts=trusted_hosts),
            Middleware(
                BodyLimitMiddleware,
                max_body_bytes=max_body_bytes,
                body_idle_timeout_seconds=body_idle_timeout_seconds,
                body_timeout_seconds=body_timeout_seconds,
            ),
        ],
        exception_handlers={
            ApiError: _api_error,
            EffectsError: _runtime_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )
    app.state.max_body_bytes = max_body_bytes
    app.state.ws_close_timeout_seconds = ws_close_timeout_seconds
    app.state.streams = set()  # the tasks serving open WebSocket streams
    app.state.fanouts = {}  # a thread's event log → the `_FanOut` writing it to its clients
    app.state.requests = set()  # the tasks serving open HTTP requests (`Server.shutdown`)
    return app
