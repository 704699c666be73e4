"""Hostile and odd input over HTTP and in the Python API: a clear 4xx, bounded memory and
nothing stored, for every kind (huge numbers, deep JSON, odd bodies, huge bodies, stalled
requests, echoed values, unknown args fields, error codes of a corrupt thread)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest
from conftest import DEMO_APP, Api, live_server, make_app, serve_api

from runtime import InvalidDelay, InvalidEffectArgs, Runtime, canonical_json
from runtime._limits import MAX_ARGS_DEPTH, MAX_JSON_DEPTH
from runtime.testing import FakeClock, override_model
from tests.test_turns import APP, Script, call, text

pytestmark = pytest.mark.usefixtures("no_blocking")

GUARD_SECONDS = 20  # only guards against a hang


def error_of(res: httpx.Response, status: int, code: str) -> str:
    assert res.status_code == status, res.text
    assert res.json()["error"]["code"] == code, res.text
    message: str = res.json()["error"]["message"]
    return message


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


async def runs_of(api: Api, tid: str) -> list[Any]:
    res = await api.client.get(f"/api/threads/{tid}/effects")
    assert res.status_code == 200, res.text
    runs: list[Any] = res.json()["runs"]
    return runs


# ---------------------------------------------------------------- huge numbers


async def test_huge_integers_are_4xx_in_query_and_body(api: Api) -> None:
    tid = await api.new_thread()
    for path in (f"/api/threads/{tid}/effects", "/api/threads", "/api/runs"):
        res = await api.client.get(path, params={"cursor": "9" * 23})
        assert "cursor" in error_of(res, 400, "invalid_parameter")
        res = await api.client.get(path, params={"limit": "9" * 40})
        error_of(res, 400, "invalid_parameter")
    res = await api.client.get(f"/api/threads/{tid}/messages", params={"limit": "9" * 40})
    error_of(res, 400, "invalid_parameter")
    for path in ("/api/threads", "/api/runs"):
        res = await api.client.get(path, params={"cursor": "1e999~t1"})
        error_of(res, 400, "invalid_parameter")

    body = b'{"name": "ping", "delay_seconds": 1' + b"0" * 309 + b"}"
    res = await api.client.post(f"/api/threads/{tid}/effects", content=body)
    message = error_of(res, 422, "invalid_delay")
    assert "delay_seconds" in message and "10 years" in message
    assert "timedelta" not in message  # HTTP speaks JSON
    res = await api.client.post(
        f"/api/threads/{tid}/effects", json={"name": "ping", "delay_seconds": "soon"}
    )
    message = error_of(res, 422, "invalid_delay")
    assert "timedelta" not in message and "a number" in message
    res = await api.client.post(
        f"/api/threads/{tid}/effects", content=b'{"name": "ping", "delay_seconds": 1e400}'
    )
    assert "out of range" in error_of(res, 400, "invalid_json")
    assert await runs_of(api, tid) == []


async def test_a_huge_delay_is_invalid_delay_in_python(api: Api) -> None:
    state = await api.rt.create_thread()
    for delay in (10**400, -(10**400), float("inf")):
        with pytest.raises(InvalidDelay, match="delay must be"):
            await state.schedule_effect("ping", None, delay=delay)
    assert (await state.list_runs()).runs == []


# ------------------------------------------------------------------ deep JSON


async def test_deep_json_is_400_on_every_json_route(api: Api) -> None:
    tid = await api.new_thread()
    deep = nested(100_000).encode()
    for path in (
        "/api/threads",
        f"/api/threads/{tid}/effects",
        f"/api/threads/{tid}/messages",
    ):
        res = await api.client.post(path, content=deep)
        assert f"{MAX_JSON_DEPTH} levels" in error_of(res, 400, "invalid_json"), path
    res = await api.client.post(
        f"/api/threads/{tid}/effects",
        content=b'{"name": "note", "args": {"text": ' + nested(960).encode() + b"}}",
    )
    error_of(res, 400, "invalid_json")
    assert await runs_of(api, tid) == []


async def test_deep_args_are_422_over_http_and_in_python(api: Api) -> None:
    tid = await api.new_thread()
    args = json.loads(nested(MAX_ARGS_DEPTH + 5))
    res = await api.client.post(
        f"/api/threads/{tid}/effects", json={"name": "ping", "args": args}
    )
    assert f"{MAX_ARGS_DEPTH} levels" in error_of(res, 422, "invalid_args")
    state = await api.rt.get_thread(tid)
    with pytest.raises(InvalidEffectArgs, match=f"limit of {MAX_ARGS_DEPTH} levels"):
        deep: Any = 1
        for _ in range(5000):
            deep = [deep]
        await state.schedule_effect("ping", deep)
    assert await runs_of(api, tid) == []


async def test_cyclic_args_are_invalid_args_in_python(api: Api) -> None:
    state = await api.rt.create_thread()
    looped: list[Any] = []
    looped.append(looped)
    selfish: dict[str, Any] = {}
    selfish["me"] = selfish
    for args in ({"payload": {"l": looped}}, selfish):
        with pytest.raises(InvalidEffectArgs, match="holds itself"):
            await asyncio.wait_for(
                state.schedule_effect("note", args, delay=999), GUARD_SECONDS
            )
    assert (await state.list_runs()).runs == []


def test_canonical_json_refuses_cycles_and_deep_values() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(TypeError, match="cycle"):
        canonical_json({"l": looped})
    with pytest.raises(TypeError, match=f"limit of {MAX_JSON_DEPTH} levels"):
        deep: Any = 1
        for _ in range(5000):
            deep = [deep]
        canonical_json(deep)


# ---------------------------------------------------------------- odd bodies


@pytest.mark.parametrize("body", [b"[]", b"0", b"false", b'""', b"null", b"[1]", b"true"])
async def test_a_body_that_is_not_an_object_creates_nothing(api: Api, body: bytes) -> None:
    res = await api.client.post("/api/threads", content=body)
    assert "JSON object" in error_of(res, 400, "invalid_body")
    tid = await api.new_thread()
    for path in (f"/api/threads/{tid}/effects", f"/api/threads/{tid}/messages"):
        error_of(await api.client.post(path, content=body), 400, "invalid_body")
    threads = (await api.client.get("/api/threads")).json()["threads"]
    assert [t["id"] for t in threads] == [tid]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"[]", "invalid_body"), (b"0", "invalid_body"), (b"null", "invalid_body"),
        (b'{"x": 1}', "invalid_body"), (b"notjson", "invalid_json"),
        (nested(100_000).encode(), "invalid_json"),
    ],
)
async def test_routes_that_take_no_body_refuse_one(api: Api, body: bytes, code: str) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "ping", delay_seconds=999)
    for path in ("run", "cancel", "replay"):
        res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/{path}", content=body)
        error_of(res, 400, code)
    for path in ("pause", "resume"):
        error_of(await api.client.post(f"/api/threads/{tid}/{path}", content=body), 400, code)
    res = await api.client.request("DELETE", f"/api/threads/{tid}", content=body)
    error_of(res, 400, code)
    assert [r["status"] for r in await runs_of(api, tid)] == ["pending"]  # nothing happened
    res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/cancel", content=b"")
    assert res.json() == {"canceled": True}  # an empty body is no body
    res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/replay", content=b"{}")
    assert res.status_code == 201, res.text  # and so is {}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "invalid_body"), (b"[]", "invalid_body"), (b"0", "invalid_body"),
        (b"null", "invalid_body"), (b'{"x": 1}', "invalid_body"),
        (b'{"tag": 1}', "invalid_body"), (b"notjson", "invalid_json"),
        (nested(100_000).encode(), "invalid_json"),
    ],
)
async def test_bulk_actions_take_a_filter_object_only(api: Api, body: bytes, code: str) -> None:
    tid = await api.new_thread()
    await api.schedule(tid, "ping", delay_seconds=999)
    for action in ("cancel", "replay"):
        error_of(await api.client.post(f"/api/runs/{action}", content=body), 400, code)
    # "by" is cancel's alone.
    res = await api.client.post("/api/runs/replay", json={"by": "me"})
    assert "unknown field(s) by" in error_of(res, 400, "invalid_body")
    res = await api.client.post("/api/runs/cancel", json={"since": "yesterday"})
    assert 'got "yesterday"' in error_of(res, 400, "invalid_parameter")
    assert [r["status"] for r in await runs_of(api, tid)] == ["pending"]  # nothing happened
    res = await api.client.post("/api/runs/cancel", json={"by": "me"})
    assert res.json()["canceled"] == 1, res.text


async def test_a_post_without_content_length_over_the_messages_limit_names_it(
    api: Api,
) -> None:
    tid = await api.new_thread()
    res = await api.client.post(
        f"/api/threads/{tid}/messages", content=b"{}",
        headers={"Content-Length": "268435456"},
    )
    assert f"the limit is {1 << 20} bytes" in error_of(res, 413, "body_too_large")
    res = await api.client.post(
        f"/api/threads/{tid}/effects", content=b"{}", headers={"Content-Length": "268435456"}
    )
    assert f"the limit is {2 << 20} bytes" in error_of(res, 413, "body_too_large")


# -------------------------------------------------------------- huge bodies


async def endless(chunks_read: list[int], chunk: bytes) -> AsyncIterator[bytes]:
    """A chunked body of up to 256 MiB; counts how much the server pulled."""
    for _ in range((256 << 20) // len(chunk)):
        chunks_read[0] += 1
        yield chunk


@pytest.mark.parametrize("route", ["messages", "effects", "status", "threads"])
async def test_a_chunked_body_over_the_limit_stops_being_read(
    tmp_path: Path, route: str
) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock(), app_dir=DEMO_APP) as api:
        tid = await api.new_thread()
        path = "/api/threads" if route == "threads" else f"/api/threads/{tid}/{route}"
        chunk = b" " * 65536
        read = [0]
        method = "GET" if route == "status" else "POST"  # a user endpoint that reads nothing
        res = await api.client.request(method, path, content=endless(read, chunk))
        if route == "status":
            assert res.status_code == 200  # it never read the body: nothing was buffered
            assert read[0] <= 1
            return
        assert "limit" in error_of(res, 413, "body_too_large")
        assert res.headers["connection"] == "close"
        limit = (1 << 20) if route == "messages" else (2 << 20)
        assert read[0] * len(chunk) <= limit + len(chunk)  # stopped at the limit


async def test_a_declared_length_over_the_limit_is_refused_before_reading(api: Api) -> None:
    tid = await api.new_thread()
    read = [0]

    async def body() -> AsyncIterator[bytes]:
        read[0] += 1
        yield b"{}"

    res = await api.client.post(
        f"/api/threads/{tid}/effects", content=body(), headers={"Content-Length": "999999999"}
    )
    error_of(res, 413, "body_too_large")
    assert read[0] == 0


async def test_a_stalled_body_gets_408(tmp_path: Path) -> None:
    async with serve_api(
        tmp_path / "data", clock=FakeClock(), body_idle_timeout_seconds=0.2
    ) as api:
        never = asyncio.Event()

        async def stalls() -> AsyncIterator[bytes]:
            yield b'{"agent_id": '
            await never.wait()

        async with asyncio.timeout(GUARD_SECONDS):
            res = await api.client.post("/api/threads", content=stalls())
        assert "stalled" in error_of(res, 408, "request_timeout")
        assert (await api.client.get("/api/threads")).json()["threads"] == []


async def test_a_half_sent_request_head_is_dropped(tmp_path: Path) -> None:
    app = await anyio.to_thread.run_sync(lambda: make_app(tmp_path / "data"))
    async with live_server(app, header_timeout_seconds=0.2) as host:
        address, port = host.split(":")
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (address, int(port)))
            await loop.sock_sendall(sock, b"GET /api/threads HTTP/1.1\r\nHost: 127.0")
            async with asyncio.timeout(GUARD_SECONDS):
                assert await loop.sock_recv(sock, 1024) == b""  # closed by the server
        finally:
            sock.close()
        async with httpx.AsyncClient(base_url=f"http://{host}") as client:
            assert (await client.get("/api/threads")).status_code == 200  # others are served


async def test_a_dripping_body_gets_408_at_the_body_deadline(tmp_path: Path) -> None:
    async with serve_api(
        tmp_path / "data", clock=FakeClock(), body_idle_timeout_seconds=5,
        body_timeout_seconds=0.5,
    ) as api:

        async def drips() -> AsyncIterator[bytes]:
            while True:  # never idle for long, never done
                yield b" "
                await asyncio.sleep(0.05)

        async with asyncio.timeout(GUARD_SECONDS):
            res = await api.client.post(
                "/api/threads", content=drips(), headers={"Content-Length": "1000"}
            )
        assert "within 0.5 s" in error_of(res, 408, "request_timeout")
        assert res.headers["connection"] == "close"
        assert (await api.client.get("/api/threads")).json()["threads"] == []


async def test_a_client_that_leaves_mid_body_is_a_quiet_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await anyio.to_thread.run_sync(lambda: make_app(tmp_path / "data"))
    async with live_server(app) as host:
        address, port = host.split(":")
        loop = asyncio.get_running_loop()
        with caplog.at_level(logging.INFO):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, (address, int(port)))
                await loop.sock_sendall(
                    sock,
                    b"POST /api/threads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a",
                )
                await asyncio.sleep(0.2)  # the route starts reading the body
            finally:
                sock.close()
            async with httpx.AsyncClient(base_url=f"http://{host}") as client:
                async with asyncio.timeout(GUARD_SECONDS):
                    while "disconnected" not in caplog.text:
                        await asyncio.sleep(0.05)
                assert (await client.get("/api/threads")).json()["threads"] == []
    assert "Exception in ASGI application" not in caplog.text
    assert "Traceback" not in caplog.text and "ClientDisconnect" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


# ----------------------------------------------------------------------- echo


async def test_user_values_in_error_messages_are_cut(api: Api) -> None:
    tid = await api.new_thread()
    huge = "a" * 200_000
    long = "a" * 10_000  # what fits in a URL
    checks = [
        (await api.client.post(f"/api/threads/{tid}/effects", json={"name": huge}),
         404, "effect_not_found"),
        (await api.client.post(f"/api/threads/{tid}/effects", json={huge: 1, "name": "x"}),
         400, "invalid_body"),
        (await api.client.get(f"/api/threads/{tid}/effects", params={"cursor": long}),
         400, "invalid_parameter"),
        (await api.client.get(f"/api/threads/{tid}/effects", params={"status": long}),
         400, "invalid_parameter"),
        (await api.client.get("/api/threads", params={"limit": long}),
         400, "invalid_parameter"),
        (await api.client.get(f"/api/threads/{tid}/messages", params={"after": long}),
         400, "invalid_parameter"),
        (await api.client.get(f"/api/threads/{tid}/messages", params={"limit": long}),
         400, "invalid_parameter"),
        (await api.client.get("/api/runs", params={"cursor": long}),
         400, "invalid_parameter"),
        (await api.client.get("/api/runs", params={"status": long}),
         400, "invalid_parameter"),
        (await api.client.get("/api/runs", params={"since": long}),
         400, "invalid_parameter"),
        (await api.client.get("/api/runs", params={"limit": long}),
         400, "invalid_parameter"),
        (await api.client.post("/api/runs/cancel", json={"until": long}),
         400, "invalid_parameter"),
        (await api.client.post("/api/threads", json={"agent_id": huge}),
         400, "invalid_argument"),
        (await api.client.post("/api/threads", json={"id": huge}),
         400, "invalid_thread_id"),
        (await api.client.get(f"/api/threads/{tid}/effects/{'b' * 10_000}"),
         404, "run_not_found"),
        (await api.client.get(f"/api/{'c' * 10_000}"), 404, "not_found"),
        (await api.client.post(
            f"/api/threads/{tid}/effects", json={"name": "ping", "delay_seconds": huge}),
         422, "invalid_delay"),
    ]
    for res, status, code in checks:
        message = error_of(res, status, code)
        assert len(message) <= 300, (code, len(message))
        for letter in "abc":
            assert letter * 100 not in message, message


async def test_quoted_values_are_spelled_as_json(api: Api) -> None:
    tid = await api.new_thread()
    path = f"/api/threads/{tid}/effects"
    for value, spelled in ((True, "got true"), ({"k": 1}, 'got {"k": 1}'), (None, "")):
        res = await api.client.post(path, json={"name": "ping", "delay_seconds": value})
        if value is None:
            assert res.status_code == 201
            continue
        message = error_of(res, 422, "invalid_delay")
        assert spelled in message, message
    body = b'{"name": "ping", "delay_seconds": ' + b"1" * 5000 + b"}"
    message = error_of(await api.client.post(path, content=body), 400, "invalid_json")
    assert "over the limit of 4300 digits" in message
    assert "sys." not in message and "set_int_max_str_digits" not in message
    res = await api.client.post(path, json={"name": "nope/x"})
    assert 'package "nope"' in error_of(res, 404, "effect_not_found")
    res = await api.client.get(path, params={"status": "done"})
    assert 'Unknown status "done"' in error_of(res, 400, "invalid_parameter")
    res = await api.client.get("/api/runs", params={"status": "done"})
    assert 'Unknown status "done"' in error_of(res, 400, "invalid_parameter")
    res = await api.client.get("/api/runs", params={"since": "yesterday"})
    assert 'got "yesterday"' in error_of(res, 400, "invalid_parameter")
    res = await api.client.get("/api/threads/a.b/effects")
    assert 'Invalid thread id "a.b"' in error_of(res, 400, "invalid_thread_id")
    res = await api.client.get(path, params={"cursor": "x1"})
    assert 'Invalid cursor "x1"' in error_of(res, 400, "invalid_parameter")
    deep = base64.urlsafe_b64encode(b"[" * 5000).decode()  # what a cursor could decode to
    res = await api.client.get(f"/api/threads/{tid}/effect-records", params={"cursor": deep})
    assert "Invalid effect-records cursor" in error_of(res, 400, "invalid_parameter")


@pytest.mark.parametrize("limit", ["5_0", "+5", " 5", "\u0665", "1.5", "-1", "0x10"])
async def test_integer_query_parameters_take_ascii_digits_only(api: Api, limit: str) -> None:
    tid = await api.new_thread()
    for path in (
        "/api/threads", f"/api/threads/{tid}/effects", f"/api/threads/{tid}/messages",
        f"/api/threads/{tid}/effect-records", "/api/runs",
    ):
        res = await api.client.get(path, params={"limit": limit})
        assert "limit must be an integer" in error_of(res, 400, "invalid_parameter"), path
    for cursor in ("1_0", "+1", " 1", "\u0661"):
        res = await api.client.get(f"/api/threads/{tid}/effects", params={"cursor": cursor})
        error_of(res, 400, "invalid_parameter")
        res = await api.client.get("/api/threads", params={"cursor": f"{cursor}~{tid}"})
        error_of(res, 400, "invalid_parameter")
        res = await api.client.get("/api/runs", params={"cursor": f"{cursor}~{tid}"})
        error_of(res, 400, "invalid_parameter")


# --------------------------------------------------------- unknown args fields


async def test_unknown_fields_in_args_are_refused(api: Api) -> None:
    tid = await api.new_thread()
    res = await api.client.post(
        f"/api/threads/{tid}/effects",
        json={"name": "note", "args": {"text": "x", "extra": 1}},
    )
    message = error_of(res, 422, "invalid_args")
    assert "unknown field(s) extra" in message and "Note" in message
    state = await api.rt.get_thread(tid)
    with pytest.raises(InvalidEffectArgs, match="unknown field"):
        await state.schedule_effect("note", {"text": "x", "txt": "typo"})
    assert await runs_of(api, tid) == []
    run_id = await api.schedule(tid, "note", {"text": "x"})
    assert (await api.run(tid, run_id))["args"] == {"text": "x"}


async def test_a_schema_that_allows_extra_fields_keeps_them(tmp_path: Path) -> None:
    from pydantic import BaseModel, ConfigDict

    from runtime import Runtime, define_effect

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        text: str

    class Outer(BaseModel):
        inner: Open
        n: int = 0

    async def run(state: object, args: Outer) -> None:
        return None

    async with Runtime(data_dir=tmp_path / "data", load_packages=False) as rt:
        rt.registry.app["outer"] = define_effect("Nested.", Outer, run)
        state = await rt.create_thread()
        run_id = await state.schedule_effect("outer", {"inner": {"text": "x", "more": [1]}})
        assert (await state.get_run(run_id)).args == {"inner": {"text": "x", "more": [1]}}
        with pytest.raises(InvalidEffectArgs, match=r"unknown field\(s\) nope"):
            await state.schedule_effect("outer", {"inner": {"text": "x"}, "nope": 1})


async def test_flat_args_are_stored_as_their_json_and_odd_scalars_refused(
    tmp_path: Path,
) -> None:
    """An object of scalars (the schedule's fast path) stores what its JSON decodes to."""
    import enum

    from pydantic import BaseModel

    from runtime import Runtime, define_effect

    class Level(enum.IntEnum):
        HIGH = 3

    class Tag(enum.StrEnum):
        RED = "red"

    class Flat(BaseModel):
        text: str = ""
        n: int = 0
        x: float = 0.0
        ok: bool = False
        maybe: int | None = None

    async def run(state: object, args: Flat) -> None:
        return None

    async with Runtime(data_dir=tmp_path / "data", load_packages=False) as rt:
        rt.registry.app["flat"] = define_effect("Flat.", Flat, run)
        state = await rt.create_thread()
        given = {"text": "é", "n": 2**70, "x": -0.0, "ok": True, "maybe": None}
        run_id = await state.schedule_effect("flat", given, delay=999)
        stored = (await state.get_run(run_id)).args
        assert stored == given and stored is not given
        assert json.dumps(stored) == json.dumps(given)
        # Subclasses of the scalars are stored as their JSON (an int, a string).
        run_id = await state.schedule_effect("flat", {"n": Level.HIGH, "text": Tag.RED})
        stored = (await state.get_run(run_id)).args
        assert stored == {"n": 3, "text": "red"}
        assert type(stored["n"]) is int and type(stored["text"]) is str
        for bad, problem in (
            ({"x": float("nan")}, "not JSON"),
            ({"x": float("inf")}, "not JSON"),
            ({"text": "\ud800"}, "not valid Unicode"),
            ({1: "one"}, "fail its schema"),
        ):
            with pytest.raises(InvalidEffectArgs, match=problem):
                await state.schedule_effect("flat", bad, delay=999)
        assert len((await state.list_runs()).runs) == 2


# ------------------------------------------------------------------ error codes


async def test_a_corrupt_thread_is_thread_storage_error_on_every_route(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with serve_api(data, clock=FakeClock(), app_dir=DEMO_APP) as api:
        await api.new_thread(id="broken")
        path = api.rt.settings.data_dir / "threads" / "broken.sqlite"

    def corrupt() -> None:
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        path.write_bytes(b"this is not a database" * 100)

    await anyio.to_thread.run_sync(corrupt)
    async with serve_api(data, clock=FakeClock(), app_dir=DEMO_APP) as api:
        for method, route in (
            ("GET", "effects"), ("GET", "status"), ("POST", "export"), ("GET", "messages"),
        ):
            res = await api.client.request(method, f"/api/threads/broken/{route}")
            error_of(res, 500, "thread_storage_error")


# ------------------------------------------------------------------ layering


def test_import_runtime_does_not_load_starlette() -> None:
    code = (
        "import sys, runtime\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('starlette', 'uvicorn', 'runtime.http'))\n"
        "print(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


async def test_unknown_fields_in_tool_args_are_a_tool_error(tmp_path: Path) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path / "data", clock=FakeClock(), load_packages=False
    ) as rt:
        thread = await rt.create_thread()
        script = Script(
            call("schedule_note", {"text": "x", "delay_seconds": 0, "priority": "high"}),
            text("Sorry."),
        )
        with override_model(rt, script.model):
            result = await thread.send_message("note x")
        (tool_result,) = result.messages[2].tool_results
        assert tool_result.is_error
        assert "unknown field(s) priority" in tool_result.content
        assert await thread.get_scheduled_effects() == []
