"""`hang_once` as a concurrent effect: first attempt leaves a marker and hangs beside the
thread's other runs (the test kills the process); later attempts complete."""

import asyncio

from runtime import ThreadState, define_effect


async def hang_once_beside(state: ThreadState) -> None:
    marker = state.runtime.settings.data_dir / "hang_once_beside.started"
    if marker.exists():
        (state.runtime.settings.data_dir / "hang_once_beside.done").write_text("done")
        return
    marker.write_text("started")
    await asyncio.sleep(3600)


effect = define_effect("Hangs on its first attempt, beside other runs.", hang_once_beside,
                       concurrent=True)
