"""Run the thread-effects server: the HTTP API, the effect_changed stream and the Effects pane.

    python server.py [--app-dir agents] [--data-dir data] [--host 127.0.0.1] [--port 8000]

Every option can also come from the environment (THREAD_EFFECTS_APP_DIR, _DATA_DIR, _HOST,
_PORT, _API_TOKEN, _SHUTDOWN_GRACE_SECONDS, _MODEL, _LOAD_PACKAGES=0 for --no-packages). The
server listens on loopback; another address needs an API token. SIGINT/SIGTERM stop it
gracefully: runs still going after the grace period are interrupted and re-queued.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from runtime.http import LOOPBACK_HOSTS, ApiError, create_app, read_json

ROOT = Path(__file__).resolve().parent
ENV = "THREAD_EFFECTS_"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ

    def port(text: str) -> int:
        value = int(text)
        if not 1 <= value <= 65535:
            raise argparse.ArgumentTypeError(f"port must be 1..65535, got {value}")
        return value

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--app-dir", type=Path, default=Path(env.get(f"{ENV}APP_DIR", "agents")),
                   help="the application folder (its effects/ holds the effects)")
    p.add_argument("--data-dir", type=Path, default=Path(env.get(f"{ENV}DATA_DIR", "data")),
                   help="where the SQLite files live")
    p.add_argument("--host", default=env.get(f"{ENV}HOST", "127.0.0.1"),
                   help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=env.get(f"{ENV}PORT", "8000"),
                   help="port to listen on (default 8000)")
    p.add_argument("--api-token", default=env.get(f"{ENV}API_TOKEN") or None,
                   help="require this token on every API call (prefer the environment "
                        "variable: command lines are visible to other users)")
    p.add_argument("--shutdown-grace-seconds", type=float,
                   default=env.get(f"{ENV}SHUTDOWN_GRACE_SECONDS", "10"),
                   help="on shutdown, runs still going after this are re-queued")
    p.add_argument("--model", default=env.get(f"{ENV}MODEL") or None,
                   help="pydantic-ai model for agents that name none, e.g. openai:gpt-4o-mini "
                        "(default: the offline demo model)")
    p.add_argument("--no-packages", dest="load_packages", action="store_false",
                   default=_env_flag(f"{ENV}LOAD_PACKAGES", default=True),
                   help="do not load effects of installed packages (entry point group "
                        "thread_effects.packages); THREAD_EFFECTS_LOAD_PACKAGES=0 does the same")
    p.add_argument("--log-level", default=env.get(f"{ENV}LOG_LEVEL", "info"))
    return p.parse_args(argv)


def _env_flag(name: str, *, default: bool) -> bool:
    """A yes/no environment variable: 1/true/yes/on or 0/false/no/off (any case)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SystemExit(f"server.py: {name}={raw!r} is not a yes/no value (use 1 or 0)")


def demo_webhook_route(data_dir: Path, max_body_bytes: int) -> Route:
    """``POST /demo/webhook``: the demo app's webhook target, appending to a JSONL inbox."""
    inbox = data_dir / "webhook-inbox.jsonl"

    def append(line: str) -> None:
        with open(inbox, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    async def webhook(request: Request) -> JSONResponse:
        payload: Any = await read_json(request, max_body_bytes)
        if not isinstance(payload, dict):
            raise ApiError(400, "invalid_body", "POST /demo/webhook: send a JSON object")
        await anyio.to_thread.run_sync(append, json.dumps(payload, separators=(",", ":")))
        return JSONResponse({"received": True, "inbox": str(inbox)})

    return Route("/demo/webhook", webhook, methods=["POST"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not is_loopback(args.host) and not args.api_token:
        print(
            f"server.py: refusing to listen on {args.host} without an API token: anyone who "
            f"can reach it could schedule effects. Set {ENV}API_TOKEN (or --api-token), or "
            f"listen on 127.0.0.1.",
            file=sys.stderr,
        )
        return 2
    if not args.app_dir.is_dir():
        print(f"server.py: app directory {args.app_dir} does not exist", file=sys.stderr)
        return 2
    args.data_dir.mkdir(parents=True, exist_ok=True)

    # The demo webhook effect posts here by default (see agents/effects/post_webhook.py).
    connect_host = "127.0.0.1" if not is_loopback(args.host) else args.host
    if ":" in connect_host:
        connect_host = f"[{connect_host.strip('[]')}]"
    os.environ.setdefault(f"{ENV}SELF_URL", f"http://{connect_host}:{args.port}")
    if args.api_token:  # given as --api-token: the webhook effect needs it for /demo/webhook
        os.environ[f"{ENV}API_TOKEN"] = args.api_token

    max_body_bytes = 2 * 1024 * 1024
    app = create_app(
        data_dir=args.data_dir,
        app_dir=args.app_dir,
        api_token=args.api_token,
        # Without a token, only loopback names are answered (no DNS rebinding); with one,
        # the token is what protects the API.
        trusted_hosts=(*LOOPBACK_HOSTS, args.host) if not args.api_token else None,
        web_dir=ROOT / "web",
        max_body_bytes=max_body_bytes,
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        model=args.model,
        load_packages=args.load_packages,
        # A server process is ours: keep its long-lived objects out of full collections.
        freeze_gc=True,
        extra_routes=[demo_webhook_route(args.data_dir, max_body_bytes)],
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        lifespan="on",
        log_level=args.log_level,
        # Open HTTP requests get this long on SIGINT/SIGTERM; then the runtime's own grace
        # period runs (the lifespan shutdown), after which running effects are re-queued.
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    server.run()
    # uvicorn reports a failed startup (bad effect file, data dir in use) by not starting.
    return 0 if server.started else 3


if __name__ == "__main__":
    sys.exit(main())
