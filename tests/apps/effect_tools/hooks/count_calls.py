"""after_tool_call_success: records each successful call (hooks wrap effect tools too)."""

from runtime import ThreadState, ToolCall, define_hook

SEEN: list[tuple[str, object, str | None]] = []


async def count(state: ThreadState, call: ToolCall, result: object) -> None:
    SEEN.append((call.name, result, state.execution.run_id if state.execution else None))


hook = define_hook("after_tool_call_success", "count_calls", count)
