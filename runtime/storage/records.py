"""Effect records: what an effect tool applied, by effect key (the store contract and two stores).

An effect record is one row per ``(thread_id, key)``: **in progress** while a call holds it
under a lease (an owner and an expiry), **applied** once the call stored the JSON result.
A call that raised drops its in-progress record (`EffectRecordStore.release`): nothing is
recorded, so a later call can still apply the effect.

The same store journals durable turns (`runtime.durable`): a journaled tool call or model
response ends **succeeded** (its output recorded), **denied** (a call the user refused;
the refusal recorded) or **failed** (the error recorded). Succeeded, denied and applied
records are *finished*: a call on their key returns what they hold. A failed record is
not: `EffectRecordStore.begin` claims it again, so the next attempt runs the call again.

- `EffectRecordStore`: the contract (an ABC); its docstrings state what every backend
  guarantees. `tests/storage/test_effect_records.py` runs one suite against every backend.
- `InMemoryEffectStore`: one process, for tests and custom loops.
- `SqliteEffectStore`: a standalone SQLite file (WAL), safe for several processes.

The SQL is written so the same table can live in another database (a thread's own file):
`EFFECT_RECORDS_DDL` creates it, and the ``sql_*`` functions take a ``sqlite3.Connection``
or a cursor of one (`Executor`) and run inside the caller's transaction — they never begin
or commit. A caller that needs `sql_begin` to be atomic against other connections runs it
in a write transaction (``BEGIN IMMEDIATE``), as `SqliteEffectStore` does.

Instants are aware UTC datetimes in records and seconds since the Unix epoch (floats) in
the table; durations are seconds.
"""

from __future__ import annotations

import abc
import base64
import json
import math
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import anyio.to_thread

from runtime._limits import parse_json, quoted
from runtime.errors import EffectRecordLost
from runtime.storage import schema as _schema

ClockFn = Callable[[], float]
"""Seconds since the Unix epoch (UTC); ``time.time`` or ``FakeClock.now``."""


class EffectRecordStatus(StrEnum):
    """The status of an effect record."""

    IN_PROGRESS = "in_progress"
    APPLIED = "applied"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DENIED = "denied"


FINISHED_STATUSES = frozenset({EffectRecordStatus.APPLIED, EffectRecordStatus.SUCCEEDED,
                               EffectRecordStatus.DENIED})
"""Statuses whose record holds an answer: a call on the key returns it and runs nothing."""

JOURNAL_PREFIX = "durable:"
"""How the keys of durable runs' journal records begin (`runtime.durable`). A thread's
effect-record listing (`ThreadStore.list_effect_records`) leaves them out: they are the
thread's turn journal, not effect tools' records."""

_RESULT_STATUSES = FINISHED_STATUSES | {EffectRecordStatus.FAILED}


@dataclass(frozen=True, slots=True)
class EffectRecord:
    """One effect key's record.

    Attributes:
        thread_id: The thread the key is scoped to (``""`` outside a thread).
        key: The effect key.
        tool_name: The tool that claimed or applied the key.
        run_id: The turn (run id) that claimed or applied it, if known.
        status: In progress (a call holds the lease), or what the call ended as: applied
            (effect tools), succeeded, failed or denied (durable turns).
        result_json: The recorded result as JSON text (the error text of a failed
            record; None while in progress).
        owner: Who holds the lease (in-progress records only).
        lease_expires_at: When the lease expires, aware UTC (in-progress records only).
        created_at: When the key was first claimed (or last taken over), aware UTC.
        updated_at: When the record last changed, aware UTC.
    """

    thread_id: str
    key: str
    tool_name: str
    run_id: str | None
    status: EffectRecordStatus
    result_json: str | None
    owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @property
    def result(self) -> Any:
        """The recorded result, decoded from `result_json` (None while in progress)."""
        return None if self.result_json is None else json.loads(self.result_json)

    def to_json(self) -> dict[str, Any]:
        """The record as the HTTP API shows it (instants as ISO 8601 UTC text)."""
        return {
            "threadId": self.thread_id,
            "key": self.key,
            "toolName": self.tool_name,
            "runId": self.run_id,
            "status": str(self.status),
            "result": self.result,
            "leaseExpiresAt": _iso(self.lease_expires_at),
            "createdAt": _iso(self.created_at),
            "updatedAt": _iso(self.updated_at),
        }


