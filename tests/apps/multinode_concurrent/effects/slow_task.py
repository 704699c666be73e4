"""A run in line: records its start and end in ``$MULTINODE_LOG`` and sleeps ``seconds``."""

import asyncio

from pydantic import BaseModel

from runtime import ThreadState, define_effect
from tests.apps._multinode_log import note


class Sleep(BaseModel):
    seconds: float = 0.0


async def slow_task(state: ThreadState, args: Sleep) -> None:
    note(state, "start", effect="slow_task")
    await asyncio.sleep(args.seconds)
    note(state, "end", effect="slow_task")


effect = define_effect("Sleeps `seconds` in line with the thread's other runs.",
                       Sleep, slow_task, timeout_seconds=60)
