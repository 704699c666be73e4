"""``thread-effects``: the command-line tool, a client of a running server's HTTP API.

It talks to the server at ``--url`` (or ``THREAD_EFFECTS_URL``; default
``http://127.0.0.1:8000``) and sends the token of ``THREAD_EFFECTS_API_TOKEN``, the
variable the server reads, so the same command works on the server's machine and against a
remote node. ``serve`` is the exception: it runs a server (`runtime.serve`, the same code as
``python server.py``).

Commands (``docs/cli.md``)::

    thread-effects threads list|show|delete
    thread-effects runs list [--thread TID] [--status S]... [--name N] [--user U] [--tag T]
    thread-effects runs show|cancel|run-now|replay RUN_ID --thread TID
    thread-effects effects list
    thread-effects serve [server options]

Every command prints a table for people, or with ``--json`` the API's JSON answer for
scripts. Exit statuses:

- 0: done;
- 1: the server refused (it answered an error: unknown thread or run, wrong state, bad or
  missing token, ...; its message is printed), or nothing was done (``runs cancel`` of a
  run that is no longer pending, a declined ``threads delete``);
- 2: usage (an unknown option, a bad value);
- 3: no thread-effects server answered at the URL (connection refused, DNS, timeout, or an
  answer that is not the API's).

This module belongs to the HTTP layer: ``import runtime`` does not import it, and it imports
no part of the runtime but `runtime.serve` (only when ``serve`` runs).
"""

from __future__ import annotations

import io
import json
import math
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, Literal, NoReturn
from urllib.parse import quote, urlsplit

import click
import httpx
from rich.console import Console
from rich.table import Table
from rich.text import Text

DEFAULT_URL = "http://127.0.0.1:8000"
"""The server ``thread-effects`` talks to without ``--url`` or ``THREAD_EFFECTS_URL``."""

URL_ENV = "THREAD_EFFECTS_URL"
"""Environment variable naming the server's URL."""

TOKEN_ENV = "THREAD_EFFECTS_API_TOKEN"
"""Environment variable holding the API token (the one the server reads, too)."""

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_CANNOT_CONNECT = 3

RUN_STATUSES = ("pending", "running", "completed", "failed", "canceled")

_THREAD_KEYS = ("id", "createdAt", "agentId", "userId", "tags", "lastActivityAt")
_RUN_KEYS = ("id", "threadId", "name", "status", "runAt", "createdAt", "startedAt",
             "finishedAt", "attempts", "error", "replayOf")

_SCHEDULE_KEYS = ("id", "threadId", "name", "cron", "timezone", "everySeconds", "state",
                  "nextFireAt", "createdAt", "key", "occurrences", "skipped", "lastRunId",
                  "lastFireAt")

_PROG = "thread-effects"
_WIDE = 1000  # columns of a table written to a pipe or file: rows stay on one line
_PAGE = 50  # items per page unless --limit says otherwise (the API's default)
_MAX_PAGE = 500  # the API's largest page


# ----------------------------------------------------------------------------- errors


