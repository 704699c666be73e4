"""Recurring schedules as a user sees them: fire times (DST included), skips, coalescing,
pause/resume/cancel, keys, frames and the HTTP routes."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from runtime import (
    EffectStatus,
    InvalidSchedule,
    Runtime,
    Schedule,
    ScheduleChange,
    ScheduleChanged,
    ScheduleNotFound,
    ScheduleState,
    ThreadState,
)
from runtime.recurrence import Recurrence
from runtime.storage.memory import MemoryBackend
from runtime.testing import FakeClock
from tests.conftest import Api, release, serve_api
from tests.storage.backends import make_backend

APP = Path(__file__).parent / "apps" / "scheduling"


def ts(text: str) -> float:
    """An ISO 8601 UTC time as seconds since the epoch."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M")


@pytest.fixture
async def api(tmp_path: Path, backend_settings: dict[str, Any]) -> AsyncIterator[Api]:
    async with serve_api(tmp_path / "data", clock=FakeClock(ts("2026-03-28T12:00:00")),
                         app_dir=APP, **backend_settings) as running:
        yield running


def clock_of(api: Api) -> FakeClock:
    assert api.clock is not None
    return api.clock


async def step(api: Api, seconds: float) -> None:
    """Move the fake clock on, then let the drains it woke finish."""
    clock_of(api).advance(seconds)
    await api.rt.wait_idle()


async def fire_times(thread: ThreadState, schedule_id: str) -> list[str]:
    page = await thread.list_runs(limit=500)
    runs = [r for r in page.runs if r.schedule_id == schedule_id]
    return sorted(iso(r.run_at_ts) for r in runs)


# --------------------------------------------------------------- cron and DST


async def test_cron_on_the_spring_forward_day_fires_a_missing_wall_time_shifted(api: Api) -> None:
    # Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST. 02:30 does not exist that
    # day: it fires once, at 01:30 UTC (02:30 CET, shown as 03:30 CEST).
    thread = await api.rt.create_thread()
    made = await thread.schedule_recurring(
        "ping", cron="30 2 * * *", timezone="Europe/Berlin"
    )
    assert made.created
    assert iso(made.schedule.next_fire_at_ts or 0) == "2026-03-29 01:30"
    hourly = await thread.schedule_recurring("ping", cron="0 * * * *", timezone="Europe/Berlin")
    for _ in range(72):  # three days, an hour at a time
        await step(api, 3600)
    daily = await fire_times(thread, made.schedule.id)
    assert daily == ["2026-03-29 01:30", "2026-03-30 00:30", "2026-03-31 00:30"]
    hours = await fire_times(thread, hourly.schedule.id)
    # Hourly stays hourly in UTC across the jump: 01:00 CET (00:00 UTC), then 03:00 CEST
    # (01:00 UTC): the hour that does not exist is not made up, none is doubled.
    night = [h for h in hours if h.startswith("2026-03-29 0")]
    assert night[:4] == [
        "2026-03-29 00:00", "2026-03-29 01:00", "2026-03-29 02:00", "2026-03-29 03:00"
    ]
    assert len(hours) == len(set(hours)) == 72
    runs = (await thread.list_runs(limit=500)).runs
    assert {r.status for r in runs} == {EffectStatus.COMPLETED}


async def test_cron_on_the_fall_back_day_fires_a_repeated_wall_time_twice(api: Api) -> None:
    # Europe/Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice.
    clock_of(api).advance(ts("2026-10-24T12:00:00") - clock_of(api).now())
    thread = await api.rt.create_thread()
    made = await thread.schedule_recurring(
        "ping", cron="30 2 * * *", timezone="Europe/Berlin"
    )
    hourly = await thread.schedule_recurring("ping", cron="0 * * * *", timezone="Europe/Berlin")
    for _ in range(48):
        await step(api, 3600)
    assert await fire_times(thread, made.schedule.id) == [
        "2026-10-25 00:30", "2026-10-25 01:30", "2026-10-26 01:30"
    ]
    hours = await fire_times(thread, hourly.schedule.id)
    assert [h for h in hours if h.startswith("2026-10-25 0")][:4] == [
        "2026-10-25 00:00", "2026-10-25 01:00", "2026-10-25 02:00", "2026-10-25 03:00"
    ]
    assert len(hours) == len(set(hours)) == 48