@dataclass(frozen=True, slots=True)
class Claim:
    """What `EffectRecordStore.begin` found or did.

    Attributes:
        record: The key's record after the call.
        claimed: True when this caller now holds the in-progress record (a new key, or an
            expired lease taken over); False when the key is applied or held by another.
        took_over: True when the claim replaced another owner's expired lease (that owner
            may have applied the effect before it died: reconcile before applying).
    """

    record: EffectRecord
    claimed: bool
    took_over: bool = False

    @property
    def applied(self) -> bool:
        """Whether the key already has a recorded result."""
        return self.record.status is EffectRecordStatus.APPLIED

    @property
    def finished(self) -> bool:
        """Whether the key's record holds an answer (applied, succeeded or denied)."""
        return self.record.status in FINISHED_STATUSES


@dataclass(frozen=True, slots=True)
class EffectRecordPage:
    """A page of effect records, newest first (by `EffectRecord.created_at`, then key).

    Attributes:
        records: The records on this page.
        next_cursor: Pass as ``cursor`` for the next page; None on the last page.
    """

    records: list[EffectRecord]
    next_cursor: str | None


class EffectRecordStore(abc.ABC):
    """Records by effect key, scoped to a thread: the contract every backend keeps.

    Every method is atomic on its own; none blocks the event loop. Records of different
    ``thread_id`` never interact.
    """

    @abc.abstractmethod
    async def get(self, thread_id: str, key: str) -> EffectRecord | None:
        """The key's record, in progress or applied; None when there is none."""

    @abc.abstractmethod
    async def begin(
        self,
        thread_id: str,
        key: str,
        *,
        tool_name: str,
        run_id: str | None,
        owner: str,
        lease_seconds: float,
    ) -> Claim:
        """Claim a key for applying its effect, atomically.

        With no record, creates an in-progress record held by ``owner`` until now +
        ``lease_seconds`` (``claimed``). With a failed record, makes it in progress under
        ``owner`` (``claimed``; the call runs again). With an in-progress record whose lease
        has expired, hands it to ``owner`` (``claimed`` and ``took_over``). With a finished
        record (applied, succeeded, denied), or an in-progress record under a live lease,
        changes nothing (``claimed`` is False).
        Of any number of concurrent callers on one key (tasks, threads, processes on one
        store), exactly one gets ``claimed``.

        Raises:
            ValueError: ``lease_seconds`` is not positive and finite.
        """

    @abc.abstractmethod
    async def complete(
        self, thread_id: str, key: str, *, owner: str, result_json: str,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        """Record the result of the effect ``owner`` applied: the record becomes ``status``.

        The result is stored as given (JSON text); the lease fields are cleared.

        Args:
            thread_id: The thread the key is scoped to.
            key: The key.
            owner: Who holds the in-progress record.
            result_json: The result (or, for ``failed``, the error) as JSON text.
            status: What the call ended as: applied (effect tools; the default), or
                succeeded, failed or denied (durable turns).

        Raises:
            ValueError: ``status`` is ``in_progress``.
            EffectRecordLost: ``owner`` does not hold the key's in-progress record (its
                lease was taken over after it expired, or the record is gone or applied).
        """

    async def renew(
        self, thread_id: str, key: str, *, owner: str, lease_seconds: float
    ) -> bool:
        """Extend ``owner``'s live claim to now + ``lease_seconds`` (a heartbeat while applying).

        A backend without it keeps the lease it was claimed with (this default, True).

        Returns:
            True if ``owner`` still holds the key's in-progress record (now renewed);
            False if it does not (taken over after it expired, or gone): nothing changes.

        Raises:
            ValueError: ``lease_seconds`` is not positive and finite.
        """
        check_lease(lease_seconds)
        return True

    @abc.abstractmethod
    async def release(self, thread_id: str, key: str, *, owner: str) -> bool:
        """Drop ``owner``'s in-progress record (its execute raised): nothing is recorded.

        Returns:
            True if the record was dropped; False if ``owner`` did not hold it (nothing
            changes then: an applied record or another owner's claim stays).
        """

    @abc.abstractmethod
    async def list(
        self,
        thread_id: str,
        *,
        status: EffectRecordStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        """A page of the thread's records, newest first (``created_at``, then key).

        Args:
            thread_id: The thread.
            status: Only records in this status.
            limit: At most this many records (1..1000).
            cursor: `EffectRecordPage.next_cursor` of the previous page.

        Raises:
            ValueError: a limit out of range, or a cursor this store did not produce.
        """

    @abc.abstractmethod
    async def purge(self, *, older_than: datetime) -> int:
        """Delete records last changed before ``older_than`` (aware UTC), in every thread.

        Records in any status but in progress go by that age alone; in-progress records go
        only when their lease expired before ``older_than`` too.

        Returns:
            How many records were deleted.
        """

    @abc.abstractmethod
    async def purge_thread(self, thread_id: str) -> int:
        """Delete every record of a thread (the thread is deleted). Returns how many."""

    async def close(self) -> None:  # noqa: B027 - optional for backends
        """Release the store's resources; it is not used afterwards."""


# --- SQL, usable inside any connection that holds the table ---------------------------

EFFECT_RECORDS_DDL: tuple[str, ...] = tuple(
    statement.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1).replace(
        "CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ", 1
    )
    for statement in _schema.EFFECT_RECORDS_DDL
)
"""Table ``effect_records`` and its indexes (generated from
`runtime.storage.models.EffectRecordRow`, as in a thread file), each statement idempotent."""

Executor = sqlite3.Connection | sqlite3.Cursor
"""What the ``sql_*`` functions run their statements on: a connection, or a cursor of one
(the SQLite backend's stores run every statement on one cursor kept per connection)."""

_COLUMNS = ('thread_id, "key", tool_name, run_id, status, result, owner, lease_expires_at, '
            "created_at, updated_at")
MAX_PAGE = 1000


def create_effect_records_table(conn: Executor) -> None:
    """Create the table and its indexes if missing (inside the caller's transaction)."""
    for statement in EFFECT_RECORDS_DDL:
        conn.execute(statement)


def sql_get(conn: Executor, thread_id: str, key: str) -> EffectRecord | None:
    """`EffectRecordStore.get` on a connection."""
    row = conn.execute(
        f'SELECT {_COLUMNS} FROM effect_records WHERE thread_id = ? AND "key" = ?',
        (thread_id, key),
    ).fetchone()
    return None if row is None else _from_row(row)


def sql_begin(
    conn: Executor,
    thread_id: str,
    key: str,
    *,
    tool_name: str,
    run_id: str | None,
    owner: str,
    lease_seconds: float,
    now: float,
) -> Claim:
    """`EffectRecordStore.begin` on a connection; run it in a write transaction.

    Each statement is atomic on its own (insert if absent, take over if expired), so two
    connections never both claim; the write transaction makes the answer consistent too.
    """
    check_lease(lease_seconds)
    now = _quantize(now)
    expires = now + lease_seconds
    inserted = conn.execute(
        f"INSERT OR IGNORE INTO effect_records ({_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
        (thread_id, key, tool_name, run_id, EffectRecordStatus.IN_PROGRESS.value, owner,
         expires, now, now),
    ).rowcount
    if inserted:
        return Claim(_require(conn, thread_id, key), claimed=True)
    retried = conn.execute(
        "UPDATE effect_records SET status = ?, result = NULL, owner = ?, lease_expires_at = ?, "
        'tool_name = ?, run_id = ?, created_at = ?, updated_at = ? WHERE thread_id = ? '
        'AND "key" = ? AND status = ?',
        (EffectRecordStatus.IN_PROGRESS.value, owner, expires, tool_name, run_id, now, now,
         thread_id, key, EffectRecordStatus.FAILED.value),
    ).rowcount
    if retried:
        return Claim(_require(conn, thread_id, key), claimed=True)
    taken = conn.execute(
        "UPDATE effect_records SET owner = ?, lease_expires_at = ?, tool_name = ?, run_id = ?, "
        'created_at = ?, updated_at = ? WHERE thread_id = ? AND "key" = ? AND status = ? '
        "AND lease_expires_at <= ?",
        (owner, expires, tool_name, run_id, now, now, thread_id, key,
         EffectRecordStatus.IN_PROGRESS.value, now),
    ).rowcount
    record = _require(conn, thread_id, key)
    return Claim(record, claimed=bool(taken), took_over=bool(taken))


def sql_complete(
    conn: Executor, thread_id: str, key: str, *, owner: str, result_json: str,
    now: float, status: EffectRecordStatus = EffectRecordStatus.APPLIED,
) -> EffectRecord:
    """`EffectRecordStore.complete` on a connection."""
    status = _check_result_status(status)
    now = _quantize(now)
    changed = conn.execute(
        "UPDATE effect_records SET status = ?, result = ?, owner = NULL, lease_expires_at = NULL, "
        'updated_at = ? WHERE thread_id = ? AND "key" = ? AND status = ? AND owner = ?',
        (status.value, result_json, now, thread_id, key,
         EffectRecordStatus.IN_PROGRESS.value, owner),
    ).rowcount
    if not changed:
        raise _lost(thread_id, key, owner)
    return _require(conn, thread_id, key)


def sql_renew(
    conn: Executor, thread_id: str, key: str, *, owner: str, lease_seconds: float,
    now: float,
) -> bool:
    """`EffectRecordStore.renew` on a connection."""
    check_lease(lease_seconds)
    return bool(conn.execute(
        'UPDATE effect_records SET lease_expires_at = ? WHERE thread_id = ? AND "key" = ? '
        "AND status = ? AND owner = ?",
        (_quantize(now) + lease_seconds, thread_id, key, EffectRecordStatus.IN_PROGRESS.value,
         owner),
    ).rowcount)


def sql_release(conn: Executor, thread_id: str, key: str, *, owner: str) -> bool:
    """`EffectRecordStore.release` on a connection."""
    return bool(conn.execute(
        'DELETE FROM effect_records WHERE thread_id = ? AND "key" = ? AND status = ? '
        "AND owner = ?",
        (thread_id, key, EffectRecordStatus.IN_PROGRESS.value, owner),
    ).rowcount)


def sql_list(
    conn: Executor,
    thread_id: str,
    *,
    status: EffectRecordStatus | None = None,
    limit: int = 50,
    cursor: str | None = None,
    hide_journal: bool = False,
) -> EffectRecordPage:
    """`EffectRecordStore.list` on a connection (``hide_journal``: no `JOURNAL_PREFIX` keys)."""
    check_limit(limit)
    where, params = ["thread_id = ?"], [thread_id]
    if hide_journal:
        where.append('substr("key", 1, ?) != ?')
        params.extend([len(JOURNAL_PREFIX), JOURNAL_PREFIX])  # type: ignore[list-item]
    if status is not None:
        where.append("status = ?")
        params.append(EffectRecordStatus(status).value)
    if cursor is not None:
        created, after_key = decode_cursor(cursor)
        where.append('(created_at < ? OR (created_at = ? AND "key" < ?))')
        params.extend([created, created, after_key])  # type: ignore[list-item]
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM effect_records WHERE {' AND '.join(where)} "
        'ORDER BY created_at DESC, "key" DESC LIMIT ?',
        (*params, limit + 1),
    ).fetchall()
    records = [_from_row(r) for r in rows[:limit]]
    return EffectRecordPage(records, _next_cursor(records) if len(rows) > limit else None)


