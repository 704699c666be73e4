"""Demo hook: greet a new thread with a message saying what the demo can do."""

from runtime import ThreadState, define_hook


async def welcome(state: ThreadState) -> None:
    await state.inject_message(
        "Hi! I can set reminders. Try: \"remind me in 10 seconds to stretch\"."
    )


hook = define_hook("after_thread_created", "welcome", welcome)
