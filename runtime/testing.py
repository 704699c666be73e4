"""Test doubles that users of thread-effects need in their own tests.

- `FakeClock`: time that moves only when the test says so; alarms fire on `FakeClock.advance`.
- `demo_model` (from `runtime.demo_model`, re-exported): the scripted, offline "model" of
  the demo (reminders only); agents use it when no real model is configured.
- `override_model`: run a runtime's turns on a model of the test's choosing (pydantic-ai's
  ``FunctionModel`` scripts one).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from runtime.abc import AlarmCallback, AlarmTimer
from runtime.demo_model import DEMO_HELP, DEMO_MODEL_NAME, demo_model, parse_reminder

if TYPE_CHECKING:
    from pydantic_ai.models import Model

    from runtime.supervisor import Runtime

# pydantic-ai is not imported here: `FakeClock` is for effects-only apps too, which never
# load it.

__all__ = [
    "DEMO_HELP", "DEMO_MODEL_NAME", "FakeClock", "ManualTimer", "demo_model", "override_model",
    "parse_reminder",
]


class ManualTimer:
    """An `AlarmTimer` driven by a `FakeClock`: it fires only inside `FakeClock.advance`."""

    def __init__(self, clock: FakeClock, callback: AlarmCallback) -> None:
        self._clock = clock
        self._callback = callback
        self._due: dict[str, float] = {}
        self._started = False

    def start(self) -> None:  # noqa: D102
        self._started = True
        self.fire_due()

    def arm(self, thread_id: str, due_at: float) -> None:  # noqa: D102
        self._due[thread_id] = due_at
        if self._started and due_at <= self._clock.now():
            self.fire_due()

    def disarm(self, thread_id: str) -> None:  # noqa: D102
        self._due.pop(thread_id, None)

    def shutdown(self) -> None:  # noqa: D102
        self._started = False
        self._due.clear()

    def fire_due(self) -> None:
        """Fire every alarm that is due by the clock, earliest first."""
        if not self._started:
            return
        now = self._clock.now()
        due = sorted((t, tid) for tid, t in self._due.items() if t <= now)
        for _, tid in due:
            del self._due[tid]
            self._callback(tid)


class FakeClock:
    """A clock for tests: starts at ``start`` (epoch seconds, default: the real now).

    Example::

        clock = FakeClock()
        async with Runtime(app_dir=..., data_dir=..., clock=clock) as rt:
            ...schedule with delay=3600...
            clock.advance(3600)
            await rt.wait_idle()
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._timers: list[ManualTimer] = []

    def now(self) -> float:
        """The fake time, seconds since the epoch."""
        return self._now

    def create_timer(self, callback: AlarmCallback) -> AlarmTimer:
        """A timer that fires when `advance` passes an alarm's due time."""
        timer = ManualTimer(self, callback)
        self._timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (≥ 0) and fire alarms that became due.

        Raises:
            ValueError: for a negative amount.
        """
        if seconds < 0:
            raise ValueError(f"FakeClock.advance: seconds must be >= 0, got {seconds}")
        self._now += seconds
        for timer in self._timers:
            timer.fire_due()


@contextmanager
def override_model(rt: Runtime, model: Model) -> Iterator[None]:
    """Make every turn of ``rt`` use ``model`` inside the block (whatever the agents say).

    Example::

        def script(messages, info):
            return ModelResponse(parts=[TextPart("hello")])

        with override_model(rt, FunctionModel(script)):
            result = await thread.send_message("hi")
    """
    previous = rt.turns.model_override
    rt.turns.model_override = model
    try:
        yield
    finally:
        rt.turns.model_override = previous