def process_owner_prefix() -> str:
    """``<host>:<pid>:``: how every lease owner of this process begins (effect tools add an id).

    A backend that one process uses at a time knows, when it opens a thread, that an
    in-progress record whose owner begins otherwise was held by a process that is gone.
    """
    return f"{socket.gethostname()}:{os.getpid()}:"


def sql_expire_leases(
    conn: Executor, thread_id: str, *, keep_owner_prefix: str, now: float
) -> int:
    """`EffectRecordTable.expire_leases` on a connection."""
    now = _quantize(now)
    return conn.execute(
        "UPDATE effect_records SET lease_expires_at = ?, updated_at = ? WHERE thread_id = ? "
        "AND status = ? AND lease_expires_at > ? AND substr(owner, 1, ?) != ?",
        (now, now, thread_id, EffectRecordStatus.IN_PROGRESS.value, now,
         len(keep_owner_prefix), keep_owner_prefix),
    ).rowcount


def sql_purge(conn: Executor, *, older_than: datetime) -> int:
    """`EffectRecordStore.purge` on a connection."""
    cutoff = _epoch(older_than)
    return conn.execute(
        "DELETE FROM effect_records WHERE updated_at < ? AND "
        "(status != ? OR lease_expires_at < ?)",
        (cutoff, EffectRecordStatus.IN_PROGRESS.value, cutoff),
    ).rowcount


