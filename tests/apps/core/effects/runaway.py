"""Schedules itself again at once, forever: the runaway chain the guard and pause stop."""

from runtime import ThreadState, define_effect


async def runaway(state: ThreadState) -> None:
    await state.schedule_effect("runaway", None, 0)


effect = define_effect("Schedules itself again with no delay.", runaway)
