"""The embedded backend: one SQLite file per thread plus ``runtime.sqlite``.

Layout of a data directory (`SQLiteBackend` owns it; nothing else knows a path):

- ``runtime.lock``: held with ``fcntl.flock`` while a runtime uses the directory;
- ``runtime.sqlite``: the registry and the alarm index (`SQLiteRuntimeStore`);
- ``threads/<thread_id>.sqlite``: one file per thread (`SQLiteThreadStore`), with its
  ``-wal`` and ``-shm`` companions.

Plain ``sqlite3`` on an open connection, one short transaction per call; the runtime calls
these from worker threads. Each store guards its connection with a lock so that a close
from another thread (thread deletion, eviction) never races a query.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import queue
import re
import sqlite3
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, TypeVar

from runtime._text import replace_lone_surrogates
from runtime.config import RetentionPolicy
from runtime.effects import FINISHED_STATUSES, EffectRun, EffectStatus, RunAttempt, replace_run
from runtime.errors import (
    DataDirLocked,
    RuntimeClosed,
    RuntimeStorageError,
    ThreadStorageError,
)
from runtime.ids import validate_thread_id
from runtime.messages import Message, message_from_row
from runtime.recurrence import Recurrence, Schedule, ScheduleState
from runtime.storage import records as _records
from runtime.storage.base import (
    Finish,
    FrameDraft,
    RunQuery,
    RuntimeStore,
    StorageBackend,
    ThreadInfo,
    ThreadQuery,
    ThreadStore,
    interrupted_error,
)
from runtime.storage.records import Claim, EffectRecord, EffectRecordPage, EffectRecordStatus

# Migrations from version N to N+1, applied in one transaction when an older file is
# opened. Version 0 is a new, empty file: its "migration" creates the schema. The DDL is
# generated from the models (runtime.storage.models) into a checked-in module, so that
# SQLModel and SQLAlchemy are not imported at run time.
from runtime.storage.schema import RUNTIME_MIGRATIONS, THREAD_DDL, THREAD_MIGRATIONS

log = logging.getLogger("runtime")

T = TypeVar("T")

# Binding None (SQL NULL) to a parameter: Python 3.11's sqlite3 first looks for an adapter
# of NoneType, then asks its PrepareProtocol type for ``__adapt__``, which raises and
# clears an AttributeError with its message formatted (about 0.2 µs and 3,300 instructions
# per None; a run binds 20 to 30 across its schedule, claim, finish and run index row).
# With an adapter registered for NoneType the look-up ends at once, and the value bound is
# the same NULL. Registered for the whole process (sqlite3 keeps one registry), unless the
# application registered its own.
_NOTHING: dict[None, None] = {}
if (type(None), sqlite3.PrepareProtocol) not in sqlite3.adapters:
    # ``_NOTHING.get(None)`` is None, answered in C (a Python function would add a frame).
    sqlite3.register_adapter(type(None), _NOTHING.get)

THREAD_SCHEMA_VERSION = 10
"""``PRAGMA user_version`` of a current thread file (2: the ``messages`` table; 3: the
``effect_records`` table; 4: a run's ``key`` and ``canceled_by``; 5: the ``run_traces``
table; 6: the ``run_attempts`` table; 7: the ``schedules`` table and a run's
``schedule_id``; 8: the node that ran each attempt, ``run_attempts.node_id``; 9: fewer
pages written per run: ``run_attempts`` ``WITHOUT ROWID``, runs without a key left out of
the pending-key index; 10: fewer still: the due index holds the pending and running runs
only, the finished index the finished runs only)."""

RUNTIME_SCHEMA_VERSION = 6
"""``PRAGMA user_version`` of a current ``runtime.sqlite`` (2: ``paused_threads``; 3: the
runtime-level ``effect_records`` table, `RuntimeStore.begin_record`; 4: the run index and
``runtime_meta``; 5: a thread's ``last_activity_at``; 6: a run's ``schedule_id`` in the run
index)."""

# A thread's latest activity the registry can tell without opening its file: its creation
# and its indexed runs' latest times. Fills in rows from before version 5 (and any left
# NULL): their messages are not known until the thread's next message or run.
_BACKFILL_ACTIVITY = (
    "UPDATE threads SET last_activity_at = max(created_at, coalesce(("
    "SELECT max(max(r.created_at, coalesce(r.started_at, 0), coalesce(r.finished_at, 0))) "
    "FROM run_index r WHERE r.thread_id = threads.id), 0)) "
    "WHERE last_activity_at IS NULL"
)
_TOUCH = (
    "UPDATE threads SET last_activity_at = max(coalesce(last_activity_at, created_at), ?) "
    "WHERE id = ?"
)


_INDEX_COLUMNS = (
    "run_id, thread_id, name, status, run_at, created_at, started_at, finished_at, "
    "attempts, error, replay_of, \"key\", canceled_by, schedule_id"
)
_INDEX_COMPLETE = "run_index_complete"

_RUN_COLUMNS = (
    "seq, id, name, status, args, run_at, created_at, started_at, finished_at, "
    "attempts, error, replay_of, \"key\", canceled_by, schedule_id"
)
_SCHEDULE_COLUMNS = (
    "id, name, args, cron, timezone, every_seconds, state, next_fire_at, created_at, "
    "\"key\", occurrences, skipped, last_run_id, last_fire_at"
)
# The earliest time the thread must wake for: its earliest pending run, or the next fire
# of an active schedule.
_NEXT_WAKE = (
    "SELECT min(t) FROM (SELECT min(run_at) AS t FROM effect_runs WHERE status = 'pending' "
    "UNION ALL SELECT min(next_fire_at) FROM schedules WHERE state = 'active')"
)
_UNKNOWN = object()
_FINISHED = tuple(str(s) for s in FINISHED_STATUSES)

# The WHERE of the two partial indexes of effect_runs (thread schema 10, see
# `runtime.storage.models.EffectRunRow`), spelled as the index spells them: SQLite uses a
# partial index only for a query whose WHERE holds the same term (or, for ``IS NOT NULL``,
# a comparison of that column). Every finished run has a ``finished_at`` and no other has.
_LIVE = "(status = 'pending' OR status = 'running')"
"""ix_effect_runs_due holds the pending and running runs."""
_DONE = "finished_at IS NOT NULL"
"""ix_effect_runs_finished holds the finished runs."""

_COUNT_FINISHED = f"SELECT count(*) FROM effect_runs WHERE status IN (?, ?, ?) AND {_DONE}"
"""The thread's finished runs, hidden ones included (params: `_FINISHED`)."""

SWEEP_SECONDS = 60.0
"""On the write path, runs past their retention age are deleted at most this often per
store, and runs over ``max_finished`` once they exceed it by more than a tenth of it
(reads hide both meanwhile)."""

# The ``n`` oldest finished runs (by finished_at, then seq). One index walk per status:
# ix_effect_runs_finished is ordered (status, finished_at, seq), so none of them sorts.
_DELETE_OLDEST_FINISHED = (
    "DELETE FROM effect_runs WHERE seq IN (SELECT seq FROM ("
    + " UNION ALL ".join(
        f"SELECT * FROM (SELECT seq, finished_at FROM effect_runs WHERE status = '{status}' "
        f"AND {_DONE} ORDER BY finished_at, seq LIMIT :n)"
        for status in _FINISHED
    )
    + ") ORDER BY finished_at, seq LIMIT :n)"
)

# The (finished_at, seq) of the finished run at position :offset among the unexpired ones,
# newest first; again one index walk per status.
_NEWEST_FINISHED = (
    "SELECT finished_at, seq FROM ("
    + " UNION ALL ".join(
        f"SELECT * FROM (SELECT finished_at, seq FROM effect_runs WHERE status = '{status}' "
        f"AND finished_at >= :{'failed' if status == 'failed' else 'completed'} "
        f"ORDER BY finished_at DESC, seq DESC LIMIT :offset + 1)"
        for status in _FINISHED
    )
    + ") ORDER BY finished_at DESC, seq DESC LIMIT 1 OFFSET :offset"
)

_EXPIRED = (
    "(status IN ('completed', 'canceled') AND finished_at < ?) "
    "OR (status = 'failed' AND finished_at < ?)"
)


def _sweep_due(swept_at: float | None, now: float) -> bool:
    """Whether a write-path sweep by age is due (at most every `SWEEP_SECONDS`)."""
    return swept_at is None or now - swept_at >= SWEEP_SECONDS or now < swept_at


PAGE_SIZE_BYTES = 1024
"""Page size of a database file this runtime creates (bytes; SQLite's default is 4,096).

A commit appends every page it changed to the WAL whole (a 24-byte header, the page, a
checksum over both), and a run's commits change 5 to 6 pages of small rows (a run, its
attempt, their index entries): 1 KiB pages write a quarter of the bytes for the same
rows. Measured with `bench/bench_cpu.py` (NORMAL, 5 alternations): process CPU per
scheduled run 111 → 87 µs, per executed run 508 → 428 µs (medians); see bench/README.md,
"1 KiB pages". SQLite fixes the page size when a file is created: files made before keep
theirs (4,096) and work as before.
"""


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a write transaction
    # takes the write lock up front instead of failing on upgrade.
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    try:
        cur = conn.cursor()  # one cursor for all four (see `_transaction`)
        # Before anything writes: it applies to a new, empty file only (else a no-op).
        cur.execute(f"PRAGMA page_size={PAGE_SIZE_BYTES}")
        cur.execute("PRAGMA journal_mode=WAL")
        # FULL: an acknowledged write survives power loss; NORMAL: a process crash only.
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA foreign_keys=ON")
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate(
    conn: sqlite3.Connection, current: int, migrations: dict[int, tuple[str, ...]], what: str,
    fresh: tuple[str, ...] | None = None,
) -> None:
    """Take the file to schema version ``current``.

    A new file (version 0) gets ``fresh``, the current schema in one step, when given
    (tests/test_schema.py checks that replaying the migrations gives the same schema).
    """
    cur = conn.cursor()  # one cursor for every statement (see `_transaction`)
    version = int(cur.execute("PRAGMA user_version").fetchone()[0])
    if version > current:
        raise sqlite3.DatabaseError(
            f"{what} has schema version {version}, newer than this runtime's {current}; "
            f"upgrade thread-effects"
        )
    if version == current:
        return
    cur.execute("BEGIN IMMEDIATE")
    try:
        # Re-read under the write lock: another process may have migrated meanwhile.
        version = int(cur.execute("PRAGMA user_version").fetchone()[0])
        if version == 0 and fresh is not None:
            # Replaying every step would also run the rebuilds of later steps on empty
            # tables, and leave each connection holding the pages they touched.
            for statement in fresh:
                cur.execute(statement)
            version = current
        while version < current:
            for statement in migrations[version]:
                cur.execute(statement)
            version += 1
        cur.execute(f"PRAGMA user_version={version}")
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise


