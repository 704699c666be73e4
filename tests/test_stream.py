"""The thread's WebSocket stream, through a real uvicorn server and real clients.

Every change of a run sends one ``effect_changed`` frame and every stored message one
``message_created`` frame; ``seq`` grows by one per frame of a thread, across both kinds;
no run frame carries args; an unknown thread is refused with 4404 and a malformed thread id
with 4400; a client that stops reading is closed with 1013 while the others receive every
frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest
from conftest import DEMO_APP, Api, live_server, make_app
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from runtime import http
from runtime.errors import SubscriptionOverflow
from runtime.testing import FakeClock

Frame = dict[str, Any]
GUARD_SECONDS = 20  # only guards against a hang; nothing here waits on time


@dataclass
class Live:
    host: str
    api: Api

    def url(self, tid: str, query: str = "") -> str:
        return f"ws://{self.host}/api/threads/{tid}/stream{query}"


@asynccontextmanager
async def running(
    tmp_path: Path, *, send_buffer_bytes: int | None = None,
    server: dict[str, Any] | None = None, **kwargs: Any
) -> AsyncIterator[Live]:
    clock = FakeClock()
    app = await anyio.to_thread.run_sync(
        partial(make_app, tmp_path / "data", clock=clock, **kwargs)
    )
    async with live_server(app, send_buffer_bytes=send_buffer_bytes, **(server or {})) as host:
        token = kwargs.get("api_token")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(base_url=f"http://{host}", headers=headers) as client:
            yield Live(host, Api(app, client, clock))


@pytest.fixture
async def live(tmp_path: Path, backend_settings: dict[str, Any]) -> AsyncIterator[Live]:
    async with running(tmp_path, **backend_settings) as server:
        yield server


@asynccontextmanager
async def stream(url: str, **kwargs: Any) -> AsyncIterator[ClientConnection]:
    async with connect(url, ping_interval=None, **kwargs) as ws:
        yield ws


async def frames_until(ws: ClientConnection, done: Callable[[Frame], bool]) -> list[Frame]:
    """Read frames until one satisfies ``done``; also checks no frame carries args."""
    frames: list[Frame] = []
    async with asyncio.timeout(GUARD_SECONDS):
        while True:
            raw = await ws.recv()
            assert isinstance(raw, str)
            frame = json.loads(raw)
            assert "args" not in frame, frame
            if frame["eventType"] == "effect_changed":
                assert "args" not in frame["data"], frame
            frames.append(frame)
            if done(frame):
                return frames


def change_is(run_id: str, change: str) -> Callable[[Frame], bool]:
    return lambda f: (f["eventType"] == "effect_changed" and f["data"]["id"] == run_id
                      and f["data"]["change"] == change)


async def close_code(ws: ClientConnection) -> int | None:
    """Read until the server closes; the close code it sent."""
    async with asyncio.timeout(GUARD_SECONDS):
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None, "closed without a close frame"
    return closed.value.rcvd.code


@pytest.mark.every_backend
async def test_scheduled_started_completed(live: Live) -> None:
    tid = await live.api.new_thread()
    async with stream(live.url(tid)) as ws:
        run_id = await live.api.schedule(tid, "note", {"text": "secret-args-value"})
        frames = await frames_until(ws, change_is(run_id, "completed"))
    assert [f["data"]["change"] for f in frames] == ["scheduled", "started", "completed"]
    assert [f["data"]["status"] for f in frames] == ["pending", "running", "completed"]
    assert [f["data"]["attempts"] for f in frames] == [0, 1, 1]
    first = frames[0]["seq"]
    assert [f["seq"] for f in frames] == [first, first + 1, first + 2]
    for f in frames:
        assert f["type"] == "event" and f["eventType"] == "effect_changed"
        assert f["threadId"] == tid
        assert f["data"]["id"] == run_id and f["data"]["name"] == "note"
        assert "secret-args-value" not in json.dumps(f)
    done = frames[-1]["data"]
    assert done["error"] is None and done["startedAt"] and done["finishedAt"]
    assert set(done) >= {
        "id", "name", "status", "change", "runAt", "startedAt", "finishedAt",
        "attempts", "error", "replayOf",
    }


@pytest.mark.every_backend
async def test_the_server_wide_stream_has_every_threads_run_changes(live: Live) -> None:
    a = await live.api.new_thread()
    b = await live.api.new_thread()
    async with stream(f"ws://{live.host}/api/stream") as ws:
        first = await live.api.schedule(a, "note", {"text": "secret-args-value"})
        await live.api.rt.wait_idle()
        second = await live.api.schedule(b, "boom", {"message": "no"})
        frames = await frames_until(ws, change_is(second, "failed"))
        await live.api.client.delete(f"/api/threads/{b}")  # the stream goes on
        third = await live.api.schedule(a, "ping")
        more = await frames_until(ws, change_is(third, "completed"))
    assert [(f["threadId"], f["data"]["id"], f["data"]["change"]) for f in frames] == [
        (a, first, "scheduled"), (a, first, "started"), (a, first, "completed"),
        (b, second, "scheduled"), (b, second, "started"), (b, second, "failed"),
    ]
    # The deletion is a frame of its own, numbered after the thread's last one: a client
    # drops that thread's runs.
    deleted, *more = more
    assert deleted == {"type": "event", "eventType": "thread_deleted", "threadId": b,
                       "seq": frames[5]["seq"] + 1}
    assert all(f["eventType"] == "effect_changed" for f in frames + more)
    assert all("secret-args-value" not in json.dumps(f) for f in frames)
    # Each frame keeps its thread's seq.
    assert [f["seq"] for f in frames[:3]] == [frames[0]["seq"] + i for i in range(3)]
    assert [f["seq"] for f in more] == [frames[2]["seq"] + 1 + i for i in range(3)]
    assert frames[5]["data"]["error"] == "ValueError: no"


async def test_the_server_wide_stream_needs_the_token(tmp_path: Path) -> None:
    async with running(tmp_path, api_token="s3cret") as live:
        async with stream(f"ws://{live.host}/api/stream") as ws:
            assert await close_code(ws) == 4401
        async with stream(f"ws://{live.host}/api/stream?token=s3cret") as ws:
            tid = await live.api.new_thread()
            run_id = await live.api.schedule(tid, "ping")
            await frames_until(ws, change_is(run_id, "completed"))


@pytest.mark.every_backend
async def test_several_clients_of_a_thread_get_the_same_frames(live: Live) -> None:
    tid = await live.api.new_thread()
    url = live.url(tid)
    async with stream(url) as a, stream(url) as b, stream(url) as c, stream(
        f"ws://{live.host}/api/stream"
    ) as everything:
        ids = [await live.api.schedule(tid, "note", {"text": str(i)}) for i in range(5)]
        await live.api.rt.wait_idle()
        texts = []
        for ws in (a, b, c, everything):
            async with asyncio.timeout(GUARD_SECONDS):
                texts.append([await ws.recv() for _ in range(3 * len(ids))])
    assert texts[0] == texts[1] == texts[2] == texts[3]
    frames = [json.loads(t) for t in texts[0]]
    for run_id in ids:
        assert [f["data"]["change"] for f in frames if f["data"]["id"] == run_id] == [
            "scheduled", "started", "completed"
        ]


@pytest.mark.every_backend
async def test_failed_and_replayed(live: Live) -> None:
    tid = await live.api.new_thread()
    async with stream(live.url(tid)) as ws:
        run_id = await live.api.schedule(tid, "boom", {"message": "nope"})
        frames = await frames_until(ws, change_is(run_id, "failed"))
        assert [f["data"]["change"] for f in frames] == ["scheduled", "started", "failed"]
        assert frames[-1]["data"]["status"] == "failed"
        assert frames[-1]["data"]["error"] == "ValueError: nope"

        res = await live.api.client.post(f"/api/threads/{tid}/effects/{run_id}/replay")
        new_id = res.json()["id"]
        frames = await frames_until(ws, change_is(new_id, "failed"))
        assert frames[0]["data"]["change"] == "scheduled"
        assert all(f["data"]["replayOf"] == run_id for f in frames)


@pytest.mark.every_backend
async def test_canceled_and_run_now(live: Live) -> None:
    tid = await live.api.new_thread()
    async with stream(live.url(tid)) as ws:
        doomed = await live.api.schedule(tid, "ping", delay_seconds=3600)
        await live.api.client.post(f"/api/threads/{tid}/effects/{doomed}/cancel")
        frames = await frames_until(ws, change_is(doomed, "canceled"))
        assert [f["data"]["change"] for f in frames] == ["scheduled", "canceled"]
        assert frames[-1]["data"]["status"] == "canceled"

        later = await live.api.schedule(tid, "ping", delay_seconds=3600)
        await live.api.client.post(f"/api/threads/{tid}/effects/{later}/run")
        frames = await frames_until(ws, change_is(later, "completed"))
        assert [f["data"]["change"] for f in frames] == [
            "scheduled", "rescheduled", "started", "completed",
        ]


def kind(frame: Frame) -> tuple[str, str]:
    """``("effect", change)`` or ``("message", role)``: what a frame says, in short."""
    if frame["eventType"] == "message_created":
        return "message", frame["data"]["role"]
    return "effect", frame["data"]["change"]


async def test_messages_are_frames_on_the_threads_one_sequence(tmp_path: Path) -> None:
    async with running(tmp_path, app_dir=DEMO_APP) as live:
        client = live.api.client
        # The demo agent's welcome hook stores a message as the thread is created: that is
        # event 1 of the thread, before anyone could listen.
        tid = await live.api.new_thread()
        async with stream(live.url(tid)) as ws:
            res = await client.post(
                f"/api/threads/{tid}/messages",
                json={"content": "remind me in 1 seconds to stretch"},
            )
            assert res.status_code == 200, res.text
            reply = res.json()["reply"]
            turn = await frames_until(ws, lambda f: f["data"]["id"] == reply["id"])
            # The tool schedules the reminder during the turn; the turn's own messages are
            # stored when it ends.
            assert [kind(f) for f in turn] == [
                ("message", "user"),
                ("effect", "scheduled"),
                ("message", "assistant"),
                ("message", "tool"),
                ("message", "assistant"),
            ]
            assert turn[-1]["data"]["content"] == "OK, I'll remind you to stretch in 1 second."
            run_id = turn[1]["data"]["id"]

            assert live.api.clock is not None
            live.api.clock.advance(1)
            later = await frames_until(ws, change_is(run_id, "completed"))
        assert [kind(f) for f in later] == [
            ("effect", "started"),
            ("message", "assistant"),
            ("effect", "completed"),
        ]
        frames = turn + later
        assert [f["seq"] for f in frames] == list(range(2, 2 + len(frames)))
        assert all(f["type"] == "event" and f["threadId"] == tid for f in frames)

        injected = later[1]
        assert injected["eventType"] == "message_created"
        assert injected["data"]["content"] == "Reminder: stretch"
        assert injected["data"]["injected"] is True
        # The frame carries the message exactly as the HTTP API returns it.
        for frame in [*turn, injected]:
            if frame["eventType"] == "message_created":
                one = await client.get(f"/api/threads/{tid}/messages/{frame['data']['id']}")
                assert frame["data"] == one.json()
        listed = (await client.get(f"/api/threads/{tid}/messages")).json()["messages"]
        streamed = [f["data"]["id"] for f in frames if f["eventType"] == "message_created"]
        assert [m["id"] for m in listed[1:]] == streamed  # [0] is the welcome message


async def test_an_interrupted_run_is_requeued_on_shutdown(tmp_path: Path) -> None:
    async with running(tmp_path, shutdown_grace_seconds=0) as live:
        tid = await live.api.new_thread()
        async with stream(live.url(tid)) as ws:
            run_id = await live.api.schedule(tid, "hold", {"key": "never"})
            await frames_until(ws, change_is(run_id, "started"))
            await live.api.rt.close()  # what the lifespan does on SIGTERM
            frames = await frames_until(ws, change_is(run_id, "requeued"))
            requeued = frames[-1]["data"]
            assert requeued["status"] == "pending" and requeued["attempts"] == 1
            assert await close_code(ws) == 1012  # "service restart": come back later


async def close_frame(ws: ClientConnection) -> tuple[int, str]:
    """Read until the server closes; the close code and reason it sent."""
    async with asyncio.timeout(GUARD_SECONDS):
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None, "closed without a close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason


@pytest.mark.every_backend
async def test_an_unknown_thread_is_refused_with_4404(live: Live) -> None:
    async with stream(live.url("no-such-thread")) as ws:
        assert await close_frame(ws) == (4404, "Thread not found: no-such-thread")


@pytest.mark.parametrize("tid", ["bad..id", "bad.id", "x" * 65, "%C3%A9" * 80])
async def test_a_malformed_thread_id_is_refused_with_4400(live: Live, tid: str) -> None:
    async with stream(live.url(tid)) as ws:
        code, reason = await close_frame(ws)
    assert code == 4400
    assert reason.startswith("Invalid thread id ")
    assert len(reason.encode()) <= 123  # what a close frame can carry, even for "é" * 80
    if len(tid) < 20:
        assert f'Invalid thread id "{tid}": must match' in reason


@pytest.mark.every_backend
async def test_deleting_the_thread_closes_its_stream(live: Live) -> None:
    tid = await live.api.new_thread()
    async with stream(live.url(tid)) as ws:
        run_id = await live.api.schedule(tid, "ping", delay_seconds=60)
        await frames_until(ws, change_is(run_id, "scheduled"))
        assert (await live.api.client.delete(f"/api/threads/{tid}")).status_code == 200
        assert await close_code(ws) == 4404


async def test_clients_a_node_cannot_give_missed_frames_are_closed_with_1013_to_reload(
    tmp_path: Path,
) -> None:
    # What a PostgreSQL node does when its listening connection comes back
    # (tests/test_nodes.py): here the hub is told directly.
    async with running(tmp_path) as server:
        tid = await server.api.new_thread()
        async with stream(server.url(tid)) as ws, stream(
                f"ws://{server.host}/api/stream") as everything:
            # Both subscribed before their handshakes completed.
            server.api.rt.hub.drop_subscribers([tid], every_thread=True, reason="missed")
            for client in (ws, everything):
                assert await close_frame(client) == (1013, "missed; reload and reconnect")


async def test_the_stream_needs_the_token_and_the_same_origin(tmp_path: Path) -> None:
    async with running(tmp_path, api_token="tok") as live:
        tid = await live.api.new_thread()
        async with stream(live.url(tid)) as ws:
            assert await close_code(ws) == 4401
        async with stream(live.url(tid, "?token=wrong")) as ws:
            assert await close_code(ws) == 4401
        async with stream(live.url(tid, "?token=tok"), origin="http://evil.example") as ws:
            assert await close_code(ws) == 4403
        same_origin = f"http://{live.host}"
        async with stream(live.url(tid, "?token=tok"), origin=same_origin) as ws:
            run_id = await live.api.schedule(tid, "ping")
            frames = await frames_until(ws, change_is(run_id, "completed"))
            assert len(frames) == 3


async def test_a_client_that_does_not_read_is_dropped_and_others_get_every_frame(
    tmp_path: Path,
) -> None:
    # Small socket buffers on both sides and large frames (a long error) make the slow
    # client's backlog reach the server's per-client queue (8 frames) quickly.
    runs = 80
    error_bytes = 7_000  # stored errors are capped at 8 KiB
    async with running(
        tmp_path, send_buffer_bytes=8192, subscriber_queue_size=8, synchronous="NORMAL"
    ) as live:
        tid = await live.api.new_thread()
        host, port = live.host.split(":")
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.setblocking(False)
        await asyncio.get_running_loop().sock_connect(raw, (host, int(port)))
        # No compression: the long error must be long on the wire too.
        async with stream(live.url(tid), sock=raw, max_queue=1, compression=None) as slow, stream(
            live.url(tid)
        ) as fast:
            state = await live.api.rt.get_thread(tid)
            ids = [
                await state.schedule_effect("boom", {"message": "x", "repeat": error_bytes})
                for _ in range(runs)
            ]
            received = await frames_until(fast, change_is(ids[-1], "failed"))
            await live.api.rt.wait_idle()
            metrics = (await live.api.client.get("/metrics")).text
            assert "thread_effects_websocket_clients 2.0" in metrics

            # The reading client got every frame, in order, with no gap.
            assert len(received) == 3 * runs
            first = received[0]["seq"]
            assert [f["seq"] for f in received] == list(range(first, first + 3 * runs))
            failed = [f for f in received if f["data"]["change"] == "failed"]
            assert [f["data"]["id"] for f in failed] == ids
            assert all(len(f["data"]["error"]) > error_bytes for f in failed)

            # The one that did not read gets what was already on its way, then 1013.
            got: list[int] = []
            async with asyncio.timeout(GUARD_SECONDS):
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        got.append(json.loads(await slow.recv())["seq"])
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
            assert got == list(range(first, first + len(got)))
            assert len(got) < 3 * runs
        # What the slow client never got is counted; once both left, no client is counted.
        async with asyncio.timeout(GUARD_SECONDS):
            while "thread_effects_websocket_clients 0.0" not in (
                metrics := (await live.api.client.get("/metrics")).text
            ):
                await asyncio.sleep(0.01)
        (dropped,) = [line for line in metrics.splitlines()
                      if line.startswith("thread_effects_frames_dropped_total ")]
        assert float(dropped.split()[1]) >= 1


def tcp_state(sock: socket.socket) -> int:
    """The kernel's TCP state of ``sock`` (1 = ESTABLISHED; 7 = CLOSE after a reset)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


