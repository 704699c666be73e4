"""Run operations as a user sees them: scheduling keys, chains, canceling a running run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from runtime import (
    EffectStatus,
    InvalidArgument,
    InvalidDelay,
    RunStateError,
    Runtime,
    ThreadState,
)
from runtime.testing import FakeClock
from tests.conftest import Api, serve_api

APP = Path(__file__).parent / "apps" / "scheduling"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    """The server on the scheduling test app and a fake clock."""
    async with serve_api(tmp_path / "data", clock=FakeClock(), app_dir=APP) as running:
        yield running


def release_link(rt: Runtime, gate: str) -> None:
    """Let the test app's ``link`` runs waiting on ``gate`` go on."""
    gates: dict[str, asyncio.Event] = rt.registry.app["link"].fn.__globals__["GATES"]
    gates.setdefault(gate, asyncio.Event()).set()


async def wait_for(thread: ThreadState, run_id: str, status: EffectStatus) -> None:
    """Wait (bounded, a hang guard) until the run has ``status``."""
    for _ in range(2000):
        if (await thread.get_run(run_id)).status is status:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"run {run_id} never became {status}")


async def started(log: Path, key: str) -> None:
    """Wait (bounded, a hang guard) until the effect's code logged ``<key> started``."""
    for _ in range(2000):
        if log.exists() and f"{key} started" in log.read_text().splitlines():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{key} never started (see {log})")


async def live(thread: ThreadState, key: str) -> list[Any]:
    page = await thread.list_runs(status=["pending", "running"], limit=500)
    return [(r.id, r.status) for r in page.runs if r.key == key]


# ------------------------------------------------------------------ keys


async def test_twenty_concurrent_schedules_with_one_key_store_one_run(api: Api) -> None:
    thread = await api.rt.create_thread()
    results = await asyncio.gather(
        *(thread.schedule("ping", None, 3600, key="daily") for _ in range(20))
    )
    created = [r for r in results if r.created]
    assert len(created) == 1
    assert {r.run_id for r in results} == {created[0].run_id}
    page = await thread.list_runs()
    assert [(r.id, r.key) for r in page.runs] == [(created[0].run_id, "daily")]
    # schedule_effect returns the same id, and stores nothing either.
    assert await thread.schedule_effect("ping", None, 5, key="daily") == created[0].run_id
    assert len((await thread.list_runs()).runs) == 1
    # Another thread has its own keys.
    other = await api.rt.create_thread()
    assert (await other.schedule("ping", key="daily")).created


async def test_a_key_is_free_again_once_its_run_finished(api: Api) -> None:
    thread = await api.rt.create_thread()
    first = await thread.schedule("ping", key="k")
    await api.rt.wait_idle()
    assert (await thread.get_run(first.run_id)).status is EffectStatus.COMPLETED
    second = await thread.schedule("ping", key="k", delay=60)
    assert second.created and second.run_id != first.run_id
    assert await thread.remove_scheduled_effect(second.run_id)
    third = await thread.schedule("ping", key="k", delay=60)
    assert third.created and third.run_id not in (first.run_id, second.run_id)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "key must not be empty"),
        ("x" * 257, "key is 257 characters; the limit is 256"),
        (7, "key must be a string, got int"),
        ("\ud800", "key is not valid Unicode text"),
    ],
)
async def test_a_bad_key_is_refused_naming_it_and_nothing_is_stored(
    api: Api, key: Any, message: str
) -> None:
    thread = await api.rt.create_thread()
    with pytest.raises(InvalidArgument, match=message):
        await thread.schedule_effect("ping", key=key)
    assert (await thread.list_runs()).runs == []


async def test_http_answers_201_for_a_new_run_and_200_for_the_keyed_one(api: Api) -> None:
    tid = await api.new_thread()
    url = f"/api/threads/{tid}/effects"
    answers = await asyncio.gather(
        *(api.client.post(url, json={"name": "ping", "delay_seconds": 60, "key": "k"})
          for _ in range(20))
    )
    assert sorted(a.status_code for a in answers) == [200] * 19 + [201]
    assert len({a.json()["id"] for a in answers}) == 1
    run = await api.run(tid, answers[0].json()["id"])
    assert run["key"] == "k" and run["canceledBy"] is None
    listed = (await api.client.get(url)).json()["runs"]
    assert [r["key"] for r in listed] == ["k"]
    bad = await api.client.post(url, json={"name": "ping", "key": 5})
    assert bad.status_code == 400 and "key must be a string" in bad.json()["error"]["message"]
    empty = await api.client.post(url, json={"name": "ping", "key": ""})
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "invalid_argument"


