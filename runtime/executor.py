"""How a run is executed: a thread's drain, and one effect call.

A drain (one worker, one thread) repeats, under the thread's lock: record the outcome of
the previous run and claim the next due one in one transaction (status ``running``,
``attempts + 1``); then, without the lock, validate the claimed run's args against the
effect's schema as it is now, call the effect (sync ones in a worker thread) within its
``timeout_seconds``, and turn whatever happened into the outcome to record. When nothing
is due, the thread's alarm is set to its next pending run (or removed). An effect that
raises is ``failed`` with its error text and never run again; a run interrupted by the
thread's deletion or by shutdown is left for recovery (``pending`` again, at most
`runtime.config.MAX_ATTEMPTS` attempts). So is a run whose effect raised because the
runtime refused a call while shutting down (`RuntimeClosed`): a shutdown never fails a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, cast

import anyio.to_thread
from pydantic import ValidationError

from runtime.abc import RunSync
from runtime.actors import ThreadActor
from runtime.alarms import AlarmIndex
from runtime.config import RetentionPolicy
from runtime.discovery import EffectRegistry
from runtime.effects import EffectDefinition, EffectRun, EffectStatus
from runtime.errors import EffectNotFound, RuntimeClosed
from runtime.events import RunChange
from runtime.frames import ChangeHub
from runtime.storage.base import Finish, ThreadInfo
from runtime.watchdog import describe_tool

log = logging.getLogger("runtime")

DRAIN_BATCH = 100
"""Runs a worker executes for one thread before letting other due threads go first."""

MAX_ERROR_CHARS = 8192
"""A failed run's stored error is cut to this many UTF-8 bytes (it travels in every frame)."""


class _EffectTimeout(Exception):
    """An effect overran its ``timeout_seconds``."""


class _EffectAborted(Exception):
    """An effect raised SystemExit or KeyboardInterrupt (its message is the whole error)."""


IN_EFFECT: contextvars.ContextVar[bool] = contextvars.ContextVar("in_effect", default=False)
"""True inside effect code, where waiting for the runtime to go idle would wait forever."""


