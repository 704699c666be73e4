"""The pydantic-ai side of a turn: an `AgentDefinition` built as a pydantic-ai ``Agent``.

Kept apart from `runtime.turns` so that pydantic-ai is imported only by apps that use it:
`runtime.turns` imports this module when it builds an agent, and the runtime at startup
when the app defines agents (`runtime.turns.resolve_models`, in a worker thread, so a
turn never imports on the event loop). An app with effects only never loads pydantic-ai.

pydantic-ai reads the annotations of the functions given to it (``RunContext`` first
means "pass the run context"), resolving them in this module's globals: the names they use
are imported here at module level, not under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from opentelemetry import trace
from pydantic_ai import Agent, ModelRetry, RunContext, Tool, ToolFailed
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.messages import ModelMessage

from runtime import hooks as _hooks
from runtime.agents import AgentApp, AgentDefinition
from runtime.durable import IdempotencyWindow, durable_tool
from runtime.effect_tools import EffectToolDefinition, EffectToolSettings, call_effect_tool
from runtime.errors import database_unreachable
from runtime.hooks import HookPoint
from runtime.messages import ToolCall
from runtime.telemetry import TRACER_NAME
from runtime.thread import Execution, ThreadState
from runtime.tools import ToolDefinition, check_tool_result
from runtime.watchdog import running_tool

log = logging.getLogger("runtime.turns")

_WINDOWS: dict[str, IdempotencyWindow] = {
    "run": "run", "thread": "thread", "cross-run": "cross-run"
}


def _execution(ctx: RunContext[ThreadState]) -> Execution:
    return Execution(run_id=ctx.run_id or "", step=ctx.run_step, tool_call_id=ctx.tool_call_id)


def effect_tool_settings(state: ThreadState) -> EffectToolSettings:
    """The runtime's effect-tool settings (`runtime.config.Settings`), as the call takes them."""
    settings = state.runtime.settings
    return EffectToolSettings(
        lease_seconds=settings.effect_tool_lease_seconds,
        wait_timeout_seconds=settings.effect_tool_wait_seconds,
        max_result_bytes=settings.effect_tool_max_result_bytes,
        retention_seconds=settings.retention.effect_records_seconds,
    )


async def _call(defn: ToolDefinition, state: ThreadState, args: Any) -> Any:
    """Call a tool; an effect tool applies at most once per key, recorded in the thread."""
    if isinstance(defn, EffectToolDefinition):
        return await call_effect_tool(
            defn, state, args, store=state.runtime.effect_records, thread_id=state.thread_id,
            settings=effect_tool_settings(state),
        )
    return await defn.call(state, args)


def _tool(app: AgentApp, agent: AgentDefinition, defn: ToolDefinition) -> Tool[ThreadState]:
    succeeded = app.hooks_for(agent.name, HookPoint.AFTER_TOOL_CALL_SUCCESS)
    failed = app.hooks_for(agent.name, HookPoint.AFTER_TOOL_CALL_FAILURE)

    async def run(ctx: RunContext[ThreadState], **raw: Any) -> Any:
        state = ctx.deps.with_context(execution=_execution(ctx))
        call = ToolCall(ctx.tool_call_id or "", defn.name, dict(raw))
        # Effects the tool schedules are children of this span (runtime/telemetry.py).
        with trace.get_tracer(TRACER_NAME).start_as_current_span(
            f"tool {defn.name}",
            attributes={
                "thread_effects.thread_id": state.thread_id,
                "thread_effects.turn_id": ctx.run_id or "",
                "thread_effects.tool": defn.name,
                "thread_effects.tool_call_id": call.id,
            },
        ):
            return await _answer(state, call, raw, ctx.run_id or "")

    async def _answer(
        state: ThreadState, call: ToolCall, raw: dict[str, Any], turn_id: str
    ) -> Any:
        try:
            args = defn.validate_args(raw)
            with running_tool(defn.name, state.thread_id, turn_id):  # the watchdog
                result = await _call(defn, state, args)
            check_tool_result(defn.name, result)
        except ModelRetry as exc:
            # The tool asks the model to correct its call: pydantic-ai's retry, as is.
            await _hooks.after_tool_call_failure(failed, state, call, exc.message)
            raise
        except Exception as exc:
            if database_unreachable(exc):
                # The runtime's own database, not the tool, failed: the turn stops (HTTP
                # 503) and is resumed, running this call again; the model never sees it.
                log.info("tool %s in thread %s: the database cannot be reached: %s",
                         defn.name, state.thread_id, exc)
                raise
            error = str(exc) if isinstance(exc, ToolFailed | ValueError) and str(exc) else (
                f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            )
            log.info("tool %s failed in thread %s: %s", defn.name, state.thread_id, error)
            await _hooks.after_tool_call_failure(failed, state, call, error)
            raise ToolFailed(error) from exc
        return await _hooks.after_tool_call_success(succeeded, state, call, result)

    tool = Tool.from_schema(
        run,
        name=defn.name,
        description=defn.description,
        json_schema=defn.json_schema(),
        takes_ctx=True,
    )
    if defn.idempotency == "call" and defn.idempotency_key is None:
        return tool  # journaled by call id, like every tool of a turn (run_durable)
    key = None
    if defn.idempotency_key is not None:
        logical = defn.idempotency_key

        def key(raw: dict[str, Any]) -> str:
            return logical(defn.validate_args(raw))

    return durable_tool(tool, idempotency="args" if defn.idempotency == "args" else "call",
                        idempotency_key=key,
                        idempotency_window=_WINDOWS.get(defn.idempotency_window or ""))


def build_agent(app: AgentApp, agent: AgentDefinition) -> Agent[ThreadState, str]:
    """The pydantic-ai agent of a definition: its instructions, tools and history filters."""
    filters = app.hooks_for(agent.name, HookPoint.FILTER_MESSAGES)

    async def filter_history(
        ctx: RunContext[ThreadState], messages: list[ModelMessage]
    ) -> list[ModelMessage]:
        state = ctx.deps.with_context(execution=_execution(ctx))
        return await _hooks.filter_messages(filters, state, messages)

    instructions = agent.instructions
    if callable(instructions):
        compute = instructions

        async def dynamic(ctx: RunContext[ThreadState]) -> str:
            text = compute(ctx.deps.with_context(execution=_execution(ctx)))
            if inspect.isawaitable(text):
                text = await text
            return str(text)

        agent_instructions: Any = dynamic
    else:
        agent_instructions = instructions

    return Agent(
        None,
        name=agent.name,
        instructions=agent_instructions,
        deps_type=ThreadState,
        output_type=str,
        tools=[_tool(app, agent, app.tools[name]) for name in agent.tools],
        capabilities=[ProcessHistory(filter_history)] if filters else None,
    )