def sql_purge_thread(conn: Executor, thread_id: str) -> int:
    """`EffectRecordStore.purge_thread` on a connection."""
    return conn.execute("DELETE FROM effect_records WHERE thread_id = ?", (thread_id,)).rowcount


def encode_cursor(created_at: datetime, key: str) -> str:
    """The opaque cursor after a record (its ``created_at`` and key)."""
    raw = json.dumps([_epoch(created_at), key]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """Read a cursor `encode_cursor` wrote.

    Raises:
        ValueError: naming the cursor, when this store did not produce it.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, key = parse_json(raw)
        if isinstance(created, int | float) and isinstance(key, str) and math.isfinite(created):
            return float(created), key
    except (ValueError, TypeError):
        pass
    raise ValueError(f"Invalid effect-records cursor: {quoted(cursor)}")


def _next_cursor(records: list[EffectRecord]) -> str:
    last = records[-1]
    return encode_cursor(last.created_at, last.key)


def _require(conn: Executor, thread_id: str, key: str) -> EffectRecord:
    record = sql_get(conn, thread_id, key)
    assert record is not None, "a row read inside the transaction that wrote it"
    return record


def _from_row(row: tuple[Any, ...]) -> EffectRecord:
    thread_id, key, tool_name, run_id, status, result, owner, lease, created, updated = row
    return EffectRecord(
        thread_id=thread_id, key=key, tool_name=tool_name, run_id=run_id,
        status=EffectRecordStatus(status), result_json=result, owner=owner,
        lease_expires_at=None if lease is None else _dt(lease),
        created_at=_dt(created), updated_at=_dt(updated),
    )


def _quantize(seconds: float) -> float:
    # Stored instants are whole microseconds, what a datetime holds: a cursor built from a
    # record's created_at then compares equal to the stored value.
    return _dt(seconds).timestamp()


def _dt(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _epoch(instant: datetime) -> float:
    if instant.tzinfo is None:
        raise ValueError(f"An instant must be timezone-aware (UTC), got naive {instant}")
    return instant.timestamp()


def _iso(instant: datetime | None) -> str | None:
    return None if instant is None else instant.isoformat().replace("+00:00", "Z")


def instant(seconds: float) -> datetime:
    """Seconds since the epoch as an aware UTC datetime."""
    return _dt(seconds)


def check_lease(lease_seconds: float) -> None:
    """Raise ValueError unless ``lease_seconds`` is positive and finite."""
    if not (isinstance(lease_seconds, int | float) and 0 < lease_seconds < float("inf")):
        raise ValueError(f"lease_seconds must be positive and finite, got {lease_seconds!r}")


def _check_result_status(status: EffectRecordStatus) -> EffectRecordStatus:
    checked = EffectRecordStatus(status)
    if checked not in _RESULT_STATUSES:
        raise ValueError(f"complete: a record ends applied, succeeded, failed or denied, "
                         f"not {checked.value!r}")
    return checked


def check_limit(limit: int) -> None:
    """Raise ValueError unless ``limit`` is an integer from 1 to `MAX_PAGE`."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")


