"""after_thread_created, but no agent lists it: it must never run."""

from runtime import ThreadState, define_hook

RAN: list[str] = []


async def undeclared(state: ThreadState) -> None:
    RAN.append(state.thread_id)
    await state.schedule_effect("note", {"text": "undeclared hook ran"})


hook = define_hook("after_thread_created", "undeclared", undeclared)
