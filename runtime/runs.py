"""Run operations: schedule, cancel, run now, replay, read and list a thread's runs.

What `runtime.thread.ThreadState` (and so the HTTP API, tools and effects) does to runs.
Every write takes the thread's lock, and a schedule or a run-now lowers the thread's
durable alarm *before* its run row commits, so a crash between the two leaves a spurious
wake-up, never a run without an alarm.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from runtime._limits import (
    check_args_depth,
    delay_seconds,
    parse_run_cursor,
    quoted,
    run_at_seconds,
    validate_args,
)
from runtime._text import check_text, find_invalid_text
from runtime.abc import RunSync
from runtime.actors import ActorTable, ThreadActor
from runtime.alarms import AlarmIndex
from runtime.config import IMMEDIATE_RUN_SECONDS, Settings
from runtime.discovery import EffectRegistry
from runtime.effects import EffectDefinition, EffectRun, EffectStatus, RunAttempt, replace_run
from runtime.errors import (
    EffectNotFound,
    InvalidArgument,
    InvalidDelay,
    InvalidEffectArgs,
    RunNotFound,
    RunStateError,
    ThreadNotFound,
    TooManyImmediateRuns,
    short_repr,
)
from runtime.events import RunChange
from runtime.executor import CURRENT_RUN, IN_EFFECT, EffectExecutor, error_text
from runtime.frames import ChangeHub
from runtime.ids import new_id
from runtime.storage.base import RuntimeStore, ThreadStore
from runtime.telemetry import capture_context
from runtime.thread import RunPage, Scheduled

if TYPE_CHECKING:
    from runtime.thread import ThreadState

MAX_PAGE = 500
"""Largest page of runs or threads."""

MAX_KEY_CHARS = 256
"""Longest scheduling key, in characters."""

MAX_CANCELED_BY_CHARS = 256
"""Longest ``canceled_by`` text, in characters."""

CANCEL_WAIT_SECONDS = 5.0
"""How long canceling a running run waits for its effect to stop before answering."""

CANCEL_RESEND_SECONDS = 1.0
"""While a cancel waits for another node to cancel a run it runs, the request is sent again
this often: a node whose listening connection was down when it was first sent gets it once
it listens again (within the wait)."""


def check_limit(limit: int) -> None:
    """Raise ValueError unless ``limit`` is an integer from 1 to `MAX_PAGE`."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")


def parse_statuses(
    status: EffectStatus | str | list[EffectStatus | str] | None,
) -> list[EffectStatus] | None:
    """One status or a list of them as `EffectStatus` values; None stays None.

    Raises:
        ValueError: an unknown status (names it and the choices).
    """
    if status is None:
        return None
    raw = [status] if isinstance(status, str) else list(status)
    allowed = {s.value for s in EffectStatus}
    for value in raw:
        if value not in allowed:
            raise ValueError(
                f"Unknown status {quoted(value)}; one of: "
                f"{', '.join(s.value for s in EffectStatus)}"
            )
    return [EffectStatus(s) for s in raw]


_ARGS_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))
"""How args are written (what ``json.dumps`` with these options builds at every call)."""

_SCALARS = frozenset({str, int, float, bool, type(None)})


def _flat_json_object(args: Any) -> bool:
    """Whether ``args`` is a dict of str keys to str, int, float, bool or None values.

    Such args nest one level (no depth walk needed) and decode from their JSON text to an
    equal dict (exact types only: a subclass may dump differently), so the schedule skips
    the walk and the decode.
    """
    if type(args) is not dict:
        return False
    scalars = _SCALARS
    for key, value in args.items():
        if type(key) is not str or type(value) not in scalars:
            return False
    return True


