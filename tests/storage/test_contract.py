"""The storage contract (runtime/storage/base.py), tested on every backend.

One fixture, `store_backend`, yields a `Harness` for each backend; a new backend joins the
suite by adding one parameter to it (and the few lines that make its data older or newer
than the code, which only a backend knows how to do). The tests speak the contract only.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runtime import EffectStatus, RetentionPolicy
from runtime.effects import EffectRun, RunAttempt
from runtime.errors import (
    DataDirLocked,
    EffectRecordLost,
    RuntimeClosed,
    RuntimeStorageError,
    ThreadStorageError,
    TurnLeaseLost,
)
from runtime.messages import Message, MessageRole
from runtime.recurrence import Recurrence, Schedule, ScheduleState
from runtime.storage.base import (
    Finish,
    RunQuery,
    RuntimeStore,
    StorageBackend,
    ThreadInfo,
    ThreadQuery,
    ThreadStore,
)
from runtime.storage.memory import MemoryBackend
from runtime.storage.records import Claim, EffectRecordStatus
from runtime.storage.sqlite import RUNTIME_SCHEMA_VERSION, SQLiteBackend

T0 = 1_800_000_000.0
DAY = 86_400.0
KEEP = RetentionPolicy(completed_seconds=1e10, failed_seconds=1e10)
"""A policy nothing in these tests is old enough to be past (for reads that see all)."""


@dataclass
class Harness:
    """A backend under test and what only it knows how to do."""

    backend: StorageBackend
    twin: Callable[[], StorageBackend]
    """Another backend on the same data (a second process, for SQLite)."""
    make_thread_newer: Callable[[str, int], None]
    """Stamp a (closed) thread's store with a schema version."""
    make_runtime_newer: Callable[[int], None]
    """Stamp the (closed) runtime store with a schema version."""
    make_runtime_current: Callable[[], None]
    """Stamp the (closed) runtime store with the version the code knows."""


NODE = "node-a"
"""The node id every harness backend records on the attempts it claims."""


def _with_node(backend: StorageBackend) -> StorageBackend:
    backend.node_id = NODE
    return backend


def _sqlite_harness(data_dir: Path) -> Harness:
    backend = SQLiteBackend(data_dir, "NORMAL")
    backend.node_id = NODE

    def stamp(path: Path, version: int) -> None:
        conn = sqlite3.connect(path)
        try:
            conn.execute(f"PRAGMA user_version={version}")
        finally:
            conn.close()

    return Harness(
        backend=backend,
        twin=lambda: _with_node(SQLiteBackend(data_dir, "NORMAL")),
        make_thread_newer=lambda tid, v: stamp(backend.thread_path(tid), v),
        make_runtime_newer=lambda v: stamp(backend.runtime_path, v),
        make_runtime_current=lambda: stamp(backend.runtime_path, RUNTIME_SCHEMA_VERSION),
    )


def _memory_harness() -> Harness:
    backend = MemoryBackend()
    backend.node_id = NODE

    def runtime_newer(version: int) -> None:
        backend.schema_version = version

    return Harness(
        backend=backend,
        twin=lambda: backend,
        make_thread_newer=backend.set_thread_schema_version,
        make_runtime_newer=runtime_newer,
        make_runtime_current=lambda: runtime_newer(RUNTIME_SCHEMA_VERSION),
    )


def _postgres_harness(url: str) -> Harness:
    from runtime.storage.pg_schema import SCHEMA_VERSION
    from runtime.storage.postgres import PostgresBackend, split_schema
    from tests.pg import set_schema_version

    backend = PostgresBackend(url, node_id=NODE)
    base, schema = split_schema(url)
    assert schema is not None

    def stamp(version: int) -> None:
        set_schema_version(base, schema, version)

    return Harness(
        backend=backend,
        # The same node id: a second live process with it is refused.
        twin=lambda: PostgresBackend(url, node_id=NODE),
        # One schema version for the whole database: every thread's store is in it.
        make_thread_newer=lambda _tid, v: stamp(v),
        make_runtime_newer=stamp,
        make_runtime_current=lambda: stamp(SCHEMA_VERSION),
    )


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "sqlite":
        h = _sqlite_harness(tmp_path)
    elif request.param == "postgres":
        h = _postgres_harness(request.getfixturevalue("pg_url"))
    else:
        h = _memory_harness()
    yield h
    h.backend.close()


@pytest.fixture
def rtdb(harness: Harness) -> Iterator[RuntimeStore]:
    store = harness.backend.open()
    yield store
    store.close()


@pytest.fixture
def store(harness: Harness, rtdb: RuntimeStore) -> Iterator[ThreadStore]:
    info = ThreadInfo(id="t", created_at_ts=T0)
    assert rtdb.add_thread(info)
    s = harness.backend.create_thread_store(info)
    yield s
    s.close()


_ids = iter(range(10**6))


def run(name: str = "record", *, run_at: float = T0, args: object = None) -> EffectRun:
    """A new pending run with a unique, sortable id."""
    return EffectRun(
        id=f"r{next(_ids):06d}",
        thread_id="t",
        name=name,
        status=EffectStatus.PENDING,
        args=args,
        run_at_ts=run_at,
        created_at_ts=T0,
    )


def message(n: int) -> Message:
    return Message(
        id=f"m{n:04d}",
        thread_id="t",
        role=MessageRole.USER if n % 2 else MessageRole.ASSISTANT,
        content=f"text {n}",
        created_at_ts=T0 + n,
        run_id=None,
    )


def finish(run_id: str, status: EffectStatus = EffectStatus.COMPLETED, at: float = T0) -> Finish:
    return Finish(run_id, status, "boom" if status is EffectStatus.FAILED else None, at)


def complete(store: ThreadStore, r: EffectRun, at: float, **kw: object) -> EffectRun:
    """Insert ``r``, claim it and complete it at ``at`` (nothing else may be due)."""
    store.insert_run(r)
    _, claimed, _ = store.finish_and_claim(None, at)
    assert claimed is not None and claimed.id == r.id
    done, _, _ = store.finish_and_claim(finish(r.id, at=at), at, claim=False, **kw)  # type: ignore[arg-type]
    assert done is not None
    return done


def ids(runs: list[EffectRun]) -> list[str]:
    return [r.id for r in runs]


# ------------------------------------------------------------------ backend


def test_open_is_exclusive_and_data_outlives_a_close(harness: Harness) -> None:
    rtdb = harness.backend.open()
    with pytest.raises(DataDirLocked):
        harness.twin().open()
    info = ThreadInfo(id="t", created_at_ts=T0, agent_id="a", user_id="u", tags=("x", "y"))
    assert rtdb.add_thread(info)
    rtdb.set_alarm("t", T0 - 5)  # before the run (a store may lower it to the run's time)
    store = harness.backend.create_thread_store(info)
    r = run(args={"key": "k", "n": [1, 2]})
    store.insert_run(r)
    store.close()
    rtdb.close()
    harness.backend.close()
    harness.backend.close()  # idempotent

    again = harness.twin()
    rtdb = again.open()
    try:
        assert rtdb.get_thread("t") == info
        assert rtdb.load_alarms() == [("t", T0 - 5)]
        store = again.open_thread_store("t")
        assert store.get_run(r.id, T0, KEEP) == r
        store.close()
    finally:
        rtdb.close()
        again.close()


def test_a_closed_store_refuses_every_call(store: ThreadStore) -> None:
    store.close()
    store.close()
    with pytest.raises(ThreadStorageError, match="Thread t"):
        store.insert_run(run())
    with pytest.raises(ThreadStorageError, match="Thread t"):
        store.list_runs(T0, KEEP)
    with pytest.raises(ThreadStorageError, match="Thread t"):
        store.get_effect_record("k")


def test_a_closed_runtime_store_refuses_every_call_with_runtime_closed(
    rtdb: RuntimeStore,
) -> None:
    rtdb.close()
    rtdb.close()
    calls: list[Callable[[], object]] = [
        lambda: rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0)),
        lambda: rtdb.get_thread("a"),
        lambda: rtdb.list_threads(10, None),
        lambda: rtdb.list_threads(10, None, ThreadQuery(by_activity=True)),
        lambda: rtdb.touch_threads({"a": T0}),
        lambda: rtdb.set_paused("a", True),
        lambda: rtdb.delete_thread("a"),
        lambda: rtdb.set_alarm("a", T0),
        lambda: rtdb.lower_alarm("a", T0),
        lambda: rtdb.move_alarms([("a", None, T0)]),
        rtdb.load_alarms,
    ]
    for call in calls:
        with pytest.raises(RuntimeClosed, match="closed"):
            call()


def test_open_discards_stores_without_a_registry_entry(harness: Harness) -> None:
    rtdb = harness.backend.open()
    kept = ThreadInfo(id="kept", created_at_ts=T0)
    assert rtdb.add_thread(kept)
    harness.backend.create_thread_store(kept).close()
    # A crash after the registry entry went but before the store did (or mid-create).
    harness.backend.create_thread_store(ThreadInfo(id="orphan", created_at_ts=T0)).close()
    rtdb.close()
    harness.backend.close()

    again = harness.twin()
    rtdb = again.open()
    try:
        again.open_thread_store("kept").close()
        with pytest.raises(ThreadStorageError, match="Thread orphan"):
            again.open_thread_store("orphan")
    finally:
        rtdb.close()
        again.close()


def test_a_missing_store_is_refused(harness: Harness, rtdb: RuntimeStore) -> None:
    with pytest.raises(ThreadStorageError, match="Thread nope"):
        harness.backend.open_thread_store("nope")


def test_removal_is_idempotent_and_the_store_is_gone(
    harness: Harness, store: ThreadStore
) -> None:
    store.insert_run(run())
    store.close()
    harness.backend.remove_thread_store("t")
    harness.backend.remove_thread_store("t")
    harness.backend.remove_thread_store("never-existed")
    with pytest.raises(ThreadStorageError, match="Thread t"):
        harness.backend.open_thread_store("t")


def test_create_discards_leftovers_and_writes_meta(
    harness: Harness, rtdb: RuntimeStore
) -> None:
    info = ThreadInfo(id="t", created_at_ts=T0)
    first = harness.backend.create_thread_store(info)
    assert rtdb.add_thread(info)  # (a backend shared by nodes stores runs of registered threads)
    first.insert_run(run())
    first.insert_messages([message(1)])
    first.close()
    # The registry row is gone and the store's rows are left (a crash between a create's or
    # a deletion's two writes): the next create starts empty.
    assert rtdb.delete_thread("t")
    again = harness.backend.create_thread_store(ThreadInfo(id="t", created_at_ts=T0 + 1))
    try:
        assert again.list_runs(T0, KEEP) == ([], None)
        assert again.all_messages() == []
        assert again.get_meta("thread_id") == "t"
        assert again.get_meta("created_at") == repr(T0 + 1)
        assert again.get_meta("nothing") is None
        again.set_meta("created_at", "x")
        again.set_meta("other", "y")
        assert (again.get_meta("created_at"), again.get_meta("other")) == ("x", "y")
    finally:
        again.close()


def test_a_newer_thread_schema_is_refused(harness: Harness, store: ThreadStore) -> None:
    store.close()
    harness.make_thread_newer("t", 99)
    with pytest.raises(ThreadStorageError, match="schema version 99, newer than"):
        harness.backend.open_thread_store("t")


def test_a_newer_runtime_schema_is_refused_and_nothing_stays_taken(harness: Harness) -> None:
    harness.backend.open().close()
    harness.backend.close()
    harness.make_runtime_newer(99)
    with pytest.raises(RuntimeStorageError, match="schema version 99, newer than"):
        harness.backend.open()
    harness.make_runtime_current()
    harness.backend.open().close()


# ------------------------------------------------------------------ registry


