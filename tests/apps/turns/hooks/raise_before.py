"""before_create_message that raises when the message says "raise"."""

from runtime import Message, ThreadState, define_hook


async def raise_before(state: ThreadState, message: Message) -> Message | None:
    if "raise" in message.content:
        raise ValueError("before_create_message hook failed on purpose")
    return None


hook = define_hook("before_create_message", "raise_before", raise_before)
