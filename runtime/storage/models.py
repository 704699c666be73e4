"""Table models: the single definition of the schema.

SQLModel models describe every table; the SQLite backend's DDL is generated from them into
`runtime.storage.schema` (checked in, so that neither SQLModel nor SQLAlchemy is imported at
run time), and it talks plain ``sqlite3`` on the hot path (≈10 µs per query against ≈200 µs
through an ORM session, docs/design.md "Decisions"). After changing a model or a migration
step below, regenerate that module::

    .venv/bin/python -m runtime.storage.models          # rewrites runtime/storage/schema.py
    .venv/bin/python -m runtime.storage.models --check  # exit status 1 if it is out of date

(tests/test_schema.py fails while it differs from what the models generate). Should
``import runtime`` itself fail for want of a valid schema module, run the file instead:
``.venv/bin/python runtime/storage/models.py`` imports only SQLModel. Two databases use the
models:

- each thread's file (``threads/<id>.sqlite``): `ThreadMetaRow`, `EffectRunRow`,
  `MessageRow` (the conversation, from schema version 2), `EffectRecordRow` (effect-tool
  records, from schema version 3); a run's ``key`` and ``canceled_by`` columns are added by
  schema version 4; `ScheduleRow` (recurring schedules) and a run's ``schedule_id`` by
  version 7;
- the runtime database (``runtime.sqlite``): `ThreadRow` (the registry), `AlarmRow`
  (the durable alarm index: one row per thread with pending work), `PausedThreadRow`
  (the paused threads, from schema version 2).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Column,
    Identity,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlmodel import Field, SQLModel


class ThreadMetaRow(SQLModel, table=True):
    """Key/value facts of one thread file (its id, its creation time)."""

    __tablename__ = "thread_meta"

    key: str = Field(primary_key=True)
    value: str


class EffectRunRow(SQLModel, table=True):
    """One run of an effect. Times are seconds since the epoch, UTC."""

    __tablename__ = "effect_runs"
    __table_args__ = (
        # SQLite indexes only the runs each index serves (thread schema 10): the due index
        # the pending and running runs (claims, wake-ups, recovery, the key check), the
        # finished index the finished ones (retention; every finish sets ``finished_at``).
        # A run's insert then writes neither the finished index nor, at its finish, the
        # due index; its claim moves it within the due index alone: about four b-tree
        # pages fewer per executed run. A query reaches a partial index only when its
        # WHERE implies the index's (SQLite's rule: the same term, or a comparison of the
        # column for ``IS NOT NULL``), so the queries of `runtime.storage.sqlite` spell
        # these terms out. PostgreSQL keeps its indexes as created.
        Index("ix_effect_runs_due", "status", "run_at", "seq",
              sqlite_where=text("status = 'pending' OR status = 'running'"),
              info={"sqlite_only_where": True}),
        Index("ix_effect_runs_finished", "status", "finished_at",
              sqlite_where=text("finished_at IS NOT NULL"), info={"sqlite_only_where": True}),
        Index("ix_effect_runs_name", "name", "seq"),
        # At most one pending run per key: the database itself keeps that part of the
        # promise of `ThreadState.schedule_effect(..., key=...)` (a running run holds its
        # key too, and may hand it to one pending successor: checked in the transaction).
        # Runs without a key stay out of the SQLite index (thread schema 9): a pending
        # run's insert and its claim then write one b-tree page less each. PostgreSQL
        # keeps its index as created (NULLs never collide in either).
        Index(
            "ix_effect_runs_pending_key",
            "key",
            unique=True,
            sqlite_where=text("status = 'pending' AND \"key\" IS NOT NULL"),
            postgresql_where=text("status = 'pending'"),
        ),
    )

    seq: int | None = Field(default=None, primary_key=True)
    id: str = Field(unique=True)
    name: str
    status: str
    args: str | None = None
    run_at: float
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    error: str | None = None
    replay_of: str | None = None
    key: str | None = None
    canceled_by: str | None = None
    schedule_id: str | None = None  # the recurring schedule it is an occurrence of


class ScheduleRow(SQLModel, table=True):
    """A recurring schedule of the thread (`runtime.recurrence.Schedule`), from version 7.

    ``cron`` + ``timezone`` or ``every_seconds``; ``next_fire_at`` is None while paused.
    Times are seconds since the epoch, UTC.
    """

    __tablename__ = "schedules"
    __table_args__ = (
        Index("ix_schedules_key", "key", unique=True),
        Index("ix_schedules_due", "state", "next_fire_at"),
    )

    seq: int | None = Field(default=None, primary_key=True)
    id: str = Field(unique=True)
    name: str
    args: str | None = None
    cron: str | None = None
    timezone: str | None = None
    every_seconds: float | None = None
    state: str
    next_fire_at: float | None = None
    created_at: float
    key: str | None = None
    occurrences: int = 0
    skipped: int = 0
    last_run_id: str | None = None
    last_fire_at: float | None = None


class RunTraceRow(SQLModel, table=True):
    """The span context a pending or running run was scheduled in (`runtime.telemetry`).

    A table of its own (added by a migration step, where a column could not be) holding
    only unfinished runs: the row goes in the transaction that finishes or cancels its run.
    """

    __tablename__ = "run_traces"

    run_id: str = Field(primary_key=True)
    context: str


class RunAttemptRow(SQLModel, table=True):
    """One attempt of a run (`runtime.effects.RunAttempt`); deleted with its run."""

    __tablename__ = "run_attempts"
    # One b-tree, keyed by (run_id, attempt), instead of a rowid table and its primary
    # key's index (thread schema 9): a claim's INSERT writes one page less. PostgreSQL
    # ignores the option.
    __table_args__ = {"sqlite_with_rowid": False}

    run_id: str = Field(primary_key=True)
    attempt: int = Field(primary_key=True)
    started_at: float
    ended_at: float | None = None
    outcome: str
    error: str | None = None
    node_id: str | None = None
    """The node that ran the attempt (`runtime.config.Settings.node_id`); None for an
    attempt recorded before node ids existed."""


class MessageRow(SQLModel, table=True):
    """One message of the thread's conversation, in the order it was stored (``seq``).

    ``data`` is the pydantic-ai ``ModelMessage`` as JSON (the history a turn sends to the
    model is rebuilt from it); ``meta`` holds the tool calls or tool results as JSON for
    readers. Times are seconds since the epoch, UTC.
    """

    __tablename__ = "messages"
    __table_args__ = (Index("ix_messages_run", "run_id", "seq"),)

    seq: int | None = Field(default=None, primary_key=True)
    id: str = Field(unique=True)
    role: str
    content: str
    created_at: float
    run_id: str | None = None
    meta: str = "{}"
    data: str


class EffectRecordRow(SQLModel, table=True):
    """What an effect tool applied, by effect key (`runtime.storage.records`).

    In progress while a call holds the key under a lease (``owner``, ``lease_expires_at``),
    applied once its JSON ``result`` is stored. Times are seconds since the epoch, UTC.
    The same table serves a standalone `SqliteEffectStore` file (``EFFECT_RECORDS_DDL``).
    """

    __tablename__ = "effect_records"
    __table_args__ = (
        Index("ix_effect_records_created", "thread_id", "created_at", "key"),
        Index("ix_effect_records_updated", "updated_at"),
    )

    thread_id: str = Field(primary_key=True)
    key: str = Field(primary_key=True)
    tool_name: str
    run_id: str | None = None
    status: str
    result: str | None = None
    owner: str | None = None
    lease_expires_at: float | None = None
    created_at: float
    updated_at: float


class ThreadRow(SQLModel, table=True):
    """The registry: one row per existing thread."""

    __tablename__ = "threads"
    __table_args__ = (
        Index("ix_threads_created", "created_at", "id"),
        Index("ix_threads_activity", "last_activity_at", "id"),
    )

    id: str = Field(primary_key=True)
    created_at: float
    agent_id: str | None = None
    user_id: str | None = None
    tags: str = "[]"
    # The latest of its creation, its runs' transitions and its messages (seconds, UTC):
    # moved forward with the run index's writes, so "threads by last activity" reads
    # this table alone. Added by the version-5 migration (which fills it in).
    last_activity_at: float | None = None


class PausedThreadRow(SQLModel, table=True):
    """A paused thread (`runtime.Runtime.pause_thread`): it runs nothing until resumed."""

    __tablename__ = "paused_threads"

    thread_id: str = Field(primary_key=True)


class AlarmRow(SQLModel, table=True):
    """The durable alarm of a thread: due when its earliest pending run is due."""

    __tablename__ = "alarms"

    thread_id: str = Field(primary_key=True)
    due_at: float


class RunIndexRow(SQLModel, table=True):
    """The cross-thread run index: one row per run of every thread, without its args.

    Kept by the runtime's indexer from the change hub (in batches), so that runs can be
    listed across threads without opening every thread file. The thread file stays the
    truth; this is a copy of what lists need. Times are seconds since the epoch, UTC.
    """

    __tablename__ = "run_index"
    __table_args__ = (
        Index("ix_run_index_created", "created_at", "run_id"),
        Index("ix_run_index_status", "status", "created_at", "run_id"),
        Index("ix_run_index_name", "name", "created_at", "run_id"),
        Index("ix_run_index_thread", "thread_id", "created_at", "run_id"),
        Index("ix_run_index_user", "user_id", "created_at", "run_id"),
        Index("ix_run_index_due", "run_at"),
        Index("ix_run_index_finished", "status", "finished_at"),
    )

    run_id: str = Field(primary_key=True)
    thread_id: str
    user_id: str | None = None  # the thread's, copied: "runs of this user" uses an index
    name: str
    status: str
    run_at: float
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    error: str | None = None
    replay_of: str | None = None
    key: str | None = None  # the run's scheduling key (`EffectRun.key`), if any
    canceled_by: str | None = None
    schedule_id: str | None = None  # its recurring schedule (from runtime version 5)


class RuntimeMetaRow(SQLModel, table=True):
    """Key/value facts of the runtime database (whether the run index is complete)."""

    __tablename__ = "runtime_meta"

    key: str = Field(primary_key=True)
    value: str


class NodeRow(SQLModel, table=True):
    """A server process sharing a PostgreSQL database: its membership lease.

    PostgreSQL only (SQLite and memory: one process per data directory). A node renews
    ``lease_expires_at`` every third of its lease period; once it has passed, any other
    node re-queues the runs the node was running. ``token`` tells two processes with the
    same node id apart (the later one takes the row over). Times are seconds since the
    epoch, UTC, by the database server's clock.
    """

    __tablename__ = "nodes"

    node_id: str = Field(primary_key=True)
    token: str
    lease_expires_at: float
    started_at: float
    heartbeat_at: float
    # Whether the node claims runs (``max_concurrent_runs`` > 0): only those rank for
    # wake-ups (version 4). Null: a row written before version 4, by a node that claims.
    claims: bool | None = None
    # The effects the node runs: a JSON array of qualified names (version 5). A run of an
    # effect the node lacks is left to a live node that has it (docs/scale-out.md,
    # "Rolling deploys"). Null: not recorded (a row written before version 5, or a node
    # still discovering its effects): the node knows none for others.
    effects: str | None = None


class TurnLeaseRow(SQLModel, table=True):
    """The turn a thread runs now, and the node running it (PostgreSQL only).

    One row per thread with a turn in progress: another node's turn on the thread waits
    until the row is gone, or until the holder's node lease expired (its turn is then
    resumed there). Times are seconds since the epoch, UTC.
    """

    __tablename__ = "turn_leases"

    thread_id: str = Field(primary_key=True)
    node_id: str
    token: str
    acquired_at: float


class FrameRow(SQLModel, table=True):
    """A thread's frame, as its WebSocket clients get it (PostgreSQL only, from version 2).

    Written by the node that made the change, read by the nodes whose clients missed its
    notification; pruned after a few minutes (docs/scale-out.md, "Frames across nodes").
    """

    __tablename__ = "frames"
    __table_args__ = (Index("ix_frames_created", "created_at"),)

    thread_id: str = Field(primary_key=True)
    frame_seq: int = Field(primary_key=True, sa_type=BigInteger)  # the frame's ``seq``
    kind: str  # the frame's eventType
    frame: str  # the frame's JSON text
    created_at: float


class FrameCounterRow(SQLModel, table=True):
    """The last ``seq`` given to a frame of each thread, across nodes (PostgreSQL only)."""

    __tablename__ = "frame_counters"

    thread_id: str = Field(primary_key=True)
    last_seq: int = Field(sa_type=BigInteger)


def _table(model: type[SQLModel]) -> Table:
    table = model.__table__  # type: ignore[attr-defined]
    assert isinstance(table, Table)
    return table


def sqlite_ddl(*models: type[SQLModel]) -> list[str]:
    """CREATE TABLE / CREATE INDEX statements for SQLite, generated from the models."""
    dialect = sqlite.dialect()
    statements: list[str] = []
    for model in models:
        table = _table(model)
        statements.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    return statements


THREAD_MODELS: tuple[type[SQLModel], ...] = (
    ThreadMetaRow, EffectRunRow, MessageRow, EffectRecordRow, RunTraceRow, RunAttemptRow,
    ScheduleRow,
)
RUNTIME_MODELS: tuple[type[SQLModel], ...] = (
    ThreadRow, AlarmRow, PausedThreadRow, EffectRecordRow, RunIndexRow, RuntimeMetaRow,
)

THREAD_MIGRATION_MODELS: dict[int, tuple[type[SQLModel], ...]] = {
    0: (ThreadMetaRow, EffectRunRow),
    1: (MessageRow,),
    2: (EffectRecordRow,),
    3: (),
    4: (RunTraceRow,),
    5: (RunAttemptRow,),
    6: (ScheduleRow,),
    7: (),
    8: (),
    9: (),
}
"""The tables each migration of a thread file creates: step N takes schema version N to
N + 1 (version 0 is a new, empty file). Add a step for a new table; never change one."""

THREAD_MIGRATION_COLUMNS: dict[int, tuple[tuple[type[SQLModel], str], ...]] = {
    3: ((EffectRunRow, "key"), (EffectRunRow, "canceled_by")),
    6: ((EffectRunRow, "schedule_id"),),
    7: ((RunAttemptRow, "node_id"),),
}
"""The columns each migration of a thread file adds to a table an earlier step created
(nullable ones: ``ALTER TABLE ... ADD COLUMN``). The earlier step creates the table without
them, and an index over such a column is created by the step that adds it."""

THREAD_MIGRATION_REBUILDS: dict[int, tuple[type[SQLModel], ...]] = {
    8: (RunAttemptRow,),
}
"""The tables each migration of a thread file rebuilds to the model's current definition
(a new table, its rows copied over, the old one dropped, the new one renamed, then its
indexes): for a change ``ALTER TABLE`` cannot make, such as ``WITHOUT ROWID``. The step
that created the table generates the current definition too, so a new file is rebuilt
once from an empty table."""

THREAD_MIGRATION_INDEXES: dict[int, tuple[tuple[type[SQLModel], str], ...]] = {
    8: ((EffectRunRow, "ix_effect_runs_pending_key"),),
    9: ((EffectRunRow, "ix_effect_runs_due"), (EffectRunRow, "ix_effect_runs_finished")),
}
"""The indexes each migration of a thread file drops and creates again as the model now
defines them (a changed column list or ``WHERE``)."""

RUNTIME_MIGRATION_MODELS: dict[int, tuple[type[SQLModel], ...]] = {
    0: (ThreadRow, AlarmRow),
    1: (PausedThreadRow,),
    2: (EffectRecordRow,),  # runtime-level records: durable turns' "cross-run" keys
    3: (RunIndexRow, RuntimeMetaRow),
    4: (),
    5: (),
}
"""The same for ``runtime.sqlite``."""

RUNTIME_MIGRATION_COLUMNS: dict[int, tuple[tuple[type[SQLModel], str], ...]] = {
    4: ((ThreadRow, "last_activity_at"),),
    5: ((RunIndexRow, "schedule_id"),),
}
"""The same for ``runtime.sqlite``."""


def _added_later(
    columns: dict[int, tuple[tuple[type[SQLModel], str], ...]], model: type[SQLModel], step: int
) -> set[str]:
    return {name for n, cols in columns.items() if n > step for m, name in cols if m is model}


def migration_ddl(
    step: int,
    models: dict[int, tuple[type[SQLModel], ...]],
    columns: dict[int, tuple[tuple[type[SQLModel], str], ...]],
    rebuilds: dict[int, tuple[type[SQLModel], ...]] | None = None,
    indexes: dict[int, tuple[tuple[type[SQLModel], str], ...]] | None = None,
) -> list[str]:
    """The statements of one migration step, generated from the models.

    The tables the step creates (without the columns later steps add, nor the indexes over
    them), then the columns it adds (``ALTER TABLE ... ADD COLUMN``) and the indexes that
    need them, then the tables it rebuilds (``rebuilds``) and the indexes it creates again
    (``indexes``). Running steps 0..N in order gives the models' current schema.
    """
    dialect = sqlite.dialect()
    statements: list[str] = []
    for model in models.get(step, ()):
        later = _added_later(columns, model, step)
        table = _table(model)
        kept = Table(
            table.name,
            MetaData(),
            *(c._copy() for c in table.columns if c.name not in later),
        )
        statements.append(str(CreateTable(kept).compile(dialect=dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            if not {c.name for c in index.columns} & later:
                statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    added = columns.get(step, ())
    for model, name in added:
        table = _table(model)
        column: Column[object] = table.columns[name]
        assert column.nullable, f"{table.name}.{name}: an added column must be nullable"
        quoted = dialect.identifier_preparer.quote(name)
        kind = column.type.compile(dialect=dialect)
        statements.append(f"ALTER TABLE {table.name} ADD COLUMN {quoted} {kind}")
    for model in dict.fromkeys(m for m, _ in added):
        names = {name for m, name in added if m is model}
        later = _added_later(columns, model, step)
        for index in sorted(_table(model).indexes, key=lambda i: str(i.name)):
            cols = {c.name for c in index.columns}
            if cols & names and not cols & later:
                statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    for model in (rebuilds or {}).get(step, ()):
        assert not _added_later(columns, model, step), "rebuild after the last added column"
        statements.extend(_rebuild_ddl(_table(model), dialect))
    for model, name in (indexes or {}).get(step, ()):
        (index,) = (i for i in _table(model).indexes if i.name == name)
        statements.append(f"DROP INDEX IF EXISTS {name}")
        statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    return statements


def _rebuild_ddl(table: Table, dialect: Dialect) -> list[str]:
    """Statements that rebuild ``table`` as defined now, its rows kept.

    SQLite's own recipe for a change ``ALTER TABLE`` cannot make; the migration runs them
    in its transaction.
    """
    new = f"{table.name}__new"
    copy = table.to_metadata(MetaData(), name=new)
    names = ", ".join(dialect.identifier_preparer.quote(c.name) for c in table.columns)
    statements = [
        str(CreateTable(copy).compile(dialect=dialect)).strip(),
        f"INSERT INTO {new} ({names}) SELECT {names} FROM {table.name}",
        f"DROP TABLE {table.name}",
        f"ALTER TABLE {new} RENAME TO {table.name}",
    ]
    for index in sorted(table.indexes, key=lambda i: str(i.name)):
        statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    return statements

# ---------------------------------------------------------------- PostgreSQL

POSTGRES_SCHEMA_VERSION = 5
"""The schema version of a current PostgreSQL database (`runtime.storage.postgres`); its
``schema_version`` table holds it. Version 1 holds every table of the thread and runtime
models above (as of thread schema 6 and runtime schema 5); version 2 adds the frames across
nodes (`FrameRow`, `FrameCounterRow`) and an index of the alarms by due time; version 3
the node that ran each run attempt (``run_attempts.node_id``), the node leases (`NodeRow`)
and the turn leases (`TurnLeaseRow`); version 4 whether each node claims runs
(``nodes.claims``); version 5 the effects each node runs (``nodes.effects``)."""

POSTGRES_THREAD_MODELS: tuple[type[SQLModel], ...] = THREAD_MODELS
"""The tables of a thread's store, all threads in one table each, keyed by ``thread_id``
first (a model without that column gets it prepended: its key, unique constraints and
indexes become ``(thread_id, ...)``)."""

POSTGRES_RUNTIME_MODELS: tuple[tuple[type[SQLModel], str], ...] = tuple(
    (m, "runtime_effect_records" if m is EffectRecordRow else _table(m).name)
    for m in RUNTIME_MODELS
)
"""The runtime database's tables and their PostgreSQL names: the runtime-level effect
records (keyed by scope, in ``thread_id``) get a table of their own beside the threads'."""