@pytest.mark.parametrize("cron", ["0,30 1 * * *", "*/30 * * * *"])
async def test_a_repeated_wall_time_fires_twice_where_winter_is_utc_plus_zero(
    api: Api, cron: str
) -> None:
    # Europe/London, 2026-10-25: 02:00 BST goes back to 01:00 GMT (offset +0000); 01:00
    # and 01:30 happen twice, at 00:00/00:30 UTC (BST) and again at 01:00/01:30 UTC (GMT).
    clock_of(api).advance(ts("2026-10-24T12:00:00") - clock_of(api).now())
    thread = await api.rt.create_thread()
    made = await thread.schedule_recurring("ping", cron=cron, timezone="Europe/London")
    for _ in range(48):
        await step(api, 1800)
    fires = await fire_times(thread, made.schedule.id)
    assert [f for f in fires if "2026-10-25 00:00" <= f <= "2026-10-25 01:30"] == [
        "2026-10-25 00:00", "2026-10-25 00:30", "2026-10-25 01:00", "2026-10-25 01:30"
    ]
    assert len(fires) == len(set(fires))


@pytest.mark.parametrize(
    ("zone", "start", "fires"),
    [
        # Clocks jump at midnight: 00:00 does not exist that day; it fires once, shifted
        # by the gap (01:00 local). APScheduler 3's own zone handling skipped this day.
        ("America/Havana", "2026-03-07T20:00:00",
         ["2026-03-08 05:00", "2026-03-09 04:00", "2026-03-10 04:00"]),
        ("America/Santiago", "2026-09-05T20:00:00",
         ["2026-09-06 04:00", "2026-09-07 03:00", "2026-09-08 03:00"]),
        # Beside them, a zone whose clocks jump at 02:00: midnight exists, nothing shifts.
        ("Europe/Berlin", "2026-03-28T12:00:00",
         ["2026-03-28 23:00", "2026-03-29 22:00", "2026-03-30 22:00"]),
    ],
)
async def test_a_daily_cron_fires_on_a_day_whose_midnight_falls_in_a_gap(
    tmp_path: Path, zone: str, start: str, fires: list[str]
) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock(ts(start)), app_dir=APP) as api:
        thread = await api.rt.create_thread()
        made = await thread.schedule_recurring("ping", cron="0 0 * * *", timezone=zone)
        assert iso(made.schedule.next_fire_at_ts or 0) == fires[0]
        for _ in range(3 * 24):
            await step(api, 3600)
        assert await fire_times(thread, made.schedule.id) == fires


def test_day_of_month_and_weekday_both_restricted_fire_on_either() -> None:
    # Crontab (Vixie cron): "13 * 5" is the 13th of any month OR any Friday.
    recurrence = Recurrence.parse(cron="0 9 13 * 5")
    fires: list[str] = []
    at: float | None = ts("2026-11-30T00:00:00")  # a Monday
    for _ in range(4):
        assert at is not None
        at = recurrence.next_fire(at, 0)
        assert at is not None
        fires.append(iso(at))
    assert fires == [
        "2026-12-04 09:00", "2026-12-11 09:00", "2026-12-13 09:00", "2026-12-18 09:00"
    ]
    # One field left as * (or */n): both must match, as before.
    on_the_13th = Recurrence.parse(cron="0 9 13 * */1")
    assert iso(on_the_13th.next_fire(ts("2026-11-30T00:00:00"), 0) or 0) == (
        "2026-12-13 09:00"
    )


@pytest.mark.parametrize(
    "cron", ["0 9 31 2 *", "0 9 30 2 *", "0 9 31 4,6,9,11 *", "0 9 31 2 */2"]
)
async def test_a_cron_that_never_fires_is_refused(api: Api, cron: str) -> None:
    with pytest.raises(InvalidSchedule, match="never fires"):
        Recurrence.parse(cron=cron)
    tid = await api.new_thread()
    res = await api.client.post(
        f"/api/threads/{tid}/schedules", json={"name": "ping", "cron": cron}
    )
    assert res.status_code == 422, res.text
    assert res.json()["error"]["code"] == "invalid_schedule"
    assert "never fires" in res.json()["error"]["message"]
    # A date that exists only some years is fine.
    assert Recurrence.parse(cron="0 9 29 2 *").next_fire(ts("2026-01-01T00:00:00"), 0) == (
        ts("2028-02-29T09:00:00")
    )


# ------------------------------------------------------------- every, skips


@pytest.mark.every_backend
async def test_every_makes_one_run_per_period_on_a_grid(api: Api) -> None:
    thread = await api.rt.create_thread()
    start = clock_of(api).now()
    sid = await thread.schedule_effect("ping", every=timedelta(minutes=10))
    for _ in range(3):
        await step(api, 600)
    runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
    assert sorted(r.run_at_ts for r in runs) == [start + 600, start + 1200, start + 1800]
    assert all(r.status is EffectStatus.COMPLETED for r in runs)
    schedule = await thread.get_schedule(sid)
    assert (schedule.occurrences, schedule.skipped) == (3, 0)
    assert schedule.next_fire_at_ts == start + 2400
    assert schedule.to_json()["everySeconds"] == 600
    # Across threads too (the run index keeps the schedule id).
    across = await api.rt.list_runs(thread_id=thread.thread_id)
    assert [r.schedule_id for r in across.runs] == [sid, sid, sid]
    listed = (await api.client.get("/api/runs")).json()["runs"]
    assert {r["scheduleId"] for r in listed} == {sid}