def test_thread_registry(rtdb: RuntimeStore) -> None:
    info = ThreadInfo(id="a", created_at_ts=T0, tags=("x",))
    assert rtdb.add_thread(info) is True
    assert rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0 + 1)) is False
    assert rtdb.get_thread("a") == info
    assert rtdb.get_thread("b") is None
    rtdb.set_alarm("a", T0)
    assert rtdb.delete_thread("a") is True
    assert rtdb.delete_thread("a") is False
    assert rtdb.get_thread("a") is None
    assert rtdb.load_alarms() == []  # the alarm went with the thread


def test_a_live_shared_backend_discards_the_rows_a_deletion_left_in_bounded_passes(
    harness: Harness, rtdb: RuntimeStore,
) -> None:
    backend = harness.backend
    for tid in ("gone1", "gone2", "gone3", "kept"):
        info = ThreadInfo(id=tid, created_at_ts=T0)
        assert rtdb.add_thread(info)
        store = backend.create_thread_store(info)
        store.insert_run(replace(run(), id="r1", thread_id=tid))
        store.close()
    # Deleted from the registry by a node that stopped before removing their rows.
    for tid in ("gone1", "gone2", "gone3"):
        assert rtdb.delete_thread(tid)
    # Being created: its store is written, its registry entry not yet.
    backend.create_thread_store(ThreadInfo(id="new", created_at_ts=T0 + 100)).close()
    if backend.exclusive:  # one process: what a crash left goes at the next open
        assert backend.discard_orphaned_threads(T0 + 50) == []
        return
    assert backend.discard_orphaned_threads(T0 + 50, thread_ids=["gone2", "kept"]) == [
        "gone2"]
    assert backend.discard_orphaned_threads(T0 + 50, limit=1) == ["gone1"]
    assert backend.discard_orphaned_threads(T0 + 50) == ["gone3"]
    assert backend.discard_orphaned_threads(T0 + 50) == []
    for tid in ("gone1", "gone2", "gone3"):
        with pytest.raises(ThreadStorageError, match=f"Thread {tid}"):
            backend.open_thread_store(tid)
    kept = backend.open_thread_store("kept")
    assert [r.id for r in kept.pending_runs()] == ["r1"]
    kept.close()
    backend.open_thread_store("new").close()  # still there for its registry entry
    assert rtdb.add_thread(ThreadInfo(id="new", created_at_ts=T0 + 100))


def test_a_pause_mark_is_kept_listed_durable_and_goes_with_the_thread(
    harness: Harness,
) -> None:
    rtdb = harness.backend.open()
    assert rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0, tags=("x",)))
    assert rtdb.add_thread(ThreadInfo(id="b", created_at_ts=T0 + 1))
    assert rtdb.get_thread("a") == ThreadInfo(id="a", created_at_ts=T0, tags=("x",))
    assert rtdb.set_paused("a", True) is True
    assert rtdb.set_paused("a", True) is True  # idempotent
    assert rtdb.set_paused("nope", True) is False
    assert rtdb.get_thread("nope") is None  # nothing written for an unknown thread
    assert rtdb.get_thread("a") == ThreadInfo(id="a", created_at_ts=T0, tags=("x",), paused=True)
    assert [(i.id, i.paused) for i in rtdb.list_threads(10, None)[0]] == [
        ("b", False), ("a", True)
    ]
    rtdb.close()
    harness.backend.close()

    again = harness.twin()
    rtdb = again.open()
    try:
        assert rtdb.get_thread("a").paused is True  # type: ignore[union-attr]
        assert rtdb.set_paused("a", False) is True
        assert rtdb.get_thread("a").paused is False  # type: ignore[union-attr]
        assert rtdb.set_paused("b", True)
        # Deleted and created again under the same id: a new thread, not paused.
        assert rtdb.delete_thread("b")
        assert rtdb.add_thread(ThreadInfo(id="b", created_at_ts=T0 + 2))
        assert rtdb.get_thread("b").paused is False  # type: ignore[union-attr]
    finally:
        rtdb.close()
        again.close()


def test_paused_flags_name_the_registered_threads_with_their_pause_marks(
    rtdb: RuntimeStore,
) -> None:
    for tid in ("a", "b", "c"):
        assert rtdb.add_thread(ThreadInfo(id=tid, created_at_ts=T0))
    assert rtdb.set_paused("b", True)
    assert rtdb.delete_thread("c")
    assert rtdb.paused_flags(["a", "b", "c", "never"]) == {"a": False, "b": True}
    assert rtdb.paused_flags([]) == {}


def test_thread_pages_are_newest_first_with_ties_by_id(rtdb: RuntimeStore) -> None:
    # Five threads share one creation time: the id breaks the tie (descending).
    for tid, at in [("c", T0), ("a", T0), ("e", T0), ("b", T0), ("d", T0), ("old", T0 - 1),
                    ("new", T0 + 1)]:
        assert rtdb.add_thread(ThreadInfo(id=tid, created_at_ts=at))
    seen: list[str] = []
    cursor: tuple[float, str] | None = None
    pages = 0
    while True:
        page, cursor = rtdb.list_threads(2, cursor)
        seen += [i.id for i in page]
        pages += 1
        if cursor is None:
            break
        assert cursor == (page[-1].created_at_ts, page[-1].id)
    assert seen == ["new", "e", "d", "c", "b", "a", "old"]
    assert pages == 4
    # A page that ends exactly at the last thread has no cursor.
    assert rtdb.list_threads(7, None)[1] is None
    assert rtdb.list_threads(6, None)[1] == (T0, "a")
    # A cursor is a position, not a thread: it outlives the deletion of the thread it names.
    page, cursor = rtdb.list_threads(3, None)
    assert cursor == (T0, "d")
    assert rtdb.delete_thread("d")
    assert [i.id for i in rtdb.list_threads(3, cursor)[0]] == ["c", "b", "a"]


def test_a_tag_is_found_by_its_filter_whatever_its_characters(rtdb: RuntimeStore) -> None:
    # "\x01nul\x01..." is how the PostgreSQL store marks an escaped text: a tag that looks
    # like one is still an ordinary tag; so are quotes, backslashes and non-ASCII.
    odd = ["\x01nul\x01t", 'say "hi"', "back\\slash", "caf\u00e9", "[\"x\"]"]
    for i, tag in enumerate(odd):
        assert rtdb.add_thread(ThreadInfo(id=f"t{i}", created_at_ts=T0 + i, tags=(tag, "all")))
        rtdb.index_runs([indexed(f"t{i}", i + 1)])
    for i, tag in enumerate(odd):
        threads = rtdb.list_threads(10, None, ThreadQuery(tag=tag))[0]
        assert [t.id for t in threads] == [f"t{i}"], tag
        assert threads[0].tags == (tag, "all")
        runs = rtdb.list_indexed_runs(RunQuery(tag=tag), T0, KEEP, 10)[0]
        assert [r.thread_id for r in runs] == [f"t{i}"], tag
    assert len(rtdb.list_threads(10, None, ThreadQuery(tag="all"))[0]) == len(odd)
    assert rtdb.list_threads(10, None, ThreadQuery(tag="\x01nul\x01"))[0] == []


def test_threads_by_last_activity_with_filters_and_a_stable_cursor(rtdb: RuntimeStore) -> None:
    for i, tid in enumerate(["a", "b", "c", "d"]):
        assert rtdb.add_thread(ThreadInfo(
            id=tid, created_at_ts=T0 + i, user_id="ann" if tid in "abc" else "bob",
            agent_id="helper" if tid in "ab" else None, tags=("vip",) if tid in "ac" else (),
        ))
    by_activity = ThreadQuery(by_activity=True)
    # Added: its activity is its creation.
    assert rtdb.get_thread("a").last_activity_ts == T0  # type: ignore[union-attr]
    assert [i.id for i in rtdb.list_threads(10, None, by_activity)[0]] == ["d", "c", "b", "a"]

    # A run's latest time (here its finish) moves its thread forward; a message too.
    r = replace(run(), thread_id="a", created_at_ts=T0 + 5, started_at_ts=T0 + 6,
                finished_at_ts=T0 + 20, status=EffectStatus.COMPLETED)
    rtdb.index_runs([r])
    rtdb.touch_threads({"b": T0 + 10, "gone": T0 + 99})  # an unknown thread is skipped
    rtdb.touch_threads({"b": T0 + 7})  # never moves back
    page, _ = rtdb.list_threads(10, None, by_activity)
    assert [(i.id, i.last_activity_ts) for i in page] == [
        ("a", T0 + 20), ("b", T0 + 10), ("d", T0 + 3), ("c", T0 + 2)
    ]
    # By creation, as without a query; filters apply to either order.
    assert [i.id for i in rtdb.list_threads(10, None, ThreadQuery())[0]] == ["d", "c", "b", "a"]
    ann = ThreadQuery(user_id="ann", by_activity=True)
    assert [i.id for i in rtdb.list_threads(10, None, ann)[0]] == ["a", "b", "c"]
    vip = ThreadQuery(user_id="ann", tag="vip", by_activity=True)
    assert [i.id for i in rtdb.list_threads(10, None, vip)[0]] == ["a", "c"]
    helper = ThreadQuery(agent_id="helper")
    assert [i.id for i in rtdb.list_threads(10, None, helper)[0]] == ["b", "a"]
    assert rtdb.list_threads(10, None, ThreadQuery(tag="nope"))[0] == []

    # Pages: the cursor is (last activity, id); a thread active meanwhile moves ahead of
    # the cursor and is not met twice.
    first, cursor = rtdb.list_threads(2, None, by_activity)
    assert [i.id for i in first] == ["a", "b"] and cursor == (T0 + 10, "b")
    rtdb.touch_threads({"c": T0 + 30})
    rest, cursor = rtdb.list_threads(2, cursor, by_activity)
    assert [i.id for i in rest] == ["d"] and cursor is None
    assert [i.id for i in rtdb.list_threads(1, None, by_activity)[0]] == ["c"]


# ------------------------------------------------------------------ alarms


def test_set_and_lower_alarms(rtdb: RuntimeStore) -> None:
    rtdb.set_alarm("a", T0 + 10)
    rtdb.set_alarm("a", T0 + 20)  # set raises too
    rtdb.lower_alarm("a", T0 + 30)  # lower never raises
    rtdb.lower_alarm("b", T0 + 30)  # and creates a missing one
    assert sorted(rtdb.load_alarms()) == [("a", T0 + 20), ("b", T0 + 30)]
    rtdb.lower_alarm("a", T0 + 5)
    rtdb.set_alarm("b", None)
    rtdb.set_alarm("c", None)  # removing a missing alarm is fine
    assert rtdb.load_alarms() == [("a", T0 + 5)]


def test_alarms_load_within_a_window(rtdb: RuntimeStore) -> None:
    """A node keeping timers for a horizon reads only the alarms due before its end."""
    rtdb.set_alarm("a", T0 + 10)
    rtdb.set_alarm("b", T0 + 60)
    rtdb.set_alarm("c", T0 - 5)  # overdue: in every window
    assert sorted(rtdb.load_alarms(until=T0 + 60)) == [("a", T0 + 10), ("c", T0 - 5)]
    assert sorted(rtdb.load_alarms(until=T0)) == [("c", T0 - 5)]
    assert sorted(rtdb.load_alarms(until=T0 + 61)) == sorted(rtdb.load_alarms())
    assert len(rtdb.load_alarms()) == 3


def test_adding_a_thread_can_write_its_alarm_row_with_it(rtdb: RuntimeStore) -> None:
    assert rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0), alarm_at=T0)
    assert rtdb.add_thread(ThreadInfo(id="b", created_at_ts=T0))  # no alarm_at: no row
    assert rtdb.load_alarms() == [("a", T0)]
    # A taken id writes nothing, the alarm row included.
    assert rtdb.add_thread(ThreadInfo(id="b", created_at_ts=T0), alarm_at=T0 - 5) is False
    assert rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0), alarm_at=T0 - 5) is False
    assert rtdb.load_alarms() == [("a", T0)]
    # The row is an alarm like any other: it goes with the thread.
    assert rtdb.delete_thread("a")
    assert rtdb.load_alarms() == []


