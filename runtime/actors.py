"""The actor table: how a thread is created, opened, kept, evicted and deleted.

Each thread in memory is a `ThreadActor` (its open store, its write lock, the effect it
runs). The table holds at most ``max_open_threads`` of them in LRU order, opens a thread's
store on first use (single-flight: concurrent callers share one open), recovers runs a
dead process left ``running`` when it opens one, and closes idle actors beyond the limit.

A thread's lifecycle in this process is one state, `ThreadLifecycle`::

    CLOSED ──create──► CREATING ──► OPEN ◄──open (recovery)── OPENING ◄──use── CLOSED
                                     │  └──evict──► CLOSED
                                     └──delete──► DELETING ──► CLOSED (gone from the registry)

A thread in transition (creating, opening, deleting) has one `_Transition` entry; an open
one is in the LRU map; anything else is closed. An actor object that left the map
(evicted, deleted, shut down) is never used again: its `ThreadActor.state` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial

from runtime.abc import RunSync
from runtime.config import MAX_ATTEMPTS, RetentionPolicy
from runtime.effects import EffectRun
from runtime.errors import ThreadExists, ThreadNotFound, ThreadStorageError
from runtime.ids import validate_thread_id
from runtime.storage.base import Finish, RuntimeStore, StorageBackend, ThreadInfo, ThreadStore
from runtime.storage.records import process_owner_prefix

log = logging.getLogger("runtime")


class ThreadLifecycle(StrEnum):
    """Where a thread is in this process (`ActorTable.lifecycle`)."""

    CLOSED = "closed"
    """No actor in memory (never opened, evicted, or not a thread at all)."""
    CREATING = "creating"
    """Its store and registry entry are being made; the id is taken."""
    OPENING = "opening"
    """Its store is being opened and its interrupted runs recovered."""
    OPEN = "open"
    """An actor is in the table, usable."""
    DELETING = "deleting"
    """Being deleted: every use raises `ThreadNotFound`."""


class ActorState(StrEnum):
    """What an actor object is: live in the table, or why it left it."""

    OPEN = "open"
    EVICTED = "evicted"
    """Closed to make room (or at shutdown); the thread itself lives on."""
    DELETED = "deleted"
    """Its thread was deleted: nothing it does may be written."""


class ThreadActor:
    """One open thread: its store, the write lock and the effect it runs now.

    Attributes:
        info: The registry entry.
        store: The thread's open store.
        lock: Held around each store transaction (never while effect code runs), so
            effect code may schedule on its own thread without deadlocking.
        current_run: The run it executes now, if any.
        unrecorded: The outcome of its last in-line run, decided (its code ended) and not
            recorded yet: the drain records it at its next commit; if the store failed to
            (the database was unreachable), the next drain records it first, and the run
            is never executed again. A cancel meanwhile changes nothing.
        effect_task: The task running that effect's code, if any.
        immediate_runs: ``(window_start, count)``: immediate runs (delay under 1 s) its
            effects scheduled in the current one-second window (the runaway guard, `runtime.runs`).
        side_runs: The runs of concurrent effects it executes now, by id (beside
            ``current_run``), and ``side_tasks`` the tasks of their code.
        next_fire: The earliest next fire time of its active recurring schedules (None:
            none), valid while ``next_fire_known``; a drain asks the store only when it is
            unknown or due. Whoever changes the thread's schedules sets it unknown.
        users: Callers inside `ActorTable.use` (the actor is not evicted meanwhile).
        state: `ActorState.OPEN` while in the table.
    """

    def __init__(self, info: ThreadInfo, store: ThreadStore) -> None:
        self.info = info
        self.thread_id = info.id
        self.store = store
        self.lock = asyncio.Lock()
        self.current_run: EffectRun | None = None
        self.unrecorded: Finish | None = None
        self.effect_task: asyncio.Task[None] | None = None
        self.immediate_runs: tuple[float, int] = (0.0, 0)
        self.side_runs: dict[str, EffectRun] = {}
        self.side_tasks: dict[str, asyncio.Task[None]] = {}
        self.next_fire: float | None = None
        self.next_fire_known = False
        self.users = 0
        self.state = ActorState.OPEN

    @property
    def deleted(self) -> bool:
        """Whether its thread was deleted (nothing it does may be written)."""
        return self.state is ActorState.DELETED

    @property
    def busy(self) -> bool:
        """Whether the actor is running effects or holds its lock (not evictable)."""
        return (self.current_run is not None or self.unrecorded is not None
                or self.lock.locked() or bool(self.side_runs))


@dataclass
class _Transition:
    state: ThreadLifecycle
    opened: asyncio.Future[ThreadActor] | None = None


Recovered = Callable[[ThreadActor, list[EffectRun]], Awaitable[None]]
"""Called with the runs recovery changed when an actor opens (under no lock)."""


class ActorTable:
    """The LRU of open thread actors, with single-flight open and recovery on open.

    Args:
        backend: Makes, opens and removes thread stores.
        run_sync: Runs a blocking call off the event loop, ``await run_sync(fn, *args)``.
        now: The clock's ``now`` (seconds since the epoch).
        max_open: How many actors stay open (busy ones may exceed it for a while).
        pinned: Whether a thread must not be evicted even when idle (the dispatcher
            drains it).
        on_recovered: Gets the runs recovery changed (to publish and arm them).
        check_open: Raises `RuntimeClosed` unless the runtime is running.
        retention: The policy finished runs are pruned by when recovery on open writes;
            None prunes nothing.
    """

    def __init__(
        self,
        backend: StorageBackend,
        run_sync: RunSync,
        now: Callable[[], float],
        max_open: int,
        pinned: Callable[[str], bool],
        on_recovered: Recovered,
        check_open: Callable[[], None],
        *,
        retention: RetentionPolicy | None = None,
    ) -> None:
        self._check_open = check_open
        self._backend = backend
        self._run_sync = run_sync
        self._now = now
        self._max_open = max_open
        self._pinned = pinned
        self._on_recovered = on_recovered
        self._retention = retention
        self.registry: RuntimeStore | None = None
        self._open: OrderedDict[str, ThreadActor] = OrderedDict()
        self._transitions: dict[str, _Transition] = {}
        self._no_transitions = asyncio.Event()
        self._no_transitions.set()
        self._closing = False

    # ------------------------------------------------------------- transitions

    def _begin(self, thread_id: str, transition: _Transition) -> None:
        self._transitions[thread_id] = transition
        self._no_transitions.clear()

    def _end(self, thread_id: str, transition: _Transition) -> None:
        if self._transitions.get(thread_id) is transition:
            del self._transitions[thread_id]
        if not self._transitions:
            self._no_transitions.set()

    # ----------------------------------------------------------------- reading

    def lifecycle(self, thread_id: str) -> ThreadLifecycle:
        """The thread's state in this process."""
        transition = self._transitions.get(thread_id)
        if transition is not None:
            return transition.state
        return ThreadLifecycle.OPEN if thread_id in self._open else ThreadLifecycle.CLOSED

    @property
    def open_count(self) -> int:
        """How many actors are open."""
        return len(self._open)

    @property
    def opening(self) -> bool:
        """Whether some thread is being opened now."""
        return any(t.state is ThreadLifecycle.OPENING for t in self._transitions.values())

    def open_actors(self) -> list[ThreadActor]:
        """The open actors, least recently used first."""
        return list(self._open.values())

    def peek(self, thread_id: str) -> ThreadActor | None:
        """The open actor of a thread, without opening or touching the LRU order."""
        return self._open.get(thread_id)

    async def info(self, thread_id: str) -> ThreadInfo:
        """The registry entry of a thread.

        Raises:
            ThreadNotFound: not registered, or being deleted.
        """
        assert self.registry is not None
        if self.lifecycle(thread_id) is ThreadLifecycle.DELETING:
            raise ThreadNotFound(thread_id)
        info = await self._run_sync(self.registry.get_thread, thread_id)
        if info is None:
            raise ThreadNotFound(thread_id)
        return info

    # ---------------------------------------------------------------- creating

    async def create(self, info: ThreadInfo, *, alarm_at: float | None = None) -> ThreadActor:
        """Make the thread's store, register it and open its actor.

        A failure while creating leaves no store and no registry entry behind.
        ``alarm_at``: the thread's alarm row is written with its registry entry, at that
        time (seconds since the epoch, UTC; `runtime.alarms.AlarmIndex.created`).

        Raises:
            ThreadExists: the id is taken (registered, or being created or deleted).
        """
        assert self.registry is not None
        tid = info.id
        # Claimed before the first await, so a concurrent create of the same id is refused
        # instead of removing this one's store as a leftover.
        self._check_open()
        if self.lifecycle(tid) is not ThreadLifecycle.CLOSED:
            raise ThreadExists(tid)
        transition = _Transition(ThreadLifecycle.CREATING)
        self._begin(tid, transition)
        try:
            if await self._run_sync(self.registry.get_thread, tid) is not None:
                raise ThreadExists(tid)
            store = await self._run_sync(self._backend.create_thread_store, info)
            try:
                added = await self._run_sync(
                    partial(self.registry.add_thread, alarm_at=alarm_at), info
                )
            except BaseException:
                # No registry entry: the store would belong to no thread.
                await self._run_sync(self._discard_store, store, tid)
                raise
        finally:
            self._end(tid, transition)
        if not added:
            await self._run_sync(store.close)
            raise ThreadExists(tid)
        actor = ThreadActor(info, store)
        self._open[tid] = actor
        await self.evict()
        return actor

    def _discard_store(self, store: ThreadStore, thread_id: str) -> None:
        store.close()
        self._backend.remove_thread_store(thread_id)

    # ----------------------------------------------------------------- opening

    async def get(self, thread_id: str) -> ThreadActor:
        """The open actor of a thread, opening (and recovering) its store if needed.

        Raises:
            InvalidThreadId: a malformed id.
            ThreadNotFound: no such thread, or it is being deleted.
            ThreadStorageError: its store cannot be opened.
            RuntimeClosed: the runtime is not running.
        """
        self._check_open()
        validate_thread_id(thread_id)
        actor = self._open.get(thread_id)
        if actor is not None:
            self._open.move_to_end(thread_id)
            return actor
        transition = self._transitions.get(thread_id)
        if transition is not None:
            if transition.state is ThreadLifecycle.OPENING:
                assert transition.opened is not None
                return await asyncio.shield(transition.opened)
            raise ThreadNotFound(thread_id)  # deleting (or creating: not registered yet)
        future: asyncio.Future[ThreadActor] = asyncio.get_running_loop().create_future()
        transition = _Transition(ThreadLifecycle.OPENING, future)
        self._begin(thread_id, transition)
        try:
            actor = await self._open_actor(thread_id, transition)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            self._end(thread_id, transition)
        future.set_result(actor)
        return actor

    async def raise_if_unregistered(self, thread_id: str) -> None:
        """Raise `ThreadNotFound` if the registry no longer holds the thread (read now).

        For a call that found the thread's store or one of its runs gone: a deletion on
        any node (its registry entry first, then its rows) overtook it.
        """
        assert self.registry is not None
        if await self._run_sync(self.registry.get_thread, thread_id) is None:
            raise ThreadNotFound(thread_id) from None

    async def _open_actor(self, thread_id: str, transition: _Transition) -> ThreadActor:
        info = await self.info(thread_id)
        try:
            store = await self._run_sync(self._backend.open_thread_store, thread_id)
        except ThreadStorageError as exc:
            # Another node may have deleted the thread since its entry was read here, and
            # removed its store after the deletion's commit: then the call was overtaken
            # by a deletion (not found), not given a damaged thread to restore.
            if not exc.unavailable:
                await self.raise_if_unregistered(thread_id)
            raise
        try:
            # The actor did not exist, so nothing in this process runs this thread's
            # effects: a run still marked running was interrupted by a crash.
            recovered = await self._run_sync(
                partial(store.recover_interrupted, retention=self._retention,
                        reason="its process ended (a crash or restart) before it did"),
                self._now(),
                MAX_ATTEMPTS,
            )
            if self._backend.exclusive or await self._run_sync(self._backend.alone):
                # Likewise an effect-tool key held in progress by another process: that
                # process is gone, so its call is taken over at once, not after its lease.
                # (A shared backend: only while no other node is live, as another node
                # may be applying it; else the key is taken over after its lease.)
                ended = await self._run_sync(partial(
                    store.expire_effect_leases, keep_owner_prefix=process_owner_prefix(),
                    now=self._now(),
                ))
                if ended:
                    log.info("thread %s: %d effect-tool keys left in progress by a stopped "
                             "process are reconciled by their next call", thread_id, ended)
        except BaseException:
            await self._run_sync(store.close)
            raise
        if self._transitions.get(thread_id) is not transition:  # deleted meanwhile
            await self._run_sync(store.close)
            raise ThreadNotFound(thread_id)
        actor = ThreadActor(info, store)
        self._open[thread_id] = actor
        if recovered:
            await self._on_recovered(actor, recovered)
        return actor

    def use(self, thread_id: str) -> contextlib.AbstractAsyncContextManager[ThreadActor]:
        """Hold a thread's actor open (not evictable) for the duration of the block.

        ``async with actors.use(thread_id) as actor: ...``

        Raises:
            InvalidThreadId, ThreadNotFound, ThreadStorageError: as `get`.
        """
        return _Use(self._hold, self._release, thread_id)

    def writing(
        self, thread_id: str, created_at_ts: float | None = None
    ) -> contextlib.AbstractAsyncContextManager[ThreadActor]:
        """Hold a thread's actor and its write lock, for one write.

        ``async with actors.writing(thread_id) as actor: ...``

        Args:
            thread_id: The thread.
            created_at_ts: The creation time of the thread the caller means; a handle
                kept from a deleted thread must not write into a new thread with its id.

        Raises:
            ThreadNotFound: the thread was deleted (or is another thread by now).
        """
        return _Writing(self._hold, self._release, thread_id, created_at_ts)

    async def _hold(self, thread_id: str) -> ThreadActor:
        """Open a thread's actor and count one more user of it (`use`'s entry)."""
        while True:
            actor = await self.get(thread_id)
            # Between the actor being opened and this line, another task's eviction may
            # have closed it (users was still 0): take it only if it is still the live
            # one, with no await between the check and the claim.
            if self._open.get(thread_id) is actor:
                break
            if actor.deleted:
                raise ThreadNotFound(thread_id)
        actor.users += 1
        if len(self._open) > self._max_open:
            try:
                await self.evict()
            except BaseException:
                await self._release(actor)
                raise
        return actor

    async def _release(self, actor: ThreadActor) -> None:
        """One user fewer (`use`'s exit)."""
        actor.users -= 1
        # Actors that were busy when the map overflowed are closed once they are idle.
        if len(self._open) > self._max_open:
            await self.evict()

    async def evict(self) -> None:
        """Close idle actors beyond ``max_open``, least recently used first."""
        excess = len(self._open) - self._max_open
        if excess <= 0 or self._closing:
            return
        victims = [
            actor for actor in self._open.values()
            if actor.users == 0 and not actor.busy and not self._pinned(actor.thread_id)
        ][:excess]
        # Removed from the map before the first await, so concurrent evictions never pick
        # the same actor; the next use of the thread opens its store again.
        for actor in victims:
            del self._open[actor.thread_id]
            actor.state = ActorState.EVICTED
        for actor in victims:
            # Closing a WAL connection checkpoints: done off the loop.
            await self._run_sync(actor.store.close)

    # ---------------------------------------------------------------- deleting

    @contextlib.asynccontextmanager
    async def deleting(self, thread_id: str) -> AsyncIterator[ThreadActor | None]:
        """Take a thread out of use for its deletion; yields its actor if it was open.

        Inside the block the thread is `ThreadLifecycle.DELETING`: uses raise
        `ThreadNotFound`, a create of its id raises `ThreadExists`. An open in flight is
        waited for (and then refused); the actor, if any, is marked deleted and its
        running effect cancelled (unless the caller is that effect).
        """
        previous = self._transitions.get(thread_id)
        transition = _Transition(ThreadLifecycle.DELETING)
        # Replacing an opener's entry makes it close what it opened and refuse.
        self._begin(thread_id, transition)
        try:
            if previous is not None and previous.opened is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(previous.opened)
            actor = self._open.pop(thread_id, None)
            if actor is not None:
                actor.state = ActorState.DELETED
                # An effect may delete its own thread: it finishes, nothing is recorded.
                for task in (actor.effect_task, *actor.side_tasks.values()):
                    if task is not None and task is not asyncio.current_task():
                        task.cancel()
            yield actor
        finally:
            self._end(thread_id, transition)

    async def remove_store(self, thread_id: str, actor: ThreadActor | None) -> None:
        """Delete a thread's store (after its registry entry is gone)."""
        if actor is not None:
            await self._run_sync(actor.store.close)
        await self._run_sync(self._backend.remove_thread_store, thread_id)

    # ----------------------------------------------------------------- closing

    async def stop(self) -> None:
        """Shutdown begins: evict nothing more, and wait for creates, opens and deletes.

        Call it once the runtime refuses new calls (`check_open` raises): every
        transition in flight then ends (completes, or fails) before this returns, so
        no store is opened or made after `close_all`.
        """
        self._closing = True
        while self._transitions:
            await self._no_transitions.wait()

    async def close_all(self) -> None:
        """Close every open actor's store (shutdown)."""
        self._closing = True
        actors = list(self._open.values())
        self._open.clear()
        for actor in actors:
            actor.state = ActorState.EVICTED
            await self._run_sync(actor.store.close)


