"""Tools: functions the model may call during a turn, one per file in ``agents/tools/``.

``agents/tools/set_reminder.py`` defines the tool ``set_reminder``::

    class Reminder(BaseModel):
        text: str
        delay_seconds: float

    async def set_reminder(state: ThreadState, args: Reminder) -> dict:
        run_id = await state.schedule_effect("send_reminder", {"text": args.text},
                                             delay=args.delay_seconds)
        return {"scheduled": run_id}

    tool = define_tool("Sets a reminder.", Reminder, set_reminder)

A tool runs as a pydantic-ai tool whose dependencies are the thread's `ThreadState`, with
``state.execution`` set to the turn's run id, the model step and the tool call id. What it
returns (text, or anything JSON-serializable) is what the model sees. If it raises, its
args fail the schema, or it returns a value that cannot be serialized (`check_tool_result`),
the model sees a tool error (a pydantic-ai ``ToolFailed``) and the turn goes on;
``after_tool_call_failure`` hooks see the error first (``after_tool_call_success`` hooks
do not run).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, overload

import anyio.to_thread
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from runtime._limits import unknown_fields

if TYPE_CHECKING:
    from runtime.thread import ThreadState

ToolFn = Callable[..., Awaitable[Any] | Any]


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """What `define_tool` returns: a tool's description, argument schema and function.

    Attributes:
        description: Tells the model what the tool does and when to call it.
        args_schema: A pydantic model the model's arguments are validated against, or
            None for a tool without arguments.
        execute: ``execute(state, args)`` (``execute(state)`` without a schema); async, or
            sync (then run in a worker thread, and unable to await the state's methods).
        name: The ``name=`` given to `define_tool` (``""`` if none); discovery sets it
            to the file name (and refuses a ``name=`` that differs from it).
        idempotency: ``"call"`` (one run per model tool call) or ``"args"`` (one run per
            arguments in the turn); see `define_tool`.
        idempotency_key: ``key(args) -> str`` (the validated arguments), or None.
        idempotency_window: ``"run"``, ``"thread"`` or ``"cross-run"`` with a key.
    """

    description: str
    args_schema: type[BaseModel] | None
    execute: ToolFn
    name: str = ""
    idempotency: str = "call"
    idempotency_key: Callable[[Any], str] | None = None
    idempotency_window: str | None = None

    @property
    def tool_name(self) -> str:
        """The name the model calls: `name`, else the function's ``__name__``."""
        return self.name or str(getattr(self.execute, "__name__", ""))

    @property
    def is_async(self) -> bool:
        """Whether ``execute`` is a coroutine function (else it runs in a worker thread)."""
        return inspect.iscoroutinefunction(self.execute)

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments the model is asked for."""
        if self.args_schema is None:
            return {"type": "object", "properties": {}, "additionalProperties": False}
        return self.args_schema.model_json_schema()

    def validate_args(self, raw: dict[str, Any]) -> BaseModel | None:
        """Validate the model's arguments.

        Raises:
            ValueError: naming each failing field (the model sees this message).
        """
        if self.args_schema is None:
            if raw:  # the one rule for unknown fields (runtime._limits.unknown_fields)
                raise ValueError(f"Tool {self.name} takes no arguments, got {sorted(raw)[:5]}")
            return None
        try:
            model = self.args_schema.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(args)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ValueError(f"Invalid arguments for tool {self.name}: {problems}") from None
        if problem := unknown_fields(model, raw):
            raise ValueError(f"Invalid arguments for tool {self.name}: {problem}")
        return model

    async def call(self, state: ThreadState, args: BaseModel | None) -> Any:
        """Run ``execute`` (sync functions in a worker thread) and return its result."""
        call_args = (state, args) if self.args_schema is not None else (state,)
        if self.is_async:
            return await self.execute(*call_args)
        result = await anyio.to_thread.run_sync(partial(self.execute, *call_args))
        if inspect.isawaitable(result):
            return await result
        return result


class UnsendableToolResult(ValueError):
    """A tool returned a value that cannot be sent to the model (not JSON-serializable)."""


def check_tool_result(tool_name: str, result: Any) -> None:
    """Check that pydantic-ai can send a tool's result to the model (and store it).

    pydantic-ai serializes the result only when it builds the next model request, where
    a failure would crash the turn; checked here, it becomes a tool error the model sees.

    Raises:
        UnsendableToolResult: naming the tool and what could not be serialized.
    """
    from pydantic_ai.messages import tool_return_ta  # not at import: effects-only apps skip it

    try:
        tool_return_ta.dump_json(result, by_alias=True)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise UnsendableToolResult(
            f"Tool {tool_name} returned a value of type {type(result).__name__} that cannot "
            f"be sent to the model: {exc}. A tool returns text or a JSON-serializable value"
        ) from None


@overload
def define_tool(
    description: str,
    args_schema: type[BaseModel],
    execute: Callable[[ThreadState, Any], Awaitable[Any] | Any],
    /,
    *,
    name: str | None = None,
    idempotency: str = "call",
    idempotency_key: Callable[[Any], str] | None = None,
    idempotency_window: str | None = None,
) -> ToolDefinition: ...


@overload
def define_tool(
    description: str,
    execute: Callable[[ThreadState], Awaitable[Any] | Any],
    /,
    *,
    name: str | None = None,
    idempotency: str = "call",
    idempotency_key: Callable[[Any], str] | None = None,
    idempotency_window: str | None = None,
) -> ToolDefinition: ...


def define_tool(
    description: str,
    schema_or_execute: Any,
    execute: Any = None,
    /,
    *,
    name: str | None = None,
    idempotency: str = "call",
    idempotency_key: Callable[[Any], str] | None = None,
    idempotency_window: str | None = None,
) -> ToolDefinition:
    """Define a tool; assign the result to a module-level name in ``agents/tools/<name>.py``.

    Two forms::

        tool = define_tool("Sets a reminder.", Reminder, set_reminder)  # with arguments
        tool = define_tool("Tells the time.", tell_time)                # no arguments

    Args:
        description: Non-empty text telling the model what the tool does.
        schema_or_execute: The pydantic model of the arguments, or the function for a tool
            without arguments.
        execute: The function when a schema is given: ``execute(state, args)``, returning
            text or a JSON-serializable value, or raising to report a failure.
        name: The tool's name where no file names it (`runtime.wrap_tools_for_run`);
            default: the function's name. In ``agents/tools/`` it must equal the file name.
        idempotency: What "the same call" is inside a turn, which is durable
            (docs/durable-turns.md): ``"call"`` (default) — one run per model tool call;
            ``"args"`` — one run per arguments in the turn: a second call with the same
            arguments (`runtime.keys.args_hash` of the model's JSON arguments) gets the
            first's result without running.
        idempotency_key: ``key(args) -> str``: a logical id (an order id, a date) from the
            validated arguments (the schema's model; None without a schema); calls with
            one key run once per ``idempotency_window``.
        idempotency_window: With a key: ``"run"`` (this turn and its sub-agent runs),
            ``"thread"`` (this thread) or ``"cross-run"`` (every thread, until purged).

    Returns:
        A `ToolDefinition` (its ``name`` is set when the file is discovered).

    Raises:
        TypeError: the schema is not a pydantic model, the function is not callable, or
            an ``idempotency_key`` without an ``idempotency_window`` (or the reverse),
            naming the tool.
        ValueError: the description is empty, the name is not snake_case, or an unknown
            idempotency or window.
    """
    schema, execute = check_tool_parts("define_tool", description, schema_or_execute, execute,
                                       name)
    check_idempotency(name or str(getattr(execute, "__name__", "")), idempotency,
                      idempotency_key, idempotency_window)
    return ToolDefinition(description=description.strip(), args_schema=schema, execute=execute,
                          name=name or "", idempotency=idempotency,
                          idempotency_key=idempotency_key, idempotency_window=idempotency_window)


def check_idempotency(
    tool: str, idempotency: object, key: object, window: object
) -> None:
    """Check `define_tool`'s idempotency options (as `runtime.durable.durable_tool` does).

    Raises:
        TypeError: a key without a window, or a window without a key, naming the tool.
        ValueError: an unknown idempotency or window, or a key with ``idempotency="args"``.
    """
    if idempotency not in ("call", "args"):
        raise ValueError(f"define_tool: tool {tool!r}: idempotency must be 'call' or 'args', "
                         f"got {idempotency!r}")
    if key is not None and not callable(key):
        raise TypeError(f"define_tool: tool {tool!r}: idempotency_key must be a function "
                        f"key(args) -> str, got {key!r}")
    if key is not None and window is None:
        raise TypeError(f"define_tool: tool {tool!r} has an idempotency_key but no "
                        f"idempotency_window; choose a window: 'run', 'thread' or 'cross-run'")
    if key is None and window is not None:
        raise TypeError(f"define_tool: tool {tool!r} has an idempotency_window but no "
                        f"idempotency_key; pass the key function the window applies to")
    if window is not None and window not in ("run", "thread", "cross-run"):
        raise ValueError(f"define_tool: tool {tool!r}: idempotency_window must be 'run', "
                         f"'thread' or 'cross-run', got {window!r}")
    if key is not None and idempotency == "args":
        raise ValueError(f"define_tool: tool {tool!r}: choose idempotency='args' or an "
                         f"idempotency_key, not both")


TOOL_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def check_tool_parts(
    what: str, description: object, schema_or_execute: Any, execute: Any, name: object
) -> tuple[type[BaseModel] | None, ToolFn]:
    """Check `define_tool`'s arguments (shared by `runtime.define_effect_tool`).

    Returns:
        ``(args_schema or None, execute)``.

    Raises:
        TypeError, ValueError: as `define_tool` says, prefixed with ``what``.
    """
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"{what}: description must be a non-empty string")
    if name is not None and not (isinstance(name, str) and TOOL_NAME_RE.match(name)):
        raise ValueError(f"{what}: name must be snake_case (^[a-z][a-z0-9_]*$), got {name!r}")
    schema: type[BaseModel] | None
    if execute is None:
        schema, execute = None, schema_or_execute
    else:
        schema = schema_or_execute
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise TypeError(
                f"{what}: args_schema must be a pydantic BaseModel subclass, got {schema!r}"
            )
    if not callable(execute):
        raise TypeError(f"{what}: execute must be callable, got {execute!r}")
    return schema, execute
