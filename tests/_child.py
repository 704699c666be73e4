"""A real process running the runtime, for crash tests (killed with SIGKILL by the test).

Usage:
    python tests/_child.py DATA_DIR serve [THREAD EFFECT ARGS_JSON DELAY]
        start; optionally schedule one run (printing "SCHEDULED <run id>"); print "READY";
        then run until killed.
    python tests/_child.py DATA_DIR delete-while-opening
        thread "x" has a run due in 0.3 s and its store opens slowly; while its drain
        opens it, "x" is deleted, and that deletion waits behind the deletion of "y",
        which never ends (a stuck disk). Prints "READY" once x's drain has given up, then
        runs until killed: the kill lands between the two halves of a deletion.
    python tests/_child.py DATA_DIR serve-warm THREAD EFFECT ARGS_JSON DELAY
        as serve with one run, but first THREAD runs a run of "record" due now and drains
        (its alarm row stays low: the thread is warm), then the run is scheduled.
    python tests/_child.py DATA_DIR drain THREAD
        start, wait until THREAD has nothing pending-and-due or running, print its runs
        as JSON on one line, and exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from runtime import Runtime, ThreadExists
from runtime.actors import ThreadLifecycle
from runtime.alarms import ALARM_FLUSH_SECONDS
from runtime.storage.sqlite import SQLiteBackend, SQLiteRuntimeStore, SQLiteThreadStore

APP = Path(__file__).parent / "apps" / "core"


class _StuckBackend(SQLiteBackend):
    """Deletes of "y" never end; opening "x" waits for `let_open`."""

    def __init__(self, data_dir: str) -> None:
        super().__init__(data_dir)
        self.deleting_y = threading.Event()
        self.let_open = threading.Event()

    def open(self) -> SQLiteRuntimeStore:
        store = super().open()
        delete = store.delete_thread

        def stuck_delete(thread_id: str) -> bool:
            if thread_id == "y":
                self.deleting_y.set()
                threading.Event().wait()  # until the process is killed
            return delete(thread_id)

        store.delete_thread = stuck_delete  # type: ignore[method-assign]
        return store

    def open_thread_store(self, thread_id: str) -> SQLiteThreadStore:
        if thread_id == "x":
            self.let_open.wait()
        return super().open_thread_store(thread_id)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def _delete_while_opening(rt: Runtime, backend: _StuckBackend) -> None:
    x = await rt.create_thread("x")
    await x.schedule_effect("record", {"key": "x"}, delay=0.3)
    await rt.create_thread("y")  # the only open actor now: x is closed (evicted)
    await _until(lambda: rt.actors.lifecycle("x") is ThreadLifecycle.OPENING)
    delete_y = asyncio.create_task(rt.delete_thread("y"))
    await _until(backend.deleting_y.is_set)
    delete_x = asyncio.create_task(rt.delete_thread("x"))  # waits behind y's
    await _until(lambda: rt.actors.lifecycle("x") is ThreadLifecycle.DELETING)
    backend.let_open.set()
    await _until(lambda: rt.dispatcher.state("x") is None)  # its drain met the deletion
    print("READY", flush=True)
    await asyncio.gather(delete_y, delete_x)


async def main(argv: list[str]) -> None:
    data_dir, mode = argv[0], argv[1]
    if mode == "delete-while-opening":
        backend = _StuckBackend(data_dir)
        async with Runtime(
            app_dir=APP, data_dir=data_dir, load_packages=False, storage=backend,
            max_open_threads=1,
        ) as rt:
            await _delete_while_opening(rt, backend)
        return
    async with Runtime(
        app_dir=APP, data_dir=data_dir, load_packages=False,
        # PostgreSQL when the test sets it (tests marked every_backend), else SQLite files.
        database_url=os.environ.get("THREAD_EFFECTS_DATABASE_URL") or None,
        # NORMAL: the run's store calls are made on the event loop (sqlite-normal).
        synchronous=os.environ.get("THREAD_EFFECTS_TEST_SYNCHRONOUS") or "FULL",
        # One node id for every child of a test: a restart is the same node, which
        # re-queues its killed predecessor's runs at once.
        **({"node_id": os.environ["THREAD_EFFECTS_NODE_ID"]}
           if os.environ.get("THREAD_EFFECTS_NODE_ID") else {}),
    ) as rt:
        if mode == "serve-warm":
            state = await rt.create_thread(argv[2])
            await state.schedule_effect("record", {"key": "first"})
            await rt.wait_idle()
            await asyncio.sleep(ALARM_FLUSH_SECONDS * 4)  # past any flush of the row
            run_id = await state.schedule_effect(argv[3], json.loads(argv[4]),
                                                 delay=float(argv[5]))
            print("SCHEDULED", run_id, flush=True)
            print("READY", flush=True)
            await asyncio.Event().wait()
        elif mode == "serve":
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
