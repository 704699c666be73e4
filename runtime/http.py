"""The HTTP and WebSocket API (``docs/http-api.md``) and the Effects pane, as a Starlette app.

`create_app` builds the application; the `runtime.Runtime` is created and started in the
app's lifespan and closed (with its shutdown grace) when the server stops.
`runtime.serve` (``server.py``, ``thread-effects serve``) only parses options and runs uvicorn.

Guards, in this order, on every request:

1. *Host* (only when ``trusted_hosts`` is given — ``server.py`` does for loopback without a
   token): the ``Host`` header must name one of them, so a DNS-rebinding page cannot talk to
   a server on 127.0.0.1 as if it were its own origin.
2. *Origin*: a browser request that changes something (POST, DELETE, …) or opens the
   WebSocket must come from the server's own origin. Other clients send no ``Origin``.
3. *Token* (when ``api_token`` is set): every ``/api/...`` path (the WebSocket too) and
   every other route (``extra_routes``, such as a webhook) need it; the pane's static files
   (``/``, ``/web/...``) do not (they hold no data), and a path outside ``/api/`` that no
   route serves is answered a JSON 404 without it.

Errors are JSON ``{"error": {"code": "<snake_case>", "message": "..."}}``; the WebSocket is
refused by closing it with a 44xx code after accepting (browsers cannot see an HTTP status
of a refused handshake): 4400 malformed thread id, 4401 token, 4403 origin or host, 4404
unknown thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hmac
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.datastructures import Headers, QueryParams
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as ASGIMessage
from starlette.websockets import WebSocket, WebSocketDisconnect

from runtime._http_errors import error_response, runtime_error_status
from runtime._text import find_invalid_text
from runtime.alarms import Clock
from runtime.config import Settings
from runtime.effects import iso
from runtime.endpoints import message_routes, thread_endpoint_routes
from runtime.errors import (
    EffectsError,
    InvalidThreadId,
    RuntimeClosed,
    SubscriptionOverflow,
    ThreadNotFound,
)
from runtime.frames import Subscription, ThreadEvent
from runtime.storage.base import ThreadInfo
from runtime.supervisor import Runtime
from runtime.thread import ThreadState

log = logging.getLogger("runtime.http")

DEFAULT_WEB_DIR = Path(__file__).resolve().parent.parent / "web"
"""The pane's static files in a source checkout (``<repo>/web``)."""

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
"""Largest request body read (2 MiB); a larger one is refused with 413 before parsing."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""Host names a loopback-only server answers to (see the *Host* guard above)."""

CLOSE_INVALID_THREAD_ID = 4400
CLOSE_POLICY = 4403
CLOSE_TOKEN = 4401
CLOSE_UNKNOWN_THREAD = 4404
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_SERVICE_RESTART = 1012

WS_CLOSE_REASON_BYTES = 123
"""Longest close reason a WebSocket close frame can carry, in bytes of UTF-8."""

WS_CLOSE_TIMEOUT_SECONDS = 10.0
"""How long the stream waits to get its close frame (or last frames) out to a client."""

_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_THREAD_FIELDS = frozenset({"id", "agent_id", "user_id", "tags"})
_SCHEDULE_FIELDS = frozenset({"name", "args", "delay_seconds"})


