"""Overhead of an effect tool call against a plain tool call, per call, in one run.

Real pydantic-ai ``Agent`` runs on a scripted ``FunctionModel`` make ``--calls`` tool calls
in all, ``--per-step`` of them in the one model response of each run, through
`runtime.wrap_tools_for_run`:

- plain:               a `define_tool` tool (the baseline);
- effect, first:       a `define_effect_tool` tool, every call with new args (each one
                       claims its key, runs, records the result);
- effect, recorded:    the same calls again in the same run id (each one finds its record
                       and runs nothing);

each with `InMemoryEffectStore`, with `SqliteEffectStore` (WAL, synchronous FULL, on
``--data-dir``) and with a thread's own store inside a `Runtime` (``rt.effect_records``:
the records in the thread's SQLite file, synchronous FULL, through the actor table and the
runtime's storage threads, as effect tools in turns use it). The tool's function does
nothing, so the difference to the plain row is the effect tool's overhead. Rows are
interleaved and repeated (``--repeat``, medians).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _args import positive_int  # bench/_args.py: bench/ is on the path
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime import (
    EffectRecordStore,
    EffectToolContext,
    InMemoryEffectStore,
    Runtime,
    SqliteEffectStore,
    ToolRunState,
    define_effect_tool,
    define_tool,
    wrap_tools_for_run,
)


class Args(BaseModel):
    n: int
    text: str


async def work(state: ToolRunState, args: Args) -> dict[str, int]:
    return {"n": args.n}


PLAIN = define_tool("Does nothing.", Args, work, name="work")
EFFECT = define_effect_tool("Does nothing, once.", Args, work, name="work")


def script(first: int, count: int) -> FunctionModel:
    """One model response with ``count`` calls (args ``first`` ...), then the final text."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[
            ToolCallPart("work", {"n": n, "text": f"call {n}"}, tool_call_id=f"c{n}")
            for n in range(first, first + count)
        ])

    return FunctionModel(answer)


async def timed_runs(tool: Any, store: EffectRecordStore, prefix: str, calls: int,
                     per_step: int, thread_id: str = "") -> tuple[float, float]:
    """Wall-clock and CPU microseconds per tool call, over runs of ``per_step`` calls each.

    Short runs keep pydantic-ai's message history (which every step re-reads) small, so
    the time per call does not grow with ``calls``. Run ids are ``prefix-<batch>``: timing
    the same prefix twice replays every call.
    """
    tools = [tool]
    elapsed = cpu = 0.0
    for batch, first in enumerate(range(0, calls, per_step)):
        ctx = EffectToolContext(run_id=f"{prefix}-{batch}", agent="bench", trigger="bench",
                                thread_id=thread_id)
        agent = Agent(script(first, min(per_step, calls - first)),
                      toolsets=[wrap_tools_for_run(tools, ctx, store)])
        start, start_cpu = time.perf_counter(), time.process_time()
        await agent.run("go")
        elapsed += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
    return elapsed / calls * 1e6, cpu / calls * 1e6


async def measure(
    calls: int, per_step: int, repeat: int, data_dir: Path
) -> dict[str, tuple[float, float]]:
    samples: dict[str, list[tuple[float, float]]] = {}

    def add(name: str, value: tuple[float, float]) -> None:
        samples.setdefault(name, []).append(value)

    async def standalone(
        store: EffectRecordStore,
    ) -> tuple[EffectRecordStore, str, Callable[[], Awaitable[None]]]:
        return store, "", store.close

    async def in_thread(i: int) -> tuple[EffectRecordStore, str, Callable[[], Awaitable[None]]]:
        rt = Runtime(data_dir=data_dir / f"rt-{i}", extensions=[], load_packages=False)
        await rt.start()
        thread = await rt.create_thread()

        async def close() -> None:
            await rt.close()
            shutil.rmtree(data_dir / f"rt-{i}")

        return rt.effect_records, thread.thread_id, close

    stores: list[tuple[str, Callable[[int], Awaitable[Any]]]] = [
        ("memory", lambda i: standalone(InMemoryEffectStore())),
        ("sqlite", lambda i: standalone(SqliteEffectStore(data_dir / f"bench-{i}.sqlite"))),
        ("thread store", in_thread),
    ]
    # Warm up both paths (imports, first connections) before anything is timed.
    await timed_runs(PLAIN, InMemoryEffectStore(), "warm", min(calls, 20), per_step)
    await timed_runs(EFFECT, InMemoryEffectStore(), "warm", min(calls, 20), per_step)
    for i in range(repeat):
        for label, make in stores:
            # The baseline runs right before each pair, so background load hits both alike.
            add("plain", await timed_runs(PLAIN, InMemoryEffectStore(), f"p{i}{label}", calls,
                                          per_step))
            store, thread_id, close = await make(i)
            add(f"effect, first application ({label})",
                await timed_runs(EFFECT, store, f"r{i}", calls, per_step, thread_id))
            add(f"effect, recorded hit ({label})",
                await timed_runs(EFFECT, store, f"r{i}", calls, per_step, thread_id))
            await close()
        print(f"repetition {i + 1}/{repeat} done", file=sys.stderr)
    return {
        name: (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values))
        for name, values in samples.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=positive_int, default=None,
                        help="default 1000 (--quick: 100)")
    parser.add_argument("--per-step", type=positive_int, default=10)
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="100 calls, 1 repetition")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.repeat = 1
    if opts.calls is None:
        opts.calls = 100 if opts.quick else 1000
    run: Callable[[Path], Awaitable[dict[str, tuple[float, float]]]] = lambda d: measure(  # noqa: E731
        opts.calls, opts.per_step, opts.repeat, d)
    if opts.data_dir is not None:
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        figures = asyncio.run(run(opts.data_dir))
        for path in opts.data_dir.glob("bench-*.sqlite*"):
            path.unlink()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            figures = asyncio.run(run(Path(tmp)))
    plain, plain_cpu = figures["plain"]
    print(f"{opts.calls} calls, {opts.per_step} per run (one model step), median of "
          f"{opts.repeat}; load average {os.getloadavg()[0]:.1f}\n")
    print("| tool call | wall µs/call | overhead (wall) | CPU µs/call | overhead (CPU) |")
    print("|---|---:|---:|---:|---:|")
    for name, (wall, cpu) in figures.items():
        print(f"| {name} | {wall:.0f} | {wall - plain:+.0f} | {cpu:.0f} | {cpu - plain_cpu:+.0f} |")


if __name__ == "__main__":
    main()
