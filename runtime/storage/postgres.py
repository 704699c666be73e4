"""The PostgreSQL backend: every thread's store and the runtime's tables in one database.

Select it with ``Runtime(..., database_url="postgresql://user@host:5432/db")`` (the server:
``--database-url`` or ``THREAD_EFFECTS_DATABASE_URL``); SQLite stays the default. Needs the
``postgres`` extra (psycopg 3 and psycopg_pool): ``pip install "thread-effects[postgres]"``.
``import runtime`` never imports psycopg; only this module does.

Layout (docs/scale-out.md): one table per model of `runtime.storage.models`, generated from
the models into `runtime.storage.pg_schema`. Every table of a thread's store holds the rows
of every thread and carries ``thread_id`` as the first column of its primary key, unique
constraints and indexes (the registry's key is the thread id itself), so that Citus can
distribute each table by it. ``schema_version`` holds the schema version; a database of a
newer version than this code knows is refused.

Connections come from a `psycopg_pool.ConnectionPool`; every contract method is one
transaction on one pooled connection, called from the runtime's storage threads (the
contract is synchronous, as for SQLite). Several processes ("nodes") may use one schema
at once: `PostgresBackend.open` takes a session advisory lock on its node id (a second live
process with that id is refused) and registers a lease in the ``nodes`` table, renewed on a
connection of its own; a run is claimed under the thread's row lock, and its outcome is
fenced by its attempt (docs/scale-out.md, "Nodes and leases").
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import re
import select
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn, Self, TypeVar
from urllib.parse import urlsplit

from runtime._text import replace_lone_surrogates
from runtime.config import RetentionPolicy
from runtime.effects import FINISHED_STATUSES, EffectRun, EffectStatus, RunAttempt
from runtime.errors import (
    DatabaseUnavailable,
    DataDirLocked,
    RuntimeClosed,
    RuntimeStorageError,
    ThreadExists,
    ThreadNotFound,
    ThreadStorageError,
    TurnLeaseLost,
)
from runtime.ids import THREAD_ID_RE, validate_thread_id
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
from runtime.storage.pg_schema import MIGRATIONS, SCHEMA_VERSION, THREAD_TABLES
from runtime.storage.records import (
    Claim,
    EffectRecord,
    EffectRecordPage,
    EffectRecordStatus,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

    Cursor = psycopg.Cursor[tuple[Any, ...]]

log = logging.getLogger("runtime")

T = TypeVar("T")


_NUL = "\x00"
NUL_MARK = "\x01nul\x01"
"""Prefix of a stored text that was escaped because PostgreSQL text cannot hold NUL.

A text column cannot hold U+0000, which SQLite and the memory backend store as given; so a
string holding NUL (or starting with this mark, to keep the mapping one-to-one) is written
as the mark followed by its JSON form (``"a\\u0000b"``) and read back as the original.
Other strings are written unchanged, so equality and prefix filters on them still work.
"""


def escape_nul(text: str) -> str:
    """``text`` as stored: unchanged unless it holds NUL or starts with `NUL_MARK`."""
    if _NUL in text or text.startswith(NUL_MARK):
        return NUL_MARK + json.dumps(text)
    return text


def unescape_nul(text: str) -> str:
    """The string `escape_nul` stored as ``text``."""
    if text.startswith(NUL_MARK):
        value = json.loads(text[len(NUL_MARK):])
        if isinstance(value, str):
            return value
    return text


@functools.cache
def _adapters() -> Any:
    """The psycopg adapters with every str parameter escaped and every text column unescaped."""
    import psycopg
    from psycopg.adapt import AdaptersMap, Buffer
    from psycopg.types.string import (
        StrBinaryDumper,
        StrDumperUnknown,
        TextBinaryLoader,
        TextLoader,
    )

    class NulStrBinaryDumper(StrBinaryDumper):
        def dump(self, obj: str) -> Buffer | None:
            return super().dump(escape_nul(obj))

    class NulStrDumper(StrDumperUnknown):
        def dump(self, obj: str) -> Buffer | None:
            return super().dump(escape_nul(obj))

    class NulTextLoader(TextLoader):
        def load(self, data: Buffer) -> bytes | str:
            value = super().load(data)
            return unescape_nul(value) if isinstance(value, str) else value

    class NulTextBinaryLoader(TextBinaryLoader):
        def load(self, data: Buffer) -> bytes | str:
            value = super().load(data)
            return unescape_nul(value) if isinstance(value, str) else value

    adapters = AdaptersMap(psycopg.adapters)
    # Binary first, text last: the last registered is the default (as psycopg does).
    adapters.register_dumper(str, NulStrBinaryDumper)
    adapters.register_dumper(str, NulStrDumper)
    for name in ("text", "varchar"):
        adapters.register_loader(name, NulTextLoader)
        adapters.register_loader(name, NulTextBinaryLoader)
    return adapters


@contextmanager
def _plain_transaction(
    conn: psycopg.Connection[tuple[Any, ...]], first: bytes | None = None,
) -> Iterator[list[str]]:
    """One transaction on an autocommit connection: ``BEGIN``, the block, ``COMMIT``.

    As ``conn.transaction()`` without savepoint bookkeeping: ``BEGIN`` and ``COMMIT`` go
    through libpq directly (a blocking call in C, the GIL released), where psycopg's
    transaction block cost about a tenth of a short transaction's client CPU. If the
    block raises, the transaction is rolled back (`psycopg.Connection.rollback`, which
    also forgets the statements prepared in it) and the error goes on.

    ``first``: a parameterless query (`_lock_threads_sql`) sent with the ``BEGIN`` in
    the same round trip (the simple query protocol runs each statement of a string
    with a snapshot of its own, as separate calls would); the block gets the first
    column of its rows, decoded (empty without ``first``).

    Raises:
        psycopg.Error: ``BEGIN``, ``first`` or ``COMMIT`` failed (the connection lost, a
            deferred check), or the block's own error.
    """
    try:
        if first is None:
            _command(conn, b"BEGIN")
            rows: list[str] = []
        else:
            rows = _command_rows(conn, b"BEGIN; " + first)
        yield rows
    except BaseException:
        if not conn.broken:
            with contextlib.suppress(Exception):
                conn.rollback()
        raise
    _command(conn, b"COMMIT")


def _readable(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    """Whether ``conn``'s socket has something to read now (no wait); True if it is gone."""
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, _db_error()):
        return True


def _command(conn: psycopg.Connection[tuple[Any, ...]], command: bytes) -> None:
    """Run a parameterless command through libpq; raise its error as psycopg does."""
    from psycopg import pq

    result = conn.pgconn.exec_(command)
    if result.status != pq.ExecStatus.COMMAND_OK:
        _raise_from(conn, result)


def _command_rows(conn: psycopg.Connection[tuple[Any, ...]], query: bytes) -> list[str]:
    """Run parameterless ``query`` through libpq; its last statement's first column.

    Raises:
        psycopg.Error: a statement failed (the ones after it did not run).
    """
    from psycopg import pq

    result = conn.pgconn.exec_(query)
    if result.status != pq.ExecStatus.TUPLES_OK:
        _raise_from(conn, result)
    encoding = conn.info.encoding
    return [bytes(result.get_value(i, 0) or b"").decode(encoding)
            for i in range(result.ntuples)]


def _raise_from(conn: psycopg.Connection[tuple[Any, ...]], result: Any) -> NoReturn:
    from psycopg import errors, pq

    if conn.pgconn.status == pq.ConnStatus.BAD:
        raise errors.OperationalError(
            f"the connection was lost: {pq.error_message(conn.pgconn)}")
    raise errors.error_from_result(result, encoding=conn.info.encoding)


def _lock_threads_sql(thread_ids: Sequence[str], *, skip_locked: bool) -> bytes | None:
    """The parameterless statement locking the rows of ``thread_ids`` ``FOR NO KEY UPDATE``.

    In id order; ``skip_locked``: rows another transaction holds are left out (the
    statement never waits). Its rows are the ids of the rows it locked. For
    `_plain_transaction`'s ``first``: the ids are written in as literals, which only ids
    that `THREAD_ID_RE` accepts (letters, digits, ``_`` and ``-``) make safe; None when
    one is not such an id (the caller then locks with a statement of its own).
    """
    if not all(THREAD_ID_RE.match(t) for t in thread_ids):
        return None
    ids = ",".join(f"'{t}'" for t in thread_ids)
    where = f"id = {ids}" if len(thread_ids) == 1 else f"id IN ({ids}) ORDER BY id"
    skip = " SKIP LOCKED" if skip_locked else ""
    return (f"{_CLAIM_PLANS}; "
            f"SELECT id FROM threads WHERE {where} FOR NO KEY UPDATE{skip}").encode()


_CLAIM_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"
"""Sent with a claim transaction's ``BEGIN`` (`_lock_threads_sql`): its prepared statements
use their generic plans. Left to choose, the server planned the claim statements anew on
every call (a custom plan for each call's arrays, no cheaper than the generic one): for a
claim group (`_CLAIM_GROUP`) ≈ 1.5 ms of server CPU per call, more than it took to run.
Measured with ``bench/bench_pg_statements.py`` (bench/README.md, "Generic plans for the
claims"): server CPU per executed run 865 → 555 µs, the group's planning 321 → 33 µs per
run. Only for the claim transactions, whose statements all select by thread id; other
statements (listings across threads, whose best plan depends on the filter's values) keep
the server's choice."""


_KEY_RACE_TRIES = 3
"""How many times `PostgresThreadStore.insert_run` makes a keyed insert that lost a race
for its key to another node's insert of the same moment (each try then sees that run)."""


def _pending_key_taken(exc: BaseException) -> bool:
    """Whether ``exc`` (a `ThreadStorageError`) comes from the pending-key unique index.

    That index keeps one pending run per key: another transaction stored one first.
    """
    from psycopg import errors

    cause = exc.__cause__
    return isinstance(cause, errors.UniqueViolation) and \
        cause.diag.constraint_name == "ix_effect_runs_pending_key"


def _db_error() -> type[Exception]:
    """`psycopg.Error`, imported when first needed (in a storage thread, never at import).

    Constructing a backend happens on the event loop (`runtime.Runtime`); psycopg is
    imported by `PostgresBackend.open`, which the runtime calls from a storage thread.
    """
    import psycopg

    return psycopg.Error

_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_RUN_COLUMNS = (
    "seq, id, name, status, args, run_at, created_at, started_at, finished_at, "
    "attempts, error, replay_of, key, canceled_by, schedule_id"
)
_INDEX_COLUMNS = (
    "run_id, thread_id, name, status, run_at, created_at, started_at, finished_at, "
    "attempts, error, replay_of, key, canceled_by, schedule_id"
)
_INDEX_UPSERT = (
    "ON CONFLICT (thread_id, run_id) DO UPDATE SET status = excluded.status, "
    "run_at = excluded.run_at, started_at = excluded.started_at, "
    "finished_at = excluded.finished_at, attempts = excluded.attempts, "
    "error = excluded.error, canceled_by = excluded.canceled_by "
)
"""An index row's upsert: what a later write of a run's entry replaces (a run's name, key,
thread and creation never change)."""
_INDEX_RUNS = (
    f"INSERT INTO run_index ({_INDEX_COLUMNS}, user_id) "
    f"SELECT u.*, t.user_id FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], "
    f"%b::float8[], %b::float8[], %b::float8[], %b::float8[], %b::bigint[], %b::text[], "
    f"%b::text[], %b::text[], %b::text[], %b::text[]) AS u({_INDEX_COLUMNS}) "
    f"JOIN threads t ON t.id = u.thread_id ORDER BY u.thread_id, u.run_id "
    f"FOR KEY SHARE OF t {_INDEX_UPSERT}"
    f"WHERE run_index.status NOT IN ('completed', 'failed', 'canceled') "
    f"OR excluded.status IN ('completed', 'failed', 'canceled')"
)
"""Index entries of runs, one statement: arrays of each `_INDEX_COLUMNS` column (one
element per run, unique (thread, run), sorted by them); a run whose thread is not
registered is skipped. The threads' rows are locked ``FOR KEY SHARE`` until the batch
commits: a deletion of one of them (which locks its row ``FOR UPDATE`` before it removes the
thread's entries, `PostgresRuntimeStore.delete_thread`) either waits for the batch and
removes its entries, or commits first and the batch, having waited for it, skips the
thread (under READ COMMITTED a locked row that was deleted meanwhile is left out). Without
the lock a batch overlapping a deletion committed entries of a thread no longer registered,
listed as ``pending`` for good and inherited by a thread created again with that id.
Claims and activity updates lock the rows ``FOR NO KEY UPDATE``, which a key-share lock
does not conflict with, so batches and claims never wait for each other. An entry in a
final status (completed, failed, canceled: final for good, a replay is a new run) is never
replaced by a pending or running one: nodes write
their batches after their own commits, so a batch of the node that scheduled a run can
arrive after the batch of the node that ran it to its end."""
_STORED_RUNS = (
    "(SELECT e.id AS run_id, e.thread_id, t.user_id, e.name, e.status, e.run_at, "
    "e.created_at, e.started_at, e.finished_at, e.attempts, e.error, e.replay_of, e.key, "
    "e.canceled_by, e.schedule_id FROM effect_runs e JOIN threads t ON t.id = e.thread_id) "
    "AS run_index"
)
"""The runs table in the shape of the run index (registered threads' runs only), named as
it so that the index's filters apply: read where a change committed by another node must
show at once (`list_stored_runs`). A filter on ``thread_id`` walks that thread's part of
the table; others scan it."""
_SCHEDULE_COLUMNS = (
    "id, name, args, cron, timezone, every_seconds, state, next_fire_at, created_at, "
    "key, occurrences, skipped, last_run_id, last_fire_at"
)
_MESSAGE_COLUMNS = "seq, id, role, content, created_at, run_id, meta, data"
_THREAD_COLUMNS = (
    "id, created_at, agent_id, user_id, tags, "
    "EXISTS (SELECT 1 FROM paused_threads p WHERE p.thread_id = threads.id), "
    "coalesce(last_activity_at, created_at)"
)
_TOUCH = (
    "WITH u AS (SELECT * FROM unnest(%b::text[], %b::float8[]) AS u(id, ts)), "
    "l AS (SELECT t.id, u.ts FROM threads t JOIN u ON t.id = u.id ORDER BY t.id "
    "FOR NO KEY UPDATE OF t SKIP LOCKED), "
    "w AS (UPDATE threads SET last_activity_at = GREATEST(coalesce(last_activity_at, "
    "created_at), l.ts) FROM l WHERE threads.id = l.id RETURNING threads.id) "
    "SELECT u.id, u.ts FROM u, (SELECT set_config('synchronous_commit', 'off', true)) s "
    "WHERE NOT EXISTS (SELECT 1 FROM w WHERE w.id = u.id) "
    "AND EXISTS (SELECT 1 FROM threads t WHERE t.id = u.id)"
)
"""Move threads' activity forward, one statement for all (arrays of ids and times, ids
unique); answers the ids and times it left for later. The rows are locked in id order,
skipping any row another transaction holds: a claim locks its thread's row for its
transaction (`PostgresThreadStore.finish_and_claim`), and an activity update that waited
for it made the next claims wait behind it in turn (a batch of 100 threads' rows took
17.6 ms per statement and a claim's lock 0.7 ms, `bench_pg_statements.py`). A skipped
row's activity is written by a later batch (`RuntimeStore.touch_threads`' answer). It
runs as a transaction of its own, committed without waiting for the WAL flush
(``synchronous_commit`` off for it alone), so the rows it locked are free again at once:
the activity time is derived data (a server crash may lose the last move, which the next
activity of the thread makes again)."""
_FINISHED = tuple(str(s) for s in FINISHED_STATUSES)

_NEW_RUN_COLUMNS = (
    "thread_id, id, name, status, args, run_at, created_at, attempts, replay_of, key, "
    "schedule_id"
)
_NEW_RUN_VALUES = (
    "%(t)s, %(id)s, %(name)s, %(status)s, %(args)s, %(run_at)s, %(created_at)s, 0, "
    "%(replay_of)s, %(key)s, %(schedule_id)s"
)


@functools.cache
def _insert_run_sql(*, keyed: bool, trace: bool, wake: bool) -> str:
    """A run's insert as one statement (its own transaction: one round trip, one commit).

    It answers one row: with ``keyed``, the live run holding the key (the first pending
    one, else a running one other than ``%(hand_off)s``; 'pending' sorts first, so a
    successor wins over the running run it hands off from), which is then returned
    instead of inserting the run (all columns null if none); nothing is inserted either
    when the thread has no registry row (deleted); with ``trace``, the run's
    trace context is inserted too; with ``wake``, the wake-up `PostgresClusterBus.wake_in`
    would send is sent (``%(channel)s``, ``%(payload)s``) if the run was inserted. Its
    last column is the frame number the run's ``scheduled`` frame takes (the thread's
    ``frame_counters`` row raised by one in the same statement: `ThreadStore.frame_seq`),
    null when nothing was inserted.
    """
    # Only into a registered thread: a node that missed another's deletion of the thread
    # (its listening connection down) must not acknowledge a run that nothing would run.
    # (A CTE, read first, so that the server types %(t)s as the column it is compared to.)
    # Locked (``FOR KEY SHARE``, until the commit) so that a deletion committing meanwhile
    # cannot miss the run: it either waits for this commit and removes the run with the
    # thread's rows, or commits first and this statement, having waited, inserts nothing.
    ctes = ["reg AS (SELECT 1 FROM threads WHERE id = %(t)s FOR KEY SHARE)"]
    registered = "EXISTS (SELECT 1 FROM reg)"
    if keyed:
        ctes.append(
            f"live AS (SELECT {_RUN_COLUMNS} FROM effect_runs WHERE thread_id = %(t)s "
            f"AND key = %(key)s AND status IN ('pending', 'running') AND (status = "
            f"'pending' OR id IS DISTINCT FROM %(hand_off)s) ORDER BY status, seq LIMIT 1)")
        values = (f"SELECT {_NEW_RUN_VALUES} WHERE NOT EXISTS (SELECT 1 FROM live) "
                  f"AND {registered}")
    else:
        values = f"SELECT {_NEW_RUN_VALUES} WHERE {registered}"
    ctes.append(f"ins AS (INSERT INTO effect_runs ({_NEW_RUN_COLUMNS}) {values} "
                f"RETURNING id, thread_id)")
    ctes.append(f"fc AS ({_TAKE_FRAME_SEQ})")
    if trace:
        ctes.append("tr AS (INSERT INTO run_traces (thread_id, run_id, context) "
                    "SELECT %(t)s, id, %(trace)s FROM ins)")
    # The thread's alarm row, at or before the new run whatever any node believes of it
    # (`RuntimeStore.alarms_follow_runs`). The conflict locks the row even when it is
    # left as it is, so a concurrent raise (`move_alarms`, which locks it first) either
    # sees this run or is seen by this statement.
    ctes.append("al AS (INSERT INTO alarms (thread_id, due_at) SELECT %(t)s, %(run_at)s "
                "FROM ins ON CONFLICT (thread_id) DO UPDATE SET due_at = excluded.due_at "
                "WHERE alarms.due_at > excluded.due_at)")
    # A SELECT in WITH runs only where the statement reads it: the last column does.
    if wake:
        ctes.append("wk AS (SELECT 1 FROM ins, LATERAL pg_notify(%(channel)s, %(payload)s) n)")
    woken = "(SELECT count(*) FROM wk)" if wake else "0"
    if keyed:
        return (f"WITH {', '.join(ctes)} SELECT live.*, {woken}, (SELECT last_seq FROM fc) "
                f"FROM (SELECT 1) one LEFT JOIN live ON true")
    return f"WITH {', '.join(ctes)} SELECT {woken}, (SELECT last_seq FROM fc)"


_TAKE_FRAME_SEQ = (
    "INSERT INTO frame_counters (thread_id, last_seq) SELECT thread_id, 1 FROM ins "
    "ON CONFLICT (thread_id) DO UPDATE SET last_seq = frame_counters.last_seq + 1 "
    "RETURNING last_seq"
)
"""Raise the thread's frame counter by one for each row of ``ins`` (the new run): the
number its ``scheduled`` frame takes, in the run's own transaction, so that no other
node's frame of that run (its claim, which commits later) is numbered before it."""


