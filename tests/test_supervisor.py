"""The runtime core as a user sees it: statuses, attempts, order, errors, deletion."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sqlite3
import threading
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import BaseModel

from runtime import (
    EffectDefinitionError,
    EffectNotFound,
    EffectStatus,
    InvalidArgument,
    InvalidDelay,
    InvalidEffectArgs,
    InvalidThreadId,
    RunNotFound,
    RunStateError,
    Runtime,
    RuntimeStorageError,
    ThreadExists,
    ThreadNotFound,
    ThreadState,
    ThreadStorageError,
    define_effect,
)
from runtime.alarms import ALARM_FLUSH_SECONDS, ALARM_KEEP_SECONDS
from runtime.storage.base import StorageBackend
from runtime.testing import FakeClock
from tests.storage.backends import BACKENDS, has_thread_store, make_backend, stored_alarms

APP = Path(__file__).parent / "apps" / "core"


class Args(BaseModel):
    n: int


def records(data_dir: Path) -> list[dict[str, object]]:
    path = data_dir / "record.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[Runtime]:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as runtime:
        yield runtime


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture(params=BACKENDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> StorageBackend:
    return make_backend(request.param, tmp_path)


@pytest.fixture
async def frt(
    tmp_path: Path, clock: FakeClock, storage: StorageBackend
) -> AsyncIterator[Runtime]:
    """A runtime on the fake clock, on every backend."""
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as runtime:
        yield runtime


async def test_delay_zero_runs_promptly_and_exactly_once(rt: Runtime) -> None:
    thread = await rt.create_thread()
    run_id = await thread.schedule_effect("record", {"key": "a"})
    await rt.wait_idle()
    await asyncio.sleep(0.1)  # a spurious extra wake-up would show up here
    await rt.wait_idle()

    run = await thread.get_run(run_id)
    assert run.status is EffectStatus.COMPLETED
    assert run.attempts == 1
    assert run.args == {"key": "a"}
    assert [r["key"] for r in records(rt.settings.data_dir)] == ["a"]
    assert records(rt.settings.data_dir)[0]["execution"] is False  # execution is None


async def test_delayed_run_waits_for_its_due_time(frt: Runtime, clock: FakeClock) -> None:
    thread = await frt.create_thread()
    run_id = await thread.schedule_effect("record", {"key": "later"}, delay=timedelta(hours=1))
    await frt.wait_idle()
    assert (await thread.get_run(run_id)).status is EffectStatus.PENDING
    assert [r.id for r in await thread.get_scheduled_effects()] == [run_id]

    clock.advance(3599)
    await frt.wait_idle()
    assert (await thread.get_run(run_id)).status is EffectStatus.PENDING

    clock.advance(1)
    await frt.wait_idle()
    run = await thread.get_run(run_id)
    assert run.status is EffectStatus.COMPLETED
    assert run.run_at_ts == 1_800_000_000.0 + 3600
    assert await thread.get_scheduled_effects() == []


async def test_raising_effect_fails_with_its_message_and_never_runs_again(
    frt: Runtime, clock: FakeClock
) -> None:
    thread = await frt.create_thread()
    run_id = await thread.schedule_effect("boom", {"message": "no such mailbox"})
    await frt.wait_idle()
    clock.advance(86_000)
    await frt.wait_idle()

    run = await thread.get_run(run_id)
    assert run.status is EffectStatus.FAILED
    assert run.error == "RuntimeError: no such mailbox"
    assert run.attempts == 1


async def test_sync_effect_without_args_runs_in_a_worker_thread(rt: Runtime) -> None:
    thread = await rt.create_thread()
    run_id = await thread.schedule_effect("cleanup")
    await rt.wait_idle()
    assert (await thread.get_run(run_id)).status is EffectStatus.COMPLETED
    assert (rt.settings.data_dir / "cleanup.log").read_text() == thread.thread_id + "\n"


async def test_store_calls_that_end_together_each_get_their_own_outcome(rt: Runtime) -> None:
    # The storage threads hand outcomes back to the loop in batches (one wake-up for the
    # calls that end close together): each caller still gets its own result or error, and
    # a caller that gave up is skipped without disturbing the others.
    release = threading.Event()

    def call(i: int) -> int:
        release.wait(10)
        if i % 3 == 0:
            raise ValueError(f"call {i} failed")
        return i * 10

    tasks = [asyncio.ensure_future(rt.run_sync(call, i)) for i in range(12)]
    await asyncio.sleep(0)  # every call queued
    tasks[1].cancel()
    release.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(outcomes[1], asyncio.CancelledError)
    for i, outcome in enumerate(outcomes):
        if i == 1:
            continue
        if i % 3 == 0:
            assert isinstance(outcome, ValueError) and str(outcome) == f"call {i} failed"
        else:
            assert outcome == i * 10


async def test_effect_over_its_timeout_fails(rt: Runtime) -> None:
    thread = await rt.create_thread()
    run_id = await thread.schedule_effect("overrun")
    await rt.wait_idle()
    run = await thread.get_run(run_id)
    assert run.status is EffectStatus.FAILED
    assert run.error == "Effect overrun timed out after 0.2 s"


async def test_effect_can_schedule_on_its_own_thread(rt: Runtime) -> None:
    thread = await rt.create_thread()
    await thread.schedule_effect("chain", {"key": "from-effect"})
    await rt.wait_idle()
    page = await thread.list_runs()
    assert sorted((r.name, r.status) for r in page.runs) == [
        ("chain", EffectStatus.COMPLETED),
        ("record", EffectStatus.COMPLETED),
    ]


async def test_cancel_returns_false_unless_a_pending_run_was_canceled(
    frt: Runtime, clock: FakeClock
) -> None:
    thread = await frt.create_thread()
    pending = await thread.schedule_effect("record", {"key": "p"}, delay=60)
    done = await thread.schedule_effect("record", {"key": "d"})
    await frt.wait_idle()

    assert await thread.remove_scheduled_effect("no-such-run") is False
    assert await thread.remove_scheduled_effect(done) is False
    assert await thread.remove_scheduled_effect(pending) is True
    assert await thread.remove_scheduled_effect(pending) is False

    clock.advance(120)
    await frt.wait_idle()
    canceled = await thread.get_run(pending)
    assert canceled.status is EffectStatus.CANCELED  # stays in the history, never ran
    assert [r["key"] for r in records(frt.settings.data_dir)] == ["d"]


async def test_run_now_and_replay(frt: Runtime, clock: FakeClock) -> None:
    thread = await frt.create_thread()
    later = await thread.schedule_effect("record", {"key": "x"}, delay=3600)
    await thread.run_now(later)
    await frt.wait_idle()
    assert (await thread.get_run(later)).status is EffectStatus.COMPLETED

    with pytest.raises(RunStateError, match="only a pending run"):
        await thread.run_now(later)
    with pytest.raises(RunNotFound):
        await thread.run_now("nope")

    replay_id = await thread.replay(later)
    await frt.wait_idle()
    replay = await thread.get_run(replay_id)
    assert replay.replay_of == later
    assert (replay.name, replay.args, replay.status) == ("record", {"key": "x"},
                                                         EffectStatus.COMPLETED)
    assert [r["key"] for r in records(frt.settings.data_dir)] == ["x", "x"]

    pending = await thread.schedule_effect("record", {"key": "y"}, delay=60)
    with pytest.raises(RunStateError, match="only a finished run"):
        await thread.replay(pending)


async def test_history_filters_and_pages_newest_first(frt: Runtime) -> None:
    thread = await frt.create_thread()
    ids = [await thread.schedule_effect("record", {"key": str(i)}, delay=60) for i in range(5)]
    boom = await thread.schedule_effect("boom")
    await frt.wait_idle()

    page = await thread.list_runs(limit=2)
    assert [r.id for r in page.runs] == [boom, ids[4]]
    assert page.counts == {
        EffectStatus.PENDING: 5, EffectStatus.RUNNING: 0, EffectStatus.COMPLETED: 0,
        EffectStatus.FAILED: 1, EffectStatus.CANCELED: 0,
    }
    assert (await thread.list_runs(name="boom")).counts[EffectStatus.PENDING] == 0
    assert page.next_cursor is not None
    page2 = await thread.list_runs(limit=2, cursor=page.next_cursor)
    assert [r.id for r in page2.runs] == [ids[3], ids[2]]
    page3 = await thread.list_runs(limit=2, cursor=page2.next_cursor)
    assert [r.id for r in page3.runs] == [ids[1], ids[0]]
    assert page3.next_cursor is None

    failed = await thread.list_runs(status="failed")
    assert [r.id for r in failed.runs] == [boom]
    assert [r.id for r in (await thread.list_runs(name="boom")).runs] == [boom]
    assert len((await thread.list_runs(status=["pending", "failed"])).runs) == 6
    with pytest.raises(ValueError, match="Unknown status"):
        await thread.list_runs(status="done")
    with pytest.raises(ValueError, match="limit"):
        await thread.list_runs(limit=0)


async def test_hundred_threads_every_run_once_in_due_order(rt: Runtime) -> None:
    threads = [await rt.create_thread(f"t{i:03d}") for i in range(100)]
    # Interleaved due times: run j of thread i is due about (j * 100 + (i * 37) % 100) ms
    # after a common base, scheduled in reverse order so insertion order is not due order.
    base = rt.clock.now() + 1.0
    for j in reversed(range(10)):
        for i, thread in enumerate(threads):
            due = base + (j * 100 + (i * 37) % 100) / 1000
            await thread.schedule_effect(
                "record", {"key": f"{j}"}, delay=max(0.0, due - rt.clock.now())
            )

    deadline = asyncio.get_running_loop().time() + 60
    while len(records(rt.settings.data_dir)) < 1000:
        assert asyncio.get_running_loop().time() < deadline, "runs did not all execute"
        await asyncio.sleep(0.05)
    await rt.wait_idle()

    seen: dict[str, list[str]] = {}
    for rec in records(rt.settings.data_dir):
        seen.setdefault(str(rec["thread"]), []).append(str(rec["key"]))
    for thread in threads:
        page = await thread.list_runs(limit=20)
        assert {(r.status, r.attempts) for r in page.runs} == {(EffectStatus.COMPLETED, 1)}
        in_due_order = [r.args["key"] for r in sorted(page.runs, key=lambda r: r.run_at_ts)]
        assert seen[thread.thread_id] == in_due_order
    assert sum(len(v) for v in seen.values()) == 1000


async def test_bad_input_is_refused_and_stores_nothing(rt: Runtime) -> None:
    thread = await rt.create_thread()
    with pytest.raises(EffectNotFound, match=r"^Effect not found: nope$"):
        await thread.schedule_effect("nope")
    with pytest.raises(InvalidEffectArgs, match="fail its schema: key: Field required"):
        await thread.schedule_effect("record", {"other": 1})
    with pytest.raises(InvalidEffectArgs, match="not JSON"):
        await thread.schedule_effect("record", {"key": object()})
    with pytest.raises(InvalidEffectArgs, match="not JSON"):
        await thread.schedule_effect("record", {"key": "k", "due": math.nan})
    with pytest.raises(InvalidEffectArgs, match=r"bytes of JSON; the limit is 1048576 bytes"):
        await thread.schedule_effect("record", {"key": "x" * (1 << 20)})
    with pytest.raises(InvalidEffectArgs, match="takes no arguments"):
        await thread.schedule_effect("cleanup", {"x": 1})
    for delay in (-1, math.nan, math.inf, "5"):
        with pytest.raises(InvalidDelay, match="delay must be"):
            await thread.schedule_effect("record", {"key": "k"}, delay=delay)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # InvalidDelay is a ValueError too
        await thread.schedule_effect("record", {"key": "k"}, delay=timedelta(seconds=-1))

    with pytest.raises(InvalidEffectArgs, match=r"not valid Unicode text: the string at key"):
        await thread.schedule_effect("record", {"key": "a\udfff"})

    assert (await thread.list_runs()).runs == []
    assert not (rt.settings.data_dir / "record.jsonl").exists()
    # A surrogate pair is fine (json.dumps escapes emoji as one).
    await thread.schedule_effect("record", {"key": "\U0001f600"}, delay=3600)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"user_id": "\ud800"}, r"user_id is not valid Unicode text: .*lone surrogate \\ud800"),
        ({"agent_id": "a\udfff"}, r"agent_id is not valid Unicode"),
        ({"tags": ["ok", "\udfff"]}, r"tags\[1\] is not valid Unicode"),
        ({"user_id": "u" * 257}, r"user_id is 257 characters; the limit is 256"),
        ({"agent_id": "a" * 257}, r"agent_id is 257 characters; the limit is 256"),
        ({"tags": ["t"] * 33}, r"at most 32 tags, got 33"),
        ({"tags": ["x" * 65]}, r"tags\[0\] is 65 characters; the limit is 64"),
        ({"tags": "abc"}, r"tags must be a list of strings"),
        ({"tags": [1]}, r"tags\[0\] must be a string, got int"),
        ({"user_id": 7}, r"user_id must be a string, got int"),
    ],
)
async def test_create_thread_refuses_bad_text_before_writing_anything(
    rt: Runtime, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        await rt.create_thread("t1", **kwargs)  # type: ignore[arg-type]
    assert (await rt.list_threads()).threads == []
    assert list((rt.settings.data_dir / "threads").iterdir()) == []
    with pytest.raises(ThreadNotFound):
        await rt.get_thread("t1")
    # The id is still free.
    await rt.create_thread("t1", user_id="u" * 256, tags=["x" * 64] * 32)


async def test_for_package_refuses_an_invalid_package_id_at_once(rt: Runtime) -> None:
    thread = await rt.create_thread()
    for bad in ("Bad Id!", "", "9lives", "a/b", "ok\n"):
        with pytest.raises(InvalidArgument, match=r"Invalid packageId .*\^\[a-z\]\[a-z0-9_-\]\*\$"):
            thread.for_package(bad)
    assert thread.for_package("acme_billing-2").package_id == "acme_billing-2"
    assert thread.for_package(None).package_id is None


async def test_create_thread_leaves_no_file_when_the_registry_write_fails(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert rt.actors.registry is not None

    def fail(info: object, **kwargs: object) -> bool:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(rt.actors.registry, "add_thread", fail)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        await rt.create_thread("t1")
    assert list((rt.settings.data_dir / "threads").iterdir()) == []
    monkeypatch.undo()
    assert (await rt.list_threads()).threads == []
    await rt.create_thread("t1")
    assert [p.name for p in (rt.settings.data_dir / "threads").iterdir()
            if p.suffix == ".sqlite"] == ["t1.sqlite"]


async def test_bad_thread_ids_and_unknown_threads(rt: Runtime, tmp_path: Path) -> None:
    for bad in ("../x", "", "a" * 65, "a/b", "é", "a b"):
        with pytest.raises(InvalidThreadId, match="must match"):
            await rt.get_thread(bad)
        with pytest.raises(InvalidThreadId):
            await rt.create_thread(bad)
    assert not (tmp_path / "x.sqlite").exists()
    with pytest.raises(ThreadNotFound, match="Thread not found: ghost"):
        await rt.get_thread("ghost")
    await rt.create_thread("dup")
    with pytest.raises(ThreadExists):
        await rt.create_thread("dup")
    assert await rt.delete_thread("ghost") is False


async def test_corrupt_thread_file_fails_that_thread_only(tmp_path: Path) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        bad = await rt.create_thread("bad")
        await bad.schedule_effect("record", {"key": "never"}, delay=0.3)
        good = await rt.create_thread("good")
    (tmp_path / "threads" / "bad.sqlite").write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (tmp_path / "threads" / f"bad.sqlite{suffix}").unlink(missing_ok=True)

    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        bad = await rt.get_thread("bad")  # the registry still knows it
        with pytest.raises(ThreadStorageError, match=r"Thread bad: database .*bad\.sqlite"):
            await bad.list_runs()
        with pytest.raises(ThreadStorageError):
            await bad.schedule_effect("record", {"key": "k"})
        good = await rt.get_thread("good")
        run_id = await good.schedule_effect("record", {"key": "fine"})
        await asyncio.sleep(0.5)  # past the bad thread's alarm
        await rt.wait_idle()
        assert (await good.get_run(run_id)).status is EffectStatus.COMPLETED
        assert [r["key"] for r in records(tmp_path)] == ["fine"]
        assert await rt.delete_thread("bad") is True  # a corrupt thread can still be deleted
        assert not (tmp_path / "threads" / "bad.sqlite").exists()


async def test_newer_schema_is_refused_clearly(tmp_path: Path) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        await rt.create_thread("t")
    conn = sqlite3.connect(tmp_path / "threads" / "t.sqlite")
    conn.execute("PRAGMA user_version=99")
    conn.close()
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        t = await rt.get_thread("t")
        with pytest.raises(ThreadStorageError, match="schema version 99, newer than"):
            await t.list_runs()


async def test_delete_thread_discards_due_and_running_runs(tmp_path: Path) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        thread = await rt.create_thread("doomed")
        await thread.schedule_effect("slow", {"seconds": 5})
        await thread.schedule_effect("record", {"key": "after-slow"})
        await thread.schedule_effect("record", {"key": "later"}, delay=0.2)
        while not (tmp_path / "slow.started").exists():
            await asyncio.sleep(0.01)

        assert await rt.delete_thread("doomed") is True
        assert not (tmp_path / "threads" / "doomed.sqlite").exists()
        with pytest.raises(ThreadNotFound):
            await thread.schedule_effect("record", {"key": "k"})
        with pytest.raises(ThreadNotFound):
            await rt.get_thread("doomed")
        await asyncio.sleep(0.4)
        await rt.wait_idle()

    assert not (tmp_path / "slow.done").exists()
    assert records(tmp_path) == []
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        await asyncio.sleep(0.1)
        await rt.wait_idle()
        assert (await rt.list_threads()).threads == []
    assert records(tmp_path) == []


async def test_delete_with_a_due_alarm_runs_nothing(tmp_path: Path) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        thread = await rt.create_thread("t")
        await thread.schedule_effect("record", {"key": "k"}, delay=0.3)
    # The alarm is overdue when the runtime starts again; the thread is deleted first.
    await asyncio.sleep(0.4)
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        assert await rt.delete_thread("t") is True
        await asyncio.sleep(0.1)
        await rt.wait_idle()
    assert records(tmp_path) == []


async def test_subscription_sees_every_change_without_args(rt: Runtime) -> None:
    thread = await rt.create_thread()
    sub = thread.subscribe()
    ok = await thread.schedule_effect("record", {"key": "secret-value"})
    await rt.wait_idle()
    bad = await thread.schedule_effect("boom")
    await rt.wait_idle()
    gone = await thread.schedule_effect("record", {"key": "k"}, delay=60)
    await thread.remove_scheduled_effect(gone)
    sub.close()
    events = [e async for e in sub]

    assert [(e.run.id, str(e.change), e.data["status"]) for e in events] == [
        (ok, "scheduled", "pending"),
        (ok, "started", "running"),
        (ok, "completed", "completed"),
        (bad, "scheduled", "pending"),
        (bad, "started", "running"),
        (bad, "failed", "failed"),
        (gone, "scheduled", "pending"),
        (gone, "canceled", "canceled"),
    ]
    assert [e.seq for e in events] == list(range(1, 9))
    assert events[5].data["error"] == "RuntimeError: boom"
    assert all("args" not in e.to_frame()["data"] for e in events)
    assert all(e.run.args is None for e in events)  # not in the Python events either
    assert "secret-value" not in json.dumps([e.to_frame() for e in events])
    # The text a WebSocket client gets is to_frame() as JSON, made once per event.
    for e in events:
        assert json.loads(e.frame_text()) == e.to_frame()
        assert e.frame_text() is e.frame_text()


async def test_two_subscribers_get_the_same_event_and_frame_text(rt: Runtime) -> None:
    thread = await rt.create_thread()
    first, second = thread.subscribe(), thread.subscribe()
    await thread.schedule_effect("record", {"key": "k"})
    await rt.wait_idle()
    first.close()
    second.close()
    a, b = [e async for e in first], [e async for e in second]
    assert [str(e.change) for e in a] == ["scheduled", "started", "completed"]
    assert all(x is y for x, y in zip(a, b, strict=True))
    assert [e.frame_text() for e in a] == [e.frame_text() for e in b]


async def test_graceful_shutdown_requeues_a_running_run(tmp_path: Path) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, shutdown_grace_seconds=0.1
    ) as rt:
        thread = await rt.create_thread("t")
        run_id = await thread.schedule_effect("slow", {"seconds": 30})
        while not (tmp_path / "slow.started").exists():
            await asyncio.sleep(0.01)
        sub = thread.subscribe()
    events = [e async for e in sub]
    assert [str(e.change) for e in events] == ["requeued"]

    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, shutdown_grace_seconds=0.1
    ) as rt:
        thread = await rt.get_thread("t")
        # Requeued with its attempt counted, and started again at once after the restart.
        while (await thread.get_run(run_id)).status is not EffectStatus.RUNNING:
            await asyncio.sleep(0.01)
        assert (await thread.get_run(run_id)).attempts == 2


async def test_lru_evicts_idle_threads_and_reopens_them(tmp_path: Path) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, max_open_threads=3
    ) as rt:
        threads = [await rt.create_thread(f"t{i}") for i in range(8)]
        for t in threads:
            await t.schedule_effect("record", {"key": t.thread_id}, delay=0.05)
        await asyncio.sleep(0.2)
        await rt.wait_idle()
        assert rt.actors.open_count <= 3
        assert sorted(str(r["key"]) for r in records(tmp_path)) == [f"t{i}" for i in range(8)]
        for t in threads:
            page = await t.list_runs()
            assert [r.status for r in page.runs] == [EffectStatus.COMPLETED]


async def test_a_huge_error_message_is_cut(rt: Runtime) -> None:
    thread = await rt.create_thread()
    run_id = await thread.schedule_effect("boom", {"message": "x" * 100_000})
    await rt.wait_idle()
    run = await thread.get_run(run_id)
    assert run.status is EffectStatus.FAILED
    assert run.error is not None
    assert len(run.error) <= 8192
    assert run.error.startswith("RuntimeError: xxx")
    assert run.error.endswith("more bytes cut]")


async def test_a_delay_over_ten_years_is_refused_and_far_alarms_still_start(
    tmp_path: Path,
) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        thread = await rt.create_thread("t")
        await thread.schedule_effect("record", {"key": "soon"}, delay=60)
        for delay in (1e12, 3e11, 1e20, 1e308, timedelta(days=3660 * 2)):
            with pytest.raises(InvalidDelay, match=r"at most 315360000 s \(10 years\)"):
                await thread.schedule_effect("record", {"key": "far"}, delay=delay)
        assert len((await thread.list_runs()).runs) == 1
    # An alarm row far in the future (written before the cap existed) does not stop startup.
    rtdb = rt.storage.open()
    try:
        rtdb.set_alarm("t", 1e15)
    finally:
        rtdb.close()
        rt.storage.close()
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        assert len((await (await rt.get_thread("t")).list_runs()).runs) == 1


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("surrogate", "ValueError: cannot import caf\\udce9.txt"),
        ("exit", "SystemExit: 3"),
        ("interrupt", "KeyboardInterrupt"),
        ("cancel", "CancelledError: the effect cancelled itself"),
        ("bad_str", "_BadStr: <the exception's message could not be rendered>"),
        ("wait_idle", "RuntimeError: wait_idle() cannot be called from an effect"),
    ],
)
async def test_odd_failures_fail_the_run_and_the_thread_goes_on(
    rt: Runtime, how: str, error: str
) -> None:
    thread = await rt.create_thread()
    bad = await thread.schedule_effect("misbehave", {"how": how})
    after = await thread.schedule_effect("record", {"key": "after"})
    await rt.wait_idle()
    run = await thread.get_run(bad)
    assert run.status is EffectStatus.FAILED
    assert run.error is not None and run.error.startswith(error)
    assert (await thread.get_run(after)).status is EffectStatus.COMPLETED


async def test_an_effect_can_delete_its_own_thread(rt: Runtime, tmp_path: Path) -> None:
    thread = await rt.create_thread("selfish")
    await thread.schedule_effect("misbehave", {"how": "delete_self"})
    await thread.schedule_effect("record", {"key": "never"}, delay=0.05)
    await asyncio.sleep(0.2)
    await rt.wait_idle()
    assert (tmp_path / "deleted_self").read_text() == "selfish"
    with pytest.raises(ThreadNotFound):
        await rt.get_thread("selfish")
    assert records(tmp_path) == []
    assert not (tmp_path / "threads" / "selfish.sqlite").exists()


async def test_an_async_callable_object_is_awaited(rt: Runtime, tmp_path: Path) -> None:
    thread = await rt.create_thread()
    run_id = await thread.schedule_effect("callable_object")
    await rt.wait_idle()
    assert (await thread.get_run(run_id)).status is EffectStatus.COMPLETED
    assert (tmp_path / "callable_object.ran").read_text() == "yes"


async def test_deleting_while_scheduling_leaves_no_alarm_behind(rt: Runtime) -> None:
    for i in range(10):
        thread = await rt.create_thread(f"race{i}")
        results = await asyncio.gather(
            rt.delete_thread(thread.thread_id),
            *(thread.schedule_effect("record", {"key": "k"}, delay=60) for _ in range(5)),
            return_exceptions=True,
        )
        assert results[0] is True
        assert all(isinstance(r, str | ThreadNotFound) for r in results[1:]), results
    assert stored_alarms(rt) == {}


async def test_args_size_counts_utf8_bytes(tmp_path: Path) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, max_args_bytes=1000
    ) as rt:
        thread = await rt.create_thread()
        await thread.schedule_effect("record", {"key": "é" * 480})  # 960 bytes + 10
        with pytest.raises(InvalidEffectArgs, match="1002 bytes of JSON; the limit is 1000"):
            await thread.schedule_effect("record", {"key": "é" * 496})
        deep: object = "x"
        for _ in range(5000):
            deep = [deep]
        with pytest.raises(InvalidEffectArgs, match="deeper than the limit of 32 levels"):
            await thread.schedule_effect("record", {"key": "k", "extra": deep})


async def test_a_missing_app_folder_stops_startup(tmp_path: Path) -> None:
    rt = Runtime(app_dir=tmp_path / "typo", data_dir=tmp_path / "data", load_packages=False)
    with pytest.raises(EffectDefinitionError, match=r"App folder .*typo does not exist"):
        await rt.start()


async def test_emptied_files_are_refused_not_taken_for_new_ones(tmp_path: Path) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        thread = await rt.create_thread("t")
        await thread.schedule_effect("record", {"key": "k"}, delay=3600)
    (tmp_path / "threads" / "t.sqlite").write_bytes(b"")
    for suffix in ("-wal", "-shm"):
        (tmp_path / "threads" / f"t.sqlite{suffix}").unlink(missing_ok=True)
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        with pytest.raises(ThreadStorageError, match="is missing or empty although the thread"):
            await (await rt.get_thread("t")).list_runs()

    (tmp_path / "runtime.sqlite").write_bytes(b"")
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"runtime.sqlite{suffix}").unlink(missing_ok=True)
    rt = Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False)
    with pytest.raises(RuntimeStorageError, match="holds 1 thread files"):
        await rt.start()
    (tmp_path / "runtime.sqlite").write_bytes(b"garbage" * 1000)
    with pytest.raises(RuntimeStorageError, match="cannot be used: file is not a database"):
        await rt.start()


def test_define_effect_checks_the_function_signature() -> None:
    async def no_state() -> None: ...

    async def one(state: object) -> None: ...

    with pytest.raises(TypeError, match=r"cannot be called as fn\(state, args\)"):
        define_effect("x", Args, one)
    with pytest.raises(TypeError, match=r"cannot be called as fn\(state\)"):
        define_effect("x", no_state)


async def test_wait_idle_rejects_a_bad_timeout(rt: Runtime) -> None:
    for bad in (0, -1, math.nan):
        with pytest.raises(ValueError, match="timeout_seconds"):
            await rt.wait_idle(bad)


async def test_deleting_a_thread_removes_its_store(
    frt: Runtime, storage: StorageBackend
) -> None:
    thread = await frt.create_thread("gone")
    await thread.schedule_effect("record", {"key": "k"}, delay=60)
    assert has_thread_store(storage, "gone")
    assert await frt.delete_thread("gone") is True
    assert not has_thread_store(storage, "gone")
    assert stored_alarms(frt) == {}
    # The id is free again, and the new thread starts empty.
    again = await frt.create_thread("gone")
    assert (await again.list_runs()).runs == []


async def test_a_restart_on_the_same_backend_finds_threads_runs_and_alarms(
    tmp_path: Path, clock: FakeClock, storage: StorageBackend
) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as rt:
        thread = await rt.create_thread("kept", tags=["a"])
        # Within the alarm horizon of a shared backend (60 s): a later alarm is armed by
        # the node's poll, on the real clock, which this fake clock does not drive.
        later = await thread.schedule_effect("record", {"key": "later"}, delay=30)
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as rt:
        assert [t.id for t in (await rt.list_threads()).threads] == ["kept"]
        alarms = stored_alarms(rt)
        if storage.kind == "postgres" and alarms == {"kept": clock.now()}:
            # The node's first alarm poll read the thread's creation-time row after the
            # schedule and armed it there (a poll cannot tell a creation row from another
            # node's run due then): the shutdown left the row early, a wake-up for
            # nothing at this start, never a late one. The run still runs at its time.
            pass
        else:
            assert alarms == {"kept": clock.now() + 30}
        clock.advance(30)
        await rt.wait_idle()
        thread = await rt.get_thread("kept")
        assert (await thread.get_run(later)).status is EffectStatus.COMPLETED
    assert [r["key"] for r in records(tmp_path)] == ["later"]


async def test_alarm_rows_follow_the_next_pending_run(frt: Runtime, clock: FakeClock) -> None:
    thread = await frt.create_thread("t")
    now = clock.now()
    # The row was written with the thread, at its creation: a schedule due at or after
    # that writes no row.
    assert stored_alarms(frt) == {"t": now}
    await thread.schedule_effect("record", {"key": "later"}, delay=3600)
    assert stored_alarms(frt) == {"t": now}
    await thread.schedule_effect("record", {"key": "now"})
    assert stored_alarms(frt) == {"t": now}
    await frt.wait_idle()
    # Just drained, the thread is warm: its row stays where it was (at or before the
    # drain), so a schedule on it now commits its run row only.
    await asyncio.sleep(ALARM_FLUSH_SECONDS * 3)
    assert stored_alarms(frt) == {"t": now}
    await thread.schedule_effect("record", {"key": "soon"}, delay=ALARM_KEEP_SECONDS / 2)
    assert stored_alarms(frt) == {"t": now}
    clock.advance(ALARM_KEEP_SECONDS / 2)
    await frt.wait_idle()
    # Idle for ALARM_KEEP_SECONDS: raised to the next pending run in the background (a
    # stale, earlier row would only cause a harmless extra wake-up after a crash).
    clock.advance(ALARM_KEEP_SECONDS)
    for _ in range(150):
        if stored_alarms(frt) == {"t": now + 3600}:
            break
        await asyncio.sleep(0.02)
    assert stored_alarms(frt) == {"t": now + 3600}

    clock.advance(3600)
    await frt.wait_idle()
    clock.advance(ALARM_KEEP_SECONDS)
    for _ in range(150):
        if not stored_alarms(frt):
            break
        await asyncio.sleep(0.02)
    assert stored_alarms(frt) == {}
    assert [r["key"] for r in records(frt.settings.data_dir)] == ["now", "soon", "later"]

    # Idle and raised: a run due before the row lowers it at once, before its run row.
    await thread.schedule_effect("record", {"key": "far"}, delay=7200)
    clock.advance(ALARM_KEEP_SECONDS)
    for _ in range(150):
        if stored_alarms(frt) == {"t": clock.now() + 7200 - ALARM_KEEP_SECONDS}:
            break
        await asyncio.sleep(0.02)
    far = clock.now() + 7200 - ALARM_KEEP_SECONDS
    assert stored_alarms(frt) == {"t": far}
    await thread.schedule_effect("record", {"key": "sooner"}, delay=10)
    assert stored_alarms(frt) == {"t": clock.now() + 10}


async def test_a_clean_shutdown_moves_warm_rows_to_the_next_pending_run(
    tmp_path: Path, clock: FakeClock, storage: StorageBackend
) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as rt:
        thread = await rt.create_thread("t")
        now = clock.now()
        await thread.schedule_effect("record", {"key": "later"}, delay=3600)
        await thread.schedule_effect("record", {"key": "now"})
        idle = await rt.create_thread("idle")
        await idle.schedule_effect("record", {"key": "idle"})
        await rt.wait_idle()
        assert stored_alarms(rt) == {"t": now, "idle": now}  # both warm
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, clock=clock, load_packages=False, storage=storage
    ) as rt:
        assert stored_alarms(rt) == {"t": now + 3600}


async def test_a_run_scheduled_while_its_thread_drains_keeps_an_early_enough_alarm(
    rt: Runtime,
) -> None:
    for i in range(20):
        thread = await rt.create_thread(f"d{i}")
        await thread.schedule_effect("record", {"key": "a"})
        # Races the drain and its alarm flush: the row must end at or before this run.
        run_id = await thread.schedule_effect("record", {"key": "b"}, delay=30)
        run = await thread.get_run(run_id)
        await asyncio.sleep(0.06)
        await rt.wait_idle()
        rows = stored_alarms(rt)
        assert rows[thread.thread_id] <= run.run_at_ts


async def test_concurrent_creates_of_one_id_give_one_working_thread(rt: Runtime) -> None:
    for i in range(20):
        results = await asyncio.gather(
            *(rt.create_thread(f"same{i}") for _ in range(4)), return_exceptions=True
        )
        made = [r for r in results if not isinstance(r, BaseException)]
        assert len(made) == 1, results
        assert all(isinstance(r, ThreadExists) for r in results if r not in made), results
        thread = await rt.get_thread(f"same{i}")
        run_id = await thread.schedule_effect("record", {"key": "k"}, delay=60)
        assert (await thread.get_run(run_id)).status is EffectStatus.PENDING


async def test_a_state_of_a_deleted_thread_cannot_write_into_a_new_one_with_its_id(
    rt: Runtime,
) -> None:
    old = await rt.create_thread("reused")
    assert await rt.delete_thread("reused")
    new = await rt.create_thread("reused")
    with pytest.raises(ThreadNotFound):
        await old.schedule_effect("record", {"key": "from the old thread"})
    with pytest.raises(ThreadNotFound):
        await old.inject_message("from the old thread")
    assert (await new.list_runs()).runs == []
    await new.schedule_effect("record", {"key": "fine"})


async def test_many_threads_over_the_open_limit_never_hit_a_closed_file(
    tmp_path: Path,
) -> None:
    async with Runtime(
        app_dir=APP, data_dir=tmp_path, load_packages=False, max_open_threads=3,
        max_concurrent_runs=3,
    ) as rt:
        threads = [await rt.create_thread(f"t{i}") for i in range(30)]

        async def churn(t: ThreadState) -> None:
            for j in range(5):
                await t.schedule_effect("record", {"key": f"{t.thread_id}-{j}"}, delay=j / 100)

        await asyncio.gather(*(churn(t) for t in threads))
        await asyncio.sleep(0.2)
        await rt.wait_idle()
        assert len(records(tmp_path)) == 150


async def test_a_huge_non_ascii_error_is_cut_to_8_kib_of_utf8(rt: Runtime) -> None:
    thread = await rt.create_thread()
    run_id = await thread.schedule_effect("boom", {"message": "😀" * 100_000})
    await rt.wait_idle()
    error = (await thread.get_run(run_id)).error
    assert error is not None and len(error.encode("utf-8")) <= 8192


async def test_the_storage_pool_skips_a_call_cancelled_before_it_started() -> None:
    # One thread, so the calls run strictly in order: the blocker, the canceled call,
    # the marker. What Runtime.run_sync relies on (as with an executor): a caller that
    # gave up before its call started does not have it run later; results and
    # exceptions come back to the awaiting task.
    from runtime.supervisor import _StoragePool

    pool = _StoragePool(1, "test-storage")
    loop = asyncio.get_running_loop()
    gate = threading.Event()
    ran: list[str] = []
    try:
        blocker = pool.submit(loop, gate.wait, ())
        canceled = pool.submit(loop, ran.append, ("canceled",))
        canceled.cancel()
        gate.set()
        assert await blocker is True
        assert await pool.submit(loop, ran.append, ("marker",)) is None
        assert ran == ["marker"]
        with pytest.raises(ZeroDivisionError):
            await pool.submit(loop, divmod, (1, 0))
    finally:
        pool.shutdown()


async def test_a_corrupt_thread_is_retried_with_backoff_not_in_a_hot_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        bad = await rt.create_thread("bad")
        await bad.schedule_effect("record", {"key": "never"}, delay=0.2)
    (tmp_path / "threads" / "bad.sqlite").write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (tmp_path / "threads" / f"bad.sqlite{suffix}").unlink(missing_ok=True)
    caplog.set_level(logging.ERROR)
    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        for _ in range(400):  # a hang guard
            if "(retrying in 2 s)" in caplog.text:
                break
            await asyncio.sleep(0.05)
        tries = caplog.text.count("thread bad cannot run its effects")
        assert "(retrying in 1 s)" in caplog.text and "(retrying in 2 s)" in caplog.text
        assert tries == 2, caplog.text  # the first try and one retry: no hot loop
        good = await rt.create_thread("good")
        run_id = await good.schedule_effect("record", {"key": "fine"})
        await rt.wait_idle()
        assert (await good.get_run(run_id)).status is EffectStatus.COMPLETED


async def test_a_thread_whose_store_answered_again_backs_off_from_one_second_at_its_next_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from runtime.errors import ThreadStorageError

    async with Runtime(app_dir=APP, data_dir=tmp_path, load_packages=False) as rt:
        await rt.create_thread("t")
        real = rt.executor.drain
        fails = [True, True, False, True]  # two failures, a drain that works, a failure
        calls: list[bool] = []

        async def drain(actor: object) -> bool:
            fail = fails[len(calls)] if len(calls) < len(fails) else False
            calls.append(fail)
            if fail:
                raise ThreadStorageError("t", "Thread t: the disk blinked")
            return await real(actor)  # type: ignore[arg-type]

        rt.executor.drain = drain  # type: ignore[method-assign]
        caplog.set_level(logging.ERROR)
        rt.dispatcher.wake("t")
        for _ in range(200):  # a hang guard: the retries come after 1 s, then 2 s
            if len(calls) >= 3:
                break
            await asyncio.sleep(0.05)
        assert calls == [True, True, False]
        rt.dispatcher.wake("t")
        for _ in range(100):
            if len(calls) >= 4:
                break
            await asyncio.sleep(0.05)
        lines = [r.getMessage() for r in caplog.records if "cannot run its effects" in
                 r.getMessage()]
        assert [line.split("(")[1].split(")")[0] for line in lines] == [
            "retrying in 1 s", "retrying in 2 s", "retrying in 1 s"]