POSTGRES_MIGRATION_MODELS: dict[int, tuple[type[SQLModel], ...]] = {
    1: (FrameRow, FrameCounterRow),
    2: (NodeRow, TurnLeaseRow),
}
"""The tables each later PostgreSQL migration creates: step N takes version N to N + 1 (step
0 is every table of `POSTGRES_THREAD_MODELS` and `POSTGRES_RUNTIME_MODELS`). Add a step;
never change one. These models keep ``thread_id`` as their first key column themselves."""

POSTGRES_MIGRATION_INDEXES: dict[int, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    1: (("alarms", "ix_alarms_due", ("due_at",)),),
}
"""Indexes a later PostgreSQL migration adds to a table of step 0: ``(table, index name,
columns)`` (version 2: the alarms due within a node's horizon, `load_alarms`' ``until``)."""

POSTGRES_MIGRATION_COLUMNS: dict[int, tuple[tuple[str, str], ...]] = {
    2: (("run_attempts", "node_id"),),
    3: (("nodes", "claims"),),
    4: (("nodes", "effects"),),
}
"""Columns a later PostgreSQL migration adds to a table an earlier step created (nullable,
``ALTER TABLE ... ADD COLUMN``): ``(table, column)``. The earlier step creates the table
without them."""

POSTGRES_GLOBAL_TABLES = ("runtime_meta", "schema_version", "nodes")
"""The tables without a ``thread_id`` (Citus: reference tables, copied to every node)."""


