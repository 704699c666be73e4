"""Exceptions raised by thread-effects.

Every exception the runtime raises on purpose derives from `EffectsError`::

    EffectsError
    ├── EffectNotFound          no effect of that name (app or package)
    ├── EffectDefinitionError   a file in agents/effects/ (or a package) is not a valid effect
    ├── InvalidEffectArgs       args are not JSON, too large, or fail the effect's schema
    ├── InvalidDelay            a delay that is negative, NaN or infinite
    ├── InvalidSchedule         a recurring schedule's cron, timezone or every is not valid
    ├── InvalidThreadId         a thread id that is not ^[A-Za-z0-9_-]{1,64}$
    ├── InvalidArgument         a text argument that is not valid Unicode or over its limit
    ├── ThreadNotFound          no thread with that id
    ├── ThreadExists            create_thread with an id that is taken
    ├── DataDirLocked           another process is using the data directory
    ├── ThreadStorageError      a thread's database cannot be used (corrupt, newer schema)
    │   └── TurnLeaseLost       a turn's write refused: its turn lease moved on (fencing)
    ├── RuntimeStorageError     runtime.sqlite cannot be used (the runtime cannot start)
    ├── RunNotFound             no run with that id in the thread
    ├── RunStateError           the run is in the wrong status for the operation
    ├── ScheduleNotFound        no recurring schedule with that id in the thread
    ├── TooManyImmediateRuns    a thread's effects scheduled too many immediate runs a second
    ├── RuntimeClosed           the runtime is not running (not started or shut down)
    ├── SubscriptionOverflow    a change subscriber fell behind its bounded queue
    ├── AgentDefinitionError    a file in agents/agents|tools|hooks|api is not valid
    ├── AgentNotFound           no agent of that id (or no agent serves the thread)
    ├── MessageNotFound         no message with that id in the thread
    ├── TurnInProgress          a message was sent while the thread's turn runs
    ├── TurnRunIdConflict       a message reused the run_id of a turn with another message
    ├── ThreadPaused            a message was sent to a paused thread
    ├── TurnFailed              the model (or the agent loop) failed during a turn
    ├── ModelNotAvailable       a configured model cannot be resolved (raised at startup)
    ├── EffectKeyBusy           an effect key stayed in progress (another call) past the wait
    ├── EffectResultError       an effect tool's result is not JSON or over the size limit
    └── EffectRecordLost        completing an effect record whose lease the caller lost

`InvalidThreadId`, `InvalidArgument`, `InvalidDelay`, `InvalidSchedule`,
`InvalidEffectArgs` and `EffectResultError` are also
`ValueError`s; `EffectNotFound`, `ThreadNotFound`, `RunNotFound`, `ScheduleNotFound`,
`AgentNotFound` and `MessageNotFound` are also `LookupError`s, so callers that only know
the builtin hierarchy still catch them.
"""

from __future__ import annotations

from collections.abc import Callable


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages about user input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


class EffectsError(Exception):
    """Base class of every error the runtime raises on purpose."""


class EffectNotFound(EffectsError, LookupError):
    """No effect is registered under the requested name."""

    def __init__(self, name: str, detail: str | None = None) -> None:
        self.name = name
        # The name may come from a request: quoted cut, never echoed whole.
        message = f"Effect not found: {name if len(name) <= 80 else name[:79] + '…'}"
        if detail:
            message = f"{message} ({detail})"
        super().__init__(message)


class EffectDefinitionError(EffectsError):
    """A file that should define an effect does not (raised at startup, names the file)."""


class InvalidEffectArgs(EffectsError, ValueError):
    """Arguments for an effect are not JSON, exceed the size limit, or fail the schema."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        self.too_large = too_large
        super().__init__(message)


class InvalidThreadId(EffectsError, ValueError):
    """A thread id does not match ``^[A-Za-z0-9_-]{1,64}$``."""


class InvalidArgument(EffectsError, ValueError):
    """A text argument is refused before anything is stored.

    It is not a string, holds a lone surrogate (not valid Unicode, so it cannot be stored
    or sent as UTF-8), or is over its limit (e.g. a ``user_id`` over 256 characters, more
    than 32 tags). The message names the argument and the rule.
    """


class ThreadNotFound(EffectsError, LookupError):
    """No thread exists with the given id (never created, or deleted)."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(f"Thread not found: {thread_id[:80]}")


