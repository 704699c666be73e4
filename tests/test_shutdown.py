"""A shutdown never fails a run: calls are served during the grace period, a refusal is an
interruption, and the timer stops quietly."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from runtime import EffectStatus, Runtime, RuntimeClosed
from runtime.alarms import LoopTimer

APP = Path(__file__).parent / "apps" / "core"


async def wait_for_file(path: Path) -> None:
    async with asyncio.timeout(30):
        while not path.exists():
            await asyncio.sleep(0.01)


async def test_a_run_finishing_in_the_grace_period_schedules_its_follow_up(
    tmp_path: Path,
) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, shutdown_grace_seconds=10
    ) as rt:
        thread = await rt.create_thread("t")
        first = await thread.schedule_effect("again", {"seconds": 0.3, "delay": 60})
        await wait_for_file(tmp_path / "again.started")
        # Leaving the block closes the runtime while the run sleeps.

    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        thread = await rt.get_thread("t")
        run = await thread.get_run(first)
        assert (run.status, run.attempts, run.error) == (EffectStatus.COMPLETED, 1, None)
        follow_up = await thread.get_scheduled_effects("again")
        assert len(follow_up) == 1 and follow_up[0].id != first


REFUSED = '''
import asyncio
from runtime import RuntimeClosed, ThreadState, define_effect

async def refused(state: ThreadState) -> None:
    (state.runtime.settings.data_dir / "refused.started").write_text("x")
    while not (state.runtime.settings.data_dir / "refused.go").exists():
        await asyncio.sleep(0.01)
    try:
        raise RuntimeClosed("The runtime is not running (not started, or shut down)")
    except RuntimeClosed as exc:
        raise RuntimeError("could not save the result") from exc

effect = define_effect("Fails because a call was refused by a shutdown.", refused)
'''


async def test_a_run_refused_by_the_shutdown_goes_back_to_pending(tmp_path: Path) -> None:
    app = tmp_path / "app"
    (app / "effects").mkdir(parents=True)
    (app / "effects" / "refused.py").write_text(REFUSED)
    data = tmp_path / "data"
    rt = Runtime(app_dir=app, data_dir=data, load_packages=False, shutdown_grace_seconds=10)
    await rt.start()
    thread = await rt.create_thread("t")
    run_id = await thread.schedule_effect("refused")
    await wait_for_file(data / "refused.started")
    sub = thread.subscribe()
    closing = asyncio.create_task(rt.close())
    await asyncio.sleep(0.05)
    (data / "refused.go").write_text("go")
    await closing
    events = [e async for e in sub]
    assert [str(e.change) for e in events] == ["requeued"]
    assert events[0].run.status is EffectStatus.PENDING and events[0].run.error is None

    # The same error outside a shutdown is the effect's failure, as any other.
    async with Runtime(app_dir=app, data_dir=data, load_packages=False) as rt:
        thread = await rt.get_thread("t")
        (data / "refused.started").unlink()
        await wait_for_file(data / "refused.started")
        await rt.wait_idle()
        run = await thread.get_run(run_id)
        assert run.status is EffectStatus.FAILED and run.attempts == 2
        assert run.error == "RuntimeError: could not save the result"


async def test_calls_after_the_grace_period_are_refused(tmp_path: Path) -> None:
    rt = Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False)
    await rt.start()
    thread = await rt.create_thread("t")
    await rt.close()
    with pytest.raises(RuntimeClosed, match="not running"):
        await thread.schedule_effect("note", {"text": "late"})


def test_the_timer_stops_quietly_with_an_alarm_due_in_flight(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fired: list[str] = []

    async def main() -> None:
        timer = LoopTimer(fired.append)
        timer.start()
        timer.arm("t", time.time() + 0.01)
        time.sleep(0.02)  # due now: the loop's next iteration would run its handle
        # The timer stops in the loop's last iteration, before that handle ran: it is
        # cancelled, no error, and the alarm does not fire.
        timer.shutdown()

    asyncio.run(main())
    assert fired == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_node_of_several_hands_its_requeued_frame_to_its_own_stream_before_closing(
    pg_url: str, tmp_path: Path,
) -> None:
    """PostgreSQL: the stream of a thread whose first frame on this node is the shutdown's
    ``requeued`` frame (subscribed while the run ran) gets it before it ends."""
    from runtime.storage.postgres import PostgresBackend

    rt = Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False,
                 shutdown_grace_seconds=0.1,
                 storage=PostgresBackend(pg_url, node_id="closing"))
    await rt.start()
    try:
        thread = await rt.create_thread("t")
        run_id = await thread.schedule_effect("slow", {"seconds": 60})
        async with asyncio.timeout(30):
            while (await thread.get_run(run_id)).status is not EffectStatus.RUNNING:
                await asyncio.sleep(0.02)
        sub = thread.subscribe()
        await rt.close()
        async with asyncio.timeout(30):  # a hang guard
            events = [e async for e in sub]
    finally:
        await rt.close()
    # (Its ``started`` frame comes first if it was relayed after the subscription.)
    assert [str(e.change) for e in events] in (["requeued"], ["started", "requeued"])
    assert (events[-1].run.id, events[-1].run.status) == (run_id, EffectStatus.PENDING)
