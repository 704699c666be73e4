"""Several nodes on one PostgreSQL schema: wake-ups, the alarm horizon, frames across nodes.

In-process tests run two `Runtime`s on one schema (each its own `PostgresBackend` with its
own node id, so its own pool, node lease and listening connection): everything between them
goes through the real server. The last test runs two real ``server.py`` processes.
Bounds below are guards against hangs, never measurements.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import SERVER_APP, release
from websockets.sync.client import connect as ws_connect

from runtime import Runtime, cluster
from runtime.cluster import rank
from runtime.effects import EffectRun, EffectStatus
from runtime.events import EffectChanged, RelayedFrame, RunChange, ThreadEvent
from runtime.frames import Subscription
from runtime.storage.postgres import PostgresBackend, split_schema
from runtime.testing import FakeClock

ROOT = Path(__file__).resolve().parent.parent
GUARD = 30.0


@asynccontextmanager
async def node(url: str, tmp_path: Path, name: str, **settings: Any) -> AsyncIterator[Runtime]:
    rt = Runtime(data_dir=tmp_path / name, app_dir=SERVER_APP, load_packages=False,
                 storage=PostgresBackend(url), node_id=f"node-{name}", **settings)
    await rt.start()
    assert rt.cluster is not None
    assert await asyncio.to_thread(rt.cluster.bus.flush, GUARD)
    try:
        yield rt
    finally:
        await rt.close()


async def until(check: Callable[[], Any], what: str) -> None:
    async with asyncio.timeout(GUARD):
        while not check():
            await asyncio.sleep(0.01)


async def take(sub: Subscription, n: int) -> list[ThreadEvent]:
    events: list[ThreadEvent] = []
    async with asyncio.timeout(GUARD):
        async for event in sub:
            events.append(event)
            if len(events) == n:
                break
    return events


def frames_of(events: list[ThreadEvent]) -> list[dict[str, Any]]:
    return [json.loads(e.frame_text()) for e in events]


async def test_a_subscriber_on_one_node_gets_every_frame_made_on_the_other_in_seq_order(
    pg_url: str, tmp_path: Path,
) -> None:
    async with node(pg_url, tmp_path, "a") as a, node(pg_url, tmp_path, "b") as b:
        ta = await a.create_thread()
        on_b = (await b.get_thread(ta.thread_id)).subscribe()
        on_a = ta.subscribe()
        ids = [await ta.schedule_effect("note", {"text": str(i)}) for i in range(3)]
        # Each run: scheduled, started, completed.
        got_b = await take(on_b, 9)
        got_a = await take(on_a, 9)
    assert [e.seq for e in got_b] == list(range(1, 10))
    assert frames_of(got_b) == frames_of(got_a)  # the same frames, the same numbers
    assert all(isinstance(e, RelayedFrame) for e in got_b)  # made on the other node
    assert all(isinstance(e, EffectChanged) for e in got_a)  # this node's own events
    by_run: dict[str, list[str]] = {}
    for f in frames_of(got_b):
        by_run.setdefault(f["data"]["id"], []).append(f["data"]["change"])
    assert by_run == {i: ["scheduled", "started", "completed"] for i in ids}


async def test_seq_stays_continuous_when_both_nodes_make_changes_to_one_thread(
    pg_url: str, tmp_path: Path,
) -> None:
    async with node(pg_url, tmp_path, "a") as a, node(pg_url, tmp_path, "b") as b:
        ta = await a.create_thread()
        tb = await b.get_thread(ta.thread_id)
        sub_a, sub_b = ta.subscribe(), tb.subscribe()
        # Far-off runs: nothing starts; each node schedules and cancels some.
        runs = []
        for i in range(10):
            runs.append(await (ta if i % 2 else tb).schedule_effect(
                "note", {"text": str(i)}, 3600))
        for i, run_id in enumerate(runs[:4]):
            assert await (tb if i % 2 else ta).remove_scheduled_effect(run_id)
        got_a, got_b = await take(sub_a, 14), await take(sub_b, 14)
    assert [e.seq for e in got_a] == [e.seq for e in got_b] == list(range(1, 15))
    assert frames_of(got_a) == frames_of(got_b)


async def test_a_change_a_dead_node_never_relayed_shows_as_a_seq_gap_on_another_node(
    pg_url: str, tmp_path: Path,
) -> None:
    url, schema = split_schema(pg_url)
    async with node(pg_url, tmp_path, "b") as b:
        async with node(pg_url, tmp_path, "a") as a:
            ta = await a.create_thread()
            on_b = (await b.get_thread(ta.thread_id)).subscribe()
            await ta.schedule_effect("note", {"text": "relayed"})
            assert [e.seq for e in await take(on_b, 3)] == [1, 2, 3]
            # Node A's relay stops before appending: the next run commits all its
            # changes (scheduled, started, completed) and none of their frames is written
            # (the schedule's statement took seq 4 for its frame; the relay never wrote it).
            assert a.cluster is not None
            a.cluster.send = lambda event: None  # type: ignore[method-assign]
            await ta.schedule_effect("note", {"text": "never relayed"})
            await a.wait_idle(GUARD)
        # A closed cleanly (lease 0, frames flushed); make it a node that died instead:
        # its lease expired a moment ago, its last heartbeat just before.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                f"UPDATE {schema}.nodes SET lease_expires_at = extract(epoch from now()) - 1, "
                f"heartbeat_at = extract(epoch from now()) - 2 WHERE node_id = 'node-a'")
        await b.requeue_orphans()
        assert await asyncio.to_thread(b.storage.mark_dead_nodes_gaps) == []  # once only
        # The next change of the thread, made on B, comes after the numbers skipped; B
        # waits for them (GAP_WAIT_SECONDS), then delivers it.
        await (await b.get_thread(ta.thread_id)).schedule_effect("note", {"text": "x"}, 3600)
        after = await take(on_b, 1)
    # 4 (the schedule's own number) and 5 (the skip) were the dead node's: the client reloads.
    assert [e.seq for e in after] == [6]


def hold_appends(rt: Runtime) -> threading.Event:
    """Hold ``rt``'s relay in its next appends (in its storage thread) until the event is set."""
    assert rt.cluster is not None
    bus = rt.cluster.bus
    append, gate = bus.append_frames, threading.Event()

    def held(drafts: Any, now: float) -> list[int]:
        assert gate.wait(GUARD)
        return append(drafts, now)

    bus.append_frames = held  # type: ignore[method-assign]
    return gate


