"""Selecting the PostgreSQL backend: the setting, the server's health, refusals.

The storage contract over PostgreSQL is in tests/storage/test_contract.py; the end-to-end
tests marked ``every_backend`` (HTTP, stream, SIGKILL recovery) run on it too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pydantic
import pytest
from conftest import serve_api
from pg import query

from runtime import Runtime
from runtime.config import RetentionPolicy
from runtime.effects import EffectRun, EffectStatus
from runtime.errors import RuntimeStorageError, ThreadNotFound, ThreadStorageError
from runtime.recurrence import Recurrence, Schedule, ScheduleState
from runtime.storage.base import Finish, RunQuery, RuntimeStore, ThreadInfo, ThreadStore
from runtime.storage.postgres import (
    CLAIM_TRANSACTIONS_IN_FLIGHT,
    PostgresBackend,
    redact_url,
    split_schema,
)
from runtime.testing import FakeClock


async def test_a_database_url_keeps_every_thread_in_postgres(pg_url: str, tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock(), database_url=pg_url) as api:
        assert isinstance(api.rt.storage, PostgresBackend)
        res = await api.client.get("/api/health")
        assert res.json() == {"status": "ok", "backend": "postgres", "databaseConnected": True,
                              "nodeId": api.rt.node_id}
        tid = await api.new_thread(user_id="u1")
        run_id = await api.schedule(tid, "note", {"text": "hello"})
        await api.rt.wait_idle()
        assert (await api.run(tid, run_id))["status"] == "completed"
    url, schema = split_schema(pg_url)
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"SELECT thread_id, id, status, attempts FROM {schema}.effect_runs"
        ).fetchall()
        registry = conn.execute(f"SELECT id, user_id FROM {schema}.threads").fetchall()
    assert rows == [(tid, run_id, "completed", 1)]
    assert registry == [(tid, "u1")]
    assert not (tmp_path / "data" / "threads").exists()  # no SQLite file was made


async def test_without_a_database_url_health_names_sqlite(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        res = await api.client.get("/api/health")
        assert res.json() == {"status": "ok", "backend": "sqlite", "databaseConnected": None,
                              "nodeId": api.rt.node_id}


def test_a_database_url_that_is_not_postgres_is_refused_without_its_password(
    tmp_path: Path,
) -> None:
    with pytest.raises(pydantic.ValidationError, match="must begin with postgresql://") as err:
        Runtime(data_dir=tmp_path, database_url="mysql://u:secret@h/db")
    assert "secret" not in str(err.value)


async def test_an_unreachable_database_stops_the_start_naming_it_without_the_password(
    tmp_path: Path,
) -> None:
    url = "postgresql://u:secret@127.0.0.1:1/db"  # nothing listens on port 1
    rt = Runtime(data_dir=tmp_path, database_url=url, load_packages=False)
    with pytest.raises(RuntimeStorageError, match="cannot be reached") as err:
        await rt.start()
    assert "postgresql://u:***@127.0.0.1:1/db" in str(err.value)
    assert "secret" not in str(err.value)


def test_urls_are_shown_without_passwords_and_the_schema_parameter_is_taken_off() -> None:
    assert redact_url("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert split_schema("postgresql://h/db?schema=app1&sslmode=disable") == (
        "postgresql://h/db?sslmode=disable", "app1"
    )
    assert split_schema("postgresql://h/db") == ("postgresql://h/db", None)
    with pytest.raises(ValueError, match="Invalid PostgreSQL schema name"):
        PostgresBackend("postgresql://h/db?schema=Bad-Name")


@pytest.mark.parametrize("schema", ["information_schema", "pg_catalog", "pg_toast", "pg_x"])
def test_postgresqls_own_schemas_are_refused_before_connecting(schema: str) -> None:
    with pytest.raises(ValueError, match=f"schema name '{schema}'.*PostgreSQL's own"):
        PostgresBackend(f"postgresql://h/db?schema={schema}")
    with pytest.raises(ValueError, match="PostgreSQL's own"):
        PostgresBackend("postgresql://h/db", schema=schema)


@pytest.mark.parametrize(
    "url", ["postgresql://h/db\n", "postgresql://h/d\tb", "postgresql://h/db\r"])
def test_a_url_with_a_control_character_is_refused_before_connecting(url: str) -> None:
    with pytest.raises(ValueError, match=r"control character.*line break"):
        PostgresBackend(url)


def test_connections_the_server_ended_are_replaced_without_failing_a_call(pg_url: str) -> None:
    """A blink (the server restarted, a proxy cut the connections): the next calls work."""
    from runtime.effects import EffectRun, EffectStatus
    from runtime.storage.base import ThreadInfo

    backend = PostgresBackend(pg_url)
    rtdb = backend.open()
    try:
        info = ThreadInfo(id="a", created_at_ts=1.0)
        assert rtdb.add_thread(info)
        store = backend.create_thread_store(info)
        url, schema = split_schema(pg_url)
        with psycopg.connect(url, autocommit=True) as conn:
            ended = [pid for pid, done in conn.execute(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s", (f"thread-effects:{schema}",),
            ).fetchall() if done]
            assert ended  # the pool held at least one connection
            # Until the server processes are gone (they end a moment after the signal).
            while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                               (ended,)).fetchone() != (0,):
                time.sleep(0.01)
        assert rtdb.get_thread("a") == info
        run = EffectRun(id="r1", thread_id="a", name="note", status=EffectStatus.PENDING,
                        args={"text": "x"}, run_at_ts=1.0, created_at_ts=1.0)
        assert store.insert_run(run) is None
        assert [r.id for r in store.pending_runs()] == ["r1"]
        assert backend.connection_held()  # the lock's own connection was left alone
        store.close()
    finally:
        rtdb.close()
        backend.close()


def test_password_query_parameters_are_redacted_too() -> None:
    assert redact_url("postgresql://h/db?user=u&password=s3cret&sslmode=disable") == (
        "postgresql://h/db?user=u&password=***&sslmode=disable"
    )
    assert "s3cret" not in redact_url("postgresql://u:pw@h/db?PASSWORD=s3cret")
    assert "pw" not in redact_url("postgresql://u:pw@h/db?PASSWORD=s3cret").split("@")[0][6:]


def test_a_url_without_a_host_part_is_kept_intact_when_the_schema_is_taken_off() -> None:
    assert split_schema("postgresql:///db?host=127.0.0.1&user=postgres&schema=app1") == (
        "postgresql:///db?host=127.0.0.1&user=postgres", "app1"
    )
    assert split_schema("postgresql:///db?schema=app1") == ("postgresql:///db", "app1")
    assert split_schema("postgresql:///db?host=/run/x") == ("postgresql:///db?host=/run/x", None)


@pytest.mark.parametrize("query", ["schema=Mixed", "schema=a;drop"])
def test_an_invalid_schema_name_is_refused_naming_the_rule(query: str) -> None:
    with pytest.raises(ValueError, match=r"must match \[a-z_\]\[a-z0-9_\]\*"):
        PostgresBackend(f"postgresql://h/db?{query}")


def test_an_empty_or_repeated_schema_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="schema parameter is empty"):
        PostgresBackend("postgresql://h/db?schema=")
    with pytest.raises(ValueError, match="given 2 times"):
        PostgresBackend("postgresql://h/db?schema=a&schema=b")
    with pytest.raises(ValueError, match="Invalid PostgreSQL schema name ''"):
        PostgresBackend("postgresql://h/db", schema="")


def test_the_server_refuses_a_bad_schema_in_one_line() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "server.py", "--database-url", "postgresql://h/db?schema=a;drop"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "[a-z_][a-z0-9_]*" in proc.stderr


def test_a_schema_version_of_zero_is_reported_as_such(pg_url: str) -> None:
    url, _ = split_schema(pg_url)
    name = "zero_version"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"CREATE SCHEMA {name}")
        conn.execute(f"CREATE TABLE {name}.schema_version (version integer)")
        conn.execute(f"INSERT INTO {name}.schema_version VALUES (0)")
    backend = PostgresBackend(url, schema=name)
    try:
        with pytest.raises(RuntimeStorageError, match="holds version 0"):
            backend.open()
    finally:
        backend.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def test_a_failed_transaction_commits_nothing_and_its_connection_serves_the_next(
    pg_url: str,
) -> None:
    from runtime.storage.base import ThreadInfo

    backend = PostgresBackend(pg_url, pool_size=1)  # one connection: the next call reuses it
    rtdb = backend.open()
    try:
        assert rtdb.add_thread(ThreadInfo(id="a", created_at_ts=1.0))
        with pytest.raises(psycopg.errors.DivisionByZero):
            with backend.transaction() as cur:
                cur.execute("UPDATE threads SET created_at = 2.0 WHERE id = 'a'")
                cur.execute("SELECT 1 / 0")
        with pytest.raises(KeyError):  # an error of the caller's code, not the database's
            with backend.transaction() as cur:
                cur.execute("UPDATE threads SET created_at = 3.0 WHERE id = 'a'")
                raise KeyError("x")
        with backend.transaction() as cur:
            cur.execute("UPDATE threads SET user_id = 'u' WHERE id = 'a'")
        info = rtdb.get_thread("a")
        assert info is not None and (info.created_at_ts, info.user_id) == (1.0, "u")
    finally:
        rtdb.close()
        backend.close()


def test_activity_of_a_thread_whose_row_is_held_is_left_for_later_not_waited_for(
    pg_url: str,
) -> None:
    # A claim holds its thread's registry row for its transaction; an activity update
    # that waited for it made the next claims wait behind it in turn. It now skips that
    # row and answers what it left, which the runtime gives again with its next batch.
    backend = PostgresBackend(pg_url)
    rtdb = backend.open()
    url, schema = split_schema(pg_url)
    holder = psycopg.connect(url)
    try:
        for tid in ("a", "b"):
            assert rtdb.add_thread(ThreadInfo(id=tid, created_at_ts=1.0))
        holder.execute(f"SELECT 1 FROM {schema}.threads WHERE id = 'a' FOR NO KEY UPDATE")
        started = time.monotonic()
        left = rtdb.touch_threads({"a": 50.0, "b": 60.0, "gone": 70.0})
        run = EffectRun("r1", "b", "note", EffectStatus.COMPLETED, None, 80.0, 80.0,
                        finished_at_ts=90.0)
        left_by_index = rtdb.index_runs([run, replace(run, id="r2", thread_id="a")])
        assert time.monotonic() - started < 5  # neither waited for the held row
        assert left == {"a": 50.0}  # an unknown thread is skipped, not left for later
        assert left_by_index == {"a": 90.0}
        activity = {i.id: i.last_activity_ts for i in (rtdb.get_thread("a"),
                                                       rtdb.get_thread("b")) if i}
        assert activity == {"a": 1.0, "b": 90.0}
        holder.rollback()  # the row is free again: the later batch writes it
        assert rtdb.touch_threads({"a": 90.0}) == {}
        info = rtdb.get_thread("a")
        assert info is not None and info.last_activity_ts == 90.0
    finally:
        holder.close()
        rtdb.close()
        backend.close()


async def test_a_threads_activity_left_for_later_reaches_the_listing_once_its_row_is_free(
    pg_url: str, tmp_path: Path
) -> None:
    clock = FakeClock()
    async with serve_api(tmp_path / "data", clock=clock, database_url=pg_url) as api:
        older = await api.new_thread()
        clock.advance(1)
        newer = await api.new_thread()
        clock.advance(1)
        url, schema = split_schema(pg_url)
        holder = await psycopg.AsyncConnection.connect(url)
        try:
            # Another transaction (a claim of another node, say) holds the older thread's row.
            await holder.execute(
                f"SELECT 1 FROM {schema}.threads WHERE id = %s FOR NO KEY UPDATE", (older,))
            state = await api.rt.get_thread(older)
            message = await state.inject_message("a notice")

            async def by_activity() -> list[str]:
                res = await api.client.get("/api/threads")
                assert res.status_code == 200, res.text
                return [t["id"] for t in res.json()["threads"]]

            assert await by_activity() == [newer, older]  # not written yet, not waited for
            await holder.rollback()
            deadline = time.monotonic() + 10
            while await by_activity() != [older, newer]:
                assert time.monotonic() < deadline, "the activity was never written"
                await asyncio.sleep(0.05)
            res = await api.client.get("/api/threads", params={"limit": "1"})
            assert res.json()["threads"][0]["lastActivityAt"] == \
                message.to_json()["createdAt"]
        finally:
            await holder.close()


def test_a_claim_that_skips_its_probe_still_sees_what_another_node_did(pg_url: str) -> None:
    """A thread store that inserted a due run claims without probing first; another node
    may have run it (nothing to claim, the next due read) or be running one (busy)."""
    from runtime.effects import EffectRun, EffectStatus
    from runtime.storage.base import Finish, ThreadInfo

    def run(run_id: str, due: float) -> EffectRun:
        return EffectRun(id=run_id, thread_id="a", name="note", status=EffectStatus.PENDING,
                         args={"text": "x"}, run_at_ts=due, created_at_ts=1.0)

    one, two = PostgresBackend(pg_url, node_id="n1"), PostgresBackend(pg_url, node_id="n2")
    rtdb = one.open()
    rtdb2 = two.open()
    try:
        info = ThreadInfo(id="a", created_at_ts=1.0)
        assert rtdb.add_thread(info)
        here, there = one.create_thread_store(info), two.open_thread_store(info.id)
        assert here.insert_run(run("r1", 2.0)) is None  # this store knows r1 is due at 2
        _, claimed, _ = there.finish_and_claim(None, 3.0)
        assert claimed is not None and claimed.id == "r1"
        # The other node runs r1: the claim here is refused as busy.
        assert here.finish_and_claim(None, 3.0) == (None, None, None)
        assert here.claim_blocked == "busy"
        assert there.insert_run(run("r2", 9.0)) is None
        finished, claimed, next_due = there.finish_and_claim(
            Finish("r1", EffectStatus.COMPLETED, None, 4.0), 4.0)
        assert finished is not None and claimed is None and next_due == 9.0
        assert here.insert_run(run("r3", 5.0)) is None
        _, claimed, _ = there.finish_and_claim(None, 5.0)
        assert claimed is not None and claimed.id == "r3"
        finished, claimed, next_due = there.finish_and_claim(
            Finish("r3", EffectStatus.COMPLETED, None, 5.0), 5.0)
        assert finished is not None and finished.id == "r3"
        assert (claimed, next_due) == (None, 9.0)
        # r3 ran on the other node: here nothing is claimed, and the next due is read.
        assert here.finish_and_claim(None, 6.0) == (None, None, 9.0)
        assert here.claim_blocked is None
        _, claimed, _ = here.finish_and_claim(None, 9.0)
        assert claimed is not None and claimed.id == "r2"
        here.close()
        there.close()
    finally:
        rtdb2.close()
        rtdb.close()
        two.close()
        one.close()


def _due_run(thread_id: str, run_id: str, due: float) -> EffectRun:
    return EffectRun(id=run_id, thread_id=thread_id, name="note", status=EffectStatus.PENDING,
                     args={"text": "x"}, run_at_ts=due, created_at_ts=1.0)


def _thread_with_a_due_run(
    rtdb: RuntimeStore, backend: PostgresBackend, thread_id: str
) -> ThreadStore:
    """A registered thread's new store holding one run ``<thread_id>1`` due at 2.0."""
    info = ThreadInfo(id=thread_id, created_at_ts=1.0)
    assert rtdb.add_thread(info)
    store = backend.create_thread_store(info)
    assert store.insert_run(_due_run(thread_id, f"{thread_id}1", 2.0)) is None
    return store