def _pg_table(model: type[SQLModel], name: str, metadata: MetaData) -> Table:
    """The model's table for PostgreSQL: ``thread_id`` the first column of every key.

    A model with a ``thread_id`` column keeps its own key when ``thread_id`` is part of it;
    otherwise ``thread_id`` is prepended to its primary key, to each unique constraint and
    to each index. An integer ``seq`` key becomes a ``BIGINT`` identity column (one
    sequence for all threads: scheduling order within a thread is its order). SQLite's
    partial-index ``WHERE`` becomes PostgreSQL's, unless the index's ``info`` has
    ``sqlite_only_where``.
    """
    source = _table(model)
    names = [c.name for c in source.columns]
    pk = [c.name for c in source.primary_key.columns]
    threaded = "thread_id" in names or name == "threads"
    columns: list[Column[object]] = []
    if "thread_id" not in names and name != "threads" and name != "runtime_meta":
        columns.append(Column("thread_id", String, nullable=False))
        threaded = False
    for c in source.columns:
        if c.name == "seq":
            columns.append(Column("seq", BigInteger, Identity(), nullable=False))
            continue
        copy = c._copy()
        copy.primary_key = False
        copy.unique = False
        copy.index = False
        columns.append(copy)
    prefix = [] if threaded or name == "runtime_meta" else ["thread_id"]
    if name == "run_index":  # keyed by run id alone in SQLite; by (thread_id, run_id) here
        pk = ["thread_id", *pk]
    constraints: list[PrimaryKeyConstraint | UniqueConstraint] = [
        PrimaryKeyConstraint(*prefix, *pk)
    ]
    for c in source.columns:
        if c.unique:
            constraints.append(UniqueConstraint(*prefix, c.name))
    table = Table(name, metadata, *columns, *constraints)
    for index in sorted(source.indexes, key=lambda i: str(i.name)):
        cols = [c.name for c in index.columns]
        if cols[0] != "thread_id" and name not in ("threads", "run_index"):
            cols = [*prefix, *cols] if prefix else cols
        where = index.dialect_options["postgresql"].get("where")
        if where is None and not index.info.get("sqlite_only_where"):
            where = index.dialect_options["sqlite"].get("where")
        Index(
            str(index.name).replace("ix_effect_records", f"ix_{name}"),
            *(table.c[n] for n in cols),
            unique=bool(index.unique),
            postgresql_where=where,
        )
    return table