class ThreadStorageError(EffectsError):
    """A thread's database file cannot be used: corrupt, unreadable or from a newer version.

    Only that thread is affected; every other thread keeps running.
    """

    def __init__(self, thread_id: str, message: str, *, unavailable: bool = False) -> None:
        self.thread_id = thread_id
        self.unavailable = unavailable
        """The database server could not be reached (nothing is wrong with the thread)."""
        super().__init__(message)


class TurnLeaseLost(ThreadStorageError):
    """A turn's write was refused: the thread's turn lease is no longer the turn's.

    On a backend shared by several nodes, a turn holds its thread's turn lease and every
    write it makes carries the lease's token (its fencing token). Once the lease moved on
    (this node's lease expired and another node resumed the turn) the write is refused,
    nothing of it is stored, and the turn stops here.
    """

    def __init__(self, thread_id: str) -> None:
        super().__init__(
            thread_id,
            f"Thread {thread_id}: this turn no longer holds the thread's turn lease (it was "
            f"resumed by another node after this node's lease expired); nothing was written",
        )


class RunNotFound(EffectsError, LookupError):
    """No run with the given id exists in the thread (or it was pruned)."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        shown = run_id if len(run_id) <= 80 else f"{run_id[:79]}…"
        super().__init__(f"Run not found: {shown} in thread {thread_id}")


class RunStateError(EffectsError):
    """The run's status does not allow the operation (e.g. run-now on a completed run)."""


class ScheduleNotFound(EffectsError, LookupError):
    """No recurring schedule with the given id exists in the thread (or it was canceled)."""

    def __init__(self, thread_id: str, schedule_id: str) -> None:
        self.thread_id = thread_id
        self.schedule_id = schedule_id
        shown = schedule_id if len(schedule_id) <= 80 else f"{schedule_id[:79]}…"
        super().__init__(f"Schedule not found: {shown} in thread {thread_id}")


class TooManyImmediateRuns(EffectsError):
    """A thread's effects scheduled more immediate runs within a second than allowed.

    The guard against a runaway chain (an effect that schedules itself with no or a tiny
    delay; any delay under ``runtime.config.IMMEDIATE_RUN_SECONDS`` counts):
    the setting ``max_immediate_runs_per_second``. The message names the thread, the
    limit and the setting.
    """


class RuntimeClosed(EffectsError):
    """The runtime is not started, or is shutting down.

    Attributes:
        shutting_down: True when a shutdown refused it (new work from outside during the
            grace period, or anything after it): HTTP 503 ``shutting_down``, retry once
            the server is back; False for a runtime never started or already closed.
    """

    def __init__(self, message: str, *, shutting_down: bool = False) -> None:
        super().__init__(message)
        self.shutting_down = shutting_down


class SubscriptionOverflow(EffectsError):
    """A change subscriber did not read fast enough and its bounded queue overflowed."""


class InvalidDelay(EffectsError, ValueError):
    """A delay that is negative, NaN, infinite or not a number of seconds."""


class InvalidSchedule(EffectsError, ValueError):
    """A recurring schedule that cannot be made (the message names the argument).

    A bad ``cron`` expression, an unknown ``timezone``, an ``every`` under the minimum, or
    arguments that exclude each other.
    """


