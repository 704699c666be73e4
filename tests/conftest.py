"""Shared fixtures.

Server tests:
- `api` / `serve_api`: the real Starlette app (`runtime.http.create_app`) with its lifespan
  running, driven in this event loop through ``httpx.ASGITransport`` (no sockets), on the
  test app in ``tests/apps/server_app`` and a `FakeClock`.
- `live_server`: the same app behind a real uvicorn server on a free loopback port, in this
  event loop (for WebSocket tests with real clients).
- `release`: lets a run of the test app's ``hold`` effect finish.
- `no_blocking`: fails the test if anything blocks the event loop (blockbuster); opt in
  with ``pytestmark = pytest.mark.usefixtures("no_blocking")``.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest
import uvicorn
from blockbuster import blockbuster_ctx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette

from runtime import Runtime
from runtime.http import create_app, server_options
from runtime.testing import FakeClock

ROOT = Path(__file__).resolve().parent.parent
DEMO_APP = ROOT / "agents"
SERVER_APP = Path(__file__).parent / "apps" / "server_app"


@dataclass
class Api:
    """A running app and an HTTP client for it."""

    app: Starlette
    client: httpx.AsyncClient
    clock: FakeClock | None

    @property
    def rt(self) -> Runtime:
        rt: Runtime = self.app.state.runtime
        return rt

    async def new_thread(self, **body: Any) -> str:
        res = await self.client.post("/api/threads", json=body)
        assert res.status_code == 201, res.text
        tid: str = res.json()["id"]
        return tid

    async def schedule(
        self, tid: str, name: str, args: Any = None, delay_seconds: float = 0
    ) -> str:
        res = await self.client.post(
            f"/api/threads/{tid}/effects",
            json={"name": name, "args": args, "delay_seconds": delay_seconds},
        )
        assert res.status_code == 201, res.text
        run_id: str = res.json()["id"]
        return run_id

    async def run(self, tid: str, run_id: str) -> dict[str, Any]:
        res = await self.client.get(f"/api/threads/{tid}/effects/{run_id}")
        assert res.status_code == 200, res.text
        data: dict[str, Any] = res.json()
        return data


def make_app(data_dir: Path, **kwargs: Any) -> Starlette:
    """`create_app` with the test app, no installed packages and, unless given, no pane."""
    kwargs.setdefault("app_dir", SERVER_APP)
    kwargs.setdefault("web_dir", None)
    kwargs.setdefault("load_packages", False)
    return create_app(data_dir=data_dir, **kwargs)


@asynccontextmanager
async def serve_api(
    data_dir: Path, *, clock: FakeClock | None = None, **kwargs: Any
) -> AsyncIterator[Api]:
    """Run the app's lifespan and yield an `Api` whose client talks to it in-process."""
    # create_app is startup code (it looks at the pane's folder): not on the loop.
    app = await anyio.to_thread.run_sync(partial(make_app, data_dir, clock=clock, **kwargs))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield Api(app, client, clock)


STORAGE_KINDS = ("sqlite", "sqlite-normal", "postgres")
"""The backends a test marked ``every_backend`` runs on (once each). ``sqlite-normal`` is
SQLite with ``synchronous=NORMAL``, where a run's store calls are made on the event loop
(`runtime.Runtime.run_short`) instead of a storage thread."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test marked ``every_backend`` once per storage backend (`storage_kind`)."""
    if "storage_kind" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "every_backend"
    ):
        # A module may narrow the kinds (its own STORAGE_KINDS).
        metafunc.parametrize("storage_kind", getattr(metafunc.module, "STORAGE_KINDS",
                                                     STORAGE_KINDS))


@pytest.fixture
def storage_kind() -> str:
    """The backend of a test not marked ``every_backend``: SQLite, the default."""
    return "sqlite"


@pytest.fixture
def backend_settings(request: pytest.FixtureRequest, storage_kind: str) -> dict[str, Any]:
    """The `Runtime` settings that select the test's backend (none for SQLite)."""
    if storage_kind == "postgres":
        return {"database_url": request.getfixturevalue("pg_url")}
    if storage_kind == "sqlite-normal":
        return {"synchronous": "NORMAL"}
    return {}


@pytest.fixture
async def api(tmp_path: Path, backend_settings: dict[str, Any]) -> AsyncIterator[Api]:
    async with serve_api(tmp_path / "data", clock=FakeClock(), **backend_settings) as running:
        yield running


@asynccontextmanager
async def live_server(
    app: Starlette, *, send_buffer_bytes: int | None = None, **options: Any
) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in this loop; yields the base URL.

    Args:
        app: The application (its lifespan runs inside the server).
        send_buffer_bytes: SO_SNDBUF of the server's sockets, to make a slow reader's
            backlog reach the server's queue after little data.
        **options: Arguments of `runtime.http.server_options` (the server's settings).
    """
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets (else every
    # keep-alive request waits ~40 ms for a delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer_bytes is not None:
        # Accepted connections inherit the listening socket's buffer sizes (Linux).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="on", log_config=None, log_level="warning", **server_options(**options)
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                raise RuntimeError(f"uvicorn did not start: {task.exception()!r}")
            await asyncio.sleep(0.01)
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def release(rt: Runtime, key: str) -> None:
    """Let the test app's ``hold`` run with args ``{"key": key}`` finish (now or when it starts)."""
    gates: dict[str, asyncio.Event] = rt.registry.app["hold"].fn.__globals__["GATES"]
    gates.setdefault(key, asyncio.Event()).set()


@pytest.fixture
def no_blocking() -> Iterator[None]:
    """Fail the test if a blocking call (file, socket, sqlite3, sleep) runs on the loop.

    Except SQLite calls made on the loop on purpose: by `runtime.Runtime.run_short` (with
    ``synchronous=NORMAL``, a run's short store calls) and by a thread store's
    ``claim_inline`` and ``finish_inline`` (commits without an fsync, when the store is
    free).
    """
    with blockbuster_ctx() as bb:
        allow_inline_sqlite(bb)
        yield


def allow_inline_sqlite(bb: Any) -> None:
    """Let a blockbuster context accept the SQLite calls the runtime makes on the loop."""
    for name, function in bb.functions.items():
        if name.startswith("sqlite3."):
            function.can_block_in("runtime/supervisor.py", "run_short")
            function.can_block_in("runtime/storage/sqlite.py", "claim_inline")
            function.can_block_in("runtime/storage/sqlite.py", "finish_inline")


_SPANS: InMemorySpanExporter | None = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans finished during the test (the SDK's in-memory exporter).

    The process-wide tracer provider can be set only once: the exporter is added to it
    the first time, then cleared around each test that asks for it.
    """
    global _SPANS
    if _SPANS is None:
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(TracerProvider())
        provider = trace.get_tracer_provider()
        assert isinstance(provider, TracerProvider)
        _SPANS = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_SPANS))
    _SPANS.clear()
    yield _SPANS
    _SPANS.clear()


@pytest.fixture(scope="session", autouse=True)
def pg_database() -> Iterator[str]:
    """The URL of this session's fresh PostgreSQL database (dropped at the end).

    Autouse: `tests.storage.backends.make_backend` builds PostgreSQL backends outside
    fixtures, from `tests.pg.session_url`.
    """
    from tests import pg

    with pg.session_database() as url:
        pg.session_url = url
        try:
            yield url
        finally:
            pg.session_url = None


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """A database URL whose ``schema`` parameter names a schema no other test uses."""
    from tests.pg import fresh_url

    return fresh_url()
