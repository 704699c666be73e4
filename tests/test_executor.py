"""A thread's drain on SQLite with ``synchronous=FULL``: group commit of its outcomes.

A drain records run k's outcome and claims run k+1 in one transaction; on a FULL store
that commit may skip its own disk flush, as long as nothing of it is seen before a flush
makes it durable: its frames wait, in order, and every read of the store flushes first.
These tests count the flushes of a drain and check, frame by frame, that each outcome a
listener or a subscriber saw was durable when it saw it.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime import EffectStatus, Runtime, ThreadState
from runtime import executor as executor_module
from runtime.events import EffectChanged, ThreadEvent
from runtime.testing import FakeClock
from tests.conftest import release

APP = Path(__file__).parent / "apps" / "scheduling"
_OUTCOME = re.compile(r"^UPDATE effect_runs SET status = '(\w+)'.* WHERE id = '([^']+)'")


class Durability:
    """What reached the disk of one thread file, as its connection and `os.fdatasync` saw.

    A run's outcome is *recorded* when the transaction that wrote it commits, and
    *durable* once a commit at ``synchronous=FULL`` that wrote, or a flush of the file,
    follows (WAL is append-only: one flush syncs every commit before it).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.level = int(conn.execute("PRAGMA synchronous").fetchone()[0])
        self.in_tx: list[str] = []
        self.recorded: list[str] = []  # committed, not durable yet
        self.durable: set[str] = set()
        self.flushes = 0  # commits that synced, and fdatasyncs
        self.frames: list[tuple[str, str]] = []  # (run id, change) as listeners saw them
        self.seen_early: list[str] = []  # outcomes seen before they were durable

    def trace(self, sql: str) -> None:
        if sql.startswith("PRAGMA synchronous="):
            self.level = {"FULL": 2, "NORMAL": 1}[sql.split("=")[1]]
            return
        found = _OUTCOME.match(sql)
        if found is not None and found.group(1) != "running":
            self.in_tx.append(found.group(2))
        elif sql == "COMMIT":
            self.recorded += self.in_tx
            self.in_tx = []
            if self.level == 2:
                self.sync()
        elif sql == "ROLLBACK":
            self.in_tx = []

    def sync(self) -> None:
        self.flushes += 1
        self.durable.update(self.recorded)
        self.recorded = []

    def listen(self, event: ThreadEvent) -> None:
        if isinstance(event, EffectChanged):
            self.frames.append((event.run.id, str(event.change)))
            if event.change != "started" and event.run.id not in self.durable:
                self.seen_early.append(event.run.id)


@contextmanager
def watched(rt: Runtime, tid: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Durability]:
    """Watch the thread's file: its commits, the flushes of its WAL, the frames."""
    actor = rt.actors._open[tid]  # opened by the schedules before
    conn: sqlite3.Connection = actor.store._conn  # type: ignore[attr-defined]
    seen = Durability(conn)
    fdatasync: Callable[[int], None] = os.fdatasync

    def counted(fd: int) -> None:
        fdatasync(fd)
        seen.sync()

    monkeypatch.setattr(os, "fdatasync", counted)
    conn.set_trace_callback(seen.trace)
    rt.hub.add_listener(seen.listen)
    try:
        yield seen
    finally:
        rt.hub.remove_listener(seen.listen)
        conn.set_trace_callback(None)


async def burst(rt: Runtime, n: int) -> tuple[Any, list[str]]:
    """A paused thread with ``n`` runs of ``ping`` due now (resume it to drain them)."""
    thread = await rt.create_thread("t")
    await thread.pause()
    ids = [(await thread.schedule("ping")).run_id for _ in range(n)]
    return thread, ids


