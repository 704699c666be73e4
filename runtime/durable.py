"""Durable turns outside the runtime: a drop-in for pydantic-ai's ``agent.run``.

``run_durable(agent, prompt, run_id=..., journal=...)`` runs an ordinary pydantic-ai
``Agent`` through its public interface, as pydantic-ai's own durable integrations
(Temporal, DBOS, Prefect) do: the model is wrapped so every model response is journaled
per step, and every toolset is wrapped so every tool call is journaled by the model's
``tool_call_id``. Called again with the same run id after a crash, the run replays what
finished — journaled model responses without a model request, finished tool calls with
their journaled output and without running — and continues from the first unfinished
step.

The journal is the effect tools' record store (`runtime.storage.records`): one record per
model step and per tool call, in progress while it runs, then **succeeded** (the output),
**failed** (the error; the next attempt runs the call again) or **denied** (a call the
user refused). `InMemoryJournal` keeps it in memory (tests), `SqliteJournal` in a SQLite
file; `Journal(store, thread_id=...)` puts it in any `EffectRecordStore`.

`durable_tool` changes what "the same call" means for one tool: ``idempotency="args"``
keys it on a type-tagged hash of its arguments (`runtime.keys.args_hash`), and
``idempotency_key=fn`` on a logical id, once per ``idempotency_window``: ``"run"`` (this
run and every sub-agent run under it), ``"thread"`` (the journal's thread) or
``"cross-run"`` (every thread of the journal's store, until purged).

One attempt of a run at a time: an attempt that finds a call in progress under an
earlier attempt of the same run takes it over (that attempt is taken to be dead) and runs
the call again. Between a tool's side effect and its record there is a window; a crash in
it runs the tool once more on resume (see docs/durable-turns.md for closing it).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic_ai import (
    ApprovalRequired,
    CallDeferred,
    CustomEvent,
    ModelMessagesTypeAdapter,
    ModelRetry,
    RunContext,
    Tool,
    ToolDenied,
)
from pydantic_ai._function_schema import FunctionSchema
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import (
    CompletedStreamedResponse,
    Model,
    ModelRequestParameters,
    StreamedResponse,
    infer_model,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import to_jsonable_python

from runtime.errors import EffectKeyBusy, database_unreachable
from runtime.keys import NO_ARGS_HASH, args_hash, check_effect_key
from runtime.storage.records import (
    FINISHED_STATUSES,
    ClockFn,
    EffectRecord,
    EffectRecordStatus,
    EffectRecordStore,
    InMemoryEffectStore,
    SqliteEffectStore,
)

__all__ = [
    "CROSS_RUN_THREAD",
    "MODEL_RESPONSE",
    "NO_ARGS_HASH",
    "DurableContext",
    "Idempotency",
    "IdempotencyWindow",
    "InMemoryJournal",
    "Journal",
    "SqliteJournal",
    "ToolCallReplayed",
    "args_hash",
    "call_key",
    "current_durable_context",
    "durable_tool",
    "durable_tools",
    "model_key",
    "run_durable",
]

log = logging.getLogger("runtime.durable")

Idempotency = Literal["call", "args"]
IdempotencyWindow = Literal["run", "thread", "cross-run"]
_WINDOWS = ("run", "thread", "cross-run")

CROSS_RUN_THREAD = "*cross-run*"
"""The thread id under which ``"cross-run"`` keys are recorded (no thread has this id)."""

MODEL_RESPONSE = ":model"
"""The ``tool_name`` of a journaled model response (no tool has a name with a colon)."""

_DURABLE_METADATA = "runtime.durable"


# --- the journal ----------------------------------------------------------------------


class Journal:
    """The journal of durable runs: tool calls and model responses in a record store.

    A record per model step (key ``durable:run:<run_id>:model:<step>``) and per tool call
    (``durable:run:<run_id>:call:<tool_call_id>``; other keys for ``idempotency="args"``
    and keyed tools), in the store's ``thread_id`` scope.

    Args:
        store: The record store (the effect tools' store).
        thread_id: The thread the journal's records belong to (``""`` outside a thread).
        cross_run_store: Where ``"cross-run"`` keys live (default: ``store``), under the
            thread id `CROSS_RUN_THREAD`.
        lease_seconds: How long a running call holds its record before another attempt
            may take it over.
        wait_timeout_seconds: How long a call waits for a call on the same key that
            another run holds, before `EffectKeyBusy`.
        poll_interval_seconds: How often a waiting call looks again.
    """

    def __init__(
        self,
        store: EffectRecordStore,
        *,
        thread_id: str = "",
        cross_run_store: EffectRecordStore | None = None,
        lease_seconds: float = 300.0,
        wait_timeout_seconds: float = 60.0,
        poll_interval_seconds: float = 0.05,
    ) -> None:
        if thread_id == CROSS_RUN_THREAD:
            raise ValueError(f"Journal: the thread id {CROSS_RUN_THREAD!r} is reserved for "
                             f"cross-run keys")
        self.store = store
        self.thread_id = thread_id
        self.cross_run_store = cross_run_store or store
        self.lease_seconds = lease_seconds
        self.wait_timeout_seconds = wait_timeout_seconds
        self.poll_interval_seconds = poll_interval_seconds

    def _where(self, window: str) -> tuple[EffectRecordStore, str]:
        if window == "cross-run":
            return self.cross_run_store, CROSS_RUN_THREAD
        return self.store, self.thread_id

    async def get(self, key: str, *, window: str = "run") -> EffectRecord | None:
        """The record under a journal key (see the class docstring); None if there is none."""
        store, thread_id = self._where(window)
        return await store.get(thread_id, key)

    async def model_response(self, run_id: str, step: int) -> ModelResponse | None:
        """The journaled model response of a run's step (1-based); None if not finished."""
        record = await self.get(model_key(run_id, step))
        if record is None or record.status is not EffectRecordStatus.SUCCEEDED:
            return None
        return _load_response(record.result_json or "[]")

    async def acquire(
        self, key: str, *, window: str, name: str, run_id: str, owner: str
    ) -> EffectRecord | None:
        """Claim a key for running its call, or find its finished record.

        Returns:
            The finished record (succeeded, denied) to replay; None when the caller now
            holds the key in progress and must run the call, then `finish` it.

        Raises:
            EffectKeyBusy: another run held the key for ``wait_timeout_seconds``.
        """
        store, thread_id = self._where(window)
        # A replay finds most keys finished: one read, no write transaction.
        recorded = await store.get(thread_id, key)
        if recorded is not None and recorded.status in FINISHED_STATUSES:
            return recorded
        root = _root_of(owner)
        deadline = time.monotonic() + self.wait_timeout_seconds
        while True:
            claim = await store.begin(thread_id, key, tool_name=name, run_id=run_id,
                                      owner=owner, lease_seconds=self.lease_seconds)
            if claim.finished:
                return claim.record
            if claim.claimed:
                return None
            holder = claim.record.owner or ""
            if holder != owner and _root_of(holder) == root:
                # An earlier attempt of this run claimed it and never finished: it died.
                log.info("run %s: taking over %s from an earlier attempt", run_id, key)
                await store.release(thread_id, key, owner=holder)
                continue
            if time.monotonic() >= deadline:
                raise EffectKeyBusy(key, name, self.wait_timeout_seconds)
            await anyio.sleep(self.poll_interval_seconds)

    async def finish(
        self, key: str, *, window: str, owner: str, status: EffectRecordStatus,
        output_json: str,
    ) -> EffectRecord:
        """Record how the call ``owner`` holds ended (succeeded, failed or denied)."""
        store, thread_id = self._where(window)
        return await store.complete(thread_id, key, owner=owner, result_json=output_json,
                                    status=status)

    async def release(self, key: str, *, window: str, owner: str) -> bool:
        """Drop ``owner``'s claim without a record (the call asked the model to retry)."""
        store, thread_id = self._where(window)
        return await store.release(thread_id, key, owner=owner)

    async def purge(self, *, older_than: datetime) -> int:
        """Delete journal records last changed before ``older_than`` (aware UTC).

        Args:
            older_than: An aware `datetime`; records last changed before it go.

        Returns:
            How many records were deleted (from both stores when they differ).

        Raises:
            TypeError: ``older_than`` is not a datetime, or is a naive one.
        """
        older_than = check_older_than(older_than)
        count = await self.store.purge(older_than=older_than)
        if self.cross_run_store is not self.store:
            count += await self.cross_run_store.purge(older_than=older_than)
        return count

    async def purge_thread(self, thread_id: str) -> int:
        """Delete every journal record of a thread (the thread is deleted)."""
        return await self.store.purge_thread(thread_id)

    async def close(self) -> None:
        """Close the stores."""
        await self.store.close()
        if self.cross_run_store is not self.store:
            await self.cross_run_store.close()


def check_older_than(older_than: object) -> datetime:
    """Check `Journal.purge`'s cut-off: an aware `datetime`.

    Raises:
        TypeError: anything else (a string, a number, a naive datetime), naming older_than.
    """
    if not isinstance(older_than, datetime):
        raise TypeError(f"Journal.purge: older_than must be an aware datetime, got "
                        f"{type(older_than).__name__} {older_than!r}")
    if older_than.tzinfo is None or older_than.utcoffset() is None:
        raise TypeError(f"Journal.purge: older_than must be an aware datetime (with a "
                        f"timezone, e.g. UTC), got the naive {older_than.isoformat()}")
    return older_than


class InMemoryJournal(Journal):
    """A journal in this process's memory (tests); lost on exit.

    Args:
        thread_id: The thread the journal's records belong to.
        clock: The time source (seconds since the epoch); ``FakeClock.now`` in tests.
        **options: `Journal`'s timing options.
    """

    def __init__(self, *, thread_id: str = "", clock: ClockFn | None = None,
                 **options: Any) -> None:
        super().__init__(InMemoryEffectStore(clock=clock), thread_id=thread_id, **options)


class SqliteJournal(Journal):
    """A journal in a standalone SQLite file (WAL), shared safely by several processes.

    Args:
        path: The database file (created with its table if missing).
        thread_id: The thread the journal's records belong to.
        clock: The time source (seconds since the epoch).
        synchronous: ``"FULL"`` (survives power loss) or ``"NORMAL"`` (a process crash).
        **options: `Journal`'s timing options.
    """

    def __init__(self, path: str | Path, *, thread_id: str = "", clock: ClockFn | None = None,
                 synchronous: str = "FULL", **options: Any) -> None:
        super().__init__(SqliteEffectStore(path, clock=clock, synchronous=synchronous),
                         thread_id=thread_id, **options)


def model_key(run_id: str, step: int) -> str:
    """The journal key of a run's model response at a step (1-based)."""
    return f"durable:run:{run_id}:model:{step}"


def call_key(run_id: str, tool_call_id: str) -> str:
    """The journal key of a tool call (``idempotency="call"``)."""
    return f"durable:run:{run_id}:call:{tool_call_id}"


# --- the context of a run -------------------------------------------------------------


@dataclass(frozen=True)
class DurableContext:
    """Where a durable tool journals its calls: a journal and a run.

    ``run_durable`` makes one per run; outside it, pass one to `durable_tool` /
    `durable_tools`.

    Attributes:
        journal: The journal.
        run_id: The run (turn) id.
        root_run_id: The outermost run: a sub-agent's run shares its ``"run"`` window.
            Defaults to ``run_id``.
        owner: Who holds the run's claims: ``<root_run_id>#<random>``, one per attempt.
        on_replay: Called with the model's ``tool_call_id`` and the event when a tool call
            of this run is answered from the journal (the runtime marks its result).
    """

    journal: Journal
    run_id: str
    root_run_id: str = ""
    owner: str = ""
    on_replay: Callable[[str, ToolCallReplayed], None] | None = None

    def __post_init__(self) -> None:
        _check_run_id(self.run_id, "DurableContext")
        if not self.root_run_id:
            object.__setattr__(self, "root_run_id", self.run_id)
        if not self.owner:
            object.__setattr__(self, "owner", f"{self.root_run_id}#{uuid.uuid4().hex}")


_current: ContextVar[DurableContext | None] = ContextVar("runtime_durable_run", default=None)


def current_durable_context() -> DurableContext | None:
    """The `DurableContext` of the `run_durable` this code runs in, if any."""
    return _current.get()


def _root_of(owner: str) -> str:
    return owner.rpartition("#")[0]


def _check_run_id(run_id: object, who: str) -> None:
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"{who}: run_id must be a non-empty string, got {run_id!r}")


