"""Run the thread-effects server: the HTTP API, the effect_changed stream and the Effects pane.

One implementation behind ``python server.py`` and ``thread-effects serve``::

    thread-effects serve [--app-dir agents] [--data-dir data] [--host 127.0.0.1] [--port 8000]
                         [--database-url postgresql://user@host:5432/db]

Every option can also come from the environment (THREAD_EFFECTS_APP_DIR, _DATA_DIR,
_DATABASE_URL, _HOST, _PORT, _API_TOKEN, _SHUTDOWN_GRACE_SECONDS, _EFFECT_TOOL_LEASE_SECONDS,
_MODEL, _LOAD_PACKAGES=0 for --no-packages, _LOG_LEVEL, _LOG_FORMAT). The server listens on
loopback; another address needs an API token.
Logs go to standard error, as text or (``--log-format json``) one JSON object per line
(`runtime.logs`, docs/operations.md).
SIGINT/SIGTERM stop it gracefully: runs still going after the grace period are interrupted
and re-queued.

Exit status: 0 after a clean shutdown, 2 for refused options (an exposed address without a
token, a missing app directory, a bad option value), 3 when the server failed to start (a
bad effect file, a data directory in use).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import os
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import anyio
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from runtime.http import (
    DEFAULT_WEB_DIR,
    LOOPBACK_HOSTS,
    ApiError,
    Server,
    create_app,
    read_json,
    server_options,
)
from runtime.logs import LEVELS, LOG_FORMATS, log_config

ENV = "THREAD_EFFECTS_"
"""Prefix of the environment variables that set the options."""

MAX_SHUTDOWN_GRACE_SECONDS = 3600.0
"""Longest ``--shutdown-grace-seconds`` accepted (an hour)."""

DESCRIPTION = (
    "Run the thread-effects server: the HTTP API, the effect_changed stream and the "
    "Effects pane."
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an IP address, IPv6 maybe in brackets) is loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_args(argv: list[str] | None = None, *, prog: str | None = None) -> argparse.Namespace:
    """Parse the server's options, each defaulting to its ``THREAD_EFFECTS_*`` variable.

    Args:
        argv: The arguments (without the program name); None reads ``sys.argv``.
        prog: The program name in usage and error messages (``server.py``,
            ``thread-effects serve``).

    Returns:
        The options: ``app_dir``, ``data_dir`` (Paths), ``database_url`` (or None),
        ``host``, ``port`` (int),
        ``api_token``, ``shutdown_grace_seconds``, ``effect_tool_lease_seconds`` (floats),
        ``model``, ``load_packages``, ``log_level``, ``log_format``.

    Raises:
        SystemExit: 2 for a bad option (argparse prints the usage), or a message naming a
            variable whose value is not understood.
    """
    env = os.environ
    name = prog or "server.py"

    def port(text: str) -> int:
        if not text.strip().isascii() or not text.strip().isdigit():
            raise argparse.ArgumentTypeError(f"port must be 1..65535, got {text!r}")
        value = int(text)
        if not 1 <= value <= 65535:
            raise argparse.ArgumentTypeError(f"port must be 1..65535, got {value}")
        return value

    def node_id(text: str) -> str:
        from runtime.config import validate_node_id

        try:
            return validate_node_id(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    def seconds(
        what: str, low: float, high: float, *, above: bool = False,
    ) -> Callable[[str], float]:
        """A parser of a number of seconds from ``low`` (excluded if ``above``) to ``high``."""
        bounds = f"above {low:g}, at most {high:g}" if above else f"from {low:g} to {high:g}"

        def parse(text: str) -> float:
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not ((low < value) if above else (low <= value)) or not value <= high:
                # NaN and inf fail too
                raise argparse.ArgumentTypeError(
                    f"{what} must be a number of seconds {bounds}, got {text!r}")
            return value

        return parse

    lease = seconds("lease", 0.5, 86_400)
    tool_lease = seconds("effect tool lease", 0, 86_400, above=True)
    grace = seconds("shutdown grace", 0, MAX_SHUTDOWN_GRACE_SECONDS)

    def runs(text: str) -> int:
        if not text.strip().isascii() or not text.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"max concurrent runs must be a whole number, 0 or more, got {text!r}")
        return int(text)

    def token(text: str) -> str | None:
        if not text:
            return None
        if not all(33 <= ord(c) <= 126 for c in text):
            raise argparse.ArgumentTypeError(
                "the API token is malformed: a token is printable ASCII without spaces or "
                "line breaks (its value is not shown)"
            )
        return text

    def log_level(text: str) -> str:
        if text.lower() not in LEVELS:
            raise argparse.ArgumentTypeError(
                f"log level must be one of {', '.join(LEVELS)}, got {text!r}"
            )
        return text.lower()

    def log_format(text: str) -> str:
        if text.lower() not in LOG_FORMATS:
            raise argparse.ArgumentTypeError(
                f"log format must be one of {', '.join(LOG_FORMATS)}, got {text!r}"
            )
        return text.lower()

    def database_url(text: str) -> str:
        if not text.startswith(("postgresql://", "postgres://")):
            raise argparse.ArgumentTypeError(
                "database URL must begin with postgresql:// "
                "(postgresql://user@host:5432/dbname)"
            )
        from runtime.storage.postgres import PostgresBackend

        try:  # checks the schema parameter now: one line, no traceback
            PostgresBackend(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    p = _Parser(prog=prog, description=DESCRIPTION)
    p.add_argument("--app-dir", type=Path, default=Path(env.get(f"{ENV}APP_DIR", "agents")),
                   help="the application folder (its effects/ holds the effects)")
    p.add_argument("--data-dir", type=Path, default=Path(env.get(f"{ENV}DATA_DIR", "data")),
                   help="where the SQLite files live")
    p.add_argument("--database-url", type=database_url,
                   default=env.get(f"{ENV}DATABASE_URL") or None,
                   help="keep threads in this PostgreSQL database instead of SQLite files, "
                        "e.g. postgresql://user@host:5432/db (prefer the environment "
                        "variable when the URL holds a password)")
    p.add_argument("--host", default=env.get(f"{ENV}HOST", "127.0.0.1"),
                   help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=env.get(f"{ENV}PORT", "8000"),
                   help="port to listen on (default 8000)")
    p.add_argument("--api-token", type=token, default=env.get(f"{ENV}API_TOKEN") or None,
                   help="require this token on every API call (prefer the environment "
                        "variable: command lines are visible to other users)")
    p.add_argument("--shutdown-grace-seconds", type=grace,
                   default=env.get(f"{ENV}SHUTDOWN_GRACE_SECONDS", "10"),
                   help="on shutdown, runs still going after this are re-queued")
    p.add_argument("--node-id", type=node_id, default=env.get(f"{ENV}NODE_ID") or None,
                   help="this process's name among the processes sharing a database "
                        "(default <hostname>:<pid>); recorded on every run attempt")
    p.add_argument("--lease-seconds", type=lease,
                   default=env.get(f"{ENV}LEASE_SECONDS", "30"),
                   help="PostgreSQL: the node lease period; a node silent this long is "
                        "dead to the others, which re-queue its running runs (default 30)")
    p.add_argument("--max-concurrent-runs", type=runs,
                   default=env.get(f"{ENV}MAX_CONCURRENT_RUNS", "64"),
                   help="threads whose runs execute at once in this process (default 64); "
                        "0: this process runs no runs (other nodes of a shared database do)")
    p.add_argument("--effect-tool-lease-seconds", type=tool_lease,
                   default=env.get(f"{ENV}EFFECT_TOOL_LEASE_SECONDS", "300"),
                   help="an effect tool's claim on its effect key lasts this long; a claim "
                        "left by a killed process is taken over after it")
    p.add_argument("--model", default=env.get(f"{ENV}MODEL") or None,
                   help="pydantic-ai model for agents that name none, e.g. openai:gpt-4o-mini "
                        "(default: the offline demo model)")
    p.add_argument("--no-packages", dest="load_packages", action="store_false",
                   default=_env_flag(f"{ENV}LOAD_PACKAGES", default=True, prog=name),
                   help="do not load effects of installed packages (entry point group "
                        "thread_effects.packages); THREAD_EFFECTS_LOAD_PACKAGES=0 does the same")
    p.add_argument("--log-level", type=log_level, default=env.get(f"{ENV}LOG_LEVEL", "info"),
                   help=f"least severe level logged: one of {', '.join(LEVELS)} (default info)")
    p.add_argument("--log-format", type=log_format,
                   default=env.get(f"{ENV}LOG_FORMAT", "text"),
                   help="text for people, or json: one object per line with the run's "
                        "fields (default text)")
    p.argv = list(sys.argv[1:] if argv is None else argv)
    return p.parse_args(argv)


class _Parser(argparse.ArgumentParser):
    """Reports a bad option in one line (naming it and the accepted values), exit 2.

    A bad value that came from a ``THREAD_EFFECTS_*`` variable (its option not given on
    the command line) is reported under the variable's name, not as ``argument --option``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.argv: list[str] = []

    def error(self, message: str) -> NoReturn:
        found = re.match(r"argument (--[a-z-]+): (.*)", message, re.DOTALL)
        if found is not None:
            option, reason = found.groups()
            variable = ENV + option[2:].upper().replace("-", "_")
            given = any(a == option or a.startswith(option + "=") for a in self.argv)
            if not given and os.environ.get(variable):
                self.exit(2, f"{self.prog}: error: {variable}: {reason} "
                             f"(--help lists the options)\n")
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def _env_flag(name: str, *, default: bool, prog: str) -> bool:
    """A yes/no environment variable: 1/true/yes/on or 0/false/no/off (any case)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    print(f"{prog}: error: {name}={raw!r} is not a yes/no value (use 1 or 0)",
          file=sys.stderr)
    raise SystemExit(2)


def _warn_of_sqlite_threads(data_dir: Path) -> None:
    """Log a warning if ``data_dir`` holds SQLite thread files a PostgreSQL node won't serve.

    Threads are not moved between backends (docs/scale-out.md, "Switching"): a server
    switched to ``--database-url`` starts without them, and a thread made again under
    the same id is a new, separate thread.
    """
    try:
        count = sum(1 for _ in (data_dir / "threads").glob("*.sqlite"))
    except OSError:
        return
    if count:
        logging.getLogger("runtime").warning(
            "%s holds %d SQLite thread file(s); with --database-url they are not served "
            "and their pending runs do not run (threads are not moved between backends: "
            "docs/scale-out.md, \"Switching\")", data_dir / "threads", count,
        )


def demo_webhook_route(data_dir: Path, max_body_bytes: int) -> Route:
    """``/demo/webhook``: the demo app's webhook target, a JSONL inbox.

    ``POST`` appends the JSON object it gets and answers ``{"received": true, "inbox":
    "<path>"}``. ``GET ?contains=<text>`` answers ``{"entries": [...]}``: the received
    objects (oldest first) whose JSON holds ``text`` (all of them without it) — how the demo
    effect tool ``post_note`` looks for a note it posted (``already_applied``).

    Args:
        data_dir: The server's data directory; the inbox is ``webhook-inbox.jsonl`` in it.
        max_body_bytes: Largest body read, in bytes (413 over it).

    Returns:
        The route.
    """
    inbox = data_dir / "webhook-inbox.jsonl"

    def append(line: str) -> None:
        with open(inbox, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def search(needle: str | None) -> list[Any]:
        try:
            with open(inbox, encoding="utf-8") as f:
                found = f.read().splitlines()
        except FileNotFoundError:
            return []
        if needle is not None:
            escaped = json.dumps(needle)[1:-1]
            found = [line for line in found if escaped in line]
        return [json.loads(line) for line in found if line]

    async def webhook(request: Request) -> JSONResponse:
        if request.method == "GET":
            needle = request.query_params.get("contains")
            return JSONResponse({"entries": await anyio.to_thread.run_sync(search, needle)})
        payload: Any = await read_json(request, max_body_bytes)
        if not isinstance(payload, dict):
            raise ApiError(400, "invalid_body", "POST /demo/webhook: send a JSON object")
        await anyio.to_thread.run_sync(append, json.dumps(payload, separators=(",", ":")))
        return JSONResponse({"received": True, "inbox": str(inbox)})

    return Route("/demo/webhook", webhook, methods=["GET", "POST"])


def main(argv: list[str] | None = None, *, prog: str | None = None) -> int:
    """Parse the options, build the app and serve it with uvicorn until SIGINT/SIGTERM.

    Args:
        argv: The arguments (without the program name); None reads ``sys.argv``.
        prog: The program name in usage and error messages (default ``server.py``).

    Returns:
        The exit status: 0 after a clean shutdown, 2 for refused options, 3 when the
        server did not start.
    """
    name = prog or "server.py"
    args = parse_args(argv, prog=prog)
    if not is_loopback(args.host) and not args.api_token:
        print(
            f"{name}: refusing to listen on {args.host} without an API token: anyone who "
            f"can reach it could schedule effects. Set {ENV}API_TOKEN (or --api-token), or "
            f"listen on 127.0.0.1.",
            file=sys.stderr,
        )
        return 2
    if not args.app_dir.is_dir():
        print(f"{name}: app directory {args.app_dir} does not exist", file=sys.stderr)
        return 2
    try:  # before anything is created: a busy port leaves no data dir behind
        listener = bind_port(args.host, args.port)
    except OSError as exc:
        print(f"{name}: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    try:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        listener.close()
        print(f"{name}: cannot create data directory {args.data_dir}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2

    # The demo webhook effect posts here by default (see agents/effects/post_webhook.py).
    connect_host = "127.0.0.1" if not is_loopback(args.host) else args.host
    if ":" in connect_host:
        connect_host = f"[{connect_host.strip('[]')}]"
    os.environ.setdefault(f"{ENV}SELF_URL", f"http://{connect_host}:{args.port}")
    if args.api_token:  # given as --api-token: the webhook effect needs it for /demo/webhook
        os.environ[f"{ENV}API_TOKEN"] = args.api_token

    max_body_bytes = 2 * 1024 * 1024
    cluster_settings: dict[str, Any] = {}
    if os.environ.get(f"{ENV}CLUSTER_POLL_SECONDS"):  # tests of several nodes
        cluster_settings["cluster_poll_seconds"] = float(os.environ[f"{ENV}CLUSTER_POLL_SECONDS"])
    app = create_app(
        data_dir=args.data_dir,
        app_dir=args.app_dir,
        database_url=args.database_url,
        **cluster_settings,
        api_token=args.api_token,
        # Without a token, only loopback names are answered (no DNS rebinding); with one,
        # the token is what protects the API.
        trusted_hosts=(*LOOPBACK_HOSTS, args.host) if not args.api_token else None,
        web_dir=DEFAULT_WEB_DIR,
        max_body_bytes=max_body_bytes,
        shutdown_grace_seconds=args.shutdown_grace_seconds,
        effect_tool_lease_seconds=args.effect_tool_lease_seconds,
        lease_seconds=args.lease_seconds,
        max_concurrent_runs=args.max_concurrent_runs,
        **({"node_id": args.node_id} if args.node_id is not None else {}),
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
        log_config=log_config(args.log_format, args.log_level),
        # On SIGINT/SIGTERM `Server` gives running effects and open HTTP requests the
        # runtime's grace period, then interrupts what still runs (a request answers 503);
        # uvicorn's own wait after that only covers what was left unfinished.
        timeout_graceful_shutdown=5,
        **server_options(),
    )
    if args.database_url:
        _warn_of_sqlite_threads(args.data_dir)
    server = Server(config)
    with listener:
        server.run(sockets=[listener])
    # uvicorn reports a failed startup (bad effect file, data dir in use) by not starting;
    # the app logged why in one line (runtime.http.create_app).
    return 0 if server.started else 3


def bind_port(host: str, port: int) -> socket.socket:
    """The listening socket for ``host:port``, bound now (uvicorn serves on it).

    Raises:
        OSError: the port is in use, or the address is not this machine's.
    """
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