_TAKE_DELETION_SEQ = (
    "INSERT INTO frame_counters (thread_id, last_seq) SELECT id, 1 FROM threads "
    "WHERE id = %s FOR UPDATE ON CONFLICT (thread_id) DO UPDATE SET "
    "last_seq = frame_counters.last_seq + 1 RETURNING last_seq"
)
"""Lock a thread's registry row and raise its frame counter by one: the number its
``thread_deleted`` frame takes in the deletion's transaction (no row: no such thread)."""

_DELETE_THREAD = (
    "WITH a AS (DELETE FROM alarms WHERE thread_id = %(t)s), "
    "p AS (DELETE FROM paused_threads WHERE thread_id = %(t)s), "
    "i AS (DELETE FROM run_index WHERE thread_id = %(t)s), "
    "l AS (DELETE FROM turn_leases WHERE thread_id = %(t)s) "
    "DELETE FROM threads WHERE id = %(t)s"
)
"""A thread's registry entry, alarm row, pause mark, run index rows and turn lease, in one
statement (its row count: whether the thread existed)."""


_FINISH_RUN = (
    f"WITH f AS (UPDATE effect_runs SET status = %(status)s, error = %(error)s, "
    f"finished_at = %(at)s, canceled_by = %(by)s WHERE thread_id = %(t)s AND id = %(id)s "
    f"AND status = 'running' AND attempts = coalesce(%(attempt)s::bigint, attempts) "
    f"RETURNING {_RUN_COLUMNS}), "
    f"ft AS (DELETE FROM run_traces WHERE thread_id = %(t)s AND run_id IN (SELECT id FROM f)), "
    f"fa AS (UPDATE run_attempts a SET ended_at = %(at)s, outcome = %(status)s, "
    f"error = %(error)s FROM f WHERE a.thread_id = %(t)s AND a.run_id = f.id "
    f"AND a.attempt = f.attempts) "
    f"SELECT f.*, CASE WHEN %(count)s THEN (SELECT count(*) FROM effect_runs WHERE "
    f"thread_id = %(t)s AND status IN ({', '.join(repr(x) for x in _FINISHED)})) END FROM f"
)
"""A run's outcome in one statement: the run row (only if it is still ``running`` in the
given attempt), its trace context dropped, its attempt ended; answers the run's columns
(no row if it was not running) and the thread's finished runs as of before the statement
(null unless ``%(count)s``)."""

_RUN_WIDTH = len(_RUN_COLUMNS.split(","))
"""How many columns `_RUN_COLUMNS` are."""


@functools.cache
def _claim_sql(*, finishing: bool, named: bool) -> str:
    """`PostgresThreadStore.finish_and_claim`'s statement once the thread's row is locked.

    Its one row: whether the thread is paused, whether another node runs a run of it,
    whether its next due run is of an effect this node lacks (not in ``%(known)s``) and
    another live claiming node runs (that node claims it: the thread waits for it);
    with ``finishing``, the finished run's columns (all null if it was not running in the
    given attempt) and the thread's finished runs as of before the statement (null unless
    ``%(count)s``: counting costs an index scan over up to ``max_finished`` rows); then the
    claimed run's columns (all null if none was claimed: nothing due, or a check said
    no), its trace context, the earliest pending run's due time and (unless ``named``)
    the earliest active schedule's fire. With ``named`` only runs whose name is in
    ``%(names)s`` are claimed and looked at.
    """
    where = " AND name = ANY(%(names)s)" if named else ""
    ctes = [
        f"nx AS (SELECT seq, name FROM effect_runs WHERE thread_id = %(t)s AND status = "
        f"'pending' AND run_at <= %(now)s{where} ORDER BY run_at, seq LIMIT 1 "
        f"FOR UPDATE SKIP LOCKED)",
        "chk AS (SELECT EXISTS (SELECT 1 FROM paused_threads p WHERE p.thread_id = %(t)s) "
        "AS paused, EXISTS (SELECT 1 FROM effect_runs r " + _ATTEMPT_JOIN + " WHERE "
        "r.thread_id = %(t)s AND r.status = 'running' AND a.node_id IS DISTINCT FROM "
        "%(node)s) AS busy, EXISTS (SELECT 1 FROM nx WHERE NOT (nx.name = ANY(%(known)s)) "
        "AND EXISTS (SELECT 1 FROM nodes n WHERE n.node_id <> %(node)s AND "
        + _KNOWN_BY_LIVE_NODE.format(name="nx.name") + ")) AS foreign_)",
    ]
    if finishing:
        ctes.append(_FINISH_RUN.removeprefix("WITH ").split(" SELECT f.*, ")[0])
    ctes.append(
        f"c AS (UPDATE effect_runs SET status = 'running', attempts = attempts + 1, "
        f"started_at = %(now)s WHERE thread_id = %(t)s AND seq = (SELECT seq FROM nx) "
        f"AND NOT (SELECT paused OR busy OR foreign_ FROM chk) RETURNING {_RUN_COLUMNS})")
    ctes.append(
        "a AS (INSERT INTO run_attempts (thread_id, run_id, attempt, started_at, outcome, "
        "node_id) SELECT %(t)s, id, attempts, %(now)s, 'running', %(node)s FROM c "
        "ON CONFLICT (thread_id, run_id, attempt) DO UPDATE SET started_at = "
        "excluded.started_at, ended_at = NULL, outcome = 'running', error = NULL, "
        "node_id = excluded.node_id)")
    finished = ""
    joins = ""
    if finishing:
        finished = (
            "f.*, CASE WHEN f.id IS NOT NULL AND %(count)s THEN (SELECT count(*) FROM "
            "effect_runs WHERE thread_id = %(t)s AND status IN ("
            + ", ".join(repr(x) for x in _FINISHED) + ")) END, ")
        joins = " LEFT JOIN f ON true"
    fire = "NULL::float8" if named else (
        "(SELECT min(next_fire_at) FROM schedules WHERE thread_id = %(t)s "
        "AND state = 'active')")
    return (
        f"WITH {', '.join(ctes)} SELECT chk.paused, chk.busy, chk.foreign_, {finished}c.*, "
        f"(SELECT context FROM run_traces t WHERE t.thread_id = %(t)s AND t.run_id = c.id), "
        f"(SELECT min(run_at) FROM effect_runs WHERE thread_id = %(t)s AND status = "
        f"'pending'{where}), {fire} FROM chk{joins} LEFT JOIN c ON true"
    )


_INDEX_COMPLETE = "run_index_complete"

_LOWER_ALARM = (
    "INSERT INTO alarms (thread_id, due_at) VALUES (%s, %s) ON CONFLICT (thread_id) "
    "DO UPDATE SET due_at = excluded.due_at WHERE alarms.due_at > excluded.due_at"
)
"""Lower (or create) a thread's alarm row in a thread store's transaction: the row stays
locked until the commit, so a concurrent `PostgresRuntimeStore.move_alarms` either sees
the change or is seen (`RuntimeStore.alarms_follow_runs`)."""

_FIRST_DUE = (
    "SELECT LEAST((SELECT min(run_at) FROM effect_runs WHERE thread_id = %(t)s "
    "AND status = 'pending'), (SELECT min(next_fire_at) FROM schedules "
    "WHERE thread_id = %(t)s AND state = 'active'))"
)
"""A thread's earliest pending run or active schedule fire (NULL: none)."""

LOCK_WAIT_SECONDS = 1.0
"""How long `PostgresBackend.open` retries its node id's lock before refusing."""

UNAVAILABLE_WAIT_SECONDS = 2.0
"""How long a call waits for a pooled connection while the server is known unreachable
(the node's connection was lost); otherwise it waits ``connect_timeout``."""

RECENT_SECONDS = 5.0
"""A pooled connection used within this many seconds is handed out without a round trip
to check it (`PostgresBackend._check`)."""

CALL_ABORT_SECONDS = UNAVAILABLE_WAIT_SECONDS
"""Once this node noticed that the database does not answer (its lease renewal failed or
timed out), a call on a pooled connection that has waited this long for its answer is
aborted (its socket is shut down): it fails with `DatabaseUnavailable` instead of hanging
on a connection a silent network cut left open (docs/scale-out.md, "When the database is
unreachable")."""

CHECK_DEADLINE_SECONDS = UNAVAILABLE_WAIT_SECONDS
"""The round trip checking a pooled connection before a call (`PostgresBackend._check`)
is aborted after this many seconds (the connection is replaced)."""

RENEW_DEADLINE_MAX_SECONDS = 5.0
"""A lease renewal is aborted after a third of the lease period, at least 1 s and at most
this many seconds: a renewal that has not answered by then marks the database unreachable."""

LEASE_MARGIN_MAX_SECONDS = 5.0
"""The node stops (claims nothing, cancels its effects) a sixth of the lease period, at
most this many seconds, before its lease could expire in the other nodes' view."""

WATCH_SECONDS = 0.1
"""How often the lease watch (`PostgresBackend._watch`) looks at the node's own clock and
at the calls waiting for the database."""

KEEPALIVE_IDLE_SECONDS = 5
KEEPALIVE_INTERVAL_SECONDS = 2
KEEPALIVE_COUNT = 3
TCP_USER_TIMEOUT_SECONDS = 10
"""Every connection has TCP keepalives (a probe after 5 s of silence, then every 2 s, dead
after 3 unanswered) and ``tcp_user_timeout`` (data sent but not acknowledged for 10 s ends
the connection): a network that drops packets ends the connection in the kernel. A peer
that acknowledges but never answers (a stopped proxy) is caught by the client-side bounds
above."""

IDLE_IN_TRANSACTION_SECONDS = 60
"""The server ends a session left this long inside a transaction with no statement (its
client cut off mid-call): its row locks would otherwise keep other nodes from claiming the
thread's runs until the server noticed the client gone. A contract call runs its
statements back to back, so no working call comes near it."""

POOL_RECONNECT_SECONDS = UNAVAILABLE_WAIT_SECONDS
"""The pool gives up a connection attempt that keeps failing after this long (tried again
after 1 s, then at this bound); the next call that finds no connection starts a new one at
once, so that the first call after an outage waits at most a second for the pool's next
attempt, not out a long backoff (30 s before: 7.5 s after a 23 s outage)."""

LOCK_RETRY_FIRST_SECONDS = 1.0
RECONNECT_MAX_SECONDS = UNAVAILABLE_WAIT_SECONDS
"""After the node's connection is lost, reconnecting is tried at once, then after 1 s,
then every 2 s (and at least every third of the lease period): the node is ready again
(`GET /api/ready`) within about 2 s of the database's return (30 s apart before)."""

LOCK_RETRY_MAX_SECONDS = 30.0
"""While another live process holds this node's id, taking it is tried again after 1 s,
doubling to 30 s (and at least every third of the lease period)."""

LEASE_SECONDS = 30.0
"""The default node lease period (`runtime.config.Settings.lease_seconds`)."""

_DB_NOW = "extract(epoch from clock_timestamp())::float8"
"""The database server's clock, seconds since the epoch: node leases are stamped and
compared by it, so the nodes' own clocks may differ."""

_LIVE_NODE = (
    f"EXISTS (SELECT 1 FROM nodes n WHERE n.node_id = a.node_id "
    f"AND n.lease_expires_at > {_DB_NOW})"
)
"""True when attempt ``a``'s node holds a live lease."""

_KNOWN_BY_LIVE_NODE = (
    f"n.lease_expires_at > {_DB_NOW} AND n.claims IS NOT FALSE "
    "AND n.effects IS NOT NULL AND jsonb_exists(n.effects::jsonb, {name})"
)
"""True when node ``n`` holds a live lease, claims runs and runs the effect ``{name}`` (a
SQL expression: format it in)."""

_ATTEMPT_JOIN = (
    "LEFT JOIN run_attempts a ON a.thread_id = r.thread_id AND a.run_id = r.id "
    "AND a.attempt = r.attempts"
)
"""Run ``r`` with its current attempt ``a`` (which node runs it)."""

WAKE_WITHIN_SECONDS = 10.0
"""A run scheduled due within this many seconds of its creation is announced on the
cluster bus as its row commits (`PostgresClusterBus.wake_in`); a later one is left to the
nodes' alarm polls (`runtime.alarms.AlarmIndex`, ``poll_seconds``), which come well before."""

SWEEP_SECONDS = 60.0
"""On the write path, runs past their retention age are deleted at most this often per
store (as `runtime.storage.sqlite.SWEEP_SECONDS`)."""

_EXPIRED = (
    "((status IN ('completed', 'canceled') AND finished_at < %s) "
    "OR (status = 'failed' AND finished_at < %s))"
)

# The ``n`` oldest finished runs of a thread (by finished_at, then seq): one index walk
# per status over ix_effect_runs_finished (thread_id, status, finished_at).
_DELETE_OLDEST_FINISHED = (
    "DELETE FROM effect_runs WHERE thread_id = %(t)s AND seq IN (SELECT seq FROM ("
    + " UNION ALL ".join(
        f"(SELECT seq, finished_at FROM effect_runs WHERE thread_id = %(t)s "
        f"AND status = '{status}' ORDER BY finished_at, seq LIMIT %(n)s)"
        for status in _FINISHED
    )
    + ") AS oldest ORDER BY finished_at, seq LIMIT %(n)s)"
)

# The (finished_at, seq) of the finished run at position %(offset)s among the unexpired
# ones of a thread, newest first.
_NEWEST_FINISHED = (
    "SELECT finished_at, seq FROM ("
    + " UNION ALL ".join(
        f"(SELECT finished_at, seq FROM effect_runs WHERE thread_id = %(t)s "
        f"AND status = '{status}' "
        f"AND finished_at >= %({'failed' if status == 'failed' else 'completed'})s "
        f"ORDER BY finished_at DESC, seq DESC LIMIT %(offset)s + 1)"
        for status in _FINISHED
    )
    + ") AS newest ORDER BY finished_at DESC, seq DESC LIMIT 1 OFFSET %(offset)s"
)


