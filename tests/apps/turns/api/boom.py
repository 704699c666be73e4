from starlette.requests import Request

from runtime import ThreadState, define_thread_endpoint


async def boom(request: Request, state: ThreadState, params: dict[str, str]) -> None:
    raise RuntimeError("secret internals /etc/passwd")


endpoint = define_thread_endpoint(boom)
