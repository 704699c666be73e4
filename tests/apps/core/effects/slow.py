import asyncio

from pydantic import BaseModel

from runtime import ThreadState, define_effect


class Slow(BaseModel):
    seconds: float


async def slow(state: ThreadState, args: Slow) -> None:
    marker = state.runtime.settings.data_dir / "slow.started"
    marker.write_text(state.thread_id)
    await asyncio.sleep(args.seconds)
    with open(state.runtime.settings.data_dir / "slow.done", "a") as f:
        f.write(state.thread_id + "\n")


effect = define_effect("Sleeps a while.", Slow, slow, timeout_seconds=30)