def postgres_ddl() -> list[str]:
    """CREATE TABLE / CREATE INDEX statements for PostgreSQL, generated from the models.

    Every table of a thread's store and of the runtime database, in one database, and the
    ``schema_version`` table.
    """
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    metadata = MetaData()
    tables = [_pg_table(m, _table(m).name, metadata) for m in POSTGRES_THREAD_MODELS]
    tables += [_pg_table(m, name, metadata) for m, name in POSTGRES_RUNTIME_MODELS]
    statements = ["CREATE TABLE schema_version (\n\tversion INTEGER NOT NULL\n)"]
    added = {(t, c) for cols in POSTGRES_MIGRATION_COLUMNS.values() for t, c in cols}
    for table in tables:
        dropped = {c for t, c in added if t == table.name}
        if dropped:  # the columns later steps add: not in step 0
            assert not {c.name for i in table.indexes for c in i.columns} & dropped
            table = Table(
                table.name, MetaData(),
                *(c._copy() for c in table.columns if c.name not in dropped),
                PrimaryKeyConstraint(*(c.name for c in table.primary_key.columns)),
                *(UniqueConstraint(*(c.name for c in k.columns)) for k in table.constraints
                  if isinstance(k, UniqueConstraint)),
            )
        statements.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    return statements


def postgres_migration_ddl(step: int) -> list[str]:
    """The statements of PostgreSQL migration ``step`` (1 and later), from the models."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    statements: list[str] = []
    later = {(t, c) for s, cols in POSTGRES_MIGRATION_COLUMNS.items() if s > step
             for t, c in cols}
    for model in POSTGRES_MIGRATION_MODELS.get(step, ()):
        table = _table(model)
        dropped = {c for t, c in later if t == table.name}
        if dropped:  # the columns later steps add: not in this step
            assert not {c.name for i in table.indexes for c in i.columns} & dropped
            table = Table(
                table.name, MetaData(),
                *(c._copy() for c in table.columns if c.name not in dropped),
                PrimaryKeyConstraint(*(c.name for c in table.primary_key.columns)),
            )
        statements.append(str(CreateTable(table).compile(dialect=dialect)).strip())
        for index in sorted(table.indexes, key=lambda i: str(i.name)):
            statements.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    for table_name, index_name, columns in POSTGRES_MIGRATION_INDEXES.get(step, ()):
        statements.append(f"CREATE INDEX {index_name} ON {table_name} ({', '.join(columns)})")
    for table_name, column_name in POSTGRES_MIGRATION_COLUMNS.get(step, ()):
        model = next(m for m in (*THREAD_MODELS, *(m for ms in POSTGRES_MIGRATION_MODELS
                                                    .values() for m in ms))
                     if _table(m).name == table_name)
        column = _table(model).columns[column_name]
        assert column.nullable, f"{table_name}.{column_name}: an added column must be nullable"
        kind = column.type.compile(dialect=dialect)
        statements.append(f"ALTER TABLE {table_name} ADD COLUMN {column_name} {kind}")
    return statements


PG_SCHEMA_PATH = Path(__file__).with_name("pg_schema.py")

_PG_SCHEMA_HEADER = '''"""The PostgreSQL schema: DDL generated from `runtime.storage.models`.