def test_alarm_moves_are_compare_and_set(rtdb: RuntimeStore) -> None:
    for tid in "abcd":
        rtdb.set_alarm(tid, T0 + 10)
    rtdb.lower_alarm("b", T0 + 1)  # a new run lowered b meanwhile
    applied = rtdb.move_alarms([
        ("a", T0 + 10, T0 + 50),  # still as expected: raised
        ("b", T0 + 10, T0 + 50),  # lowered meanwhile: left alone
        ("c", T0 + 10, None),  # as expected: removed
        ("d", T0 + 9, None),  # not as expected: kept
        ("e", T0 + 10, T0 + 50),  # missing: not created by a compare-and-set
        ("f", None, T0 + 7),  # no row known: created
        ("a", None, T0 + 60),  # no row known: only ever lowered (a is at T0 + 50)
        ("g", None, None),  # nothing to do
    ])
    if rtdb.alarms_follow_runs:  # also what the rows not moved hold, in thread order
        assert applied == [("a", T0 + 50), ("b", T0 + 1), ("c", None), ("d", T0 + 10),
                           ("e", None)]
    else:
        assert applied == [("a", T0 + 50), ("c", None)]
    assert sorted(rtdb.load_alarms()) == [
        ("a", T0 + 50), ("b", T0 + 1), ("d", T0 + 10), ("f", T0 + 7)
    ]
    rtdb.move_alarms([("f", None, T0 + 3)])
    assert dict(rtdb.load_alarms())["f"] == T0 + 3


def test_a_store_whose_alarms_follow_runs_keeps_the_row_at_or_before_every_pending_run(
    rtdb: RuntimeStore, store: ThreadStore,
) -> None:
    """Whatever the caller believes of the row, with `alarms_follow_runs`; else untouched."""
    follows = rtdb.alarms_follow_runs
    late = run(run_at=T0 + 100)
    store.insert_run(late)  # no row yet: created at the run
    assert rtdb.load_alarms() == ([("t", T0 + 100)] if follows else [])
    rtdb.set_alarm("t", T0 + 200)  # a stale move raised it past the run
    store.insert_run(run(run_at=T0 + 300))  # a later run: the row is not raised
    assert rtdb.load_alarms() == [("t", T0 + 200)]
    early = run(run_at=T0 + 50)
    store.insert_run(early)
    assert rtdb.load_alarms() == [("t", T0 + 50 if follows else T0 + 200)]
    # A raise or a removal by a node that knows nothing of the pending runs stops at them.
    applied = rtdb.move_alarms([("t", rtdb.load_alarms()[0][1], None)])
    assert rtdb.load_alarms() == ([("t", T0 + 50)] if follows else [])
    assert applied == [("t", T0 + 50 if follows else None)]
    # Run now, re-queue and an active schedule lower it too.
    rtdb.set_alarm("t", T0 + 500)
    assert store.run_now(late.id, T0 + 10) is not None
    assert rtdb.load_alarms() == [("t", T0 + 10 if follows else T0 + 500)]
    rtdb.set_alarm("t", T0 + 500)
    _, claimed, _ = store.finish_and_claim(None, T0 + 60)
    assert claimed is not None and claimed.id == late.id
    rtdb.set_alarm("t", T0 + 500)  # removed meanwhile (the only pending runs are later)
    assert [r.id for r in store.recover_interrupted(T0 + 70, 3)] == [late.id]
    assert rtdb.load_alarms() == [("t", T0 + 10 if follows else T0 + 500)]
    rtdb.set_alarm("t", None)
    store.insert_schedule(replace(
        schedule("s1", next_fire=T0 + 40), thread_id="t"))
    assert rtdb.load_alarms() == ([("t", T0 + 40)] if follows else [])


# ------------------------------------------------------------------ runs


def test_insert_stores_a_pending_run_as_given(store: ThreadStore) -> None:
    r = run(args={"text": "hé", "items": [1, 2.5, None, True]}, run_at=T0 + 5)
    store.insert_run(r)
    assert store.get_run(r.id, T0, KEEP) == r
    assert store.pending_runs() == [r]
    with pytest.raises(ThreadStorageError, match="Thread t"):
        store.insert_run(run_with_id(r.id))
    assert store.pending_runs() == [r]


def run_with_id(run_id: str) -> EffectRun:
    return replace(run(), id=run_id)


def test_claims_go_by_due_time_then_scheduling_order(store: ThreadStore) -> None:
    late = run(run_at=T0 + 10)
    a = run(run_at=T0)
    b = run(run_at=T0)  # same due time as a, scheduled after it
    early = run(run_at=T0 - 5)
    for r in (late, a, b, early):
        store.insert_run(r)
    order = []
    for _ in range(3):
        _, claimed, next_due = store.finish_and_claim(None, T0)
        assert claimed is not None and next_due is None
        assert claimed.status is EffectStatus.RUNNING
        assert claimed.attempts == 1 and claimed.started_at_ts == T0
        order.append(claimed.id)
    assert order == [early.id, a.id, b.id]
    # Nothing due: the earliest pending run's due time, and nothing claimed.
    assert store.finish_and_claim(None, T0) == (None, None, T0 + 10)
    assert store.finish_and_claim(None, T0, claim=False) == (None, None, None)
    assert store.pending_runs() == [late]


def test_a_claim_on_the_callers_thread_is_declined_or_is_the_same_claim(
    store: ThreadStore,
) -> None:
    """`claim_inline` either does nothing (None) or claims as `finish_and_claim` would."""
    late, a, b = run(run_at=T0 + 10), run(run_at=T0), run(run_at=T0)
    for r in (late, a, b):
        store.insert_run(r)
    order = []
    for _ in range(2):
        answer = store.claim_inline(T0)
        if answer is None:
            assert [r.id for r in store.pending_runs()] == [x for x in ids([a, b, late])
                                                             if x not in order]
            answer = store.finish_and_claim(None, T0)
        _, claimed, next_due = answer
        assert claimed is not None and claimed.status is EffectStatus.RUNNING
        assert claimed.attempts == 1 and claimed.started_at_ts == T0 and next_due is None
        order.append(claimed.id)
    assert order == [a.id, b.id]
    answer = store.claim_inline(T0)
    assert answer in (None, (None, None, T0 + 10))
    assert store.pending_runs() == [late]


def test_outcomes_committed_without_waiting_for_the_disk_read_back_as_written(
    store: ThreadStore,
) -> None:
    """``durable=False`` changes when the disk is flushed, never what is stored or read."""
    a, b, c = run(), run(), run()
    for r in (a, b, c):
        store.insert_run(r)
    _, claimed, _ = store.finish_and_claim(None, T0)
    assert claimed is not None and claimed.id == a.id
    finished, claimed, _ = store.finish_and_claim(
        Finish(a.id, EffectStatus.COMPLETED, None, T0 + 1), T0 + 1, durable=False)
    assert finished is not None and finished.status is EffectStatus.COMPLETED
    assert claimed is not None and claimed.id == b.id
    # A read sees the outcome (a group commit store flushes before it answers).
    got = store.get_run(a.id, T0 + 1, RetentionPolicy())
    assert got is not None and got.status is EffectStatus.COMPLETED
    finished, claimed, _ = store.finish_and_claim(
        Finish(b.id, EffectStatus.FAILED, "boom", T0 + 2), T0 + 2, durable=False)
    assert finished is not None and claimed is not None and claimed.id == c.id
    store.sync()
    store.sync()  # nothing left to flush: no error, no change
    # The last outcome claims nothing: the group ends there.
    finished, claimed, next_due = store.finish_and_claim(
        Finish(c.id, EffectStatus.COMPLETED, None, T0 + 3), T0 + 3, durable=False)
    assert finished is not None and claimed is None and next_due is None
    assert [(r.id, r.status, r.error) for r in store.list_runs(T0 + 3, RetentionPolicy())[0]] == [
        (c.id, EffectStatus.COMPLETED, None), (b.id, EffectStatus.FAILED, "boom"),
        (a.id, EffectStatus.COMPLETED, None)]
    assert store.pending_runs() == []


def test_an_outcome_recorded_on_the_callers_thread_is_declined_or_is_the_same_write(
    store: ThreadStore,
) -> None:
    """`finish_inline` does nothing (None) or what ``finish_and_claim`` does; `sync` after."""
    a, b = run(), run()
    for r in (a, b):
        store.insert_run(r)
    store.finish_and_claim(None, T0)
    for done, nxt in ((a, b), (b, None)):
        outcome = Finish(done.id, EffectStatus.COMPLETED, None, T0 + 1)
        answer = store.finish_inline(outcome, T0 + 1)
        if answer is None:
            assert not store.group_commit
            answer = store.finish_and_claim(outcome, T0 + 1, durable=False)
        finished, claimed, next_due = answer
        assert finished is not None and finished.status is EffectStatus.COMPLETED
        assert (claimed.id if claimed is not None else None) == (nxt.id if nxt else None)
        assert next_due is None
    store.sync()
    assert {r.status for r in store.list_runs(T0 + 1, RetentionPolicy())[0]} == {
        EffectStatus.COMPLETED}


def test_two_stores_of_one_thread_claiming_at_once_never_claim_a_run_twice(
    harness: Harness, store: ThreadStore
) -> None:
    """Claims are atomic against every connection: each due run goes to one claimer."""
    runs = [run() for _ in range(40)]
    for r in runs:
        store.insert_run(r)
    other = harness.backend.open_thread_store("t")
    claimed: list[list[str]] = [[], []]

    def claim_all(s: ThreadStore, into: list[str]) -> None:
        while True:
            _, got, _ = s.finish_and_claim(None, T0)
            if got is None:
                return
            into.append(got.id)

    try:
        workers = [
            threading.Thread(target=claim_all, args=(s, into))
            for s, into in ((store, claimed[0]), (other, claimed[1]))
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=60)
        assert not any(w.is_alive() for w in workers)
    finally:
        other.close()
    every = claimed[0] + claimed[1]
    assert sorted(every) == sorted(ids(runs))  # each run claimed exactly once
    statuses = {r.id: r.status for r in store.list_runs(T0, KEEP, limit=100)[0]}
    assert set(statuses.values()) == {EffectStatus.RUNNING}


def test_finish_and_claim_records_the_outcome_and_claims_in_one_step(
    store: ThreadStore,
) -> None:
    a, b = run(), run(run_at=T0 + 1)
    store.insert_run(a)
    store.insert_run(b)
    _, claimed, _ = store.finish_and_claim(None, T0)
    assert claimed is not None and claimed.id == a.id
    finished, claimed, next_due = store.finish_and_claim(
        finish(a.id, EffectStatus.FAILED, at=T0 + 2), T0 + 2
    )
    assert finished is not None and finished.id == a.id
    assert (finished.status, finished.error, finished.finished_at_ts) == (
        EffectStatus.FAILED, "boom", T0 + 2
    )
    assert claimed is not None and claimed.id == b.id and next_due is None
    # Nothing pending at all: no next due time.
    done, claimed, next_due = store.finish_and_claim(finish(b.id, at=T0 + 3), T0 + 3)
    assert done is not None and done.status is EffectStatus.COMPLETED
    assert (claimed, next_due) == (None, None)


def test_an_outcome_is_recorded_only_for_a_running_run(store: ThreadStore) -> None:
    pending = run(run_at=T0 + 60)
    store.insert_run(pending)
    # Not running (pending, unknown, already finished): nothing is written.
    assert store.finish_and_claim(finish(pending.id), T0, claim=False) == (None, None, None)
    assert store.finish_and_claim(finish("unknown"), T0, claim=False) == (None, None, None)
    assert store.get_run(pending.id, T0, KEEP) == pending
    store.cancel(pending.id, T0)
    assert store.finish_and_claim(finish(pending.id), T0, claim=False)[0] is None
    canceled = store.get_run(pending.id, T0, KEEP)
    assert canceled is not None and canceled.status is EffectStatus.CANCELED


