"""The alarm clock: when each thread must wake next, durably (docs/design.md, "Alarms").

`AlarmIndex` is what happens around an alarm: the durable row per thread in the runtime
store (lowered at once, before the run row that needs it commits; raised or removed only
after the drain, in batches, by a background flusher with compare-and-set), and the
in-process timer, a cache rebuilt from those rows at startup. When the timer fires, the
index calls its ``on_alarm`` callback (the dispatcher queues the thread).

Because the row is written before the run row and cleared only after the due runs finished,
a crash can cause a spurious wake-up but never a lost one.

A thread that drained within the last `ALARM_KEEP_SECONDS` is *warm*: its row is not raised
or removed but kept at or before the end of its last drain, so a schedule on it (due at or
after its own "now", so after that row) commits only its run row and does not wait for a
second, synchronous commit of the row. Once the thread has been idle that long, the
flusher moves the row to its next pending run (or removes it); a clean shutdown does so at
once. The price: after a crash, threads that were warm wake once at the next start and
find nothing due.

The timer is `LoopTimer`: the event loop's own ``call_at``, one ``TimerHandle`` per thread
id whose alarm is due within a 120 s horizon, a heap (behind one handle) beyond it. It
replaced APScheduler 3's ``AsyncIOScheduler`` (memory job store), whose ``add_job`` took
≈100 µs of wall time and whose job processing took ≈13 % of the loop's CPU when runs come
due at 2,000/s (bench/README.md, "Fifth round"). Measured alternately in one session
(bench/bench_timer.py): arming 1.4 µs against 26 µs, an alarm armed and fired 11 µs of CPU
against 69 µs; a restart of 100k threads still arms in ≈0.15 s (bench/bench_restart.py).
A due or overdue alarm fires on the next loop iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from runtime.abc import AlarmCallback, AlarmTimer, Clock, RunSync
from runtime.outage import OutageLog, log_failure
from runtime.storage.base import RuntimeStore

__all__ = [
    "ALARM_FLUSH_SECONDS", "ALARM_KEEP_SECONDS", "AlarmCallback", "AlarmIndex", "AlarmTimer",
    "Clock", "LoopTimer", "SystemClock",
]

log = logging.getLogger("runtime")

T = TypeVar("T")

ALARM_FLUSH_SECONDS = 0.05
"""How long alarm-row updates (raise/remove) gather before one commit writes them."""

ALARM_KEEP_SECONDS = 60.0
"""How long after its last drain a thread's alarm row stays low (the thread is warm)."""

_COOL_CHECK_SECONDS = 1.0
"""How often (wall clock) the flusher looks for warm threads that cooled down."""