class CliError(click.ClickException):
    """A failure reported as one message (or one JSON object with ``--json``) on stderr.

    The exit status is the subclass's: `Refused` (1) or `CannotConnect` (3).

    Args:
        message: What went wrong, naming the thing.
        code: A snake_case code: the API's error code, or ``cannot_connect``,
            ``timeout``, ``not_the_api``, ``not_canceled``, ``aborted``.
        status: The HTTP status the server answered, if it answered.
        as_json: Print ``{"error": {"code", "message", "status"}}`` instead of text.
    """

    def __init__(
        self, message: str, *, code: str, status: int | None = None, as_json: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.as_json = as_json

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the error to ``file`` (stderr by default)."""
        if self.as_json:
            body = {"error": {"code": self.code, "message": self.message, "status": self.status}}
            click.echo(json.dumps(body, ensure_ascii=False), file=file, err=True)
        else:
            click.echo(f"{_PROG}: {self.message}", file=file, err=True)


class Refused(CliError):
    """The server answered an error, or nothing was done (exit status 1)."""

    exit_code = EXIT_REFUSED


class CannotConnect(CliError):
    """No thread-effects server answered at the URL (exit status 3)."""

    exit_code = EXIT_CANNOT_CONNECT


class BadSetting(CliError):
    """A setting from the environment is malformed (exit status 2, as for a bad option)."""

    exit_code = EXIT_USAGE


class BadArgument(CliError):
    """An argument cannot be used as given (exit status 2, as for a bad option)."""

    exit_code = EXIT_USAGE


def _check_arguments(args: list[str]) -> None:
    """Refuse an argument that is not UTF-8 text, naming its option (one line, exit 2).

    Python keeps undecodable bytes of the command line as lone surrogates, which no
    request can carry: without this check they would end in a traceback.
    """
    for i, arg in enumerate(args):
        if not any("\udc80" <= c <= "\udcff" for c in arg):
            continue
        shown = repr(arg.encode("utf-8", "surrogateescape"))[1:]
        option, sep, _ = arg.partition("=")
        if arg.startswith("--") and sep:
            what = option
        elif i > 0 and args[i - 1].startswith("-") and not arg.startswith("-"):
            what = args[i - 1]
        else:
            what = f"argument {shown}"
        raise BadArgument(
            f"{what}: {shown} is not UTF-8 text; arguments must be UTF-8",
            code="invalid_argument",
        )


class _Cli(click.Group):
    """The command group, checking the raw arguments once before any parsing."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        _check_arguments(args)
        return super().make_context(info_name, args, parent, **extra)


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse an empty filter: the API would answer 400 rather than list everything."""
    if value == "":
        raise click.BadParameter(
            "must not be empty (leave the option out to not filter by it)", ctx, param
        )
    return value


# ----------------------------------------------------------------------------- client


@dataclass
class Api:
    """One invocation's connection to the server.

    Args:
        url: The server's base URL (``http://host:port``, maybe with a path prefix).
        token: The API token, or None.
        timeout_seconds: How long to wait to connect and for each answer.
        as_json: Errors are printed as JSON (the command's ``--json``).
    """

    url: str
    token: str | None
    timeout_seconds: float
    as_json: bool = False
    _client: httpx.Client | None = field(default=None, repr=False)

    def close(self) -> None:
        """Close the HTTP connection, if one was opened."""
        if self._client is not None:
            self._client.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        expect: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Send one request and return the JSON object the server answered.

        Args:
            method: ``GET``, ``POST`` or ``DELETE``.
            path: The API path (``/api/...``), with its segments quoted.
            params: Query parameters (a list value repeats the parameter; None is left out).
            expect: Keys a successful answer must hold (else it is not the API's answer).

        Returns:
            The answer's JSON object.

        Raises:
            Refused: the server answered an error (exit 1, with the API's message).
            CannotConnect: no thread-effects server answered (exit 3).
        """
        if self._client is None:
            headers = {"Accept": "application/json", "User-Agent": _PROG}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._client = httpx.Client(
                base_url=self.url.rstrip("/"), headers=headers, timeout=self.timeout_seconds
            )
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            res = self._client.request(method, path, params=query)
        except httpx.TimeoutException:
            self._fail(
                CannotConnect, "timeout",
                f"no answer from {self.url} within {self.timeout_seconds:g} s "
                f"({method} {path}; --timeout waits longer)",
            )
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            self._fail(
                CannotConnect, "cannot_connect",
                f"cannot connect to {self.url}: {reason}. Is the server running "
                f"(thread-effects serve)? Set --url or {URL_ENV} to reach another one.",
            )
        try:
            body = res.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            kind = res.headers.get("content-type", "no content type")
            self._fail(
                CannotConnect, "not_the_api",
                f"{self.url} is not a thread-effects API: {method} {path} answered "
                f"HTTP {res.status_code} ({kind})",
                res.status_code,
            )
        if res.is_success:
            missing = [key for key in expect if key not in body]
            if missing:
                self._fail(
                    CannotConnect, "not_the_api",
                    f"{self.url} is not a thread-effects API: {method} {path} answered "
                    f"without {', '.join(missing)}",
                    res.status_code,
                )
            return body
        error = body.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            self._fail(
                CannotConnect, "not_the_api",
                f"{self.url} is not a thread-effects API: {method} {path} answered "
                f"HTTP {res.status_code} without an error message",
                res.status_code,
            )
        message = error["message"]
        code = str(error.get("code") or "error")
        if res.status_code == 401:
            message += f" (set {TOKEN_ENV})"
        self._fail(Refused, code, f"{message} [HTTP {res.status_code} {code}]",
                   res.status_code, api_message=error["message"])

    def pages(self, path: str, key: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Every page of a paged list, following ``nextCursor`` from ``params["cursor"]``."""
        seen: set[str] = set()
        while True:
            page = self.call("GET", path, params=params, expect=(key, "nextCursor"))
            yield page
            cursor = page.get("nextCursor")
            if not cursor or cursor in seen or not page.get(key):
                return
            seen.add(cursor)
            params = {**params, "cursor": cursor}

    def _fail(
        self,
        kind: type[CliError],
        code: str,
        message: str,
        status: int | None = None,
        *,
        api_message: str | None = None,
    ) -> NoReturn:
        # With --json the API's own message goes out unchanged; people get the status too.
        shown = api_message if self.as_json and api_message is not None else message
        raise kind(shown, code=code, status=status, as_json=self.as_json)


def _api(ctx: click.Context, as_json: bool) -> Api:
    api = ctx.find_object(Api)
    assert api is not None, "the thread-effects group sets it up"
    api.as_json = as_json
    return api


def _seg(value: str) -> str:
    """A path segment, quoted so an odd id reaches the server (which names it) intact."""
    return quote(value, safe="")


def _one_segment(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse an id that cannot be one segment of a path; the server judges the others.

    ``""``, ``"."``, ``".."`` and ids with ``/`` would reach another route (a slash is
    decoded before routing), whose answer would not name the id.
    """
    if value is not None and (value in ("", ".", "..") or "/" in value):
        what = {"thread_id": "a thread id", "schedule_id": "a schedule id"}.get(
            str(param.name), "a run id"
        )
        raise click.BadParameter(
            f"{value!r} cannot be {what}: it must be non-empty, without '/', and not "
            f"'.' or '..'", ctx, param,
        )
    return value


# ----------------------------------------------------------------------------- output


def _console() -> Console:
    """Where a command prints for people: the terminal, or plain lines for a pipe or file.

    Off a terminal, lines may be 1,000 columns wide (``COLUMNS`` changes it) so that a row
    stays whole on one line, without colours or trailing blanks; they are written when the
    command ends.
    """
    if sys.stdout.isatty():
        return Console(highlight=False)
    columns = os.environ.get("COLUMNS", "")
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=int(columns) if columns.isdigit() else _WIDE, highlight=False
    )

    def flush() -> None:
        if text := buffer.getvalue():
            click.echo("\n".join(line.rstrip() for line in text.splitlines()))

    click.get_current_context().call_on_close(flush)
    return console


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _when(value: str | None) -> Text:
    """``2026-11-30T05:40:00.123456Z`` → ``2026-11-30 05:40:00`` (the columns say UTC)."""
    if not value:
        return Text("-", style="dim")
    return Text(value.replace("T", " ").split(".")[0].removesuffix("Z"))


def _duration(start: str | None, end: str | None) -> Text:
    if not start or not end:
        return Text("-", style="dim")
    seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    if seconds < 1:
        return Text(f"{seconds * 1000:.0f} ms")
    if seconds < 60:
        return Text(f"{seconds:.1f} s")
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return Text(f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s")


_STATUS_STYLE = {
    "pending": "yellow",
    "running": "cyan",
    "completed": "green",
    "failed": "red",
    "canceled": "dim",
}


def _status(value: str) -> Text:
    return Text(value, style=_STATUS_STYLE.get(value, ""))


def _text(value: Any) -> Text:
    """A cell: never read as Rich markup (ids, tags and errors are the user's text)."""
    if value is None or value == "" or value == []:
        return Text("-", style="dim")
    if isinstance(value, list):
        return Text(", ".join(str(v) for v in value))
    return Text(str(value))


def _first_line(value: str | None, limit: int = 80) -> Text:
    if not value:
        return Text("-", style="dim")
    line = value.splitlines()[0] if value.strip() else value
    if len(line) > limit or line != value:
        line = line[: limit - 1].rstrip() + "…"
    return Text(line, style="red")


def _details(rows: list[tuple[str, Any]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(label, value if isinstance(value, Text) else _text(value))
    return grid


def _counts_line(counts: dict[str, int]) -> Text:
    line = Text()
    for i, status in enumerate(RUN_STATUSES):
        if i:
            line.append("  ")
        line.append(f"{status} {counts.get(status, 0)}", style=_STATUS_STYLE[status])
    return line


@dataclass(frozen=True)
class _Column:
    """A table column; ``drop`` orders the columns a narrow terminal leaves out (1 first)."""

    header: str
    drop: int | None = None
    shrinks: bool = False  # cut with an ellipsis rather than leave the column out
    justify: Literal["left", "right"] = "left"


def _table(console: Console, columns: list[_Column], rows: list[list[Text]]) -> Table:
    """A borderless table of ``rows`` that fits the console, one line per row.

    Cells never wrap. When the rows are wider than the console, the droppable columns go
    (lowest ``drop`` first) until the others fit with the shrinking ones at 12 characters;
    the shrinking columns share what room is left, cut with an ellipsis. Ids never shrink:
    people copy them.
    """
    natural = [
        max([len(col.header), *(row[i].cell_len for row in rows)])
        for i, col in enumerate(columns)
    ]
    keep = list(range(len(columns)))

    def needed() -> int:
        return sum(
            min(natural[i], 12) if columns[i].shrinks else natural[i] for i in keep
        ) + 2 * (len(keep) - 1)

    for i in sorted((i for i, c in enumerate(columns) if c.drop is not None),
                    key=lambda i: columns[i].drop or 0):
        if needed() <= console.width:
            break
        keep.remove(i)
    widths = {i: natural[i] for i in keep}
    shrinking = sorted((i for i in keep if columns[i].shrinks), key=lambda i: natural[i])
    room = console.width - 2 * (len(keep) - 1) - sum(
        natural[i] for i in keep if not columns[i].shrinks
    )
    for n, i in enumerate(shrinking):  # the narrow ones first: what they leave goes on
        widths[i] = max(min(natural[i], room // (len(shrinking) - n)), 1)
        room -= widths[i]
    table = Table(box=None, header_style="bold", pad_edge=False)
    for i in keep:
        col = columns[i]
        table.add_column(col.header, justify=col.justify, no_wrap=True,
                         overflow="ellipsis", width=widths[i])
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


_RUN_COLUMNS = [
    _Column("Run"),
    _Column("Effect", shrinks=True),
    _Column("Status"),
    _Column("Due (UTC)", drop=4),
    _Column("Started (UTC)", drop=1),
    _Column("Duration", drop=2, justify="right"),
    _Column("Attempts", drop=3, justify="right"),
    _Column("Error", shrinks=True),
]


_ATTEMPT_COLUMNS = [
    _Column("Attempt", justify="right"),
    _Column("Started (UTC)", drop=2),
    _Column("Ended (UTC)", drop=1),
    _Column("Duration", drop=3, justify="right"),
    _Column("Outcome"),
    _Column("Node", drop=4),
    _Column("Error", shrinks=True),
]


_THREAD_COLUMNS = [
    _Column("Thread"),
    _Column("Last activity (UTC)", drop=2),
    _Column("Created (UTC)", drop=1),
    _Column("Agent", shrinks=True),
    _Column("User", shrinks=True),
    _Column("Tags", shrinks=True),
]


def _runs_table(
    console: Console, runs: list[dict[str, Any]], *, threads: bool = False
) -> Table:
    if threads:  # runs across threads: which thread each belongs to
        columns = [*_RUN_COLUMNS[:1], _Column("Thread", drop=5), *_RUN_COLUMNS[1:]]
        return _table(console, columns, [
            [_text(run["id"]), _text(run["threadId"]), *row[1:]]
            for run, row in zip(runs, _run_rows(runs), strict=True)
        ])
    return _table(console, _RUN_COLUMNS, _run_rows(runs))


def _run_rows(runs: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            _text(run["id"]),
            _text(run["name"]),
            _status(run["status"]),
            _when(run["runAt"]),
            _when(run["startedAt"]),
            _duration(run["startedAt"], run["finishedAt"]),
            _text(run["attempts"]),
            _first_line(run["error"]),
        ]
        for run in runs
    ]


def _more(
    console: Console, cursor: str | None, what: str, command: str,
    options: list[tuple[str, Any]],
) -> None:
    """Say how to get the next page: the same command, every option given, and --cursor.

    A cursor continues one listing (its filters, its sort): the hint repeats them, so the
    line can be run as it is.
    """
    if not cursor:
        return
    words = [_PROG, *command.split()]
    for flag, value in options:
        for one in value if isinstance(value, (list, tuple)) else [value]:
            if one is True:  # a flag
                words.append(flag)
            elif one is not None and one is not False:
                words += [flag, shlex.quote(str(one))]
    words += ["--cursor", shlex.quote(cursor)]
    console.print(Text(f"more {what}: {' '.join(words)} (or --all)", style="dim",
                       no_wrap=True, overflow="ignore"))


# ----------------------------------------------------------------------------- commands

_json_option = click.option(
    "--json", "as_json", is_flag=True,
    help="Print the API's JSON answer (for scripts) instead of a table.",
)
_thread_option = click.option(
    "--thread", "-t", "thread_id", required=True, metavar="TID", callback=_one_segment,
    help="The thread the runs belong to.",
)


def _page_size(limit: int | None, every: bool) -> int:
    # --all pages through everything: the largest page the server allows saves round trips.
    return limit if limit is not None else (_MAX_PAGE if every else _PAGE)


def _check_url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        parts = urlsplit(value)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        httpx.URL(value)  # what the client will parse (it refuses "host:1:2")
    except (ValueError, httpx.InvalidURL):
        valid = False
    if not valid:
        raise click.BadParameter(
            f"{value if len(value) <= 80 else value[:79] + '…'!r} is not an http(s) URL "
            f"such as {DEFAULT_URL}",
            ctx, param,
        )
    return value


_MAX_TIMEOUT_SECONDS = 86_400.0


def _check_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    # FloatRange lets NaN and infinity through (they compare False), and so "1e400".
    if not math.isfinite(value) or value > _MAX_TIMEOUT_SECONDS:
        raise click.BadParameter(
            f"{value!r} is not a number of seconds from 0 to {_MAX_TIMEOUT_SECONDS:.0f}",
            ctx, param,
        )
    return value


def _api_token() -> str | None:
    """The token of ``THREAD_EFFECTS_API_TOKEN``; never printed, even when malformed."""
    token = os.environ.get(TOKEN_ENV) or None
    if token is not None and not all(33 <= ord(c) <= 126 for c in token):
        raise BadSetting(
            f"{TOKEN_ENV} is malformed: a token is printable ASCII without spaces or line "
            f"breaks (its value is not shown)", code="malformed_token",
        )
    return token


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url", envvar=URL_ENV, default=DEFAULT_URL, show_default=True, callback=_check_url,
    help=f"The server's URL (or {URL_ENV}). The token comes from {TOKEN_ENV}.",
)
@click.option(
    "--timeout", "timeout_seconds", type=click.FloatRange(min=0, min_open=True),
    callback=_check_timeout, default=30.0, show_default=True,
    help="Seconds to wait to connect and for each answer.",
)
@click.version_option(package_name="thread-effects", prog_name=_PROG)
@click.pass_context
def cli(ctx: click.Context, url: str, timeout_seconds: float) -> None:
    """Inspect and manage a thread-effects server: threads, runs, schedules and effects.

    Exit status: 0 done; 1 the server refused (its message is printed) or nothing was
    done; 2 usage; 3 no thread-effects server answered at the URL.
    """
    # serve checks the token itself, as the server it runs
    token = None if ctx.invoked_subcommand == "serve" else _api_token()
    api = Api(url=url, token=token, timeout_seconds=timeout_seconds)
    ctx.obj = api
    ctx.call_on_close(api.close)


@cli.group()
def threads() -> None:
    """List, show and delete threads."""


@threads.command("list", short_help="List threads, most recently active first.")
@click.option("--user", "user_id", default=None, callback=_not_empty,
              help="Only threads of this user.")
@click.option("--agent", "agent_id", default=None, callback=_not_empty,
              help="Only threads served by this agent.")
@click.option("--tag", default=None, callback=_not_empty, help="Only threads with this tag.")
@click.option("--sort", type=click.Choice(["activity", "created"]), default="activity",
              show_default=True,
              help="Most recently active first, or most recently created first.")
@click.option("--limit", type=click.IntRange(min=1, max=_MAX_PAGE), default=None,
              help="Threads per page, at most 500 [default: 50; 500 with --all].")
@click.option("--cursor", default=None, callback=_not_empty,
              help="Continue from a page's nextCursor.")
@click.option("--all", "every", is_flag=True, help="Follow the cursors: every thread.")
@_json_option
@click.pass_context
def threads_list(
    ctx: click.Context, user_id: str | None, agent_id: str | None, tag: str | None,
    sort: str, limit: int | None, cursor: str | None, every: bool, as_json: bool,
) -> None:
    """List threads (GET /api/threads): filters, and the order by last activity or creation."""
    api = _api(ctx, as_json)
    params = {"limit": _page_size(limit, every), "cursor": cursor, "user_id": user_id,
              "agent_id": agent_id, "tag": tag, "sort": sort}
    if every:
        found = [t for page in api.pages("/api/threads", "threads", params)
                 for t in page["threads"]]
        answer: dict[str, Any] = {"threads": found, "nextCursor": None}
    else:
        answer = api.call("GET", "/api/threads", params=params, expect=("threads",))
    if as_json:
        _print_json(answer)
        return
    console = _console()
    items: list[dict[str, Any]] = answer["threads"]
    if not items:
        console.print("No threads.")
        return
    console.print(_table(console, _THREAD_COLUMNS, [
        [_text(t["id"]), _when(t["lastActivityAt"]), _when(t["createdAt"]),
         _text(t["agentId"]), _text(t["userId"]), _text(t["tags"])]
        for t in items
    ]))
    _more(console, answer.get("nextCursor"), "threads", "threads list", [
        ("--sort", sort), ("--user", user_id), ("--agent", agent_id), ("--tag", tag),
        ("--limit", limit),
    ])


@threads.command("show", short_help="Show a thread, its run counts and newest runs.")
@click.argument("thread_id", metavar="TID", callback=_one_segment)
@click.option("--runs", "recent", type=click.IntRange(min=0, max=500), default=10,
              show_default=True, help="How many of its newest runs to show.")
@_json_option
@click.pass_context
def threads_show(ctx: click.Context, thread_id: str, recent: int, as_json: bool) -> None:
    """Show a thread, its run counts by status and its newest runs.

    JSON: {"thread": {...}, "counts": {status: n}, "runs": [...newest first...]}.
    """
    api = _api(ctx, as_json)
    thread = api.call("GET", f"/api/threads/{_seg(thread_id)}", expect=_THREAD_KEYS)
    page = api.call("GET", f"/api/threads/{_seg(thread_id)}/effects",
                    params={"limit": max(recent, 1)}, expect=("runs", "counts"))
    runs: list[dict[str, Any]] = page["runs"][:recent]
    listed = api.call("GET", f"/api/threads/{_seg(thread_id)}/schedules", expect=("schedules",))
    schedules: list[dict[str, Any]] = listed["schedules"]
    if as_json:
        _print_json({"thread": thread, "counts": page["counts"], "runs": runs,
                     "schedules": schedules})
        return
    console = _console()
    console.print(_details([
        ("Thread", thread["id"]),
        ("Created", _when(thread["createdAt"]).append(" UTC")),
        ("Last activity", _when(thread["lastActivityAt"]).append(" UTC")),
        ("Agent", thread["agentId"]),
        ("User", thread["userId"]),
        ("Tags", thread["tags"]),
        ("Runs", _counts_line(page["counts"])),
        ("Schedules", len(schedules)),
    ]))
    if schedules:
        console.print()
        console.print(_schedules_table(console, schedules))
    if runs:
        console.print()
        console.print(_runs_table(console, runs))
        total = sum(page["counts"].values())
        if total > len(runs):
            console.print(Text(
                f"{len(runs)} of {total} runs shown; thread-effects runs list --thread "
                f"{thread['id']}", style="dim"))


@threads.command("delete", short_help="Delete a thread and all its runs.")
@click.argument("thread_id", metavar="TID", callback=_one_segment)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_json_option
@click.pass_context
def threads_delete(ctx: click.Context, thread_id: str, yes: bool, as_json: bool) -> None:
    """Delete a thread with all its runs; nothing of it runs afterwards.

    Asks first (on stderr) unless --yes; a declined or unanswered question exits 1.
    """
    api = _api(ctx, as_json)
    if not yes:
        try:
            agreed = click.confirm(
                f"Delete thread {thread_id} and all its runs?", err=True, default=False
            )
        except click.Abort:  # no answer (end of input)
            click.echo(err=True)
            agreed = False
        if not agreed:
            raise Refused(f"thread {thread_id} not deleted (confirm, or pass --yes)",
                          code="aborted", as_json=as_json)
    answer = api.call("DELETE", f"/api/threads/{_seg(thread_id)}", expect=("deleted",))
    if as_json:
        _print_json(answer)
    else:
        _console().print(Text(f"Deleted thread {thread_id}."))


@cli.group()
def runs() -> None:
    """List a thread's runs; show, cancel, run now or replay one."""


@runs.command("list", short_help="List runs, of one thread or of all, newest first.")
@click.option("--thread", "-t", "thread_id", default=None, metavar="TID",
              callback=_one_segment,
              help="Only this thread's runs (without it: runs across every thread).")
@click.option("--status", "statuses", type=click.Choice(RUN_STATUSES), multiple=True,
              help="Only runs in this status (repeat for several).")
@click.option("--name", default=None, callback=_not_empty, help="Only runs of this effect.")
@click.option("--user", "user_id", default=None, callback=_not_empty,
              help="Only runs of threads of this user_id (across threads).")
@click.option("--tag", default=None, callback=_not_empty,
              help="Only runs of threads with this tag (across threads).")
@click.option("--since", default=None, metavar="TIME", callback=_not_empty,
              help="Only runs due at or after this ISO 8601 time, UTC unless it says "
                   "(across threads).")
@click.option("--until", default=None, metavar="TIME", callback=_not_empty,
              help="Only runs due before this time (across threads).")
@click.option("--replayed/--not-replayed", default=None,
              help="Only runs that a run replays, or only those none replays yet "
                   "(across threads).")
@click.option("--limit", type=click.IntRange(min=1, max=_MAX_PAGE), default=None,
              help="Runs per page, at most 500 [default: 50; 500 with --all].")
@click.option("--cursor", default=None, callback=_not_empty,
              help="Continue from a page's nextCursor.")
@click.option("--all", "every", is_flag=True, help="Follow the cursors: every matching run.")
@_json_option
@click.pass_context
def runs_list(
    ctx: click.Context,
    thread_id: str | None,
    statuses: tuple[str, ...],
    name: str | None,
    user_id: str | None,
    tag: str | None,
    since: str | None,
    until: str | None,
    replayed: bool | None,
    limit: int | None,
    cursor: str | None,
    every: bool,
    as_json: bool,
) -> None:
    """List runs newest first, of one thread or across every thread.

    With only --thread (and --status, --name): GET /api/threads/TID/effects. Without it,
    or with --user, --tag, --since, --until or --replayed/--not-replayed: GET /api/runs,
    across threads. The counts are the matching runs by status (every filter but --status
    applied).
    """
    api = _api(ctx, as_json)
    across = thread_id is None or any(
        v is not None for v in (user_id, tag, since, until, replayed)
    )
    params: dict[str, Any] = {
        "status": list(statuses) or None, "name": name, "limit": _page_size(limit, every),
        "cursor": cursor,
    }
    if across or thread_id is None:
        path = "/api/runs"
        params.update(thread_id=thread_id, user_id=user_id, tag=tag, since=since,
                      until=until,
                      replayed=None if replayed is None else str(replayed).lower())
    else:
        path = f"/api/threads/{_seg(thread_id)}/effects"
    if every:
        pages = list(api.pages(path, "runs", params))
        answer: dict[str, Any] = {
            "runs": [r for page in pages for r in page["runs"]],
            "nextCursor": None,
            "counts": pages[0]["counts"],
        }
        if across or thread_id is None:
            answer["complete"] = all(p.get("complete", True) for p in pages)
    else:
        answer = api.call("GET", path, params=params, expect=("runs", "counts"))
    if as_json:
        _print_json(answer)
        return
    console = _console()
    found: list[dict[str, Any]] = answer["runs"]
    if found:
        console.print(_runs_table(console, found, threads=across))
    else:
        filtered = statuses or name or cursor or (across and thread_id) or user_id or tag \
            or since or until
        console.print("No runs match." if filtered else "No runs.")
    console.print(_counts_line(answer["counts"]))
    _more(console, answer.get("nextCursor"), "runs", "runs list", [
        ("--thread", thread_id), ("--status", list(statuses)), ("--name", name),
        ("--user", user_id), ("--tag", tag), ("--since", since), ("--until", until),
        ("--replayed", replayed is True), ("--not-replayed", replayed is False),
        ("--limit", limit),
    ])


@runs.command("show", short_help="Show one run with its args and error.")
@click.argument("run_id", metavar="RUN_ID", callback=_one_segment)
@_thread_option
@_json_option
@click.pass_context
def runs_show(ctx: click.Context, run_id: str, thread_id: str, as_json: bool) -> None:
    """Show one run with its args and its whole error."""
    api = _api(ctx, as_json)
    run = api.call("GET", f"/api/threads/{_seg(thread_id)}/effects/{_seg(run_id)}",
                   expect=_RUN_KEYS)
    if as_json:
        _print_json(run)
        return
    args = run.get("args")
    console = _console()
    console.print(_details([
        ("Run", run["id"]),
        ("Thread", run["threadId"]),
        ("Effect", run["name"]),
        ("Status", _status(run["status"])),
        ("Due", _when(run["runAt"]).append(" UTC")),
        ("Created", _when(run["createdAt"]).append(" UTC")),
        ("Started", _when(run["startedAt"]).append(" UTC" if run["startedAt"] else "")),
        ("Finished", _when(run["finishedAt"]).append(" UTC" if run["finishedAt"] else "")),
        ("Duration", _duration(run["startedAt"], run["finishedAt"])),
        ("Attempts", run["attempts"]),
        ("Replay of", run["replayOf"]),
        ("Error", Text(run["error"], style="red") if run["error"] else _text(None)),
        ("Args", Text(json.dumps(args, indent=2, ensure_ascii=False))
         if args is not None else _text(None)),
    ]))
    attempts: list[dict[str, Any]] = run.get("attemptDetails") or []
    if attempts:
        console.print(_table(console, _ATTEMPT_COLUMNS, [
            [
                _text(a["attempt"]),
                _when(a["startedAt"]),
                _when(a["endedAt"]),
                _duration(a["startedAt"], a["endedAt"]),
                _status(a["outcome"]),
                _text(a.get("nodeId")),
                _first_line(a["error"]),
            ]
            for a in attempts
        ]))


def _run_action(
    ctx: click.Context,
    thread_id: str,
    run_id: str,
    action: str,
    as_json: bool,
    say: Callable[[dict[str, Any]], str],
    expect: tuple[str, ...],
) -> None:
    api = _api(ctx, as_json)
    answer = api.call("POST", f"/api/threads/{_seg(thread_id)}/effects/{_seg(run_id)}/{action}",
                      expect=expect)
    if as_json:
        _print_json(answer)
    else:
        _console().print(Text(say(answer)))


@runs.command("cancel", short_help="Cancel a pending run.")
@click.argument("run_id", metavar="RUN_ID", callback=_one_segment)
@_thread_option
@_json_option
@click.pass_context
def runs_cancel(ctx: click.Context, run_id: str, thread_id: str, as_json: bool) -> None:
    """Cancel a pending run. A run no longer pending is left alone (exit 1)."""
    api = _api(ctx, as_json)
    path = f"/api/threads/{_seg(thread_id)}/effects/{_seg(run_id)}"
    answer = api.call("POST", f"{path}/cancel", expect=("canceled",))
    if as_json:
        _print_json(answer)
    if answer.get("canceled"):
        if not as_json:
            _console().print(Text(f"Canceled run {run_id}."))
        return
    run = api.call("GET", path, expect=("status",))
    raise Refused(
        f"run {run_id} is {run['status']}, not pending: nothing canceled",
        code="not_canceled", as_json=as_json,
    )


@runs.command("run-now", short_help="Make a pending run due now.")
@click.argument("run_id", metavar="RUN_ID", callback=_one_segment)
@_thread_option
@_json_option
@click.pass_context
def runs_run_now(ctx: click.Context, run_id: str, thread_id: str, as_json: bool) -> None:
    """Make a pending run due now (it runs after the thread's running run, if any)."""
    _run_action(ctx, thread_id, run_id, "run", as_json,
                lambda a: f"Run {a['id']} is due now ({a['status']}).", ("id", "status"))


@runs.command("replay", short_help="Run a finished run again, as a new run.")
@click.argument("run_id", metavar="RUN_ID", callback=_one_segment)
@_thread_option
@_json_option
@click.pass_context
def runs_replay(ctx: click.Context, run_id: str, thread_id: str, as_json: bool) -> None:
    """Schedule a new run with the name and args of a finished one, due now."""
    _run_action(ctx, thread_id, run_id, "replay", as_json,
                lambda a: f"Replayed run {run_id} as run {a['id']}.", ("id",))


@cli.group()
def schedules() -> None:
    """List a thread's recurring schedules; show, pause, resume or cancel one."""


_SCHEDULE_COLUMNS = [
    _Column("Schedule"),
    _Column("Effect", shrinks=True),
    _Column("When", shrinks=True),
    _Column("State"),
    _Column("Next fire (UTC)", drop=3),
    _Column("Runs", drop=2, justify="right"),
    _Column("Skipped", drop=1, justify="right"),
    _Column("Key", drop=4, shrinks=True),
]


def _recurrence(schedule: dict[str, Any]) -> Text:
    """``cron 0 9 * * 1-5 (Europe/Istanbul)`` or ``every 90s``."""
    if schedule.get("cron"):
        return Text(f"cron {schedule['cron']} ({schedule.get('timezone') or 'UTC'})")
    return Text(f"every {schedule.get('everySeconds'):g}s")


def _schedule_state(value: str) -> Text:
    return Text(value, style="green" if value == "active" else "yellow")


def _schedules_table(console: Console, found: list[dict[str, Any]]) -> Table:
    return _table(console, _SCHEDULE_COLUMNS, [
        [
            _text(s["id"]),
            _text(s["name"]),
            _recurrence(s),
            _schedule_state(s["state"]),
            _when(s["nextFireAt"]),
            _text(s["occurrences"]),
            _text(s["skipped"]),
            _text(s["key"]),
        ]
        for s in found
    ])


_schedule_thread_option = click.option(
    "--thread", "-t", "thread_id", required=True, metavar="TID", callback=_one_segment,
    help="The thread the schedule belongs to.",
)


@schedules.command("list", short_help="List a thread's recurring schedules, oldest first.")
@_schedule_thread_option
@_json_option
@click.pass_context
def schedules_list(ctx: click.Context, thread_id: str, as_json: bool) -> None:
    """List a thread's recurring schedules, oldest first (GET /api/threads/TID/schedules)."""
    api = _api(ctx, as_json)
    answer = api.call("GET", f"/api/threads/{_seg(thread_id)}/schedules",
                      expect=("schedules",))
    if as_json:
        _print_json(answer)
        return
    console = _console()
    found: list[dict[str, Any]] = answer["schedules"]
    console.print(_schedules_table(console, found) if found else "No schedules.")


def _schedule_details(console: Console, s: dict[str, Any]) -> None:
    console.print(_details([
        ("Schedule", s["id"]),
        ("Thread", s["threadId"]),
        ("Effect", s["name"]),
        ("When", _recurrence(s)),
        ("State", _schedule_state(s["state"])),
        ("Next fire", _when(s["nextFireAt"]).append(" UTC" if s["nextFireAt"] else "")),
        ("Created", _when(s["createdAt"]).append(" UTC")),
        ("Key", s["key"]),
        ("Runs made", s["occurrences"]),
        ("Skipped", s["skipped"]),
        ("Last run", s["lastRunId"]),
        ("Last fire", _when(s["lastFireAt"]).append(" UTC" if s["lastFireAt"] else "")),
        *([("Args", Text(json.dumps(s["args"], indent=2, ensure_ascii=False))
            if s["args"] is not None else _text(None))] if "args" in s else []),
    ]))


@schedules.command("show", short_help="Show one schedule with its args.")
@click.argument("schedule_id", metavar="SID", callback=_one_segment)
@_schedule_thread_option
@_json_option
@click.pass_context
def schedules_show(ctx: click.Context, schedule_id: str, thread_id: str, as_json: bool) -> None:
    """Show one recurring schedule: when it fires, its state, its counts and its args."""
    api = _api(ctx, as_json)
    found = api.call("GET", f"/api/threads/{_seg(thread_id)}/schedules/{_seg(schedule_id)}",
                     expect=_SCHEDULE_KEYS)
    if as_json:
        _print_json(found)
    else:
        _schedule_details(_console(), found)


def _schedule_action(
    ctx: click.Context, thread_id: str, schedule_id: str, action: str, as_json: bool, said: str
) -> None:
    api = _api(ctx, as_json)
    answer = api.call(
        "POST", f"/api/threads/{_seg(thread_id)}/schedules/{_seg(schedule_id)}/{action}",
        expect=_SCHEDULE_KEYS,
    )
    if as_json:
        _print_json(answer)
        return
    next_fire = answer["nextFireAt"]
    tail = f"; next fire {_when(next_fire).plain} UTC" if next_fire and action != "cancel" else ""
    _console().print(Text(f"{said} schedule {schedule_id} ({answer['name']}){tail}."))


@schedules.command("pause", short_help="Pause a schedule: it makes no runs.")
@click.argument("schedule_id", metavar="SID", callback=_one_segment)
@_schedule_thread_option
@_json_option
@click.pass_context
def schedules_pause(ctx: click.Context, schedule_id: str, thread_id: str, as_json: bool) -> None:
    """Pause a schedule: it makes no runs until resumed (runs it made are left alone)."""
    _schedule_action(ctx, thread_id, schedule_id, "pause", as_json, "Paused")


@schedules.command("resume", short_help="Resume a paused schedule.")
@click.argument("schedule_id", metavar="SID", callback=_one_segment)
@_schedule_thread_option
@_json_option
@click.pass_context
def schedules_resume(
    ctx: click.Context, schedule_id: str, thread_id: str, as_json: bool
) -> None:
    """Resume a schedule: its next fire time is the first after now (none made up)."""
    _schedule_action(ctx, thread_id, schedule_id, "resume", as_json, "Resumed")


@schedules.command("cancel", short_help="Cancel (delete) a schedule; its runs stay.")
@click.argument("schedule_id", metavar="SID", callback=_one_segment)
@_schedule_thread_option
@_json_option
@click.pass_context
def schedules_cancel(
    ctx: click.Context, schedule_id: str, thread_id: str, as_json: bool
) -> None:
    """Cancel a schedule: it is deleted and makes no more runs; the runs it made stay.

    JSON: the schedule as it was.
    """
    _schedule_action(ctx, thread_id, schedule_id, "cancel", as_json, "Canceled")


@cli.group()
def effects() -> None:
    """The effects the server discovered."""


def _schema_summary(schema: dict[str, Any] | None) -> Text:
    """``{"properties": {"text": {"type": "string"}}, ...}`` → ``text: string``."""
    if not schema:
        return Text("(no args)", style="dim")
    required = set(schema.get("required", ()))
    parts: list[str] = []
    for prop, spec in (schema.get("properties") or {}).items():
        part = prop if prop in required else f"{prop}?"
        kind = _type_name(spec)
        if kind:
            part += f": {kind}"
        if "default" in spec:
            part += f" = {json.dumps(spec['default'], ensure_ascii=False)}"
        parts.append(part)
    return Text(", ".join(parts) if parts else "{}")


def _type_name(spec: dict[str, Any]) -> str:
    if "type" in spec:
        kind = spec["type"]
        if kind == "array" and isinstance(spec.get("items"), dict):
            inner = _type_name(spec["items"])
            return f"array[{inner}]" if inner else "array"
        return "|".join(kind) if isinstance(kind, list) else str(kind)
    if "$ref" in spec:
        return str(spec["$ref"]).rsplit("/", 1)[-1]
    for union in ("anyOf", "oneOf"):
        if union in spec:
            return "|".join(_type_name(s) or "any" for s in spec[union])
    if "enum" in spec:
        return "|".join(json.dumps(v) for v in spec["enum"])
    return ""


@effects.command("list", short_help="List the effects with their args.")
@_json_option
@click.pass_context
def effects_list(ctx: click.Context, as_json: bool) -> None:
    """List the effects with their args (GET /api/effects).

    The table sums up each schema (``name?`` is optional); --json gives the JSON schemas.
    """
    answer = _api(ctx, as_json).call("GET", "/api/effects", expect=("effects",))
    if as_json:
        _print_json(answer)
        return
    console = _console()
    found: list[dict[str, Any]] = answer["effects"]
    if not found:
        console.print("No effects.")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("Effect", no_wrap=True)
    table.add_column("Description")
    table.add_column("Args")
    for e in sorted(found, key=lambda e: str(e["name"])):
        table.add_row(_text(e["name"]), _text(e["description"]),
                      _schema_summary(e["argsSchema"]))
    console.print(table)


@cli.command(
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
    short_help="Run the server here (as python server.py does).",
)
@click.argument("server_args", nargs=-1, type=click.UNPROCESSED)
def serve(server_args: tuple[str, ...]) -> None:
    """Run the server here (what python server.py does; serve --help lists its options)."""
    from runtime.serve import main  # the server's imports only when serving

    sys.exit(main(list(server_args), prog=f"{_PROG} serve"))


def main() -> None:
    """The console script ``thread-effects``."""
    cli(prog_name=_PROG)
