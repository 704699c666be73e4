"""after_thread_created: schedules the ``note`` effect."""

from runtime import ThreadState, define_hook

SEEN: list[object] = []


async def greet(state: ThreadState) -> None:
    SEEN.append(state.execution)
    await state.schedule_effect("note", {"text": f"welcome to {state.thread_id}"})


hook = define_hook("after_thread_created", "greet_effect", greet)