class ApiError(Exception):
    """An HTTP error answer: ``status`` with the JSON body ``{"error": {code, message}}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(message)


# --------------------------------------------------------------------------- guards


def _host_name(host: str) -> str:
    """``"[::1]:8000"`` → ``"::1"``, ``"Example.org:80"`` → ``"example.org"``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_public_path(path: str) -> bool:
    return path == "/" or path.startswith("/web/")


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
                f"Host {host!r} is not served here; use one of: {', '.join(sorted(self._hosts))}",
                CLOSE_POLICY,
            )
        origin = headers.get("origin")
        is_ws = scope["type"] == "websocket"
        if origin is not None and (is_ws or scope["method"] in _UNSAFE_METHODS):
            if urlsplit(origin).netloc.lower() != host.lower():
                raise _Refusal(
                    403, "forbidden_origin",
                    f"Cross-origin request from {origin} refused",
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


class InterruptedRequestMiddleware:
    """Answer JSON 503 ``shutting_down`` for a request cancelled before it answered.

    On SIGINT/SIGTERM uvicorn gives open requests ``timeout_graceful_shutdown`` seconds
    (``server.py``: 5), then cancels them; uncaught, the cancellation would reach uvicorn,
    which logs a traceback and sends a plain-text 500. A request (a long turn, say) that
    had not started its answer gets ``{"error": {"code": "shutting_down", ...}}`` with
    ``Retry-After`` instead; what it stored before stays stored.

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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: Request, limit: int, *, required: bool = True) -> Any:
    r"""Read and parse a JSON request body of at most ``limit`` bytes.

    The size is checked from ``Content-Length`` before anything is read, and again while
    reading (for chunked bodies), so an oversized body is never buffered whole.

    Returns:
        The parsed value, or None for an empty body when ``required`` is False.

    Raises:
        ApiError: 413 over the limit; 400 when empty (and required), not valid JSON, or
            holding a string that is not valid Unicode (a lone surrogate such as
            ``"\ud800"``).
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "invalid_body", f"Invalid Content-Length {declared!r}") from None
        if size > limit:
            raise ApiError(
                413, "body_too_large",
                f"Request body is {size} bytes; the limit is {limit} bytes",
            )
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(
                413, "body_too_large", f"Request body exceeds the limit of {limit} bytes"
            )
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.strip():
        if required:
            raise ApiError(400, "invalid_body", "Request body must be a JSON object")
        return None
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, "invalid_json", f"Request body is not valid JSON: {exc}") from None
    # JSON may spell lone surrogates ("\ud800"), which are not text: nothing could store
    # or answer them, so the body is refused before any route sees it.
    problem = find_invalid_text(value)
    if problem is not None:
        raise ApiError(
            400, "invalid_json",
            f"Request body is not valid JSON text: {problem}, which is not valid Unicode",
        )
    return value


def _object(value: Any, allowed: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_body", f"{what}: the body must be a JSON object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ApiError(
            400, "invalid_body",
            f"{what}: unknown field(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}",
        )
    return value


def _optional_str(body: dict[str, Any], key: str, what: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, "invalid_body", f"{what}: {key} must be a string or null")
    return value


def _page_params(request: Request) -> tuple[int, str | None]:
    raw = request.query_params.get("limit")
    limit = 50
    if raw is not None:
        try:
            limit = int(raw)
        except ValueError:
            raise ApiError(
                400, "invalid_parameter", f"limit must be an integer from 1 to 500, got {raw!r}"
            ) from None
    cursor = request.query_params.get("cursor") or None
    return limit, cursor


def thread_json(info: ThreadInfo) -> dict[str, Any]:
    """A thread's wire form: ``{"id", "createdAt", "agentId", "userId", "tags"}``."""
    return {
        "id": info.id,
        "createdAt": iso(info.created_at_ts),
        "agentId": info.agent_id,
        "userId": info.user_id,
        "tags": list(info.tags),
    }


async def _thread(request: Request) -> ThreadState:
    return await _runtime(request).get_thread(request.path_params["tid"])


# --------------------------------------------------------------------------- routes


async def _create_thread(request: Request) -> Response:
    what = "POST /api/threads"
    body = _object(
        await read_json(request, request.app.state.max_body_bytes, required=False) or {},
        _THREAD_FIELDS, what,
    )
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


async def _list_threads(request: Request) -> Response:
    limit, cursor = _page_params(request)
    try:
        page = await _runtime(request).list_threads(limit=limit, cursor=cursor)
    except ValueError as exc:  # a bad limit or a malformed cursor
        raise ApiError(400, "invalid_parameter", str(exc)) from None
    return JSONResponse(
        {"threads": [thread_json(t) for t in page.threads], "nextCursor": page.next_cursor}
    )


async def _get_thread(request: Request) -> Response:
    state = await _thread(request)
    info = ThreadInfo(
        id=state.thread_id,
        created_at_ts=state.created_at.timestamp(),
        agent_id=state.agent_id,
        user_id=state.user_id,
        tags=state.tags,
    )
    return JSONResponse(thread_json(info))


async def _delete_thread(request: Request) -> Response:
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
    name = request.query_params.get("name") or None
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


async def _schedule(request: Request) -> Response:
    what = f"POST /api/threads/{request.path_params['tid']}/effects"
    state = await _thread(request)
    body = _object(
        await read_json(request, request.app.state.max_body_bytes), _SCHEDULE_FIELDS, what
    )
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "invalid_body", f"{what}: name must be a non-empty string")
    delay = body.get("delay_seconds")
    run_id = await state.schedule_effect(name, body.get("args"), 0 if delay is None else delay)
    return JSONResponse({"id": run_id}, status_code=201)


