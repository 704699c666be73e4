"""Runs until canceled, then takes 2.5 s to clean up; writes what it got to its data dir."""

import asyncio

from runtime import ThreadState, define_effect


async def slow_stop(state: ThreadState) -> None:
    data = state.runtime.settings.data_dir
    (data / "slow_stop.started").write_text(state.thread_id)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        try:
            await asyncio.sleep(2.5)  # the cleanup: a second cancel would cut it short
        except asyncio.CancelledError:
            (data / "slow_stop.cut").write_text(state.thread_id)
            raise
        (data / "slow_stop.cleaned").write_text(state.thread_id)
        raise


effect = define_effect("Runs until canceled, then cleans up for 2.5 s.", slow_stop)
