"""Runs across threads: the run index over 1,000 threads, its filters, counts and cursors,
and its rebuild after a crash (the API's ``GET /api/runs`` reads the same)."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

import anyio.to_thread
import pydantic_ai  # noqa: F401 - imported by messages on first use; that reads files (blocking)
import pytest
from conftest import release, serve_api

from runtime import Runtime
from runtime.errors import InvalidArgument
from runtime.storage.memory import MemoryBackend
from runtime.testing import FakeClock

APP = Path(__file__).parent / "apps" / "server_app"
THREADS = 1000

pytestmark = pytest.mark.usefixtures("no_blocking")


def runtime(data_dir: Path, clock: FakeClock, **kw: object) -> Runtime:
    return Runtime(app_dir=APP, data_dir=data_dir, clock=clock, load_packages=False,
                   extensions=[], synchronous="NORMAL", **kw)


async def test_filters_counts_and_cursors_over_a_thousand_threads(tmp_path: Path) -> None:
    clock = FakeClock()
    async with runtime(tmp_path / "data", clock) as rt:
        failing: set[str] = set()
        vip_threads: set[str] = set()
        for i in range(THREADS):
            tags = ["vip"] if i % 100 == 0 else []
            thread = await rt.create_thread(user_id=f"u{i % 10}", tags=tags)
            if tags:
                vip_threads.add(thread.thread_id)
            if i == 0:
                first = thread.thread_id  # vip, and its run fails
            clock.advance(0.001)  # distinct scheduling times
            if i % 7 == 0:
                failing.add(await thread.schedule_effect("boom", {"message": "no"}))
            else:
                await thread.schedule_effect("ping")
        clock.advance(0.001)
        later = await thread.schedule_effect("ping", delay=3600)
        await rt.wait_idle()

        page = await rt.list_runs(status="failed", limit=500)
        assert {r.id for r in page.runs} == failing and page.next_cursor is None
        assert all(r.error == "ValueError: no" and r.args is None for r in page.runs)
        assert page.counts["failed"] == len(failing)
        assert page.counts["completed"] == THREADS - len(failing)
        assert page.counts["pending"] == 1 and page.complete

        # Every run once, newest first, through stable cursors (while runs change).
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = await rt.list_runs(limit=97, cursor=cursor)
            seen += [r.id for r in page.runs]
            created = [r.created_at_ts for r in page.runs]
            assert created == sorted(created, reverse=True)
            if len(seen) == 97:  # a change in the middle of the walk moves nothing
                await (await rt.get_thread(thread.thread_id)).run_now(later)
                await rt.wait_idle()
            cursor = page.next_cursor
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) == THREADS + 1
        assert seen[0] == later

        users = await rt.list_runs(user_id="u3", limit=500)
        assert len(users.runs) == THREADS // 10
        vip = await rt.list_runs(tag="vip", status=["completed", "failed"], limit=500)
        assert {r.thread_id for r in vip.runs} == vip_threads
        assert vip.counts["failed"] == sum(1 for r in vip.runs if r.status == "failed")
        named = await rt.list_runs(name="boom", thread_id=first)
        assert [r.status for r in named.runs] == ["failed"]
        t0 = page.runs[-1].run_at_ts
        window = await rt.list_runs(since=t0, until=t0 + 0.0105, limit=500)
        assert 1 <= len(window.runs) <= 11

        with pytest.raises(ValueError, match='Unknown status "done"'):
            await rt.list_runs(status="done")
        with pytest.raises(ValueError, match="Invalid cursor"):
            await rt.list_runs(cursor="nope")
        # A deleted thread's runs are gone from the index.
        await rt.delete_thread(thread.thread_id)
        assert later not in {r.id for r in (await rt.list_runs(limit=500)).runs}


async def test_the_index_is_rebuilt_after_a_crash(tmp_path: Path) -> None:
    clock = FakeClock()
    data = tmp_path / "data"
    async with runtime(data, clock) as rt:
        ids = []
        for _ in range(30):
            thread = await rt.create_thread()
            ids.append(await thread.schedule_effect("ping", delay=60))

    # What a crash leaves: the last batch never written, the index not marked complete.
    def crash() -> None:
        conn = sqlite3.connect(data / "runtime.sqlite")
        with conn:
            conn.execute("DELETE FROM run_index WHERE rowid % 2 = 0")
            conn.execute("UPDATE runtime_meta SET value = '0'")
        conn.close()

    await anyio.to_thread.run_sync(crash)
    async with runtime(data, clock) as rt:
        await rt.wait_run_index()
        page = await rt.list_runs(limit=100)
        assert page.complete and sorted(r.id for r in page.runs) == sorted(ids)
        assert page.counts["pending"] == 30
    # A clean close marks it complete: the next start does not rebuild.
    async with runtime(data, clock) as rt:
        assert rt.run_index.complete


async def test_the_memory_backend_indexes_runs_too(tmp_path: Path) -> None:
    clock = FakeClock()
    async with runtime(tmp_path, clock, storage=MemoryBackend()) as rt:
        thread = await rt.create_thread(user_id="u")
        run_id = await thread.schedule_effect("ping")
        await rt.wait_idle()
        page = await rt.list_runs(user_id="u")
        assert [(r.id, r.status) for r in page.runs] == [(run_id, "completed")]


async def test_get_api_runs_filters_pages_and_counts(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        assert api.clock is not None
        a = await api.new_thread(user_id="alice", tags=["vip"])
        b = await api.new_thread(user_id="bob")
        ok = await api.schedule(a, "note", {"text": "secret"})
        api.clock.advance(1)
        bad = await api.schedule(b, "boom", {"message": "no"})
        api.clock.advance(1)
        later = await api.schedule(a, "ping", delay_seconds=3600)
        await api.rt.wait_idle()

        res = await api.client.get("/api/runs")
        assert res.status_code == 200
        body = res.json()
        assert [r["id"] for r in body["runs"]] == [later, bad, ok]
        assert body["nextCursor"] is None and body["complete"] is True
        assert body["counts"] == {"pending": 1, "running": 0, "completed": 1, "failed": 1,
                                  "canceled": 0}
        assert all("args" not in r for r in body["runs"])
        failed = body["runs"][1]
        assert (failed["threadId"], failed["status"], failed["error"]) == (
            b, "failed", "ValueError: no"
        )

        async def ids(**params: str) -> list[str]:
            res = await api.client.get("/api/runs", params=params)
            assert res.status_code == 200, res.text
            return [r["id"] for r in res.json()["runs"]]

        assert await ids(status="failed,completed") == [bad, ok]
        assert await ids(user_id="alice") == [later, ok]
        assert await ids(tag="vip", status="pending") == [later]
        assert await ids(name="boom") == [bad]
        assert await ids(thread_id=b) == [bad]
        due = (await api.run(a, later))["runAt"]
        assert await ids(since=due) == [later]
        assert await ids(until=due) == [bad, ok]

        first = (await api.client.get("/api/runs", params={"limit": 2})).json()
        assert [r["id"] for r in first["runs"]] == [later, bad]
        rest = await ids(cursor=first["nextCursor"])
        assert rest == [ok]

        for params, word in (({"status": "done"}, "Unknown status"),
                             ({"since": "yesterday"}, "ISO 8601"),
                             ({"cursor": "x"}, "Invalid cursor"),
                             ({"limit": "0"}, "limit")):
            res = await api.client.get("/api/runs", params=params)
            assert res.status_code == 400 and res.json()["error"]["code"] == "invalid_parameter"
            assert word in res.json()["error"]["message"]


async def test_bulk_cancel_and_replay_of_a_filtered_list(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        vip = await api.new_thread(user_id="carol", tags=["vip"])
        other = await api.new_thread(user_id="dan")
        waiting = [await api.schedule(t, "ping", delay_seconds=3600) for t in (vip, vip, other)]
        failed = [await api.schedule(t, "boom", {"message": "no"}) for t in (vip, other)]
        await api.rt.wait_idle()

        # How many a confirmation would name: the counts of the same filter.
        listed = (await api.client.get("/api/runs", params={"tag": "vip"})).json()
        assert listed["counts"]["pending"] == 2 and listed["counts"]["failed"] == 1

        res = await api.client.post("/api/runs/cancel", json={"tag": "vip"})
        assert res.status_code == 200, res.text
        body = res.json()
        assert body["canceled"] == 2 and set(body["ids"]) == set(waiting[:2])
        assert body["more"] is False
        assert (await api.run(other, waiting[2]))["status"] == "pending"
        assert [(await api.run(vip, r))["status"] for r in waiting[:2]] == ["canceled"] * 2

        res = await api.client.post("/api/runs/replay", json={"user_id": "dan"})
        body = res.json()
        assert body["replayed"] == 1
        (new,) = body["ids"]
        replay = await api.run(other, new)
        assert replay["replayOf"] == failed[1] and replay["args"] == {"message": "no"}
        await api.rt.wait_idle()
        assert (await api.run(other, new))["status"] == "failed"
        # Nothing left to do: a second call changes nothing.
        again = (await api.client.post("/api/runs/cancel", json={"tag": "vip"})).json()
        assert again == {"canceled": 0, "ids": [], "more": False}

        res = await api.client.post("/api/runs/cancel", json={"tag": "vip", "status": "x"})
        assert res.status_code == 400 and res.json()["error"]["code"] == "invalid_body"
        res = await api.client.post("/api/runs/cancel", json={"since": "soon"})
        assert res.status_code == 400 and "ISO 8601" in res.json()["error"]["message"]
        res = await api.client.post("/api/runs/cancel")  # no body: not "everything"
        assert res.status_code == 400


async def test_a_due_pending_run_behind_a_running_one_says_so_across_threads(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with runtime(tmp_path / "data", clock) as rt:
        busy = await rt.create_thread()
        paused = await rt.create_thread()
        await rt.pause_thread(paused.thread_id)
        async with rt.subscribe_runs() as frames:
            held = await busy.schedule_effect("hold", {"key": "waiting"})
            async for event in frames:
                if event.run.id == held and event.run.status == "running":
                    break
            behind = await busy.schedule_effect("ping")
            async for event in frames:
                if event.run.id == behind:
                    scheduled = event
                    break
        later = await busy.schedule_effect("ping", delay=3600)
        alone = await paused.schedule_effect("ping")

        assert scheduled.change == "scheduled" and scheduled.run.waiting_for == held
        page = await rt.list_runs(status="pending")
        waiting = {r.id: r.waiting_for for r in page.runs}
        # Due behind the running run: named; not due yet, or in a thread running nothing: not.
        assert waiting == {behind: held, later: None, alone: None}
        assert waiting == {
            r.id: r.waiting_for for r in await busy.get_scheduled_effects()
        } | {alone: None}

        release(rt, "waiting")
        await rt.wait_idle()
        page = await rt.list_runs(status="pending")
        assert {r.id: r.waiting_for for r in page.runs} == {later: None, alone: None}


async def test_threads_by_last_activity_over_http_with_filters(tmp_path: Path) -> None:
    clock = FakeClock()
    async with serve_api(tmp_path / "data", clock=clock) as api:
        quiet = await api.new_thread(user_id="erin", tags=["vip"])
        clock.advance(1)
        ran = await api.new_thread(user_id="erin")
        clock.advance(1)
        talked = await api.new_thread(user_id="erin", tags=["vip"])
        clock.advance(1)
        newest = await api.new_thread(user_id="frank", agent_id=None)
        clock.advance(1)
        await api.schedule(ran, "ping")  # scheduled, started, completed: activity
        await api.rt.wait_idle()
        clock.advance(1)
        state = await api.rt.get_thread(talked)
        message = await state.inject_message("a notice")  # a message: activity too

        async def listed(**params: str) -> list[str]:
            res = await api.client.get("/api/threads", params=params)
            assert res.status_code == 200, res.text
            return [t["id"] for t in res.json()["threads"]]

        assert await listed() == [talked, ran, newest, quiet]
        assert await listed(sort="created") == [newest, talked, ran, quiet]
        assert await listed(user_id="erin") == [talked, ran, quiet]
        assert await listed(user_id="erin", tag="vip") == [talked, quiet]
        assert await listed(agent_id="nobody") == []
        first = (await api.client.get("/api/threads", params={"limit": "1"})).json()
        assert first["threads"][0]["lastActivityAt"] == message.to_json()["createdAt"]
        rest = (await api.client.get(
            "/api/threads", params={"limit": "10", "cursor": first["nextCursor"]}
        )).json()
        assert [t["id"] for t in rest["threads"]] == [ran, newest, quiet]
        res = await api.client.get("/api/threads", params={"sort": "recent"})
        assert res.status_code == 400 and "sort must be activity or created" in res.text

        # The same from the runtime, which the CLI and the pane reach through the API.
        page = await api.rt.list_threads(by_activity=True, tag="vip")
        assert [t.id for t in page.threads] == [talked, quiet]


async def test_thread_cursors_name_their_sort_and_filters_take_one_value(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with serve_api(tmp_path / "data", clock=clock) as api:
        made = []
        for _ in range(3):
            made.append(await api.new_thread(user_id="gina", tags=["vip"]))
            clock.advance(1)
        await api.schedule(made[0], "ping")  # the oldest thread is the most recently active
        await api.rt.wait_idle()

        async def get(path: str, params: object) -> dict[str, object]:
            res = await api.client.get(path, params=params)  # type: ignore[arg-type]
            return {"status": res.status_code, **res.json()}

        by_activity = await get("/api/threads", {"limit": "1"})
        by_created = await get("/api/threads", {"limit": "1", "sort": "created"})
        assert str(by_activity["nextCursor"]).startswith("activity:")
        assert str(by_created["nextCursor"]).startswith("created:")
        # A cursor continues the order it came from, and no other.
        for cursor, sort, other in ((by_activity["nextCursor"], "created", "activity"),
                                    (by_created["nextCursor"], "activity", "created")):
            wrong = await get("/api/threads", {"cursor": cursor, "sort": sort})
            assert wrong["status"] == 400
            error = wrong["error"]
            assert isinstance(error, dict) and error["code"] == "invalid_parameter"
            assert f"sorted by {other}, not by {sort}" in error["message"]
            assert "cursor" in error["message"]
        rest = await get("/api/threads", {"cursor": by_created["nextCursor"], "sort": "created"})
        assert [t["id"] for t in rest["threads"]] == [made[1], made[0]]  # type: ignore[attr-defined]
        # A runs cursor is no thread cursor.
        runs = await get("/api/runs", {"limit": "1"})
        bad = await get("/api/threads", {"cursor": runs["nextCursor"] or "1.0~x"})
        assert bad["status"] == 400

        # A repeated filter is refused, naming it; status alone takes several values.
        for path, key in (("/api/threads", "user_id"), ("/api/threads", "tag"),
                          ("/api/threads", "sort"), ("/api/runs", "user_id"),
                          ("/api/runs", "tag"), ("/api/runs", "name"),
                          ("/api/runs", "cursor"), (f"/api/threads/{made[0]}/effects", "name")):
            res = await api.client.get(path, params=[(key, "a"), (key, "b")])
            assert res.status_code == 400, (path, key)
            assert res.json()["error"]["code"] == "invalid_parameter"
            assert res.json()["error"]["message"].startswith(f"{key} is given 2 times")
        res = await api.client.get("/api/runs", params=[("status", "failed"),
                                                        ("status", "completed")])
        assert res.status_code == 200

        # A malformed thread id, and a time range that ends before it starts.
        res = await api.client.get("/api/runs", params={"thread_id": "bad!id"})
        assert res.status_code == 400 and res.json()["error"]["code"] == "invalid_thread_id"
        res = await api.client.post("/api/runs/cancel", json={"thread_id": "bad!id"})
        assert res.status_code == 400 and res.json()["error"]["code"] == "invalid_thread_id"
        times = {"since": "2026-12-02T00:00:00Z", "until": "2026-12-01T00:00:00Z"}
        for res in (await api.client.get("/api/runs", params=times),
                    await api.client.post("/api/runs/cancel", json=times)):
            assert res.status_code == 400
            assert res.json()["error"]["code"] == "invalid_parameter"
            assert "since must not be after until" in res.json()["error"]["message"]

        # GET /api/threads/{id} says when the thread last did something, as the list does.
        one = (await api.client.get(f"/api/threads/{made[0]}")).json()
        listed = (await api.client.get("/api/threads")).json()["threads"]
        assert one == next(t for t in listed if t["id"] == made[0])
        assert one["lastActivityAt"] > one["createdAt"]


async def test_an_empty_by_is_refused_by_both_cancels(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        tid = await api.new_thread()
        waiting = await api.schedule(tid, "ping", delay_seconds=3600)
        for path in ("/api/runs/cancel", f"/api/threads/{tid}/effects/{waiting}/cancel"):
            res = await api.client.post(path, json={"by": ""})
            assert res.status_code == 400, path
            assert res.json()["error"]["code"] == "invalid_argument"
            assert "by must be 1 to 256 characters" in res.json()["error"]["message"]
        assert (await api.run(tid, waiting))["status"] == "pending"  # nothing canceled
        res = await api.client.post(f"/api/threads/{tid}/effects/{waiting}/cancel",
                                    json={"by": "ops"})
        assert res.json() == {"canceled": True}
        assert (await api.run(tid, waiting))["canceledBy"] == "ops"


async def test_replay_all_failed_acts_on_failures_not_replayed_yet(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        tid = await api.new_thread(user_id="hal")
        failed = [await api.schedule(tid, "boom", {"message": "no"}) for _ in range(2)]
        await api.rt.wait_idle()

        async def unreplayed() -> int:
            res = await api.client.get("/api/runs", params={
                "user_id": "hal", "status": "failed", "replayed": "false", "limit": "1"})
            assert res.status_code == 200, res.text
            return int(res.json()["counts"]["failed"])

        assert await unreplayed() == 2
        first = (await api.client.post("/api/runs/replay", json={"user_id": "hal"})).json()
        assert first["replayed"] == 2
        await api.rt.wait_idle()  # the replays fail too
        replays = {(await api.run(tid, r))["replayOf"] for r in first["ids"]}
        assert replays == set(failed)
        # Four failed runs, of which the two replays are the ones not replayed yet.
        listed = (await api.client.get("/api/runs", params={"user_id": "hal"})).json()
        assert listed["counts"]["failed"] == 4 and await unreplayed() == 2
        again = (await api.client.post("/api/runs/replay", json={"user_id": "hal"})).json()
        assert again["replayed"] == 2  # the replays' replays, not the originals again
        assert {(await api.run(tid, r))["replayOf"] for r in again["ids"]} == set(first["ids"])
        replayed = (await api.client.get("/api/runs", params={
            "user_id": "hal", "replayed": "true"})).json()
        assert {r["id"] for r in replayed["runs"]} == {*failed, *first["ids"]}
        # One run's replay stays allowed on any failed run, replayed or not.
        res = await api.client.post(f"/api/threads/{tid}/effects/{failed[0]}/replay")
        assert res.status_code == 201
        res = await api.client.get("/api/runs", params={"replayed": "maybe"})
        assert res.status_code == 400 and "replayed must be true or false" in res.text


async def test_replay_all_failed_skips_runs_whose_effect_is_gone_and_says_so(
    tmp_path: Path,
) -> None:
    # An app whose effect "boom2" fails its runs, then is removed (a deploy dropped the
    # file): "replay all failed" replays the other failures and names the ones it skipped.
    app = tmp_path / "app"

    def make_app() -> None:
        shutil.copytree(APP, app)
        (app / "effects" / "boom2.py").write_text(
            (APP / "effects" / "boom.py").read_text()
            .replace("async def boom(", "async def boom2(").replace(", boom)", ", boom2)"))

    await anyio.to_thread.run_sync(make_app)
    data = tmp_path / "data"
    async with serve_api(data, clock=FakeClock(), app_dir=app) as api:
        tid = await api.new_thread(user_id="kim")
        failed = [await api.schedule(tid, "boom", {}) for _ in range(2)]
        gone = await api.schedule(tid, "boom2", {})
        await api.rt.wait_idle()
    await anyio.to_thread.run_sync((app / "effects" / "boom2.py").unlink)
    async with serve_api(data, clock=FakeClock(), app_dir=app) as api:
        res = await api.client.post("/api/runs/replay", json={"user_id": "kim"})
        assert res.status_code == 200, res.text
        body = res.json()
        assert body["replayed"] == 2 and body["more"] is False
        assert {(await api.run(tid, r))["replayOf"] for r in body["ids"]} == set(failed)
        assert body["skipped"] == 1
        [skip] = body["skippedRuns"]
        assert skip["id"] == gone and skip["threadId"] == tid
        assert skip["error"] == "effect_not_found" and "boom2" in skip["message"]
        # Nothing replays the skipped run: it is still a failure not replayed yet (beside
        # the replays, which failed in turn).
        await api.rt.wait_idle()
        res = await api.client.get("/api/runs", params={
            "user_id": "kim", "status": "failed", "replayed": "false"})
        assert {r["id"] for r in res.json()["runs"]} == {gone, *body["ids"]}
        # A cancel-all answer is unchanged.
        res = await api.client.post("/api/runs/cancel", json={"user_id": "kim"})
        assert res.json() == {"canceled": 0, "ids": [], "more": False}


async def test_an_empty_filter_is_refused_not_taken_as_no_filter(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        tid = await api.new_thread(user_id="ann", tags=["vip"])
        waiting = await api.schedule(tid, "ping", delay_seconds=3600)
        failed = await api.schedule(tid, "boom", {"message": "no"})
        await api.rt.wait_idle()
        for key, code in (("thread_id", "invalid_thread_id"), ("user_id", "invalid_argument"),
                          ("name", "invalid_argument"), ("tag", "invalid_argument"),
                          ("since", "invalid_argument")):
            for action in ("cancel", "replay"):
                res = await api.client.post(f"/api/runs/{action}", json={key: ""})
                assert res.status_code == 400, (key, action, res.text)
                assert res.json()["error"]["code"] == code, (key, action)
                if code != "invalid_thread_id":
                    assert key in res.json()["error"]["message"]
        for path, keys in (("/api/runs", ("thread_id", "user_id", "name", "tag", "status",
                                          "since", "cursor", "replayed")),
                           ("/api/threads", ("user_id", "agent_id", "tag", "sort"))):
            for key in keys:
                res = await api.client.get(path, params={key: ""})
                assert res.status_code == 400, (path, key)
                code = "invalid_thread_id" if key == "thread_id" else "invalid_parameter"
                assert res.json()["error"]["code"] == code, (path, key)
                if key != "thread_id":
                    assert res.json()["error"]["message"].startswith(f"{key} is given without")
        # Nothing was canceled nor replayed.
        assert (await api.run(tid, waiting))["status"] == "pending"
        listed = (await api.client.get("/api/runs")).json()
        assert listed["counts"]["failed"] == 1 and len(listed["runs"]) == 2
        assert failed in {r["id"] for r in listed["runs"]}
        # The runtime refuses them too.
        for call in (api.rt.cancel_runs(user_id=""), api.rt.replay_runs(thread_id=""),
                     api.rt.list_runs(tag=""), api.rt.list_threads(user_id="")):
            with pytest.raises(InvalidArgument, match="must not be empty"):
                await call


async def test_unknown_query_parameters_are_refused_naming_the_known_ones(
    tmp_path: Path,
) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        await api.new_thread(user_id="ann")
        for path, known in (("/api/runs", "cursor, limit, name, replayed, since, status, "
                                          "tag, thread_id, until, user_id"),
                            ("/api/threads", "agent_id, cursor, limit, sort, tag, user_id")):
            res = await api.client.get(path, params={"user": "ann"})
            assert res.status_code == 400, path
            assert res.json()["error"] == {
                "code": "invalid_parameter",
                "message": f'Unknown query parameter "user"; known: {known}',
            }
            assert (await api.client.get(path, params={"user_id": "ann"})).status_code == 200


@pytest.mark.parametrize("cursor", [
    "1e20~a", "-5~a", "99999999999999999999~a", "253402300800~a", "1.0~bad!id", "nan~a",
])
async def test_forged_cursors_are_refused(tmp_path: Path, cursor: str) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        for path, given in (("/api/runs", cursor), ("/api/threads", f"created:{cursor}"),
                            ("/api/threads", f"activity:{cursor}")):
            params = {"cursor": given}
            if given.startswith("created:"):
                params["sort"] = "created"
            res = await api.client.get(path, params=params)
            assert res.status_code == 400, (path, given)
            assert res.json()["error"]["code"] == "invalid_parameter"
            assert "Invalid cursor" in res.json()["error"]["message"]
        ok = await api.client.get("/api/runs", params={"cursor": "253402300799~a"})
        assert ok.status_code == 200


async def test_concurrent_replay_all_replays_each_failure_once(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        threads = [await api.new_thread(user_id="ivy") for _ in range(3)]
        failed = [await api.schedule(tid, "boom", {"message": "no"})
                  for tid in threads for _ in range(3)]
        await api.rt.wait_idle()

        async def replay_all() -> dict[str, object]:
            res = await api.client.post("/api/runs/replay", json={"user_id": "ivy"})
            assert res.status_code == 200, res.text
            return dict(res.json())

        answers = await asyncio.gather(*(replay_all() for _ in range(5)))
        assert sum(int(a["replayed"]) for a in answers) == len(failed)  # type: ignore[call-overload]
        await api.rt.wait_idle()
        listed = (await api.client.get("/api/runs", params={
            "user_id": "ivy", "replayed": "true"})).json()
        assert sorted(r["id"] for r in listed["runs"]) == sorted(failed)
        every = (await api.client.get("/api/runs", params={"user_id": "ivy",
                                                           "limit": "100"})).json()
        replay_of = [r["replayOf"] for r in every["runs"] if r["replayOf"]]
        assert sorted(replay_of) == sorted(failed)  # each failure replayed exactly once


async def test_a_new_threads_last_activity_is_its_creation(tmp_path: Path) -> None:
    # The demo app's agent writes a welcome message when a thread is created (its
    # after_thread_created hook), a few milliseconds later on the real clock: part of the
    # creation, so lastActivityAt is the creation time, in the thread and in the list.
    demo = Path(__file__).parent.parent / "agents"
    async with serve_api(tmp_path / "data", app_dir=demo) as api:
        tid = (await api.client.post("/api/threads", json={})).json()["id"]
        messages = (await api.client.get(f"/api/threads/{tid}/messages")).json()["messages"]
        assert len(messages) == 1 and messages[0]["injected"]  # the welcome
        one = (await api.client.get(f"/api/threads/{tid}")).json()
        assert one["lastActivityAt"] == one["createdAt"]
        listed = (await api.client.get("/api/threads")).json()["threads"]
        assert [t["lastActivityAt"] for t in listed if t["id"] == tid] == [one["createdAt"]]
        # What happens afterwards moves it forward.
        res = await api.client.post(f"/api/threads/{tid}/effects", json={
            "name": "send_reminder", "args": {"text": "x"}, "delay_seconds": 60})
        assert res.status_code == 201, res.text
        later = (await api.client.get(f"/api/threads/{tid}")).json()
        assert later["lastActivityAt"] > later["createdAt"]
