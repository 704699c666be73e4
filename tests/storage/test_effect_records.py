"""The effect-record store contract, run against every backend.

A backend joins by adding a parameter to the `store` fixture (and to `open_store_code`
for the cross-process test when it can be shared between processes).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runtime import (
    EffectRecordLost,
    EffectRecordStatus,
    EffectRecordStore,
    InMemoryEffectStore,
    SqliteEffectStore,
)
from runtime.storage.records import EFFECT_RECORDS_DDL, sql_begin, sql_complete, sql_get
from runtime.testing import FakeClock

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=T0)


@pytest.fixture(params=["memory", "sqlite"])
async def store(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path, no_blocking: None
) -> AsyncIterator[EffectRecordStore]:
    """Each backend; no contract method may block the event loop (blockbuster checks)."""
    backend: EffectRecordStore
    if request.param == "memory":
        backend = InMemoryEffectStore(clock=clock.now)
    else:
        backend = SqliteEffectStore(tmp_path / "records.sqlite", clock=clock.now)
    yield backend
    await backend.close()


async def claim(store: EffectRecordStore, key: str, owner: str, *, thread: str = "t1",
                lease: float = 30.0) -> bool:
    result = await store.begin(thread, key, tool_name="post", run_id="r1", owner=owner,
                               lease_seconds=lease)
    return result.claimed


async def test_a_new_key_is_claimed_in_progress_under_a_lease(
    store: EffectRecordStore,
) -> None:
    assert await store.get("t1", "k") is None
    got = await store.begin("t1", "k", tool_name="post", run_id="r1", owner="a",
                            lease_seconds=30)
    assert got.claimed and not got.took_over and not got.applied
    record = got.record
    assert record.status is EffectRecordStatus.IN_PROGRESS
    assert (record.thread_id, record.key, record.tool_name, record.run_id, record.owner) == (
        "t1", "k", "post", "r1", "a")
    assert record.lease_expires_at == datetime.fromtimestamp(T0 + 30, UTC)
    assert record.created_at == datetime.fromtimestamp(T0, UTC)
    assert record.result is None
    assert await store.get("t1", "k") == record


async def test_a_held_key_is_not_claimed_again_until_its_lease_expires(
    store: EffectRecordStore, clock: FakeClock
) -> None:
    assert await claim(store, "k", "a", lease=10)
    held = await store.begin("t1", "k", tool_name="post", run_id="r2", owner="b",
                             lease_seconds=10)
    assert not held.claimed and not held.applied and held.record.owner == "a"
    clock.advance(9.5)
    assert not await claim(store, "k", "b", lease=10)
    clock.advance(0.5)
    taken = await store.begin("t1", "k", tool_name="post", run_id="r2", owner="b",
                              lease_seconds=10)
    assert taken.claimed and taken.took_over
    assert taken.record.owner == "b" and taken.record.run_id == "r2"
    with pytest.raises(EffectRecordLost, match="'k'"):
        await store.complete("t1", "k", owner="a", result_json="1")
    assert not await store.release("t1", "k", owner="a")
    assert (await store.complete("t1", "k", owner="b", result_json="2")).result == 2


async def test_complete_records_the_result_and_a_recorded_key_is_never_claimed(
    store: EffectRecordStore, clock: FakeClock
) -> None:
    assert await claim(store, "k", "a")
    clock.advance(2)
    done = await store.complete("t1", "k", owner="a", result_json='{"id":7,"ok":true}')
    assert done.status is EffectRecordStatus.APPLIED
    assert done.result == {"id": 7, "ok": True}
    assert done.owner is None and done.lease_expires_at is None
    assert done.updated_at == datetime.fromtimestamp(T0 + 2, UTC)
    clock.advance(3600)  # no lease to expire: applied is final
    again = await store.begin("t1", "k", tool_name="post", run_id="r9", owner="b",
                              lease_seconds=1)
    assert again.applied and not again.claimed
    assert again.record.result_json == '{"id":7,"ok":true}'
    with pytest.raises(EffectRecordLost):
        await store.complete("t1", "k", owner="a", result_json="3")
    assert not await store.release("t1", "k", owner="a")
    assert (await store.get("t1", "k")) == done


async def test_renew_extends_only_the_owners_live_lease(
    store: EffectRecordStore, clock: FakeClock
) -> None:
    assert await claim(store, "k", "a", lease=10)
    clock.advance(8)
    assert await store.renew("t1", "k", owner="a", lease_seconds=10)
    record = await store.get("t1", "k")
    assert record is not None
    assert record.lease_expires_at == datetime.fromtimestamp(T0 + 18, UTC)
    clock.advance(8)  # 16 s after the claim: alive only because it was renewed
    assert not await claim(store, "k", "b", lease=10)
    assert not await store.renew("t1", "k", owner="b", lease_seconds=10)  # not its claim
    clock.advance(2)
    assert await claim(store, "k", "b", lease=10)  # expired: taken over
    assert not await store.renew("t1", "k", owner="a", lease_seconds=10)  # lost it
    await store.complete("t1", "k", owner="b", result_json="1")
    assert not await store.renew("t1", "k", owner="b", lease_seconds=10)  # applied
    assert not await store.renew("t1", "gone", owner="b", lease_seconds=10)
    with pytest.raises(ValueError):
        await store.renew("t1", "k", owner="b", lease_seconds=0)


async def test_release_drops_only_the_owners_in_progress_record(
    store: EffectRecordStore,
) -> None:
    assert await claim(store, "k", "a")
    assert not await store.release("t1", "k", owner="b")
    assert await store.release("t1", "k", owner="a")
    assert await store.get("t1", "k") is None
    assert not await store.release("t1", "k", owner="a")
    assert await claim(store, "k", "b")  # nothing was recorded: the next call may apply
    with pytest.raises(EffectRecordLost):
        await store.complete("t1", "missing", owner="b", result_json="1")


async def test_keys_are_scoped_to_their_thread(store: EffectRecordStore) -> None:
    assert await claim(store, "k", "a", thread="t1")
    assert await claim(store, "k", "b", thread="t2")
    await store.complete("t2", "k", owner="b", result_json='"two"')
    one = await store.get("t1", "k")
    assert one is not None and one.status is EffectRecordStatus.IN_PROGRESS


async def test_bad_leases_limits_and_cursors_are_refused(store: EffectRecordStore) -> None:
    for lease in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="lease_seconds"):
            await store.begin("t1", "k", tool_name="p", run_id=None, owner="a",
                              lease_seconds=lease)
    assert await store.get("t1", "k") is None
    for limit in (0, 1001):
        with pytest.raises(ValueError, match="limit"):
            await store.list("t1", limit=limit)
    with pytest.raises(ValueError, match="cursor"):
        await store.list("t1", cursor="not-a-cursor")
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.purge(older_than=datetime(2024, 1, 1))


async def test_list_pages_newest_first_and_filters_by_status(
    store: EffectRecordStore, clock: FakeClock
) -> None:
    for i in range(7):
        assert await claim(store, f"k{i}", "a")
        if i % 2 == 0:
            await store.complete("t1", f"k{i}", owner="a", result_json=str(i))
        clock.advance(0.000001 if i == 3 else 1)
    assert await claim(store, "other", "a", thread="t2")
    # Two records share an instant: the key breaks the tie, and no page loses either.
    clock_now = clock.now()
    assert await claim(store, "same-b", "a")
    assert await claim(store, "same-a", "a")
    assert clock.now() == clock_now
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list("t1", limit=2, cursor=cursor)
        seen += [r.key for r in page.records]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ["same-b", "same-a", "k6", "k5", "k4", "k3", "k2", "k1", "k0"]
    applied = await store.list("t1", status=EffectRecordStatus.APPLIED, limit=10)
    assert [r.key for r in applied.records] == ["k6", "k4", "k2", "k0"]
    assert applied.next_cursor is None
    assert [r.key for r in (await store.list("t2")).records] == ["other"]
    assert (await store.list("nobody")).records == []


async def test_purge_by_age_keeps_live_leases_and_purge_thread_takes_all(
    store: EffectRecordStore, clock: FakeClock
) -> None:
    assert await claim(store, "old-applied", "a")
    await store.complete("t1", "old-applied", owner="a", result_json="1")
    assert await claim(store, "old-dead", "a", lease=5)
    assert await claim(store, "old-live", "a", lease=10_000)
    clock.advance(100)
    assert await claim(store, "new", "a")
    await store.complete("t1", "new", owner="a", result_json="2")
    assert await claim(store, "elsewhere", "a", thread="t2")
    cutoff = datetime.fromtimestamp(clock.now(), UTC) - timedelta(seconds=50)
    assert await store.purge(older_than=cutoff) == 2
    left = {r.key for r in (await store.list("t1")).records}
    assert left == {"old-live", "new"}
    assert await store.purge_thread("t1") == 2
    assert (await store.list("t1")).records == []
    assert [r.key for r in (await store.list("t2")).records] == ["elsewhere"]


async def test_many_concurrent_claimants_on_one_key_one_wins(store: EffectRecordStore) -> None:
    import anyio

    winners: list[str] = []

    async def contend(owner: str) -> None:
        if await claim(store, "hot", owner):
            winners.append(owner)

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(contend, f"o{i}")
    assert len(winners) == 1


def test_the_sql_runs_inside_another_database_file(tmp_path: Path) -> None:
    """The thread store can hold the table in its own file and call the functions."""
    conn = sqlite3.connect(tmp_path / "thread.sqlite", isolation_level=None)
    conn.execute("CREATE TABLE effect_runs (id TEXT PRIMARY KEY)")  # a thread's own table
    conn.execute("BEGIN IMMEDIATE")
    for statement in EFFECT_RECORDS_DDL:
        conn.execute(statement)
    got = sql_begin(conn, "t1", "k", tool_name="p", run_id="r", owner="a", lease_seconds=5,
                    now=T0)
    conn.execute("INSERT INTO effect_runs VALUES ('run-1')")
    sql_complete(conn, "t1", "k", owner="a", result_json="[1]", now=T0 + 1)
    conn.execute("COMMIT")
    assert got.claimed
    record = sql_get(conn, "t1", "k")
    assert record is not None and record.result == [1]
    conn.close()


RACE = """
import asyncio, json, sys, time
from pathlib import Path
from runtime import SqliteEffectStore

