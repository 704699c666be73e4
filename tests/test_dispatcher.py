"""The dispatcher: a thread is queued once, woken again when woken while it drains, and a
thread at its batch limit lets the others go first."""

from __future__ import annotations

import asyncio

from runtime.dispatcher import Dispatcher, DispatchState


async def test_a_thread_woken_twice_while_queued_is_drained_once() -> None:
    drained: list[str] = []

    async def drain(thread_id: str) -> bool:
        drained.append(thread_id)
        return False

    dispatcher = Dispatcher(1, drain)
    dispatcher.wake("a")
    dispatcher.wake("a")
    assert dispatcher.state("a") is DispatchState.QUEUED
    dispatcher.start()
    await asyncio.wait_for(_idle(dispatcher), 5)
    assert drained == ["a"]
    assert dispatcher.state("a") is None
    await dispatcher.stop(1)


async def test_a_wake_during_the_drain_drains_the_thread_again() -> None:
    drained: list[str] = []
    release = asyncio.Event()

    async def drain(thread_id: str) -> bool:
        drained.append(thread_id)
        if len(drained) == 1:
            await release.wait()
        return False

    dispatcher = Dispatcher(2, drain)
    dispatcher.start()
    dispatcher.wake("a")
    while not dispatcher.is_draining("a"):
        await asyncio.sleep(0)
    dispatcher.wake("a")
    assert dispatcher.state("a") is DispatchState.DRAINING_REWAKE
    release.set()
    await asyncio.wait_for(_idle(dispatcher), 5)
    assert drained == ["a", "a"]
    await dispatcher.stop(1)


async def test_a_thread_at_its_batch_limit_goes_behind_the_other_due_threads() -> None:
    drained: list[str] = []

    async def drain(thread_id: str) -> bool:
        drained.append(thread_id)
        return drained.count(thread_id) == 1 and thread_id == "a"  # a has more after one

    dispatcher = Dispatcher(1, drain)
    dispatcher.wake("a")
    dispatcher.wake("b")
    dispatcher.start()
    await asyncio.wait_for(_idle(dispatcher), 5)
    assert drained == ["a", "b", "a"]
    await dispatcher.stop(1)


async def test_a_stopped_dispatcher_takes_no_more_threads() -> None:
    drained: list[str] = []

    async def drain(thread_id: str) -> bool:
        drained.append(thread_id)
        return False

    dispatcher = Dispatcher(1, drain)
    dispatcher.start()
    await dispatcher.stop(1)
    dispatcher.wake("a")
    await asyncio.sleep(0)
    assert drained == []
    assert dispatcher.state("a") is None


async def _idle(dispatcher: Dispatcher) -> None:
    while True:
        for _ in range(3):
            await asyncio.sleep(0)
        if dispatcher.idle:
            return
        await dispatcher.wait_for_change()