def changes(events: list[ThreadEvent]) -> list[str]:
    return [f["data"]["change"] for f in frames_of(events)]


async def test_a_runs_scheduled_frame_comes_before_its_start_when_the_scheduling_node_relays_late(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """a schedules (its relay held), b claims and completes, c subscribes: seq follows commits.

    The schedule's statement took seq 1; b's frames are 2 and 3. c holds them until a's
    relay writes 1 (the wait for a missing number is made longer than the test's guard).
    """
    monkeypatch.setattr(cluster, "GAP_WAIT_SECONDS", GUARD)
    fast = {"cluster_wake_grace_seconds": 0.1}
    async with node(pg_url, tmp_path, "a", max_concurrent_runs=0, **fast) as a, \
            node(pg_url, tmp_path, "b", **fast) as b, \
            node(pg_url, tmp_path, "c", max_concurrent_runs=0, **fast) as c:
        assert c.cluster is not None
        ta = await a.create_thread()
        on_c = (await c.get_thread(ta.thread_id)).subscribe()
        on_b = (await b.get_thread(ta.thread_id)).subscribe()
        gate = hold_appends(a)
        run_id = await ta.schedule_effect("note", {"text": "late frame"})
        tb = await b.get_thread(ta.thread_id)
        async with asyncio.timeout(GUARD):
            while (await tb.get_run(run_id)).status is not EffectStatus.COMPLETED:
                await asyncio.sleep(0.02)
        # c has b's frames 2 and 3 and holds them: 1 is missing.
        await until(lambda: (o := c.cluster._order.get(ta.thread_id)) is not None  # type: ignore[union-attr]
                    and {2, 3} <= set(o.buffer), "b's frames on c")
        assert on_c.pending == 0 and on_b.pending == 0  # nothing delivered out of order
        gate.set()
        got_c, got_b = await take(on_c, 3), await take(on_b, 3)
    for got in (got_c, got_b):
        assert [e.seq for e in got] == [1, 2, 3]
        assert changes(got) == ["scheduled", "started", "completed"]


async def test_every_threads_stream_gets_a_runs_scheduled_frame_before_its_start_on_every_node(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, for the subscribers of every thread's run changes (`WS /api/stream`).

    a schedules (its relay held) and b runs the run: the frames of b (2, 3) reach a and c
    before a's own scheduled frame (1). Before, the subscribers of every thread got each
    frame as it came: ``started`` and ``completed`` before ``scheduled``, on a and on c.
    """
    monkeypatch.setattr(cluster, "GAP_WAIT_SECONDS", GUARD)
    fast = {"cluster_wake_grace_seconds": 0.1}
    async with node(pg_url, tmp_path, "a", max_concurrent_runs=0, **fast) as a, \
            node(pg_url, tmp_path, "b", **fast) as b, \
            node(pg_url, tmp_path, "c", max_concurrent_runs=0, **fast) as c:
        assert a.cluster is not None and c.cluster is not None
        ta = await a.create_thread()
        all_a, all_b, all_c = a.subscribe_runs(), b.subscribe_runs(), c.subscribe_runs()
        gate = hold_appends(a)
        run_id = await ta.schedule_effect("note", {"text": "late frame"})
        tb = await b.get_thread(ta.thread_id)
        async with asyncio.timeout(GUARD):
            while (await tb.get_run(run_id)).status is not EffectStatus.COMPLETED:
                await asyncio.sleep(0.02)
        for rt in (a, c):  # b's frames 2 and 3 are held there: 1 is missing
            await until(lambda rt=rt: (o := rt.cluster._order.get(ta.thread_id)) is not None
                        and {2, 3} <= set(o.buffer), "b's frames held")
        assert all_a.pending == 0 and all_c.pending == 0  # nothing delivered out of order
        gate.set()
        got = [await take(sub, 3) for sub in (all_a, all_b, all_c)]
    for events in got:
        assert [(e.thread_id, e.seq) for e in events] == [(ta.thread_id, n) for n in (1, 2, 3)]
        assert changes(events) == ["scheduled", "started", "completed"]


async def test_a_scheduled_frame_its_node_never_relays_is_skipped_after_the_wait(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """a's relay never writes the run's scheduled frame (seq 1) while b runs the run.

    c waits `GAP_WAIT_SECONDS` (short here), skips 1 (its client reloads), delivers 2 and 3;
    when 1 comes after all, it is dropped: the next frame c delivers is 4.
    """
    monkeypatch.setattr(cluster, "GAP_WAIT_SECONDS", 0.2)
    fast = {"cluster_wake_grace_seconds": 0.1}
    async with node(pg_url, tmp_path, "a", max_concurrent_runs=0, **fast) as a, \
            node(pg_url, tmp_path, "b", **fast) as b, \
            node(pg_url, tmp_path, "c", max_concurrent_runs=0, **fast) as c:
        ta = await a.create_thread()
        on_c = (await c.get_thread(ta.thread_id)).subscribe()
        gate = hold_appends(a)
        await ta.schedule_effect("note", {"text": "never relayed"})
        got = await take(on_c, 2)
        assert [e.seq for e in got] == [2, 3]
        assert changes(got) == ["started", "completed"]
        gate.set()  # 1 comes too late: dropped
        assert a.cluster is not None and await a.cluster.flush(GUARD)
        await (await b.get_thread(ta.thread_id)).schedule_effect("note", {"text": "x"}, 3600)
        after = await take(on_c, 1)
    assert [e.seq for e in after] == [4]
    assert changes(after) == ["scheduled"]


async def test_frames_missed_while_the_listening_connection_was_down_are_read_back(
    pg_url: str, tmp_path: Path,
) -> None:
    async with node(pg_url, tmp_path, "a") as a, node(pg_url, tmp_path, "b") as b:
        ta = await a.create_thread()
        sub = (await b.get_thread(ta.thread_id)).subscribe()
        await ta.schedule_effect("note", {"text": "before"}, 3600)
        first = await take(sub, 1)
        assert b.cluster is not None
        conn = b.cluster.bus._conn  # type: ignore[attr-defined]
        base, _ = split_schema(pg_url)
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        # While b reconnects, a keeps making changes; b hears some of them, or none.
        for i in range(5):
            await ta.schedule_effect("note", {"text": str(i)}, 3600)
        rest = await take(sub, 5)
    assert [e.seq for e in first + rest] == list(range(1, 7))


async def test_a_deleted_threads_subscribers_on_another_node_are_told_and_closed(
    pg_url: str, tmp_path: Path,
) -> None:
    async with node(pg_url, tmp_path, "a") as a, node(pg_url, tmp_path, "b") as b:
        ta = await a.create_thread()
        sub = (await b.get_thread(ta.thread_id)).subscribe()
        every = b.subscribe_runs()
        await ta.schedule_effect("note", {"text": "x"}, 3600)
        await take(sub, 1)
        await a.delete_thread(ta.thread_id)
        async with asyncio.timeout(GUARD):
            await sub.wait_closed()
        seen = await take(every, 2)
        # A thread deleted right after a change: the change's frame still comes first.
        for _ in range(3):
            tc = await a.create_thread()
            await tc.schedule_effect("note", {"text": "y"}, 3600)
            await a.delete_thread(tc.thread_id)
        later = await take(every, 6)
    assert [f["eventType"] for f in frames_of(seen)] == ["effect_changed", "thread_deleted"]
    assert [e.seq for e in seen] == [1, 2]
    assert [f["eventType"] for f in frames_of(later)] == [
        "effect_changed", "thread_deleted"] * 3


async def test_a_node_decodes_no_frames_of_its_own_nor_of_threads_it_has_no_subscriber_of(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import runtime.cluster as cluster
    from runtime.storage.base import decode_frames, frames_header

    decoded: list[str] = []

    def counting(payload: str) -> Any:
        decoded.append(payload)
        return decode_frames(payload)

    monkeypatch.setattr(cluster, "decode_frames", counting)
    async with node(pg_url, tmp_path, "a") as a, node(pg_url, tmp_path, "b") as b:
        assert a.cluster is not None
        quiet = await a.create_thread()  # nobody subscribes to it, on either node
        for i in range(20):
            await quiet.schedule_effect("note", {"text": str(i)}, 3600)
        assert await a.cluster.flush(GUARD)
        watched = await a.create_thread()
        on_b = (await b.get_thread(watched.thread_id)).subscribe()
        on_a = watched.subscribe()
        await watched.schedule_effect("note", {"text": "w"}, 3600)
        # The quiet thread's notifications reached b before the watched thread's one did.
        assert [e.seq for e in await take(on_b, 1)] == [1]
        assert [e.seq for e in await take(on_a, 1)] == [1]  # a: from its append's result
    # b decoded a's notification of the watched thread, once: a skipped its own unread;
    # neither decoded one that lists no thread it has a subscriber of.
    assert decoded
    assert len(set(decoded)) == len(decoded)
    for payload in decoded:
        sender, threads = frames_header(payload)
        assert sender == a.cluster.bus.sender
        assert watched.thread_id in threads


async def test_a_subscriber_arriving_mid_burst_gets_continuous_seq_from_its_first_frame(
    pg_url: str, tmp_path: Path,
) -> None:
    total = 120
    async with node(pg_url, tmp_path, "a") as a, node(pg_url, tmp_path, "b") as b:
        assert a.cluster is not None
        ta = await a.create_thread()
        tb = await b.get_thread(ta.thread_id)

        async def burst(start: int, stop: int) -> None:
            for i in range(start, stop):
                await (ta if i % 3 else tb).schedule_effect("note", {"text": str(i)}, 3600)

        for i in range(30):  # frames 1-30, all a's own, numbered before anyone subscribes
            await ta.schedule_effect("note", {"text": str(i)}, 3600)
        assert await a.cluster.flush(GUARD)
        rest = asyncio.create_task(burst(30, total))
        await asyncio.sleep(0)
        sub_a, sub_b = ta.subscribe(), tb.subscribe()
        await rest
        got: dict[str, list[int]] = {"a": [], "b": []}
        async with asyncio.timeout(GUARD):
            for name, sub in (("a", sub_a), ("b", sub_b)):
                async for event in sub:
                    got[name].append(event.seq)
                    if event.seq == total:
                        break
    for seqs in got.values():
        assert seqs == list(range(seqs[0], total + 1))
    assert got["a"][0] > 30  # frames 1-30 went to a's subscribers before this one came


async def test_a_run_due_now_starts_on_another_node_when_its_own_cannot_take_it(
    pg_url: str, tmp_path: Path,
) -> None:
    """The wake-up travels by NOTIFY: the poll is an hour away, so it cannot be the poll."""
    slow = {"cluster_poll_seconds": 3600.0, "cluster_wake_grace_seconds": 0.5}
    async with node(pg_url, tmp_path, "a", max_concurrent_runs=1, **slow) as a, \
            node(pg_url, tmp_path, "b", **slow) as b:
        assert a.cluster is not None and b.cluster is not None
        await (await a.create_thread()).schedule_effect("hold", {"key": "k"})
        # a's one worker is taken
        await until(lambda: any(x.current_run for x in a.actors.open_actors()), "hold")
        ta = await a.create_thread()
        run_id = await ta.schedule_effect("note", {"text": "now"})
        tb = await b.get_thread(ta.thread_id)
        async with asyncio.timeout(GUARD):
            while (await tb.get_run(run_id)).status is not EffectStatus.COMPLETED:
                await asyncio.sleep(0.02)
        assert b.cluster.polls == 1  # only the one at start: the wake-up did it
        assert b.cluster.wakeups_armed >= 1
        release(a, "k")


async def test_a_run_a_clean_shutdown_requeues_starts_on_another_node_by_its_wake_up(
    pg_url: str, tmp_path: Path,
) -> None:
    """The re-queue announces the run: the poll is an hour away, so it cannot be the poll."""
    slow = {"cluster_poll_seconds": 3600.0, "cluster_wake_grace_seconds": 0.5}
    async with node(pg_url, tmp_path, "b", **slow) as b:
        a = Runtime(data_dir=tmp_path / "a", app_dir=SERVER_APP, load_packages=False,
                    storage=PostgresBackend(pg_url), node_id="node-a",
                    shutdown_grace_seconds=0.1, **slow)
        await a.start()
        try:
            ta = await a.create_thread()
            run_id = await ta.schedule_effect("hold", {"key": "stays"})
            await until(lambda: any(x.current_run for x in a.actors.open_actors()), "hold")
            await b.cluster.poll()  # b knows a is alive (a wake-up's sender gets the grace)
        finally:
            await a.close()  # the run is re-queued: pending, due now
        assert b.cluster is not None
        tb = await b.get_thread(ta.thread_id)
        async with asyncio.timeout(GUARD):
            while (await tb.get_run(run_id)).status is not EffectStatus.RUNNING:
                await asyncio.sleep(0.02)
        first, second = await tb.get_run_attempts(run_id)
        assert (first.node_id, first.outcome) == ("node-a", "interrupted")
        assert first.error == "node node-a shut down before it ended"
        assert (second.node_id, second.outcome) == ("node-b", "running")
        assert b.cluster.polls == 2  # the one at start and ours: the wake-up did it
        release(b, "stays")


async def test_a_lost_wake_up_only_delays_the_run_until_the_poll(
    pg_url: str, tmp_path: Path,
) -> None:
    slow = {"cluster_poll_seconds": 3600.0, "cluster_wake_grace_seconds": 0.5}
    async with node(pg_url, tmp_path, "a", max_concurrent_runs=1, **slow) as a, \
            node(pg_url, tmp_path, "b", **slow) as b:
        assert a.cluster is not None and b.cluster is not None
        b.cluster.bus.unlisten("wake", b.cluster._on_wake)  # b hears no wake-up
        await (await a.create_thread()).schedule_effect("hold", {"key": "k2"})
        await until(lambda: any(x.current_run for x in a.actors.open_actors()), "hold")
        ta = await a.create_thread()
        run_id = await ta.schedule_effect("note", {"text": "later"})
        tb = await b.get_thread(ta.thread_id)
        await asyncio.sleep(0.3)
        assert (await tb.get_run(run_id)).status is EffectStatus.PENDING
        # b must know a is alive to rank itself; then its poll finds the alarm row.
        await b.cluster.poll()
        await a.cluster.poll()
        await b.cluster.poll()
        async with asyncio.timeout(GUARD):
            while (await tb.get_run(run_id)).status is not EffectStatus.COMPLETED:
                await asyncio.sleep(0.02)
        release(a, "k2")


@pytest.mark.parametrize("wake_by", ["announcement", "poll"])
async def test_a_node_that_found_the_thread_run_elsewhere_is_woken_again_later(
    pg_url: str, tmp_path: Path, wake_by: str,
) -> None:
    """b's drain of a thread that a runs claims nothing; b must still answer later wake-ups.

    a runs a ``hold`` of the thread while b schedules a run on it: b's drain finds the
    thread run by a (a runs that run next). Later a schedules another run on the thread
    while its one worker is taken by another thread: only b can run it, woken by the
    announcement or, with that lost, by its alarm poll.
    """
    slow = {"cluster_poll_seconds": 3600.0, "cluster_wake_grace_seconds": 0.5}
    async with node(pg_url, tmp_path, "a", max_concurrent_runs=1, **slow) as a, \
            node(pg_url, tmp_path, "b", **slow) as b:
        assert a.cluster is not None and b.cluster is not None
        ta = await a.create_thread()
        tid = ta.thread_id
        await ta.schedule_effect("hold", {"key": "first"})
        await until(lambda: any(x.current_run for x in a.actors.open_actors()), "hold")
        tb = await b.get_thread(tid)
        second = await tb.schedule_effect("note", {"text": "behind the hold"})
        # b woke the thread for the hold (announced by a: due + grace) or for its own
        # run: either way its drain found the thread run by a, which runs the second run
        # after the hold.
        await asyncio.sleep(1.0)
        await until(lambda: b.dispatcher.state(tid) is None, "b's drain")
        assert (await tb.get_run(second)).status is EffectStatus.PENDING
        release(a, "first")  # a runs the second run right after the hold
        async with asyncio.timeout(GUARD):
            while (await ta.get_run(second)).status is not EffectStatus.COMPLETED:
                await asyncio.sleep(0.02)
        # a's one worker is taken by another thread; the thread itself is free.
        await (await a.create_thread()).schedule_effect("hold", {"key": "other"})
        await until(lambda: any(x.current_run and x.thread_id != tid
                                for x in a.actors.open_actors()), "other hold")
        if wake_by == "poll":
            b.cluster.bus.unlisten("wake", b.cluster._on_wake)  # b hears no wake-up
        third = await ta.schedule_effect("note", {"text": "a cannot take it"})
        if wake_by == "poll":
            await asyncio.sleep(0.3)
            assert (await tb.get_run(third)).status is EffectStatus.PENDING
            await b.cluster.poll()
            await a.cluster.poll()
            await b.cluster.poll()
        async with asyncio.timeout(GUARD):
            while (await tb.get_run(third)).status is not EffectStatus.COMPLETED:
                await asyncio.sleep(0.02)
        attempts = await tb.get_run_attempts(third)
        release(a, "other")
    assert [x.node_id for x in attempts] == ["node-b"]


async def test_a_node_that_claims_no_run_is_never_ranked_to_wake_a_thread(
    pg_url: str, tmp_path: Path,
) -> None:
    """a claims nothing (an API front); b's one worker is taken; only c can run the run.

    The thread is one that a would rank first among the nodes other than b: the wake-up
    must reach c all the same (the poll is an hour away).
    """
    slow = {"cluster_poll_seconds": 3600.0, "cluster_wake_grace_seconds": 0.5}
    async with node(pg_url, tmp_path, "a", max_concurrent_runs=0, **slow) as a, \
            node(pg_url, tmp_path, "b", max_concurrent_runs=1, **slow) as b, \
            node(pg_url, tmp_path, "c", **slow) as c:
        assert a.cluster is not None and b.cluster is not None and c.cluster is not None
        for rt in (a, b, c):  # every node hears every other (a announces nothing)
            await rt.cluster.poll()
        na, nb, nc = a.cluster.node, b.cluster.node, c.cluster.node
        await until(lambda: {nb, nc} <= set(c.cluster.live_nodes()), "presence")
        await until(lambda: {nb, nc} <= set(b.cluster.live_nodes()), "presence")
        assert na not in c.cluster.live_nodes() and na not in b.cluster.live_nodes()
        await (await b.create_thread()).schedule_effect("hold", {"key": "busy"})
        await until(lambda: any(x.current_run for x in b.actors.open_actors()), "hold")
        while True:
            tb = await b.create_thread()
            if rank([na, nc], tb.thread_id)[0] == na:
                break
        run_id = await tb.schedule_effect("note", {"text": "c runs it"})
        async with asyncio.timeout(GUARD):
            while (await tb.get_run(run_id)).status is not EffectStatus.COMPLETED:
                await asyncio.sleep(0.02)
        attempts = await tb.get_run_attempts(run_id)
        release(b, "busy")
    assert [x.node_id for x in attempts] == ["node-c"]


async def test_a_run_scheduled_on_a_node_that_claims_none_wakes_a_claiming_node_at_due(
    pg_url: str, tmp_path: Path,
) -> None:
    """f claims nothing (an API front); w is the only node that claims.

    f's runs are never f's to take, so w must not leave f a grace (an hour here; the poll
    is an hour away too): scheduled with no delay, run now and replayed through f, each
    run completes on w.
    """
    slow = {"cluster_poll_seconds": 3600.0, "cluster_wake_grace_seconds": 3600.0}
    async with node(pg_url, tmp_path, "f", max_concurrent_runs=0, **slow) as f, \
            node(pg_url, tmp_path, "w", **slow) as w:
        assert f.cluster is not None and w.cluster is not None
        await w.cluster.poll()
        tf = await f.create_thread()
        tw = await w.get_thread(tf.thread_id)

        async def completed(run_id: str) -> None:
            async with asyncio.timeout(GUARD):
                while (await tw.get_run(run_id)).status is not EffectStatus.COMPLETED:
                    await asyncio.sleep(0.02)

        now = await tf.schedule_effect("note", {"text": "now"})
        await completed(now)
        later = await tf.schedule_effect("note", {"text": "in an hour"}, 3600)
        await until(lambda: w.dispatcher.state(tf.thread_id) is None, "w's drain")
        await tf.run_now(later)
        await completed(later)
        again = await tf.replay(now)
        await completed(again)
        for run_id in (now, later, again):
            attempts = await tw.get_run_attempts(run_id)
            assert [x.node_id for x in attempts] == ["node-w"]
        assert f.cluster.wakeups_armed == 0


async def test_a_node_keeps_timers_only_for_the_alarms_due_within_its_horizon(
    pg_url: str, tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with node(pg_url, tmp_path, "a", clock=clock) as a:
        for i in range(4):
            await (await a.create_thread()).schedule_effect("note", {"text": "x"},
                                                            10 if i == 0 else 3600)
    clock2 = FakeClock(clock.now())
    async with node(pg_url, tmp_path, "b", clock=clock2, alarm_horizon_seconds=60.0,
                    cluster_poll_seconds=3600.0) as b:
        assert b.cluster is not None
        assert b.alarms.armed_count == 1  # only the one due within 60 s
        clock2.advance(3590)
        await b.cluster.poll()
        assert b.alarms.armed_count == 4


def test_two_server_processes_a_client_on_one_sees_every_frame_made_through_the_other(
    pg_url: str, tmp_path: Path,
) -> None:
    def start(name: str) -> tuple[subprocess.Popen[bytes], str, Path]:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = tmp_path / f"{name}.log"
        env = {**os.environ, "THREAD_EFFECTS_DATABASE_URL": pg_url,
               "THREAD_EFFECTS_NODE_ID": f"node-{name}", "THREAD_EFFECTS_PORT": str(port),
               "THREAD_EFFECTS_DATA_DIR": str(tmp_path / name),
               "THREAD_EFFECTS_CLUSTER_POLL_SECONDS": "3600"}
        env.pop("THREAD_EFFECTS_API_TOKEN", None)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "server.py", "--app-dir", str(SERVER_APP), "--no-packages"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        return proc, f"127.0.0.1:{port}", log

    def ready(proc: subprocess.Popen[bytes], addr: str, log: Path) -> None:
        deadline = time.monotonic() + GUARD
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://{addr}/api/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    def scenario() -> tuple[list[dict[str, Any]], list[str]]:
        (pa, a, la), (pc, c, lc) = start("a"), start("c")
        try:
            ready(pa, a, la)
            ready(pc, c, lc)
            tid = httpx.post(f"http://{a}/api/threads", json={}).json()["id"]
            frames: list[dict[str, Any]] = []
            with ws_connect(f"ws://{c}/api/threads/{tid}/stream", open_timeout=GUARD) as ws:
                time.sleep(0.2)  # the server subscribes as it accepts
                run_ids = [
                    httpx.post(f"http://{a}/api/threads/{tid}/effects",
                               json={"name": "note", "args": {"text": str(i)}}).json()["id"]
                    for i in range(5)
                ]
                while len(frames) < 15:
                    frames.append(json.loads(ws.recv(timeout=GUARD)))
            return frames, run_ids
        finally:
            for proc in (pa, pc):
                proc.terminate()
                proc.wait(timeout=GUARD)

    frames, run_ids = scenario()
    assert [f["seq"] for f in frames] == list(range(1, 16))
    assert {f["data"]["id"] for f in frames} == set(run_ids)
    assert sorted(f["data"]["change"] for f in frames) == sorted(
        ["scheduled", "started", "completed"] * 5)


@pytest.fixture(autouse=True)
def _needs_postgres(pg_url: str) -> None:
    """Every test here runs against the session's PostgreSQL database."""


async def test_frames_reach_a_subscriber_right_after_start_while_the_bus_is_slow_to_listen(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A slow listening connection (a loaded server): frames announced before LISTEN took
    # effect would be lost to a subscriber that has no frame of its thread yet.
    from runtime.storage import pg_bus

    listen_new = pg_bus.PostgresClusterBus._listen_new

    def slow(self: Any, conn: Any) -> None:
        time.sleep(0.5)
        listen_new(self, conn)

    monkeypatch.setattr(pg_bus.PostgresClusterBus, "_listen_new", slow)
    rt = Runtime(data_dir=tmp_path / "a", app_dir=SERVER_APP, load_packages=False,
                 storage=PostgresBackend(pg_url), node_id="node-a", clock=FakeClock())
    await rt.start()  # no flush of the bus here: start() is all a user calls
    try:
        thread = await rt.create_thread()
        sub = thread.subscribe()
        run_id = await thread.schedule_effect("note", {"text": "x"}, 3600)
        assert await thread.remove_scheduled_effect(run_id)
        events = await take(sub, 2)
        assert [e.to_frame()["data"]["change"] for e in events] == ["scheduled", "canceled"]
        sub.close()
    finally:
        await rt.close()


async def test_a_database_blink_makes_the_alarm_poll_warn_once_and_go_on(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runtime.errors import DatabaseUnavailable

    async with node(pg_url, tmp_path, "a", cluster_poll_seconds=0.05) as a:
        cluster = a.cluster
        assert cluster is not None and cluster._store is not None
        store = cluster._store
        real = store.load_alarms
        failures = 0

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            nonlocal failures
            failures += 1
            raise DatabaseUnavailable("PoolTimeout: couldn't get a connection (test)")

        caplog.set_level("INFO", logger="runtime")
        caplog.set_level("INFO", logger="asyncio")
        monkeypatch.setattr(store, "load_alarms", unavailable)
        # The poll loop fails, and so does the poll made when the bus reconnects.
        cluster._wake_listening = True
        before = set(cluster._tasks)
        cluster._on_wake_reconnect()
        tasks = [t for t in cluster._tasks if t not in before]
        assert tasks
        await until(lambda: failures >= 4, "the poll retried")
        await asyncio.wait(tasks, timeout=GUARD)
        assert all(not t.cancelled() and t.exception() is None for t in tasks)
        monkeypatch.setattr(store, "load_alarms", real)
        polls = cluster.polls
        await until(lambda: cluster.polls > polls + 1, "the poll went on")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
              and "alarm poll" in r.getMessage()]
    # One line for the loop however many retries, one for the poll after the reconnect.
    assert len([m for m in warned if "retrying with backoff" in m]) == 1, warned
    assert len([m for m in warned if "after the bus reconnected" in m]) == 1, warned
    assert not [r for r in caplog.records if r.levelname == "ERROR" or r.exc_info]


async def test_a_run_scheduled_on_a_node_with_a_stale_alarm_belief_is_claimed_elsewhere(
    pg_url: str, tmp_path: Path,
) -> None:
    """b believes the thread's alarm row early; another node's compare-and-set raised it.

    b (which claims no run) schedules a run due soon: its belief says the row is already
    at or before the run, yet the row must end at or before it, so that a (deaf to the
    wake-up) finds the run by its alarm poll. Before, b wrote no row and a never saw it.
    """
    slow = {"cluster_poll_seconds": 3600.0, "cluster_wake_grace_seconds": 0.2}
    async with node(pg_url, tmp_path, "a", **slow) as a, \
            node(pg_url, tmp_path, "b", max_concurrent_runs=0, **slow) as b:
        assert a.cluster is not None and b.cluster is not None
        a.cluster.bus.unlisten("wake", a.cluster._on_wake)  # a hears no wake-up
        tb = await b.create_thread()  # b believes the row at the thread's creation
        tid = tb.thread_id
        store = a._store
        assert store is not None
        [(_, created)] = [r for r in await a.run_sync(store.load_alarms) if r[0] == tid]
        # Another node's flush raises the row far past the horizon (it knew no run).
        far = a.clock.now() + 7200
        assert await a.run_sync(store.move_alarms, [(tid, created, far)]) == [(tid, far)]
        run_id = await tb.schedule_effect("note", {"text": "found by the poll"}, 0.5)
        rows = dict(await a.run_sync(store.load_alarms))
        run = await tb.get_run(run_id)
        assert rows[tid] <= run.run_at.timestamp() + 1e-6  # run_at: whole microseconds
        await asyncio.sleep(0.8)  # due, and overdue by more than the grace
        await a.cluster.poll()
        async with asyncio.timeout(GUARD):
            while (await tb.get_run(run_id)).status is not EffectStatus.COMPLETED:
                await asyncio.sleep(0.02)
        attempts = await tb.get_run_attempts(run_id)
    assert [x.node_id for x in attempts] == ["node-a"]


async def test_a_frame_that_cannot_be_rendered_is_dropped_and_the_relay_goes_on(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="runtime")
    async with node(pg_url, tmp_path, "a") as a, node(pg_url, tmp_path, "b") as b:
        assert a.cluster is not None
        ta, tother = await a.create_thread(), await a.create_thread()
        on_b = (await b.get_thread(ta.thread_id)).subscribe()
        other_on_b = (await b.get_thread(tother.thread_id)).subscribe()
        on_a = ta.subscribe()
        # A run no datetime can show (a NaN due time): its frame raises as it is rendered.
        broken = EffectRun(id="0" * 32, thread_id=ta.thread_id, name="note",
                           status=EffectStatus.PENDING, args=None,
                           run_at_ts=float("nan"), created_at_ts=0.0)
        gate = hold_appends(a)  # the broken frame and the next ones go in one batch
        a.cluster.send(EffectChanged(thread_id=ta.thread_id, seq=0,
                                     change=RunChange.SCHEDULED, run=broken))
        later = await ta.schedule_effect("note", {"text": "later"}, 3600)
        other = await tother.schedule_effect("note", {"text": "other"}, 3600)
        gate.set()
        got_b, got_other, got_a = (
            await take(on_b, 1), await take(other_on_b, 1), await take(on_a, 1))
    assert [(f["seq"], f["data"]["id"]) for f in frames_of(got_b)] == [(1, later)]
    assert frames_of(got_a) == frames_of(got_b)
    assert [f["data"]["id"] for f in frames_of(got_other)] == [other]
    dropped = [r.getMessage() for r in caplog.records if "cannot be rendered" in r.getMessage()]
    assert len(dropped) == 1 and ta.thread_id in dropped[0], dropped


async def test_an_idle_threads_alarm_row_goes_once_it_cooled_though_the_poll_finds_it_overdue(
    pg_url: str, tmp_path: Path
) -> None:
    """A thread that ran is warm: its row stays overdue for a while, and every alarm poll
    drains the thread. Those drains find nothing and do not make it warm again: the row
    goes once the thread cooled, and the polls stop draining it."""
    url, schema = split_schema(pg_url)
    async with node(pg_url, tmp_path, "a", cluster_poll_seconds=0.1) as a:
        a.alarms._keep = 1.0  # a thread cools 1 s after its last run here (60 s by default)
        drains: list[str] = []
        real = a.executor.drain

        async def drain(actor: Any) -> bool:
            drains.append(actor.thread_id)
            return bool(await real(actor))

        a.executor.drain = drain  # type: ignore[method-assign]
        thread = await a.create_thread("idle")
        run_id = await thread.schedule_effect("ping", {})
        await until(lambda: drains.count("idle") >= 1, "the run's drain")
        await a.wait_idle()
        assert (await thread.get_run(run_id)).status is EffectStatus.COMPLETED

        def rows() -> list[tuple[Any, ...]]:
            with psycopg.connect(url, autocommit=True,
                                 options=f"-c search_path={schema}") as conn:
                return conn.execute(
                    "SELECT due_at FROM alarms WHERE thread_id = 'idle'").fetchall()

        async with asyncio.timeout(GUARD):
            while await asyncio.to_thread(rows):
                await asyncio.sleep(0.1)
        # Gone, and the polls no longer drain the thread.
        seen = drains.count("idle")
        await asyncio.sleep(1.0)  # ten polls
        assert drains.count("idle") == seen