def _in_threads(
    calls: dict[str, Callable[[], object]],
) -> dict[str, concurrent.futures.Future[object]]:
    pool = concurrent.futures.ThreadPoolExecutor(len(calls))
    futures = {name: pool.submit(fn) for name, fn in calls.items()}
    pool.shutdown(wait=False)
    return futures


def _wait_queued(backend: PostgresBackend, count: int) -> None:
    """Wait until ``count`` claims wait behind the one in flight on ``backend``."""
    deadline = time.monotonic() + 10
    while len(backend._claims._queue) < count:
        assert time.monotonic() < deadline, "the claims never queued"
        time.sleep(0.01)


@contextmanager
def _rows_held(url: str, *thread_ids: str) -> Iterator[Callable[[], None]]:
    """Hold these threads' registry rows locked from another connection until the yielded
    function (or the block's end) releases them."""
    base, schema = split_schema(url)
    with psycopg.connect(base, options=f"-c search_path={schema}") as conn:
        conn.execute("SELECT 1 FROM threads WHERE id = ANY(%s) FOR NO KEY UPDATE",
                     (list(thread_ids),))
        yield conn.commit
        conn.commit()


# Claims kept in flight (their rows held) so that the next ones queue for a group.
_LEADERS = tuple(f"x{i}" for i in range(CLAIM_TRANSACTIONS_IN_FLIGHT))