@pytest.mark.every_backend
async def test_a_schedule_never_stacks_runs_it_skips_and_counts(api: Api) -> None:
    thread = await api.rt.create_thread()
    sid = await thread.schedule_effect("hold", {"key": "slow"}, every=60)
    clock_of(api).advance(60)
    run_id = await _running_of(thread, sid)
    for _ in range(3):  # three fire times come while the first occurrence runs
        clock_of(api).advance(60)
        await asyncio.sleep(0.05)
    release(api.rt, "slow")
    await api.rt.wait_idle()
    schedule = await thread.get_schedule(sid)
    assert (schedule.occurrences, schedule.skipped) == (1, 3)
    runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
    assert [r.id for r in runs] == [run_id]
    await step(api, 60)  # free again: the next fire time makes a run
    schedule = await thread.get_schedule(sid)
    assert (schedule.occurrences, schedule.skipped) == (2, 3)


async def _running_of(thread: ThreadState, schedule_id: str) -> str:
    for _ in range(2000):
        page = await thread.list_runs(status="running")
        for run in page.runs:
            if run.schedule_id == schedule_id:
                return run.id
        await asyncio.sleep(0.005)
    raise AssertionError("no occurrence started")


async def test_missed_fire_times_make_one_run_after_a_restart(tmp_path: Path) -> None:
    clock = FakeClock(ts("2026-05-01T08:00:00"))
    async with Runtime(app_dir=APP, data_dir=tmp_path / "d", clock=clock) as rt:
        thread = await rt.create_thread("t1")
        sid = await thread.schedule_effect("ping", every=60)
        clock.advance(60)
        await rt.wait_idle()
    clock.advance(3600)  # down for an hour: sixty fire times missed
    async with Runtime(app_dir=APP, data_dir=tmp_path / "d", clock=clock) as rt:
        await rt.wait_idle()
        thread = await rt.get_thread("t1")
        runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
        assert len(runs) == 2  # the one before, and one for the whole hour missed
        schedule = await thread.get_schedule(sid)
        assert schedule.occurrences == 2 and schedule.skipped == 0
        # The next fire time is the first one after now, on the grid.
        assert schedule.next_fire_at_ts == clock.now() + 60
        assert {r.status for r in runs} == {EffectStatus.COMPLETED}


async def test_fire_times_missed_while_down_are_never_counted_as_skipped(
    tmp_path: Path,
) -> None:
    clock = FakeClock(ts("2026-05-01T08:00:00"))
    (tmp_path / "d").mkdir()
    async with Runtime(app_dir=APP, data_dir=tmp_path / "d", clock=clock) as rt:
        thread = await rt.create_thread("t1")
        sid = await thread.schedule_effect("hold", {"key": "slow"}, every=60)
        clock.advance(60)
        run_id = await _running_of(thread, sid)
        clock.advance(60)  # a fire time while the process runs and the occurrence runs
        await asyncio.sleep(0.05)
    # Closed while its occurrence ran: it is re-queued at the next start.
    clock.advance(3600)  # down for an hour: sixty fire times pass
    async with Runtime(app_dir=APP, data_dir=tmp_path / "d", clock=clock) as rt:
        thread = await rt.get_thread("t1")
        release(rt, "slow")
        await rt.wait_idle()
        schedule = await thread.get_schedule(sid)
        runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
        # The interrupted occurrence covered the outage: no run made for it, and its
        # sixty fire times counted as nothing; the fire time that came while the process
        # ran is the one skip.
        assert [r.id for r in runs] == [run_id]
        assert (schedule.occurrences, schedule.skipped) == (1, 1)
        assert schedule.next_fire_at_ts == ts("2026-05-01T09:03:00")


async def test_a_schedule_whose_effect_is_gone_is_paused_with_a_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = tmp_path / "app"
    shutil.copytree(APP, app)
    clock = FakeClock(ts("2026-05-01T08:00:00"))
    async with Runtime(app_dir=app, data_dir=tmp_path / "d", clock=clock) as rt:
        thread = await rt.create_thread("t1")
        sid = await thread.schedule_effect("ping", every=60)
    (app / "effects" / "ping.py").unlink()  # the effect file removed between restarts
    async with Runtime(app_dir=app, data_dir=tmp_path / "d", clock=clock) as rt:
        thread = await rt.get_thread("t1")
        for _ in range(3):
            clock.advance(60)
            await rt.wait_idle()
        schedule = await thread.get_schedule(sid)
        assert schedule.to_json()["state"] == "paused"
        assert schedule.to_json()["pausedReason"] == "effect not found: ping"
        assert [s.paused_reason for s in await thread.list_schedules()] == [
            "effect not found: ping"
        ]
        assert [r for r in (await thread.list_runs()).runs if r.schedule_id == sid] == []
        assert schedule.occurrences == 0
        assert any(sid in r.getMessage() and "ping" in r.getMessage()
                   for r in caplog.records if r.levelname == "WARNING")
        resumed = await thread.resume_schedule(sid)
        assert (resumed.state, resumed.paused_reason) == (ScheduleState.ACTIVE, None)