Generated; do not edit. Regenerate with ``.venv/bin/python -m runtime.storage.models``
(tests/test_schema.py fails while this file differs from what the models generate). The
PostgreSQL backend (`runtime.storage.postgres`) runs these statements, so SQLModel and
SQLAlchemy are not imported at run time.
"""
# ruff: noqa: E501 - one statement per line, as generated

'''


def pg_schema_source() -> str:
    """The text of `runtime.storage.pg_schema`: the versioned PostgreSQL DDL."""
    out = [_PG_SCHEMA_HEADER]
    out.append(f"SCHEMA_VERSION = {POSTGRES_SCHEMA_VERSION}\n")
    out.append('"""The version `MIGRATIONS` take a database to."""\n\n')
    out.append("MIGRATIONS: dict[int, tuple[str, ...]] = {\n")
    for step in range(POSTGRES_SCHEMA_VERSION):
        out.append(f"    {step}: (\n")
        for statement in postgres_ddl() if step == 0 else postgres_migration_ddl(step):
            literal = _literal(statement)
            if len(literal) == 1:
                out.append(f"        {literal[0]},\n")
            else:
                out.append("        (\n" + "".join(f"            {x}\n" for x in literal)
                           + "        ),\n")
        out.append("    ),\n")
    out.append("}\n")
    out.append('"""The statements that take schema version N to N + 1 (0: an empty schema)."""\n\n')
    thread_tables = tuple(_table(m).name for m in POSTGRES_THREAD_MODELS)
    out.append(f"THREAD_TABLES: tuple[str, ...] = {thread_tables!r}\n")
    out.append('"""The tables of threads\' stores (each keyed by ``thread_id`` first)."""\n\n')
    out.append(f"GLOBAL_TABLES: tuple[str, ...] = {POSTGRES_GLOBAL_TABLES!r}\n")
    out.append('"""The tables without a ``thread_id`` (Citus reference tables)."""\n')
    return "".join(out)


