"""The supervisor: `Runtime`, which creates, finds and evicts thread actors and runs due work.

Life of a run (docs/design.md, "Core semantics" and "Alarms")::

    schedule_effect ─► alarm row lowered (runtime.sqlite) ─► run row committed (thread file)
                       └► in-process timer armed
    timer fires ─► thread queued ─► a worker drains it: claim the earliest due run
      (status running, attempts + 1, committed) ─► run the effect ─► record the outcome
      together with the next claim (one transaction) ─► … ─► nothing due: the alarm row is
      set to the next pending run, or removed

Because the alarm row is written before the run row and cleared only after the due runs
finished, a crash can cause a spurious wake-up but never a lost one. At startup every alarm
row is re-armed; opening a thread's file returns runs left ``running`` by a dead process to
``pending`` (the third interruption fails them).

Concurrency: each thread runs one effect at a time (one worker drains it); at most
``max_concurrent_runs`` workers run at once. SQLite calls run in worker threads, never on
the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import gc
import inspect
import json
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio.to_thread
from pydantic import BaseModel, ValidationError

from runtime import hooks as _hooks
from runtime._limits import (
    check_args_depth,
    delay_seconds,
    parse_run_cursor,
    parse_thread_cursor,
    validate_args,
)
from runtime._text import check_text, find_invalid_text
from runtime.agents import AgentApp, load_agent_app
from runtime.alarms import AlarmTimer, Clock, SystemClock
from runtime.config import MAX_ATTEMPTS, Settings
from runtime.discovery import EffectRegistry, discover
from runtime.effects import EffectDefinition, EffectRun, EffectStatus, RunChange, new_id
from runtime.errors import (
    EffectDefinitionError,
    EffectNotFound,
    InvalidArgument,
    InvalidEffectArgs,
    InvalidThreadId,
    RunNotFound,
    RunStateError,
    RuntimeClosed,
    ThreadExists,
    ThreadNotFound,
    ThreadStorageError,
    short_repr,
)
from runtime.frames import ChangeHub
from runtime.storage.base import Finish, RuntimeStore, StorageBackend, ThreadInfo, ThreadStore
from runtime.storage.sqlite import SQLiteBackend
from runtime.thread import RunPage, ThreadActor, ThreadState
from runtime.turns import TurnTracker, resolve_models

log = logging.getLogger("runtime")

T = TypeVar("T")

THREAD_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
"""Thread ids become file names, so they are checked before they touch a path."""

_DRAIN_BATCH = 100
"""Runs a worker executes for one thread before letting other due threads go first."""

_MAX_PAGE = 500

_STORAGE_THREADS = 16
"""OS threads for SQLite work. Measured with bench/bench_effects.py (2 cores, FULL): 16
gave lag p99 88 ms and loop stalls of 13 ms where 32 gave 199 ms and 25 ms; more threads
mostly add GIL contention, fewer leave the disk's parallel fsyncs unused."""

_ALARM_FLUSH_SECONDS = 0.05
"""How long alarm-row updates (raise/remove) gather before one commit writes them."""

MAX_ERROR_CHARS = 8192
"""A failed run's stored error is cut to this many UTF-8 bytes (it travels in every frame)."""


MAX_ID_CHARS = 256
"""Longest ``agent_id`` and ``user_id`` of a thread, in characters."""

MAX_TAGS = 32
"""Most tags a thread may have."""

MAX_TAG_CHARS = 64
"""Longest tag, in characters."""


