"""Works a while, then schedules itself again (a chain that a shutdown must not break)."""

import asyncio

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Again(BaseModel):
    seconds: float = 2.0
    delay: float = 1.0


async def again(state: ThreadState, args: Again) -> None:
    (state.runtime.settings.data_dir / "again.started").write_text(state.thread_id)
    await asyncio.sleep(args.seconds)
    await state.schedule_effect("again", args, delay=args.delay)


effect = define_effect("Sleeps, then schedules itself again.", Again, again)
