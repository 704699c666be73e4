"""Effect tools: a tool's side effect applies at most once per effect key.

``agents/tools/post_comment.py``::

    def key_of(args: Comment, execution) -> str:        # one comment per turn and issue
        return f"{execution.run_id}:comment:{args.issue}"

    async def find_comment(key: str, args: Comment):    # None = not applied remotely
        ...                                              # search for effect_marker(key)

    tool = define_effect_tool("Posts a comment on the issue.", Comment, post_comment,
                              effect_key=key_of, already_applied=find_comment)

**Every call** (`call_effect_tool`): the key is computed first (before ``execute``, so a
handler that mutates its args cannot change it) — ``effect_key(args, execution)`` or
`runtime.keys.default_effect_key` — then

1. a recorded result for the key is returned, and nothing runs;
2. else the key is claimed (an in-progress record under a lease); a call that finds the
   key held by another call waits for its result (``wait_timeout_seconds``, then
   `EffectKeyBusy`); an expired lease (its holder died) is taken over;
3. holding the claim, ``already_applied(key, args)`` runs if given: anything but None is
   recorded and returned;
4. else ``execute`` runs (its lease renewed every ``lease_seconds / 3`` meanwhile) and
   what it returns is recorded. A raising ``execute`` or ``already_applied`` records
   nothing (the claim is released), so a later call can still apply the effect; calls of
   this process that were waiting on the claim raise the same error and do not apply.

Results are recorded as JSON (pydantic's JSON form; at most ``max_result_bytes``), and the
first call returns the decoded JSON, exactly what a replay returns. A result that is not
JSON or is too large is an `EffectResultError` (the model sees a tool error); the effect
happened, so the key is recorded as applied with that error (``{RESULT_ERROR_FIELD:
message}``) and every later call raises it again instead of applying again. When
recording fails after the effect happened (disk full, database locked), the call still
returns the result and logs the key; ``already_applied`` guards the next call. An
``execute`` that returns an async iterator (or is an async generator) streams:
each value goes to the caller's ``emit`` as it comes, and the last one is recorded; a
replay emits only that value.

pydantic-ai is imported only by `wrap_tools_for_run` (through `runtime._effect_toolset`),
so ``import runtime`` stays light.
"""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, overload

import anyio
import anyio.lowlevel
import anyio.to_thread
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from runtime.errors import EffectKeyBusy, EffectResultError
from runtime.keys import check_effect_key, default_effect_key
from runtime.storage.records import EffectRecordStatus, EffectRecordStore, process_owner_prefix
from runtime.tools import ToolDefinition, check_tool_parts

if TYPE_CHECKING:
    from pydantic_ai.toolsets import FunctionToolset

    from runtime.thread import Execution

log = logging.getLogger("runtime.effect_tools")

EffectKeyFn = Callable[[Any, "Execution"], "str | Awaitable[str]"]
"""``effect_key(args, execution) -> str`` (sync or async); args is None without a schema."""

AlreadyAppliedFn = Callable[[str, Any], Any]
"""``already_applied(key, args)`` (sync or async): the remote result, or None."""

Emit = Callable[[Any, bool], Awaitable[None]]
"""``emit(value, replayed)``: where a streaming tool's values go as they come."""

DEFAULT_MAX_RESULT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class EffectToolSettings:
    """The limits and timings of effect tools.

    Attributes:
        lease_seconds: How long an in-progress record holds its key without a renewal (a
            running call renews it every third of it); a dead holder's is taken over after it.
        wait_timeout_seconds: How long a call waits for another call's in-progress
            record of the same key before `EffectKeyBusy`.
        poll_interval_seconds: How often a waiting call looks at the record again.
        max_result_bytes: The largest recorded result (UTF-8 JSON), default 1 MiB.
        retention_seconds: How old an applied record may grow before it is purged
            (default 30 days; ``store.purge(older_than=now - retention_seconds)``).
    """

    lease_seconds: float = 300.0
    wait_timeout_seconds: float = 60.0
    poll_interval_seconds: float = 0.05
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    retention_seconds: float = 30 * 24 * 3600.0

    def __post_init__(self) -> None:
        for name in ("lease_seconds", "wait_timeout_seconds", "poll_interval_seconds",
                     "retention_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"EffectToolSettings.{name} must be a positive number of "
                                 f"seconds, got {value!r}")
        if not (isinstance(self.max_result_bytes, int) and self.max_result_bytes > 0):
            raise ValueError(f"EffectToolSettings.max_result_bytes must be a positive integer, "
                             f"got {self.max_result_bytes!r}")


