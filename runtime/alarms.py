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
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger

_LATEST_ALARM = datetime(9999, 1, 1, tzinfo=UTC).timestamp()

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
    """`AlarmTimer` on APScheduler's ``AsyncIOScheduler`` (memory job store)."""

    def __init__(self, callback: AlarmCallback, now: Callable[[], float] = time.time) -> None:
        self._callback = callback
        self._now = now
        self._scheduler = AsyncIOScheduler(
            timezone=UTC,
            job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
        )
        self._armed: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:  # noqa: D102
        self._loop = asyncio.get_running_loop()
        self._scheduler.start()

    async def _fire(self, thread_id: str) -> None:
        self._armed.discard(thread_id)
        self._callback(thread_id)

    def arm(self, thread_id: str, due_at: float) -> None:  # noqa: D102
        if due_at <= self._now():
            self.disarm(thread_id)
            assert self._loop is not None, "timer not started"
            self._loop.call_soon(self._callback, thread_id)
            return
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


class SystemClock:
    """The real clock: `time.time` and an APScheduler timer."""

    def now(self) -> float:
        """Seconds since the Unix epoch (UTC)."""
        return time.time()

    def create_timer(self, callback: AlarmCallback) -> AlarmTimer:
        """An APScheduler-backed timer."""
        return SchedulerTimer(callback, self.now)