def test_recovery_requeues_interrupted_runs_and_fails_them_at_the_attempt_limit(
    store: ThreadStore,
) -> None:
    a, b, later = run(), run(), run(run_at=T0 + 100)
    for r in (a, b, later):
        store.insert_run(r)
    # a starts three times (two interruptions), b once.
    for attempt in (1, 2):
        _, claimed, _ = store.finish_and_claim(None, T0)
        assert claimed is not None and claimed.id == a.id and claimed.attempts == attempt
        assert ids(store.recover_interrupted(T0 + attempt, 3)) == [a.id]
    _, claimed_a, _ = store.finish_and_claim(None, T0 + 3)
    _, claimed_b, _ = store.finish_and_claim(None, T0 + 3)
    assert claimed_a is not None and claimed_a.attempts == 3
    assert claimed_b is not None and claimed_b.id == b.id

    # Only the named runs; a run that is not running is left alone.
    assert store.recover_interrupted(T0 + 4, 3, [later.id]) == []
    assert store.recover_interrupted(T0 + 4, 3, []) == []
    changed = store.recover_interrupted(T0 + 4, 3)
    assert ids(changed) == [a.id, b.id]  # scheduling order
    failed, requeued = changed
    assert failed.status is EffectStatus.FAILED and failed.finished_at_ts == T0 + 4
    assert failed.error == (
        "Interrupted 3 times (by a restart, a shutdown, a lost lease or an unreachable "
        "database, not by its own error); "
        "gave up after 3 attempts"
    )
    assert requeued.status is EffectStatus.PENDING
    assert requeued.attempts == 1 and requeued.run_at_ts == T0  # its due time is kept
    assert store.recover_interrupted(T0 + 5, 3) == []
    # A run interrupted before its (moved) due time is due at once after recovery.
    store.run_now(later.id, T0 + 10)
    _, claimed, _ = store.finish_and_claim(None, T0 + 10)
    _, claimed, _ = store.finish_and_claim(None, T0 + 10)
    assert claimed is not None and claimed.id == later.id
    (back,) = store.recover_interrupted(T0 + 11, 3, [later.id])
    assert back.run_at_ts == T0 + 10


def test_recover_interrupted_stores_its_reason(store: ThreadStore) -> None:
    # What interrupted an attempt is its error; a run failed at the limit names the last.
    a = run(run_at=T0)
    store.insert_run(a)
    store.finish_and_claim(None, T0)
    (back,) = store.recover_interrupted(T0 + 1, 3, [a.id])
    assert back.status is EffectStatus.PENDING
    reasons = ["the database could not be reached", "its node's lease expired"]
    for attempt, reason in enumerate(reasons, start=2):
        _, claimed, _ = store.finish_and_claim(None, T0 + attempt)
        assert claimed is not None and claimed.id == a.id
        (back,) = store.recover_interrupted(T0 + attempt, 3, [a.id], reason=reason)
    assert back.status is EffectStatus.FAILED
    assert back.error is not None and back.error.endswith(
        "(the last time: its node's lease expired)")
    attempts = store.run_attempts(a.id)
    assert [(x.outcome, x.error) for x in attempts] == [
        ("interrupted", None), ("interrupted", reasons[0]), ("interrupted", reasons[1])]


def test_cancel_and_run_now_change_only_pending_runs(store: ThreadStore) -> None:
    a, b, c = run(run_at=T0 + 60), run(run_at=T0 + 60), run(run_at=T0 - 60)
    for r in (a, b, c):
        store.insert_run(r)
    canceled = store.cancel(a.id, T0)
    assert canceled is not None
    assert (canceled.status, canceled.finished_at_ts) == (EffectStatus.CANCELED, T0)
    assert store.cancel(a.id, T0) is None
    assert store.cancel("unknown", T0) is None
    assert store.run_now(a.id, T0) is None

    moved = store.run_now(b.id, T0)
    assert moved is not None and moved.run_at_ts == T0 and moved.status is EffectStatus.PENDING
    already_due = store.run_now(c.id, T0)
    assert already_due is not None and already_due.run_at_ts == T0 - 60  # never later
    _, running, _ = store.finish_and_claim(None, T0)
    assert running is not None and running.id == c.id
    assert store.cancel(c.id, T0) is None  # a running run is not canceled here
    assert store.run_now(c.id, T0) is None
    assert ids(store.pending_runs()) == [b.id]


def test_a_run_keeps_its_trace_context_until_it_finishes(
    harness: Harness, store: ThreadStore
) -> None:
    ctx = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    done, failing, canceled, requeued = (
        replace(run(), trace_context=ctx) for _ in range(4)
    )
    plain = run(run_at=T0 + 60)
    for r in (done, failing, canceled, requeued, plain):
        store.insert_run(r)
    # It survives closing and reopening the store (a restart).
    store.close()
    store = harness.backend.open_thread_store("t")
    try:
        got = store.get_run(done.id, T0, KEEP)
        assert got is not None and got.trace_context == ctx
        plain_got = store.get_run(plain.id, T0, KEEP)
        assert plain_got is not None and plain_got.trace_context is None

        _, claimed, _ = store.finish_and_claim(None, T0)
        assert claimed is not None and claimed.id == done.id and claimed.trace_context == ctx
        finished, claimed, _ = store.finish_and_claim(finish(done.id), T0)
        assert finished is not None and finished.trace_context is None
        assert claimed is not None and claimed.id == failing.id
        assert claimed.trace_context == ctx
        finished, _, _ = store.finish_and_claim(
            finish(failing.id, EffectStatus.FAILED), T0, claim=False
        )
        assert finished is not None and finished.trace_context is None

        gone = store.cancel(canceled.id, T0)
        assert gone is not None and gone.trace_context is None

        # An interrupted run keeps it for its next attempt, until the last one fails.
        for attempt in (1, 2, 3):
            _, claimed, _ = store.finish_and_claim(None, T0)
            assert claimed is not None and claimed.id == requeued.id
            assert claimed.attempts == attempt and claimed.trace_context == ctx
            (back,) = store.recover_interrupted(T0, 3)
        assert back.status is EffectStatus.FAILED and back.trace_context is None
        for r in (done, failing, canceled, requeued):
            again = store.get_run(r.id, T0, KEEP)
            assert again is not None and again.status.finished
            assert again.trace_context is None
    finally:
        store.close()


def test_each_attempt_is_kept_with_how_it_ended(store: ThreadStore) -> None:
    r, other = run(), run(run_at=T0 + 1)
    store.insert_run(r)
    store.insert_run(other)
    assert store.run_attempts(r.id) == []
    store.finish_and_claim(None, T0)  # attempt 1 ...
    assert store.run_attempts(r.id) == [RunAttempt(1, T0, None, "running", node_id=NODE)]
    store.recover_interrupted(T0 + 5, 3)  # ... interrupted by a restart
    store.finish_and_claim(None, T0 + 6)  # attempt 2 ...
    finished, _, _ = store.finish_and_claim(
        finish(r.id, EffectStatus.FAILED, at=T0 + 8), T0 + 8, claim=False
    )  # ... failed
    assert finished is not None
    assert store.run_attempts(r.id) == [
        RunAttempt(1, T0, T0 + 5, "interrupted", node_id=NODE),
        RunAttempt(2, T0 + 6, T0 + 8, "failed", "boom", NODE),
    ]
    store.finish_and_claim(None, T0 + 9)
    store.finish_and_claim(finish(other.id, at=T0 + 10), T0 + 10, claim=False)
    assert store.run_attempts(other.id) == [
        RunAttempt(1, T0 + 9, T0 + 10, "completed", node_id=NODE)]
    assert store.run_attempts("unknown") == []
    # Pruned with their run.
    store.prune(T0 + 10 * DAY, RetentionPolicy(completed_seconds=1, failed_seconds=1))
    assert store.run_attempts(r.id) == [] and store.run_attempts(other.id) == []


def test_pending_runs_in_due_order_by_name(store: ThreadStore) -> None:
    x1, y, x2 = run("x", run_at=T0 + 2), run("y", run_at=T0 + 1), run("x", run_at=T0 + 1)
    for r in (x1, y, x2):
        store.insert_run(r)
    assert ids(store.pending_runs()) == [y.id, x2.id, x1.id]
    assert ids(store.pending_runs("x")) == [x2.id, x1.id]
    assert store.pending_runs("z") == []


def test_list_runs_newest_first_with_filters_and_a_stable_cursor(store: ThreadStore) -> None:
    runs = [run("x" if i % 2 else "y", run_at=T0 + 100 - i) for i in range(7)]
    for r in runs:
        store.insert_run(r)
    complete(store, extra := run("x", run_at=T0 - 1), T0)
    everything = [extra, *reversed(runs)]

    seen: list[EffectRun] = []
    cursor: int | None = None
    while True:
        page, cursor = store.list_runs(T0, KEEP, limit=3, before_seq=cursor)
        seen += page
        if cursor is None:
            break
        if len(seen) == 3:
            # New runs while paging do not shift the pages that follow.
            store.insert_run(run())
    assert ids(seen) == ids(everything)
    assert store.list_runs(T0, KEEP, limit=len(everything) + 1)[1] is None
    assert store.list_runs(T0, KEEP, limit=len(everything) + 1)[0][0].status is (
        EffectStatus.PENDING
    )

    xs, nxt = store.list_runs(T0, KEEP, name="x", limit=100)
    assert ids(xs) == [r.id for r in everything if r.name == "x"] and nxt is None
    done, _ = store.list_runs(T0, KEEP, statuses=[EffectStatus.COMPLETED])
    assert ids(done) == [extra.id]
    both, _ = store.list_runs(
        T0, KEEP, statuses=[EffectStatus.COMPLETED, EffectStatus.PENDING], name="y"
    )
    assert ids(both) == [r.id for r in reversed(runs) if r.name == "y"]
    assert store.list_runs(T0, KEEP, statuses=[EffectStatus.FAILED]) == ([], None)

    counts = store.count_runs(T0, KEEP)
    assert counts == {**dict.fromkeys(EffectStatus, 0), EffectStatus.PENDING: 8,
                      EffectStatus.COMPLETED: 1}
    assert store.count_runs(T0, KEEP, name="x")[EffectStatus.COMPLETED] == 1
    assert store.count_runs(T0, KEEP, name="z") == dict.fromkeys(EffectStatus, 0)


# ------------------------------------------------------------------ retention


def _aged_store(store: ThreadStore) -> tuple[EffectRun, EffectRun, EffectRun, EffectRun]:
    """A completed, canceled and failed run finished at T0, and a pending one."""
    done = complete(store, run(), T0)
    canceled = run(run_at=T0 + 10)
    store.insert_run(canceled)
    assert store.cancel(canceled.id, T0) is not None
    failed = run()
    store.insert_run(failed)
    _, claimed, _ = store.finish_and_claim(None, T0)
    assert claimed is not None
    store.finish_and_claim(finish(failed.id, EffectStatus.FAILED), T0, claim=False)
    pending = run(run_at=T0 + 1000 * DAY)
    store.insert_run(pending)
    return done, store.get_run(canceled.id, T0, KEEP), store.get_run(failed.id, T0, KEEP), pending  # type: ignore[return-value]