class LoopTimer:
    """`AlarmTimer` on the event loop's own ``call_at``: one ``TimerHandle`` per thread id.

    Alarms due within `horizon_seconds` each hold one handle (re-arming cancels and replaces
    it, `disarm` cancels it); alarms further out wait in a heap and one handle for the
    whole heap wakes the timer when the earliest of them nears the horizon, so a restart
    with 100k threads arms only the few due soon. Due times are wall-clock (``now``, epoch
    seconds, UTC) and are converted to loop time when a handle is armed; since the two
    clocks may drift apart (a wall-clock step), a handle that fires before its due time by
    the wall clock is armed again for what is left, so an alarm never fires early (late
    is possible after a forward step: by at most the horizon).

    Args:
        callback: Called on the loop with the thread id when its alarm fires (its errors
            are logged, never raised into the loop).
        now: The wall clock, epoch seconds.
        horizon_seconds: How far ahead (seconds) an alarm gets its own handle.
    """

    def __init__(
        self,
        callback: AlarmCallback,
        now: Callable[[], float] = time.time,
        *,
        horizon_seconds: float = 120.0,
    ) -> None:
        self._callback = callback
        self._now = now
        self._horizon = horizon_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due: dict[str, float] = {}  # every alarm, near or far: its due time
        self._handles: dict[str, asyncio.Handle] = {}  # the near ones
        # Far alarms: (due, thread id); an entry is stale unless the thread's alarm is
        # still due then and has no handle (disarm and re-arm leave entries behind).
        self._far_heap: list[tuple[float, str]] = []
        self._far_handle: asyncio.TimerHandle | None = None
        self._far_at = 0.0  # the wall time the far handle wakes at

    @property
    def handle_count(self) -> int:
        """How many loop handles the timer holds now (one per near alarm, one for the heap)."""
        return len(self._handles) + (self._far_handle is not None)

    def start(self) -> None:
        """Begin firing on the running loop; alarms armed before then are armed now.

        Raises:
            RuntimeError: already started (and not shut down since), or no running loop.
        """
        if self._loop is not None:
            raise RuntimeError("the alarm timer is already running")
        self._loop = asyncio.get_running_loop()
        now = self._now()
        for thread_id, due_at in self._due.items():
            self._place(thread_id, due_at, now)

    def arm(self, thread_id: str, due_at: float) -> None:
        """Fire for ``thread_id`` at ``due_at`` (epoch seconds), replacing its earlier alarm.

        Due or overdue: fires on the next loop iteration. Before `start` (or after
        `shutdown`) the alarm is kept and armed by the next `start`.
        """
        handle = self._handles.pop(thread_id, None)
        if handle is not None:
            handle.cancel()
        self._due[thread_id] = due_at
        if self._loop is not None:
            self._place(thread_id, due_at, self._now())

    def _place(self, thread_id: str, due_at: float, now: float) -> None:
        loop = self._loop
        assert loop is not None
        delay = due_at - now
        if delay <= 0:
            self._handles[thread_id] = loop.call_soon(self._fire, thread_id, due_at)
        elif delay <= self._horizon:
            self._handles[thread_id] = loop.call_at(
                loop.time() + delay, self._fire, thread_id, due_at
            )
        else:
            heapq.heappush(self._far_heap, (due_at, thread_id))
            if len(self._far_heap) > 64 and len(self._far_heap) > 2 * (
                len(self._due) - len(self._handles)
            ):
                self._compact()
            if self._far_handle is None or due_at - self._horizon < self._far_at:
                self._arm_far(now)

    def _fire(self, thread_id: str, due_at: float) -> None:
        del self._handles[thread_id]
        now = self._now()
        if now < due_at:  # the loop clock ran ahead of the wall clock (a step back)
            self._place(thread_id, due_at, now)
            return
        del self._due[thread_id]
        try:
            self._callback(thread_id)
        except Exception:
            log.exception("the alarm callback failed for thread %s", thread_id)

    def _compact(self) -> None:
        self._far_heap = [
            (due, tid) for due, tid in self._far_heap
            if self._due.get(tid) == due and tid not in self._handles
        ]
        heapq.heapify(self._far_heap)

    def _arm_far(self, now: float) -> None:
        """(Re)arm the heap's handle: when its earliest alarm nears the horizon.

        It wakes at least every half horizon, so a forward wall-clock step delays a far
        alarm by no more than that.
        """
        if self._far_handle is not None:
            self._far_handle.cancel()
            self._far_handle = None
        heap = self._far_heap
        while heap and (self._due.get(heap[0][1]) != heap[0][0] or heap[0][1] in self._handles):
            heapq.heappop(heap)
        if not heap:
            return
        delay = min(max(heap[0][0] - self._horizon - now, 0.0), self._horizon / 2)
        assert self._loop is not None
        self._far_at = now + delay
        self._far_handle = self._loop.call_at(self._loop.time() + delay, self._promote)

    def _promote(self) -> None:
        self._far_handle = None
        now = self._now()
        limit = now + self._horizon
        heap = self._far_heap
        while heap and heap[0][0] <= limit:
            due_at, thread_id = heapq.heappop(heap)
            if self._due.get(thread_id) == due_at and thread_id not in self._handles:
                self._place(thread_id, due_at, now)
        self._arm_far(now)

    def disarm(self, thread_id: str) -> None:
        """Forget the thread's alarm, if any (its heap entry, if far, is skipped later)."""
        self._due.pop(thread_id, None)
        handle = self._handles.pop(thread_id, None)
        if handle is not None:
            handle.cancel()

    def shutdown(self) -> None:
        """Stop firing: cancel every handle and forget every alarm (idempotent)."""
        for handle in self._handles.values():
            handle.cancel()
        if self._far_handle is not None:
            self._far_handle.cancel()
            self._far_handle = None
        self._handles.clear()
        self._due.clear()
        self._far_heap.clear()
        self._loop = None


