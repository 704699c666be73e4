"""The pydantic-ai side of `runtime.effect_tools.wrap_tools_for_run` (imported only by it).

pydantic-ai reads the annotations of the functions given to it (``RunContext`` first means
"pass the run context"), resolving them in this module's globals: the names they use are
imported here at module level, not under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic_ai import CustomEvent, ModelRetry, RunContext, Tool, ToolFailed
from pydantic_ai.toolsets import FunctionToolset

from runtime.effect_tools import (
    EffectToolContext,
    EffectToolDefinition,
    ToolRunState,
    call_effect_tool,
)
from runtime.storage.records import EffectRecordStore
from runtime.thread import Execution, ThreadState
from runtime.tools import TOOL_NAME_RE, ToolDefinition, check_tool_result

log = logging.getLogger("runtime.effect_tools")


@dataclass(kw_only=True)
class EffectToolValue(CustomEvent):
    """A value a streaming effect tool yielded, in the run's event stream.

    Attributes:
        value: The value (JSON data for a replayed one).
        replayed: True when it is the recorded result of an earlier call (nothing ran).
    """

    value: Any = None
    replayed: bool = False


def _state(ctx: RunContext[Any], run: EffectToolContext) -> Any:
    execution = Execution(run_id=run.run_id, step=ctx.run_step, tool_call_id=ctx.tool_call_id)
    if isinstance(ctx.deps, ThreadState):
        return ctx.deps.with_context(execution=execution)
    return ToolRunState(execution=execution, context=run, deps=ctx.deps)


def _error_text(exc: Exception) -> str:
    text = str(exc)
    if isinstance(exc, ToolFailed | ValueError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _tool(defn: ToolDefinition, run: EffectToolContext, store: EffectRecordStore) -> Tool[Any]:
    name = defn.tool_name

    async def call(ctx: RunContext[Any], **raw: Any) -> Any:
        state = _state(ctx, run)
        try:
            args = defn.validate_args(raw)
            if isinstance(defn, EffectToolDefinition):

                async def emit(value: Any, replayed: bool) -> None:
                    await ctx.emit(EffectToolValue(value=value, replayed=replayed))

                return await call_effect_tool(
                    defn, state, args, store=store, thread_id=run.thread_id,
                    settings=run.settings, emit=emit,
                )
            result = await defn.call(state, args)
            check_tool_result(name, result)
            return result
        except ModelRetry:
            raise
        except Exception as exc:
            error = _error_text(exc)
            log.info("tool %s failed in run %s: %s", name, run.run_id, error)
            raise ToolFailed(error) from exc

    return Tool.from_schema(
        call, name=name, description=defn.description, json_schema=defn.json_schema(),
        takes_ctx=True,
    )


def build_toolset(
    tools: list[Any], run: EffectToolContext, store: EffectRecordStore
) -> FunctionToolset[Any]:
    """See `runtime.effect_tools.wrap_tools_for_run`."""
    built: list[Tool[Any]] = []
    names: set[str] = set()
    for entry in tools:
        if isinstance(entry, Tool):
            tool: Tool[Any] = entry
        elif isinstance(entry, ToolDefinition):
            if not TOOL_NAME_RE.match(entry.tool_name):
                raise ValueError(
                    f"wrap_tools_for_run: a tool needs a snake_case name, got "
                    f"{entry.tool_name!r}; pass name= to define_tool or define_effect_tool"
                )
            tool = _tool(entry, run, store)
        else:
            raise TypeError(f"wrap_tools_for_run: expected tool definitions (define_tool, "
                            f"define_effect_tool), got {entry!r}")
        if tool.name in names:
            raise ValueError(f"wrap_tools_for_run: two tools are named {tool.name!r}")
        names.add(tool.name)
        built.append(tool)
    return FunctionToolset(built)
