"""A link of a chain: waits for its gate (if any), then schedules the next link under the
key ``"chain"`` (see tests/test_runs.py)."""

import asyncio

from pydantic import BaseModel

from runtime import ThreadState, define_effect

GATES: dict[str, asyncio.Event] = {}


class Link(BaseModel):
    gate: str | None = None
    every_seconds: float = 60


async def link(state: ThreadState, args: Link) -> None:
    if args.gate is not None:
        await GATES.setdefault(args.gate, asyncio.Event()).wait()
    await state.schedule_effect("link", args, delay=args.every_seconds, key="chain")


effect = define_effect("Schedules the next link of the chain.", Link, link)
