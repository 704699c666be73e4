"""Change events per thread and their subscribers (docs/design.md, "Frames").

The event classes live in `runtime.events`; this module numbers them per thread (one
``seq`` for every kind) and delivers them.
Publishing never awaits a subscriber: a thread's subscribers share one log of its recent
events (an event is appended once, whatever their number, `_Feed`), each reads it from its
own position, and one that falls more than its ``maxsize`` behind is cut off
(`SubscriptionOverflow`) rather than slowing the others or the runtime.

Besides per-thread subscribers, the hub has *listeners*: plain callbacks that see every
event of every thread as it is published (`ChangeHub.add_listener`). They are how the
core's run log (`runtime.telemetry`) and the server's Prometheus metrics
(`runtime.metrics`) observe runs without the core importing either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from runtime.effects import EffectRun, replace_run
from runtime.errors import SubscriptionOverflow
from runtime.events import (
    EVENT_TYPES,
    EffectChanged,
    EffectRecordChanged,
    MessageCreated,
    RecordChange,
    RelayedFrame,
    RunChange,
    ScheduleChange,
    ScheduleChanged,
    ThreadDeleted,
    ThreadEvent,
)
from runtime.messages import Message
from runtime.recurrence import Schedule

__all__ = ["ChangeHub", "Listener", "Subscription", "ThreadEvent"]

_E = TypeVar("_E", EffectChanged, MessageCreated, EffectRecordChanged, ScheduleChanged)

log = logging.getLogger("runtime")

_LINGER_ROOM = 16
"""A batching reader lingers only while this many events or more fit in a quarter of its
queue (`Subscription.next_batch`)."""

ALL_THREADS = "*"
"""The key of the subscriptions to every thread's run changes (not a valid thread id)."""

Listener = Callable[[ThreadEvent], None]
"""A callback that sees every event of every thread (`ChangeHub.add_listener`)."""


class FrameRelay(Protocol):
    """Where a hub sends its events instead of numbering them itself (`ChangeHub.relay`)."""

    def send(self, event: ThreadEvent) -> None:
        """Number ``event`` across nodes and deliver it (later, in ``seq`` order).

        An event whose ``seq`` is set (not 0) was numbered in its change's transaction:
        it keeps that number.
        """


class _Feed:
    """The recent events of one key (a thread, or `ALL_THREADS`), shared by its subscriptions.

    Each event is appended once, whatever the number of subscribers; a subscription is a
    cursor into this log (an absolute index: the feed's ``head`` counts every event ever
    appended). Publishing costs O(1): the subscriptions that an append leaves more than
    ``maxsize`` events behind are found by their cursor (`at`), the readers to wake by the
    head they wait for (`wakers`). Events no open subscription still needs are dropped, so
    the log never holds more than ``maxsize`` events (plus a compaction margin).
    """

    __slots__ = ("at", "base", "events", "head", "low", "maxsize", "subs", "wakers")

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.events: list[ThreadEvent] = []
        self.base = 0  # the index of events[0]
        self.low = 0  # no open subscription's cursor is below this (base <= low <= head)
        self.head = 0  # the index of the next event appended
        self.subs: set[Subscription] = set()
        # cursor → the open subscriptions whose next unread event is that index
        self.at: dict[int, set[Subscription]] = {}
        # head → the subscriptions waiting until the head reaches it (stale entries are
        # skipped: a subscription wakes only for the target it waits for now)
        self.wakers: dict[int, list[Subscription]] = {}

    def append(self, event: ThreadEvent) -> None:
        self.events.append(event)
        head = self.head = self.head + 1
        # Those now maxsize + 1 behind (their cursor is exactly that far: the ones further
        # behind were cut off by an earlier append).
        behind = self.at.pop(head - 1 - self.maxsize, None)
        if behind:
            for sub in list(behind):
                sub._overflow()
            self._trim()
        woken = self.wakers.pop(head, None)
        if woken:
            for sub in woken:
                if sub._wake_target == head:
                    sub._ready.set()

    def move(self, sub: Subscription, old: int, new: int) -> None:
        """``sub``'s cursor goes from ``old`` to ``new`` (-1: it joins, or leaves, the feed)."""
        at = self.at
        if new >= 0:  # first: trimming below must see where it is now
            group = at.get(new)
            if group is None:
                at[new] = {sub}
            else:
                group.add(sub)
        group = at.get(old)
        if group is not None:
            group.discard(sub)
            if not group:
                del at[old]
                if old == self.low:
                    self._trim()

    def _trim(self) -> None:
        # Drop the events before the oldest cursor; compact the list only now and then
        # (amortized O(1) per event).
        low, head, at = self.low, self.head, self.at
        while low < head and low not in at:
            low += 1
        self.low = low
        drop = low - self.base
        if drop and (low == head or drop >= 256 or drop * 2 >= len(self.events)):
            del self.events[:drop]
            self.base = low

    def since(self, cursor: int) -> list[ThreadEvent]:
        """The events from index ``cursor`` to the head, oldest first."""
        return self.events[cursor - self.base:]


