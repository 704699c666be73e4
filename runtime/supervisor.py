"""`Runtime`: the facade that composes the runtime's parts (docs/design.md, "The parts").

Each part has one job and its own module:

- storage (`runtime.storage`): a `StorageBackend` makes the runtime store (registry +
  alarm rows) and every thread's store; it owns paths, files and the data-dir lock;
- the alarm index (`runtime.alarms.AlarmIndex`): durable alarm rows, timer and flusher;
- the actor table (`runtime.actors.ActorTable`): LRU of open threads, single-flight
  open, recovery on open, eviction, deletion;
- the dispatcher (`runtime.dispatcher.Dispatcher`): due threads queued, workers, fairness;
- the executor (`runtime.executor.EffectExecutor`): a thread's drain and one effect call;
- run operations (`runtime.runs.RunOperations`): schedule, cancel, run now, replay, list;
- the change hub (`runtime.frames.ChangeHub`): per-thread events to subscribers;
- extensions (`runtime.extension`): the conversation layer plugs in here.

Life of a run::

    schedule_effect ─► RunOperations.schedule ─► AlarmIndex.lower (row, then timer)
                       ─► run row committed (thread store) ─► hub: scheduled
    timer fires ─► Dispatcher.wake ─► a worker ─► ActorTable.use ─► EffectExecutor.drain:
      claim the earliest due run (running, attempts + 1) ─► call the effect ─► record the
      outcome with the next claim (one transaction) ─► … ─► nothing due:
      AlarmIndex.settle (timer now, row later by the flusher)

Concurrency: each thread runs one effect at a time (one worker drains it); at most
``max_concurrent_runs`` workers run at once. Store calls run on the runtime's storage
thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
import logging
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from runtime._limits import (
    MAX_DELAY_SECONDS,
    delay_seconds,
    empty_filter,
    parse_thread_cursor,
    quoted,
)
from runtime._text import check_text
from runtime.actors import ActorState, ActorTable, ThreadActor, ThreadLifecycle
from runtime.alarms import AlarmIndex, Clock, SystemClock
from runtime.all_runs import MAX_BULK_RUNS, AllRuns, BulkResult, RunsPage
from runtime.cluster import ClusterNode
from runtime.config import MAX_ATTEMPTS, Settings
from runtime.discovery import EffectRegistry, discover
from runtime.dispatcher import Dispatcher
from runtime.effect_records import EffectRecords, RuntimeRecords
from runtime.effects import EffectRun, EffectStatus
from runtime.errors import (
    EffectDefinitionError,
    EffectNotFound,
    InvalidArgument,
    InvalidThreadId,
    RunStateError,
    RuntimeClosed,
    RuntimeStorageError,
    ThreadNotFound,
    ThreadStorageError,
    database_unreachable,
)
from runtime.events import RunChange, ThreadEvent
from runtime.executor import (
    IN_EFFECT,
    RETRY_FIRST_SECONDS,
    RETRY_MAX_SECONDS,
    EffectExecutor,
)
from runtime.extension import Conversation, Extension, default_extensions
from runtime.frames import ChangeHub, Subscription
from runtime.ids import THREAD_ID_RE, new_id, validate_thread_id
from runtime.outage import OutageLog
from runtime.run_index import RunIndexer
from runtime.runs import MAX_PAGE, RunOperations, check_limit
from runtime.schedules import ScheduleOperations
from runtime.storage.base import (
    Finish,
    RuntimeStore,
    StorageBackend,
    ThreadInfo,
    ThreadQuery,
    ThreadStore,
)
from runtime.storage.sqlite import SQLiteBackend
from runtime.telemetry import log_run_change
from runtime.thread import ThreadState
from runtime.watchdog import LoopWatchdog

__all__ = [
    "MAX_BULK_RUNS",
    "MAX_DELAY_SECONDS",
    "MAX_ID_CHARS",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "THREAD_ID_RE",
    "BulkResult",
    "RunsPage",
    "Runtime",
    "ThreadPage",
    "delay_seconds",
    "validate_thread_id",
]

log = logging.getLogger("runtime")

T = TypeVar("T")

_STORAGE_THREADS = 16

_INLINE_YIELD_EVERY = 8
"""`Runtime.run_short` lets the loop take a turn after this many calls made on the loop."""
_BUS_LISTEN_WAIT = 10.0
"""How long `Runtime.start` waits for the cluster bus to listen (seconds)."""

_UNREACHABLE_FLUSH_SECONDS = 1.0
"""How long `Runtime.close` waits for its last frames to be written once it found the
database unreachable (else the grace period and a second): a frame written in that time
still reaches the other nodes' clients."""

COMMANDS_CHANNEL = "commands"
"""The cluster bus channel of cancels, deletions and pauses made on one node for the
others (a shared backend only): JSON ``{"op", "thread", "from", ...}``."""
LOCK_RECHECK_SECONDS = 2.0
"""While the backend reports a lock problem, a due thread is looked at again this often."""
"""OS threads for store calls. Measured with bench/bench_effects.py (2 cores, FULL): 16
gave lag p99 88 ms and loop stalls of 13 ms where 32 gave 199 ms and 25 ms; more threads
mostly add GIL contention, fewer leave the disk's parallel fsyncs unused."""

DELETE_FRAMES_WAIT_SECONDS = 5.0
"""With nodes sharing the backend, how long a thread's deletion waits for the frames this
node queued before it to be written, so that they are numbered before its deletion's."""

ORPHAN_SWEEP_SECONDS = 600.0
"""With nodes sharing the backend, how often a node looks at every thread's store for rows
no registry entry names (`StorageBackend.discard_orphaned_threads`; a scan: about 0.1 s
with 100,000 threads). The deletions it hears of are looked up by id at every round of
the dead-node look instead."""

RESYNC_RETRY_FIRST_SECONDS = 0.5
RESYNC_RETRY_MAX_SECONDS = 10.0
"""A resync of the commands missed while the bus was down whose read fails is tried again
after this long, doubling up to the maximum, until it succeeds, the bus is lost again (the
next connection starts a new resync) or the runtime closes."""

MAX_DELETIONS_HEARD = 10_000
"""The most deletions heard of that a node keeps to look up (the oldest go first; the
sweep of every `ORPHAN_SWEEP_SECONDS` finds what they left)."""


def _default_backend(settings: Settings) -> StorageBackend:
    """The backend the settings name: PostgreSQL with a ``database_url``, else SQLite files."""
    if settings.database_url is not None:
        # Imported only here: a SQLite user never loads psycopg.
        from runtime.storage.postgres import PostgresBackend

        # One pooled connection per storage thread (the lock has one of its own).
        return PostgresBackend(settings.database_url, pool_size=_STORAGE_THREADS,
                               lease_seconds=settings.lease_seconds)
    return SQLiteBackend(settings.data_dir, settings.synchronous)


