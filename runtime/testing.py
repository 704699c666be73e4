"""Test doubles that users of thread-effects need in their own tests.

- `FakeClock`: time that moves only when the test says so; alarms fire on `FakeClock.advance`.
- `demo_model`: the scripted, offline "model" of the demo (reminders only), a pydantic-ai
  ``FunctionModel``; agents use it when no real model is configured.
- `override_model`: run a runtime's turns on a model of the test's choosing (pydantic-ai's
  ``FunctionModel`` scripts one).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from runtime.alarms import AlarmCallback, AlarmTimer

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
    from pydantic_ai.models import Model
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from runtime.supervisor import Runtime

# pydantic-ai is imported by the demo model's functions, not here: `FakeClock` is for
# effects-only apps too, which never load it.


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


# --------------------------------------------------------------- the demo model

DEMO_MODEL_NAME = "thread-effects-demo"
"""The name the demo model reports (it shows in stored assistant messages' model data)."""

DEMO_HELP = (
    "I'm the offline demo model of thread-effects (no real model is configured). "
    "I understand reminders: try \"remind me in 10 seconds to stretch\"."
)

_UNITS = {
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}
_AMOUNT = (
    r"(?P<n>\d+(?:\.\d+)?)\s*"
    r"(?P<unit>seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)\b"
)
_CONNECTORS = frozenset({"to", "that", "about", ":"})
"""Words between the time and the text; alone, they are no text ("remind me in 5 s to")."""
_REMIND_PATTERNS = (
    # "remind me in 10 seconds to stretch"
    re.compile(rf"\bremind me in {_AMOUNT}\s*(?:to\s+|that\s+|about\s+|:\s*)?(?P<text>.+)", re.I),
    # "remind me to stretch in 10 seconds"
    re.compile(rf"\bremind me (?:to\s+|that\s+|about\s+)?(?P<text>.+?)\s+in {_AMOUNT}\s*$", re.I),
)


def parse_reminder(text: str) -> tuple[str, float] | None:
    """Read "remind me in 10 seconds to stretch" (or "remind me to stretch in 2 minutes").

    Units: seconds, minutes, hours and days (``s``, ``min``, ``h``, ``d`` too).

    Returns:
        ``(what, delay_seconds)``, or None when the text asks for no reminder (or names
        nothing to be reminded of: "remind me in 10 seconds to").
    """
    for pattern in _REMIND_PATTERNS:
        match = pattern.search(text.strip())
        if match:
            what = match.group("text").strip().rstrip(".!?").strip()
            if what and what.lower() not in _CONNECTORS:
                return what, float(match.group("n")) * _UNITS[match.group("unit").lower()]
    return None


def _duration_text(seconds: float) -> str:
    """``172800`` → ``"2 days"``, ``90`` → ``"90 seconds"``: the largest whole unit."""
    for unit, size in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0)):
        if seconds >= size and seconds % size == 0:
            count = f"{seconds / size:g}"
            return f"{count} {unit}" if count == "1" else f"{count} {unit}s"
    value = f"{seconds:g}"
    return f"{value} second" if value == "1" else f"{value} seconds"


def _demo_reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )

    last = messages[-1]
    if isinstance(last, ModelRequest):
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if returns:
            texts = []
            for part in returns:
                if part.outcome != "success":
                    error = part.model_response_str(wrap_if_error=False)
                    texts.append(f"Sorry, {part.tool_name} failed: {error}")
                    continue
                call = _find_call(messages, part.tool_call_id)
                args = call.args_as_dict() if call is not None else {}
                if part.tool_name == "set_reminder" and "text" in args:
                    delay = float(args.get("delay_seconds", 0))
                    texts.append(
                        f"OK, I'll remind you to {args['text']} in {_duration_text(delay)}."
                    )
                else:
                    texts.append(f"{part.tool_name} returned {part.model_response_str()}.")
            return ModelResponse(parts=[TextPart(" ".join(texts))], model_name=DEMO_MODEL_NAME)
    prompt = _last_user_text(messages)
    reminder = parse_reminder(prompt) if prompt else None
    tools = {t.name for t in info.function_tools}
    if reminder is not None and "set_reminder" in tools:
        what, delay = reminder
        return ModelResponse(
            parts=[ToolCallPart("set_reminder", {"text": what, "delay_seconds": delay})],
            model_name=DEMO_MODEL_NAME,
        )
    if reminder is not None:
        text = "I'd set that reminder, but this agent has no set_reminder tool."
    else:
        text = DEMO_HELP
    return ModelResponse(parts=[TextPart(text)], model_name=DEMO_MODEL_NAME)


def _find_call(messages: list[ModelMessage], tool_call_id: str) -> ToolCallPart | None:
    from pydantic_ai.messages import ModelResponse, ToolCallPart

    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ToolCallPart) and part.tool_call_id == tool_call_id:
                    return part
    return None


def _last_user_text(messages: list[ModelMessage]) -> str:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in reversed(message.parts):
                if isinstance(part, UserPromptPart):
                    if isinstance(part.content, str):
                        return part.content
                    return " ".join(c for c in part.content if isinstance(c, str))
    return ""


def demo_model() -> FunctionModel:
    """The scripted model the demo uses when no real model is configured — a demo, not AI.

    It understands one request, "remind me in <n> seconds|minutes|hours|days to <something>"
    (or "remind me to <something> in <n> ..."), which it answers by calling the agent's
    ``set_reminder`` tool with ``{"text", "delay_seconds"}``, then confirming in words.
    Anything else gets a short help text. It needs no network, so the demo (and tests)
    run offline. For scripted models of your own, use pydantic-ai's ``FunctionModel``.
    """
    from pydantic_ai.models.function import FunctionModel

    return FunctionModel(_demo_reply, model_name=DEMO_MODEL_NAME)


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