# --- tool calls -----------------------------------------------------------------------


@dataclass(kw_only=True)
class ToolCallReplayed(CustomEvent):
    """A tool call answered from the journal: its function did not run.

    An event in the run's event stream (``event_stream_handler``, ``run_stream_events``);
    pydantic-ai stamps ``tool_call_id`` and ``tool_name`` of the call on the event.

    Attributes:
        key: The journal key whose record answered.
        status: ``"succeeded"`` or ``"denied"``.
        run_id: The run that recorded it (another run's for ``"run"``-window keys of a
            sub-agent, ``"thread"`` and ``"cross-run"`` keys).
    """

    key: str = ""
    status: str = ""
    run_id: str | None = None


@dataclass(frozen=True)
class _Idempotency:
    mode: Idempotency = "call"
    key: Callable[[dict[str, Any]], str] | None = None
    window: IdempotencyWindow | None = None

    def journal_key(self, ctx: DurableContext, name: str, call_id: str | None,
                    args: dict[str, Any]) -> tuple[str, str]:
        if self.key is not None:
            logical = check_effect_key(self.key(args), name, what="idempotency_key")
            if self.window == "run":
                return "run", f"durable:run:{ctx.root_run_id}:key:{name}:{logical}"
            if self.window == "thread":
                return "thread", f"durable:thread:key:{name}:{logical}"
            return "cross-run", f"durable:key:{name}:{logical}"
        if self.mode == "args":
            return "run", f"durable:run:{ctx.root_run_id}:args:{name}:{args_hash(args)}"
        if not call_id:
            raise ValueError(f"{name}: a durable tool call needs the model's tool_call_id")
        return "run", call_key(ctx.run_id, call_id)

    def describe(self) -> dict[str, Any]:
        if self.key is not None:
            return {"idempotency": "key", "window": self.window}
        return {"idempotency": self.mode}