class ThreadExists(EffectsError):
    """`create_thread` was given an id that another thread already has."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(f"Thread already exists: {thread_id}")


class DataDirLocked(EffectsError):
    """Another process holds the data directory (the SQLite backend is single-process)."""


class AgentDefinitionError(EffectsError):
    """A file in ``agents/agents/``, ``tools/``, ``hooks/`` or ``api/`` is not valid.

    Raised at startup (or when the thread endpoints are mounted); the message names the file.
    """


class AgentNotFound(EffectsError, LookupError):
    """No agent has the requested id, or the thread names none and no default exists."""


class MessageNotFound(EffectsError, LookupError):
    """No message with the given id exists in the thread."""

    def __init__(self, thread_id: str, message_id: str) -> None:
        self.thread_id = thread_id
        self.message_id = message_id
        super().__init__(f"Message not found: {message_id} in thread {thread_id}")


class TurnInProgress(EffectsError):
    """A message was sent to a thread whose previous turn is still running (one at a time)."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(
            f"Thread {thread_id} is already running a turn; send the next message when it "
            f"has answered"
        )


class TurnRunIdConflict(EffectsError):
    """A message was sent with the ``run_id`` of a turn that answered another message.

    Attributes:
        run_id: The turn's run id.
    """

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        super().__init__(
            f"Turn {run_id} of thread {thread_id} was started with another message; a "
            f"run_id names one message: send a new message with a new run_id"
        )


class ThreadPaused(EffectsError):
    """A message was sent to a paused thread: a paused thread runs nothing, turns included.

    Resume the thread (``Runtime.resume_thread``, ``POST /api/threads/{id}/resume``) and
    send it again; nothing of the message was stored.
    """

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(
            f"Thread {thread_id} is paused: it runs no turn until resumed (resume it, then "
            f"send the message again; nothing was stored)"
        )


class TurnFailed(EffectsError):
    """The model or the agent loop failed during a turn (the user's message stays stored).

    Attributes:
        run_id: The failed turn's run id.
    """

    def __init__(self, thread_id: str, run_id: str, message: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        super().__init__(message)


class ModelNotAvailable(EffectsError):
    """A configured pydantic-ai model cannot be used (raised at startup, not at each turn).

    The name is malformed or unknown, its provider's package is not installed, or the
    provider refuses to start (e.g. no API key). The message names the model and who
    configured it (the ``model`` setting or an agent's file).
    """


class RuntimeStorageError(EffectsError):
    """The runtime database (``runtime.sqlite``) is unusable, so the runtime cannot start."""


class DatabaseUnavailable(RuntimeStorageError):
    """The database server (PostgreSQL) cannot be reached now; try again later (HTTP 503)."""


def database_unreachable(error: BaseException) -> bool:
    """Whether ``error`` is, was caused by, or groups an unreachable database server.

    That is a `DatabaseUnavailable` or a `ThreadStorageError` marked ``unavailable``,
    found in ``error`` itself, its ``__cause__``/``__context__`` chain or the members of an
    exception group: the runtime's own store lost its server, nothing else went wrong.
    """
    return in_chain(error, lambda exc: isinstance(exc, DatabaseUnavailable) or (
        isinstance(exc, ThreadStorageError) and exc.unavailable))


def in_chain(error: BaseException, match: Callable[[BaseException], bool]) -> bool:
    """Whether ``match`` holds for ``error`` or for any error it was caused by or groups.

    Walks the ``__cause__``/``__context__`` chain and the members of exception groups,
    each error once.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        if match(exc):
            return True
        if isinstance(exc, BaseExceptionGroup):
            todo.extend(exc.exceptions)
        todo.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
    return False


class EffectKeyBusy(EffectsError):
    """Another call held an effect key's in-progress record longer than a caller would wait.

    Attributes:
        key: The effect key.
        tool_name: The tool whose call waited.
        waited_seconds: How long the caller waited.
    """

    def __init__(self, key: str, tool_name: str, waited_seconds: float) -> None:
        self.key = key
        self.tool_name = tool_name
        self.waited_seconds = waited_seconds
        super().__init__(
            f"Tool {tool_name}: effect key {key!r} is still being applied by another call "
            f"after waiting {waited_seconds:g} s (the wait timeout); try again later"
        )


class EffectResultError(EffectsError, ValueError):
    """An effect tool's result cannot be recorded: not JSON, or over the size limit."""


class EffectRecordLost(EffectsError):
    """The caller no longer holds the in-progress record it tried to complete or release.

    Its lease expired and another call took the key over, or the record was purged.
    """
