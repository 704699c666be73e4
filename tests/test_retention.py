"""Retention: completed/canceled kept 30 days, failed 24 hours, at most N finished per thread."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtime import EffectStatus, RetentionPolicy, RunNotFound, Runtime
from runtime.storage.base import StorageBackend
from runtime.testing import FakeClock
from tests.storage.backends import BACKENDS, make_backend, stored_runs

APP = Path(__file__).parent / "apps" / "core"
DAY = 86_400.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture(params=BACKENDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> StorageBackend:
    return make_backend(request.param, tmp_path)


@pytest.fixture
async def rt(
    tmp_path: Path, clock: FakeClock, storage: StorageBackend
) -> AsyncIterator[Runtime]:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as r:
        yield r


async def test_failed_runs_are_kept_24_hours(rt: Runtime, clock: FakeClock) -> None:
    thread = await rt.create_thread()
    failed = await thread.schedule_effect("boom")
    done = await thread.schedule_effect("record", {"key": "k"})
    await rt.wait_idle()

    clock.advance(DAY - 1)
    assert (await thread.get_run(failed)).status is EffectStatus.FAILED
    clock.advance(2)
    with pytest.raises(RunNotFound):
        await thread.get_run(failed)
    assert [r.id for r in (await thread.list_runs()).runs] == [done]


async def test_completed_and_canceled_runs_are_kept_30_days(
    rt: Runtime, clock: FakeClock
) -> None:
    thread = await rt.create_thread()
    done = await thread.schedule_effect("record", {"key": "k"})
    canceled = await thread.schedule_effect("record", {"key": "c"}, delay=60)
    await thread.remove_scheduled_effect(canceled)
    pending = await thread.schedule_effect("record", {"key": "p"}, delay=90 * DAY)
    await rt.wait_idle()

    clock.advance(30 * DAY - 10)
    assert {r.id for r in (await thread.list_runs()).runs} == {done, canceled, pending}
    clock.advance(20)
    # Pending runs are never pruned, however old.
    assert [r.id for r in (await thread.list_runs()).runs] == [pending]
    with pytest.raises(RunNotFound):
        await thread.get_run(done)


async def test_at_most_max_finished_runs_per_thread(
    tmp_path: Path, clock: FakeClock, storage: StorageBackend
) -> None:
    async with Runtime(
        app_dir=APP,
        data_dir=tmp_path,
        clock=clock,
        load_packages=False,
        retention=RetentionPolicy(max_finished=5),
        storage=storage,
    ) as rt:
        thread = await rt.create_thread()
        ids = []
        for i in range(8):
            ids.append(await thread.schedule_effect("record", {"key": str(i)}))
            await rt.wait_idle()
            clock.advance(1)
        pending = await thread.schedule_effect("record", {"key": "p"}, delay=60)

        runs = (await thread.list_runs(limit=100)).runs
        assert [r.id for r in runs] == [pending, *reversed(ids[3:])]
        with pytest.raises(RunNotFound):
            await thread.get_run(ids[2])
    # The pruned runs are gone from the store, not merely hidden.
    assert [r.id for r in stored_runs(storage, thread.thread_id)] == [
        pending, *reversed(ids[3:])
    ]


async def test_reads_never_delete_and_finishing_prunes(
    tmp_path: Path, clock: FakeClock, storage: StorageBackend
) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as rt:
        thread = await rt.create_thread()
        failed = await thread.schedule_effect("boom")
        await rt.wait_idle()
        clock.advance(DAY + 1)
        with pytest.raises(RunNotFound):
            await thread.get_run(failed)
        assert (await thread.list_runs()).runs == []
        # Hidden by the reads, still stored: reads never write.
        assert [r.id for r in stored_runs(storage, thread.thread_id)] == [failed]
        # The next finished run deletes it in the same transaction.
        done = await thread.schedule_effect("record", {"key": "k"})
        await rt.wait_idle()
        assert [r.id for r in stored_runs(storage, thread.thread_id)] == [done]


def test_retention_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        RetentionPolicy(failed_seconds=0)
    with pytest.raises(ValueError):
        RetentionPolicy(max_finished=0)