async def _journaled_call(
    ctx: DurableContext, spec: _Idempotency, run_ctx: RunContext[Any], name: str,
    args: dict[str, Any], execute: Callable[[], Awaitable[Any]],
) -> Any:
    window, key = spec.journal_key(ctx, name, run_ctx.tool_call_id, args)
    journal = ctx.journal
    record = await journal.acquire(key, window=window, name=name, run_id=ctx.run_id,
                                   owner=ctx.owner)
    if record is not None:
        log.debug("run %s: %s replayed from the journal (%s)", ctx.run_id, name, key)
        event = ToolCallReplayed(key=key, status=str(record.status), run_id=record.run_id)
        if ctx.on_replay is not None:
            ctx.on_replay(run_ctx.tool_call_id or "", event)
        await run_ctx.emit(event)
        return record.result
    try:
        result = await execute()
    except (ModelRetry, CallDeferred, ApprovalRequired):
        await journal.release(key, window=window, owner=ctx.owner)
        raise
    except Exception as exc:
        if database_unreachable(exc):
            # Not the call's outcome: the key stays claimed, and the run's next attempt
            # takes it over and runs the call again.
            raise
        error = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        await journal.finish(key, window=window, owner=ctx.owner,
                             status=EffectRecordStatus.FAILED, output_json=error)
        raise
    try:
        output_json = json.dumps(to_jsonable_python(result), ensure_ascii=False,
                                 separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError) as exc:
        error = json.dumps({"error": f"output is not JSON: {exc}"})
        await journal.finish(key, window=window, owner=ctx.owner,
                             status=EffectRecordStatus.FAILED, output_json=error)
        raise TypeError(f"durable tool {name}: its output cannot be journaled as JSON "
                        f"({exc}); return JSON data or a pydantic model") from exc
    await journal.finish(key, window=window, owner=ctx.owner,
                         status=EffectRecordStatus.SUCCEEDED, output_json=output_json)
    # What the model sees is the journaled form, on the first call as on every replay.
    return json.loads(output_json)


