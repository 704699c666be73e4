"""Runs until the test releases it: ``GATES[key].set()`` (see tests/conftest.py `release`)."""

import asyncio

from pydantic import BaseModel

from runtime import ThreadState, define_effect

GATES: dict[str, asyncio.Event] = {}


class Hold(BaseModel):
    key: str


async def hold(state: ThreadState, args: Hold) -> None:
    await GATES.setdefault(args.key, asyncio.Event()).wait()


effect = define_effect("Waits until released by the test.", Hold, hold)
