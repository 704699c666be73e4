"""Hooks: code that runs at fixed points of a thread's life, one per file in ``agents/hooks/``.

``agents/hooks/welcome.py`` defines the hook ``welcome``::

    async def welcome(state: ThreadState) -> None:
        await state.inject_message("Hi! Try: remind me in 10 seconds to stretch")

    hook = define_hook("after_thread_created", "welcome", welcome)

A hook runs only for threads whose agent lists its id (``define_agent(..., hooks=[...])``),
in the order the agent lists them. It gets the thread's `ThreadState` (``execution`` is set
during a turn, None otherwise) and may schedule effects. A hook that raises, or returns
something it may not, is logged and ignored: the turn goes on with the original data.

Hook points and what ``execute`` receives and may return:

=========================  ==================================  ===============================
point                      ``execute(state, ...)``             returns
=========================  ==================================  ===============================
after_thread_created       ``(state)``                         None
before_create_message      ``(state, message: Message)``       a changed `Message` or None
after_create_message       ``(state, message: Message)``       None
filter_messages            ``(state, messages)`` (pydantic-ai  a new list, or None to keep it
                           ``ModelMessage`` history about to
                           go to the model)
after_tool_call_success    ``(state, call: ToolCall, result)`` a replacement result, or None
after_tool_call_failure    ``(state, call: ToolCall, error)``  None
=========================  ==================================  ===============================

``before_create_message`` runs before any message is stored (user, assistant, tool,
injected); only the ``content`` of a plain text message (no tool calls or results) can be
changed. ``filter_messages`` is mapped onto pydantic-ai's history processors: it runs before
every model request of a turn and changes what the model sees of earlier messages, never
what is stored for them. Leave the running turn's own messages (at the end) in place:
pydantic-ai continues the turn from, and the turn stores, what the filter returns.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from runtime.messages import Message, ToolCall, with_content
from runtime.tools import UnsendableToolResult, check_tool_result

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

    from runtime.thread import ThreadState

log = logging.getLogger("runtime.hooks")

HookFn = Callable[..., Awaitable[Any] | Any]


class HookPoint(StrEnum):
    """Where in a thread's life a hook runs (see the module docstring for signatures)."""

    AFTER_THREAD_CREATED = "after_thread_created"
    BEFORE_CREATE_MESSAGE = "before_create_message"
    AFTER_CREATE_MESSAGE = "after_create_message"
    FILTER_MESSAGES = "filter_messages"
    AFTER_TOOL_CALL_SUCCESS = "after_tool_call_success"
    AFTER_TOOL_CALL_FAILURE = "after_tool_call_failure"


@dataclass(frozen=True, slots=True)
class HookDefinition:
    """What `define_hook` returns.

    Attributes:
        hook: The point it runs at.
        id: Its id (the file name without ``.py``); agents list hooks by id.
        execute: The function; async, or sync (then run in a worker thread).
    """

    hook: HookPoint
    id: str
    execute: HookFn

    async def call(self, *args: Any) -> Any:
        """Run ``execute`` with the given arguments and return its result."""
        if inspect.iscoroutinefunction(self.execute):
            return await self.execute(*args)
        result = await anyio.to_thread.run_sync(partial(self.execute, *args))
        if inspect.isawaitable(result):
            return await result
        return result


def define_hook(hook: HookPoint | str, id: str, execute: HookFn) -> HookDefinition:
    """Define a hook; assign the result to a module-level name in ``agents/hooks/<id>.py``.

    Args:
        hook: The hook point, e.g. ``"after_thread_created"`` (see `HookPoint`).
        id: The hook's id; must equal the file name without ``.py``.
        execute: The function (see the module docstring for its arguments and result).

    Returns:
        A `HookDefinition`.

    Raises:
        ValueError: an unknown hook point or an empty id.
        TypeError: ``execute`` is not callable.
    """
    try:
        point = HookPoint(hook)
    except ValueError:
        allowed = ", ".join(p.value for p in HookPoint)
        raise ValueError(f"define_hook: unknown hook point {hook!r}; one of: {allowed}") from None
    if not isinstance(id, str) or not id.strip():
        raise ValueError("define_hook: id must be a non-empty string")
    if not callable(execute):
        raise TypeError(f"define_hook: execute must be callable, got {execute!r}")
    return HookDefinition(hook=point, id=id, execute=execute)


def _failed(defn: HookDefinition, state: ThreadState, why: str | None = None) -> None:
    if why is None:
        log.exception(
            "hook %s (%s) raised in thread %s; continuing with the original data",
            defn.id, defn.hook, state.thread_id,
        )
    else:
        log.error(
            "hook %s (%s) in thread %s: %s; continuing with the original data",
            defn.id, defn.hook, state.thread_id, why,
        )


async def after_thread_created(hooks: Sequence[HookDefinition], state: ThreadState) -> None:
    """Run ``after_thread_created`` hooks."""
    for defn in hooks:
        try:
            await defn.call(state)
        except Exception:
            _failed(defn, state)


async def before_create_message(
    hooks: Sequence[HookDefinition], state: ThreadState, message: Message
) -> Message:
    """Run ``before_create_message`` hooks in order; each sees the previous one's message.

    Returns:
        The message to store.
    """
    for defn in hooks:
        try:
            result = await defn.call(state, message)
        except Exception:
            _failed(defn, state)
            continue
        if result is None or result == message:
            continue
        if not isinstance(result, Message):
            _failed(defn, state, f"returned {type(result).__name__}, not a Message or None")
            continue
        if result.content == message.content:
            continue
        try:
            message = with_content(message, result.content)
        except ValueError as exc:
            _failed(defn, state, str(exc))
    return message


async def after_create_message(
    hooks: Sequence[HookDefinition], state: ThreadState, message: Message
) -> None:
    """Run ``after_create_message`` hooks."""
    for defn in hooks:
        try:
            await defn.call(state, message)
        except Exception:
            _failed(defn, state)


async def filter_messages(
    hooks: Sequence[HookDefinition], state: ThreadState, messages: list[ModelMessage]
) -> list[ModelMessage]:
    """Run ``filter_messages`` hooks in order on the history about to go to the model."""
    for defn in hooks:
        try:
            result = await defn.call(state, list(messages))
        except Exception:
            _failed(defn, state)
            continue
        if result is None:
            continue
        if not isinstance(result, list) or not result:
            _failed(defn, state, "must return a non-empty list of pydantic-ai messages or None")
            continue
        messages = result
    return messages


async def after_tool_call_success(
    hooks: Sequence[HookDefinition], state: ThreadState, call: ToolCall, result: Any
) -> Any:
    """Run ``after_tool_call_success`` hooks; a hook returning non-None replaces the result.

    A replacement that cannot be sent to the model (not JSON) is logged and ignored.
    """
    for defn in hooks:
        try:
            replaced = await defn.call(state, call, result)
        except Exception:
            _failed(defn, state)
            continue
        if replaced is None:
            continue
        try:
            check_tool_result(call.name, replaced)
        except UnsendableToolResult as exc:
            _failed(defn, state, f"returned a replacement result that is not JSON ({exc})")
            continue
        result = replaced
    return result


async def after_tool_call_failure(
    hooks: Sequence[HookDefinition], state: ThreadState, call: ToolCall, error: str
) -> None:
    """Run ``after_tool_call_failure`` hooks."""
    for defn in hooks:
        try:
            await defn.call(state, call, error)
        except Exception:
            _failed(defn, state)