SCHEMA_PATH = Path(__file__).with_name("schema.py")

_SCHEMA_HEADER = '''"""The SQLite schema: DDL generated from the models in `runtime.storage.models`.

Generated; do not edit. After changing a model or a migration step there, regenerate with
``.venv/bin/python -m runtime.storage.models`` (tests/test_schema.py fails while this file
differs from what the models generate). The SQLite backend (`runtime.storage.sqlite`) runs
these statements with plain ``sqlite3``, so SQLModel and SQLAlchemy are not imported at run
time.
"""
# ruff: noqa: E501 - one statement per line, as generated

'''


def _literal(statement: str) -> list[str]:
    """One statement as adjacent string literals, a line of SQL each."""
    lines = statement.split("\n")
    return [json.dumps(line + "\n") for line in lines[:-1]] + [json.dumps(lines[-1])]


def _constant(model: type[SQLModel]) -> str:
    return f"{_table(model).name.upper()}_DDL"


def _migrations(
    name: str,
    steps: dict[int, tuple[type[SQLModel], ...]],
    columns: dict[int, tuple[tuple[type[SQLModel], str], ...]],
    rebuilds: dict[int, tuple[type[SQLModel], ...]] | None = None,
    indexes: dict[int, tuple[tuple[type[SQLModel], str], ...]] | None = None,
) -> str:
    out = [f"{name}: dict[int, tuple[str, ...]] = {{"]
    for step in sorted(steps):
        out.append(f"    {step}: (")
        for statement in migration_ddl(step, steps, columns, rebuilds, indexes):
            literal = _literal(statement)
            if len(literal) == 1:
                out.append(f"        {literal[0]},")
            else:
                out.append("        (\n" + "\n".join(f"            {x}" for x in literal)
                           + "\n        ),")
        out.append("    ),")
    return "\n".join([*out, "}"]) + "\n"


