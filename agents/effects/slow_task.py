"""Demo: an effect that takes a while, so the pane shows it running.

Interrupt the server while it runs and it is re-queued and runs again after the restart.
"""

import asyncio

from pydantic import BaseModel, Field

from runtime import ThreadState, define_effect


class Slow(BaseModel):
    seconds: float = Field(default=10.0, ge=0, le=600, description="How long to work.")


async def slow_task(state: ThreadState, args: Slow) -> None:
    await asyncio.sleep(args.seconds)


effect = define_effect("Works for the given number of seconds.", Slow, slow_task)
