"""The cross-thread run index: every run of every thread, listable without opening them.

`RunIndexer` listens to the change hub (`runtime.frames.ChangeHub.add_listener`) and keeps
the latest state of each changed run (never its args) until its flusher writes them to
the runtime store in one transaction (`runtime.storage.base.RuntimeStore.index_runs`),
at most every `FLUSH_SECONDS`; a cross-thread read flushes first, so it sees every change
made before it. Finished runs past their retention age are hidden by reads and deleted
from the index at most once a minute.

Because entries are written in batches, a crash can lose the last ones: the runtime
store's *complete* flag is set to False while a runtime runs and back to True after the
final flush of a clean close (on a store shared by several nodes, the node that finds a
dead node rewrites what its lost batch left stale instead, and the flag stays True). A
start that finds it False (after a crash, or an upgrade from a version without the
index) rebuilds the index in the background from every thread's store
(`RunIndexer.rebuild`); until that ends, listings may miss runs, and say so
(``complete`` False). That mark is written durably before any batch; the batches
themselves may be committed less durably (SQLite: without an fsync of their own), since
a power cut that loses one leaves the mark False and the index is rebuilt.

The same flush moves each thread's *last activity* in the registry forward (the store
does it for every indexed run, `RuntimeStore.index_runs`, and for the threads whose
messages were noted, `RuntimeStore.touch_threads`), so threads can be listed by last
activity from the registry alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from runtime.abc import RunSync
from runtime.config import RetentionPolicy
from runtime.effects import EffectRun
from runtime.events import EffectChanged, MessageCreated, ThreadEvent
from runtime.outage import OutageLog, log_failure
from runtime.storage.base import RuntimeStore

log = logging.getLogger("runtime")

FLUSH_SECONDS = 0.2
"""Longest time a run change waits before the flusher writes it to the index."""

PRUNE_SECONDS = 60.0
"""Finished runs past their age are deleted from the index at most this often."""


class RunIndexer:
    """Keeps the runtime store's run index up to date from the change hub.

    Args:
        run_sync: Runs a blocking call off the event loop.
        now: The clock's ``now``.
        retention: What reads hide and pruning deletes.
    """

    def __init__(
        self, run_sync: RunSync, now: Callable[[], float], retention: RetentionPolicy
    ) -> None:
        self._run_sync = run_sync
        self._now = now
        self._retention = retention
        self._store: RuntimeStore | None = None
        self._dirty: dict[str, EffectRun] = {}
        self._touched: dict[str, float] = {}  # thread id -> its latest message's time
        self.creating: set[str] = set()
        """Threads being created: their messages (a welcome written by an
        ``after_thread_created`` hook) are part of the creation, not later activity."""
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._pruned_at: float | None = None
        self.complete = True
        """Whether the index holds every run (False while a rebuild is due or running)."""

    def observe(self, event: ThreadEvent) -> None:
        """Note a run's change or a thread's message (a change-hub listener)."""
        if isinstance(event, EffectChanged):
            self._dirty[event.run.id] = event.run
            self._wake.set()
        elif isinstance(event, MessageCreated) and event.thread_id not in self.creating:
            self._note_touched({event.thread_id: event.message.created_at_ts})
            self._wake.set()

    def _note_touched(self, activity: dict[str, float]) -> None:
        """Keep threads' activity to write with the next batch (the latest time wins)."""
        for tid, ts in activity.items():
            self._touched[tid] = max(ts, self._touched.get(tid, ts))

    async def start(self, store: RuntimeStore, *, shared: bool = False) -> bool:
        """Start the flusher; True if the index must be rebuilt (see the module docstring).

        ``shared``: the store is shared by several processes (PostgreSQL nodes). The mark
        is then left as it is: other live nodes write their own batches, and a dead node's
        lost last batch is rewritten by the node that finds it dead
        (`StorageBackend.mark_dead_nodes_gaps`), so a node starting beside others has
        nothing to rebuild; only a mark False from an upgrade (or a rebuild that did not
        end) makes it rebuild.
        """
        self._store = store
        self.complete = await self._run_sync(store.run_index_complete)
        if not shared:
            # Until a clean close says otherwise: a crash may lose the last batch.
            await self._run_sync(store.set_run_index_complete, False)
        self._flusher = asyncio.create_task(self._flush_loop(), name="thread-effects-run-index")
        return not self.complete

    async def _flush_loop(self) -> None:
        failures = OutageLog(log, "writing the run index")
        while True:
            await self._wake.wait()
            await asyncio.sleep(FLUSH_SECONDS)  # gather a batch
            try:
                await self.flush()
            except Exception as exc:
                failures.failed(exc, "retried with the next batch")
            else:
                failures.ok()

    async def flush(self) -> None:
        """Write every noted change to the index now (and prune it once a minute)."""
        store = self._store
        if store is None:
            return
        async with self._flush_lock:
            self._wake.clear()
            batch, self._dirty = self._dirty, {}
            touched, self._touched = self._touched, {}
            try:
                # What the store answers is activity it left for later (a thread's row
                # was busy): kept for the next batch.
                if batch:
                    self._note_touched(
                        await self._run_sync(store.index_runs, list(batch.values())))
                    batch = {}
                if touched:
                    left = await self._run_sync(store.touch_threads, touched)
                    touched = {}
                    self._note_touched(left)
            except BaseException:
                # Not written: keep them, unless a newer change of the run came meanwhile.
                for run_id, run in batch.items():
                    self._dirty.setdefault(run_id, run)
                self._note_touched(touched)
                self._wake.set()
                raise
            if self._touched:
                self._wake.set()
            now = self._now()
            if self._pruned_at is None or now - self._pruned_at >= PRUNE_SECONDS:
                self._pruned_at = now
                await self._run_sync(store.prune_run_index, now, self._retention)

    async def rebuild(self, threads: Callable[[], AsyncIterator[list[EffectRun]]]) -> None:
        """Index every run of every thread, then mark the index complete.

        Args:
            threads: Yields each thread's runs, read under the thread's lock (so that a
                change published later is newer than what was read).
        """
        count = 0
        async for runs in threads():
            for run in runs:
                # A change noted meanwhile is at least as new as what was read.
                self._dirty.setdefault(run.id, run)
            count += len(runs)
            if len(self._dirty) >= 1000:
                await self.flush()
        await self.flush()
        self.complete = True
        log.info("run index rebuilt: %d runs", count)

    async def close(self, *, write: bool = True) -> None:
        """Stop the flusher, write what is left, and mark the index complete if it is.

        Args:
            write: False when the database is known unreachable: nothing is written (one
                warning line says how many changes are left to the next start's or
                another node's repair, `StorageBackend.mark_dead_nodes_gaps`).
        """
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self._store is None:
            return
        if not write:
            if self._dirty or self._touched:
                log.warning("shutdown: %d run change(s) not written to the run index, the "
                            "database being unreachable (repaired once this node's lease "
                            "has expired, or at the next start)", len(self._dirty))
            return
        try:
            await self.flush()
            if self.complete:
                await self._run_sync(self._store.set_run_index_complete, True)
        except Exception as exc:
            log_failure(log, "writing the run index at shutdown (rebuilt at the next start)",
                        exc)

    def pending_changes(self) -> int:
        """How many noted run changes wait for the flusher."""
        return len(self._dirty)

    def describe(self) -> dict[str, Any]:
        """``{"complete": bool}`` for listings."""
        return {"complete": self.complete}
