"""The actor table: a thread's lifecycle, single-flight open, eviction, delete while opening."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from runtime import Runtime, ThreadExists, ThreadNotFound
from runtime.actors import ThreadLifecycle
from runtime.storage.base import ThreadInfo
from runtime.storage.sqlite import SQLiteBackend, SQLiteThreadStore

APP = Path(__file__).parent / "apps" / "core"


class CountingBackend(SQLiteBackend):
    """The SQLite backend, counting opens; ``gate`` (if set) holds each open until set."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.opens: list[str] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def create_thread_store(self, info: ThreadInfo) -> SQLiteThreadStore:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return super().create_thread_store(info)

    def open_thread_store(self, thread_id: str) -> SQLiteThreadStore:
        self.opens.append(thread_id)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return super().open_thread_store(thread_id)


async def test_a_thread_is_open_after_create_and_closed_after_eviction_or_delete(
    tmp_path: Path,
) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, max_open_threads=1,
        extensions=[],
    ) as rt:
        await rt.create_thread("a")
        assert rt.actors.lifecycle("a") is ThreadLifecycle.OPEN
        await rt.create_thread("b")  # a is evicted: one open thread at most
        assert rt.actors.lifecycle("a") is ThreadLifecycle.CLOSED
        assert rt.actors.lifecycle("b") is ThreadLifecycle.OPEN
        assert rt.actors.open_count == 1
        a = await rt.get_thread("a")
        await a.schedule_effect("record", {"key": "k"}, delay=3600)  # opens a again
        assert rt.actors.lifecycle("a") is ThreadLifecycle.OPEN
        assert await rt.delete_thread("a")
        assert rt.actors.lifecycle("a") is ThreadLifecycle.CLOSED
        with pytest.raises(ThreadNotFound):
            await a.get_scheduled_effects()


async def test_concurrent_uses_of_a_closed_thread_open_its_store_once(tmp_path: Path) -> None:
    backend = CountingBackend(tmp_path)
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, max_open_threads=1,
        storage=backend, extensions=[],
    ) as rt:
        a = await rt.create_thread("a")
        await rt.create_thread("b")  # evicts a
        backend.gate = threading.Event()
        readers = [asyncio.create_task(a.get_scheduled_effects()) for _ in range(5)]
        await asyncio.to_thread(backend.entered.wait, 10)
        assert rt.actors.lifecycle("a") is ThreadLifecycle.OPENING
        backend.gate.set()
        assert await asyncio.gather(*readers) == [[]] * 5
        assert backend.opens == ["a"]


async def test_deleting_a_thread_while_it_opens_refuses_the_open(tmp_path: Path) -> None:
    backend = CountingBackend(tmp_path)
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, max_open_threads=1,
        storage=backend, extensions=[],
    ) as rt:
        a = await rt.create_thread("a")
        await a.schedule_effect("record", {"key": "k"}, delay=3600)
        await rt.create_thread("b")  # evicts a
        backend.gate = threading.Event()
        reader = asyncio.create_task(a.get_scheduled_effects())
        await asyncio.to_thread(backend.entered.wait, 10)
        deleting = asyncio.create_task(rt.delete_thread("a"))
        while rt.actors.lifecycle("a") is not ThreadLifecycle.DELETING:
            await asyncio.sleep(0)
        backend.gate.set()
        assert await deleting is True
        with pytest.raises(ThreadNotFound):
            await reader
        assert rt.actors.lifecycle("a") is ThreadLifecycle.CLOSED
        assert not backend.thread_path("a").exists()
        with pytest.raises(ThreadNotFound):
            await rt.get_thread("a")


async def test_deleting_a_thread_while_it_is_created_leaves_the_new_thread_whole(
    tmp_path: Path,
) -> None:
    backend = CountingBackend(tmp_path)
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, storage=backend, extensions=[],
    ) as rt:
        backend.gate = threading.Event()
        creating = asyncio.create_task(rt.create_thread("a"))
        await asyncio.to_thread(backend.entered.wait, 10)
        assert rt.actors.lifecycle("a") is ThreadLifecycle.CREATING
        assert await rt.delete_thread("a") is False  # not a thread yet
        with pytest.raises(ThreadExists):
            await rt.create_thread("a")
        backend.gate.set()
        thread = await creating
        await thread.schedule_effect("record", {"key": "k"})
        await rt.wait_idle()
        assert (await thread.list_runs()).runs[0].status == "completed"
        assert backend.thread_path("a").exists()