class SystemClock:
    """The real clock: `time.time` and a timer on the event loop's ``call_at``."""

    def now(self) -> float:
        """Seconds since the Unix epoch (UTC)."""
        return time.time()

    def create_timer(self, callback: AlarmCallback) -> AlarmTimer:
        """A `LoopTimer` reading this clock."""
        return LoopTimer(callback, self.now)


class AlarmIndex:
    """The durable alarm index and its timer: one alarm per thread, at its next due run.

    Three views of each thread's alarm: ``due`` (when the timer wakes it: the intent),
    ``row`` (what the runtime store holds, as far as known; never believed lower than it
    is, so a needed write is never skipped) and ``dirty`` (threads whose row should move to
    ``due``, written in batches by the flusher). Lowering is never deferred.

    Every store call goes through ``run_sync`` (the runtime's storage thread pool).

    Args:
        clock: Gives the time and the timer.
        run_sync: Runs a blocking call off the event loop, ``await run_sync(fn, *args)``.
        on_alarm: Called on the loop with a thread id when its alarm goes off.
        is_draining: Whether the dispatcher drains that thread now (its timer is then
            left alone: the drain sets it when it ends).
        keep_seconds: How long after its last drain a thread stays warm (its row kept
            at or before that drain's end; see the module docstring), in seconds of
            ``clock``; 0 raises and removes rows right after each drain.
        horizon_seconds: None (a backend one process uses): `start` arms every alarm
            row. A number (a backend several nodes share): `start` arms only the rows due
            within that many seconds; the others are found later by the node's poll
            (`runtime.cluster`), which calls `hint`.
        on_busy: Called on the loop with a thread id when `hint` finds the thread drained
            here now (this node runs it): the drain may start a run of a concurrent effect
            beside its running run (`runtime.executor.EffectExecutor.poke`). None: nothing.
    """

    def __init__(
        self,
        clock: Clock,
        run_sync: RunSync,
        on_alarm: AlarmCallback,
        is_draining: Callable[[str], bool],
        *,
        keep_seconds: float = ALARM_KEEP_SECONDS,
        horizon_seconds: float | None = None,
        on_busy: Callable[[str], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_busy = on_busy
        self._run_sync = run_sync
        self._on_alarm = on_alarm
        self._is_draining = is_draining
        self._store: RuntimeStore | None = None
        self._timer: AlarmTimer | None = None
        self._due: dict[str, float] = {}
        self._row: dict[str, float] = {}
        self._dirty: set[str] = set()
        # Threads running runs of concurrent effects with no drain: the row stays at or
        # before the earliest of those runs until they end (a crash then reopens the
        # thread and re-queues them), whatever the timer waits for.
        self._held: dict[str, float] = {}
        # Warm threads: when their last drain ended (clock seconds), oldest first. Their
        # row stays at or before that instant until they have been idle `keep_seconds`.
        self._keep = keep_seconds
        self._warm: dict[str, float] = {}
        # Threads whose last drain here found them run by another node (a shared store):
        # this node keeps no timer for them, and a `lower` or `hint` arms the timer even
        # while that drain is still ending, until a drain here settles the thread.
        self._yielded: set[str] = set()
        self._lock = asyncio.Lock()
        self._flush_needed = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._horizon = horizon_seconds

    async def start(self, store: RuntimeStore) -> int:
        """Start the timer, arm every alarm row of ``store`` and start the flusher.

        With a horizon, only the rows due before now + horizon are armed.

        Returns:
            How many alarms were re-armed.
        """
        self._store = store
        self._timer = self._clock.create_timer(self._on_alarm)
        self._timer.start()
        if self._horizon is None:
            alarms = await self._run_sync(store.load_alarms)
        else:
            alarms = await self._run_sync(store.load_alarms, self._clock.now() + self._horizon)
        for thread_id, due_at in alarms:
            self._due[thread_id] = due_at
            self._row[thread_id] = due_at
            try:
                self._timer.arm(thread_id, due_at)
            except Exception:  # one bad row must not keep every other thread down
                log.exception("cannot arm the alarm of thread %s (due %r)", thread_id, due_at)
        self._flusher = asyncio.create_task(
            self._flush_loop(), name="thread-effects-alarm-flusher"
        )
        return len(alarms)

    @property
    def armed_count(self) -> int:
        """How many threads have an alarm now (threads with a pending or running run)."""
        return len(self._due)

    def stop_timer(self) -> None:
        """Stop firing alarms (shutdown begins); rows are still written."""
        if self._timer is not None:
            self._timer.shutdown()

    async def close(self, *, write: bool = True) -> None:
        """Stop the flusher and write the rows still dirty (errors are logged).

        Warm threads cool at once: after a clean shutdown every row is at its thread's
        next pending run (or gone), so the next start wakes no thread for nothing.

        Args:
            write: False when the database is known unreachable: the rows are left as
                they are (early at worst: a thread woken for nothing).
        """
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        self._dirty.update(self._warm)
        self._warm.clear()
        if not write:
            return
        try:
            await self.flush()
        except Exception as exc:
            log_failure(log, "updating the alarm rows at shutdown (they stay early)", exc)

    async def lower(self, thread_id: str, due_at: float) -> None:
        """Make the durable alarm at or before ``due_at`` now (call with the actor lock).

        Written at once, before the caller's run row commits: a run is never without an
        alarm at or before its due time, so a crash cannot lose it. A store whose thread
        stores lower the row with the run itself (`RuntimeStore.alarms_follow_runs`) is
        not written to: only the belief and the timer move.

        Raises:
            RuntimeStorageError: the runtime store failed (nothing was armed).
        """
        assert self._store is not None and self._timer is not None
        async with self._lock:
            row = self._row.get(thread_id)
            if row is None or due_at < row:
                if not self._store.alarms_follow_runs:
                    await self._run_sync(self._store.lower_alarm, thread_id, due_at)
                self._row[thread_id] = due_at
            current = self._due.get(thread_id)
            # A wake-up time already past does not stand for this run (see `hint`); its
            # firing may still be pending (a busy loop), so the timer is not moved later.
            past = current is not None and current <= self._clock.now()
            if current is None or due_at < current or past:
                self._due[thread_id] = due_at
                if thread_id in self._yielded or not self._is_draining(thread_id):
                    self._yielded.discard(thread_id)
                    self._timer.arm(thread_id, min(due_at, current) if past
                                    and current is not None else due_at)

    async def hint(
        self, thread_id: str, due_at: float, arm_at: float, *, row: float | None = None,
    ) -> bool:
        """Another node's work: ``thread_id`` has a run due at ``due_at``; wake at ``arm_at``.

        For a backend several nodes share (`runtime.cluster`): a wake-up announced by the
        node that scheduled the run, or an alarm row this node's poll read (``row``: its
        value, now known). Arms the timer at ``arm_at`` (at or after ``due_at``: a grace
        left to the nodes ranked first) unless this node's timer already wakes the thread
        at or before ``due_at`` (and later than now), or drains it now (unless that drain
        found the thread run by another node: `yielded`). A thread drained here now is
        handed to ``on_busy`` instead, at once: the drain starts the thread's due runs of
        concurrent effects beside its running run and arms the timer for the later ones,
        with no grace (this node runs the thread, as for a run scheduled here). Writes no
        row.

        Returns:
            Whether the timer was armed.
        """
        assert self._timer is not None
        async with self._lock:
            if row is not None and thread_id not in self._row:
                self._row[thread_id] = row
            current = self._due.get(thread_id)
            # A wake-up time already past is no promise: it fired (the thread was queued,
            # or drained and left to another node), so it does not stand for this one.
            if current is not None and current <= due_at and current > self._clock.now():
                return False
            if self.runs_here(thread_id):
                if self._on_busy is not None:
                    self._on_busy(thread_id)
                return False
            self._yielded.discard(thread_id)
            self._due[thread_id] = due_at
            if current is not None and current <= self._clock.now():
                # Its firing may still be pending (a busy loop): wake now, not later.
                arm_at = min(arm_at, current)
            self._timer.arm(thread_id, arm_at)
            return True

    def runs_here(self, thread_id: str) -> bool:
        """Whether a drain of this node runs the thread now (not one that yielded it)."""
        return self._is_draining(thread_id) and thread_id not in self._yielded

    async def yielded(self, thread_id: str) -> None:
        """A drain found the thread run by another node (a shared store; with the actor lock).

        That node drains the thread on as its run ends. This node stops waking it: its
        timer is disarmed and its due time forgotten, so that a later wake-up (`hint`:
        an announcement, the alarm poll) or a run scheduled here (`lower`) arms the
        timer again, even before the drain that yielded has ended. The durable row
        stays where it is (this node learned nothing about the thread's runs).
        """
        assert self._timer is not None
        async with self._lock:
            self._due.pop(thread_id, None)
            self._timer.disarm(thread_id)
            self._yielded.add(thread_id)

    def created(self, thread_id: str, row_at: float) -> None:
        """A thread was registered with its alarm row at ``row_at`` (its creation time).

        The thread is warm from now on: its first schedules (due at or after its
        creation) commit no row of their own, and the flusher removes the row once the
        thread has been idle for `keep_seconds` with nothing pending. A row already known
        (a schedule that raced the creation) is left as known.
        """
        if thread_id not in self._row:
            self._row[thread_id] = row_at
        if self._keep > 0:
            if not self._warm:
                self._flush_needed.set()
            self._warm.pop(thread_id, None)
            self._warm[thread_id] = self._clock.now()

    def arm_timer(self, thread_id: str, due_at: float) -> None:
        """Arm the in-process timer only (the durable row stays where it is).

        For a drain that runs a run while a run of a concurrent effect comes due later:
        its row is already at or before the running run, so a crash loses nothing.
        """
        assert self._timer is not None
        self._timer.arm(thread_id, due_at)

    def _target(self, thread_id: str) -> float | None:
        """Where the thread's row belongs: its next due time, or earlier while held.

        A warm thread's row stays where it is if that is at or before the end of its
        last drain, else it goes there (the row is at or before every pending run
        either way: `lower` keeps it so).
        """
        due, held = self._due.get(thread_id), self._held.get(thread_id)
        target = due if held is None else held if due is None else min(due, held)
        warm = self._warm.get(thread_id)
        if warm is None:
            return target
        row = self._row.get(thread_id)
        if row is not None and row <= warm and (target is None or row <= target):
            return row
        return warm if target is None else min(target, warm)

    def _cool(self) -> None:
        """Threads idle for `keep_seconds` are no longer warm: their rows move (dirty)."""
        limit = self._clock.now() - self._keep
        while self._warm:
            thread_id, since = next(iter(self._warm.items()))
            if since > limit:
                break
            del self._warm[thread_id]
            self._dirty.add(thread_id)

    async def settle(
        self, thread_id: str, due_at: float | None, *, hold_row_at: float | None = None,
        active: bool = True,
    ) -> None:
        """After a drain: wake next at ``due_at`` (None: no pending run) (with the actor lock).

        The timer moves now; the durable row (still at or before every pending run) is
        raised or removed later by the flusher, in one transaction for many threads, so
        a drain never waits for a commit to the shared runtime store. ``hold_row_at``:
        the row is never raised above it (the earliest run still running beside the
        drain, so that a crash reopens the thread to re-queue it); None lifts the hold.
        ``active``: the drain recorded an outcome or started a run, which makes the
        thread warm again; a drain that found nothing to do (woken by the alarm poll of a
        shared store, which finds a warm thread's row overdue) leaves its warmth as it
        was, so the thread cools `keep_seconds` after its last real activity and its row
        goes. (Before, each such drain made it warm again: on PostgreSQL the row of every
        thread that ever ran stayed, and each claiming node drained every such thread at
        every poll, for good.)
        """
        assert self._timer is not None
        async with self._lock:
            self._yielded.discard(thread_id)
            if hold_row_at is None:
                self._held.pop(thread_id, None)
            else:
                self._held[thread_id] = hold_row_at
            if self._keep > 0 and active:
                if not self._warm:
                    self._flush_needed.set()  # the flusher then wakes to cool it later
                self._warm.pop(thread_id, None)  # to the end: the dict stays oldest first
                self._warm[thread_id] = self._clock.now()
            if due_at is None:
                self._due.pop(thread_id, None)
                self._timer.disarm(thread_id)
            else:
                self._due[thread_id] = due_at
                self._timer.arm(thread_id, due_at)
            if self._row.get(thread_id) != self._target(thread_id):
                self._dirty.add(thread_id)
                self._flush_needed.set()

    def forget(self, thread_id: str) -> None:
        """The thread is being deleted: disarm it; its row goes with the registry entry."""
        if self._timer is not None:
            self._timer.disarm(thread_id)
        self._due.pop(thread_id, None)
        self._held.pop(thread_id, None)
        self._warm.pop(thread_id, None)
        self._yielded.discard(thread_id)
        self._dirty.discard(thread_id)

    async def delete_with(self, thread_id: str, delete: Callable[[], T]) -> T:
        """Run ``delete`` (which removes the row with the thread) with the index locked."""
        async with self._lock:
            result = await self._run_sync(delete)
            self._row.pop(thread_id, None)
            return result

    def restore(self, thread_id: str) -> None:
        """A deletion failed (its registry entry and alarm row stay): re-arm the timer.

        The timer goes to the row as known (at or before every pending run; a spurious
        wake-up at worst), so the thread's runs are not left waiting for a restart.
        """
        row = self._row.get(thread_id)
        if row is not None and self._timer is not None:
            self._due[thread_id] = row
            self._timer.arm(thread_id, row)

    async def drop(self, thread_id: str) -> None:
        """Remove the alarm row of a thread that is not registered (a row left by a crash).

        Under the index lock, and only if the registry has no entry for the thread: a
        thread being deleted keeps its row until its registry entry goes with it (one
        transaction), so a crash in between never leaves a registered thread without
        one. Errors are logged (the row stays; a spurious wake-up at the next start).
        """
        assert self._store is not None
        store = self._store
        async with self._lock:
            try:
                if await self._run_sync(store.get_thread, thread_id) is not None:
                    return
                await self._run_sync(store.set_alarm, thread_id, None)
            except Exception:
                log.exception("could not remove the alarm row of unregistered thread %s",
                              thread_id)
                return
            self._due.pop(thread_id, None)
            self._held.pop(thread_id, None)
            self._warm.pop(thread_id, None)
            self._yielded.discard(thread_id)
            self._row.pop(thread_id, None)
            self._dirty.discard(thread_id)

    async def _flush_loop(self) -> None:
        failures = OutageLog(log, "updating the alarm rows")
        while True:
            if self._warm:  # wake now and then to let warm threads cool
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._flush_needed.wait(), _COOL_CHECK_SECONDS)
            else:
                await self._flush_needed.wait()
            # Gather the drains of a moment into one commit.
            await asyncio.sleep(ALARM_FLUSH_SECONDS)
            self._flush_needed.clear()
            try:
                await self.flush()
            except Exception as exc:
                failures.failed(exc, "they stay early: harmless; retried")
            else:
                failures.ok()

    async def flush(self) -> None:
        """Move dirty alarm rows to the timer's due times, in one transaction.

        Threads idle for `keep_seconds` stop being warm first (their rows move too).
        """
        assert self._store is not None
        async with self._lock:
            self._cool()
            dirty, self._dirty = self._dirty, set()
            changes = [
                (tid, self._row.get(tid), self._target(tid))
                for tid in dirty
                if self._row.get(tid) != self._target(tid)
            ]
            if not changes:
                return
            applied = await self._run_sync(self._store.move_alarms, changes)
            for tid, due_at in applied:
                if due_at is None:
                    self._row.pop(tid, None)
                else:
                    self._row[tid] = due_at