@dataclass(frozen=True, slots=True)
class EffectToolDefinition(ToolDefinition):
    """What `define_effect_tool` returns: a tool plus its effect-key hooks.

    Attributes:
        effect_key: ``effect_key(args, execution) -> str``, or None for the default key.
        already_applied: ``already_applied(key, args)``: the result of an effect found
            applied remotely, or None; None (no hook) means never looked up.
    """

    effect_key: EffectKeyFn | None = None
    already_applied: AlreadyAppliedFn | None = None


@overload
def define_effect_tool(
    description: str,
    args_schema: type[BaseModel],
    execute: Callable[[Any, Any], Any],
    /,
    *,
    effect_key: EffectKeyFn | None = None,
    already_applied: AlreadyAppliedFn | None = None,
    name: str | None = None,
) -> EffectToolDefinition: ...


@overload
def define_effect_tool(
    description: str,
    execute: Callable[[Any], Any],
    /,
    *,
    effect_key: EffectKeyFn | None = None,
    already_applied: AlreadyAppliedFn | None = None,
    name: str | None = None,
) -> EffectToolDefinition: ...


def define_effect_tool(
    description: str,
    schema_or_execute: Any,
    execute: Any = None,
    /,
    *,
    effect_key: EffectKeyFn | None = None,
    already_applied: AlreadyAppliedFn | None = None,
    name: str | None = None,
) -> EffectToolDefinition:
    """Define an effect tool: its side effect applies at most once per effect key.

    Everything `runtime.define_tool` takes, plus two optional hooks (sync or async)::

        tool = define_effect_tool("Posts a comment.", Comment, post_comment,
                                  effect_key=key_of, already_applied=find_comment)

    Args:
        description: Non-empty text telling the model what the tool does.
        schema_or_execute: The pydantic model of the arguments, or the function for a tool
            without arguments.
        execute: ``execute(state, args)``: applies the effect and returns its result
            (JSON-serializable, at most 1 MiB by default), or an async iterator of values
            whose last one is the result.
        effect_key: ``effect_key(args, execution) -> str``: the key one application is
            recorded under; build it from stable ids (the run id, an issue number), never
            from text the model wrote. Default: `runtime.default_effect_key` (one
            application per turn, tool and args).
        already_applied: ``already_applied(key, args)``: looks for the effect in the world
            (e.g. a comment carrying ``effect_marker(key)``); its non-None answer is
            recorded and returned instead of running ``execute``.
        name: The tool's name where no file names it; default: the function's name.

    Returns:
        An `EffectToolDefinition`, accepted wherever a `ToolDefinition` is.

    Raises:
        TypeError: a schema that is not a pydantic model, or a non-callable function or hook.
        ValueError: an empty description, or a name that is not snake_case.
    """
    schema, fn = check_tool_parts("define_effect_tool", description, schema_or_execute, execute,
                                  name)
    for hook_name, hook in (("effect_key", effect_key), ("already_applied", already_applied)):
        if hook is not None and not callable(hook):
            raise TypeError(f"define_effect_tool: {hook_name} must be callable, got {hook!r}")
    return EffectToolDefinition(
        description=description.strip(), args_schema=schema, execute=fn, name=name or "",
        effect_key=effect_key, already_applied=already_applied,
    )


