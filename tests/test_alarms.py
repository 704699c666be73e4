"""The in-process timer: a loop handle per alarm within the horizon, a heap beyond."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from runtime.alarms import LoopTimer, SystemClock


async def _fired_within(timer_fired: dict[str, float], thread_id: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if thread_id in timer_fired:
            return True
        await asyncio.sleep(0.01)
    return thread_id in timer_fired


def _scheduled(loop: asyncio.AbstractEventLoop) -> int:
    """How many live (not cancelled) timer handles the loop holds."""
    return sum(1 for h in loop._scheduled if not h.cancelled())  # type: ignore[attr-defined]


async def test_alarms_beyond_the_horizon_fire_at_their_due_time_not_before() -> None:
    fired: dict[str, float] = {}
    timer = LoopTimer(lambda tid: fired.setdefault(tid, time.time()), horizon_seconds=0.2)
    timer.start()
    try:
        now = time.time()
        timer.arm("near", now + 0.1)  # a loop handle at once
        timer.arm("far", now + 0.4)  # waits in the heap, promoted when it nears
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


def test_the_system_clock_makes_loop_timers() -> None:
    assert isinstance(SystemClock().create_timer(lambda tid: None), LoopTimer)


async def test_overdue_alarms_fire_on_the_next_iteration_not_during_arm() -> None:
    fired: list[str] = []
    timer = LoopTimer(fired.append)
    timer.start()
    try:
        timer.arm("t", time.time() - 5)
        assert fired == []
        await asyncio.sleep(0)
        assert fired == ["t"]
    finally:
        timer.shutdown()


async def test_rearming_replaces_the_handle_and_disarm_cancels_it() -> None:
    fired: list[str] = []
    timer = LoopTimer(fired.append, horizon_seconds=60)
    loop = asyncio.get_running_loop()
    before = _scheduled(loop)
    timer.start()
    try:
        now = time.time()
        timer.arm("a", now + 30)
        timer.arm("a", now + 0.05)
        timer.arm("a", now + 20)
        assert _scheduled(loop) - before == 1 == timer.handle_count
        timer.arm("b", now + 0.05)
        timer.arm("b", now - 1)  # re-armed overdue: the pending handle goes too
        timer.disarm("b")
        timer.arm("c", now + 0.05)
        timer.disarm("c")
        assert _scheduled(loop) - before == 1
        await asyncio.sleep(0.2)
        assert fired == []  # "a" waits for its last due time, "b" and "c" were disarmed
        timer.arm("a", time.time() + 0.05)
        await asyncio.sleep(0.2)
        assert fired == ["a"]
        assert timer.handle_count == 0
    finally:
        timer.shutdown()


async def test_a_handle_that_fires_before_the_wall_clock_due_time_is_rearmed() -> None:
    # The wall clock steps back 0.3 s after arming: the loop handle (0.1 s of loop time)
    # fires when the wall clock says 0.2 s remain; the alarm must wait for them.
    offset = 0.0
    fired: dict[str, float] = {}
    timer = LoopTimer(lambda tid: fired.setdefault(tid, time.time() + offset))
    timer.start()
    try:
        due = time.time() + 0.1
        timer.arm("t", due)
        offset = -0.3
        timer._now = lambda: time.time() + offset
        await asyncio.sleep(0.2)
        assert fired == {}
        assert timer.handle_count == 1  # armed again for what is left
        assert await _fired_within(fired, "t", 2)
        assert fired["t"] >= due
    finally:
        timer.shutdown()


async def test_a_far_alarm_is_promoted_and_fires_once() -> None:
    fired: list[str] = []
    timer = LoopTimer(fired.append, horizon_seconds=0.1)
    timer.start()
    try:
        due = time.time() + 0.35
        timer.arm("far", due)
        timer.arm("far", due)  # the same due time twice: two heap entries, one alarm
        assert timer.handle_count == 1  # the heap's handle only
        await asyncio.sleep(0.6)
        assert fired == ["far"]
        assert timer.handle_count == 0
    finally:
        timer.shutdown()


async def test_many_far_alarms_make_few_loop_handles() -> None:
    timer = LoopTimer(lambda tid: None, horizon_seconds=120)
    loop = asyncio.get_running_loop()
    before = _scheduled(loop)
    timer.start()
    try:
        now = time.time()
        for i in range(100_000):
            timer.arm(f"t{i}", now + 3600 + i * 0.5)
        for i in range(10):
            timer.arm(f"soon{i}", now + 60)
        assert _scheduled(loop) - before <= 11
        assert timer.handle_count <= 11
    finally:
        timer.shutdown()
    assert _scheduled(loop) == before


async def test_callback_errors_are_logged_and_the_timer_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fired: list[str] = []

    def callback(thread_id: str) -> None:
        fired.append(thread_id)
        if thread_id == "bad":
            raise ValueError("boom")

    timer = LoopTimer(callback)
    timer.start()
    try:
        now = time.time()
        timer.arm("bad", now + 0.02)
        timer.arm("good", now + 0.05)
        await asyncio.sleep(0.2)
        assert fired == ["bad", "good"]
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        # Logged by the runtime (its logger, with the thread id), not left to asyncio.
        assert [(r.name, "bad" in r.getMessage()) for r in errors] == [("runtime", True)]
    finally:
        timer.shutdown()


async def test_shutdown_cancels_everything_and_alarms_armed_before_start_wait_for_it() -> None:
    fired: list[str] = []
    timer = LoopTimer(fired.append, horizon_seconds=0.1)
    loop = asyncio.get_running_loop()
    before = _scheduled(loop)
    now = time.time()
    timer.arm("early", now - 1)  # before start: armed by it
    timer.start()
    with pytest.raises(RuntimeError):
        timer.start()
    await asyncio.sleep(0)
    assert fired == ["early"]
    fired.clear()
    timer.arm("near", now + 0.05)
    timer.arm("far", now + 0.3)
    timer.arm("due", now - 1)
    timer.shutdown()
    timer.shutdown()  # idempotent
    assert _scheduled(loop) == before
    await asyncio.sleep(0.5)
    assert fired == []
    timer.arm("again", time.time() - 1)  # stopped: kept for the next start
    await asyncio.sleep(0.05)
    assert fired == []
    timer.start()
    await asyncio.sleep(0)
    assert fired == ["again"]
    timer.shutdown()
