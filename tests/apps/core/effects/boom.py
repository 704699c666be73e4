from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Boom(BaseModel):
    message: str = "boom"


async def boom(state: ThreadState, args: Boom) -> None:
    raise RuntimeError(args.message)


effect = define_effect("Always raises.", Boom, boom)
