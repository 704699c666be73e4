"""Fails in the ways effect code can go wrong beyond a plain exception."""

import asyncio
import os
import sys

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Misbehave(BaseModel):
    how: str


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


async def misbehave(state: ThreadState, args: Misbehave) -> None:
    if args.how == "surrogate":
        name = os.fsdecode(b"caf\xe9.txt")  # a lone surrogate, as from a real file name
        raise ValueError(f"cannot import {name}")
    if args.how == "exit":
        sys.exit(3)
    if args.how == "interrupt":
        raise KeyboardInterrupt
    if args.how == "cancel":
        raise asyncio.CancelledError
    if args.how == "bad_str":
        raise _BadStr
    if args.how == "wait_idle":
        await state.runtime.wait_idle()
    if args.how == "delete_self":
        assert await state.runtime.delete_thread(state.thread_id) is True
        (state.runtime.settings.data_dir / "deleted_self").write_text(state.thread_id)


effect = define_effect("Misbehaves on request.", Misbehave, misbehave)
