from starlette.requests import Request

from runtime import ThreadState, define_thread_endpoint


async def special(
    request: Request, state: ThreadState, params: dict[str, str]
) -> dict[str, object]:
    return {"route": "notes special", "params": params}


endpoint = define_thread_endpoint(special)
