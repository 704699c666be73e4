"""A time budget for the runtime's own steps in one event-loop turn.

asyncio runs, in one turn, every callback that was ready when the turn began, and only
then looks at its timers and sockets again. When many drains are ready together (a burst
due on many threads: their effects ended in the same turn), each one's next step — the
outcome committed and the next run claimed on the loop, its frames, the next effect
started, about 0.3 ms — ran back to back: tens of ms in which no timer fired (alarms came
due late) and no socket was read (frames and requests waited). Now a step that finds the
turn's budget spent waits in line, and each later turn lets as many waiting steps go, in
the order they came, as the budget held before: timers and sockets go between.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

TURN_BUDGET_SECONDS = 0.005
"""How long the runtime's paced steps may run in one event-loop turn (seconds), counted
from the turn's first one, before the next one waits for a later turn."""


_MOST_PER_TURN = 1024
"""The most waiting steps one turn lets go."""


class TurnBudget:
    """How much of one event-loop turn the runtime's paced steps may take.

    A step asks `spent` as it begins. The turn's first step starts the budget; a step
    that finds it spent, or finds steps waiting already, awaits `wait_turn`: it waits in
    line (first come, first served), and each later turn lets go as many waiting steps
    as the last full budget held (twice as many after a turn whose budget they did not
    fill), which then run without asking again. So a turn runs one to two budgets of
    paced steps, and a waiting step goes in the turn its place in line comes.

    Args:
        seconds: The budget per turn (default `TURN_BUDGET_SECONDS`), > 0.
        clock: The time source in seconds (default ``time.perf_counter``).

    Raises:
        ValueError: ``seconds`` is not > 0.
    """

    __slots__ = ("_began", "_clock", "_fit", "_loop", "_over", "_per_turn", "_seconds",
                 "_tick_queued", "_waiting")

    def __init__(
        self, seconds: float = TURN_BUDGET_SECONDS, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds!r}")
        self._seconds = seconds
        self._clock = clock
        self._began: float | None = None  # when this turn's budget started (clock)
        self._fit = 0  # steps begun within it
        self._over = False  # a step began, or was turned away, after it ran out
        self._per_turn = 1  # waiting steps a turn lets go: how many a full budget held
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._tick_queued = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def waiting(self) -> int:
        """How many steps wait for a turn now."""
        return len(self._waiting)

    def spent(self) -> bool:
        """Whether a step beginning now must wait for a later turn (call it on the loop).

        Returns:
            True when steps wait already or this turn's budget is used up; False
            otherwise (the turn's first step starts the budget).
        """
        if self._waiting:
            if self._loop is asyncio.get_running_loop():
                return True
            self._waiting.clear()  # left on a loop that has gone: nobody lets them go
        if self._count(self._clock()):
            return False
        self._over = True
        return True

    async def wait_turn(self) -> None:
        """Wait in line for a later turn (after `spent` answered True)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._queue_tick()
        await waiter
        # Let go: counted in this turn's budget (which it starts if nothing did yet), so
        # that the steps arriving after it in this turn see what it took.
        if not self._count(self._clock()):
            self._over = True

    def _count(self, now: float) -> bool:
        """Count a step beginning at ``now``: whether it is within this turn's budget."""
        began = self._began
        if began is None:
            self._began, self._fit, self._over = now, 1, False
            self._queue_tick()
            return True
        if now - began < self._seconds:
            self._fit += 1
            return True
        return False

    def _queue_tick(self) -> None:
        if not self._tick_queued:
            self._loop = loop = asyncio.get_running_loop()
            self._tick_queued = True
            loop.call_soon(self._tick)

    def _tick(self) -> None:
        # Once per turn while steps are paced: the budget starts again, and the next
        # waiting steps are let go (they run in the next turn, in line order). A budget
        # that ran out says how many steps a turn holds; one that did not, with steps
        # still in line, holds more: twice as many go next time (a budget cut short by
        # a slow moment, the process preempted, recovers in a few turns).
        self._tick_queued = False
        if self._began is not None:
            if self._over:
                self._per_turn = self._fit
            elif self._waiting:
                self._per_turn = min(2 * max(self._per_turn, self._fit), _MOST_PER_TURN)
            self._began = None
        waiting = self._waiting
        n = self._per_turn
        while waiting and n:
            waiter = waiting.popleft()
            if not waiter.done():  # its step was cancelled meanwhile (shutdown)
                waiter.set_result(None)
                n -= 1
        if waiting:
            self._queue_tick()