def _transaction(cur: sqlite3.Cursor, fn: Callable[[sqlite3.Cursor], T], write: bool) -> T:
    """``fn(cur)`` in one ``BEGIN IMMEDIATE`` transaction (or as a plain read).

    ``cur`` is the one cursor a store keeps for its connection, and every statement of the
    store's transactions runs through it: ``Connection.execute`` makes a cursor per statement,
    and the connection keeps a weak reference to each, pruned only every 200 cursors, so
    a busy connection holds up to 200 dead ones for the garbage collector to walk (about
    18k of a 100-thread process's 57k tracked objects). ``fn`` therefore reads each
    statement's rows before it runs the next (a statement run on the cursor ends the one
    before it), and reads what it selects to the end (``fetchall``, or ``fetchone`` of a
    query of at most one row): a statement left half-read would keep its read snapshot
    until the store's next statement.
    """
    if not write:
        return fn(cur)
    cur.execute("BEGIN IMMEDIATE")
    try:
        result = fn(cur)
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    cur.execute("COMMIT")
    return result


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
"""``json.dumps(value, separators=(",", ":"))``, without building an encoder per call."""

def _transaction_unsynced(
    cur: sqlite3.Cursor, fn: Callable[[sqlite3.Cursor], T], write: bool
) -> T:
    """`_transaction` committed at ``NORMAL`` on a ``FULL`` connection: no fsync of its own.

    The WAL frames reach the file (a process crash keeps them); the next ``FULL`` commit
    or flush of the file syncs them with its own.
    """
    cur.execute("PRAGMA synchronous=NORMAL")
    try:
        return _transaction(cur, fn, write)
    finally:
        cur.execute("PRAGMA synchronous=FULL")


_STATUS = {str(s): s for s in EffectStatus}
"""The statuses by their stored text (a look-up, cheaper than calling the enum)."""


def _row_to_run(thread_id: str, row: Sequence[Any]) -> EffectRun:
    return EffectRun(
        id=row[1],
        thread_id=thread_id,
        name=row[2],
        status=_STATUS.get(row[3]) or EffectStatus(row[3]),
        args=json.loads(row[4]) if row[4] is not None else None,
        run_at_ts=row[5],
        created_at_ts=row[6],
        started_at_ts=row[7],
        finished_at_ts=row[8],
        attempts=row[9],
        error=row[10],
        replay_of=row[11],
        key=row[12],
        canceled_by=row[13],
        schedule_id=row[14],
    )


def _row_to_schedule(thread_id: str, row: Sequence[Any]) -> Schedule:
    return Schedule(
        id=row[0],
        thread_id=thread_id,
        name=row[1],
        args=json.loads(row[2]) if row[2] is not None else None,
        recurrence=Recurrence(cron=row[3], timezone=row[4], every_seconds=row[5]),
        state=ScheduleState(row[6]),
        next_fire_at_ts=row[7],
        created_at_ts=row[8],
        key=row[9],
        occurrences=row[10],
        skipped=row[11],
        last_run_id=row[12],
        last_fire_at_ts=row[13],
    )


CHECKPOINT_WAL_BYTES = 4 * 1024 * 1024
"""A thread file's WAL is checkpointed off the committing call once
it holds this many bytes (SQLite's own automatic checkpoint: 1,000 pages of 4 KiB)."""
_CHECKPOINT_CHECK_EVERY = 32
"""Write transactions of a thread store between two looks at its WAL's size."""


