"""Demo effect tool: post a note to the demo webhook inbox, at most once per turn and topic.

The note carries ``effect_marker(key)``; ``already_applied`` looks for that marker in the
inbox (``GET /demo/webhook?contains=...``), so a call whose first attempt posted the note but
died before it was recorded (a killed server) finds the note there and posts nothing. The
inbox is the server's own ``/demo/webhook`` (``data/webhook-inbox.jsonl``); run under
``server.py``, which sets ``THREAD_EFFECTS_SELF_URL``.
"""

import os
from typing import Any

import httpx
from pydantic import BaseModel, Field

from runtime import Execution, ThreadState, define_effect_tool, effect_marker, find_effect_markers


class Note(BaseModel):
    topic: str = Field(min_length=1, max_length=80, description="What the note is about.")
    text: str = Field(min_length=1, max_length=2000, description="The note.")


class InboxError(Exception):
    pass


def key_of(args: Note, execution: Execution) -> str:
    # One note per turn and topic: the turn's id is stable, unlike the note's wording.
    return f"{execution.run_id}:note:{args.topic.strip().lower()}"


def _inbox() -> tuple[str, dict[str, str]]:
    base = os.environ.get("THREAD_EFFECTS_SELF_URL")
    if not base:
        raise InboxError("No demo inbox: run under server.py, which serves /demo/webhook")
    token = os.environ.get("THREAD_EFFECTS_API_TOKEN")
    return f"{base}/demo/webhook", {"Authorization": f"Bearer {token}"} if token else {}


async def find_note(key: str, args: Note) -> dict[str, Any] | None:
    url, headers = _inbox()
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.get(url, params={"contains": effect_marker(key)},
                                    headers=headers)
    if response.is_error:
        raise InboxError(f"GET {url} answered {response.status_code}: {response.text[:300]}")
    for entry in response.json()["entries"]:
        if key in find_effect_markers(str(entry.get("note", ""))):
            return {"posted": True, "topic": entry.get("topic"), "found": True}
    return None


async def post_note(state: ThreadState, args: Note) -> dict[str, Any]:
    assert state.execution is not None  # a tool runs inside a turn
    key = key_of(args, state.execution)
    url, headers = _inbox()
    body = {"threadId": state.thread_id, "topic": args.topic,
            "note": f"{args.text} {effect_marker(key)}"}
    async with httpx.AsyncClient(timeout=10.0) as client:
        response = await client.post(url, json=body, headers=headers)
    if response.is_error:
        raise InboxError(f"POST {url} answered {response.status_code}: {response.text[:300]}")
    return {"posted": True, "topic": args.topic, "found": False}


tool = define_effect_tool(
    "Post a note on a topic to the team inbox (at most once per topic in this turn).",
    Note,
    post_note,
    effect_key=key_of,
    already_applied=find_note,
)
