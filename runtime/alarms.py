"""The alarm clock: when each thread must wake next.

The durable alarm is a row in the runtime database (see `runtime.storage.models.AlarmRow`);
this module holds only the in-process timer, a cache rebuilt from those rows at startup.
The timer is APScheduler 3's ``AsyncIOScheduler`` with its memory job store, one job per
thread id (docs/design.md, "Decisions": its SQLAlchemy store can lose alarms, the memory store
is fast: ≈30k adds/s). A due or overdue alarm fires on the next loop iteration without
going through the scheduler at all.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

_LATEST_ALARM = datetime(9999, 1, 1, tzinfo=UTC).timestamp()

_PROMOTE_JOB_ID = "promote:far-alarms"

AlarmCallback = Callable[[str], None]
"""Called on the event loop with the thread id whose alarm went off."""


class AlarmTimer(Protocol):
    """An in-process timer with at most one pending alarm per thread."""

    def start(self) -> None:
        """Begin firing (call on the running event loop)."""

    def arm(self, thread_id: str, due_at: float) -> None:
        """Fire for ``thread_id`` at ``due_at`` (epoch seconds), replacing its earlier alarm."""

    def disarm(self, thread_id: str) -> None:
        """Forget the thread's alarm, if any."""

    def shutdown(self) -> None:
        """Stop firing."""


class Clock(Protocol):
    """Where the runtime reads the time and gets its timer from."""

    def now(self) -> float:
        """Seconds since the Unix epoch (UTC)."""
        ...

    def create_timer(self, callback: AlarmCallback) -> AlarmTimer:
        """A timer that calls ``callback(thread_id)`` when an alarm is due by this clock."""
        ...


class SchedulerTimer:
    """`AlarmTimer` on APScheduler's ``AsyncIOScheduler`` (memory job store).

    Alarms due within `horizon_seconds` are APScheduler jobs, one per thread id. Alarms
    further out wait in a heap and become jobs as they come within the horizon (a
    promotion job runs every quarter horizon): a restart with 100k threads then arms only
    the few due soon instead of paying ≈ 30 µs per job for all of them.
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
        self._scheduler = AsyncIOScheduler(
            timezone=UTC,
            job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
        )
        self._armed: set[str] = set()
        self._far: dict[str, float] = {}
        self._far_heap: list[tuple[float, str]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:  # noqa: D102
        self._loop = asyncio.get_running_loop()
        self._scheduler.start()
        self._scheduler.add_job(
            self._promote,
            IntervalTrigger(seconds=self._horizon / 4, timezone=UTC),
            id=_PROMOTE_JOB_ID,  # not a valid thread id, so it never collides
            replace_existing=True,
        )

    async def _fire(self, thread_id: str) -> None:
        self._armed.discard(thread_id)
        self._callback(thread_id)

    async def _promote(self) -> None:
        limit = self._now() + self._horizon
        while self._far_heap and self._far_heap[0][0] <= limit:
            due_at, thread_id = heapq.heappop(self._far_heap)
            if self._far.get(thread_id) == due_at:  # else re-armed or disarmed since
                del self._far[thread_id]
                self._add_job(thread_id, due_at)

    def arm(self, thread_id: str, due_at: float) -> None:  # noqa: D102
        now = self._now()
        if due_at <= now:
            self.disarm(thread_id)
            assert self._loop is not None, "timer not started"
            self._loop.call_soon(self._callback, thread_id)
            return
        if due_at > now + self._horizon:
            self.disarm(thread_id)
            self._far[thread_id] = due_at
            heapq.heappush(self._far_heap, (due_at, thread_id))
            return
        self._far.pop(thread_id, None)
        self._add_job(thread_id, due_at)

    def _add_job(self, thread_id: str, due_at: float) -> None:
        # Far-future alarms (rows written before delays were capped) fire at the latest
        # instant a datetime can hold rather than failing to arm.
        due_at = min(due_at, _LATEST_ALARM)
        self._scheduler.add_job(
            self._fire,
            DateTrigger(run_date=datetime.fromtimestamp(due_at, UTC), timezone=UTC),
            args=(thread_id,),
            id=thread_id,
            replace_existing=True,
        )
        self._armed.add(thread_id)

    def disarm(self, thread_id: str) -> None:  # noqa: D102
        self._far.pop(thread_id, None)  # its heap entry is skipped when popped
        if thread_id in self._armed:
            self._armed.discard(thread_id)
            try:
                self._scheduler.remove_job(thread_id)
            except JobLookupError:
                pass

    def shutdown(self) -> None:  # noqa: D102
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._armed.clear()
        self._far.clear()
        self._far_heap.clear()


class SystemClock:
    """The real clock: `time.time` and an APScheduler timer."""

    def now(self) -> float:
        """Seconds since the Unix epoch (UTC)."""
        return time.time()

    def create_timer(self, callback: AlarmCallback) -> AlarmTimer:
        """An APScheduler-backed timer."""
        return SchedulerTimer(callback, self.now)
