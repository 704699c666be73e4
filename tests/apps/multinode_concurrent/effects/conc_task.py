"""A concurrent run: records its start and end in ``$MULTINODE_LOG``, sleeps ``seconds``."""

import asyncio

from pydantic import BaseModel

from runtime import ThreadState, define_effect
from tests.apps._multinode_log import note


class Sleep(BaseModel):
    seconds: float = 0.0


async def conc_task(state: ThreadState, args: Sleep) -> None:
    note(state, "start", effect="conc_task")
    await asyncio.sleep(args.seconds)
    note(state, "end", effect="conc_task")


effect = define_effect("Sleeps `seconds` beside the thread's other runs.",
                       Sleep, conc_task, timeout_seconds=60, concurrent=True)
