"""Schedules a `record` run on its own thread: effects may schedule effects."""

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Chain(BaseModel):
    key: str


async def chain(state: ThreadState, args: Chain) -> None:
    await state.schedule_effect("record", {"key": args.key})


effect = define_effect("Schedules another effect.", Chain, chain)