def test_reads_hide_runs_past_retention_and_never_delete(store: ThreadStore) -> None:
    done, canceled, failed, pending = _aged_store(store)
    policy = RetentionPolicy(completed_seconds=10 * DAY, failed_seconds=DAY)
    at = T0 + DAY + 1  # failed is past retention, the others are not
    assert store.get_run(failed.id, at, policy) is None
    assert ids(store.list_runs(at, policy)[0]) == [pending.id, canceled.id, done.id]
    assert store.count_runs(at, policy)[EffectStatus.FAILED] == 0
    later = T0 + 10 * DAY + 1  # now completed and canceled are too; pending never
    assert ids(store.list_runs(later, policy)[0]) == [pending.id]
    assert store.get_run(done.id, later, policy) is None
    # Reading wrote nothing: with a longer policy every run is still there.
    assert ids(store.list_runs(later, KEEP)[0]) == [pending.id, failed.id, canceled.id, done.id]
    assert store.get_run(failed.id, later, KEEP) == failed


def test_prune_by_age(store: ThreadStore) -> None:
    _done, _canceled, failed, pending = _aged_store(store)
    policy = RetentionPolicy(completed_seconds=10 * DAY, failed_seconds=DAY)
    assert store.prune(T0 + DAY - 1, policy) == 0
    assert store.prune(T0 + DAY + 1, policy) == 1
    assert store.get_run(failed.id, T0, KEEP) is None
    assert store.prune(T0 + 10 * DAY + 1, policy) == 2
    assert ids(store.list_runs(T0, KEEP)[0]) == [pending.id]
    assert store.prune(T0 + 1000 * DAY, policy) == 0  # pending runs are never pruned


def test_prune_by_count_keeps_the_latest_finished(store: ThreadStore) -> None:
    # Finished in a different order than scheduled; two share a finish time.
    finished_at = [T0 + 3, T0 + 1, T0 + 1, T0 + 4, T0 + 2]
    runs = [run(run_at=at) for at in finished_at]  # each is finished when it is due
    for r in runs:
        store.insert_run(r)
    for at in sorted(finished_at):
        _, claimed, _ = store.finish_and_claim(None, at)
        assert claimed is not None
        store.finish_and_claim(finish(claimed.id, at=at), at, claim=False)
    pending = run(run_at=T0 + 1000)
    store.insert_run(pending)
    policy = RetentionPolicy(max_finished=2)
    # Oldest by finish time first, ties by scheduling order: runs 1, 2, then 4.
    assert store.prune(T0 + 5, policy) == 3
    assert ids(store.list_runs(T0 + 5, KEEP)[0]) == [pending.id, runs[3].id, runs[0].id]


def test_finishing_prunes_on_the_write_path(store: ThreadStore) -> None:
    policy = RetentionPolicy(max_finished=2, completed_seconds=DAY, failed_seconds=DAY)
    kept = [complete(store, run(), T0 + i, retention=policy) for i in range(4)]
    # After each finish at most two finished runs remain, without a prune call.
    assert ids(store.list_runs(T0 + 4, KEEP)[0]) == [kept[3].id, kept[2].id]
    c = run(run_at=T0 + 99)
    store.insert_run(c)
    assert store.cancel(c.id, T0 + 5, retention=policy) is not None
    assert ids(store.list_runs(T0 + 5, KEEP)[0]) == [c.id, kept[3].id]
    # A finish a day later deletes what its age put past retention.
    late = complete(store, run(run_at=T0 + 2 * DAY), T0 + 2 * DAY, retention=policy)
    assert ids(store.list_runs(T0 + 2 * DAY, KEEP)[0]) == [late.id]
    # Recovery that fails a run prunes as well.
    stuck = run(run_at=T0 + 3 * DAY)
    store.insert_run(stuck)
    for _ in range(3):
        store.finish_and_claim(None, T0 + 3 * DAY)
        store.recover_interrupted(T0 + 3 * DAY, 3, retention=policy)
    got = store.get_run(stuck.id, T0 + 3 * DAY, KEEP)
    assert got is not None and got.status is EffectStatus.FAILED
    assert ids(store.list_runs(T0 + 3 * DAY, KEEP)[0]) == [stuck.id, late.id]


def test_without_a_policy_nothing_is_pruned(store: ThreadStore) -> None:
    for i in range(3):
        complete(store, run(), T0 + i)
    assert len(store.list_runs(T0 + 1000 * DAY, KEEP)[0]) == 3


# ------------------------------------------------------------------ messages


def test_messages_round_trip_in_order(store: ThreadStore) -> None:
    batch = [message(i) for i in range(1, 4)]
    store.insert_messages(batch)
    store.insert_messages([])
    store.insert_messages([message(4)])
    assert store.all_messages() == [*batch, message(4)]
    assert store.get_message("m0002") == message(2)
    assert store.get_message("nope") is None


def test_free_text_with_nul_round_trips(store: ThreadStore, rtdb: RuntimeStore) -> None:
    """NUL in content, args and errors is kept (PostgreSQL text cannot hold it: escaped)."""
    texts = ["a\u0000b", "\u0000", "\u0001nul\u0001\"x\"", "\u0001nul\u0001", "plain"]
    batch = [replace(message(i), content=t) for i, t in enumerate(texts, start=1)]
    store.insert_messages(batch)
    assert store.all_messages() == batch
    assert store.get_message("m0001") == batch[0]

    r = run(args={"text": "hi \u0000", "\u0000key": ["\u0000"]})
    store.insert_run(r)
    _, claimed, _ = store.finish_and_claim(None, T0)
    assert claimed is not None and claimed.args == r.args
    failed = Finish(r.id, EffectStatus.FAILED, "ValueError: bad \u0000 thing", T0)
    done, _, _ = store.finish_and_claim(failed, T0, claim=False)
    assert done is not None and done.error == "ValueError: bad \u0000 thing"
    got = store.get_run(r.id, T0, KEEP)
    assert got is not None and got.error == done.error and got.args == r.args
    rtdb.index_runs([done])
    page = rtdb.list_indexed_runs(RunQuery(statuses=(EffectStatus.FAILED,)), T0, KEEP, 10)
    assert [(x.id, x.error) for x in page[0]] == [(r.id, done.error)]


def test_a_batch_with_a_taken_id_writes_nothing(store: ThreadStore) -> None:
    store.insert_messages([message(1)])
    with pytest.raises(ThreadStorageError, match="Thread t"):
        store.insert_messages([message(2), message(1)])
    assert store.all_messages() == [message(1)]


def test_message_pages_and_cursors(store: ThreadStore) -> None:
    store.insert_messages([message(i) for i in range(1, 8)])

    def page(**kw: object) -> tuple[list[str], str | None, str | None] | None:
        got = store.list_messages(**kw)  # type: ignore[arg-type]
        return None if got is None else ([m.id for m in got[0]], got[1], got[2])

    # Forward from the start.
    assert page(limit=3) == (["m0001", "m0002", "m0003"], "m0003", None)
    assert page(limit=3, after_id="m0003") == (["m0004", "m0005", "m0006"], "m0006", "m0004")
    assert page(limit=3, after_id="m0006") == (["m0007"], None, "m0007")
    assert page(limit=3, after_id="m0007") == ([], None, None)
    assert page(limit=7) == ([f"m{i:04d}" for i in range(1, 8)], None, None)
    # The newest, and backwards.
    assert page(limit=3, latest=True) == (["m0005", "m0006", "m0007"], None, "m0005")
    assert page(limit=3, before_id="m0005") == (["m0002", "m0003", "m0004"], "m0004", "m0002")
    assert page(limit=3, before_id="m0002") == (["m0001"], "m0001", None)
    assert page(limit=3, before_id="m0001") == ([], None, None)
    assert page(limit=10, latest=True) == ([f"m{i:04d}" for i in range(1, 8)], None, None)
    # A cursor that names no message.
    assert page(after_id="nope") is None
    assert page(before_id="nope") is None


def test_an_empty_conversation(store: ThreadStore) -> None:
    assert store.list_messages() == ([], None, None)
    assert store.list_messages(latest=True) == ([], None, None)
    assert store.all_messages() == []


def test_reads_show_only_the_latest_max_finished_while_deletion_is_batched(
    store: ThreadStore,
) -> None:
    # A backend may delete the runs over max_finished in batches (at most a tenth of the
    # limit late); reads never show more than the limit, and always the latest.
    policy = RetentionPolicy(max_finished=20)
    done: list[EffectRun] = []
    pending = run(run_at=T0 + 1000)
    store.insert_run(pending)
    for i in range(45):
        done.append(complete(store, run(run_at=T0 + i), T0 + i, retention=policy))
        at = T0 + i
        latest = [r.id for r in reversed(done[-20:])]
        shown, _ = store.list_runs(at, policy, limit=100)
        assert ids(shown) == [*latest, pending.id]
        assert store.count_runs(at, policy)[EffectStatus.COMPLETED] == len(latest)
        assert store.get_run(done[-1].id, at, policy) is not None
        if len(done) > 20:
            assert store.get_run(done[-21].id, at, policy) is None
        stored = store.count_runs(at, KEEP)[EffectStatus.COMPLETED]
        assert len(latest) <= stored <= 20 + 20 // 10


def test_a_run_cursor_outlives_the_deletion_of_the_run_it_names(store: ThreadStore) -> None:
    old = [complete(store, run(run_at=T0 + i), T0 + i) for i in range(3)]
    newer = [run(run_at=T0 + 100) for _ in range(3)]
    for r in newer:
        store.insert_run(r)
    page, cursor = store.list_runs(T0 + 3, KEEP, limit=4)
    assert ids(page) == [*reversed(ids(newer)), old[2].id] and cursor is not None
    # The run the cursor names is pruned before the next page is read.
    assert store.prune(T0 + 3, RetentionPolicy(max_finished=1)) == 2
    assert store.list_runs(T0 + 3, KEEP, limit=4, before_seq=cursor) == ([], None)
    page, cursor = store.list_runs(T0 + 3, KEEP, limit=3)
    assert ids(page) == ids(list(reversed(newer))) and cursor is not None
    assert ids(store.list_runs(T0 + 3, KEEP, limit=3, before_seq=cursor)[0]) == [old[2].id]


def test_reads_hide_finished_runs_beyond_max_finished_without_deleting(
    store: ThreadStore,
) -> None:
    done = [complete(store, run(run_at=T0 + i), T0 + i) for i in range(4)]
    pending = run(run_at=T0 + 99)
    store.insert_run(pending)
    policy = RetentionPolicy(max_finished=2, completed_seconds=DAY, failed_seconds=DAY)
    at = T0 + 10
    assert ids(store.list_runs(at, policy)[0]) == [pending.id, done[3].id, done[2].id]
    assert store.get_run(done[1].id, at, policy) is None
    assert store.get_run(done[2].id, at, policy) is not None
    assert store.count_runs(at, policy)[EffectStatus.COMPLETED] == 2
    # Age first, then the count among what is left.
    assert ids(store.list_runs(T0 + DAY + 1.5, policy)[0]) == [
        pending.id, done[3].id, done[2].id
    ]
    assert ids(store.list_runs(T0 + DAY + 2.5, policy)[0]) == [pending.id, done[3].id]
    assert ids(store.list_runs(T0 + DAY + 3.5, policy)[0]) == [pending.id]
    # Nothing was deleted.
    assert ids(store.list_runs(at, KEEP)[0]) == [pending.id, *reversed(ids(done))]


def test_a_failed_run_past_its_age_does_not_count_toward_max_finished(
    store: ThreadStore,
) -> None:
    done = [complete(store, run(run_at=T0 + i), T0 + i) for i in range(2)]
    failed = run(run_at=T0 + 2)
    store.insert_run(failed)
    store.finish_and_claim(None, T0 + 2)
    store.finish_and_claim(finish(failed.id, EffectStatus.FAILED, at=T0 + 2), T0 + 2, claim=False)
    policy = RetentionPolicy(max_finished=2, completed_seconds=30 * DAY, failed_seconds=DAY)
    assert ids(store.list_runs(T0 + 3, policy)[0]) == [failed.id, done[1].id]
    # A day later the failed run is past its age: both completed runs show again.
    assert ids(store.list_runs(T0 + DAY + 3, policy)[0]) == [done[1].id, done[0].id]
    assert store.prune(T0 + DAY + 3, policy) == 1
    assert ids(store.list_runs(T0 + DAY + 3, KEEP)[0]) == [done[1].id, done[0].id]