async def _get_run(request: Request) -> Response:
    state = await _thread(request)
    run = await state.get_run(request.path_params["run_id"])
    return JSONResponse(run.to_json(include_args=True))


async def _run_now(request: Request) -> Response:
    state = await _thread(request)
    run = await state.run_now(request.path_params["run_id"])
    return JSONResponse({"id": run.id, "status": str(run.status)})


async def _replay(request: Request) -> Response:
    state = await _thread(request)
    new_id = await state.replay(request.path_params["run_id"])
    return JSONResponse({"id": new_id}, status_code=201)


async def _cancel(request: Request) -> Response:
    state = await _thread(request)
    run_id = request.path_params["run_id"]
    canceled = await state.remove_scheduled_effect(run_id)
    if not canceled:
        await state.get_run(run_id)  # RunNotFound (404) for an id the thread never had
    return JSONResponse({"canceled": canceled})


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


# ------------------------------------------------------------------------ the stream


class _End(enum.Enum):
    OVERFLOW = "overflow"
    CLOSED = "closed"


class FrameStream:
    """One WebSocket client of a thread's ``effect_changed`` and ``message_created`` frames.

    A pump moves events from the `Subscription` into this client's bounded queue without
    ever waiting for the client; a writer sends them. If the queue holds ``max_queued``
    unsent frames (the client reads too slowly) the client is closed with 1013 — the
    runtime and the other clients never wait for it. Frames are the events' ``to_frame()``
    (`EffectChanged`, which never carries args, and `MessageCreated`).

    Args:
        websocket: The accepted socket.
        subscription: The thread's subscription (closed when the stream ends).
        max_queued: Frames buffered for this client before it is dropped.
        close_timeout_seconds: How long to try to deliver the final frames and the close.
    """

    def __init__(
        self,
        websocket: WebSocket,
        subscription: Subscription,
        max_queued: int,
        close_timeout_seconds: float = WS_CLOSE_TIMEOUT_SECONDS,
    ) -> None:
        self.websocket = websocket
        self.subscription = subscription
        self.max_queued = max_queued
        self.close_timeout_seconds = close_timeout_seconds
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()

    async def _pump(self) -> _End:
        try:
            async for event in self.subscription:
                if self._queue.qsize() >= self.max_queued:
                    return _End.OVERFLOW
                self._queue.put_nowait(_frame_text(event))
        except SubscriptionOverflow:
            return _End.OVERFLOW
        self._queue.put_nowait(None)  # the writer sends what is queued, then stops
        return _End.CLOSED

    async def _write(self) -> None:
        while (text := await self._queue.get()) is not None:
            await self.websocket.send_text(text)

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
        pump = asyncio.create_task(self._pump(), name="frames-pump")
        writer = asyncio.create_task(self._write(), name="frames-writer")
        reader = asyncio.create_task(self._read(), name="frames-reader")
        tasks = (pump, writer, reader)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if not pump.done():
                return  # the client left, or sending failed: nothing more to do
            if pump.result() is _End.OVERFLOW:
                writer.cancel()
                log.info(
                    "closing a slow client of thread %s: %d frames unsent",
                    self.subscription.thread_id, self._queue.qsize(),
                )
                await self._close(
                    CLOSE_TRY_AGAIN_LATER,
                    f"Too slow: over {self.max_queued} frames queued; reload and reconnect",
                )
                return
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
            self.subscription.close()
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