async def raw_stream(host: str, tid: str, receive_buffer_bytes: int | None = None
                     ) -> socket.socket:
    """A TCP socket that opened ``tid``'s stream (the 101 read) and does nothing more:
    it answers no ping and reads only when the test does."""
    address, port = host.split(":")
    loop = asyncio.get_running_loop()
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer_bytes is not None:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    raw.setblocking(False)
    await loop.sock_connect(raw, (address, int(port)))
    handshake = (
        f"GET /api/threads/{tid}/stream HTTP/1.1\r\nHost: {host}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await loop.sock_sendall(raw, handshake.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += await loop.sock_recv(raw, 1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return raw


async def test_a_client_that_does_not_answer_pings_is_closed_and_the_log_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A client reading slower than the frames come, with megabytes of kernel buffers
    # between, never fills the server's queue (no 1013): its pong comes too late. The
    # server closes it after the ping timeout and says so in one line.
    caplog.set_level(logging.INFO, logger="runtime.http")
    async with running(
        tmp_path, synchronous="NORMAL",
        server={"ws_ping_interval_seconds": 0.2, "ws_ping_timeout_seconds": 0.3,
                "ws_close_timeout_seconds": 0.3},
    ) as live:
        tid = await live.api.new_thread()
        loop = asyncio.get_running_loop()
        raw = await raw_stream(live.host, tid)  # it never answers a ping
        try:
            async with asyncio.timeout(GUARD_SECONDS):
                while tcp_state(raw) == 1:
                    await asyncio.sleep(0.05)
            rest = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := await loop.sock_recv(raw, 65536):
                    rest += chunk
            assert b"keepalive ping timeout" in rest  # the close frame (1011) it sent
        finally:
            raw.close()
    lines = [r.getMessage() for r in caplog.records
             if "no answer to a keepalive ping" in r.getMessage()]
    assert len(lines) == 1 and f"/api/threads/{tid}/stream" in lines[0], lines


async def test_a_client_that_never_reads_is_really_disconnected(tmp_path: Path) -> None:
    # A client that never reads cannot receive the 1013 close frame either: the server
    # gives up after its close timeout and aborts the connection, releasing the socket
    # and every frame it had queued for it (issue: sockets stayed ESTABLISHED for 100 s+).
    close_timeout = 0.3
    async with running(
        tmp_path, send_buffer_bytes=8192, subscriber_queue_size=8, synchronous="NORMAL",
        ws_close_timeout_seconds=close_timeout,
        server={"ws_close_timeout_seconds": close_timeout},
    ) as live:
        tid = await live.api.new_thread()
        loop = asyncio.get_running_loop()
        raw = await raw_stream(live.host, tid, receive_buffer_bytes=4096)  # never reads
        try:
            state = await live.api.rt.get_thread(tid)
            for _ in range(60):
                await state.schedule_effect("boom", {"message": "x", "repeat": 7_000})
            await live.api.rt.wait_idle()
            assert tcp_state(raw) == 1  # still connected: the server is the one to end it
            async with asyncio.timeout(GUARD_SECONDS):
                while tcp_state(raw) == 1:
                    await asyncio.sleep(0.05)
            # Reset by the server (abort), not a polite close it could not send.
            with pytest.raises(ConnectionResetError):
                while await loop.sock_recv(raw, 65536):
                    pass
        finally:
            raw.close()


async def test_a_thread_whose_file_is_corrupt_is_refused_with_4500(tmp_path: Path) -> None:
    async with running(tmp_path) as server:
        await server.api.new_thread(id="corrupt1")
        path = server.api.rt.settings.data_dir / "threads" / "corrupt1.sqlite"

    def corrupt() -> None:
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        path.write_bytes(b"this is not a database" * 100)

    await anyio.to_thread.run_sync(corrupt)
    async with running(tmp_path) as server:
        res = await server.api.client.get("/api/threads/corrupt1/effects")
        assert res.status_code == 500 and res.json()["error"]["code"] == "thread_storage_error"
        async with stream(server.url("corrupt1")) as ws:
            code, reason = await close_frame(ws)
        assert code == 4500
        assert reason == "Thread storage error: thread corrupt1's database cannot be used"
        assert len(reason.encode()) <= 123


async def test_a_batching_reader_gets_every_event_in_order_and_lingers_only_with_room() -> None:
    from runtime.effects import EffectRun, EffectStatus
    from runtime.events import RunChange
    from runtime.frames import ChangeHub

    hub = ChangeHub(queue_size=100)
    sub = hub.subscribe("t1")
    loop = asyncio.get_running_loop()

    def publish(n: int) -> None:
        for i in range(n):
            run = EffectRun(id=f"r{i}", thread_id="t1", name="noop",
                            status=EffectStatus.PENDING, args=None, run_at_ts=0.0,
                            created_at_ts=0.0)
            hub.publish(RunChange.SCHEDULED, run)

    publish(3)
    # An idle reader's first batch goes at once: nothing to linger for.
    assert [e.seq for e in await sub.next_batch()] == [1, 2, 3]
    # A lingering reader waits for more, until a quarter of its queue (25) is there.
    reader = asyncio.create_task(sub.next_batch(linger_until=loop.time() + 60))
    await asyncio.sleep(0)
    publish(10)
    await asyncio.sleep(0.01)
    assert not reader.done()
    publish(15)
    batch = await asyncio.wait_for(reader, 5)
    assert [e.seq for e in batch] == list(range(4, 29))
    # Or until its deadline.
    publish(2)
    batch = await sub.next_batch(linger_until=loop.time() + 0.02)
    assert [e.seq for e in batch] == [29, 30]
    # A short queue never lingers (it would overflow before the reader runs again).
    small = ChangeHub(queue_size=8).subscribe("t2")
    small._hub._deliver("t2", lambda seq: _Marker(seq))  # type: ignore[arg-type]
    assert len(await asyncio.wait_for(small.next_batch(linger_until=loop.time() + 60), 5)) == 1
    sub.close()
    assert await sub.next_batch() == []


@dataclass(frozen=True)
class _Marker:
    seq: int


@pytest.mark.parametrize("length", [0, 125, 126, 65535, 65536])
def test_a_text_frame_header_is_what_the_websockets_library_writes(length: int) -> None:
    from websockets.frames import Frame, Opcode

    from runtime.http import _text_frame_header

    payload = b"x" * length
    assert _text_frame_header(length) + payload == Frame(Opcode.TEXT, payload).serialize(
        mask=False
    )


async def test_subscribers_share_one_log_and_each_is_cut_off_by_its_own_lag() -> None:
    from runtime.effects import EffectRun, EffectStatus
    from runtime.events import RunChange
    from runtime.frames import ChangeHub

    hub = ChangeHub(queue_size=10)

    def publish(n: int) -> None:
        for i in range(n):
            run = EffectRun(id=f"r{i}", thread_id="t1", name="noop",
                            status=EffectStatus.PENDING, args=None, run_at_ts=0.0,
                            created_at_ts=0.0)
            hub.publish(RunChange.SCHEDULED, run)

    early, reader = hub.subscribe("t1"), hub.subscribe("t1")
    publish(4)
    late = hub.subscribe("t1")  # sees only what comes after it
    assert late.source is early.source and late.position != early.position
    publish(6)
    assert (early.pending, reader.pending, late.pending) == (10, 10, 6)
    assert [e.seq for e in reader.take()] == list(range(1, 11))
    publish(1)
    # `early` was 10 behind (its queue size): the 11th is one too many, and only for it.
    assert early.overflowed and early.closed and early.dropped == 11
    assert not reader.overflowed and not late.overflowed
    with pytest.raises(SubscriptionOverflow):
        await early.__anext__()
    assert [(await late.__anext__()).seq for _ in range(7)] == list(range(5, 12))
    assert [e.seq for e in await reader.next_batch()] == [11]
    # Closing keeps what it held: it is still read, then iteration ends.
    publish(3)
    reader.close()
    publish(1)
    assert [e.seq async for e in reader] == [12, 13, 14]
    assert [e.seq for e in late.take()] == [12, 13, 14, 15]
    late.close()
    assert not hub.subscribed("t1")  # the log went with its last subscriber


@pytest.mark.every_backend
async def test_a_burst_streams_each_run_started_then_ended_in_seq_order(live: Live) -> None:
    # 150 runs due at once on one thread (SQLite FULL commits their outcomes in groups and
    # holds the frames until each group's flush): one frame per change, numbered without
    # a gap, and no run starts on the stream before the one before it ended.
    tid = await live.api.new_thread()
    assert (await live.api.client.post(f"/api/threads/{tid}/pause")).status_code == 200
    ids = [await live.api.schedule(tid, "ping") for _ in range(150)]
    async with stream(live.url(tid)) as ws:
        assert (await live.api.client.post(f"/api/threads/{tid}/resume")).status_code == 200
        frames = await frames_until(ws, change_is(ids[-1], "completed"))
    # (With a relay the last schedules' frames may come after the stream opened.)
    runs = [f for f in frames if f["eventType"] == "effect_changed"
            and f["data"]["change"] != "scheduled"]
    assert [(f["data"]["id"], f["data"]["change"]) for f in runs] == [
        (i, c) for i in ids for c in ("started", "completed")]
    first = frames[0]["seq"]
    assert [f["seq"] for f in frames] == list(range(first, first + len(frames)))


def test_a_held_thread_s_events_are_numbered_at_once_and_delivered_in_order_on_release(
) -> None:
    from runtime.effects import EffectRun, EffectStatus
    from runtime.events import EffectChanged, RunChange, ThreadEvent
    from runtime.frames import ChangeHub

    hub = ChangeHub(queue_size=100)
    sub, other, every = hub.subscribe("t1"), hub.subscribe("t2"), hub.subscribe_runs()
    heard: list[tuple[str, int]] = []

    def listen(event: ThreadEvent) -> None:
        heard.append((event.thread_id, event.seq))

    hub.add_listener(listen)

    def publish(tid: str, run_id: str) -> int:
        run = EffectRun(id=run_id, thread_id=tid, name="noop", status=EffectStatus.PENDING,
                        args=None, run_at_ts=0.0, created_at_ts=0.0)
        return hub.publish(RunChange.SCHEDULED, run).seq

    assert publish("t1", "a") == 1 and [e.seq for e in sub.take()] == [1]
    hub.hold("t1")
    assert [publish("t1", r) for r in ("b", "c")] == [2, 3]
    mark = hub.hold_mark("t1")
    assert publish("t1", "d") == 4
    assert publish("t2", "x") == 1  # another thread is not held
    assert sub.take() == [] and [e.seq for e in other.take()] == [1]
    assert heard == [("t1", 1), ("t2", 1)]
    # Up to the mark, then the rest; listeners, the thread's and every thread's
    # subscribers get them in the order they were numbered.
    hub.release("t1", mark)
    assert [e.seq for e in sub.take()] == [2, 3] and hub.held("t1")
    hub.release("t1", mark)  # released already: nothing more
    assert sub.take() == []
    hub.release("t1")
    assert [e.seq for e in sub.take()] == [4] and not hub.held("t1")
    assert heard[2:] == [("t1", 2), ("t1", 3), ("t1", 4)]
    assert [(e.thread_id, e.seq) for e in every.take() if isinstance(e, EffectChanged)] == [
        ("t1", 1), ("t2", 1), ("t1", 2), ("t1", 3), ("t1", 4)]
    assert publish("t1", "e") == 5 and [e.seq for e in sub.take()] == [5]
    # A deleted thread's held events are never delivered.
    hub.hold("t1")
    publish("t1", "f")
    hub.close_thread("t1")
    hub.release("t1")
    assert sub.take() == [] and sub.closed and heard[-1] == ("t1", 5)


async def test_many_clients_of_one_thread_get_the_same_frames_from_when_they_joined(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, synchronous="NORMAL") as live:
        tid = await live.api.new_thread()
        async with stream(live.url(tid)) as first:
            await live.api.schedule(tid, "ping")
            head = await frames_until(first, lambda f: f["data"]["change"] == "completed")
            async with contextlib.AsyncExitStack() as stack:
                others = [await stack.enter_async_context(stream(live.url(tid)))
                          for _ in range(8)]
                ids = [await live.api.schedule(tid, "ping") for _ in range(5)]
                got = [await frames_until(ws, change_is(ids[-1], "completed"))
                       for ws in [first, *others]]
        assert [f["seq"] for f in head] == [1, 2, 3]
        assert all(g == got[0] for g in got)
        assert [f["seq"] for f in got[0]] == list(range(4, 4 + 15))


@pytest.mark.parametrize(("clients", "seconds"), [
    (0, 0.05), (1, 0.05), (100, 0.05), (200, 0.1), (300, 0.15), (500, 0.25), (5000, 0.25),
])
def test_a_frame_waits_longer_for_its_write_round_with_more_clients(
    clients: int, seconds: float,
) -> None:
    assert http.frame_batch_seconds(clients) == pytest.approx(seconds)


async def test_with_many_clients_frames_wait_for_the_longer_round_or_a_quarter_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Scaled down: 2 clients make the round interval 60 s, and a quarter of a queue of 64
    # (16 frames) pending ends the wait.
    monkeypatch.setattr(http, "FRAME_BATCH_SECONDS_PER_CLIENT", 30.0)
    monkeypatch.setattr(http, "FRAME_BATCH_MAX_SECONDS", 60.0)
    async with running(tmp_path, subscriber_queue_size=64, synchronous="NORMAL") as live:
        tid = await live.api.new_thread()
        async with stream(live.url(tid)) as a, stream(live.url(tid)) as b:
            await live.api.schedule(tid, "ping")
            await live.api.rt.wait_idle()
            # 3 frames pending, far from 16: held for the round (no client sees them yet).
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await a.recv()
            for _ in range(5):
                await live.api.schedule(tid, "ping")
            # 18 frames: the round comes; every client gets them from the first, in order.
            got = []
            for ws in (a, b):
                frames = await frames_until(ws, lambda f: f["seq"] >= 16)
                assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
                got.append(frames[:16])
        assert got[0] == got[1]


async def test_a_write_round_lets_other_work_run_between_slices_of_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Slices of 2 clients: what the loop has ready runs after the 2nd write (here: client 3
    # leaves, and gets nothing more), and every other client gets every frame in order.
    from runtime.effects import EffectRun, EffectStatus
    from runtime.events import RunChange
    from runtime.frames import ChangeHub

    monkeypatch.setattr(http, "FANOUT_SLICE_CLIENTS", 2)
    hub = ChangeHub(queue_size=100)
    subs = [hub.subscribe("t1") for _ in range(5)]
    for i in range(3):
        hub.publish(RunChange.SCHEDULED, EffectRun(
            id=f"r{i}", thread_id="t1", name="noop", status=EffectStatus.PENDING,
            args=None, run_at_ts=0.0, created_at_ts=0.0))
    fanout = http._FanOut(subs[0].source, {})
    loop = asyncio.get_running_loop()
    order: list[str] = []
    got: dict[int, list[int]] = {i: [] for i in range(5)}

    def leave() -> None:
        order.append("3 leaves")
        fanout.remove(subs[3])
        subs[3].close()

    def writer(i: int) -> Callable[[bytes, list[bytes]], None]:
        def write(wire: bytes, payloads: list[bytes]) -> None:
            order.append(f"write {i}")
            got[i].extend(json.loads(p)["seq"] for p in payloads)
            if i == 0:
                loop.call_soon(leave)
        return write

    done = [fanout.add(sub, lambda: True, writer(i)) for i, sub in enumerate(subs)]
    async with asyncio.timeout(GUARD_SECONDS):
        while len(order) < 5:
            await asyncio.sleep(0)
    assert order == ["write 0", "write 1", "3 leaves", "write 2", "write 4"]
    assert got == {0: [1, 2, 3], 1: [1, 2, 3], 2: [1, 2, 3], 3: [], 4: [1, 2, 3]}
    for i in (0, 1, 2, 4):
        subs[i].close()
    async with asyncio.timeout(GUARD_SECONDS):
        await asyncio.gather(*(done[i] for i in (0, 1, 2, 4)))
    done[3].cancel()  # what its `FrameStream` does when it leaves


async def test_a_stream_asked_while_the_database_is_unreachable_is_closed_with_1013(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the PostgreSQL backend raises while its database cannot be reached (HTTP: 503
    # database_unavailable); tests/test_multinode.py cuts a real node off the network.
    from runtime.errors import DatabaseUnavailable

    async with running(tmp_path) as server:
        tid = await server.api.new_thread()

        async def unreachable(*_: Any, **__: Any) -> Any:
            raise DatabaseUnavailable("PostgreSQL database x cannot be reached")

        monkeypatch.setattr(server.api.rt, "get_thread", unreachable)
        async with stream(server.url(tid)) as ws:
            assert await close_frame(ws) == (1013, "Database unavailable; try again later")