# ------------------------------------------------------------ effect records


def begin(store: ThreadStore, key: str, owner: str, at: float, **kw: object) -> Claim:
    return store.begin_effect_record(
        key, tool_name="post_note", run_id="turn-1", owner=owner, lease_seconds=60.0, now=at,
        **kw,  # type: ignore[arg-type]
    )


def test_an_effect_key_is_claimed_once_then_applied(store: ThreadStore) -> None:
    assert store.get_effect_record("k") is None
    first = begin(store, "k", "a", T0)
    assert first.claimed and not first.took_over and not first.applied
    assert first.record.thread_id == "t" and first.record.run_id == "turn-1"
    assert first.record.status is EffectRecordStatus.IN_PROGRESS
    assert first.record.lease_expires_at == datetime.fromtimestamp(T0 + 60, UTC)
    # Another caller under the live lease: nothing changes.
    second = begin(store, "k", "b", T0 + 1)
    assert not second.claimed and second.record.owner == "a"
    with pytest.raises(EffectRecordLost, match="'k' in thread t"):
        store.complete_effect_record("k", owner="b", result_json="1", now=T0 + 2)
    done = store.complete_effect_record("k", owner="a", result_json='{"id":7}', now=T0 + 2)
    assert done.status is EffectRecordStatus.APPLIED and done.result == {"id": 7}
    assert done.owner is None and done.lease_expires_at is None
    assert store.get_effect_record("k") == done
    # Applied: a later claim, even past the old lease, gets the result.
    again = begin(store, "k", "c", T0 + 600)
    assert again.applied and not again.claimed and again.record.result == {"id": 7}


def test_an_expired_lease_is_taken_over_and_a_release_records_nothing(
    store: ThreadStore,
) -> None:
    begin(store, "k", "a", T0)
    taken = begin(store, "k", "b", T0 + 61)
    assert taken.claimed and taken.took_over and taken.record.owner == "b"
    assert store.release_effect_record("k", owner="a") is None  # not its claim any more
    released = store.release_effect_record("k", owner="b")
    assert released is not None and released.key == "k"
    assert store.get_effect_record("k") is None
    assert begin(store, "k", "c", T0 + 62).claimed
    with pytest.raises(ValueError, match="lease_seconds"):
        store.begin_effect_record("x", tool_name="t", run_id=None, owner="a",
                                  lease_seconds=0, now=T0)
    assert store.get_effect_record("x") is None


def test_effect_records_page_newest_first(store: ThreadStore) -> None:
    for i in range(5):
        begin(store, f"k{i}", "a", T0 + i)
    store.complete_effect_record("k1", owner="a", result_json="1", now=T0 + 9)
    page = store.list_effect_records(limit=2)
    assert [r.key for r in page.records] == ["k4", "k3"] and page.next_cursor is not None
    rest = store.list_effect_records(limit=10, cursor=page.next_cursor)
    assert [r.key for r in rest.records] == ["k2", "k1", "k0"] and rest.next_cursor is None
    applied = store.list_effect_records(status=EffectRecordStatus.APPLIED)
    assert [r.key for r in applied.records] == ["k1"]
    with pytest.raises(ValueError, match="cursor"):
        store.list_effect_records(cursor="not-a-cursor")
    with pytest.raises(ValueError, match="limit"):
        store.list_effect_records(limit=0)


def test_effect_records_past_retention_go_on_the_write_path_and_with_the_store(
    harness: Harness, store: ThreadStore
) -> None:
    policy = RetentionPolicy(effect_records_seconds=DAY)
    begin(store, "old", "a", T0)
    store.complete_effect_record("old", owner="a", result_json="1", now=T0)
    begin(store, "held", "a", T0)  # in progress, its lease long expired by then
    begin(store, "new", "a", T0 + DAY)
    store.complete_effect_record("new", owner="a", result_json="2", now=T0 + DAY)
    # A read never deletes.
    assert len(store.list_effect_records().records) == 3
    begin(store, "later", "a", T0 + DAY + 120, retention=policy)
    assert {r.key for r in store.list_effect_records().records} == {"new", "later"}
    store.prune(T0 + 3 * DAY, policy)
    assert store.list_effect_records().records == []
    begin(store, "k", "a", T0 + 3 * DAY)
    store.close()
    harness.backend.remove_thread_store("t")
    info = ThreadInfo(id="t", created_at_ts=T0 + 4 * DAY)
    fresh = harness.backend.create_thread_store(info)
    try:
        assert fresh.get_effect_record("k") is None
    finally:
        fresh.close()


def test_effect_records_are_the_threads_own(harness: Harness, rtdb: RuntimeStore) -> None:
    stores = []
    for tid in ("a", "b"):
        info = ThreadInfo(id=tid, created_at_ts=T0)
        assert rtdb.add_thread(info)
        stores.append(harness.backend.create_thread_store(info))
    try:
        begin(stores[0], "k", "x", T0)
        assert stores[1].get_effect_record("k") is None
        assert begin(stores[1], "k", "y", T0).claimed
        assert [r.thread_id for r in stores[1].list_effect_records().records] == ["b"]
    finally:
        for s in stores:
            s.close()


def test_purging_a_threads_effect_records_by_age_or_all(store: ThreadStore) -> None:
    begin(store, "old", "a", T0)
    store.complete_effect_record("old", owner="a", result_json="1", now=T0)
    begin(store, "held", "a", T0 + 10)  # lease until T0 + 70
    begin(store, "new", "a", T0 + 100)
    # Before T0 + 50: "old" (applied) goes; "held" stays, its lease runs to T0 + 70.
    assert store.purge_effect_records(older_than=T0 + 50) == 1
    assert {r.key for r in store.list_effect_records().records} == {"held", "new"}
    assert store.purge_effect_records(older_than=T0 + 80) == 1
    assert store.purge_effect_records(older_than=None) == 1
    assert store.list_effect_records().records == []


def test_leases_of_a_gone_process_end_and_the_next_claim_takes_them_over(
    store: ThreadStore,
) -> None:
    mine = "host-a:42:"
    begin(store, "theirs", "host-b:7:x1", T0)
    begin(store, "ours", f"{mine}y2", T0)
    begin(store, "done", "host-b:7:x3", T0)
    store.complete_effect_record("done", owner="host-b:7:x3", result_json="1", now=T0)
    assert store.expire_effect_leases(keep_owner_prefix=mine, now=T0 + 1) == 1
    assert store.expire_effect_leases(keep_owner_prefix=mine, now=T0 + 1) == 0
    theirs = store.get_effect_record("theirs")
    assert theirs is not None
    assert theirs.lease_expires_at == datetime.fromtimestamp(T0 + 1, UTC)
    taken = begin(store, "theirs", f"{mine}z", T0 + 1)
    assert taken.claimed and taken.took_over
    assert not begin(store, "ours", f"{mine}w", T0 + 1).claimed  # a live call of ours
    done = store.get_effect_record("done")
    assert done is not None and done.status is EffectRecordStatus.APPLIED


# ------------------------------------------------------------------ keys


def test_a_key_holds_one_live_run_and_is_free_once_it_finished(store: ThreadStore) -> None:
    first = replace(run(), key="daily")
    assert store.insert_run(first) is None
    held = store.insert_run(replace(run(), key="daily"))
    assert held is not None and held.id == first.id and held.key == "daily"
    assert store.insert_run(replace(run(), key="other")) is None  # another key
    assert store.insert_run(run()) is None  # no key: never held
    _, claimed, _ = store.finish_and_claim(None, T0)
    assert claimed is not None and claimed.id == first.id
    running = store.insert_run(replace(run(), key="daily"))  # a running run holds it too
    assert running is not None and running.id == first.id
    store.finish_and_claim(finish(first.id), T0, claim=False)
    again = replace(run(), key="daily")
    assert store.insert_run(again) is None  # finished: the key is free
    assert [r.id for r in store.pending_runs() if r.key == "daily"] == [again.id]
    assert store.get_run(first.id, T0, KEEP) == replace(
        first, status=EffectStatus.COMPLETED, attempts=1, started_at_ts=T0, finished_at_ts=T0
    )


def test_a_running_run_hands_its_key_to_one_successor(store: ThreadStore) -> None:
    link = replace(run(), key="chain")
    store.insert_run(link)
    _, claimed, _ = store.finish_and_claim(None, T0)
    assert claimed is not None and claimed.id == link.id
    successor = replace(run(run_at=T0 + 60), key="chain")
    assert store.insert_run(successor, hand_off_from=link.id) is None
    # A second hand-off, or anyone else, finds the pending successor.
    for hand_off in (link.id, None):
        held = store.insert_run(replace(run(), key="chain"), hand_off_from=hand_off)
        assert held is not None and held.id == successor.id
    # Only the run that holds the key can hand it on.
    other = replace(run(), key="solo")
    store.insert_run(other)
    store.finish_and_claim(finish(link.id), T0, claim=False)
    held = store.insert_run(replace(run(), key="solo"), hand_off_from=link.id)
    assert held is not None and held.id == other.id


def test_cancel_and_finish_record_who_canceled(store: ThreadStore) -> None:
    pending = run()
    store.insert_run(pending)
    canceled = store.cancel(pending.id, T0 + 1, canceled_by="http")
    assert canceled is not None
    assert (canceled.status, canceled.canceled_by, canceled.finished_at_ts) == (
        EffectStatus.CANCELED, "http", T0 + 1
    )
    busy = run()
    store.insert_run(busy)
    store.finish_and_claim(None, T0)
    done, _, _ = store.finish_and_claim(
        Finish(busy.id, EffectStatus.CANCELED, None, T0 + 2, canceled_by="pane"), T0 + 2,
        claim=False,
    )
    assert done is not None
    assert (done.status, done.canceled_by, done.finished_at_ts) == (
        EffectStatus.CANCELED, "pane", T0 + 2
    )
    assert store.get_run(busy.id, T0 + 2, KEEP) == done


def test_a_claim_can_be_limited_to_some_effect_names(store: ThreadStore) -> None:
    serial = run("serial", run_at=T0)
    beside = run("beside", run_at=T0 + 1)
    later = run("beside", run_at=T0 + 5)
    for r in (serial, beside, later):
        store.insert_run(r)
    _, claimed, _ = store.finish_and_claim(None, T0 + 2, only_names=["beside"])
    assert claimed is not None and claimed.id == beside.id  # the serial one is passed over
    _, claimed, next_due = store.finish_and_claim(None, T0 + 2, only_names=["beside"])
    assert (claimed, next_due) == (None, T0 + 5)  # only runs of those names count
    assert store.finish_and_claim(None, T0 + 2, only_names=[]) == (None, None, None)
    done, claimed, _ = store.finish_and_claim(finish(beside.id), T0 + 2, only_names=[])
    assert done is not None and done.status is EffectStatus.COMPLETED and claimed is None
    _, claimed, _ = store.finish_and_claim(None, T0 + 2)
    assert claimed is not None and claimed.id == serial.id


# ------------------------------------------------------------- runtime-level records


