"""Notes the event-loop turn it raises in (a test sets ``TURN[0]``, a turn counter), then
raises."""

from collections.abc import Callable

from pydantic import BaseModel

from runtime import ThreadState, define_effect

TURN: list[Callable[[], int]] = [lambda: 0]
RAISED: dict[tuple[str, int], int] = {}  # (thread id, i) -> the turn its effect raised in


class Boom(BaseModel):
    i: int


async def boom(state: ThreadState, args: Boom) -> None:
    RAISED[(state.thread_id, args.i)] = TURN[0]()
    raise RuntimeError(f"boom {args.i}")


effect = define_effect("Notes the loop turn it raises in, then raises.", Boom, boom)
