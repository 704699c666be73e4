"""filter_messages: records what it saw; with "forget" in the last prompt, keeps only the
last message (the model then sees nothing older)."""

from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart

from runtime import ThreadState, define_hook

SEEN: list[tuple[int, object]] = []


async def watch(state: ThreadState, messages: list[ModelMessage]) -> list[ModelMessage] | None:
    SEEN.append((len(messages), state.execution))
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(
        isinstance(p, UserPromptPart) and "forget" in str(p.content) for p in last.parts
    ):
        return [last]
    return None


hook = define_hook("filter_messages", "watch_history", watch)