def _lost(thread_id: str, key: str, owner: str) -> EffectRecordLost:
    where = f" in thread {thread_id}" if thread_id else ""
    return EffectRecordLost(
        f"Effect key {key!r}{where} is not in progress under {owner!r}: its lease expired and "
        f"another call took it over, or the record was purged"
    )


# --- backends -------------------------------------------------------------------------


class EffectRecordTable:
    """Effect records held in a dict: the memory counterpart of the ``sql_*`` functions.

    Not thread-safe on its own: the holder runs each method under its own lock (as
    `InMemoryEffectStore` and the memory backend's thread store do), so each call is one
    transaction. Times are seconds since the epoch, given by the caller.
    """

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], EffectRecord] = {}

    def get(self, thread_id: str, key: str) -> EffectRecord | None:
        """`EffectRecordStore.get`."""
        return self.records.get((thread_id, key))

    def begin(
        self, thread_id: str, key: str, *, tool_name: str, run_id: str | None, owner: str,
        lease_seconds: float, now: float,
    ) -> Claim:
        """`EffectRecordStore.begin` at ``now``."""
        check_lease(lease_seconds)
        now = _quantize(now)
        current = self.records.get((thread_id, key))
        took_over = False
        if current is not None and current.status is not EffectRecordStatus.FAILED:
            expiry = current.lease_expires_at
            if current.status in FINISHED_STATUSES or (
                expiry is not None and _epoch(expiry) > now
            ):
                return Claim(current, claimed=False)
            took_over = True
        record = EffectRecord(
            thread_id=thread_id, key=key, tool_name=tool_name, run_id=run_id,
            status=EffectRecordStatus.IN_PROGRESS, result_json=None, owner=owner,
            lease_expires_at=_dt(now + lease_seconds), created_at=_dt(now),
            updated_at=_dt(now),
        )
        self.records[(thread_id, key)] = record
        return Claim(record, claimed=True, took_over=took_over)

    def complete(
        self, thread_id: str, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        """`EffectRecordStore.complete` at ``now``."""
        status = _check_result_status(status)
        current = self.records.get((thread_id, key))
        if (current is None or current.status is not EffectRecordStatus.IN_PROGRESS
                or current.owner != owner):
            raise _lost(thread_id, key, owner)
        record = replace(
            current, status=status, result_json=result_json,
            owner=None, lease_expires_at=None, updated_at=_dt(_quantize(now)),
        )
        self.records[(thread_id, key)] = record
        return record

    def renew(self, thread_id: str, key: str, *, owner: str, lease_seconds: float,
              now: float) -> bool:
        """`EffectRecordStore.renew` at ``now``."""
        check_lease(lease_seconds)
        current = self.records.get((thread_id, key))
        if (current is None or current.status is not EffectRecordStatus.IN_PROGRESS
                or current.owner != owner):
            return False
        self.records[(thread_id, key)] = replace(
            current, lease_expires_at=_dt(_quantize(now) + lease_seconds))
        return True

    def release(self, thread_id: str, key: str, *, owner: str) -> bool:
        """`EffectRecordStore.release`."""
        current = self.records.get((thread_id, key))
        if (current is None or current.status is not EffectRecordStatus.IN_PROGRESS
                or current.owner != owner):
            return False
        del self.records[(thread_id, key)]
        return True

    def list(
        self, thread_id: str, *, status: EffectRecordStatus | None = None, limit: int = 50,
        cursor: str | None = None, hide_journal: bool = False,
    ) -> EffectRecordPage:
        """`EffectRecordStore.list` (``hide_journal``: without `JOURNAL_PREFIX` keys)."""
        check_limit(limit)
        after = decode_cursor(cursor) if cursor is not None else None
        chosen = [
            r for r in self.records.values()
            if r.thread_id == thread_id and (status is None or r.status == status)
            and not (hide_journal and r.key.startswith(JOURNAL_PREFIX))
        ]
        chosen.sort(key=lambda r: (_epoch(r.created_at), r.key), reverse=True)
        if after is not None:
            chosen = [r for r in chosen if (_epoch(r.created_at), r.key) < after]
        page = chosen[:limit]
        return EffectRecordPage(page, _next_cursor(page) if len(chosen) > limit else None)

    def purge(self, *, older_than: datetime) -> int:
        """`EffectRecordStore.purge`."""
        cutoff = _epoch(older_than)
        gone = [
            k for k, r in self.records.items()
            if _epoch(r.updated_at) < cutoff and (
                r.status is not EffectRecordStatus.IN_PROGRESS
                or (r.lease_expires_at is not None and _epoch(r.lease_expires_at) < cutoff)
            )
        ]
        for k in gone:
            del self.records[k]
        return len(gone)

    def expire_leases(self, thread_id: str, *, keep_owner_prefix: str, now: float) -> int:
        """End at ``now`` the live leases of in-progress records of a gone process.

        Those whose owner does not begin with ``keep_owner_prefix``; the next claim takes
        them over. Returns how many.
        """
        now = _quantize(now)
        count = 0
        for k, r in list(self.records.items()):
            if (k[0] == thread_id and r.status is EffectRecordStatus.IN_PROGRESS
                    and r.lease_expires_at is not None and _epoch(r.lease_expires_at) > now
                    and not (r.owner or "").startswith(keep_owner_prefix)):
                self.records[k] = replace(r, lease_expires_at=_dt(now), updated_at=_dt(now))
                count += 1
        return count

    def purge_thread(self, thread_id: str) -> int:
        """`EffectRecordStore.purge_thread`."""
        gone = [k for k in self.records if k[0] == thread_id]
        for k in gone:
            del self.records[k]
        return len(gone)


class InMemoryEffectStore(EffectRecordStore):
    """Effect records in this process's memory (tests, custom loops); lost on exit.

    Args:
        clock: The time source (seconds since the epoch); ``FakeClock.now`` in tests.
    """

    def __init__(self, *, clock: ClockFn | None = None) -> None:
        self._clock = clock or time.time
        self._table = EffectRecordTable()
        self._lock = threading.Lock()

    async def get(self, thread_id: str, key: str) -> EffectRecord | None:  # noqa: D102
        with self._lock:
            return self._table.get(thread_id, key)

    async def begin(  # noqa: D102
        self, thread_id: str, key: str, *, tool_name: str, run_id: str | None, owner: str,
        lease_seconds: float,
    ) -> Claim:
        with self._lock:
            return self._table.begin(
                thread_id, key, tool_name=tool_name, run_id=run_id, owner=owner,
                lease_seconds=lease_seconds, now=self._clock(),
            )

    async def complete(  # noqa: D102
        self, thread_id: str, key: str, *, owner: str, result_json: str,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        status = _check_result_status(status)
        with self._lock:
            return self._table.complete(
                thread_id, key, owner=owner, result_json=result_json, now=self._clock(),
                status=status,
            )

    async def renew(  # noqa: D102
        self, thread_id: str, key: str, *, owner: str, lease_seconds: float
    ) -> bool:
        with self._lock:
            return self._table.renew(thread_id, key, owner=owner, lease_seconds=lease_seconds,
                                     now=self._clock())

    async def release(self, thread_id: str, key: str, *, owner: str) -> bool:  # noqa: D102
        with self._lock:
            return self._table.release(thread_id, key, owner=owner)

    async def list(  # noqa: D102
        self, thread_id: str, *, status: EffectRecordStatus | None = None, limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        with self._lock:
            return self._table.list(thread_id, status=status, limit=limit, cursor=cursor)

    async def purge(self, *, older_than: datetime) -> int:  # noqa: D102
        with self._lock:
            return self._table.purge(older_than=older_than)

    async def purge_thread(self, thread_id: str) -> int:  # noqa: D102
        with self._lock:
            return self._table.purge_thread(thread_id)


class SqliteEffectStore(EffectRecordStore):
    """Effect records in a standalone SQLite file (WAL), shared safely by several processes.

    Every operation runs in a worker thread, a write in one ``BEGIN IMMEDIATE`` transaction
    on the store's connection (opened, and the table created, by the first operation, so
    constructing the store does no I/O); another process's writer is waited for
    (``busy_timeout_seconds``).

    Args:
        path: The database file (created with its table if missing).
        clock: The time source (seconds since the epoch); ``FakeClock.now`` in tests.
        synchronous: SQLite's ``synchronous`` setting: ``"FULL"`` (survives power loss)
            or ``"NORMAL"`` (survives a process crash).
        busy_timeout_seconds: How long a write waits for another connection's writer.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        clock: ClockFn | None = None,
        synchronous: str = "FULL",
        busy_timeout_seconds: float = 30.0,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        self.path = Path(path)
        self._clock = clock or time.time
        self._synchronous = synchronous
        self._busy_timeout_seconds = busy_timeout_seconds
        self._conn: sqlite3.Connection | None = None  # opened by the first operation
        self._closed = False
        self._lock = threading.Lock()

    def _connection(self) -> sqlite3.Connection:
        """The open connection (in a worker thread, under the lock): opened on first use."""
        if self._closed:
            raise RuntimeError(f"SqliteEffectStore({str(self.path)!r}) is closed")
        if self._conn is None:
            # isolation_level=None: transactions are ours (BEGIN IMMEDIATE takes the write
            # lock up front, so a racing claimant waits instead of failing on upgrade).
            deadline = time.monotonic() + self._busy_timeout_seconds
            while True:
                conn = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False,
                    timeout=self._busy_timeout_seconds,
                )
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute(f"PRAGMA synchronous={self._synchronous}")
                    conn.execute("BEGIN IMMEDIATE")
                    create_effect_records_table(conn)
                    conn.execute("COMMIT")
                except sqlite3.OperationalError as exc:
                    conn.close()
                    # Switching a new file to WAL takes an exclusive lock without waiting on
                    # the busy handler: a process opening the same file at the same moment
                    # gets "database is locked" at once. Try again until the busy timeout.
                    if "locked" not in str(exc) or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.01)
                    continue
                except BaseException:
                    conn.close()
                    raise
                break
            self._conn = conn
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    async def _run(self, fn: Callable[[sqlite3.Connection], Any], *, write: bool = True) -> Any:
        def work() -> Any:
            if not write:  # one SELECT in autocommit mode reads a consistent snapshot
                with self._lock:
                    return fn(self._connection())
            with self._transaction() as conn:
                return fn(conn)

        return await anyio.to_thread.run_sync(work)

    async def get(self, thread_id: str, key: str) -> EffectRecord | None:  # noqa: D102
        result: EffectRecord | None = await self._run(
            lambda c: sql_get(c, thread_id, key), write=False
        )
        return result

    async def begin(  # noqa: D102
        self, thread_id: str, key: str, *, tool_name: str, run_id: str | None, owner: str,
        lease_seconds: float,
    ) -> Claim:
        check_lease(lease_seconds)
        claim: Claim = await self._run(lambda c: sql_begin(
            c, thread_id, key, tool_name=tool_name, run_id=run_id, owner=owner,
            lease_seconds=lease_seconds, now=self._clock(),
        ))
        return claim

    async def complete(  # noqa: D102
        self, thread_id: str, key: str, *, owner: str, result_json: str,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        status = _check_result_status(status)
        record: EffectRecord = await self._run(lambda c: sql_complete(
            c, thread_id, key, owner=owner, result_json=result_json, now=self._clock(),
            status=status,
        ))
        return record

    async def renew(  # noqa: D102
        self, thread_id: str, key: str, *, owner: str, lease_seconds: float
    ) -> bool:
        check_lease(lease_seconds)
        renewed: bool = await self._run(lambda c: sql_renew(
            c, thread_id, key, owner=owner, lease_seconds=lease_seconds, now=self._clock()))
        return renewed

    async def release(self, thread_id: str, key: str, *, owner: str) -> bool:  # noqa: D102
        dropped: bool = await self._run(lambda c: sql_release(c, thread_id, key, owner=owner))
        return dropped

    async def list(  # noqa: D102
        self, thread_id: str, *, status: EffectRecordStatus | None = None, limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        check_limit(limit)
        if cursor is not None:
            decode_cursor(cursor)
        page: EffectRecordPage = await self._run(lambda c: sql_list(
            c, thread_id, status=status, limit=limit, cursor=cursor
        ), write=False)
        return page

    async def purge(self, *, older_than: datetime) -> int:  # noqa: D102
        _epoch(older_than)
        count: int = await self._run(lambda c: sql_purge(c, older_than=older_than))
        return count

    async def purge_thread(self, thread_id: str) -> int:  # noqa: D102
        count: int = await self._run(lambda c: sql_purge_thread(c, thread_id))
        return count

    async def close(self) -> None:  # noqa: D102
        def shut() -> None:
            with self._lock:
                self._closed = True
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await anyio.to_thread.run_sync(shut)
