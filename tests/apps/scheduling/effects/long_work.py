"""Long work beside the thread's other runs (``concurrent=True``): runs until the test sets
``GATES[key]``; writes ``<key> started``, then ``<key> done`` or ``<key> canceled``, to
<data_dir>/long_work.log."""

import asyncio

from pydantic import BaseModel

from runtime import ThreadState, define_effect

GATES: dict[str, asyncio.Event] = {}


class LongWork(BaseModel):
    key: str


async def long_work(state: ThreadState, args: LongWork) -> None:
    log = state.runtime.settings.data_dir / "long_work.log"
    with open(log, "a") as f:
        f.write(f"{args.key} started\n")
    try:
        await GATES.setdefault(args.key, asyncio.Event()).wait()
    except asyncio.CancelledError:
        with open(log, "a") as f:
            f.write(f"{args.key} canceled\n")
        raise
    with open(log, "a") as f:
        f.write(f"{args.key} done\n")


effect = define_effect("Works beside the other runs.", LongWork, long_work, concurrent=True)