class Subscription(AsyncIterator[ThreadEvent]):
    """An async iterator over one thread's events, from the moment it was made.

    It yields `EffectChanged`, `MessageCreated`, `EffectRecordChanged` and
    `ScheduleChanged` events in the
    order they happened; tell them apart with ``isinstance`` (or use ``to_frame()``, which
    says which it is).

    Iteration ends when the subscription is closed (the thread was deleted or the runtime
    shut down) and raises `SubscriptionOverflow` if more than ``maxsize`` events piled up
    unread. Use it as ``async with`` or call `close` to stop receiving.

    The subscriptions of one thread share one log of its recent events (each event is
    stored once, whatever the number of subscribers); a subscription is a position in it.
    """

    def __init__(self, hub: ChangeHub, thread_id: str, maxsize: int, feed: _Feed) -> None:
        self.thread_id = thread_id
        self.maxsize = maxsize
        self.overflowed = False
        self.closed = False
        self.dropped = 0
        self.lost: str | None = None
        """Why it was dropped though it kept up (`ChangeHub.drop_subscribers`), or None."""
        self._hub = hub
        self._feed = feed
        self._cursor = feed.head
        self._rest: deque[ThreadEvent] = deque()  # once closed: the unread events it yields
        self._ready = asyncio.Event()
        self._wake_target = -1  # the feed head a waiting reader wakes at (-1: not waiting)
        self._ended: asyncio.Event | None = None
        feed.subs.add(self)
        feed.move(self, -1, self._cursor)

    @property
    def pending(self) -> int:
        """How many events it holds that were not read yet."""
        if self.closed:
            return len(self._rest)
        return self._feed.head - self._cursor

    @property
    def linger_fill(self) -> int:
        """How many unread events end a batching reader's linger (`next_batch`).

        A quarter of ``maxsize`` (the rest is room for what is published before the reader
        runs again); 0 for a queue shorter than four times `_LINGER_ROOM` (never lingers).
        """
        fill = self.maxsize // 4
        return fill if fill >= _LINGER_ROOM else 0

    @property
    def position(self) -> int | None:
        """Where it reads in the thread's shared event log (None once closed).

        Two open subscriptions of the same `source` at the same position hold the same
        unread events: a writer of many clients builds their bytes once.
        """
        return None if self.closed else self._cursor

    @property
    def source(self) -> object:
        """The shared event log it reads (an opaque key).

        The same object for every subscription of the thread (or of every thread's run
        changes) on this hub, while one of them stays open.
        """
        return self._feed

    def take(self) -> list[ThreadEvent]:
        """Every event it holds now, oldest first, marked read (empty if none).

        Raises:
            SubscriptionOverflow: if it fell more than ``maxsize`` events behind.
        """
        if self.overflowed:
            self._raise_overflow()
        if self.closed:
            rest = list(self._rest)
            self._rest.clear()
            return rest
        feed = self._feed
        cursor, head = self._cursor, feed.head
        if cursor == head:
            return []
        events = feed.since(cursor)
        self._cursor = head
        feed.move(self, cursor, head)
        return events

    def _raise_overflow(self) -> None:
        if self.lost is not None:
            raise SubscriptionOverflow(
                f"Subscriber of thread {self.thread_id} was dropped: {self.lost}; reload "
                f"over HTTP and subscribe again")
        raise SubscriptionOverflow(
            f"Subscriber of thread {self.thread_id} fell more than {self.maxsize} "
            f"events behind and was dropped; reload over HTTP and subscribe again"
        )

    def _overflow(self) -> None:
        feed = self._feed
        self.overflowed = True
        self.dropped = feed.head - self._cursor
        feed.move(self, self._cursor, -1)
        self._end()

    def _end(self) -> None:
        self.closed = True
        self._feed.subs.discard(self)
        self._hub._remove(self)
        self._ready.set()
        if self._ended is not None:
            self._ended.set()

    async def wait_closed(self) -> None:
        """Return once the subscription is closed (by `close`, the hub, or an overflow).

        Events still buffered can be read afterwards (not after an overflow: ``dropped``
        then counts the events it discarded, the one that did not fit included).
        """
        if self._ended is None:
            self._ended = asyncio.Event()
            if self.closed:
                self._ended.set()
        await self._ended.wait()

    def close(self) -> None:
        """Stop receiving; events already delivered to it are still yielded, then iteration ends.

        On PostgreSQL an event reaches subscribers after the database numbered it (one
        round trip after its change), so an event of a change made just before ``close``
        may not be delivered yet: wait for the event itself, not for the call that made it.
        """
        if not self.closed:
            feed = self._feed
            self._rest = deque(feed.since(self._cursor))
            feed.move(self, self._cursor, -1)
            self._end()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> ThreadEvent:
        while True:
            if self.overflowed:
                self._raise_overflow()
            if self.closed:
                if self._rest:
                    return self._rest.popleft()
                raise StopAsyncIteration
            feed = self._feed
            cursor = self._cursor
            if cursor < feed.head:
                event = feed.events[cursor - feed.base]
                self._cursor = cursor + 1
                feed.move(self, cursor, cursor + 1)
                return event
            await self.wait(1)

    async def wait(self, count: int = 1) -> None:
        """Return once it holds ``count`` unread events (at once if it does) or is closed."""
        if self.closed:
            return
        target = self._cursor + count
        feed = self._feed
        if feed.head >= target:
            return
        self._ready.clear()
        self._wake_target = target
        waiting = feed.wakers.get(target)
        if waiting is None:
            feed.wakers[target] = [self]
        else:
            waiting.append(self)
        try:
            await self._ready.wait()
        finally:
            self._wake_target = -1

    async def next_batch(self, linger_until: float | None = None) -> list[ThreadEvent]:
        """Every event buffered now (waiting for at least one), oldest first.

        What a writer that sends many events at once uses instead of iterating. With
        ``linger_until`` (the loop's clock, ``loop.time()``, seconds), once an event is
        there it waits further, until then, for more to come with it, but no longer than
        until a quarter of ``maxsize`` is buffered (the rest is room for what is published
        before the reader runs again; a queue shorter than four times `_LINGER_ROOM` never
        lingers). Returns an empty list once the subscription is closed and everything was read.

        Raises:
            SubscriptionOverflow: as iteration does.
        """
        while True:
            if self.overflowed:
                self._raise_overflow()
            pending = self.pending
            fill = self.linger_fill
            if pending and linger_until is not None and not self.closed and pending < fill:
                remaining = linger_until - asyncio.get_running_loop().time()
                linger_until = None
                if remaining > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(remaining):
                            await self.wait(fill)
                    continue
            if pending:
                return self.take()
            if self.closed:
                return []
            await self.wait(1)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class _Kept:
    """A held thread's events not delivered yet (`ChangeHub.hold`)."""

    __slots__ = ("events", "taken")

    def __init__(self) -> None:
        self.events: deque[ThreadEvent] = deque()
        self.taken = 0  # events kept since the hold, released ones included


