"""The in-process timer: APScheduler jobs for alarms within the horizon, a heap beyond."""

from __future__ import annotations

import asyncio
import time

from runtime.alarms import SchedulerTimer


async def _fired_within(timer_fired: dict[str, float], thread_id: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if thread_id in timer_fired:
            return True
        await asyncio.sleep(0.01)
    return thread_id in timer_fired


async def test_alarms_beyond_the_horizon_fire_at_their_due_time_not_before() -> None:
    fired: dict[str, float] = {}
    timer = SchedulerTimer(lambda tid: fired.setdefault(tid, time.time()), horizon_seconds=0.2)
    timer.start()
    try:
        now = time.time()
        timer.arm("near", now + 0.1)  # an APScheduler job at once
        timer.arm("far", now + 0.4)  # waits in the heap, promoted by the periodic job
        timer.arm("gone", now + 0.4)
        timer.disarm("gone")
        timer.arm("moved", now + 5)
        timer.arm("moved", now + 0.15)  # re-armed nearer: the far entry is dropped
        timer.arm("late", now - 1)  # overdue: fires on the next loop iteration

        assert await _fired_within(fired, "far", 3)
        assert await _fired_within(fired, "moved", 1)
        assert {"near", "far", "moved", "late"} <= fired.keys()
        assert fired["far"] >= now + 0.4
        assert fired["near"] >= now + 0.1
        await asyncio.sleep(0.3)
        assert "gone" not in fired
    finally:
        timer.shutdown()
