"""A concurrent run: records its start and end in ``$MULTINODE_LOG``, sleeps ``seconds``."""

import asyncio
import json
import os
import time

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Sleep(BaseModel):
    seconds: float = 0.0


def _note(state: ThreadState, event: str) -> None:
    line = json.dumps({"effect": "conc_task", "thread": state.thread_id, "event": event,
                       "node": os.environ["MULTINODE_NODE"], "at": time.time()})
    fd = os.open(os.environ["MULTINODE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def conc_task(state: ThreadState, args: Sleep) -> None:
    _note(state, "start")
    await asyncio.sleep(args.seconds)
    _note(state, "end")


effect = define_effect("Sleeps `seconds` beside the thread's other runs.",
                       Sleep, conc_task, timeout_seconds=60, concurrent=True)
