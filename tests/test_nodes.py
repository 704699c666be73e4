"""Several nodes on one PostgreSQL schema: node leases, claims, fencing, re-queues.

Two `PostgresBackend`s (or two runtimes) on one schema in one test process play two server
processes. Real PostgreSQL throughout; leases are short (about a second) where a lease
must expire, instead of a fake clock: leases are stamped by the database server's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg import query

from runtime import Runtime
from runtime.config import MAX_ATTEMPTS, default_node_id, validate_node_id
from runtime.effects import EffectRun, EffectStatus
from runtime.errors import DataDirLocked, RunStateError
from runtime.storage import pg_bus
from runtime.storage.base import (
    ClusterBus,
    Finish,
    FrameDraft,
    RunQuery,
    RuntimeStore,
    ThreadInfo,
    ThreadStore,
)
from runtime.storage.postgres import PostgresBackend, split_schema

APP = Path(__file__).parent / "apps" / "core"
T0 = 1_800_000_000.0


def new_run(run_id: str, run_at: float = T0, name: str = "record") -> EffectRun:
    return EffectRun(id=run_id, thread_id="t", name=name, args={"key": run_id},
                     status=EffectStatus.PENDING, run_at_ts=run_at, created_at_ts=T0)


def expire_lease(pg_url: str, node_id: str) -> None:
    """Make ``node_id``'s lease expired, as if it stopped renewing it long ago."""
    url, schema = split_schema(pg_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.nodes SET lease_expires_at = 0 WHERE node_id = %s",
                     (node_id,))


@pytest.fixture
def two_nodes(
    pg_url: str,
) -> Iterator[tuple[tuple[PostgresBackend, RuntimeStore], tuple[PostgresBackend, RuntimeStore]]]:
    a = PostgresBackend(pg_url, node_id="node-a")
    b = PostgresBackend(pg_url, node_id="node-b")
    ra = a.open()
    rb = b.open()
    try:
        yield (a, ra), (b, rb)
    finally:
        for backend, store in ((a, ra), (b, rb)):
            store.close()
            backend.close()


def thread_on_both(
    a: PostgresBackend, ra: RuntimeStore, b: PostgresBackend
) -> tuple[ThreadStore, ThreadStore]:
    info = ThreadInfo(id="t", created_at_ts=T0)
    assert ra.add_thread(info)
    return a.create_thread_store(info), b.open_thread_store("t")


# ------------------------------------------------------------------ identity


def test_node_ids_are_validated_naming_the_rule() -> None:
    assert validate_node_id("web-1.eu:8000@a_b") == "web-1.eu:8000@a_b"
    assert validate_node_id(default_node_id()) == default_node_id()
    with pytest.raises(ValueError, match="must start with a letter or digit"):
        validate_node_id("-x")
    with pytest.raises(ValueError, match="invalid node id 'a b'"):
        validate_node_id("a b")
    with pytest.raises(ValueError, match="at most 128"):
        validate_node_id("n" * 129)
    with pytest.raises(ValueError, match="non-empty"):
        validate_node_id("")
    with pytest.raises(ValueError, match="node id"):
        Runtime(data_dir="x", node_id="no spaces")
    with pytest.raises(ValueError, match="lease_seconds"):
        PostgresBackend("postgresql:///x", lease_seconds=0.1)