def test_runtime_records_keep_the_record_contract_by_scope(rtdb: RuntimeStore) -> None:
    from runtime.errors import EffectRecordLost
    from runtime.storage.records import EffectRecordStatus

    claim = rtdb.begin_record("s", "k", tool_name="ship", run_id="r1", owner="o1",
                              lease_seconds=60, now=T0)
    assert claim.claimed and claim.record.status is EffectRecordStatus.IN_PROGRESS
    # Another owner waits while the lease lasts, takes over once it expired.
    assert not rtdb.begin_record("s", "k", tool_name="ship", run_id="r2", owner="o2",
                                 lease_seconds=60, now=T0 + 1).claimed
    with pytest.raises(EffectRecordLost):
        rtdb.complete_record("s", "k", owner="o2", result_json="1", now=T0 + 2,
                             status=EffectRecordStatus.SUCCEEDED)
    done = rtdb.complete_record("s", "k", owner="o1", result_json='"shipped"', now=T0 + 2,
                                status=EffectRecordStatus.SUCCEEDED)
    assert (done.status, done.result) == (EffectRecordStatus.SUCCEEDED, "shipped")
    again = rtdb.begin_record("s", "k", tool_name="ship", run_id="r3", owner="o3",
                              lease_seconds=60, now=T0 + 3)
    assert again.finished and again.record.result == "shipped"
    got = rtdb.get_record("s", "k")
    assert got is not None and got.run_id == "r1"
    # Scopes are apart; release drops an unfinished claim only.
    assert rtdb.get_record("other", "k") is None
    assert rtdb.begin_record("other", "k", tool_name="ship", run_id=None, owner="o4",
                             lease_seconds=60, now=T0 + 3).claimed
    assert not rtdb.release_record("s", "k", owner="o1")
    assert rtdb.release_record("other", "k", owner="o4")
    assert [r.key for r in rtdb.list_records("s").records] == ["k"]
    assert rtdb.list_records("other").records == []
    # Purge by age, and a whole scope.
    rtdb.begin_record("t", "x", tool_name="ship", run_id=None, owner="o5",
                      lease_seconds=60, now=T0 + 100)
    assert rtdb.purge_records(older_than=T0 + 50) == 1
    assert rtdb.get_record("s", "k") is None
    assert rtdb.delete_records("t") == 1
    assert rtdb.get_record("t", "x") is None


def test_runtime_records_outlive_a_close(harness: Harness) -> None:
    from runtime.storage.records import EffectRecordStatus

    rtdb = harness.backend.open()
    rtdb.begin_record("s", "k", tool_name="ship", run_id="r1", owner="o1",
                      lease_seconds=60, now=T0)
    rtdb.complete_record("s", "k", owner="o1", result_json="1", now=T0,
                         status=EffectRecordStatus.SUCCEEDED)
    rtdb.close()
    harness.backend.close()
    again = harness.twin()
    rtdb = again.open()
    try:
        record = rtdb.get_record("s", "k")
        assert record is not None and record.result == 1
    finally:
        rtdb.close()
        again.close()


# ------------------------------------------------------------------ run index


def indexed(thread_id: str, n: int, **kw: object) -> EffectRun:
    fields: dict[str, object] = {
        "id": f"x{n:04d}", "thread_id": thread_id, "name": "record",
        "status": EffectStatus.PENDING, "args": {"secret": 1}, "run_at_ts": T0 + n,
        "created_at_ts": T0 + n,
    }
    fields.update(kw)
    return EffectRun(**fields)  # type: ignore[arg-type]


def test_an_index_batch_holding_one_run_twice_keeps_its_last_state(rtdb: RuntimeStore) -> None:
    # The indexer keeps one state per run, but the contract takes any batch: the later
    # state of a run wins, and the thread's activity moves to the latest time given.
    rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0))
    first = indexed("a", 1)
    done = replace(first, status=EffectStatus.COMPLETED, attempts=1,
                   started_at_ts=T0 + 5, finished_at_ts=T0 + 6)
    rtdb.index_runs([first, indexed("a", 2), done])
    page, _ = rtdb.list_indexed_runs(RunQuery(thread_id="a"), T0, KEEP, 10)
    assert [(r.id, r.status, r.attempts) for r in page] == [
        ("x0002", EffectStatus.PENDING, 0), ("x0001", EffectStatus.COMPLETED, 1)]
    info = rtdb.get_thread("a")
    assert info is not None and info.last_activity_ts == T0 + 6


def test_the_run_index_lists_across_threads_newest_first_with_filters(
    rtdb: RuntimeStore,
) -> None:
    rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0, user_id="u1", tags=("vip", "x")))
    rtdb.add_thread(ThreadInfo(id="b", created_at_ts=T0, user_id="u2"))
    runs = [
        indexed("a", 1),
        indexed("b", 2, name="send"),
        indexed("a", 3, status=EffectStatus.FAILED, finished_at_ts=T0 + 3, error="boom"),
        indexed("b", 4, status=EffectStatus.COMPLETED, finished_at_ts=T0 + 4),
        indexed("a", 5, created_at_ts=T0 + 4),  # same created_at as x0004: ties by id
        indexed("gone", 6),  # a thread that is not registered: skipped
    ]
    rtdb.index_runs(runs)
    q = RunQuery()
    page, cursor = rtdb.list_indexed_runs(q, T0, KEEP, 10)
    assert ids(page) == ["x0005", "x0004", "x0003", "x0002", "x0001"] and cursor is None
    assert all(r.args is None for r in page)
    assert page[2].error == "boom" and page[2].status is EffectStatus.FAILED

    # Pages with a stable cursor, while runs change and new ones arrive.
    first, cursor = rtdb.list_indexed_runs(q, T0, KEEP, 2)
    assert ids(first) == ["x0005", "x0004"] and cursor == (T0 + 4, "x0004")
    rtdb.index_runs([indexed("a", 9), replace(runs[3], status=EffectStatus.COMPLETED)])
    rest, cursor = rtdb.list_indexed_runs(q, T0, KEEP, 2, cursor)
    assert ids(rest) == ["x0003", "x0002"] and cursor == (T0 + 2, "x0002")
    last, cursor = rtdb.list_indexed_runs(q, T0, KEEP, 2, cursor)
    assert ids(last) == ["x0001"] and cursor is None

    def listed(**kw: object) -> list[str]:
        return ids(rtdb.list_indexed_runs(RunQuery(**kw), T0, KEEP, 50)[0])  # type: ignore[arg-type]

    assert listed(statuses=(EffectStatus.FAILED, EffectStatus.COMPLETED)) == ["x0004", "x0003"]
    assert listed(name="send") == ["x0002"]
    assert listed(thread_id="b") == ["x0004", "x0002"]
    assert listed(user_id="u1") == ["x0009", "x0005", "x0003", "x0001"]
    assert listed(tag="vip", statuses=(EffectStatus.PENDING,)) == ["x0009", "x0005", "x0001"]
    assert listed(tag="nope") == []
    assert listed(since=T0 + 2, until=T0 + 4) == ["x0003", "x0002"]  # by due time

    counts = rtdb.count_indexed_runs(RunQuery(thread_id="a", statuses=(EffectStatus.FAILED,)),
                                     T0, KEEP)
    assert counts == {EffectStatus.PENDING: 3, EffectStatus.RUNNING: 0,
                      EffectStatus.COMPLETED: 0, EffectStatus.FAILED: 1,
                      EffectStatus.CANCELED: 0}

    # An update replaces the entry; deleting the thread removes its entries.
    rtdb.index_runs([replace(runs[0], status=EffectStatus.RUNNING, attempts=1,
                             started_at_ts=T0 + 7)])
    (entry,) = [r for r in rtdb.list_indexed_runs(q, T0, KEEP, 50)[0] if r.id == "x0001"]
    assert (entry.status, entry.attempts, entry.started_at_ts) == (
        EffectStatus.RUNNING, 1, T0 + 7
    )
    assert rtdb.delete_thread("a")
    assert listed() == ["x0004", "x0002"]


def test_the_run_index_hides_and_prunes_runs_past_retention(rtdb: RuntimeStore) -> None:
    rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0))
    policy = RetentionPolicy(completed_seconds=10 * DAY, failed_seconds=DAY)
    rtdb.index_runs([
        indexed("a", 1, status=EffectStatus.FAILED, finished_at_ts=T0),
        indexed("a", 2, status=EffectStatus.COMPLETED, finished_at_ts=T0),
        indexed("a", 3),
    ])
    later = T0 + 2 * DAY
    assert ids(rtdb.list_indexed_runs(RunQuery(), later, policy, 10)[0]) == ["x0003", "x0002"]
    assert rtdb.count_indexed_runs(RunQuery(), later, policy)[EffectStatus.FAILED] == 0
    assert rtdb.prune_run_index(later, policy) == 1
    assert rtdb.prune_run_index(later, policy) == 0
    assert ids(rtdb.list_indexed_runs(RunQuery(), T0, KEEP, 10)[0]) == ["x0003", "x0002"]


def test_whether_the_run_index_is_complete_is_kept(harness: Harness) -> None:
    rtdb = harness.backend.open()
    assert rtdb.run_index_complete() is True  # a new store: nothing to index
    rtdb.set_run_index_complete(False)
    rtdb.close()
    harness.backend.close()
    rtdb = harness.backend.open()
    try:
        assert rtdb.run_index_complete() is False
        rtdb.set_run_index_complete(True)
        assert rtdb.run_index_complete() is True
    finally:
        rtdb.close()


def test_the_run_index_keeps_a_runs_key_and_who_canceled_it(rtdb: RuntimeStore) -> None:
    rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0))
    keyed = indexed("a", 1, key="daily")
    rtdb.index_runs([keyed, indexed("a", 2)])
    page, _ = rtdb.list_indexed_runs(RunQuery(), T0, KEEP, 10)
    assert [(r.id, r.key, r.canceled_by) for r in page] == [
        ("x0002", None, None), ("x0001", "daily", None)
    ]
    rtdb.index_runs([replace(keyed, status=EffectStatus.CANCELED, finished_at_ts=T0 + 1,
                             canceled_by="pane")])
    page, _ = rtdb.list_indexed_runs(RunQuery(thread_id="a"), T0 + 1, KEEP, 10)
    assert [(r.id, r.status, r.key, r.canceled_by) for r in page][1] == (
        "x0001", EffectStatus.CANCELED, "daily", "pane"
    )


def test_the_run_index_tells_replayed_runs_from_the_others(rtdb: RuntimeStore) -> None:
    rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0))
    failed = {"status": EffectStatus.FAILED, "finished_at_ts": T0 + 9}
    rtdb.index_runs([
        indexed("a", 1, **failed),
        indexed("a", 2, **failed),
        indexed("a", 3, replay_of="x0001", **failed),  # x0001's replay, failed in turn
        indexed("a", 4, replay_of="x0003"),
    ])

    def listed(replayed: bool | None) -> list[str]:
        query = RunQuery(statuses=(EffectStatus.FAILED,), replayed=replayed)
        return ids(rtdb.list_indexed_runs(query, T0, KEEP, 10)[0])

    assert listed(None) == ["x0003", "x0002", "x0001"]
    assert listed(False) == ["x0002"]
    assert listed(True) == ["x0003", "x0001"]
    counts = rtdb.count_indexed_runs(RunQuery(replayed=False), T0, KEEP)
    assert (counts[EffectStatus.FAILED], counts[EffectStatus.PENDING]) == (1, 1)


def test_a_renewed_lease_is_not_taken_over_until_it_expires(store: ThreadStore) -> None:
    begin(store, "k", "a", T0)  # a 60 s lease
    assert store.renew_effect_record("k", owner="a", lease_seconds=60, now=T0 + 50)
    assert not begin(store, "k", "b", T0 + 61).claimed  # renewed until T0 + 110
    assert not store.renew_effect_record("k", owner="b", lease_seconds=60, now=T0 + 61)
    assert begin(store, "k", "b", T0 + 111).took_over
    assert not store.renew_effect_record("k", owner="a", lease_seconds=60, now=T0 + 112)
    assert not store.renew_effect_record("gone", owner="a", lease_seconds=60, now=T0)