class _Checkpointer:
    """One OS thread that checkpoints thread files' WALs.

    A commit then never runs a checkpoint (copying the WAL into the file and two fsyncs:
    milliseconds to hundreds of milliseconds on a busy disk): with ``NORMAL`` such a commit
    runs on the event loop; with ``FULL`` it is a schedule a caller waits for, or a drain's
    claim or finish that the thread's next due runs wait behind (SQLite's own checkpoint
    ran in about one commit in 250 of the peers' benchmark: 10,000 runs on 100 files).

    Each checkpoint is ``PRAGMA wal_checkpoint(PASSIVE)`` on a connection of its own, so it
    never waits for the store's lock nor makes a writer wait; the store stays open meanwhile
    (`SQLiteThreadStore.close` waits for a checkpoint in progress), so this connection is
    never the file's last and never removes the WAL.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[SQLiteThreadStore | None] = queue.SimpleQueue()
        self._pending: set[int] = set()  # id() of the stores queued
        self._thread: threading.Thread | None = None
        self._closed = False
        self.done = 0
        """Checkpoints run (for benchmarks and tests)."""

    def request(self, store: SQLiteThreadStore) -> None:
        if self._closed or id(store) in self._pending:
            return
        self._pending.add(id(store))
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._serve, name="thread-effects-checkpoint", daemon=True)
            self._thread.start()
        self._queue.put(store)

    def _serve(self) -> None:
        while True:
            store = self._queue.get()
            if store is None:
                return
            self._pending.discard(id(store))
            try:
                store.checkpoint_aside()
                self.done += 1
            except Exception:  # a checkpoint is an optimisation: the next commit asks again
                log.warning("checkpoint of %s failed", store.path, exc_info=True)

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(10)
            self._thread = None


class SQLiteThreadStore(ThreadStore):
    """One thread's file, ``<data_dir>/threads/<thread_id>.sqlite``."""

    def __init__(
        self, thread_id: str, path: Path, synchronous: str = "FULL", *, create: bool = False,
        node_id: str | None = None,
        checkpointer: _Checkpointer | None = None,
    ) -> None:
        """Open and migrate the file of a thread; with ``create``, make a new one.

        ``node_id`` is recorded on each attempt this store claims (`RunAttempt.node_id`).

        Raises:
            ThreadStorageError: the file is missing or empty (for an existing thread: its
                runs would silently be gone), not a database, corrupt, or has a newer
                schema. The message names the thread and the file.
        """
        self.thread_id = thread_id
        self.path = path
        self.node_id = node_id
        self._synchronous = synchronous
        self._lock = threading.Lock()
        # With a checkpointer, SQLite's automatic checkpoint is off: it would run in the
        # committing call, on the event loop with NORMAL. Held while one runs aside.
        self._checkpointer = checkpointer
        self._checkpointing = threading.Lock()
        self._writes = 0  # write transactions since the WAL's size was last looked at
        # Write-path pruning: the number of finished runs (None: unknown, counted on
        # demand) and when runs past their age were last deleted. This store is the only
        # writer of its file (one process holds the data directory).
        self._finished: int | None = None
        self._swept_at: float | None = None
        # Rows in run_traces (None: unknown, counted on demand). Most runs are scheduled
        # without a span context: then a claim need not look one up nor a finish delete it.
        self._traces: int | None = None
        self._records_swept_at: float | None = None
        # The earliest next fire of an active schedule (None: none), as this store wrote
        # it; _UNKNOWN until read. Lets `due_schedules` answer most drains without a query.
        self._next_fire: object = _UNKNOWN
        # Group commit (`finish_and_claim(..., durable=False)`): outcomes committed without
        # an fsync of their own, synced by `sync` (one fdatasync of the WAL for all of
        # them) or by the next FULL commit that writes; every read syncs them first.
        self.group_commit = synchronous == "FULL"
        self._group_commits = 0  # outcomes committed without a flush, ever (a counter)
        self._synced_commits = 0  # how many of them a flush has made durable
        self._wal_fd: int | None = None  # the -wal file, opened at the first `sync`
        # The runs this store claimed that are running, as claimed, with their args' text
        # (run id -> (run, args)): a finish returns the run from here, changed as the
        # finish changed its row, instead of the whole row through RETURNING (15 columns,
        # cursor.description built per execute, the args decoded: ≈ 8 µs of ≈ 17).
        self._claimed: dict[str, tuple[EffectRun, str | None]] = {}
        if not create and (not path.exists() or path.stat().st_size == 0):
            raise ThreadStorageError(
                thread_id,
                f"Thread {thread_id}: database {path} is missing or empty although the "
                f"thread is registered; restore the file, or delete the thread",
            )
        try:
            self._conn: sqlite3.Connection | None = _connect(path, synchronous)
            try:
                _migrate(self._conn, THREAD_SCHEMA_VERSION, THREAD_MIGRATIONS, str(path),
                         fresh=THREAD_DDL)
                # Every transaction's statements run on this one cursor (`_transaction`).
                self._cur: sqlite3.Cursor | None = self._conn.cursor()
                # A cheap read that touches the run table: a damaged header or schema fails
                # here, when the thread is opened, not in the middle of a run.
                self._cur.execute("SELECT count(*) FROM thread_meta").fetchone()
                if checkpointer is not None:
                    self._cur.execute("PRAGMA wal_autocheckpoint=0")
            except BaseException:
                self._conn.close()
                raise
        except sqlite3.DatabaseError as exc:
            raise ThreadStorageError(
                thread_id, f"Thread {thread_id}: database {path} cannot be used: {exc}"
            ) from exc

    def _tx(
        self, fn: Callable[[sqlite3.Cursor], T], *, write: bool = True, sync: bool = True
    ) -> T:
        with self._lock:
            return self._tx_held(fn, write=write, sync=sync)

    def _tx_held(
        self, fn: Callable[[sqlite3.Cursor], T], *, write: bool = True, sync: bool = True,
        shown: bool = True,
    ) -> T:
        """`_tx` with ``self._lock`` already held by the caller.

        ``sync=False`` commits a write without an fsync of its own when the store is
        ``FULL`` (``PRAGMA synchronous=NORMAL`` around it): the WAL frames reach the file
        (a process crash keeps them) and the next ``FULL`` commit of this file syncs them
        with its own (WAL is append-only, so a power cut loses a suffix, never a middle).

        A read (``write=False``) flushes outcomes a group commit left unsynced first,
        unless ``shown`` is False: a look-up of the store's own that no caller sees (the
        due time of the next pending run before a claim).
        """
        conn, cur = self._conn, self._cur
        if conn is None or cur is None:
            raise ThreadStorageError(self.thread_id, f"Thread {self.thread_id} is closed")
        unsynced = self._unsynced
        if unsynced and not write and shown:
            # No reader sees an outcome a power cut could still take back.
            self._flush_wal()
            unsynced = False
        try:
            if sync or self._synchronous != "FULL":
                changes = conn.total_changes
                result = _transaction(cur, fn, write)
                if unsynced and write:
                    # A FULL commit that wrote synced the WAL, everything before it too;
                    # one that wrote nothing did not, and a durable write promises both.
                    if conn.total_changes == changes:
                        self._flush_wal()
                    self._synced_commits = self._group_commits
            else:
                result = _transaction_unsynced(cur, fn, write)
        except BaseException as exc:
            # Rolled back: what the transaction counted is unknown again.
            self._finished = None
            self._swept_at = None
            self._next_fire = _UNKNOWN
            self._traces = None
            self._claimed.clear()
            if not isinstance(exc, sqlite3.DatabaseError):
                raise
            raise ThreadStorageError(
                self.thread_id,
                f"Thread {self.thread_id}: database {self.path} failed: {exc}",
            ) from exc
        if write and self._checkpointer is not None:
            self._writes += 1
            if self._writes >= _CHECKPOINT_CHECK_EVERY:
                self._writes = 0
                self._check_wal()
        return result

    @property
    def _unsynced(self) -> bool:
        """Whether an outcome committed without a flush is not durable yet."""
        return self._group_commits != self._synced_commits

    def _flush_wal(self) -> None:
        """Flush the file's WAL (fdatasync ; ``self._lock`` held): commits so far are durable.

        WAL is append-only and every frame carries a checksum, so one flush of the file
        makes every commit before it survive a power cut, as their own fsyncs would have.

        Raises:
            ThreadStorageError: the flush (or opening the WAL) failed.
        """
        self._fdatasync(self._wal())
        self._synced_commits = self._group_commits

    def _fdatasync(self, fd: int) -> None:
        """``os.fdatasync(fd)`` of the WAL's descriptor.

        Raises:
            ThreadStorageError: the flush failed (the error names the file).
        """
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise ThreadStorageError(
                self.thread_id, f"Thread {self.thread_id}: syncing {self.path}-wal failed: {exc}"
            ) from exc

    def _wal(self) -> int:
        """The descriptor of the WAL the connection writes now (``self._lock`` held)."""
        wal = f"{self.path}-wal"
        try:
            fd = self._wal_fd
            # SQLite removes the WAL when its last connection closes, and a new one may
            # have another inode: flush the file the connection writes now.
            if fd is None or os.fstat(fd).st_ino != os.stat(wal).st_ino:
                if fd is not None:
                    self._wal_fd = None
                    os.close(fd)
                fd = self._wal_fd = os.open(wal, os.O_RDONLY)
        except OSError as exc:
            raise ThreadStorageError(
                self.thread_id, f"Thread {self.thread_id}: syncing {wal} failed: {exc}"
            ) from exc
        return fd

    def sync(self) -> None:  # noqa: D102 - contract in base
        # The fdatasync runs without the store's lock (a claim or an outcome on the loop
        # need not wait for the disk): on a descriptor of its own, and what it makes
        # durable is what was committed before it began (`_group_commits` then).
        with self._lock:
            if not self._unsynced:
                return
            if self._conn is None:
                raise ThreadStorageError(self.thread_id, f"Thread {self.thread_id} is closed")
            commits = self._group_commits
            try:
                fd = os.dup(self._wal())
            except OSError as exc:
                raise ThreadStorageError(
                    self.thread_id, f"Thread {self.thread_id}: syncing its WAL failed: {exc}"
                ) from exc
        try:
            self._fdatasync(fd)
        finally:
            os.close(fd)
        with self._lock:
            self._synced_commits = max(self._synced_commits, commits)

    def _check_wal(self) -> None:
        try:
            size = os.stat(f"{self.path}-wal").st_size
        except OSError:
            return
        if size >= CHECKPOINT_WAL_BYTES and self._checkpointer is not None:
            self._checkpointer.request(self)

    def checkpoint_aside(self) -> None:
        """Checkpoint the file's WAL on a connection of its own (``PASSIVE``; blocking).

        Does nothing once the store is closed. Raises `sqlite3.Error` when it fails.
        """
        with self._checkpointing:
            if self._conn is None:
                return
            conn = sqlite3.connect(
                f"file:{self.path}?mode=rw", uri=True, isolation_level=None,
                check_same_thread=False, timeout=30,
            )
            try:
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            finally:
                conn.close()

    def _one(self, c: sqlite3.Cursor, sql: str, params: Sequence[Any]) -> EffectRun | None:
        """The run of a statement that selects or returns at most one, or None."""
        row = c.execute(sql, params).fetchone()
        return _row_to_run(self.thread_id, row) if row is not None else None

    def set_meta(  # noqa: D102 - contract in base
        self, key: str, value: str, *, fence: str | None = None
    ) -> None:
        self._tx(
            lambda c: c.execute(
                "INSERT INTO thread_meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )
        )

    def get_meta(self, key: str) -> str | None:  # noqa: D102 - contract in base
        row = self._tx(
            lambda c: c.execute("SELECT value FROM thread_meta WHERE key = ?", (key,)).fetchone(),
            write=False,
        )
        return None if row is None else str(row[0])

    def _prune_in(
        self, c: sqlite3.Cursor, now: float, retention: RetentionPolicy, finished: int
    ) -> int:
        """Write-path pruning inside a transaction that just finished ``finished`` runs."""
        deleted = 0
        if self._swept_at is None or now - self._swept_at >= SWEEP_SECONDS or now < self._swept_at:
            deleted += c.execute(
                f"DELETE FROM effect_runs WHERE {_EXPIRED}",
                (now - retention.completed_seconds, now - retention.failed_seconds),
            ).rowcount
            self._swept_at = now
            _records.sql_purge(
                c, older_than=_records.instant(now - retention.effect_records_seconds)
            )
            self._records_swept_at = now
        if self._finished is None:
            self._count_finished(c)
        else:
            self._finished += finished - deleted
        assert self._finished is not None
        excess = self._finished - retention.max_finished
        # Deleted in batches (a tenth of the limit), so that a busy thread does not pay a
        # delete with every finish; reads hide the excess meanwhile (see _visible).
        if excess > retention.max_finished // 10:
            removed = c.execute(_DELETE_OLDEST_FINISHED, {"n": excess}).rowcount
            self._finished -= removed
            deleted += removed
        if deleted:
            self._drop_orphan_attempts(c)
        return deleted

    def _count_finished(self, c: sqlite3.Cursor) -> int:
        if self._finished is None:
            row = c.execute(_COUNT_FINISHED, _FINISHED).fetchone()
            self._finished = int(row[0])
        return self._finished

    def insert_run(  # noqa: D102 - contract in base
        self, run: EffectRun, *, hand_off_from: str | None = None, replay_once: bool = False
    ) -> EffectRun | None:
        def tx(c: sqlite3.Cursor) -> EffectRun | None:
            if replay_once and run.replay_of is not None:
                replay = self._one(
                    c, f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE replay_of = ? "
                    f"ORDER BY seq LIMIT 1", (run.replay_of,))
                if replay is not None:
                    return replay
            if run.key is not None:
                rows = c.execute(
                    f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE \"key\" = ? "
                    f"AND {_LIVE} ORDER BY status, seq",
                    (run.key,),
                ).fetchall()
                for row in rows:  # 'pending' sorts first: a successor wins over its link
                    live = _row_to_run(self.thread_id, row)
                    if live.status is EffectStatus.PENDING or live.id != hand_off_from:
                        return live
            self._insert_run_in(c, run)
            return None

        return self._tx(tx)

    def _insert_run_in(self, c: sqlite3.Cursor, run: EffectRun) -> None:
        args = _COMPACT_JSON.encode(run.args) if run.args is not None else None
        c.execute(
            "INSERT INTO effect_runs (id, name, status, args, run_at, created_at, "
            "attempts, replay_of, \"key\", schedule_id) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
            (run.id, run.name, str(run.status), args, run.run_at_ts, run.created_at_ts,
             run.replay_of, run.key, run.schedule_id),
        )
        if run.trace_context is not None:
            traces = self._count_traces(c)
            c.execute(
                "INSERT INTO run_traces (run_id, context) VALUES (?, ?)",
                (run.id, run.trace_context),
            )
            self._traces = traces + 1

    # ------------------------------------------------------ recurring schedules

    def _schedule(self, c: sqlite3.Cursor, schedule_id: str) -> Schedule | None:
        row = c.execute(
            f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE id = ?", (schedule_id,)
        ).fetchone()
        return None if row is None else _row_to_schedule(self.thread_id, row)

    def _refresh_next_fire(self, c: sqlite3.Cursor) -> None:
        row = c.execute(
            "SELECT min(next_fire_at) FROM schedules WHERE state = 'active'"
        ).fetchone()
        self._next_fire = row[0]

    def insert_schedule(self, schedule: Schedule) -> Schedule | None:  # noqa: D102
        args = (
            json.dumps(schedule.args, separators=(",", ":")) if schedule.args is not None
            else None
        )
        rec = schedule.recurrence

        def tx(c: sqlite3.Cursor) -> Schedule | None:
            if schedule.key is not None:
                row = c.execute(
                    f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE \"key\" = ?",
                    (schedule.key,),
                ).fetchone()
                if row is not None:
                    return _row_to_schedule(self.thread_id, row)
            c.execute(
                f"INSERT INTO schedules ({_SCHEDULE_COLUMNS}) "
                f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, NULL)",
                (schedule.id, schedule.name, args, rec.cron, rec.timezone, rec.every_seconds,
                 str(schedule.state), schedule.next_fire_at_ts, schedule.created_at_ts,
                 schedule.key),
            )
            self._refresh_next_fire(c)
            return None

        return self._tx(tx)

    def get_schedule(self, schedule_id: str) -> Schedule | None:  # noqa: D102
        return self._tx(lambda c: self._schedule(c, schedule_id), write=False)

    def list_schedules(self) -> list[Schedule]:  # noqa: D102
        rows = self._tx(
            lambda c: c.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules ORDER BY seq"
            ).fetchall(),
            write=False,
        )
        return [_row_to_schedule(self.thread_id, r) for r in rows]

    def set_schedule_state(  # noqa: D102
        self, schedule_id: str, state: ScheduleState, next_fire_at: float | None
    ) -> Schedule | None:
        def tx(c: sqlite3.Cursor) -> Schedule | None:
            c.execute(
                "UPDATE schedules SET state = ?, next_fire_at = ? WHERE id = ?",
                (str(state), next_fire_at, schedule_id),
            )
            self._refresh_next_fire(c)
            return self._schedule(c, schedule_id)

        return self._tx(tx)

    def delete_schedule(self, schedule_id: str) -> Schedule | None:  # noqa: D102
        def tx(c: sqlite3.Cursor) -> Schedule | None:
            found = self._schedule(c, schedule_id)
            if found is not None:
                c.execute("DELETE FROM schedules WHERE id = ?", (schedule_id,))
                self._refresh_next_fire(c)
            return found

        return self._tx(tx)

    def due_schedules(self, now: float) -> list[Schedule]:  # noqa: D102
        known = self._next_fire
        if known is None or (isinstance(known, float | int) and known > now):
            return []
        rows = self._tx(
            lambda c: c.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE state = 'active' "
                f"AND next_fire_at <= ? ORDER BY next_fire_at, seq",
                (now,),
            ).fetchall(),
            write=False,
        )
        if not rows and known is _UNKNOWN:
            self._tx(self._refresh_next_fire, write=False)
        return [_row_to_schedule(self.thread_id, r) for r in rows]

    def next_schedule_fire(self) -> float | None:  # noqa: D102
        if self._next_fire is _UNKNOWN:
            self._tx(self._refresh_next_fire, write=False)
        fire = self._next_fire
        return fire if isinstance(fire, float | int) else None

    def fire_schedule(  # noqa: D102
        self,
        schedule_id: str,
        fire_at: float,
        run: EffectRun | None,
        skipped: int,
        last_fire_at: float,
        next_fire_at: float | None,
    ) -> tuple[Schedule | None, EffectRun | None]:
        def tx(c: sqlite3.Cursor) -> tuple[Schedule | None, EffectRun | None]:
            current = self._schedule(c, schedule_id)
            if (
                current is None
                or current.state is not ScheduleState.ACTIVE
                or current.next_fire_at_ts != fire_at
            ):
                return current, None
            stored = None
            if run is not None:
                self._insert_run_in(c, replace(run, schedule_id=schedule_id))
                stored = self._with_trace(c, self._one(
                    c, f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE id = ?", (run.id,)
                ))
            c.execute(
                "UPDATE schedules SET occurrences = occurrences + ?, "
                "last_run_id = coalesce(?, last_run_id), skipped = skipped + ?, "
                "last_fire_at = ?, next_fire_at = ? WHERE id = ?",
                (0 if run is None else 1, None if run is None else run.id, skipped,
                 last_fire_at, next_fire_at, schedule_id),
            )
            self._refresh_next_fire(c)
            return self._schedule(c, schedule_id), stored

        return self._tx(tx)

    def _count_traces(self, c: sqlite3.Cursor) -> int:
        if self._traces is None:
            self._traces = int(c.execute("SELECT count(*) FROM run_traces").fetchone()[0])
        return self._traces

    def _with_trace(self, c: sqlite3.Cursor, run: EffectRun | None) -> EffectRun | None:
        if run is None or run.status.finished or not self._count_traces(c):
            return run
        row = c.execute("SELECT context FROM run_traces WHERE run_id = ?", (run.id,)).fetchone()
        return replace(run, trace_context=row[0]) if row is not None else run

    @staticmethod
    def _end_attempt(
        c: sqlite3.Cursor, run: EffectRun, outcome: str, at: float, error: str | None
    ) -> None:
        c.execute(
            "UPDATE run_attempts SET ended_at = ?, outcome = ?, error = ? "
            "WHERE run_id = ? AND attempt = ?",
            (at, outcome, error, run.id, run.attempts),
        )

    def run_attempts(self, run_id: str) -> list[RunAttempt]:  # noqa: D102
        rows = self._tx(
            lambda c: c.execute(
                "SELECT attempt, started_at, ended_at, outcome, error, node_id FROM run_attempts "
                "WHERE run_id = ? ORDER BY attempt", (run_id,),
            ).fetchall(),
            write=False,
        )
        return [RunAttempt(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    @staticmethod
    def _drop_orphan_attempts(c: sqlite3.Cursor) -> None:
        c.execute(
            "DELETE FROM run_attempts WHERE run_id NOT IN (SELECT id FROM effect_runs)"
        )

    def _drop_trace(self, c: sqlite3.Cursor, run: EffectRun | None) -> None:
        if run is not None and self._count_traces(c):
            deleted = c.execute("DELETE FROM run_traces WHERE run_id = ?", (run.id,)).rowcount
            self._traces = self._count_traces(c) - deleted

    def finish_and_claim(  # noqa: D102 - contract in base
        self,
        finish: Finish | None,
        now: float,
        *,
        claim: bool = True,
        retention: RetentionPolicy | None = None,
        only_names: Collection[str] | None = None,
        durable: bool = True,
    ) -> tuple[EffectRun | None, EffectRun | None, float | None]:
        with self._lock:
            return self._finish_and_claim(finish, now, claim, retention, only_names,
                                          durable)

    def claim_inline(  # noqa: D102 - contract in base
        self, now: float
    ) -> tuple[EffectRun | None, EffectRun | None, float | None] | None:
        # Cheap whenever the store is free: the claim commits without an fsync (see
        # `_tx_held`), and a probe that finds nothing due writes nothing. A storage thread
        # holding the lock (a listing, a schedule's fsync) would make the loop wait: no.
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._finish_and_claim(None, now, True, None, None)
        finally:
            self._lock.release()

    def finish_inline(  # noqa: D102 - contract in base
        self, finish: Finish, now: float, *, retention: RetentionPolicy | None = None
    ) -> tuple[EffectRun | None, EffectRun | None, float | None] | None:
        # Under FULL the commit goes at NORMAL and nothing here waits for the disk: cheap
        # when the store is free, as under NORMAL (where the runtime makes such calls on
        # the loop anyway, `Runtime.run_short`).
        if not self.group_commit or not self._lock.acquire(blocking=False):
            return None
        try:
            return self._finish_and_claim(finish, now, True, retention, None,
                                          durable=False, flush=False)
        finally:
            self._lock.release()

    def _finish(self, c: sqlite3.Cursor, finish: Finish) -> EffectRun | None:
        """Write ``finish`` if its run is running (in its attempt); the run as written.

        The run comes from `_claimed` when this store claimed it (its row then holds what
        the claim returned, and the finish's columns), its args decoded again from their
        text (nothing shares them with the claimed run's); else from its row.
        """
        row = c.execute(
            "UPDATE effect_runs SET status = ?, error = ?, finished_at = ?, "
            "canceled_by = ? WHERE id = ? AND status = 'running' "
            "AND attempts = coalesce(?, attempts) RETURNING attempts",
            (str(finish.status), finish.error, finish.finished_at, finish.canceled_by,
             finish.run_id, finish.attempt),
        ).fetchone()
        # Taken out either way: a finish that wrote nothing (fenced) ends that claim too.
        claimed = self._claimed.pop(finish.run_id, None)
        if row is None:
            return None
        if claimed is None or claimed[0].attempts != row[0]:
            return self._one(
                c, f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE id = ?", (finish.run_id,))
        run, args = claimed
        return replace_run(
            run, status=finish.status, error=finish.error, finished_at_ts=finish.finished_at,
            canceled_by=finish.canceled_by, trace_context=None,
            args=json.loads(args) if args is not None else None,
        )

    def _finish_and_claim(
        self,
        finish: Finish | None,
        now: float,
        claim: bool,
        retention: RetentionPolicy | None,
        only_names: Collection[str] | None,
        durable: bool = True,
        flush: bool = True,
    ) -> tuple[EffectRun | None, EffectRun | None, float | None]:
        """`finish_and_claim` with ``self._lock`` held (``flush=False``: `finish_inline`).

        A claim alone (no finish) commits without an fsync of its own under ``FULL``: a
        process crash keeps it; a power cut may lose it together with everything after it
        (the next ``FULL`` commit of the file, at the latest the run's finish, syncs it),
        and then the run is pending again with that attempt uncounted. The finish, and with
        it the outcome every frame and caller saw, is synced before it is published:
        in this commit, or (``durable=False`` under ``FULL``) by `sync`, a later commit
        that writes, or the next read.
        """
        names: tuple[str, ...] = ()
        where = ""
        if only_names is not None:
            names = tuple(only_names)
            if not names:
                # Nothing may be claimed; a finish is still recorded.
                if finish is None:
                    return None, None, None
                claim = False
            where = f" AND name IN ({','.join('?' * len(names))})"
        wake_sql = (
            _NEXT_WAKE if only_names is None
            else f"SELECT min(run_at) FROM effect_runs WHERE status = 'pending'{where}"
        )

        def tx(c: sqlite3.Cursor) -> tuple[EffectRun | None, EffectRun | None, float | None]:
            finished = None
            if finish is not None:
                finished = self._finish(c, finish)
                self._drop_trace(c, finished)
                if finished is not None:
                    self._end_attempt(c, finished, str(finished.status), finish.finished_at,
                                      finish.error)
                if retention is not None and finished is not None:
                    self._prune_in(c, now, retention, 1)
            if not claim:
                return finished, None, None
            row = c.execute(
                f"UPDATE effect_runs SET status = 'running', attempts = attempts + 1, "
                f"started_at = ? WHERE seq = (SELECT seq FROM effect_runs "
                f"WHERE status = 'pending' AND run_at <= ?{where} ORDER BY run_at, seq LIMIT 1) "
                f"RETURNING {_RUN_COLUMNS}",
                (now, now, *names),
            ).fetchone()
            claimed = None
            if row is not None:
                claimed = self._with_trace(c, _row_to_run(self.thread_id, row))
                assert claimed is not None
                self._claimed[claimed.id] = (claimed, row[4])
                c.execute(
                    "INSERT OR REPLACE INTO run_attempts (run_id, attempt, started_at, "
                    "outcome, node_id) VALUES (?, ?, ?, 'running', ?)",
                    (claimed.id, claimed.attempts, now, self.node_id),
                )
            next_due = None
            if claimed is None:
                row = c.execute(wake_sql, names).fetchone()
                next_due = row[0]
            return finished, claimed, next_due

        if finish is None and claim:
            # Nothing to write unless something is due: probe first without taking the
            # write lock (and without a commit, hence no fsync).
            row = self._tx_held(
                lambda c: c.execute(
                    f"SELECT min(run_at) FROM effect_runs WHERE status = 'pending'{where}",
                    names,
                ).fetchone(),
                write=False,
                shown=False,
            )
            if row[0] is None or row[0] > now:
                if only_names is None:
                    if self._next_fire is _UNKNOWN:
                        self._tx_held(self._refresh_next_fire, write=False, shown=False)
                    fire = self._next_fire
                    if isinstance(fire, float | int):
                        return None, None, fire if row[0] is None else min(row[0], fire)
                return None, None, row[0]
        if finish is None or durable or not self.group_commit:
            answer = self._tx_held(tx, sync=finish is not None)
        else:
            answer = self._tx_held(tx, sync=False)
            self._group_commits += 1
        if self._unsynced and flush and finish is not None and (durable or answer[1] is None):
            # Durable, or the caller's group ends here (nothing claimed): sync it all now.
            self._flush_wal()
        return answer

    def recover_interrupted(  # noqa: D102 - contract in base
        self,
        now: float,
        max_attempts: int,
        run_ids: Sequence[str] | None = None,
        *,
        retention: RetentionPolicy | None = None,
        dead_nodes_only: bool = False,
        reason: str | None = None,
    ) -> list[EffectRun]:
        def tx(c: sqlite3.Cursor) -> list[EffectRun]:
            if run_ids is None:
                rows = c.execute(
                    "SELECT id, attempts, seq FROM effect_runs WHERE status = 'running'"
                ).fetchall()
            else:
                marks = ",".join("?" * len(run_ids))
                rows = c.execute(
                    f"SELECT id, attempts, seq FROM effect_runs WHERE status = 'running' "
                    f"AND id IN ({marks})",
                    tuple(run_ids),
                ).fetchall()
            changed: list[EffectRun] = []
            order = {row[0]: row[2] for row in rows}
            for run_id, attempts, _seq in rows:
                if attempts >= max_attempts:
                    sql = (
                        f"UPDATE effect_runs SET status = 'failed', finished_at = ?, error = ? "
                        f"WHERE id = ? RETURNING {_RUN_COLUMNS}"
                    )
                    params: tuple[Any, ...] = (
                        now, interrupted_error(attempts, max_attempts, reason), run_id)
                else:
                    sql = (
                        f"UPDATE effect_runs SET status = 'pending', run_at = min(run_at, ?) "
                        f"WHERE id = ? RETURNING {_RUN_COLUMNS}"
                    )
                    params = (now, run_id)
                run = self._one(c, sql, params)
                if run is not None:
                    self._claimed.pop(run.id, None)
                    self._end_attempt(c, run, "interrupted", now, reason)
                    if run.status.finished:
                        self._drop_trace(c, run)
                    changed.append(run)
            if retention is not None:
                failed = sum(1 for r in changed if r.status is EffectStatus.FAILED)
                self._prune_in(c, now, retention, failed)
            changed.sort(key=lambda r: order[r.id])
            return changed

        if run_ids is not None and not run_ids:
            return []
        return self._tx(tx)

    def cancel(  # noqa: D102
        self,
        run_id: str,
        now: float,
        *,
        retention: RetentionPolicy | None = None,
        canceled_by: str | None = None,
    ) -> EffectRun | None:
        def tx(c: sqlite3.Cursor) -> EffectRun | None:
            run = self._one(
                c,
                f"UPDATE effect_runs SET status = 'canceled', finished_at = ?, canceled_by = ? "
                f"WHERE id = ? AND status = 'pending' RETURNING {_RUN_COLUMNS}",
                (now, canceled_by, run_id),
            )
            self._drop_trace(c, run)
            if run is not None and retention is not None:
                self._prune_in(c, now, retention, 1)
            return run

        return self._tx(tx)

    def run_now(self, run_id: str, now: float) -> EffectRun | None:  # noqa: D102
        return self._tx(
            lambda c: self._one(
                c,
                f"UPDATE effect_runs SET run_at = min(run_at, ?) "
                f"WHERE id = ? AND status = 'pending' RETURNING {_RUN_COLUMNS}",
                (now, run_id),
            )
        )

    def _visible(
        self, c: sqlite3.Cursor, now: float, retention: RetentionPolicy
    ) -> tuple[str, tuple[Any, ...]]:
        """The read-side retention filter: what a read may return.

        A run past its retention age is never returned, even before it is deleted; nor is
        a finished run beyond the ``max_finished`` most recent (unexpired) ones, which the
        write path deletes in batches.
        """
        cutoffs = (now - retention.completed_seconds, now - retention.failed_seconds)
        sql, params = f"NOT ({_EXPIRED})", cutoffs
        if self._count_finished(c) <= retention.max_finished:
            return sql, params
        # The oldest of the max_finished most recent unexpired finished runs.
        row = c.execute(
            _NEWEST_FINISHED,
            {"completed": cutoffs[0], "failed": cutoffs[1], "offset": retention.max_finished - 1},
        ).fetchone()
        if row is None:
            return sql, params
        return (
            f"{sql} AND (status NOT IN (?, ?, ?) OR (finished_at, seq) >= (?, ?))",
            (*params, *_FINISHED, row[0], row[1]),
        )

    def get_run(  # noqa: D102
        self, run_id: str, now: float, retention: RetentionPolicy
    ) -> EffectRun | None:
        def read(c: sqlite3.Cursor) -> EffectRun | None:
            visible, params = self._visible(c, now, retention)
            return self._with_trace(c, self._one(
                c,
                f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE id = ? AND {visible}",
                (run_id, *params),
            ))

        return self._tx(read, write=False)

    def list_runs(  # noqa: D102
        self,
        now: float,
        retention: RetentionPolicy,
        *,
        statuses: Sequence[EffectStatus] | None = None,
        name: str | None = None,
        limit: int = 50,
        before_seq: int | None = None,
    ) -> tuple[list[EffectRun], int | None]:
        where: list[str] = []
        params: list[Any] = []
        if statuses:
            where.append(f"status IN ({','.join('?' * len(statuses))})")
            params.extend(str(s) for s in statuses)
            # Lets SQLite use the partial index that holds every run asked for.
            if all(s.finished for s in statuses):
                where.append(_DONE)
            elif not any(s.finished for s in statuses):
                where.append(_LIVE)
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if before_seq is not None:
            where.append("seq < ?")
            params.append(before_seq)
        params.append(limit + 1)

        def read(c: sqlite3.Cursor) -> list[Any]:
            visible, vparams = self._visible(c, now, retention)
            sql = (
                f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE "
                f"{' AND '.join([visible, *where])} ORDER BY seq DESC LIMIT ?"
            )
            return c.execute(sql, (*vparams, *params)).fetchall()

        rows = self._tx(read, write=False)
        runs = [_row_to_run(self.thread_id, r) for r in rows[:limit]]
        cursor = rows[limit - 1][0] if len(rows) > limit else None
        return runs, cursor

    def count_runs(  # noqa: D102
        self, now: float, retention: RetentionPolicy, *, name: str | None = None
    ) -> dict[EffectStatus, int]:
        def read(c: sqlite3.Cursor) -> list[Any]:
            # The unfinished runs and the visible finished ones, each counted over the
            # partial index that holds them (retention hides finished runs only).
            visible, params = self._visible(c, now, retention)
            named = "" if name is None else " AND name = ?"
            sql = (
                f"SELECT status, count(*) FROM effect_runs WHERE {_LIVE}{named} "
                f"GROUP BY status UNION ALL "
                f"SELECT status, count(*) FROM effect_runs WHERE {_DONE} "
                f"AND status IN (?, ?, ?) AND {visible}{named} GROUP BY status"
            )
            by_name = () if name is None else (name,)
            return c.execute(sql, (*by_name, *_FINISHED, *params, *by_name)).fetchall()

        rows = self._tx(read, write=False)
        counts = dict.fromkeys(EffectStatus, 0)
        for status, n in rows:
            counts[EffectStatus(status)] = n
        return counts

    def pending_runs(self, name: str | None = None) -> list[EffectRun]:  # noqa: D102
        sql = f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE status = 'pending'"
        params: tuple[Any, ...] = ()
        if name is not None:
            sql += " AND name = ?"
            params = (name,)
        sql += " ORDER BY run_at, seq"
        rows = self._tx(lambda c: c.execute(sql, params).fetchall(), write=False)
        return [_row_to_run(self.thread_id, r) for r in rows]

    def prune(self, now: float, retention: RetentionPolicy) -> int:  # noqa: D102
        def count_excess(c: sqlite3.Cursor) -> int:
            row = c.execute(_COUNT_FINISHED, _FINISHED).fetchone()
            return int(row[0]) - retention.max_finished

        def expired(c: sqlite3.Cursor) -> bool:
            row = c.execute(
                f"SELECT 1 FROM effect_runs WHERE {_EXPIRED} LIMIT 1",
                (now - retention.completed_seconds, now - retention.failed_seconds),
            ).fetchone()
            return row is not None

        records_cutoff = _records.instant(now - retention.effect_records_seconds)

        def old_records(c: sqlite3.Cursor) -> bool:
            row = c.execute(
                "SELECT 1 FROM effect_records WHERE updated_at < ? LIMIT 1",
                (records_cutoff.timestamp(),),
            ).fetchone()
            return row is not None

        # Reads first: the common case deletes nothing and then takes no write lock.
        if not self._tx(
            lambda c: count_excess(c) > 0 or expired(c) or old_records(c), write=False
        ):
            return 0

        def tx(c: sqlite3.Cursor) -> int:
            self._finished = None  # counted afresh by the next finishing transaction
            _records.sql_purge(c, older_than=records_cutoff)
            self._records_swept_at = now
            deleted = c.execute(
                f"DELETE FROM effect_runs WHERE {_EXPIRED}",
                (now - retention.completed_seconds, now - retention.failed_seconds),
            ).rowcount
            excess = count_excess(c)
            if excess > 0:
                deleted += c.execute(_DELETE_OLDEST_FINISHED, {"n": excess}).rowcount
            if deleted:
                self._drop_orphan_attempts(c)
            return deleted

        return self._tx(tx)

    def registered_ids(self) -> set[str]:
        """The id of every registered thread (start-up checks)."""
        rows = self._tx(lambda c: c.execute("SELECT id FROM threads").fetchall(), write=False)
        return {r[0] for r in rows}

    def close(self) -> None:  # noqa: D102
        # A checkpoint running aside ends first: its connection must not be the last.
        with self._checkpointing, self._lock:
            if self._conn is not None:
                if self._unsynced:
                    # Closing the file's last connection checkpoints it (with its own
                    # syncs); flush first anyway, so that no close leaves one behind.
                    with contextlib.suppress(ThreadStorageError):
                        self._flush_wal()
                self._conn.close()
                self._conn = self._cur = None
                self._claimed.clear()
            if self._wal_fd is not None:
                os.close(self._wal_fd)
                self._wal_fd = None

    def remove_files(self) -> None:
        """Close and delete the file with its WAL and shared-memory companions."""
        self.close()
        _remove_thread_files(self.path)

    # ------------------------------------------------------------ effect records

    def get_effect_record(self, key: str) -> EffectRecord | None:  # noqa: D102
        return self._tx(lambda c: _records.sql_get(c, self.thread_id, key), write=False)

    def begin_effect_record(  # noqa: D102
        self,
        key: str,
        *,
        tool_name: str,
        run_id: str | None,
        owner: str,
        lease_seconds: float,
        now: float,
        retention: RetentionPolicy | None = None,
    ) -> Claim:
        _records.check_lease(lease_seconds)

        def tx(c: sqlite3.Cursor) -> Claim:
            claim = _records.sql_begin(
                c, self.thread_id, key, tool_name=tool_name, run_id=run_id, owner=owner,
                lease_seconds=lease_seconds, now=now,
            )
            if retention is not None and _sweep_due(self._records_swept_at, now):
                _records.sql_purge(
                    c, older_than=_records.instant(now - retention.effect_records_seconds)
                )
                self._records_swept_at = now
            return claim

        return self._tx(tx)

    def complete_effect_record(  # noqa: D102
        self, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        return self._tx(lambda c: _records.sql_complete(
            c, self.thread_id, key, owner=owner, result_json=result_json, now=now,
            status=status,
        ))

    def renew_effect_record(  # noqa: D102
        self, key: str, *, owner: str, lease_seconds: float, now: float
    ) -> bool:
        _records.check_lease(lease_seconds)
        renewed: bool = self._tx(lambda c: _records.sql_renew(
            c, self.thread_id, key, owner=owner, lease_seconds=lease_seconds, now=now))
        return renewed

    def release_effect_record(self, key: str, *, owner: str) -> EffectRecord | None:  # noqa: D102
        def tx(c: sqlite3.Cursor) -> EffectRecord | None:
            record = _records.sql_get(c, self.thread_id, key)
            if record is None or not _records.sql_release(c, self.thread_id, key, owner=owner):
                return None
            return record

        return self._tx(tx)

    def list_effect_records(  # noqa: D102
        self,
        *,
        status: EffectRecordStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        _records.check_limit(limit)
        if cursor is not None:
            _records.decode_cursor(cursor)
        return self._tx(
            lambda c: _records.sql_list(c, self.thread_id, status=status, limit=limit,
                                        cursor=cursor, hide_journal=True),
            write=False,
        )

    def expire_effect_leases(self, *, keep_owner_prefix: str, now: float) -> int:  # noqa: D102
        return self._tx(lambda c: _records.sql_expire_leases(
            c, self.thread_id, keep_owner_prefix=keep_owner_prefix, now=now
        ))

    def purge_effect_records(self, *, older_than: float | None) -> int:  # noqa: D102
        if older_than is None:
            return self._tx(lambda c: _records.sql_purge_thread(c, self.thread_id))
        cutoff = _records.instant(older_than)
        return self._tx(lambda c: _records.sql_purge(c, older_than=cutoff))

    # ------------------------------------------------------------ messages

    def insert_messages(  # noqa: D102 - contract in base
        self, messages: Sequence[Message], *, fence: str | None = None
    ) -> None:

        def tx(c: sqlite3.Cursor) -> None:
            c.executemany(
                "INSERT INTO messages (id, role, content, created_at, run_id, meta, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (m.id, str(m.role), m.content, m.created_at_ts, m.run_id, m.meta_json(),
                     m.data)
                    for m in messages
                ],
            )

        if messages:
            self._tx(tx)

    def _message(self, row: Sequence[Any]) -> Message:
        return message_from_row(
            self.thread_id, id=row[1], role=row[2], content=row[3], created_at_ts=row[4],
            run_id=row[5], meta=row[6], data=row[7],
        )

    def list_messages(  # noqa: D102
        self,
        *,
        limit: int = 50,
        after_id: str | None = None,
        before_id: str | None = None,
        latest: bool = False,
    ) -> tuple[list[Message], str | None, str | None] | None:

        def seq_of(c: sqlite3.Cursor, message_id: str) -> int | None:
            row = c.execute("SELECT seq FROM messages WHERE id = ?", (message_id,)).fetchone()
            return None if row is None else int(row[0])

        def read(c: sqlite3.Cursor) -> tuple[list[Message], str | None, str | None] | None:
            if before_id is not None or latest:
                before: int | None = None
                if before_id is not None:
                    before = seq_of(c, before_id)
                    if before is None:
                        return None
                if before is None:
                    cursor = c.execute(
                        f"SELECT {_MESSAGE_COLUMNS} FROM messages ORDER BY seq DESC LIMIT ?",
                        (limit + 1,),
                    )
                else:
                    cursor = c.execute(
                        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE seq < ? "
                        "ORDER BY seq DESC LIMIT ?",
                        (before, limit + 1),
                    )
                rows = cursor.fetchall()
                page = [self._message(r) for r in reversed(rows[:limit])]
                older = len(rows) > limit
                newer = before is not None  # the message it was asked to page back from
                return (
                    page,
                    page[-1].id if page and newer else None,
                    page[0].id if page and older else None,
                )
            after = 0
            if after_id is not None:
                found = seq_of(c, after_id)
                if found is None:
                    return None
                after = found
            rows = c.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, limit + 1),
            ).fetchall()
            page = [self._message(r) for r in rows[:limit]]
            return (
                page,
                page[-1].id if len(rows) > limit else None,
                page[0].id if page and after_id is not None else None,
            )

        return self._tx(read, write=False)

    def get_message(self, message_id: str) -> Message | None:  # noqa: D102
        row = self._tx(
            lambda c: c.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
            ).fetchone(),
            write=False,
        )
        return self._message(row) if row is not None else None

    def all_messages(self) -> list[Message]:  # noqa: D102
        rows = self._tx(
            lambda c: c.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages ORDER BY seq"
            ).fetchall(),
            write=False,
        )
        return [self._message(r) for r in rows]