async def test_fire_times_during_start_up_are_never_counted_as_skipped(
    tmp_path: Path,
) -> None:
    clock = FakeClock(ts("2026-05-01T08:00:00"))
    async with Runtime(app_dir=APP, data_dir=tmp_path / "d", clock=clock) as rt:
        thread = await rt.create_thread("t1")
        sid = await thread.schedule_effect("hold", {"key": "slow"}, every=60)
        clock.advance(60)
        run_id = await _running_of(thread, sid)
    # Closed while its occurrence ran: it is re-queued at the next start.
    clock.advance(30)
    async with Runtime(app_dir=APP, data_dir=tmp_path / "d", clock=clock) as rt:
        # Started, but the thread has not drained yet: the re-queued occurrence is not
        # claimed. A fire time passes now (08:02), still part of the start-up.
        clock.advance(60)
        thread = await rt.get_thread("t1")
        await _running_of(thread, sid)
        release(rt, "slow")
        await rt.wait_idle()
        schedule = await thread.get_schedule(sid)
        runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
        assert [r.id for r in runs] == [run_id]
        assert (schedule.occurrences, schedule.skipped) == (1, 0)
        assert schedule.next_fire_at_ts == ts("2026-05-01T08:03:00")


@pytest.mark.every_backend
async def test_pause_creates_nothing_and_resume_starts_from_now(api: Api) -> None:
    thread = await api.rt.create_thread()
    sid = await thread.schedule_effect("ping", every=60)
    await step(api, 60)
    paused = await thread.pause_schedule(sid)
    assert paused.state is ScheduleState.PAUSED and paused.next_fire_at_ts is None
    for _ in range(5):
        await step(api, 60)
    assert (await thread.get_schedule(sid)).occurrences == 1
    resumed = await thread.resume_schedule(sid)
    assert resumed.state is ScheduleState.ACTIVE
    assert resumed.next_fire_at_ts == clock_of(api).now() + 60  # no backlog
    await step(api, 60)
    assert (await thread.get_schedule(sid)).occurrences == 2


async def test_a_paused_thread_holds_occurrences_and_runs_one_on_resume(api: Api) -> None:
    thread = await api.rt.create_thread()
    sid = await thread.schedule_effect("ping", every=60)
    await api.rt.pause_thread(thread.thread_id)
    for _ in range(3):
        await step(api, 60)
    assert (await thread.get_schedule(sid)).occurrences == 0
    await api.rt.resume_thread(thread.thread_id)
    await api.rt.wait_idle()
    runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
    assert len(runs) == 1 and runs[0].status is EffectStatus.COMPLETED


@pytest.mark.every_backend
async def test_cancel_deletes_the_schedule_and_keeps_its_runs(api: Api) -> None:
    thread = await api.rt.create_thread()
    sid = await thread.schedule_effect("ping", every=60, key="beat")
    await step(api, 60)
    removed = await thread.cancel_schedule(sid)
    assert removed.id == sid
    with pytest.raises(ScheduleNotFound):
        await thread.get_schedule(sid)
    with pytest.raises(ScheduleNotFound):
        await thread.cancel_schedule(sid)
    await step(api, 600)
    runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
    assert len(runs) == 1
    assert await thread.list_schedules() == []
    # The key is free again.
    again = await thread.schedule_recurring("ping", every=60, key="beat")
    assert again.created and again.schedule.id != sid


@pytest.mark.every_backend
async def test_a_key_makes_one_schedule(api: Api) -> None:
    thread = await api.rt.create_thread()
    made = await asyncio.gather(*(
        thread.schedule_recurring("ping", cron="0 9 * * 1-5", timezone="Europe/Istanbul",
                                  key="digest")
        for _ in range(10)
    ))
    assert sum(m.created for m in made) == 1
    assert len({m.schedule.id for m in made}) == 1
    assert len(await thread.list_schedules()) == 1
    assert await thread.schedule_effect(
        "ping", cron="0 9 * * 1-5", timezone="Europe/Istanbul", key="digest"
    ) == made[0].schedule.id


