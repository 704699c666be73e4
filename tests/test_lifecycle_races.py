"""Lifecycle races of the core: a deletion that fails, calls in flight at close, wait_idle
at close. (A kill -9 between the two halves of a deletion: tests/test_crash.py.)"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import EffectStatus, Runtime, RuntimeClosed, ThreadState
from runtime.storage.base import StorageBackend
from runtime.testing import FakeClock
from tests.storage.backends import BACKENDS, make_backend, same_data, stored_alarms

APP = Path(__file__).parent / "apps" / "core"


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _open_files_under(directory: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            found.append(target)
    return found


async def test_a_delete_the_runtime_store_refuses_keeps_the_thread_and_its_due_run(
    tmp_path: Path, backend_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    storage = make_backend(backend_name, tmp_path)
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as rt:
        thread = await rt.create_thread("t")
        run_id = await thread.schedule_effect("record", {"key": "a"}, delay=60)
        registry = rt.actors.registry
        assert registry is not None

        def disk_full(thread_id: str, **announce: object) -> bool:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(registry, "delete_thread", disk_full)
        with pytest.raises(OSError, match="No space left"):
            await rt.delete_thread("t")
        monkeypatch.undo()

        assert [t.id for t in (await rt.list_threads()).threads] == ["t"]
        # The row written with the thread, at its creation (before its run).
        assert stored_alarms(rt) == {"t": clock.now()}
        clock.advance(60)
        await rt.wait_idle()
        run = await (await rt.get_thread("t")).get_run(run_id)
        assert (run.status, run.attempts) == (EffectStatus.COMPLETED, 1)


async def test_creates_racing_close_complete_before_the_stores_close_or_raise_closed(
    tmp_path: Path, backend_name: str
) -> None:
    # Each step of the loop lets close() start at another point of the creates.
    for turns in range(0, 24, 3):
        data_dir = tmp_path / str(turns)
        storage: StorageBackend = make_backend(backend_name, data_dir)
        rt = Runtime(
            app_dir=APP, data_dir=data_dir, load_packages=False, storage=storage,
            max_open_threads=1,
        )
        await rt.start()
        for i in range(3):
            await rt.create_thread(f"a{i}")
        creates = [asyncio.create_task(rt.create_thread(f"b{i}")) for i in range(3)]
        for _ in range(turns):
            await asyncio.sleep(0)
        await rt.close()
        results = await asyncio.gather(*creates, return_exceptions=True)

        created = {r.thread_id for r in results if isinstance(r, ThreadState)}
        refused = [r for r in results if not isinstance(r, ThreadState)]
        assert all(isinstance(r, RuntimeClosed) for r in refused), refused
        assert _open_files_under(data_dir) == []
        with pytest.raises(RuntimeClosed):
            await rt.create_thread("late")

        again = Runtime(
            app_dir=APP, data_dir=data_dir, load_packages=False,
            storage=same_data(storage),
        )
        async with again:
            registered = {t.id for t in (await again.list_threads()).threads}
            assert registered == {"a0", "a1", "a2", *created}
            for thread_id in created:  # a created thread is whole: its store opens
                assert (await (await again.get_thread(thread_id)).list_runs()).runs == []


async def test_wait_idle_pending_at_close_raises_runtime_closed_at_once(
    tmp_path: Path,
) -> None:
    rt = Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, shutdown_grace_seconds=0.1
    )
    await rt.start()
    thread = await rt.create_thread("t")
    await thread.schedule_effect("slow", {"seconds": 30})
    async with asyncio.timeout(30):
        while not (tmp_path / "slow.started").exists():
            await asyncio.sleep(0.01)
    waiting = asyncio.create_task(rt.wait_idle(60))
    await asyncio.sleep(0)
    await rt.close()

    with pytest.raises(RuntimeClosed, match="shut down"):
        await waiting  # not TimeoutError after 60 s
    with pytest.raises(RuntimeClosed):
        await rt.wait_idle(60)


async def test_close_never_closes_a_store_under_its_own_recovery_walk(
    tmp_path: Path, backend_name: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two actors over max_open_threads=1 (both in use) when close() walks the open ones;
    # the uses end while it re-queues the first: nothing may be evicted under the walk.
    rt = Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False,
        storage=make_backend(backend_name, tmp_path), max_open_threads=1,
    )
    await rt.start()
    await rt.create_thread("a")
    await rt.create_thread("b")
    entered, go = threading.Event(), threading.Event()
    async with rt.actors.use("a") as a, rt.actors.use("b") as b:
        assert rt.actors.open_count == 2
        recover = a.store.recover_interrupted

        def held_recover(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            go.wait(30)
            return recover(*args, **kwargs)

        monkeypatch.setattr(a.store, "recover_interrupted", held_recover)
        closing = asyncio.create_task(rt.close())
        async with asyncio.timeout(30):
            while not entered.is_set():
                await asyncio.sleep(0.01)
    go.set()  # the uses ended (their eviction attempts ran) before the walk went on
    await closing

    assert b.state.value == "evicted"  # closed by close(), after its recovery
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []
