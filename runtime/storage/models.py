"""Table models: the single definition of the schema.

SQLModel models describe every table; the SQLite backend generates its DDL from them and
then talks plain ``sqlite3`` on the hot path (≈10 µs per query against ≈200 µs through an
ORM session, docs/design.md "Decisions"). Two databases use them:

- each thread's file (``threads/<id>.sqlite``): `ThreadMetaRow`, `EffectRunRow`,
  `MessageRow` (the conversation, from schema version 2);
- the runtime database (``runtime.sqlite``): `ThreadRow` (the registry), `AlarmRow`
  (the durable alarm index: one row per thread with pending work).
"""

from __future__ import annotations

from sqlalchemy import Index, Table
from sqlalchemy.dialects import sqlite
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
        Index("ix_effect_runs_due", "status", "run_at", "seq"),
        Index("ix_effect_runs_finished", "status", "finished_at"),
        Index("ix_effect_runs_name", "name", "seq"),
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


class ThreadRow(SQLModel, table=True):
    """The registry: one row per existing thread."""

    __tablename__ = "threads"
    __table_args__ = (Index("ix_threads_created", "created_at", "id"),)

    id: str = Field(primary_key=True)
    created_at: float
    agent_id: str | None = None
    user_id: str | None = None
    tags: str = "[]"


class AlarmRow(SQLModel, table=True):
    """The durable alarm of a thread: due when its earliest pending run is due."""

    __tablename__ = "alarms"

    thread_id: str = Field(primary_key=True)
    due_at: float


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


THREAD_MODELS: tuple[type[SQLModel], ...] = (ThreadMetaRow, EffectRunRow, MessageRow)
RUNTIME_MODELS: tuple[type[SQLModel], ...] = (ThreadRow, AlarmRow)