def redact_url(url: str) -> str:
    """The database URL without its passwords (for messages and logs).

    Both the ``user:password@`` part and any ``password=`` query parameter become ``***``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable database URL>"
    if parts.password is not None:
        head, sep, rest = url.partition("//")
        userinfo, at, after = rest.partition("@")
        user = userinfo.split(":", 1)[0]
        url = f"{head}{sep}{user}:***{at}{after}"
    base, question, query = url.partition("?")
    if not question:
        return url
    query, hash_, fragment = query.partition("#")
    pairs = [
        f"{kv.split('=', 1)[0]}=***" if kv.split("=", 1)[0].lower() == "password" else kv
        for kv in query.split("&")
    ]
    return f"{base}?{'&'.join(pairs)}{hash_}{fragment}"


def split_schema(url: str) -> tuple[str, str | None]:
    """``(url without its schema parameter, the schema or None)``.

    The rest of the URL is kept as written (``postgresql:///db?host=...`` stays so).

    Raises:
        ValueError: the URL is not a ``postgresql://`` or ``postgres://`` URL, holds a
            control character (a line break), or its ``schema`` parameter is empty or given
            more than once.
    """
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError(
            f"Invalid database URL {redact_url(url)!r}: it holds a control character "
            f"(a trailing line break?); percent-encode it if it is meant"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(
            f"Invalid database URL {redact_url(url)!r}: must begin with postgresql:// "
            f"(postgresql://user@host:5432/dbname)"
        )
    base, question, query = url.partition("?")
    if not question:
        return url, None
    query, hash_, fragment = query.partition("#")
    pairs = [kv for kv in query.split("&") if kv]
    schemas = [kv.partition("=")[2] for kv in pairs if kv.partition("=")[0] == "schema"]
    if len(schemas) > 1:
        raise ValueError(
            f"Invalid database URL {redact_url(url)!r}: the schema parameter is given "
            f"{len(schemas)} times; give it once"
        )
    if schemas and not schemas[0]:
        raise ValueError(
            f"Invalid database URL {redact_url(url)!r}: the schema parameter is empty; "
            f"give a schema name matching [a-z_][a-z0-9_]* or leave the parameter out"
        )
    rest = "&".join(kv for kv in pairs if kv.partition("=")[0] != "schema")
    kept = f"{base}?{rest}" if rest else base
    return f"{kept}{hash_}{fragment}", (schemas[0] if schemas else None)


def _sweep_due(swept_at: float | None, now: float) -> bool:
    return swept_at is None or now - swept_at >= SWEEP_SECONDS or now < swept_at


def _row_to_run(thread_id: str, row: Sequence[Any]) -> EffectRun:
    return EffectRun(
        id=row[1],
        thread_id=thread_id,
        name=row[2],
        status=EffectStatus(row[3]),
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


# ------------------------------------------------------------------ effect records


class _Records:
    """The `runtime.storage.records` ``sql_*`` functions, for one PostgreSQL table.

    ``effect_records`` holds threads' records, ``runtime_effect_records`` the runtime-level
    ones (a scope in ``thread_id``). Each runs inside the caller's transaction.
    """

    _COLUMNS = ("thread_id, key, tool_name, run_id, status, result, owner, "
                "lease_expires_at, created_at, updated_at")

    def __init__(self, table: str) -> None:
        self.table = table

    def get(self, c: Cursor, thread_id: str, key: str) -> EffectRecord | None:
        row = c.execute(
            f"SELECT {self._COLUMNS} FROM {self.table} WHERE thread_id = %s AND key = %s",
            (thread_id, key),
        ).fetchone()
        return None if row is None else _records._from_row(row)

    def _require(self, c: Cursor, thread_id: str, key: str) -> EffectRecord:
        record = self.get(c, thread_id, key)
        assert record is not None, "a row read inside the transaction that wrote it"
        return record

    def begin(
        self, c: Cursor, thread_id: str, key: str, *, tool_name: str, run_id: str | None,
        owner: str, lease_seconds: float, now: float,
    ) -> Claim:
        _records.check_lease(lease_seconds)
        now = _records._quantize(now)
        expires = now + lease_seconds
        # Lock the key's row (if any) for this transaction: two claims of one key
        # serialize here, so exactly one sees it free.
        c.execute(
            f"SELECT 1 FROM {self.table} WHERE thread_id = %s AND key = %s FOR UPDATE",
            (thread_id, key),
        )
        inserted = c.execute(
            f"INSERT INTO {self.table} ({self._COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, NULL, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (thread_id, key, tool_name, run_id, EffectRecordStatus.IN_PROGRESS.value, owner,
             expires, now, now),
        ).rowcount
        if inserted:
            return Claim(self._require(c, thread_id, key), claimed=True)
        retried = c.execute(
            f"UPDATE {self.table} SET status = %s, result = NULL, owner = %s, "
            "lease_expires_at = %s, tool_name = %s, run_id = %s, created_at = %s, "
            "updated_at = %s WHERE thread_id = %s AND key = %s AND status = %s",
            (EffectRecordStatus.IN_PROGRESS.value, owner, expires, tool_name, run_id, now, now,
             thread_id, key, EffectRecordStatus.FAILED.value),
        ).rowcount
        if retried:
            return Claim(self._require(c, thread_id, key), claimed=True)
        taken = c.execute(
            f"UPDATE {self.table} SET owner = %s, lease_expires_at = %s, tool_name = %s, "
            "run_id = %s, created_at = %s, updated_at = %s WHERE thread_id = %s AND key = %s "
            "AND status = %s AND lease_expires_at <= %s",
            (owner, expires, tool_name, run_id, now, now, thread_id, key,
             EffectRecordStatus.IN_PROGRESS.value, now),
        ).rowcount
        record = self._require(c, thread_id, key)
        return Claim(record, claimed=bool(taken), took_over=bool(taken))

    def complete(
        self, c: Cursor, thread_id: str, key: str, *, owner: str, result_json: str,
        now: float, status: EffectRecordStatus,
    ) -> EffectRecord:
        status = _records._check_result_status(status)
        now = _records._quantize(now)
        changed = c.execute(
            f"UPDATE {self.table} SET status = %s, result = %s, owner = NULL, "
            "lease_expires_at = NULL, updated_at = %s WHERE thread_id = %s AND key = %s "
            "AND status = %s AND owner = %s",
            (status.value, result_json, now, thread_id, key,
             EffectRecordStatus.IN_PROGRESS.value, owner),
        ).rowcount
        if not changed:
            raise _records._lost(thread_id, key, owner)
        return self._require(c, thread_id, key)

    def renew(self, c: Cursor, thread_id: str, key: str, *, owner: str,
              lease_seconds: float, now: float) -> bool:
        _records.check_lease(lease_seconds)
        return bool(c.execute(
            f"UPDATE {self.table} SET lease_expires_at = %s WHERE thread_id = %s AND key = %s "
            "AND status = %s AND owner = %s",
            (_records._quantize(now) + lease_seconds, thread_id, key,
             EffectRecordStatus.IN_PROGRESS.value, owner),
        ).rowcount)

    def release(self, c: Cursor, thread_id: str, key: str, *, owner: str) -> bool:
        return bool(c.execute(
            f"DELETE FROM {self.table} WHERE thread_id = %s AND key = %s AND status = %s "
            "AND owner = %s",
            (thread_id, key, EffectRecordStatus.IN_PROGRESS.value, owner),
        ).rowcount)

    def list(
        self, c: Cursor, thread_id: str, *, status: EffectRecordStatus | None, limit: int,
        cursor: str | None, hide_journal: bool = False,
    ) -> EffectRecordPage:
        _records.check_limit(limit)
        where, params = ["thread_id = %s"], [thread_id]
        if hide_journal:
            where.append("substr(key, 1, %s) != %s")
            params.extend([len(_records.JOURNAL_PREFIX), _records.JOURNAL_PREFIX])  # type: ignore[list-item]
        if status is not None:
            where.append("status = %s")
            params.append(EffectRecordStatus(status).value)
        if cursor is not None:
            created, after_key = _records.decode_cursor(cursor)
            where.append("(created_at < %s OR (created_at = %s AND key < %s))")
            params.extend([created, created, after_key])  # type: ignore[list-item]
        rows = c.execute(
            f"SELECT {self._COLUMNS} FROM {self.table} WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, key DESC LIMIT %s",
            (*params, limit + 1),
        ).fetchall()
        found = [_records._from_row(r) for r in rows[:limit]]
        return EffectRecordPage(
            found, _records._next_cursor(found) if len(rows) > limit else None
        )

    def expire_leases(self, c: Cursor, thread_id: str, *, keep_owner_prefix: str,
                      now: float) -> int:
        now = _records._quantize(now)
        return c.execute(
            f"UPDATE {self.table} SET lease_expires_at = %s, updated_at = %s "
            "WHERE thread_id = %s AND status = %s AND lease_expires_at > %s "
            "AND substr(owner, 1, %s) != %s",
            (now, now, thread_id, EffectRecordStatus.IN_PROGRESS.value, now,
             len(keep_owner_prefix), keep_owner_prefix),
        ).rowcount

    def purge(self, c: Cursor, thread_id: str | None, *, older_than: float) -> int:
        older_than = _records._epoch(_records.instant(older_than))
        scope, params = ("thread_id = %s AND ", [thread_id]) if thread_id is not None else (
            "", [])
        return c.execute(
            f"DELETE FROM {self.table} WHERE {scope}updated_at < %s AND "
            "(status != %s OR lease_expires_at < %s)",
            (*params, older_than, EffectRecordStatus.IN_PROGRESS.value, older_than),
        ).rowcount

    def purge_thread(self, c: Cursor, thread_id: str) -> int:
        return c.execute(
            f"DELETE FROM {self.table} WHERE thread_id = %s", (thread_id,)
        ).rowcount


_THREAD_RECORDS = _Records("effect_records")
_RUNTIME_RECORDS = _Records("runtime_effect_records")


# ------------------------------------------------------------------ thread store


CLAIM_GROUP_MAX = 32
"""The most `PostgresThreadStore.finish_and_claim` calls committed in one transaction
(`_ClaimGroup`); the runtime's 16 storage threads make at most 16 at once."""

CLAIM_TRANSACTIONS_IN_FLIGHT = 4
"""How many claim transactions (alone or grouped) a backend runs at once before later
calls queue for a group (`_ClaimGroup`)."""

_LOCK_THREADS = (
    "SELECT id FROM threads WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED"
)
"""Lock the rows of the given threads that no other transaction holds, in id order; the
ids of the rows locked. It never waits: a row another transaction holds (another node's
claim, an activity update) or a deleted thread is left out, and its call runs alone."""

_GROUP_RUN_COLUMNS = ", ".join(f"r.{col.strip()}" for col in _RUN_COLUMNS.split(","))

_CLAIM_GROUP = (
    "WITH g AS (SELECT * FROM unnest(%(t)s::text[], %(now)s::float8[], %(id)s::text[], "
    "%(attempt)s::bigint[], %(status)s::text[], %(error)s::text[], %(at)s::float8[], "
    "%(by)s::text[], %(count)s::bool[]) WITH ORDINALITY AS g(g_t, g_now, g_id, g_attempt, "
    "g_status, g_error, g_at, g_by, g_count, g_i)), "
    "nx AS (SELECT g.g_t AS nx_t, x.seq AS nx_seq, x.name AS nx_name FROM g CROSS JOIN "
    "LATERAL (SELECT seq, name FROM effect_runs WHERE thread_id = g.g_t AND status = "
    "'pending' AND run_at <= g.g_now ORDER BY run_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED) x), "
    "chk AS (SELECT g.g_t AS k_t, EXISTS (SELECT 1 FROM paused_threads p WHERE p.thread_id "
    "= g.g_t) AS paused, EXISTS (SELECT 1 FROM effect_runs r " + _ATTEMPT_JOIN + " WHERE "
    "r.thread_id = g.g_t AND r.status = 'running' AND a.node_id IS DISTINCT FROM "
    "%(node)s) AS busy, EXISTS (SELECT 1 FROM nx WHERE nx.nx_t = g.g_t AND NOT "
    "(nx.nx_name = ANY(%(known)s)) AND EXISTS (SELECT 1 FROM nodes n WHERE n.node_id <> "
    "%(node)s AND " + _KNOWN_BY_LIVE_NODE.format(name="nx.nx_name") + ")) AS foreign_ "
    "FROM g), "
    "f AS (UPDATE effect_runs r SET status = g.g_status, error = g.g_error, finished_at = "
    "g.g_at, canceled_by = g.g_by FROM g WHERE r.thread_id = g.g_t AND r.id = g.g_id AND "
    "r.status = 'running' AND r.attempts = coalesce(g.g_attempt, r.attempts) RETURNING "
    f"r.thread_id AS f_t, {_GROUP_RUN_COLUMNS}), "
    "ft AS (DELETE FROM run_traces t USING f WHERE t.thread_id = f.f_t AND t.run_id = f.id), "
    "fa AS (UPDATE run_attempts a SET ended_at = f.finished_at, outcome = f.status, "
    "error = f.error FROM f WHERE a.thread_id = f.f_t AND a.run_id = f.id "
    "AND a.attempt = f.attempts), "
    "c AS (UPDATE effect_runs r SET status = 'running', attempts = r.attempts + 1, "
    "started_at = g.g_now FROM g JOIN nx ON nx.nx_t = g.g_t JOIN chk ON chk.k_t = g.g_t "
    "WHERE r.thread_id = g.g_t AND r.seq = nx.nx_seq AND NOT (chk.paused OR chk.busy OR "
    f"chk.foreign_) RETURNING r.thread_id AS c_t, {_GROUP_RUN_COLUMNS}), "
    "a AS (INSERT INTO run_attempts (thread_id, run_id, attempt, started_at, outcome, "
    "node_id) SELECT c_t, id, attempts, started_at, 'running', %(node)s FROM c "
    "ON CONFLICT (thread_id, run_id, attempt) DO UPDATE SET started_at = "
    "excluded.started_at, ended_at = NULL, outcome = 'running', error = NULL, "
    "node_id = excluded.node_id) "
    "SELECT chk.paused, chk.busy, chk.foreign_, "
    + ", ".join(f"f.{col.strip()}" for col in _RUN_COLUMNS.split(","))
    + ", CASE WHEN f.id IS NOT NULL AND g.g_count THEN (SELECT count(*) FROM effect_runs "
    "WHERE thread_id = g.g_t AND status IN (" + ", ".join(repr(x) for x in _FINISHED)
    + ")) END, "
    + ", ".join(f"c.{col.strip()}" for col in _RUN_COLUMNS.split(","))
    + ", (SELECT context FROM run_traces t WHERE t.thread_id = g.g_t AND t.run_id = c.id), "
    "(SELECT min(run_at) FROM effect_runs WHERE thread_id = g.g_t AND status = 'pending'), "
    "(SELECT min(next_fire_at) FROM schedules WHERE thread_id = g.g_t AND state = 'active') "
    "FROM g JOIN chk ON chk.k_t = g.g_t LEFT JOIN f ON f.f_t = g.g_t "
    "LEFT JOIN c ON c.c_t = g.g_t ORDER BY g.g_i"
)
"""The check, finish and claim of several threads (`_claim_sql` without ``named``, for
each element of the arrays: ``t`` the thread ids, ``now`` each call's time, then each
call's finish, all null for none, and ``count`` whether to count its thread's finished
runs), in ONE statement; it runs after the statement that
locked the threads' rows (`_LOCK_THREADS`), as `_claim_sql` runs after the row lock. A
row per thread in the arrays' order, each as `_claim_sql` (``finishing``) answers: the
checks; the finished run's columns and the thread's finished runs as of before the
statement; the claimed run's columns, its trace context, the earliest pending run's due
time and the earliest active schedule's fire. Data-modifying ``WITH`` parts cannot sit
in a ``LATERAL`` subquery, so the finish and the claim are each one ``UPDATE`` joined
to the arrays; only the pick of each thread's due run is ``LATERAL`` (its
``LIMIT 1 ... SKIP LOCKED`` per thread)."""

_Claimed = tuple[EffectRun | None, EffectRun | None, float | None]


class _ClaimCall:
    """One `PostgresThreadStore.finish_and_claim` transaction, to run alone or grouped.

    See `_ClaimGroup`.

    Attributes:
        store: The calling thread store.
        claim: Whether the call claims (its thread's row is locked first).
        alone: Run the whole call in a transaction of its own (locks the row itself).
        together: Run the call's statements in a transaction that already holds the
            thread's row lock (True) or that is not to claim (False).
        row: The call's elements of `_CLAIM_GROUP`'s arrays (``t``, ``now``, the finish),
            or None when the call runs its own statements in a group (``only_names``).
        settle: What the call returns from its `_CLAIM_GROUP` row (the row in
            `_claim_sql`'s shape for the call's ``finishing``), its pruning done.
        result: What the call returned when run in a group.
        error: What the call raises, when its group failed for want of the database.
        lead: Set on the call whose caller is to run the next group (the group's calls).
        by_itself: Set when the caller is to run its call alone after all.
    """

    __slots__ = ("alone", "by_itself", "claim", "error", "first", "lead", "ready", "result",
                 "row", "settle", "store", "together")

    def __init__(
        self, store: PostgresThreadStore, claim: bool,
        alone: Callable[[Cursor], _Claimed], together: Callable[[Cursor, bool], _Claimed],
        row: dict[str, Any] | None = None,
        settle: Callable[[Cursor, Sequence[Any]], _Claimed] | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        self.alone = alone
        self.together = together
        self.row = row
        self.settle = settle
        # The thread's row lock sent with the BEGIN (`_lock_threads_sql`), when claiming.
        self.first = store._lock_first if claim else None
        self.result: _Claimed | None = None
        self.error: BaseException | None = None
        self.lead: list[_ClaimCall] | None = None
        self.by_itself = False
        # Held from the start; released once the call's outcome (or its turn to lead a
        # group) is set. A bare lock: a `threading.Event` (a condition variable in Python)
        # cost about a tenth of a grouped call's CPU.
        self.ready = threading.Lock()
        self.ready.acquire()

    def run_alone(self) -> _Claimed:
        if self.first is None:
            return self.store._tx(self.alone)
        # The row lock in the BEGIN's round trip; the checks read by a later statement.
        locked: list[str] = []
        return self.store._tx(lambda c: self.together(c, bool(locked)), first=self.first,
                              rows=locked)

    def answer(self) -> _Claimed:
        """What the caller returns once its call ran: alone after all, or in a group."""
        if self.by_itself:
            return self.run_alone()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class _ClaimGroup:
    """Group commit of a backend's `PostgresThreadStore.finish_and_claim` transactions.

    A call that comes while fewer than `CLAIM_TRANSACTIONS_IN_FLIGHT` claim transactions of
    this backend are in flight runs at once, alone (no added latency). Calls that come
    while that many are in flight queue up; when one ends, the first queued caller takes
    every queued call (of distinct threads, up to `CLAIM_GROUP_MAX`) and runs them in ONE
    transaction: ``BEGIN``, the claiming threads' rows locked in one statement
    (`_LOCK_THREADS`: id order, skipping rows another transaction holds), then every
    call's check, finish and claim in ONE statement over arrays (`_CLAIM_GROUP`),
    ``COMMIT``: four round trips at any size. Pruning stays per call (a statement only
    when due); a call with ``only_names`` (names differ per call) or that does not claim
    runs its own statement(s) in the transaction. Each caller gets its own result and its
    store its own state (`ThreadStore.claim_blocked`, the due hint).

    What each call guarantees alone still holds: its check is read by a statement after
    the one that locked its thread's row; its attempt row commits with its claim before
    the caller returns; its finish is fenced by the same statement. The lock statement
    never waits, so groups cannot deadlock with other nodes' groups or claims over the
    threads' rows. A call whose row was not locked (held elsewhere, or its thread
    deleted) runs alone in its caller's storage thread, as do all of a group's calls when
    the group's transaction fails for a reason other than the database being unreachable
    (a deadlock, one thread's error): one thread never fails another's call.
    """

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self._guard = threading.Lock()
        self._in_flight = 0
        self._queue: list[_ClaimCall] = []

    def run(self, call: _ClaimCall) -> _Claimed:
        """Run ``call``'s transaction, alone or in a group; return its result.

        Raises:
            ThreadStorageError: the call's transaction failed (nothing of it written).
        """
        with self._guard:
            queued = self._in_flight >= CLAIM_TRANSACTIONS_IN_FLIGHT
            if queued:
                self._queue.append(call)
            else:
                self._in_flight += 1
        if queued:
            call.ready.acquire()
            if call.lead is None:
                return call.answer()
        group = call.lead or [call]
        try:
            if len(group) == 1:
                try:
                    call.result = call.run_alone()
                except BaseException as exc:
                    call.error = exc
            else:
                self._run_group(group)
        finally:
            for other in group[1:]:
                if other.result is None and other.error is None:
                    other.by_itself = True  # the group was interrupted
                other.ready.release()
            self._hand_off()
        return call.answer()

    def _hand_off(self) -> None:
        """Give the queued calls (distinct threads, up to the cap) to the first of them."""
        with self._guard:
            group: list[_ClaimCall] = []
            seen: set[str] = set()
            rest: list[_ClaimCall] = []
            for queued in self._queue:
                if len(group) < CLAIM_GROUP_MAX and queued.store.thread_id not in seen:
                    seen.add(queued.store.thread_id)
                    group.append(queued)
                else:
                    rest.append(queued)
            self._queue = rest
            if not group:
                self._in_flight -= 1
                return
        group[0].lead = group
        group[0].ready.release()

    def _claim_arrayed(self, c: Cursor, calls: list[_ClaimCall]) -> None:
        """Run ``calls`` (their rows locked by an earlier statement) as one `_CLAIM_GROUP`."""
        params: dict[str, Any] = {
            key: [call.row[key] for call in calls if call.row is not None]
            for key in ("t", "now", "id", "attempt", "status", "error", "at", "by", "count")}
        params["node"] = self._backend.node_id
        params["known"] = list(self._backend.effects or ())
        rows = c.execute(_CLAIM_GROUP, params).fetchall()
        assert len(rows) == len(calls)
        for call, out in zip(calls, rows, strict=True):
            assert call.row is not None and call.settle is not None
            if call.row["id"] is None:  # no finish: `_claim_sql`'s shape without its columns
                out = (*out[:3], *out[3 + _RUN_WIDTH + 1:])
            call.result = call.settle(c, out)

    def _run_group(self, group: list[_ClaimCall]) -> None:
        """Run ``group``'s calls in one transaction; mark those to run alone."""
        try:
            claiming = sorted(call.store.thread_id for call in group
                              if call.claim and not call.store._closed)
            # The rows locked in the BEGIN's round trip (ids fit to be literals), else
            # by a statement of their own.
            first = _lock_threads_sql(claiming, skip_locked=True) if claiming else None
            got: list[str] = []
            with self._backend.transaction(first=first, rows=got) as c:
                locked = set(got) if first is not None or not claiming else {
                    row[0] for row in c.execute(_LOCK_THREADS, (claiming,))}
                arrayed: list[_ClaimCall] = []
                for call in group:
                    call.result = None
                    if call.store._closed or (call.claim
                                              and call.store.thread_id not in locked):
                        call.by_itself = True
                    elif call.claim and call.row is not None:
                        arrayed.append(call)
                    else:
                        call.result = call.together(c, call.claim)
                if arrayed:
                    self._claim_arrayed(c, arrayed)
        except (RuntimeClosed, DatabaseUnavailable) as exc:
            # Running each alone would only wait out the same outage once per call.
            for call in group:
                call.store._swept_at = None
                call.result = None
                call.by_itself = False
                error = ThreadStorageError(
                    call.store.thread_id,
                    f"Thread {call.store.thread_id}: PostgreSQL failed: {exc}",
                    unavailable=isinstance(exc, DatabaseUnavailable))
                error.__cause__ = exc
                call.error = error
        except Exception:
            # Nothing of the group committed: each call runs again alone, so that one
            # thread's error (or a deadlock) fails at most that thread's call.
            log.debug("a group of %d claims failed; each runs alone", len(group),
                      exc_info=True)
            for call in group:
                call.store._swept_at = None
                call.result = None
                call.by_itself = True


class PostgresThreadStore(ThreadStore):
    """One thread's rows in the shared tables (every query names its ``thread_id``)."""

    def __init__(self, backend: PostgresBackend, thread_id: str) -> None:
        self.thread_id = thread_id
        self._backend = backend
        self._closed = False
        self._swept_at: float | None = None
        self._records_swept_at: float | None = None
        # The thread's finished runs as this store last counted them, plus the finishes it
        # wrote since (None: unknown). A finish counts them again (an index scan over up to
        # `RetentionPolicy.max_finished` rows) only when this says pruning may be due: a
        # hint for when to look, never what is deleted (another node's finishes make it
        # low, which only delays a prune that node makes itself).
        self._finished_seen: int | None = None
        # The earliest due time this store knows of a pending run of the thread: a run it
        # inserted, or what a claim that found nothing read as due next (None: unknown).
        # A claim with nothing to finish skips its probe when this is due (see
        # `finish_and_claim`); it is a hint only, the claim itself checks the rows.
        self._due_seen: float | None = None
        # The thread's row lock for a claim alone, sent with its BEGIN (`_ClaimCall`).
        self._lock_first = _lock_threads_sql((thread_id,), skip_locked=False)

    def _saw_due(self, due_at: float) -> None:
        if self._due_seen is None or due_at < self._due_seen:
            self._due_seen = due_at

    def _tx(self, fn: Callable[[Cursor], T], *, single: bool = False,
            first: bytes | None = None, rows: list[str] | None = None) -> T:
        """``fn`` in one transaction; ``single``: ``fn`` runs exactly one statement.

        ``first`` and ``rows``: as `PostgresBackend.transaction`'s.
        """
        if self._closed:
            raise ThreadStorageError(self.thread_id, f"Thread {self.thread_id} is closed")
        try:
            with self._backend.transaction(single=single, first=first, rows=rows) as c:
                return fn(c)
        except (_db_error(), RuntimeClosed, DatabaseUnavailable) as exc:
            self._swept_at = None
            self._finished_seen = None
            raise ThreadStorageError(
                self.thread_id, f"Thread {self.thread_id}: PostgreSQL failed: {exc}",
                unavailable=isinstance(exc, DatabaseUnavailable),
            ) from exc

    def _one(self, c: Cursor, sql: str, params: Sequence[Any]) -> EffectRun | None:
        row = c.execute(sql, params).fetchone()
        return _row_to_run(self.thread_id, row) if row is not None else None

    # ------------------------------------------------------------ meta

    def _fenced(self, c: Cursor, fence: str | None) -> bool:
        """Whether ``fence`` still holds the thread's turn lease (None: no fence).

        The lease row stays locked (shared) until the caller's transaction ends: a turn
        taking the lease over waits for this write, so nothing of the old turn is
        written after the lease moved.
        """
        return fence is None or c.execute(
            "SELECT 1 FROM turn_leases WHERE thread_id = %s AND token = %s FOR SHARE",
            (self.thread_id, fence)).fetchone() is not None

    def set_meta(  # noqa: D102 - contract in base
        self, key: str, value: str, *, fence: str | None = None
    ) -> None:
        def tx(c: Cursor) -> bool:
            if not self._fenced(c, fence):
                return False
            c.execute(
                "INSERT INTO thread_meta (thread_id, key, value) VALUES (%s, %s, %s) "
                "ON CONFLICT (thread_id, key) DO UPDATE SET value = excluded.value",
                (self.thread_id, key, value),
            )
            return True

        if not self._tx(tx):
            raise TurnLeaseLost(self.thread_id)

    def get_meta(self, key: str) -> str | None:  # noqa: D102 - contract in base
        row = self._tx(lambda c: c.execute(
            "SELECT value FROM thread_meta WHERE thread_id = %s AND key = %s",
            (self.thread_id, key),
        ).fetchone())
        return None if row is None else str(row[0])

    # ------------------------------------------------------------ runs

    def _count_finished(self, c: Cursor) -> int:
        row = c.execute(
            "SELECT count(*) FROM effect_runs WHERE thread_id = %s AND status IN (%s, %s, %s)",
            (self.thread_id, *_FINISHED),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def _delete_expired(self, c: Cursor, now: float, retention: RetentionPolicy) -> int:
        return c.execute(
            f"DELETE FROM effect_runs WHERE thread_id = %s AND {_EXPIRED}",
            (self.thread_id, now - retention.completed_seconds,
             now - retention.failed_seconds),
        ).rowcount

    def _prune_in(self, c: Cursor, now: float, retention: RetentionPolicy, *,
                  finished_count: int | None = None) -> int:
        """Write-path pruning inside a transaction that just finished runs.

        ``finished_count``: the thread's finished runs, if the caller counted them.
        """
        deleted = 0
        if _sweep_due(self._swept_at, now):
            deleted += self._delete_expired(c, now, retention)
            self._swept_at = now
            _THREAD_RECORDS.purge(c, self.thread_id,
                                  older_than=now - retention.effect_records_seconds)
            self._records_swept_at = now
            finished_count = None  # some may be gone
        if finished_count is None:
            finished_count = self._count_finished(c)
        excess = finished_count - retention.max_finished
        # Deleted in batches (a tenth of the limit); reads hide the excess meanwhile.
        oldest = 0
        if excess > retention.max_finished // 10:
            oldest = c.execute(
                _DELETE_OLDEST_FINISHED, {"t": self.thread_id, "n": excess}
            ).rowcount
            deleted += oldest
        self._finished_seen = finished_count - oldest
        if deleted:
            self._drop_orphan_attempts(c)
        return deleted

    def _drop_orphan_attempts(self, c: Cursor) -> None:
        c.execute(
            "DELETE FROM run_attempts a WHERE a.thread_id = %s AND NOT EXISTS (SELECT 1 "
            "FROM effect_runs r WHERE r.thread_id = a.thread_id AND r.id = a.run_id)",
            (self.thread_id,),
        )

    def _drop_trace(self, c: Cursor, run: EffectRun | None) -> None:
        if run is not None:
            c.execute("DELETE FROM run_traces WHERE thread_id = %s AND run_id = %s",
                      (self.thread_id, run.id))

    def _with_trace(self, c: Cursor, run: EffectRun | None) -> EffectRun | None:
        if run is None or run.status.finished:
            return run
        row = c.execute(
            "SELECT context FROM run_traces WHERE thread_id = %s AND run_id = %s",
            (self.thread_id, run.id),
        ).fetchone()
        return replace(run, trace_context=row[0]) if row is not None else run

    def _end_attempt(
        self, c: Cursor, run: EffectRun, outcome: str, at: float, error: str | None
    ) -> None:
        c.execute(
            "UPDATE run_attempts SET ended_at = %s, outcome = %s, error = %s "
            "WHERE thread_id = %s AND run_id = %s AND attempt = %s",
            (at, outcome, error, self.thread_id, run.id, run.attempts),
        )

    def insert_run(  # noqa: D102 - contract in base
        self, run: EffectRun, *, hand_off_from: str | None = None, replay_once: bool = False
    ) -> EffectRun | None:
        # Two nodes storing a run under one key at the same moment: each statement's key
        # check sees no live run (READ COMMITTED: the other row is not committed yet), and
        # the later insert waits at the pending-key index, then fails once the first
        # commits. Made again, the check sees the committed run and answers with it.
        for tries_left in range(_KEY_RACE_TRIES - 1, -1, -1):
            try:
                return self._insert_run(run, hand_off_from=hand_off_from,
                                         replay_once=replay_once)
            except ThreadStorageError as exc:
                if run.key is None or not tries_left or not _pending_key_taken(exc):
                    raise
        raise AssertionError("unreachable")

    def _insert_run(
        self, run: EffectRun, *, hand_off_from: str | None, replay_once: bool
    ) -> EffectRun | None:
        self.frame_seq = None
        if replay_once and run.replay_of is not None:
            # A replay made once across nodes: its checks need the original's row
            # lock, so it is a transaction of its own (not the one statement below).
            def tx(c: Cursor) -> EffectRun | None:
                # Key-share locked: a deletion committing meanwhile cannot miss the replay.
                if c.execute("SELECT 1 FROM threads WHERE id = %s FOR KEY SHARE",
                             (self.thread_id,)).fetchone() is None:
                    raise ThreadNotFound(self.thread_id)  # deleted by another node
                # The original's row serializes the replays of it across nodes.
                c.execute("SELECT 1 FROM effect_runs WHERE thread_id = %s AND id = %s "
                          "FOR UPDATE", (self.thread_id, run.replay_of))
                replay = self._one(
                    c, f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE thread_id = %s "
                    f"AND replay_of = %s ORDER BY seq LIMIT 1", (self.thread_id, run.replay_of))
                if replay is not None:
                    return replay
                if run.key is not None:
                    rows = c.execute(
                        f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE thread_id = %s "
                        f"AND key = %s AND status IN ('pending', 'running') ORDER BY status, seq",
                        (self.thread_id, run.key),
                    ).fetchall()
                    for row in rows:  # 'pending' sorts first: a successor wins over its link
                        live = _row_to_run(self.thread_id, row)
                        if live.status is EffectStatus.PENDING or live.id != hand_off_from:
                            return live
                self.frame_seq = self._insert_run_in(c, run)
                return None

            return self._tx(tx)
        # One statement, its own transaction: one round trip, one commit.
        args = json.dumps(run.args, separators=(",", ":")) if run.args is not None else None
        params: dict[str, Any] = {
            "t": self.thread_id, "id": run.id, "name": run.name, "status": str(run.status),
            "args": args, "run_at": run.run_at_ts, "created_at": run.created_at_ts,
            "replay_of": run.replay_of, "key": run.key, "schedule_id": run.schedule_id,
            "trace": run.trace_context, "hand_off": hand_off_from,
        }
        # Due soon: tell every node as the row commits (as `_insert_run_in` does).
        wake = run.run_at_ts - run.created_at_ts <= WAKE_WITHIN_SECONDS
        if wake:
            params["channel"], params["payload"] = self._backend.cluster.wake_params(
                self.thread_id, run.run_at_ts)
        sql = _insert_run_sql(keyed=run.key is not None,
                              trace=run.trace_context is not None, wake=wake)
        row = self._tx(lambda c: c.execute(sql, params).fetchone(), single=True)
        assert row is not None
        if row[-1] is not None:
            self.frame_seq = int(row[-1])
            self._saw_due(run.run_at_ts)
        if run.key is None or row[0] is None:
            if row[-1] is None:  # not inserted, and no run holds its key: no thread
                raise ThreadNotFound(self.thread_id)
            return None
        return _row_to_run(self.thread_id, row[:-2])

    def _insert_run_in(self, c: Cursor, run: EffectRun) -> int:
        """Insert ``run`` in the caller's transaction; the frame number it took."""
        self._saw_due(run.run_at_ts)
        args = json.dumps(run.args, separators=(",", ":")) if run.args is not None else None
        row = c.execute(
            f"WITH ins AS (INSERT INTO effect_runs (thread_id, id, name, status, args, "
            f"run_at, created_at, attempts, replay_of, key, schedule_id) "
            f"VALUES (%s, %s, %s, %s, %s, %s, %s, 0, %s, %s, %s) RETURNING thread_id) "
            f"{_TAKE_FRAME_SEQ}",
            (self.thread_id, run.id, run.name, str(run.status), args, run.run_at_ts,
             run.created_at_ts, run.replay_of, run.key, run.schedule_id),
        ).fetchone()
        assert row is not None
        c.execute(_LOWER_ALARM, (self.thread_id, run.run_at_ts))
        if run.run_at_ts - run.created_at_ts <= WAKE_WITHIN_SECONDS:
            # Due soon: tell every node now. Later runs are found by the nodes' alarm
            # polls well before they are due (docs/scale-out.md, "Wake-ups").
            self._backend.cluster.wake_in(c, self.thread_id, run.run_at_ts)
        if run.trace_context is not None:
            c.execute(
                "INSERT INTO run_traces (thread_id, run_id, context) VALUES (%s, %s, %s)",
                (self.thread_id, run.id, run.trace_context),
            )
        return int(row[0])

    # ------------------------------------------------------------ recurring schedules

    def _schedule(self, c: Cursor, schedule_id: str) -> Schedule | None:
        row = c.execute(
            f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE thread_id = %s AND id = %s",
            (self.thread_id, schedule_id),
        ).fetchone()
        return None if row is None else _row_to_schedule(self.thread_id, row)

    def insert_schedule(self, schedule: Schedule) -> Schedule | None:  # noqa: D102
        args = (
            json.dumps(schedule.args, separators=(",", ":")) if schedule.args is not None
            else None
        )
        rec = schedule.recurrence

        def tx(c: Cursor) -> Schedule | None:
            # Key-share locked until the commit, as a run's insert is: a deletion
            # committing meanwhile either removes this schedule or is seen here.
            if c.execute("SELECT 1 FROM threads WHERE id = %s FOR KEY SHARE",
                         (self.thread_id,)).fetchone() is None:
                raise ThreadNotFound(self.thread_id)  # deleted by another node
            if schedule.key is not None:
                row = c.execute(
                    f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE thread_id = %s "
                    f"AND key = %s", (self.thread_id, schedule.key),
                ).fetchone()
                if row is not None:
                    return _row_to_schedule(self.thread_id, row)
            c.execute(
                f"INSERT INTO schedules (thread_id, {_SCHEDULE_COLUMNS}) VALUES "
                f"(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0, NULL, NULL)",
                (self.thread_id, schedule.id, schedule.name, args, rec.cron, rec.timezone,
                 rec.every_seconds, str(schedule.state), schedule.next_fire_at_ts,
                 schedule.created_at_ts, schedule.key),
            )
            if schedule.state is ScheduleState.ACTIVE and schedule.next_fire_at_ts is not None:
                c.execute(_LOWER_ALARM, (self.thread_id, schedule.next_fire_at_ts))
            return None

        return self._tx(tx)

    def get_schedule(self, schedule_id: str) -> Schedule | None:  # noqa: D102
        return self._tx(lambda c: self._schedule(c, schedule_id))

    def list_schedules(self) -> list[Schedule]:  # noqa: D102
        rows = self._tx(lambda c: c.execute(
            f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE thread_id = %s ORDER BY seq",
            (self.thread_id,),
        ).fetchall())
        return [_row_to_schedule(self.thread_id, r) for r in rows]

    def set_schedule_state(  # noqa: D102
        self, schedule_id: str, state: ScheduleState, next_fire_at: float | None
    ) -> Schedule | None:
        def tx(c: Cursor) -> Schedule | None:
            c.execute(
                "UPDATE schedules SET state = %s, next_fire_at = %s WHERE thread_id = %s "
                "AND id = %s", (str(state), next_fire_at, self.thread_id, schedule_id),
            )
            found = self._schedule(c, schedule_id)
            if found is not None and state is ScheduleState.ACTIVE \
                    and next_fire_at is not None:
                c.execute(_LOWER_ALARM, (self.thread_id, next_fire_at))
            return found

        return self._tx(tx)

    def delete_schedule(self, schedule_id: str) -> Schedule | None:  # noqa: D102
        def tx(c: Cursor) -> Schedule | None:
            found = self._schedule(c, schedule_id)
            if found is not None:
                c.execute("DELETE FROM schedules WHERE thread_id = %s AND id = %s",
                          (self.thread_id, schedule_id))
            return found

        return self._tx(tx)

    def due_schedules(self, now: float) -> list[Schedule]:  # noqa: D102
        rows = self._tx(lambda c: c.execute(
            f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE thread_id = %s "
            f"AND state = 'active' AND next_fire_at <= %s ORDER BY next_fire_at, seq",
            (self.thread_id, now),
        ).fetchall())
        return [_row_to_schedule(self.thread_id, r) for r in rows]

    def next_schedule_fire(self) -> float | None:  # noqa: D102
        # One read: autocommitted (a drain on a shared store asks it every time, so the
        # BEGIN and COMMIT round trips were two thirds of its cost).
        return self._tx(self._next_fire, single=True)

    def _next_fire(self, c: Cursor) -> float | None:
        row = c.execute(
            "SELECT min(next_fire_at) FROM schedules WHERE thread_id = %s AND state = 'active'",
            (self.thread_id,),
        ).fetchone()
        return None if row is None else row[0]

    def fire_schedule(  # noqa: D102
        self,
        schedule_id: str,
        fire_at: float,
        run: EffectRun | None,
        skipped: int,
        last_fire_at: float,
        next_fire_at: float | None,
    ) -> tuple[Schedule | None, EffectRun | None]:
        self.frame_seq = None

        def tx(c: Cursor) -> tuple[Schedule | None, EffectRun | None]:
            c.execute(  # one fire at a time: the row is locked until this commits
                "SELECT 1 FROM schedules WHERE thread_id = %s AND id = %s FOR UPDATE",
                (self.thread_id, schedule_id),
            )
            current = self._schedule(c, schedule_id)
            if (
                current is None
                or current.state is not ScheduleState.ACTIVE
                or current.next_fire_at_ts != fire_at
            ):
                return current, None
            stored = None
            if run is not None:
                self.frame_seq = self._insert_run_in(c, replace(run, schedule_id=schedule_id))
                stored = self._with_trace(c, self._one(
                    c, f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE thread_id = %s "
                    f"AND id = %s", (self.thread_id, run.id),
                ))
            c.execute(
                "UPDATE schedules SET occurrences = occurrences + %s, "
                "last_run_id = coalesce(%s, last_run_id), skipped = skipped + %s, "
                "last_fire_at = %s, next_fire_at = %s WHERE thread_id = %s AND id = %s",
                (0 if run is None else 1, None if run is None else run.id, skipped,
                 last_fire_at, next_fire_at, self.thread_id, schedule_id),
            )
            return self._schedule(c, schedule_id), stored

        return self._tx(tx)

    def run_attempts(self, run_id: str) -> list[RunAttempt]:  # noqa: D102
        rows = self._tx(lambda c: c.execute(
            "SELECT attempt, started_at, ended_at, outcome, error, node_id FROM run_attempts "
            "WHERE thread_id = %s AND run_id = %s ORDER BY attempt",
            (self.thread_id, run_id),
        ).fetchall())
        return [RunAttempt(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def finish_and_claim(  # noqa: D102 - contract in base
        self,
        finish: Finish | None,
        now: float,
        *,
        claim: bool = True,
        retention: RetentionPolicy | None = None,
        only_names: Collection[str] | None = None,
        durable: bool = True,  # every commit is durable here (no group commit)
    ) -> tuple[EffectRun | None, EffectRun | None, float | None]:
        names: list[str] | None = None
        where = ""
        if only_names is not None:
            names = list(only_names)
            if not names:
                if finish is None:
                    return None, None, None
                claim = False
            where = " AND name = ANY(%(names)s)"
        params: dict[str, Any] = {"t": self.thread_id, "now": now, "names": names,
                                  "node": self._backend.node_id,
                                  "known": list(self._backend.effects or ())}
        # The earliest pending run, and (any name) the earliest active schedule's fire.
        nexts = (
            f"(SELECT min(run_at) FROM effect_runs WHERE thread_id = %(t)s "
            f"AND status = 'pending'{where}), "
            + ("NULL::float8" if only_names is not None else
               "(SELECT min(next_fire_at) FROM schedules WHERE thread_id = %(t)s "
               "AND state = 'active')")
        )

        def next_due(run_due: float | None, fire: float | None) -> float | None:
            return fire if run_due is None else run_due if fire is None else min(run_due, fire)

        def finished_row(c: Cursor, row: Sequence[Any] | None) -> EffectRun | None:
            # The finish's columns then the thread's finished runs as of before the
            # statement (the run finished here is one more): the run, old ones pruned.
            if row is None or row[0] is None:
                return None
            if retention is not None:
                counted = row[-1]
                tally = self._finished_seen
                self._prune_in(c, now, retention, finished_count=(
                    int(counted) + 1 if counted is not None
                    else None if tally is None else tally + 1))
            return _row_to_run(self.thread_id, row[:-1])

        # Count the thread's finished runs with the finish only when pruning may be due
        # (see `_finished_seen`); else `_prune_in` goes by this store's own tally.
        seen = self._finished_seen
        count = retention is not None and (
            seen is None or _sweep_due(self._swept_at, now)
            or seen + 1 - retention.max_finished > retention.max_finished // 10)
        finish_params = None if finish is None else {
            "id": finish.run_id, "attempt": finish.attempt,
            "status": str(finish.status), "error": finish.error,
            "at": finish.finished_at, "by": finish.canceled_by, "count": count,
        }

        def tx(c: Cursor) -> tuple[EffectRun | None, EffectRun | None, float | None]:
            # The thread's row serializes claims across nodes. What is checked with it
            # (paused, another node running a run of the thread) is read by a statement
            # after the one that took the lock: under READ COMMITTED a statement sees the
            # data as of its start, so a check made in the statement that waited for the
            # lock would miss the run the lock's last holder just claimed.
            locked = claim and c.execute("SELECT 1 FROM threads WHERE id = %s FOR NO KEY UPDATE",
                                         (self.thread_id,)).fetchone() is not None
            return locked_tx(c, locked)

        def locked_tx(
            c: Cursor, locked: bool
        ) -> tuple[EffectRun | None, EffectRun | None, float | None]:
            # ``locked``: this transaction holds the thread's row lock, taken by an
            # earlier statement (here or in `_ClaimGroup`); False: not claiming, or the
            # thread is deleted.
            self.claim_blocked = None
            if not locked:
                # Not claiming (or the thread is deleted): only the outcome is written.
                finished = None if finish_params is None else finished_row(c, c.execute(
                    _FINISH_RUN, {"t": self.thread_id, **finish_params}).fetchone())
                if claim:
                    self.claim_blocked = "paused"  # deleted: nothing is claimed
                return finished, None, None
            # One statement: the checks, the outcome (its trace dropped, its attempt
            # ended), and, unless a check blocks it, the claim with its attempt row, its
            # trace context and what is due next if nothing was (the pending runs as of
            # before the claim: none due).
            out = c.execute(
                _claim_sql(finishing=finish_params is not None,
                           named=only_names is not None),
                {**params, **(finish_params or {})},
            ).fetchone()
            assert out is not None
            return settle(c, out)

        def settle(
            c: Cursor, out: Sequence[Any]
        ) -> tuple[EffectRun | None, EffectRun | None, float | None]:
            # The claim statement's row (`_claim_sql`'s shape): the call's answer.
            self.claim_blocked = None
            paused, busy, foreign = out[0], out[1], out[2]
            finished = None
            at = 3
            if finish_params is not None:
                finished = finished_row(c, out[at:at + _RUN_WIDTH + 1])
                at += _RUN_WIDTH + 1
            if paused or busy or foreign:
                self.claim_blocked = "paused" if paused else "busy" if busy else "foreign"
                return finished, None, None
            claim_row = out[at:at + _RUN_WIDTH]
            trace, run_due, fire = out[at + _RUN_WIDTH:]
            if claim_row[0] is None:
                return finished, None, next_due(run_due, fire)
            claimed = _row_to_run(self.thread_id, claim_row)
            if trace is not None:
                claimed = replace(claimed, trace_context=trace)
            return finished, claimed, None

        self.claim_blocked = None
        hinted = only_names is None and self._due_seen is not None and self._due_seen <= now
        if finish is None and claim and not hinted:
            # Nothing to write unless a run is due: probe first with one read (skipped
            # when this store knows of a run due by now: the claim would follow anyway).
            probe = self._tx(lambda c: c.execute(f"SELECT {nexts}", params).fetchone(),
                             single=True)
            assert probe is not None
            run_due, fire = probe
            if only_names is None:
                self._due_seen = run_due
            if run_due is None or run_due > now:
                return None, None, next_due(run_due, fire)
        # In a group, a claim of any name runs in the group's one statement (`_CLAIM_GROUP`);
        # one with ``only_names`` runs its own (the names differ per call).
        row = None if only_names is not None else {
            "t": self.thread_id, "now": now, **(finish_params or dict.fromkeys(
                ("id", "attempt", "status", "error", "at", "by", "count")))}
        result = self._backend._claims.run(
            _ClaimCall(self, claim, tx, locked_tx, row, settle))
        if only_names is None and claim:
            # What is due next as the claim read it when it found nothing; after a claim,
            # unknown (the drain finishes the run with another claim, which reads it).
            self._due_seen = result[2] if result[1] is None and \
                self.claim_blocked is None else None
        return result

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
        if run_ids is not None and not run_ids:
            return []

        def tx(c: Cursor) -> list[EffectRun]:
            # Serialized with other nodes' claims of the thread (`finish_and_claim`).
            c.execute("SELECT 1 FROM threads WHERE id = %s FOR NO KEY UPDATE", (self.thread_id,))
            # A run another node holds under a live lease is that node's, and with
            # dead_nodes_only so is every run of this node.
            mine = "" if dead_nodes_only else "a.node_id = %s OR "
            sql = (
                f"SELECT r.id, r.attempts FROM effect_runs r {_ATTEMPT_JOIN} "
                f"WHERE r.thread_id = %s AND r.status = 'running' AND (a.node_id IS NULL OR "
                f"{mine}(a.node_id <> %s AND NOT {_LIVE_NODE}))"
            )
            node = self._backend.node_id
            params: tuple[Any, ...] = (
                (self.thread_id, node) if dead_nodes_only else (self.thread_id, node, node))
            if run_ids is not None:
                sql += " AND r.id = ANY(%s)"
                params += (list(run_ids),)
            rows = c.execute(sql + " ORDER BY r.seq FOR UPDATE OF r", params).fetchall()
            changed: list[EffectRun] = []
            for run_id, attempts in rows:
                if attempts >= max_attempts:
                    run = self._one(
                        c,
                        f"UPDATE effect_runs SET status = 'failed', finished_at = %s, "
                        f"error = %s WHERE thread_id = %s AND id = %s RETURNING {_RUN_COLUMNS}",
                        (now, interrupted_error(attempts, max_attempts, reason),
                         self.thread_id, run_id),
                    )
                else:
                    run = self._one(
                        c,
                        f"UPDATE effect_runs SET status = 'pending', run_at = LEAST(run_at, %s) "
                        f"WHERE thread_id = %s AND id = %s RETURNING {_RUN_COLUMNS}",
                        (now, self.thread_id, run_id),
                    )
                if run is not None:
                    self._end_attempt(c, run, "interrupted", now, reason)
                    if run.status.finished:
                        self._drop_trace(c, run)
                    changed.append(run)
            pending = [r.run_at_ts for r in changed if r.status is EffectStatus.PENDING]
            if pending:
                c.execute(_LOWER_ALARM, (self.thread_id, min(pending)))
                # Announced at commit: a node shutting down re-queues its runs here, and
                # another node takes them on this wake-up, not at its next alarm poll.
                self._backend.cluster.wake_in(c, self.thread_id, min(pending))
            if retention is not None:
                self._prune_in(c, now, retention)
            return changed

        return self._tx(tx)

    def cancel(  # noqa: D102
        self,
        run_id: str,
        now: float,
        *,
        retention: RetentionPolicy | None = None,
        canceled_by: str | None = None,
    ) -> EffectRun | None:
        def tx(c: Cursor) -> EffectRun | None:
            run = self._one(
                c,
                f"UPDATE effect_runs SET status = 'canceled', finished_at = %s, "
                f"canceled_by = %s WHERE thread_id = %s AND id = %s AND status = 'pending' "
                f"RETURNING {_RUN_COLUMNS}",
                (now, canceled_by, self.thread_id, run_id),
            )
            self._drop_trace(c, run)
            if run is not None and retention is not None:
                self._prune_in(c, now, retention)
            return run

        return self._tx(tx)

    def run_now(self, run_id: str, now: float) -> EffectRun | None:  # noqa: D102
        def tx(c: Cursor) -> EffectRun | None:
            run = self._one(
                c,
                f"UPDATE effect_runs SET run_at = LEAST(run_at, %s) WHERE thread_id = %s "
                f"AND id = %s AND status = 'pending' RETURNING {_RUN_COLUMNS}",
                (now, self.thread_id, run_id),
            )
            if run is not None:
                c.execute(_LOWER_ALARM, (self.thread_id, run.run_at_ts))
                self._backend.cluster.wake_in(c, self.thread_id, run.run_at_ts)
            return run

        return self._tx(tx)

    def _visible(
        self, c: Cursor, now: float, retention: RetentionPolicy
    ) -> tuple[str, tuple[Any, ...]]:
        """The read-side retention filter (as `SQLiteThreadStore._visible`)."""
        cutoffs = (now - retention.completed_seconds, now - retention.failed_seconds)
        sql, params = f"NOT {_EXPIRED}", cutoffs
        if self._count_finished(c) <= retention.max_finished:
            return sql, params
        row = c.execute(
            _NEWEST_FINISHED,
            {"t": self.thread_id, "completed": cutoffs[0], "failed": cutoffs[1],
             "offset": retention.max_finished - 1},
        ).fetchone()
        if row is None:
            return sql, params
        return (
            f"{sql} AND (status NOT IN (%s, %s, %s) OR (finished_at, seq) >= (%s, %s))",
            (*params, *_FINISHED, row[0], row[1]),
        )

    def get_run(  # noqa: D102
        self, run_id: str, now: float, retention: RetentionPolicy
    ) -> EffectRun | None:
        def read(c: Cursor) -> EffectRun | None:
            visible, params = self._visible(c, now, retention)
            return self._with_trace(c, self._one(
                c,
                f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE thread_id = %s AND id = %s "
                f"AND {visible}",
                (self.thread_id, run_id, *params),
            ))

        return self._tx(read)

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
        where: list[str] = ["thread_id = %s"]
        params: list[Any] = [self.thread_id]
        if statuses:
            where.append("status = ANY(%s)")
            params.append([str(s) for s in statuses])
        if name is not None:
            where.append("name = %s")
            params.append(name)
        if before_seq is not None:
            where.append("seq < %s")
            params.append(before_seq)

        def read(c: Cursor) -> list[Any]:
            visible, vparams = self._visible(c, now, retention)
            sql = (
                f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE "
                f"{' AND '.join([*where, visible])} ORDER BY seq DESC LIMIT %s"
            )
            return c.execute(sql, (*params, *vparams, limit + 1)).fetchall()

        rows = self._tx(read)
        runs = [_row_to_run(self.thread_id, r) for r in rows[:limit]]
        cursor = int(rows[limit - 1][0]) if len(rows) > limit else None
        return runs, cursor

    def count_runs(  # noqa: D102
        self, now: float, retention: RetentionPolicy, *, name: str | None = None
    ) -> dict[EffectStatus, int]:
        def read(c: Cursor) -> list[Any]:
            visible, params = self._visible(c, now, retention)
            sql = f"SELECT status, count(*) FROM effect_runs WHERE thread_id = %s AND {visible}"
            args: tuple[Any, ...] = (self.thread_id, *params)
            if name is not None:
                sql += " AND name = %s"
                args = (*args, name)
            return c.execute(f"{sql} GROUP BY status", args).fetchall()

        counts = dict.fromkeys(EffectStatus, 0)
        for status, n in self._tx(read):
            counts[EffectStatus(status)] = int(n)
        return counts

    def pending_runs(self, name: str | None = None) -> list[EffectRun]:  # noqa: D102
        sql = (f"SELECT {_RUN_COLUMNS} FROM effect_runs WHERE thread_id = %s "
               f"AND status = 'pending'")
        params: tuple[Any, ...] = (self.thread_id,)
        if name is not None:
            sql += " AND name = %s"
            params += (name,)
        sql += " ORDER BY run_at, seq"
        rows = self._tx(lambda c: c.execute(sql, params).fetchall())
        return [_row_to_run(self.thread_id, r) for r in rows]

    def prune(self, now: float, retention: RetentionPolicy) -> int:  # noqa: D102
        def tx(c: Cursor) -> int:
            _THREAD_RECORDS.purge(c, self.thread_id,
                                  older_than=now - retention.effect_records_seconds)
            self._records_swept_at = now
            deleted = self._delete_expired(c, now, retention)
            self._swept_at = now
            excess = self._count_finished(c) - retention.max_finished
            if excess > 0:
                deleted += c.execute(
                    _DELETE_OLDEST_FINISHED, {"t": self.thread_id, "n": excess}
                ).rowcount
            if deleted:
                self._drop_orphan_attempts(c)
            return deleted

        return self._tx(tx)

    # ------------------------------------------------------------ messages

    def insert_messages(  # noqa: D102 - contract in base
        self, messages: Sequence[Message], *, fence: str | None = None
    ) -> None:
        if not messages:
            return

        def tx(c: Cursor) -> bool:
            if not self._fenced(c, fence):
                return False
            c.executemany(
                "INSERT INTO messages (thread_id, id, role, content, created_at, run_id, "
                "meta, data) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [(self.thread_id, m.id, str(m.role), m.content, m.created_at_ts, m.run_id,
                  m.meta_json(), m.data) for m in messages],
            )
            return True

        if not self._tx(tx):
            raise TurnLeaseLost(self.thread_id)

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
        tid = self.thread_id

        def seq_of(c: Cursor, message_id: str) -> int | None:
            row = c.execute("SELECT seq FROM messages WHERE thread_id = %s AND id = %s",
                            (tid, message_id)).fetchone()
            return None if row is None else int(row[0])

        def read(c: Cursor) -> tuple[list[Message], str | None, str | None] | None:
            if before_id is not None or latest:
                before: int | None = None
                if before_id is not None:
                    before = seq_of(c, before_id)
                    if before is None:
                        return None
                if before is None:
                    rows = c.execute(
                        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s "
                        f"ORDER BY seq DESC LIMIT %s", (tid, limit + 1),
                    ).fetchall()
                else:
                    rows = c.execute(
                        f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s "
                        f"AND seq < %s ORDER BY seq DESC LIMIT %s", (tid, before, limit + 1),
                    ).fetchall()
                page = [self._message(r) for r in reversed(rows[:limit])]
                older = len(rows) > limit
                newer = before is not None
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
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s AND seq > %s "
                f"ORDER BY seq LIMIT %s", (tid, after, limit + 1),
            ).fetchall()
            page = [self._message(r) for r in rows[:limit]]
            return (
                page,
                page[-1].id if len(rows) > limit else None,
                page[0].id if page and after_id is not None else None,
            )

        return self._tx(read)

    def get_message(self, message_id: str) -> Message | None:  # noqa: D102
        row = self._tx(lambda c: c.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s AND id = %s",
            (self.thread_id, message_id),
        ).fetchone())
        return self._message(row) if row is not None else None

    def all_messages(self) -> list[Message]:  # noqa: D102
        rows = self._tx(lambda c: c.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE thread_id = %s ORDER BY seq",
            (self.thread_id,),
        ).fetchall())
        return [self._message(r) for r in rows]

    # ------------------------------------------------------------ effect records

    def get_effect_record(self, key: str) -> EffectRecord | None:  # noqa: D102
        return self._tx(lambda c: _THREAD_RECORDS.get(c, self.thread_id, key))

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

        def tx(c: Cursor) -> Claim:
            claim = _THREAD_RECORDS.begin(
                c, self.thread_id, key, tool_name=tool_name, run_id=run_id, owner=owner,
                lease_seconds=lease_seconds, now=now,
            )
            if retention is not None and _sweep_due(self._records_swept_at, now):
                _THREAD_RECORDS.purge(c, self.thread_id,
                                      older_than=now - retention.effect_records_seconds)
                self._records_swept_at = now
            return claim

        return self._tx(tx)

    def complete_effect_record(  # noqa: D102
        self, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus = EffectRecordStatus.APPLIED,
    ) -> EffectRecord:
        return self._tx(lambda c: _THREAD_RECORDS.complete(
            c, self.thread_id, key, owner=owner, result_json=result_json, now=now,
            status=status,
        ))

    def renew_effect_record(  # noqa: D102
        self, key: str, *, owner: str, lease_seconds: float, now: float
    ) -> bool:
        _records.check_lease(lease_seconds)
        return self._tx(lambda c: _THREAD_RECORDS.renew(
            c, self.thread_id, key, owner=owner, lease_seconds=lease_seconds, now=now))

    def release_effect_record(self, key: str, *, owner: str) -> EffectRecord | None:  # noqa: D102
        def tx(c: Cursor) -> EffectRecord | None:
            record = _THREAD_RECORDS.get(c, self.thread_id, key)
            if record is None or not _THREAD_RECORDS.release(c, self.thread_id, key,
                                                             owner=owner):
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
        return self._tx(lambda c: _THREAD_RECORDS.list(
            c, self.thread_id, status=status, limit=limit, cursor=cursor, hide_journal=True))

    def expire_effect_leases(self, *, keep_owner_prefix: str, now: float) -> int:  # noqa: D102
        return self._tx(lambda c: _THREAD_RECORDS.expire_leases(
            c, self.thread_id, keep_owner_prefix=keep_owner_prefix, now=now))

    def purge_effect_records(self, *, older_than: float | None) -> int:  # noqa: D102
        if older_than is None:
            return self._tx(lambda c: _THREAD_RECORDS.purge_thread(c, self.thread_id))
        cutoff = older_than
        return self._tx(lambda c: _THREAD_RECORDS.purge(c, self.thread_id,
                                                        older_than=cutoff))

    def close(self) -> None:  # noqa: D102
        self._closed = True


# ------------------------------------------------------------------ runtime store


class PostgresRuntimeStore(RuntimeStore):
    """The registry, alarms, run index and runtime-level records, in the shared database.

    Failures raise `psycopg.Error` (the backend's own database error).
    """

    alarms_follow_runs = True

    def __init__(self, backend: PostgresBackend) -> None:
        self._backend = backend
        self._closed = False

    def _tx(self, fn: Callable[[Cursor], T], *, single: bool = False) -> T:
        """``fn`` in one transaction; ``single``: ``fn`` runs exactly one statement."""
        if self._closed:
            raise RuntimeClosed(
                f"The runtime store {redact_url(self._backend.url)} is closed")
        with self._backend.transaction(single=single) as c:
            return fn(c)

    @staticmethod
    def _info(row: Sequence[Any]) -> ThreadInfo:
        return ThreadInfo(
            id=row[0], created_at_ts=row[1], agent_id=row[2], user_id=row[3],
            tags=tuple(replace_lone_surrogates(t) for t in json.loads(row[4])),
            paused=bool(row[5]),
            last_activity_ts=row[6],
        )

    def add_thread(  # noqa: D102
        self, info: ThreadInfo, *, alarm_at: float | None = None
    ) -> bool:
        def tx(c: Cursor) -> bool:
            self._backend.lock_thread_id(c, info.id)
            added = c.execute(
                "INSERT INTO threads (id, created_at, agent_id, user_id, tags, "
                "last_activity_at) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (info.id, info.created_at_ts, info.agent_id, info.user_id,
                 json.dumps(list(info.tags)), info.created_at_ts),
            ).rowcount == 1
            if added and alarm_at is not None:
                c.execute(
                    "INSERT INTO alarms (thread_id, due_at) VALUES (%s, %s) ON CONFLICT "
                    "(thread_id) DO UPDATE SET due_at = LEAST(alarms.due_at, excluded.due_at)",
                    (info.id, alarm_at),
                )
            return added

        return self._tx(tx)

    def get_thread(self, thread_id: str) -> ThreadInfo | None:  # noqa: D102
        row = self._tx(lambda c: c.execute(
            f"SELECT {_THREAD_COLUMNS} FROM threads WHERE id = %s", (thread_id,)
        ).fetchone())
        return self._info(row) if row is not None else None

    def paused_flags(self, thread_ids: Sequence[str]) -> dict[str, bool]:  # noqa: D102
        rows = self._tx(lambda c: c.execute(
            "SELECT t.id, EXISTS (SELECT 1 FROM paused_threads p WHERE p.thread_id = t.id) "
            "FROM threads t WHERE t.id = ANY(%s)", (list(thread_ids),)
        ).fetchall(), single=True)
        return {str(r[0]): bool(r[1]) for r in rows}

    def list_threads(  # noqa: D102
        self, limit: int, after: tuple[float, str] | None, query: ThreadQuery | None = None
    ) -> tuple[list[ThreadInfo], tuple[float, str] | None]:
        query = query or ThreadQuery()
        key = "last_activity_at" if query.by_activity else "created_at"
        parts: list[str] = []
        params: list[Any] = []
        for column, value in (("user_id", query.user_id), ("agent_id", query.agent_id)):
            if value is not None:
                parts.append(f"{column} = %s")
                params.append(value)
        if query.tag is not None:
            # Containment of a one-element JSON array, not ``? tag``: the array's text never
            # starts with NUL_MARK, so a tag that does is compared as itself, not escaped.
            parts.append("tags::jsonb @> %s::jsonb")
            params.append(json.dumps([query.tag]))
        if after is not None:
            parts.append(f"({key}, id) < (%s, %s)")
            params += [after[0], after[1]]
        sql = f"SELECT {_THREAD_COLUMNS} FROM threads"
        if parts:
            sql += " WHERE " + " AND ".join(parts)
        sql += f" ORDER BY {key} DESC, id DESC LIMIT %s"
        rows = self._tx(lambda c: c.execute(sql, (*params, limit + 1)).fetchall())
        infos = [self._info(r) for r in rows[:limit]]
        cursor = None
        if len(rows) > limit:
            last = infos[-1]
            ts = last.last_activity_ts if query.by_activity else last.created_at_ts
            cursor = (ts if ts is not None else last.created_at_ts, last.id)
        return infos, cursor

    def touch_threads(self, activity: Mapping[str, float]) -> dict[str, float]:  # noqa: D102
        if not activity:
            return {}
        ids = sorted(activity)
        params = (ids, [float(activity[t]) for t in ids])
        rows = self._tx(lambda c: c.execute(_TOUCH, params).fetchall(), single=True)
        return {str(r[0]): float(r[1]) for r in rows}

    def set_paused(self, thread_id: str, paused: bool) -> bool:  # noqa: D102
        def tx(c: Cursor) -> bool:
            # Key-share locked, so that a deletion committing meanwhile cannot miss the mark.
            if c.execute("SELECT 1 FROM threads WHERE id = %s FOR KEY SHARE",
                         (thread_id,)).fetchone() is None:
                return False
            if paused:
                c.execute("INSERT INTO paused_threads (thread_id) VALUES (%s) "
                          "ON CONFLICT DO NOTHING", (thread_id,))
            else:
                c.execute("DELETE FROM paused_threads WHERE thread_id = %s", (thread_id,))
            return True

        return self._tx(tx)

    def delete_thread(  # noqa: D102 - contract in base
        self, thread_id: str, *, frame: FrameDraft | None = None, now: float = 0.0,
        notify: tuple[str, str] | None = None,
    ) -> bool:
        bus = self._backend.cluster

        def tx(c: Cursor) -> bool:
            if frame is not None:
                # The thread's registry row, then its frame counter, then (below) its alarm
                # row: a run's insert locks the counter before the alarm row
                # (`_insert_run_sql`), so the two never deadlock. No thread, no number.
                row = c.execute(_TAKE_DELETION_SEQ, (thread_id,)).fetchone()
                if row is not None:
                    bus.append_frames_in(c, [replace(frame, seq=int(row[0]))], now)
            else:
                c.execute("SELECT 1 FROM threads WHERE id = %s FOR UPDATE", (thread_id,))
            # The registry row is locked by the statement above, so the one below (a new
            # snapshot under READ COMMITTED) sees every index entry and pause mark of the
            # thread committed by transactions that held the row's key-share lock (an index
            # batch, a run's insert, a pause): none can commit one after it.
            existed: bool = c.execute(_DELETE_THREAD, {"t": thread_id}).rowcount == 1
            if existed and notify is not None:
                bus.notify_sql(c, *notify)  # sent at the commit, after the frame's
            return existed

        return self._tx(tx)

    # ------------------------------------------------------------ run index

    def index_runs(self, runs: Sequence[EffectRun]) -> dict[str, float]:  # noqa: D102
        if not runs:
            return {}
        # One row per run (the last given wins), in key order, and the threads' rows
        # (`touch_threads`) in id order: two batches (or a batch and a thread's own
        # transaction) lock rows in one order, never in opposite orders (a deadlock the
        # server breaks by failing one of them). Each is one statement over arrays: a row
        # costs the client a few microseconds, where a statement per row cost tens.
        by_key = {(r.thread_id, r.id): r for r in runs}
        ordered = [by_key[k] for k in sorted(by_key)]
        columns = tuple(list(c) for c in zip(*(
            (r.id, r.thread_id, r.name, str(r.status), r.run_at_ts, r.created_at_ts,
             r.started_at_ts, r.finished_at_ts, r.attempts, r.error, r.replay_of, r.key,
             r.canceled_by, r.schedule_id)
            for r in ordered), strict=True))
        latest: dict[str, float] = {}
        for r in runs:
            ts = max(r.created_at_ts, r.started_at_ts or 0.0, r.finished_at_ts or 0.0)
            latest[r.thread_id] = max(ts, latest.get(r.thread_id, ts))
        self._tx(lambda c: c.execute(_INDEX_RUNS, columns), single=True)
        # The activity in a transaction of its own (see `_TOUCH`): the index batch locks
        # no thread's row, so claims never wait for its commit.
        return self.touch_threads(latest)

    @staticmethod
    def _where(
        query: RunQuery, now: float, retention: RetentionPolicy, *, statuses: bool = True,
        replays: str = "run_index",
    ) -> tuple[str, list[Any]]:
        parts = [f"NOT {_EXPIRED}"]
        params: list[Any] = [now - retention.completed_seconds, now - retention.failed_seconds]
        if statuses and query.statuses is not None:
            parts.append("status = ANY(%s)")
            params.append([str(s) for s in query.statuses])
        for column, value in (("name", query.name), ("thread_id", query.thread_id),
                              ("user_id", query.user_id)):
            if value is not None:
                parts.append(f"{column} = %s")
                params.append(value)
        if query.since is not None:
            parts.append("run_at >= %s")
            params.append(query.since)
        if query.until is not None:
            parts.append("run_at < %s")
            params.append(query.until)
        if query.tag is not None:
            parts.append(
                "EXISTS (SELECT 1 FROM threads t WHERE t.id = run_index.thread_id "
                "AND t.tags::jsonb @> %s::jsonb)"  # see `list_threads`
            )
            params.append(json.dumps([query.tag]))
        if query.replayed is not None:
            # A replay is a run of the same thread: the (thread_id, ...) key keeps it cheap.
            parts.append(
                ("" if query.replayed else "NOT ")
                + f"EXISTS (SELECT 1 FROM {replays} r WHERE r.thread_id = run_index.thread_id "
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
        return self._list_runs("run_index", "run_index", query, now, retention, limit, before)

    def list_stored_runs(  # noqa: D102
        self,
        query: RunQuery,
        now: float,
        retention: RetentionPolicy,
        limit: int,
        before: tuple[float, str] | None = None,
    ) -> tuple[list[EffectRun], tuple[float, str] | None]:
        return self._list_runs(_STORED_RUNS, "effect_runs", query, now, retention, limit,
                               before)

    def count_stored_runs(  # noqa: D102
        self, query: RunQuery, now: float, retention: RetentionPolicy
    ) -> dict[EffectStatus, int]:
        return self._count_runs(_STORED_RUNS, "effect_runs", query, now, retention)

    def running_runs(  # noqa: D102
        self, thread_ids: Sequence[str], now: float, retention: RetentionPolicy
    ) -> list[EffectRun]:
        if not thread_ids:
            return []
        rows = self._tx(lambda c: c.execute(
            f"SELECT {_INDEX_COLUMNS} FROM {_STORED_RUNS} "
            f"WHERE thread_id = ANY(%s) AND status = 'running'", (list(thread_ids),),
        ).fetchall())
        return [self._indexed(r) for r in rows]

    @staticmethod
    def _indexed(r: Sequence[Any]) -> EffectRun:
        return EffectRun(
            id=r[0], thread_id=r[1], name=r[2], status=EffectStatus(r[3]), args=None,
            run_at_ts=r[4], created_at_ts=r[5], started_at_ts=r[6], finished_at_ts=r[7],
            attempts=r[8], error=r[9], replay_of=r[10], key=r[11], canceled_by=r[12],
            schedule_id=r[13],
        )

    def _list_runs(
        self,
        source: str,
        replays: str,
        query: RunQuery,
        now: float,
        retention: RetentionPolicy,
        limit: int,
        before: tuple[float, str] | None,
    ) -> tuple[list[EffectRun], tuple[float, str] | None]:
        where, params = self._where(query, now, retention, replays=replays)
        if before is not None:
            where += " AND (created_at, run_id) < (%s, %s)"
            params += [before[0], before[1]]
        sql = (
            f"SELECT {_INDEX_COLUMNS} FROM {source} WHERE {where} "
            f"ORDER BY created_at DESC, run_id DESC LIMIT %s"
        )
        rows = self._tx(lambda c: c.execute(sql, (*params, limit + 1)).fetchall())
        runs = [self._indexed(r) for r in rows[:limit]]
        cursor = (runs[-1].created_at_ts, runs[-1].id) if len(rows) > limit else None
        return runs, cursor

    def count_indexed_runs(  # noqa: D102
        self, query: RunQuery, now: float, retention: RetentionPolicy
    ) -> dict[EffectStatus, int]:
        return self._count_runs("run_index", "run_index", query, now, retention)

    def _count_runs(
        self, source: str, replays: str, query: RunQuery, now: float,
        retention: RetentionPolicy,
    ) -> dict[EffectStatus, int]:
        where, params = self._where(query, now, retention, statuses=False, replays=replays)
        rows = self._tx(lambda c: c.execute(
            f"SELECT status, count(*) FROM {source} WHERE {where} GROUP BY status", params,
        ).fetchall())
        counts = dict.fromkeys(EffectStatus, 0)
        for status, n in rows:
            counts[EffectStatus(status)] = int(n)
        return counts

    def prune_run_index(self, now: float, retention: RetentionPolicy) -> int:  # noqa: D102
        return self._tx(lambda c: c.execute(
            f"DELETE FROM run_index WHERE {_EXPIRED}",
            (now - retention.completed_seconds, now - retention.failed_seconds),
        ).rowcount)

    def run_index_complete(self) -> bool:  # noqa: D102
        row = self._tx(lambda c: c.execute(
            "SELECT value FROM runtime_meta WHERE key = %s", (_INDEX_COMPLETE,)
        ).fetchone())
        return row is not None and row[0] == "1"

    def set_run_index_complete(self, complete: bool) -> None:  # noqa: D102
        self._tx(lambda c: c.execute(
            "INSERT INTO runtime_meta (key, value) VALUES (%s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (_INDEX_COMPLETE, "1" if complete else "0"),
        ))

    # ------------------------------------------------------------ alarms

    def set_alarm(self, thread_id: str, due_at: float | None) -> None:  # noqa: D102
        if due_at is None:
            self._tx(lambda c: c.execute("DELETE FROM alarms WHERE thread_id = %s",
                                         (thread_id,)), single=True)
        else:
            self._tx(lambda c: c.execute(
                "INSERT INTO alarms (thread_id, due_at) VALUES (%s, %s) "
                "ON CONFLICT (thread_id) DO UPDATE SET due_at = excluded.due_at",
                (thread_id, due_at),
            ), single=True)

    def lower_alarm(self, thread_id: str, due_at: float) -> None:  # noqa: D102
        self._tx(lambda c: c.execute(
            "INSERT INTO alarms (thread_id, due_at) VALUES (%s, %s) ON CONFLICT (thread_id) "
            "DO UPDATE SET due_at = LEAST(alarms.due_at, excluded.due_at)",
            (thread_id, due_at),
        ), single=True)

    def move_alarms(  # noqa: D102
        self, changes: Sequence[tuple[str, float | None, float | None]]
    ) -> list[tuple[str, float | None]]:
        def tx(c: Cursor) -> list[tuple[str, float | None]]:
            applied: list[tuple[str, float | None]] = []
            # In thread order: two nodes' flushes lock their rows in one order (no deadlock).
            for thread_id, expected, target in sorted(changes, key=lambda m: m[0]):
                if expected is None:
                    if target is not None:
                        c.execute(_LOWER_ALARM, (thread_id, target))
                    continue
                # The row first, then (a statement later, so a run committed while this
                # waited for the lock is seen) the thread's first pending due time.
                row = c.execute("SELECT due_at FROM alarms WHERE thread_id = %s FOR UPDATE",
                                (thread_id,)).fetchone()
                held = None if row is None else float(row[0])
                if held != expected:
                    applied.append((thread_id, held))  # what the row holds, for the caller
                    continue
                first = c.execute(_FIRST_DUE, {"t": thread_id}).fetchone()
                due = None if first is None or first[0] is None else float(first[0])
                value = due if target is None else target if due is None else min(target, due)
                if value is None:
                    c.execute("DELETE FROM alarms WHERE thread_id = %s", (thread_id,))
                elif value != expected:
                    c.execute("UPDATE alarms SET due_at = %s WHERE thread_id = %s",
                              (value, thread_id))
                applied.append((thread_id, value))
            return applied

        return self._tx(tx)

    def load_alarms(self, until: float | None = None) -> list[tuple[str, float]]:  # noqa: D102
        rows = self._tx(
            lambda c: c.execute("SELECT thread_id, due_at FROM alarms").fetchall()
            if until is None else
            c.execute("SELECT thread_id, due_at FROM alarms WHERE due_at < %s",
                      (until,)).fetchall()
        )
        return [(r[0], r[1]) for r in rows]

    # ------------------------------------------------------------ runtime-level records

    def get_record(self, scope: str, key: str) -> EffectRecord | None:  # noqa: D102
        return self._tx(lambda c: _RUNTIME_RECORDS.get(c, scope, key))

    def begin_record(  # noqa: D102
        self, scope: str, key: str, *, tool_name: str, run_id: str | None, owner: str,
        lease_seconds: float, now: float,
    ) -> Claim:
        _records.check_lease(lease_seconds)
        return self._tx(lambda c: _RUNTIME_RECORDS.begin(
            c, scope, key, tool_name=tool_name, run_id=run_id, owner=owner,
            lease_seconds=lease_seconds, now=now,
        ))

    def complete_record(  # noqa: D102
        self, scope: str, key: str, *, owner: str, result_json: str, now: float,
        status: EffectRecordStatus,
    ) -> EffectRecord:
        return self._tx(lambda c: _RUNTIME_RECORDS.complete(
            c, scope, key, owner=owner, result_json=result_json, now=now, status=status,
        ))

    def renew_record(  # noqa: D102
        self, scope: str, key: str, *, owner: str, lease_seconds: float, now: float
    ) -> bool:
        _records.check_lease(lease_seconds)
        return self._tx(lambda c: _RUNTIME_RECORDS.renew(
            c, scope, key, owner=owner, lease_seconds=lease_seconds, now=now))

    def release_record(self, scope: str, key: str, *, owner: str) -> bool:  # noqa: D102
        return self._tx(lambda c: _RUNTIME_RECORDS.release(c, scope, key, owner=owner))

    def list_records(  # noqa: D102
        self, scope: str, *, status: EffectRecordStatus | None = None, limit: int = 50,
        cursor: str | None = None,
    ) -> EffectRecordPage:
        _records.check_limit(limit)
        if cursor is not None:
            _records.decode_cursor(cursor)
        return self._tx(lambda c: _RUNTIME_RECORDS.list(
            c, scope, status=status, limit=limit, cursor=cursor))

    def delete_records(self, scope: str) -> int:  # noqa: D102
        return self._tx(lambda c: _RUNTIME_RECORDS.purge_thread(c, scope))

    def purge_records(self, *, older_than: float) -> int:  # noqa: D102
        return self._tx(lambda c: _RUNTIME_RECORDS.purge(c, None, older_than=older_than))

    def close(self) -> None:  # noqa: D102
        self._closed = True


# ------------------------------------------------------------------ backend


class PostgresBackend(StorageBackend):
    """Every thread and the runtime's tables in one PostgreSQL database (schema).

    Args:
        url: A libpq connection URL, ``postgresql://user[:password]@host:port/dbname``. A
            ``schema=<name>`` query parameter (taken off before connecting) sets ``schema``.
        schema: The PostgreSQL schema the tables live in (created if missing), a lowercase
            identifier (``[a-z_][a-z0-9_]*``, at most 63 characters); default ``public``,
            or the URL's ``schema`` parameter.
        pool_size: The most connections the pool opens (the runtime's storage threads use
            at most 16 at once; one more connection holds the lock).
        connect_timeout: Seconds to wait for a connection (from the pool or the server)
            before a call fails.
        node_id: This process's node id (default: set by the runtime from its settings,
            `runtime.config.Settings.node_id`).
        lease_seconds: The node lease period (seconds; default 30): renewed every third
            of it; a node that has not renewed it for this long is dead to the others.

    Several processes ("nodes") may open the same schema at once: each registers in the
    ``nodes`` table with a lease it renews, and holds a session advisory lock on its node
    id (so two live processes with one node id are refused). A node claims a thread's run
    only while no other node runs one of that thread's runs, and re-queues the runs of
    nodes whose lease expired (`orphaned_runs`).

    Attributes:
        cluster: The `PostgresClusterBus` of this schema (``LISTEN``/``NOTIFY`` between
            the processes sharing it); it listens from `open` to `close`.

    Raises:
        ValueError: an invalid ``schema`` (or one of PostgreSQL's own: ``information_schema``,
            ``pg_*``), ``pool_size``, ``node_id`` or ``lease_seconds``.
    """

    exclusive = False

    def __init__(
        self, url: str, *, schema: str | None = None, pool_size: int = 17,
        connect_timeout: float = 10.0, node_id: str | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        from runtime.config import validate_node_id
        from runtime.storage.pg_bus import PostgresClusterBus

        if node_id is not None:
            validate_node_id(node_id)
        if not 0.5 <= lease_seconds <= 86_400:
            raise ValueError(f"lease_seconds must be from 0.5 to 86400, got {lease_seconds}")
        url, from_url = split_schema(url)
        if schema is None:
            schema = from_url or "public"
        if not _SCHEMA_RE.fullmatch(schema):
            raise ValueError(
                f"Invalid PostgreSQL schema name {schema!r}: must match [a-z_][a-z0-9_]* "
                f"(at most 63 characters)"
            )
        if schema == "information_schema" or schema.startswith("pg_"):
            raise ValueError(
                f"Invalid PostgreSQL schema name {schema!r}: information_schema and names "
                f"beginning with pg_ are PostgreSQL's own; pick another"
            )
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        self.url = url
        self.schema = schema
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self._pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] | None = None
        self._lock_conn: psycopg.Connection[tuple[Any, ...]] | None = None
        # Renewals begun and ended on this backend's connections, counted by the one
        # thread that renews: odd while one runs (`connection_held`).
        self._renewals = 0
        # The node's connection last seen ended by the server (`connection_held`).
        self._lost_conn: psycopg.Connection[tuple[Any, ...]] | None = None
        # Wakes the renewing thread before its period ends (a lost connection seen, or
        # the backend closing).
        self._renew_now = threading.Event()
        self._guard = threading.Lock()
        # Set while this process does not hold the schema's lock after holding it.
        self._lock_problem: str | None = None
        # Set while the database holds a newer schema than this code knows (read with
        # each lease renewal): another node was upgraded and migrated it.
        self._schema_problem: str | None = None
        self._watch_stop = threading.Event()
        # id(connection) -> time.monotonic() it went back to the pool (see `_check`).
        self._returned_at: dict[int, float] = {}
        # Calls waiting for the database: id -> (connection, time.monotonic() begun,
        # deadline or None); the lease watch aborts those past their bound (`_watch`).
        self._in_flight: dict[int, tuple[psycopg.Connection[Any], float, float | None]] = {}
        self._in_flight_guard = threading.Lock()
        self._in_flight_next = 0
        # Set while a renewal failed for want of the database (not for a lost race).
        self._unreachable = False
        # Set while the pool's last attempt to open a connection failed (`_pool_class`).
        self._pool_refused = False
        # The server process of the node's lock connection (ended on reconnect, see
        # `_heartbeat`).
        self._lock_pid: int | None = None
        self.node_id = node_id
        self.lease_seconds = float(lease_seconds)
        self._token = uuid.uuid4().hex
        self._lease_valid_until = -math.inf  # time.monotonic() the lease surely lasts to
        self._lost_notified = False
        self.on_lease_lost = None
        self.cluster: PostgresClusterBus = PostgresClusterBus(self)
        self._claims = _ClaimGroup(self)

    @property
    def _lock_key(self) -> int:
        """The migration advisory lock key of this schema (a signed 64-bit integer)."""
        return zlib.crc32(f"thread-effects:{self.schema}".encode())

    @property
    def _node_key(self) -> int:
        """The advisory lock key of this node id in this schema (held while open)."""
        return zlib.crc32(f"thread-effects:{self.schema}:node:{self.node_id}".encode()) << 8

    def _connect_kwargs(self, role: str = "thread-effects") -> dict[str, Any]:
        return {
            "autocommit": True,
            "context": _adapters(),  # NUL-safe text (see `escape_nul`)
            # The server too drops a session whose client vanished (keepalives, the
            # user timeout) and one left idle in a transaction (its row locks would stop
            # other nodes' claims), see `IDLE_IN_TRANSACTION_SECONDS`.
            "options": (f"-c search_path={self.schema} "
                        f"-c tcp_keepalives_idle={KEEPALIVE_IDLE_SECONDS} "
                        f"-c tcp_keepalives_interval={KEEPALIVE_INTERVAL_SECONDS} "
                        f"-c tcp_keepalives_count={KEEPALIVE_COUNT} "
                        f"-c tcp_user_timeout={TCP_USER_TIMEOUT_SECONDS * 1000} "
                        f"-c idle_in_transaction_session_timeout="
                        f"{IDLE_IN_TRANSACTION_SECONDS * 1000}"),
            "connect_timeout": max(1, round(self.connect_timeout)),
            # A network cut that drops packets ends the connection within seconds (see
            # `TCP_USER_TIMEOUT_SECONDS`); libpq ignores these on a Unix socket.
            "keepalives": 1,
            "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
            "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
            "keepalives_count": KEEPALIVE_COUNT,
            "tcp_user_timeout": TCP_USER_TIMEOUT_SECONDS * 1000,
            # Seen in pg_stat_activity: which schema's pool (or lock) a connection is.
            "application_name": f"{role}:{self.schema}",
        }

    kind = "postgres"

    def connection_held(self) -> bool:
        """Whether the backend is open, its node's connection alive and its lease held.

        Between two renewals (a third of the lease) the connection is known lost as soon
        as its socket has something to read: nothing is sent to an idle connection but
        the server's error as it ends the session (a shutdown, ``pg_terminate_backend``)
        or the end of the stream. (Before, it was false only once the next renewal failed:
        up to 10 s late with the default lease, while `/api/ready` already said 503.)
        """
        conn = self._lock_conn
        if (conn is None or conn.closed or conn.broken or self._lock_problem is not None
                or self._lease_lapsed() or conn is self._lost_conn):
            return False
        renewals = self._renewals
        if renewals % 2 == 0 and _readable(conn) and self._renewals == renewals:
            # No renewal ran meanwhile: the server ended the session (for good: the
            # connection is known lost until the renewing thread replaces it). That thread
            # is woken to find it lost (it stops claiming) and reconnect now, not at its
            # next renewal.
            self._lost_conn = conn
            self._renew_now.set()
            return False
        return True

    def lock_problem(self) -> str | None:
        """Why this process must not start runs now (its node lease is not held), or None."""
        if self._lock_problem is not None:
            if self._unreachable:  # its reconnects fail too: say so, not only what was lost
                return (f"{self._lock_problem}; the database {redact_url(self.url)} cannot "
                        f"be reached now")
            return self._lock_problem
        if self._schema_problem is not None:
            return self._schema_problem
        if self._lock_conn is not None and self._lease_lapsed():
            return (f"the lease of node {self.node_id} was not renewed within its period "
                    f"({self.lease_seconds:g} s); this process starts no runs until it is")
        return None

    @property
    def lease_margin(self) -> float:
        """Seconds before its lease's end at which the node stops (a sixth, at most 5 s)."""
        return min(self.lease_seconds / 6, LEASE_MARGIN_MAX_SECONDS)

    @property
    def renew_deadline(self) -> float:
        """Seconds a lease renewal may take before it is aborted (a third of the lease, 1-5 s)."""
        return min(max(self.lease_seconds / 3, 1.0), RENEW_DEADLINE_MAX_SECONDS)

    def _lease_lapsed(self) -> bool:
        """Whether the node's own clock says its lease may end within `lease_margin`.

        Decided by ``time.monotonic()`` against the start of the last renewal that
        succeeded, whether or not a renewal is still waiting for its answer.
        """
        return time.monotonic() > self._lease_valid_until - self.lease_margin

    @contextmanager
    def _bounded(
        self, conn: psycopg.Connection[Any], seconds: float | None = None
    ) -> Iterator[None]:
        """Let the lease watch abort a call on ``conn`` that waits too long for the database.

        The call is aborted (``conn``'s socket shut down, so that it fails at once with a
        broken connection) once ``seconds`` have passed, if given; and, while the node
        knows the database unreachable (`lock_problem`), once it has waited
        `CALL_ABORT_SECONDS`.
        """
        started = time.monotonic()
        with self._in_flight_guard:
            self._in_flight_next += 1
            key = self._in_flight_next
            self._in_flight[key] = (
                conn, started, None if seconds is None else started + seconds)
        try:
            yield
        finally:
            with self._in_flight_guard:
                del self._in_flight[key]

    @staticmethod
    def _abort(conn: psycopg.Connection[Any]) -> None:
        """Shut down ``conn``'s socket: a call waiting on it fails at once (broken)."""
        with contextlib.suppress(Exception):
            fd = conn.pgconn.socket
            sock = socket.socket(fileno=fd)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()  # the descriptor stays libpq's

    def _watch(self, stop: threading.Event) -> None:
        """Decide the lease by this node's clock; abort calls past their bounds.

        Runs beside `_heartbeat` so that neither a renewal waiting on a dead socket nor
        any other call delays it: once the lease lapsed (`_lease_lapsed`), the effects
        this node runs are canceled (`on_lease_lost`), before another node may take the
        runs over.
        """
        while not stop.wait(WATCH_SECONDS):
            if self._lock_conn is None:
                return
            if self._lease_lapsed():
                self._lease_lost("not renewed within its period of "
                                 f"{self.lease_seconds:g} s")
            now = time.monotonic()
            unreachable = self._unreachable and self._lock_problem is not None
            # Under the guard: a call still registered has not let go of its connection,
            # so no other call can be using it.
            with self._in_flight_guard:
                for key, (conn, started, deadline) in list(self._in_flight.items()):
                    if ((deadline is not None and now > deadline)
                            or (unreachable and now - started > CALL_ABORT_SECONDS)):
                        # Once: its socket is not reused while the call holds it.
                        self._abort(conn)
                        self._in_flight[key] = (conn, math.inf, math.inf)

    def _renew(
        self, conn: psycopg.Connection[tuple[Any, ...]], *, take_over: bool = False
    ) -> bool:
        """Renew this node's lease on ``conn``; False if the row is another process's now.

        ``take_over`` (this process holds its node id's lock again, after losing it): a
        row another process with the same node id wrote is taken back once that process's
        lease ended (it closed, or died).
        """
        started = time.monotonic()
        expired = f" OR lease_expires_at <= {_DB_NOW}" if take_over else ""
        self._renewals += 1  # odd while the renewal runs (`connection_held`)
        try:
            with self._bounded(conn, self.renew_deadline):
                row = conn.execute(
                    f"UPDATE nodes SET lease_expires_at = {_DB_NOW} + %s, "
                    f"heartbeat_at = {_DB_NOW}, "
                    f"token = %s, claims = %s, effects = %s WHERE node_id = %s "
                    f"AND (token = %s{expired}) "
                    f"RETURNING (SELECT max(version) FROM schema_version)",
                    (self.lease_seconds, self._token, self.claims, self._effects_json(),
                     self.node_id, self._token),
                ).fetchone()
        finally:
            self._renewals += 1
        if row is None:
            return False
        self._lease_valid_until = started + self.lease_seconds
        self._check_schema(row[0])
        return True

    def _check_schema(self, version: int | None) -> None:
        """Stop claiming (and say why) while the database's schema is newer than this code.

        A rolling upgrade: a node of a newer version migrated the shared schema while this
        one runs. This node keeps its lease (its running runs end normally) but claims
        nothing, `lock_problem` names both versions (so `/api/ready` answers 503 and takes
        it out of rotation), until it is upgraded or the version goes back.
        """
        if version is not None and int(version) > SCHEMA_VERSION:
            problem = (f"the database {redact_url(self.url)} (schema {self.schema}) now has "
                       f"schema version {int(version)}, newer than this runtime's "
                       f"{SCHEMA_VERSION} (another node was upgraded); this node starts no "
                       f"runs: upgrade thread-effects here")
            if self._schema_problem != problem:
                log.error("%s", problem)
            self._schema_problem = problem
        elif self._schema_problem is not None:
            log.warning("the database's schema version is %s again: this node claims runs",
                        version)
            self._schema_problem = None

    def _lease_lost(self, why: str) -> None:
        """The lease may have expired: stop claiming (`lock_problem`), cancel running effects."""
        if self._lost_notified:
            return
        self._lost_notified = True
        log.error("node %s lost its lease (%s): it stops claiming runs and cancels the effects "
                  "it runs (other nodes re-queue them)", self.node_id, why)
        callback = self.on_lease_lost
        if callback is not None:
            try:
                callback(why)
            except Exception:
                log.exception("node %s: the lease-lost callback failed", self.node_id)

    def _heartbeat(self, stop: threading.Event, where: str) -> None:
        """Renew the node lease every third of its period; on a lost connection, reconnect.

        While the lease cannot be renewed the node claims nothing (`lock_problem`); once
        its period has passed without renewal, `on_lease_lost` is called (once).
        """
        import psycopg

        period = self.lease_seconds / 3
        delay = min(LOCK_RETRY_FIRST_SECONDS, period)

        def paused(seconds: float) -> bool:
            """Wait ``seconds`` or until woken; whether the backend is closing."""
            self._renew_now.wait(seconds)
            self._renew_now.clear()
            return stop.is_set()

        while not paused(period if self._lock_problem is None else delay):
            if time.monotonic() > self._lease_valid_until:
                self._lease_lost("not renewed within its period of "
                                 f"{self.lease_seconds:g} s")
            conn = self._lock_conn
            if conn is None:
                return
            if self._lock_problem is None:
                try:
                    if self._renew(conn):
                        self._lost_notified = False
                        continue
                    problem = (f"{where}: the lease of node {self.node_id} was taken by "
                               f"another process with the same node id; this process "
                               f"starts no runs")
                    log.error("%s", problem)
                    self._lock_problem = problem
                    self._lease_lost("taken by another process")
                    continue
                except _db_error() as exc:
                    if stop.is_set():
                        return
                    self._unreachable = True
                    self._lock_problem = (
                        f"{where}: the connection renewing node {self.node_id}'s lease was "
                        f"lost ({exc}); this process starts no runs until it renews it"
                    )
                    log.error("%s", self._lock_problem)
                    # Reconnected at once (a blink: the server ended the connection but
                    # answers), and if that fails after 1 s, doubling.
                    delay = min(LOCK_RETRY_FIRST_SECONDS, period) / 2
            try:
                new = psycopg.connect(self.url, **self._connect_kwargs("thread-effects-node"))
            except _db_error():
                self._unreachable = True
                delay = min(delay * 2, RECONNECT_MAX_SECONDS, period)
                continue
            self._unreachable = False  # the server answered
            try:
                with self._bounded(new, self.renew_deadline):
                    locked = self._try_lock(new, wait=0.0)
                    if not locked and self._lock_pid is not None:
                        # The old lock connection's server process may outlive a silent
                        # cut (the server saw no close): it is this process's own, end it.
                        new.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE pid = %s "
                            "AND locktype = 'advisory' AND granted AND objsubid = 1 "
                            "AND ((classid::bigint << 32) | objid::bigint) = %s",
                            (self._lock_pid, self._node_key))
                        locked = self._try_lock(new, wait=0.5)
                if not locked:
                    new.close()
                    problem = (f"{where}: node id {self.node_id} is held by another live "
                               f"process; this process starts no runs")
                    if self._lock_problem != problem:
                        log.error("%s", problem)
                    self._lock_problem = problem
                    delay = min(delay * 2, LOCK_RETRY_MAX_SECONDS, period)
                    continue
                renewed = self._renew(new, take_over=True)
            except _db_error():
                new.close()
                self._unreachable = True
                delay = min(delay * 2, RECONNECT_MAX_SECONDS, period)
                continue
            if not renewed:
                new.close()
                problem = (f"{where}: the lease of node {self.node_id} is held by another "
                           f"process with the same node id; this process starts no runs "
                           f"until that one stops")
                if self._lock_problem != problem:
                    log.error("%s", problem)
                self._lock_problem = problem
                self._lease_lost("taken by another process")
                delay = min(delay * 2, LOCK_RETRY_MAX_SECONDS, period)
                continue
            with self._guard:
                old, self._lock_conn = self._lock_conn, new
                if old is None:  # closed meanwhile
                    self._lock_conn = None
            if old is None:
                new.close()
                return
            # The replaced connection is closed here whatever happens next: a close()
            # that began meanwhile takes (and releases the lease on) the new one.
            old.close()
            if stop.is_set():
                return
            self._lock_pid = new.info.backend_pid
            self._lock_problem = None
            self._lost_notified = False
            delay = min(LOCK_RETRY_FIRST_SECONDS, period)
            log.warning("%s: node %s holds its lease again; starting runs again", where,
                        self.node_id)

    def _pool_class(self) -> type[psycopg.Connection[tuple[Any, ...]]]:
        """The pool's connection class: it tells this backend whether connecting works.

        While the pool's last attempt to connect failed, calls wait at most
        `UNAVAILABLE_WAIT_SECONDS` for a connection (`transaction`): the pool's next
        attempt may be seconds away.
        """
        import psycopg

        backend = self

        class PoolConnection(psycopg.Connection[tuple[Any, ...]]):
            @classmethod
            def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
                try:
                    conn = super().connect(conninfo, **kwargs)
                except Exception:
                    backend._pool_refused = True
                    raise
                backend._pool_refused = False
                return conn

        return PoolConnection

    def _check(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Raise if ``conn``, about to be taken from the pool, is not fit to use.

        A connection back in the pool for less than `RECENT_SECONDS` whose socket has
        nothing to read is used as it is: a server that ended it (a restart, a failover,
        ``pg_terminate_backend``, a proxy's cut) sent an error or closed the socket, which
        makes it readable. Any other is checked with an empty query, one round trip, which
        on a busy node would otherwise double the round trips of a call.
        """
        from psycopg import OperationalError
        from psycopg_pool import ConnectionPool

        if conn.closed or conn.broken:
            raise OperationalError("the connection is closed")
        returned = self._returned_at.get(id(conn))
        if returned is not None and time.monotonic() - returned < RECENT_SECONDS:
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN)
            if not poller.poll(0):
                return
        # Bounded: a connection a silent network cut left open would wait forever.
        with self._bounded(conn, CHECK_DEADLINE_SECONDS):
            ConnectionPool.check_connection(conn)

    @contextmanager
    def transaction(
        self, *, single: bool = False, first: bytes | None = None,
        rows: list[str] | None = None,
    ) -> Iterator[Cursor]:
        """A cursor in one transaction on a pooled connection (committed on success).

        Args:
            single: the caller runs exactly one statement: it runs in autocommit (the
                statement is its own transaction), which saves the ``BEGIN`` and
                ``COMMIT`` round trips.
            first: a parameterless statement (`_lock_threads_sql`) run first in the
                transaction, sent with its ``BEGIN`` in one round trip; not with
                ``single``.
            rows: filled with the first column of ``first``'s rows before the block runs.

        Raises:
            RuntimeClosed: the backend is not open.
            psycopg.Error: the database failed (the transaction is rolled back).
        """
        pool = self._pool
        if pool is None:
            raise RuntimeClosed(f"PostgreSQL backend {redact_url(self.url)} is not open")
        from psycopg_pool import PoolTimeout

        # While the lock's connection is known lost, or the pool's last attempt to connect
        # failed, a call waits briefly for a connection.
        known_down = self._lock_problem is not None or self._pool_refused
        wait = min(self.connect_timeout, UNAVAILABLE_WAIT_SECONDS) if known_down else (
            self.connect_timeout)
        started = time.monotonic()
        try:
            conn = self._take(pool, wait)
        except PoolTimeout as exc:
            waited = time.monotonic() - started  # less than ``wait`` once a check failed
            raise DatabaseUnavailable(
                f"PostgreSQL database {redact_url(self.url)} cannot be reached (no "
                f"connection within {waited:.0f} s); try again later") from exc
        try:
            # Aborted by the lease watch if it waits on a database known unreachable.
            block: contextlib.AbstractContextManager[list[str]] = (
                contextlib.nullcontext([]) if single else _plain_transaction(conn, first))
            # One cursor per pooled connection, reused by every call on it (a new
            # cursor per transaction was about 6 µs of CPU).
            cur = getattr(conn, "te_cursor", None)
            if cur is None or cur.closed:
                cur = conn.cursor()
                conn.te_cursor = cur  # type: ignore[attr-defined]
            with self._bounded(conn), block as got:
                if rows is not None:
                    rows.extend(got)
                yield cur
        except _db_error() as exc:
            if conn.broken:
                raise DatabaseUnavailable(
                    f"PostgreSQL database {redact_url(self.url)} cannot be reached: "
                    f"{exc}") from exc
            raise
        finally:
            self._returned_at[id(conn)] = time.monotonic()
            pool.putconn(conn)

    def _take(
        self, pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]], wait: float
    ) -> psycopg.Connection[tuple[Any, ...]]:
        """A checked connection from ``pool`` within ``wait`` seconds (`_check`).

        One that fails its check is closed (the pool opens a replacement) and the next is
        taken at once: after a blink (the server ended every connection) the call takes
        the pool's ended connections one after another, each failing without a round
        trip, then a new one, instead of the pool's own check loop, which sleeps 1 s,
        2 s, 4 s... between failed checks. Once one failed, the rest of the wait is at
        most `UNAVAILABLE_WAIT_SECONDS`: a server that ended the connection and takes
        no new one is an outage.

        Raises:
            psycopg_pool.PoolTimeout: no connection within the wait.
        """
        deadline = time.monotonic() + wait
        while True:
            conn = pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))
            try:
                self._check(conn)
            except Exception:
                conn.close()
                pool.putconn(conn)  # closed: the pool replaces it
                deadline = min(deadline, time.monotonic() + UNAVAILABLE_WAIT_SECONDS)
                continue
            return conn

    def open(self) -> PostgresRuntimeStore:  # noqa: D102 - contract in base
        import psycopg
        from psycopg_pool import ConnectionPool

        where = f"PostgreSQL database {redact_url(self.url)} (schema {self.schema})"
        if self.node_id is None:
            from runtime.config import default_node_id

            self.node_id = default_node_id()
        with self._guard:
            if self._lock_conn is not None:
                raise DataDirLocked(f"{where} is already open in this backend")
            try:
                lock_conn = psycopg.connect(
                    self.url, **self._connect_kwargs("thread-effects-node")
                )
            except _db_error() as exc:
                raise RuntimeStorageError(f"{where} cannot be reached: {exc}") from exc
            try:
                if not self._try_lock(lock_conn):
                    raise DataDirLocked(
                        f"{where}: node id {self.node_id} is in use by another live process; "
                        f"give each process its own node id (--node-id, "
                        f"THREAD_EFFECTS_NODE_ID)")
                created = self._migrate(lock_conn, where)
                self._register(lock_conn, where)
            except BaseException:
                lock_conn.close()
                raise
            self._lock_conn = lock_conn
            self._lock_pid = lock_conn.info.backend_pid
            self._pool = ConnectionPool(
                self.url, connection_class=self._pool_class(), min_size=1,
                max_size=self.pool_size, kwargs=self._connect_kwargs(),
                timeout=self.connect_timeout, name=f"thread-effects:{self.schema}",
                # Checked as a call takes it (`_take`, not the pool's `check`, whose
                # loop sleeps between failed checks): a connection the server ended (a
                # restart, a failover, a proxy's cut) is replaced, not handed to a call.
                open=False, reconnect_timeout=POOL_RECONNECT_SECONDS,
            )
        try:
            self._pool.open(wait=True, timeout=self.connect_timeout)
            store = PostgresRuntimeStore(self)
            if created:  # a new database: its (empty) index holds every run there is
                store.set_run_index_complete(True)
            self._discard_orphans()
            self._lock_problem = None
            self._lost_notified = False
            self.cluster.start()
            self._watch_stop = threading.Event()
            threading.Thread(target=self._heartbeat, args=(self._watch_stop, where),
                             name=f"thread-effects-node-lease:{self.schema}",
                             daemon=True).start()
            threading.Thread(target=self._watch, args=(self._watch_stop,),
                             name=f"thread-effects-node-watch:{self.schema}",
                             daemon=True).start()
        except BaseException as exc:
            self.close()
            if isinstance(exc, _db_error()):
                raise RuntimeStorageError(f"{where} cannot be used: {exc}") from exc
            raise
        return store

    def _register(self, conn: psycopg.Connection[tuple[Any, ...]], where: str) -> None:
        """Write this node's row (a new token, a fresh lease); its node-id lock is held."""
        started = time.monotonic()
        try:
            with conn.transaction():
                # This node id's previous process ended without closing (its lease was not
                # set to 0, and the node-id lock is free): it may have died with frames not
                # relayed, and nobody else will account for it once this row is renewed.
                prev = conn.execute(
                    "SELECT heartbeat_at FROM nodes WHERE node_id = %s AND "
                    "lease_expires_at > 0 FOR UPDATE", (self.node_id,)).fetchone()
                if prev is not None:
                    cur = conn.cursor()
                    skipped = self._skip_frame_seqs(cur, str(self.node_id), float(prev[0]))
                    self._repair_run_index(cur, [t for t, _ in skipped],
                                           float(prev[0]) - self.lease_seconds)
                self._upsert_node(conn)
        except _db_error() as exc:
            raise RuntimeStorageError(f"{where} cannot be used: {exc}") from exc
        self._lease_valid_until = started + self.lease_seconds

    def _upsert_node(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        conn.execute(
            f"INSERT INTO nodes (node_id, token, lease_expires_at, started_at, "
            f"heartbeat_at, claims, effects) VALUES (%s, %s, {_DB_NOW} + %s, {_DB_NOW}, "
            f"{_DB_NOW}, %s, %s) ON CONFLICT (node_id) DO UPDATE SET token = excluded.token, "
            f"lease_expires_at = excluded.lease_expires_at, "
            f"started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, "
            f"claims = excluded.claims, effects = excluded.effects",
            (self.node_id, self._token, self.lease_seconds, self.claims,
             self._effects_json()),
        )

    def _effects_json(self) -> str | None:
        return None if self.effects is None else json.dumps(list(self.effects))

    def _try_lock(
        self, conn: psycopg.Connection[tuple[Any, ...]], wait: float = LOCK_WAIT_SECONDS
    ) -> bool:
        """Take this node id's session advisory lock; False if another session holds it.

        Retries for ``wait`` seconds: the server releases a killed process's lock when it
        notices the connection is gone, which can take a moment.
        """
        deadline = time.monotonic() + wait
        while True:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self._node_key,)).fetchone()
            if row is not None and row[0]:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _migrate(self, conn: psycopg.Connection[tuple[Any, ...]], where: str) -> bool:
        """Create or upgrade the schema; True if it was created. Refuses a newer one."""
        try:
            with conn.transaction():
                # Serializes migrations of one schema across processes (the schema's
                # creation too: two concurrent IF NOT EXISTS can both try to create it).
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key + 1,))
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
                exists = conn.execute(
                    "SELECT to_regclass(%s) IS NOT NULL", (f"{self.schema}.schema_version",)
                ).fetchone()
                version = 0
                if exists is not None and exists[0]:
                    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
                    if row is None or row[0] is None:
                        raise RuntimeStorageError(
                            f"{where}: its schema_version table is empty; restore it from "
                            f"a backup, or drop the schema to start empty"
                        )
                    version = int(row[0])
                    if version < 1:
                        raise RuntimeStorageError(
                            f"{where}: its schema_version table holds version {version}; "
                            f"versions start at 1: restore it from a backup, or drop the "
                            f"schema to start empty"
                        )
                if version > SCHEMA_VERSION:
                    raise RuntimeStorageError(
                        f"{where} has schema version {version}, newer than this runtime's "
                        f"{SCHEMA_VERSION}; upgrade thread-effects"
                    )
                start = version
                while version < SCHEMA_VERSION:
                    for statement in MIGRATIONS[version]:
                        conn.execute(statement)
                    version += 1
                if version != start:
                    conn.execute("DELETE FROM schema_version")
                    conn.execute("INSERT INTO schema_version (version) VALUES (%s)",
                                 (version,))
                return start == 0
        except _db_error() as exc:
            raise RuntimeStorageError(f"{where} cannot be used: {exc}") from exc

    def schema_version(self) -> int:
        """The schema version the database holds now (read each time).

        Raises:
            RuntimeClosed: the backend is not open.
            psycopg.Error: the read failed.
        """
        with self.transaction() as c:
            row = c.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    def _discard_orphans(self) -> None:
        # A crash between a delete's registry commit and the rows' removal (or during a
        # create) leaves a thread's rows that no registry entry names.
        with self.transaction() as c:
            rows = c.execute(
                "SELECT DISTINCT thread_id FROM thread_meta m WHERE NOT EXISTS "
                "(SELECT 1 FROM threads t WHERE t.id = m.thread_id)"
            ).fetchall()
            for (thread_id,) in rows:
                log.warning("removing the rows of thread %s: no registry entry names it "
                            "(left by a crash during a create or delete)", thread_id)
            # And the run index entries of threads no longer registered: a batch that
            # overlapped a deletion could commit some before the batches locked the
            # threads' rows (`_INDEX_RUNS`).
            for table in (*THREAD_TABLES, "run_index"):
                c.execute(
                    f"DELETE FROM {table} x WHERE NOT EXISTS "
                    f"(SELECT 1 FROM threads t WHERE t.id = x.thread_id)"
                )

    def discard_orphaned_threads(  # noqa: D102 - contract in base
        self, created_before: float, limit: int = 100,
        thread_ids: Sequence[str] | None = None,
    ) -> list[str]:
        # The store rows are locked (SKIP LOCKED: a create or delete of the same id at this
        # moment is left to itself); a create of that id waits for this commit to write
        # its own. A created_at that is not a number is never taken.
        wanted = None if thread_ids is None else list(thread_ids)
        with self.transaction() as c:
            rows = c.execute(
                "SELECT m.thread_id FROM thread_meta m WHERE m.key = 'created_at' "
                "AND NOT EXISTS (SELECT 1 FROM threads t WHERE t.id = m.thread_id) "
                "AND (CASE WHEN m.value ~ '^[0-9.eE+-]+$' THEN m.value::float8 END) < %s "
                "AND (%s::text[] IS NULL OR m.thread_id = ANY(%s::text[])) "
                "ORDER BY m.thread_id LIMIT %s FOR UPDATE OF m SKIP LOCKED",
                (created_before, wanted, wanted, limit),
            ).fetchall()
            ids = [str(r[0]) for r in rows]
            if ids:
                for table in THREAD_TABLES:
                    c.execute(f"DELETE FROM {table} WHERE thread_id = ANY(%s)", (ids,))
        for thread_id in ids:
            log.warning("removed the rows of thread %s: no registry entry names it (left "
                        "by a node that stopped during its delete)", thread_id)
        return ids

    def lock_thread_id(self, c: Cursor, thread_id: str) -> None:
        """Take the transaction's advisory lock on ``thread_id`` in this schema.

        Held by a store's create and a registry add, so a create of an id registered by
        another node meanwhile sees the registration (two-int keys: their own key space).
        """
        schema_key = zlib.crc32(f"thread-effects:{self.schema}:thread".encode())
        c.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                  (schema_key - (1 << 32) if schema_key >= 1 << 31 else schema_key,
                   thread_id))

    def _remove_rows(self, c: Cursor, thread_id: str) -> None:
        for table in THREAD_TABLES:
            c.execute(f"DELETE FROM {table} WHERE thread_id = %s", (thread_id,))

    def create_thread_store(self, info: ThreadInfo) -> PostgresThreadStore:  # noqa: D102
        thread_id = validate_thread_id(info.id)
        try:
            with self.transaction() as c:
                # Nodes create the same id at once: one at a time, and never over the
                # store of a thread another node registered meanwhile (no leftovers).
                self.lock_thread_id(c, thread_id)
                if c.execute(
                    "SELECT 1 FROM threads t JOIN thread_meta m ON m.thread_id = t.id "
                    "AND m.key = 'thread_id' WHERE t.id = %s", (thread_id,)
                ).fetchone() is not None:
                    raise ThreadExists(thread_id)
                # Rows left by a crashed create or delete belong to no thread.
                self._remove_rows(c, thread_id)
                c.executemany(
                    "INSERT INTO thread_meta (thread_id, key, value) VALUES (%s, %s, %s)",
                    [(thread_id, "thread_id", thread_id),
                     (thread_id, "created_at", repr(info.created_at_ts))],
                )
        except (_db_error(), RuntimeClosed) as exc:
            raise ThreadStorageError(
                thread_id, f"Thread {thread_id}: its store cannot be made: {exc}"
            ) from exc
        return PostgresThreadStore(self, thread_id)

    def open_thread_store(self, thread_id: str) -> PostgresThreadStore:  # noqa: D102
        validate_thread_id(thread_id)
        try:
            with self.transaction() as c:
                row = c.execute("SELECT max(version) FROM schema_version").fetchone()
                version = int(row[0]) if row is not None and row[0] is not None else 0
                found = c.execute(
                    "SELECT 1 FROM thread_meta WHERE thread_id = %s AND key = 'thread_id'",
                    (thread_id,),
                ).fetchone()
        except (_db_error(), RuntimeClosed, DatabaseUnavailable) as exc:
            raise ThreadStorageError(
                thread_id, f"Thread {thread_id}: PostgreSQL failed: {exc}",
                unavailable=isinstance(exc, DatabaseUnavailable),
            ) from exc
        if version > SCHEMA_VERSION:
            raise ThreadStorageError(
                thread_id,
                f"Thread {thread_id}: the database has schema version {version}, newer than "
                f"this runtime's {SCHEMA_VERSION}; upgrade thread-effects",
            )
        if found is None:
            raise ThreadStorageError(
                thread_id,
                f"Thread {thread_id}: its store is missing from {redact_url(self.url)} "
                f"(schema {self.schema}) although the thread is registered; restore it, or "
                f"delete the thread",
            )
        return PostgresThreadStore(self, thread_id)

    def remove_thread_store(self, thread_id: str) -> None:  # noqa: D102
        validate_thread_id(thread_id)
        with self.transaction() as c:
            self._remove_rows(c, thread_id)

    def orphaned_runs(self, limit: int = 1000) -> list[tuple[str, str]]:  # noqa: D102
        with self.transaction() as c:
            rows = c.execute(
                f"SELECT r.thread_id, r.id FROM effect_runs r {_ATTEMPT_JOIN} "
                f"WHERE r.status = 'running' AND (a.node_id IS NULL OR "
                f"(a.node_id <> %s AND NOT {_LIVE_NODE})) ORDER BY r.thread_id, r.seq LIMIT %s",
                (self.node_id, limit),
            ).fetchall()
        return [(r[0], r[1]) for r in rows]

    def mark_dead_nodes_gaps(self) -> list[tuple[str, int]]:  # noqa: D102
        # A dead node is one whose lease expired (> 0: a node that closed cleanly set it to
        # 0 after flushing its frames; -1: accounted for here). The node's row is locked
        # by the UPDATE, so two live nodes never both advance the counters.
        skipped: list[tuple[str, int]] = []
        with self.transaction() as c:
            dead = c.execute(
                f"UPDATE nodes SET lease_expires_at = -1 WHERE node_id <> %s "
                f"AND lease_expires_at > 0 AND lease_expires_at <= {_DB_NOW} "
                f"RETURNING node_id, heartbeat_at",
                (self.node_id,),
            ).fetchall()
            for node_id, heartbeat_at in dead:
                skipped.extend(self._skip_frame_seqs(c, node_id, float(heartbeat_at)))
            if dead:
                since = min(float(h) for _, h in dead) - self.lease_seconds
                self._repair_run_index(c, [t for t, _ in skipped], since)
        return skipped

    def _repair_run_index(self, c: Cursor, thread_ids: list[str], since: float) -> int:
        """Rewrite the run index rows a dead node's lost last batch may have left stale.

        A node writes its runs' index rows in batches after their own commits
        (`runtime.run_index`): one killed in between leaves rows saying what the run was
        before (``running`` for a run it completed, ``pending`` for one it canceled) or no
        row at all (a run it scheduled), and no node would ever write them again. Rewritten
        from ``effect_runs``: every run of ``thread_ids`` (the threads in which the dead node
        held an attempt, `_skip_frame_seqs`), every run whose ``pending`` or ``running``
        index row says another status, and every run created at or after ``since``
        (seconds, UTC) with no index row. The runs read are locked (``FOR SHARE``) until
        the caller's transaction commits, so a later change of one commits after this
        rewrite and its node's index write comes after it (never the other way round). A
        run another transaction is changing (its row locked) is skipped, never waited for:
        the node changing it writes its index row after that change commits, and a wait
        here could deadlock with a run's transaction locking the thread's rows in another
        order. The threads' registry rows are key-share locked as the index batches' are
        (`_INDEX_RUNS`), skipping a thread whose deletion holds its row: no entry of a
        deleted thread is written.

        Returns:
            How many index rows were written.
        """
        stale = c.execute(
            "SELECT DISTINCT i.thread_id FROM run_index i JOIN effect_runs r "
            "ON r.thread_id = i.thread_id AND r.id = i.run_id "
            "WHERE i.status IN ('pending', 'running') AND r.status <> i.status "
            "UNION SELECT DISTINCT r.thread_id FROM effect_runs r WHERE r.created_at >= %s "
            "AND NOT EXISTS (SELECT 1 FROM run_index i WHERE i.thread_id = r.thread_id "
            "AND i.run_id = r.id)",
            (since,),
        ).fetchall()
        threads = sorted({*thread_ids, *(str(t) for (t,) in stale)})
        if not threads:
            return 0
        written = c.execute(
            f"INSERT INTO run_index ({_INDEX_COLUMNS}, user_id) "
            f"SELECT r.id, r.thread_id, r.name, r.status, r.run_at, r.created_at, "
            f"r.started_at, r.finished_at, r.attempts, r.error, r.replay_of, r.key, "
            f"r.canceled_by, r.schedule_id, t.user_id "
            f"FROM effect_runs r JOIN threads t ON t.id = r.thread_id "
            f"WHERE r.thread_id = ANY(%s) ORDER BY r.thread_id, r.id "
            f"FOR SHARE OF r SKIP LOCKED FOR KEY SHARE OF t SKIP LOCKED {_INDEX_UPSERT}"
            f"WHERE (run_index.status, run_index.run_at, run_index.started_at, "
            f"run_index.finished_at, run_index.attempts, run_index.error, "
            f"run_index.canceled_by) IS DISTINCT FROM (excluded.status, excluded.run_at, "
            f"excluded.started_at, excluded.finished_at, excluded.attempts, excluded.error, "
            f"excluded.canceled_by)",
            (threads,),
        ).rowcount
        if written:
            log.warning("rewrote %d run index row(s) of %d thread(s) a dead node may have "
                        "left stale", written, len(threads))
        return written

    def _skip_frame_seqs(self, c: Cursor, node_id: str,
                         heartbeat_at: float) -> list[tuple[str, int]]:
        """Advance the frame counters of the threads dead ``node_id`` may have changed."""
        rows = c.execute(
            "INSERT INTO frame_counters (thread_id, last_seq) "
            "SELECT DISTINCT a.thread_id, 1 FROM run_attempts a "
            "WHERE a.node_id = %s AND (a.ended_at IS NULL OR a.ended_at >= %s) "
            "ORDER BY 1 ON CONFLICT (thread_id) DO UPDATE SET "
            "last_seq = frame_counters.last_seq + 1 RETURNING thread_id, last_seq",
            (node_id, heartbeat_at - self.lease_seconds),
        ).fetchall()
        if rows:
            log.warning("node %s died: %d thread(s) it may have changed without relaying "
                        "the frame skip a seq (their clients reload)", node_id, len(rows))
        return [(str(t), int(seq)) for t, seq in rows]

    def alone(self) -> bool:  # noqa: D102 - contract in base
        return all(node == self.node_id for node, _ in self.live_nodes())

    def take_turn_lease(self, thread_id: str, token: str) -> str | None:  # noqa: D102
        with self.transaction() as c:
            taken = c.execute(
                f"INSERT INTO turn_leases (thread_id, node_id, token, acquired_at) "
                f"VALUES (%s, %s, %s, {_DB_NOW}) ON CONFLICT (thread_id) DO UPDATE SET "
                f"node_id = excluded.node_id, token = excluded.token, "
                f"acquired_at = excluded.acquired_at WHERE turn_leases.token = excluded.token "
                f"OR turn_leases.node_id = excluded.node_id OR NOT EXISTS (SELECT 1 FROM "
                f"nodes n WHERE n.node_id = turn_leases.node_id "
                f"AND n.lease_expires_at > {_DB_NOW}) RETURNING 1",
                (thread_id, self.node_id, token),
            ).fetchone()
            if taken is not None:
                return None
            row = c.execute("SELECT node_id FROM turn_leases WHERE thread_id = %s",
                            (thread_id,)).fetchone()
        return str(row[0]) if row is not None else ""

    def release_turn_lease(self, thread_id: str, token: str) -> None:  # noqa: D102
        with self.transaction() as c:
            c.execute("DELETE FROM turn_leases WHERE thread_id = %s AND token = %s",
                      (thread_id, token))

    def held_turn_leases(self) -> list[tuple[str, str]]:  # noqa: D102
        with self.transaction() as c:
            rows = c.execute("SELECT thread_id, token FROM turn_leases WHERE node_id = %s "
                             "ORDER BY thread_id", (self.node_id,)).fetchall()
        return [(str(t), str(k)) for t, k in rows]

    def orphaned_turns(self) -> list[str]:  # noqa: D102
        with self.transaction() as c:
            rows = c.execute(
                f"SELECT t.thread_id FROM turn_leases t WHERE t.node_id <> %s AND NOT EXISTS "
                f"(SELECT 1 FROM nodes n WHERE n.node_id = t.node_id "
                f"AND n.lease_expires_at > {_DB_NOW}) ORDER BY t.thread_id LIMIT 1000",
                (self.node_id,),
            ).fetchall()
        return [r[0] for r in rows]

    def claiming_nodes(self) -> list[str]:  # noqa: D102 - contract in base
        # A null ``claims``: a row written before schema version 4 (a node that claims).
        with self.transaction() as c:
            rows = c.execute(
                f"SELECT node_id FROM nodes WHERE lease_expires_at > {_DB_NOW} "
                f"AND claims IS NOT FALSE ORDER BY node_id").fetchall()
        return [r[0] for r in rows]

    def record_effects(self, names: Collection[str]) -> None:  # noqa: D102 - contract in base
        self.effects = tuple(sorted(set(names)))
        with self.transaction() as c:
            c.execute("UPDATE nodes SET effects = %s WHERE node_id = %s AND token = %s",
                      (self._effects_json(), self.node_id, self._token))

    def effect_known_elsewhere(self, name: str) -> bool:  # noqa: D102 - contract in base
        with self.transaction() as c:
            row = c.execute(
                f"SELECT EXISTS (SELECT 1 FROM nodes n WHERE n.node_id <> %s AND "
                f"{_KNOWN_BY_LIVE_NODE.format(name='%s')})",
                (self.node_id, name)).fetchone()
        return bool(row and row[0])

    def live_nodes(self) -> list[tuple[str, float]]:
        """The nodes holding a live lease: ``(node_id, lease_expires_at)``, by node id.

        Raises:
            RuntimeClosed: the backend is not open.
            psycopg.Error: the read failed.
        """
        with self.transaction() as c:
            rows = c.execute(
                f"SELECT node_id, lease_expires_at FROM nodes WHERE lease_expires_at > {_DB_NOW} "
                f"ORDER BY node_id").fetchall()
        return [(r[0], r[1]) for r in rows]

    def close(self) -> None:  # noqa: D102
        self._watch_stop.set()
        self._renew_now.set()
        self.cluster.stop()
        with self._guard:
            pool, self._pool = self._pool, None
            lock_conn, self._lock_conn = self._lock_conn, None
        if pool is not None:
            pool.close()
        if lock_conn is not None:
            # Unlocked explicitly: the server ends a closed session's locks only once it
            # has processed the close, and a new open may come first.
            if not lock_conn.closed and not lock_conn.broken:
                with contextlib.suppress(_db_error()):
                    # Its lease ends now: other nodes need not wait out its period.
                    lock_conn.execute(
                        "UPDATE nodes SET lease_expires_at = 0 WHERE node_id = %s "
                        "AND token = %s", (self.node_id, self._token))
                    lock_conn.execute("SELECT pg_advisory_unlock(%s)", (self._node_key,))
            lock_conn.close()

