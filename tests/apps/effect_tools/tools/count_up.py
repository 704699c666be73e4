"""A streaming effect tool: yields 1..n; the last value is its recorded result."""

from pydantic import BaseModel

from runtime import define_effect_tool

CALLS: list[int] = []


class Count(BaseModel):
    n: int


async def count_up(state, args: Count):
    CALLS.append(args.n)
    for i in range(1, args.n + 1):
        yield {"at": i}


tool = define_effect_tool("Counts up to n.", Count, count_up)
