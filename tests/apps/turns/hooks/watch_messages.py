"""after_create_message: records (role, content, execution) of every stored message."""

from runtime import Message, ThreadState, define_hook

SEEN: list[tuple[str, str, object]] = []


async def watch(state: ThreadState, message: Message) -> None:
    SEEN.append((str(message.role), message.content, state.execution))


hook = define_hook("after_create_message", "watch_messages", watch)