_MESSAGE_COLUMNS = "seq, id, role, content, created_at, run_id, meta, data"

_THREAD_COLUMNS = (
    "id, created_at, agent_id, user_id, tags, "
    "EXISTS (SELECT 1 FROM paused_threads p WHERE p.thread_id = threads.id), "
    "coalesce(last_activity_at, created_at)"
)


class SQLiteRuntimeStore(RuntimeStore):
    """``<data_dir>/runtime.sqlite``: the registry and the alarm index."""

    def __init__(self, path: Path, synchronous: str = "FULL") -> None:
        """Open (creating if needed) and migrate the runtime database.

        Raises:
            sqlite3.DatabaseError: the runtime database is unusable; the runtime cannot
                start without it.
        """
        self.path = path
        self._lock = threading.Lock()
        self._synchronous = synchronous
        self._conn: sqlite3.Connection | None = _connect(path, synchronous)
        # Every transaction's statements run on this one cursor (`_transaction`).
        self._cur: sqlite3.Cursor | None = self._conn.cursor()
        before = int(self._cur.execute("PRAGMA user_version").fetchone()[0])
        _migrate(self._conn, RUNTIME_SCHEMA_VERSION, RUNTIME_MIGRATIONS, str(path))
        if before == 0:  # a new database: its (empty) index holds every run there is
            self.set_run_index_complete(True)
        elif before < RUNTIME_SCHEMA_VERSION:
            self._tx(lambda c: c.execute(_BACKFILL_ACTIVITY))

    def _tx(self, fn: Callable[[sqlite3.Cursor], T], *, write: bool = True) -> T:
        with self._lock:
            cur = self._cur
            if cur is None:
                raise RuntimeClosed(f"The runtime store {self.path} is closed")
            return _transaction(cur, fn, write)

    def _derived_tx(self, fn: Callable[[sqlite3.Cursor], None]) -> None:
        """A write of derived data (the run index): committed without an fsync of its own.

        The run index is rebuilt from the thread files whenever a start finds it not marked
        complete, and that mark is written ``FULL`` (False at every start, True only after
        the final flush of a clean close or a rebuild). So an index batch lost by a power
        cut is rebuilt, and it need not wait for the disk. With ``synchronous=FULL`` the
        batch commits at ``NORMAL``: its frames are appended to the WAL, and the next
        ``FULL`` commit on this file (an alarm row, a registry change, the mark) syncs them
        with its own; a process crash loses nothing committed either way, and the database
        stays consistent after a power cut (SQLite's guarantee for WAL at ``NORMAL``). Every
        other write of this store stays ``FULL``: an alarm row or a registered thread that
        was acknowledged survives a power cut. The batches then no longer queue their
        fsyncs (hundreds of KiB every `runtime.run_index.FLUSH_SECONDS`) in front of the
        thread files' commits that callers wait for.
        """
        if self._synchronous != "FULL":
            self._tx(fn)
            return
        with self._lock:
            cur = self._cur
            if cur is None:
                raise RuntimeClosed(f"The runtime store {self.path} is closed")
            _transaction_unsynced(cur, fn, True)

    @staticmethod
    def _info(row: Sequence[Any]) -> ThreadInfo:
        return ThreadInfo(
            id=row[0], created_at_ts=row[1], agent_id=row[2], user_id=row[3],
            # Tags were once stored unchecked; a lone surrogate would make every thread
            # list unanswerable, so an old row's is shown as U+FFFD.
            tags=tuple(replace_lone_surrogates(t) for t in json.loads(row[4])),
            paused=bool(row[5]),
            last_activity_ts=row[6],
        )

    def add_thread(  # noqa: D102
        self, info: ThreadInfo, *, alarm_at: float | None = None
    ) -> bool:
        def tx(c: sqlite3.Cursor) -> bool:
            cur = c.execute(
                "INSERT INTO threads (id, created_at, agent_id, user_id, tags, "
                "last_activity_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING",
                (info.id, info.created_at_ts, info.agent_id, info.user_id,
                 json.dumps(list(info.tags)), info.created_at_ts),
            )
            if cur.rowcount != 1:
                return False
            if alarm_at is not None:
                c.execute(
                    "INSERT INTO alarms (thread_id, due_at) VALUES (?, ?) ON CONFLICT"
                    "(thread_id) DO UPDATE SET due_at = min(due_at, excluded.due_at)",
                    (info.id, alarm_at),
                )
            return True

        return self._tx(tx)

    def get_thread(self, thread_id: str) -> ThreadInfo | None:  # noqa: D102
        row = self._tx(
            lambda c: c.execute(
                f"SELECT {_THREAD_COLUMNS} FROM threads WHERE id = ?",
                (thread_id,),
            ).fetchone(),
            write=False,
        )
        return self._info(row) if row is not None else None

    def list_threads(  # noqa: D102
        self, limit: int, after: tuple[float, str] | None, query: ThreadQuery | None = None
    ) -> tuple[list[ThreadInfo], tuple[float, str] | None]:
        query = query or ThreadQuery()
        # Rows always hold last_activity_at (set when added, filled in by the upgrade), so
        # the order uses ix_threads_activity as it is.
        key = "last_activity_at" if query.by_activity else "created_at"
        parts: list[str] = []
        params: list[Any] = []
        for column, value in (("user_id", query.user_id), ("agent_id", query.agent_id)):
            if value is not None:
                parts.append(f"{column} = ?")
                params.append(value)
        if query.tag is not None:
            parts.append("EXISTS (SELECT 1 FROM json_each(threads.tags) WHERE value = ?)")
            params.append(query.tag)
        if after is not None:
            parts.append(f"({key}, id) < (?, ?)")
            params += [after[0], after[1]]
        sql = f"SELECT {_THREAD_COLUMNS} FROM threads"
        if parts:
            sql += " WHERE " + " AND ".join(parts)
        sql += f" ORDER BY {key} DESC, id DESC LIMIT ?"
        rows = self._tx(lambda c: c.execute(sql, (*params, limit + 1)).fetchall(), write=False)
        infos = [self._info(r) for r in rows[:limit]]
        cursor = None
        if len(rows) > limit:
            last = infos[-1]
            ts = last.last_activity_ts if query.by_activity else last.created_at_ts
            cursor = (ts if ts is not None else last.created_at_ts, last.id)
        return infos, cursor

    def touch_threads(self, activity: Mapping[str, float]) -> dict[str, float]:  # noqa: D102
        if activity:
            rows = [(ts, tid) for tid, ts in activity.items()]
            self._tx(lambda c: c.executemany(_TOUCH, rows))
        return {}  # one process holds the file: nothing is ever busy

    def set_paused(self, thread_id: str, paused: bool) -> bool:  # noqa: D102
        def tx(c: sqlite3.Cursor) -> bool:
            if c.execute("SELECT 1 FROM threads WHERE id = ?", (thread_id,)).fetchone() is None:
                return False
            if paused:
                c.execute(
                    "INSERT INTO paused_threads (thread_id) VALUES (?) ON CONFLICT DO NOTHING",
                    (thread_id,),
                )
            else:
                c.execute("DELETE FROM paused_threads WHERE thread_id = ?", (thread_id,))
            return True

        return self._tx(tx)

    def delete_thread(  # noqa: D102 - contract in base
        self, thread_id: str, *, frame: FrameDraft | None = None, now: float = 0.0,
        notify: tuple[str, str] | None = None,
    ) -> bool:
        del frame, now, notify  # no cluster bus: nothing to announce

        def tx(c: sqlite3.Cursor) -> bool:
            c.execute("DELETE FROM alarms WHERE thread_id = ?", (thread_id,))
            c.execute("DELETE FROM paused_threads WHERE thread_id = ?", (thread_id,))
            c.execute("DELETE FROM run_index WHERE thread_id = ?", (thread_id,))
            return c.execute("DELETE FROM threads WHERE id = ?", (thread_id,)).rowcount == 1

        return self._tx(tx)

    # ------------------------------------------------------------ run index

    def index_runs(self, runs: Sequence[EffectRun]) -> dict[str, float]:  # noqa: D102
        if not runs:
            return {}
        rows = [
            (r.id, r.thread_id, r.name, str(r.status), r.run_at_ts, r.created_at_ts,
             r.started_at_ts, r.finished_at_ts, r.attempts, r.error, r.replay_of, r.key,
             r.canceled_by, r.schedule_id)
            for r in runs
        ]
        latest: dict[str, float] = {}
        for r in runs:
            ts = max(r.created_at_ts, r.started_at_ts or 0.0, r.finished_at_ts or 0.0)
            latest[r.thread_id] = max(ts, latest.get(r.thread_id, ts))

        def tx(c: sqlite3.Cursor) -> None:
            c.executemany(
                f"INSERT INTO run_index ({_INDEX_COLUMNS}, user_id) "
                f"SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, t.user_id "
                f"FROM threads t WHERE t.id = ?2 "
                f"ON CONFLICT(run_id) DO UPDATE SET status = excluded.status, "
                f"run_at = excluded.run_at, started_at = excluded.started_at, "
                f"finished_at = excluded.finished_at, attempts = excluded.attempts, "
                f"error = excluded.error, canceled_by = excluded.canceled_by",
                rows,
            )
            c.executemany(_TOUCH, [(ts, tid) for tid, ts in latest.items()])

        self._derived_tx(tx)
        return {}

    @staticmethod
    def _where(
        query: RunQuery, now: float, retention: RetentionPolicy, *, statuses: bool = True
    ) -> tuple[str, list[Any]]:
        parts = [f"NOT ({_EXPIRED})"]
        params: list[Any] = [now - retention.completed_seconds, now - retention.failed_seconds]
        if statuses and query.statuses is not None:
            parts.append(f"status IN ({','.join('?' * len(query.statuses))})")
            params += [str(s) for s in query.statuses]
        for column, value in (("name", query.name), ("thread_id", query.thread_id)):
            if value is not None:
                parts.append(f"{column} = ?")
                params.append(value)
        if query.since is not None:
            parts.append("run_at >= ?")
            params.append(query.since)
        if query.until is not None:
            parts.append("run_at < ?")
            params.append(query.until)
        if query.user_id is not None:
            parts.append("user_id = ?")  # the thread's, copied into the row
            params.append(query.user_id)
        if query.tag is not None:
            parts.append(
                "EXISTS (SELECT 1 FROM threads t, json_each(t.tags) "
                "WHERE t.id = run_index.thread_id AND json_each.value = ?)"
            )
            params.append(query.tag)
        if query.replayed is not None:
            # A replay is a run of the same thread: ix_run_index_thread keeps this cheap.
            parts.append(
                ("" if query.replayed else "NOT ")
                + "EXISTS (SELECT 1 FROM run_index r WHERE r.thread_id = run_index.thread_id "
                "AND r.replay_of = run_index.run_id)"
            )
        return " AND ".join(parts), params

    def list_indexed_runs(  # noqa: D102
        self,
        query: RunQuery,
        now: float,
        retention: RetentionPolicy,
        limit: int,
        before: tuple[float, str] | None = None,
    ) -> tuple[list[EffectRun], tuple[float, str] | None]:
        where, params = self._where(query, now, retention)
        if before is not None:
            where += " AND (created_at, run_id) < (?, ?)"
            params += [before[0], before[1]]
        sql = (
            f"SELECT {_INDEX_COLUMNS} FROM run_index WHERE {where} "
            f"ORDER BY created_at DESC, run_id DESC LIMIT ?"
        )
        rows = self._tx(lambda c: c.execute(sql, (*params, limit + 1)).fetchall(), write=False)
        runs = [
            EffectRun(
                id=r[0], thread_id=r[1], name=r[2], status=EffectStatus(r[3]), args=None,
                run_at_ts=r[4], created_at_ts=r[5], started_at_ts=r[6], finished_at_ts=r[7],
                attempts=r[8], error=r[9], replay_of=r[10], key=r[11],
                canceled_by=r[12], schedule_id=r[13],
            )
            for r in rows[:limit]
        ]
        cursor = (runs[-1].created_at_ts, runs[-1].id) if len(rows) > limit else None
        return runs, cursor

    def count_indexed_runs(  # noqa: D102
        self, query: RunQuery, now: float, retention: RetentionPolicy
    ) -> dict[EffectStatus, int]:
        where, params = self._where(query, now, retention, statuses=False)
        rows = self._tx(
            lambda c: c.execute(
                f"SELECT status, count(*) FROM run_index WHERE {where} GROUP BY status",
                params,
            ).fetchall(),
            write=False,
        )
        counts = dict.fromkeys(EffectStatus, 0)
        for status, n in rows:
            counts[EffectStatus(status)] = int(n)
        return counts

    def prune_run_index(self, now: float, retention: RetentionPolicy) -> int:  # noqa: D102
        deleted = 0

        def tx(c: sqlite3.Cursor) -> None:
            nonlocal deleted
            deleted = c.execute(
                f"DELETE FROM run_index WHERE {_EXPIRED}",
                (now - retention.completed_seconds, now - retention.failed_seconds),
            ).rowcount

        # A prune lost by a power cut leaves expired entries that reads hide anyway.
        self._derived_tx(tx)
        return deleted

    def run_index_complete(self) -> bool:  # noqa: D102
        row = self._tx(
            lambda c: c.execute(
                "SELECT value FROM runtime_meta WHERE key = ?", (_INDEX_COMPLETE,)
            ).fetchone(),
            write=False,
        )
        return row is not None and row[0] == "1"

    def set_run_index_complete(self, complete: bool) -> None:  # noqa: D102
        self._tx(
            lambda c: c.execute(
                "INSERT INTO runtime_meta (key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (_INDEX_COMPLETE, "1" if complete else "0"),
            )
        )

    def set_alarm(self, thread_id: str, due_at: float | None) -> None:  # noqa: D102
        if due_at is None:
            self._tx(lambda c: c.execute("DELETE FROM alarms WHERE thread_id = ?", (thread_id,)))
        else:
            self._tx(
                lambda c: c.execute(
                    "INSERT INTO alarms (thread_id, due_at) VALUES (?, ?) "
                    "ON CONFLICT(thread_id) DO UPDATE SET due_at = excluded.due_at",
                    (thread_id, due_at),
                )
            )

    def lower_alarm(self, thread_id: str, due_at: float) -> None:  # noqa: D102
        self._tx(
            lambda c: c.execute(
                "INSERT INTO alarms (thread_id, due_at) VALUES (?, ?) "
                "ON CONFLICT(thread_id) DO UPDATE SET due_at = min(due_at, excluded.due_at)",
                (thread_id, due_at),
            )
        )

    def move_alarms(  # noqa: D102
        self, changes: Sequence[tuple[str, float | None, float | None]]
    ) -> list[tuple[str, float | None]]:
        def tx(c: sqlite3.Cursor) -> list[tuple[str, float | None]]:
            applied: list[tuple[str, float | None]] = []
            for thread_id, expected, target in changes:
                if expected is None:
                    if target is None:
                        continue
                    # No row known: only ever lower (or create) one.
                    c.execute(
                        "INSERT INTO alarms (thread_id, due_at) VALUES (?, ?) ON CONFLICT"
                        "(thread_id) DO UPDATE SET due_at = min(due_at, excluded.due_at)",
                        (thread_id, target),
                    )
                    continue
                # Compare-and-set: a row lowered meanwhile (a new run) is left alone.
                if target is None:
                    cur = c.execute(
                        "DELETE FROM alarms WHERE thread_id = ? AND due_at = ?",
                        (thread_id, expected),
                    )
                else:
                    cur = c.execute(
                        "UPDATE alarms SET due_at = ? WHERE thread_id = ? AND due_at = ?",
                        (target, thread_id, expected),
                    )
                if cur.rowcount == 1:
                    applied.append((thread_id, target))
            return applied

        return self._tx(tx)

    def get_record(self, scope: str, key: str) -> EffectRecord | None:  # noqa: D102
        return self._tx(lambda c: _records.sql_get(c, scope, key), write=False)

    def begin_record(  # noqa: D102
        self, scope: str, key: str, *, tool_name: str, run_id: str | None, owner: str,
        lease_seconds: float, now: float,
    ) -> Claim:
        return self._tx(lambda c: _records.sql_begin(
            c, scope, key, tool_name=tool_name, run_id=run_id, owner=owner,
            lease_seconds=lease_seconds, now=now,
        ))

    def complete_record(  # noqa: D102
        self, scope: str, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus,
    ) -> EffectRecord:
        return self._tx(lambda c: _records.sql_complete(
            c, scope, key, owner=owner, result_json=result_json, now=now, status=status,
        ))

    def renew_record(  # noqa: D102
        self, scope: str, key: str, *, owner: str, lease_seconds: float, now: float
    ) -> bool:
        _records.check_lease(lease_seconds)
        renewed: bool = self._tx(lambda c: _records.sql_renew(
            c, scope, key, owner=owner, lease_seconds=lease_seconds, now=now))
        return renewed

    def release_record(self, scope: str, key: str, *, owner: str) -> bool:  # noqa: D102
        return self._tx(lambda c: _records.sql_release(c, scope, key, owner=owner))

    def list_records(  # noqa: D102
        self, scope: str, *, status: EffectRecordStatus | None = None, limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        _records.check_limit(limit)
        if cursor is not None:
            _records.decode_cursor(cursor)
        return self._tx(lambda c: _records.sql_list(c, scope, status=status, limit=limit,
                                                    cursor=cursor), write=False)

    def delete_records(self, scope: str) -> int:  # noqa: D102
        return self._tx(lambda c: _records.sql_purge_thread(c, scope))

    def purge_records(self, *, older_than: float) -> int:  # noqa: D102
        return self._tx(lambda c: _records.sql_purge(c, older_than=_records.instant(older_than)))

    def load_alarms(self, until: float | None = None) -> list[tuple[str, float]]:  # noqa: D102
        rows = self._tx(
            lambda c: c.execute("SELECT thread_id, due_at FROM alarms").fetchall()
            if until is None else
            c.execute("SELECT thread_id, due_at FROM alarms WHERE due_at < ?",
                      (until,)).fetchall(),
            write=False,
        )
        return [(r[0], r[1]) for r in rows]

    def registered_ids(self) -> set[str]:
        """The id of every registered thread (start-up checks)."""
        rows = self._tx(lambda c: c.execute("SELECT id FROM threads").fetchall(), write=False)
        return {r[0] for r in rows}

    def close(self) -> None:  # noqa: D102
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = self._cur = None




_THREAD_FILE_RE = re.compile(r"([A-Za-z0-9_-]{1,64})\.sqlite(?:-wal|-shm|-journal)?")
"""A thread's file name in ``threads/`` (the id pattern of `runtime.ids`); nothing else
there is ever removed."""


def _remove_thread_files(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")


class SQLiteBackend(StorageBackend):
    """The embedded backend: a data directory of SQLite files, for one process at a time.

    Args:
        data_dir: The data directory (created if missing).
        synchronous: SQLite ``synchronous`` for every database: ``FULL`` (an acknowledged
            write survives power loss) or ``NORMAL`` (a process crash only).
    """

    kind = "sqlite"

    def __init__(self, data_dir: str | os.PathLike[str], synchronous: str = "FULL") -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        self.data_dir = Path(data_dir)
        self.synchronous = synchronous
        # NORMAL: a commit appends to the WAL without an fsync (tens of µs), less than the
        # hand-off to a storage thread and back costs.
        self.short_calls_inline = synchronous == "NORMAL"
        # No commit runs a checkpoint (on the loop with NORMAL; in a call that a caller or
        # a drain waits for with FULL): thread files' WALs are checkpointed on a thread of
        # their own.
        self._checkpointer: _Checkpointer | None = _Checkpointer()
        self._lock_file: IO[str] | None = None

    @property
    def threads_dir(self) -> Path:
        """``<data_dir>/threads``, one ``<thread_id>.sqlite`` per thread."""
        return self.data_dir / "threads"

    @property
    def runtime_path(self) -> Path:
        """``<data_dir>/runtime.sqlite``: the registry and the alarm index."""
        return self.data_dir / "runtime.sqlite"

    def thread_path(self, thread_id: str) -> Path:
        """The database file of a thread.

        Raises:
            InvalidThreadId: the id would not be a plain file name in ``threads/``.
        """
        return self.threads_dir / f"{validate_thread_id(thread_id)}.sqlite"

    def open(self) -> SQLiteRuntimeStore:  # noqa: D102 - contract in base
        self._lock_data_dir()
        try:
            store = self._open_runtime_db()
        except BaseException:
            self.close()
            raise
        try:
            self._discard_orphans(store)
        except BaseException:
            store.close()
            self.close()
            raise
        return store

    def _lock_data_dir(self) -> None:
        if self._lock_file is not None:
            raise DataDirLocked(
                f"Data directory {self.data_dir} is already open in this backend; "
                f"one process per data directory"
            )
        self.threads_dir.mkdir(parents=True, exist_ok=True)
        lock_path = self.data_dir / "runtime.lock"
        handle = open(lock_path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise DataDirLocked(
                f"Data directory {self.data_dir} is in use by {holder}; "
                f"one process per data directory"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        self._lock_file = handle

    def _discard_orphans(self, store: SQLiteRuntimeStore) -> None:
        # A crash between a delete's registry commit and the file's removal (or during a
        # create) leaves a thread file that no registry row names: nothing can reach it.
        registered = store.registered_ids()
        orphans: set[str] = set()
        for entry in os.scandir(self.threads_dir):
            match = _THREAD_FILE_RE.fullmatch(entry.name)
            if match is not None and match.group(1) not in registered:
                orphans.add(match.group(1))
        for thread_id in sorted(orphans):
            log.warning("removing %s: a thread file with no registry entry (left by a "
                        "crash during a create or delete)", self.thread_path(thread_id))
            _remove_thread_files(self.thread_path(thread_id))

    def _open_runtime_db(self) -> SQLiteRuntimeStore:
        path = self.runtime_path
        if not path.exists() or path.stat().st_size == 0:
            orphans = sum(1 for _ in self.threads_dir.glob("*.sqlite"))
            if orphans:
                # Starting would silently forget every thread and its pending runs.
                raise RuntimeStorageError(
                    f"Runtime database {path} is missing or empty, but {self.threads_dir} "
                    f"holds {orphans} thread files; restore {path.name} from a backup, "
                    f"or move the thread files away to start empty"
                )
        try:
            return SQLiteRuntimeStore(path, self.synchronous)
        except sqlite3.DatabaseError as exc:
            raise RuntimeStorageError(f"Runtime database {path} cannot be used: {exc}") from exc

    def create_thread_store(self, info: ThreadInfo) -> SQLiteThreadStore:  # noqa: D102
        path = self.thread_path(info.id)
        # A file without a registry row is left over from a crash during create or
        # delete: it belongs to no thread, so it is discarded.
        _remove_thread_files(path)
        try:
            store = SQLiteThreadStore(info.id, path, self.synchronous, create=True,
                                      node_id=self.node_id, checkpointer=self._checkpointer)
        except BaseException:
            _remove_thread_files(path)
            raise
        try:
            store.set_meta("thread_id", info.id)
            store.set_meta("created_at", repr(info.created_at_ts))
        except BaseException:
            store.remove_files()
            raise
        return store

    def open_thread_store(self, thread_id: str) -> SQLiteThreadStore:  # noqa: D102
        return SQLiteThreadStore(thread_id, self.thread_path(thread_id), self.synchronous,
                                 node_id=self.node_id, checkpointer=self._checkpointer)

    def remove_thread_store(self, thread_id: str) -> None:  # noqa: D102
        _remove_thread_files(self.thread_path(thread_id))

    def close(self) -> None:  # noqa: D102
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = _Checkpointer()
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None
