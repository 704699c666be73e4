"""Effect definitions and the records of their runs.

An effect is a named function that runs later, outside the model's turn. Each file in
``agents/effects/`` defines one with `define_effect`; the file name is the effect name.
Each scheduled execution of an effect is a *run* (`EffectRun`), which moves through
``pending → running → completed | failed`` or ``pending → canceled``.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, overload

from pydantic import BaseModel

from runtime._limits import utc_instant
from runtime.ids import new_id as new_id  # where it was first defined

EFFECT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*\Z")
"""Effect names (and so effect file names) are snake_case."""


EffectFn = Callable[..., Awaitable[None] | None]

class EffectStatus(StrEnum):
    """Where a run is in its life: ``pending → running → completed | failed``, or canceled."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def finished(self) -> bool:
        """True for the terminal statuses (completed, failed, canceled)."""
        return self in (EffectStatus.COMPLETED, EffectStatus.FAILED, EffectStatus.CANCELED)


FINISHED_STATUSES = (EffectStatus.COMPLETED, EffectStatus.FAILED, EffectStatus.CANCELED)


@dataclass(frozen=True, slots=True)
class EffectDefinition:
    """What `define_effect` returns: an effect's description, argument schema and function.

    Attributes:
        description: One line for people (shown in the pane and in ``GET /api/effects``).
        schema: A pydantic model the run's args are validated against, or None for an
            effect without arguments (its args must then be ``None`` or ``{}``).
        fn: ``fn(state, args)`` (or ``fn(state)`` without a schema); async, or sync (which
            then runs in a worker thread).
        timeout_seconds: A run that takes longer fails with a timeout error; None = no limit.
        name: Filled in by discovery from the file name (``""`` until then).
        package_id: The package that exports the effect, or None for the app's own.
        concurrent: Its runs run beside the thread's other runs instead of one at a time.
    """

    description: str
    schema: type[BaseModel] | None
    fn: EffectFn
    timeout_seconds: float | None = None
    name: str = ""
    package_id: str | None = None
    concurrent: bool = False
    # Looked at by every run (which `_call` path to take): decided once, at definition.
    _is_async: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fn = self.fn
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - an object with `async def __call__`
        )
        object.__setattr__(self, "_is_async", is_async)

    @property
    def is_async(self) -> bool:
        """Whether ``fn`` is a coroutine function (else it runs in a worker thread)."""
        return self._is_async

    @property
    def qualified_name(self) -> str:
        """``name`` for app effects, ``"{package_id}/{name}"`` for package effects."""
        return f"{self.package_id}/{self.name}" if self.package_id else self.name

    def args_json_schema(self) -> dict[str, Any] | None:
        """The JSON schema of the args, or None for an effect without arguments."""
        return self.schema.model_json_schema() if self.schema is not None else None


@overload
def define_effect(
    description: str,
    schema: type[BaseModel],
    fn: Callable[[Any, Any], Awaitable[None] | None],  # (ThreadState, args)
    /,
    *,
    timeout_seconds: float | None = None,
    concurrent: bool = False,
) -> EffectDefinition: ...


@overload
def define_effect(
    description: str,
    fn: Callable[[Any], Awaitable[None] | None],  # (ThreadState)
    /,
    *,
    timeout_seconds: float | None = None,
    concurrent: bool = False,
) -> EffectDefinition: ...