def _frame_text(event: ThreadEvent) -> str:
    return json.dumps(event.to_frame(), separators=(",", ":"))


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
    # Subscribed before accepting: the client misses nothing from the moment it is open.
    subscription = state.subscribe()

    async def why_closed() -> tuple[int, str]:
        try:
            await rt.get_thread(tid)
        except (ThreadNotFound, InvalidThreadId):
            return CLOSE_UNKNOWN_THREAD, f"Thread deleted: {tid}"
        except RuntimeClosed:
            pass
        return CLOSE_SERVICE_RESTART, "The server is shutting down"

    try:
        await websocket.accept()
        stream = FrameStream(websocket, subscription, rt.settings.subscriber_queue_size)
        await stream.run(why_closed)
    finally:
        subscription.close()


# -------------------------------------------------------------------------- errors


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message)


async def _runtime_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EffectsError)
    status, code = runtime_error_status(exc)
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc)
    return error_response(status, code, str(exc))


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    message = exc.detail
    if exc.status_code == 404:
        message = f"No such path: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}"
    return error_response(exc.status_code, code, message, dict(exc.headers or {}))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(
        500, "internal_error",
        f"Internal error while handling {request.method} {request.url.path}: "
        f"{type(exc).__name__}; see the server log",
    )


# ---------------------------------------------------------------------------- app

Endpoint = Callable[[Request], Awaitable[Response]]


def _route(path: str, **by_method: Endpoint) -> Route:
    """One route per path, so a wrong method gets 405 with the full ``Allow`` list."""

    async def dispatch(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await by_method[method](request)

    return Route(path, dispatch, methods=list(by_method))



def create_app(
    *,
    data_dir: str | os.PathLike[str],
    app_dir: str | os.PathLike[str] | None = None,
    api_token: str | None = None,
    trusted_hosts: Sequence[str] | None = None,
    web_dir: str | os.PathLike[str] | None = DEFAULT_WEB_DIR,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
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
        max_body_bytes: Largest request body, in bytes (over it: 413 before parsing).
        clock: The runtime's clock (`runtime.testing.FakeClock` in tests).
        extra_routes: More routes, after the built-in ones (which win on a collision).
            The messages routes and the app's thread endpoints (``agents/api/``,
            see `runtime.endpoints`) are always mounted.
        **settings: Any other field of `runtime.config.Settings`.

    Returns:
        The ASGI application.

    Raises:
        ValueError: an empty ``api_token`` or a ``max_body_bytes`` below 1.
        AgentDefinitionError: a thread endpoint file is invalid or collides with a route.
        pydantic.ValidationError: an unknown or invalid setting.
    """
    if api_token is not None and not api_token:
        raise ValueError("api_token must not be empty (use None for no token)")
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
    # Validated now, so a bad setting fails at startup of the program, not of the server.
    Settings(
        data_dir=Path(data_dir),
        app_dir=Path(app_dir) if app_dir is not None else None,
        **settings,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        rt = Runtime(data_dir=data_dir, app_dir=app_dir, clock=clock, **settings)
        async with rt:
            app.state.runtime = rt
            yield

    routes: list[BaseRoute] = [
        _route("/api/threads", GET=_list_threads, POST=_create_thread),
        _route("/api/threads/{tid}", GET=_get_thread, DELETE=_delete_thread),
        _route("/api/threads/{tid}/effects", GET=_list_runs, POST=_schedule),
        _route("/api/threads/{tid}/effects/{run_id}", GET=_get_run),
        _route("/api/threads/{tid}/effects/{run_id}/run", POST=_run_now),
        _route("/api/threads/{tid}/effects/{run_id}/replay", POST=_replay),
        _route("/api/threads/{tid}/effects/{run_id}/cancel", POST=_cancel),
        _route("/api/effects", GET=_list_effects),
        _route("/api/agents", GET=_list_agents),
        WebSocketRoute("/api/threads/{tid}/stream", _stream),
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

    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(InterruptedRequestMiddleware),
            Middleware(GuardMiddleware, api_token=api_token, trusted_hosts=trusted_hosts),
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
    return app
