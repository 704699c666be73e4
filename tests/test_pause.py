"""Pausing and resuming a thread, and the guard against runaway chains."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from runtime import EffectStatus, Runtime, ThreadNotFound, TooManyImmediateRuns
from runtime.storage.memory import MemoryBackend
from runtime.testing import FakeClock
from tests.conftest import serve_api

APP = Path(__file__).parent / "apps" / "core"


def recorded(data_dir: Path) -> list[str]:
    path = data_dir / "record.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["key"] for line in path.read_text().splitlines()]


async def runs_by_status(thread: object, status: str) -> list[object]:
    page = await thread.list_runs(status=status, limit=500)  # type: ignore[attr-defined]
    return list(page.runs)


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
async def test_a_paused_thread_runs_nothing_keeps_everything_and_resumes_in_due_order(
    tmp_path: Path, backend: str
) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    storage = MemoryBackend() if backend == "memory" else None

    def runtime() -> Runtime:
        return Runtime(app_dir=APP, data_dir=tmp_path, clock=clock, storage=storage,
                       load_packages=False)

    async with runtime() as rt:
        thread = await rt.create_thread("t")
        other = await rt.create_thread("other")
        await thread.schedule_effect("record", {"key": "b"}, delay=20)
        paused = await thread.pause()
        assert paused.paused and (await rt.get_thread("t")).paused
        assert not (await rt.get_thread("other")).paused
        # Still accepts schedules, while nothing of it runs; other threads run.
        await thread.schedule_effect("record", {"key": "a"}, delay=10)
        await thread.schedule_effect("record", {"key": "c"}, delay=30)
        await other.schedule_effect("record", {"key": "other"})
        clock.advance(60)
        await rt.wait_idle()
        assert recorded(tmp_path) == ["other"]
        assert [r.status for r in await thread.get_scheduled_effects()] == [
            EffectStatus.PENDING
        ] * 3
        listed = {t.id: t.paused for t in (await rt.list_threads()).threads}
        assert listed == {"t": True, "other": False}

    # The mark survives a restart: still nothing runs, though every alarm is overdue.
    async with runtime() as rt:
        thread = await rt.get_thread("t")
        assert thread.paused
        clock.advance(1)
        await rt.wait_idle()
        assert recorded(tmp_path) == ["other"]
        resumed = await thread.resume()
        assert not resumed.paused
        await rt.wait_idle()
        assert recorded(tmp_path) == ["other", "a", "b", "c"]
        assert not (await rt.get_thread("t")).paused
        # Resuming (or pausing) twice changes nothing.
        assert not (await rt.resume_thread("t")).paused


async def test_pausing_lets_a_running_run_finish(tmp_path: Path) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        thread = await rt.create_thread("t")
        slow = await thread.schedule_effect("slow", {"seconds": 0.3})
        after = await thread.schedule_effect("record", {"key": "after"})
        async with asyncio.timeout(30):
            while not (tmp_path / "slow.started").exists():
                await asyncio.sleep(0.01)
        await thread.pause()
        await rt.wait_idle()
        assert (await thread.get_run(slow)).status is EffectStatus.COMPLETED
        assert (await thread.get_run(after)).status is EffectStatus.PENDING
        await thread.resume()
        await rt.wait_idle()
        assert (await thread.get_run(after)).status is EffectStatus.COMPLETED


async def test_pausing_an_unknown_thread_is_refused(tmp_path: Path) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        with pytest.raises(ThreadNotFound):
            await rt.pause_thread("nope")
        with pytest.raises(ThreadNotFound):
            await rt.resume_thread("nope")


async def test_the_guard_stops_a_runaway_chain_with_a_clear_error(tmp_path: Path) -> None:
    clock = FakeClock(start=1_800_000_000.0)  # time stands still: every run is in one second
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False,
        max_immediate_runs_per_second=50,
    ) as rt:
        thread = await rt.create_thread("t")
        await thread.schedule_effect("runaway")  # from outside an effect: not counted
        await rt.wait_idle()
        completed = await runs_by_status(thread, "completed")
        [failed] = await runs_by_status(thread, "failed")
        assert len(completed) == 50
        assert await thread.get_scheduled_effects() == []
        assert failed.error is not None
        assert failed.error.startswith(f"{TooManyImmediateRuns.__name__}: Thread t: ")
        assert "more than 50 immediate runs (delay under 1 s) within one second" in failed.error
        assert "max_immediate_runs_per_second=50" in failed.error

        # A new second, a new allowance; schedules from outside effects are never counted.
        for i in range(60):
            await thread.schedule_effect("record", {"key": f"k{i}"})
        clock.advance(1)
        await thread.schedule_effect("runaway")
        await rt.wait_idle()
        assert len(await runs_by_status(thread, "failed")) == 2


@pytest.mark.parametrize("delay", [1e-9, 0.001])
async def test_a_tiny_positive_delay_does_not_bypass_the_guard(
    tmp_path: Path, delay: float
) -> None:
    effects = tmp_path / "app" / "effects"
    effects.mkdir(parents=True)
    (effects / "tinyaway.py").write_text(
        "from runtime import ThreadState, define_effect\n\n"
        "async def tinyaway(state: ThreadState) -> None:\n"
        f"    await state.schedule_effect('tinyaway', None, {delay!r})\n\n"
        "effect = define_effect('Schedules itself again after a tiny delay.', tinyaway)\n"
    )
    (effects / "patient.py").write_text(
        "from runtime import ThreadState, define_effect\n\n"
        "async def patient(state: ThreadState) -> None:\n"
        "    for _ in range(30):\n"
        "        await state.schedule_effect('tinyaway', None, 1.0)\n\n"
        "effect = define_effect('Schedules 30 runs a second from now.', patient)\n"
    )
    clock = FakeClock(start=1_800_000_000.0)
    async with Runtime(
        app_dir=tmp_path / "app", data_dir=tmp_path / "data", clock=clock,
        load_packages=False, max_immediate_runs_per_second=20,
    ) as rt:
        thread = await rt.create_thread("t")
        await thread.schedule_effect("tinyaway")
        for _ in range(40):  # each link is due `delay` later: let the clock reach it
            await rt.wait_idle()
            clock.advance(delay)
            if await runs_by_status(thread, "failed"):
                break
        [failed] = await runs_by_status(thread, "failed")
        assert failed.error is not None
        assert "more than 20 immediate runs (delay under 1 s)" in failed.error
        assert len(await runs_by_status(thread, "completed")) == 20

        # A delay of 1 s or more is not counted: 30 at once from one effect is fine.
        await thread.schedule_effect("patient")
        await rt.wait_idle()
        assert len(await runs_by_status(thread, "failed")) == 1
        assert len(await thread.get_scheduled_effects()) == 30


async def test_the_default_guard_never_trips_a_fan_out_of_normal_size(tmp_path: Path) -> None:
    fan_out = tmp_path / "app" / "effects"
    fan_out.mkdir(parents=True)
    (fan_out / "fan_out.py").write_text(
        "from runtime import ThreadState, define_effect\n\n"
        "async def fan_out(state: ThreadState) -> None:\n"
        "    for _ in range(100):\n"
        "        await state.schedule_effect('noop')\n\n"
        "effect = define_effect('Schedules 100 runs at once.', fan_out)\n"
    )
    (fan_out / "noop.py").write_text(
        "from runtime import ThreadState, define_effect\n\n"
        "async def noop(state: ThreadState) -> None:\n    pass\n\n"
        "effect = define_effect('Nothing.', noop)\n"
    )
    clock = FakeClock(start=1_800_000_000.0)
    async with Runtime(
        app_dir=tmp_path / "app", data_dir=tmp_path / "data", clock=clock,
        load_packages=False,
    ) as rt:
        thread = await rt.create_thread("t")
        await thread.schedule_effect("fan_out")
        await rt.wait_idle()
        assert len(await runs_by_status(thread, "completed")) == 101


async def test_a_runaway_chain_is_paused_and_resumed_over_http(tmp_path: Path) -> None:
    clock = FakeClock(start=1_800_000_000.0)
    async with serve_api(
        tmp_path / "data", clock=clock, app_dir=APP, max_immediate_runs_per_second=None
    ) as api:
        tid = await api.new_thread()
        await api.schedule(tid, "runaway")
        rt = api.app.state.runtime
        thread = await rt.get_thread(tid)
        async with asyncio.timeout(30):
            while len(await runs_by_status(thread, "completed")) < 20:
                await asyncio.sleep(0.01)
        res = await api.client.post(f"/api/threads/{tid}/pause")
        assert res.status_code == 200, res.text
        assert res.json()["paused"] is True and res.json()["id"] == tid
        await rt.wait_idle()
        # Stopped: the run that was going finished and left its follow-up pending.
        pending = (await api.client.get(f"/api/threads/{tid}/effects?status=pending")).json()
        assert len(pending["runs"]) == 1
        done = len(await runs_by_status(thread, "completed"))
        clock.advance(5)
        await rt.wait_idle()
        assert len(await runs_by_status(thread, "completed")) == done
        assert (await api.client.get(f"/api/threads/{tid}")).json()["paused"] is True
        listed = (await api.client.get("/api/threads")).json()["threads"]
        assert [t["paused"] for t in listed if t["id"] == tid] == [True]
        # Canceling the pending run now ends the chain for good, history kept.
        run_id = pending["runs"][0]["id"]
        res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/cancel")
        assert res.json() == {"canceled": True}

        res = await api.client.post(f"/api/threads/{tid}/resume")
        assert res.status_code == 200 and res.json()["paused"] is False
        await rt.wait_idle()
        assert len(await runs_by_status(thread, "completed")) == done

        res = await api.client.post("/api/threads/nope/pause")
        assert res.status_code == 404 and res.json()["error"]["code"] == "thread_not_found"
        res = await api.client.post(f"/api/threads/{tid}/pause", json={"why": "x"})
        assert res.status_code == 400 and res.json()["error"]["code"] == "invalid_body"
