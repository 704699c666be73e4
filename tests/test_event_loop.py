"""The runtime never blocks the event loop: SQLite and file work run in worker threads.

blockbuster raises inside any coroutine that makes a blocking call (file I/O, sqlite3,
time.sleep, os.stat, ...) on the loop, as pydantic-ai's test suite does; the SQLite
commits without an fsync that a thread store makes on the loop on purpose are allowed.
"""

from __future__ import annotations

from pathlib import Path

import anyio
from blockbuster import blockbuster_ctx

from runtime import EffectStatus, Runtime
from tests.conftest import allow_inline_sqlite

APP = Path(__file__).parent / "apps" / "core"


async def test_a_full_workload_makes_no_blocking_call_on_the_loop(tmp_path: Path) -> None:
    with blockbuster_ctx() as bb:
        allow_inline_sqlite(bb)
        async with Runtime(
            app_dir=APP, data_dir=tmp_path, load_packages=False, max_open_threads=2
        ) as rt:
            threads = [await rt.create_thread(f"t{i}") for i in range(4)]
            ids = []
            for t in threads:
                sub = t.subscribe()
                ids.append(await t.schedule_effect("note", {"text": "now"}))
                ids.append(await t.schedule_effect("note", {"text": "soon"}, delay=0.05))
                later = await t.schedule_effect("note", {"text": "never"}, delay=60)
                assert await t.remove_scheduled_effect(later)
                sub.close()
            await anyio.sleep(0.2)
            await rt.wait_idle()
            for t in threads:
                page = await t.list_runs()
                assert sorted(r.status for r in page.runs) == [
                    EffectStatus.CANCELED, EffectStatus.COMPLETED, EffectStatus.COMPLETED
                ]
                # run_now first: a replay starts at once, and a run cannot run now while
                # another of its thread runs.
                await t.run_now(await t.schedule_effect("note", {"text": "x"}, delay=60))
                replay = await t.replay(page.runs[-1].id)
                assert (await t.get_run(replay)).replay_of == page.runs[-1].id
            await rt.wait_idle()
            assert (await rt.pause_thread("t1")).paused
            assert not (await rt.resume_thread("t1")).paused
            assert (await rt.list_threads()).threads
            assert await rt.delete_thread("t0")
    log = (tmp_path / "notes.log").read_text().splitlines()
    assert sum(1 for line in log if line.endswith(" now")) == 8  # 4 runs + 4 replays
    assert not any(line.endswith(" never") for line in log)