class ChangeHub:
    """Per-thread sequence numbers and subscriber sets. Event-loop only (not thread-safe)."""

    def __init__(self, queue_size: int) -> None:
        self.queue_size = queue_size
        self._seq: dict[str, int] = {}
        self._feeds: dict[str, _Feed] = {}  # thread id (or ALL_THREADS) → its subscriptions' log
        self._listeners: list[Listener] = []
        self._kept: dict[str, _Kept] = {}  # thread id → its events held back (`hold`)
        self.relay: FrameRelay | None = None
        """None: this hub numbers and delivers events itself (one process per backend).
        Set (a backend several nodes share, `runtime.cluster`): events go to the relay,
        which numbers them across nodes and hands them back through `deliver_numbered`;
        listeners still see each event at once (with ``seq`` 0, or the number it took in
        its change's transaction), and only this node's."""

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(event)`` for every event of every thread, as it is published.

        Called on the event loop, synchronously, before the subscribers get the event; it
        must be quick and must not block. An exception it raises is logged and ignored (an
        observer never fails a run). Adding the same listener twice has no effect.
        """
        if listener not in self._listeners:
            self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling ``listener``; no effect if it was not added."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def subscribe(self, thread_id: str) -> Subscription:
        """A new subscription to a thread's events."""
        return Subscription(self, thread_id, self.queue_size, self._feed(thread_id))

    def subscribe_runs(self) -> Subscription:
        """A new subscription to the run changes (`EffectChanged`) of every thread.

        Each event keeps its thread's ``seq``. It ends at shutdown (`close_all`), not when
        a thread is deleted: it gets a `ThreadDeleted` event then. Like any subscription
        it overflows when read too slowly.
        """
        return Subscription(self, ALL_THREADS, self.queue_size, self._feed(ALL_THREADS))

    def _feed(self, key: str) -> _Feed:
        feed = self._feeds.get(key)
        if feed is None:
            feed = self._feeds[key] = _Feed(self.queue_size)
        return feed

    def _remove(self, sub: Subscription) -> None:
        feed = self._feeds.get(sub.thread_id)
        if feed is sub._feed and not feed.subs:
            del self._feeds[sub.thread_id]

    def publish(
        self, change: RunChange, run: EffectRun, seq: int | None = None
    ) -> EffectChanged:
        """Number a run's change and hand it to every subscriber of its thread, without waiting.

        The event's run carries no args (``args`` is None): changes never expose them.
        ``seq``: the number the change already took in its own transaction
        (`ThreadStore.frame_seq`, with a relay only); None: numbered as usual.
        """
        bare = run if run.args is None else replace_run(run, args=None)
        return self._deliver(
            run.thread_id,
            lambda seq: EffectChanged(thread_id=run.thread_id, seq=seq, change=change, run=bare),
            seq,
        )

    def publish_message(self, message: Message) -> MessageCreated:
        """Number a stored message and hand it to every subscriber of its thread."""
        return self._deliver(
            message.thread_id,
            lambda seq: MessageCreated(thread_id=message.thread_id, seq=seq, message=message),
        )

    def publish_record(
        self, thread_id: str, change: RecordChange, record: dict[str, Any]
    ) -> EffectRecordChanged:
        """Number an effect record's change (its wire form) and hand it to the subscribers."""
        return self._deliver(
            thread_id,
            lambda seq: EffectRecordChanged(
                thread_id=thread_id, seq=seq, change=change, record=record
            ),
        )

    def publish_schedule(self, change: ScheduleChange, schedule: Schedule) -> ScheduleChanged:
        """Number a schedule's change and hand it to the subscribers (never its args)."""
        bare = replace(schedule, args=None)
        return self._deliver(
            schedule.thread_id,
            lambda seq: ScheduleChanged(
                thread_id=schedule.thread_id, seq=seq, change=change, schedule=bare
            ),
        )

    def hold(self, thread_id: str) -> None:
        """Keep the thread's events from now on instead of delivering them, until `release`.

        They are numbered as they are published (``seq`` follows the publishing order) and
        delivered later, in that order, to the listeners and subscribers alike. For events
        whose change is committed but not durable yet (a group commit,
        `ThreadStore.group_commit`): nobody sees them before the disk flush. Holding a
        thread already held changes nothing.
        """
        if thread_id not in self._kept:
            self._kept[thread_id] = _Kept()

    def hold_mark(self, thread_id: str) -> int:
        """How many events of the thread were kept since its `hold` (0 when not held).

        Taken before a disk flush, passed to `release` after it: the events kept by then
        were committed before the flush began.
        """
        kept = self._kept.get(thread_id)
        return 0 if kept is None else kept.taken

    def release(self, thread_id: str, upto: int | None = None) -> None:
        """Deliver the thread's kept events, in order: all, or the first ``upto`` of them.

        ``upto`` is a `hold_mark` (counted since the `hold`; events already released count
        too). Once none is kept any more, the thread's events are delivered at once again.
        No effect on a thread not held.
        """
        kept = self._kept.get(thread_id)
        if kept is None:
            return
        events = kept.events
        if upto is None:
            upto = kept.taken
        while events and kept.taken - len(events) < upto:
            self._hand(thread_id, events.popleft())
        if not events:
            del self._kept[thread_id]

    def held(self, thread_id: str) -> bool:
        """Whether the thread's events are being kept (`hold`)."""
        return thread_id in self._kept

    def _deliver(self, thread_id: str, make: Callable[[int], _E], given: int | None = None,
                 ) -> _E:
        if self.relay is not None:
            event = make(given or 0)  # 0: the relay numbers it
        else:
            # One counter per thread for every kind of event: a gap means "missed
            # something".
            seq = self._seq.get(thread_id, 0) + 1
            self._seq[thread_id] = seq
            event = make(seq)
        kept = self._kept.get(thread_id)
        if kept is not None:
            kept.events.append(event)
            kept.taken += 1
        else:
            self._hand(thread_id, event)
        return event

    def _hand(self, thread_id: str, event: ThreadEvent) -> None:
        """Give a numbered event to the listeners and subscribers (or to the relay)."""
        relay = self.relay
        if relay is not None:
            for listener in self._listeners:
                try:
                    listener(event)
                except Exception:
                    log.exception("a listener of the change hub failed on %r", event)
            relay.send(event)
            return
        feeds = self._feeds
        if isinstance(event, EffectChanged) and ALL_THREADS in feeds:
            feeds[ALL_THREADS].append(event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                log.exception("a listener of the change hub failed on %r", event)
        # Once into the thread's log, whatever the number of its subscribers.
        feed = feeds.get(thread_id)
        if feed is not None:
            feed.append(event)

    def close_thread(self, thread_id: str) -> None:
        """End every subscription of a thread (it was deleted) and forget its counter.

        The subscribers of every thread (`subscribe_runs`) get a `ThreadDeleted` event
        first, numbered after the thread's last one; listeners do not (the stores forget
        the thread themselves). With a relay, the event goes through it and the
        subscriptions end when it comes back (after every event numbered before it).
        Events of the thread kept by `hold` are dropped: nobody may see them now.
        """
        self._kept.pop(thread_id, None)
        if self.relay is not None:
            self.relay.send(ThreadDeleted(thread_id=thread_id, seq=0))
            return
        event = ThreadDeleted(thread_id=thread_id, seq=self._seq.get(thread_id, 0) + 1)
        self._append(ALL_THREADS, event)
        self._close_feed(thread_id)
        self._seq.pop(thread_id, None)

    def _append(self, key: str, event: ThreadEvent) -> None:
        feed = self._feeds.get(key)
        if feed is not None:
            feed.append(event)

    def _close_feed(self, key: str) -> None:
        feed = self._feeds.get(key)
        if feed is not None:
            for sub in list(feed.subs):
                sub.close()

    def subscribed_threads(self) -> list[str]:
        """The threads this hub has subscribers of (not those of every thread's runs)."""
        return [key for key in self._feeds if key != ALL_THREADS]

    def drop_subscribers(self, thread_ids: Sequence[str], every_thread: bool,
                         reason: str) -> None:
        """Drop the subscriptions of ``thread_ids`` (and of every thread's run changes).

        For subscribers that may have missed events this hub cannot give them any more
        (with a relay: frames announced while this node was not listening, with no
        number to read them back from). Each ends as an overflow does: iterating it
        raises `SubscriptionOverflow` naming ``reason``; a WebSocket client is closed
        with 1013 and reloads.
        """
        keys = [*thread_ids, ALL_THREADS] if every_thread else list(thread_ids)
        for key in keys:
            feed = self._feeds.get(key)
            if feed is not None:
                for sub in list(feed.subs):
                    sub.lost = reason
                    sub._overflow()

    def end_thread(self, thread_id: str) -> None:
        """End a deleted thread's subscriptions, delivering no event (with a relay only).

        For a deletion this node learned of from the database rather than from the
        thread's ``thread_deleted`` frame: the frame was numbered and announced by the node
        that deleted it, and is not made again (the subscribers of every thread get it only
        from the relay).
        """
        self._close_feed(thread_id)

    def subscribed(self, thread_id: str) -> bool:
        """Whether this hub has a subscriber of ``thread_id``'s events."""
        return thread_id in self._feeds

    @property
    def subscribed_to_all(self) -> bool:
        """Whether this hub has a subscriber of every thread's run changes."""
        return ALL_THREADS in self._feeds

    def deliver_numbered(self, event: ThreadEvent) -> None:
        """Hand an event numbered by the relay to this node's subscribers (no listeners).

        The relay calls it in each thread's ``seq`` order. A thread's deletion
        (``thread_deleted``) goes to the subscribers of every thread and ends the thread's
        own subscriptions.
        """
        kind = event.event_type if isinstance(event, RelayedFrame) else EVENT_TYPES[type(event)]
        if kind in ("effect_changed", "thread_deleted"):
            self._append(ALL_THREADS, event)
        if kind == "thread_deleted":
            self._close_feed(event.thread_id)
            return
        self._append(event.thread_id, event)

    def close_all(self) -> None:
        """End every subscription (shutdown)."""
        for key in list(self._feeds):
            self._close_feed(key)
