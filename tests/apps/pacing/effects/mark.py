"""Notes the event-loop turn each run starts in (a test sets ``TURN[0]``, a turn counter)."""

from collections.abc import Callable

from pydantic import BaseModel

from runtime import ThreadState, define_effect

TURN: list[Callable[[], int]] = [lambda: 0]
STARTS: list[int] = []


class Mark(BaseModel):
    i: int


async def mark(state: ThreadState, args: Mark) -> None:
    STARTS.append(TURN[0]())


effect = define_effect("Notes the loop turn it starts in.", Mark, mark)