@pytest.mark.parametrize("n", [1, 70, 100, 250])
async def test_a_drain_of_n_due_runs_flushes_once_per_group_and_shows_only_durable_outcomes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    # Only the bound of runs ends a group here (not the time bound: a slow machine).
    monkeypatch.setattr(executor_module, "GROUP_COMMIT_SECONDS", 3600.0)
    bound = executor_module.GROUP_COMMIT_RUNS
    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=FakeClock(),
                       synchronous="FULL", load_packages=False) as rt:
        thread, ids = await burst(rt, n)
        sub = thread.subscribe()
        with watched(rt, "t", monkeypatch) as seen:
            await thread.resume()
            await rt.wait_idle()
        page = await thread.list_runs(limit=500)
        assert {r.status for r in page.runs} == {EffectStatus.COMPLETED}
        assert len(page.runs) == n and all(r.attempts == 1 for r in page.runs)
        # On every commit of its own, 100 runs would be 100 flushes. A drain runs at most
        # DRAIN_BATCH runs (then the thread's next drain goes on).
        batch = executor_module.DRAIN_BATCH
        drains = [min(batch, n - k) for k in range(0, n, batch)]
        assert seen.flushes <= sum(math.ceil(d / bound) + 1 for d in drains), seen.flushes
        assert seen.seen_early == []
        assert seen.recorded == [] and seen.durable == set(ids)
        # In order: each run started, then ended, before the next one started.
        expected = [(i, c) for i in ids for c in ("started", "completed")]
        assert seen.frames == expected
        events = [e for e in sub.take() if isinstance(e, EffectChanged)]
        sub.close()
        assert [(e.run.id, str(e.change)) for e in events] == expected
        assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + 2 * n))


async def test_a_read_during_a_group_flushes_first_and_a_slow_run_does_not_hold_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The time bound: the outcome before a slow run is delivered while that run runs.
    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=FakeClock(),
                       synchronous="FULL", load_packages=False) as rt:
        thread = await rt.create_thread("t")
        await thread.pause()
        first = (await thread.schedule("ping")).run_id
        slow = (await thread.schedule("hold", {"key": "g"})).run_id
        gates: dict[str, asyncio.Event] = rt.registry.app["hold"].fn.__globals__["GATES"]
        sub = thread.subscribe()
        with watched(rt, "t", monkeypatch) as seen:
            await thread.resume()
            async with asyncio.timeout(20):  # a hang guard
                got: list[tuple[str, str]] = []
                while (slow, "started") not in got:
                    got += [(e.run.id, str(e.change)) for e in await sub.next_batch()
                            if isinstance(e, EffectChanged)]
            assert got == [(first, "started"), (first, "completed"), (slow, "started")]
            # Seen by a reader while the slow run runs: durable.
            assert (await thread.get_run(first)).status is EffectStatus.COMPLETED
            assert first in seen.durable and seen.seen_early == []
            gates.setdefault("g", asyncio.Event()).set()
            await rt.wait_idle()
        sub.close()
        assert (await thread.get_run(slow)).status is EffectStatus.COMPLETED
        assert seen.seen_early == [] and seen.recorded == []



async def test_a_concurrent_run_in_a_burst_keeps_the_in_line_order_and_the_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A due run of a concurrent effect starts beside the in-line runs (its claim without
    # a finish, its outcome durable on its own, `_run_side`): its frames wait behind the
    # held ones, the in-line runs keep their order, nothing is seen early.
    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=FakeClock(),
                       synchronous="FULL", load_packages=False) as rt:
        thread = await rt.create_thread("t")
        await thread.pause()
        before = [(await thread.schedule("ping")).run_id for _ in range(20)]
        beside = (await thread.schedule("long_work", {"key": "w"})).run_id
        after = [(await thread.schedule("ping")).run_id for _ in range(20)]
        gates: dict[str, asyncio.Event] = rt.registry.app["long_work"].fn.__globals__["GATES"]
        gates.setdefault("w", asyncio.Event()).set()  # it ends as soon as it starts
        sub = thread.subscribe()
        with watched(rt, "t", monkeypatch) as seen:
            await thread.resume()
            await rt.wait_idle()
        page = await thread.list_runs(limit=500)
        assert {r.status for r in page.runs} == {EffectStatus.COMPLETED}
        assert seen.seen_early == [] and seen.recorded == []
        in_line = [f for f in seen.frames if f[0] != beside]
        assert in_line == [(i, c) for i in before + after for c in ("started", "completed")]
        assert [c for i, c in seen.frames if i == beside] == ["started", "completed"]
        events = [e for e in sub.take() if isinstance(e, EffectChanged)]
        sub.close()
        assert [(e.run.id, str(e.change)) for e in events] == seen.frames
        assert [e.seq for e in events] == list(range(events[0].seq,
                                                     events[0].seq + len(events)))