async def test_ensuring_a_chain_while_a_link_runs_never_makes_two_chains(api: Api) -> None:
    assert api.clock is not None
    thread = await api.rt.create_thread()
    args = {"gate": "first"}
    ensured = await thread.schedule("link", args, key="chain")
    assert ensured.created
    await wait_for(thread, ensured.run_id, EffectStatus.RUNNING)
    # "Ensure it is scheduled" while the link runs: the running link is the chain.
    again = await thread.schedule("link", args, key="chain")
    assert (again.run_id, again.created) == (ensured.run_id, False)
    release_link(api.rt, "first")
    await api.rt.wait_idle()
    # The link handed the key to its successor: one pending link, none running.
    chain = await live(thread, "chain")
    assert len(chain) == 1 and chain[0][1] is EffectStatus.PENDING
    successor = chain[0][0]
    assert (await thread.schedule("link", args, key="chain")).run_id == successor
    for _ in range(3):  # links run on time, one chain throughout
        api.clock.advance(60)
        await api.rt.wait_idle()
        assert (await thread.get_run(successor)).status is EffectStatus.COMPLETED
        chain = await live(thread, "chain")
        assert len(chain) == 1 and chain[0][1] is EffectStatus.PENDING
        successor = chain[0][0]
    completed = await thread.list_runs(status="completed")
    assert len(completed.runs) == 4


# ------------------------------------------------------------------ cancel a running run


def release_sync(rt: Runtime, key: str) -> None:
    """Let the test app's ``hold_sync`` run with args ``{"key": key}`` return."""
    rt.registry.app["hold_sync"].fn.__globals__["gate"](key).set()


async def test_canceling_a_running_async_run_stops_it_and_it_never_runs_again(
    api: Api, tmp_path: Path
) -> None:
    thread = await api.rt.create_thread()
    sub = thread.subscribe()
    run_id = await thread.schedule_effect("hold", {"key": "long"})
    await started(tmp_path / "data" / "hold.log", "long")
    assert api.clock is not None
    api.clock.advance(7)
    assert await thread.remove_scheduled_effect(run_id, canceled_by="ops")
    await api.rt.wait_idle()
    run = await thread.get_run(run_id)
    assert (run.status, run.canceled_by, run.attempts, run.error) == (
        EffectStatus.CANCELED, "ops", 1, None
    )
    assert run.finished_at_ts == api.clock.now()
    assert (tmp_path / "data" / "hold.log").read_text() == "long started\nlong canceled\n"
    changes = []
    while sub.pending:
        changes.append(await sub.__anext__())
    assert [(e.change, e.run.status) for e in changes if e.run.id == run_id][-1] == (
        "canceled", EffectStatus.CANCELED
    )
    sub.close()
    # A second cancel does nothing, and nothing runs it again.
    assert not await thread.remove_scheduled_effect(run_id)
    api.clock.advance(3600)
    await api.rt.wait_idle()
    assert (await thread.get_run(run_id)).status is EffectStatus.CANCELED
    assert await thread.get_scheduled_effects() == []
    # The thread goes on with its next run.
    after = await thread.schedule_effect("ping")
    await api.rt.wait_idle()
    assert (await thread.get_run(after)).status is EffectStatus.COMPLETED


async def test_two_cancels_of_a_running_run_both_answer_true_and_the_first_is_kept(
    api: Api, tmp_path: Path
) -> None:
    # The effect is slow to stop: the second cancel comes while the first one waits.
    gates: dict[str, asyncio.Event] = api.rt.registry.app["hold"].fn.__globals__["GATES"]
    stop = gates["twice:stop"] = asyncio.Event()
    thread = await api.rt.create_thread()
    run_id = await thread.schedule_effect("hold", {"key": "twice"})
    await started(tmp_path / "data" / "hold.log", "twice")
    first = asyncio.create_task(thread.remove_scheduled_effect(run_id, canceled_by="a"))
    log = tmp_path / "data" / "hold.log"
    for _ in range(2000):  # a hang guard: until the cancellation reached the effect
        if "twice canceled" in log.read_text().splitlines():
            break
        await asyncio.sleep(0.005)
    second = asyncio.create_task(thread.remove_scheduled_effect(run_id, canceled_by="b"))
    await asyncio.sleep(0.05)
    assert not first.done()  # still waiting for the effect to stop
    stop.set()
    assert await asyncio.gather(first, second) == [True, True]
    await api.rt.wait_idle()
    run = await thread.get_run(run_id)
    assert (run.status, run.canceled_by) == (EffectStatus.CANCELED, "a")


