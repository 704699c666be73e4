import asyncio

from runtime import ThreadState, define_effect


async def overrun(state: ThreadState) -> None:
    await asyncio.sleep(10)


effect = define_effect("Overruns its timeout.", overrun, timeout_seconds=0.2)