class RunOperations:
    """The run operations of every thread (the interface `ThreadState` calls).

    Args:
        settings: The runtime's settings (args size limit, retention).
        registry: The effects by name (read at each call: discovered at start).
        actors: The actor table.
        alarms: The durable alarm index.
        hub: Where run changes are published.
        run_sync: Runs a blocking call off the event loop.
        now: The clock's ``now``.
        check_open: Raises `RuntimeClosed` unless the runtime is running.
        executor: Cancels running runs (None: only pending runs can be canceled).
        run_short: Runs the store call that records a schedule (`Runtime.run_short`: on
            the loop when the backend says it is cheap); ``run_sync`` when None.
        cancel_elsewhere: With a backend shared by several processes: asks the node
            running a run to cancel it, ``await cancel_elsewhere(actor, run_id,
            canceled_by)``; True if the run is running on another node (which was asked).
    """

    def __init__(
        self,
        settings: Settings,
        registry: Callable[[], EffectRegistry],
        actors: ActorTable,
        alarms: AlarmIndex,
        hub: ChangeHub,
        run_sync: RunSync,
        now: Callable[[], float],
        check_open: Callable[[], None],
        executor: EffectExecutor | None = None,
        run_short: RunSync | None = None,
        cancel_elsewhere: Callable[[ThreadActor, str, str], Awaitable[bool]] | None = None,
        shared: bool = False,
        deleted_elsewhere: Callable[[str], None] | None = None,
    ) -> None:
        self._cancel_elsewhere = cancel_elsewhere
        self._deleted_elsewhere = deleted_elsewhere
        self._shared = shared
        self._settings = settings
        self._registry = registry
        self._actors = actors
        self._alarms = alarms
        self._hub = hub
        self._run_sync = run_sync
        self._run_short = run_short or run_sync
        self._now = now
        self._check_open = check_open
        self._executor = executor

    def encode_args(self, defn: EffectDefinition, args: Any) -> Any:
        """The args as they are stored: JSON, within the size limit, passing the schema.

        Raises:
            InvalidEffectArgs: not JSON, not valid Unicode, over ``max_args_bytes``, or
                failing the effect's schema (names the effect and the problem).
        """
        name = defn.qualified_name
        if isinstance(args, BaseModel):
            try:
                args = args.model_dump(mode="json")
            except Exception as exc:
                raise InvalidEffectArgs(
                    f"Args for effect {name} cannot be turned into JSON: {error_text(exc)}"
                ) from None
        if args is None and defn.schema is not None:
            args = {}  # a schema whose fields all have defaults needs no args
        flat = _flat_json_object(args)
        if not flat:
            check_args_depth(name, args)
        try:
            text = _ARGS_ENCODER.encode(args)
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
        limit = self._settings.max_args_bytes
        if size > limit:
            raise InvalidEffectArgs(
                f"Args for effect {name} are {size} bytes of JSON; the limit is {limit} bytes",
                too_large=True,
            )
        # Decoding the text gives what is stored (tuples become lists, keys strings...);
        # for an object of plain scalars that is a copy of it (floats are finite here).
        value = dict(args) if flat else json.loads(text)
        if defn.schema is None:
            if value not in (None, {}):
                raise InvalidEffectArgs(
                    f"Effect {name} takes no arguments, got {text[:200]}"
                )
            return None
        validate_args(defn.schema, value, name)
        return value

    async def schedule(
        self,
        state: ThreadState,
        name: str,
        args: Any,
        delay: object,
        *,
        key: str | None = None,
        at: datetime | None = None,
        replay_of: str | None = None,
        replay_once: bool = False,
    ) -> Scheduled:
        """See `ThreadState.schedule`; ``replay_of`` links a replay to its original.

        ``replay_once``: store nothing if a run already replays ``replay_of`` (that run's
        id is returned, ``created`` False), checked in the thread's transaction.
        """
        self._check_open()
        if not isinstance(name, str):
            raise EffectNotFound(short_repr(name))
        defn = self._registry().resolve(name, package_id=state.package_id)
        seconds = delay_seconds(delay)
        at_ts: float | None = None
        if at is not None:
            if seconds:
                raise InvalidDelay("give either delay or at, not both")
            at_ts = run_at_seconds(at, self._now())
        if key is not None:
            check_text(key, "key", max_chars=MAX_KEY_CHARS)
            if not key:
                raise InvalidArgument("key must not be empty (None means no key)")
        stored_args = self.encode_args(defn, args)
        # A state kept from a deleted thread (an abandoned sync effect, say) must not
        # write into a new thread that reuses the id.
        async with self._actors.writing(state.thread_id, state.info.created_at_ts) as actor:
            now = self._now()
            delay = seconds if at_ts is None else at_ts - now
            if delay < IMMEDIATE_RUN_SECONDS and IN_EFFECT.get():
                self._count_immediate(actor, now)
            run = EffectRun(
                id=new_id(),
                thread_id=state.thread_id,
                name=defn.qualified_name,
                status=EffectStatus.PENDING,
                args=stored_args,
                run_at_ts=now + seconds if at_ts is None else at_ts,
                created_at_ts=now,
                replay_of=replay_of,
                key=key,
                # The span this schedule happens in (a turn, a tool call, an HTTP request,
                # an effect): the run's attempts are its children, even after a restart.
                trace_context=capture_context(),
            )
            # The alarm first: a crash between the two writes leaves a spurious alarm,
            # never a run without one (and a key already taken, a harmless early wake-up).
            await self._alarms.lower(state.thread_id, run.run_at_ts)
            current = CURRENT_RUN.get()
            hand_off = current[1] if current and current[0] == state.thread_id else None
            try:
                existing = await self._run_short(
                    partial(actor.store.insert_run, hand_off_from=hand_off,
                            replay_once=replay_once), run
                )
            except ThreadNotFound:
                # Deleted by another node, whose command this one missed: applied here
                # now (once this lock is free), as the command would have been.
                if self._deleted_elsewhere is not None:
                    self._deleted_elsewhere(state.thread_id)
                raise
            # The number its frame took in the same transaction (PostgreSQL), read before
            # the lock lets another call use the store.
            seq = actor.store.frame_seq
        if existing is not None:
            return Scheduled(existing.id, created=False)
        if defn.concurrent and self._executor is not None:
            self._executor.poke(state.thread_id)  # it need not wait for a running run
        # Due at once behind a running run: the frame says so, as a listing would (one
        # copy of the run for both: marked, and without its args).
        shown = self._behind(run, actor.current_run, self._now(), bare=True)
        self._hub.publish(RunChange.SCHEDULED, shown, seq)
        return Scheduled(run.id, created=True)

    def _waiting(
        self, actor: ThreadActor, runs: list[EffectRun], now: float,
        stored: EffectRun | None = None,
    ) -> list[EffectRun]:
        """``runs``, each due pending one marked with the running run it waits behind.

        That run is the one this node runs in the thread, else ``stored`` (`_stored_running`:
        one another node runs). Runs of concurrent effects wait for nothing.
        """
        current = actor.current_run or stored
        if current is None:
            return runs
        return [self._behind(run, current, now) for run in runs]

    def _behind(
        self, run: EffectRun, current: EffectRun | None, now: float, *, bare: bool = False
    ) -> EffectRun:
        """``run`` marked as waiting behind ``current``, or ``run`` as it is.

        Marked when it is due and pending, and not of a concurrent effect (which waits for
        nothing). ``bare``: without its args too (a frame's run), in the same copy.
        """
        strip = {"args": None} if bare and run.args is not None else {}
        if (
            current is not None
            and current.id != run.id  # read pending, then running: it waits for nothing
            and run.status is EffectStatus.PENDING
            and run.run_at_ts <= now
            and not self._concurrent(run.name)
        ):
            return replace_run(run, waiting_for=current.id, **strip)
        return replace_run(run, **strip) if strip else run

    async def mark_waiting(
        self, store: RuntimeStore, runs: list[EffectRun], now: float
    ) -> list[EffectRun]:
        """``runs`` of any threads, each due pending one marked as `_waiting` marks it.

        For listings across threads: a thread this node runs a run of has its actor open
        (`ActorTable.peek`), a dictionary look-up per due pending run of the page. With a
        backend shared by nodes, the other threads of due pending runs are looked up in
        ``store`` (`RuntimeStore.running_runs`, one read): a run another node runs.
        """
        waiting: dict[str, EffectRun] = {}
        ask: list[str] = []
        for run in runs:
            if run.status is EffectStatus.PENDING and run.run_at_ts <= now:
                actor = self._actors.peek(run.thread_id)
                if actor is not None and actor.current_run is not None:
                    waiting[run.thread_id] = actor.current_run
                elif self._shared and run.thread_id not in ask:
                    ask.append(run.thread_id)
        if ask:
            found = await self._run_sync(
                store.running_runs, ask, now, self._settings.retention
            )
            for running in found:
                if not self._concurrent(running.name):
                    waiting.setdefault(running.thread_id, running)
        return [self._behind(run, waiting.get(run.thread_id), now) for run in runs]

    def _stored_running(self, store: ThreadStore, now: float) -> EffectRun | None:
        """The thread's running run (not of a concurrent effect) as stored.

        Whichever node runs it; None without a backend shared by nodes (there this
        node's actor knows). Called in a worker thread.
        """
        if not self._shared:
            return None
        runs, _ = store.list_runs(
            now, self._settings.retention, statuses=[EffectStatus.RUNNING], limit=50
        )
        return next((r for r in runs if not self._concurrent(r.name)), None)

    def _concurrent(self, name: str) -> bool:
        try:
            return self._registry().resolve(name).concurrent
        except EffectNotFound:
            return False

    def _count_immediate(self, actor: ThreadActor, now: float) -> None:
        """Count an immediate run (delay under 1 s) scheduled by an effect; refuse one too many."""
        limit = self._settings.max_immediate_runs_per_second
        if limit is None:
            return
        start, count = actor.immediate_runs
        if not 0 <= now - start < 1.0:
            start, count = now, 0
        if count >= limit:
            raise TooManyImmediateRuns(
                f"Thread {actor.thread_id}: its effects scheduled more than {limit} "
                f"immediate runs (delay under {IMMEDIATE_RUN_SECONDS:g} s) within one second "
                f"(setting max_immediate_runs_per_second={limit}); a runaway chain? Schedule "
                f"with a delay of {IMMEDIATE_RUN_SECONDS:g} s or more, pause the thread, or "
                f"raise the setting"
            )
        actor.immediate_runs = (start, count + 1)

    async def pending(self, thread_id: str, name: str | None) -> list[EffectRun]:
        """See `ThreadState.get_scheduled_effects`."""
        self._check_open()
        async with self._actors.use(thread_id) as actor:
            runs: list[EffectRun] = await self._run_sync(actor.store.pending_runs, name)
            return self._waiting(actor, runs, self._now())

    async def cancel(self, thread_id: str, run_id: str, canceled_by: str) -> bool:
        """See `ThreadState.remove_scheduled_effect`."""
        self._check_open()
        check_text(canceled_by, "canceled_by", max_chars=MAX_CANCELED_BY_CHARS)
        run_id = str(run_id)
        asked_at = self._now()
        task = None
        asked = False
        async with self._actors.writing(thread_id) as actor:
            run = await self._run_sync(
                partial(
                    actor.store.cancel,
                    retention=self._settings.retention,
                    canceled_by=canceled_by,
                ),
                run_id,
                self._now(),
            )
            if run is None and self._executor is not None:
                asked, task = self._executor.cancel_running(actor, run_id, canceled_by)
            elsewhere = False
            if run is None and not asked and self._cancel_elsewhere is not None:
                # Running on another node, maybe: that node is told to cancel it.
                asked = elsewhere = await self._cancel_elsewhere(actor, run_id, canceled_by)
            if run is None and not asked:
                # A concurrent cancel (on this node or another) may have ended it since
                # this one was asked: that answers True as well.
                asked = await self._canceled_since(actor, run_id, asked_at)
        if run is not None:
            self._hub.publish(RunChange.CANCELED, run)
            return True
        if elsewhere:
            # True only once the run is canceled in the store (the node running it may
            # no longer execute it, or let it finish).
            return await self._canceled_in_store(thread_id, run_id, canceled_by)
        if task is None:
            return asked  # asked before its code started: it never will
        if task is not asyncio.current_task():  # an effect canceling itself goes on
            # Give the effect its next await to stop; one that ignores the cancellation
            # is not waited for longer.
            await asyncio.wait({task}, timeout=CANCEL_WAIT_SECONDS)
        return True

    async def _canceled_since(self, actor: ThreadActor, run_id: str, asked_at: float) -> bool:
        """Whether ``run_id`` ended ``canceled`` after ``asked_at`` (seconds, UTC)."""
        run = await self._run_sync(actor.store.get_run, run_id, self._now(),
                                   self._settings.retention)
        if run is None:
            await self._actors.raise_if_unregistered(actor.thread_id)
        return (run is not None and run.status is EffectStatus.CANCELED
                and run.finished_at_ts is not None and run.finished_at_ts > asked_at)

    async def _canceled_in_store(self, thread_id: str, run_id: str, canceled_by: str) -> bool:
        """Wait up to `CANCEL_WAIT_SECONDS` (plus a second) for ``run_id`` to end; canceled?

        The node running it is asked again every `CANCEL_RESEND_SECONDS` meanwhile.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_WAIT_SECONDS + 1.0
        resend_at = loop.time() + CANCEL_RESEND_SECONDS
        delay = 0.01
        while True:
            async with self._actors.use(thread_id) as actor:
                run = await self._run_sync(actor.store.get_run, run_id, self._now(),
                                           self._settings.retention)
            if run is None:
                await self._actors.raise_if_unregistered(thread_id)
            if run is None or run.status is not EffectStatus.RUNNING:
                return run is not None and run.status is EffectStatus.CANCELED
            if loop.time() >= deadline:
                return False
            if loop.time() >= resend_at and self._cancel_elsewhere is not None:
                resend_at = loop.time() + CANCEL_RESEND_SECONDS
                async with self._actors.writing(thread_id) as actor:
                    await self._cancel_elsewhere(actor, run_id, canceled_by)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    async def get_run(self, thread_id: str, run_id: str) -> EffectRun:
        """See `ThreadState.get_run`."""
        self._check_open()
        async with self._actors.use(thread_id) as actor:
            now = self._now()

            def read(store: ThreadStore) -> tuple[EffectRun | None, EffectRun | None]:
                run = store.get_run(str(run_id), now, self._settings.retention)
                due = run is not None and run.status is EffectStatus.PENDING and (
                    run.run_at_ts <= now)
                return run, self._stored_running(store, now) if due else None

            run, stored = await self._run_sync(read, actor.store)
            if run is None:
                raise RunNotFound(thread_id, str(run_id))
            return self._waiting(actor, [run], now, stored)[0]

    async def attempts(self, thread_id: str, run_id: str) -> list[RunAttempt]:
        """See `ThreadState.get_run_attempts`."""
        self._check_open()
        async with self._actors.use(thread_id) as actor:
            run = await self._run_sync(
                actor.store.get_run, str(run_id), self._now(), self._settings.retention
            )
            if run is None:
                raise RunNotFound(thread_id, str(run_id))
            found: list[RunAttempt] = await self._run_sync(actor.store.run_attempts, run.id)
            return found

    async def run_now(self, thread_id: str, run_id: str) -> EffectRun:
        """See `ThreadState.run_now`."""
        self._check_open()
        async with self._actors.writing(thread_id) as actor:
            now = self._now()

            def read(store: ThreadStore) -> tuple[EffectRun | None, EffectRun | None]:
                run = store.get_run(run_id, now, self._settings.retention)
                pending = run is not None and run.status is EffectStatus.PENDING
                return run, self._stored_running(store, now) if pending else None

            current, stored = await self._run_sync(read, actor.store)
            if current is None:
                raise RunNotFound(thread_id, run_id)
            running = actor.current_run or stored
            if running is not None and running.id == run_id:
                # Claimed (here or on another node) between the two reads of `read`: it
                # is running now, and waits for nothing.
                current = running
            if current.status is not EffectStatus.PENDING:
                raise RunStateError(
                    f"Run {run_id} is {current.status}; only a pending run can be run now"
                )
            if running is not None and not self._concurrent(current.name):
                raise RunStateError(
                    f"Run {run_id} cannot run now: it waits for run {running.id} "
                    f"({running.name}), which is running; this thread runs its runs one "
                    f"at a time (waitingFor: {running.id})"
                )
            await self._alarms.lower(thread_id, now)
            run = await self._run_sync(actor.store.run_now, run_id, now)
            if run is None:
                # No longer pending: another node (or this node's executor) started,
                # canceled or deleted it since the read above.
                current = await self._run_sync(
                    actor.store.get_run, run_id, self._now(), self._settings.retention
                )
                if current is None:
                    raise RunNotFound(thread_id, run_id)
                raise RunStateError(
                    f"Run {run_id} is {current.status}; only a pending run can be run now"
                )
        if self._executor is not None and self._concurrent(run.name):
            self._executor.poke(thread_id)
        self._hub.publish(RunChange.RESCHEDULED, run)
        return run

    async def replay(self, state: ThreadState, run_id: str, *, once: bool = False) -> str:
        """See `ThreadState.replay`."""
        return (await self.replay_scheduled(state, run_id, once=once)).run_id

    async def replay_scheduled(
        self, state: ThreadState, run_id: str, *, once: bool = False
    ) -> Scheduled:
        """`replay`, saying also whether a run was stored.

        Returns:
            The run's id, and ``created``: False when ``once`` found a run replaying
            ``run_id`` already (its id is the one given).
        """
        original = await self.get_run(state.thread_id, run_id)
        if not original.status.finished:
            raise RunStateError(
                f"Run {run_id} is {original.status}; only a finished run "
                f"(completed, failed or canceled) can be replayed"
            )
        plain = state.with_context(execution=state.execution, package_id=None)
        scheduled = await self.schedule(
            plain, original.name, original.args, 0, replay_of=original.id, replay_once=once
        )
        return scheduled

    async def list_runs(
        self,
        thread_id: str,
        status: EffectStatus | str | list[EffectStatus | str] | None,
        name: str | None,
        limit: int,
        cursor: str | None,
    ) -> RunPage:
        """See `ThreadState.list_runs`."""
        self._check_open()
        check_limit(limit)
        statuses = parse_statuses(status)
        before: int | None = None
        if cursor is not None:
            before = parse_run_cursor(cursor)
        now = self._now()
        retention = self._settings.retention

        def read(store: Any) -> tuple[list[EffectRun], int | None, Any, EffectRun | None]:
            runs, nxt = store.list_runs(
                now, retention, statuses=statuses, name=name, limit=limit, before_seq=before
            )
            due = any(r.status is EffectStatus.PENDING and r.run_at_ts <= now for r in runs)
            return (runs, nxt, store.count_runs(now, retention, name=name),
                    self._stored_running(store, now) if due else None)

        async with self._actors.use(thread_id) as actor:
            runs, nxt, counts, stored = await self._run_sync(read, actor.store)
            runs = self._waiting(actor, runs, now, stored)
        return RunPage(runs, str(nxt) if nxt is not None else None, counts)
