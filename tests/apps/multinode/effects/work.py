"""Records each execution (its start, and its end or cancellation) as JSON lines in one file
all nodes share.

The file is ``$MULTINODE_LOG``; each line is written with one ``write`` on a file opened for
appending, so the lines of concurrent processes do not mix. The node is
``$MULTINODE_NODE`` (the name the test gave the process), so that the test counts the
executions from the effect's side, not from the runs' statuses.

With ``$MULTINODE_EXIT_AFTER_DELETE`` set, the process exits (status 70, no cleanup) as soon
as a thread's deletion has committed, before anything else is done about it: a node killed
right after its deletion's commit.
"""

import asyncio
import os
from typing import Any

from pydantic import BaseModel

from runtime import ThreadState, define_effect
from runtime.alarms import AlarmIndex
from tests.apps._multinode_log import note

if os.environ.get("MULTINODE_EXIT_AFTER_DELETE"):
    _delete_with = AlarmIndex.delete_with

    async def _exit_after_delete(self: AlarmIndex, thread_id: str, delete: Any) -> Any:
        await _delete_with(self, thread_id, delete)  # the deletion's transaction committed
        os._exit(70)

    setattr(AlarmIndex, "delete_with", _exit_after_delete)  # noqa: B010


class Work(BaseModel):
    item: int
    seconds: float = 0.0


async def work(state: ThreadState, args: Work) -> None:
    note(state, "start", item=args.item)
    try:
        await asyncio.sleep(args.seconds)
    except asyncio.CancelledError:
        note(state, "canceled", item=args.item)
        raise
    note(state, "end", item=args.item)


effect = define_effect("Records its start and end (or its cancellation) in $MULTINODE_LOG.",
                       Work, work, timeout_seconds=30)