async def main():
    path, go, me, keys = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    store = SqliteEffectStore(path)
    print("READY", flush=True)
    while not go.exists():
        time.sleep(0.005)
    won = []
    for i in range(keys):
        got = await store.begin("t1", f"k{i}", tool_name="p", run_id="r", owner=me,
                                lease_seconds=60)
        if got.claimed:
            won.append(i)
            await store.complete("t1", f"k{i}", owner=me, result_json=json.dumps(me))
    await store.close()
    print(json.dumps(won), flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
def test_processes_racing_on_one_sqlite_file_claim_each_key_once(tmp_path: Path) -> None:
    path, go, keys = tmp_path / "records.sqlite", tmp_path / "go", 40
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(RACE), str(path), str(go), f"p{i}",
             str(keys)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for i in range(3)
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY", proc.stderr
    go.touch()
    won: list[int] = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        won += json.loads(out.strip().splitlines()[-1])
    assert sorted(won) == list(range(keys))  # every key claimed, each by exactly one
    conn = sqlite3.connect(path)
    statuses = conn.execute("SELECT DISTINCT status FROM effect_records").fetchall()
    conn.close()
    assert statuses == [("applied",)]



async def test_a_record_as_json_is_what_the_http_api_will_list(store: EffectRecordStore) -> None:
    got = await store.begin("t1", "k", tool_name="post", run_id="r1", owner="a",
                            lease_seconds=30)
    assert got.record.to_json() == {
        "threadId": "t1", "key": "k", "toolName": "post", "runId": "r1",
        "status": "in_progress", "result": None,
        "leaseExpiresAt": "2023-11-14T22:13:50Z", "createdAt": "2023-11-14T22:13:20Z",
        "updatedAt": "2023-11-14T22:13:20Z",
    }
    done = await store.complete("t1", "k", owner="a", result_json='{"id":1}')
    assert done.to_json()["status"] == "applied" and done.to_json()["result"] == {"id": 1}
    assert done.to_json()["leaseExpiresAt"] is None


@pytest.mark.parametrize("status", [EffectRecordStatus.SUCCEEDED, EffectRecordStatus.DENIED])
async def test_a_succeeded_or_denied_record_is_finished_like_an_applied_one(
    store: EffectRecordStore, status: EffectRecordStatus
) -> None:
    assert await claim(store, "k", "a")
    done = await store.complete("t1", "k", owner="a", result_json='"ok"', status=status)
    assert done.status is status and done.result == "ok" and done.owner is None
    again = await store.begin("t1", "k", tool_name="post", run_id="r2", owner="b",
                              lease_seconds=30)
    assert again.finished and not again.claimed and not again.applied


async def test_a_failed_record_is_claimed_again_not_taken_over(
    store: EffectRecordStore, clock: FakeClock
) -> None:
    assert await claim(store, "k", "a")
    failed = await store.complete("t1", "k", owner="a", result_json='{"error": "x"}',
                                  status=EffectRecordStatus.FAILED)
    assert failed.status is EffectRecordStatus.FAILED and failed.result == {"error": "x"}
    clock.advance(5)
    retry = await store.begin("t1", "k", tool_name="post", run_id="r2", owner="b",
                              lease_seconds=30)
    assert retry.claimed and not retry.took_over and not retry.finished
    assert retry.record.status is EffectRecordStatus.IN_PROGRESS
    assert retry.record.result_json is None and retry.record.run_id == "r2"
    assert retry.record.created_at == datetime.fromtimestamp(T0 + 5, UTC)
    assert not await claim(store, "k", "c")  # the retry holds it now


async def test_a_record_cannot_complete_as_in_progress(store: EffectRecordStore) -> None:
    assert await claim(store, "k", "a")
    with pytest.raises(ValueError, match="applied, succeeded, failed or denied"):
        await store.complete("t1", "k", owner="a", result_json="1",
                             status=EffectRecordStatus.IN_PROGRESS)
    record = await store.get("t1", "k")
    assert record is not None and record.status is EffectRecordStatus.IN_PROGRESS


async def test_purge_deletes_old_failed_records(store: EffectRecordStore,
                                                clock: FakeClock) -> None:
    assert await claim(store, "k", "a")
    await store.complete("t1", "k", owner="a", result_json="{}",
                         status=EffectRecordStatus.FAILED)
    clock.advance(60)
    assert await store.purge(older_than=datetime.fromtimestamp(T0 + 1, UTC)) == 1
    assert await store.get("t1", "k") is None
