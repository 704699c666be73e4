"""docs/http-api.md against real answers: every documented shape, field and limit is what
the server sends and enforces, so the document cannot drift from the server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import DEMO_APP, Api, serve_api

from runtime import EffectChanged, MessageCreated
from runtime._http_errors import MAX_ERROR_MESSAGE_CHARS
from runtime._limits import MAX_ARGS_DEPTH, MAX_DELAY_SECONDS, MAX_JSON_DEPTH, MAX_QUOTED_CHARS
from runtime.events import EffectRecordChanged
from runtime.http import (
    BODY_IDLE_TIMEOUT_SECONDS,
    DEFAULT_MAX_BODY_BYTES,
    HEADER_TIMEOUT_SECONDS,
    KEEP_ALIVE_SECONDS,
    MAX_MESSAGE_BODY_BYTES,
    WS_CLOSE_TIMEOUT_SECONDS,
)
from runtime.testing import FakeClock

DOC = (Path(__file__).resolve().parent.parent / "docs" / "http-api.md").read_text()


def keys_after(marker: str) -> tuple[set[str], set[str]]:
    """The keys of the first ``{...}`` after ``marker``: (always there, marked ``?``)."""
    start = DOC.index(marker) + len(marker)
    opening = DOC.index("{", start)
    depth, end = 0, opening
    for end in range(opening, len(DOC)):
        depth += {"{": 1, "}": -1}.get(DOC[end], 0)
        if depth == 0:
            break
    block = DOC[opening + 1 : end]
    inner = re.sub(r"\{[^{}]*\}", "", block)  # nested objects are checked on their own
    found = re.findall(r'(?<!: )(?<!:)"(\w+)"(\?)?', inner)  # keys, not values
    return {k for k, opt in found if not opt}, {k for k, opt in found if opt}


def field_list(marker: str) -> set[str]:
    """The quoted names of a ``{"a", "b", ...}`` list right after ``marker``."""
    required, optional = keys_after(marker)
    return required | optional


async def test_thread_shapes_and_create_fields(api: Api) -> None:
    documented = field_list("body (optional): ")
    res = await api.client.post("/api/threads", json={"nope": 1})
    allowed = set(re.findall(r"\b\w+\b", res.json()["error"]["message"].split("allowed:")[1]))
    assert documented == allowed
    res = await api.client.post(
        "/api/threads", json={"id": "doc-thread", "user_id": "u", "tags": ["t"]}
    )
    assert res.status_code == 201, res.text
    created = res.json()
    assert set(created) == field_list("-> 201 ")
    listed = (await api.client.get("/api/threads")).json()
    assert set(listed) == field_list("&tag=&sort=activity|created\n")
    assert set(listed["threads"][0]) == field_list('{"threads": [')


async def test_run_shapes_lists_and_frames(api: Api) -> None:
    tid = await api.new_thread()
    state = await api.rt.get_thread(tid)
    events: list[EffectChanged | MessageCreated] = []
    async with state.subscribe() as sub:
        run_id = await api.schedule(tid, "note", {"text": "x"})
        await api.rt.wait_idle()
        while sub.pending:
            events.append(await sub.__anext__())

    required, optional = keys_after("only in the single-run answer, never in lists or frames):")
    one = await api.run(tid, run_id)
    assert set(one) == required | optional
    (attempt,) = one["attemptDetails"]
    assert set(attempt) == field_list("`attemptDetails` lists each attempt, first first: ")
    assert attempt["outcome"] == "completed" and attempt["attempt"] == 1
    page = (await api.client.get(f"/api/threads/{tid}/effects")).json()
    assert set(page["runs"][0]) == required
    assert set(page) == field_list("&name=&limit=50&cursor=\n     -> ")
    assert set(page["counts"]) == field_list('"counts": ')

    frame = next(e for e in events if isinstance(e, EffectChanged)).to_frame()
    assert set(frame) == field_list("A change of a run:\n```\n")
    assert set(frame["data"]) == field_list('"data": ')
    allowed_changes = re.search(r'"change": "([a-z|]+)"', DOC)
    assert allowed_changes is not None
    assert {e.data["change"] for e in events if isinstance(e, EffectChanged)} <= set(
        allowed_changes.group(1).split("|")
    )


async def test_message_shapes(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock(), app_dir=DEMO_APP) as api:
        tid = await api.new_thread()
        res = await api.client.post(f"/api/threads/{tid}/messages", json={"content": "hello"})
        assert res.status_code == 200, res.text
        answer = res.json()
        assert set(answer) == field_list('"run_id"?: "..."} -> ')
        required, optional = keys_after("A message: ")
        for message in answer["messages"]:
            assert required <= set(message) <= required | optional
        listed = (await api.client.get(f"/api/threads/{tid}/messages")).json()
        assert set(listed) == field_list("before=<message id>, latest=true\n     -> ")
        turns = (await api.client.get(f"/api/threads/{tid}/turns")).json()
        assert set(turns) == field_list("/turns          -> ")
        required, optional = keys_after("A turn: ")
        assert [set(t) for t in turns["turns"]] == [required]
        assert turns["turns"][0]["runId"] == answer["runId"]


def test_documented_limits_are_the_servers() -> None:
    checks = {
        f"at most {DEFAULT_MAX_BODY_BYTES >> 20} MiB on every route": True,
        f"`POST .../messages`: {MAX_MESSAGE_BODY_BYTES >> 20} MiB": True,
        f"deeper than {MAX_JSON_DEPTH} levels": True,
        f"args nest at most\n  {MAX_ARGS_DEPTH} levels": True,
        f"cut to {MAX_QUOTED_CHARS} characters": True,
        f"a whole message\nto {MAX_ERROR_MESSAGE_CHARS:,}": True,
        f"within {HEADER_TIMEOUT_SECONDS:g} s of opening": True,
        f"nothing for {BODY_IDLE_TIMEOUT_SECONDS:g} s": True,
        f"after {KEEP_ALIVE_SECONDS:g} s": True,
        f"reset {WS_CLOSE_TIMEOUT_SECONDS:g} s later": True,
        f"from 0 to {MAX_DELAY_SECONDS:.0f} (10 years)": True,
    }
    missing = [text for text in checks if text not in DOC]
    assert not missing, missing


async def test_effect_record_shapes_and_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_effect_tools_runtime import APP, NOTE, scripted, turn

    monkeypatch.setenv("NOTES_WORLD", str(tmp_path / "world.txt"))
    async with serve_api(tmp_path / "data", clock=FakeClock(), app_dir=APP) as api:
        tid = await api.new_thread(agent_id="notes")
        thread = await api.rt.get_thread(tid)
        async with thread.subscribe() as events:
            await turn(thread, scripted([NOTE]))
            events.close()  # what the turn published is still yielded
            frames = [e.to_frame() async for e in events if isinstance(e, EffectRecordChanged)]
        listed = (await api.client.get(f"/api/threads/{tid}/effect-records")).json()
        assert set(listed) == field_list(
            "?status=in_progress|applied|succeeded|failed|denied&limit=50&cursor=\n     -> ")
        required, optional = keys_after("A record: ")
        [record] = listed["records"]
        assert set(record) == required and optional == {"resultPreview", "resultChars"}
        assert record["resultTruncated"] is False
        one = (await api.client.get(
            f"/api/threads/{tid}/effect-records/{record['key']}")).json()
        assert one == record
        frame_keys = field_list(
            '"eventType": "effect_record_changed", "threadId": "...", "seq": 9,\n "data": '
        )
        for frame in frames:
            assert set(frame["data"]) == frame_keys == required | {"change"}
        assert [f["data"]["change"] for f in frames] == ["claimed", "applied"]
        assert '"eventType": "effect_record_changed"' in DOC


async def test_pause_and_resume_answer_the_thread_as_documented(api: Api) -> None:
    tid = await api.new_thread()
    shape = field_list("GET    /api/threads/{tid}      -> ")
    for route, paused in (("pause", True), ("resume", False)):
        assert f"POST   /api/threads/{{tid}}/{route}" in DOC
        assert f'-> the thread, "paused": {str(paused).lower()}' in DOC
        res = await api.client.post(f"/api/threads/{tid}/{route}")
        assert res.status_code == 200, res.text
        assert set(res.json()) == shape and res.json()["paused"] is paused
        res = await api.client.post(f"/api/threads/{tid}/{route}", json={})
        assert res.status_code == 200, res.text
        res = await api.client.post(f"/api/threads/nope/{route}")
        assert res.status_code == 404


async def test_schedule_shapes_routes_and_frames(api: Api) -> None:
    tid = await api.new_thread()
    state = await api.rt.get_thread(tid)
    base = f"/api/threads/{tid}/schedules"
    required, optional = keys_after("A schedule as JSON (`args` only in the answers\nabout one "
                                    "schedule: create and get):")
    async with state.subscribe() as sub:
        res = await api.client.post(base, json={"name": "note", "args": {"text": "x"},
                                                "every_seconds": 60, "key": "k"})
        assert res.status_code == 201, res.text
        made = res.json()
        assert set(made) == required | optional
        again = await api.client.post(base, json={"name": "note", "args": {"text": "x"},
                                                  "cron": "0 9 * * *", "key": "k"})
        assert again.status_code == 200 and again.json()["id"] == made["id"]
        listed = (await api.client.get(base)).json()
        assert set(listed) == field_list("GET  /api/threads/{tid}/schedules                 -> ")
        assert set(listed["schedules"][0]) == required
        for action in ("pause", "resume", "cancel"):
            res = await api.client.post(f"{base}/{made['id']}/{action}")
            assert res.status_code == 200 and set(res.json()) == required
        frames = []
        while sub.pending:
            frames.append((await sub.__anext__()).to_frame())
    documented = field_list('"eventType": "schedule_changed", "threadId": "...", "seq": 10,\n'
                            ' "data": ')
    changes = re.search(r'"change": "(created\|[a-z|]+)"', DOC)
    assert changes is not None
    assert [f["data"]["change"] for f in frames] == ["created", "paused", "resumed", "canceled"]
    for frame in frames:
        assert set(frame["data"]) == documented == (required - {"threadId"}) | {"change"}
        assert frame["data"]["change"] in changes.group(1).split("|")