@pytest.mark.every_backend
async def test_deleting_the_thread_deletes_its_schedules(api: Api) -> None:
    thread = await api.rt.create_thread("gone")
    await thread.schedule_effect("ping", every=60)
    await api.rt.delete_thread("gone")
    again = await api.rt.create_thread("gone")
    assert await again.list_schedules() == []
    await step(api, 120)
    assert (await again.list_runs()).runs == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "0 9 * * 1-5", "every": 60}, "either cron or every"),
        ({}, "needs cron or every"),
        ({"cron": "61 * * * *"}, r"cron '61 \* \* \* \*' is not a valid crontab.*\(59\)"),
        ({"cron": "* * *"}, "is not a valid crontab"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "Unknown timezone 'Mars/Olympus'"),
        # Host-dependent names are not IANA zones: the schedule would move with the host.
        ({"cron": "0 9 * * *", "timezone": "localtime"}, "Unknown timezone 'localtime'"),
        ({"cron": "0 9 * * *", "timezone": "posix/Europe/Berlin"}, "Unknown timezone"),
        ({"cron": "0 \u0669 * * *"}, "only ASCII characters"),
        ({"every": 0.5}, "every must be at least 1 s"),
        ({"every": timedelta(milliseconds=10)}, "every must be at least 1 s"),
        ({"every": float("nan")}, "every must be a finite number"),
        ({"every": "60"}, "every must be seconds"),
        ({"every": 60, "timezone": "UTC"}, "timezone applies to cron only"),
    ],
)
async def test_bad_recurrence_is_refused_naming_the_argument(
    api: Api, kwargs: dict[str, Any], message: str
) -> None:
    thread = await api.rt.create_thread()
    with pytest.raises(InvalidSchedule, match=message) as err:
        await thread.schedule_recurring("ping", **kwargs)
    assert isinstance(err.value, ValueError)
    assert await thread.list_schedules() == []


async def test_cron_or_every_with_delay_or_at_is_refused(api: Api) -> None:
    thread = await api.rt.create_thread()
    with pytest.raises(InvalidSchedule, match="not both"):
        await thread.schedule_effect("ping", None, 5, every=60)
    with pytest.raises(InvalidSchedule, match="not both"):
        await thread.schedule_effect(
            "ping", cron="0 9 * * *", at=datetime(2030, 1, 1, tzinfo=UTC)
        )
    assert await thread.list_schedules() == []
    assert (await thread.list_runs()).runs == []


