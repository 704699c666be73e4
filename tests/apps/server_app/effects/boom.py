"""Always fails; ``repeat`` makes its error (and so its failed frame) as large as wanted."""

from pydantic import BaseModel, Field

from runtime import ThreadState, define_effect


class Boom(BaseModel):
    message: str = "boom"
    repeat: int = Field(default=1, ge=1, le=100_000)


async def boom(state: ThreadState, args: Boom) -> None:
    raise ValueError(args.message * args.repeat)


effect = define_effect("Always raises ValueError(message * repeat).", Boom, boom)