def define_effect(
    description: str,
    schema_or_fn: Any,
    fn: Any = None,
    /,
    *,
    timeout_seconds: float | None = None,
    concurrent: bool = False,
) -> EffectDefinition:
    """Define an effect; assign the result to a module-level name in ``agents/effects/<name>.py``.

    Two forms::

        effect = define_effect("Posts a reminder.", Reminder, send_reminder)  # with args
        effect = define_effect("Cleans up.", cleanup)                        # no args

    Args:
        description: Non-empty text for people.
        schema_or_fn: The pydantic model of the args, or the function for an effect
            without arguments.
        fn: The function when a schema is given: ``fn(state: ThreadState, args: Schema)``.
        timeout_seconds: Optional run time limit in seconds (> 0); an overrunning run fails.
        concurrent: True for long work that does not depend on ordering: a run of this
            effect starts when due even while another run of the thread runs, and the
            thread's next due runs start without waiting for it. Default False: one at a
            time, in due order (the actor rule).

    Returns:
        An `EffectDefinition` (its ``name`` is set when the file is discovered).

    Raises:
        TypeError: if the schema is not a pydantic model or the function is not callable.
        ValueError: if the description is empty or the timeout is not a positive number.
        TypeError: if ``concurrent`` is not a bool.
    """
    if not isinstance(concurrent, bool):
        raise TypeError(f"define_effect: concurrent must be True or False, got {concurrent!r}")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("define_effect: description must be a non-empty string")
    schema: type[BaseModel] | None
    if fn is None:
        schema, fn = None, schema_or_fn
    else:
        schema = schema_or_fn
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise TypeError(
                f"define_effect: schema must be a pydantic BaseModel subclass, got {schema!r}"
            )
    if not callable(fn):
        raise TypeError(f"define_effect: fn must be callable, got {fn!r}")
    _check_arity(fn, 2 if schema is not None else 1)
    if timeout_seconds is not None and (
        not isinstance(timeout_seconds, int | float)
        or not math.isfinite(timeout_seconds)
        or timeout_seconds <= 0
    ):
        raise ValueError(
            f"define_effect: timeout_seconds must be a positive finite number, "
            f"got {timeout_seconds!r}"
        )
    return EffectDefinition(
        description=description.strip(),
        schema=schema,
        fn=fn,
        timeout_seconds=float(timeout_seconds) if timeout_seconds is not None else None,
        concurrent=concurrent,
    )


