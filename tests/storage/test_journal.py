"""The journal contract (`runtime.durable.Journal`), run against every journal.

A journal joins by adding a parameter to the `journal` fixture.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

from runtime import EffectKeyBusy, EffectRecordLost, EffectRecordStatus
from runtime.durable import (
    CROSS_RUN_THREAD,
    MODEL_RESPONSE,
    InMemoryJournal,
    Journal,
    SqliteJournal,
    _dump_response,
    model_key,
)
from runtime.testing import FakeClock

T0 = 1_700_000_000.0
OPTIONS = {"wait_timeout_seconds": 0.2, "poll_interval_seconds": 0.01, "lease_seconds": 30.0}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=T0)


@pytest.fixture(params=["memory", "sqlite"])
async def journal(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path, no_blocking: None
) -> AsyncIterator[Journal]:
    """Each journal, in thread ``t1``; no method may block the event loop."""
    backend: Journal
    if request.param == "memory":
        backend = InMemoryJournal(thread_id="t1", clock=clock.now, **OPTIONS)
    else:
        backend = SqliteJournal(tmp_path / "journal.sqlite", thread_id="t1", clock=clock.now,
                                **OPTIONS)
    yield backend
    await backend.close()


async def run_call(journal: Journal, key: str, owner: str, status: EffectRecordStatus,
                   output: object, *, window: str = "run") -> None:
    assert await journal.acquire(key, window=window, name="charge", run_id="r1",
                                 owner=owner) is None
    await journal.finish(key, window=window, owner=owner, status=status,
                         output_json=json.dumps(output))


async def test_a_new_call_is_claimed_and_its_output_is_replayed_once_succeeded(
    journal: Journal,
) -> None:
    assert await journal.acquire("k", window="run", name="charge", run_id="r1",
                                 owner="r1#a") is None
    running = await journal.get("k")
    assert running is not None and running.status is EffectRecordStatus.IN_PROGRESS
    await journal.finish("k", window="run", owner="r1#a", status=EffectRecordStatus.SUCCEEDED,
                         output_json='{"charged": 42}')
    again = await journal.acquire("k", window="run", name="charge", run_id="r1", owner="r1#b")
    assert again is not None and again.status is EffectRecordStatus.SUCCEEDED
    assert again.result == {"charged": 42} and again.thread_id == "t1"


async def test_a_failed_call_is_claimed_again_not_replayed(journal: Journal) -> None:
    await run_call(journal, "k", "r1#a", EffectRecordStatus.FAILED, {"error": "boom"})
    failed = await journal.get("k")
    assert failed is not None and failed.status is EffectRecordStatus.FAILED
    assert failed.result == {"error": "boom"}
    assert await journal.acquire("k", window="run", name="charge", run_id="r1",
                                 owner="r1#b") is None
    retried = await journal.get("k")
    assert retried is not None and retried.status is EffectRecordStatus.IN_PROGRESS
    assert retried.owner == "r1#b" and retried.result_json is None


async def test_a_denied_call_is_finished(journal: Journal) -> None:
    await run_call(journal, "k", "r1#a", EffectRecordStatus.DENIED, "not this card")
    denied = await journal.acquire("k", window="run", name="charge", run_id="r1", owner="r1#b")
    assert denied is not None and denied.status is EffectRecordStatus.DENIED
    assert denied.result == "not this card"


async def test_a_later_attempt_of_the_run_takes_over_an_unfinished_call(
    journal: Journal,
) -> None:
    assert await journal.acquire("k", window="run", name="charge", run_id="r1",
                                 owner="r1#dead") is None
    assert await journal.acquire("k", window="run", name="charge", run_id="r1",
                                 owner="r1#next") is None
    record = await journal.get("k")
    assert record is not None and record.owner == "r1#next"
    with pytest.raises(EffectRecordLost):
        await journal.finish("k", window="run", owner="r1#dead",
                             status=EffectRecordStatus.SUCCEEDED, output_json="1")


async def test_a_call_held_by_another_run_is_waited_for_then_busy(journal: Journal) -> None:
    assert await journal.acquire("k", window="thread", name="charge", run_id="r1",
                                 owner="r1#a") is None
    with pytest.raises(EffectKeyBusy, match="charge"):
        await journal.acquire("k", window="thread", name="charge", run_id="r2", owner="r2#a")
    record = await journal.get("k", window="thread")
    assert record is not None and record.owner == "r1#a"


async def test_model_responses_round_trip(journal: Journal) -> None:
    response = ModelResponse(parts=[ToolCallPart("charge", {"order": 42}, tool_call_id="c1"),
                                    TextPart("charging")], model_name="scripted")
    key = model_key("r1", 1)
    assert await journal.model_response("r1", 1) is None
    assert await journal.acquire(key, window="run", name=MODEL_RESPONSE, run_id="r1",
                                 owner="r1#a") is None
    assert await journal.model_response("r1", 1) is None  # in progress is not finished
    await journal.finish(key, window="run", owner="r1#a", status=EffectRecordStatus.SUCCEEDED,
                         output_json=_dump_response(response))
    replayed = await journal.model_response("r1", 1)
    assert replayed is not None
    assert replayed.parts == response.parts and replayed.model_name == "scripted"
    assert await journal.model_response("r1", 2) is None


async def test_cross_run_keys_live_outside_the_thread(journal: Journal) -> None:
    await run_call(journal, "x", "r1#a", EffectRecordStatus.SUCCEEDED, 1, window="cross-run")
    await run_call(journal, "t", "r1#a", EffectRecordStatus.SUCCEEDED, 2, window="thread")
    cross = await journal.get("x", window="cross-run")
    assert cross is not None and cross.thread_id == CROSS_RUN_THREAD
    assert await journal.get("x", window="thread") is None
    assert await journal.purge_thread("t1") == 1
    assert await journal.get("t", window="thread") is None
    assert await journal.get("x", window="cross-run") is not None


async def test_purge_by_age_keeps_new_records_and_running_calls(
    journal: Journal, clock: FakeClock
) -> None:
    await run_call(journal, "old-ok", "r1#a", EffectRecordStatus.SUCCEEDED, 1)
    await run_call(journal, "old-failed", "r1#a", EffectRecordStatus.FAILED, {"error": "x"})
    assert await journal.acquire("running", window="run", name="charge", run_id="r1",
                                 owner="r1#a") is None
    clock.advance(3600)
    await run_call(journal, "new", "r1#a", EffectRecordStatus.SUCCEEDED, 2)
    cutoff = datetime.fromtimestamp(T0 + 10, UTC)  # before the lease (30 s) expires
    assert await journal.purge(older_than=cutoff) == 2
    assert await journal.get("old-ok") is None and await journal.get("old-failed") is None
    assert await journal.get("running") is not None and await journal.get("new") is not None
    assert await journal.purge(older_than=cutoff + timedelta(days=1)) == 2


def test_the_reserved_thread_id_is_refused() -> None:
    with pytest.raises(ValueError, match="reserved"):
        InMemoryJournal(thread_id=CROSS_RUN_THREAD)


async def test_a_sqlite_journal_is_read_back_by_a_new_journal(tmp_path: Path) -> None:
    first = SqliteJournal(tmp_path / "j.sqlite")
    await run_call(first, "k", "r1#a", EffectRecordStatus.SUCCEEDED, {"ok": True})
    await first.close()
    second = SqliteJournal(tmp_path / "j.sqlite")
    record = await second.acquire("k", window="run", name="charge", run_id="r1", owner="r1#b")
    await second.close()
    assert record is not None and record.result == {"ok": True}
