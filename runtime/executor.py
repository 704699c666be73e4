"""How a run is executed: a thread's drain, and one effect call.

A drain (one worker, one thread) repeats, under the thread's lock: record the outcome of
the previous run and claim the next due one in one transaction (status ``running``,
``attempts + 1``); then, without the lock, validate the claimed run's args against the
effect's schema as it is now, call the effect (sync ones in a worker thread) within its
``timeout_seconds``, and turn whatever happened into the outcome to record. When nothing
is due, the thread's alarm is set to its next pending run (or removed). An effect that
raises is ``failed`` with its error text and never run again; a run interrupted by the
thread's deletion or by shutdown is left for recovery (``pending`` again, at most
`runtime.config.MAX_ATTEMPTS` attempts). So is a run whose effect raised because the
runtime refused a call while shutting down (`RuntimeClosed`): a shutdown never fails a run.
Nor does an outage: a run whose effect raised because the runtime's own database could not
be reached (`DatabaseUnavailable`, or a `ThreadStorageError` marked ``unavailable``, in the
error or its causes) is re-queued at once under the same attempt rule, its attempt ended
``interrupted`` with the reason; the re-queue is retried like any outcome until the store
answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, cast

import anyio.to_thread
from pydantic import ValidationError

from runtime.abc import RunSync
from runtime.actors import ActorState, ThreadActor
from runtime.alarms import AlarmIndex
from runtime.config import MAX_ATTEMPTS, RetentionPolicy
from runtime.discovery import EffectRegistry
from runtime.effects import EffectDefinition, EffectRun, EffectStatus
from runtime.errors import (
    EffectNotFound,
    RunStateError,
    RuntimeClosed,
    RuntimeStorageError,
    ThreadStorageError,
    database_unreachable,
    in_chain,
)
from runtime.events import RunChange
from runtime.frames import ChangeHub
from runtime.pacing import TurnBudget
from runtime.schedules import fire_due, publish_fires
from runtime.storage.base import Finish, ThreadInfo, ThreadStore
from runtime.telemetry import end_run_span, run_span
from runtime.watchdog import describe_tool

_Claimed = tuple[EffectRun | None, EffectRun | None, float | None]
"""What `ThreadStore.finish_and_claim` answers: (finished, claimed, next due)."""

log = logging.getLogger("runtime")

DRAIN_BATCH = 100
"""Runs a worker executes for one thread before letting other due threads go first."""

GROUP_COMMIT_RUNS = 32
"""Outcomes a drain commits without a disk flush of their own at most (a group commit on a
`ThreadStore.group_commit` store): the 32nd commit of a group waits for the disk."""
GROUP_COMMIT_SECONDS = 0.1
"""How long the frames of a group commit are held at most (seconds since its first
outcome). In a burst on many threads a thread's next run comes tens of ms after its
last (the other threads' runs go between): a bound of 10 ms would end every group at
its first outcome."""
GROUP_COMMIT_SLOW_RUN_SECONDS = 0.01
"""A run in line that runs longer than this (seconds) has the frames held before it
flushed and delivered meanwhile: a slow run does not hold back the outcome before it."""

# A drain (or the recording of a concurrent run's outcome) that failed on a storage error
# is tried again after RETRY_FIRST_SECONDS, doubling up to RETRY_MAX_SECONDS.
RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0

MAX_ERROR_CHARS = 8192
"""A failed run's stored error is cut to this many UTF-8 bytes (it travels in every frame)."""

MAX_REASON_CHARS = 1000
"""Why an outage interrupted an attempt (stored as the attempt's error), cut to this many bytes."""


class _Held:
    """A thread's group commit in progress: frames held since ``since`` (loop time)."""

    __slots__ = ("runs", "since", "timer")

    def __init__(self, since: float, timer: asyncio.TimerHandle) -> None:
        self.since = since
        self.runs = 0  # outcomes committed in the group without a flush
        self.timer = timer


class _EffectTimeout(Exception):
    """An effect overran its ``timeout_seconds``."""


class _EffectAborted(Exception):
    """An effect raised SystemExit or KeyboardInterrupt (its message is the whole error)."""


IN_EFFECT: contextvars.ContextVar[bool] = contextvars.ContextVar("in_effect", default=False)
"""True inside effect code, where waiting for the runtime to go idle would wait forever."""

CURRENT_RUN: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "current_run", default=None
)
"""``(thread_id, run_id)`` of the run whose effect code is running here, else None."""