def _check_arity(fn: Callable[..., Any], count: int) -> None:
    """Fail at definition, not at the first run, when ``fn`` cannot take its arguments."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        signature.bind(*([None] * count))
    except TypeError:
        wanted = "(state, args)" if count == 2 else "(state)"
        raise TypeError(
            f"define_effect: {getattr(fn, '__name__', fn)!s}{signature} cannot be called as "
            f"fn{wanted}; an effect {'with' if count == 2 else 'without'} a schema takes "
            f"{count} positional argument{'s' if count == 2 else ''}"
        ) from None


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return utc_instant(ts).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class EffectRun:
    """One scheduled execution of an effect, as stored in the thread's database.

    Times are seconds since the Unix epoch (UTC) in the ``*_ts`` fields; the datetime
    properties and `to_json` give aware UTC datetimes, from 0001-01-01T00:00:00Z to
    9999-12-31T23:59:59Z (a time outside, stored before it was refused, shows as the
    nearest bound: `runtime._limits.utc_instant`).

    Attributes:
        id: The run id (32 hex characters), unique across threads.
        thread_id: The thread that owns the run.
        name: The effect name (``"{package_id}/{name}"`` for package effects).
        status: See `EffectStatus`.
        args: The JSON args as scheduled (None for an effect without arguments).
        run_at_ts: When the run is (or was) due.
        created_at_ts: When it was scheduled.
        started_at_ts: When its latest attempt started, or None.
        finished_at_ts: When it reached a terminal status, or None.
        attempts: How many times it has started (at most three).
        error: Why it failed, or None.
        replay_of: The id of the run this one replays, or None.
        key: The scheduling key (at most one pending or running run per key in a
            thread), or None.
        canceled_by: Who canceled the run (free text, such as ``"http"``), or None.
        waiting_for: Not stored: filled in by reads for a due pending run that waits
            behind the thread's running run (that run's id; on a backend shared by
            nodes, whichever node runs it, read from the database), else None.
        trace_context: The span context it was scheduled in, as W3C trace-context JSON
            text (`runtime.telemetry`), while it is pending or running; None without one
            and once it finished. Never part of `to_json`.
        schedule_id: The recurring schedule whose occurrence this run is
            (`runtime.recurrence.Schedule`), or None.
    """

    id: str
    thread_id: str
    name: str
    status: EffectStatus
    args: Any
    run_at_ts: float
    created_at_ts: float
    started_at_ts: float | None = None
    finished_at_ts: float | None = None
    attempts: int = 0
    error: str | None = None
    replay_of: str | None = None
    key: str | None = None
    canceled_by: str | None = None
    waiting_for: str | None = None
    trace_context: str | None = None
    schedule_id: str | None = None

    @property
    def run_at(self) -> datetime:
        """When the run is due, an aware UTC datetime."""
        return utc_instant(self.run_at_ts)

    @property
    def created_at(self) -> datetime:
        """When the run was scheduled, an aware UTC datetime."""
        return utc_instant(self.created_at_ts)

    def to_json(self, *, include_args: bool = False) -> dict[str, Any]:
        """The wire form (camelCase keys, ISO 8601 UTC times); args only when asked for."""
        out: dict[str, Any] = {
            "id": self.id,
            "threadId": self.thread_id,
            "name": self.name,
            "status": str(self.status),
            "runAt": _iso(self.run_at_ts),
            "createdAt": _iso(self.created_at_ts),
            "startedAt": _iso(self.started_at_ts),
            "finishedAt": _iso(self.finished_at_ts),
            "attempts": self.attempts,
            "error": self.error,
            "replayOf": self.replay_of,
            "key": self.key,
            "canceledBy": self.canceled_by,
            "waitingFor": self.waiting_for,
            "scheduleId": self.schedule_id,
        }
        if include_args:
            out["args"] = self.args
        return out


_RUN_SLOTS = {f.name: EffectRun.__dict__[f.name] for f in fields(EffectRun)}
_RUN_COPY = tuple((slot.__get__, slot.__set__) for slot in _RUN_SLOTS.values())


def replace_run(run: EffectRun, **changes: Any) -> EffectRun:
    """``dataclasses.replace(run, **changes)``, at about half its cost.

    For the copies made at every run change (a frame's run without its args, a due run
    marked as waiting): the fields are copied slot to slot, without ``__init__``
    (`EffectRun` has no ``__post_init__``), then ``changes`` are set.

    Raises:
        TypeError: a name in ``changes`` is not a field of `EffectRun`.
    """
    copy = object.__new__(EffectRun)
    for get, put in _RUN_COPY:
        put(copy, get(run))
    for name, value in changes.items():
        slot = _RUN_SLOTS.get(name)
        if slot is None:
            raise TypeError(f"EffectRun has no field {name!r}")
        slot.__set__(copy, value)
    return copy


@dataclass(frozen=True, slots=True)
class RunAttempt:
    """One attempt of a run: when it started, when and how it ended.

    Attributes:
        attempt: Its number (1 for the first).
        started_at_ts: When it started, seconds since the epoch (UTC).
        ended_at_ts: When it ended, or None while it runs.
        outcome: ``running``, ``completed``, ``failed``, ``canceled`` (the run was canceled
            while this attempt ran) or ``interrupted`` (a restart, a shutdown or its node's
            expired lease stopped it; the run went back to pending, or failed at the limit).
        error: Why it failed, or None.
        node_id: The node that ran it (`runtime.config.Settings.node_id`), or None for
            an attempt recorded before node ids existed.
    """

    attempt: int
    started_at_ts: float
    ended_at_ts: float | None
    outcome: str
    error: str | None = None
    node_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"attempt", "startedAt", "endedAt", "outcome", "error", "nodeId"}``."""
        return {
            "attempt": self.attempt,
            "startedAt": _iso(self.started_at_ts),
            "endedAt": _iso(self.ended_at_ts),
            "outcome": self.outcome,
            "error": self.error,
            "nodeId": self.node_id,
        }


def iso(ts: float | None) -> str | None:
    """Seconds since the epoch → ISO 8601 UTC with a ``Z`` suffix (None stays None)."""
    return _iso(ts)