@dataclass(kw_only=True)
class _DurableFunctionSchema(FunctionSchema):
    """A tool's function schema whose call goes through the journal."""

    idempotency: _Idempotency
    tool_name: str
    context: DurableContext | None = None

    async def call(self, args_dict: dict[str, Any], ctx: RunContext[Any]) -> Any:
        run = _current.get() or self.context
        if run is None:
            raise RuntimeError(
                f"durable tool {self.tool_name}: called outside run_durable and without a "
                f"context; pass context=DurableContext(journal=..., run_id=...) to durable_tool"
            )
        return await _journaled_call(
            run, self.idempotency, ctx, self.tool_name, args_dict,
            lambda: FunctionSchema.call(self, args_dict, ctx),
        )


def durable_tool(
    tool: Tool[Any] | Callable[..., Any],
    *,
    idempotency: Idempotency = "call",
    idempotency_key: Callable[[dict[str, Any]], str] | None = None,
    idempotency_window: IdempotencyWindow | None = None,
    context: DurableContext | None = None,
) -> Tool[Any]:
    """A tool whose calls are journaled: a finished call is never run again.

    Args:
        tool: A pydantic-ai ``Tool`` or a plain function (as ``Agent(tools=[...])`` takes).
        idempotency: ``"call"`` — one run per model tool call (``tool_call_id``);
            ``"args"`` — one run per arguments in the run (`runtime.keys.args_hash` of the
            validated arguments), so calls with fresh call ids and the same arguments run
            once.
        idempotency_key: ``fn(args) -> str``: a logical id (an order id, a date) from the
            validated arguments (``{parameter: value}``); calls with one key run once per
            window. A non-empty string of at most 1,024 characters, built from stable ids,
            never from text the model wrote.
        idempotency_window: With ``idempotency_key``: ``"run"`` (this run and every
            sub-agent run under it), ``"thread"`` (the journal's thread) or
            ``"cross-run"`` (every thread, until purged).
        context: Where to journal when called outside `run_durable` (inside, the run's
            journal and run id are used).

    Returns:
        A new ``Tool`` with the same name, description and schema.

    Raises:
        TypeError: ``tool`` is neither a Tool nor a function; ``idempotency_key`` without
            ``idempotency_window`` (or the reverse), naming the tool.
        ValueError: an unknown ``idempotency`` or window, or a key with
            ``idempotency="args"``.
    """
    if isinstance(tool, Tool):
        base: Tool[Any] = tool
    elif callable(tool):
        base = Tool(tool)
    else:
        raise TypeError(f"durable_tool: expected a pydantic-ai Tool or a function, got {tool!r}")
    name = base.name
    if idempotency not in ("call", "args"):
        raise ValueError(f"durable_tool: tool {name!r}: idempotency must be 'call' or 'args', "
                         f"got {idempotency!r}")
    if idempotency_key is not None and not callable(idempotency_key):
        raise TypeError(f"durable_tool: tool {name!r}: idempotency_key must be a function "
                        f"key(args) -> str, got {idempotency_key!r}")
    if idempotency_key is not None and idempotency_window is None:
        raise TypeError(f"durable_tool: tool {name!r} has an idempotency_key but no "
                        f"idempotency_window; choose a window: 'run', 'thread' or 'cross-run'")
    if idempotency_key is None and idempotency_window is not None:
        raise TypeError(f"durable_tool: tool {name!r} has an idempotency_window but no "
                        f"idempotency_key; pass the key function the window applies to")
    if idempotency_window is not None and idempotency_window not in _WINDOWS:
        raise ValueError(f"durable_tool: tool {name!r}: idempotency_window must be 'run', "
                         f"'thread' or 'cross-run', got {idempotency_window!r}")
    if idempotency_key is not None and idempotency == "args":
        raise ValueError(f"durable_tool: tool {name!r}: choose idempotency='args' or an "
                         f"idempotency_key, not both")
    spec = _Idempotency(idempotency, idempotency_key, idempotency_window)
    return _with_schema(base, spec, context)


