"""Runs until the test releases it (``GATES[key].set()``), or until it is canceled; records
``<key> started`` and, when a cancellation reaches it, ``<key> canceled`` in
<data_dir>/hold.log; a canceled run with a ``GATES["<key>:stop"]`` stops once that is set."""

import asyncio

from pydantic import BaseModel

from runtime import ThreadState, define_effect

GATES: dict[str, asyncio.Event] = {}


class Hold(BaseModel):
    key: str


async def hold(state: ThreadState, args: Hold) -> None:
    with open(state.runtime.settings.data_dir / "hold.log", "a") as f:
        f.write(f"{args.key} started\n")
    try:
        await GATES.setdefault(args.key, asyncio.Event()).wait()
    except asyncio.CancelledError:
        with open(state.runtime.settings.data_dir / "hold.log", "a") as f:
            f.write(f"{args.key} canceled\n")
        stop = GATES.get(f"{args.key}:stop")
        if stop is not None:  # slow to stop: until the test sets this gate too
            await stop.wait()
        raise


effect = define_effect("Waits until released by the test.", Hold, hold)
