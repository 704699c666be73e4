"""Change events per thread and their subscribers (docs/design.md, "Frames").

The event classes live in `runtime.events`; this module numbers them per thread (one
``seq`` for every kind) and delivers them.
Publishing never awaits a subscriber: each has a bounded buffer, and one that falls
behind is cut off (`SubscriptionOverflow`) rather than slowing the others or the runtime.

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
from collections.abc import AsyncIterator, Callable
from dataclasses import fields, replace
from typing import Any, Protocol, TypeVar

from runtime.effects import EffectRun
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

_NEVER = 1 << 62
"""A buffer length no subscription reaches (`Subscription._wake_at` while nobody waits)."""

_LINGER_ROOM = 16
"""A batching reader lingers only while this many events or more fit in a quarter of its
queue (`Subscription.next_batch`)."""

ALL_THREADS = "*"
"""The key of the subscriptions to every thread's run changes (not a valid thread id)."""

Listener = Callable[[ThreadEvent], None]
"""A callback that sees every event of every thread (`ChangeHub.add_listener`)."""


_RUN_FIELDS = tuple(f.name for f in fields(EffectRun) if f.name != "args")


def _without_args(run: EffectRun) -> EffectRun:
    """A copy of ``run`` with ``args=None`` (what `dataclasses.replace` does, faster)."""
    bare = object.__new__(EffectRun)
    for name in _RUN_FIELDS:
        object.__setattr__(bare, name, getattr(run, name))
    object.__setattr__(bare, "args", None)
    return bare


class FrameRelay(Protocol):
    """Where a hub sends its events instead of numbering them itself (`ChangeHub.relay`)."""

    def send(self, event: ThreadEvent) -> None:
        """Number ``event`` across nodes and deliver it (later, in ``seq`` order).

        An event whose ``seq`` is set (not 0) was numbered in its change's transaction:
        it keeps that number.
        """


