"""POST .../export: schedules the ``note`` effect with the body's text."""

from starlette.requests import Request
from starlette.responses import JSONResponse

from runtime import ThreadState, define_thread_endpoint


async def export(request: Request, state: ThreadState, params: dict[str, str]) -> JSONResponse:
    body = await request.json()
    run_id = await state.schedule_effect("note", {"text": body["text"]}, delay=body["delay"])
    return JSONResponse({"scheduled": run_id}, status_code=202)


endpoint = define_thread_endpoint(export)