async def test_schedule_frames_share_the_threads_seq_and_carry_no_args(api: Api) -> None:
    thread = await api.rt.create_thread()
    sub = thread.subscribe()
    sid = await thread.schedule_effect("hold", {"key": "f"}, every=60)
    clock_of(api).advance(60)
    await _running_of(thread, sid)
    clock_of(api).advance(60)  # skipped: the first occurrence still runs
    await asyncio.sleep(0.05)
    release(api.rt, "f")
    await api.rt.wait_idle()
    await thread.pause_schedule(sid)
    await thread.resume_schedule(sid)
    await thread.cancel_schedule(sid)
    frames = []
    while len(frames) < 100:
        try:
            event = await asyncio.wait_for(sub.__anext__(), 0.2)
        except TimeoutError:
            break
        frames.append(event.to_frame())
    sub.close()
    seqs = [f["seq"] for f in frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    changes = [
        (f["eventType"], f["data"]["change"]) for f in frames
        if f["eventType"] == "schedule_changed"
    ]
    assert changes == [
        ("schedule_changed", c)
        for c in ("created", "fired", "skipped", "paused", "resumed", "canceled")
    ]
    assert all("args" not in f["data"] for f in frames)
    fired = next(f for f in frames if f["eventType"] == "effect_changed")
    assert fired["data"]["scheduleId"] == sid


# ------------------------------------------------------------------- HTTP


@pytest.mark.every_backend
async def test_http_create_list_pause_resume_cancel(api: Api) -> None:
    tid = await api.new_thread()
    base = f"/api/threads/{tid}/schedules"
    res = await api.client.post(base, json={
        "name": "ping", "cron": "0 9 * * 1-5", "timezone": "Europe/Istanbul", "key": "digest",
    })
    assert res.status_code == 201, res.text
    made = res.json()
    # 2026-03-28 is a Saturday: the next weekday 09:00 in Istanbul (UTC+3) is Monday 06:00Z.
    assert made["nextFireAt"] == "2026-03-30T06:00:00Z"
    assert (made["cron"], made["timezone"], made["everySeconds"]) == (
        "0 9 * * 1-5", "Europe/Istanbul", None)
    assert (made["state"], made["occurrences"], made["skipped"]) == ("active", 0, 0)
    same = await api.client.post(base, json={"name": "ping", "every_seconds": 5, "key": "digest"})
    assert same.status_code == 200 and same.json()["id"] == made["id"]
    every = await api.client.post(base, json={"name": "ping", "every_seconds": 90})
    assert every.status_code == 201 and every.json()["everySeconds"] == 90
    listed = (await api.client.get(base)).json()["schedules"]
    assert [s["id"] for s in listed] == [made["id"], every.json()["id"]]
    assert "args" not in listed[0]
    one = (await api.client.get(f"{base}/{made['id']}")).json()
    assert one["args"] is None and one["id"] == made["id"]

    paused = (await api.client.post(f"{base}/{made['id']}/pause")).json()
    assert paused["state"] == "paused" and paused["nextFireAt"] is None
    resumed = (await api.client.post(f"{base}/{made['id']}/resume")).json()
    assert resumed["state"] == "active" and resumed["nextFireAt"] == "2026-03-30T06:00:00Z"
    await step(api, 90)
    runs = (await api.client.get(f"/api/threads/{tid}/effects")).json()["runs"]
    assert [r["scheduleId"] for r in runs] == [every.json()["id"]]
    canceled = await api.client.post(f"{base}/{made['id']}/cancel")
    assert canceled.status_code == 200 and canceled.json()["id"] == made["id"]
    gone = await api.client.get(f"{base}/{made['id']}")
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "schedule_not_found"
    again = await api.client.post(f"{base}/{made['id']}/pause")
    assert again.status_code == 404


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"cron": "0 25 * * *"}, "cron '0 25 * * *' is not a valid crontab"),
        ({"cron": "0 9 * * *", "timezone": "Europe/Atlantis"}, "Unknown timezone"),
        # Messages name the HTTP fields: every_seconds, not the Python every.
        ({"every_seconds": 0.25}, "every_seconds must be at least 1 s"),
        ({"every_seconds": 1e12}, "every_seconds must be at most"),
        ({"cron": "0 9 * * *", "every_seconds": 60}, "either cron or every_seconds, not both"),
        ({"every_seconds": 60, "timezone": "UTC"}, "every_seconds counts seconds"),
        ({"every_seconds": "60"}, "every_seconds must be a number"),
        ({}, "needs cron or every_seconds"),
        # A field of the wrong type is invalid_schedule as well, not a generic body error.
        ({"cron": 5}, "cron must be a string, got 5"),
        ({"cron": "0 9 * * *", "timezone": 5}, "timezone must be an IANA zone name"),
        ({"cron": "0 9 * * *", "timezone": "localtime"}, "Unknown timezone 'localtime'"),
        ({"cron": "0 9 * * \u0661"}, "only ASCII characters"),
    ],
)
async def test_http_bad_schedules_are_422_naming_the_argument(
    api: Api, body: dict[str, Any], message: str
) -> None:
    tid = await api.new_thread()
    res = await api.client.post(f"/api/threads/{tid}/schedules", json={"name": "ping", **body})
    assert res.status_code == 422, res.text
    error = res.json()["error"]
    assert error["code"] == "invalid_schedule"
    assert message in error["message"]
    assert (await api.client.get(f"/api/threads/{tid}/schedules")).json() == {"schedules": []}


async def test_http_run_at_errors_name_run_at(api: Api) -> None:
    tid = await api.new_thread()
    res = await api.client.post(f"/api/threads/{tid}/effects",
                                json={"name": "ping", "run_at": "2090-01-01T00:00:00Z"})
    assert res.status_code == 422, res.text
    assert res.json()["error"]["message"].startswith("run_at must be at most")
    res = await api.client.post(f"/api/threads/{tid}/effects",
                                json={"name": "ping", "run_at": "2026-12-01T09:00:00"})
    assert res.status_code == 422 and "run_at must carry its offset" in res.text


async def test_http_schedule_body_errors(api: Api) -> None:
    tid = await api.new_thread()
    base = f"/api/threads/{tid}/schedules"
    res = await api.client.post(base, json={"name": "ping", "every_seconds": 60, "delay": 1})
    assert res.status_code == 400 and "unknown field" in res.json()["error"]["message"]
    res = await api.client.post(base, json={"name": "nope", "every_seconds": 60})
    assert res.status_code == 404 and res.json()["error"]["code"] == "effect_not_found"
    res = await api.client.post("/api/threads/missing/schedules",
                                json={"name": "ping", "every_seconds": 60})
    assert res.status_code == 404 and res.json()["error"]["code"] == "thread_not_found"


# ------------------------------------------------------- crontab weekdays