async def test_http_cancel_of_a_running_async_run_says_who(api: Api) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "hold", {"key": "h"})
    thread = await api.rt.get_thread(tid)
    await wait_for(thread, run_id, EffectStatus.RUNNING)
    res = await api.client.post(
        f"/api/threads/{tid}/effects/{run_id}/cancel", json={"by": "pane"}
    )
    assert (res.status_code, res.json()) == (200, {"canceled": True})
    await api.rt.wait_idle()
    run = await api.run(tid, run_id)
    assert (run["status"], run["canceledBy"]) == ("canceled", "pane")
    # Without a body the API says "http".
    other = await api.schedule(tid, "ping", None, 60)
    res = await api.client.post(f"/api/threads/{tid}/effects/{other}/cancel")
    assert (res.status_code, res.json()) == (200, {"canceled": True})
    assert (await api.run(tid, other))["canceledBy"] == "http"
    bad = await api.client.post(f"/api/threads/{tid}/effects/{other}/cancel", json={"who": 1})
    assert bad.status_code == 400 and "unknown field(s) who" in bad.json()["error"]["message"]


async def test_a_running_sync_run_cannot_be_canceled_and_says_why(api: Api) -> None:
    tid = await api.new_thread()
    run_id = await api.schedule(tid, "hold_sync", {"key": "s"})
    thread = await api.rt.get_thread(tid)
    await wait_for(thread, run_id, EffectStatus.RUNNING)
    res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/cancel")
    assert res.status_code == 409
    error = res.json()["error"]
    assert error["code"] == "run_state_conflict"
    assert f"Run {run_id} of effect hold_sync is running a sync function" in error["message"]
    assert "cannot be stopped" in error["message"]
    with pytest.raises(RunStateError, match="cannot be stopped"):
        await thread.remove_scheduled_effect(run_id)
    release_sync(api.rt, "s")
    await api.rt.wait_idle()
    run = await api.run(tid, run_id)
    assert (run["status"], run["canceledBy"]) == ("completed", None)


async def test_a_canceled_pending_run_keeps_who_canceled_it(api: Api) -> None:
    thread = await api.rt.create_thread()
    run_id = await thread.schedule_effect("ping", delay=60)
    assert await thread.remove_scheduled_effect(run_id)
    assert (await thread.get_run(run_id)).canceled_by == "code"
    with pytest.raises(InvalidArgument, match="canceled_by"):
        await thread.remove_scheduled_effect(run_id, canceled_by="")


# A cancel that comes once the effect's code has returned, before its outcome is recorded:
# the outcome stands (the run ends completed) and the cancel answers False, on every backend
# (on PostgreSQL it once canceled the run in the store and answered True, issue 13).


@pytest.fixture
async def any_api(tmp_path: Path, backend_settings: dict[str, Any]) -> AsyncIterator[Api]:
    """The server on the scheduling test app, on the test's backend."""
    async with serve_api(tmp_path / "data", clock=FakeClock(), app_dir=APP,
                         **backend_settings) as running:
        yield running


def release_hold(rt: Runtime, key: str) -> None:
    gates: dict[str, asyncio.Event] = rt.registry.app["hold"].fn.__globals__["GATES"]
    gates.setdefault(key, asyncio.Event()).set()


