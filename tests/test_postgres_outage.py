"""A database outage as a user sees it: runs wait, then go on; nothing runs twice.

The runtime talks to PostgreSQL through a small TCP proxy that the test stops (every
connection cut, new ones refused) and starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from runtime import EffectStatus, Runtime, ThreadState, ThreadStorageError
from tests.conftest import release, serve_api

APP = Path(__file__).parent / "apps" / "scheduling"


class TcpProxy:
    """Forwards 127.0.0.1:<port> to the PostgreSQL server; `stop` cuts everything.

    `go_silent` cuts the network silently: nothing is read or forwarded any more and no
    connection is closed, as with a stopped proxy (``kill -STOP``: the peers' kernels
    still acknowledge what they buffer); `resume` forwards again what was held.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._guard = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()

    def go_silent(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    @classmethod
    def to_local(cls, url: str) -> tuple[TcpProxy, str]:
        """A started proxy to the local server, and ``url`` (on 127.0.0.1:5432) through it."""
        proxy = cls(("127.0.0.1", 5432))
        proxy.start()
        through = url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        assert through != url
        return proxy, through

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        self._flowing.set()  # its pipes end on the sockets shut down below
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._guard:
            socks, self._open = list(self._open), set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._flowing.wait()  # silent: the connection waits, unanswered
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._guard:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._flowing.wait()
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()  # read just before the cut: held, as in a kernel
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


async def wait_for(thread: ThreadState, run_id: str, status: EffectStatus,
                   seconds: float = 120) -> None:
    """Wait (bounded, a hang guard) until the run has ``status``."""
    for _ in range(int(seconds / 0.05)):
        with contextlib.suppress(Exception):  # the database may still be down
            if (await thread.get_run(run_id)).status is status:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never became {status}")


async def test_a_thread_goes_on_after_a_database_outage_and_runs_nothing_twice(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy, url = TcpProxy.to_local(pg_url)
    caplog.set_level(logging.INFO)
    try:
        async with serve_api(tmp_path / "data", app_dir=APP, database_url=url) as api:
            tid = await api.new_thread()
            thread = await api.rt.get_thread(tid)
            in_flight = await api.schedule(tid, "hold", {"key": "outage"})
            await wait_for(thread, in_flight, EffectStatus.RUNNING)
            behind = await api.schedule(tid, "ping")
            # The database goes away for longer than the pool waits (10 s); the run in
            # flight ends meanwhile, so its outcome cannot be written.
            proxy.stop()
            release(api.rt, "outage")
            failed = ("running the threads' effects failed: the database cannot be "
                      "reached")
            for _ in range(400):
                if failed in caplog.text:
                    break
                await asyncio.sleep(0.05)
            assert failed in caplog.text
            proxy.start()
            await wait_for(thread, in_flight, EffectStatus.COMPLETED)
            await wait_for(thread, behind, EffectStatus.COMPLETED)
            # One line for the outage, none per thread; one when the drains work again.
            assert caplog.text.count(failed) == 1
            assert "cannot run its effects" not in caplog.text
            # The frames waiting meanwhile: one line too, not one per retry.
            assert caplog.text.count("cluster: writing frames failed") <= 1
            assert "could not write" not in caplog.text
            assert "running the threads' effects works again" in caplog.text
            # Recorded from memory, never executed again.
            assert (await api.run(tid, in_flight))["attempts"] == 1
            hold_log = (tmp_path / "data" / "hold.log").read_text().splitlines()
            assert hold_log.count("outage started") == 1
            # New runs on the thread start too.
            later = await api.schedule(tid, "ping")
            await wait_for(thread, later, EffectStatus.COMPLETED)
    finally:
        proxy.stop()


async def test_a_message_the_database_refuses_leaves_no_turn_to_resume(
    pg_url: str, tmp_path: Path
) -> None:
    from runtime.storage.postgres import split_schema
    from runtime.testing import override_model
    from runtime.turns import load_turns
    from tests.test_turns import APP as TURNS_APP
    from tests.test_turns import Script, text

    url, schema = split_schema(pg_url)
    async with Runtime(app_dir=TURNS_APP, data_dir=tmp_path, database_url=pg_url,
                       load_packages=False) as rt:
        thread = await rt.create_thread("t")
        # The database refuses this one message (as it would refuse any failing write).
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {schema}.messages ADD CONSTRAINT refuse_one "
                         f"CHECK (content <> 'refused by the database')")
        with override_model(rt, Script(text("never")).model), pytest.raises(ThreadStorageError):
            await thread.send_message("refused by the database")
        assert await load_turns(rt, "t") == {}
        with override_model(rt, Script(text("hello back")).model):
            result = await thread.send_message("hello")
        assert result.reply is not None and result.reply.content == "hello back"
    # Nothing is resumed at the next start.
    async with Runtime(app_dir=TURNS_APP, data_dir=tmp_path, database_url=pg_url,
                       load_packages=False) as rt:
        turns = await load_turns(rt, "t")
        assert [row.status for row in turns.values()] == ["succeeded"]
        messages = (await (await rt.get_thread("t")).get_messages()).messages
        assert [m.content for m in messages] == ["hello", "hello back"]


async def test_losing_the_lock_connection_stops_runs_until_the_lock_is_held_again(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from runtime.storage import postgres
    from runtime.storage.postgres import PostgresBackend, split_schema

    monkeypatch.setattr(postgres, "LOCK_RETRY_FIRST_SECONDS", 2.0)
    caplog.set_level(logging.ERROR)
    url, schema = split_schema(pg_url)
    # The lease is renewed every 0.2 s.
    async with serve_api(tmp_path / "data", app_dir=APP, database_url=pg_url,
                         lease_seconds=0.6) as api:
        tid = await api.new_thread()
        thread = await api.rt.get_thread(tid)
        first = await api.schedule(tid, "ping")
        await wait_for(thread, first, EffectStatus.COMPLETED)
        assert (await api.client.get("/api/health")).json()["databaseConnected"] is True
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE application_name = %s", (f"thread-effects-node:{schema}",))
        # A second process with the same node id starts before this one reconnects.
        other = PostgresBackend(pg_url, node_id=api.rt.node_id)
        await asyncio.to_thread(other.open)
        try:
            for _ in range(400):  # a hang guard
                health = (await api.client.get("/api/health")).json()
                if health["databaseConnected"] is False:
                    break
                await asyncio.sleep(0.05)
            assert health["databaseConnected"] is False
            for _ in range(400):  # the next renewal (0.2 s) finds it lost
                if "connection renewing node" in caplog.text:
                    break
                await asyncio.sleep(0.05)
            assert "connection renewing node" in caplog.text
            for _ in range(400):
                if "is held by another live process" in caplog.text:
                    break
                await asyncio.sleep(0.05)
            ready = await api.client.get("/api/ready")
            assert ready.status_code == 503
            assert "held by another" in ready.json()["error"]["message"]
            # Runs are still accepted, but none starts while the other process holds it.
            stopped = await api.schedule(tid, "ping")
            await asyncio.sleep(1.5)
            assert (await thread.get_run(stopped)).status is EffectStatus.PENDING
        finally:
            await asyncio.to_thread(other.close)
        # The other process is gone: the node id and its lease are taken back, and the run
        # goes on.
        await wait_for(thread, stopped, EffectStatus.COMPLETED, seconds=60)
        assert (await api.client.get("/api/health")).json()["databaseConnected"] is True
        assert (await api.client.get("/api/ready")).status_code == 200


async def test_health_says_the_connection_is_lost_as_soon_as_the_server_ends_it(
    pg_url: str, tmp_path: Path
) -> None:
    from runtime.storage.postgres import split_schema

    url, schema = split_schema(pg_url)
    # The default lease: renewed every 10 s, so the next renewal is seconds away.
    async with serve_api(tmp_path / "data", app_dir=APP, database_url=pg_url) as api:
        assert (await api.client.get("/api/health")).json()["databaseConnected"] is True
        with psycopg.connect(url, autocommit=True) as conn:
            ended = conn.execute(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM "
                "pg_stat_activity WHERE application_name = %s) t",
                (f"thread-effects-node:{schema}",)).fetchone()
        assert ended == (1,)
        for _ in range(40):  # within 2 s, well before the renewal
            health = (await api.client.get("/api/health")).json()
            if health["databaseConnected"] is False:
                break
            await asyncio.sleep(0.05)
        assert health["databaseConnected"] is False
        # Nothing else is wrong: seeing it lost woke the renewal, which reconnected at
        # once (not at its next period, seconds away).
        for _ in range(60):  # within 3 s
            if (await api.client.get("/api/health")).json()["databaseConnected"] is True:
                break
            await asyncio.sleep(0.05)
        assert (await api.client.get("/api/health")).json()["databaseConnected"] is True
        assert (await api.client.get("/api/ready")).status_code == 200


async def test_ready_answers_503_at_once_when_the_server_ended_the_nodes_connection(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy, url = TcpProxy.to_local(pg_url)
    caplog.set_level(logging.INFO, logger="runtime.http")
    try:
        # The default lease: the next renewal is seconds away.
        async with serve_api(tmp_path / "data", app_dir=APP, database_url=url) as api:
            assert (await api.client.get("/api/ready")).status_code == 200
            proxy.stop()  # every connection closed, and no new one gets through
            for _ in range(40):  # within 2 s
                if (await api.client.get("/api/health")).json()["databaseConnected"] is False:
                    break
                await asyncio.sleep(0.05)
            started = time.monotonic()
            ready = await api.client.get("/api/ready")
            assert ready.status_code == 503
            assert time.monotonic() - started < 1.0  # not the pool's 2 s wait
            # Once the renewal's reconnects fail too, the answer says why.
            for _ in range(100):  # a hang guard
                message = (await api.client.get("/api/ready")).json()["error"]["message"]
                if "cannot be reached" in message:
                    break
                await asyncio.sleep(0.05)
            assert "cannot be reached" in message, message
            # A probe a moment does not make a log line a moment: one per reason.
            failed = [r for r in caplog.records if "readiness check" in r.getMessage()]
            assert 1 <= len(failed) <= 3, [r.getMessage() for r in failed]
            proxy.start()
            for _ in range(200):  # a hang guard
                if (await api.client.get("/api/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert (await api.client.get("/api/ready")).status_code == 200
            assert "readiness check passes again" in caplog.text
    finally:
        proxy.stop()


async def test_calls_during_an_outage_answer_503_database_unavailable_without_a_traceback(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:

    proxy, url = TcpProxy.to_local(pg_url)
    caplog.set_level(logging.ERROR)
    try:
        # The node lease is renewed every 0.2 s: the cut is noticed at once.
        async with serve_api(tmp_path / "data", app_dir=APP, database_url=url,
                             lease_seconds=0.6) as api:
            tid = await api.new_thread()
            proxy.stop()
            for _ in range(400):  # a hang guard
                if (await api.client.get("/api/health")).json()["databaseConnected"] is False:
                    break
                await asyncio.sleep(0.05)
            ready = await api.client.get("/api/ready")
            assert ready.status_code == 503
            caplog.clear()
            res = await api.client.get(f"/api/threads/{tid}/effects")
            assert res.status_code == 503, res.text
            assert res.json()["error"]["code"] == "database_unavailable"
            listing = await api.client.get("/api/threads")
            assert listing.status_code == 503, listing.text
            assert listing.json()["error"]["code"] == "database_unavailable"
            assert "Traceback" not in caplog.text
            proxy.start()
            for _ in range(600):  # a hang guard: back once the lock is held again
                if (await api.client.get("/api/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert (await api.client.get(f"/api/threads/{tid}/effects")).status_code == 200
    finally:
        proxy.stop()


async def guarded_get(api: Any, path: str) -> httpx.Response:
    """GET ``path``; a hang guard of 30 s (a call that hangs fails the test)."""
    async with asyncio.timeout(30):
        response: httpx.Response = await api.client.get(path)
        return response


async def test_a_silent_network_cut_stops_the_node_before_its_lease_ends_and_calls_answer_503(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Packets vanish, no connection closes: the node's own clock ends its lease.

    Its running effect is canceled while its lease row still holds in the database (no
    other node may have taken the run yet); calls answer 503 instead of hanging; once the
    network is back the node holds its lease again and the run goes on.
    """
    from runtime.storage.postgres import split_schema

    direct, schema = split_schema(pg_url)
    proxy, url = TcpProxy.to_local(pg_url)
    caplog.set_level(logging.INFO)
    log_file = tmp_path / "data" / "hold.log"
    try:
        async with serve_api(tmp_path / "data", app_dir=APP, database_url=url,
                             lease_seconds=6) as api:
            tid = await api.new_thread()
            thread = await api.rt.get_thread(tid)
            run_id = await api.schedule(tid, "hold", {"key": "cut"})
            await wait_for(thread, run_id, EffectStatus.RUNNING)
            node = api.rt.node_id
            proxy.go_silent()
            try:
                await silent_cut_checks(api, tid, run_id, node, direct, schema, log_file)
            finally:
                proxy.resume()  # also on a failure: the runtime's shutdown needs it
            for _ in range(1200):  # a hang guard: back once the lease is held again
                if (await guarded_get(api, "/api/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert (await guarded_get(api, "/api/ready")).status_code == 200
            caplog.clear()
            # The run was re-queued (attempt 2) and goes on; new runs start too.
            for _ in range(1200):
                if log_file.read_text().count("cut started") == 2:
                    break
                await asyncio.sleep(0.05)
            release(api.rt, "cut")
            await wait_for(thread, run_id, EffectStatus.COMPLETED)
            assert (await api.run(tid, run_id))["attempts"] == 2
            later = await api.schedule(tid, "ping")
            await wait_for(thread, later, EffectStatus.COMPLETED)
            res = await guarded_get(api, f"/api/threads/{tid}/effects")
            assert res.status_code == 200
            # The pool came back with the lease (no call waited out a reconnect backoff).
            assert "cannot be reached" not in caplog.text
    finally:
        proxy.stop()


async def silent_cut_checks(api: Any, tid: str, run_id: str, node: str, direct: str,
                            schema: str, log_file: Path) -> None:
    """While the network is cut silently: the node stopped in time and answers 503."""
    for _ in range(1500):  # a hang guard (30 s): the effect used to run on to its end
        if "cut canceled" in log_file.read_text():
            break
        await asyncio.sleep(0.02)
    assert "cut canceled" in log_file.read_text()
    # Canceled before any other node may take the run over: the lease still holds.
    with psycopg.connect(direct, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT lease_expires_at > extract(epoch from clock_timestamp()) "
            f"FROM {schema}.nodes WHERE node_id = %s", (node,)).fetchone()
    assert row == (True,)
    # Calls answer at once instead of waiting on the silent connections.
    health = (await guarded_get(api, "/api/health")).json()
    assert health["databaseConnected"] is False
    assert (await guarded_get(api, "/api/ready")).status_code == 503
    for path in (f"/api/threads/{tid}/effects/{run_id}", f"/api/threads/{tid}/effects"):
        res = await guarded_get(api, path)
        assert res.status_code == 503, res.text
        assert res.json()["error"]["code"] == "database_unavailable"
    # The scrape still answers with what this process counts; only the gauge read from the
    # database is left out.
    res = await guarded_get(api, "/metrics")
    assert res.status_code == 200, res.text
    assert 'thread_effects_runs_scheduled_total{effect="hold"} 1.0' in res.text
    assert "thread_effects_pending_runs" not in res.text
    assert "cut canceled" in log_file.read_text()


def _pooled(url: str, schema: str) -> int:
    """How many connections the node's pool holds on the server."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                           (f"thread-effects:{schema}",)).fetchone()
    return int(row[0]) if row else 0


async def _fill_pool(api: Any, tid: str, url: str, schema: str, at_least: int) -> None:
    """Make the node's pool hold ``at_least`` connections (concurrent calls)."""
    for _ in range(100):  # a hang guard
        await asyncio.gather(*[api.client.get(f"/api/threads/{tid}") for _ in range(40)])
        if await asyncio.to_thread(_pooled, url, schema) >= at_least:
            return
    raise AssertionError("the pool never held enough connections")


async def _timed(api: Any, method: str, path: str, **kwargs: Any) -> tuple[int, float]:
    started = time.monotonic()
    async with asyncio.timeout(30):  # a hang guard
        response = await api.client.request(method, path, **kwargs)
    return response.status_code, time.monotonic() - started


async def test_after_a_blink_the_next_calls_work_at_once(
    pg_url: str, tmp_path: Path,
) -> None:
    # A blink: every connection of the database ended, the server up. Before,
    # each call took the pool's ended connections one by one, sleeping 1, 2, 4 s between
    # them: 503 after 10 s, or an answer after 3 to 7 s.
    from runtime.storage.postgres import split_schema

    url, schema = split_schema(pg_url)
    assert schema is not None
    async with serve_api(tmp_path / "data", app_dir=APP, database_url=pg_url,
                         lease_seconds=6) as api:
        tid = await api.new_thread()
        await _fill_pool(api, tid, url, schema, at_least=6)
        with psycopg.connect(url, autocommit=True) as conn:
            ended = [pid for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s "
                "AND pg_terminate_backend(pid)", (f"thread-effects%:{schema}",)).fetchall()]
            assert len(ended) >= 8  # the pool's, the node's lock and the bus
            while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                               (ended,)).fetchone() != (0,):
                await asyncio.sleep(0.01)
        answers = [
            await _timed(api, "POST", f"/api/threads/{tid}/effects",
                         json={"name": "ping", "args": {}}),
            await _timed(api, "GET", f"/api/threads/{tid}"),
            await _timed(api, "GET", f"/api/threads/{tid}/effects"),
            await _timed(api, "GET", "/api/threads"),
        ]
        assert [status for status, _ in answers] == [201, 200, 200, 200], answers
        # At most a failed check and a new connection each (milliseconds).
        assert max(seconds for _, seconds in answers) < 1.5, answers


async def test_ready_answers_503_within_seconds_of_an_outage_and_200_soon_after_it(
    pg_url: str, tmp_path: Path,
) -> None:
    # An outage (connections ended, new ones refused): before, /api/ready took
    # 10 s to answer 503, and 6 to 8 s after the database came back to answer 200.
    from runtime.storage.postgres import split_schema

    proxy, url = TcpProxy.to_local(pg_url)
    base, schema = split_schema(pg_url)
    assert schema is not None
    try:
        async with serve_api(tmp_path / "data", app_dir=APP, database_url=url,
                             lease_seconds=6) as api:
            tid = await api.new_thread()
            await _fill_pool(api, tid, base, schema, at_least=4)
            proxy.stop()
            during = [await _timed(api, "GET", "/api/ready") for _ in range(4)]
            await asyncio.sleep(6)  # the pool's attempts to connect back off meanwhile
            during.append(await _timed(api, "GET", "/api/ready"))
            assert {status for status, _ in during} == {503}, during
            # "About 2 s once the outage is noticed"; before, 10 s.
            assert max(seconds for _, seconds in during) < 5.0, during
            proxy.start()
            reopened = time.monotonic()
            for _ in range(600):  # a hang guard
                if (await _timed(api, "GET", "/api/ready"))[0] == 200:
                    break
                await asyncio.sleep(0.1)
            back = time.monotonic() - reopened
            assert back < 4.5, back  # the node reconnects within 2 s, the pool within 1 s
            status, _ = await _timed(api, "GET", f"/api/threads/{tid}")
            assert status == 200
    finally:
        proxy.stop()


NOTE_APP = '''
import asyncio

from runtime import ThreadState, define_effect

GATE = asyncio.Event()
CALLS = []


async def note(state: ThreadState) -> None:
    CALLS.append(state.thread_id)
    await GATE.wait()
    await state.inject_message("noted")


effect = define_effect("Waits for the test, then writes a message.", note,
                       concurrent=CONCURRENT)
'''


@pytest.mark.parametrize("concurrent", [False, True], ids=["in_line", "concurrent"])
async def test_a_run_whose_store_call_loses_the_database_is_requeued_not_failed(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, concurrent: bool
) -> None:
    # The effect's own call through ThreadState fails because the runtime's database went
    # away: the outage is the runtime's, so the run runs again once it is back. (A
    # concurrent effect's run records its outcome itself, beside the drain.)
    app = tmp_path / "app"
    (app / "effects").mkdir(parents=True)
    (app / "effects" / "note.py").write_text(f"CONCURRENT = {concurrent}\n" + NOTE_APP)
    proxy, url = TcpProxy.to_local(pg_url)
    caplog.set_level(logging.WARNING)
    try:
        async with Runtime(app_dir=app, data_dir=tmp_path / "data", database_url=url,
                           load_packages=False) as rt:
            thread = await rt.create_thread("t")
            run_id = await thread.schedule_effect("note")
            await wait_for(thread, run_id, EffectStatus.RUNNING)
            effect_globals = rt.registry.app["note"].fn.__globals__
            proxy.stop()
            effect_globals["GATE"].set()  # its inject_message finds no database
            for _ in range(400):
                if "interrupted by a database outage" in caplog.text:
                    break
                await asyncio.sleep(0.05)
            assert "interrupted by a database outage" in caplog.text
            proxy.start()
            await wait_for(thread, run_id, EffectStatus.COMPLETED)
            run = await thread.get_run(run_id)
            assert run.attempts == 2 and run.error is None
            first, second = await thread.get_run_attempts(run_id)
            assert first.outcome == "interrupted"
            assert first.error is not None
            assert first.error.startswith("the database could not be reached while it ran")
            assert second.outcome == "completed"
            assert effect_globals["CALLS"] == ["t", "t"]
            messages = (await thread.get_messages()).messages
            assert [m.content for m in messages] == ["noted"]
    finally:
        proxy.stop()


async def test_a_shutdown_while_the_database_is_unreachable_leaves_the_runs_to_the_lease_rule(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A node stopped during an outage tries the database once, not once per open thread.

    Its log says in one warning line, with no traceback, what it left; the run it was
    running stays ``running`` under its id, and its next start re-queues it (so does
    another node once the lease expired: tests/test_nodes.py).
    """
    from runtime.storage.postgres import PostgresBackend

    proxy, url = TcpProxy.to_local(pg_url)

    def node(database_url: str) -> Runtime:
        storage = PostgresBackend(database_url, node_id="stopper", lease_seconds=3.0)
        return Runtime(app_dir=APP, data_dir=tmp_path / "data", load_packages=False,
                       storage=storage, shutdown_grace_seconds=0.2)

    rt = node(url)
    await rt.start()
    try:
        threads = []
        for i in range(6):
            thread = await rt.create_thread(f"open{i}")
            threads.append((thread, await thread.schedule_effect("ping")))
        for thread, run_id in threads:
            await wait_for(thread, run_id, EffectStatus.COMPLETED)
        held = await rt.create_thread("held")
        in_flight = await held.schedule_effect("hold", {"key": "stopped"})
        await wait_for(held, in_flight, EffectStatus.RUNNING)
        caplog.set_level(logging.WARNING)
        caplog.clear()
        proxy.stop()
        for _ in range(400):  # a hang guard: the next renewal (within 1 s) notices
            if rt.storage.lock_problem() is not None:
                break
            await asyncio.sleep(0.05)
        await rt.close()
    finally:
        proxy.stop()
        await rt.close()
    ours = [r for r in caplog.records if r.name.startswith("runtime")]
    left = [r for r in ours if "shutdown: the database cannot be reached" in r.getMessage()]
    assert len(left) == 1, [r.getMessage() for r in ours]
    assert "7 open thread(s)" in left[0].getMessage()
    assert not [r for r in ours if "could not re-queue" in r.getMessage()]
    assert not [r.getMessage() for r in ours if r.exc_info], "no traceback"

    # Its next start re-queues the run it left running (the lease rule's own case).
    rt = node(pg_url)
    await rt.start()
    try:
        release(rt, "stopped")
        held = await rt.get_thread("held")
        await wait_for(held, in_flight, EffectStatus.COMPLETED)
        attempts = await held.get_run_attempts(in_flight)
        assert [a.outcome for a in attempts] == ["interrupted", "completed"]
    finally:
        await rt.close()