class Subscription(AsyncIterator[ThreadEvent]):
    """An async iterator over one thread's events, from the moment it was made.

    It yields `EffectChanged`, `MessageCreated`, `EffectRecordChanged` and
    `ScheduleChanged` events in the
    order they happened; tell them apart with ``isinstance`` (or use ``to_frame()``, which
    says which it is).

    Iteration ends when the subscription is closed (the thread was deleted or the runtime
    shut down) and raises `SubscriptionOverflow` if more than ``maxsize`` events piled up
    unread. Use it as ``async with`` or call `close` to stop receiving.
    """

    def __init__(self, hub: ChangeHub, thread_id: str, maxsize: int) -> None:
        self.thread_id = thread_id
        self.maxsize = maxsize
        self.overflowed = False
        self.closed = False
        self.dropped = 0
        self._hub = hub
        self._buffer: deque[ThreadEvent] = deque()
        self._ready = asyncio.Event()
        # A push sets _ready once the buffer holds this many events: 1 while the reader
        # waits for any, more while a batching reader lingers, _NEVER while it is busy.
        self._wake_at = _NEVER
        self._ended: asyncio.Event | None = None

    def _push(self, event: ThreadEvent) -> None:
        if self.closed:
            return
        buffer = self._buffer
        if len(buffer) >= self.maxsize:
            self._overflow()
            return
        buffer.append(event)
        if len(buffer) >= self._wake_at:
            self._ready.set()

    def _overflow(self) -> None:
        self.overflowed = True
        self.dropped = len(self._buffer) + 1
        self._buffer.clear()
        self._end()

    def _end(self) -> None:
        self.closed = True
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
            self._end()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> ThreadEvent:
        while True:
            if self.overflowed:
                raise SubscriptionOverflow(
                    f"Subscriber of thread {self.thread_id} fell more than {self.maxsize} "
                    f"events behind and was dropped; reload over HTTP and subscribe again"
                )
            if self._buffer:
                return self._buffer.popleft()
            if self.closed:
                raise StopAsyncIteration
            await self._wait(1)

    async def _wait(self, count: int) -> None:
        """Until the buffer holds ``count`` events or the subscription ends."""
        self._ready.clear()
        self._wake_at = count
        try:
            await self._ready.wait()
        finally:
            self._wake_at = _NEVER

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
                raise SubscriptionOverflow(
                    f"Subscriber of thread {self.thread_id} fell more than {self.maxsize} "
                    f"events behind and was dropped; reload over HTTP and subscribe again"
                )
            buffer = self._buffer
            fill = self.maxsize // 4
            if (
                buffer and linger_until is not None and not self.closed
                and fill >= _LINGER_ROOM and len(buffer) < fill
            ):
                remaining = linger_until - asyncio.get_running_loop().time()
                linger_until = None
                if remaining > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(remaining):
                            await self._wait(fill)
                    continue
            if buffer:
                batch = list(buffer)
                buffer.clear()
                return batch
            if self.closed:
                return []
            await self._wait(1)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class ChangeHub:
    """Per-thread sequence numbers and subscriber sets. Event-loop only (not thread-safe)."""

    def __init__(self, queue_size: int) -> None:
        self.queue_size = queue_size
        self._seq: dict[str, int] = {}
        self._subs: dict[str, set[Subscription]] = {}
        self._listeners: list[Listener] = []
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
        sub = Subscription(self, thread_id, self.queue_size)
        self._subs.setdefault(thread_id, set()).add(sub)
        return sub

    def subscribe_runs(self) -> Subscription:
        """A new subscription to the run changes (`EffectChanged`) of every thread.

        Each event keeps its thread's ``seq``. It ends at shutdown (`close_all`), not when
        a thread is deleted: it gets a `ThreadDeleted` event then. Like any subscription
        it overflows when read too slowly.
        """
        sub = Subscription(self, ALL_THREADS, self.queue_size)
        self._subs.setdefault(ALL_THREADS, set()).add(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.thread_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.thread_id]

    def publish(
        self, change: RunChange, run: EffectRun, seq: int | None = None
    ) -> EffectChanged:
        """Number a run's change and hand it to every subscriber of its thread, without waiting.

        The event's run carries no args (``args`` is None): changes never expose them.
        ``seq``: the number the change already took in its own transaction
        (`ThreadStore.frame_seq`, with a relay only); None: numbered as usual.
        """
        bare = run if run.args is None else _without_args(run)
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

    def _deliver(self, thread_id: str, make: Callable[[int], _E], given: int | None = None,
                 ) -> _E:
        relay = self.relay
        if relay is not None:
            event = make(given or 0)  # 0: the relay numbers it
            for listener in self._listeners:
                try:
                    listener(event)
                except Exception:
                    log.exception("a listener of the change hub failed on %r", event)
            relay.send(event)
            return event
        # One counter per thread for every kind of event: a gap means "missed something".
        seq = self._seq.get(thread_id, 0) + 1
        self._seq[thread_id] = seq
        event = make(seq)
        if isinstance(event, EffectChanged):
            for sub in list(self._subs.get(ALL_THREADS, ())):
                sub._push(event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                log.exception("a listener of the change hub failed on %r", event)
        subs = self._subs.get(thread_id)
        if subs:
            # `Subscription._push`, inlined: with hundreds of clients on one thread this
            # loop runs for each of them at every event.
            for sub in list(subs):
                if sub.closed:
                    continue
                buffer = sub._buffer
                if len(buffer) >= sub.maxsize:
                    sub._overflow()
                    continue
                buffer.append(event)
                if len(buffer) >= sub._wake_at:
                    sub._ready.set()
        return event

    def close_thread(self, thread_id: str) -> None:
        """End every subscription of a thread (it was deleted) and forget its counter.

        The subscribers of every thread (`subscribe_runs`) get a `ThreadDeleted` event
        first, numbered after the thread's last one; listeners do not (the stores forget
        the thread themselves). With a relay, the event goes through it and the
        subscriptions end when it comes back (after every event numbered before it).
        """
        if self.relay is not None:
            self.relay.send(ThreadDeleted(thread_id=thread_id, seq=0))
            return
        event = ThreadDeleted(thread_id=thread_id, seq=self._seq.get(thread_id, 0) + 1)
        for sub in list(self._subs.get(ALL_THREADS, ())):
            sub._push(event)
        for sub in list(self._subs.get(thread_id, ())):
            sub.close()
        self._seq.pop(thread_id, None)

    def subscribed(self, thread_id: str) -> bool:
        """Whether this hub has a subscriber of ``thread_id``'s events."""
        return thread_id in self._subs

    @property
    def subscribed_to_all(self) -> bool:
        """Whether this hub has a subscriber of every thread's run changes."""
        return ALL_THREADS in self._subs

    def deliver_numbered(self, event: ThreadEvent) -> None:
        """Hand an event numbered by the relay to this node's subscribers (no listeners).

        The relay calls it in each thread's ``seq`` order. A thread's deletion
        (``thread_deleted``) goes to the subscribers of every thread and ends the thread's
        own subscriptions.
        """
        kind = event.event_type if isinstance(event, RelayedFrame) else EVENT_TYPES[type(event)]
        if kind in ("effect_changed", "thread_deleted"):
            for sub in list(self._subs.get(ALL_THREADS, ())):
                sub._push(event)
        if kind == "thread_deleted":
            for sub in list(self._subs.get(event.thread_id, ())):
                sub.close()
            return
        for sub in list(self._subs.get(event.thread_id, ())):
            sub._push(event)

    def close_all(self) -> None:
        """End every subscription (shutdown)."""
        for thread_id in list(self._subs):
            for sub in list(self._subs.get(thread_id, ())):
                sub.close()
