"""A node among several sharing one backend: wake-ups and frames across nodes.

A runtime whose backend has a `runtime.storage.base.ClusterBus` (PostgreSQL) runs one
`ClusterNode` (docs/scale-out.md, "Wake-ups", "Alarms horizon", "Frames across nodes"):

- **Membership.** Every ``poll_seconds`` the node reads the nodes that hold a live lease
  and claim runs (`StorageBackend.claiming_nodes`, the ``nodes`` table): a node whose
  lease expired (killed, cut off) leaves the ranking at the next poll of every other
  node, and a node that claims nothing (``max_concurrent_runs`` 0) never enters it. A
  claiming node also announces itself on the ``nodes`` channel as it polls, so that a
  node that just started is ranked before the others' next read. They rank each thread
  by rendezvous hashing (the highest ``blake2b(node, thread)`` first), so every node
  agrees on who comes first for a thread without talking.
- **Wake-ups.** A run due soon is announced on the ``wake`` channel as its row commits
  (the backend does it). The node that scheduled it has its own timer; the first-ranked of
  the *other* live nodes arms the thread at due + grace (`AlarmIndex.hint`), so a run
  whose scheduling node cannot take it (busy, dying) still starts within the grace, and
  no other node stirs. A run scheduled (or run now, replayed) on a node that claims no
  run is not that node's to take: the first-ranked live node arms the thread at due.
- **Alarms horizon and the safety net.** Every ``poll_seconds`` the node reads the alarm
  rows due within its horizon (``load_alarms(until=now + horizon)``) and hints those it
  did not know at that value: the first-ranked live node at due + grace, the second at
  due + 2 * grace, no other; a row already overdue by more than the grace is armed at
  once by every live claiming node (the nodes ranked first did not take it: dead before
  their leases expired, busy, cut off from the bus). A lost notification delays a run by
  at most a poll (plus the grace), never loses it; a node keeps timers only for that
  window and its own work.
- **Frames.** The hub hands every event to `FrameRelay.send` instead of numbering it. The
  relay gives them, in batches, to `ClusterBus.append_frames` (one transaction: each
  thread's counter, the ``frames`` table, the notifications), then delivers the batch,
  numbered, to this node's own subscribers from the append's result (its own
  notifications are skipped unread). What the ``frames`` channel brings from the other
  nodes goes to this node's subscribers in each thread's ``seq`` order, reading missing
  ones from the table (a notification lost while the bus reconnected, a frame too large
  to carry). A notification whose header lists no thread subscribed here is not decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from runtime.abc import Clock
from runtime.alarms import AlarmIndex
from runtime.errors import database_unreachable
from runtime.events import EVENT_TYPES, RelayedFrame, ThreadDeleted, ThreadEvent
from runtime.frames import ChangeHub
from runtime.outage import OutageLog
from runtime.storage.base import (
    FRAMES_CHANNEL,
    WAKE_CHANNEL,
    ClusterBus,
    FrameDraft,
    RuntimeStore,
    decode_frames,
    decode_wake,
    frames_header,
)

log = logging.getLogger("runtime")

T = TypeVar("T")
RunSync = Callable[..., Awaitable[Any]]

NODES_CHANNEL = "nodes"
"""The channel on which nodes announce themselves (presence)."""

POLL_BACKOFF_FACTOR = 8
"""While the alarm poll fails (the database is unreachable), it is retried after the poll
period, doubling up to this many times the period."""

FRAME_BATCH = 500
"""The most frames one append transaction writes."""

FRAME_APPEND_INTERVAL = 0.02
"""Seconds from the start of one append to the next while frames keep coming: a frame
queued sooner waits for the rest of the interval (at most this long), so that a stream of
changes (a caller scheduling run after run, runs ending one after another) is written in
batches of many frames, not one transaction per frame, which cost about as much as the
change itself (bench/README.md, "PostgreSQL"). A frame queued after a quiet interval is
written at once."""

MAX_QUEUED_FRAMES = 50_000
"""Frames waiting for the database beyond this are dropped (the oldest; clients see a gap)."""

GAP_WAIT_SECONDS = 2.0
"""How long a node waits for a missing frame number before it skips it as a gap (real
seconds). A frame numbered in its change's transaction (a run's ``scheduled``) is written
to the ``frames`` table by its node's relay right after: until then a later frame of the
thread, written by another node, may be there before it. Frames behind the missing one
are held meanwhile; one that never comes (its node died between its commit and its
relay, or it was pruned) is skipped once this passed, and its subscribers see the gap."""

GAP_RECHECK_SECONDS = 0.25
"""While waiting for a missing frame number, the ``frames`` table is read again this often
(a frame whose notification was lost is found there)."""

MAX_IDLE_ORDERS = 10_000
"""How many threads' delivery states (`_Order`) a node keeps before it forgets the idle
ones of threads nobody here subscribes to by id (kept for the subscribers of every
thread's run changes). A forgotten thread's next frame starts afresh: its number before
is looked up in the ``frames`` table, as for a thread's first frame."""

PRUNE_EVERY_SECONDS = 60.0
"""How often a node deletes the frames past ``frame_keep_seconds``."""

_RETRY_FIRST_SECONDS = 0.5
_RETRY_MAX_SECONDS = 10.0


def rank(nodes: list[str], thread_id: str) -> list[str]:
    """``nodes`` in rendezvous order for ``thread_id`` (the first one first)."""
    def weight(node: str) -> bytes:
        return hashlib.blake2b(f"{node}\0{thread_id}".encode(), digest_size=8).digest()

    return sorted(nodes, key=weight, reverse=True)


@dataclass
class _Order:
    """A thread's delivery state on this node: the next ``seq`` to hand out."""

    next_seq: int
    buffer: dict[int, ThreadEvent | None]  # None: announced without its text
    filling: bool = False
    arrived: asyncio.Event | None = None  # set by `_offer` while a fill waits
    probe: bool = False  # next_seq is the number before the first frame (see `_offer`)


class ClusterNode:
    """Wake-ups, the alarm poll and the frame relay of one node (see the module doc).

    Args:
        bus: The backend's cluster bus.
        hub: The runtime's change hub (its ``relay`` is set by `start`).
        alarms: The runtime's alarm index (`AlarmIndex.hint`).
        run_sync: Runs a blocking call off the loop (the runtime's storage threads).
        clock: The runtime's clock (due times, frame ages).
        poll_seconds: How often alarms are read and presence is announced (real seconds).
        horizon_seconds: How far ahead the poll reads alarms.
        grace_seconds: The wake-up grace (see the module doc).
        frame_keep_seconds: How long frames stay in the table.
        claiming_nodes: Reads the node ids holding a live lease that claim runs
            (`StorageBackend.claiming_nodes`; blocking, called through ``run_sync``).
        claims: Whether this node claims runs (``max_concurrent_runs`` > 0). A node that
            claims none neither announces itself nor answers wake-ups (no thread ranks
            it: its lease row says it claims nothing).
    """

    def __init__(
        self, bus: ClusterBus, hub: ChangeHub, alarms: AlarmIndex, run_sync: RunSync,
        clock: Clock, *, poll_seconds: float, horizon_seconds: float, grace_seconds: float,
        frame_keep_seconds: float, claiming_nodes: Callable[[], list[str]],
        claims: bool = True,
    ) -> None:
        self.bus = bus
        self.hub = hub
        self.alarms = alarms
        self._run_sync = run_sync
        self._clock = clock
        self.poll_seconds = poll_seconds
        self.horizon_seconds = horizon_seconds
        self.grace_seconds = grace_seconds
        self.frame_keep_seconds = frame_keep_seconds
        self.claims = claims
        self._claiming_nodes = claiming_nodes
        # The node id: what the live leases name, wake-ups carry and threads rank by.
        self.node = getattr(bus, "node", "") or hashlib.blake2b(
            repr(id(self)).encode(), digest_size=8).hexdigest()
        # What this process's frame notifications carry (`encode_frames`).
        self._frames_sender: str = getattr(bus, "sender", "") or self.node
        self._loop: asyncio.AbstractEventLoop | None = None
        self._store: RuntimeStore | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._fills: set[asyncio.Future[Any]] = set()  # `_fill`s running (`flush` waits)
        # The claiming nodes with a live lease as the last poll read them, and the nodes
        # heard announcing themselves (loop time) since that read began.
        self._members: set[str] = set()
        self._read_at = -math.inf
        self._heard: dict[str, float] = {}
        self._polled: dict[str, float] = {}  # thread -> the row value last hinted
        # Frames: to write, and the delivery state of subscribed threads.
        self._queue: deque[ThreadEvent] = deque()
        self._queued = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._order: dict[str, _Order] = {}
        # `_caught_up`: its markers waiting to come back, and the appends begun and done.
        self._syncs: dict[str, asyncio.Future[None]] = {}
        self._sync_count = 0
        self._appends_begun = 0
        self._appends_done = 0
        self._appended = asyncio.Event()
        self._taken = 0  # frames taken off the queue so far (written, or dropped)
        self.polls = 0
        self._wake_listening = False
        self._frames_listening = False
        self.wakeups_armed = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self, store: RuntimeStore) -> None:
        """Listen, set the hub's relay and start the poll, writer and pruning tasks."""
        self._loop = asyncio.get_running_loop()
        self._store = store
        self.bus.listen(NODES_CHANNEL, self._on_presence)
        self.bus.listen(WAKE_CHANNEL, self._on_wake, on_reconnect=self._on_wake_reconnect)
        self.bus.listen(FRAMES_CHANNEL, self._on_frames, on_reconnect=self._on_frames_reconnect)
        self.hub.relay = self
        for name, coro in (("poll", self._poll_loop()), ("frames", self._write_loop()),
                           ("prune", self._prune_loop())):
            self._tasks.append(asyncio.create_task(coro, name=f"thread-effects-cluster-{name}"))

    async def flush(self, wait_seconds: float) -> bool:
        """Wait up to ``wait_seconds`` for the queued frames to reach this node's streams.

        They are written to the table, then handed to this node's subscribers. The first
        frame of a thread that reaches this node's subscribers is handed on after a read
        of the table (`_fill`, the frame before it may not be written yet):
        the reads running are waited for too, so that a shutdown's last frames (its
        ``requeued`` frames) reach this node's own streams before they are closed.

        Returns:
            True if all that happened in time.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_seconds):
                await self._idle.wait()
                while self._fills:
                    await asyncio.wait(list(self._fills))
                return True
        return False

    async def close(self) -> None:
        """Stop the tasks and stop listening (call after `flush`)."""
        self.bus.unlisten(NODES_CHANNEL, self._on_presence)
        self.bus.unlisten(WAKE_CHANNEL, self._on_wake)
        self.bus.unlisten(FRAMES_CHANNEL, self._on_frames)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.hub.relay is self:
            self.hub.relay = None

    # ------------------------------------------------------------------ presence

    def live_nodes(self) -> list[str]:
        """The nodes a thread's wake-ups are ranked over, sorted.

        The claiming nodes holding a live lease as the last poll read them, those heard
        announcing themselves since that read began, and this node if it claims.
        """
        live = self._members | {n for n, at in self._heard.items() if at >= self._read_at}
        if self.claims:
            live.add(self.node)
        return sorted(live)

    def _on_presence(self, payload: str) -> None:
        assert self._loop is not None
        self._heard[payload] = self._loop.time()

    async def _read_members(self) -> None:
        """Read the claiming nodes with a live lease (`StorageBackend.claiming_nodes`)."""
        assert self._loop is not None
        started = self._loop.time()
        members = await self._run_sync(self._claiming_nodes)
        self._members = set(members)
        self._read_at = started
        self._heard = {n: at for n, at in self._heard.items() if at >= started}

    # ------------------------------------------------------------------ wake-ups

    def _on_wake(self, payload: str) -> None:
        try:
            sender, thread_id, due_at = decode_wake(payload)
        except ValueError:
            log.warning("cluster: ignoring a malformed wake-up %r", payload[:200])
            return
        if sender == self.node or not self.claims:
            return  # this node armed it when it scheduled the run, or runs nothing
        if self.alarms.runs_here(thread_id):
            # This node runs the thread: it alone can start the run now (a concurrent
            # effect's, beside the running run), whatever the ranking; no grace.
            self._spawn(self._hint(thread_id, due_at, due_at, None))
            return
        live = self.live_nodes()
        others = [n for n in live if n != sender]
        if not others or rank(others, thread_id)[0] != self.node:
            return
        # A sender that claims no run (an API front, ``max_concurrent_runs`` 0) never
        # takes it: no grace to leave it, the first-ranked node wakes the thread at due.
        grace = self.grace_seconds if sender in live else 0.0
        self._spawn(self._hint(thread_id, due_at, due_at + grace, None))

    def _on_wake_reconnect(self) -> None:
        if not self._wake_listening:  # the first time: the poll loop's first poll does it
            self._wake_listening = True
            return
        # Wake-ups sent while the bus reconnected are lost: read the alarm window now.
        self._spawn(self._poll_once())

    async def _poll_once(self) -> None:
        """One poll out of the loop: a failure is one warning line (the loop goes on)."""
        try:
            await self.poll()
        except Exception as exc:
            log.warning("cluster: the alarm poll after the bus reconnected failed (%s); "
                        "the next poll retries", exc)

    async def _hint(self, thread_id: str, due_at: float, arm_at: float,
                    row: float | None) -> None:
        try:
            if await self.alarms.hint(thread_id, due_at, arm_at, row=row):
                self.wakeups_armed += 1
        except Exception:
            log.exception("cluster: could not arm thread %s", thread_id)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.append(task)
        task.add_done_callback(self._forget)
        return task

    def _spawn_fill(self, coro: Awaitable[Any]) -> None:
        fill = self._spawn(coro)
        self._fills.add(fill)
        fill.add_done_callback(self._fills.discard)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    async def poll(self) -> int:
        """Read the live claiming nodes and the alarms due within the horizon; hint rows.

        Announces this node first. A node that claims no run does none of it (it counts
        the poll).

        Returns:
            How many alarm rows the window held.
        """
        assert self._store is not None
        if not self.claims:
            self.polls += 1
            return 0  # ranked by nobody, it wakes nothing
        await self._run_sync(self.bus.notify, NODES_CHANNEL, self.node)
        await self._read_members()
        now = self._clock.now()
        rows = await self._run_sync(self._store.load_alarms, now + self.horizon_seconds)
        live = self.live_nodes()
        seen: dict[str, float] = {}
        for thread_id, due_at in rows:
            seen[thread_id] = due_at
            if self._polled.get(thread_id) == due_at and due_at > now - self.poll_seconds:
                # Hinted at this value already. A row still at a value due a whole poll
                # ago is hinted again: the node that would move it (by draining the
                # thread) may have died holding its timer.
                continue
            if due_at < now - self.grace_seconds:
                # Overdue past the grace: the nodes ranked first did not take it (dead
                # with their leases not yet expired, busy, deaf to the bus). Every live
                # claiming node tries now; the claim lets one run it.
                await self._hint(thread_id, due_at, now, due_at)
                continue
            order = rank(live, thread_id)
            place = order.index(self.node)
            if place > 1 and not self.alarms.runs_here(thread_id):
                # The first two nodes of its ranking look after it (and the node that
                # runs it now, which alone can start a concurrent effect's run beside).
                continue
            await self._hint(thread_id, due_at, due_at + (place + 1) * self.grace_seconds,
                             due_at)
        self._polled = seen
        self.polls += 1
        return len(rows)

    async def _poll_loop(self) -> None:
        # While the database is unreachable: one warning line, then retries backing off
        # from the poll period, doubling up to `POLL_BACKOFF_FACTOR` times it.
        delay = self.poll_seconds
        failing = False
        while True:
            try:
                await self.poll()
            except Exception as exc:
                if not failing:
                    log.warning("cluster: the alarm poll failed (%s); retrying with backoff",
                                exc)
                failing = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.poll_seconds * POLL_BACKOFF_FACTOR)
                continue
            if failing:
                log.info("cluster: the alarm poll works again")
            failing, delay = False, self.poll_seconds
            await asyncio.sleep(self.poll_seconds)

    # ------------------------------------------------------------------ frames: out

    def send(self, event: ThreadEvent) -> None:
        """Queue an event of this node to be numbered and announced (`FrameRelay`)."""
        self._queue.append(event)
        if len(self._queue) > MAX_QUEUED_FRAMES:
            dropped = self._queue.popleft()
            self._taken += 1
            log.error("cluster: over %d frames wait for the database; dropping one of "
                      "thread %s (its clients will see a gap)", MAX_QUEUED_FRAMES,
                      dropped.thread_id)
        self._idle.clear()
        self._queued.set()

    async def sent_so_far(self, wait_seconds: float) -> bool:
        """Wait up to ``wait_seconds`` for the frames queued before this call to be written.

        Frames queued later are not waited for (the wait ends under a steady stream of
        changes). A frame dropped from a full queue counts as written.

        Returns:
            True if they were written in time.
        """
        target = self._taken + len(self._queue)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_seconds):
                while self._taken < target:
                    self._appended.clear()
                    await self._appended.wait()
                return True
        return False

    def deletion_draft(self, thread_id: str) -> tuple[FrameDraft, list[ThreadEvent]]:
        """The ``thread_deleted`` frame of ``thread_id``, for its deletion's own transaction.

        `RuntimeStore.delete_thread` numbers, stores and announces it as the deletion
        commits, so the other nodes end the thread's streams whatever becomes of this node
        afterwards. Its ``render`` puts the numbered event in the list returned with it,
        for `deliver_written` (this node's own notifications are skipped unread).
        """
        numbered: list[ThreadEvent] = []
        return self._draft(ThreadDeleted(thread_id=thread_id, seq=0), numbered), numbered

    def deliver_written(self, numbered: list[ThreadEvent]) -> None:
        """Hand a frame that its change's transaction wrote to this node's subscribers.

        ``numbered`` is what the draft's ``render`` put there (`deletion_draft`): empty if
        the frame was not written, and only its last entry is the committed one (a retried
        transaction renders again). Delivered in the thread's ``seq`` order, as the
        relay's own frames are.
        """
        if numbered:
            self._deliver_own(numbered[-1:])

    @staticmethod
    def _draft(event: ThreadEvent, numbered: list[ThreadEvent]) -> FrameDraft:
        """``event``'s draft; its ``render`` appends the numbered event to ``numbered``."""

        def render(seq: int) -> str:
            event_n = replace(event, seq=seq)
            numbered.append(event_n)
            return event_n.frame_text()

        kind = event.event_type if isinstance(event, RelayedFrame) else EVENT_TYPES[type(event)]
        # A seq set already was taken in the change's transaction: the frame keeps it.
        return FrameDraft(event.thread_id, kind, render, event.seq or None)

    async def _write_loop(self) -> None:
        delay = _RETRY_FIRST_SECONDS
        # While the database cannot be reached: one line per outage, not one per retry.
        failures = OutageLog(log, "cluster: writing frames")
        loop = asyncio.get_running_loop()
        appended_at = -FRAME_APPEND_INTERVAL  # loop.time() the last append started
        while True:
            if not self._queue:
                self._idle.set()
                self._queued.clear()
                await self._queued.wait()
            if len(self._queue) < FRAME_BATCH:
                # Frames keep coming: let them gather for the rest of the interval.
                wait = appended_at + FRAME_APPEND_INTERVAL - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            appended_at = loop.time()
            batch = [self._queue[i] for i in range(min(FRAME_BATCH, len(self._queue)))]
            numbered: list[ThreadEvent] = []
            self._appends_begun += 1
            try:
                await self._run_sync(self.bus.append_frames,
                                     [self._draft(e, numbered) for e in batch],
                                     self._clock.now())
            except Exception as exc:
                if self._drop_unrenderable(batch):
                    continue  # the rest of the batch goes on at once
                if database_unreachable(exc):
                    failures.failed(exc, f"{len(self._queue)} frame(s) wait; retried with "
                                         f"backoff up to {_RETRY_MAX_SECONDS:g} s")
                else:
                    log.warning("cluster: could not write %d frame(s) (%s); retrying in %g s",
                                len(batch), exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_SECONDS)
                continue
            failures.ok()
            delay = _RETRY_FIRST_SECONDS
            for _ in batch:
                self._queue.popleft()
            self._taken += len(batch)
            # This node's own frames go to its subscribers from the append's result: its
            # own notifications are skipped unread (`_on_frames`).
            self._deliver_own(numbered)
            self._appends_done = self._appends_begun
            self._appended.set()
            await asyncio.sleep(0)  # one batch per loop turn: the loop's other work goes on

    def _drop_unrenderable(self, batch: list[ThreadEvent]) -> bool:
        """Drop from the queue the frames of ``batch`` whose rendering raises.

        Called when an append failed: a frame that cannot be rendered would fail every
        retry and hold back every thread's frames behind it. Each one is logged (its
        thread, the reason) and counted as taken; it took no ``seq`` (or, numbered in its
        change's transaction, leaves a gap), so its thread's clients reload at worst.

        Returns:
            True if any was dropped (the rest is worth appending again at once).
        """
        bad: set[int] = set()
        for event in batch:
            try:
                replace(event, seq=event.seq or 1).frame_text()
            except Exception as exc:  # whatever it is, this frame cannot go out
                bad.add(id(event))
                log.error("cluster: dropping a frame of thread %s that cannot be rendered "
                          "(%s: %s); its clients will see a gap", event.thread_id,
                          type(exc).__name__, exc)
        if not bad:
            return False
        kept = [e for e in self._queue if id(e) not in bad]
        self._taken += len(self._queue) - len(kept)
        self._queue.clear()
        self._queue.extend(kept)
        self._appended.set()
        return True

    def _deliver_own(self, numbered: list[ThreadEvent]) -> None:
        hub = self.hub
        # A frame numbered in its change's transaction may come after frames of its
        # thread numbered later in the batch: each thread's frames go out in seq order,
        # in the places its frames held in the batch (other threads' frames keep theirs,
        # so a stream of every thread sees the changes in the order they were made).
        by_thread: dict[str, list[ThreadEvent]] = {}
        for event in numbered:
            by_thread.setdefault(event.thread_id, []).append(event)
        for events in by_thread.values():
            events.sort(key=lambda e: e.seq, reverse=True)
        for event in [by_thread[e.thread_id].pop() for e in numbered]:
            if hub.subscribed(event.thread_id) or hub.subscribed_to_all:
                self._offer(event.thread_id, event.seq, event)
            else:
                self._order.pop(event.thread_id, None)

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(PRUNE_EVERY_SECONDS)
            try:
                await self._run_sync(self.bus.prune_frames,
                                     self._clock.now() - self.frame_keep_seconds)
            except Exception as exc:
                log.warning("cluster: could not prune old frames (%s)", exc)

    # ------------------------------------------------------------------ frames: in

    def _on_frames(self, payload: str) -> None:
        sender, threads = frames_header(payload)
        if sender == self._frames_sender:
            # Delivered from the append's result already (`_write_loop`); or a marker.
            if threads and threads[0] in self._syncs:
                future = self._syncs[threads[0]]
                if not future.done():
                    future.set_result(None)
            return
        hub = self.hub
        if not hub.subscribed_to_all:
            wanted = False
            for thread_id in threads:
                if hub.subscribed(thread_id):
                    wanted = True
                elif self._order:
                    self._order.pop(thread_id, None)
            if not wanted:
                return  # no subscriber here of any of its threads: the frames stay unread
        try:
            _, frames = decode_frames(payload)
        except ValueError:
            log.warning("cluster: ignoring a malformed frames notification")
            return
        for f in frames:
            event: ThreadEvent | None = None
            if f.text is not None:
                event = RelayedFrame(f.thread_id, f.seq, f.kind, f.text)
            if not hub.subscribed(f.thread_id) and not hub.subscribed_to_all:
                self._order.pop(f.thread_id, None)
                continue
            # Subscribers of every thread's run changes get them in each thread's seq
            # order too: a run's `scheduled` frame, numbered in the run's transaction on
            # the node that scheduled it, can reach this node after its `started` frame
            # from the node that claimed it. (Every frame of the thread goes through the
            # order, the hub hands on only the run changes and deletions.)
            self._offer(f.thread_id, f.seq, event)

    def _offer(self, thread_id: str, seq: int, event: ThreadEvent | None) -> None:
        order = self._order.get(thread_id)
        if order is None:  # the first frame since this node subscribed
            if len(self._order) >= MAX_IDLE_ORDERS:
                self._forget_idle()
            order = self._order[thread_id] = _Order(next_seq=seq, buffer={})
            if seq > 1:
                # The number before it may be a frame numbered in its change's transaction
                # and not written yet (a run's scheduled frame, this one its start): the
                # fill looks for it, skips it if it is stored already (made before this
                # first frame came), else waits for it as for any missing number.
                order.next_seq, order.probe = seq - 1, True
        if seq < order.next_seq:
            return  # delivered already (a fill read it from the table), or skipped
        order.buffer[seq] = event
        if order.arrived is not None:
            order.arrived.set()  # a fill waits for a missing number: maybe this one
        self._release(thread_id, order)

    def _forget_idle(self) -> None:
        """Forget the idle delivery states of threads nobody here subscribes to by id."""
        hub = self.hub
        for thread_id, order in list(self._order.items()):
            if not order.buffer and not order.filling and not hub.subscribed(thread_id):
                del self._order[thread_id]

    def _deliver_ready(self, thread_id: str, order: _Order) -> bool:
        """Deliver the buffered frames that follow on from ``order.next_seq``, in order.

        Returns:
            False if nobody here subscribes to the thread any more (``order`` replaced).
        """
        buffer = order.buffer
        while order.next_seq in buffer and buffer[order.next_seq] is not None:
            event = buffer.pop(order.next_seq)
            assert event is not None
            order.next_seq += 1
            self.hub.deliver_numbered(event)
            if self._order.get(thread_id) is not order:
                return False
            if isinstance(event, ThreadDeleted) or (
                    isinstance(event, RelayedFrame) and event.event_type == "thread_deleted"):
                # The thread's streams ended; a thread created again with its id numbers
                # on from here (its first frame starts a new order).
                self._order.pop(thread_id, None)
                return False
        return True

    def _release(self, thread_id: str, order: _Order) -> None:
        if order.filling:
            return
        if not self._deliver_ready(thread_id, order):
            return
        buffer = order.buffer
        if buffer:  # a gap, or a frame announced without its text: read the table
            order.filling = True
            self._spawn_fill(self._fill(thread_id, order, max(buffer)))

    async def _fill(self, thread_id: str, order: _Order, upto: int | None) -> None:
        # Read what is missing from the table; deliver what follows on; while a number
        # is still missing, wait for it (its frame comes, or the table has it) up to
        # `GAP_WAIT_SECONDS` from the last progress, then skip it as a gap.
        loop = asyncio.get_running_loop()
        buffer = order.buffer
        since = loop.time()
        read = True
        while True:
            if read:
                try:
                    rows = await self._run_sync(self.bus.read_frames, thread_id,
                                                order.next_seq - 1, upto)
                except Exception as exc:
                    log.warning("cluster: could not read missed frames of thread %s (%s)",
                                thread_id, exc)
                    break
                if order.probe:
                    order.probe = False
                    if rows and rows[0][0] == order.next_seq:
                        # The number before the first frame is stored: it reached this
                        # node before it subscribed (skipped) or is on its way (delivered).
                        rows = rows[1:]
                        await self._caught_up()
                        if buffer.get(order.next_seq) is None:
                            buffer.pop(order.next_seq, None)
                            order.next_seq += 1
                for seq, kind, text in rows:
                    if seq >= order.next_seq and buffer.get(seq) is None:
                        buffer[seq] = RelayedFrame(thread_id, seq, kind, text)
            if self._order.get(thread_id) is not order:
                return  # nobody here subscribes to the thread any more
            start = order.next_seq
            if not self._deliver_ready(thread_id, order):
                return
            if not buffer:
                order.filling = False
                order.arrived = None
                return
            now = loop.time()
            if order.next_seq != start:
                since = now
            left = since + GAP_WAIT_SECONDS - now
            if left <= 0:
                # The missing numbers up to the next frame known never came (their node
                # died before relaying them) or were pruned: a real gap.
                while buffer and buffer.get(order.next_seq) is None:
                    buffer.pop(order.next_seq, None)
                    order.next_seq += 1
                since, read = now, False
                continue
            if order.arrived is None:
                order.arrived = asyncio.Event()
            order.arrived.clear()
            try:
                async with asyncio.timeout(min(left, GAP_RECHECK_SECONDS)):
                    await order.arrived.wait()
            except TimeoutError:
                read = True
            else:  # a frame came: read the table only if the next one has no text
                read = order.next_seq in buffer and buffer[order.next_seq] is None
            upto = max(buffer) if buffer else upto
        order.filling = False
        order.arrived = None
        # The table cannot be read: whatever is missing up to the highest frame known
        # is skipped (a gap; its subscribers reload).
        while buffer:
            if order.next_seq in buffer and buffer[order.next_seq] is not None:
                event = buffer.pop(order.next_seq)
                assert event is not None
                self.hub.deliver_numbered(event)
            else:
                buffer.pop(order.next_seq, None)
            order.next_seq += 1
            if self._order.get(thread_id) is not order:
                return

    async def _caught_up(self) -> None:
        r"""Return once every frame stored before this call reached this node (or not).

        Frames of other nodes: a marker notification of this node's own on the ``frames``
        channel (``<node>\t~sync<n>``, no frames: other nodes drop it unread) comes back
        after every notification committed before it (PostgreSQL delivers notifications
        in commit order). This node's own: the appends begun before are done. Waits at
        most `GAP_WAIT_SECONDS`; a failure to send the marker ends it at once.
        """
        assert self._loop is not None
        self._sync_count += 1
        key = f"~sync{self._sync_count}"
        future: asyncio.Future[None] = self._loop.create_future()
        self._syncs[key] = future
        begun = self._appends_begun
        try:
            async with asyncio.timeout(GAP_WAIT_SECONDS):
                await self._run_sync(self.bus.notify, FRAMES_CHANNEL,
                                     f"{self._frames_sender}\t{key}")
                await future
                while self._appends_done < begun:
                    self._appended.clear()
                    await self._appended.wait()
        except TimeoutError:
            pass
        except Exception as exc:
            log.warning("cluster: could not tell which frames reached this node (%s)", exc)
        finally:
            del self._syncs[key]

    def _on_frames_reconnect(self) -> None:
        # Frames announced while the bus was down are in the table: read them. Those of
        # threads kept only for the subscribers of every thread are not read: those
        # subscribers are dropped below (they reload), and a thread's next frame starts
        # its order afresh.
        for thread_id, order in list(self._order.items()):
            if not self.hub.subscribed(thread_id) and not order.filling:
                del self._order[thread_id]
            elif not order.filling:
                order.filling = True
                self._spawn_fill(self._fill(thread_id, order, None))
        if not self._frames_listening:  # the first time: nothing was missed
            self._frames_listening = True
            return
        # Taken now: one whose first frame comes after this may have missed some before.
        self._spawn(self._drop_unnumbered(
            [t for t in self.hub.subscribed_threads() if t not in self._order]))

    async def _drop_unnumbered(self, threads: list[str]) -> None:
        """Tell the subscribers with no frame number to fill from that they may have missed some.

        After the bus reconnected: a subscriber of a thread that had no frame here since it
        subscribed has no number to read the table from, nor has one of every thread's run
        changes. Those of a thread still registered are dropped (`ChangeHub.drop_subscribers`:
        a WebSocket client is closed with 1013, reloads and reconnects); a deleted thread's
        end as its deletion ends them (4404).
        """
        assert self._store is not None
        hub = self.hub
        registered: Collection[str] = threads
        if threads:
            try:
                registered = await self._run_sync(self._store.paused_flags, threads)
            except Exception as exc:
                log.warning("cluster: could not read which threads streamed here still "
                            "exist (%s)", exc)
        for thread_id in threads:
            if thread_id not in registered:
                hub.end_thread(thread_id)
        hub.drop_subscribers(
            [t for t in threads if t in registered],
            every_thread=True,
            reason="frames were missed while the server was not listening to the database")
