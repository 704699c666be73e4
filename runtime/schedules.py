"""Recurring schedule operations: create, list, get, pause, resume, cancel, and firing.

A schedule (`runtime.recurrence.Schedule`) lives in its thread's store. Its fire times
are computed by `runtime.recurrence.Recurrence`; the thread's drain
(`runtime.executor.EffectExecutor.drain`) fires the due ones under the thread's lock with
`fire_due`, one transaction per fire: the occurrence run (or the skip) and the next fire
time are written together, so a crash between fires loses none and doubles none.

Rules a user sees:

- Each occurrence is an ordinary run (``scheduleId`` set), due at its fire time, with the
  usual statuses, attempts, frames, retention.
- Never stacked: a fire time that comes while the process runs and finds the previous
  occurrence still pending or running is skipped and counted (``skipped``).
- Coalesced: fire times missed while the process was down (or the thread was paused)
  make one occurrence when the thread next drains, due at the first missed fire time
  after the previous occurrence ended; the next fire time is then the first one after
  now. Fire times from before the thread's first drain in this process (downtime, and
  the process's own start-up) are never counted as skipped: when the previous occurrence
  is still pending or running (re-queued after a crash), they make nothing and count
  nothing (that occurrence covers them).
- Pause creates nothing; resume computes the next fire time from now (no backlog).
- A paused thread (`runtime.Runtime.pause_thread`) does not drain: its schedules fire
  once it is resumed (coalesced as above).
- Cancel deletes the schedule (its key is free again); its runs stay. Deleting the thread
  deletes its schedules.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from runtime._text import check_text
from runtime.abc import RunSync
from runtime.actors import ActorTable
from runtime.alarms import AlarmIndex
from runtime.config import RetentionPolicy
from runtime.discovery import EffectRegistry
from runtime.effects import EffectRun, EffectStatus
from runtime.errors import EffectNotFound, InvalidArgument, ScheduleNotFound, short_repr
from runtime.events import RunChange, ScheduleChange
from runtime.frames import ChangeHub
from runtime.ids import new_id
from runtime.recurrence import Recurrence, Schedule, ScheduleState
from runtime.storage.base import ThreadStore

if TYPE_CHECKING:
    from runtime.runs import RunOperations
    from runtime.thread import ThreadState

log = logging.getLogger("runtime")

MAX_SCHEDULES = 1000
"""Most recurring schedules one thread may have."""


MAX_COUNTED_FIRES = 10_000
"""Most fire times one fire of a schedule looks at (so a long outage costs bounded work);
skips beyond it are not counted."""


def fire_due(
    store: ThreadStore,
    now: float,
    retention: RetentionPolicy,
    up_since: float = -math.inf,
    known: Callable[[str], bool] = lambda name: True,
) -> tuple[list[tuple[Schedule, EffectRun | None, int | None]], float | None]:
    """Fire every due schedule of a thread's store (blocking: call off the loop).

    For each due schedule, its fire times from its stored ``next_fire_at`` up to ``now``
    are looked at in order: one that came while its previous occurrence was pending or
    running (before that run finished) is skipped, and counted when it is after
    ``up_since`` (the thread's first drain in this process: fire times at or before it
    passed in the downtime or the start-up and are never counted); the first one after
    that run ended makes the occurrence run (due at that fire time), and the later ones
    are coalesced into it. The next fire time is then the
    first after ``now``. A due schedule whose effect ``known`` does not know (its file
    was removed) is paused instead, with a ``paused_reason``, and makes no run.

    Returns:
        ``(fired, next_fire)``: ``(schedule, run, seq)`` per schedule written (the
        schedule after it, its new occurrence run, or None when every due fire time was
        skipped or it was paused, and the number the run's ``scheduled`` frame took in
        the fire's transaction, `ThreadStore.frame_seq`), and the store's earliest next
        fire time afterwards (None: none).
    """
    out: list[tuple[Schedule, EffectRun | None, int | None]] = []
    for schedule in store.due_schedules(now):
        first = schedule.next_fire_at_ts
        assert first is not None
        if not known(schedule.name):
            paused = store.set_schedule_state(schedule.id, ScheduleState.PAUSED, None)
            if paused is not None:
                out.append((replace(paused, paused_reason=f"effect not found: {paused.name}"),
                            None, None))
            continue
        busy_until = -math.inf  # no previous occurrence, or it was pruned long since
        if schedule.last_run_id is not None:
            previous = store.get_run(schedule.last_run_id, now, retention)
            if previous is not None:
                busy_until = (
                    previous.finished_at_ts
                    if previous.status.finished and previous.finished_at_ts is not None
                    else math.inf
                )
        recurrence, anchor = schedule.recurrence, schedule.created_at_ts
        skipped, fire, last = 0, None, first
        at: float | None = first
        for _ in range(MAX_COUNTED_FIRES):
            if at is None or at > now:
                break
            last = at
            if at > busy_until:
                fire = at
                break
            if at > up_since:  # downtime fire times are coalesced, not counted
                skipped += 1
            at = recurrence.next_fire(at, anchor)
        run = None
        if fire is not None:
            run = EffectRun(
                id=new_id(),
                thread_id=schedule.thread_id,
                name=schedule.name,
                status=EffectStatus.PENDING,
                args=schedule.args,
                run_at_ts=fire,
                created_at_ts=now,
                schedule_id=schedule.id,
            )
        after = recurrence.next_fire(now, anchor)
        written, stored = store.fire_schedule(
            schedule.id, first, run, skipped, last, after
        )
        if written is not None and written.next_fire_at_ts == after and (
            stored is not None or written.last_fire_at_ts == last
        ):
            out.append((written, stored, store.frame_seq if stored is not None else None))
    return out, store.next_schedule_fire()


class ScheduleOperations:
    """The recurring schedules of every thread (the interface `ThreadState` calls).

    Args:
        registry: The effects by name.
        actors: The actor table.
        alarms: The durable alarm index (lowered to a schedule's next fire time before
            the schedule commits, as for a run).
        hub: Where schedule changes are published.
        run_sync: Runs a blocking call off the event loop.
        now: The clock's ``now``.
        check_open: Raises `RuntimeClosed` unless the runtime is running.
        runs: Encodes and checks args as a run's are.
        poke: Tells a drain running a run in line that the thread's schedules changed
            (it then fires them on time beside that run).
        reasons: Why the runtime paused a schedule, by schedule id (shared with the
            executor, which pauses a schedule whose effect is gone).
    """

    def __init__(
        self,
        registry: Callable[[], EffectRegistry],
        actors: ActorTable,
        alarms: AlarmIndex,
        hub: ChangeHub,
        run_sync: RunSync,
        now: Callable[[], float],
        check_open: Callable[[], None],
        runs: RunOperations,
        poke: Callable[[str], None] | None = None,
        reasons: dict[str, str] | None = None,
    ) -> None:
        self._registry = registry
        self._actors = actors
        self._alarms = alarms
        self._hub = hub
        self._run_sync = run_sync
        self._now = now
        self._check_open = check_open
        self._runs = runs
        self._poke = poke or (lambda thread_id: None)
        self._reasons = reasons if reasons is not None else {}

    def _with_reason(self, schedule: Schedule) -> Schedule:
        reason = self._reasons.get(schedule.id)
        if reason is None or schedule.state is not ScheduleState.PAUSED:
            return schedule
        return replace(schedule, paused_reason=reason)

    async def create(
        self,
        state: ThreadState,
        name: str,
        args: Any,
        *,
        cron: object = None,
        timezone: object = None,
        every: object = None,
        key: str | None = None,
    ) -> tuple[Schedule, bool]:
        """See `ThreadState.schedule_recurring`; True with a new schedule."""
        self._check_open()
        recurrence = Recurrence.parse(cron=cron, timezone=timezone, every=every)
        if not isinstance(name, str):
            raise EffectNotFound(short_repr(name))
        defn = self._registry().resolve(name, package_id=state.package_id)
        if key is not None:
            check_text(key, "key", max_chars=256)
            if not key:
                raise InvalidArgument("key must not be empty (None means no key)")
        stored_args = self._runs.encode_args(defn, args)
        async with self._actors.writing(state.thread_id, state.info.created_at_ts) as actor:
            existing = await self._run_sync(actor.store.list_schedules)
            for found in existing:
                if key is not None and found.key == key:
                    return found, False
            if len(existing) >= MAX_SCHEDULES:
                raise InvalidArgument(
                    f"Thread {state.thread_id} has {len(existing)} schedules, the most a "
                    f"thread may have ({MAX_SCHEDULES}); cancel one first"
                )
            now = self._now()
            schedule = Schedule(
                id=new_id(),
                thread_id=state.thread_id,
                name=defn.qualified_name,
                args=stored_args,
                recurrence=recurrence,
                state=ScheduleState.ACTIVE,
                next_fire_at_ts=recurrence.next_fire(now, now),
                created_at_ts=now,
                key=key,
            )
            # The alarm first, as for a run: a crash in between leaves an early wake-up.
            if schedule.next_fire_at_ts is not None:
                await self._alarms.lower(state.thread_id, schedule.next_fire_at_ts)
            actor.next_fire_known = False
            held = await self._run_sync(actor.store.insert_schedule, schedule)
        if held is not None:
            return held, False
        self._hub.publish_schedule(ScheduleChange.CREATED, schedule)
        self._poke(state.thread_id)
        return schedule, True

    async def list(self, thread_id: str) -> list[Schedule]:
        """See `ThreadState.list_schedules`."""
        self._check_open()
        async with self._actors.use(thread_id) as actor:
            found: list[Schedule] = await self._run_sync(actor.store.list_schedules)
            return [self._with_reason(s) for s in found]

    async def get(self, thread_id: str, schedule_id: str) -> Schedule:
        """See `ThreadState.get_schedule`."""
        self._check_open()
        async with self._actors.use(thread_id) as actor:
            found = await self._run_sync(actor.store.get_schedule, str(schedule_id))
        if found is None:
            raise ScheduleNotFound(thread_id, str(schedule_id))
        return self._with_reason(found)

    async def pause(self, thread_id: str, schedule_id: str) -> Schedule:
        """See `ThreadState.pause_schedule`."""
        return await self._set_state(thread_id, schedule_id, ScheduleState.PAUSED)

    async def resume(self, thread_id: str, schedule_id: str) -> Schedule:
        """See `ThreadState.resume_schedule`."""
        return await self._set_state(thread_id, schedule_id, ScheduleState.ACTIVE)

    async def _set_state(
        self, thread_id: str, schedule_id: str, state: ScheduleState
    ) -> Schedule:
        self._check_open()
        schedule_id = str(schedule_id)
        async with self._actors.writing(thread_id) as actor:
            current = await self._run_sync(actor.store.get_schedule, schedule_id)
            if current is None:
                raise ScheduleNotFound(thread_id, schedule_id)
            if current.state is state:
                return self._with_reason(current)
            self._reasons.pop(schedule_id, None)
            next_fire = None
            if state is ScheduleState.ACTIVE:
                # From now: the fire times it missed while paused are not made up.
                next_fire = current.recurrence.next_fire(self._now(), current.created_at_ts)
                if next_fire is not None:
                    await self._alarms.lower(thread_id, next_fire)
            actor.next_fire_known = False
            written = await self._run_sync(
                actor.store.set_schedule_state, schedule_id, state, next_fire
            )
        if written is None:
            raise ScheduleNotFound(thread_id, schedule_id)
        change = ScheduleChange.RESUMED if state is ScheduleState.ACTIVE else ScheduleChange.PAUSED
        self._hub.publish_schedule(change, written)
        self._poke(thread_id)
        return written

    async def cancel(self, thread_id: str, schedule_id: str) -> Schedule:
        """See `ThreadState.cancel_schedule`."""
        self._check_open()
        schedule_id = str(schedule_id)
        async with self._actors.writing(thread_id) as actor:
            actor.next_fire_known = False
            removed = await self._run_sync(actor.store.delete_schedule, schedule_id)
        if removed is None:
            raise ScheduleNotFound(thread_id, schedule_id)
        self._reasons.pop(schedule_id, None)
        self._hub.publish_schedule(ScheduleChange.CANCELED, removed)
        return removed


def publish_fires(
    hub: ChangeHub, fired: list[tuple[Schedule, EffectRun | None, int | None]]
) -> None:
    """Publish what `fire_due` wrote: each new run (``scheduled``), then its schedule."""
    for schedule, run, seq in fired:
        if schedule.paused_reason is not None:
            hub.publish_schedule(ScheduleChange.PAUSED, schedule)
        elif run is not None:
            hub.publish(RunChange.SCHEDULED, run, seq)
            hub.publish_schedule(ScheduleChange.FIRED, schedule)
        else:
            hub.publish_schedule(ScheduleChange.SKIPPED, schedule)

