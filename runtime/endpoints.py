"""Thread endpoints: the app's file-based routes in ``agents/api/``.

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

This module defines and discovers endpoints without importing Starlette (``import runtime``
stays free of the web stack); `runtime.http.thread_endpoint_routes` mounts them.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from runtime.agents import load_definition
from runtime.discovery import app_package, module_segment
from runtime.errors import AgentDefinitionError

if TYPE_CHECKING:
    from starlette.requests import Request

    from runtime.thread import ThreadState

BUILTIN_THREAD_ROUTES = frozenset({"effects", "stream", "messages"})
"""First path segments beneath ``/api/threads/{tid}/`` that the runtime itself serves."""

METHODS = ("get", "post", "put", "patch", "delete")

_STATIC_RE = re.compile(r"^[A-Za-z0-9_-]+\Z")
_PARAM_RE = re.compile(r"^\[([A-Za-z_][A-Za-z0-9_]*)\]\Z")
_REST = "[*]"
REST_PARAM = "_rest"
"""The route parameter that holds what ``[*]`` captured (given to handlers as ``"*"``)."""
_RESERVED_PARAMS = frozenset({"tid", REST_PARAM})

EndpointHandler = Callable[..., Awaitable[Any] | Any]


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
        return re.sub(r"\{[^}]+\}", "{}", self.path.replace(f"{{{REST_PARAM}:path}}", "*"))

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
            segments.append(f"{{{REST_PARAM}:path}}")
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
