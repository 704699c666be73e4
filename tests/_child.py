"""A real process running the runtime, for crash tests (killed with SIGKILL by the test).

Usage:
    python tests/_child.py DATA_DIR serve [THREAD EFFECT ARGS_JSON DELAY]
        start; optionally schedule one run (printing "SCHEDULED <run id>"); print "READY";
        then run until killed.
    python tests/_child.py DATA_DIR drain THREAD
        start, wait until THREAD has nothing pending-and-due or running, print its runs
        as JSON on one line, and exit.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from runtime import Runtime, ThreadExists

APP = Path(__file__).parent / "apps" / "core"


async def main(argv: list[str]) -> None:
    data_dir, mode = argv[0], argv[1]
    async with Runtime(app_dir=APP, data_dir=data_dir, load_packages=False) as rt:
        if mode == "serve":
            if len(argv) > 2:
                thread_id, effect, args, delay = argv[2], argv[3], json.loads(argv[4]), argv[5]
                try:
                    state = await rt.create_thread(thread_id)
                except ThreadExists:
                    state = await rt.get_thread(thread_id)
                run_id = await state.schedule_effect(effect, args, delay=float(delay))
                print("SCHEDULED", run_id, flush=True)
            print("READY", flush=True)
            await asyncio.Event().wait()
        elif mode == "drain":
            state = await rt.get_thread(argv[2])
            while True:
                page = await state.list_runs(limit=500)
                now = rt.clock.now()
                busy = [
                    r for r in page.runs
                    if r.status == "running" or (r.status == "pending" and r.run_at_ts <= now)
                ]
                if not busy:
                    break
                await asyncio.sleep(0.05)
            await rt.wait_idle()
            page = await state.list_runs(limit=500)
            print(json.dumps([r.to_json() for r in page.runs]), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