# `ActorTable.use` and `ActorTable.writing` are entered at least once per schedule and per
# drain: plain classes cost a fraction of an `asynccontextmanager` (no generator, no
# wrapper object per exit).


_Hold = Callable[[str], Awaitable[ThreadActor]]
"""`ActorTable._hold`: open a thread's actor and count one more user."""
_Release = Callable[[ThreadActor], Awaitable[None]]
"""`ActorTable._release`: one user fewer."""


def _deleted_meanwhile(actor: ThreadActor, exc: object) -> None:
    """Raise `ThreadNotFound` for a store call failed by a deletion meanwhile.

    The thread's store was closed under the block (by a delete here or one heard from
    another node): the caller gets what a call made after the deletion gets.
    """
    if isinstance(exc, ThreadStorageError) and actor.deleted:
        raise ThreadNotFound(actor.thread_id) from exc


class _Use:
    """`ActorTable.use`'s block."""

    __slots__ = ("_actor", "_hold", "_release", "_thread_id")

    def __init__(self, hold: _Hold, release: _Release, thread_id: str) -> None:
        self._hold = hold
        self._release = release
        self._thread_id = thread_id
        self._actor: ThreadActor | None = None

    async def __aenter__(self) -> ThreadActor:
        self._actor = await self._hold(self._thread_id)
        return self._actor

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._actor is not None
        await self._release(self._actor)
        _deleted_meanwhile(self._actor, exc_info[1])


class _Writing:
    """`ActorTable.writing`'s block: `_Use` and the actor's lock, then the identity check."""

    __slots__ = ("_actor", "_created_at_ts", "_hold", "_release", "_thread_id")

    def __init__(
        self, hold: _Hold, release: _Release, thread_id: str, created_at_ts: float | None
    ) -> None:
        self._hold = hold
        self._release = release
        self._thread_id = thread_id
        self._created_at_ts = created_at_ts
        self._actor: ThreadActor | None = None

    async def __aenter__(self) -> ThreadActor:
        actor = await self._hold(self._thread_id)
        try:
            await actor.lock.acquire()
        except BaseException:
            await self._release(actor)
            raise
        created = self._created_at_ts
        if actor.deleted or (created is not None and actor.info.created_at_ts != created):
            actor.lock.release()
            await self._release(actor)
            raise ThreadNotFound(self._thread_id)
        self._actor = actor
        return actor

    async def __aexit__(self, *exc_info: object) -> None:
        actor = self._actor
        assert actor is not None
        actor.lock.release()
        await self._release(actor)
        _deleted_meanwhile(actor, exc_info[1])