@dataclass(frozen=True, slots=True)
class EffectToolContext:
    """The run a set of wrapped tools serves (`wrap_tools_for_run`).

    Attributes:
        run_id: The turn's run id: default keys contain it, so a new run applies again.
        agent: The agent's name.
        trigger: What started the run (e.g. ``"user_message"``, ``"effect"``).
        thread_id: The thread the records are scoped to (``""`` outside a thread).
        settings: Leases, waits and limits.
    """

    run_id: str
    agent: str = ""
    trigger: str = ""
    thread_id: str = ""
    settings: EffectToolSettings = field(default_factory=EffectToolSettings)

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ValueError(f"EffectToolContext.run_id must be a non-empty string, "
                             f"got {self.run_id!r}")


@dataclass(frozen=True, slots=True)
class ToolRunState:
    """What a tool's function gets as its state outside the runtime (`wrap_tools_for_run`).

    Inside the runtime a tool gets the thread's `ThreadState`; both have ``execution``.

    Attributes:
        execution: The run id, model step and tool call id.
        context: The run's `EffectToolContext`.
        deps: The pydantic-ai run's dependencies (``agent.run(..., deps=...)``).
    """

    execution: Execution
    context: EffectToolContext
    deps: Any = None


def _owner() -> str:
    return f"{process_owner_prefix()}{uuid.uuid4().hex[:12]}"


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _call_hook(fn: Callable[..., Any], *args: Any) -> Any:
    """A hook: awaited when async, in a worker thread when sync (it may do I/O)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    return await _maybe_await(await anyio.to_thread.run_sync(partial(fn, *args)))


def record_json(tool_name: str, value: Any, max_result_bytes: int) -> str:
    """The JSON text a tool's result is recorded as (pydantic's JSON form, compact).

    Raises:
        EffectResultError: the value is not JSON (NaN, an object pydantic cannot dump) or
            its JSON is over ``max_result_bytes``, naming the tool and the limit.
    """
    try:
        text = json.dumps(to_jsonable_python(value), allow_nan=False, ensure_ascii=False,
                          separators=(",", ":"))
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start] if isinstance(exc.object, str) else "?"
        raise EffectResultError(
            f"Tool {tool_name} returned a string with a lone surrogate (U+{ord(bad):04X}), "
            f"which is not valid Unicode and cannot be recorded as JSON (UTF-8)"
        ) from None
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise EffectResultError(
            f"Tool {tool_name} returned a value of type {type(value).__name__} that cannot be "
            f"recorded as JSON: {exc}. An effect tool returns JSON-serializable data"
        ) from None
    if size > max_result_bytes:
        raise EffectResultError(
            f"Tool {tool_name} returned {size} bytes of JSON, over the recorded-result limit "
            f"of {max_result_bytes} bytes (EffectToolSettings.max_result_bytes)"
        )
    return text


async def compute_effect_key(
    defn: EffectToolDefinition, args: BaseModel | None, execution: Execution
) -> str:
    """The effect key of a call: the tool's ``effect_key`` hook, or the default key.

    Raises:
        TypeError, ValueError: the hook returned no usable key, or the args hold a value
            canonical JSON does not support (see `runtime.keys`).
    """
    if defn.effect_key is None:
        return default_effect_key(execution.run_id, defn.tool_name, args)
    key = await _call_hook(defn.effect_key, args, execution)
    return check_effect_key(key, defn.tool_name)


async def call_effect_tool(
    defn: EffectToolDefinition,
    state: Any,
    args: BaseModel | None,
    *,
    store: EffectRecordStore,
    thread_id: str = "",
    settings: EffectToolSettings | None = None,
    emit: Emit | None = None,
) -> Any:
    """Call an effect tool once, applying its effect at most once per effect key.

    Args:
        defn: The tool.
        state: What ``execute`` gets first (a `ThreadState` or a `ToolRunState`); its
            ``execution`` gives the run id for the key.
        args: The validated arguments (None without a schema).
        store: Where records live.
        thread_id: The thread the key is scoped to.
        settings: Leases, waits and limits (defaults if None).
        emit: Receives a streaming tool's values (``replayed`` True for a recorded one).

    Returns:
        The result, decoded from the JSON it is recorded as.

    Raises:
        EffectKeyBusy: another call held the key past ``wait_timeout_seconds``.
        EffectResultError: the result is not JSON or too large (recorded as the key's
            error: a later call raises it again, never applies again).
        Exception: what ``execute``, ``already_applied`` or ``effect_key`` raised (nothing
            recorded; calls waiting on this call's claim raise it too).
    """
    settings = settings or EffectToolSettings()
    execution = state.execution
    key = await compute_effect_key(defn, args, execution)
    recorded = await store.get(thread_id, key)  # a read: the cheap path of a repeat
    if recorded is not None and recorded.status is EffectRecordStatus.APPLIED:
        return await _replay(defn, recorded.result, emit)
    slot = _slot(store, thread_id, key)
    calls = _calls.get(slot)
    if calls is None:
        calls = _calls[slot] = _KeyCalls()
    calls.count += 1
    entered = next(_sequence)
    try:
        return await _claim_and_apply(defn, state, args, key, store, thread_id, settings,
                                      emit, calls, entered)
    finally:
        calls.count -= 1
        if calls.count == 0 and _calls.get(slot) is calls:  # no entry outlives its calls
            del _calls[slot]


async def _claim_and_apply(
    defn: EffectToolDefinition, state: Any, args: BaseModel | None, key: str,
    store: EffectRecordStore, thread_id: str, settings: EffectToolSettings,
    emit: Emit | None, calls: _KeyCalls, entered: int,
) -> Any:
    tool_name = defn.tool_name
    run_id = state.execution.run_id
    owner = _owner()
    waited_since = time.monotonic()
    while True:
        calls.raise_shared(entered)
        claim = await store.begin(
            thread_id, key, tool_name=tool_name, run_id=run_id, owner=owner,
            lease_seconds=settings.lease_seconds,
        )
        if claim.applied:
            return await _replay(defn, claim.record.result, emit)
        if claim.claimed:
            if calls.shared(entered) is not None:  # it failed while this call was in flight
                with anyio.CancelScope(shield=True):
                    await store.release(thread_id, key, owner=owner)
                calls.raise_shared(entered)
            break
        waited = time.monotonic() - waited_since
        if waited >= settings.wait_timeout_seconds:
            raise EffectKeyBusy(key, tool_name, round(waited, 3))
        await calls.wait(settings.poll_interval_seconds)
    if claim.took_over:
        log.warning("tool %s: took over effect key %r from an expired lease (its holder "
                    "stopped); reconciling through already_applied", tool_name, key)
    failure: BaseException | None = None
    text, unrecordable = "", None
    try:
        async with anyio.create_task_group() as heartbeat:
            heartbeat.start_soon(_renew_lease, store, thread_id, key, owner, settings,
                                 tool_name)
            try:
                text, unrecordable = await _apply(defn, state, args, key, settings, emit)
            except BaseException as exc:  # raised below, outside the task group (no group)
                failure = exc
            heartbeat.cancel_scope.cancel()
    except BaseException as exc:  # a cancellation from outside, seen on leaving the group
        failure = failure or exc
    if failure is not None:
        if isinstance(failure, Exception):
            # Calls of this process in flight on the key share this outcome: they do not
            # apply again (a cancelled holder shares nothing: the next call applies).
            calls.fail(failure)
        with anyio.CancelScope(shield=True):
            try:
                await store.release(thread_id, key, owner=owner)
            except Exception:
                log.exception("tool %s: could not release effect key %r; it is taken over "
                              "when its lease expires", tool_name, key)
            finally:
                calls.notify()
        raise failure
    try:
        await store.complete(thread_id, key, owner=owner, result_json=text)
    except Exception:
        # The effect happened: the caller gets its result. already_applied guards a retry.
        log.exception("tool %s: the effect of key %r was applied but could not be recorded",
                      tool_name, key)
    finally:
        calls.notify()
    if unrecordable is not None:
        raise unrecordable
    return json.loads(text)


class _KeyCalls:
    """The calls of this process on one effect key now (e.g. identical calls in one step).

    They wake as soon as the holder records or releases the key (not at their next poll),
    and share a raising holder's error. Holders in other processes are seen by polling;
    their errors are not seen (a waiter there takes the released key over).
    """

    __slots__ = ("changed", "count", "failure")

    def __init__(self) -> None:
        self.count = 0
        self.changed = anyio.Event()
        self.failure: tuple[int, Exception] | None = None

    def fail(self, error: Exception) -> None:
        """A holder raised: calls that entered before now share ``error``."""
        self.failure = (next(_sequence), error)

    def shared(self, entered: int) -> Exception | None:
        """The error a call that entered at ``entered`` shares, if any."""
        if self.failure is not None and self.failure[0] > entered:
            return self.failure[1]
        return None

    def raise_shared(self, entered: int) -> None:
        error = self.shared(entered)
        if error is not None:
            raise error

    def notify(self) -> None:
        """The holder recorded or released the key: wake the waiting calls."""
        self.changed.set()
        self.changed = anyio.Event()

    async def wait(self, poll_interval_seconds: float) -> None:
        with anyio.move_on_after(poll_interval_seconds):
            await self.changed.wait()


# Scoped to the event loop (its token), the store, the thread and the key; an entry lives
# exactly as long as calls on its key are in flight.
_calls: dict[tuple[object, int, str, str], _KeyCalls] = {}
_sequence = itertools.count()
"""Orders entries of calls and failures of holders (a failure is shared with the calls
that entered before it, never with a later call)."""


def _slot(store: EffectRecordStore, thread_id: str, key: str) -> tuple[object, int, str, str]:
    return (anyio.lowlevel.current_token(), id(store), thread_id, key)


RESULT_ERROR_FIELD = "$effectResultError"
"""The one field of a recorded result that stands for an `EffectResultError`: the effect
was applied but its result could not be recorded; a replay raises the error again."""


async def _renew_lease(
    store: EffectRecordStore, thread_id: str, key: str, owner: str,
    settings: EffectToolSettings, tool_name: str,
) -> None:
    """Keep ``owner``'s in-progress lease alive while ``execute`` runs (every third of it).

    Only a holder that stopped (its process died) lets its lease expire; a slow ``execute``
    is never taken over while it runs.
    """
    interval = settings.lease_seconds / 3
    while True:
        await anyio.sleep(interval)
        try:
            renewed = await store.renew(thread_id, key, owner=owner,
                                        lease_seconds=settings.lease_seconds)
        except Exception:
            log.exception("tool %s: could not renew the lease of effect key %r", tool_name,
                          key)
            continue
        if not renewed:
            log.warning("tool %s: lost the lease of effect key %r while applying it",
                        tool_name, key)
            return


async def _replay(defn: ToolDefinition, result: Any, emit: Emit | None) -> Any:
    if isinstance(result, dict) and len(result) == 1 and RESULT_ERROR_FIELD in result:
        raise EffectResultError(f"{result[RESULT_ERROR_FIELD]} (recorded when the effect was "
                                f"applied; it is not applied again)")
    if emit is not None and _streams(defn):
        await emit(result, True)
    return result


def _streams(defn: ToolDefinition) -> bool:
    return inspect.isasyncgenfunction(defn.execute)


async def _apply(
    defn: EffectToolDefinition, state: Any, args: BaseModel | None, key: str,
    settings: EffectToolSettings, emit: Emit | None,
) -> tuple[str, EffectResultError | None]:
    """Reconcile, else execute: the JSON text to record, and the error a caller gets.

    The effect has happened once this returns: a result that cannot be recorded becomes a
    recorded error (``{RESULT_ERROR_FIELD: message}``) returned with its
    `EffectResultError`, so a retry raises it again and never applies again.
    """
    tool_name = defn.tool_name
    if defn.already_applied is not None:
        found = await _call_hook(defn.already_applied, key, args)
        if found is not None:
            text, error = _recordable(tool_name, found, settings.max_result_bytes)
            if error is None and emit is not None and _streams(defn):
                await emit(json.loads(text), True)
            return text, error
    call_args = (state, args) if defn.args_schema is not None else (state,)
    if inspect.isasyncgenfunction(defn.execute):
        result: Any = defn.execute(*call_args)
    else:
        result = await defn.call(state, args)
    if isinstance(result, AsyncIterator) or hasattr(result, "__aiter__"):
        try:
            result = await _drain(tool_name, result, emit)
        except EffectResultError as exc:  # it streamed nothing, yet it ran to its end
            return _error_json(exc), exc
    return _recordable(tool_name, result, settings.max_result_bytes)


def _recordable(tool_name: str, value: Any, max_result_bytes: int
                ) -> tuple[str, EffectResultError | None]:
    try:
        return record_json(tool_name, value, max_result_bytes), None
    except EffectResultError as exc:
        return _error_json(exc), exc


def _error_json(error: EffectResultError) -> str:
    return json.dumps({RESULT_ERROR_FIELD: str(error)}, ensure_ascii=True)


async def _drain(tool_name: str, values: Any, emit: Emit | None) -> Any:
    last: Any = None
    seen = False
    async for value in values:
        last, seen = value, True
        if emit is not None:
            await emit(value, False)
    if not seen:
        raise EffectResultError(f"Tool {tool_name} streamed no value; a streaming effect tool "
                                f"yields at least one (the last is its result)")
    return last


def wrap_tools_for_run(
    tools: Sequence[Any],
    ctx: EffectToolContext,
    store: EffectRecordStore,
) -> FunctionToolset[Any]:
    """The tools as a pydantic-ai toolset for one run, effect tools wrapped as in the runtime.

    ``Agent(model, toolsets=[wrap_tools_for_run(tools, ctx, store)])``: effect tools apply
    at most once per effect key in ``store``; plain tool definitions run unchanged
    (pydantic-ai ``Tool`` objects are taken as they are). A tool's function gets a
    `ToolRunState` (or, when the run's deps are a `ThreadState`, that state with its
    ``execution`` set). A streaming tool's values are emitted into the run's event stream
    as ``runtime.effect_tools.EffectToolValue`` events. Failures reach the model as tool
    errors (pydantic-ai's ``ToolFailed``), as inside the runtime.

    Args:
        tools: Tool definitions (`define_tool`, `define_effect_tool`), each with a name
            (``name=`` or its function's name), no two alike.
        ctx: The run: its id, agent, trigger, thread and settings.
        store: Where effect records live: `InMemoryEffectStore`, `SqliteEffectStore`, or
            a thread's own store.

    Returns:
        A pydantic-ai ``FunctionToolset``.

    Raises:
        TypeError: an entry that is not a tool definition.
        ValueError: a tool without a usable name, or two tools with one name.
    """
    from runtime._effect_toolset import build_toolset

    return build_toolset(list(tools), ctx, store)


def __getattr__(name: str) -> Any:
    """``EffectToolValue`` (the event a streaming tool's values travel in) loads pydantic-ai.

    It subclasses pydantic-ai's ``CustomEvent``, so it is defined in `runtime._effect_toolset`
    and reached here lazily: ``from runtime.effect_tools import EffectToolValue``.
    """
    if name == "EffectToolValue":
        from runtime._effect_toolset import EffectToolValue

        return EffectToolValue
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
