"""The loop turn's budget (`runtime.pacing.TurnBudget`): many steps ready in one turn go
on over several turns, in the order they came, with the loop's other work between; and a
burst of runs due on many threads at once is drained that way.

Time is a fake clock (a step "costs" what the test adds to it) or a budget no step fits
in; no assertion depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import runtime.executor
from runtime import Runtime
from runtime.pacing import TurnBudget
from runtime.testing import FakeClock

APP = Path(__file__).parent / "apps" / "pacing"


class Turns:
    """Counts the loop's turns: a task that goes once round every turn."""

    def __init__(self) -> None:
        self.now = 0
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            self.now += 1
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._task.cancel()


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="seconds must be > 0"):
        TurnBudget(0)


async def test_steps_ready_together_go_on_over_several_turns_in_their_order() -> None:
    clock = [0.0]
    budget = TurnBudget(4.0, clock=lambda: clock[0])  # each step costs 1: 4 per budget
    turns = Turns()
    ran: list[tuple[int, int, int]] = []  # (turn, worker, step)

    async def worker(k: int) -> None:
        for step in range(3):
            if budget.spent():
                await budget.wait_turn()
            ran.append((turns.now, k, step))
            clock[0] += 1.0
            await asyncio.sleep(0)  # as a drain awaits its effect

    await asyncio.gather(*(worker(k) for k in range(30)))
    turns.stop()
    assert len(ran) == 90 and budget.waiting == 0
    per_turn: dict[int, int] = {}
    for turn, _, _ in ran:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    # Without a budget all 30 workers' steps run in each of three turns.
    assert max(per_turn.values()) <= 8
    # First come, first served: a worker's first steps go in the order the workers came.
    firsts = [k for _, k, step in ran if step == 0]
    assert firsts == list(range(30))


async def test_a_budget_cut_short_by_one_slow_step_lets_more_steps_go_again() -> None:
    clock = [0.0]
    budget = TurnBudget(4.0, clock=lambda: clock[0])
    turns = Turns()
    ran: list[int] = []

    async def step(cost: float) -> None:
        if budget.spent():
            await budget.wait_turn()
        ran.append(turns.now)
        clock[0] += cost

    # One slow step fills a budget alone (a process preempted looks the same): the
    # next turn lets one waiting step go, but the turns after let more go each time.
    await asyncio.gather(step(10.0), *(step(0.1) for _ in range(40)))
    turns.stop()
    assert len(ran) == 41
    # One step per turn would take 40 turns.
    assert max(ran) - min(ran) < 20


async def test_a_step_cancelled_while_it_waits_lets_the_others_go() -> None:
    clock = [0.0]
    budget = TurnBudget(1.0, clock=lambda: clock[0])
    assert not budget.spent()
    clock[0] = 5.0
    assert budget.spent()
    waiting = [asyncio.create_task(budget.wait_turn()) for _ in range(3)]
    await asyncio.sleep(0)
    waiting[0].cancel()
    await asyncio.gather(*waiting[1:])
    assert budget.waiting == 0


async def test_a_burst_due_on_many_threads_starts_few_runs_per_loop_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget no step fits in: a turn lets go one waiting drain step, and one more
    # step may begin in it.
    monkeypatch.setattr(runtime.executor, "TurnBudget", lambda: TurnBudget(1e-9))
    clock = FakeClock()
    # NORMAL: every store call on the loop (`Runtime.run_short`); with FULL, outcomes and
    # claims that storage threads committed at once under load woke several drains in
    # one turn, past the line (a step's storage call is not paced, its start is).
    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False,
                       extensions=[], synchronous="NORMAL") as rt:
        marks = rt.registry.app["mark"].fn.__globals__
        starts: list[int] = marks["STARTS"]
        starts.clear()
        for k in range(30):
            thread = await rt.create_thread(f"t{k}")
            for i in range(3):
                await thread.schedule_effect("mark", {"i": i}, delay=60)
        turns = Turns()
        marks["TURN"][0] = lambda: turns.now
        clock.advance(60)  # 30 threads due in the same turn
        await rt.wait_idle()
        turns.stop()
    assert len(starts) == 90
    per_turn: dict[int, int] = {}
    for turn in starts:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    # Without the budget the 30 threads' first runs all start in one turn.
    assert max(per_turn.values()) <= 3


async def test_a_failure_is_recorded_in_the_turn_its_effect_raised_not_after_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A crash between an effect's raise and the commit of its failure re-queues the run
    # as interrupted, so it would run again: that window must not include a wait in the
    # drains' line (a budget no step fits in puts every step of a burst in line).
    import runtime.storage.sqlite as sqlite_store

    monkeypatch.setattr(runtime.executor, "TurnBudget", lambda: TurnBudget(1e-9))
    turns: list[Turns] = []
    recorded: dict[str, int] = {}  # run id -> the turn its failure was committed in
    finish_and_claim = sqlite_store.SQLiteThreadStore._finish_and_claim

    def spy(self: sqlite_store.SQLiteThreadStore, finish: object, *args: object,
            **kwargs: object) -> object:
        answer = finish_and_claim(self, finish, *args, **kwargs)  # type: ignore[arg-type]
        if finish is not None and str(finish.status) == "failed":  # type: ignore[attr-defined]
            recorded[finish.run_id] = turns[0].now  # type: ignore[attr-defined]
        return answer

    monkeypatch.setattr(sqlite_store.SQLiteThreadStore, "_finish_and_claim", spy)
    clock = FakeClock()
    # NORMAL: every store call on the loop (`Runtime.run_short`), so the commit's turn
    # is the drain's, never a storage thread's.
    async with Runtime(app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False,
                       extensions=[], synchronous="NORMAL") as rt:
        booms = rt.registry.app["boom"].fn.__globals__
        raised: dict[tuple[str, int], int] = booms["RAISED"]
        raised.clear()
        ids: dict[str, tuple[str, int]] = {}
        for k in range(30):
            thread = await rt.create_thread(f"t{k}")
            for i in range(3):
                run_id = await thread.schedule_effect("boom", {"i": i}, delay=60)
                ids[run_id] = (f"t{k}", i)
        turns.append(Turns())
        booms["TURN"][0] = lambda: turns[0].now
        clock.advance(60)  # 30 threads due in the same turn
        await rt.wait_idle()
        turns[0].stop()
        for k in range(30):
            runs = (await (await rt.get_thread(f"t{k}")).list_runs()).runs
            assert [r.status for r in runs] == ["failed"] * 3
    assert len(raised) == 90 and set(recorded) == set(ids)
    # The effect runs in a task of its own: its end wakes the drain two turns later, and
    # the drain commits the failure in that turn (it waited up to 20 turns in line).
    late = {run_id: (raised[ids[run_id]], turn) for run_id, turn in recorded.items()
            if turn > raised[ids[run_id]] + 2}
    assert late == {}  # (turn raised, turn recorded) of each failure recorded later