def schema_source() -> str:
    """The text of `runtime.storage.schema`: each table's DDL and the migration steps."""
    tables = tuple(dict.fromkeys((*THREAD_MODELS, *RUNTIME_MODELS)))  # a table in both: once
    for steps in (THREAD_MIGRATION_MODELS, RUNTIME_MIGRATION_MODELS):
        assert all(m in tables for models in steps.values() for m in models)
    out = [_SCHEMA_HEADER]
    for model in tables:
        out.append(f"{_constant(model)}: tuple[str, ...] = (\n")
        for statement in sqlite_ddl(model):
            literal = _literal(statement)
            if len(literal) == 1:
                out.append(f"    {literal[0]},\n")
            else:
                out.append("    (\n" + "".join(f"        {x}\n" for x in literal) + "    ),\n")
        out.append(")\n")
        out.append(f'"""Table ``{_table(model).name}`` and its indexes ({model.__name__})."""\n\n')
    out.append("THREAD_DDL: tuple[str, ...] = (\n"
               + "".join(f"    *{_constant(m)},\n" for m in THREAD_MODELS) + ")\n")
    out.append('"""A new thread file\'s whole schema at the current version (the tables of '
               'the thread models\nand their indexes), created in one step instead of '
               'replaying the migrations."""\n\n')
    out.append(_migrations("THREAD_MIGRATIONS", THREAD_MIGRATION_MODELS,
                           THREAD_MIGRATION_COLUMNS, THREAD_MIGRATION_REBUILDS,
                           THREAD_MIGRATION_INDEXES))
    out.append('"""Thread file: the statements that take schema version N to N + 1."""\n\n')
    out.append(_migrations("RUNTIME_MIGRATIONS", RUNTIME_MIGRATION_MODELS,
                           RUNTIME_MIGRATION_COLUMNS))
    out.append('"""``runtime.sqlite``: the statements that take schema version N to N + 1."""\n')
    return "".join(out)


def main(argv: list[str]) -> int:
    """``python -m runtime.storage.models [--check]``: rewrite (or check) the schema module."""
    if argv and argv != ["--check"]:
        print("usage: python -m runtime.storage.models [--check]", file=sys.stderr)
        return 2
    status = 0
    for path, source in ((SCHEMA_PATH, schema_source()), (PG_SCHEMA_PATH, pg_schema_source())):
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if argv == ["--check"]:
            if current != source:
                print(f"{path} is out of date; run python -m runtime.storage.models")
                status = 1
        elif current != source:
            path.write_text(source, encoding="utf-8")
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