def hold_fdatasync(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make every ``os.fdatasync`` wait for ``go``; ``entered`` is set once one waits."""
    entered, go = threading.Event(), threading.Event()
    fdatasync = os.fdatasync

    def slow(fd: int) -> None:
        entered.set()
        go.wait(30)
        fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    return entered, go


async def thread_with_held_flushes(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> tuple[ThreadState, threading.Event, threading.Event]:
    """Thread ``t``, which ran one run already, then every flush held (`hold_fdatasync`)."""
    thread = await rt.create_thread("t")
    await thread.schedule("ping")
    await rt.wait_idle()
    entered, go = hold_fdatasync(monkeypatch)
    return thread, entered, go


async def test_a_run_does_not_wait_for_the_disk_flush_of_the_outcome_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A drain whose last outcome waits for its flush has ended: the thread's next run is
    # claimed and started meanwhile; the outcome's frame still waits for the flush.
    async with Runtime(app_dir=APP, data_dir=tmp_path, synchronous="FULL",
                       load_packages=False) as rt:
        thread, entered, go = await thread_with_held_flushes(rt, monkeypatch)
        sub = thread.subscribe()
        frames: list[tuple[str, str]] = []

        def take() -> None:
            frames.extend((e.run.id, str(e.change)) for e in sub.take()
                          if isinstance(e, EffectChanged))

        try:
            first = (await thread.schedule("ping")).run_id
            assert await asyncio.to_thread(entered.wait, 30)  # its outcome is being flushed
            second = (await thread.schedule("hold", {"key": "b"})).run_id
            log = tmp_path / "hold.log"
            async with asyncio.timeout(30):  # a hang guard
                while not (log.exists() and "b started" in log.read_text()):
                    await asyncio.sleep(0.01)
            take()
            assert (first, "completed") not in frames  # not durable yet: not shown
        finally:
            go.set()
        release(rt, "b")
        await rt.wait_idle()
        take()
        sub.close()
        assert [f for f in frames if f[1] != "scheduled"] == [
            (first, "started"), (first, "completed"), (second, "started"), (second, "completed")
        ]


async def test_a_shutdown_sends_the_frames_of_outcomes_still_being_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = Runtime(app_dir=APP, data_dir=tmp_path, synchronous="FULL", load_packages=False)
    await rt.start()
    try:
        thread, entered, go = await thread_with_held_flushes(rt, monkeypatch)
        sub = thread.subscribe()
        run = (await thread.schedule("ping")).run_id
        assert await asyncio.to_thread(entered.wait, 30)  # its outcome is being flushed
        closing = asyncio.create_task(rt.close())
        await asyncio.sleep(0.05)
    finally:
        go.set()
    await closing
    frames = [(e.run.id, str(e.change)) for e in sub.take() if isinstance(e, EffectChanged)]
    assert (run, "completed") in frames


async def test_a_schedule_made_while_an_outcome_is_flushed_is_shown_once_that_flush_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its frame waits behind the flushing group; it is not left for the group's timer.
    async with Runtime(app_dir=APP, data_dir=tmp_path, synchronous="FULL",
                       load_packages=False) as rt:
        thread, entered, go = await thread_with_held_flushes(rt, monkeypatch)
        sub = thread.subscribe()
        try:
            await thread.schedule("ping")
            assert await asyncio.to_thread(entered.wait, 30)
            later = (await thread.schedule("ping", delay=3600)).run_id
        finally:
            go.set()
        await rt.wait_idle()
        frames = [(e.run.id, str(e.change)) for e in sub.take()
                  if isinstance(e, EffectChanged)]
        sub.close()
        assert frames[-1] == (later, "scheduled")
