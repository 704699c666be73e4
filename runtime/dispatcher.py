"""The dispatcher: which thread runs next, and the workers that drain them.

An alarm that fires `Dispatcher.wake`s its thread: the thread is queued once (FIFO), and
one of ``max_concurrent_runs`` workers takes it and drains it (runs its due runs, one at
a time). Fairness: a drain runs at most a batch of runs, then asks to be woken again, so
other due threads go first. A thread's place in this is one `DispatchState`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum

log = logging.getLogger("runtime")


class DispatchState(StrEnum):
    """Where a thread is in the dispatcher (absent: idle)."""

    QUEUED = "queued"
    """Waiting for a worker."""
    DRAINING = "draining"
    """A worker runs its due runs."""
    DRAINING_REWAKE = "draining_rewake"
    """Draining, and woken meanwhile: queued again when the drain ends, so a wake-up
    that the drain may not have seen is never lost."""


Drain = Callable[[str], Awaitable[bool]]
"""Drains a thread; returns True to be woken again (it stopped at its batch limit)."""


class Dispatcher:
    """A queue of due threads and the workers that drain them.

    Args:
        workers: How many threads may be drained at once.
        drain: Drains one thread (it handles its own errors; one that escapes is logged).
    """

    def __init__(self, workers: int, drain: Drain) -> None:
        self._workers_wanted = workers
        self._drain = drain
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._state: dict[str, DispatchState] = {}
        self._draining = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task[None]] = []
        self._stopping = False

    def start(self) -> None:
        """Start the workers (on the running loop)."""
        self._workers = [
            asyncio.create_task(self._worker(), name=f"thread-effects-worker-{i}")
            for i in range(self._workers_wanted)
        ]

    def state(self, thread_id: str) -> DispatchState | None:
        """The thread's state, None when idle."""
        return self._state.get(thread_id)

    def is_draining(self, thread_id: str) -> bool:
        """Whether a worker drains the thread now."""
        return self._state.get(thread_id) in (
            DispatchState.DRAINING, DispatchState.DRAINING_REWAKE
        )

    @property
    def draining_count(self) -> int:
        """How many threads are being drained."""
        return self._draining

    @property
    def queued_count(self) -> int:
        """How many threads wait for a worker."""
        return self._queue.qsize()

    @property
    def idle(self) -> bool:
        """Whether no thread is queued or draining."""
        return self._idle.is_set() and self._queue.empty()

    async def wait_for_change(self) -> None:
        """Wait until the dispatcher is idle (it may be busy again when this returns)."""
        await self._idle.wait()

    def wake(self, thread_id: str) -> None:
        """Queue a thread to be drained (an alarm went off); a no-op when already queued.

        Also a no-op with no workers (``max_concurrent_runs`` 0): this process drains no
        thread, so it claims no run, and stays idle.
        """
        if self._stopping or self._workers_wanted == 0:
            return
        state = self._state.get(thread_id)
        if state is DispatchState.DRAINING:
            self._state[thread_id] = DispatchState.DRAINING_REWAKE
            return
        if state is not None:
            return
        self._state[thread_id] = DispatchState.QUEUED
        self._idle.clear()
        self._queue.put_nowait(thread_id)  # wakes one idle worker, not all of them

    async def _worker(self) -> None:
        while True:
            thread_id = await self._queue.get()
            if thread_id is None or self._stopping:
                return
            self._state[thread_id] = DispatchState.DRAINING
            self._draining += 1
            again = False
            try:
                again = await self._drain(thread_id)
            except Exception:
                log.exception("unexpected error while running thread %s", thread_id)
            finally:
                rewake = self._state.pop(thread_id, None) is DispatchState.DRAINING_REWAKE
                self._draining -= 1
                if (rewake or again) and not self._stopping:
                    self.wake(thread_id)
                if self._queue.empty() and self._draining == 0:
                    self._idle.set()

    async def stop(self, grace_seconds: float) -> None:
        """Stop taking threads; give running drains ``grace_seconds``, then cancel them."""
        self._stopping = True
        for _ in self._workers:
            self._queue.put_nowait(None)  # idle workers stop; busy ones after their run
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_seconds):
                await asyncio.gather(*self._workers, return_exceptions=True)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