async def _cancel_after_the_code_returned(
    api: Api, monkeypatch: pytest.MonkeyPatch, name: str, hook: str
) -> None:
    """Run ``name`` (``hold`` in line, ``long_work`` beside) and cancel it right after its
    code returned: as `execute` returns (``hook="execute"``), or as the drain goes on to
    record it (``hook="pace"``, in line only)."""
    rt = api.rt
    thread = await rt.create_thread()
    answers: list[bool] = []
    executor = rt.executor
    returned = False
    if hook == "execute":
        execute = executor.execute

        async def then_cancel(actor: Any, run: Any, **kw: Any) -> Any:
            finish = await execute(actor, run, **kw)
            if run.name == name:
                answers.append(await thread.remove_scheduled_effect(run.id))
            return finish

        monkeypatch.setattr(executor, "execute", then_cancel)
    else:
        pace = executor._pace

        async def cancel_first(*args: Any) -> None:
            # The drain's first step after the released effect returned.
            if returned and not answers:
                answers.append(await thread.remove_scheduled_effect(run_id))
            await pace(*args)

        monkeypatch.setattr(executor, "_pace", cancel_first)
    run_id = await thread.schedule_effect(name, {"key": "k"})
    await wait_for(thread, run_id, EffectStatus.RUNNING)
    returned = True  # from the release on (the drain waits for the effect meanwhile)
    (release_long if name == "long_work" else release_hold)(rt, "k")
    await wait_for(thread, run_id, EffectStatus.COMPLETED)
    run = await thread.get_run(run_id)
    assert (answers, run.status, run.canceled_by) == ([False], EffectStatus.COMPLETED, None)
    (attempt,) = await thread.get_run_attempts(run_id)
    assert attempt.outcome == "completed"
    # The thread goes on; a cancel after the end answers False too.
    assert await thread.remove_scheduled_effect(run_id) is False
    after = await thread.schedule_effect("ping")
    await wait_for(thread, after, EffectStatus.COMPLETED)