def durable_tools(tools: Iterable[Tool[Any] | Callable[..., Any]],
                  ctx: DurableContext) -> list[Tool[Any]]:
    """Journal a list of tools in ``ctx`` (for a run outside `run_durable`).

    Tools already made by `durable_tool` keep their idempotency; others journal by call.
    """
    wrapped = []
    for tool in tools:
        schema = tool.function_schema if isinstance(tool, Tool) else None
        if isinstance(tool, Tool) and isinstance(schema, _DurableFunctionSchema):
            wrapped.append(_with_schema(tool, schema.idempotency, ctx))
        else:
            wrapped.append(durable_tool(tool, context=ctx))
    return wrapped


def _with_schema(base: Tool[Any], spec: _Idempotency, context: DurableContext | None) -> (
    Tool[Any]
):
    original = base.function_schema
    values = {f.name: getattr(original, f.name) for f in fields(FunctionSchema)}
    schema = _DurableFunctionSchema(**values, idempotency=spec, tool_name=base.name,
                                    context=context)
    return Tool(
        original.function, takes_ctx=base.takes_ctx, max_retries=base.max_retries,
        name=base.name, description=base.description, prepare=base.prepare,
        args_validator=base.args_validator, strict=base.strict, sequential=base.sequential,
        requires_approval=base.requires_approval,
        metadata={**(base.metadata or {}), _DURABLE_METADATA: spec.describe()},
        timeout=base.timeout, tool_kind=base.tool_kind, defer_loading=base.defer_loading,
        include_return_schema=base.include_return_schema, function_schema=schema,
    )


