"""Selecting the PostgreSQL backend: the setting, the server's health, refusals.

The storage contract over PostgreSQL is in tests/storage/test_contract.py; the end-to-end
tests marked ``every_backend`` (HTTP, stream, SIGKILL recovery) run on it too.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pydantic
import pytest
from conftest import serve_api
from pg import query

from runtime import Runtime
from runtime.errors import RuntimeStorageError
from runtime.storage.postgres import PostgresBackend, redact_url, split_schema
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
        here, there = one.create_thread_store(info), two.create_thread_store(info)
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
        here, there = one.create_thread_store(info), two.create_thread_store(info)
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