@pytest.mark.every_backend
@pytest.mark.parametrize("name", ["hold", "long_work"])
async def test_a_cancel_as_the_effect_returned_answers_false_and_the_run_completes(
    any_api: Api, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    await _cancel_after_the_code_returned(any_api, monkeypatch, name, "execute")


@pytest.mark.every_backend
async def test_a_cancel_before_the_returned_effects_outcome_is_recorded_changes_nothing(
    any_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _cancel_after_the_code_returned(any_api, monkeypatch, "hold", "pace")


# ------------------------------------------------------------------ long runs beside short ones


def release_long(rt: Runtime, key: str) -> None:
    gates: dict[str, asyncio.Event] = rt.registry.app["long_work"].fn.__globals__["GATES"]
    gates.setdefault(key, asyncio.Event()).set()


async def test_a_concurrent_run_leaves_a_short_one_on_time(api: Api, tmp_path: Path) -> None:
    assert api.clock is not None
    thread = await api.rt.create_thread()
    long = await thread.schedule_effect("long_work", {"key": "report"})
    await wait_for(thread, long, EffectStatus.RUNNING)
    reminder = await thread.schedule_effect("ping", delay=5)
    second_long = await thread.schedule_effect("long_work", {"key": "export"}, delay=5)
    api.clock.advance(5)
    await wait_for(thread, reminder, EffectStatus.COMPLETED)
    short = await thread.get_run(reminder)
    assert short.started_at_ts == short.run_at_ts  # on time, beside the long run
    await wait_for(thread, second_long, EffectStatus.RUNNING)  # two long ones at once
    assert (await thread.get_run(long)).status is EffectStatus.RUNNING
    release_long(api.rt, "report")
    release_long(api.rt, "export")
    await api.rt.wait_idle()
    assert (await thread.get_run(long)).status is EffectStatus.COMPLETED
    assert (await thread.get_run(second_long)).status is EffectStatus.COMPLETED
    log = (tmp_path / "data" / "long_work.log").read_text().splitlines()
    assert sorted(log) == ["export done", "export started", "report done", "report started"]


async def test_a_due_run_behind_a_running_one_says_what_it_waits_for(api: Api) -> None:
    tid = await api.new_thread()
    thread = await api.rt.get_thread(tid)
    holding = await api.schedule(tid, "hold", {"key": "w"})
    await wait_for(thread, holding, EffectStatus.RUNNING)
    waiting = await api.schedule(tid, "ping")
    later = await api.schedule(tid, "ping", None, 60)
    beside = await api.schedule(tid, "long_work", {"key": "side"}, 60)
    assert (await api.run(tid, waiting))["waitingFor"] == holding
    assert (await api.run(tid, later))["waitingFor"] is None  # not due yet
    page = (await api.client.get(f"/api/threads/{tid}/effects")).json()
    listed = {r["id"]: r for r in page["runs"]}
    assert listed[waiting]["waitingFor"] == holding
    assert listed[holding]["waitingFor"] is None
    assert [r.waiting_for for r in await thread.get_scheduled_effects()] == [holding, None, None]
    # Run now cannot help: 409 with the reason, for a due run and for a later one alike.
    for run_id in (waiting, later):
        res = await api.client.post(f"/api/threads/{tid}/effects/{run_id}/run")
        assert res.status_code == 409, res.text
        message = res.json()["error"]["message"]
        assert f"waits for run {holding} (hold), which is running" in message
    # A concurrent effect's run waits for nothing: run now starts it beside the hold.
    res = await api.client.post(f"/api/threads/{tid}/effects/{beside}/run")
    assert res.status_code == 200, res.text
    await wait_for(thread, beside, EffectStatus.RUNNING)
    release(api.rt, "w")
    release_long(api.rt, "side")
    await api.rt.wait_idle()
    done = await api.run(tid, waiting)
    assert (done["status"], done["waitingFor"]) == ("completed", None)


def release(rt: Runtime, key: str) -> None:
    gates: dict[str, asyncio.Event] = rt.registry.app["hold"].fn.__globals__["GATES"]
    gates.setdefault(key, asyncio.Event()).set()


async def test_a_concurrent_run_can_be_canceled_and_the_thread_goes_on(
    api: Api, tmp_path: Path
) -> None:
    thread = await api.rt.create_thread()
    long = await thread.schedule_effect("long_work", {"key": "c"})
    await started(tmp_path / "data" / "long_work.log", "c")
    assert await thread.remove_scheduled_effect(long, canceled_by="ops")
    await api.rt.wait_idle()
    run = await thread.get_run(long)
    assert (run.status, run.canceled_by) == (EffectStatus.CANCELED, "ops")
    assert (tmp_path / "data" / "long_work.log").read_text() == "c started\nc canceled\n"


async def test_a_concurrent_run_interrupted_by_shutdown_runs_again_after_restart(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    data = tmp_path / "data"
    async with Runtime(app_dir=APP, data_dir=data, clock=clock, load_packages=False,
                       shutdown_grace_seconds=0) as rt:
        thread = await rt.create_thread("t")
        long = await thread.schedule_effect("long_work", {"key": "r"})
        await started(data / "long_work.log", "r")
    assert (data / "long_work.log").read_text() == "r started\nr canceled\n"
    async with Runtime(app_dir=APP, data_dir=data, clock=clock, load_packages=False) as rt:
        release_long(rt, "r")
        thread = await rt.get_thread("t")
        await rt.wait_idle()
        run = await thread.get_run(long)
        assert (run.status, run.attempts) == (EffectStatus.COMPLETED, 2)


async def test_deleting_a_thread_stops_its_concurrent_runs(api: Api, tmp_path: Path) -> None:
    thread = await api.rt.create_thread()
    await thread.schedule_effect("long_work", {"key": "d"})
    await started(tmp_path / "data" / "long_work.log", "d")
    await api.rt.delete_thread(thread.thread_id)
    await api.rt.wait_idle()
    assert (tmp_path / "data" / "long_work.log").read_text() == "d started\nd canceled\n"


async def test_a_paused_thread_starts_no_concurrent_run_until_resumed(
    api: Api, tmp_path: Path
) -> None:
    thread = await api.rt.create_thread()
    holding = await thread.schedule_effect("hold", {"key": "p"})
    await wait_for(thread, holding, EffectStatus.RUNNING)
    await thread.pause()
    # Due now, and its effect runs beside others: still nothing starts while paused,
    # neither beside the running run nor once that one ended.
    beside = await thread.schedule_effect("long_work", {"key": "later"})
    assert [r.id for r in await thread.get_scheduled_effects()] == [beside]
    release(api.rt, "p")
    await api.rt.wait_idle()
    assert (await thread.get_run(holding)).status is EffectStatus.COMPLETED
    assert (await thread.get_run(beside)).status is EffectStatus.PENDING
    assert not (tmp_path / "data" / "long_work.log").exists()
    await thread.resume()
    await started(tmp_path / "data" / "long_work.log", "later")
    release_long(api.rt, "later")
    await api.rt.wait_idle()
    assert (await thread.get_run(beside)).status is EffectStatus.COMPLETED


async def test_the_loop_watchdog_names_a_running_concurrent_run(
    api: Api, tmp_path: Path
) -> None:
    thread = await api.rt.create_thread()
    long = await thread.schedule_effect("long_work", {"key": "named"})
    await started(tmp_path / "data" / "long_work.log", "named")
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == f"effect-{long}"]
    assert api.rt.executor.describe_task(task) == (
        f"effect long_work (thread {thread.thread_id}, run {long})"
    )
    release_long(api.rt, "named")
    await api.rt.wait_idle()
    assert api.rt.executor.describe_task(task) == f"task 'effect-{long}'"


# ------------------------------------------------------------------ absolute times


async def test_at_schedules_for_an_aware_time_and_a_past_one_runs_once(api: Api) -> None:
    assert api.clock is not None
    thread = await api.rt.create_thread()
    now = datetime.fromtimestamp(api.clock.now(), UTC)
    istanbul = ZoneInfo("Europe/Istanbul")
    later = await thread.schedule_effect("ping", at=(now + timedelta(hours=2)).astimezone(istanbul))
    assert (await thread.get_run(later)).run_at == now + timedelta(hours=2)
    past = await thread.schedule_effect("ping", at=now - timedelta(days=3))
    await api.rt.wait_idle()
    done = await thread.get_run(past)
    assert (done.status, done.attempts) == (EffectStatus.COMPLETED, 1)
    assert (await thread.get_run(later)).status is EffectStatus.PENDING
    api.clock.advance(7201)  # a datetime has microseconds: `now` above may round up
    await api.rt.wait_idle()
    assert (await thread.get_run(later)).status is EffectStatus.COMPLETED


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"at": datetime(2030, 1, 1, 9, 0)}, "aware datetime .* naive 2030-01-01T09:00"),
        ({"at": "2030-01-01T09:00:00Z"}, "at must be an aware datetime, got \"2030"),
        ({"at": datetime(2099, 1, 1, tzinfo=UTC)}, "at most 315360000 s \\(10 years\\) from now"),
        ({"at": datetime(2030, 1, 1, tzinfo=UTC), "delay": 5}, "either delay or at"),
        # 0000-12-31T10:00:00Z in UTC: no datetime could show it again.
        ({"at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))},
         "at must be at or after 0001-01-01T00:00:00Z \\(in UTC\\), got 0001-01-01T00:00:00"),
    ],
)
async def test_a_bad_at_is_refused_naming_it(
    api: Api, kwargs: dict[str, Any], message: str
) -> None:
    thread = await api.rt.create_thread()
    with pytest.raises(InvalidDelay, match=message):
        await thread.schedule_effect("ping", **kwargs)
    assert (await thread.list_runs()).runs == []


