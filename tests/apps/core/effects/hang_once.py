"""First attempt: leaves a marker and hangs (the test kills the process). Later: completes."""

import asyncio

from runtime import ThreadState, define_effect


async def hang_once(state: ThreadState) -> None:
    marker = state.runtime.settings.data_dir / "hang_once.started"
    if marker.exists():
        (state.runtime.settings.data_dir / "hang_once.done").write_text("done")
        return
    marker.write_text("started")
    await asyncio.sleep(3600)


effect = define_effect("Hangs on its first attempt.", hang_once)
