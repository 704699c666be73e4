from starlette.requests import Request

from runtime import ThreadState, define_thread_endpoint


async def one(request: Request, state: ThreadState, params: dict[str, str]) -> dict[str, object]:
    return {"route": "one note", "params": params}


endpoint = define_thread_endpoint(one)