async def test_http_run_at_takes_rfc3339_with_an_offset(api: Api) -> None:
    assert api.clock is not None
    tid = await api.new_thread()
    url = f"/api/threads/{tid}/effects"
    when = datetime.fromtimestamp(api.clock.now() + 3600, UTC).replace(microsecond=0)
    res = await api.client.post(
        url, json={"name": "ping", "run_at": when.astimezone(ZoneInfo("Asia/Tokyo")).isoformat()}
    )
    assert res.status_code == 201, res.text
    assert (await api.run(tid, res.json()["id"]))["runAt"] == when.isoformat().replace(
        "+00:00", "Z"
    )
    res = await api.client.post(url, json={"name": "ping", "run_at": "2020-01-01T00:00:00Z"})
    assert res.status_code == 201
    for body, status, text in [
        ({"run_at": "2030-01-01T09:00:00"}, 422, "run_at must carry its offset"),
        ({"run_at": "tomorrow"}, 422, "run_at must be an RFC 3339 date-time"),
        ({"run_at": 5}, 400, "run_at must be a string"),
        ({"run_at": "2030-01-01T09:00:00Z", "delay_seconds": 5}, 400, "not both"),
    ]:
        res = await api.client.post(url, json={"name": "ping", **body})
        assert res.status_code == status, res.text
        assert text in res.json()["error"]["message"]
