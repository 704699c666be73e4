"""The checked-in DDL (runtime/storage/schema.py) is what the SQLModel models generate.

The models in runtime/storage/models.py are the single definition of the schema; the SQLite
backend runs the generated module so that SQLModel is not imported at run time. Regenerate
it with ``.venv/bin/python -m runtime.storage.models``.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from runtime.config import RetentionPolicy
from runtime.effects import EffectRun, EffectStatus
from runtime.storage import models, schema, sqlite
from runtime.storage.base import Finish, RunQuery, ThreadInfo

ROOT = Path(__file__).resolve().parent.parent


def file_at(path: Path, migrations: dict[int, tuple[str, ...]], version: int
            ) -> sqlite3.Connection:
    """A new file at ``path`` with ``migrations``' steps 0 to ``version - 1`` run, as a
    runtime of that schema version left it (``user_version`` not set: the caller does)."""
    conn = sqlite3.connect(path)
    for step in range(version):
        for statement in migrations[step]:
            conn.execute(statement)
    return conn


def test_the_checked_in_schema_is_what_the_models_generate() -> None:
    assert models.SCHEMA_PATH == Path(schema.__file__)
    assert models.SCHEMA_PATH.read_text(encoding="utf-8") == models.schema_source(), (
        "runtime/storage/schema.py is out of date: run .venv/bin/python -m runtime.storage.models"
    )


def test_the_migrations_are_the_models_ddl_step_by_step() -> None:
    for generated, steps, columns, rebuilds, indexes in (
        (schema.THREAD_MIGRATIONS, models.THREAD_MIGRATION_MODELS,
         models.THREAD_MIGRATION_COLUMNS, models.THREAD_MIGRATION_REBUILDS,
         models.THREAD_MIGRATION_INDEXES),
        (schema.RUNTIME_MIGRATIONS, models.RUNTIME_MIGRATION_MODELS,
         models.RUNTIME_MIGRATION_COLUMNS, None, None),
    ):
        assert generated == {
            n: tuple(models.migration_ddl(n, steps, columns, rebuilds, indexes)) for n in steps
        }
    assert sqlite.THREAD_MIGRATIONS is schema.THREAD_MIGRATIONS
    assert sqlite.RUNTIME_MIGRATIONS is schema.RUNTIME_MIGRATIONS
    assert len(schema.THREAD_MIGRATIONS) == sqlite.THREAD_SCHEMA_VERSION
    assert len(schema.RUNTIME_MIGRATIONS) == sqlite.RUNTIME_SCHEMA_VERSION


def test_every_model_is_created_by_a_migration() -> None:
    for steps, wanted in (
        (schema.THREAD_MIGRATIONS, models.THREAD_MODELS),
        (schema.RUNTIME_MIGRATIONS, models.RUNTIME_MODELS),
    ):  # two files: a thread's and runtime.sqlite
        conn = sqlite3.connect(":memory:")
        for statements in steps.values():
            for statement in statements:
                conn.execute(statement)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {m.__tablename__ for m in wanted}


def test_the_migrated_schema_is_the_models_schema() -> None:
    """Steps 0..N (tables, then added columns) give exactly the models' tables and indexes."""
    migrated = sqlite3.connect(":memory:")
    for statements in schema.THREAD_MIGRATIONS.values():
        for statement in statements:
            migrated.execute(statement)
    fresh = sqlite3.connect(":memory:")
    for statement in models.sqlite_ddl(*models.THREAD_MODELS):
        fresh.execute(statement)

    def shape(conn: sqlite3.Connection) -> tuple[object, ...]:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        columns = {t: [r[1:] for r in conn.execute(f"PRAGMA table_info({t})")] for t in tables}
        indexes = sorted(r for r in conn.execute(
            "SELECT name, tbl_name, sql FROM sqlite_master WHERE type='index' "
            "AND sql IS NOT NULL"))
        without_rowid = sorted(r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND sql LIKE '%WITHOUT ROWID'"))
        return tables, columns, indexes, without_rowid

    assert shape(migrated) == shape(fresh)


def test_a_new_thread_file_gets_the_current_schema_in_one_step(tmp_path: Path) -> None:
    """A new file runs the models' DDL (not the migrations one by one, which would rebuild
    tables of later steps for nothing) and is stamped with the current version."""
    assert schema.THREAD_DDL == tuple(models.sqlite_ddl(*models.THREAD_MODELS))
    store = sqlite.SQLiteThreadStore("t", tmp_path / "t.sqlite", create=True)
    store.close()
    conn = sqlite3.connect(tmp_path / "t.sqlite")
    expected = sqlite3.connect(":memory:")
    for statement in schema.THREAD_DDL:
        expected.execute(statement)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite.THREAD_SCHEMA_VERSION
        query = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"
        assert conn.execute(query).fetchall() == expected.execute(query).fetchall()
    finally:
        conn.close()
        expected.close()


def test_a_version_8_thread_file_is_rebuilt_with_fewer_pages_per_run(tmp_path: Path) -> None:
    """Version 9 rebuilds ``run_attempts`` ``WITHOUT ROWID`` (its rows kept) and leaves runs
    without a key out of the pending-key index, which still holds a key once."""
    path = tmp_path / "t.sqlite"
    conn = file_at(path, schema.THREAD_MIGRATIONS, 8)
    # The index as versions 4 to 8 created it (every pending run in it, keyed or not).
    conn.execute("DROP INDEX ix_effect_runs_pending_key")
    conn.execute("CREATE UNIQUE INDEX ix_effect_runs_pending_key ON effect_runs (\"key\") "
                 "WHERE status = 'pending'")
    conn.execute("INSERT INTO thread_meta VALUES ('thread_id', 't')")
    conn.execute(
        "INSERT INTO effect_runs (id, name, status, args, run_at, created_at, attempts, "
        "\"key\") VALUES ('done', 'a.note', 'completed', NULL, 100.0, 90.0, 2, NULL), "
        "('keyed', 'a.note', 'pending', NULL, 300.0, 90.0, 0, 'daily')"
    )
    conn.execute(
        "INSERT INTO run_attempts (run_id, attempt, started_at, ended_at, outcome, error, "
        "node_id) VALUES ('done', 1, 100.0, 101.0, 'failed', 'boom', 'n1'), "
        "('done', 2, 110.0, 111.0, 'completed', NULL, 'n2')"
    )
    conn.execute("PRAGMA user_version=8")
    conn.commit()
    conn.close()

    store = sqlite.SQLiteThreadStore("t", path)
    try:
        assert [(a.attempt, a.started_at_ts, a.ended_at_ts, a.outcome, a.error, a.node_id)
                for a in store.run_attempts("done")] == [
            (1, 100.0, 101.0, "failed", "boom", "n1"), (2, 110.0, 111.0, "completed", None, "n2")
        ]
        held = store.insert_run(EffectRun(
            id="again", thread_id="t", name="a.note", status=EffectStatus.PENDING, args=None,
            run_at_ts=400.0, created_at_ts=390.0, key="daily"))
        assert held is not None and held.id == "keyed"
        for run_id in ("free1", "free2"):  # runs without a key never collide
            assert store.insert_run(EffectRun(
                id=run_id, thread_id="t", name="a.note", status=EffectStatus.PENDING,
                args=None, run_at_ts=50.0, created_at_ts=40.0)) is None
        _, claimed, _ = store.finish_and_claim(None, 60.0)
        assert claimed is not None and claimed.id == "free1"
        assert [(a.attempt, a.outcome) for a in store.run_attempts("free1")] == [(1, "running")]
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite.THREAD_SCHEMA_VERSION
        (index_sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'ix_effect_runs_pending_key'").fetchone()
        assert index_sql.endswith("WHERE status = 'pending' AND \"key\" IS NOT NULL")
        (table_sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'run_attempts'").fetchone()
        assert table_sql.endswith("WITHOUT ROWID")
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE "
                            "'sqlite_autoindex_run_attempts%'").fetchone()[0] == 0
        # The claim's look-up for a pending run without a key uses no key index any more.
        assert conn.execute("SELECT count(*) FROM effect_runs INDEXED BY "
                            "ix_effect_runs_pending_key WHERE status = 'pending' "
                            "AND \"key\" IS NOT NULL").fetchone()[0] == 1
    finally:
        conn.close()


def _index_entries(conn: sqlite3.Connection, index: str) -> int:
    """The entries of an index, counted in its leaf pages (SQLite's ``dbstat`` table)."""
    try:
        row = conn.execute("SELECT sum(ncell) FROM dbstat WHERE name = ? AND pagetype = 'leaf'",
                           (index,)).fetchone()
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table")
    return int(row[0] or 0)


def test_a_version_9_thread_file_indexes_each_run_only_where_it_is_looked_up(
    tmp_path: Path,
) -> None:
    """Version 10 keeps the due index to pending and running runs and the finished index to
    finished ones (a run's insert, claim and finish write fewer pages); every read of runs
    answers as before."""
    path = tmp_path / "t.sqlite"
    conn = file_at(path, schema.THREAD_MIGRATIONS, 9)
    conn.execute("INSERT INTO thread_meta VALUES ('thread_id', 't')")
    conn.execute(
        "INSERT INTO effect_runs (id, name, status, run_at, created_at, started_at, "
        "finished_at, attempts, error, \"key\") VALUES "
        "('done', 'a.note', 'completed', 100.0, 90.0, 100.0, 101.0, 1, NULL, NULL), "
        "('bad', 'a.note', 'failed', 100.0, 90.0, 100.0, 102.0, 1, 'boom', NULL), "
        "('off', 'b.note', 'canceled', 300.0, 90.0, NULL, 103.0, 0, NULL, NULL), "
        "('busy', 'b.note', 'running', 100.0, 90.0, 104.0, NULL, 1, NULL, 'k'), "
        "('next', 'a.note', 'pending', 105.0, 90.0, NULL, NULL, 0, NULL, 'k'), "
        "('later', 'b.note', 'pending', 500.0, 90.0, NULL, NULL, 0, NULL, NULL)"
    )
    conn.execute("PRAGMA user_version=9")
    conn.commit()
    conn.close()

    retention = RetentionPolicy()
    store = sqlite.SQLiteThreadStore("t", path)
    try:
        def ids(statuses: list[EffectStatus] | None = None, name: str | None = None) -> list[str]:
            runs, _ = store.list_runs(110.0, retention, statuses=statuses, name=name)
            return [r.id for r in runs]

        assert ids() == ["later", "next", "busy", "off", "bad", "done"]
        assert ids([EffectStatus.PENDING]) == ["later", "next"]
        assert ids([EffectStatus.PENDING, EffectStatus.RUNNING]) == ["later", "next", "busy"]
        assert ids([EffectStatus.COMPLETED, EffectStatus.FAILED]) == ["bad", "done"]
        assert ids([EffectStatus.CANCELED, EffectStatus.PENDING], "b.note") == ["later", "off"]
        assert store.count_runs(110.0, retention) == {
            EffectStatus.PENDING: 2, EffectStatus.RUNNING: 1, EffectStatus.COMPLETED: 1,
            EffectStatus.FAILED: 1, EffectStatus.CANCELED: 1,
        }
        assert store.count_runs(110.0, retention, name="b.note")[EffectStatus.PENDING] == 1
        # The key is held by the running run and its pending successor, as before.
        held = store.insert_run(EffectRun(
            id="again", thread_id="t", name="a.note", status=EffectStatus.PENDING, args=None,
            run_at_ts=400.0, created_at_ts=110.0, key="k"))
        assert held is not None and held.id == "next"
        # A run's claim and finish; a restart's recovery finds the running one.
        finished, claimed, _ = store.finish_and_claim(
            Finish("busy", EffectStatus.COMPLETED, None, 110.0, attempt=1), 110.0)
        assert finished is not None and finished.status is EffectStatus.COMPLETED
        assert claimed is not None and claimed.id == "next"
        [requeued] = store.recover_interrupted(111.0, 3)
        assert (requeued.id, requeued.status) == ("next", EffectStatus.PENDING)
        # Over max_finished, the oldest finished runs go first.
        assert store.prune(112.0, RetentionPolicy(max_finished=2)) == 2
        assert ids([EffectStatus.COMPLETED, EffectStatus.FAILED, EffectStatus.CANCELED]) == [
            "busy", "off"]
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 10
        live = conn.execute(
            "SELECT count(*) FROM effect_runs WHERE status IN ('pending', 'running')"
        ).fetchone()[0]
        done = conn.execute("SELECT count(*) FROM effect_runs WHERE status IN "
                            "('completed', 'failed', 'canceled')").fetchone()[0]
        assert (live, done) == (2, 2)
        assert _index_entries(conn, "ix_effect_runs_due") == live
        assert _index_entries(conn, "ix_effect_runs_finished") == done
    finally:
        conn.close()


def test_the_check_command_reports_drift_by_its_exit_status() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.storage.models", "--check"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("version", range(1, sqlite.THREAD_SCHEMA_VERSION))
def test_a_thread_file_of_every_older_version_migrates(tmp_path: Path, version: int) -> None:
    """A file written at ``version`` (steps 0..version-1) opens as the current schema.

    Its run is kept (without a key), a key is then held once among pending runs, from
    version 3 on its effect-tool record is kept too, and from version 5 on its span context;
    attempts are recorded from the first claim after the upgrade.
    """
    path = tmp_path / "t.sqlite"
    conn = file_at(path, schema.THREAD_MIGRATIONS, version)
    conn.execute("INSERT INTO thread_meta VALUES ('thread_id', 't')")
    conn.execute(
        "INSERT INTO effect_runs (id, name, status, args, run_at, created_at, attempts) "
        "VALUES ('old', 'a.note', 'pending', NULL, 100.0, 90.0, 0)"
    )
    if version >= 3:
        conn.execute(
            "INSERT INTO effect_records (thread_id, \"key\", tool_name, status, result, "
            "created_at, updated_at) VALUES ('t', 'k', 'post_note', 'applied', '1', 90, 90)"
        )
    context = '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    if version >= 5:
        conn.execute("INSERT INTO run_traces (run_id, context) VALUES ('old', ?)", (context,))
    conn.execute(f"PRAGMA user_version={version}")
    conn.commit()
    conn.close()

    store = sqlite.SQLiteThreadStore("t", path)
    try:
        [old] = store.pending_runs()
        assert (old.id, old.key, old.canceled_by, old.run_at_ts) == ("old", None, None, 100.0)
        kept = store.get_run("old", 150.0, RetentionPolicy())
        assert kept is not None
        assert kept.trace_context == (context if version >= 5 else None)
        keyed = EffectRun(id="new", thread_id="t", name="a.note", status=EffectStatus.PENDING,
                          args=None, run_at_ts=200.0, created_at_ts=190.0, key="daily")
        assert store.insert_run(keyed) is None
        held = store.insert_run(replace(keyed, id="again"))
        assert held is not None and held.id == "new"
        record = store.get_effect_record("k")
        assert (record is not None) == (version >= 3)
        _, claimed, _ = store.finish_and_claim(None, 150.0)
        assert claimed is not None and claimed.id == "old"
        store.finish_and_claim(Finish("old", EffectStatus.COMPLETED, None, 151.0), 151.0,
                               claim=False)
        assert [(a.attempt, a.outcome) for a in store.run_attempts("old")] == [(1, "completed")]
        # Version 7: no schedule yet, and the old run is no schedule's occurrence.
        assert store.list_schedules() == []
        assert kept.schedule_id is None
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite.THREAD_SCHEMA_VERSION
    finally:
        conn.close()


@pytest.mark.parametrize("version", range(1, sqlite.RUNTIME_SCHEMA_VERSION))
def test_a_runtime_database_of_every_older_version_migrates(
    tmp_path: Path, version: int
) -> None:
    """A runtime database written at ``version`` opens as the current schema.

    Its threads and alarms are kept, from version 2 on its pause marks too, from version 3
    on its runtime-level records; its run index (version 4) starts empty and incomplete, so
    that the runtime rebuilds it. A thread's last activity (version 5) is filled in from its
    creation and, from version 4 on, its indexed runs. An indexed run keeps the schedule it
    is an occurrence of (version 6); one indexed before has none.
    """
    path = tmp_path / "runtime.sqlite"
    conn = file_at(path, schema.RUNTIME_MIGRATIONS, version)
    conn.execute("INSERT INTO threads (id, created_at, user_id, tags) VALUES ('t', 1.0, 'u', '[]')")
    conn.execute("INSERT INTO alarms (thread_id, due_at) VALUES ('t', 5.0)")
    if version >= 2:
        conn.execute("INSERT INTO paused_threads (thread_id) VALUES ('t')")
    if version >= 3:
        conn.execute(
            "INSERT INTO effect_records (thread_id, key, tool_name, status, result, "
            "created_at, updated_at) VALUES ('t', 'k', 'ship', 'succeeded', '1', 1.0, 1.0)"
        )
    if version >= 4:
        conn.execute(
            "INSERT INTO run_index (run_id, thread_id, name, status, run_at, created_at, "
            "started_at, finished_at, attempts) "
            "VALUES ('old', 't', 'a.note', 'completed', 0.5, 0.5, 3.5, 4.0, 1)"
        )
    conn.execute(f"PRAGMA user_version={version}")
    conn.commit()
    conn.close()

    store = sqlite.SQLiteRuntimeStore(path)
    try:
        info = store.get_thread("t")
        assert info is not None and info.user_id == "u"
        assert info.paused == (version >= 2)
        assert info.last_activity_ts == (4.0 if version >= 4 else 1.0)
        assert store.load_alarms() == [("t", 5.0)]
        record = store.get_record("t", "k")
        assert (record is not None and record.result == 1) == (version >= 3)
        assert store.run_index_complete() is False  # an upgrade: the runtime rebuilds it
        run = EffectRun(id="r", thread_id="t", name="a.note", status=EffectStatus.PENDING,
                        args=None, run_at_ts=5.0, created_at_ts=1.0, key="daily",
                        schedule_id="s1")
        store.index_runs([run])
        indexed = store.list_indexed_runs(RunQuery(), 2.0, RetentionPolicy(), 10)[0]
        assert [(r.id, r.key, r.thread_id, r.schedule_id) for r in indexed] == [
            ("r", "daily", "t", "s1"),
            *([("old", None, "t", None)] if version >= 4 else []),
        ]
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite.RUNTIME_SCHEMA_VERSION
    finally:
        conn.close()


def test_a_runtime_database_one_version_newer_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "runtime.sqlite"
    sqlite.SQLiteRuntimeStore(path).close()
    newer = sqlite.RUNTIME_SCHEMA_VERSION + 1
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={newer}")
    conn.commit()
    conn.close()
    with pytest.raises(sqlite3.DatabaseError, match=f"schema version {newer}, newer than"):
        sqlite.SQLiteRuntimeStore(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == newer
    finally:
        conn.close()


def test_a_new_runtime_database_has_a_complete_run_index(tmp_path: Path) -> None:
    store = sqlite.SQLiteRuntimeStore(tmp_path / "runtime.sqlite")
    try:
        assert store.add_thread(ThreadInfo(id="t", created_at_ts=1.0))
        assert store.run_index_complete() is True
    finally:
        store.close()


def test_the_checked_in_postgres_schema_is_what_the_models_generate() -> None:
    from runtime.storage import pg_schema

    assert models.PG_SCHEMA_PATH == Path(pg_schema.__file__)
    assert models.PG_SCHEMA_PATH.read_text(encoding="utf-8") == models.pg_schema_source(), (
        "runtime/storage/pg_schema.py is out of date: run .venv/bin/python -m "
        "runtime.storage.models"
    )
    assert pg_schema.SCHEMA_VERSION == len(pg_schema.MIGRATIONS)


def test_every_postgres_migration_step_after_the_first_only_adds() -> None:
    """A node of the previous version keeps serving on the migrated schema (rolling upgrade,
    docs/scale-out.md "The schema"): each step may only create tables and indexes and add
    columns that are nullable or have a default, never drop, rename or retype."""
    import re

    from runtime.storage import pg_schema

    adds = re.compile(
        r"^(CREATE TABLE \w+ \(|CREATE (UNIQUE )?INDEX \w+ ON \w+ |"
        r"ALTER TABLE \w+ ADD COLUMN \w+ [A-Z ]+?(?<!NOT NULL)$|"
        r"ALTER TABLE \w+ ADD COLUMN \w+ [A-Z ]+ NOT NULL DEFAULT .+$)"
    )
    for version, statements in pg_schema.MIGRATIONS.items():
        if version == 0:
            continue
        for statement in statements:
            assert adds.match(statement), (version, statement)
            assert not re.search(r"\b(DROP|RENAME|TYPE)\b", statement), (version, statement)


def test_every_postgres_table_is_keyed_by_thread_id_first(pg_url: str) -> None:
    """Citus distributes a table by a column of every unique key: thread_id, first."""
    import psycopg

    from runtime.storage.pg_schema import GLOBAL_TABLES
    from runtime.storage.postgres import PostgresBackend, split_schema

    backend = PostgresBackend(pg_url)
    backend.open().close()
    backend.close()
    url, schema = split_schema(pg_url)
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname, i.indisprimary, i.indisunique, "
            "(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid "
            " AND a.attnum = i.indkey[0]) "
            "FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
            (schema,),
        ).fetchall()
        tables = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        )}
    expected = {m.__tablename__ for m in models.THREAD_MODELS} | {
        name for _, name in models.POSTGRES_RUNTIME_MODELS} | {"schema_version"} | {
        m.__tablename__ for step in models.POSTGRES_MIGRATION_MODELS.values() for m in step}
    assert tables == expected
    unique = [(table, first) for table, primary, uniq, first in rows if primary or uniq]
    assert {t for t, _ in unique} == tables - {"schema_version"}
    for table, first in unique:
        if table in GLOBAL_TABLES:
            continue
        assert first == ("id" if table == "threads" else "thread_id"), (table, first)