class _Completions:
    """The finished calls of a `_StoragePool` for one event loop, handed back in batches.

    A storage thread appends its call's outcome and wakes the loop only if no wake-up is
    pending yet (one ``call_soon_threadsafe``, which writes the loop's self-pipe); the loop
    clears the mark *before* it empties the queue, so an outcome appended meanwhile is
    either taken by this round or has woken the loop again. Calls that end close together
    (several threads' store calls) cost one wake-up and one pipe read, not one each.
    """

    __slots__ = ("_done", "_wake_pending", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._done: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = (
            collections.deque())
        self._wake_pending = False

    def add(self, future: asyncio.Future[Any], ok: bool, value: Any) -> None:
        """Hand an outcome to the loop (called in a storage thread)."""
        self._done.append((future, ok, value))
        if not self._wake_pending:
            self._wake_pending = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.loop.call_soon_threadsafe(self._complete)

    def _complete(self) -> None:
        self._wake_pending = False
        done = self._done
        while done:
            future, ok, value = done.popleft()
            if future.done():  # cancelled meanwhile
                continue
            try:
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            except Exception:  # a StopIteration cannot be set: the others still are
                log.exception("a storage call's outcome could not be handed back")


class _StoragePool:
    """OS threads that run blocking store calls for the event loop.

    Lighter than ``loop.run_in_executor`` on a ``ThreadPoolExecutor``: a call is one queue
    item and its outcome goes back through `_Completions` onto an asyncio future (no
    ``concurrent.futures.Future`` with its condition variable, no future chaining, one
    wake-up of the loop for calls that end together) — the hop is paid by every store call
    that does not run on the loop. A call whose future was cancelled before a thread took
    it up is skipped, as the executor would.
    """

    def __init__(self, threads: int, name: str) -> None:
        self._queue: queue.SimpleQueue[
            tuple[_Completions, asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]]
            | None
        ] = queue.SimpleQueue()
        self._completions: _Completions | None = None
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        get = self._queue.get
        while (item := get()) is not None:
            completions, future, fn, args = item
            if future.cancelled():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as an executor does
                completions.add(future, False, exc)
            else:
                completions.add(future, True, result)
            del item, future, fn, args, completions

    def submit(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., T], args: tuple[Any, ...]
    ) -> asyncio.Future[T]:
        """Queue ``fn(*args)``; the future gets its result or exception."""
        completions = self._completions
        if completions is None or completions.loop is not loop:
            completions = self._completions = _Completions(loop)
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((completions, future, fn, args))
        return future

    def shutdown(self) -> None:
        """Let every thread stop once the calls already queued have run (does not wait)."""
        for _ in self._threads:
            self._queue.put(None)


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