def test_a_renewed_runtime_record_is_not_taken_over_until_it_expires(
    rtdb: RuntimeStore,
) -> None:
    def claim(owner: str, now: float) -> Claim:
        return rtdb.begin_record("s", "k", tool_name="ship", run_id=None, owner=owner,
                                 lease_seconds=60, now=now)

    claim("a", T0)  # a 60 s lease
    assert rtdb.renew_record("s", "k", owner="a", lease_seconds=60, now=T0 + 50)
    assert not claim("b", T0 + 61).claimed  # renewed until T0 + 110
    assert not rtdb.renew_record("s", "k", owner="b", lease_seconds=60, now=T0 + 61)
    assert not rtdb.renew_record("other", "k", owner="a", lease_seconds=60, now=T0 + 61)
    assert claim("b", T0 + 111).took_over
    assert not rtdb.renew_record("s", "k", owner="a", lease_seconds=60, now=T0 + 112)
    with pytest.raises(ValueError, match="lease"):
        rtdb.renew_record("s", "k", owner="b", lease_seconds=0, now=T0 + 112)


def test_the_run_index_keeps_no_waiting_for(rtdb: RuntimeStore) -> None:
    # `waiting_for` is what a read says about the moment it reads, never stored.
    assert rtdb.add_thread(ThreadInfo(id="a", created_at_ts=T0))
    rtdb.index_runs([replace(run(), thread_id="a", waiting_for="other")])
    [indexed], _ = rtdb.list_indexed_runs(RunQuery(), T0, RetentionPolicy(), 10)
    assert indexed.waiting_for is None


# ------------------------------------------------------------ recurring schedules


def schedule(sid: str, *, key: str | None = None, next_fire: float | None = T0 + 60,
             args: object = None) -> Schedule:
    return Schedule(
        id=sid, thread_id="t", name="record", args=args,
        recurrence=Recurrence(every_seconds=60.0), state=ScheduleState.ACTIVE,
        next_fire_at_ts=next_fire, created_at_ts=T0, key=key,
    )


def test_schedules_are_stored_listed_and_keyed(store: ThreadStore) -> None:
    a = schedule("s1", key="digest", args={"n": 1})
    assert store.insert_schedule(a) is None
    held = store.insert_schedule(schedule("s2", key="digest"))
    assert held == a  # the key is held: nothing stored
    b = replace(schedule("s3"), recurrence=Recurrence(cron="0 9 * * 1-5", timezone="Asia/Tokyo"))
    assert store.insert_schedule(b) is None
    assert store.list_schedules() == [a, b]
    assert store.get_schedule("s1") == a and store.get_schedule("nope") is None
    with pytest.raises(ThreadStorageError):
        store.insert_schedule(schedule("s1"))
    assert store.delete_schedule("s1") == a
    assert store.delete_schedule("s1") is None
    assert store.insert_schedule(schedule("s4", key="digest")) is None  # free again
    assert [s.id for s in store.list_schedules()] == ["s3", "s4"]


def test_pause_resume_and_the_next_wake_time(store: ThreadStore) -> None:
    assert store.next_schedule_fire() is None
    store.insert_run(run(run_at=T0 + 500))
    store.insert_schedule(schedule("s1", next_fire=T0 + 60))
    assert store.next_schedule_fire() == T0 + 60
    # Nothing due: the thread wakes for the schedule's fire time, before the run.
    assert store.finish_and_claim(None, T0) == (None, None, T0 + 60)
    paused = store.set_schedule_state("s1", ScheduleState.PAUSED, None)
    assert store.next_schedule_fire() is None
    assert paused is not None and paused.state is ScheduleState.PAUSED
    assert paused.next_fire_at_ts is None
    assert store.finish_and_claim(None, T0) == (None, None, T0 + 500)
    assert store.due_schedules(T0 + 1000) == []
    resumed = store.set_schedule_state("s1", ScheduleState.ACTIVE, T0 + 120)
    assert resumed is not None and resumed.next_fire_at_ts == T0 + 120
    assert store.finish_and_claim(None, T0) == (None, None, T0 + 120)
    # Runs of concurrent effects are claimed beside others: schedules do not count there.
    assert store.finish_and_claim(None, T0, only_names=["record"]) == (None, None, T0 + 500)
    assert store.set_schedule_state("nope", ScheduleState.PAUSED, None) is None


def test_due_schedules_earliest_first(store: ThreadStore) -> None:
    store.insert_schedule(schedule("late", next_fire=T0 + 90))
    store.insert_schedule(schedule("early", next_fire=T0 + 30))
    store.insert_schedule(schedule("later", next_fire=T0 + 900))
    assert store.due_schedules(T0) == []
    assert [s.id for s in store.due_schedules(T0 + 100)] == ["early", "late"]


def test_a_fire_stores_the_run_and_the_next_fire_time_together(store: ThreadStore) -> None:
    store.insert_schedule(schedule("s1", args={"n": 1}))
    occurrence = replace(run(run_at=T0 + 60, args={"n": 1}), schedule_id="s1")
    written, stored = store.fire_schedule("s1", T0 + 60, occurrence, 0, T0 + 60, T0 + 120)
    assert stored is not None and stored.schedule_id == "s1" and stored.args == {"n": 1}
    assert stored.status is EffectStatus.PENDING and stored.run_at_ts == T0 + 60
    assert written is not None
    assert (written.occurrences, written.skipped, written.last_run_id) == (1, 0, occurrence.id)
    assert (written.last_fire_at_ts, written.next_fire_at_ts) == (T0 + 60, T0 + 120)
    assert store.get_run(occurrence.id, T0, KEEP) == stored
    # The same fire again (a retry after a crash, say) writes nothing.
    again = replace(run(run_at=T0 + 60), schedule_id="s1")
    written, stored = store.fire_schedule("s1", T0 + 60, again, 0, T0 + 60, T0 + 120)
    assert stored is None and written is not None and written.occurrences == 1
    assert store.get_run(again.id, T0, KEEP) is None
    # A fire that makes no run counts its skips.
    written, stored = store.fire_schedule("s1", T0 + 120, None, 3, T0 + 300, T0 + 360)
    assert stored is None and written is not None
    assert (written.occurrences, written.skipped, written.last_run_id) == (1, 3, occurrence.id)
    assert written.next_fire_at_ts == T0 + 360
    # Paused or deleted: nothing is written.
    store.set_schedule_state("s1", ScheduleState.PAUSED, None)
    late = replace(run(run_at=T0 + 360), schedule_id="s1")
    written, stored = store.fire_schedule("s1", T0 + 360, late, 0, T0 + 360, T0 + 420)
    assert stored is None and written is not None and written.state is ScheduleState.PAUSED
    store.delete_schedule("s1")
    assert store.fire_schedule("s1", T0 + 360, late, 0, T0 + 360, T0 + 420) == (None, None)
    assert store.get_run(late.id, T0, KEEP) is None
    # The occurrence stays, with its schedule id, after the schedule is gone.
    kept = store.get_run(occurrence.id, T0, KEEP)
    assert kept is not None and kept.schedule_id == "s1"


def test_an_occurrence_keeps_its_trace_context_until_it_finishes(store: ThreadStore) -> None:
    plain = run(run_at=T0 + 900)  # a run without one, read first (no trace known yet)
    store.insert_run(plain)
    assert store.get_run(plain.id, T0, KEEP) is not None
    store.insert_schedule(schedule("s1"))
    ctx = '{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    occurrence = replace(run(run_at=T0 + 60), schedule_id="s1", trace_context=ctx)
    _, stored = store.fire_schedule("s1", T0 + 60, occurrence, 0, T0 + 60, T0 + 120)
    assert stored is not None and stored.trace_context == ctx
    _, claimed, _ = store.finish_and_claim(None, T0 + 60)
    assert claimed is not None and claimed.id == occurrence.id and claimed.trace_context == ctx


def test_one_nodes_turn_leases_and_orphans(harness: Harness, rtdb: RuntimeStore) -> None:
    """One node: its turn lease is always its own; no run or turn is another node's."""
    backend = harness.backend
    assert backend.take_turn_lease("t", "turn-1") is None
    assert backend.take_turn_lease("t", "turn-1") is None  # its holder takes it again
    # The same node id (an earlier process with it, or a turn it ended without release).
    assert backend.take_turn_lease("t", "turn-2") is None
    backend.release_turn_lease("t", "turn-2")
    backend.release_turn_lease("t", "turn-2")  # idempotent
    assert backend.orphaned_turns() == []
    assert backend.orphaned_runs() == []


def test_a_turns_writes_are_fenced_by_its_turn_lease_token(
    harness: Harness, store: ThreadStore,
) -> None:
    """A shared backend refuses a write whose token no longer holds the turn lease."""
    backend = harness.backend
    assert backend.take_turn_lease("t", "turn-1") is None
    store.insert_messages([message(1)], fence="turn-1")
    store.set_meta("turns", "1", fence="turn-1")
    assert backend.take_turn_lease("t", "turn-2") is None  # the lease moved on (resumed)
    if backend.exclusive:  # one process: the runtime serializes turns; no fence to check
        store.insert_messages([message(2)], fence="turn-1")
        store.set_meta("turns", "2", fence="turn-1")
        assert [m.id for m in store.all_messages()] == ["m0001", "m0002"]
        assert store.get_meta("turns") == "2"
        return
    with pytest.raises(TurnLeaseLost, match="no longer holds the thread's turn lease"):
        store.insert_messages([message(2)], fence="turn-1")
    with pytest.raises(TurnLeaseLost):
        store.set_meta("turns", "2", fence="turn-1")
    assert [m.id for m in store.all_messages()] == ["m0001"]  # nothing written
    assert store.get_meta("turns") == "1"
    store.insert_messages([message(3)], fence="turn-2")
    store.insert_messages([message(4)])  # no turn's write: not fenced
    backend.release_turn_lease("t", "turn-2")
    with pytest.raises(TurnLeaseLost):  # a released lease fences too
        store.set_meta("turns", "3", fence="turn-2")
    assert [m.id for m in store.all_messages()] == ["m0001", "m0003", "m0004"]


def test_the_turn_leases_a_node_holds_are_listed(harness: Harness, rtdb: RuntimeStore) -> None:
    backend = harness.backend
    assert backend.take_turn_lease("u", "turn-u") is None
    assert backend.take_turn_lease("t", "turn-t") is None
    shared = not backend.exclusive
    assert backend.held_turn_leases() == ([("t", "turn-t"), ("u", "turn-u")] if shared else [])
    backend.release_turn_lease("u", "turn-u")
    assert backend.held_turn_leases() == ([("t", "turn-t")] if shared else [])
    backend.release_turn_lease("t", "turn-t")
    assert backend.held_turn_leases() == []


def test_a_deleted_thread_leaves_no_turn_lease(harness: Harness, rtdb: RuntimeStore) -> None:
    backend = harness.backend
    info = ThreadInfo(id="t", created_at_ts=T0)
    assert rtdb.add_thread(info)
    assert backend.take_turn_lease("t", "turn-1") is None
    assert rtdb.delete_thread("t")
    assert backend.held_turn_leases() == []  # the deletion dropped it
    assert backend.orphaned_turns() == []


def test_one_node_is_alone(harness: Harness, rtdb: RuntimeStore) -> None:
    assert harness.backend.alone() is True


def test_one_node_claiming_runs_is_the_only_claiming_node(harness: Harness) -> None:
    """The nodes wake-ups rank over: this one while it claims, none when it claims nothing."""
    backend = harness.backend
    rtdb = backend.open()
    assert backend.claiming_nodes() == [NODE]
    rtdb.close()
    backend.close()
    front = harness.twin()  # the same data, opened by a node that claims no run
    front.node_id, front.claims = NODE, False
    front.open().close()
    try:
        assert front.claiming_nodes() == []
    finally:
        front.close()


def test_replay_once_stores_no_second_replay_of_a_run(store: ThreadStore) -> None:
    original = run()
    store.insert_run(original)
    first = replace(run(), replay_of=original.id)
    assert store.insert_run(first, replay_once=True) is None
    again = store.insert_run(replace(run(), replay_of=original.id), replay_once=True)
    assert again is not None and again.id == first.id
    # Without replay_once a run may be replayed again (a single replay).
    assert store.insert_run(replace(run(), replay_of=original.id)) is None
