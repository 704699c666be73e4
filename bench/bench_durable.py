"""Durable turns: the cost of journaling a turn, and the time to resume a long one.

Real pydantic-ai ``Agent`` runs on a scripted ``FunctionModel``; model step *i* calls a
do-nothing tool ``work(n=i)``, and the step after the last call answers with text.

- **A 10-step turn** (``--steps``; 10 tool steps, then the answer) with ``agent.run``
  (the baseline) and with `runtime.durable.run_durable` on `InMemoryJournal` and on
  `SqliteJournal` (WAL, synchronous FULL, on ``--data-dir``): wall-clock and CPU
  microseconds per model step, medians over ``--turns`` turns per repetition.
- **Resume of a 100-step turn** (``--resume-steps``): a turn whose answer step fails after
  100 journaled steps, then resumed with the same run id on `SqliteJournal` (a fresh
  journal object, as after a restart): the time of the resume, which replays 100 model
  responses and 100 tool calls from the journal and asks the model once, beside the same
  turn with ``agent.run`` and no journal (pydantic-ai's own cost of 100 steps, which
  grows with the message history).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _args import positive_int  # bench/_args.py: bench/ is on the path
from pydantic_ai import Agent, UsageLimits
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runtime.durable import InMemoryJournal, Journal, SqliteJournal, run_durable


def work(n: int) -> dict[str, int]:
    """Does nothing."""
    return {"n": n}


class Scripted:
    """``steps`` tool steps, then the answer (or a failure while ``fail_answer``)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.fail_answer = False
        self.requests = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        step = sum(1 for m in messages if isinstance(m, ModelResponse)) + 1
        if step <= self.steps:
            return ModelResponse(parts=[ToolCallPart("work", {"n": step})])
        if self.fail_answer:
            raise RuntimeError("the answer step fails")
        return ModelResponse(parts=[TextPart("done")])


async def timed_turns(label: str, steps: int, turns: int, journal: Journal | None,
                      prefix: str) -> tuple[float, float]:
    """Wall-clock and CPU µs per model step (``steps`` + 1 per turn) over ``turns`` turns."""
    model = Scripted(steps)
    agent = Agent(FunctionModel(model), tools=[work])
    start, start_cpu = time.perf_counter(), time.process_time()
    for turn in range(turns):
        if journal is None:
            await agent.run("go")
        else:
            await run_durable(agent, "go", run_id=f"{prefix}-{label}-{turn}", journal=journal)
    per = turns * (steps + 1)
    return ((time.perf_counter() - start) / per * 1e6,
            (time.process_time() - start_cpu) / per * 1e6)


async def resume_time(steps: int, path: Path, run_id: str) -> tuple[float, float, float, int]:
    """Seconds of the same turn without a journal, of the failed first attempt and of the
    resume, and the model requests of the resume."""
    model = Scripted(steps)
    agent = Agent(FunctionModel(model), tools=[work])
    # Replayed steps count as requests too: a long turn needs a higher request limit.
    limits = UsageLimits(request_limit=steps + 10)
    start = time.perf_counter()
    await agent.run("go", usage_limits=limits)
    plain = time.perf_counter() - start
    model.fail_answer = True
    journal = SqliteJournal(path)
    start = time.perf_counter()
    try:
        await run_durable(agent, "go", run_id=run_id, journal=journal, usage_limits=limits)
    except RuntimeError:
        pass
    first = time.perf_counter() - start
    await journal.close()
    model.fail_answer, model.requests = False, 0
    journal = SqliteJournal(path)
    start = time.perf_counter()
    result = await run_durable(agent, "go", run_id=run_id, journal=journal,
                               usage_limits=limits)
    resumed = time.perf_counter() - start
    await journal.close()
    assert result.output == "done"
    return plain, first, resumed, model.requests


async def measure(opts: argparse.Namespace, data_dir: Path) -> None:
    await timed_turns("warm", opts.steps, 2, InMemoryJournal(), "warm")
    samples: dict[str, list[tuple[float, float]]] = {}
    resumes: list[tuple[float, float, float, int]] = []
    for i in range(opts.repeat):
        memory = InMemoryJournal()
        sqlite = SqliteJournal(data_dir / f"bench-{i}.sqlite")
        for label, journal in (("agent.run (no journal)", None),
                               ("run_durable, InMemoryJournal", memory),
                               ("run_durable, SqliteJournal", sqlite)):
            samples.setdefault(label, []).append(
                await timed_turns(label, opts.steps, opts.turns, journal, f"t{i}"))
        await sqlite.close()
        resumes.append(await resume_time(opts.resume_steps, data_dir / f"bench-r{i}.sqlite",
                                         f"resume-{i}"))
        print(f"repetition {i + 1}/{opts.repeat} done", file=sys.stderr)
    print(f"{opts.turns} turns of {opts.steps} tool steps + the answer, median of "
          f"{opts.repeat}; load average {os.getloadavg()[0]:.1f}\n")
    print("| turn | wall µs/step | overhead (wall) | CPU µs/step | overhead (CPU) |")
    print("|---|---:|---:|---:|---:|")
    medians = {k: (statistics.median(v[0] for v in vs), statistics.median(v[1] for v in vs))
               for k, vs in samples.items()}
    base_wall, base_cpu = medians["agent.run (no journal)"]
    for label, (wall, cpu) in medians.items():
        print(f"| {label} | {wall:.0f} | {wall - base_wall:+.0f} | {cpu:.0f} | "
              f"{cpu - base_cpu:+.0f} |")
    plain = statistics.median(r[0] for r in resumes)
    first = statistics.median(r[1] for r in resumes)
    resumed = statistics.median(r[2] for r in resumes)
    requests = resumes[-1][3]
    print(f"\n| resume of a turn with {opts.resume_steps} journaled steps (SqliteJournal) | "
          f"seconds |")
    print("|---|---:|")
    print(f"| the same turn with agent.run, no journal ({opts.resume_steps} steps + the "
          f"answer) | {plain:.3f} |")
    print(f"| first attempt ({opts.resume_steps} steps run and journaled, answer fails) | "
          f"{first:.3f} |")
    print(f"| resume (replay {opts.resume_steps} steps, {requests} model request) | "
          f"{resumed:.3f} |")
    print(f"| resume, per replayed step (ms) | {resumed / opts.resume_steps * 1e3:.2f} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--turns", type=positive_int, default=None, help="default 50 (--quick: 3)")
    parser.add_argument("--resume-steps", type=positive_int, default=None,
                        help="default 100 (--quick: 10)")
    parser.add_argument("--repeat", type=positive_int, default=3)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repetition")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.repeat = 1
    opts.turns = opts.turns or (3 if opts.quick else 50)
    opts.resume_steps = opts.resume_steps or (10 if opts.quick else 100)
    if opts.data_dir is not None:
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(measure(opts, opts.data_dir))
        for path in opts.data_dir.glob("bench-*.sqlite*"):
            path.unlink()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(measure(opts, Path(tmp)))


if __name__ == "__main__":
    main()