@dataclass
class _JournaledToolset(WrapperToolset[Any]):
    """Journals by call id every tool of a toolset that is not a durable tool itself."""

    run: DurableContext = field(kw_only=True)

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        if _DURABLE_METADATA in (tool.tool_def.metadata or {}):
            return await super().call_tool(name, tool_args, ctx, tool)
        return await _journaled_call(
            self.run, _Idempotency(), ctx, name, tool_args,
            lambda: super(_JournaledToolset, self).call_tool(name, tool_args, ctx, tool),
        )


# --- model responses ------------------------------------------------------------------


def _dump_response(response: ModelResponse) -> str:
    return ModelMessagesTypeAdapter.dump_json([response]).decode("utf-8")


def _load_response(text: str) -> ModelResponse:
    messages = ModelMessagesTypeAdapter.validate_json(text)
    response = messages[0] if messages else None
    if not isinstance(response, ModelResponse):  # pragma: no cover - we wrote it
        raise ValueError("a journaled model response is not a ModelResponse")
    return response


class _JournaledModel(WrapperModel):
    """Journals the model's response of every step; replays journaled steps."""

    def __init__(self, wrapped: Model, run: DurableContext) -> None:
        super().__init__(wrapped)
        self._run = run
        self._step = 0

    def _next_key(self) -> str:
        self._step += 1
        return model_key(self._run.run_id, self._step)

    async def _begin(self, key: str) -> ModelResponse | None:
        record = await self._run.journal.acquire(
            key, window="run", name=MODEL_RESPONSE, run_id=self._run.run_id,
            owner=self._run.owner,
        )
        return None if record is None else _load_response(record.result_json or "[]")

    async def _finish(self, key: str, response: ModelResponse | None,
                      error: BaseException | None = None) -> None:
        if response is not None:
            status, text = EffectRecordStatus.SUCCEEDED, _dump_response(response)
        else:
            status = EffectRecordStatus.FAILED
            text = json.dumps({"error": f"{type(error).__name__}: {error}"})
        await self._run.journal.finish(key, window="run", owner=self._run.owner,
                                       status=status, output_json=text)

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        key = self._next_key()
        recorded = await self._begin(key)
        if recorded is not None:
            return recorded
        try:
            response = await super().request(messages, model_settings, model_request_parameters)
        except Exception as exc:
            await self._finish(key, None, exc)
            raise
        await self._finish(key, response)
        return response

    @asynccontextmanager
    async def request_stream(
        self, messages: list[ModelMessage], model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        key = self._next_key()
        recorded = await self._begin(key)
        if recorded is not None:
            yield CompletedStreamedResponse(
                recorded, model_request_parameters=model_request_parameters,
                replay_events=True,
            )
            return
        try:
            async with super().request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as streamed:
                yield streamed
                async for _ in streamed:  # what the consumer left unread
                    pass
        except Exception as exc:
            await self._finish(key, None, exc)
            raise
        await self._finish(key, streamed.get())


# --- run_durable ----------------------------------------------------------------------


async def _record_denials(ctx: DurableContext, deferred: Any,
                          history: Sequence[ModelMessage] | None) -> None:
    approvals = getattr(deferred, "approvals", None) or {}
    names = {part.tool_call_id: part.tool_name for message in history or ()
             if isinstance(message, ModelResponse) for part in message.parts
             if isinstance(part, ToolCallPart)}
    for call_id, answer in approvals.items():
        if answer is False or isinstance(answer, ToolDenied):
            message = answer.message if isinstance(answer, ToolDenied) else "denied"
            key = call_key(ctx.run_id, call_id)
            record = await ctx.journal.acquire(key, window="run", name=names.get(call_id, ""),
                                               run_id=ctx.run_id, owner=ctx.owner)
            if record is None:
                await ctx.journal.finish(key, window="run", owner=ctx.owner,
                                         status=EffectRecordStatus.DENIED,
                                         output_json=json.dumps(message))


def _overridden_model(agent: Any) -> Any:
    # An `agent.override(model=...)` around the call (pydantic-ai's testing pattern) wins
    # over the agent's model in `agent.run`; ours replaces it for the run, so read it first.
    # pydantic-ai keeps it in a private ContextVar holding an Option (`Some(value)`).
    override = getattr(agent, "_override_model", None)
    option = override.get() if isinstance(override, ContextVar) else None
    return getattr(option, "value", None)


async def run_durable(
    agent: Any,
    user_prompt: Any = None,
    *,
    run_id: str,
    journal: Journal,
    on_replay: Callable[[str, ToolCallReplayed], None] | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``agent`` like ``agent.run``, journaling model responses and tool calls.

    Call it again with the same ``run_id`` (and the same prompt and arguments) after a
    crash: journaled model responses are replayed without a model request, finished tool
    calls return their journaled output without running, a failed call runs again, and
    the run continues from its first unfinished step. A tool that runs another agent with
    `run_durable` makes a sub-agent run, which shares this run's ``"run"`` window.

    Args:
        agent: A pydantic-ai ``Agent``.
        user_prompt: As ``agent.run``.
        run_id: The run's id; the same id resumes the run. A sub-agent run needs an id
            of its own that is stable across attempts (e.g. built from the parent's
            ``tool_call_id``).
        journal: Where the run is journaled (`InMemoryJournal`, `SqliteJournal`, `Journal`).
        on_replay: ``on_replay(tool_call_id, event)``, called when a tool call of this run
            is answered from the journal (besides the `ToolCallReplayed` event).
        **kwargs: Anything ``agent.run`` accepts (``model``, ``toolsets``, ``deps``,
            ``message_history``, ``deferred_tool_results``, ``event_stream_handler`` …).

    Returns:
        What ``agent.run`` returns (an ``AgentRunResult``).

    Raises:
        ValueError: an empty run id, or a sub-agent run with its parent's run id.
        TypeError: ``journal`` is not a `Journal`.
        Exception: whatever ``agent.run`` raises; the run can be resumed.
    """
    _check_run_id(run_id, "run_durable")
    if not isinstance(journal, Journal):
        raise TypeError(f"run_durable: journal must be a Journal (InMemoryJournal, "
                        f"SqliteJournal), got {type(journal).__name__}")
    parent = _current.get()
    if parent is not None:
        if parent.run_id == run_id:
            raise ValueError(f"run_durable: a sub-agent run needs its own run_id; "
                             f"{run_id!r} is its parent's")
        ctx = DurableContext(journal, run_id, root_run_id=parent.root_run_id,
                             owner=parent.owner, on_replay=on_replay)
    else:
        ctx = DurableContext(journal, run_id, on_replay=on_replay)
    model = kwargs.pop("model", None) or _overridden_model(agent) or agent.model
    if model is None:
        raise ValueError(f"run_durable: run {run_id}: the agent has no model; pass model=")
    extra: Sequence[AbstractToolset[Any]] = kwargs.pop("toolsets", None) or ()
    toolsets = [_JournaledToolset(ts, run=ctx) for ts in [*agent.toolsets, *extra]]
    await _record_denials(ctx, kwargs.get("deferred_tool_results"),
                          kwargs.get("message_history"))
    token = _current.set(ctx)
    try:
        with agent.override(model=_JournaledModel(infer_model(model), ctx), toolsets=toolsets,
                            tools=[]):
            # pydantic-ai's run id (``ctx.run_id``, the messages' ``run_id``) is the run's.
            return await agent.run(user_prompt, run_id=run_id, **kwargs)
    finally:
        _current.reset(token)
