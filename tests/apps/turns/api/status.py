"""GET .../status: the thread's id, agent and execution (None in an endpoint)."""

from starlette.requests import Request

from runtime import ThreadState, define_thread_endpoint


async def status(request: Request, state: ThreadState, params: dict[str, str]) -> dict[str, object]:
    return {
        "thread": state.thread_id,
        "agent": state.agent_id,
        "execution": repr(state.execution),
        "params": params,
    }


endpoint = define_thread_endpoint(status)