@pytest.mark.parametrize(
    ("weekdays", "first_days"),
    [
        ("1-5", ["Mon", "Tue", "Wed", "Thu", "Fri", "Mon"]),
        ("0", ["Sun", "Sun"]),
        ("7", ["Sun", "Sun"]),
        ("5-7", ["Sun", "Fri", "Sat", "Sun"]),
        ("7-7", ["Sun", "Sun"]),
        ("0-0", ["Sun", "Sun"]),
        ("0-1", ["Sun", "Mon", "Sun"]),
        ("6-7", ["Sun", "Sat", "Sun"]),
        ("0-7", ["Sun", "Mon", "Tue"]),
        ("fri-sun", ["Sun", "Fri", "Sat", "Sun"]),
        ("sat,sun", ["Sun", "Sat", "Sun"]),
        ("*/3", ["Sun", "Wed", "Sat", "Sun"]),
    ],
)
def test_cron_weekdays_are_numbered_as_crontab_numbers_them(
    weekdays: str, first_days: list[str]
) -> None:
    # APScheduler 3 counts weekdays from Monday; a crontab's 0 (and 7) is Sunday.
    recurrence = Recurrence.parse(cron=f"0 9 * * {weekdays}", timezone="UTC")
    at: float | None = ts("2026-03-29T00:00:00")  # a Sunday
    days = []
    for _ in first_days:
        assert at is not None
        at = recurrence.next_fire(at, 0)
        assert at is not None
        days.append(datetime.fromtimestamp(at, UTC).strftime("%a"))
    assert days == first_days


@pytest.mark.parametrize("weekdays", ["8", "5-2", "mon-xyz", "*/0", "7-1", "\u0665", "*/\u0662"])
def test_a_bad_crontab_weekday_is_refused(weekdays: str) -> None:
    with pytest.raises(InvalidSchedule, match=r"cron .* is not a valid crontab"):
        Recurrence.parse(cron=f"0 9 * * {weekdays}")


@pytest.mark.parametrize(
    ("cron", "field"),
    [
        ("*/0 9 * * *", "minute"), ("5/0 9 * * *", "minute"), ("0 0-23/0 * * *", "hour"),
        ("0 9 1-31/0 * *", "day"), ("0 9 * */0 *", "month"), ("0 9 * 1-12/0 *", "month"),
        ("0 9 * jan-dec/0 *", "month"), ("0 9 * jan/0 *", "month"),
        ("0 9 * 1,jan-dec/0 *", "month"), ("0 9 * * mon-fri/0", "weekday"),
        ("0 9 * jan-dec/x *", "month"), ("0 9 * jan-dec/ *", "month"),
    ],
)
def test_a_step_of_zero_is_refused_in_every_field_form(cron: str, field: str) -> None:
    with pytest.raises(InvalidSchedule, match=rf"not a valid crontab.*{field} step"):
        Recurrence.parse(cron=cron)
    assert Recurrence.parse(cron="0 9 * jan-dec/2 *").cron == "0 9 * jan-dec/2 *"


async def test_a_zoneinfo_is_accepted_as_the_timezone(api: Api, tmp_path: Path) -> None:
    thread = await api.rt.create_thread()
    made = await thread.schedule_recurring(
        "ping", cron="30 2 * * *", timezone=ZoneInfo("Europe/Berlin")
    )
    assert made.schedule.recurrence.timezone == "Europe/Berlin"
    assert made.schedule.next_fire_at_ts == ts("2026-03-29T01:30:00")  # in the gap
    # A ZoneInfo read from a file has no IANA key: refused as any unknown zone.
    source = Path("/usr/share/zoneinfo/Europe/Berlin")
    if source.exists():
        with source.open("rb") as f:
            keyless = ZoneInfo.from_file(f)
        with pytest.raises(InvalidSchedule, match="timezone must be an IANA zone name"):
            Recurrence.parse(cron="0 9 * * *", timezone=keyless)


@pytest.mark.parametrize("kind", ["memory", "postgres"])
async def test_the_other_backends_fire_skip_and_coalesce_the_same(
    tmp_path: Path, kind: str
) -> None:
    clock = FakeClock(ts("2026-05-01T08:00:00"))
    (tmp_path / "m").mkdir()  # where the hold effect keeps its log
    storage = MemoryBackend() if kind == "memory" else make_backend(kind, tmp_path / "m")
    async with Runtime(app_dir=APP, data_dir=tmp_path / "m", clock=clock,
                       storage=storage) as rt:
        thread = await rt.create_thread()
        sid = await thread.schedule_effect("hold", {"key": "mem"}, every=60)
        clock.advance(60)
        await _running_of(thread, sid)
        for _ in range(2):
            clock.advance(60)
            await asyncio.sleep(0.05)
        release(rt, "mem")
        await rt.wait_idle()
        schedule = await thread.get_schedule(sid)
        assert (schedule.occurrences, schedule.skipped) == (1, 2)
        await thread.pause_schedule(sid)
        clock.advance(600)
        await rt.wait_idle()
        resumed = await thread.resume_schedule(sid)
        # From now, on the grid: the ten fire times it was paused for are not made up.
        assert resumed.next_fire_at_ts == clock.now() + 60
        assert (await thread.get_schedule(sid)).occurrences == 1
        clock.advance(60)
        await rt.wait_idle()
        assert (await thread.get_schedule(sid)).occurrences == 2