def test_a_lease_renewed_on_a_new_connection_as_the_node_closes_leaks_no_connection(
    pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The renewal connection was cut, a new one renewed the lease just as close() began:
    # the cut connection is closed there and then (it was once left open, and psycopg
    # warned when it was collected), and close() releases the lease on the new one.
    import threading

    backend = PostgresBackend(pg_url, node_id="node-a")
    backend.open()
    old = backend._lock_conn
    assert old is not None
    stop = threading.Event()
    real_renew = backend._renew

    def renew(conn: Any, *, take_over: bool = False) -> bool:
        if not take_over:
            raise psycopg.OperationalError("network cut (test)")
        renewed = real_renew(conn, take_over=True)
        stop.set()  # close() begins now
        return renewed

    monkeypatch.setattr(backend, "_renew", renew)
    backend.lease_seconds = 0.3  # this call's period; the backend's own thread sleeps on
    backend._heartbeat(stop, "test")  # returns once it has handed over the connection
    new = backend._lock_conn
    assert old.closed
    assert new is not None and new is not old and not new.closed
    backend.close()
    assert new.closed
    other = PostgresBackend(pg_url, node_id="node-b")
    other.open()
    try:
        assert [n for n, _ in other.live_nodes()] == ["node-b"]  # node a's lease ended
    finally:
        other.close()


def test_the_same_node_id_twice_is_refused_another_joins(pg_url: str) -> None:
    a = PostgresBackend(pg_url, node_id="node-a")
    store = a.open()
    try:
        with pytest.raises(DataDirLocked, match="node id node-a is in use by another live"):
            PostgresBackend(pg_url, node_id="node-a").open()
        b = PostgresBackend(pg_url, node_id="node-b")
        b.open().close()
        assert [n for n, _ in a.live_nodes()] == ["node-a", "node-b"]
        assert a.claiming_nodes() == ["node-a", "node-b"]
        assert a.alone() is False  # another node may be applying an effect-tool key
        b.close()  # its lease ends at once
        assert [n for n, _ in a.live_nodes()] == ["node-a"]
        assert a.claiming_nodes() == ["node-a"]
        assert a.alone() is True
        # A node that claims no run holds a lease but is no claiming node.
        front = PostgresBackend(pg_url, node_id="node-f")
        front.claims = False
        front.open().close()
        assert [n for n, _ in a.live_nodes()] == ["node-a", "node-f"]
        assert a.claiming_nodes() == ["node-a"]
        front.close()
    finally:
        store.close()
        a.close()


# ------------------------------------------------------------------ claims


def test_one_node_runs_a_thread_at_a_time_and_records_who_ran_each_attempt(
    two_nodes: Any,
) -> None:
    (a, ra), (b, _) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    sa.insert_run(new_run("r1"))
    sb.insert_run(new_run("r2"))
    _, first, _ = sa.finish_and_claim(None, T0 + 1)
    assert first is not None and first.id == "r1"
    # Node b may not start r2 while node a runs r1 (one run at a time per thread).
    _, claimed, next_due = sb.finish_and_claim(None, T0 + 1)
    assert claimed is None and next_due is None and sb.claim_blocked == "busy"
    # Node a records r1 and claims r2 in the same transaction.
    finished, second, _ = sa.finish_and_claim(
        Finish("r1", EffectStatus.COMPLETED, None, T0 + 2, attempt=1), T0 + 2)
    assert finished is not None and finished.status is EffectStatus.COMPLETED
    assert second is not None and second.id == "r2" and sa.claim_blocked is None
    sa.finish_and_claim(Finish("r2", EffectStatus.COMPLETED, None, T0 + 3, attempt=1), T0 + 3)
    sb.insert_run(new_run("r3", T0 + 3))
    _, third, _ = sb.finish_and_claim(None, T0 + 4)  # nothing runs now: node b may
    assert third is not None and third.id == "r3" and sb.claim_blocked is None
    assert [x.node_id for x in sa.run_attempts("r1")] == ["node-a"]
    assert [x.node_id for x in sb.run_attempts("r3")] == ["node-b"]
    sa.close()
    sb.close()


def test_a_thread_paused_on_another_node_is_not_claimed(two_nodes: Any) -> None:
    (a, ra), (b, rb) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    sb.insert_run(new_run("r1"))
    assert ra.set_paused("t", True)  # node a pauses it; node b's cache knows nothing
    _, claimed, next_due = sb.finish_and_claim(None, T0 + 1)
    assert claimed is None and next_due is None and sb.claim_blocked == "paused"
    assert rb.set_paused("t", False) is True
    _, claimed, _ = sb.finish_and_claim(None, T0 + 1)
    assert claimed is not None and claimed.id == "r1"
    sa.close()
    sb.close()


def test_a_run_of_an_effect_only_another_live_node_has_waits_for_that_node_in_due_order(
    pg_url: str, two_nodes: Any,
) -> None:
    (a, ra), (b, _) = two_nodes
    a.record_effects(["record"])
    b.record_effects(["record", "only_b"])
    sa, sb = thread_on_both(a, ra, b)
    sa.insert_run(new_run("r1", T0, name="only_b"))
    sa.insert_run(new_run("r2", T0 + 1))  # due after r1: not run ahead of it
    assert a.effect_known_elsewhere("only_b") is True
    assert a.effect_known_elsewhere("nope") is False
    assert b.effect_known_elsewhere("only_b") is False  # no other node has it
    _, claimed, next_due = sa.finish_and_claim(None, T0 + 2)
    assert claimed is None and next_due is None and sa.claim_blocked == "foreign"
    assert sa.get_run("r1", T0 + 2, _keep()).attempts == 0  # type: ignore[union-attr]
    _, claimed, _ = sb.finish_and_claim(None, T0 + 2)
    assert claimed is not None and claimed.id == "r1" and sb.claim_blocked is None
    # Node a claims the next run once it is one of an effect it has.
    sb.finish_and_claim(Finish("r1", EffectStatus.COMPLETED, None, T0 + 3, attempt=1),
                        T0 + 3, claim=False)
    _, claimed, _ = sa.finish_and_claim(None, T0 + 3)
    assert claimed is not None and claimed.id == "r2"
    sa.finish_and_claim(Finish("r2", EffectStatus.COMPLETED, None, T0 + 4, attempt=1),
                        T0 + 4, claim=False)
    # Once no live node has the effect, node a claims its run (and fails it, as alone).
    sa.insert_run(new_run("r3", T0 + 4, name="only_b"))
    expire_lease(pg_url, "node-b")
    assert a.effect_known_elsewhere("only_b") is False
    _, claimed, _ = sa.finish_and_claim(None, T0 + 5)
    assert claimed is not None and claimed.id == "r3" and sa.claim_blocked is None
    sa.close()
    sb.close()


def test_a_canceled_run_is_never_claimed_by_another_node(two_nodes: Any) -> None:
    (a, ra), (b, _) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    sb.insert_run(new_run("r1", T0 + 1))
    assert sa.cancel("r1", T0, canceled_by="node a") is not None
    _, claimed, next_due = sb.finish_and_claim(None, T0 + 5)
    assert claimed is None and next_due is None
    assert sb.get_run("r1", T0 + 5, _keep()).status is EffectStatus.CANCELED  # type: ignore[union-attr]
    sa.close()
    sb.close()


def _keep() -> Any:
    from runtime.config import RetentionPolicy

    return RetentionPolicy()


def test_a_dead_nodes_run_is_requeued_and_its_late_outcome_is_fenced(
    two_nodes: Any, pg_url: str,
) -> None:
    (a, ra), (b, _) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    sa.insert_run(new_run("r1"))
    _, claimed, _ = sa.finish_and_claim(None, T0 + 1)
    assert claimed is not None
    # While node a's lease is live, its run is its own: not an orphan, not recovered.
    assert b.orphaned_runs() == []
    assert sb.recover_interrupted(T0 + 2, MAX_ATTEMPTS) == []
    expire_lease(pg_url, "node-a")
    assert b.orphaned_runs() == [("t", "r1")]
    # Node a's own view: its runs are never orphans to itself.
    assert a.orphaned_runs() == []
    (requeued,) = sb.recover_interrupted(T0 + 2, MAX_ATTEMPTS, ["r1"], dead_nodes_only=True)
    assert requeued.status is EffectStatus.PENDING and requeued.attempts == 1
    _, again, _ = sb.finish_and_claim(None, T0 + 3)
    assert again is not None and again.attempts == 2
    # Node a comes back and records the outcome of attempt 1: fenced, nothing written.
    finished, _, _ = sa.finish_and_claim(
        Finish("r1", EffectStatus.FAILED, "late", T0 + 4, attempt=1), T0 + 4, claim=False)
    assert finished is None
    finished, _, _ = sb.finish_and_claim(
        Finish("r1", EffectStatus.COMPLETED, None, T0 + 5, attempt=2), T0 + 5, claim=False)
    assert finished is not None and finished.status is EffectStatus.COMPLETED
    attempts = sb.run_attempts("r1")
    assert [(x.attempt, x.outcome, x.node_id) for x in attempts] == [
        (1, "interrupted", "node-a"), (2, "completed", "node-b")]
    sa.close()
    sb.close()


def test_a_dead_nodes_recent_threads_skip_one_frame_seq_once(
    two_nodes: Any, pg_url: str,
) -> None:
    (a, ra), (b, _) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    old = ThreadInfo(id="old", created_at_ts=T0)
    assert ra.add_thread(old)
    so = a.create_thread_store(old)
    sa.insert_run(new_run("r1"))
    assert sa.frame_seq == 1  # its scheduled frame's number, taken by the insert
    _, claimed, _ = sa.finish_and_claim(None, T0 + 1)  # attempt still open on node a
    assert claimed is not None
    so.insert_run(replace(new_run("r2", run_at=1_000.0), thread_id="old"))
    _, done, _ = so.finish_and_claim(None, 1_000.0)
    assert done is not None
    # Ended long before node a's last heartbeat: its frame was relayed long ago.
    so.finish_and_claim(Finish("r2", EffectStatus.COMPLETED, None, 1_001.0, attempt=1),
                        1_001.0, claim=False)
    url, schema = split_schema(pg_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.frame_counters SET last_seq = 7 WHERE thread_id = 't'")
        # Node a closed cleanly (lease 0, its frames flushed): nothing to account for.
        conn.execute(f"UPDATE {schema}.nodes SET lease_expires_at = 0 "
                     f"WHERE node_id = 'node-a'")
        assert b.mark_dead_nodes_gaps() == []
        # Node a died: its lease expired a moment ago.
        conn.execute(f"UPDATE {schema}.nodes SET lease_expires_at = "
                     f"extract(epoch from now()) - 1 WHERE node_id = 'node-a'")
        assert a.mark_dead_nodes_gaps() == []  # never its own
        assert b.mark_dead_nodes_gaps() == [("t", 8)]
        assert b.mark_dead_nodes_gaps() == []  # accounted for once
        row = conn.execute(f"SELECT last_seq FROM {schema}.frame_counters "
                           f"WHERE thread_id = 't'").fetchone()
    assert row == (8,)
    # The next frame of thread t is numbered after the one skipped.
    drafts = [FrameDraft("t", "effect_changed", lambda seq: f'{{"seq": {seq}}}')]
    assert b.cluster.append_frames(drafts, T0) == [9]
    for store in (sa, sb, so):
        store.close()


def _node_x_claimed_r1_then_died(pg_url: str, *, finish: bool) -> None:
    """Node ``node-x`` claims run r1 of thread t (indexed ``running``; completed when
    ``finish``, its index batch lost), then its process ends as if killed: its lease row
    is left live (a clean close would set it to 0)."""
    first = PostgresBackend(pg_url, node_id="node-x")
    rx = first.open()
    info = ThreadInfo(id="t", created_at_ts=T0)
    assert rx.add_thread(info)
    store = first.create_thread_store(info)
    store.insert_run(new_run("r1"))
    _, claimed, _ = store.finish_and_claim(None, T0 + 1)
    assert claimed is not None
    if finish:
        rx.index_runs([claimed])
        store.finish_and_claim(
            Finish("r1", EffectStatus.COMPLETED, None, T0 + 2, attempt=1), T0 + 2, claim=False)
    store.close()
    rx.close()
    first.close()
    url, schema = split_schema(pg_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.nodes SET lease_expires_at = "
                     f"extract(epoch from now()) + 30 WHERE node_id = 'node-x'")


def test_a_node_restarting_under_its_id_skips_a_frame_seq_for_its_previous_process(
    pg_url: str,
) -> None:
    _node_x_claimed_r1_then_died(pg_url, finish=False)
    url, schema = split_schema(pg_url)
    with psycopg.connect(url, autocommit=True) as conn:
        again = PostgresBackend(pg_url, node_id="node-x")
        store2 = again.open()
        try:
            rows = conn.execute(f"SELECT thread_id, last_seq FROM {schema}.frame_counters"
                                ).fetchall()
            assert rows == [("t", 2)]  # 1: the run's scheduled frame; 2: the skip
            assert again.mark_dead_nodes_gaps() == []
        finally:
            store2.close()
            again.close()
        # A clean close: the next start skips nothing.
        third = PostgresBackend(pg_url, node_id="node-x")
        store3 = third.open()
        store3.close()
        third.close()
        rows = conn.execute(f"SELECT last_seq FROM {schema}.frame_counters").fetchall()
    assert rows == [(2,)]


def test_the_third_interrupted_attempt_of_dead_nodes_fails_the_run(
    two_nodes: Any, pg_url: str,
) -> None:
    (a, ra), (b, _) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    sa.insert_run(new_run("r1"))
    for attempt in range(1, MAX_ATTEMPTS + 1):
        _, claimed, _ = sa.finish_and_claim(None, T0 + attempt)
        assert claimed is not None and claimed.attempts == attempt
        expire_lease(pg_url, "node-a")
        (changed,) = sb.recover_interrupted(T0 + attempt, MAX_ATTEMPTS, ["r1"],
                                            dead_nodes_only=True)
        # node a renews: a later claim of its own holds a live lease again
        url, schema = split_schema(pg_url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"UPDATE {schema}.nodes SET lease_expires_at = 1e12 "
                         f"WHERE node_id = 'node-a'")
    assert changed.status is EffectStatus.FAILED
    assert "gave up after 3 attempts" in (changed.error or "")
    sa.close()
    sb.close()


def _indexed(store: RuntimeStore) -> dict[str, str]:
    runs, _ = store.list_indexed_runs(RunQuery(), T0, _keep(), 100)
    return {r.id: str(r.status) for r in runs}


def test_a_late_index_batch_never_takes_a_finished_run_back_to_pending(
    two_nodes: Any,
) -> None:
    # Node a schedules r1; node b runs it to its end and writes its index batch first; a's
    # batch (written after a's own commit, so possibly later) must not undo b's.
    (a, ra), (b, rb) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    scheduled = new_run("r1")
    sa.insert_run(scheduled)
    _, claimed, _ = sb.finish_and_claim(None, T0 + 1)
    assert claimed is not None
    finished, _, _ = sb.finish_and_claim(
        Finish("r1", EffectStatus.FAILED, "boom", T0 + 2, attempt=1), T0 + 2, claim=False)
    assert finished is not None
    rb.index_runs([finished])
    ra.index_runs([scheduled])  # late: still says pending
    ra.index_runs([claimed])  # late: still says running
    assert _indexed(ra) == _indexed(rb) == {"r1": "failed"}
    # A pending or running state still moves forward as before.
    sa.insert_run(new_run("r2", run_at=T0 + 5))
    pending = sa.get_run("r2", T0, _keep())
    assert pending is not None
    ra.index_runs([pending])
    assert _indexed(rb)["r2"] == "pending"
    sa.close()
    sb.close()


def test_stored_runs_show_another_nodes_commits_before_any_index_batch(
    two_nodes: Any,
) -> None:
    # Nothing indexed: node b reads node a's runs from the runs table itself.
    (a, ra), (b, rb) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    sa.insert_run(new_run("r1"))
    sa.insert_run(new_run("r2", run_at=T0 + 600, name="other"))
    _, claimed, _ = sa.finish_and_claim(None, T0 + 1)
    assert claimed is not None and claimed.id == "r1"
    assert _indexed(rb) == {}
    runs, cursor = rb.list_stored_runs(RunQuery(thread_id="t"), T0 + 1, _keep(), 1)
    assert [(r.id, r.status, r.args) for r in runs] == [("r2", EffectStatus.PENDING, None)]
    assert cursor is not None
    runs, cursor = rb.list_stored_runs(RunQuery(thread_id="t"), T0 + 1, _keep(), 1, cursor)
    assert [(r.id, r.status) for r in runs] == [("r1", EffectStatus.RUNNING)] and cursor is None
    runs, _ = rb.list_stored_runs(RunQuery(name="other", statuses=(EffectStatus.PENDING,)),
                                  T0 + 1, _keep(), 10)
    assert [r.id for r in runs] == ["r2"]
    counts = rb.count_stored_runs(RunQuery(thread_id="t"), T0 + 1, _keep())
    assert (counts[EffectStatus.PENDING], counts[EffectStatus.RUNNING]) == (1, 1)
    assert [r.id for r in rb.running_runs(["t", "nope"], T0 + 1, _keep())] == ["r1"]
    assert rb.running_runs([], T0 + 1, _keep()) == []
    assert rb.list_stored_runs(RunQuery(user_id="u"), T0 + 1, _keep(), 10) == ([], None)
    sa.close()
    sb.close()


def test_a_dead_nodes_stale_run_index_rows_are_rewritten_by_the_node_accounting_for_it(
    two_nodes: Any, pg_url: str,
) -> None:
    # Node a writes its index rows in batches after its runs commit: killed in between,
    # the rows of its last changes stay as they were (or missing) unless another node
    # rewrites them when it finds node a dead.
    (a, ra), (b, rb) = two_nodes
    sa, _ = thread_on_both(a, ra, b)
    u = ThreadInfo(id="u", created_at_ts=1_000.0)
    assert ra.add_thread(u)
    su = a.create_thread_store(u)
    su.insert_run(replace(new_run("r3", run_at=2_000.0), thread_id="u",
                          created_at_ts=1_000.0))
    pending = su.get_run("r3", T0, _keep())
    assert pending is not None
    sa.insert_run(new_run("r1"))
    _, claimed, _ = sa.finish_and_claim(None, T0 + 1)
    assert claimed is not None
    ra.index_runs([claimed, pending])  # the last batch node a wrote
    sa.finish_and_claim(Finish("r1", EffectStatus.COMPLETED, None, T0 + 2, attempt=1),
                        T0 + 2, claim=False)
    sa.insert_run(new_run("r2", run_at=T0 + 5))  # scheduled, never indexed
    assert su.cancel("r3", T0) is not None  # canceled: its row still says pending
    assert _indexed(rb) == {"r1": "running", "r3": "pending"}
    url, schema = split_schema(pg_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {schema}.nodes SET lease_expires_at = "
                     f"extract(epoch from now()) - 1 WHERE node_id = 'node-a'")
    b.mark_dead_nodes_gaps()
    assert _indexed(rb) == {"r1": "completed", "r2": "pending", "r3": "canceled"}
    (r1,), _ = rb.list_indexed_runs(RunQuery(thread_id="t", statuses=(EffectStatus.COMPLETED,)),
                                    T0, _keep(), 10)
    assert (r1.attempts, r1.finished_at_ts) == (1, T0 + 2)
    for store in (sa, su):
        store.close()


def test_the_index_rewrite_for_a_dead_node_skips_a_run_being_changed_never_waits(
    two_nodes: Any, pg_url: str,
) -> None:
    # Waiting for a run's row another transaction holds could deadlock with a run's
    # transaction; the node changing it writes its index row after its commit anyway.
    from concurrent.futures import ThreadPoolExecutor

    (a, ra), (b, rb) = two_nodes
    sa, _ = thread_on_both(a, ra, b)
    sa.insert_run(new_run("r1"))
    _, claimed, _ = sa.finish_and_claim(None, T0 + 1)
    assert claimed is not None
    ra.index_runs([claimed])
    sa.finish_and_claim(Finish("r1", EffectStatus.COMPLETED, None, T0 + 2, attempt=1),
                        T0 + 2, claim=False)
    sa.insert_run(new_run("r2", run_at=T0 + 5))
    pending = sa.get_run("r2", T0, _keep())
    assert pending is not None
    ra.index_runs([pending])
    url, schema = split_schema(pg_url)
    with psycopg.connect(url, autocommit=True) as conn, \
            psycopg.connect(url) as other, ThreadPoolExecutor(1) as pool:
        conn.execute(f"UPDATE {schema}.nodes SET lease_expires_at = "
                     f"extract(epoch from now()) - 1 WHERE node_id = 'node-a'")
        # A live node is canceling r2: its row is locked until that transaction ends.
        other.execute(f"UPDATE {schema}.effect_runs SET status = 'canceled', "
                      f"finished_at = %s WHERE thread_id = 't' AND id = 'r2'", (T0,))
        accounted = pool.submit(b.mark_dead_nodes_gaps)
        try:
            accounted.result(timeout=30)  # a guard against a hang, not a measurement
        finally:
            other.commit()
    assert _indexed(rb) == {"r1": "completed", "r2": "pending"}
    sa.close()


def test_a_node_restarting_under_its_id_rewrites_its_previous_processes_stale_index_rows(
    pg_url: str,
) -> None:
    _node_x_claimed_r1_then_died(pg_url, finish=True)
    again = PostgresBackend(pg_url, node_id="node-x")
    store2 = again.open()
    try:
        assert _indexed(store2) == {"r1": "completed"}
    finally:
        store2.close()
        again.close()


# ------------------------------------------------------------------ runtimes


@pytest.fixture
def make_node(pg_url: str, tmp_path: Path) -> Callable[..., Runtime]:
    def make(node_id: str, lease_seconds: float = 30.0) -> Runtime:
        storage = PostgresBackend(pg_url, node_id=node_id, lease_seconds=lease_seconds)
        return Runtime(app_dir=APP, data_dir=tmp_path / node_id, load_packages=False,
                       storage=storage)

    return make


async def wait_until(check: Callable[[], Any], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.fixture
async def nodes(make_node: Callable[..., Runtime]) -> AsyncIterator[tuple[Runtime, Runtime]]:
    a, b = make_node("node-a"), make_node("node-b")
    async with a, b:
        yield a, b


async def test_runs_scheduled_through_two_nodes_run_once_each_in_due_order(
    nodes: tuple[Runtime, Runtime], tmp_path: Path,
) -> None:
    a, b = nodes
    threads = [await a.create_thread() for _ in range(8)]
    ids: dict[str, list[str]] = {}
    for n in range(6):
        for thread in threads:
            via = await (a if n % 2 == 0 else b).get_thread(thread.thread_id)
            run_id = await via.schedule_effect("record", {"key": f"{thread.thread_id}/{n}"})
            ids.setdefault(thread.thread_id, []).append(run_id)

    async def all_done() -> bool:
        for thread in threads:
            for run_id in ids[thread.thread_id]:
                if (await thread.get_run(run_id)).status is not EffectStatus.COMPLETED:
                    return False
        return True

    await wait_until(all_done)
    lines = []
    for node in ("node-a", "node-b"):
        path = tmp_path / node / "record.jsonl"
        if path.exists():
            lines += [json.loads(x) for x in path.read_text().splitlines()]
    keys = [x["key"] for x in lines]
    assert sorted(keys) == sorted(f"{t.thread_id}/{n}" for t in threads for n in range(6))
    for thread in threads:  # per thread, in scheduling order
        order = [x["key"] for x in sorted(lines, key=lambda x: x["at"])
                 if x["thread"] == thread.thread_id]
        assert order == [f"{thread.thread_id}/{n}" for n in range(6)]
        for run_id in ids[thread.thread_id]:
            (attempt,) = await thread.get_run_attempts(run_id)
            assert attempt.node_id in ("node-a", "node-b")


async def test_a_node_that_loses_its_lease_cancels_its_effects_and_another_reruns_them(
    make_node: Callable[..., Runtime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = make_node("node-a", lease_seconds=0.9)
    b = make_node("node-b", lease_seconds=0.9)
    async with a, b:
        thread = await a.create_thread()
        run_id = await thread.schedule_effect("slow", {"seconds": 2})
        await wait_until(lambda: _status(thread, run_id, EffectStatus.RUNNING))
        assert (tmp_path / "node-a" / "slow.started").exists()
        storage = a.storage
        assert isinstance(storage, PostgresBackend)

        def cut(*_: Any, **__: Any) -> bool:
            raise psycopg.OperationalError("network cut (test)")

        monkeypatch.setattr(storage, "_renew", cut)  # node a can no longer renew
        await wait_until(lambda: _status(thread, run_id, EffectStatus.COMPLETED))
        attempts = await thread.get_run_attempts(run_id)
        assert [(x.attempt, x.outcome, x.node_id) for x in attempts] == [
            (1, "interrupted", "node-a"), (2, "completed", "node-b")]
        # Node a canceled its effect when its lease lapsed: it never finished there.
        assert not (tmp_path / "node-a" / "slow.done").exists()
        assert (tmp_path / "node-b" / "slow.done").exists()
        assert a.storage.lock_problem() is not None
        health_ok = b.storage.connection_held()
        assert health_ok is True
        monkeypatch.undo()


async def _status(thread: Any, run_id: str, status: EffectStatus) -> bool:
    return bool((await thread.get_run(run_id)).status is status)


async def _start_on_b(a: Runtime, b: Runtime, seconds: float = 30) -> tuple[Any, Any, str]:
    """A thread made on node a, a slow run scheduled (and so started) on node b."""
    thread_a = await a.create_thread()
    thread_b = await b.get_thread(thread_a.thread_id)
    run_id = await thread_b.schedule_effect("slow", {"seconds": seconds})
    await wait_until(lambda: _status(thread_a, run_id, EffectStatus.RUNNING))
    (attempt,) = await thread_a.get_run_attempts(run_id)
    assert attempt.node_id == "node-b"
    return thread_a, thread_b, run_id


async def test_canceling_on_node_a_a_run_running_on_node_b_stops_it_there(
    nodes: tuple[Runtime, Runtime], tmp_path: Path,
) -> None:
    a, b = nodes
    thread_a, _, run_id = await _start_on_b(a, b)
    assert await thread_a.remove_scheduled_effect(run_id) is True
    await wait_until(lambda: _status(thread_a, run_id, EffectStatus.CANCELED), seconds=10)
    run = await thread_a.get_run(run_id)
    assert run.canceled_by is not None
    assert not (tmp_path / "node-b" / "slow.done").exists()
    (attempt,) = await thread_a.get_run_attempts(run_id)
    assert (attempt.outcome, attempt.node_id) == ("canceled", "node-b")


async def test_a_cancel_asked_again_while_the_effect_cleans_up_does_not_cut_its_cleanup(
    pg_url: str, tmp_path: Path,
) -> None:
    # A cancel waiting on node a asks node b again every second; b acts on the first
    # request only: an effect that takes a while to stop is not interrupted twice.
    def make(node_id: str) -> Runtime:
        storage = PostgresBackend(pg_url, node_id=node_id)
        return Runtime(app_dir=Path(__file__).parent / "apps" / "slow_stop",
                       data_dir=tmp_path / node_id, load_packages=False, storage=storage)

    a, b = make("node-a"), make("node-b")
    async with a, b:
        thread_a = await a.create_thread()
        thread_b = await b.get_thread(thread_a.thread_id)
        run_id = await thread_b.schedule_effect("slow_stop", {})
        await wait_until(lambda: _status(thread_a, run_id, EffectStatus.RUNNING))
        assert await thread_a.remove_scheduled_effect(run_id) is True
        assert (tmp_path / "node-b" / "slow_stop.cleaned").exists()
        assert not (tmp_path / "node-b" / "slow_stop.cut").exists()


async def test_deleting_on_node_a_a_thread_running_on_node_b_cancels_its_run_there(
    nodes: tuple[Runtime, Runtime], tmp_path: Path,
) -> None:
    a, b = nodes
    thread_a, _, _ = await _start_on_b(a, b)
    tid = thread_a.thread_id
    assert await a.delete_thread(tid) is True

    async def gone_on_b() -> bool:
        actor = b.actors.peek(tid)
        return actor is None and not b.executor.side_running

    await wait_until(gone_on_b, seconds=10)
    await asyncio.sleep(0.3)
    assert not (tmp_path / "node-b" / "slow.done").exists()
    url_rows = await asyncio.to_thread(_rows_of, b, tid)
    assert url_rows == 0  # node b wrote nothing back for the deleted thread


@pytest.fixture
async def slow_to_listen(
    make_node: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Runtime, Runtime]]:
    """Two nodes whose listening connection comes back 3 s after it is lost (0.2 s by
    default): long enough for what the tests announce while one of them is not listening."""
    monkeypatch.setattr(pg_bus, "RETRY_FIRST_SECONDS", 3.0)
    a, b = make_node("node-a"), make_node("node-b")
    async with a, b:
        yield a, b


async def _cut_bus(rt: Runtime) -> ClusterBus:
    """End the node's listening connection on the server (``pg_terminate_backend``).

    Returns once the node saw it lost: its bus (``connected`` False until it listens again).
    """
    storage = rt.storage
    assert isinstance(storage, PostgresBackend)
    conn = storage.cluster._conn
    assert conn is not None
    url, _ = split_schema(storage.url)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    bus = storage.cluster

    async def deaf() -> bool:
        return not bus.connected

    await wait_until(deaf, seconds=5)
    return bus


async def test_a_node_whose_bus_was_down_applies_the_deletion_and_pause_it_missed(
    slow_to_listen: tuple[Runtime, Runtime], tmp_path: Path,
) -> None:
    from runtime.errors import ThreadNotFound

    a, b = slow_to_listen
    thread_a, _, _ = await _start_on_b(a, b)
    tid = thread_a.thread_id
    paused = await a.create_thread()
    assert not (await b.get_thread(paused.thread_id)).info.paused  # cached on b
    watched = (await b.get_thread(tid)).subscribe()  # on b; no frame of it seen yet
    bus = await _cut_bus(b)
    assert await a.delete_thread(tid) is True
    await a.pause_thread(paused.thread_id)
    assert not bus.connected  # b heard neither command

    async def resynced() -> bool:
        return b.actors.peek(tid) is None and not b.executor.side_running

    # Once it listens again, b reads what the lost commands said: the thread is gone
    # (its run canceled, its stream ended), the other one paused.
    await wait_until(resynced, seconds=10)
    await asyncio.wait_for(watched.wait_closed(), 5)
    with pytest.raises(ThreadNotFound):
        await b.get_thread(tid)
    assert (await b.get_thread(paused.thread_id)).info.paused
    await asyncio.sleep(0.3)
    assert not (tmp_path / "node-b" / "slow.done").exists()


async def test_a_cancel_asked_while_the_running_node_was_not_listening_reaches_it_in_the_wait(
    slow_to_listen: tuple[Runtime, Runtime], tmp_path: Path,
) -> None:
    # Node b listens again 3 s after its listening connection is ended: within the about
    # 6 s a cancel asked on node a waits for the run to be canceled.
    a, b = slow_to_listen
    thread_a, _, run_id = await _start_on_b(a, b)
    await _cut_bus(b)
    assert await thread_a.remove_scheduled_effect(run_id) is True
    assert (await thread_a.get_run(run_id)).status is EffectStatus.CANCELED
    (attempt,) = await thread_a.get_run_attempts(run_id)
    assert (attempt.outcome, attempt.node_id) == ("canceled", "node-b")
    assert not (tmp_path / "node-b" / "slow.done").exists()


async def test_subscribers_on_a_node_whose_bus_was_down_get_the_missed_frames_or_reload(
    slow_to_listen: tuple[Runtime, Runtime],
) -> None:
    from runtime.errors import SubscriptionOverflow

    a, b = slow_to_listen
    seen, fresh = await a.create_thread(), await a.create_thread()
    on_seen = (await b.get_thread(seen.thread_id)).subscribe()
    first = await seen.schedule_effect("record", {"key": "first"})
    frames = []
    while len(frames) < 3:  # scheduled, started, completed: b numbers from here
        frames.append(await asyncio.wait_for(anext(on_seen), 10))
    on_fresh = (await b.get_thread(fresh.thread_id)).subscribe()  # no frame yet
    everything = b.subscribe_runs()
    bus = await _cut_bus(b)
    missed = await seen.schedule_effect("record", {"key": "missed"})
    await fresh.schedule_effect("record", {"key": "missed"})
    assert not bus.connected
    # A subscriber with a frame number to go on from gets what was announced meanwhile
    # from the table, in order.
    while len(frames) < 6:
        frames.append(await asyncio.wait_for(anext(on_seen), 10))
    assert [f.seq for f in frames] == list(range(frames[0].seq, frames[0].seq + 6))
    assert [json.loads(f.frame_text())["data"]["id"] for f in frames] == (
        [first] * 3 + [missed] * 3)
    # One without (none of its thread's frames came yet, or every thread's): told to
    # reload, since what it missed cannot be told apart from what came before it.
    for sub in (on_fresh, everything):
        await asyncio.wait_for(sub.wait_closed(), 10)
        with pytest.raises(SubscriptionOverflow, match="frames were missed"):
            await anext(sub)
    assert not on_seen.closed


def _rows_of(rt: Runtime, thread_id: str) -> int:
    storage = rt.storage
    assert isinstance(storage, PostgresBackend)
    with storage.transaction() as c:
        row = c.execute("SELECT count(*) FROM effect_runs WHERE thread_id = %s",
                        (thread_id,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_thread_paused_on_node_a_starts_nothing_on_node_b_until_resumed(
    nodes: tuple[Runtime, Runtime],
) -> None:
    a, b = nodes
    thread_a = await a.create_thread()
    thread_b = await b.get_thread(thread_a.thread_id)
    first = await thread_b.schedule_effect("record", {"key": "first"})
    await wait_until(lambda: _status(thread_a, first, EffectStatus.COMPLETED))
    await a.pause_thread(thread_a.thread_id)
    stopped = await thread_b.schedule_effect("record", {"key": "stopped"})
    await asyncio.sleep(1.0)
    assert (await thread_b.get_run(stopped)).status is EffectStatus.PENDING
    await a.resume_thread(thread_a.thread_id)
    await wait_until(lambda: _status(thread_b, stopped, EffectStatus.COMPLETED), seconds=10)


# ------------------------------------------------------------------ turns

TURNS_APP = Path(__file__).parent / "apps" / "turns"


async def test_one_turn_at_a_time_per_thread_across_nodes(
    pg_url: str, tmp_path: Path,
) -> None:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.testing import override_model

    def node(node_id: str) -> Runtime:
        return Runtime(app_dir=TURNS_APP, data_dir=tmp_path / node_id, load_packages=False,
                       storage=PostgresBackend(pg_url, node_id=node_id))

    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await release.wait()
        return ModelResponse(parts=[TextPart("slow answer")])

    async def quick(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("quick answer")])

    a, b = node("node-a"), node("node-b")
    async with a, b:
        thread_a = await a.create_thread()
        thread_b = await b.get_thread(thread_a.thread_id)
        with override_model(a, FunctionModel(slow)), override_model(b, FunctionModel(quick)):
            first = asyncio.create_task(thread_a.send_message("take your time"))
            await entered.wait()
            second = asyncio.create_task(thread_b.send_message("and this"))
            await asyncio.sleep(1.0)
            assert not second.done()  # node b waits for node a's turn on the thread
            release.set()
            await first
            result = await asyncio.wait_for(second, 10)
        assert result.reply is not None and result.reply.content == "quick answer"
        contents = [m.content for m in (await thread_a.get_messages()).messages]
        assert contents == ["take your time", "slow answer", "and this", "quick answer"]


async def test_a_turn_of_a_node_whose_lease_expired_is_resumed_by_another_node(
    pg_url: str, tmp_path: Path,
) -> None:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.testing import override_model

    entered = asyncio.Event()

    async def hang(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def quick(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("resumed answer")])

    a = Runtime(app_dir=TURNS_APP, data_dir=tmp_path / "a", load_packages=False,
                storage=PostgresBackend(pg_url, node_id="node-a", lease_seconds=0.9))
    b = Runtime(app_dir=TURNS_APP, data_dir=tmp_path / "b", load_packages=False,
                storage=PostgresBackend(pg_url, node_id="node-b", lease_seconds=0.9))
    async with b:
        await a.start()
        thread_a = await a.create_thread()
        tid = thread_a.thread_id
        with override_model(a, FunctionModel(hang)), override_model(b, FunctionModel(quick)):
            turn = asyncio.create_task(thread_a.send_message("hello"))
            await entered.wait()
            # Node a dies mid-turn: it stops renewing its lease and its work stops there
            # (a process killed; its turn lease row stays behind).
            storage = a.storage
            assert isinstance(storage, PostgresBackend)
            storage._watch_stop.set()
            # Node b cannot take the thread's turn while node a's lease lasts.
            holder = await asyncio.to_thread(b.storage.take_turn_lease, tid, "probe")
            assert holder == "node-a"
            thread_b = await b.get_thread(tid)

            async def resumed() -> bool:
                messages = (await thread_b.get_messages()).messages
                return [m.content for m in messages] == ["hello", "resumed answer"]

            await wait_until(resumed, seconds=20)
            turn.cancel()
        with contextlib.suppress(BaseException):
            await turn
        with contextlib.suppress(Exception):
            await a.close()


def _turn_node(pg_url: str, tmp_path: Path, node_id: str, lease_seconds: float = 1.5) -> Runtime:
    """A node of the turns app; a short lease: it looks for lost turn leases every 0.5 s."""
    return Runtime(app_dir=TURNS_APP, data_dir=tmp_path / node_id, load_packages=False,
                   storage=PostgresBackend(pg_url, node_id=node_id, lease_seconds=lease_seconds))


def _answering(text: str) -> Any:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(text)])

    return FunctionModel(answer)


async def test_a_turn_lease_whose_release_was_cut_frees_the_thread_for_other_nodes(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime.errors import DatabaseUnavailable
    from runtime.testing import override_model

    a, b = _turn_node(pg_url, tmp_path, "node-a"), _turn_node(pg_url, tmp_path, "node-b")
    async with a, b:
        thread_a = await a.create_thread()
        tid = thread_a.thread_id
        release = a.storage.release_turn_lease
        cut: list[str] = []

        def cut_once(thread_id: str, token: str) -> None:
            if not cut:  # the connection is cut as the turn gives its lease back
                cut.append(thread_id)
                raise DatabaseUnavailable("connection lost")
            release(thread_id, token)

        monkeypatch.setattr(a.storage, "release_turn_lease", cut_once)
        with override_model(a, _answering("from a")), override_model(b, _answering("from b")):
            assert (await thread_a.send_message("first")).reply is not None
            assert cut == [tid]
            thread_b = await b.get_thread(tid)
            # No turn runs on node a (alive): node b's turn runs once a gave the row back.
            result = await asyncio.wait_for(thread_b.send_message("second"), 15)
        assert result.reply is not None and result.reply.content == "from b"
        assert await asyncio.to_thread(a.storage.held_turn_leases) == []


async def test_a_turn_deleted_while_taking_its_lease_leaves_none_for_the_id_created_again(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from runtime.errors import ThreadNotFound
    from runtime.testing import override_model

    a, b = _turn_node(pg_url, tmp_path, "node-a"), _turn_node(pg_url, tmp_path, "node-b")
    async with a, b:
        thread_a = await a.create_thread()
        tid = thread_a.thread_id
        take = a.storage.take_turn_lease
        asked, go, taken = threading.Event(), threading.Event(), threading.Event()

        def slow_take(thread_id: str, token: str) -> str | None:
            asked.set()
            go.wait(10)  # the deletion lands meanwhile; the take commits after it
            try:
                return take(thread_id, token)
            finally:
                taken.set()

        monkeypatch.setattr(a.storage, "take_turn_lease", slow_take)
        with override_model(a, _answering("from a")), override_model(b, _answering("from b")):
            turn = asyncio.create_task(thread_a.send_message("hello"))
            assert await asyncio.to_thread(asked.wait, 10)
            assert await b.delete_thread(tid)
            with pytest.raises(ThreadNotFound):  # node a heard it and cancelled the turn
                await asyncio.wait_for(turn, 10)
            go.set()
            assert await asyncio.to_thread(taken.wait, 10)
            monkeypatch.setattr(a.storage, "take_turn_lease", take)
            again = await b.create_thread(tid)
            result = await asyncio.wait_for(again.send_message("again"), 15)
        assert result.reply is not None and result.reply.content == "from b"
        assert await asyncio.to_thread(a.storage.held_turn_leases) == []


async def test_a_turn_whose_thread_another_node_deleted_answers_thread_not_found(
    pg_url: str, tmp_path: Path,
) -> None:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.errors import ThreadNotFound
    from runtime.testing import override_model

    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await release.wait()
        return ModelResponse(parts=[TextPart("too late")])

    x = PostgresBackend(pg_url, node_id="node-x")
    rx = x.open()
    try:
        a = _turn_node(pg_url, tmp_path, "node-a", lease_seconds=30)
        async with a:
            thread_a = await a.create_thread()
            with override_model(a, FunctionModel(slow)):
                turn = asyncio.create_task(thread_a.send_message("hello"))
                await entered.wait()
                # Deleted on node x before node a hears of it: the turn's lease goes too.
                assert await asyncio.to_thread(rx.delete_thread, thread_a.thread_id)
                release.set()
                with pytest.raises(ThreadNotFound):
                    await asyncio.wait_for(turn, 10)
    finally:
        rx.close()
        x.close()


async def test_a_dead_nodes_turn_lease_on_a_deleted_thread_is_dropped_quietly(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    x = PostgresBackend(pg_url, node_id="node-x")
    rx = x.open()
    try:
        assert x.take_turn_lease("gone", "turn-x") is None  # its thread deleted since
        x._watch_stop.set()  # node x dies
        expire_lease(pg_url, "node-x")
        b = _turn_node(pg_url, tmp_path, "node-b")
        with caplog.at_level(logging.INFO, logger="runtime"):
            async with b:
                assert await asyncio.to_thread(b.storage.orphaned_turns) == ["gone"]

                async def dropped() -> bool:
                    return await asyncio.to_thread(b.storage.orphaned_turns) == []

                await wait_until(dropped, seconds=15)
                await asyncio.sleep(1.2)  # two more looks: nothing more to say
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        resumed = [r for r in caplog.records if "resuming the turn" in r.getMessage()]
        assert len(resumed) == 1
    finally:
        rx.close()
        x.close()


@pytest.mark.parametrize("resume_cut", [False, True], ids=["resumed", "resume-cut-once"])
async def test_a_turn_whose_answer_the_database_refused_is_resumed_not_left_running(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resume_cut: bool,
) -> None:
    from runtime import turns as turns_module
    from runtime.errors import DatabaseUnavailable
    from runtime.testing import override_model
    from runtime.turns import TurnStatus, load_turns

    a = _turn_node(pg_url, tmp_path, "node-a")
    async with a:
        thread_a = await a.create_thread()
        tid = thread_a.thread_id
        store = turns_module._store
        calls: list[int] = []

        async def cut_answer(rt: Runtime, thread_id: str, messages: list[Any],
                             created_at_ts: float | None = None) -> None:
            calls.append(len(messages))
            if len(calls) == 2:  # the answer's write: the connection is cut (HTTP 503)
                raise DatabaseUnavailable("connection lost")
            await store(rt, thread_id, messages, created_at_ts)

        monkeypatch.setattr(turns_module, "_store", cut_answer)
        load = turns_module.load_turns
        resumes: list[str] = []

        async def cut_first_resume(rt: Runtime, thread_id: str) -> Any:
            task = asyncio.current_task()
            if task is not None and task.get_name().startswith("resume-turns-"):
                resumes.append(thread_id)
                if resume_cut and len(resumes) == 1:  # still cut when the resume reads
                    raise DatabaseUnavailable("connection lost")
            return await load(rt, thread_id)

        monkeypatch.setattr(turns_module, "load_turns", cut_first_resume)
        with override_model(a, _answering("answer")):
            with pytest.raises(DatabaseUnavailable):
                await thread_a.send_message("hello")

            async def ended() -> bool:
                rows = await load_turns(a, tid)
                return [r.status for r in rows.values()] == [TurnStatus.SUCCEEDED]

            await wait_until(ended, seconds=15)
        contents = [m.content for m in (await thread_a.get_messages()).messages]
        assert contents == ["hello", "answer"]
        assert len(resumes) >= (2 if resume_cut else 1)


def _noting(seen: list[list[Any]]) -> Any:
    """A model: to "note it", calls ``schedule_note`` then answers "Noted: <result>"; to
    anything else, answers "ok" (what it saw then is added to ``seen``)."""
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]
        prompt = [p for p in parts if isinstance(p, UserPromptPart)][-1]
        if prompt.content != "note it":
            seen.append(parts)
            return ModelResponse(parts=[TextPart("ok")])
        returned = [p for p in parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f"Noted: {returned[-1].content}")])
        return ModelResponse(parts=[ToolCallPart(
            "schedule_note", {"text": "x", "delay_seconds": 60}, tool_call_id="call-1")])

    return FunctionModel(answer)


@pytest.mark.parametrize("where", ["tool", "record", "answer"])
async def test_a_turn_the_database_failed_inside_its_run_is_resumed_not_failed(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str,
) -> None:
    """A cut in a tool's own runtime call, or in the journal's write of a tool call or of
    the model's answer after it, is the database's failure: 503 and resumed, not a failed
    turn (502) nor a tool failure shown to the model; until resumed it leaves only its
    user message (no tool result without its answer in the next turn's history)."""
    from pydantic_ai.messages import ToolReturnPart

    from runtime import ThreadState
    from runtime import durable as durable_module
    from runtime import turns as turns_module
    from runtime.errors import DatabaseUnavailable, ThreadStorageError
    from runtime.testing import override_model
    from runtime.turns import TurnStatus, load_turns

    a = _turn_node(pg_url, tmp_path, "node-a")
    async with a:
        thread_a = await a.create_thread()
        tid = thread_a.thread_id
        cut: list[str] = []
        if where == "tool":
            schedule = ThreadState.schedule_effect

            async def cut_schedule(self: ThreadState, *args: Any, **kwargs: Any) -> Any:
                if not cut:  # the tool's schedule_effect loses its connection
                    cut.append("schedule_effect")
                    raise ThreadStorageError(self.thread_id, "connection lost",
                                             unavailable=True)
                return await schedule(self, *args, **kwargs)

            monkeypatch.setattr(ThreadState, "schedule_effect", cut_schedule)
        else:
            finish = durable_module.Journal.finish

            async def cut_finish(self: Any, key: str, **kwargs: Any) -> Any:
                # The tool ran: the write of its record, or of the answer after it, is cut.
                if not cut and (":call:" in key if where == "record"
                                else key.endswith(":model:2")):
                    cut.append(key)
                    raise DatabaseUnavailable("connection lost")
                return await finish(self, key, **kwargs)

            monkeypatch.setattr(durable_module.Journal, "finish", cut_finish)
        resume = turns_module.resume_thread_turns
        go = asyncio.Event()

        async def gated_resume(rt: Runtime, thread_id: str) -> int:
            await go.wait()  # the next message first
            return await resume(rt, thread_id)

        monkeypatch.setattr(turns_module, "resume_thread_turns", gated_resume)
        seen: list[list[Any]] = []
        with override_model(a, _noting(seen)):
            with pytest.raises(DatabaseUnavailable):
                await thread_a.send_message("note it")
            assert cut
            rows = await load_turns(a, tid)
            assert [r.status for r in rows.values()] == [TurnStatus.RUNNING]
            contents = [m.content for m in (await thread_a.get_messages()).messages]
            assert contents == ["note it"]
            # The next message's turn sees no tool result without its answer.
            assert (await thread_a.send_message("next")).reply is not None
            assert not [p for p in seen[0] if isinstance(p, ToolReturnPart)]
            go.set()

            async def ended() -> bool:
                rows = await load_turns(a, tid)
                return [r.status for r in rows.values()] == [TurnStatus.SUCCEEDED] * 2

            await wait_until(ended, seconds=15)
        messages = (await thread_a.get_messages()).messages
        replies = [m.content for m in messages if m.role == "assistant" and m.content]
        assert replies[0] == "ok" and replies[1].startswith("Noted: ") and len(replies) == 2
        results = [r for m in messages for r in m.tool_results]
        assert [(r.tool_name, r.is_error) for r in results] == [("schedule_note", False)]
        runs = (await thread_a.list_runs()).runs
        # Cut before the tool scheduled: once. Cut after it, before its record: the resume
        # runs it again (docs/durable-turns.md, "The crash window").
        assert [r.name for r in runs] == (["note", "note"] if where == "record" else ["note"])


async def test_a_turn_the_database_stopped_more_times_than_the_attempts_still_ends(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Blinks are not interruptions: a turn stopped by the database at each of its first
    MAX_ATTEMPTS attempts is resumed again, not failed as "interrupted"."""
    from runtime import ThreadState
    from runtime.errors import DatabaseUnavailable, ThreadStorageError
    from runtime.testing import override_model
    from runtime.turns import TurnStatus, load_turns

    a = _turn_node(pg_url, tmp_path, "node-a")
    async with a:
        thread_a = await a.create_thread()
        tid = thread_a.thread_id
        schedule = ThreadState.schedule_effect
        cuts: list[int] = []

        async def cut_schedule(self: ThreadState, *args: Any, **kwargs: Any) -> Any:
            if len(cuts) < MAX_ATTEMPTS:  # each attempt's schedule_effect is cut
                cuts.append(1)
                raise ThreadStorageError(self.thread_id, "connection lost", unavailable=True)
            return await schedule(self, *args, **kwargs)

        monkeypatch.setattr(ThreadState, "schedule_effect", cut_schedule)
        with override_model(a, _noting([])):
            with pytest.raises(DatabaseUnavailable):
                await thread_a.send_message("note it")

            async def ended() -> bool:
                rows = await load_turns(a, tid)
                return [r.status for r in rows.values()] != [TurnStatus.RUNNING]

            await wait_until(ended, seconds=20)
        row, = (await load_turns(a, tid)).values()
        assert (row.status, row.attempts, row.error) == (
            TurnStatus.SUCCEEDED, MAX_ATTEMPTS + 1, None)
        replies = [m.content for m in (await thread_a.get_messages()).messages
                   if m.role == "assistant" and m.content]
        assert len(replies) == 1 and replies[0].startswith("Noted: ")


def test_a_bulk_replay_replays_a_failure_once_across_nodes(two_nodes: Any) -> None:
    (a, ra), (b, _) = two_nodes
    sa, sb = thread_on_both(a, ra, b)
    sa.insert_run(new_run("r1"))
    sa.finish_and_claim(None, T0)
    sa.finish_and_claim(Finish("r1", EffectStatus.FAILED, "boom", T0 + 1), T0 + 1, claim=False)
    replay_a = replace(new_run("ra"), replay_of="r1")
    replay_b = replace(new_run("rb"), replay_of="r1")
    assert sa.insert_run(replay_a, replay_once=True) is None
    existing = sb.insert_run(replay_b, replay_once=True)  # node b's bulk replay, later
    assert existing is not None and existing.id == "ra"
    assert sb.insert_run(replay_b) is None  # a single replay (not "once") is another run
    sa.close()
    sb.close()


async def test_a_node_starting_leaves_alone_the_turn_a_live_node_runs(
    pg_url: str, tmp_path: Path,
) -> None:
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.testing import override_model
    from runtime.turns import resume_thread_turns

    def node(node_id: str) -> Runtime:
        return Runtime(app_dir=TURNS_APP, data_dir=tmp_path / node_id, load_packages=False,
                       storage=PostgresBackend(pg_url, node_id=node_id))

    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await release.wait()
        return ModelResponse(parts=[TextPart("slow answer")])

    a, b = node("node-a"), node("node-b")
    async with a, b:
        thread_a = await a.create_thread()
        with override_model(a, FunctionModel(slow)):
            first = asyncio.create_task(thread_a.send_message("take your time"))
            await entered.wait()
            # What node b's start does for every thread: the turn is running, but on a
            # live node, so b neither resumes it nor waits for it.
            assert await asyncio.wait_for(resume_thread_turns(b, thread_a.thread_id), 10) == 0
            assert b.turns.running(thread_a.thread_id) is None
            release.set()
            await first


# ------------------------------------------------- a lease lost, then held again


async def test_a_node_that_holds_its_lease_again_requeues_the_runs_it_gave_up(
    make_node: Callable[..., Runtime], pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The database cut off longer than the lease: the node cancels its effects; when it
    # holds its lease again, no other node sees its runs as orphans, so it re-queues them.
    a = make_node("node-a", lease_seconds=0.9)
    async with a:
        thread = await a.create_thread()
        slow_id = await thread.schedule_effect("slow", {"seconds": 1})
        behind_id = await thread.schedule_effect("record", {"key": "behind"})
        await wait_until(lambda: _status(thread, slow_id, EffectStatus.RUNNING))
        storage = a.storage
        assert isinstance(storage, PostgresBackend)
        conn = storage._lock_conn
        assert conn is not None
        pid = conn.info.backend_pid

        async def no_round() -> int:
            return 0

        # No periodic re-queue round: the thread's own drain must re-queue the given-up
        # run before it claims the run behind it.
        a.requeue_orphans = no_round  # type: ignore[method-assign]

        def cut(*_: Any, **__: Any) -> bool:
            raise psycopg.OperationalError("network cut (test)")

        monkeypatch.setattr(storage, "_renew", cut)

        async def lost() -> bool:
            return storage._lost_notified

        await wait_until(lost, seconds=10)
        url, _ = split_schema(pg_url)
        with psycopg.connect(url, autocommit=True) as admin:  # the node's session ends
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        monkeypatch.undo()
        await wait_until(lambda: _status(thread, behind_id, EffectStatus.COMPLETED))
        await wait_until(lambda: _status(thread, slow_id, EffectStatus.COMPLETED))
        assert storage.lock_problem() is None
        attempts = await thread.get_run_attempts(slow_id)
        assert [(x.attempt, x.outcome, x.node_id) for x in attempts] == [
            (1, "interrupted", "node-a"), (2, "completed", "node-a")]
        assert (await thread.get_run(slow_id)).status is EffectStatus.COMPLETED
        # Due order and one run at a time held: the run behind started only once the given-up
        # run had been re-queued, run again and ended.
        (behind,) = await thread.get_run_attempts(behind_id)
        ended = attempts[1].ended_at_ts
        assert ended is not None and behind.started_at_ts >= ended


async def test_a_cancel_of_a_run_its_node_gave_up_is_applied_in_the_store(
    make_node: Callable[..., Runtime],
) -> None:
    a, b = make_node("node-a"), make_node("node-b")
    async with a, b:
        thread_a = await a.create_thread()
        thread_b = await b.get_thread(thread_a.thread_id)
        first = await thread_a.schedule_effect("slow", {"seconds": 30})
        await wait_until(lambda: _status(thread_a, first, EffectStatus.RUNNING))
        (attempt,) = await thread_a.get_run_attempts(first)
        owner = a if attempt.node_id == "node-a" else b
        other_thread = thread_b if owner is a else thread_a
        # The owner gives up its effects (its lease lapsed) while its lease row is live
        # again: the run stays `running` under its id, executed by no process.
        owner._lease_lost("test")
        # Asked on the other node: true once canceled in the store, by whom it says.
        assert await other_thread.remove_scheduled_effect(first, canceled_by="ops") is True
        run = await other_thread.get_run(first)
        assert run.status is EffectStatus.CANCELED
        assert run.canceled_by == "ops"
        # The thread drains again: a run scheduled behind it starts.
        second = await other_thread.schedule_effect("slow", {"seconds": 30})
        await wait_until(lambda: _status(thread_a, second, EffectStatus.RUNNING))
        assert await thread_a.remove_scheduled_effect(second) is True


async def test_a_cancel_on_the_node_of_a_run_it_gave_up_is_applied_in_the_store(
    make_node: Callable[..., Runtime],
) -> None:
    a = make_node("node-a")
    async with a:
        thread = await a.create_thread()
        run_id = await thread.schedule_effect("slow", {"seconds": 30})
        await wait_until(lambda: _status(thread, run_id, EffectStatus.RUNNING))
        a._lease_lost("test")
        assert await thread.remove_scheduled_effect(run_id) is True
        assert (await thread.get_run(run_id)).status is EffectStatus.CANCELED


async def test_a_partitioned_nodes_late_turn_writes_nothing_after_its_turn_resumed_elsewhere(
    pg_url: str, tmp_path: Path,
) -> None:
    """Node a's turn outlives a's lease without a noticing (a long pause, a partition).

    Node b resumes the turn; when a's model answers at last, a's write of it is refused by
    the turn lease's token (fencing): the conversation holds b's answer only.
    """
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.errors import TurnLeaseLost
    from runtime.testing import override_model

    entered, late = asyncio.Event(), asyncio.Event()

    async def paused(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await late.wait()
        return ModelResponse(parts=[TextPart("late answer")])

    async def quick(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("resumed answer")])

    a = Runtime(app_dir=TURNS_APP, data_dir=tmp_path / "a", load_packages=False,
                storage=PostgresBackend(pg_url, node_id="node-a", lease_seconds=0.9))
    b = Runtime(app_dir=TURNS_APP, data_dir=tmp_path / "b", load_packages=False,
                storage=PostgresBackend(pg_url, node_id="node-b", lease_seconds=0.9))
    async with b:
        await a.start()
        try:
            thread_a = await a.create_thread()
            tid = thread_a.thread_id
            with override_model(a, FunctionModel(paused)), \
                    override_model(b, FunctionModel(quick)):
                turn = asyncio.create_task(thread_a.send_message("hello"))
                await entered.wait()
                storage = a.storage
                assert isinstance(storage, PostgresBackend)
                storage._watch_stop.set()  # a renews its lease no more, and does not notice
                thread_b = await b.get_thread(tid)

                async def contents() -> list[str]:
                    return [m.content for m in (await thread_b.get_messages()).messages]

                async def resumed() -> bool:
                    return await contents() == ["hello", "resumed answer"]

                await wait_until(resumed, seconds=20)
                late.set()  # a's model answers now: its turn tries to store the answer
                with pytest.raises(TurnLeaseLost, match="no longer holds"):
                    await asyncio.wait_for(turn, 20)
                assert await contents() == ["hello", "resumed answer"]
        finally:
            with contextlib.suppress(Exception):
                await a.close()


async def test_a_node_that_loses_its_lease_stops_its_turns_for_another_node_to_resume(
    pg_url: str, tmp_path: Path,
) -> None:
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.errors import TurnLeaseLost
    from runtime.testing import override_model
    from runtime.turns import TurnStatus, load_turns

    entered = asyncio.Event()

    async def hang(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        entered.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    a = Runtime(app_dir=TURNS_APP, data_dir=tmp_path / "a", load_packages=False,
                storage=PostgresBackend(pg_url, node_id="node-a"))
    async with a:
        thread_a = await a.create_thread()
        with override_model(a, FunctionModel(hang)):
            turn = asyncio.create_task(thread_a.send_message("hello"))
            await entered.wait()
            a._lease_lost("the test says so")  # what the backend calls once the lease lapsed
            with pytest.raises(TurnLeaseLost):
                await asyncio.wait_for(turn, 20)
        # Stopped, not ended: its row says running, for a node to resume it.
        rows = await load_turns(a, thread_a.thread_id)
        assert [r.status for r in rows.values()] == [TurnStatus.RUNNING]


async def test_bulk_replays_on_two_nodes_at_once_each_report_only_the_replays_they_stored(
    make_node: Callable[..., Runtime],
) -> None:
    # Each failure is replayed once across nodes; a replay another node's call stored
    # meanwhile is not reported again (the totals add up to the runs made).
    a, b = make_node("node-a"), make_node("node-b")
    async with a, b:
        failed: list[str] = []
        threads = []
        for _ in range(6):
            thread = await a.create_thread()
            threads.append(thread.thread_id)
            for _ in range(4):
                failed.append(await thread.schedule_effect("boom", {}))
        async def all_failed() -> bool:
            for node in (a, b):
                page = await node.list_runs(status="failed", name="boom", limit=500)
                if len(page.runs) < len(failed):
                    return False
            return True

        await wait_until(all_failed)
        # The replays stay pending: a replay that ran (and failed, as boom does) before
        # a later call of the six would be a failure of its own for that call to replay.
        for thread_id in threads:
            await a.pause_thread(thread_id)
        results = await asyncio.gather(*(node.replay_runs(name="boom")
                                         for node in (a, b, a, b, a, b)))
        reported = [run_id for result in results for run_id in result.ids]
        replays: set[str] = set()
        for node in (a, b):
            page = await node.list_runs(name="boom", limit=500)
            replays |= {r.id for r in page.runs if r.replay_of is not None}
        assert len(replays) == len(failed)  # each failure once
        assert sorted(reported) == sorted(replays)  # each reported once, by its maker


async def test_a_bulk_cancel_on_node_b_cancels_the_runs_node_a_scheduled_just_before(
    nodes: tuple[Runtime, Runtime],
) -> None:
    # Node a indexes its runs in batches after their commits: node b's bulk cancel
    # selects from the runs themselves, so it cancels a run committed a moment ago.
    a, b = nodes
    thread = await a.create_thread()
    first = await thread.schedule_effect("record", {"key": "1"}, 600)
    result = await b.cancel_runs(thread_id=thread.thread_id)
    assert result.ids == [first]
    assert (await thread.get_run(first)).status is EffectStatus.CANCELED
    # A filter across threads too.
    second = await thread.schedule_effect("record", {"key": "2"}, 600)
    assert (await b.cancel_runs(name="record")).ids == [second]
    # A listing naming the thread shows the change at once on either node.
    third = await thread.schedule_effect("record", {"key": "3"}, 600)
    for node in (b, a):
        page = await node.list_runs(thread_id=thread.thread_id)
        assert [(r.id, r.status) for r in page.runs] == [
            (third, EffectStatus.PENDING), (second, EffectStatus.CANCELED),
            (first, EffectStatus.CANCELED)]
        assert page.counts[EffectStatus.CANCELED] == 2
    assert await thread.remove_scheduled_effect(third) is True
    page = await b.list_runs(thread_id=thread.thread_id, status="pending")
    assert page.runs == []


async def test_a_run_waiting_behind_a_run_on_another_node_says_so_on_every_node(
    nodes: tuple[Runtime, Runtime],
) -> None:
    a, b = nodes
    thread_a, thread_b, running = await _start_on_b(a, b)
    waiting = await thread_a.schedule_effect("record", {"key": "w"})
    for thread in (thread_a, thread_b):
        assert (await thread.get_run(waiting)).waiting_for == running
        page = await thread.list_runs()
        assert {r.id: r.waiting_for for r in page.runs} == {running: None, waiting: running}
    for node in (a, b):
        page = await node.list_runs(thread_id=thread_a.thread_id, status="pending")
        assert [(r.id, r.waiting_for) for r in page.runs] == [(waiting, running)]

    async def indexed() -> bool:
        page = await a.list_runs(status="pending")
        return [r.id for r in page.runs] == [waiting]

    await wait_until(indexed)
    page = await a.list_runs(status="pending")
    assert page.runs[0].waiting_for == running
    for thread in (thread_a, thread_b):
        with pytest.raises(RunStateError, match=f"waitingFor: {running}"):
            await thread.run_now(waiting)
    assert (await thread_a.get_run(waiting)).status is EffectStatus.PENDING


async def test_a_bulk_replay_on_node_b_replays_a_failure_node_a_just_stored(
    make_node: Callable[..., Runtime], pg_url: str, tmp_path: Path,
) -> None:
    # Node b claims no run: node a runs the failing run and indexes it after its commit.
    a = make_node("node-a")
    b = Runtime(app_dir=APP, data_dir=tmp_path / "node-b", load_packages=False,
                max_concurrent_runs=0, storage=PostgresBackend(pg_url, node_id="node-b"))
    async with a, b:
        thread = await a.create_thread()
        run_id = await thread.schedule_effect("boom", {})
        while (await thread.get_run(run_id)).status is not EffectStatus.FAILED:
            await asyncio.sleep(0.005)
        result = await b.replay_runs(thread_id=thread.thread_id)
        assert len(result.ids) == 1
        assert (await thread.get_run(result.ids[0])).replay_of == run_id


async def test_a_node_started_beside_a_live_one_does_not_rebuild_the_run_index(
    make_node: Callable[..., Runtime], caplog: pytest.LogCaptureFixture,
) -> None:
    """The run index is the database's: a live node's batches are its own to write, and a
    dead node's last batch is rewritten by the node that finds it dead; a node that starts
    meanwhile (a second node, a rolling deploy) has nothing to rebuild."""
    a = make_node("node-a")
    async with a:
        thread = await a.create_thread()
        await thread.schedule_effect("record", {"key": "k"}, delay=3600)
        await a.list_runs()  # its batch written (node-b reads the index)
        with caplog.at_level(logging.INFO, logger="runtime"):
            async with make_node("node-b") as b:
                page = await b.list_runs()
                assert page.complete and [r.thread_id for r in page.runs] == [thread.thread_id]
            assert (await a.list_runs()).complete
        assert "rebuilding" not in caplog.text
    # Both stopped cleanly: a node starting now finds the index complete too.
    with caplog.at_level(logging.INFO, logger="runtime"):
        async with make_node("node-c") as c:
            assert (await c.list_runs()).complete
    assert "rebuilding" not in caplog.text


async def test_a_node_that_missed_a_deletion_refuses_runs_for_the_thread_and_forgets_it(
    make_node: Callable[..., Runtime], pg_url: str,
) -> None:
    """Another node deleted the thread while this one was not listening (its `deleted`
    command lost): a schedule through this node is refused as the thread not found,
    nothing is stored, and this node then forgets the thread as the command would have."""
    from runtime.errors import ThreadNotFound
    from runtime.storage.postgres import split_schema

    async with make_node("node-a") as a:
        thread = await a.create_thread()
        tid = thread.thread_id
        await thread.schedule_effect("record", {"key": "before"}, delay=3600)
        # The deletion another node committed, as this node's store sees it: no registry row.
        base, schema = split_schema(pg_url)
        with psycopg.connect(base, autocommit=True,
                             options=f"-c search_path={schema}") as conn:
            conn.execute("DELETE FROM threads WHERE id = %s", (tid,))
        with pytest.raises(ThreadNotFound):
            await thread.schedule_effect("record", {"key": "after"}, delay=3600)
        with pytest.raises(ThreadNotFound):
            await thread.schedule_effect("record", {"key": "keyed"}, delay=3600, key="k")
        rows = query(pg_url, "SELECT args::text FROM effect_runs WHERE thread_id = %s", (tid,))
        assert [json.loads(str(r[0]))["key"] for r in rows] == ["before"]

        async def forgotten() -> bool:
            try:
                await a.get_thread(tid)
            except ThreadNotFound:
                return True
            return False

        await wait_until(forgotten, 10)


# ------------------------------------------------------------------ races between nodes


def test_a_store_create_of_an_id_another_node_registered_meanwhile_leaves_its_thread(
    two_nodes: Any,
) -> None:
    from runtime.errors import ThreadExists

    (a, ra), (b, rb) = two_nodes
    info = ThreadInfo(id="t", created_at_ts=T0)
    # Node b found no thread "t" in the registry; node a then made and registered it.
    sa = a.create_thread_store(info)
    assert ra.add_thread(info)
    sa.insert_run(new_run("r1"))
    with pytest.raises(ThreadExists):
        b.create_thread_store(replace(info, created_at_ts=T0 + 1))
    assert rb.add_thread(info) is False
    sb = b.open_thread_store("t")
    assert [r.id for r in sb.pending_runs()] == ["r1"]
    sa.close()
    sb.close()


async def test_creating_one_thread_id_on_two_nodes_at_once_makes_it_once(
    nodes: tuple[Runtime, Runtime],
) -> None:
    from runtime.errors import ThreadExists

    a, b = nodes
    for n in range(8):
        tid = f"race{n}"
        results = await asyncio.gather(
            *(rt.create_thread(tid) for rt in (a, b, a, b, a, b)), return_exceptions=True
        )
        made = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, ThreadExists)]
        assert (len(made), len(refused)) == (1, 5), results
        run_id = await made[0].schedule_effect("record", {"key": tid}, 3600)
        for rt in (a, b):
            assert (await (await rt.get_thread(tid)).get_run(run_id)).id == run_id


async def test_run_now_of_a_run_another_node_changed_meanwhile_says_its_state(
    nodes: tuple[Runtime, Runtime], monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = nodes
    thread_a = await a.create_thread()
    run_id = await thread_a.schedule_effect("record", {"key": "k"}, 3600)
    thread_b = await b.get_thread(thread_a.thread_id)
    alarms = a.runs._alarms
    lower = alarms.lower

    async def canceled_on_b_meanwhile(thread_id: str, at: float) -> None:
        # Node a read the run pending; node b cancels it before a's update.
        assert await thread_b.remove_scheduled_effect(run_id) is True
        await lower(thread_id, at)

    monkeypatch.setattr(alarms, "lower", canceled_on_b_meanwhile)
    with pytest.raises(RunStateError, match=f"Run {run_id} is canceled"):
        await thread_a.run_now(run_id)
    assert (await thread_a.get_run(run_id)).status is EffectStatus.CANCELED


async def test_a_resync_whose_read_fails_is_tried_again_until_the_missed_pause_applies(
    slow_to_listen: tuple[Runtime, Runtime], pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = slow_to_listen
    thread_a = await a.create_thread()
    tid = thread_a.thread_id
    await (await b.get_thread(tid)).schedule_effect("record", {"key": "later"}, 3600)
    actor = b.actors.peek(tid)  # open on b
    assert actor is not None and not actor.info.paused
    bus = await _cut_bus(b)
    await a.pause_thread(tid)
    assert not bus.connected  # b did not hear it
    url, schema = split_schema(pg_url)
    with psycopg.connect(url, autocommit=True) as admin:
        # The read-back fails (a real error of the server) when b listens again ...
        admin.execute(f"ALTER TABLE {schema}.paused_threads RENAME TO paused_threads_away")
        try:
            async def failed() -> bool:
                return "could not read back the commands" in caplog.text

            await wait_until(failed, seconds=10)
        finally:
            admin.execute(f"ALTER TABLE {schema}.paused_threads_away RENAME TO paused_threads")

    async def paused_on_b() -> bool:  # ... and is tried again once the server answers it
        return actor.info.paused

    await wait_until(paused_on_b, seconds=10)


async def test_concurrent_cancels_of_a_running_run_on_two_nodes_all_answer_true(
    nodes: tuple[Runtime, Runtime],
) -> None:
    a, b = nodes
    for _ in range(3):
        thread_a, thread_b, run_id = await _start_on_b(a, b)
        answers = await asyncio.gather(*(
            thread.remove_scheduled_effect(run_id)
            for thread in (thread_a, thread_b, thread_a, thread_b, thread_a, thread_b)
        ))
        assert answers == [True] * 6
        assert (await thread_a.get_run(run_id)).status is EffectStatus.CANCELED
        # Asked once the run has ended: nothing is canceled by it.
        assert await thread_a.remove_scheduled_effect(run_id) is False
        assert await thread_b.remove_scheduled_effect(run_id) is False


async def test_concurrent_cancels_of_a_running_run_on_its_node_all_answer_true(
    nodes: tuple[Runtime, Runtime],
) -> None:
    a, b = nodes
    for _ in range(3):
        _, thread_b, run_id = await _start_on_b(a, b)
        answers = await asyncio.gather(*(thread_b.remove_scheduled_effect(run_id)
                                         for _ in range(6)))
        assert answers == [True] * 6
        assert await thread_b.remove_scheduled_effect(run_id) is False


async def test_cancels_racing_a_deletion_on_another_node_answer_not_found_or_canceled(
    nodes: tuple[Runtime, Runtime], caplog: pytest.LogCaptureFixture,
) -> None:
    from runtime.errors import ThreadNotFound

    a, b = nodes
    for _ in range(6):
        thread_a, thread_b, run_id = await _start_on_b(a, b)
        answers = await asyncio.gather(
            *(thread.remove_scheduled_effect(run_id)
              for thread in (thread_a, thread_b, thread_a, thread_b, thread_a, thread_b)),
            a.delete_thread(thread_a.thread_id), return_exceptions=True,
        )
        assert answers[-1] is True
        for answer in answers[:-1]:
            assert answer is True or isinstance(answer, ThreadNotFound), answers
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_node_that_finds_a_newer_schema_stops_claiming_and_is_not_ready(
    make_node: Callable[..., Runtime], pg_url: str,
) -> None:
    # A rolling upgrade: a node of a newer version migrated the shared schema while this
    # one runs. It notices with its next lease renewal: it starts no runs and its
    # readiness check fails naming both versions (so /api/ready takes it out of
    # rotation), and it claims again if the version goes back.
    from runtime.storage.pg_schema import SCHEMA_VERSION

    url, schema = split_schema(pg_url)
    node = make_node("node-old", lease_seconds=1.5)
    async with node:
        thread = await node.create_thread()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"UPDATE {schema}.schema_version SET version = %s",
                         (SCHEMA_VERSION + 1,))

        async def refused() -> bool:
            return node.storage.lock_problem() is not None

        await wait_until(refused, 10)
        with pytest.raises(Exception, match=rf"schema version {SCHEMA_VERSION + 1}, newer "
                                             rf"than this runtime's {SCHEMA_VERSION}"):
            await node.check_ready()
        run_id = await thread.schedule_effect("record", {"key": "after"})
        await asyncio.sleep(1.0)  # due at once: a node that claimed would have run it
        assert (await thread.get_run(run_id)).status is EffectStatus.PENDING
        assert node.storage.connection_held()  # its connection and lease are fine

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"UPDATE {schema}.schema_version SET version = %s",
                         (SCHEMA_VERSION,))

        async def ran() -> bool:
            return (await thread.get_run(run_id)).status is EffectStatus.COMPLETED

        await wait_until(ran, 15)
        await node.check_ready()


async def test_a_cancel_from_another_node_after_the_effect_returned_answers_false(
    nodes: tuple[Runtime, Runtime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 13: node b's effect returned; before b recorded the outcome, node a asked b to
    # cancel the run. B canceled it in the store (fencing out its own outcome) and a
    # answered True. The outcome stands now, as on a store of one process.
    a, b = nodes
    thread_a = await a.create_thread()
    thread_b = await b.get_thread(thread_a.thread_id)
    run_id = await thread_b.schedule_effect("record", {"key": "done"}, 3600)
    applied = asyncio.Event()
    apply_command = b._apply_command

    async def noted(op: str, thread_id: str, command: dict[str, Any]) -> None:
        await apply_command(op, thread_id, command)
        if op == "cancel":
            applied.set()

    monkeypatch.setattr(b, "_apply_command", noted)
    cancel: list[asyncio.Task[bool]] = []
    pace = b.executor._pace
    ran = tmp_path / "node-b" / "record.jsonl"

    async def cancel_from_a_first(*args: Any) -> None:
        # B's drain, right after the effect returned: a cancel through node a, which
        # node b applies before its drain goes on to record the outcome.
        if ran.exists() and not cancel:
            cancel.append(asyncio.create_task(thread_a.remove_scheduled_effect(run_id)))
            await applied.wait()
        await pace(*args)

    monkeypatch.setattr(b.executor, "_pace", cancel_from_a_first)
    await thread_b.run_now(run_id)

    async def ended() -> bool:
        return (await thread_a.get_run(run_id)).status.finished

    await wait_until(ended, seconds=10)
    assert cancel and await cancel[0] is False
    run = await thread_a.get_run(run_id)
    assert (run.status, run.canceled_by) == (EffectStatus.COMPLETED, None)
    (attempt,) = await thread_a.get_run_attempts(run_id)
    assert (attempt.outcome, attempt.node_id) == ("completed", "node-b")


async def test_run_now_racing_its_claim_on_another_node_says_running_not_waits_for_itself(
    nodes: tuple[Runtime, Runtime], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 13: four run-nows on four nodes; one node read the run pending, another node
    # claimed it, then the first read the thread's running run: the run itself. It
    # answered "cannot run now: it waits for run X ... (waitingFor: X)".
    a, b = nodes
    thread_a = await a.create_thread()
    thread_b = await b.get_thread(thread_a.thread_id)
    run_id = await thread_a.schedule_effect("slow", {"seconds": 30}, 3600)
    loop = asyncio.get_running_loop()
    stored_running = a.runs._stored_running

    async def run_now_on_b() -> None:
        await thread_b.run_now(run_id)
        await wait_until(lambda: _status(thread_b, run_id, EffectStatus.RUNNING))

    def claimed_on_b_meanwhile(store: ThreadStore, now: float) -> Any:
        # Node a read the run pending (in a storage thread): node b runs it now, then
        # node a reads the thread's running run.
        asyncio.run_coroutine_threadsafe(run_now_on_b(), loop).result()
        return stored_running(store, now)

    monkeypatch.setattr(a.runs, "_stored_running", claimed_on_b_meanwhile)
    with pytest.raises(RunStateError) as refused:
        await thread_a.run_now(run_id)
    assert str(refused.value) == f"Run {run_id} is running; only a pending run can be run now"
    monkeypatch.undo()
    run = await thread_a.get_run(run_id)
    assert (run.status, run.waiting_for) == (EffectStatus.RUNNING, None)
    assert await thread_a.remove_scheduled_effect(run_id) is True