class EffectExecutor:
    """Drains threads: claims their due runs, calls the effects, records the outcomes.

    Args:
        registry: The effects by name, as discovered at start (read at each run).
        now: The clock's ``now``.
        hub: Where run changes are published.
        alarms: Set to the next pending run when a drain ends.
        run_sync: Runs a blocking call off the event loop.
        make_state: Builds the `runtime.thread.ThreadState` an effect gets, from the
            thread's registry entry and the effect's package id.
        stopping: Whether shutdown began (a drain then claims nothing more).
        retention: The policy finished runs are pruned by, in the transaction that
            records an outcome; None prunes nothing.
    """

    def __init__(
        self,
        registry: Callable[[], EffectRegistry],
        now: Callable[[], float],
        hub: ChangeHub,
        alarms: AlarmIndex,
        run_sync: RunSync,
        make_state: Callable[[ThreadInfo, str | None], Any],
        stopping: Callable[[], bool],
        *,
        retention: RetentionPolicy | None = None,
    ) -> None:
        self._registry = registry
        self._now = now
        self._hub = hub
        self._alarms = alarms
        self._run_sync = run_sync
        self._make_state = make_state
        self._stopping = stopping
        self._retention = retention
        # The tasks running effect code now, for `describe_task` (the loop watchdog).
        self._running: dict[asyncio.Task[None], tuple[str, str, str]] = {}

    def describe_task(self, task: asyncio.Task[Any] | None) -> str:
        """What ``task`` is: an effect's own task, or one running a turn's tool.

        ``"effect f (thread t, run r)"``, or ``"tool t (thread x, turn run r)"``.

        Safe to call from another OS thread (the loop watchdog does).
        """
        if task is None:
            return "a callback of the event loop (not a task)"
        running = self._running.get(task)
        if running is None:
            return describe_tool(task) or f"task {task.get_name()!r}"
        name, thread_id, run_id = running
        return f"effect {name} (thread {thread_id}, run {run_id})"

    async def drain(self, actor: ThreadActor) -> bool:
        """Run the thread's due runs, one at a time, up to `DRAIN_BATCH`.

        Returns:
            True if it stopped at the batch limit with work left (wake it again).

        Raises:
            ThreadStorageError: the thread's store failed.
        """
        thread_id = actor.thread_id
        finish: Finish | None = None
        done = 0
        while True:
            async with actor.lock:
                if actor.deleted:
                    return False
                stopping = self._stopping()
                # A paused thread starts nothing; its alarm row stays, and resuming
                # wakes it (`runtime.Runtime.resume_thread`).
                paused = actor.info.paused
                stop = stopping or paused or done >= DRAIN_BATCH
                finished, claimed, next_due = await self._run_sync(
                    partial(
                        actor.store.finish_and_claim,
                        claim=not stop,
                        retention=self._retention,
                    ),
                    finish,
                    self._now(),
                )
                actor.current_run = claimed
                if actor.deleted:
                    actor.current_run = None
                    return False
                if finished is not None:
                    change = (
                        RunChange.COMPLETED
                        if finished.status is EffectStatus.COMPLETED
                        else RunChange.FAILED
                    )
                    self._hub.publish(change, finished)
                if stop:
                    # Let other due threads go first; come back to this one.
                    return not (stopping or paused)
                if claimed is None:
                    await self._alarms.settle(thread_id, next_due)
                    return False
            self._hub.publish(RunChange.STARTED, claimed)
            try:
                finish = await self.execute(actor, claimed)
            except Exception as exc:  # a bug of ours: still never leave the run running
                log.exception("run %s of thread %s: internal error", claimed.id, thread_id)
                finish = Finish(claimed.id, EffectStatus.FAILED,
                                f"Internal error running the effect: {error_text(exc)}",
                                self._now())
            if finish is None:  # interrupted: deletion or shutdown
                return False
            actor.current_run = None
            done += 1

    async def execute(self, actor: ThreadActor, run: EffectRun) -> Finish | None:
        """Run one claimed run; its outcome, or None if it was interrupted (delete/shutdown).

        Never raises for anything the effect does: whatever goes wrong becomes a failed run,
        so no run is left ``running`` behind a live worker.
        """
        try:
            defn = self._registry().resolve(run.name)
        except EffectNotFound as exc:
            return Finish(run.id, EffectStatus.FAILED, error_text(exc, bare=True), self._now())
        try:
            args = defn.schema.model_validate(run.args) if defn.schema is not None else None
        except ValidationError as exc:
            return Finish(
                run.id,
                EffectStatus.FAILED,
                f"Invalid args for effect {run.name}: {validation_summary(exc)}",
                self._now(),
            )
        except Exception as exc:  # a validator of the schema raised something else
            return Finish(run.id, EffectStatus.FAILED,
                          f"Invalid args for effect {run.name}: {error_text(exc)}",
                          self._now())
        state = self._make_state(actor.info, defn.package_id)
        task = asyncio.create_task(_call(defn, state, args), name=f"effect-{run.id}")
        actor.effect_task = task
        self._running[task] = (run.name, actor.thread_id, run.id)
        try:
            await asyncio.wait({task})
        finally:
            actor.effect_task = None
            del self._running[task]
            if not task.done():  # the worker itself was canceled (shutdown)
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if actor.deleted:
            return None
        now = self._now()
        if task.cancelled():
            # Not by us (deletion returned above, shutdown cancels the worker instead):
            # the effect raised CancelledError itself.
            return Finish(run.id, EffectStatus.FAILED,
                          "CancelledError: the effect cancelled itself", now)
        error = task.exception()
        if error is None:
            return Finish(run.id, EffectStatus.COMPLETED, None, now)
        if self._stopping() and refused_by_shutdown(error):
            # Not the effect's fault: like a crash, an interruption (pending again).
            log.info("effect %s (run %s, thread %s) was refused by the shutdown; it will "
                     "run again", run.name, run.id, actor.thread_id)
            return None
        message = error_text(error, bare=isinstance(error, _EffectTimeout))
        log.info("effect %s (run %s, thread %s) failed: %s", run.name, run.id,
                 actor.thread_id, truncate(message, 500))
        return Finish(run.id, EffectStatus.FAILED, message, now)


async def _call(defn: EffectDefinition, state: Any, args: Any) -> None:
    call_args = (state, args) if defn.schema is not None else (state,)
    IN_EFFECT.set(True)
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


def refused_by_shutdown(error: BaseException) -> bool:
    """Whether ``error`` is, was caused by, or groups a `RuntimeClosed`."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, RuntimeClosed):
            return True
        if isinstance(exc, BaseExceptionGroup):
            todo.extend(exc.exceptions)
        todo.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
    return False


def validation_summary(exc: ValidationError) -> str:
    """``"field: message; ..."`` of a pydantic validation error."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(args)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def error_text(error: BaseException, *, bare: bool = False) -> str:
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
    return truncate(message, MAX_ERROR_CHARS)


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, saying how much was cut."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return text
    kept = data[: limit - 48].decode("utf-8", "ignore")
    return f"{kept}… [{len(data) - len(kept.encode('utf-8'))} more bytes cut]"
