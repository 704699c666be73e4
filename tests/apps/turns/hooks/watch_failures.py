"""after_tool_call_failure: records the call, the error and the execution."""

from runtime import ThreadState, ToolCall, define_hook

SEEN: list[tuple[ToolCall, str, object]] = []


async def watch(state: ThreadState, call: ToolCall, error: str) -> None:
    SEEN.append((call, error, state.execution))


hook = define_hook("after_tool_call_failure", "watch_failures", watch)
