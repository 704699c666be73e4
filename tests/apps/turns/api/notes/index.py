from starlette.requests import Request

from runtime import ThreadState, define_thread_endpoint


def notes(request: Request, state: ThreadState, params: dict[str, str]) -> dict[str, object]:
    return {"route": "notes index", "params": params}


endpoint = define_thread_endpoint(notes)