def _describe(runs: Sequence[EffectRun], most: int = 10) -> str:
    """``"send_reminder (run 1a2b…, thread t1), …"`` for a log line, at most ``most``."""
    text = ", ".join(f"{r.name} (run {r.id}, thread {r.thread_id})" for r in runs[:most])
    return text + (f" and {len(runs) - most} more" if len(runs) > most else "")


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
            ``synchronous`` setting, or with ``database_url`` a
            `runtime.storage.postgres.PostgresBackend` (a backend given here reads
            neither setting).
            `runtime.storage.memory.MemoryBackend` keeps everything in memory (tests).
        extensions: The layers plugged into the runtime (`runtime.extension`); None = the
            registered defaults (the conversation layer: agents, tools, hooks, turns).
        **settings: Any other field of `runtime.config.Settings`.

    Attributes:
        settings: The validated `runtime.config.Settings`.
        clock: The time source and timer.
        storage: The storage backend.
        extensions: The extensions, in the order they are called.
        registry: The effects discovered at start.
        hub: Per-thread events and their subscribers (`runtime.frames.ChangeHub`).
        alarms: The durable alarm index (`runtime.alarms.AlarmIndex`).
        actors: The open threads (`runtime.actors.ActorTable`).
        dispatcher: Due threads and the workers (`runtime.dispatcher.Dispatcher`).
        executor: Drains a thread, calls effects (`runtime.executor.EffectExecutor`).
        runs: Schedule, cancel, run now, replay, list (`runtime.runs.RunOperations`).
        schedules: Recurring schedules (`runtime.schedules.ScheduleOperations`).
        effect_records: The effect-tool records of every thread, in its own store
            (`runtime.effect_records.EffectRecords`, an ``EffectRecordStore``).
        watchdog: Warns of event-loop stalls, naming the effect that held the loop
            (`runtime.watchdog.LoopWatchdog`); None when ``loop_stall_warning_seconds``
            is None.

    An extension's `runtime.extension.Extension.attributes` are attributes too: with the
    conversation layer, ``rt.agents`` (the app's agents, tools and hooks) and ``rt.turns``.

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
        extensions: Sequence[Extension] | None = None,
        **settings: Any,
    ) -> None:
        self.settings = Settings(
            data_dir=Path(data_dir),
            app_dir=Path(app_dir) if app_dir is not None else None,
            **settings,
        )
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.storage: StorageBackend = (
            storage if storage is not None else _default_backend(self.settings)
        )
        if self.storage.node_id is None:  # a backend made with a node id keeps it
            self.storage.node_id = self.settings.node_id
        self.storage.claims = self.settings.max_concurrent_runs > 0
        self.extensions: list[Extension] = (
            list(extensions) if extensions is not None else default_extensions()
        )
        self.registry = EffectRegistry()
        self.hub = ChangeHub(self.settings.subscriber_queue_size)
        self.hub.add_listener(log_run_change)  # one log line per run transition
        self._executor_pool: _StoragePool | None = None
        self._inline_calls = 0  # short store calls made on the loop since it last yielded
        self._store: RuntimeStore | None = None
        self._started = False
        self._closing = False
        # Threads whose drain failed on a storage error: the next delay, the pending retry.
        self._drain_retry_delay: dict[str, float] = {}
        # One line per outage for the drains that failed for want of the database (not a
        # line per thread per retry); a store's own failure keeps its thread's ERROR line.
        self._drain_outage = OutageLog(log, "running the threads' effects")
        self._drain_retries: dict[str, asyncio.TimerHandle] = {}
        self._closing_started = asyncio.Event()
        # Set once the stores start closing: a store call that fails from then on failed
        # because of the shutdown, and raises RuntimeClosed.
        self._stores_closing = False
        # True from start until the shutdown grace ends: while it is, every call is served,
        # so a running effect (or turn, or tool) can still schedule, list and write.
        self._serving = False
        cluster_bus = self.storage.cluster
        self.alarms = AlarmIndex(
            self.clock, self.run_sync, self._on_alarm, self._is_draining,
            # Shared by several nodes: timers only for the alarms due within the horizon.
            horizon_seconds=(self.settings.alarm_horizon_seconds
                             if cluster_bus is not None else None),
            on_busy=self._on_busy,
        )
        self.cluster: ClusterNode | None = None
        """Wake-ups and frames across the nodes of a shared backend (`runtime.cluster`)."""
        if cluster_bus is not None:
            self.cluster = ClusterNode(
                cluster_bus, self.hub, self.alarms, self.run_sync, self.clock,
                poll_seconds=self.settings.cluster_poll_seconds,
                horizon_seconds=self.settings.alarm_horizon_seconds,
                grace_seconds=self.settings.cluster_wake_grace_seconds,
                frame_keep_seconds=self.settings.frame_keep_seconds,
                claiming_nodes=self.storage.claiming_nodes,
                claims=self.settings.max_concurrent_runs > 0,
            )
            self.hub.relay = self.cluster
        self.actors = ActorTable(
            self.storage, self.run_sync, self.clock.now, self.settings.max_open_threads,
            self._is_draining, self._recovered, self._check_open,
            retention=self.settings.retention,
        )
        self.executor = EffectExecutor(
            lambda: self.registry, self.clock.now, self.hub, self.alarms, self.run_short,
            self._state_for_effect, lambda: self._closing, claim_inline=self.claim_inline,
            retention=self.settings.retention,
            wake=lambda thread_id: self.dispatcher.wake(thread_id),
            shared=not self.storage.exclusive,
            known_elsewhere=None if self.storage.exclusive else self.storage.effect_known_elsewhere,
        )
        self._orphans: asyncio.Task[None] | None = None
        self._command_tasks: set[asyncio.Task[None]] = set()
        # Deleted threads whose rows the deleting node may have left (it stopped): thread
        # id -> when the `deleted` command was heard (loop time); bounded.
        self._deletions_heard: dict[str, float] = {}
        self._orphan_sweep_at = 0.0
        # While a resync reads the tables: the threads commands were heard for meanwhile
        # (what they said is newer than what the read may return).
        self._resyncs: list[set[str]] = []
        self._resync_generation = 0  # one more each time the commands channel listens
        # thread id -> run ids this process gave up when its lease lapsed: still `running`
        # under this node's id, re-queued here once the lease is held again.
        self._lease_abandoned: dict[str, set[str]] = {}
        self.watchdog: LoopWatchdog | None = (
            LoopWatchdog(self.settings.loop_stall_warning_seconds, self.executor.describe_task)
            if self.settings.loop_stall_warning_seconds is not None else None
        )
        self.dispatcher = Dispatcher(self.settings.max_concurrent_runs, self._drain)
        self.run_index = RunIndexer(self.run_sync, self.clock.now, self.settings.retention)
        self.hub.add_listener(self.run_index.observe)
        self._rebuild: asyncio.Task[None] | None = None
        self.runs = RunOperations(
            self.settings, lambda: self.registry, self.actors, self.alarms, self.hub,
            self.run_sync, self.clock.now, self._check_open, executor=self.executor,
            run_short=self.run_short,
            cancel_elsewhere=(self._cancel_elsewhere if self.storage.cluster is not None
                              else None),
            shared=not self.storage.exclusive,
            deleted_elsewhere=(self._deleted_elsewhere if self.storage.cluster is not None
                               else None),
        )
        self.schedules = ScheduleOperations(
            lambda: self.registry, self.actors, self.alarms, self.hub, self.run_sync,
            self.clock.now, self._check_open, self.runs, poke=self.executor.poke,
            reasons=self.executor.paused_reasons,
        )
        self.all_runs = AllRuns(
            store=self._opened_store, index=self.run_index, runs=self.runs,
            actors=self.actors, run_sync=self.run_sync, now=self.clock.now,
            retention=self.settings.retention, check_open=self._check_open,
            get_thread=self.get_thread,
        )
        self.effect_records = EffectRecords(
            self.actors, self.run_sync, self.hub, self.clock.now, self.settings.retention,
            self._thread_ids,
        )
        # Records of the runtime database: durable turns' "cross-run" keys.
        self.runtime_records = RuntimeRecords(self._runtime_store, self.run_sync, self.clock.now)

    def _opened_store(self) -> RuntimeStore:
        assert self._store is not None
        return self._store

    def _runtime_store(self) -> RuntimeStore:
        self._check_open()
        assert self._store is not None
        return self._store

    def __getattr__(self, name: str) -> Any:
        # Attributes the extensions expose (``rt.agents``, ``rt.turns``).
        if not name.startswith("_"):
            for extension in self.__dict__.get("extensions", ()):
                attributes = extension.attributes()
                if name in attributes:
                    return attributes[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def conversation(self) -> Conversation:
        """The conversation layer's handler of `ThreadState`'s conversation methods.

        Raises:
            RuntimeError: no extension of this runtime serves conversations.
        """
        for extension in self.extensions:
            conversation = extension.conversation()
            if conversation is not None:
                return conversation
        raise RuntimeError(
            "This runtime has no conversation layer (it was built with extensions= that "
            "include none): messages and turns are not available"
        )

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the storage, discover effects, start the extensions, re-arm every alarm.

        Raises:
            EffectDefinitionError: an effect file is invalid (names the file).
            AgentDefinitionError: an agent, tool or hook file is invalid (names the file).
            ModelNotAvailable: a model an agent would use (its own, or the ``model``
                setting) cannot be resolved: unknown name, provider not installed, no key.
            DataDirLocked: another process uses the data directory.
            RuntimeStorageError: the runtime database cannot be used.
        """
        if self._started:
            raise RuntimeClosed("Runtime already started")
        # The app's own files go there whatever the backend (a database server keeps the
        # threads with a database_url; SQLite makes the folder itself).
        await self.run_sync(partial(self.settings.data_dir.mkdir, parents=True, exist_ok=True))
        loop = asyncio.get_running_loop()

        def lease_lost(why: str) -> None:  # called from the backend's own thread
            loop.call_soon_threadsafe(self._lease_lost, why)

        self.storage.on_lease_lost = lease_lost
        store = await self.run_sync(self.storage.open)
        try:
            self.registry = await self.run_sync(self._discover)
            # Before any claim: other nodes leave runs of these effects to this one.
            await self.run_sync(partial(self.storage.record_effects,
                                        [d.qualified_name for d in self.registry.all()]))
            for extension in self.extensions:
                await extension.start(self)
        except BaseException:
            await self.run_sync(store.close)
            await self.run_sync(self.storage.close)
            raise
        self._store = store
        self.actors.registry = store
        self.executor.up_since = self.clock.now()
        self._started = True
        self._serving = True
        if self.watchdog is not None:
            self.watchdog.start()
        self.dispatcher.start()
        rebuild = await self.run_index.start(store, shared=not self.storage.exclusive)
        # Last: from here alarms go off, and due runs start as soon as start() yields.
        armed = await self.alarms.start(store)
        if self.cluster is not None:
            await self.cluster.start(store)
        if self.storage.cluster is not None:
            # Cancels, deletions and pauses made on other nodes (`_on_command`).
            # Those sent while the listening connection was down are lost: what they said
            # is read back from the tables when it listens again (`_resync_commands`).
            self.storage.cluster.listen(COMMANDS_CHANNEL, self._on_command,
                                        on_reconnect=self._on_commands_reconnect)
            # What other nodes and this one announce (frames, wake-ups, commands) before
            # the listening connection LISTENs is lost to this node, and a subscriber
            # with no frame of its thread yet could not tell: start() returns once the
            # bus listens (bounded; a late LISTEN still resyncs what it can).
            if not await asyncio.to_thread(self.storage.cluster.flush, _BUS_LISTEN_WAIT):
                log.warning("cluster: the listening connection is not up after %g s; "
                            "frames made before it is up may not reach this node's "
                            "subscribers", _BUS_LISTEN_WAIT)
        if not self.storage.exclusive:
            # Runs other nodes left running when they died: re-queued here (and by every
            # live node) once their lease expired, now and every third of the lease.
            # `open` discarded the rows no registry entry named: the next sweep is later.
            self._orphan_sweep_at = loop.time() + ORPHAN_SWEEP_SECONDS
            self._orphans = asyncio.create_task(self._requeue_orphans_forever(),
                                                name="thread-effects-orphans")
        if rebuild:
            log.info("the run index is incomplete (a crash or an upgrade): rebuilding it")
            self._rebuild = asyncio.create_task(
                self.run_index.rebuild(self.all_runs.every_threads_runs),
                name="thread-effects-reindex",
            )
        for extension in self.extensions:
            try:
                await extension.serving(self)
            except Exception:
                log.exception("extension %s failed when the runtime started", extension.name)
        if self.settings.freeze_gc:
            # Everything imported so far lives as long as the process: keep it out of the
            # collector's full passes, which otherwise stall the loop for tens of ms.
            gc.freeze()
        log.info("runtime started: %d effects, %d alarms re-armed",
                 sum(1 for _ in self.registry.all()), armed)

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

        No new run starts, nor a new turn from outside an effect. Running effects and
        running turns (their tools included) get ``shutdown_grace_seconds`` to finish, and
        during that grace period every call keeps being served (an effect may still
        schedule its follow-up run, list runs, write messages); then they are interrupted
        and their runs go back to ``pending`` (or fail on a third interruption), their
        ``requeued`` events published before the subscriptions end. Afterwards calls raise
        `RuntimeClosed`. Every database is closed.
        """
        if not self._started or self._closing:
            return
        if IN_EFFECT.get():
            raise RuntimeError("Runtime.close() cannot be called from an effect: shutdown "
                               "waits for running effects, this one included")
        self._closing = True
        self._closing_started.set()
        for task in list(self._command_tasks):
            task.cancel()
        if self._orphans is not None:
            self._orphans.cancel()
            with contextlib.suppress(BaseException):
                await self._orphans
            self._orphans = None
        if self._rebuild is not None:
            self._rebuild.cancel()  # the next start rebuilds (the index stays incomplete)
            with contextlib.suppress(BaseException):
                await self._rebuild
            self._rebuild = None
        assert self._store is not None
        for handle in self._drain_retries.values():
            handle.cancel()
        self._drain_retries.clear()
        self.alarms.stop_timer()
        grace = self.settings.shutdown_grace_seconds
        running = [
            run
            for a in self.actors.open_actors()
            for run in ([a.current_run] if a.current_run else []) + list(a.side_runs.values())
        ]
        if running:
            log.info("shutting down: waiting up to %g s for %d running run(s): %s", grace,
                     len(running), _describe(running))
        else:
            log.info("shutting down: no run is running")
        # Running effects (in line and concurrent), and what extensions run (turns and their
        # tools), share the grace period; every call is served until it ends.
        await asyncio.gather(
            self.dispatcher.stop(grace),
            self.executor.stop_side(grace),
            *(self._drain_extension(extension, grace) for extension in self.extensions),
        )
        # The last outcomes of drains that ended are flushed after them: their frames
        # go out before the subscribers are closed (a stuck disk: the stores' close
        # flushes, and those frames are not sent).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.executor.wait_flushed()
        self._serving = False
        # New calls are refused now; creates, opens and deletes in flight end first, and
        # nothing is evicted any more, so the actors walked below stay open.
        await self.actors.stop()
        # Every worker has stopped, so a run still marked running in an open thread was
        # interrupted (a thread with running work is never evicted, so open ones are all).
        now = self.clock.now()
        requeued: list[EffectRun] = []
        failed: list[EffectRun] = []
        # Once a thread's re-queue finds the database unreachable, the others are not
        # tried (each would wait for a connection in turn: 2 s a thread), nor are the
        # last writes below: what is left is the lease rule's (docs/scale-out.md).
        unreachable: ThreadStorageError | None = None
        actors = [a for a in self.actors.open_actors() if a.state is ActorState.OPEN]
        for left, actor in enumerate(actors):
            if actor.state is not ActorState.OPEN:
                continue  # closed meanwhile (deleted): nothing of it to re-queue
            try:
                changed = await self.run_sync(
                    partial(actor.store.recover_interrupted, retention=self.settings.retention,
                            reason=f"node {self.node_id} shut down before it ended"),
                    now,
                    MAX_ATTEMPTS,
                )
            except ThreadStorageError as exc:
                if database_unreachable(exc):
                    unreachable = exc
                    log.warning(
                        "shutdown: the database cannot be reached (%s): the interrupted "
                        "runs of %d open thread(s) are not re-queued here; they stay "
                        "running under this node's lease, and once it has expired another "
                        "node re-queues them, or this node when it starts again",
                        exc, len(actors) - left)
                    break
                log.exception("could not re-queue interrupted runs of %s", actor.thread_id)
                continue
            for run in changed:
                (requeued if run.status is EffectStatus.PENDING else failed).append(run)
                self._publish_recovered(run)
        if requeued:
            log.info("shutdown: %d interrupted run(s) re-queued (they run again after the "
                     "restart): %s", len(requeued), _describe(requeued))
        if failed:
            log.warning("shutdown: %d interrupted run(s) failed (interrupted at their "
                        "attempt limit, %d): %s", len(failed), MAX_ATTEMPTS, _describe(failed))
        if self.cluster is not None:
            # This node's last frames reach the other nodes' clients, and its own, before
            # it goes (not waited for long once the database was found unreachable).
            if not await self.cluster.flush(_UNREACHABLE_FLUSH_SECONDS
                                            if unreachable is not None else grace + 1.0):
                log.warning("shutdown: some frames could not be written to the database")
            await self.cluster.close()
        self.hub.close_all()
        await self.alarms.close(write=unreachable is None)
        await self.run_index.close(write=unreachable is None)
        self._stores_closing = True
        await self.actors.close_all()
        for extension in self.extensions:
            try:
                await extension.close(self)
            except Exception:
                log.exception("extension %s failed to close", extension.name)
        await self.run_sync(self._store.close)
        await self.run_sync(self.storage.close)
        if self._executor_pool is not None:
            self._executor_pool.shutdown()
            self._executor_pool = None
        if self.watchdog is not None:
            self.watchdog.stop()
        self._started = False

    async def check_ready(self) -> None:
        """Check that the runtime runs and its runtime store answers a read.

        Raises:
            RuntimeClosed: not started, or shutting down (from the start of `close`, while
                running runs still get their grace time).
            RuntimeStorageError: the runtime database cannot be read.
        """
        self._check_open()
        if self._closing:
            raise RuntimeClosed("The runtime is shutting down")
        assert self._store is not None
        problem = self.storage.lock_problem()
        if problem is not None:
            raise RuntimeStorageError(problem)
        if self.storage.connection_held() is False:
            # Known lost (the server ended it) before a read would wait out the pool.
            raise RuntimeStorageError(
                f"node {self.node_id} lost its connection to the database; it reconnects")
        await self.run_sync(self._store.list_threads, 1, None)

    async def _drain_extension(self, extension: Extension, grace: float) -> None:
        try:
            async with asyncio.timeout(grace):
                await extension.drain(self, grace)
        except TimeoutError:
            log.warning("shutdown: %s still had work running after the grace period of %s s",
                        extension.name, grace)
        except Exception:
            log.exception("extension %s failed to drain", extension.name)

    @property
    def node_id(self) -> str:
        """This process's node id (`runtime.config.Settings.node_id`, or the backend's own)."""
        return self.storage.node_id or self.settings.node_id

    @property
    def shutting_down(self) -> bool:
        """True once `close` has begun: no new run (or turn from outside) starts."""
        return self._closing

    def _check_open(self) -> None:
        if not self._serving:
            if self._closing and self._started:
                raise RuntimeClosed(
                    f"The runtime is shutting down: its grace period "
                    f"({self.settings.shutdown_grace_seconds:g} s) has ended; retry once it "
                    f"is back", shutting_down=True)
            raise RuntimeClosed("The runtime is not running (not started, or shut down)")

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call (storage work) on the runtime's own thread pool, off the loop.

        Returns:
            What ``fn(*args)`` returned (its exception is raised here).
        """
        if self._executor_pool is None:
            # Started eagerly, so the first busy moment does not pay for thread creation.
            self._executor_pool = _StoragePool(_STORAGE_THREADS, "thread-effects-storage")
        try:
            return await self._executor_pool.submit(asyncio.get_running_loop(), fn, args)
        except ThreadStorageError as exc:
            self._raise_if_closing(exc)
            raise

    def _raise_if_closing(self, exc: ThreadStorageError) -> None:
        """A store call failed while `close` closes the stores: raise `RuntimeClosed` instead.

        (A call in flight met a store that close() just closed.)
        """
        if self._stores_closing:
            raise RuntimeClosed("The runtime was shut down while this call was in flight") from exc

    async def run_short(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a short store call: on the loop when the backend says it is cheap, else `run_sync`.

        With a backend whose ``short_calls_inline`` is set (SQLite with
        ``synchronous=NORMAL``) ``fn(*args)`` runs here, on the event loop, and then the
        loop gets one turn (``asyncio.sleep(0)``), so that a caller scheduling in a loop
        still lets due runs and other requests go; otherwise it is `run_sync`. Used for the
        per-run calls (recording a schedule, recording an outcome and claiming the next run),
        whose hand-off to a storage thread and back cost more CPU than the call itself. On
        the loop, the call waits for the store's own lock if a storage thread holds it (a
        listing of that thread), and sometimes runs SQLite's WAL checkpoint.

        Returns:
            What ``fn(*args)`` returned (its exception is raised here).
        """
        if not self.storage.short_calls_inline:
            return await self.run_sync(fn, *args)
        try:
            result = fn(*args)
        except ThreadStorageError as exc:
            self._raise_if_closing(exc)
            raise
        self._inline_calls += 1
        if self._inline_calls >= _INLINE_YIELD_EVERY:
            self._inline_calls = 0
            await asyncio.sleep(0)
        return result

    def claim_inline(
        self, store: ThreadStore, now: float
    ) -> tuple[EffectRun | None, EffectRun | None, float | None] | None:
        """`ThreadStore.claim_inline` here, on the event loop: a claim that needs no wait.

        The drain calls it before sending a claim to a storage thread (see the method's
        contract). SQLite answers whenever the thread's store is free: the claim commits
        without an fsync of its own, a probe that finds nothing due writes nothing.

        Returns:
            None (not cheap now), or what ``store.finish_and_claim(None, now)`` returns.

        Raises:
            ThreadStorageError: the store failed.
            RuntimeClosed: the runtime's stores are closing.
        """
        try:
            return store.claim_inline(now)
        except ThreadStorageError as exc:
            self._raise_if_closing(exc)
            raise

    async def wait_idle(self, timeout_seconds: float = 30.0) -> None:
        """Wait until no thread is queued or running effects (for tests and scripts).

        With ``synchronous=FULL``, also until the outcomes drains recorded are flushed to
        the disk (a drain's last ones are flushed after it ends) and their frames sent.

        Runs due later (a delay that has not elapsed) do not count: with the real clock,
        wait for their due time first; with `runtime.testing.FakeClock`, advance it.

        Args:
            timeout_seconds: How long to wait at most, > 0.

        Raises:
            TimeoutError: still busy after ``timeout_seconds``.
            RuntimeClosed: the runtime is not started, or its shutdown began before it
                was idle (raised as soon as `close` starts): a shutdown interrupts
                runs, which are then pending, not done, so it never counts as idle.
            ValueError: a timeout that is not a positive number.
            RuntimeError: called from effect code (it would wait for itself).
        """
        if not (isinstance(timeout_seconds, int | float) and timeout_seconds > 0):
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds!r}")
        if IN_EFFECT.get():
            raise RuntimeError("wait_idle() cannot be called from an effect: it would wait "
                               "for its own run to end")
        closed = RuntimeClosed("The runtime is not running (not started, or shut down)")
        if not self._started or self._closing:
            raise closed
        try:
            async with asyncio.timeout(timeout_seconds):
                while True:
                    for _ in range(3):
                        await asyncio.sleep(0)
                    if self._closing:
                        raise closed
                    if self.dispatcher.idle and not self.actors.opening:
                        if self.executor.side_running:
                            waiting = self.executor.wait_side_idle()
                        elif self.executor.flushing:
                            # A drain's last outcomes are flushed after it ends: idle
                            # once they are durable and their frames delivered.
                            waiting = self.executor.wait_flushed()
                        else:
                            return
                    else:
                        waiting = self.dispatcher.wait_for_change()
                    changed = asyncio.ensure_future(waiting)
                    closing = asyncio.ensure_future(self._closing_started.wait())
                    try:
                        await asyncio.wait(
                            (changed, closing), return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        changed.cancel()
                        closing.cancel()
        except TimeoutError:
            raise TimeoutError(
                f"the runtime was still running effects after {timeout_seconds:g} s "
                f"({self.dispatcher.draining_count} threads running, "
                f"{self.dispatcher.queued_count} queued)"
            ) from None

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
        for extension in self.extensions:
            agent_id = extension.agent_for_new_thread(agent_id)
        info = ThreadInfo(
            id=tid, created_at_ts=self.clock.now(), agent_id=agent_id, user_id=user_id,
            tags=checked_tags,
        )
        # With its alarm row, so that its first schedule commits only its run row.
        actor = await self.actors.create(info, alarm_at=info.created_at_ts)
        self.alarms.created(actor.thread_id, info.created_at_ts)
        state = ThreadState(self, actor.info)
        self.run_index.creating.add(tid)
        try:
            for extension in self.extensions:
                await extension.thread_created(state)
        finally:
            self.run_index.creating.discard(tid)
        return state

    async def get_thread(self, thread_id: str) -> ThreadState:
        """The state of an existing thread.

        Raises:
            InvalidThreadId: a malformed id.
            ThreadNotFound: no such thread.
        """
        self._check_open()
        validate_thread_id(thread_id)
        actor = self.actors.peek(thread_id)
        if actor is not None and not actor.deleted:
            return ThreadState(self, actor.info)
        return ThreadState(self, await self.actors.info(thread_id))

    async def last_activity(self, thread_id: str) -> float | None:
        """When a thread last did something (as `list_threads` orders by), or None.

        The latest of its creation, its runs' transitions and its messages, in seconds
        since the epoch (UTC); the changes noted so far are written first. None when the
        thread is not registered (deleted meanwhile).

        Raises:
            InvalidThreadId: a malformed id.
        """
        self._check_open()
        validate_thread_id(thread_id)
        assert self._store is not None
        await self.run_index.flush()
        info = await self.run_sync(self._store.get_thread, thread_id)
        return info.last_activity_ts if info is not None else None

    async def list_runs(self, **filters: Any) -> RunsPage:
        """Runs across every thread, newest first, no args: `runtime.all_runs.AllRuns.list_runs`.

        Raises:
            ValueError: an unknown status, a bad limit or a malformed cursor.
        """
        return await self.all_runs.list_runs(**filters)

    async def cancel_runs(self, *, canceled_by: str = "code", **filters: Any) -> BulkResult:
        """Cancel every pending run matching ``filters``: `runtime.all_runs.AllRuns.cancel_runs`."""
        return await self.all_runs.cancel_runs(canceled_by=canceled_by, **filters)

    async def replay_runs(self, **filters: Any) -> BulkResult:
        """Replay every failed run matching ``filters``: `runtime.all_runs.AllRuns.replay_runs`."""
        return await self.all_runs.replay_runs(**filters)

    def subscribe_runs(self) -> Subscription:
        """A subscription to the run changes of every thread (`EffectChanged`, no args).

        Each event keeps its thread's ``seq``; a deleted thread's last event is a
        `ThreadDeleted` (after its runs are gone). The subscription ends at shutdown.

        Raises:
            RuntimeClosed: the runtime is not running.
        """
        self._check_open()
        return self.hub.subscribe_runs()

    async def wait_run_index(self) -> None:
        """Wait until a rebuild of the run index started at start-up (if any) has ended."""
        if self._rebuild is not None:
            await asyncio.shield(self._rebuild)

    async def list_threads(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        tag: str | None = None,
        by_activity: bool = False,
    ) -> ThreadPage:
        """Threads, newest first: by creation, or by last activity.

        Last activity (`ThreadInfo.last_activity_ts`) is the latest of the thread's
        creation, its runs' transitions and its messages, kept in the registry with the
        run index's writes; the changes noted so far are written before the read.

        Args:
            limit: Page size, 1 to 500.
            cursor: ``next_cursor`` from the previous page, which names its order
                (``"activity:..."`` or ``"created:..."``): a cursor of the other order
                is refused.
            user_id: Only threads of this user.
            agent_id: Only threads served by this agent.
            tag: Only threads with this tag.
            by_activity: Most recently active first (ties by id, descending). Pages never
                repeat a thread; one that becomes active while pages are read moves to
                the top and is not met again.

        Raises:
            ValueError: a bad limit, a malformed cursor or one of the other order;
                `InvalidArgument` for a filter given as an empty string.
        """
        self._check_open()
        empty_filter(user_id=user_id, agent_id=agent_id, tag=tag)
        assert self._store is not None
        check_limit(limit)
        sort = "activity" if by_activity else "created"
        after: tuple[float, str] | None = None
        if cursor is not None:
            # A cursor names its order: a position in one order means nothing in the other.
            kind, sep, position = cursor.partition(":")
            if not sep or kind not in ("activity", "created"):
                raise ValueError(
                    f"Invalid cursor {quoted(cursor)}: pass nextCursor of the last page"
                )
            if kind != sort:
                raise ValueError(
                    f"Invalid cursor {quoted(cursor)}: it continues a list sorted by "
                    f"{kind}, not by {sort}; pass the same sort as the page it came from"
                )
            after = parse_thread_cursor(position)
        query = ThreadQuery(
            user_id=user_id, agent_id=agent_id, tag=tag, by_activity=by_activity
        )
        if by_activity:
            await self.run_index.flush()
        infos, nxt = await self.run_sync(self._store.list_threads, limit, after, query)
        return ThreadPage(infos, f"{sort}:{nxt[0]!r}~{nxt[1]}" if nxt is not None else None)

    async def pause_thread(self, thread_id: str) -> ThreadState:
        """Pause a thread: it starts no run until resumed; the mark survives restarts.

        Everything is kept: its runs, its alarm row, its messages. It still accepts
        schedules, cancels and run-nows; due runs stay ``pending``. A run that is
        running when the thread is paused runs to its end (it is not cancelled; cancel
        it, or delete the thread, to stop it). Pausing a paused thread changes nothing.

        Returns:
            The thread's state, ``info.paused`` True.

        Raises:
            InvalidThreadId: a malformed id.
            ThreadNotFound: no such thread.
        """
        return await self._set_paused(thread_id, paused=True)

    async def resume_thread(self, thread_id: str) -> ThreadState:
        """Resume a paused thread: its due runs start, in due order; a no-op if not paused.

        Returns:
            The thread's state, ``info.paused`` False.

        Raises:
            InvalidThreadId: a malformed id.
            ThreadNotFound: no such thread.
        """
        return await self._set_paused(thread_id, paused=False)

    async def _set_paused(self, thread_id: str, *, paused: bool) -> ThreadState:
        self._check_open()
        validate_thread_id(thread_id)
        assert self._store is not None
        store = self._store
        async with self.actors.writing(thread_id) as actor:
            if actor.info.paused is not paused:
                if not await self.run_sync(store.set_paused, thread_id, paused):
                    raise ThreadNotFound(thread_id)
                actor.info = replace(actor.info, paused=paused)
                await self._send_command(self._command("paused", thread_id, paused=paused))
            info = actor.info
        if not paused:
            # Its alarm may have fired while it was paused: look at its due runs now
            # (the drain sets the timer to the next pending one).
            self._on_alarm(thread_id)
        log.info("thread %s %s", thread_id, "paused" if paused else "resumed")
        return ThreadState(self, info)

    async def delete_thread(self, thread_id: str) -> bool:
        """Delete a thread: its file, its alarm and every run.

        Nothing of it runs afterwards, even if its alarm was due or one of its runs is
        running now (that run is canceled mid-flight; a sync effect's worker thread is
        abandoned and its writes are refused). A turn running now is canceled too (its
        tools stop; its ``send_message`` raises `ThreadNotFound`), and has ended before
        the thread is removed, so nothing of it lands in a new thread with the same id.

        Returns:
            True if the thread existed.

        Raises:
            InvalidThreadId: a malformed id.
            RuntimeClosed: the runtime is not running.
            sqlite3.Error: (or the backend's own error) the runtime store could not
                delete it: nothing was deleted, the thread keeps its runs and its alarm
                (a running effect of it was interrupted, and is re-queued).
        """
        self._check_open()
        validate_thread_id(thread_id)
        if self.actors.lifecycle(thread_id) is ThreadLifecycle.CREATING:
            return False  # not registered yet: nothing of it may be removed mid-create
        for extension in self.extensions:  # a running turn is canceled, like a running run
            try:
                await extension.thread_deleting(self, thread_id)
            except Exception:
                log.exception("extension %s failed to stop the work of thread %s",
                              extension.name, thread_id)
        try:
            async with self.actors.deleting(thread_id) as actor:
                self.alarms.forget(thread_id)
                # Shielded: a caller that gives up midway must not leave half a thread
                # behind.
                return await asyncio.shield(self._remove_thread(thread_id, actor))
        except BaseException:
            # Re-armed once the thread is usable again (no longer being deleted), if its
            # registry entry and alarm row are still there (a no-op once they are gone).
            self.alarms.restore(thread_id)
            raise

    async def _remove_thread(self, thread_id: str, actor: ThreadActor | None) -> bool:
        assert self._store is not None
        store = self._store
        if actor is not None:
            # Writes that took the lock before the actor was marked deleted finish first
            # (an alarm row among them); later ones see it deleted and write nothing.
            async with actor.lock:
                pass
        cluster = self.cluster
        numbered: list[ThreadEvent] = []
        delete = partial(store.delete_thread, thread_id)
        if cluster is not None:
            # The deletion's frame and its `deleted` command are written and announced by
            # its own transaction (no node dying after the commit leaves the thread's
            # streams open, its cached entries served or its runs running on other
            # nodes), after the frames of the thread's last changes.
            if not await cluster.sent_so_far(DELETE_FRAMES_WAIT_SECONDS):
                log.warning("thread %s: deleted before its last frames were written (the "
                            "database is slow); they come after its deletion", thread_id)
            draft, numbered = cluster.deletion_draft(thread_id)
            delete = partial(store.delete_thread, thread_id, frame=draft,
                             now=self.clock.now(),
                             notify=(COMMANDS_CHANNEL, self._command("deleted", thread_id)))
        try:
            existed = await self.alarms.delete_with(thread_id, delete)
        except BaseException:
            # Nothing was deleted (the registry entry and its alarm row go in one
            # transaction): the thread lives on (`delete_thread` re-arms its timer); its
            # actor's store is closed, so its next use opens it afresh and re-queues an
            # interrupted run.
            if actor is not None:
                await self.run_sync(actor.store.close)
            raise
        if cluster is not None:
            cluster.deliver_written(numbered)  # nothing if it did not exist
        else:
            self.hub.close_thread(thread_id)
        await self.actors.remove_store(thread_id, actor)
        return existed

    # ------------------------------------------------- wiring between the parts

    async def _thread_ids(self) -> AsyncIterator[str]:
        """Every registered thread's id, newest first, a page at a time."""
        cursor: str | None = None
        while True:
            page = await self.list_threads(limit=MAX_PAGE, cursor=cursor)
            for thread in page.threads:
                yield thread.id
            cursor = page.next_cursor
            if cursor is None:
                return

    def _on_alarm(self, thread_id: str) -> None:
        if not self._closing:
            self.dispatcher.wake(thread_id)
            self.executor.poke(thread_id)

    def _on_busy(self, thread_id: str) -> None:
        # Another node's run for a thread this node drains now: start it beside, if due.
        if not self._closing:
            self.executor.poke(thread_id)

    def _is_draining(self, thread_id: str) -> bool:
        return self.dispatcher.is_draining(thread_id)

    def _state_for_effect(self, info: ThreadInfo, package_id: str | None) -> ThreadState:
        return ThreadState(self, info, package_id=package_id)

    async def _drain(self, thread_id: str) -> bool:
        """Drain one thread for the dispatcher; True to be woken again."""
        if self.storage.lock_problem() is not None:
            # Another process may hold the threads now: start nothing, look again later.
            self._retry_drain_later(thread_id, LOCK_RECHECK_SECONDS)
            return False
        given_up = self._lease_abandoned.get(thread_id)
        if given_up:
            # Runs this node gave up when its lease lapsed are still `running` under its
            # id: re-queued first, so that no later run of the thread starts before them
            # (one run at a time per thread, in due order).
            await self._requeue_thread(thread_id, sorted(given_up), mine=True)
            if thread_id in self._lease_abandoned:  # one still executing, or a storage error
                self._retry_drain_later(thread_id, LOCK_RECHECK_SECONDS)
                return False
        try:
            async with self.actors.use(thread_id) as actor:
                again = await self.executor.drain(actor)
        except (ThreadNotFound, InvalidThreadId):
            # Being deleted (its row goes with its registry entry, in the deletion's own
            # transaction), being created (not registered yet), or an alarm row with no
            # thread: only that last one is dropped, and only if still unregistered.
            if self.actors.lifecycle(thread_id) is ThreadLifecycle.CLOSED:
                await self.alarms.drop(thread_id)
        except ThreadStorageError as exc:
            # One bad store never stops the others. The alarm row stays, and the drain is
            # tried again with backoff (1 s doubling to 30 s): a database that blinked
            # delays the thread's runs, a broken store does not spin.
            delay = self._drain_retry_delay.get(thread_id, RETRY_FIRST_SECONDS)
            self._drain_retry_delay[thread_id] = min(delay * 2, RETRY_MAX_SECONDS)
            if exc.unavailable:
                self._drain_outage.failed(
                    exc, "each thread tries again with backoff, 1 s doubling to "
                         f"{RETRY_MAX_SECONDS:.0f} s")
            else:
                log.error("thread %s cannot run its effects (retrying in %.0f s): %s",
                          thread_id, delay, exc)
            self._retry_drain_later(thread_id, delay)
            return False
        else:
            # The store answered: the next failure backs off from the start again.
            if self._drain_retry_delay.pop(thread_id, None) is not None and (
                    self._drain_outage.in_outage):
                self._drain_outage.ok()
            return again
        return False

    # ------------------------------------------------------------ commands from any node

    def _command(self, op: str, thread_id: str, **fields: Any) -> str:
        return json.dumps({"op": op, "thread": thread_id, "from": self.node_id, **fields})

    async def _send_command(self, payload: str) -> None:
        bus = self.storage.cluster
        if bus is None:
            return
        try:
            await self.run_sync(bus.notify, COMMANDS_CHANNEL, payload)
        except Exception:  # the database blinked: the claim's own checks still hold
            log.exception("could not tell the other nodes: %s", payload)

    async def _cancel_elsewhere(self, actor: ThreadActor, run_id: str, canceled_by: str) -> bool:
        """Ask the node running ``run_id`` (not this one) to cancel it; False if none does.

        Raises:
            RunStateError: the run is a sync effect's (no node can stop its worker thread).
        """
        run = await self.run_sync(actor.store.get_run, run_id, self.clock.now(),
                                  self.settings.retention)
        if run is None or run.status is not EffectStatus.RUNNING:
            return False
        attempts = await self.run_sync(actor.store.run_attempts, run_id)
        node = attempts[-1].node_id if attempts else None
        if node == self.node_id:
            # Ours, but not running in this process (given up when the lease lapsed, or
            # left by a crash): nobody else would ever end it.
            return await self._cancel_in_store(actor, run_id, canceled_by)
        try:
            defn = self.registry.resolve(run.name)
        except EffectNotFound:
            return False
        if not defn.is_async:
            raise RunStateError(
                f"Run {run_id} of effect {run.name} is running a sync function in a worker "
                f"thread on node {node}, which cannot be stopped; it can only be left to "
                f"finish"
            )
        await self._send_command(self._command("cancel", actor.thread_id, run=run_id,
                                               by=canceled_by, node=node))
        return True

    def _on_command(self, payload: str) -> None:
        """A command from a node (this one included): applied to this node's actors."""
        try:
            command = json.loads(payload)
            op, thread_id = command["op"], command["thread"]
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed command from another node: %r", payload[:200])
            return
        if command.get("from") == self.node_id or self._closing:
            return
        for heard in self._resyncs:
            heard.add(thread_id)
        self._command_task(self._apply_command(op, thread_id, command), f"thread-effects-{op}")

    def _deleted_elsewhere(self, thread_id: str) -> None:
        """Apply the deletion of a thread the store found unregistered.

        Another node deleted it, and this one missed its ``deleted`` command (its
        listening connection was down): applied now, as that command would have been,
        once the caller's lock on the thread is free.
        """
        if self._closing:
            return
        self._command_task(self._apply_command("deleted", thread_id, {"from": "store"}),
                           "thread-effects-deleted")

    def _command_task(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` (a command's application, a resync) as a task that shutdown cancels."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._command_tasks.add(task)
        task.add_done_callback(self._command_tasks.discard)

    async def _apply_command(self, op: str, thread_id: str, command: dict[str, Any]) -> None:
        try:
            if op == "cancel":
                run_id, by = str(command["run"]), str(command.get("by") or "another node")
                actor = self.actors.peek(thread_id)
                if actor is not None:
                    async with actor.lock:
                        if self.executor.cancel_asked(run_id):
                            return  # asked again while it stops: it is not interrupted twice
                        if self.executor.cancel_running(actor, run_id, by)[0]:
                            return
                if command.get("node") != self.node_id:
                    return
                # Running under this node's id but not executed by this process (given up
                # when its lease lapsed): canceled in the store, here.
                async with self.actors.writing(thread_id) as actor:
                    await self._cancel_in_store(actor, run_id, by)
            elif op == "deleted":
                heard = self._deletions_heard
                heard[thread_id] = asyncio.get_running_loop().time()
                if len(heard) > MAX_DELETIONS_HEARD:  # the sweep looks after the oldest
                    del heard[next(iter(heard))]
                # The thread is gone: nothing of it runs here any more, nothing is written.
                for extension in self.extensions:
                    await extension.thread_deleting(self, thread_id)
                async with self.actors.deleting(thread_id) as actor:
                    self.alarms.forget(thread_id)
                    if actor is not None:
                        await self.run_sync(actor.store.close)
                if self.hub.relay is None:
                    self.hub.close_thread(thread_id)
                # Else the `thread_deleted` frame the deletion's own transaction announced
                # ends the thread's streams here too (after its last frames); a second one
                # from here would be a duplicate on every node's server-wide stream.
            elif op == "paused":
                actor = self.actors.peek(thread_id)
                paused = bool(command.get("paused"))
                if actor is not None:
                    actor.info = replace(actor.info, paused=paused)
                if not paused:
                    self._on_alarm(thread_id)
        except ThreadNotFound:
            # Deleted meanwhile (a deletion racing the command): nothing of it is left here.
            log.debug("a command from node %s found its thread deleted: %s",
                      command.get("from"), command)
        except Exception:
            log.exception("could not apply a command from node %s: %s", command.get("from"),
                          command)

    def _on_commands_reconnect(self) -> None:
        if self._closing:
            return
        self._resync_generation += 1
        self._command_task(self._resync_commands(), "thread-effects-resync")

    async def _resync_commands(self) -> None:
        """Apply the deletions and pauses this node may have missed while it was not listening.

        Called each time the listening connection listens (again): the commands sent
        meanwhile are gone, but what they changed is in the registry. One read for every
        thread this node holds (an open actor) or streams: one no longer registered is
        treated as its ``deleted`` command would be (its runs running here are canceled,
        nothing of it is written, its streams end with 4404), and the paused flag of the
        others is brought up to date (a resumed thread is drained). A command heard while
        the read runs wins over what the read returned for its thread. A failed read is
        tried again (`RESYNC_RETRY_FIRST_SECONDS`, doubling) until it succeeds, the
        connection is lost again (its next listen starts a new resync) or the runtime closes.
        """
        assert self._store is not None
        generation = self._resync_generation
        delay = RESYNC_RETRY_FIRST_SECONDS
        heard: set[str] = set()
        self._resyncs.append(heard)
        try:
            while True:
                threads = sorted({a.thread_id for a in self.actors.open_actors()}
                                 | set(self.hub.subscribed_threads()))
                if not threads:
                    return
                try:
                    flags = await self.run_sync(self._store.paused_flags, threads)
                    break
                except Exception as exc:
                    log.warning("cluster: could not read back the commands other nodes may "
                                "have sent while this node was not listening (%s); trying "
                                "again in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESYNC_RETRY_MAX_SECONDS)
                if self._closing or generation != self._resync_generation:
                    return
        finally:
            self._resyncs.remove(heard)
        # A thread being created or deleted here is left to that.
        deleted = [t for t in threads if t not in flags and t not in heard
                   and self.actors.lifecycle(t) in (ThreadLifecycle.OPEN,
                                                    ThreadLifecycle.CLOSED)]
        if deleted:
            log.warning("cluster: %d thread(s) held here were deleted on another node while "
                        "this node was not listening (%s); stopping their work here",
                        len(deleted), ", ".join(deleted[:10]))
        for thread_id in deleted:
            await self._apply_command("deleted", thread_id, {"from": "resync"})
            self.hub.end_thread(thread_id)
        for thread_id, paused in flags.items():
            actor = self.actors.peek(thread_id)
            if thread_id in heard or actor is None or actor.info.paused is paused:
                continue
            actor.info = replace(actor.info, paused=paused)
            if not paused:
                self._on_alarm(thread_id)

    async def _cancel_in_store(self, actor: ThreadActor, run_id: str, canceled_by: str) -> bool:
        """Cancel a run ``running`` under this node's id that this process does not execute.

        Written in the store (fenced by its attempt) and published; the thread drains
        again. False if the run is not such a run (finished, another node's, or executing
        here). Call holding the actor's write lock.
        """
        busy = set(actor.side_runs)
        if actor.current_run is not None:
            busy.add(actor.current_run.id)
        if run_id in busy or self.executor.decided(actor, run_id) is not None:
            # Executing here, or its code ended here and the drain records its outcome
            # next (a cancel then changes nothing, as on a store of one process).
            return False
        now = self.clock.now()
        run = await self.run_sync(actor.store.get_run, run_id, now, self.settings.retention)
        if run is None or run.status is not EffectStatus.RUNNING:
            return False
        attempts = await self.run_sync(actor.store.run_attempts, run_id)
        if not attempts or attempts[-1].node_id != self.node_id:
            return False
        finish = Finish(run_id, EffectStatus.CANCELED, None, now, canceled_by=canceled_by,
                        attempt=run.attempts)
        finished, _, _ = await self.run_sync(
            partial(actor.store.finish_and_claim, claim=False,
                    retention=self.settings.retention),
            finish, now,
        )
        if finished is None:
            return False
        given_up = self._lease_abandoned.get(actor.thread_id)
        if given_up is not None:
            given_up.discard(run_id)
        self.hub.publish(RunChange.CANCELED, finished)
        self._on_alarm(actor.thread_id)  # the runs behind it
        return True

    def _lease_lost(self, why: str) -> None:
        """This node's lease may have expired: cancel every effect it runs (on the loop).

        Other nodes re-queue those runs (the attempt rule applies); whatever this node
        would record for them later is dropped by the claim's fencing.
        """
        abandoned: list[str] = []
        for actor in self.actors.open_actors():
            given_up = self.executor.abandon(actor)
            if given_up:
                self._lease_abandoned.setdefault(actor.thread_id, set()).update(given_up)
            abandoned += given_up
        if abandoned:
            log.error("node %s lost its lease (%s): canceled %d running effect(s) (runs %s); "
                      "other nodes re-queue them (or this node, once it holds its lease "
                      "again)", self.node_id, why, len(abandoned),
                      ", ".join(abandoned[:10]))
        for extension in self.extensions:  # turns: other nodes resume them
            try:
                extension.lease_lost(self, why)
            except Exception:
                log.exception("extension %s failed to stop its work as the lease was lost",
                              extension.name)

    async def _requeue_orphans_forever(self) -> None:
        period = self._lease_seconds() / 3
        failures = OutageLog(log, "looking for runs of dead nodes")
        while True:
            try:
                await self.requeue_orphans()
            except Exception as exc:  # the database blinked: the next round tries again
                failures.failed(exc)
            else:
                failures.ok()
            await asyncio.sleep(period)

    async def requeue_orphans(self) -> int:
        """Re-queue the runs nodes whose lease expired left ``running``; how many changed.

        First the threads such nodes may have changed without relaying the frame skip a
        ``seq`` (`StorageBackend.mark_dead_nodes_gaps`); last, the rows of threads whose
        deleting node stopped before removing them go (`StorageBackend.discard_orphaned_threads`).

        Each thread's runs are re-queued in its own transaction (the attempt rule applies:
        a third interrupted attempt fails the run), and the changes are published. Does
        nothing while this node does not hold its own lease (`StorageBackend.lock_problem`).
        """
        if self.storage.lock_problem() is not None or self._closing:
            return 0
        # A dead node's changes whose frames it never relayed: their threads skip a seq,
        # so subscribers see a gap and reload (`StorageBackend.mark_dead_nodes_gaps`).
        await self.run_sync(self.storage.mark_dead_nodes_gaps)
        orphans = await self.run_sync(self.storage.orphaned_runs)
        by_thread: dict[str, list[str]] = {}
        for thread_id, run_id in orphans:
            by_thread.setdefault(thread_id, []).append(run_id)
        # This node's own runs it gave up when its lease lapsed: once it holds the lease
        # again, no other node treats them as orphans, so they are re-queued here.
        own = {thread_id: by_thread.pop(thread_id, []) + sorted(run_ids)
               for thread_id, run_ids in self._lease_abandoned.items()}
        changed = 0
        for thread_id, run_ids in [*own.items(), *by_thread.items()]:
            changed += await self._requeue_thread(thread_id, run_ids, mine=thread_id in own)
        await self._discard_orphaned_threads()
        return changed

    async def _discard_orphaned_threads(self) -> None:
        """Remove the rows of deleted threads that their deleting node left (it stopped).

        The threads whose deletion this node heard of (the ``deleted`` command) between
        one and three lease periods ago are looked up by id each round (the deleting node,
        if alive, removed their rows right after its commit); every thread's store is
        looked at every `ORPHAN_SWEEP_SECONDS` (a node deaf to the command then, a
        removal that failed). A create's store is written a moment before its registry
        entry: a thread created within two lease periods is left alone.
        """
        lease = self._lease_seconds()
        now = self.clock.now()
        loop_now = asyncio.get_running_loop().time()
        heard = self._deletions_heard
        due = [t for t, at in heard.items() if at <= loop_now - lease]
        if due:
            await self.run_sync(partial(self.storage.discard_orphaned_threads,
                                        thread_ids=due, limit=len(due)), now - 2 * lease)
            for thread_id in due:  # tried at each round until 3 lease periods have passed
                if heard[thread_id] <= loop_now - 3 * lease:
                    del heard[thread_id]
        if loop_now >= self._orphan_sweep_at:
            self._orphan_sweep_at = loop_now + ORPHAN_SWEEP_SECONDS
            await self.run_sync(self.storage.discard_orphaned_threads, now - 2 * lease)

    def _lease_seconds(self) -> float:
        return float(getattr(self.storage, "lease_seconds", 30.0))

    async def _requeue_thread(self, thread_id: str, run_ids: list[str], *, mine: bool) -> int:
        """Re-queue ``run_ids`` of one thread left ``running``; how many changed.

        The runs are a dead node's, or (``mine``) the ones this node gave up when its lease
        lapsed. The attempt rule applies (a third interrupted attempt fails the run); the changes
        are published and the thread is drained if a run is pending again. A storage error
        is logged and leaves the runs for a later round.
        """
        try:
            async with self.actors.writing(thread_id) as actor:
                if mine:
                    # One still executing here (its code did not stop yet) waits for a
                    # later round: re-queued now, it could run twice.
                    busy = set(actor.side_runs)
                    if actor.current_run is not None:
                        busy.add(actor.current_run.id)
                    given_up = self._lease_abandoned.get(thread_id, set())
                    run_ids = [r for r in run_ids if r not in busy or r not in given_up]
                    if busy & given_up:
                        self._lease_abandoned[thread_id] = busy & given_up
                    else:
                        self._lease_abandoned.pop(thread_id, None)
                # Without dead_nodes_only, the runs named that this node's attempt holds
                # are re-queued too (the given-up ones are never another's).
                reason = (
                    f"node {self.node_id} lost its lease (the database could not be "
                    f"reached long enough), so it stopped the run" if mine else
                    f"its node's lease expired (the node stopped or lost the database); "
                    f"node {self.node_id} re-queued it")
                runs = await self.run_sync(
                    partial(actor.store.recover_interrupted, retention=self.settings.retention,
                            dead_nodes_only=not mine, reason=reason),
                    self.clock.now(), MAX_ATTEMPTS, run_ids,
                )
        except (ThreadNotFound, InvalidThreadId, RuntimeClosed):
            self._lease_abandoned.pop(thread_id, None)
            return 0
        except ThreadStorageError as exc:
            log.error("could not re-queue the runs of dead nodes in thread %s: %s",
                      thread_id, exc)
            return 0
        if not runs:
            return 0
        log.warning("thread %s: re-queued %d run(s) left running by a node whose lease "
                    "expired%s", thread_id, len(runs), " (this one)" if mine else "")
        await self._recovered(actor, runs)
        if any(r.status is EffectStatus.PENDING for r in runs):
            # Due now, and no timer of this node may be set for it (the dead node held the
            # thread): drain it here rather than wait for an alarm.
            self._on_alarm(thread_id)
        return len(runs)

    def _retry_drain_later(self, thread_id: str, delay: float) -> None:
        old = self._drain_retries.pop(thread_id, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            self._drain_retries.pop(thread_id, None)
            if not self._closing:
                self.dispatcher.wake(thread_id)

        self._drain_retries[thread_id] = asyncio.get_running_loop().call_later(delay, fire)

    async def _recovered(self, actor: ThreadActor, runs: list[EffectRun]) -> None:
        for run in runs:
            self._publish_recovered(run)
        pending = [r.run_at_ts for r in runs if r.status is EffectStatus.PENDING]
        if pending:
            await self.alarms.lower(actor.thread_id, min(pending))

    def _publish_recovered(self, run: EffectRun) -> None:
        change = RunChange.REQUEUED if run.status is EffectStatus.PENDING else RunChange.FAILED
        self.hub.publish(change, run)