async def test_a_schedule_of_a_concurrent_effect_fires_on_time_beside_a_long_run(
    api: Api,
) -> None:
    # A long run in line holds the thread; the schedule's runs (a concurrent effect, whose
    # gate is open, so each ends at once) start at their fire times all the same.
    gates = api.rt.registry.app["long_work"].fn.__globals__["GATES"]
    gates.setdefault("beat", asyncio.Event()).set()
    thread = await api.rt.create_thread()
    blocker = await thread.schedule_effect("hold", {"key": "block"})
    for _ in range(2000):
        if (await thread.get_run(blocker)).status is EffectStatus.RUNNING:
            break
        await asyncio.sleep(0.005)
    sid = await thread.schedule_effect("long_work", {"key": "beat"}, every=60)
    for n in range(1, 4):
        clock_of(api).advance(60)
        for _ in range(2000):  # the n-th occurrence ran to its end (else the next skips)
            page = await thread.list_runs(status="completed")
            if len([r for r in page.runs if r.schedule_id == sid]) == n:
                break
            await asyncio.sleep(0.005)
    schedule = await thread.get_schedule(sid)
    assert (schedule.occurrences, schedule.skipped) == (3, 0)
    assert (await thread.get_run(blocker)).status is EffectStatus.RUNNING
    runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
    assert len(runs) == 3
    release(api.rt, "block")
    await api.rt.wait_idle()
    runs = [r for r in (await thread.list_runs()).runs if r.schedule_id == sid]
    assert {r.status for r in runs} == {EffectStatus.COMPLETED}


def test_a_schedule_frame_serializes_once_as_compact_json() -> None:
    event = ScheduleChanged("t", 3, ScheduleChange.CREATED, Schedule(
        id="s", thread_id="t", name="ping", args=None, recurrence=Recurrence.parse(every=60),
        state=ScheduleState.ACTIVE, next_fire_at_ts=60.0, created_at_ts=0.0,
    ))
    text = event.frame_text()
    assert text is event.frame_text()
    assert json.loads(text) == event.to_frame() and ", " not in text


@pytest.mark.parametrize(
    ("zone", "day"),
    [
        ("Europe/Berlin", "2026-03-29"), ("Europe/Berlin", "2026-10-25"),
        ("America/Havana", "2026-03-08"), ("America/Havana", "2026-11-01"),
        ("America/Santiago", "2026-09-06"), ("America/Santiago", "2026-04-05"),
        ("Australia/Lord_Howe", "2026-10-04"), ("Australia/Lord_Howe", "2026-04-05"),
        # Zones whose winter offset is zero (+0000 is an offset like any other).
        ("Europe/London", "2026-03-29"), ("Europe/London", "2026-10-25"),
        ("Europe/Lisbon", "2026-03-29"), ("Europe/Lisbon", "2026-10-25"),
        ("Antarctica/Troll", "2026-03-29"), ("Antarctica/Troll", "2026-10-25"),
    ],
)
@pytest.mark.parametrize("minutes", [[0], [0, 30], [15, 45], list(range(0, 60, 5))])
def test_cron_fire_times_around_clock_changes_match_the_rule_minute_by_minute(
    zone: str, day: str, minutes: list[int]
) -> None:
    # The rule, checked against every UTC minute of three days around a clock change: an
    # instant fires when its wall time matches, or when a matching wall time that does
    # not exist (in a gap) is shifted onto it; each instant fires once.
    tz = ZoneInfo(zone)
    start = ts(f"{day}T00:00:00") - 86_400
    expected: set[float] = set()
    for m in range(3 * 1440):
        t = start + 60 * m
        if datetime.fromtimestamp(t, tz).minute in minutes:
            expected.add(t)
    wall = datetime.fromisoformat(f"{day}T00:00:00") - timedelta(days=1)
    for m in range(3 * 1440):
        w = wall + timedelta(minutes=m)
        if w.minute not in minutes:
            continue
        shifted = w.replace(tzinfo=tz).timestamp()  # fold=0: the offset before a gap
        if datetime.fromtimestamp(shifted, tz).replace(tzinfo=None) != w:
            expected.add(shifted)  # w is in a gap
    cron = Recurrence.parse(cron=f"{','.join(map(str, minutes))} * * * *", timezone=zone)
    got: list[float] = []
    at: float | None = start + 3600  # clear of the window's edges
    end = start + 3 * 86_400 - 3600
    while True:
        assert at is not None
        at = cron.next_fire(at, 0)
        assert at is not None
        if at > end:
            break
        got.append(at)
    window = sorted(t for t in expected if start + 3600 < t <= end)
    assert got == window