def _lead(stores: dict[str, Any]) -> dict[str, concurrent.futures.Future[object]]:
    """Start the claims of the `_LEADERS` threads (their rows held: they wait in flight)."""
    first = _in_threads({x: partial(stores[x].finish_and_claim, None, 5.0)
                         for x in _LEADERS})
    time.sleep(0.2)
    assert not any(f.done() for f in first.values())
    return first


@contextmanager
def _deletion_held(
    rtdb: RuntimeStore, backend: PostgresBackend, thread_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[concurrent.futures.Future[object]]:
    """Run ``rtdb.delete_thread(thread_id)`` in a worker thread and hold its transaction
    open (everything done but the commit) for the block; it commits as the block ends."""
    entered, release = threading.Event(), threading.Event()
    real = backend.cluster.notify_sql

    def held(cursor: Any, channel: str, payload: str) -> None:
        real(cursor, channel, payload)
        entered.set()
        assert release.wait(30)

    monkeypatch.setattr(backend.cluster, "notify_sql", held)
    deletion = _in_threads({"d": partial(rtdb.delete_thread, thread_id,
                                         notify=("commands", "deleted"))})["d"]
    assert entered.wait(10)
    try:
        yield deletion
    finally:
        release.set()
        assert deletion.result(10) is True


def test_index_batches_schedules_and_pauses_overlapping_a_deletion_leave_nothing_behind(
    pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A deletion on one node while another writes the thread's run index entries,
    # schedules a run or pauses the thread: each write either commits before the
    # deletion (which then removes it) or finds the thread gone. Before, an index batch
    # and a pause that read the registry row while the deletion's transaction was open
    # committed after it: `?status=pending` listed the run for good (a thread created
    # again with the id inherited it, and the pause), and the schedule answered a run
    # that the deletion's removal of the rows then took away.
    backend = PostgresBackend(pg_url)
    rtdb = backend.open()
    retention = RetentionPolicy()
    pending = RunQuery(statuses=(EffectStatus.PENDING,))
    try:
        store = _thread_with_a_due_run(rtdb, backend, "d")
        with _deletion_held(rtdb, backend, "d", monkeypatch):
            late = _in_threads({
                "index": partial(rtdb.index_runs, [_due_run("d", "d1", 2.0)]),
                "pause": partial(rtdb.set_paused, "d", True),
                "schedule": partial(store.insert_run, _due_run("d", "d2", 3.0)),
            })
            time.sleep(0.3)  # their statements read the registry before the commit
        late["index"].result(10)
        store.close()
        backend.remove_thread_store("d")
        assert rtdb.list_indexed_runs(pending, 10.0, retention, 10) == ([], None)
        assert rtdb.count_indexed_runs(pending, 10.0, retention)[EffectStatus.PENDING] == 0
        assert late["pause"].result(10) is False
        with pytest.raises(ThreadNotFound):
            late["schedule"].result(10)
        # A thread created again with the id starts empty and running.
        info = ThreadInfo(id="d", created_at_ts=20.0)
        assert rtdb.add_thread(info)
        backend.create_thread_store(info).close()
        assert rtdb.list_indexed_runs(RunQuery(thread_id="d"), 30.0, retention, 10) == \
            ([], None)
        assert rtdb.paused_flags(["d"]) == {"d": False}
        url, schema = split_schema(pg_url)
        with psycopg.connect(url) as conn:
            left = conn.execute(
                f"SELECT 'runs', count(*) FROM {schema}.effect_runs UNION ALL "
                f"SELECT 'index', count(*) FROM {schema}.run_index UNION ALL "
                f"SELECT 'alarms', count(*) FROM {schema}.alarms").fetchall()
        assert dict(left) == {"runs": 0, "index": 0, "alarms": 0}
    finally:
        rtdb.close()
        backend.close()


def test_a_deletion_commits_after_an_index_batch_that_holds_the_thread_and_removes_it(
    pg_url: str,
) -> None:
    # The other order: the batch holds its threads' rows (key share) until it commits;
    # the deletion waits for it and then removes what it wrote.
    backend = PostgresBackend(pg_url)
    rtdb = backend.open()
    url, schema = split_schema(pg_url)
    try:
        _thread_with_a_due_run(rtdb, backend, "d").close()
        with psycopg.connect(url, options=f"-c search_path={schema}") as batch:
            batch.execute("SELECT 1 FROM threads WHERE id = 'd' FOR KEY SHARE")
            deletion = _in_threads({"d": partial(rtdb.delete_thread, "d")})["d"]
            time.sleep(0.3)
            batch.execute(
                "INSERT INTO run_index (run_id, thread_id, name, status, run_at, "
                "created_at, attempts) VALUES ('d1', 'd', 'note', 'pending', 2, 1, 0)")
            batch.commit()
        assert deletion.result(10) is True
        pending = RunQuery(statuses=(EffectStatus.PENDING,))
        assert rtdb.list_indexed_runs(pending, 10.0, RetentionPolicy(), 10) == ([], None)
    finally:
        rtdb.close()
        backend.close()


def test_a_nodes_start_removes_index_entries_of_threads_no_longer_registered(
    pg_url: str,
) -> None:
    # Left by an index batch that overlapped a deletion before the batches locked their
    # threads' rows: listed `pending` on every node, for good, and inherited by a thread
    # created again with the id.
    backend = PostgresBackend(pg_url)
    rtdb = backend.open()
    _thread_with_a_due_run(rtdb, backend, "kept").close()
    rtdb.index_runs([_due_run("kept", "kept1", 2.0)])
    url, schema = split_schema(pg_url)
    with psycopg.connect(url, options=f"-c search_path={schema}") as conn:
        conn.execute(
            "INSERT INTO run_index (run_id, thread_id, name, status, run_at, created_at, "
            "attempts) VALUES ('gone1', 'gone', 'note', 'pending', 2, 1, 0)")
    rtdb.close()
    backend.close()
    again = PostgresBackend(pg_url)
    rtdb = again.open()
    try:
        runs, _ = rtdb.list_indexed_runs(RunQuery(statuses=(EffectStatus.PENDING,)), 10.0,
                                         RetentionPolicy(), 10)
        assert [(r.thread_id, r.id) for r in runs] == [("kept", "kept1")]
    finally:
        rtdb.close()
        again.close()


async def test_a_schedule_or_pause_overtaken_by_another_nodes_deletion_answers_404(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Node b reads the thread's registry entry to open it; node a's deletion commits and
    # removes the thread's store before b opens it. Before, b answered 500
    # `thread_storage_error` ("its store is missing ... restore it").
    async with serve_api(tmp_path / "a", clock=FakeClock(), database_url=pg_url,
                         node_id="a") as a, \
            serve_api(tmp_path / "b", clock=FakeClock(), database_url=pg_url,
                      node_id="b") as b:
        registry_a, registry_b = a.rt.actors.registry, b.rt.actors.registry
        assert registry_a is not None and registry_b is not None
        read = registry_b.get_thread

        def read_then_deleted_elsewhere(thread_id: str) -> ThreadInfo | None:
            info = read(thread_id)
            if info is not None:
                assert registry_a.delete_thread(thread_id)
                a.rt.storage.remove_thread_store(thread_id)
            return info

        monkeypatch.setattr(registry_b, "get_thread", read_then_deleted_elsewhere)
        for call in ("effects", "pause"):
            tid = await a.new_thread()
            body = {"name": "note", "args": {"text": "x"}} if call == "effects" else None
            res = await b.client.post(f"/api/threads/{tid}/{call}", json=body)
            assert res.status_code == 404, res.text
            assert res.json()["error"]["code"] == "thread_not_found"


def test_claims_that_wait_behind_one_in_flight_commit_together_each_with_its_answer(
    pg_url: str,
) -> None:
    """Claims of several threads made while one is in flight go in one transaction; each
    call gets what it would alone: a run, a finish and the next run, paused, busy on
    another node, deleted; a thread whose row another transaction holds runs alone and
    holds up nobody."""
    one, two = PostgresBackend(pg_url, node_id="n1"), PostgresBackend(pg_url, node_id="n2")
    rtdb, rtdb2 = one.open(), two.open()
    try:
        stores = {}
        for t in (*_LEADERS, "a", "b", "f", "p", "u", "d", "y"):
            stores[t] = _thread_with_a_due_run(rtdb, one, t)
        assert stores["f"].insert_run(_due_run("f", "f2", 2.5)) is None
        _, running, _ = stores["f"].finish_and_claim(None, 3.0)
        assert running is not None and running.id == "f1"
        assert rtdb.set_paused("p", True)
        _, elsewhere, _ = two.open_thread_store("u").finish_and_claim(None, 3.0)
        assert elsewhere is not None and elsewhere.id == "u1"
        assert rtdb2.delete_thread("d")
        done = Finish("f1", EffectStatus.COMPLETED, None, 4.0)
        with _rows_held(pg_url, *_LEADERS) as release_x, _rows_held(pg_url, "y") as release_y:
            first = _lead(stores)
            calls: dict[str, Callable[[], object]] = {
                t: partial(stores[t].finish_and_claim, None, 5.0) for t in "abpudy"}
            calls["f"] = partial(stores["f"].finish_and_claim, done, 5.0)
            futures = _in_threads(calls)
            _wait_queued(one, len(calls))
            release_x()
            for t in "abfpud":
                futures[t].result(timeout=10)
            assert futures["y"].done() is False  # its row is held: it waits alone
            release_y()
            answers = {t: f.result(timeout=10) for t, f in {**first, **futures}.items()}
        for t in (*_LEADERS, "a", "b", "y"):
            _, claimed, _ = answers[t]
            assert claimed is not None and claimed.id == f"{t}1"
            assert stores[t].claim_blocked is None
        finished, claimed, _ = answers["f"]
        assert finished is not None and finished.status is EffectStatus.COMPLETED
        assert claimed is not None and claimed.id == "f2"
        assert (answers["p"], stores["p"].claim_blocked) == ((None, None, None), "paused")
        assert (answers["u"], stores["u"].claim_blocked) == ((None, None, None), "busy")
        assert (answers["d"], stores["d"].claim_blocked) == ((None, None, None), "paused")
        # Committed together: the rows a, b and f's claims wrote share one transaction id.
        writers = dict(query(pg_url, "SELECT id, xmin::text FROM effect_runs "
                                        "WHERE id IN ('a1', 'b1', 'f1', 'f2', 'x01', 'y1')"))
        assert writers["a1"] == writers["b1"] == writers["f1"] == writers["f2"]
        assert len({writers["a1"], writers["x01"], writers["y1"]}) == 3
        attempts = dict(query(pg_url, "SELECT run_id, xmin::text FROM run_attempts "
                                         "WHERE run_id IN ('a1', 'b1', 'f2')"))
        assert set(attempts.values()) == {writers["a1"]}
        for store in stores.values():
            store.close()
    finally:
        rtdb2.close()
        rtdb.close()
        two.close()
        one.close()


def test_one_threads_failing_claim_in_a_group_fails_only_that_thread(pg_url: str) -> None:
    """A group's transaction that fails for one thread's statement is run again call by
    call: the others claim their runs; only that thread's call raises, naming it."""
    backend = PostgresBackend(pg_url, node_id="n1")
    rtdb = backend.open()
    try:
        stores = {}
        for t in (*_LEADERS, "a", "bad", "b"):
            stores[t] = _thread_with_a_due_run(rtdb, backend, t)
        base, schema = split_schema(pg_url)
        with psycopg.connect(base, autocommit=True,
                             options=f"-c search_path={schema}") as conn:
            conn.execute("CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS "
                         "$$ BEGIN IF NEW.thread_id = 'bad' THEN RAISE EXCEPTION "
                         "'refused by the test'; END IF; RETURN NEW; END $$")
            conn.execute("CREATE TRIGGER refuse_bad BEFORE UPDATE ON effect_runs "
                         "FOR EACH ROW EXECUTE FUNCTION refuse_bad()")
        with _rows_held(pg_url, *_LEADERS) as release_x:
            first = _lead(stores)
            futures = _in_threads({t: partial(stores[t].finish_and_claim, None, 5.0)
                                   for t in ("a", "bad", "b")})
            _wait_queued(backend, 3)
            release_x()
            for t in (*_LEADERS, "a", "b"):
                _, claimed, _ = {**first, **futures}[t].result(timeout=10)
                assert claimed is not None and claimed.id == f"{t}1"
            with pytest.raises(ThreadStorageError, match=r"Thread bad: .*refused by the test"):
                futures["bad"].result(timeout=10)
        assert query(pg_url, "SELECT status FROM effect_runs WHERE id = 'bad1'") == [
            ("pending",)]
        for store in stores.values():
            store.close()
    finally:
        rtdb.close()
        backend.close()


def _claims_scene(one: PostgresBackend, two: PostgresBackend, rtdb: Any,
                  prefix: str) -> tuple[dict[str, Any], dict[str, Callable[[], object]]]:
    """Twenty threads ``{prefix}00``..``{prefix}19``, each in a state a claim meets, and
    the claim each thread's caller then makes (at 5.0); their stores are node one's."""
    stores: dict[str, Any] = {}
    for i in range(20):
        t = f"{prefix}{i:02}"
        info = ThreadInfo(id=t, created_at_ts=1.0)
        assert rtdb.add_thread(info)
        stores[t] = one.create_thread_store(info)

    def add(i: int, run_id: str, due: float, **fields: Any) -> None:
        t = f"{prefix}{i:02}"
        run = replace(_due_run(t, f"{t}-{run_id}", due), **fields)
        assert stores[t].insert_run(run) is None

    def start(i: int, run_id: str) -> Finish:
        _, running, _ = stores[f"{prefix}{i:02}"].finish_and_claim(None, 3.0)
        assert running is not None and running.id == f"{prefix}{i:02}-{run_id}"
        return Finish(running.id, EffectStatus.COMPLETED, None, 4.0, attempt=running.attempts)

    finishes: dict[int, Finish] = {}
    keep = RetentionPolicy(max_finished=10)
    for i in range(4):  # a due run
        add(i, "a", 2.0)
    add(4, "a", 2.0)  # a due run and one more due: the earlier is claimed
    add(4, "b", 2.5)
    for i in range(5, 9):
        add(i, "a", 2.0)
        finishes[i] = start(i, "a")
    add(5, "b", 4.5)  # finish, then claim the next due run
    add(6, "b", 9.0)  # finish; the next run is not due yet
    # 7: finish; no run left, a schedule's fire next
    assert stores[f"{prefix}07"].insert_schedule(Schedule(
        id=f"{prefix}07-sch", thread_id=f"{prefix}07", name="note", args=None,
        recurrence=Recurrence(every_seconds=60.0), state=ScheduleState.ACTIVE,
        next_fire_at_ts=7.5, created_at_ts=1.0)) is None
    finishes[8] = replace(finishes[8], attempt=7)  # a stale attempt: not finished
    add(8, "b", 4.0)
    add(9, "a", 2.0)  # paused
    add(10, "a", 2.0)  # paused, with a finish
    finishes[10] = start(10, "a")
    add(10, "b", 2.5)
    for i in (9, 10):
        assert rtdb.set_paused(f"{prefix}{i:02}", True)
    add(11, "a", 2.0)  # busy: node two runs its first run
    add(11, "b", 2.5)
    _, elsewhere, _ = two.open_thread_store(f"{prefix}11").finish_and_claim(None, 3.0)
    assert elsewhere is not None and elsewhere.id == f"{prefix}11-a"
    add(12, "a", 2.0, name="only_two")  # foreign: the first due is only node two's
    add(12, "b", 2.5)
    for k in range(14):  # retention: 14 finished runs, at most 10 kept
        add(13, f"old{k:02}", 1.0 + k * 0.01)
        finishes[13] = start(13, f"old{k:02}")
        if k < 13:
            assert stores[f"{prefix}13"].finish_and_claim(finishes[13], 3.0, claim=False)[0]
    add(13, "a", 4.0)
    add(14, "a", 2.0, trace_context='{"traceparent": "00-ab-cd-01"}')  # trace context
    add(15, "b", 2.0)  # two due at one time: the one scheduled first
    add(15, "a", 2.0)
    add(16, "a", 5.0)  # due exactly now
    add(17, "a", 2.0)  # canceled
    finishes[17] = replace(start(17, "a"), status=EffectStatus.CANCELED, canceled_by="http")
    add(18, "a", 2.0)  # failed
    finishes[18] = replace(start(18, "a"), status=EffectStatus.FAILED, error="boom")
    add(18, "b", 3.0)
    add(19, "a", 2.0)  # finished elsewhere already: a finish of a run not running
    finishes[19] = start(19, "a")
    assert stores[f"{prefix}19"].finish_and_claim(finishes[19], 3.5, claim=False)[0]
    calls: dict[str, Callable[[], object]] = {}
    for i in range(20):
        t = f"{prefix}{i:02}"
        calls[t] = partial(stores[t].finish_and_claim, finishes.get(i), 5.0,
                           retention=keep if i in (7, 13) else None)
    return stores, calls


def _claims_seen(url: str, stores: dict[str, Any], answers: dict[str, Any],
                 prefix: str) -> list[object]:
    """What the calls answered and wrote, with ``prefix`` left out of the ids."""
    def bare(value: object) -> object:
        return None if value is None else re.sub(rf"\b{prefix}(?=\d\d)", "", str(value))

    seen: list[object] = []
    for t, (finished, claimed, next_due) in sorted(answers.items()):
        seen.append((bare(t), bare(finished), bare(claimed), next_due,
                     stores[t].claim_blocked))
    for table, columns in (
        ("effect_runs", "thread_id, id, status, attempts, started_at, finished_at, error, "
                        "canceled_by"),
        ("run_attempts", "thread_id, run_id, attempt, started_at, ended_at, outcome, error, "
                         "node_id"),
        ("run_traces", "thread_id, run_id, context"),
    ):
        rows = query(url, f"SELECT {columns} FROM {table} WHERE thread_id LIKE %s "
                          f"ORDER BY 1, 2, 3", (f"{prefix}%",))
        seen.append([tuple(bare(x) if isinstance(x, str) else x for x in row)
                     for row in rows])
    return seen


def test_a_group_of_twenty_claims_answers_each_as_alone_and_writes_in_one_statement(
    pg_url: str,
) -> None:
    """Twenty claims that queue behind those in flight commit as one group, and each gets
    exactly what the same call gets alone on the same data (finishes, stale attempts,
    paused, busy on another node, a run only another node has, nothing due, a schedule's
    fire, retention pruning, trace context, due order); one statement of the group writes
    all its runs."""
    one, two = PostgresBackend(pg_url, node_id="n1"), PostgresBackend(pg_url, node_id="n2")
    rtdb, _ = one.open(), two.open()
    try:
        one.record_effects(["note"])
        two.record_effects(["note", "only_two"])
        alone_stores, alone_calls = _claims_scene(one, two, rtdb, "s")
        # One at a time: each runs alone.
        alone: dict[str, Any] = {t: call() for t, call in alone_calls.items()}
        stores, calls = _claims_scene(one, two, rtdb, "g")
        for x in _LEADERS:
            stores[x] = _thread_with_a_due_run(rtdb, one, x)
        base, schema = split_schema(pg_url)
        with psycopg.connect(base, autocommit=True,
                             options=f"-c search_path={schema}") as conn:
            conn.execute("CREATE TABLE run_writes (at bigint)")
            conn.execute("CREATE FUNCTION count_writes() RETURNS trigger LANGUAGE plpgsql "
                         "AS $$ BEGIN INSERT INTO run_writes VALUES (txid_current()); "
                         "RETURN NULL; END $$")
            conn.execute("CREATE TRIGGER count_writes AFTER UPDATE ON effect_runs "
                         "FOR EACH STATEMENT EXECUTE FUNCTION count_writes()")
        with _rows_held(pg_url, *_LEADERS) as release_x:
            first = _lead(stores)
            futures = _in_threads(calls)
            _wait_queued(one, len(calls))
            release_x()
            grouped = {t: f.result(timeout=10) for t, f in futures.items()}
            for f in first.values():
                f.result(timeout=10)
        assert _claims_seen(pg_url, stores, grouped, "g") == _claims_seen(
            pg_url, alone_stores, alone, "s")
        # The scene meets what it is meant to (the answers alone, known).
        blocked = {t: alone_stores[t].claim_blocked for t in alone}
        assert (blocked["s09"], blocked["s10"], blocked["s11"], blocked["s12"]) == (
            "paused", "paused", "busy", "foreign")
        assert alone["s06"][2] == 9.0 and alone["s07"][0] is not None
        assert alone["s07"][1:] == (None, 7.5)
        assert alone["s08"][0] is None and alone["s08"][1].id == "s08-b"
        assert alone["s14"][1].trace_context == '{"traceparent": "00-ab-cd-01"}'
        assert alone["s15"][1].id == "s15-b"
        assert query(pg_url, "SELECT count(*) FROM effect_runs WHERE thread_id = 's13' "
                             "AND status = 'completed'") == [(10,)]
        # One transaction, whose runs one statement wrote (finishes and claims; a
        # statement's triggers fire once per table however many of its parts write it).
        group_tx = query(pg_url, "SELECT xmin::text FROM effect_runs WHERE id = 'g00-a'")[0][0]
        assert query(pg_url, "SELECT count(*) FROM run_writes WHERE at::text = %s",
                     (group_tx,)) == [(1,)]
        for store in (*stores.values(), *alone_stores.values()):
            store.close()
    finally:
        rtdb.close()
        two.close()
        one.close()


def test_two_nodes_claiming_the_same_threads_in_groups_run_each_run_once_one_at_a_time(
    pg_url: str,
) -> None:
    """Two nodes, eight callers each, over the same eight threads: their claims group on
    each node and race across nodes; every run runs once, and never two of a thread at
    once."""
    nodes = [PostgresBackend(pg_url, node_id=f"n{i}") for i in (1, 2)]
    rtdbs = [node.open() for node in nodes]
    threads = [f"t{i}" for i in range(8)]
    runs_per_thread = 12
    try:
        for t in threads:
            info = ThreadInfo(id=t, created_at_ts=1.0)
            assert rtdbs[0].add_thread(info)
            store = nodes[0].create_thread_store(info)
            for k in range(runs_per_thread):
                assert store.insert_run(_due_run(t, f"{t}-{k:02}", 2.0 + k * 0.01)) is None
            store.close()
        holder: dict[str, str] = {}
        guard = threading.Lock()
        overlaps: list[str] = []
        ran: list[str] = []

        def work(node: PostgresBackend, t: str) -> None:
            store = node.open_thread_store(t)
            finish: Finish | None = None
            deadline = time.monotonic() + 30
            try:
                while time.monotonic() < deadline:
                    _, claimed, next_due = store.finish_and_claim(finish, 5.0)
                    finish = None
                    if claimed is None:
                        if next_due is None and store.claim_blocked is None:
                            return  # nothing left
                        time.sleep(0.001)
                        continue
                    with guard:
                        if t in holder:
                            overlaps.append(f"{claimed.id} began while {holder[t]} ran")
                        holder[t] = claimed.id
                        ran.append(claimed.id)
                    time.sleep(0.001)
                    with guard:
                        del holder[t]  # its effect is over; the finish follows
                    finish = Finish(claimed.id, EffectStatus.COMPLETED, None, 5.0)
            finally:
                store.close()

        futures = _in_threads({f"{node.node_id}:{t}": partial(work, node, t)
                               for node in nodes for t in threads})
        for future in futures.values():
            future.result(timeout=60)
        assert overlaps == []
        assert sorted(ran) == sorted(f"{t}-{k:02}" for t in threads
                                     for k in range(runs_per_thread))
        assert query(pg_url, "SELECT status, max(attempts), count(*) FROM effect_runs "
                                "GROUP BY status") == [("completed", 1, len(ran))]
    finally:
        for rtdb in rtdbs:
            rtdb.close()
        for node in nodes:
            node.close()


def test_the_same_key_scheduled_at_once_through_two_nodes_gives_the_one_run(
    pg_url: str,
) -> None:
    """Two nodes schedule a run with the same key at the same moment: each statement's
    key check sees no live run, one insert waits on the other's at the pending-key index;
    once that commits, the waiting one answers with the stored run, not an error."""
    import threading

    from runtime.effects import EffectRun, EffectStatus
    from runtime.storage.base import ThreadInfo

    def keyed(run_id: str) -> EffectRun:
        return EffectRun(id=run_id, thread_id="a", name="note", status=EffectStatus.PENDING,
                         args={"text": "x"}, run_at_ts=2.0, created_at_ts=1.0, key="same")

    one, two = PostgresBackend(pg_url, node_id="n1"), PostgresBackend(pg_url, node_id="n2")
    rtdb = one.open()
    rtdb2 = two.open()
    try:
        info = ThreadInfo(id="a", created_at_ts=1.0)
        assert rtdb.add_thread(info)
        here, there = one.create_thread_store(info), two.open_thread_store(info.id)
        answers: list[object] = []

        def schedule_here() -> None:
            try:
                answers.append(here.insert_run(keyed("r2")))
            except Exception as exc:  # the answer is what the test checks
                answers.append(exc)

        with two.transaction() as cur:
            there._insert_run_in(cur, keyed("r1"))  # not committed yet
            waiter = threading.Thread(target=schedule_here)
            waiter.start()
            # Until the other insert waits for this transaction at the unique index.
            for _ in range(200):
                waiting = query(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE "
                                "datname = current_database() AND wait_event_type = 'Lock'")
                if waiting[0][0]:
                    break
                time.sleep(0.02)
            else:
                pytest.fail("the second insert never waited for the first")
        waiter.join(10)
        [answer] = answers
        assert isinstance(answer, EffectRun) and answer.id == "r1", answer
        assert [r.id for r in here.pending_runs()] == ["r1"]
        here.close()
        there.close()
    finally:
        rtdb2.close()
        rtdb.close()
        two.close()
        one.close()


def test_a_schedule_made_on_a_thread_another_node_deleted_is_refused_not_left(
    pg_url: str,
) -> None:
    # Another node's deletion committed after this node opened the thread's store: the
    # schedule's insert finds the registry row gone (it holds it FOR KEY SHARE until its
    # commit, so a deletion cannot slip in between) and writes nothing.
    from runtime.errors import ThreadNotFound

    backend = PostgresBackend(pg_url)
    rtdb = backend.open()
    url, schema = split_schema(pg_url)
    try:
        assert rtdb.add_thread(ThreadInfo(id="gone", created_at_ts=1.0))
        store = backend.create_thread_store(ThreadInfo(id="gone", created_at_ts=1.0))
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DELETE FROM {schema}.threads WHERE id = 'gone'")
        schedule = Schedule(id="s1", thread_id="gone", name="note", args=None,
                            recurrence=Recurrence(every_seconds=60.0),
                            state=ScheduleState.ACTIVE, next_fire_at_ts=100.0,
                            created_at_ts=1.0)
        with pytest.raises(ThreadNotFound):
            store.insert_schedule(schedule)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute(
                f"SELECT count(*) FROM {schema}.schedules").fetchone() == (0,)
        store.close()
    finally:
        rtdb.close()
        backend.close()
