from starlette.requests import Request
from starlette.responses import PlainTextResponse

from runtime import ThreadState, define_thread_endpoint


async def files(request: Request, state: ThreadState, params: dict[str, str]) -> PlainTextResponse:
    return PlainTextResponse(f"file {params['*']}")


endpoint = define_thread_endpoint(files)
