"""Demo thread endpoint: ``GET /api/threads/{tid}/status`` — the thread at a glance."""

from starlette.requests import Request

from runtime import ThreadState, define_thread_endpoint
from runtime.effects import iso


async def status(request: Request, state: ThreadState, params: dict[str, str]) -> dict[str, object]:
    pending = await state.get_scheduled_effects()
    page = await state.get_messages(limit=500)
    return {
        "threadId": state.thread_id,
        "agentId": state.agent_id,
        "messages": len(page.messages) if page.next_cursor is None else f"{len(page.messages)}+",
        "pendingEffects": [
            {"id": run.id, "name": run.name, "runAt": iso(run.run_at_ts)} for run in pending
        ],
    }


endpoint = define_thread_endpoint(status)
