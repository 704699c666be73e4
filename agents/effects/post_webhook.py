"""Demo: POST a JSON payload to a webhook with httpx.

Without ``url`` it posts to the demo server's own ``/demo/webhook`` (which appends the payload
to ``data/webhook-inbox.jsonl``), so the demo works offline; ``THREAD_EFFECTS_WEBHOOK_URL``
changes that default. A connection error or an error status fails the run with a clear message.
"""

import os
from typing import Any

import httpx
from pydantic import BaseModel, Field

from runtime import ThreadState, define_effect


class Webhook(BaseModel):
    url: str | None = Field(
        default=None, description="Where to POST; default: the demo server's /demo/webhook."
    )
    payload: dict[str, Any] = Field(default_factory=dict, description="The JSON body.")


class WebhookError(Exception):
    pass


def _default_target() -> tuple[str, dict[str, str]]:
    configured = os.environ.get("THREAD_EFFECTS_WEBHOOK_URL")
    if configured:
        return configured, {}
    base = os.environ.get("THREAD_EFFECTS_SELF_URL")
    if not base:
        raise WebhookError(
            "No webhook URL: pass args.url, set THREAD_EFFECTS_WEBHOOK_URL, "
            "or run under server.py (which serves /demo/webhook)"
        )
    # Our own server: it wants the API token if one is set (never sent to other URLs).
    token = os.environ.get("THREAD_EFFECTS_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return f"{base}/demo/webhook", headers


async def post_webhook(state: ThreadState, args: Webhook) -> None:
    url, headers = (args.url, {}) if args.url else _default_target()
    body = {"threadId": state.thread_id, **args.payload}
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.post(url, json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise WebhookError(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
    if response.is_error:
        raise WebhookError(
            f"POST {url} answered {response.status_code}: {response.text[:300]}"
        )


effect = define_effect(
    "POSTs a JSON payload to a webhook (default: this server's /demo/webhook).",
    Webhook,
    post_webhook,
    timeout_seconds=30,
)