def _check_tags(tags: object) -> tuple[str, ...]:
    if isinstance(tags, str) or not isinstance(tags, list | tuple):
        raise InvalidArgument(f"tags must be a list of strings, got {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise InvalidArgument(f"a thread has at most {MAX_TAGS} tags, got {len(tags)}")
    return tuple(
        check_text(tag, f"tags[{i}]", max_chars=MAX_TAG_CHARS) for i, tag in enumerate(tags)
    )


def validate_thread_id(thread_id: object) -> str:
    """Return ``thread_id`` if it matches ``^[A-Za-z0-9_-]{1,64}$``.

    Raises:
        InvalidThreadId: otherwise (e.g. ``"../x"``), naming the value and the rule.
    """
    if not isinstance(thread_id, str) or not THREAD_ID_RE.match(thread_id):
        raise InvalidThreadId(
            f"Invalid thread id {short_repr(thread_id)}: must match ^[A-Za-z0-9_-]{{1,64}}$ "
            f"(letters, digits, '_' and '-', 1 to 64 characters)"
        )
    return thread_id


def _validation_summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(args)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class ThreadPage:
    """A page of threads, newest first.

    Attributes:
        threads: Registry entries.
        next_cursor: Pass as ``cursor`` for the next page; None on the last page.
    """

    threads: list[ThreadInfo]
    next_cursor: str | None


class Runtime:
    """The thread-effects runtime: threads, their effects and the alarm clock.

    Use it as an async context manager::

        async with Runtime(app_dir="agents", data_dir="data") as rt:
            thread = await rt.create_thread()
            run_id = await thread.schedule_effect("send_reminder", {"text": "hi"}, delay=60)

    Only one process may use a data directory at a time (its ``runtime.lock`` is held).

    Args:
        data_dir: Where the databases live (created if missing).
        app_dir: The application folder whose ``effects/`` holds the effects.
        clock: The time source and timer; `runtime.testing.FakeClock` in tests.
        storage: Where threads, runs and alarms are kept; default a
            `runtime.storage.sqlite.SQLiteBackend` on ``data_dir`` with the
            ``synchronous`` setting (which a backend given here does not read).
            `runtime.storage.memory.MemoryBackend` keeps everything in memory (tests).
        **settings: Any other field of `runtime.config.Settings`.

    Raises:
        pydantic.ValidationError: for an unknown or invalid setting.
    """

    def __init__(
        self,
        *,
        data_dir: str | os.PathLike[str],
        app_dir: str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
        storage: StorageBackend | None = None,
        **settings: Any,
    ) -> None:
        self.settings = Settings(
            data_dir=Path(data_dir),
            app_dir=Path(app_dir) if app_dir is not None else None,
            **settings,
        )
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.storage: StorageBackend = (
            storage
            if storage is not None
            else SQLiteBackend(self.settings.data_dir, self.settings.synchronous)
        )
        self.registry = EffectRegistry()
        self.agents = AgentApp()  # agents, tools and hooks of the app folder (at start)
        self.turns = TurnTracker()
        self._hub = ChangeHub(self.settings.subscriber_queue_size)
        self._rtdb: RuntimeStore | None = None
        self._timer: AlarmTimer | None = None
        self._actors: OrderedDict[str, ThreadActor] = OrderedDict()
        self._opening: dict[str, asyncio.Future[ThreadActor]] = {}
        self._deleting: set[str] = set()
        self._creating: set[str] = set()
        # Alarms, three views (see "Alarms" in the module docstring):
        # _alarm_due: when the in-process timer wakes each thread (the intent);
        # _alarm_row: what runtime.sqlite holds, as far as known (never believed lower
        #   than it is, so a needed write is never skipped);
        # _alarm_dirty: threads whose row should move to _alarm_due (raised or removed),
        #   written in batches by _alarm_flusher. Lowering is never deferred.
        self._alarm_due: dict[str, float] = {}
        self._alarm_row: dict[str, float] = {}
        self._alarm_dirty: set[str] = set()
        self._alarm_lock = asyncio.Lock()
        self._alarm_flush_needed = asyncio.Event()
        self._alarm_flusher_task: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._queued: set[str] = set()
        self._draining: set[str] = set()
        self._rewake: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers: list[asyncio.Task[None]] = []
        self._started = False
        self._closing = False
        self._startup_hooks: list[Callable[[Runtime], Any]] = []

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the runtime database, discover effects, re-arm every alarm and start workers.

        Raises:
            EffectDefinitionError: an effect file is invalid (names the file).
            AgentDefinitionError: an agent, tool or hook file is invalid (names the file).
            ModelNotAvailable: a model an agent would use (its own, or the ``model``
                setting) cannot be resolved: unknown name, provider not installed, no key.
            DataDirLocked: another process uses the data directory.
        """
        if self._started:
            raise RuntimeClosed("Runtime already started")
        self._rtdb = await self._run_sync(self.storage.open)
        try:
            self.registry = await self._run_sync(self._discover)
            self.agents = await self._run_sync(load_agent_app, self.settings.app_dir)
            # A model that cannot be used stops startup, rather than failing every turn.
            self.turns.models = await self._run_sync(
                resolve_models, self.agents, self.settings.model
            )
            for hook in self._startup_hooks:
                result = hook(self)
                if asyncio.iscoroutine(result):
                    await result
        except BaseException:
            await self._run_sync(self._rtdb.close)
            await self._run_sync(self.storage.close)
            raise
        self._started = True
        self._timer = self.clock.create_timer(self._on_alarm)
        self._timer.start()
        self._workers = [
            asyncio.create_task(self._worker(), name=f"thread-effects-worker-{i}")
            for i in range(self.settings.max_concurrent_runs)
        ]
        alarms = await self._run_sync(self._rtdb.load_alarms)
        for thread_id, due_at in alarms:
            self._alarm_due[thread_id] = due_at
            self._alarm_row[thread_id] = due_at
            try:
                self._timer.arm(thread_id, due_at)
            except Exception:  # one bad row must not keep every other thread down
                log.exception("cannot arm the alarm of thread %s (due %r)", thread_id, due_at)
        self._alarm_flusher_task = asyncio.create_task(
            self._alarm_flusher(), name="thread-effects-alarm-flusher"
        )
        # Everything imported so far lives as long as the process: keep it out of the
        # collector's full passes, which otherwise stall the loop for tens of ms.
        gc.freeze()
        log.info("runtime started: %d effects, %d alarms re-armed",
                 sum(1 for _ in self.registry.all()), len(alarms))

    def _discover(self) -> EffectRegistry:
        app_dir = self.settings.app_dir
        if app_dir is not None and not app_dir.is_dir():
            # A typo here would start with no effects and fail every due run for good.
            raise EffectDefinitionError(f"App folder {app_dir} does not exist (app_dir)")
        registry = discover(app_dir)
        if self.settings.load_packages:
            from runtime.discovery import discover_packages

            registry.packages = discover_packages()
        else:
            registry.packages_loaded = False
        return registry

    async def close(self) -> None:
        """Stop the runtime; idempotent.

        Running effects get ``shutdown_grace_seconds`` to finish; then they are
        interrupted and their runs go back to ``pending`` (or fail on a third
        interruption). Every database is closed.
        """
        if not self._started or self._closing:
            return
        if _IN_EFFECT.get():
            raise RuntimeError("Runtime.close() cannot be called from an effect: shutdown "
                               "waits for running effects, this one included")
        self._closing = True
        assert self._timer is not None and self._rtdb is not None
        self._timer.shutdown()
        for _ in self._workers:
            self._queue.put_nowait(None)  # idle workers stop; busy ones after their run
        grace = self.settings.shutdown_grace_seconds
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await asyncio.gather(*self._workers, return_exceptions=True)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        # Every worker has stopped, so a run still marked running in an open thread was
        # interrupted (a thread with running work is never evicted, so open ones are all).
        now = self.clock.now()
        for actor in list(self._actors.values()):
            if actor.deleted:
                continue
            try:
                changed = await self._run_sync(
                    partial(actor.store.recover_interrupted, retention=self.settings.retention),
                    now,
                    MAX_ATTEMPTS,
                )
            except ThreadStorageError:
                log.exception("could not re-queue interrupted runs of %s", actor.thread_id)
                continue
            for r in changed:
                self._publish_recovered(r)
        self._hub.close_all()
        if self._alarm_flusher_task is not None:
            self._alarm_flusher_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._alarm_flusher_task
        try:
            await self._flush_alarms()
        except Exception:
            log.exception("could not update alarm rows at shutdown (they stay early)")
        for actor in list(self._actors.values()):
            await self._run_sync(actor.store.close)
        self._actors.clear()
        await self._run_sync(self._rtdb.close)
        await self._run_sync(self.storage.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        self._started = False

    def _check_open(self) -> None:
        if not self._started or self._closing:
            raise RuntimeClosed("The runtime is not running (not started, or shutting down)")

    async def _run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking storage work on the runtime's own thread pool, off the loop."""
        if self._executor is None:
            # Started eagerly, so the first busy moment does not pay for thread creation.
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=_STORAGE_THREADS, thread_name_prefix="thread-effects-storage"
            )
            for _ in range(_STORAGE_THREADS):
                self._executor.submit(time.sleep, 0)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(fn, *args))

    async def wait_idle(self, timeout_seconds: float = 30.0) -> None:
        """Wait until no thread is queued or running effects (for tests and scripts).

        Runs due later (a delay that has not elapsed) do not count: with the real clock,
        wait for their due time first; with `runtime.testing.FakeClock`, advance it.

        Args:
            timeout_seconds: How long to wait at most, > 0.

        Raises:
            TimeoutError: still busy after ``timeout_seconds``.
            ValueError: a timeout that is not a positive number.
            RuntimeError: called from effect code (it would wait for itself).
        """
        if not (isinstance(timeout_seconds, int | float) and timeout_seconds > 0):
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds!r}")
        if _IN_EFFECT.get():
            raise RuntimeError("wait_idle() cannot be called from an effect: it would wait "
                               "for its own run to end")
        try:
            await self._wait_idle(timeout_seconds)
        except TimeoutError:
            raise TimeoutError(
                f"the runtime was still running effects after {timeout_seconds:g} s "
                f"({len(self._draining)} threads running, {self._queue.qsize()} queued)"
            ) from None

    async def _wait_idle(self, timeout_seconds: float) -> None:
        async with asyncio.timeout(timeout_seconds):
            while True:
                for _ in range(3):
                    await asyncio.sleep(0)
                if self._idle.is_set() and not self._opening and self._queue.empty():
                    return
                await self._idle.wait()

    # ------------------------------------------------------------------ threads

    async def create_thread(
        self,
        thread_id: str | None = None,
        *,
        agent_id: str | None = None,
        user_id: str | None = None,
        tags: list[str] | tuple[str, ...] = (),
    ) -> ThreadState:
        """Create a thread with its own database file.

        Then the ``after_thread_created`` hooks of its agent run (a hook that raises is
        logged and ignored).

        Args:
            thread_id: The id to use (``^[A-Za-z0-9_-]{1,64}$``); None = a new random id.
            agent_id: The agent that serves the thread; None = the app's only agent, or
                its default one. Free-form when the app defines no agents. At most
                `MAX_ID_CHARS` (256) characters.
            user_id: The user the thread belongs to, at most 256 characters.
            tags: Free-form labels: at most `MAX_TAGS` (32) strings of at most
                `MAX_TAG_CHARS` (64) characters each.

        Every text argument must be valid Unicode (no lone surrogates). Nothing is written
        before all of them are checked, and a failure while creating leaves no file and no
        registry row behind.

        Returns:
            The new thread's state.

        Raises:
            InvalidThreadId: a malformed id.
            InvalidArgument: ``agent_id``, ``user_id`` or a tag that is not a string, not
                valid Unicode or over its limit, or more than 32 tags (names which).
            ThreadExists: the id is taken.
            AgentNotFound: the app defines agents and none is ``agent_id`` (or, without
                one, none is the default).
        """
        self._check_open()
        tid = validate_thread_id(thread_id) if thread_id is not None else new_id()
        if agent_id is not None:
            check_text(agent_id, "agent_id", max_chars=MAX_ID_CHARS)
        if user_id is not None:
            check_text(user_id, "user_id", max_chars=MAX_ID_CHARS)
        checked_tags = _check_tags(tags)
        agent_id = self.agents.agent_for_new_thread(agent_id)
        assert self._rtdb is not None
        # Claimed before the first await, so a concurrent create of the same id is refused
        # instead of removing this one's file as a leftover.
        if tid in self._creating or tid in self._actors or tid in self._deleting:
            raise ThreadExists(tid)
        self._creating.add(tid)
        try:
            if await self._run_sync(self._rtdb.get_thread, tid) is not None:
                raise ThreadExists(tid)
            info = ThreadInfo(
                id=tid, created_at_ts=self.clock.now(), agent_id=agent_id, user_id=user_id,
                tags=checked_tags,
            )
            store = await self._run_sync(self.storage.create_thread_store, info)
            try:
                added = await self._run_sync(self._rtdb.add_thread, info)
            except BaseException:
                # No registry row: the store would belong to no thread.
                await self._run_sync(store.close)
                await self._run_sync(self.storage.remove_thread_store, tid)
                raise
        finally:
            self._creating.discard(tid)
        if not added:
            await self._run_sync(store.close)
            raise ThreadExists(tid)
        actor = ThreadActor(info, store)
        self._actors[tid] = actor
        await self._evict()
        state = ThreadState(self, info)
        await _hooks.after_thread_created(
            self.agents.hooks_for(agent_id, _hooks.HookPoint.AFTER_THREAD_CREATED), state
        )
        return state

    async def get_thread(self, thread_id: str) -> ThreadState:
        """The state of an existing thread.

        Raises:
            InvalidThreadId: a malformed id.
            ThreadNotFound: no such thread.
        """
        self._check_open()
        validate_thread_id(thread_id)
        actor = self._actors.get(thread_id)
        if actor is not None and not actor.deleted:
            return ThreadState(self, actor.info)
        info = await self._thread_info(thread_id)
        return ThreadState(self, info)

    async def _thread_info(self, thread_id: str) -> ThreadInfo:
        assert self._rtdb is not None
        if thread_id in self._deleting:
            raise ThreadNotFound(thread_id)
        info = await self._run_sync(self._rtdb.get_thread, thread_id)
        if info is None:
            raise ThreadNotFound(thread_id)
        return info

    async def list_threads(self, *, limit: int = 50, cursor: str | None = None) -> ThreadPage:
        """Threads, newest first.

        Args:
            limit: Page size, 1 to 500.
            cursor: ``next_cursor`` from the previous page.

        Raises:
            ValueError: a bad limit or a malformed cursor.
        """
        self._check_open()
        assert self._rtdb is not None
        _check_limit(limit)
        after: tuple[float, str] | None = None
        if cursor is not None:
            after = parse_thread_cursor(cursor)
        infos, nxt = await self._run_sync(self._rtdb.list_threads, limit, after)
        return ThreadPage(infos, f"{nxt[0]!r}~{nxt[1]}" if nxt is not None else None)

    async def delete_thread(self, thread_id: str) -> bool:
        """Delete a thread: its file, its alarm and every run.

        Nothing of it runs afterwards, even if its alarm was due or one of its runs is
        running now (that run is canceled mid-flight; a sync effect's worker thread is
        abandoned and its writes are refused).

        Returns:
            True if the thread existed.

        Raises:
            InvalidThreadId: a malformed id.
        """
        self._check_open()
        validate_thread_id(thread_id)
        assert self._rtdb is not None and self._timer is not None
        self._deleting.add(thread_id)
        try:
            opening = self._opening.get(thread_id)
            if opening is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(opening)
            actor = self._actors.pop(thread_id, None)
            if actor is not None:
                actor.deleted = True
                task = actor.effect_task
                # An effect may delete its own thread: it finishes, nothing is recorded.
                if task is not None and task is not asyncio.current_task():
                    task.cancel()
            self._timer.disarm(thread_id)
            self._alarm_due.pop(thread_id, None)
            self._alarm_dirty.discard(thread_id)
            # Shielded: a caller that gives up midway must not leave half a thread behind.
            return await asyncio.shield(self._remove_thread(thread_id, actor))
        finally:
            self._deleting.discard(thread_id)

    async def _remove_thread(self, thread_id: str, actor: ThreadActor | None) -> bool:
        assert self._rtdb is not None
        if actor is not None:
            # Writes that took the lock before `deleted` was set finish first (an alarm row
            # among them); later ones see `deleted` and write nothing.
            async with actor.lock:
                pass
        async with self._alarm_lock:
            existed = await self._run_sync(self._rtdb.delete_thread, thread_id)
            self._alarm_row.pop(thread_id, None)
        self._hub.close_thread(thread_id)
        if actor is not None:
            await self._run_sync(actor.store.close)
        await self._run_sync(self.storage.remove_thread_store, thread_id)
        return existed

    async def _actor(self, thread_id: str) -> ThreadActor:
        """The open actor of a thread, opening (and recovering) its file if needed."""
        self._check_open()
        validate_thread_id(thread_id)
        if thread_id in self._deleting:
            raise ThreadNotFound(thread_id)
        actor = self._actors.get(thread_id)
        if actor is not None:
            self._actors.move_to_end(thread_id)
            return actor
        pending = self._opening.get(thread_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[ThreadActor] = asyncio.get_running_loop().create_future()
        self._opening[thread_id] = future
        try:
            actor = await self._open(thread_id)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._opening[thread_id]
        future.set_result(actor)
        return actor

    async def _open(self, thread_id: str) -> ThreadActor:
        info = await self._thread_info(thread_id)
        store = await self._run_sync(self.storage.open_thread_store, thread_id)
        try:
            # The actor did not exist, so nothing in this process runs this thread's
            # effects: a run still marked running was interrupted by a crash.
            recovered = await self._run_sync(
                partial(store.recover_interrupted, retention=self.settings.retention),
                self.clock.now(),
                MAX_ATTEMPTS,
            )
        except BaseException:
            await self._run_sync(store.close)
            raise
        if thread_id in self._deleting:
            await self._run_sync(store.close)
            raise ThreadNotFound(thread_id)
        actor = ThreadActor(info, store)
        self._actors[thread_id] = actor
        for run in recovered:
            self._publish_recovered(run)
        if any(r.status is EffectStatus.PENDING for r in recovered):
            await self._lower_alarm(thread_id, min(r.run_at_ts for r in recovered))
        return actor

    @contextlib.asynccontextmanager
    async def _use(self, thread_id: str) -> AsyncIterator[ThreadActor]:
        """Hold a thread's actor open (not evictable) for the duration of the block."""
        while True:
            actor = await self._actor(thread_id)
            # Between the actor being opened and this line, another task's eviction may
            # have closed it (users was still 0): take it only if it is still the live
            # one, with no await between the check and the claim.
            if self._actors.get(thread_id) is actor:
                break
            if actor.deleted:
                raise ThreadNotFound(thread_id)
        actor.users += 1
        try:
            await self._evict()
            yield actor
        finally:
            actor.users -= 1
            # Actors that were busy when the map overflowed are closed once they are idle.
            if len(self._actors) > self.settings.max_open_threads:
                await self._evict()

    async def _evict(self) -> None:
        excess = len(self._actors) - self.settings.max_open_threads
        if excess <= 0:
            return
        victims = [
            actor for actor in self._actors.values()
            if actor.users == 0 and not actor.busy and actor.thread_id not in self._draining
        ][:excess]
        # Removed from the map before the first await, so concurrent evictions never pick
        # the same actor; the next use of the thread opens its file again.
        for actor in victims:
            del self._actors[actor.thread_id]
        for actor in victims:
            # Closing a WAL connection checkpoints: done off the loop.
            await self._run_sync(actor.store.close)

    def _publish_recovered(self, run: EffectRun) -> None:
        change = RunChange.REQUEUED if run.status is EffectStatus.PENDING else RunChange.FAILED
        self._hub.publish(change, run)

    # ------------------------------------------------------------------ alarms

    async def _lower_alarm(self, thread_id: str, due_at: float) -> None:
        """Make the durable alarm at or before ``due_at`` now (call with the actor lock).

        Lowering is written at once, before the caller's run row commits: a run is never
        without an alarm at or before its due time, so a crash cannot lose it.
        """
        assert self._rtdb is not None and self._timer is not None
        async with self._alarm_lock:
            row = self._alarm_row.get(thread_id)
            if row is None or due_at < row:
                await self._run_sync(self._rtdb.lower_alarm, thread_id, due_at)
                self._alarm_row[thread_id] = due_at
            current = self._alarm_due.get(thread_id)
            if current is None or due_at < current:
                self._alarm_due[thread_id] = due_at
                if thread_id not in self._draining:
                    self._timer.arm(thread_id, due_at)

    async def _set_alarm(self, thread_id: str, due_at: float | None) -> None:
        """After a drain: wake next at ``due_at`` (None: no pending run) (with the actor lock).

        The timer moves now; the durable row (still at or before every pending run) is
        raised or removed later by the flusher, in one transaction for many threads, so
        a drain never waits for a commit to the shared runtime database.
        """
        assert self._timer is not None
        async with self._alarm_lock:
            if due_at is None:
                self._alarm_due.pop(thread_id, None)
                self._timer.disarm(thread_id)
            else:
                self._alarm_due[thread_id] = due_at
                self._timer.arm(thread_id, due_at)
            if self._alarm_row.get(thread_id) != due_at:
                self._alarm_dirty.add(thread_id)
                self._alarm_flush_needed.set()

    async def _alarm_flusher(self) -> None:
        while True:
            await self._alarm_flush_needed.wait()
            # Gather the drains of a moment into one commit.
            await asyncio.sleep(_ALARM_FLUSH_SECONDS)
            self._alarm_flush_needed.clear()
            try:
                await self._flush_alarms()
            except Exception:
                log.exception("could not update alarm rows (they stay early: harmless)")

    async def _flush_alarms(self) -> None:
        """Move dirty alarm rows to the timer's due times, in one transaction."""
        assert self._rtdb is not None
        async with self._alarm_lock:
            dirty, self._alarm_dirty = self._alarm_dirty, set()
            changes = [
                (tid, self._alarm_row.get(tid), self._alarm_due.get(tid))
                for tid in dirty
                if self._alarm_row.get(tid) != self._alarm_due.get(tid)
            ]
            if not changes:
                return
            applied = await self._run_sync(self._rtdb.move_alarms, changes)
            for tid, due_at in applied:
                if due_at is None:
                    self._alarm_row.pop(tid, None)
                else:
                    self._alarm_row[tid] = due_at

    def _on_alarm(self, thread_id: str) -> None:
        if self._closing:
            return
        if thread_id in self._draining:
            # Its drain is finishing and may not see this: look again once it is done,
            # so a wake-up is never lost.
            self._rewake.add(thread_id)
            return
        if thread_id in self._queued:
            return
        self._queued.add(thread_id)
        self._idle.clear()
        self._queue.put_nowait(thread_id)  # wakes one idle worker, not all of them

    async def _worker(self) -> None:
        while True:
            thread_id = await self._queue.get()
            if thread_id is None or self._closing:
                return
            self._queued.discard(thread_id)
            self._draining.add(thread_id)
            try:
                await self._drain(thread_id)
            except (ThreadNotFound, InvalidThreadId):
                # Deleted meanwhile, or an alarm row left by a crash mid-delete.
                self._alarm_due.pop(thread_id, None)
                self._alarm_row.pop(thread_id, None)
                self._alarm_dirty.discard(thread_id)
                assert self._rtdb is not None
                with contextlib.suppress(Exception):
                    await self._run_sync(self._rtdb.set_alarm, thread_id, None)
            except ThreadStorageError as exc:
                # One bad file never stops the others: log, and leave the alarm row so the
                # thread's runs are tried again after the file is repaired and the
                # runtime restarted.
                log.error("thread %s cannot run its effects: %s", thread_id, exc)
            except Exception:
                log.exception("unexpected error while running thread %s", thread_id)
            finally:
                self._draining.discard(thread_id)
                if thread_id in self._rewake:
                    self._rewake.discard(thread_id)
                    self._on_alarm(thread_id)
                if self._queue.empty() and not self._draining:
                    self._idle.set()

    async def _drain(self, thread_id: str) -> None:
        async with self._use(thread_id) as actor:
            await self._drain_actor(actor)

    async def _drain_actor(self, actor: ThreadActor) -> None:
        thread_id = actor.thread_id
        finish: Finish | None = None
        done = 0
        while True:
            async with actor.lock:
                if actor.deleted:
                    return
                stop = self._closing or done >= _DRAIN_BATCH
                finished, claimed, next_due = await self._run_sync(
                    partial(
                        actor.store.finish_and_claim,
                        claim=not stop,
                        retention=self.settings.retention,
                    ),
                    finish,
                    self.clock.now(),
                )
                actor.current_run = claimed
                if actor.deleted:
                    actor.current_run = None
                    return
                if finished is not None:
                    change = (
                        RunChange.COMPLETED
                        if finished.status is EffectStatus.COMPLETED
                        else RunChange.FAILED
                    )
                    self._hub.publish(change, finished)
                if stop:
                    if not self._closing:
                        # Let other due threads go first; come back to this one.
                        self._rewake.add(thread_id)
                    return
                if claimed is None:
                    await self._set_alarm(thread_id, next_due)
                    return
            self._hub.publish(RunChange.STARTED, claimed)
            try:
                finish = await self._execute(actor, claimed)
            except Exception as exc:  # a bug of ours: still never leave the run running
                log.exception("run %s of thread %s: internal error", claimed.id, thread_id)
                finish = Finish(claimed.id, EffectStatus.FAILED,
                                f"Internal error running the effect: {_error_text(exc)}",
                                self.clock.now())
            if finish is None:  # interrupted: deletion or shutdown
                return
            actor.current_run = None
            done += 1

    async def _execute(self, actor: ThreadActor, run: EffectRun) -> Finish | None:
        """Run one claimed run; its outcome, or None if it was interrupted (delete/shutdown).

        Never raises for anything the effect does: whatever goes wrong becomes a failed run,
        so no run is left ``running`` behind a live worker.
        """
        try:
            defn = self.registry.resolve(run.name)
        except EffectNotFound as exc:
            return Finish(run.id, EffectStatus.FAILED, _error_text(exc, bare=True),
                          self.clock.now())
        try:
            args = defn.schema.model_validate(run.args) if defn.schema is not None else None
        except ValidationError as exc:
            return Finish(
                run.id,
                EffectStatus.FAILED,
                f"Invalid args for effect {run.name}: {_validation_summary(exc)}",
                self.clock.now(),
            )
        except Exception as exc:  # a validator of the schema raised something else
            return Finish(run.id, EffectStatus.FAILED,
                          f"Invalid args for effect {run.name}: {_error_text(exc)}",
                          self.clock.now())
        state = ThreadState(self, actor.info, package_id=defn.package_id)
        task = asyncio.create_task(self._call(defn, state, args), name=f"effect-{run.id}")
        actor.effect_task = task
        try:
            await asyncio.wait({task})
        finally:
            actor.effect_task = None
            if not task.done():  # the worker itself was canceled (shutdown)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if actor.deleted:
            return None
        now = self.clock.now()
        if task.cancelled():
            # Not by us (deletion returned above, shutdown cancels the worker instead):
            # the effect raised CancelledError itself.
            return Finish(run.id, EffectStatus.FAILED,
                          "CancelledError: the effect cancelled itself", now)
        error = task.exception()
        if error is None:
            return Finish(run.id, EffectStatus.COMPLETED, None, now)
        message = _error_text(error, bare=isinstance(error, _EffectTimeout))
        log.info("effect %s (run %s, thread %s) failed: %s", run.name, run.id,
                 actor.thread_id, _truncate(message, 500))
        return Finish(run.id, EffectStatus.FAILED, message, now)

    async def _call(self, defn: EffectDefinition, state: ThreadState, args: Any) -> None:
        call_args = (state, args) if defn.schema is not None else (state,)
        _IN_EFFECT.set(True)
        try:
            async with asyncio.timeout(defn.timeout_seconds):
                if defn.is_async:
                    await cast(Awaitable[None], defn.fn(*call_args))
                else:
                    # A sync effect runs in a worker thread; if it overruns or the thread
                    # is deleted, that worker thread is abandoned (Python cannot kill it).
                    result = await anyio.to_thread.run_sync(
                        partial(defn.fn, *call_args), abandon_on_cancel=True
                    )
                    if inspect.isawaitable(result):
                        # A callable that is not a coroutine function but returns one.
                        await result
        except TimeoutError as exc:
            if defn.timeout_seconds is None:
                raise
            raise _EffectTimeout(
                f"Effect {defn.qualified_name} timed out after {defn.timeout_seconds:g} s"
            ) from exc
        except (SystemExit, KeyboardInterrupt) as exc:
            # Raised out of a task these would stop the whole event loop, every thread
            # with it; for an effect they are just its failure.
            raise _EffectAborted(f"{type(exc).__name__}: {exc}" if str(exc)
                                 else type(exc).__name__) from None

    # ----------------------------------------------------------- run operations

    def _encode_args(self, defn: EffectDefinition, args: Any) -> Any:
        name = defn.qualified_name
        if isinstance(args, BaseModel):
            try:
                args = args.model_dump(mode="json")
            except Exception as exc:
                raise InvalidEffectArgs(
                    f"Args for effect {name} cannot be turned into JSON: {_error_text(exc)}"
                ) from None
        if args is None and defn.schema is not None:
            args = {}  # a schema whose fields all have defaults needs no args
        check_args_depth(name, args)
        try:
            text = json.dumps(args, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except RecursionError:
            raise InvalidEffectArgs(f"Args for effect {name} are nested too deeply") from None
        except (TypeError, ValueError) as exc:
            raise InvalidEffectArgs(f"Args for effect {name} are not JSON: {exc}") from None
        try:
            encoded = text.encode("utf-8")
        except UnicodeEncodeError:
            problem = find_invalid_text(args) or "it holds a lone surrogate"
            raise InvalidEffectArgs(
                f"Args for effect {name} are not valid Unicode text: {problem}"
            ) from None
        size = len(encoded)  # the UTF-8 bytes stored, as max_args_bytes says
        limit = self.settings.max_args_bytes
        if size > limit:
            raise InvalidEffectArgs(
                f"Args for effect {name} are {size} bytes of JSON; the limit is {limit} bytes",
                too_large=True,
            )
        value = json.loads(text)
        if defn.schema is None:
            if value not in (None, {}):
                raise InvalidEffectArgs(
                    f"Effect {name} takes no arguments, got {text[:200]}"
                )
            return None
        validate_args(defn.schema, value, name)
        return value

    async def _schedule(
        self,
        state: ThreadState,
        name: str,
        args: Any,
        delay: object,
        *,
        replay_of: str | None = None,
    ) -> str:
        self._check_open()
        if not isinstance(name, str):
            raise EffectNotFound(short_repr(name))
        defn = self.registry.resolve(name, package_id=state.package_id)
        seconds = delay_seconds(delay)
        stored_args = self._encode_args(defn, args)
        async with self._use(state.thread_id) as actor, actor.lock:
            # A state kept from a deleted thread (an abandoned sync effect, say) must not
            # write into a new thread that reuses the id.
            if actor.deleted or actor.info.created_at_ts != state._info.created_at_ts:
                raise ThreadNotFound(state.thread_id)
            now = self.clock.now()
            run = EffectRun(
                id=new_id(),
                thread_id=state.thread_id,
                name=defn.qualified_name,
                status=EffectStatus.PENDING,
                args=stored_args,
                run_at_ts=now + seconds,
                created_at_ts=now,
                replay_of=replay_of,
            )
            # The alarm first: a crash between the two writes leaves a spurious alarm,
            # never a run without one.
            await self._lower_alarm(state.thread_id, run.run_at_ts)
            await self._run_sync(actor.store.insert_run, run)
        self._hub.publish(RunChange.SCHEDULED, run)
        return run.id

    async def _pending(self, thread_id: str, name: str | None) -> list[EffectRun]:
        async with self._use(thread_id) as actor:
            return await self._run_sync(actor.store.pending_runs, name)

    async def _cancel(self, thread_id: str, run_id: str) -> bool:
        async with self._use(thread_id) as actor, actor.lock:
            if actor.deleted:
                raise ThreadNotFound(thread_id)
            run = await self._run_sync(
                partial(actor.store.cancel, retention=self.settings.retention),
                str(run_id),
                self.clock.now(),
            )
        if run is None:
            return False
        self._hub.publish(RunChange.CANCELED, run)
        return True

    async def _get_run(self, thread_id: str, run_id: str) -> EffectRun:
        async with self._use(thread_id) as actor:
            run = await self._run_sync(
                actor.store.get_run, str(run_id), self.clock.now(), self.settings.retention
            )
        if run is None:
            raise RunNotFound(thread_id, str(run_id))
        return run

    async def _run_now(self, thread_id: str, run_id: str) -> EffectRun:
        async with self._use(thread_id) as actor, actor.lock:
            if actor.deleted:
                raise ThreadNotFound(thread_id)
            now = self.clock.now()
            current = await self._run_sync(
                actor.store.get_run, run_id, now, self.settings.retention
            )
            if current is None:
                raise RunNotFound(thread_id, run_id)
            if current.status is not EffectStatus.PENDING:
                raise RunStateError(
                    f"Run {run_id} is {current.status}; only a pending run can be run now"
                )
            await self._lower_alarm(thread_id, now)
            run = await self._run_sync(actor.store.run_now, run_id, now)
        assert run is not None  # pending under the lock
        self._hub.publish(RunChange.RESCHEDULED, run)
        return run

    async def _replay(self, state: ThreadState, run_id: str) -> str:
        original = await self._get_run(state.thread_id, run_id)
        if not original.status.finished:
            raise RunStateError(
                f"Run {run_id} is {original.status}; only a finished run "
                f"(completed, failed or canceled) can be replayed"
            )
        plain = state.with_context(execution=state.execution, package_id=None)
        return await self._schedule(
            plain, original.name, original.args, 0, replay_of=original.id
        )

    async def _list_runs(
        self,
        thread_id: str,
        status: EffectStatus | str | list[EffectStatus | str] | None,
        name: str | None,
        limit: int,
        cursor: str | None,
    ) -> RunPage:
        _check_limit(limit)
        statuses: list[EffectStatus] | None = None
        if status is not None:
            raw = [status] if isinstance(status, str) else list(status)
            allowed = {s.value for s in EffectStatus}
            for value in raw:
                if value not in allowed:
                    raise ValueError(
                        f"Unknown status {short_repr(value)}; one of: "
                        f"{', '.join(s.value for s in EffectStatus)}"
                    )
            statuses = [EffectStatus(s) for s in raw]
        before: int | None = None
        if cursor is not None:
            before = parse_run_cursor(cursor)
        now = self.clock.now()
        retention = self.settings.retention

        def read(store: ThreadStore) -> tuple[list[EffectRun], int | None, Any]:
            runs, nxt = store.list_runs(
                now, retention, statuses=statuses, name=name, limit=limit, before_seq=before
            )
            return runs, nxt, store.count_runs(now, retention, name=name)

        async with self._use(thread_id) as actor:
            runs, nxt, counts = await self._run_sync(read, actor.store)
        return RunPage(runs, str(nxt) if nxt is not None else None, counts)


class _EffectTimeout(Exception):
    """An effect overran its ``timeout_seconds``."""


class _EffectAborted(Exception):
    """An effect raised SystemExit or KeyboardInterrupt (its message is the whole error)."""


_IN_EFFECT: contextvars.ContextVar[bool] = contextvars.ContextVar("in_effect", default=False)
"""True inside effect code, where waiting for the runtime to go idle would wait forever."""


def _error_text(error: BaseException, *, bare: bool = False) -> str:
    """``"<Type>: <message>"`` of an exception, storable as UTF-8 and at most 8 KiB.

    ``bare``: the message alone (it already says what happened).
    """
    try:
        text = str(error)
    except Exception:
        text = "<the exception's message could not be rendered>"
    if isinstance(error, _EffectAborted):
        bare = True
    name = type(error).__name__
    message = text if bare else (f"{name}: {text}" if text else name)
    # Lone surrogates (a file name decoded with os.fsdecode, say) cannot be stored as
    # UTF-8: they become visible \udcXX escapes instead of losing the run.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return _truncate(message, MAX_ERROR_CHARS)


def _truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, saying how much was cut."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return text
    kept = data[: limit - 48].decode("utf-8", "ignore")
    return f"{kept}… [{len(data) - len(kept.encode('utf-8'))} more bytes cut]"


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= _MAX_PAGE:
        raise ValueError(f"limit must be an integer from 1 to {_MAX_PAGE}, got {limit!r}")