class EffectExecutor:
    """Drains threads: claims their due runs, calls the effects, records the outcomes.

    Args:
        registry: The effects by name, as discovered at start (read at each run).
        now: The clock's ``now``.
        hub: Where run changes are published.
        alarms: Set to the next pending run when a drain ends.
        run_sync: Runs a blocking call off the event loop.
        make_state: Builds the `runtime.thread.ThreadState` an effect gets, from the
            thread's registry entry and the effect's package id.
        stopping: Whether shutdown began (a drain then claims nothing more).
        retention: The policy finished runs are pruned by, in the transaction that
            records an outcome; None prunes nothing.
        wake: Queues a thread for a drain (called when its last run of a concurrent
            effect ended, so that its alarm is settled).
        shared: The storage is shared by several processes (`StorageBackend.exclusive`
            False): a thread's paused state may change elsewhere, so the claim's own
            check decides (`ThreadStore.claim_blocked`), not the actor's cached one.
        claim_inline: Tries a claim on the loop (`Runtime.claim_inline`): None when it
            is not cheap now; by default the store's `ThreadStore.claim_inline`.
    """

    def __init__(
        self,
        registry: Callable[[], EffectRegistry],
        now: Callable[[], float],
        hub: ChangeHub,
        alarms: AlarmIndex,
        run_sync: RunSync,
        make_state: Callable[[ThreadInfo, str | None], Any],
        stopping: Callable[[], bool],
        *,
        retention: RetentionPolicy | None = None,
        wake: Callable[[str], None] | None = None,
        shared: bool = False,
        known_elsewhere: Callable[[str], bool] | None = None,
        claim_inline: Callable[[ThreadStore, float], _Claimed | None] | None = None,
    ) -> None:
        self._registry = registry
        self._turn = TurnBudget()  # the loop turn's budget of the drains' steps
        self._claim_inline = claim_inline or (lambda store, now: store.claim_inline(now))
        self._known_elsewhere = known_elsewhere
        self._now = now
        self._hub = hub
        self._alarms = alarms
        self._run_sync = run_sync
        self._make_state = make_state
        self._stopping = stopping
        self._retention = retention
        self._wake = wake
        self._shared = shared
        self._abandoned: set[str] = set()  # run ids given up (the node lost its lease)
        self.up_since = -math.inf
        """When the runtime started (seconds, UTC): schedules' fire times before it passed
        while the process was down and are never counted as skipped."""
        self.paused_reasons: dict[str, str] = {}
        """Why the runtime paused a schedule (its effect is gone), by schedule id."""
        self._first_fire_check: dict[str, float] = {}
        """Per thread, when its drain first looked at its schedules in this process
        (seconds, UTC). Fire times at or before it came while the process was down or
        still starting, before any occurrence could be claimed here: never counted as
        skipped (a re-queued occurrence covers them). One float per thread drained."""
        self._cancels: dict[str, str] = {}  # run id -> who asked to cancel it
        # Runs whose effect code ended here, by id, with the outcome it decided, while the
        # run is still the actor's current or side run: a cancel no longer changes it.
        self._ended: dict[str, Finish] = {}
        self._side: set[asyncio.Task[None]] = set()  # concurrent runs executing now
        self._side_idle = asyncio.Event()
        self._side_idle.set()
        self._pokes: dict[str, asyncio.Event] = {}  # threads running a run in line
        self._held: dict[str, _Held] = {}  # threads whose frames wait for a flush
        self._flushes: set[asyncio.Task[None]] = set()  # flushes the timer started
        # The tasks running effect code now, for `describe_task` (the loop watchdog).
        self._running: dict[asyncio.Task[None], tuple[str, str, str]] = {}

    def describe_task(self, task: asyncio.Task[Any] | None) -> str:
        """What ``task`` is: an effect's own task, or one running a turn's tool.

        ``"effect f (thread t, run r)"``, or ``"tool t (thread x, turn run r)"``.

        Safe to call from another OS thread (the loop watchdog does).
        """
        if task is None:
            return "a callback of the event loop (not a task)"
        running = self._running.get(task)
        if running is None:
            return describe_tool(task) or f"task {task.get_name()!r}"
        name, thread_id, run_id = running
        return f"effect {name} (thread {thread_id}, run {run_id})"

    async def drain(self, actor: ThreadActor) -> bool:
        """Run the thread's due runs, one at a time, up to `DRAIN_BATCH`.

        A run of a concurrent effect (``define_effect(..., concurrent=True)``) is started
        in a task of its own, which records its outcome itself; the drain goes on.

        Returns:
            True if it stopped at the batch limit with work left (wake it again).

        Raises:
            ThreadStorageError: the thread's store failed.
        """
        thread_id = actor.thread_id
        if self._shared:
            # Another node may have changed the thread's schedules: read their next fire.
            actor.next_fire_known = False
        # An outcome a previous drain could not record (the store failed) goes first.
        finish: Finish | None = actor.unrecorded
        done = 0
        beside = bool(self._concurrent_names())  # the app has concurrent effects
        group = actor.store.group_commit
        while True:
            # Many drains ready in one loop turn (a burst on many threads): past the
            # turn's budget, the rest go on in later turns, with timers and sockets between.
            # Not a step that records a failure: a crash before that commit would re-queue
            # the run as interrupted, and a run that raised must never run again, so the
            # window between its raise and its commit holds no wait in line.
            if finish is None or finish.status is not EffectStatus.FAILED:
                await self._pace()
            async with actor.lock:
                if actor.deleted:
                    self._drop_held(thread_id)
                    return False
                stopping = self._stopping()
                # A paused thread starts nothing; its alarm row stays, and resuming
                # wakes it (`runtime.Runtime.resume_thread`). On a shared store another
                # process may have paused or resumed it: the claim checks the store.
                paused = actor.info.paused and not self._shared
                stop = stopping or paused or done >= DRAIN_BATCH
                try:
                    if finish is not None and _is_requeue(finish):
                        # Interrupted by an outage: pending again before anything else.
                        recorded = await self._record(actor, finish)
                        self._release_held(thread_id)  # a durable commit: all before it
                        self._publish_all(recorded)
                        finish = None
                    answer: _Claimed | None = None
                    if (not stop and finish is None and self._shared
                            and not actor.next_fire_known):
                        # A shared store (another node may have changed the schedules):
                        # their next fire and, unless one is due, the claim, in one trip
                        # to the storage pool (`_fire_or_claim`).
                        now = self._now()
                        self._first_fire_check.setdefault(thread_id, now)
                        actor.next_fire, answer = await self._run_sync(
                            _fire_or_claim, actor.store, now, self._retention)
                        actor.next_fire_known = True
                    if answer is None and not stop:
                        finish = await self._fire_schedules(actor, finish)
                        if actor.deleted:
                            self._drop_held(thread_id)
                            return False
                    if answer is None:
                        now = self._now()
                        # A claim alone is often cheap enough for the loop itself (SQLite:
                        # no fsync of its own); else, and with an outcome, a storage thread.
                        answer = (
                            self._claim_inline(actor.store, now)
                            if finish is None and not stop else None
                        )
                    # Group commit: an outcome followed by a claim need not wait for the
                    # disk; its frames (and every later one) are held until a flush.
                    durable = not (group and finish is not None and not stop
                                   and self._may_hold(thread_id))
                    inline = False
                    if answer is None and finish is not None and not durable:
                        # No fsync in it: on the loop when the store is free.
                        answer = actor.store.finish_inline(finish, now,
                                                           retention=self._retention)
                        inline = answer is not None
                    if answer is None:
                        answer = await self._run_sync(
                            partial(
                                actor.store.finish_and_claim,
                                claim=not stop,
                                retention=self._retention,
                                durable=durable,
                            ),
                            finish,
                            now,
                        )
                    finished, claimed, next_due = answer
                except ThreadStorageError:
                    # Kept in memory: recorded by the next drain, never run again.
                    actor.unrecorded = finish
                    await self._flush_held(actor)
                    raise
                actor.unrecorded = None
                actor.current_run = claimed
                if actor.deleted:
                    actor.current_run = None
                    self._drop_held(thread_id)
                    return False
                if finish is not None:
                    if durable or (claimed is None and not inline):
                        # Synced (an outcome that claims nothing is, `finish_and_claim`),
                        # and with it every commit before: what was held may be seen now.
                        self._release_held(thread_id)
                    else:
                        self._hold(actor)
                if finished is not None:
                    self._hub.publish(_change_of(finished), finished)
                if stop or claimed is None:
                    if stop:
                        await self._flush_held(actor)  # nothing stays held
                    elif thread_id in self._held:
                        self._flush_soon(actor)
                if stop:
                    # Let other due threads go first; come back to this one.
                    return not (stopping or paused)
                if claimed is None and actor.store.claim_blocked is not None:
                    # Paused elsewhere (resuming wakes it), another node runs the thread,
                    # or its next due run is of an effect only other nodes run: that
                    # node drains it on (its alarm poll finds the row), the alarm row
                    # stays meanwhile, and this node forgets its timer, so that a later
                    # wake-up arms it again.
                    await self._alarms.yielded(thread_id)
                    return False
                if claimed is None:
                    # Runs of concurrent effects still running hold the durable row
                    # at or before them; the last to end wakes the thread to lift it.
                    held = min((r.run_at_ts for r in actor.side_runs.values()), default=None)
                    await self._alarms.settle(thread_id, next_due, hold_row_at=held,
                                              active=done > 0 or finished is not None)
                    return False
                side = self._is_concurrent(claimed)
                if side:
                    actor.current_run = None
                    actor.side_runs[claimed.id] = claimed
            self._hub.publish(RunChange.STARTED, claimed)
            if side:
                # Beside the others: the drain goes on to the next due run at once.
                self._start_side(actor, claimed)
                finish = None
                done += 1
                continue
            slow = self._watch_slow_run(actor)
            try:
                if beside:
                    finish = await self._execute_beside(actor, claimed)
                else:
                    finish = await self.execute(actor, claimed)
            except Exception as exc:  # a bug of ours: still never leave the run running
                log.exception("run %s of thread %s: internal error", claimed.id, thread_id)
                finish = Finish(claimed.id, EffectStatus.FAILED,
                                f"Internal error running the effect: {error_text(exc)}",
                                self._now())
            finally:
                if slow is not None:
                    slow.cancel()
                self._ended.pop(claimed.id, None)
            actor.current_run = None
            if finish is None:  # interrupted: deletion, shutdown, or the lease was lost
                await self._flush_held(actor)
                return False
            # Decided, not recorded yet: until the next commit records it (under the
            # lock), a cancel finds it here and changes nothing (`cancel_running`, and
            # on a shared store `Runtime._cancel_in_store`).
            actor.unrecorded = finish
            done += 1

    async def _pace(self) -> None:
        """Wait for a later loop turn when this one's budget is spent (`TurnBudget`)."""
        if self._turn.spent():
            await self._turn.wait_turn()

    async def _fire_schedules(self, actor: ThreadActor, finish: Finish | None) -> Finish | None:
        """Fire the thread's due recurring schedules (with the actor lock held).

        The previous run's outcome is recorded first (when a schedule is due), so that
        its end time decides which fire times came while it was still running.

        Returns:
            The outcome still to record (None once it was recorded here).
        """
        now = self._now()
        # Fire times up to the thread's first look here are downtime, not skips: a
        # re-queued occurrence cannot have been claimed before this drain.
        up_since = max(self.up_since, self._first_fire_check.setdefault(actor.thread_id, now))
        if actor.next_fire_known and (actor.next_fire is None or actor.next_fire > now):
            return finish  # nothing due: no trip to the storage pool
        if not actor.next_fire_known:
            actor.next_fire = await self._run_sync(actor.store.next_schedule_fire)
            actor.next_fire_known = True
            # Answers of the storage threads come back together: many drains (a thread's
            # first, in a burst) would go on in this one turn.
            await self._pace()
            if actor.next_fire is None or actor.next_fire > now:
                return finish
        if finish is not None:
            recorded = await self._record(actor, finish)
            self._release_held(actor.thread_id)  # a durable commit: synced, all before it
            self._publish_all(recorded)
        actor.next_fire_known = False  # unknown if the fire fails
        fired, actor.next_fire = await self._run_sync(
            fire_due, actor.store, now, self._retention or RetentionPolicy(), up_since,
            self._known_effect,
        )
        actor.next_fire_known = True
        for schedule, *_ in fired:
            if schedule.paused_reason is not None:
                self.paused_reasons[schedule.id] = schedule.paused_reason
                log.warning(
                    "schedule %s of thread %s paused: its effect %s was not found (was its "
                    "file removed?); resume it once the effect exists again",
                    schedule.id, schedule.thread_id, schedule.name,
                )
        publish_fires(self._hub, fired)
        return None

    # -------------------------------------------------------------- group commit
    # A drain on a `ThreadStore.group_commit` store records an outcome and claims the next
    # run without waiting for the disk; the frames from then on (that outcome, the next
    # run's `started`, anything else of the thread) are held by the hub, in order, and
    # delivered after the flush that makes them durable: a durable commit (the group's
    # `GROUP_COMMIT_RUNS`th outcome, a commit that claims nothing or stops the drain), a
    # `ThreadStore.sync` when the drain ends otherwise, or a timer: the first held outcome
    # waited `GROUP_COMMIT_SECONDS`, or a run in line ran `GROUP_COMMIT_SLOW_RUN_SECONDS`.
    # Nothing is seen before it is durable: a power cut loses held outcomes only, whose
    # runs run again.

    def _may_hold(self, thread_id: str) -> bool:
        """Whether the next outcome of the thread may join its group (not end it)."""
        held = self._held.get(thread_id)
        if held is None:
            return True
        return (held.runs + 1 < GROUP_COMMIT_RUNS
                and asyncio.get_running_loop().time() - held.since < GROUP_COMMIT_SECONDS)

    def _hold(self, actor: ThreadActor) -> None:
        """An outcome was committed without a flush: hold the thread's frames from now on."""
        thread_id = actor.thread_id
        held = self._held.get(thread_id)
        if held is None:
            loop = asyncio.get_running_loop()
            self._hub.hold(thread_id)
            held = self._held[thread_id] = _Held(
                loop.time(), loop.call_later(GROUP_COMMIT_SECONDS, self._flush_soon, actor)
            )
        held.runs += 1

    def _watch_slow_run(self, actor: ThreadActor) -> asyncio.TimerHandle | None:
        """Before a run in line: flush what is held if the run is still going in 10 ms."""
        if actor.thread_id not in self._held:
            return None
        return asyncio.get_running_loop().call_later(
            GROUP_COMMIT_SLOW_RUN_SECONDS, self._flush_soon, actor)

    def _release_held(self, thread_id: str) -> None:
        """Every commit of the thread so far is durable: deliver its held frames."""
        held = self._held.pop(thread_id, None)
        if held is not None:
            held.timer.cancel()
            self._hub.release(thread_id)

    def _drop_held(self, thread_id: str) -> None:
        """The thread was deleted: its held frames are never delivered."""
        held = self._held.pop(thread_id, None)
        if held is not None:
            held.timer.cancel()

    async def _flush_held(self, actor: ThreadActor) -> None:
        """Sync the thread's store and deliver the frames held before the flush began.

        A failed flush leaves them held (logged) and is tried again in
        `RETRY_FIRST_SECONDS` (or by the next durable commit): a power cut meanwhile may
        lose their outcomes, never shown. At shutdown they are dropped.
        """
        thread_id = actor.thread_id
        held = self._held.get(thread_id)
        if held is None:
            return
        mark = self._hub.hold_mark(thread_id)
        try:
            await self._run_sync(actor.store.sync)
        except (ThreadStorageError, RuntimeClosed) as exc:
            if self._held.get(thread_id) is not held:
                return
            if (isinstance(exc, RuntimeClosed) or actor.state is not ActorState.OPEN
                    or self._stopping()):
                # Shut down, deleted, or evicted (its close flushed, or could not): the
                # frames would only ever show what a crash might take back.
                self._drop_held(thread_id)
                return
            log.error("thread %s: outcomes not synced yet, their frames held (retrying in "
                      "%.0f s): %s", thread_id, RETRY_FIRST_SECONDS, exc)
            held.timer.cancel()
            held.timer = asyncio.get_running_loop().call_later(
                RETRY_FIRST_SECONDS, self._flush_soon, actor)
            return
        if self._held.get(thread_id) is not held:
            return  # released (or dropped) meanwhile
        self._hub.release(thread_id, mark)
        if self._hub.held(thread_id):
            # Frames of commits that may have come after the flush: a group of their own,
            # flushed at once when no run in line goes on to join them (a schedule made
            # while the flush ran, after the thread's drain ended).
            loop = asyncio.get_running_loop()
            held.timer.cancel()
            held.since, held.runs = loop.time(), 0
            held.timer = loop.call_later(GROUP_COMMIT_SECONDS, self._flush_soon, actor)
            if actor.current_run is None:
                self._flush_soon(actor)  # in `_flushes` before this flush ends
        else:
            held.timer.cancel()
            del self._held[thread_id]

    def _flush_soon(self, actor: ThreadActor) -> None:
        # A group's timer: flush in a task of its own.
        if actor.state is not ActorState.OPEN:
            self._drop_held(actor.thread_id)
            return
        task = asyncio.create_task(self._flush_held(actor),
                                   name=f"group-flush-{actor.thread_id}")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _record(self, actor: ThreadActor, finish: Finish) -> list[EffectRun]:
        """Write one run's outcome, claiming nothing (with the actor lock held).

        An outage's re-queue (`_is_requeue`) goes through `ThreadStore.recover_interrupted`
        (the attempt rule, the reason stored on the attempt); any other outcome through
        `ThreadStore.finish_and_claim`. Returns the runs as written (none if fencing
        dropped the outcome).

        Raises:
            ThreadStorageError: the store failed; nothing was written.
        """
        now = self._now()
        if not _is_requeue(finish):
            finished, _, _ = await self._run_sync(
                partial(actor.store.finish_and_claim, claim=False, retention=self._retention),
                finish,
                now,
            )
            return [] if finished is None else [finished]
        changed = await self._run_sync(
            partial(actor.store.recover_interrupted, retention=self._retention,
                    reason=finish.error),
            now, MAX_ATTEMPTS, [finish.run_id],
        )
        pending = [r.run_at_ts for r in changed if r.status is EffectStatus.PENDING]
        if pending:
            await self._alarms.lower(actor.thread_id, min(pending))
        return changed

    def _publish_all(self, runs: list[EffectRun]) -> None:
        for run in runs:
            self._hub.publish(_change_of(run), run)

    def _known_effect(self, name: str) -> bool:
        # Run in a worker thread (`fire_due`). An effect another live node runs is known:
        # the fire's run waits for that node (docs/scale-out.md, "Rolling deploys").
        try:
            self._registry().resolve(name)
        except EffectNotFound:
            if self._known_elsewhere is None:
                return False
            try:
                return self._known_elsewhere(name)
            except RuntimeStorageError:
                return True  # unknown: the run is made, and its claim decides
        return True

    def _concurrent_names(self) -> list[str]:
        return [d.qualified_name for d in self._registry().all() if d.concurrent]

    def poke(self, thread_id: str) -> None:
        """Say that a run of a concurrent effect of the thread may be due now.

        A drain running one of the thread's runs in line then starts it beside that run
        (a no-op otherwise: the next drain starts it).
        """
        event = self._pokes.get(thread_id)
        if event is not None:
            event.set()

    async def _execute_beside(self, actor: ThreadActor, run: EffectRun) -> Finish | None:
        """`execute` a run in line, starting due runs of concurrent effects meanwhile."""
        thread_id = actor.thread_id
        poked = self._pokes[thread_id] = asyncio.Event()
        main = asyncio.create_task(self.execute(actor, run), name=f"run-{run.id}")
        try:
            while True:
                poked.clear()
                await self._start_due_side(actor)
                if main.done():
                    break
                waiter = asyncio.create_task(poked.wait())
                try:
                    await asyncio.wait({main, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if main.done():
                    break
        except BaseException:
            main.cancel()
            with contextlib.suppress(BaseException):
                await main
            raise
        finally:
            if self._pokes.get(thread_id) is poked:
                del self._pokes[thread_id]
        return main.result()

    async def _start_due_side(self, actor: ThreadActor) -> None:
        """Fire due schedules, start every due run of a concurrent effect; arm the timer.

        The timer is armed for the next due run of a concurrent effect or the next fire
        time of a schedule, whichever comes first.
        """
        names = self._concurrent_names()
        while not self._stopping():
            async with actor.lock:
                # A paused thread starts nothing, beside a running run either.
                if actor.deleted or (actor.info.paused and not self._shared):
                    return
                # Schedules fire on time beside a running run: their runs of concurrent
                # effects start now, the others wait in line.
                await self._fire_schedules(actor, None)
                if actor.deleted:
                    return
                _, claimed, next_due = await self._run_sync(
                    partial(actor.store.finish_and_claim, only_names=names),
                    None,
                    self._now(),
                )
                if claimed is None and actor.store.claim_blocked is not None:
                    return
                if claimed is None:
                    fire = actor.next_fire if actor.next_fire_known else None
                    wake = min((t for t in (next_due, fire) if t is not None), default=None)
                    if wake is not None:
                        self._alarms.arm_timer(actor.thread_id, wake)
                    return
                actor.side_runs[claimed.id] = claimed
            self._hub.publish(RunChange.STARTED, claimed)
            self._start_side(actor, claimed)

    def _is_concurrent(self, run: EffectRun) -> bool:
        try:
            return self._registry().resolve(run.name).concurrent
        except EffectNotFound:
            return False  # it fails at once, in line

    def _start_side(self, actor: ThreadActor, run: EffectRun) -> None:
        task = asyncio.create_task(self._run_side(actor, run), name=f"side-run-{run.id}")
        self._side.add(task)
        self._side_idle.clear()
        task.add_done_callback(self._side_done)

    def _side_done(self, task: asyncio.Task[None]) -> None:
        self._side.discard(task)
        if not self._side:
            self._side_idle.set()

    async def _run_side(self, actor: ThreadActor, run: EffectRun) -> None:
        """Execute a concurrent effect's run and record its outcome under the lock."""
        try:
            try:
                finish = await self.execute(actor, run, side=True)
            except Exception as exc:  # a bug of ours: still never leave the run running
                log.exception("run %s of thread %s: internal error", run.id, actor.thread_id)
                finish = Finish(run.id, EffectStatus.FAILED,
                                f"Internal error running the effect: {error_text(exc)}",
                                self._now())
            if finish is None:  # interrupted: deletion or shutdown
                return
            delay = RETRY_FIRST_SECONDS
            while True:
                async with actor.lock:
                    if actor.deleted:
                        return
                    try:
                        changed = await self._record(actor, finish)
                    except ThreadStorageError as exc:
                        if self._stopping():
                            log.error("run %s of thread %s: outcome not recorded: %s",
                                      run.id, actor.thread_id, exc)
                            return
                        # Kept in memory and written when the store answers again: the
                        # run is never executed twice because the database blinked.
                        log.error("run %s of thread %s: outcome not recorded yet, retrying "
                                  "in %.0f s: %s", run.id, actor.thread_id, delay, exc)
                    else:
                        actor.side_runs.pop(run.id, None)
                        break
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)
            self._publish_all(changed)
            if not actor.side_runs and self._wake is not None:
                self._wake(actor.thread_id)  # a drain settles the alarm without a hold
        finally:
            actor.side_runs.pop(run.id, None)
            self._ended.pop(run.id, None)

    @property
    def side_running(self) -> int:
        """How many runs of concurrent effects are executing now (all threads)."""
        return len(self._side)

    async def wait_side_idle(self) -> None:
        """Wait until no run of a concurrent effect is executing."""
        await self._side_idle.wait()

    @property
    def flushing(self) -> int:
        """How many group flushes are in flight (the frames they make durable wait)."""
        return len(self._flushes)

    async def wait_flushed(self) -> None:
        """Wait until no group flush is in flight (each one's frames delivered)."""
        while self._flushes:
            await asyncio.wait(set(self._flushes))

    async def stop_side(self, grace_seconds: float) -> None:
        """Shutdown: give concurrent runs ``grace_seconds``, then cancel them.

        A canceled one is left ``running`` for the caller's recovery (``pending`` again).
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_seconds):
                await asyncio.gather(*self._side, return_exceptions=True)
        for task in list(self._side):
            task.cancel()
        await asyncio.gather(*self._side, return_exceptions=True)

    def cancel_asked(self, run_id: str) -> bool:
        """Whether `cancel_running` asked ``run_id`` to stop and it has not ended yet."""
        return run_id in self._cancels

    def decided(self, actor: ThreadActor, run_id: str) -> Finish | None:
        """The outcome ``run_id``'s effect code decided here, while it is not recorded yet.

        Such a run is still ``running`` in the store, but a cancel no longer changes its
        outcome. None when its code did not end here (or its outcome is recorded). Call
        under the actor's lock.
        """
        finish = self._ended.get(run_id)
        if finish is None and actor.unrecorded is not None:
            if actor.unrecorded.run_id == run_id:
                finish = actor.unrecorded
        return finish

    def cancel_running(
        self, actor: ThreadActor, run_id: str, canceled_by: str
    ) -> tuple[bool, asyncio.Task[None] | None]:
        """Cancel the thread's running run ``run_id`` cooperatively, if it runs here.

        The effect gets `asyncio.CancelledError` at its next ``await``; if it lets it
        through, the run ends ``canceled`` with ``canceled_by`` (never re-queued). An effect
        that swallows it ends as it ends (completed or failed). A second cancel while it
        stops answers the same and cancels nothing again: the first canceler is kept, and
        the effect's cleanup after its `asyncio.CancelledError` is not cut short. Call
        under the actor's lock.

        Returns:
            ``(asked, task)``: whether the run was asked to stop (False when it is not
            running here: it finished meanwhile, or never ran), and the task of its code
            (done once the effect stopped; None when its code has not started yet, and
            then it never will). Once its code returned or raised, its outcome stands,
            not recorded yet: ``(True, None)`` if it is ``canceled`` (a cancel asked
            before this one stopped it), else ``(False, None)``.

        Raises:
            RunStateError: the run is a sync effect's, which runs in a worker thread that
                Python cannot stop.
        """
        side = actor.side_runs.get(run_id)
        run = actor.current_run if side is None else side
        decided = self.decided(actor, run_id)
        if decided is not None:
            return decided.status is EffectStatus.CANCELED, None
        if run is None or run.id != run_id:
            return False, None
        task = actor.effect_task if side is None else actor.side_tasks.get(run_id)
        if task is not None and task.done():
            # Its code ended, its outcome is being decided: `_execute` reads the same.
            return task.cancelled() and run_id in self._cancels, None
        try:
            defn = self._registry().resolve(run.name)
        except EffectNotFound:
            return False, None  # it fails at once anyway
        if not defn.is_async:
            raise RunStateError(
                f"Run {run_id} of effect {run.name} is running a sync function in a worker "
                f"thread, which cannot be stopped; it can only be left to finish"
            )
        if run_id in self._cancels:
            # Asked already and stopping: the first canceler stays, and the effect's own
            # cleanup is not cut short by a second cancellation.
            return True, task
        self._cancels[run_id] = canceled_by
        if task is not None:
            task.cancel()
        return True, task

    def abandon(self, actor: ThreadActor) -> list[str]:
        """Cancel every effect the thread runs here, recording nothing (the lease was lost).

        Their runs are another node's to re-queue (their attempt counts as interrupted);
        if this node records anything later, fencing drops it. Returns their run ids.
        """
        runs = [*actor.side_runs.values()]
        if actor.current_run is not None:
            runs.append(actor.current_run)
        for run in runs:
            self._abandoned.add(run.id)
        for task in (actor.effect_task, *actor.side_tasks.values()):
            if task is not None:
                task.cancel()
        return [run.id for run in runs]

    async def execute(
        self, actor: ThreadActor, run: EffectRun, *, side: bool = False
    ) -> Finish | None:
        """Run one claimed run; its outcome, or None if it was interrupted (delete/shutdown).

        Never raises for anything the effect does: whatever goes wrong becomes a failed run
        (or, when the effect raised because the runtime's database could not be reached, a
        re-queue: status ``pending``, see `_is_requeue`), so no run is left ``running``
        behind a live worker. ``side``: a concurrent
        effect's run (its task is kept in ``actor.side_tasks``, not ``effect_task``). The
        attempt is traced by a span (`runtime.telemetry.run_span`), current while the effect
        runs.
        """
        with run_span(run) as span:
            finish: Finish | None = None
            try:
                finish = await self._execute(actor, run, side)
                if finish is not None and finish.attempt is None:
                    # Fencing: written only while the run is still in this attempt.
                    finish = replace(finish, attempt=run.attempts)
            finally:
                self._cancels.pop(run.id, None)
                self._abandoned.discard(run.id)
                # Its outcome is decided: a cancel from now on changes nothing (the
                # caller drops the mark once the run is no longer its actor's).
                if finish is not None:
                    self._ended[run.id] = finish
                if finish is None:
                    end_run_span(span, "interrupted")
                else:
                    end_run_span(span, str(finish.status), finish.error)
            return finish

    async def _execute(self, actor: ThreadActor, run: EffectRun, side: bool) -> Finish | None:
        try:
            defn = self._registry().resolve(run.name)
        except EffectNotFound as exc:
            return Finish(run.id, EffectStatus.FAILED, error_text(exc, bare=True), self._now())
        try:
            args = defn.schema.model_validate(run.args) if defn.schema is not None else None
        except ValidationError as exc:
            return Finish(
                run.id,
                EffectStatus.FAILED,
                f"Invalid args for effect {run.name}: {validation_summary(exc)}",
                self._now(),
            )
        except Exception as exc:  # a validator of the schema raised something else
            return Finish(run.id, EffectStatus.FAILED,
                          f"Invalid args for effect {run.name}: {error_text(exc)}",
                          self._now())
        state = self._make_state(actor.info, defn.package_id)
        task = asyncio.create_task(_call(defn, run, state, args), name=f"effect-{run.id}")
        if side:
            actor.side_tasks[run.id] = task
        else:
            actor.effect_task = task
        self._running[task] = (run.name, actor.thread_id, run.id)
        if run.id in self._cancels or run.id in self._abandoned or (side and actor.deleted):
            task.cancel()  # canceled (or its thread deleted) between its claim and now
        try:
            await _until_done(task)
        finally:
            if side:
                actor.side_tasks.pop(run.id, None)
            else:
                actor.effect_task = None
            del self._running[task]
            if not task.done():  # the worker itself was canceled (shutdown)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if actor.deleted or run.id in self._abandoned:
            return None
        now = self._now()
        canceled_by = self._cancels.get(run.id)
        if task.cancelled() and canceled_by is not None:
            return Finish(run.id, EffectStatus.CANCELED, None, now, canceled_by=canceled_by)
        if task.cancelled():
            # Not by us (deletion returned above, shutdown cancels the worker instead):
            # the effect raised CancelledError itself.
            return Finish(run.id, EffectStatus.FAILED,
                          "CancelledError: the effect cancelled itself", now)
        error = task.exception()
        if error is None:
            return Finish(run.id, EffectStatus.COMPLETED, None, now, attempt=run.attempts)
        if self._stopping() and refused_by_shutdown(error):
            # Not the effect's fault: like a crash, an interruption (pending again).
            log.info("effect %s (run %s, thread %s) was refused by the shutdown; it will "
                     "run again", run.name, run.id, actor.thread_id)
            return None
        if refused_by_outage(error):
            # Not the effect's fault either: the runtime's database blinked under it.
            reason = truncate(f"the database could not be reached while it ran: "
                              f"{error_text(error)}", MAX_REASON_CHARS)
            log.warning("effect %s (run %s, thread %s) was interrupted by a database outage; "
                        "it is re-queued: %s", run.name, run.id, actor.thread_id,
                        truncate(error_text(error), 500))
            return Finish(run.id, EffectStatus.PENDING, reason, now)
        message = error_text(error, bare=isinstance(error, _EffectTimeout))
        log.info("effect %s (run %s, thread %s) failed: %s", run.name, run.id,
                 actor.thread_id, truncate(message, 500))
        return Finish(run.id, EffectStatus.FAILED, message, now)


async def _until_done(task: asyncio.Task[None]) -> None:
    """Wait for ``task`` to end, raising nothing of its own; being cancelled leaves it running.

    What ``asyncio.wait({task})`` does, for one task without its sets and second future.
    """
    if task.done():
        return
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: asyncio.Task[None]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    try:
        await waiter
    finally:
        task.remove_done_callback(wake)


_CHANGE_OF = {
    EffectStatus.COMPLETED: RunChange.COMPLETED, EffectStatus.CANCELED: RunChange.CANCELED,
    EffectStatus.PENDING: RunChange.REQUEUED,
}


def _fire_or_claim(
    store: ThreadStore, now: float, retention: RetentionPolicy | None,
) -> tuple[float | None, _Claimed | None]:
    """In a storage thread: the thread's next schedule fire, then the claim unless it is due.

    Returns ``(next fire or None, finish_and_claim's answer)``; the answer is None when
    a schedule is due by ``now`` (the drain fires it first, then claims).

    Raises:
        ThreadStorageError: the store failed.
    """
    fire = store.next_schedule_fire()
    if fire is not None and fire <= now:
        return fire, None
    return fire, store.finish_and_claim(None, now, retention=retention)


def _is_requeue(finish: Finish) -> bool:
    """Whether ``finish`` asks for a re-queue (an outage interrupted the attempt).

    Such an outcome is the executor's own (status ``pending``, the reason as its error) and
    never reaches `ThreadStore.finish_and_claim`: `EffectExecutor._record` routes it.
    """
    return finish.status is EffectStatus.PENDING


def _change_of(finished: EffectRun) -> RunChange:
    return _CHANGE_OF.get(finished.status, RunChange.FAILED)


async def _call(defn: EffectDefinition, run: EffectRun, state: Any, args: Any) -> None:
    call_args = (state, args) if defn.schema is not None else (state,)
    IN_EFFECT.set(True)
    CURRENT_RUN.set((run.thread_id, run.id))
    try:
        if defn.timeout_seconds is None and defn.is_async:
            # The common case: no deadline to arm and leave, no worker thread.
            await cast(Awaitable[None], defn.fn(*call_args))
        else:
            async with asyncio.timeout(defn.timeout_seconds):
                if defn.is_async:
                    await cast(Awaitable[None], defn.fn(*call_args))
                else:
                    # A sync effect runs in a worker thread; if it overruns or the thread
                    # is deleted, that worker thread is abandoned (Python cannot kill it).
                    result = await anyio.to_thread.run_sync(
                        partial(defn.fn, *call_args), abandon_on_cancel=True
                    )
                    if inspect.isawaitable(result):
                        # A callable that is not a coroutine function but returns one.
                        await result
    except TimeoutError as exc:
        if defn.timeout_seconds is None:
            raise
        raise _EffectTimeout(
            f"Effect {defn.qualified_name} timed out after {defn.timeout_seconds:g} s"
        ) from exc
    except (SystemExit, KeyboardInterrupt) as exc:
        # Raised out of a task these would stop the whole event loop, every thread
        # with it; for an effect they are just its failure.
        raise _EffectAborted(f"{type(exc).__name__}: {exc}" if str(exc)
                             else type(exc).__name__) from None


def refused_by_shutdown(error: BaseException) -> bool:
    """Whether ``error`` is, was caused by, or groups a `RuntimeClosed`."""
    return in_chain(error, lambda exc: isinstance(exc, RuntimeClosed))


def refused_by_outage(error: BaseException) -> bool:
    """Whether ``error`` is, was caused by, or groups an unreachable runtime database.

    That is a `DatabaseUnavailable` or a `ThreadStorageError` marked ``unavailable``: the
    runtime's own store lost its server, nothing the effect did wrong.
    """
    return database_unreachable(error)


def validation_summary(exc: ValidationError) -> str:
    """``"field: message; ..."`` of a pydantic validation error."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(args)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def error_text(error: BaseException, *, bare: bool = False) -> str:
    """``"<Type>: <message>"`` of an exception, storable as UTF-8 and at most 8 KiB.

    ``bare``: the message alone (it already says what happened).
    """
    try:
        text = str(error)
    except Exception:
        text = "<the exception's message could not be rendered>"
    if isinstance(error, _EffectAborted):
        bare = True
    name = type(error).__name__
    message = text if bare else (f"{name}: {text}" if text else name)
    # Lone surrogates (a file name decoded with os.fsdecode, say) cannot be stored as
    # UTF-8: they become visible \udcXX escapes instead of losing the run.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return truncate(message, MAX_ERROR_CHARS)


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, saying how much was cut."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return text
    kept = data[: limit - 48].decode("utf-8", "ignore")
    return f"{kept}… [{len(data) - len(kept.encode('utf-8'))} more bytes cut]"
