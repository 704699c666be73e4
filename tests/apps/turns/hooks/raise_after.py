"""after_create_message that raises when the message says "raise"."""

from runtime import Message, ThreadState, define_hook


async def raise_after(state: ThreadState, message: Message) -> None:
    if "raise" in message.content:
        raise RuntimeError("after_create_message hook failed on purpose")


hook = define_hook("after_create_message", "raise_after", raise_after)
