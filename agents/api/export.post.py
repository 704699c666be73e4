"""Demo thread endpoint: ``POST /api/threads/{tid}/export`` — schedule the ``thread_digest``
effect, which writes the thread's run counts to ``data/digests/<thread>.txt``."""

from starlette.requests import Request
from starlette.responses import JSONResponse

from runtime import ThreadState, define_thread_endpoint


async def export(request: Request, state: ThreadState, params: dict[str, str]) -> JSONResponse:
    run_id = await state.schedule_effect("thread_digest")
    return JSONResponse({"scheduled": run_id}, status_code=202)


endpoint = define_thread_endpoint(export)
