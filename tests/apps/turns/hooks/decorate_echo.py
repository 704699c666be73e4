"""after_tool_call_success: wraps echo's result in brackets."""

from typing import Any

from runtime import ThreadState, ToolCall, define_hook


async def decorate(state: ThreadState, call: ToolCall, result: Any) -> Any:
    if call.name == "echo":
        return f"[{result}]"
    return None


hook = define_hook("after_tool_call_success", "decorate_echo", decorate)
