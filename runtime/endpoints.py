"""Thread endpoints (file-based routes in ``agents/api/``) and the messages routes.

Thread endpoints follow the Standard Agents file conventions: each file in ``agents/api/``
(sub-folders nest) is one route beneath ``/api/threads/{tid}/``::

    agents/api/status.py              GET    /api/threads/{tid}/status
    agents/api/export.post.py         POST   /api/threads/{tid}/export
    agents/api/notes/index.py         GET    /api/threads/{tid}/notes
    agents/api/notes/[note_id].py     GET    /api/threads/{tid}/notes/{note_id}
    agents/api/files/[*].put.py       PUT    /api/threads/{tid}/files/<the rest of the path>

A file without a method suffix answers GET; suffixes are ``.get``, ``.post``, ``.put``,
``.patch`` and ``.delete``. ``[name]`` captures one path segment as ``params["name"]``,
``[*]`` (last only) the rest of the path as ``params["*"]``. Files and folders starting with
``_`` are skipped: they are helpers, imported relatively (``from ._common import x``,
``from .._shared import y``). Each file defines one endpoint::

    async def handler(request: Request, state: ThreadState, params: dict[str, str]):
        return {"pending": len(await state.get_scheduled_effects())}

    endpoint = define_thread_endpoint(handler)

The handler gets the Starlette request, the thread's `ThreadState` (``execution`` is None)
and the captured params, and returns a Starlette ``Response``, None (204), or any
JSON-serializable value (200). An unknown thread is a 404 (a malformed id a 400); a
handler that raises a Starlette ``HTTPException`` answers with its status; any other
exception is logged and answered with a JSON 500 that carries no stack trace.

A file whose route collides with a built-in thread route (``effects``, ``stream``,
``messages``, or the thread itself) or with another file's route stops startup with an
`AgentDefinitionError` naming the file(s).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from runtime._http_errors import error_response, runtime_error_status
from runtime._text import find_invalid_text
from runtime.agents import load_definition
from runtime.discovery import app_package, module_segment
from runtime.errors import (
    AgentDefinitionError,
    AgentNotFound,
    EffectsError,
    InvalidThreadId,
    ThreadNotFound,
)
from runtime.messages import MAX_CONTENT_CHARS

if TYPE_CHECKING:
    from runtime.supervisor import Runtime
    from runtime.thread import ThreadState

log = logging.getLogger("runtime.endpoints")

BUILTIN_THREAD_ROUTES = frozenset({"effects", "stream", "messages"})
"""First path segments beneath ``/api/threads/{tid}/`` that the runtime itself serves."""

METHODS = ("get", "post", "put", "patch", "delete")

MAX_MESSAGE_BODY_BYTES = 1 << 20
"""Largest ``POST .../messages`` body (1 MiB)."""

_STATIC_RE = re.compile(r"^[A-Za-z0-9_-]+\Z")
_PARAM_RE = re.compile(r"^\[([A-Za-z_][A-Za-z0-9_]*)\]\Z")
_REST = "[*]"
_REST_PARAM = "_rest"
_RESERVED_PARAMS = frozenset({"tid", _REST_PARAM})

EndpointHandler = Callable[..., Awaitable[Any] | Any]
RuntimeGetter = Callable[[Request], "Runtime"]


@dataclass(frozen=True, slots=True)
class ThreadEndpointDefinition:
    """What `define_thread_endpoint` returns.

    Attributes:
        handler: ``handler(request, state, params)``; async, or sync (then run in a
            worker thread).
    """

    handler: EndpointHandler

    async def call(self, request: Request, state: ThreadState, params: dict[str, str]) -> Any:
        """Run the handler and return its result."""
        if inspect.iscoroutinefunction(self.handler):
            return await self.handler(request, state, params)
        result = await anyio.to_thread.run_sync(partial(self.handler, request, state, params))
        if inspect.isawaitable(result):
            return await result
        return result


def define_thread_endpoint(handler: EndpointHandler) -> ThreadEndpointDefinition:
    """Define a thread endpoint; assign the result to a module-level name in ``agents/api/``.

    The file's path is the route (see the module docstring).

    Args:
        handler: ``handler(request, state, params)`` returning a Starlette ``Response``,
            None, or a JSON-serializable value.

    Raises:
        TypeError: ``handler`` is not callable.
    """
    if not callable(handler):
        raise TypeError(f"define_thread_endpoint: handler must be callable, got {handler!r}")
    return ThreadEndpointDefinition(handler)


@dataclass(frozen=True, slots=True)
class ThreadEndpoint:
    """One discovered endpoint.

    Attributes:
        method: The HTTP method (upper case).
        path: The route beneath the thread, e.g. ``"/notes/{note_id}"``.
        file: The file that defines it.
        definition: Its handler.
    """

    method: str
    path: str
    file: Path
    definition: ThreadEndpointDefinition

    @property
    def shape(self) -> str:
        """The route with parameter names erased: two endpoints of one shape collide.

        ``[name]`` (one segment) and ``[*]`` (the rest) have different shapes, so
        ``q/[a].py`` and ``q/[*].py`` live side by side: ``/q/x`` goes to the first,
        ``/q/x/y`` to the second.
        """
        return re.sub(r"\{[^}]+\}", "{}", self.path.replace(f"{{{_REST_PARAM}:path}}", "*"))

    def _sort_key(self) -> list[tuple[int, str]]:
        # Static segments before parameters before the catch-all, so Starlette (which
        # takes the first match) picks the most specific route.
        key = []
        for segment in self.path.strip("/").split("/"):
            if segment.startswith("{") and segment.endswith(":path}"):
                key.append((2, ""))
            elif segment.startswith("{"):
                key.append((1, ""))
            else:
                key.append((0, segment))
        return key


def _route_of(api_dir: Path, path: Path) -> tuple[str, str]:
    rel = path.relative_to(api_dir)
    stem = rel.name[: -len(".py")]
    method = "GET"
    if "." in stem:
        stem, suffix = stem.rsplit(".", 1)
        if suffix.lower() not in METHODS:
            raise AgentDefinitionError(
                f"{path}: unknown method suffix {suffix!r}; use one of "
                f"{', '.join('.' + m for m in METHODS)} (or none for GET)"
            )
        method = suffix.upper()
    raw = [*rel.parts[:-1], stem]
    if raw[-1] == "index":
        raw = raw[:-1]
    segments: list[str] = []
    seen: set[str] = set()
    for i, part in enumerate(raw):
        if part == _REST:
            if i != len(raw) - 1:
                raise AgentDefinitionError(
                    f"{path}: [*] captures the rest of the path; it must be last"
                )
            segments.append(f"{{{_REST_PARAM}:path}}")
            continue
        param = _PARAM_RE.match(part)
        if param:
            name = param.group(1)
            if name in _RESERVED_PARAMS or name in seen:
                raise AgentDefinitionError(
                    f"{path}: parameter name {name!r} is reserved or used twice in the route"
                )
            seen.add(name)
            segments.append(f"{{{name}}}")
            continue
        if not _STATIC_RE.match(part):
            raise AgentDefinitionError(
                f"{path}: path segment {part!r} must be letters, digits, '_' or '-', "
                f"[name] or [*]"
            )
        segments.append(part)
    if not segments:
        raise AgentDefinitionError(
            f"{path}: routes to /api/threads/{{tid}} itself, which is a built-in route"
        )
    if segments[0] in BUILTIN_THREAD_ROUTES:
        raise AgentDefinitionError(
            f"{path}: route /api/threads/{{tid}}/{'/'.join(segments)} collides with the "
            f"built-in route /api/threads/{{tid}}/{segments[0]}; rename the file or folder"
        )
    return method, "/" + "/".join(segments)


def discover_thread_endpoints(app_dir: Path | None) -> list[ThreadEndpoint]:
    """Load every endpoint file of ``<app_dir>/api``, most specific route first.

    Raises:
        AgentDefinitionError: naming the file, for a bad file name, an import error, no or
            several definitions, or a route that collides with a built-in route or another
            file's route.
    """
    if app_dir is None:
        return []
    root = Path(app_dir).resolve()
    api_dir = root / "api"
    if not api_dir.is_dir():
        return []
    found: dict[tuple[str, str], ThreadEndpoint] = {}
    for path in sorted(api_dir.rglob("*.py")):
        rel = path.relative_to(api_dir)
        if any(part.startswith("_") for part in rel.parts):
            continue
        method, route = _route_of(api_dir, path)
        # Every folder on the way is a package, so the file's relative imports work.
        package = app_package(root, "api", *rel.parts[:-1])
        module_name = f"{package}.{module_segment(rel.name[: -len('.py')])}"
        definition = load_definition(
            path, module_name, ThreadEndpointDefinition, "thread endpoint"
        )
        endpoint = ThreadEndpoint(method, route, path, definition)
        other = found.get((method, endpoint.shape))
        if other is not None:
            raise AgentDefinitionError(
                f"{path}: {method} /api/threads/{{tid}}{route} collides with {other.file} "
                f"({method} /api/threads/{{tid}}{other.path})"
            )
        found[(method, endpoint.shape)] = endpoint
    return sorted(found.values(), key=lambda e: (e._sort_key(), e.method))


# ---------------------------------------------------------------------- HTTP glue


def _error(status: int, code: str, message: str) -> JSONResponse:
    return error_response(status, code, message)


def _default_runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


async def _thread_or_error(rt: Runtime, tid: str) -> ThreadState | JSONResponse:
    try:
        return await rt.get_thread(tid)
    except InvalidThreadId as exc:  # 400, as on every other thread route
        return _error(400, "invalid_thread_id", str(exc))
    except ThreadNotFound:
        return _error(404, "thread_not_found", f"Thread not found: {tid}")


def _endpoint_view(
    endpoint: ThreadEndpoint, get_runtime: RuntimeGetter
) -> Callable[[Request], Awaitable[Response]]:
    where = f"{endpoint.method} /api/threads/{{tid}}{endpoint.path} ({endpoint.file.name})"

    async def view(request: Request) -> Response:
        state = await _thread_or_error(get_runtime(request), request.path_params["tid"])
        if isinstance(state, Response):
            return state
        params = {
            ("*" if key == _REST_PARAM else key): str(value)
            for key, value in request.path_params.items()
            if key != "tid"
        }
        try:
            result = await endpoint.definition.call(request, state, params)
        except HTTPException as exc:
            return _error(exc.status_code, f"http_{exc.status_code}", str(exc.detail))
        except Exception:
            log.exception("thread endpoint %s failed (thread %s)", where, state.thread_id)
            return _error(
                500, "endpoint_error", f"Thread endpoint {where} failed; see the server log"
            )
        if isinstance(result, Response):
            return result
        if result is None:
            return Response(status_code=204)
        try:
            return JSONResponse(result)
        except (TypeError, ValueError):
            log.exception("thread endpoint %s returned a value that is not JSON", where)
            return _error(
                500, "endpoint_error",
                f"Thread endpoint {where} returned a value that is not JSON",
            )

    return view


def thread_endpoint_routes(
    app_dir: str | os.PathLike[str] | None, *, get_runtime: RuntimeGetter | None = None
) -> list[BaseRoute]:
    """Starlette routes for the thread endpoints of an app folder.

    Mount them after the built-in routes (which win on an overlap such as a top-level
    ``[name].py``).

    Args:
        app_dir: The application folder (its ``api/`` holds the endpoint files).
        get_runtime: How a view finds the running `Runtime`; default
            ``request.app.state.runtime``.

    Raises:
        AgentDefinitionError: see `discover_thread_endpoints`.
    """
    getter = get_runtime or _default_runtime
    endpoints = discover_thread_endpoints(Path(app_dir) if app_dir is not None else None)
    return [
        Route(
            f"/api/threads/{{tid}}{e.path}",
            _endpoint_view(e, getter),
            methods=[e.method],
            name=f"thread_endpoint:{e.method}:{e.path}",
        )
        for e in endpoints
    ]


# ------------------------------------------------------------------ messages


def _turn_error(exc: EffectsError) -> JSONResponse:
    # A thread whose agent is gone cannot take messages: a conflict with the thread's
    # state here (409 no_agent, docs/http-api.md), where elsewhere it is a 404.
    if isinstance(exc, AgentNotFound):
        return _error(409, "no_agent", str(exc))
    status, code = runtime_error_status(exc)
    if status >= 500:
        log.error("messages route failed: %s", exc)
    return _error(status, code, str(exc))


async def _message_body(request: Request) -> str | JSONResponse:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_MESSAGE_BODY_BYTES:
        return _error(
            413, "body_too_large",
            f"Request body is {declared} bytes; the limit is {MAX_MESSAGE_BODY_BYTES} bytes",
        )
    body = await request.body()
    if len(body) > MAX_MESSAGE_BODY_BYTES:
        return _error(
            413, "body_too_large",
            f"Request body exceeds the limit of {MAX_MESSAGE_BODY_BYTES} bytes",
        )
    try:
        data = json.loads(body)
    except ValueError:
        return _error(400, "invalid_json", "Request body is not valid JSON")
    problem = find_invalid_text(data)
    if problem is not None:
        return _error(
            400, "invalid_json",
            f"Request body is not valid JSON text: {problem}, which is not valid Unicode",
        )
    if not isinstance(data, dict) or set(data) != {"content"}:
        return _error(400, "invalid_body", 'Request body must be {"content": "<text>"}')
    content = data["content"]
    if not isinstance(content, str) or not content.strip():
        return _error(400, "invalid_body", "content must be a non-empty string")
    if len(content) > MAX_CONTENT_CHARS:
        return _error(
            413, "content_too_large",
            f"content is {len(content)} characters; the limit is {MAX_CONTENT_CHARS}",
        )
    return content


_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def message_routes(*, get_runtime: RuntimeGetter | None = None) -> list[BaseRoute]:
    """Starlette routes for a thread's conversation.

    ``POST /api/threads/{tid}/messages`` ``{"content": "..."}`` runs one turn and answers
    200 ``{"runId", "reply", "messages"}``; 409 ``turn_in_progress`` while a turn of the
    thread runs (one at a time; the client retries after the answer), 409 ``no_agent``
    when no agent serves the thread, 502 ``turn_failed`` when the model fails.
    ``GET /api/threads/{tid}/messages?limit=50&after=<message id>`` lists messages oldest
    first: ``{"messages": [...], "nextCursor", "prevCursor"}``; ``before=<message id>``
    gives the page before a message, ``latest=true`` the newest page.
    ``GET .../messages/{mid}`` gives one.

    Args:
        get_runtime: How a view finds the running `Runtime`; default
            ``request.app.state.runtime``.
    """
    getter = get_runtime or _default_runtime

    async def post(request: Request) -> Response:
        content = await _message_body(request)
        if isinstance(content, Response):
            return content
        state = await _thread_or_error(getter(request), request.path_params["tid"])
        if isinstance(state, Response):
            return state
        try:
            result = await state.send_message(content)
        except EffectsError as exc:
            return _turn_error(exc)
        return JSONResponse(result.to_json())

    async def list_messages(request: Request) -> Response:
        raw = request.query_params.get("limit", "50")
        try:
            limit = int(raw)
        except ValueError:
            return _error(400, "invalid_parameter", f"limit must be an integer, got {raw!r}")
        state = await _thread_or_error(getter(request), request.path_params["tid"])
        if isinstance(state, Response):
            return state
        raw_latest = request.query_params.get("latest", "false").lower()
        if raw_latest not in _BOOLEANS:
            return _error(
                400, "invalid_parameter", f"latest must be true or false, got {raw_latest!r}"
            )
        try:
            page = await state.get_messages(
                limit=limit,
                after=request.query_params.get("after") or None,
                before=request.query_params.get("before") or None,
                latest=_BOOLEANS[raw_latest],
            )
        except ValueError as exc:
            return _error(400, "invalid_parameter", str(exc))
        except EffectsError as exc:
            return _turn_error(exc)
        return JSONResponse(
            {
                "messages": [m.to_json() for m in page.messages],
                "nextCursor": page.next_cursor,
                "prevCursor": page.prev_cursor,
            }
        )

    async def get_one(request: Request) -> Response:
        state = await _thread_or_error(getter(request), request.path_params["tid"])
        if isinstance(state, Response):
            return state
        try:
            message = await state.get_message(request.path_params["mid"])
        except EffectsError as exc:
            return _turn_error(exc)
        return JSONResponse(message.to_json())

    return [
        Route("/api/threads/{tid}/messages", post, methods=["POST"]),
        Route("/api/threads/{tid}/messages", list_messages, methods=["GET"]),
        Route("/api/threads/{tid}/messages/{mid}", get_one, methods=["GET"]),
    ]
