"""A run in line: records its start and end in ``$MULTINODE_LOG`` and sleeps ``seconds``."""

import asyncio
import json
import os
import time

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Sleep(BaseModel):
    seconds: float = 0.0


def note(state: ThreadState, name: str, event: str) -> None:
    """Append one line (one ``write``) to the log the nodes share."""
    line = json.dumps({"effect": name, "thread": state.thread_id, "event": event,
                       "node": os.environ["MULTINODE_NODE"], "at": time.time()})
    fd = os.open(os.environ["MULTINODE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def slow_task(state: ThreadState, args: Sleep) -> None:
    note(state, "slow_task", "start")
    await asyncio.sleep(args.seconds)
    note(state, "slow_task", "end")


effect = define_effect("Sleeps `seconds` in line with the thread's other runs.",
                       Sleep, slow_task, timeout_seconds=60)
