"""How runtime errors become HTTP answers: one mapping for every route.

Every route of `runtime.http` (the built-in API, messages, the app's thread endpoints)
answers errors through it, so one error gets one status and code wherever it surfaces.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from runtime.errors import (
    AgentNotFound,
    DatabaseUnavailable,
    EffectNotFound,
    EffectsError,
    InvalidArgument,
    InvalidDelay,
    InvalidEffectArgs,
    InvalidSchedule,
    InvalidThreadId,
    MessageNotFound,
    RunNotFound,
    RunStateError,
    RuntimeClosed,
    ScheduleNotFound,
    ThreadExists,
    ThreadNotFound,
    ThreadPaused,
    ThreadStorageError,
    TooManyImmediateRuns,
    TurnFailed,
    TurnInProgress,
    TurnLeaseLost,
    TurnRunIdConflict,
)

MAX_ERROR_MESSAGE_CHARS = 1000
"""An error message is cut to this many characters (user values in it are cut to 80 first,
see `runtime._limits.MAX_QUOTED_CHARS`; this bounds what is left, such as a list of
schema errors)."""


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The JSON error answer of the API: ``{"error": {"code", "message"}}``."""
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = message[: MAX_ERROR_MESSAGE_CHARS - 1] + "…"
    return JSONResponse(
        {"error": {"code": code, "message": message}}, status_code=status, headers=headers
    )


def runtime_error_status(exc: EffectsError) -> tuple[int, str]:
    """The HTTP status and error code for a runtime error.

    Returns:
        ``(status, code)``: 400 for a malformed id or a refused text argument, 404 for an
        unknown thread, run, schedule, effect, agent or message, 409 for a wrong state (or
        a turn already running), 413 for args over the size limit, 422 for args that fail
        the schema, a bad delay or a bad recurring schedule (cron, timezone, every),
        502 when the model failed a turn, 503 while the runtime is not running or the
        database server cannot be reached, else 500.
    """
    if isinstance(exc, InvalidThreadId):
        return 400, "invalid_thread_id"
    if isinstance(exc, InvalidArgument):
        return 400, "invalid_argument"
    if isinstance(exc, ThreadNotFound):
        return 404, "thread_not_found"
    if isinstance(exc, RunNotFound):
        return 404, "run_not_found"
    if isinstance(exc, ScheduleNotFound):
        return 404, "schedule_not_found"
    if isinstance(exc, EffectNotFound):
        return 404, "effect_not_found"
    if isinstance(exc, RunStateError):
        return 409, "run_state_conflict"
    if isinstance(exc, ThreadExists):
        return 409, "thread_exists"
    if isinstance(exc, InvalidEffectArgs):
        return (413, "args_too_large") if exc.too_large else (422, "invalid_args")
    if isinstance(exc, InvalidDelay):
        return 422, "invalid_delay"
    if isinstance(exc, InvalidSchedule):
        return 422, "invalid_schedule"
    if isinstance(exc, TurnLeaseLost):
        return 503, "turn_lease_lost"
    if isinstance(exc, DatabaseUnavailable) or (
        isinstance(exc, ThreadStorageError) and exc.unavailable
    ):
        return 503, "database_unavailable"
    if isinstance(exc, ThreadStorageError):
        return 500, "thread_storage_error"
    if isinstance(exc, RuntimeClosed):
        return 503, "shutting_down" if exc.shutting_down else "runtime_closed"
    if isinstance(exc, TooManyImmediateRuns):
        return 429, "too_many_immediate_runs"
    # Conversations (runtime/turns.py, docs/agents.md).
    if isinstance(exc, AgentNotFound):
        return 404, "agent_not_found"
    if isinstance(exc, MessageNotFound):
        return 404, "message_not_found"
    if isinstance(exc, TurnInProgress):
        return 409, "turn_in_progress"
    if isinstance(exc, TurnRunIdConflict):
        return 409, "run_id_conflict"
    if isinstance(exc, ThreadPaused):
        return 409, "thread_paused"
    if isinstance(exc, TurnFailed):
        return 502, "turn_failed"
    return 500, "runtime_error"
