"""A thread's conversation: `Message`, and its translation to and from pydantic-ai messages.

Every stored message is one pydantic-ai ``ModelMessage`` (a ``ModelRequest`` or a
``ModelResponse``), kept as JSON in the thread's database; the history a turn sends to the
model is rebuilt from them, in order. A `Message` adds what readers need without parsing
that JSON: a role, a plain-text ``content``, and the tool calls or tool results.

Roles:
- ``user``: what the user said (a request with the user's prompt);
- ``assistant``: what the model answered (text, tool calls, or both), and messages code
  injected into the conversation with `ThreadState.inject_message` (a reminder);
- ``tool``: the results of the assistant's tool calls;
- ``system``: an injected system note.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from runtime._text import check_text
from runtime.effects import iso
from runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage, UserPromptPart

# pydantic-ai is imported by the functions that convert to or from its messages, not here:
# an app with effects only never loads it (tests/test_imports.py).

MAX_CONTENT_CHARS = 100_000
"""The longest message content accepted from a caller (user messages, injected messages)."""


class MessageRole(StrEnum):
    """Who a message is from (see the module docstring)."""

    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model made.

    Attributes:
        id: The tool call id (pairs the call with its `ToolResult`).
        name: The tool's name (its file name in ``agents/tools/``).
        args: The arguments as the model sent them (a JSON object).
    """

    id: str
    name: str
    args: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {"id": self.id, "name": self.name, "args": self.args}


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The result of one tool call, as the model saw it.

    Attributes:
        tool_call_id: The call it answers.
        tool_name: The tool's name.
        content: The result as text (JSON text for structured results).
        is_error: True when the tool raised (or its args failed its schema); ``content``
            is then the error message.
        from_journal: True when the result came from the turn's journal (the call had
            finished in an earlier attempt of a resumed turn, or an earlier call with the
            same idempotency key): the tool did not run again.
    """

    tool_call_id: str
    tool_name: str
    content: str
    is_error: bool = False
    from_journal: bool = False

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "content": self.content,
            "isError": self.is_error,
            "fromJournal": self.from_journal,
        }


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a thread, as stored.

    Attributes:
        id: The message id (32 hex characters).
        thread_id: The thread it belongs to.
        role: See `MessageRole`.
        content: The text of the message (tool results joined for a ``tool`` message).
        created_at_ts: When it was stored, seconds since the epoch (UTC); `created_at`
            gives it as an aware UTC datetime.
        run_id: The turn that produced it, or None (an injected message, or a user message
            stored before its turn started has the turn's id too).
        tool_calls: The tool calls of an ``assistant`` message.
        tool_results: The results of a ``tool`` message.
        injected: True for a message added with `ThreadState.inject_message`.
        data: The pydantic-ai ``ModelMessage`` as JSON (see `model_message`).
    """

    id: str
    thread_id: str
    role: MessageRole
    content: str
    created_at_ts: float
    run_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()
    injected: bool = False
    data: str = field(default="", repr=False)

    @property
    def created_at(self) -> datetime:
        """When it was stored, an aware UTC datetime (``created_at_ts`` as a datetime)."""
        return datetime.fromtimestamp(self.created_at_ts, UTC)

    def model_message(self) -> ModelMessage:
        """The pydantic-ai message this row stores."""
        from pydantic_ai import ModelMessagesTypeAdapter

        return ModelMessagesTypeAdapter.validate_json(f"[{self.data}]")[0]

    def meta_json(self) -> str:
        """The ``meta`` column: tool calls, tool results and the injected flag."""
        meta: dict[str, Any] = {}
        if self.tool_calls:
            meta["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_results:
            meta["tool_results"] = [r.to_json() for r in self.tool_results]
        if self.injected:
            meta["injected"] = True
        return json.dumps(meta, separators=(",", ":"))

    def to_json(self) -> dict[str, Any]:
        """The wire form (camelCase keys, ISO 8601 UTC times), without the model data."""
        out: dict[str, Any] = {
            "id": self.id,
            "threadId": self.thread_id,
            "role": str(self.role),
            "content": self.content,
            "createdAt": iso(self.created_at_ts),
            "runId": self.run_id,
            "injected": self.injected,
        }
        if self.tool_calls:
            out["toolCalls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_results:
            out["toolResults"] = [r.to_json() for r in self.tool_results]
        return out


@dataclass(frozen=True, slots=True)
class MessagePage:
    """A page of messages, oldest first.

    Attributes:
        messages: The messages on this page.
        next_cursor: Pass as ``after`` for the next (newer) page; None on the last page.
        prev_cursor: Pass as ``before`` for the previous (older) page; None when the page
            starts at the thread's first message.
    """

    messages: list[Message]
    next_cursor: str | None
    prev_cursor: str | None = None


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What a turn produced.

    Attributes:
        run_id: The turn's run id (``state.execution.run_id`` inside its tools and hooks).
        reply: The model's last text answer, or None if it gave none.
        messages: Every message the turn stored, in order (the user's first).
    """

    run_id: str
    reply: Message | None
    messages: list[Message]

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "runId": self.run_id,
            "reply": self.reply.to_json() if self.reply is not None else None,
            "messages": [m.to_json() for m in self.messages],
        }


def message_from_row(
    thread_id: str,
    *,
    id: str,
    role: str,
    content: str,
    created_at_ts: float,
    run_id: str | None,
    meta: str,
    data: str,
) -> Message:
    """Rebuild a `Message` from its stored columns."""
    parsed = json.loads(meta) if meta else {}
    return Message(
        id=id,
        thread_id=thread_id,
        role=MessageRole(role),
        content=content,
        created_at_ts=created_at_ts,
        run_id=run_id,
        tool_calls=tuple(
            ToolCall(c["id"], c["name"], c["args"]) for c in parsed.get("tool_calls", ())
        ),
        tool_results=tuple(
            ToolResult(r["toolCallId"], r["toolName"], r["content"], r["isError"],
                       bool(r.get("fromJournal", False)))
            for r in parsed.get("tool_results", ())
        ),
        injected=bool(parsed.get("injected", False)),
        data=data,
    )


def _user_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    return "\n".join(item for item in part.content if isinstance(item, str))


def _dump(message: ModelMessage) -> str:
    from pydantic_ai import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter.dump_json([message]).decode()[1:-1]


def message_from_model(
    thread_id: str,
    model_message: ModelMessage,
    *,
    id: str,
    created_at_ts: float,
    run_id: str | None,
    injected: bool = False,
    replayed: Collection[str] = (),
) -> Message:
    """Describe a pydantic-ai message as a `Message` (role, text, tool calls or results).

    ``replayed``: the tool call ids whose results came from the journal (`ToolResult`).
    """
    from pydantic_ai.messages import (
        ModelResponse,
        RetryPromptPart,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    if isinstance(model_message, ModelResponse):
        texts = [p.content for p in model_message.parts if isinstance(p, TextPart)]
        calls = tuple(
            ToolCall(p.tool_call_id, p.tool_name, p.args_as_dict())
            for p in model_message.parts
            if isinstance(p, ToolCallPart)
        )
        return Message(
            id=id, thread_id=thread_id, role=MessageRole.ASSISTANT, content="".join(texts),
            created_at_ts=created_at_ts, run_id=run_id, tool_calls=calls, injected=injected,
            data=_dump(model_message),
        )
    results: list[ToolResult] = []
    user: list[str] = []
    system: list[str] = []
    for part in model_message.parts:
        if isinstance(part, ToolReturnPart):
            results.append(
                ToolResult(
                    part.tool_call_id, part.tool_name,
                    part.model_response_str(wrap_if_error=False),
                    part.outcome in ("failed", "retried"),
                    part.tool_call_id in replayed,
                )
            )
        elif isinstance(part, RetryPromptPart):
            results.append(
                ToolResult(part.tool_call_id, part.tool_name or "", part.model_response(), True)
            )
        elif isinstance(part, UserPromptPart):
            user.append(_user_text(part))
        elif isinstance(part, SystemPromptPart):
            system.append(part.content)
    if results:
        role = MessageRole.TOOL
        content = "\n".join(r.content for r in results)
    elif user:
        role, content = MessageRole.USER, "\n".join(user)
    else:
        role, content = MessageRole.SYSTEM, "\n".join(system)
    return Message(
        id=id, thread_id=thread_id, role=role, content=content, created_at_ts=created_at_ts,
        run_id=run_id, tool_results=tuple(results), injected=injected,
        data=_dump(model_message),
    )


def text_model_message(role: MessageRole | str, content: str) -> ModelMessage:
    """The pydantic-ai message for a plain text message of a role.

    Raises:
        ValueError: for the ``tool`` role (tool results come only from tool calls) or an
            unknown role.
    """
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        UserPromptPart,
    )

    role = MessageRole(role)
    if role is MessageRole.USER:
        return ModelRequest(parts=[UserPromptPart(content)])
    if role is MessageRole.ASSISTANT:
        return ModelResponse(parts=[TextPart(content)])
    if role is MessageRole.SYSTEM:
        return ModelRequest(parts=[SystemPromptPart(content)])
    raise ValueError("a tool message cannot be created from text; tools answer tool calls")


def with_content(message: Message, content: str) -> Message:
    """A copy of a plain text message with other content (its model data rebuilt).

    Raises:
        ValueError: the message carries tool calls or tool results, whose content cannot
            be replaced by text.
    """
    if message.tool_calls or message.tool_results:
        raise ValueError(
            f"message {message.id} carries tool calls or results; its content cannot be replaced"
        )
    data = _dump(text_model_message(message.role, content))
    return Message(
        id=message.id, thread_id=message.thread_id, role=message.role, content=content,
        created_at_ts=message.created_at_ts, run_id=message.run_id, injected=message.injected,
        data=data,
    )


def check_content(content: object) -> str:
    """Validate caller-supplied message text.

    Raises:
        InvalidArgument: (a ``ValueError``) not a string, empty, not valid Unicode (a lone
            surrogate), or longer than `MAX_CONTENT_CHARS`.
    """
    content = check_text(content, "message content", max_chars=MAX_CONTENT_CHARS, nul=True)
    if not content.strip():
        raise InvalidArgument("message content must not be empty")
    return content


def history(messages: Iterable[Message]) -> list[ModelMessage]:
    """The pydantic-ai history of stored messages, in order."""
    datas: Sequence[str] = [m.data for m in messages]
    if not datas:
        return []
    from pydantic_ai import ModelMessagesTypeAdapter

    return list(ModelMessagesTypeAdapter.validate_json("[" + ",".join(datas) + "]"))
