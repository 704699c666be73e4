"""The demo model: a scripted, offline "model" that understands reminders and notes — a demo.

Agents use it when no real model is configured (no agent ``model`` and no ``model``
setting), so the demo app and its tests run without network or keys.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

# pydantic-ai is imported by the functions, not here: importing the conversation layer must
# not load it for an app without agents (tests/test_imports.py).

DEMO_MODEL_NAME = "thread-effects-demo"
"""The name the demo model reports (it shows in stored assistant messages' model data)."""

DEMO_HELP = (
    "I'm the offline demo model of thread-effects (no real model is configured). "
    "I understand reminders: try \"remind me in 10 seconds to stretch\", and notes: "
    "try \"post a note about release: shipped 1.2\"."
)

_NOTE_PATTERN = re.compile(
    r"\bnote (?:about|on) (?P<topic>[^:\n]{1,80}?)\s*:\s*(?P<text>\S.*)", re.I | re.S
)


def parse_note(text: str) -> tuple[str, str] | None:
    """Read "post a note about release: shipped 1.2" as ``(topic, text)``, or None."""
    match = _NOTE_PATTERN.search(text.strip())
    if match is None:
        return None
    return match.group("topic").strip(), match.group("text").strip()[:2000]

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
                if part.tool_name == "post_note" and isinstance(part.content, dict):
                    topic = args.get("topic", "")
                    texts.append(
                        f"That note about {topic} was already in the inbox; I posted nothing."
                        if part.content.get("found") else
                        f"Posted your note about {topic} to the inbox."
                    )
                elif part.tool_name == "set_reminder" and "text" in args:
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
    note = parse_note(prompt) if prompt and reminder is None else None
    if note is not None and "post_note" in tools:
        return ModelResponse(
            parts=[ToolCallPart("post_note", {"topic": note[0], "text": note[1]})],
            model_name=DEMO_MODEL_NAME,
        )
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

    It understands two requests: "remind me in <n> seconds|minutes|hours|days to
    <something>" (or "remind me to <something> in <n> ..."), which it answers by calling the
    agent's ``set_reminder`` tool with ``{"text", "delay_seconds"}``, and "post a note about
    <topic>: <text>", answered by calling its ``post_note`` effect tool with ``{"topic",
    "text"}``; then it confirms in words.
    Anything else gets a short help text. It needs no network, so the demo (and tests)
    run offline. For scripted models of your own, use pydantic-ai's ``FunctionModel``.
    """
    from pydantic_ai.models.function import FunctionModel

    return FunctionModel(_demo_reply, model_name=DEMO_MODEL_NAME)
