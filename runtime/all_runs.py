"""Runs across threads: listing from the cross-thread run index, and bulk actions.

A part of `runtime.supervisor.Runtime` (which delegates `Runtime.list_runs`,
`Runtime.cancel_runs` and `Runtime.replay_runs` here): reads go to the run index in the
runtime store (`runtime.run_index`), after its pending changes are written (a listing
naming a thread reads that thread's runs themselves); bulk actions walk the runs
themselves (`RuntimeStore.list_stored_runs`, every run committed on any node) and act on
each run in its own thread, through the run operations.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from runtime._limits import empty_filter, parse_thread_cursor
from runtime._text import check_text
from runtime.abc import RunSync
from runtime.actors import ActorTable
from runtime.config import RetentionPolicy
from runtime.effects import EffectRun, EffectStatus
from runtime.errors import (
    EffectNotFound,
    InvalidArgument,
    InvalidEffectArgs,
    RunNotFound,
    RunStateError,
    ThreadNotFound,
    ThreadStorageError,
)
from runtime.run_index import RunIndexer
from runtime.runs import MAX_CANCELED_BY_CHARS, RunOperations, check_limit, parse_statuses
from runtime.storage.base import RunQuery, RuntimeStore, ThreadStore
from runtime.thread import ThreadState

log = logging.getLogger("runtime")


@dataclass(frozen=True, slots=True)
class RunsPage:
    """A page of runs across threads, newest first (by when they were scheduled).

    Attributes:
        runs: The runs (without args).
        next_cursor: Pass as ``cursor`` for the next page; None on the last page.
        counts: How many runs match the filters other than the status, per status.
        complete: False while the run index is being rebuilt (runs may be missing).
    """

    runs: list[EffectRun]
    next_cursor: str | None
    counts: dict[EffectStatus, int]
    complete: bool = True


MAX_BULK_RUNS = 10_000
"""Most runs one bulk action (`Runtime.cancel_runs`, `Runtime.replay_runs`) goes through."""

MAX_SKIPPED = 100
"""Most skipped runs a bulk replay names (`BulkResult.skipped`); it counts them all."""


@dataclass(frozen=True, slots=True)
class SkippedRun:
    """A run a bulk replay left alone because it cannot be replayed here.

    Attributes:
        run_id: The failed run's id.
        thread_id: Its thread.
        error: Why: `EffectNotFound` (its effect is not registered in this process: removed
            since, or, with several nodes, only some have it) or `InvalidEffectArgs` (its
            args no longer pass the effect's schema).
    """

    run_id: str
    thread_id: str
    error: EffectNotFound | InvalidEffectArgs


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk action did.

    Attributes:
        ids: The canceled runs, or the new runs of the replays.
        more: True when it stopped at `MAX_BULK_RUNS` with matching runs left.
        skipped: The first `MAX_SKIPPED` matching runs a replay could not replay, with
            why; the others were replayed all the same. Empty for a cancel.
        skipped_count: How many matching runs it could not replay (all of them, not
            only those in ``skipped``).
    """

    ids: list[str]
    more: bool = False
    skipped: list[SkippedRun] = field(default_factory=list)
    skipped_count: int = 0

    @property
    def count(self) -> int:
        """How many runs it changed."""
        return len(self.ids)


class AllRuns:
    """Runs across every thread (a part of the runtime; see the module docstring)."""

    def __init__(
        self,
        *,
        store: Callable[[], RuntimeStore],
        index: RunIndexer,
        runs: RunOperations,
        actors: ActorTable,
        run_sync: RunSync,
        now: Callable[[], float],
        retention: RetentionPolicy,
        check_open: Callable[[], None],
        get_thread: Callable[[str], Awaitable[ThreadState]],
    ) -> None:
        self._store = store
        self._index = index
        self._runs = runs
        self._actors = actors
        self._run_sync = run_sync
        self._now = now
        self._retention = retention
        self._check_open = check_open
        self._get_thread = get_thread
        # One bulk replay at a time: each reads "not replayed yet" from the index after
        # the previous one's replays are written to it, so concurrent calls with the same
        # filters replay each failure once, not once per call.
        self._replay_lock = asyncio.Lock()
        # The replays that bulk replays made since none was in flight: a call leaves them
        # alone (a replay that failed while calls overlapped is their own doing, not a
        # failure the caller was asked about).
        self._made: set[str] = set()
        self._replay_calls = 0

    async def list_runs(
        self,
        *,
        status: EffectStatus | str | list[EffectStatus | str] | None = None,
        name: str | None = None,
        thread_id: str | None = None,
        user_id: str | None = None,
        tag: str | None = None,
        since: float | None = None,
        until: float | None = None,
        replayed: bool | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> RunsPage:
        """Runs across every thread, newest first (by when they were scheduled), no args.

        Read from the cross-thread run index (`runtime.run_index`), after writing the
        changes this node noted so far: a run changed on this node before this call shows
        its change. With a backend shared by nodes (PostgreSQL), another node's changes
        reach the index in that node's next batch (within about 0.2 s of their commit),
        except with ``thread_id``: that listing reads the thread's own runs
        (`RuntimeStore.list_stored_runs`) and shows every change committed before the
        call, on any node. A due pending run of a thread that runs another run (not of a
        concurrent effect; on any node) has ``waiting_for`` set to that run, as a
        thread's own listing has.

        Args:
            status: One status or several.
            name: The effect name.
            thread_id: The thread.
            user_id: The threads' ``user_id``.
            tag: A tag of the thread.
            since: Due at or after this time, seconds since the epoch (UTC).
            until: Due before this time.
            replayed: True: only runs that a run replays (its ``replay_of``); False:
                only runs not replayed yet (by a run still kept).
            limit: Page size, 1 to 500.
            cursor: ``next_cursor`` of the previous page.

        Raises:
            ValueError: an unknown status, a bad limit or a malformed cursor;
                `InvalidArgument` for a filter given as an empty string (None does not
                filter).
        """
        return await self._list(
            thread_id is not None,
            {"status": status, "name": name, "thread_id": thread_id, "user_id": user_id,
             "tag": tag, "since": since, "until": until, "replayed": replayed},
            limit, cursor,
        )

    async def _list(
        self, stored: bool, filters: dict[str, Any], limit: int, cursor: str | None,
    ) -> RunsPage:
        """`list_runs` with its ``filters`` (its arguments but ``limit`` and ``cursor``).

        From the threads' own runs when ``stored`` (else the index). A filter `list_runs`
        does not have raises TypeError.
        """
        self._check_open()
        empty_filter(**{k: filters.get(k) for k in ("name", "thread_id", "user_id", "tag")})
        check_limit(limit)
        statuses = parse_statuses(filters.get("status"))
        query = RunQuery(statuses=tuple(statuses) if statuses is not None else None,
                         **{k: v for k, v in filters.items() if k != "status"})
        before = parse_thread_cursor(cursor) if cursor is not None else None
        await self._index.flush()
        now = self._now()
        retention = self._retention
        store = self._store()

        def read() -> tuple[list[EffectRun], tuple[float, str] | None, dict[EffectStatus, int]]:
            if stored:
                runs, nxt = store.list_stored_runs(query, now, retention, limit, before)
                return runs, nxt, store.count_stored_runs(query, now, retention)
            runs, nxt = store.list_indexed_runs(query, now, retention, limit, before)
            return runs, nxt, store.count_indexed_runs(query, now, retention)

        runs, nxt, counts = await self._run_sync(read)
        # Which run a thread runs now: its actor knows, or (another node's) the store.
        runs = await self._runs.mark_waiting(store, runs, self._now())
        return RunsPage(
            runs, f"{nxt[0]!r}~{nxt[1]}" if nxt is not None else None, counts,
            stored or self._index.complete,
        )

    async def cancel_runs(self, *, canceled_by: str = "code", **filters: Any) -> BulkResult:
        """Cancel every pending run that matches ``filters`` (those of `list_runs`).

        Walks the threads' own runs (`RuntimeStore.list_stored_runs`: every run committed
        before the call, on any node; at most `MAX_BULK_RUNS` runs per call) and cancels each run
        in its thread as `ThreadState.remove_scheduled_effect` does, with ``canceled_by``
        (1 to 256 characters): a run that started meanwhile is canceled while running
        (counted); one that finished meanwhile is left alone (not counted).

        Returns:
            The canceled runs' ids, and whether matching runs remain.

        Raises:
            ValueError: a bad filter (as `list_runs`); `InvalidArgument` for a bad
                ``canceled_by`` (nothing canceled).
        """
        if canceled_by == "":
            raise InvalidArgument("canceled_by must not be empty")
        check_text(canceled_by, "canceled_by", max_chars=MAX_CANCELED_BY_CHARS)
        return await self._bulk(
            "pending", filters,
            lambda run: self._runs.cancel(run.thread_id, run.id, canceled_by),
        )

    async def replay_runs(self, **filters: Any) -> BulkResult:
        """Replay every failed run not replayed yet that matches ``filters`` (of `list_runs`).

        Each replay is a new run with the same name and args, due now, linked to its
        original (`ThreadState.replay`); at most `MAX_BULK_RUNS` per call. A failed run
        that a run already replays (``replay_of``) is left alone, so a second call does
        not replay the same failures again; a replay that failed in turn is a failed run
        not replayed yet. Bulk replays run one at a time, and a call leaves alone the
        replays made by calls that overlapped it: five concurrent calls with the
        same filters replay each failure once, not five times. `list_runs` with
        ``status="failed", replayed=False`` counts the same runs.

        A failed run that cannot be replayed here is skipped, not an error of the call:
        its effect is not registered in this process (removed since it ran, or, with
        several nodes on one database, not deployed on this one) or its args no longer
        pass the effect's schema. The call replays the others and says which it skipped.

        Returns:
            The new runs' ids, whether matching runs remain, and the skipped runs with
            why (`BulkResult.skipped`, `BulkResult.skipped_count`).

        Raises:
            ValueError: a bad filter (as `list_runs`).
        """
        skipped: list[SkippedRun] = []
        skipped_count = 0

        async def replay(run: EffectRun) -> str | None:
            nonlocal skipped_count
            if run.id in self._made:
                return None  # made by a bulk replay that overlapped this call
            state = await self._get_thread(run.thread_id)
            # Once per failure, across nodes too: checked in the thread's transaction. A
            # replay another node's bulk call stored meanwhile is its work, not this one's.
            try:
                scheduled = await self._runs.replay_scheduled(state, run.id, once=True)
            except (EffectNotFound, InvalidEffectArgs) as exc:
                skipped_count += 1
                if len(skipped) < MAX_SKIPPED:
                    skipped.append(SkippedRun(run.id, run.thread_id, exc))
                return None
            self._made.add(scheduled.run_id)
            return scheduled.run_id if scheduled.created else None

        self._replay_calls += 1
        try:
            async with self._replay_lock:
                result = await self._bulk("failed", {**filters, "replayed": False}, replay)
                return replace(result, skipped=skipped, skipped_count=skipped_count)
        finally:
            self._replay_calls -= 1
            if self._replay_calls == 0:
                self._made.clear()

    async def _bulk(
        self, status: str, filters: dict[str, Any], act: Callable[[EffectRun], Any]
    ) -> BulkResult:
        filters = {k: v for k, v in filters.items() if k not in ("status", "limit", "cursor")}
        done: list[str] = []
        seen = 0
        cursor: str | None = None
        while True:
            # The runs themselves, not the index: another node indexes its runs only
            # after their commits, and a bulk action must not miss a run made before it.
            page = await self._list(True, {**filters, "status": status}, 500, cursor)
            for run in page.runs:
                if seen >= MAX_BULK_RUNS:
                    return BulkResult(done, more=True)
                seen += 1
                try:
                    result = await act(run)
                except (ThreadNotFound, RunNotFound, RunStateError):
                    continue  # deleted, pruned or no longer in that status meanwhile
                if result is True:
                    done.append(run.id)
                elif isinstance(result, str):
                    done.append(result)
            cursor = page.next_cursor
            if cursor is None:
                return BulkResult(done, more=False)

    async def every_threads_runs(self) -> AsyncIterator[list[EffectRun]]:
        """Each thread's runs (those reads show), read under its lock: for a rebuild."""
        store = self._store()
        after: tuple[float, str] | None = None
        while True:
            infos, after = await self._run_sync(store.list_threads, 500, after)
            for info in infos:
                try:
                    async with self._actors.writing(info.id) as actor:
                        runs = await self._run_sync(self._all_runs, actor.store)
                except (ThreadNotFound, ThreadStorageError) as exc:
                    log.warning("run index: thread %s skipped: %s", info.id, exc)
                    continue
                yield runs
            if after is None:
                return

    def _all_runs(self, store: ThreadStore) -> list[EffectRun]:
        now, retention = self._now(), self._retention
        out: list[EffectRun] = []
        before: int | None = None
        while True:
            runs, before = store.list_runs(now, retention, limit=500, before_seq=before)
            out.extend(replace(r, args=None) for r in runs)
            if before is None:
                return out

