"""An effect without arguments."""

from runtime import ThreadState, define_effect


async def ping(state: ThreadState) -> None:
    return None


effect = define_effect("Answers nothing, takes no args.", ping)
