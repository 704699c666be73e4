from starlette.requests import Request

from runtime import ThreadState, define_thread_endpoint


async def delete(request: Request, state: ThreadState, params: dict[str, str]) -> None:
    return None


endpoint = define_thread_endpoint(delete)
