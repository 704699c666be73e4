"""The Effects pane in a real browser: Playwright driving Debian's chromium against a real
uvicorn server (in a thread) serving the demo app.

Waits below are Playwright's auto-waiting for a state to appear (with a generous upper
bound against hangs), never assertions about how long something took.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Error,
    Page,
    Request,
    expect,
    sync_playwright,
)

from runtime.http import DEFAULT_WEB_DIR, create_app

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 15_000  # upper bound of Playwright's waits (a hang guard)


def ensure_chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (as scripts/test.sh does)."""
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if shutil.which("apt-get") is None:
        pytest.fail(f"{CHROMIUM} is missing and apt-get is not available to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run([*sudo, *cmd], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"installing chromium failed ({' '.join(cmd)}): {done.stderr[-2000:]}")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"apt-get install chromium did not provide {CHROMIUM}")
    return CHROMIUM


class ThreadedServer:
    """uvicorn on a free loopback port in a background thread (Playwright's sync API
    cannot run inside the test's event loop)."""

    def __init__(self, app: Any) -> None:
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets (else every
        # keep-alive request waits ~40 ms for a delayed ACK).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, lifespan="on", log_config=None, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@dataclass
class Pane:
    url: str
    http: httpx.Client
    page: Page
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    """The questions the page asked (confirm()); each is accepted unless `refuse` is set."""
    refuse: bool = False

    def new_thread(self, **body: Any) -> str:
        res = self.http.post("/api/threads", json=body)
        assert res.status_code == 201, res.text
        tid: str = res.json()["id"]
        return tid

    def schedule(
        self, tid: str, name: str, args: Any = None, delay: float = 0, key: str | None = None
    ) -> str:
        res = self.http.post(
            f"/api/threads/{tid}/effects",
            json={"name": name, "args": args, "delay_seconds": delay, "key": key},
        )
        assert res.status_code == 201, res.text
        run_id: str = res.json()["id"]
        return run_id

    def open_thread(self, tid: str) -> None:
        self.page.goto(f"{self.url}/")
        item = self.page.locator(f'[data-testid="thread-item"][data-thread-id="{tid}"]')
        item.click()
        expect(self.page).to_have_url(f"{self.url}/#thread={tid}", timeout=WAIT_MS)
        expect(self.page.get_by_test_id("conn-state")).to_have_attribute(
            "data-state", "live", timeout=WAIT_MS
        )

    def row(self, run_id: str) -> Any:
        return self.page.locator(f'[data-testid="run-row"][data-run-id="{run_id}"]')


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = ensure_chromium()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def pane(tmp_path: Path, browser: Browser) -> Iterator[Pane]:
    with serve_pane(tmp_path, browser, ROOT / "agents") as result:
        yield result


@contextmanager
def serve_pane(
    tmp_path: Path, browser: Browser, app_dir: Path, **settings: Any
) -> Iterator[Pane]:
    """The app in ``app_dir`` served by uvicorn, and a fresh browser page (console errors kept)."""
    app = create_app(
        data_dir=tmp_path / "data",
        app_dir=app_dir,
        web_dir=DEFAULT_WEB_DIR,
        load_packages=False,
        synchronous="NORMAL",
        shutdown_grace_seconds=0,
        **settings,
    )
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url) as http:
        context = browser.new_context()
        page = context.new_page()
        result = Pane(server.url, http, page)

        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error":
                result.errors.append(msg.text)

        page.on("pageerror", lambda exc: result.errors.append(str(exc)))

        def on_dialog(dialog: Any) -> None:
            result.dialogs.append(dialog.message)
            if result.refuse:
                dialog.dismiss()
            else:
                dialog.accept()

        page.on("dialog", on_dialog)
        page.on("console", on_console)
        try:
            yield result
        finally:
            context.close()


def test_runs_update_live_and_the_buttons_work(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    pane.open_thread(tid)
    # A marker that a reload would erase: the updates below must come without one.
    page.evaluate("window.__noReload = true")

    # A pending run appears from its frame, and goes to completed after "run now".
    first = pane.schedule(tid, "send_reminder", {"text": "water the plants"}, delay=3600)
    row = pane.row(first)
    expect(row).to_have_attribute("data-status", "pending", timeout=WAIT_MS)
    row.get_by_test_id("run-now").click()
    expect(row).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(row.get_by_test_id("run-now")).to_have_count(0)

    # Cancel a pending run.
    doomed = pane.schedule(tid, "send_reminder", {"text": "never"}, delay=3600)
    expect(pane.row(doomed)).to_have_attribute("data-status", "pending", timeout=WAIT_MS)
    pane.row(doomed).get_by_test_id("cancel").click()
    expect(pane.row(doomed)).to_have_attribute("data-status", "canceled", timeout=WAIT_MS)

    # Replay the completed one: a new run with the same args completes.
    rows = page.get_by_test_id("run-row")
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    row.get_by_test_id("replay").click()
    expect(rows).to_have_count(3, timeout=WAIT_MS)
    replays = pane.http.get(f"/api/threads/{tid}/effects").json()["runs"]
    replay = next(r for r in replays if r["replayOf"] == first)
    expect(pane.row(replay["id"])).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    assert pane.http.get(f"/api/threads/{tid}/effects/{replay['id']}").json()["args"] == {
        "text": "water the plants"
    }

    # A failing run shows its error.
    failing = pane.schedule(tid, "fail_on_purpose", {"reason": "no network today"})
    expect(pane.row(failing)).to_have_attribute("data-status", "failed", timeout=WAIT_MS)
    expect(pane.row(failing)).to_contain_text("no network today")

    # The detail view shows the args.
    row.click()
    detail = page.get_by_test_id("run-detail")
    expect(detail).to_be_visible(timeout=WAIT_MS)
    expect(detail.get_by_test_id("run-args")).to_contain_text("water the plants")

    assert page.evaluate("window.__noReload") is True
    assert pane.errors == []


def test_a_run_shows_running_while_it_works(pane: Pane) -> None:
    tid = pane.new_thread()
    pane.open_thread(tid)
    slow = pane.schedule(tid, "slow_task", {"seconds": 1.0})
    expect(pane.row(slow)).to_have_attribute("data-status", "running", timeout=WAIT_MS)
    expect(pane.row(slow)).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    assert pane.errors == []


def test_a_thread_with_a_thousand_runs_stays_usable(pane: Pane) -> None:
    tid = pane.new_thread()
    ids = [
        pane.schedule(tid, "send_reminder", {"text": f"reminder {i}"}, delay=3600)
        for i in range(1000)
    ]
    pane.open_thread(tid)
    rows = pane.page.get_by_test_id("run-row")
    expect(rows.first).to_be_visible(timeout=WAIT_MS)
    loaded = rows.count()
    assert 0 < loaded < 1000  # paged, not all at once
    # The status counts are the thread's totals from the server, not what is loaded.
    pending = pane.page.get_by_test_id("filter-pending")
    expect(pending).to_have_attribute("data-count", "1000", timeout=WAIT_MS)
    pane.page.get_by_test_id("runs-more").click()
    expect(rows).to_have_count(min(2 * loaded, 1000), timeout=WAIT_MS)
    newest = pane.row(ids[-1])
    expect(newest).to_have_attribute("data-status", "pending", timeout=WAIT_MS)
    newest.get_by_test_id("run-now").click()
    expect(newest).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    # Kept current from frames alone.
    expect(pending).to_have_attribute("data-count", "999", timeout=WAIT_MS)
    expect(pane.page.get_by_test_id("filter-completed")).to_have_attribute("data-count", "1")
    newest.click()
    expect(pane.page.get_by_test_id("run-args")).to_contain_text("reminder 999")
    assert pane.errors == []


def test_the_pane_asks_for_the_token_once(tmp_path: Path, browser: Browser) -> None:
    app = create_app(
        data_dir=tmp_path / "data",
        app_dir=ROOT / "agents",
        web_dir=DEFAULT_WEB_DIR,
        load_packages=False,
        api_token="pane-secret",
    )
    with ThreadedServer(app) as server:
        headers = {"Authorization": "Bearer pane-secret"}
        with httpx.Client(base_url=server.url, headers=headers) as http:
            tid = http.post("/api/threads", json={}).json()["id"]
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"{server.url}/")
            dialog = page.get_by_test_id("token-dialog")
            expect(dialog).to_be_visible(timeout=WAIT_MS)
            page.get_by_test_id("token-input").fill("pane-secret")
            page.get_by_test_id("token-submit").click()
            item = page.locator(f'[data-testid="thread-item"][data-thread-id="{tid}"]')
            expect(item).to_be_visible(timeout=WAIT_MS)
            item.click()
            expect(page.get_by_test_id("conn-state")).to_have_attribute(
                "data-state", "live", timeout=WAIT_MS
            )
            expect(dialog).not_to_be_visible()
        except Error:
            raise
        finally:
            context.close()


def messages_requests(page: Page) -> list[str]:
    """``METHOD url`` of every request the page makes to a thread's messages from now on."""
    seen: list[str] = []

    def on_request(request: Request) -> None:
        if "/messages" in request.url:
            seen.append(f"{request.method} {request.url}")

    page.on("request", on_request)
    return seen


def test_the_conversation_shows_the_reply_and_the_reminder_live(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    pane.open_thread(tid)
    page.evaluate("window.__noReload = true")  # a reload would erase it

    page.get_by_test_id("tab-conversation").click()
    expect(page).to_have_url(f"{pane.url}/#thread={tid}&view=conversation", timeout=WAIT_MS)
    expect(page.get_by_test_id("runs-table")).to_be_hidden()
    items = page.get_by_test_id("message-item")
    # The demo agent's welcome hook greeted the thread when it was created.
    expect(items).to_have_count(1, timeout=WAIT_MS)
    expect(items.first).to_have_attribute("data-role", "assistant")
    expect(items.first).to_contain_text("I can set reminders")

    requests = messages_requests(page)
    page.get_by_test_id("composer-input").fill("remind me in 1 seconds to stretch")
    page.get_by_test_id("composer-send").click()
    expect(page.get_by_test_id("composer-input")).to_have_value("")
    user = page.locator('[data-testid="message-item"][data-role="user"]')
    expect(user).to_contain_text("remind me in 1 seconds to stretch", timeout=WAIT_MS)
    reply = page.locator(
        '[data-testid="message-item"][data-role="assistant"]',
        has_text="OK, I'll remind you to stretch in 1 second.",
    )
    expect(reply).to_be_visible(timeout=WAIT_MS)
    expect(page.get_by_test_id("composer-send")).to_be_enabled()

    # A second later the send_reminder effect injects the reminder: it shows up live, last.
    reminder = page.locator('[data-testid="message-item"]', has_text="Reminder: stretch")
    expect(reminder).to_have_count(1, timeout=WAIT_MS)
    expect(reminder).to_have_attribute("data-role", "assistant")
    expect(reminder).to_have_attribute("data-injected", "true")
    reminder_id = reminder.get_attribute("data-message-id")
    assert reminder_id
    expect(items.last).to_have_attribute("data-message-id", reminder_id)
    expect(reminder).to_be_in_viewport()
    # Everything after "Send" came over the stream: the only messages request was the POST.
    assert requests == [f"POST {pane.url}/api/threads/{tid}/messages"]
    assert page.evaluate("window.__noReload") is True

    # The same message is what the API holds, in the same order.
    stored = pane.http.get(f"/api/threads/{tid}/messages").json()["messages"]
    shown = items.evaluate_all("els => els.map(e => e.dataset.messageId)")
    assert shown == [m["id"] for m in stored]
    assert stored[-1]["content"] == "Reminder: stretch"

    # The run that posted it is on the Runs tab, completed.
    page.get_by_test_id("tab-runs").click()
    run = page.locator('[data-testid="run-row"]', has_text="send_reminder")
    expect(run).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    assert pane.errors == []


def test_the_composer_shows_errors_inline_and_text_stays_text(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    page.goto(f"{pane.url}/#thread={tid}&view=conversation")
    expect(page.get_by_test_id("conversation")).to_be_visible(timeout=WAIT_MS)
    expect(page.get_by_test_id("message-item")).to_have_count(1, timeout=WAIT_MS)

    # Markup in a message is shown as the text it is.
    box = page.get_by_test_id("composer-input")
    markup = '<img src=x onerror="window.__pwned=1"><b>bold</b>'
    box.fill(markup)
    box.press("Enter")
    user = page.locator('[data-testid="message-item"][data-role="user"]')
    expect(user).to_contain_text(markup, timeout=WAIT_MS)
    expect(page.get_by_test_id("message-item")).to_have_count(3, timeout=WAIT_MS)  # + help text
    assert user.locator("img, b").count() == 0
    assert page.evaluate("window.__pwned") is None

    # The server refuses a message over 100,000 characters: the error shows by the composer
    # and the text is kept for another try.
    too_long = "x" * 100_001
    box.fill(too_long)
    page.get_by_test_id("composer-send").click()
    error = page.get_by_test_id("composer-error")
    expect(error).to_be_visible(timeout=WAIT_MS)
    expect(error).to_contain_text("413 content_too_large")
    expect(box).to_have_value(too_long)
    expect(page.get_by_test_id("message-item")).to_have_count(3)
    # The browser logs the refused request itself; nothing else went wrong.
    assert all("413" in e for e in pane.errors), pane.errors


def test_new_thread_asks_which_agent_when_none_is_the_default(
    tmp_path: Path, browser: Browser
) -> None:
    app_dir = tmp_path / "app"
    shutil.copytree(ROOT / "agents", app_dir, ignore=shutil.ignore_patterns("__pycache__"))
    (app_dir / "agents" / "planner.py").write_text(
        "from runtime import define_agent\n\n"
        "agent = define_agent('planner', 'You plan.', description='Plans the week.')\n"
    )
    with serve_pane(tmp_path, browser, app_dir) as pane:
        page = pane.page
        page.goto(f"{pane.url}/")
        page.get_by_test_id("new-thread").click()
        picker = page.get_by_test_id("agent-picker")
        expect(picker).to_be_visible(timeout=WAIT_MS)
        options = picker.get_by_test_id("agent-option")
        expect(options).to_have_count(2)
        assert options.evaluate_all("els => els.map(e => e.dataset.agentId)") == [
            "assistant", "planner",
        ]
        expect(options.nth(1)).to_contain_text("Plans the week.")
        options.nth(1).click()

        expect(picker).to_be_hidden()
        expect(page).to_have_url(re.compile(r"#thread=[0-9a-f]{32}$"), timeout=WAIT_MS)
        tid = page.url.rsplit("=", 1)[1]
        threads = pane.http.get("/api/threads").json()["threads"]
        assert [(t["id"], t["agentId"]) for t in threads] == [(tid, "planner")]
        item = page.locator(f'[data-testid="thread-item"][data-thread-id="{tid}"]')
        expect(item).to_contain_text("agent: planner")
        expect(page.get_by_test_id("toast")).to_have_count(0)
        assert pane.errors == []


# ------------------------------------------------------------------ user findings

SHOTS = os.environ.get("PANE_SCREENSHOTS")  # a folder: save the screenshots taken below


def snap(page: Page, name: str, *, full_page: bool = False) -> None:
    """Save a screenshot to $PANE_SCREENSHOTS/<name>.png when that variable is set."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=full_page)


def test_the_badge_says_connected_without_a_thread_and_offline_only_when_unreachable(
    pane: Pane,
) -> None:
    page = pane.page
    conn = page.get_by_test_id("conn-state")
    tid = pane.new_thread()
    page.goto(f"{pane.url}/")
    expect(page.get_by_test_id("thread-item")).to_have_count(1, timeout=WAIT_MS)
    # The server answers and no thread is selected: neutral "connected" (not "idle", which
    # reads as if the runtime did nothing, nor red "offline").
    expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
    expect(conn).to_have_text("connected")
    assert conn.evaluate("e => getComputedStyle(e).color") == page.locator(
        ".brand-sub"
    ).evaluate("e => getComputedStyle(e).color")  # the muted text colour, not the red
    snap(page, "badge-connected")

    # A thread streams: live; back to no thread: connected again.
    page.locator(f'[data-testid="thread-item"][data-thread-id="{tid}"]').click()
    expect(conn).to_have_attribute("data-state", "live", timeout=WAIT_MS)
    page.go_back()
    expect(page.get_by_test_id("no-thread")).to_be_visible(timeout=WAIT_MS)
    expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT_MS)

    # The server cannot be reached: offline, and connected again by itself once it can.
    page.route("**/api/**", lambda route: route.abort())
    page.get_by_test_id("new-thread").click()
    expect(conn).to_have_attribute("data-state", "offline", timeout=WAIT_MS)
    expect(conn).to_have_text("offline")
    snap(page, "badge-offline")
    page.unroute("**/api/**")
    expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
    assert all("ERR_FAILED" in e for e in pane.errors), pane.errors


def test_with_a_token_the_badge_says_connected_once_the_token_works(
    tmp_path: Path, browser: Browser
) -> None:
    app = create_app(
        data_dir=tmp_path / "data",
        app_dir=ROOT / "agents",
        web_dir=DEFAULT_WEB_DIR,
        load_packages=False,
        api_token="pane-secret",
    )
    with ThreadedServer(app) as server:
        context = browser.new_context()
        try:
            page = context.new_page()
            conn = page.get_by_test_id("conn-state")
            page.goto(f"{server.url}/")
            expect(page.get_by_test_id("token-dialog")).to_be_visible(timeout=WAIT_MS)
            page.get_by_test_id("token-input").fill("pane-secret")
            page.get_by_test_id("token-submit").click()
            expect(page.get_by_text("No threads yet.")).to_be_visible(timeout=WAIT_MS)
            expect(conn).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
            snap(page, "badge-connected-after-token")

            # Without a token the server still answers: "token needed", not "offline".
            page.get_by_test_id("token-button").click()
            page.get_by_test_id("token-forget").click()
            expect(page.get_by_test_id("token-dialog")).to_be_visible(timeout=WAIT_MS)
            page.get_by_test_id("token-cancel").click()
            expect(conn).to_have_attribute("data-state", "unauthorized", timeout=WAIT_MS)
            expect(conn).to_have_text("token needed")
        finally:
            context.close()


def test_switching_effect_puts_that_effects_args_in_the_box(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    pane.open_thread(tid)
    name = page.get_by_test_id("schedule-name")
    args = page.get_by_test_id("schedule-args")
    restore = page.get_by_test_id("schedule-args-restore")
    expect(name.locator("option")).to_have_count(5, timeout=WAIT_MS)

    # Untouched args follow the effect, and nothing is offered back.
    name.select_option("fail_on_purpose")
    name.select_option("send_reminder")
    # Its schema refuses an empty text: nothing is pre-filled, the skeleton is the
    # placeholder and the hint names the field.
    expect(args).to_have_value("")
    assert json.loads(args.get_attribute("placeholder") or "") == {"text": "…"}
    expect(page.get_by_test_id("schedule-args-hint")).to_contain_text(
        "text (What to remind of; 1 to 2000 characters)"
    )
    expect(restore).to_be_hidden()

    # Edited args for fail_on_purpose, then thread_digest (no args): the box is emptied
    # (sent as null), scheduling works, and one click goes back to the edited args.
    name.select_option("fail_on_purpose")
    args.fill('{"reason": "my own reason"}')
    name.select_option("thread_digest")
    expect(args).to_have_value("")
    expect(restore).to_be_visible()
    expect(restore).to_contain_text("fail_on_purpose")
    snap(page, "args-switched")
    page.get_by_test_id("schedule-submit").click()
    expect(page.get_by_test_id("schedule-result")).to_contain_text(
        "Scheduled thread_digest", timeout=WAIT_MS
    )
    expect(page.get_by_test_id("schedule-error")).to_be_hidden()
    digest = page.locator('[data-testid="run-row"]', has_text="thread_digest")
    expect(digest).to_have_attribute("data-status", "completed", timeout=WAIT_MS)

    restore.click()
    expect(name).to_have_value("fail_on_purpose")
    expect(args).to_have_value('{"reason": "my own reason"}')
    expect(restore).to_be_hidden()  # the digest's args were not edited: nothing to go back to
    page.get_by_test_id("schedule-submit").click()
    failed = page.locator('[data-testid="run-row"]', has_text="fail_on_purpose")
    expect(failed).to_have_attribute("data-status", "failed", timeout=WAIT_MS)
    expect(failed).to_contain_text("my own reason")
    assert pane.errors == []


def test_on_a_narrow_screen_rows_show_that_they_open_the_run(pane: Pane) -> None:
    page = pane.page
    page.set_viewport_size({"width": 400, "height": 800})
    tid = pane.new_thread()
    run_id = pane.schedule(tid, "send_reminder", {"text": "stretch"}, delay=3600)
    pane.schedule(tid, "fail_on_purpose", {"reason": "no network today"})
    page.goto(f"{pane.url}/")
    placeholder = page.get_by_test_id("no-thread")
    expect(placeholder).to_have_text("Select a thread, or create a new one.")
    snap(page, "narrow-no-thread", full_page=True)

    pane.open_thread(tid)
    row = pane.row(run_id)
    expect(row).to_have_attribute("data-status", "pending", timeout=WAIT_MS)
    # The actions column does not fit: a chevron on every row and a hint say rows open.
    expect(row.get_by_test_id("run-now")).to_be_hidden()
    chevron = row.get_by_test_id("row-open")
    expect(chevron).to_be_visible()
    expect(chevron).to_have_text("\u203a")  # the chevron
    expect(page.get_by_test_id("runs-hint")).to_be_visible()
    assert row.evaluate("e => getComputedStyle(e).cursor") == "pointer"
    # Nothing hides off to the side: the table fits the screen.
    wrap = page.locator(".table-wrap")
    assert wrap.evaluate("e => e.scrollWidth <= e.clientWidth"), "the table scrolls sideways"
    row.scroll_into_view_if_needed()
    expect(chevron).to_be_in_viewport()
    snap(page, "narrow-rows", full_page=True)

    row.click()
    detail = page.get_by_test_id("run-detail")
    expect(detail).to_be_visible(timeout=WAIT_MS)
    expect(detail.get_by_test_id("run-now")).to_be_visible()
    snap(page, "narrow-detail")
    detail.get_by_test_id("run-now").click()
    expect(row).to_have_attribute("data-status", "completed", timeout=WAIT_MS)

    # Wide again: the actions are back in the rows, no chevron, no hint.
    page.get_by_test_id("detail-close").click()
    page.set_viewport_size({"width": 1280, "height": 800})
    expect(row.get_by_test_id("replay")).to_be_visible()
    expect(chevron).to_be_hidden()
    expect(page.get_by_test_id("runs-hint")).to_be_hidden()
    assert pane.errors == []


def expect_thread_gone(pane: Pane, tid: str, message: str) -> None:
    page = pane.page
    error = page.get_by_test_id("thread-error")
    expect(error).to_be_visible(timeout=WAIT_MS)
    expect(error).to_contain_text(message)
    expect(page.locator(f'[data-testid="thread-item"][data-thread-id="{tid}"]')).to_have_count(0)
    expect(page.get_by_test_id("run-row")).to_have_count(0)
    expect(page.get_by_test_id("runs-empty")).to_have_text("This thread does not exist.")
    expect(page.get_by_test_id("schedule-submit")).to_be_disabled()
    expect(page.get_by_test_id("reload-runs")).to_be_disabled()
    expect(page.get_by_test_id("filter-all")).to_be_disabled()
    # The server answers; there is just no thread to stream.
    expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "connected")


def test_a_thread_deleted_in_another_browser_leaves_this_one(pane: Pane) -> None:
    page = pane.page
    keep = pane.new_thread()
    tid = pane.new_thread()
    run_id = pane.schedule(tid, "send_reminder", {"text": "later"}, delay=3600)
    pane.open_thread(tid)
    expect(pane.row(run_id).get_by_test_id("run-now")).to_be_visible(timeout=WAIT_MS)
    pane.row(run_id).click()
    expect(page.get_by_test_id("run-detail")).to_be_visible(timeout=WAIT_MS)

    assert pane.http.delete(f"/api/threads/{tid}").status_code == 200  # "another browser"
    expect_thread_gone(pane, tid, f"Thread not found: {tid}. It may have been deleted.")
    expect(page.get_by_test_id("run-detail")).to_be_hidden()
    expect(page.get_by_test_id("run-now")).to_have_count(0)
    page.get_by_test_id("tab-conversation").click()
    expect(page.get_by_test_id("message-item")).to_have_count(0)
    expect(page.get_by_test_id("composer-send")).to_be_disabled()
    page.get_by_test_id("tab-runs").click()
    snap(page, "thread-deleted-elsewhere")

    # The other thread still opens normally, with everything enabled again.
    page.locator(f'[data-testid="thread-item"][data-thread-id="{keep}"]').click()
    expect(page.get_by_test_id("conn-state")).to_have_attribute(
        "data-state", "live", timeout=WAIT_MS
    )
    expect(page.get_by_test_id("thread-error")).to_be_hidden()
    expect(page.get_by_test_id("schedule-submit")).to_be_enabled()
    expect(page.get_by_test_id("runs-empty")).to_have_text("No runs in this thread yet.")
    # A request the page had in flight when the thread went (a refresh of the run's
    # detail) may be answered 404, which the browser logs; nothing else may fail.
    assert all("404" in e for e in pane.errors), pane.errors


def test_an_action_answered_404_for_a_deleted_thread_clears_it_too(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    run_id = pane.schedule(tid, "send_reminder", {"text": "later"}, delay=3600)
    # A stream that never hears of the deletion (say, a proxy holding it open): only the
    # HTTP answers can tell.
    page.route_web_socket(re.compile(r"/stream"), lambda ws: None)
    pane.open_thread(tid)
    run_now = pane.row(run_id).get_by_test_id("run-now")
    expect(run_now).to_be_visible(timeout=WAIT_MS)
    assert pane.http.delete(f"/api/threads/{tid}").status_code == 200
    run_now.click()
    expect_thread_gone(pane, tid, f"Thread not found: {tid}. It may have been deleted.")
    expect(page.get_by_test_id("toast")).to_have_count(0)
    assert all("404" in e for e in pane.errors), pane.errors


def test_a_malformed_thread_id_is_refused_once_and_not_retried(pane: Pane) -> None:
    page = pane.page
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(f"{pane.url}/#thread=bad..id")
    expect_thread_gone(pane, "bad..id", "Invalid thread id: bad..id.")
    snap(page, "malformed-thread-id")
    # The pane's first retry would come within a second; give it three.
    page.wait_for_timeout(3000)
    assert sockets == [f"{pane.url.replace('http', 'ws')}/api/threads/bad..id/stream"]
    expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "connected")
    expect(page.get_by_test_id("toast")).to_have_count(0)
    # The server accepts the socket before closing it, so the pane may ask for the runs
    # and the effect records once each (400 invalid_thread_id), and only once.
    assert len(pane.errors) <= 2 and all("400" in e for e in pane.errors), pane.errors


# ------------------------------------------------------------------ screenshots at 1400 and 420

WIDE = {"width": 1400, "height": 900}
PHONE = {"width": 420, "height": 900}


def cut_cells(page: Page) -> list[str]:
    """Text of every visible run cell and header whose text is cut (wider than the cell);
    names and errors may be cut (their title and the detail show them whole)."""
    cells: list[str] = page.evaluate(
        """() => [...document.querySelectorAll('#runs-table th, #runs-body td')]
            .filter((td) => td.offsetParent !== null && !td.classList.contains('cell-name')
                && !td.classList.contains('cell-error') && !td.querySelector('.visually-hidden'))
            .filter((td) => {
                const range = document.createRange();
                range.selectNodeContents(td);
                const style = getComputedStyle(td);
                const room = td.clientWidth - parseFloat(style.paddingLeft)
                    - parseFloat(style.paddingRight);
                return range.getBoundingClientRect().width > room + 0.5;
            })
            .map((td) => td.className + ': ' + td.textContent.trim())"""
    )
    return cells


def names_cut(page: Page) -> list[str]:
    """The run names cut to fit their cell."""
    cut: list[str] = page.evaluate(
        """() => [...document.querySelectorAll('#runs-body td.cell-name')]
            .filter((td) => td.scrollWidth > td.clientWidth).map((td) => td.textContent)"""
    )
    return cut


def error_room(pane: Pane, run_id: str) -> dict[str, float]:
    """Where a row's error text is drawn: its width, and the gap between its end and the
    row's buttons (the room the error could use but does not)."""
    room: dict[str, float] = pane.row(run_id).evaluate(
        """(row) => {
            const text = row.querySelector('.error-text').getBoundingClientRect();
            const buttons = row.querySelector('.cell-error .cell-actions').getBoundingClientRect();
            return {width: text.width, gap: buttons.left - text.right};
        }"""
    )
    return room


def visible_columns(page: Page) -> list[str]:
    names: list[str] = page.evaluate(
        """() => [...document.querySelectorAll('#runs-table thead th')]
            .filter((th) => th.offsetParent !== null).map((th) => th.className.split(' ')[0])"""
    )
    return names


def four_runs(pane: Pane, tid: str) -> dict[str, str]:
    """A completed, a failed, a canceled and a pending run (due in 29 minutes), and one
    due in two days (whose due time carries a date)."""
    done = pane.schedule(tid, "send_reminder", {"text": "stretch"})
    failed = pane.schedule(tid, "fail_on_purpose", {"reason": "no network today"})
    canceled = pane.schedule(tid, "send_reminder", {"text": "never"}, delay=1740)
    res = pane.http.post(f"/api/threads/{tid}/effects/{canceled}/cancel")
    assert res.json() == {"canceled": True}
    pending = pane.schedule(tid, "send_reminder", {"text": "later"}, delay=1740)
    pane.schedule(tid, "send_reminder", {"text": "in two days"}, delay=2 * 86400 + 60)
    for run_id, status in ((done, "completed"), (failed, "failed")):
        deadline = time.monotonic() + 15
        while pane.http.get(f"/api/threads/{tid}/effects/{run_id}").json()["status"] != status:
            assert time.monotonic() < deadline, f"{run_id} never became {status}"
            time.sleep(0.05)
    return {"completed": done, "failed": failed, "canceled": canceled, "pending": pending}


def test_at_1400px_runs_show_started_finished_and_duration_and_the_detail_hides_nothing(
    pane: Pane,
) -> None:
    page = pane.page
    page.set_viewport_size(WIDE)
    tid = pane.new_thread()
    runs = four_runs(pane, tid)
    pane.open_thread(tid)
    expect(page.get_by_test_id("run-row")).to_have_count(5, timeout=WAIT_MS)
    assert visible_columns(page) == [
        "col-id", "col-name", "col-status", "col-due", "col-started", "col-finished",
        "col-dur", "col-att", "col-error",
    ]
    done = pane.row(runs["completed"])
    assert re.search(r"\d", done.locator(".cell-started").inner_text())
    assert re.search(r"\d", done.locator(".cell-finished").inner_text())
    assert re.fullmatch(r"<1ms|\d+ms|\d\.\ds", done.locator(".cell-dur").inner_text())
    assert pane.row(runs["pending"]).locator(".cell-started").inner_text() == "—"
    assert cut_cells(page) == []
    assert names_cut(page) == []
    # The error column takes what the other columns leave, up to the row's buttons.
    snap(page, "wide-runs")
    room = error_room(pane, runs["failed"])
    assert room["gap"] <= 12 and room["width"] >= 150, room

    # Opening a run keeps ID, attempts and error in the list; times are whole, not cut.
    pane.row(runs["failed"]).click()
    detail = page.get_by_test_id("run-detail")
    expect(detail).to_be_visible(timeout=WAIT_MS)
    expect(detail.get_by_test_id("run-error")).to_contain_text("no network today")
    assert visible_columns(page) == [
        "col-id", "col-name", "col-status", "col-when", "col-att", "col-error",
    ]
    expect(pane.row(runs["failed"]).locator(".cell-error")).to_contain_text("no network")
    # Names are whole, and the error reaches its Replay button with the detail open too.
    assert names_cut(page) == []
    room = error_room(pane, runs["failed"])
    assert room["gap"] <= 12 and room["width"] >= 120, room
    expect(pane.row(runs["pending"]).get_by_test_id("run-when")).to_have_text(
        re.compile(r"in (28|29)m")
    )
    assert cut_cells(page) == []
    assert page.locator(".table-wrap").evaluate("e => e.scrollWidth <= e.clientWidth")
    expect(detail).to_contain_text("Duration")
    snap(page, "wide-detail")
    assert pane.errors == []


def test_a_canceled_run_never_says_when_it_would_have_run(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    pane.open_thread(tid)
    run_id = pane.schedule(tid, "send_reminder", {"text": "never"}, delay=1740)
    row = pane.row(run_id)
    expect(row).to_contain_text("in 29m", timeout=WAIT_MS)
    row.get_by_test_id("cancel").click()
    expect(row).to_have_attribute("data-status", "canceled", timeout=WAIT_MS)
    for size in (WIDE, PHONE):
        page.set_viewport_size(size)
        expect(row).not_to_contain_text("in 2")
        expect(row.get_by_test_id("run-when")).to_have_text(re.compile(r"^canceled"))
    row.click()
    expect(page.get_by_test_id("run-detail")).not_to_contain_text("in 2")
    assert pane.errors == []


def center_hits(page: Page, test_id: str) -> bool:
    """Whether a click at the centre of the element lands on it (nothing covers it)."""
    hit: bool = page.get_by_test_id(test_id).evaluate(
        """(e) => { const r = e.getBoundingClientRect();
            const top = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
            return top === e || e.contains(top); }"""
    )
    return hit


def test_nothing_covers_the_send_button_after_a_replay(pane: Pane) -> None:
    page = pane.page
    for size, name in ((WIDE, "wide"), (PHONE, "phone")):
        page.set_viewport_size(size)
        tid = pane.new_thread()
        run_id = pane.schedule(tid, "send_reminder", {"text": "stretch"})
        pane.open_thread(tid)
        row = pane.row(run_id)
        expect(row).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        row.click()
        page.get_by_test_id("run-detail").get_by_test_id("replay").click()
        # The outcome is said in place (in the detail and above the list), not in a toast.
        expect(page.get_by_test_id("detail-notice")).to_contain_text(
            "Replay of send_reminder scheduled as", timeout=WAIT_MS
        )
        expect(page.get_by_test_id("runs-notice")).to_contain_text("scheduled as")
        expect(page.get_by_test_id("toast")).to_have_count(0)
        page.get_by_test_id("detail-close").click()
        expect(page.get_by_test_id("run-row")).to_have_count(2, timeout=WAIT_MS)
        snap(page, f"{name}-replay-notice")
        page.get_by_test_id("tab-conversation").click()
        expect(page.get_by_test_id("composer-send")).to_be_visible(timeout=WAIT_MS)
        assert center_hits(page, "composer-send")
        # An error toast on this tab sits above the composer too.
        page.evaluate("import('/web/toasts.js').then((m) => m.toast('Something failed'))")
        expect(page.get_by_test_id("toast")).to_have_count(1, timeout=WAIT_MS)
        assert center_hits(page, "composer-send")
        assert center_hits(page, "composer-input")
        snap(page, f"{name}-conversation-toast")
        page.get_by_test_id("toast").get_by_role("button", name="Dismiss").click()
        page.get_by_test_id("tab-runs").click()
    assert pane.errors == []


def test_a_new_thread_starts_with_a_fresh_schedule_form(pane: Pane) -> None:
    page = pane.page
    first = pane.new_thread()
    second = pane.new_thread()
    pane.open_thread(first)
    name = page.get_by_test_id("schedule-name")
    args = page.get_by_test_id("schedule-args")
    delay = page.get_by_test_id("schedule-delay")
    expect(name.locator("option")).to_have_count(5, timeout=WAIT_MS)
    fresh_effect = name.input_value()  # what a page starts with
    assert fresh_effect == "fail_on_purpose"
    default = args.input_value()
    assert json.loads(default) == {"reason": "this effect fails on purpose"}
    args.fill('{"reason": "for the first thread only"}')
    delay.fill("30")
    name.select_option("thread_digest")  # sets the edited args aside
    expect(page.get_by_test_id("schedule-args-restore")).to_be_visible()
    name.select_option("fail_on_purpose")

    name.select_option("send_reminder")

    # Another thread: nothing chosen or typed for the first one is offered, or scheduled,
    # there; the effect is the one a fresh page starts with.
    page.goto(f"{pane.url}/#thread={second}")
    expect(page.get_by_test_id("thread-id")).to_have_text(second, timeout=WAIT_MS)
    expect(name).to_have_value(fresh_effect)
    expect(args).to_have_value(default)
    expect(delay).to_have_value("0")
    expect(page.get_by_test_id("schedule-args-restore")).to_be_hidden()

    # And a brand-new one from "New thread".
    args.fill('{"reason": "typed for the second"}')
    delay.fill("12")
    page.get_by_test_id("new-thread").click()
    expect(page.get_by_test_id("thread-id")).not_to_have_text(second, timeout=WAIT_MS)
    expect(args).to_have_value(default)
    expect(delay).to_have_value("0")
    assert pane.errors == []


def test_every_pre_filled_form_is_accepted_by_its_effect(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    pane.open_thread(tid)
    name = page.get_by_test_id("schedule-name")
    expect(name.locator("option")).to_have_count(5, timeout=WAIT_MS)
    effects = pane.http.get("/api/effects").json()["effects"]
    page.get_by_test_id("schedule-delay").fill("3600")  # nothing needs to run
    tried = 0
    for effect in effects:
        name.select_option(effect["name"])
        box = page.get_by_test_id("schedule-args").input_value()
        if not box and effect["argsSchema"]:
            # Nothing valid to offer: the box stays empty and the hint says what is needed.
            expect(page.get_by_test_id("schedule-args-hint")).to_be_visible()
            snap(page, f"args-needed-{effect['name']}")
            continue
        page.get_by_test_id("schedule-submit").click()
        expect(page.get_by_test_id("schedule-result")).to_contain_text(
            f"Scheduled {effect['name']}", timeout=WAIT_MS
        )
        expect(page.get_by_test_id("schedule-error")).to_be_hidden()
        tried += 1
    assert tried >= 3
    assert pane.errors == []


def test_at_420px_the_runs_start_above_the_fold(pane: Pane) -> None:
    page = pane.page
    page.set_viewport_size(PHONE)
    for _ in range(12):  # enough threads to fill the thread list
        tid = pane.new_thread()
    runs = four_runs(pane, tid)
    pane.open_thread(tid)
    expect(page.get_by_test_id("run-row")).to_have_count(5, timeout=WAIT_MS)
    page.evaluate("window.scrollTo(0, 0)")
    first = page.get_by_test_id("run-row").first
    box = first.bounding_box()
    assert box is not None and box["y"] + box["height"] <= PHONE["height"], box
    assert visible_columns(page) == ["col-name", "col-status", "col-when", "col-open"]
    assert cut_cells(page) == []
    # The compact column says how long a finished run took and when it ended.
    expect(pane.row(runs["completed"]).get_by_test_id("run-when")).to_have_text(
        re.compile(r"^(<1ms|\d+ms|\d\.\ds) · (\d+s ago|now)$")
    )
    assert page.locator(".table-wrap").evaluate("e => e.scrollWidth <= e.clientWidth")
    snap(page, "phone-runs")
    pane.row(runs["failed"]).click()
    expect(page.get_by_test_id("run-detail")).to_be_visible(timeout=WAIT_MS)
    snap(page, "phone-detail")
    page.get_by_test_id("detail-close").click()
    page.get_by_test_id("tab-conversation").click()
    snap(page, "phone-conversation")
    assert pane.errors == []


def test_a_thread_whose_file_is_corrupt_says_so_once(tmp_path: Path, browser: Browser) -> None:
    with serve_pane(tmp_path, browser, ROOT / "agents") as pane:
        pane.http.post("/api/threads", json={"id": "fine1"})
        pane.http.post("/api/threads", json={"id": "corrupt1"})
    path = tmp_path / "data" / "threads" / "corrupt1.sqlite"
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"this is not a database" * 100)

    with serve_pane(tmp_path, browser, ROOT / "agents") as pane:
        page = pane.page
        page.goto(f"{pane.url}/#thread=corrupt1")
        error = page.get_by_test_id("thread-error")
        expect(error).to_contain_text("Thread corrupt1 cannot be used", timeout=WAIT_MS)
        expect(error).to_contain_text("thread storage error")
        expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "connected")
        expect(page.get_by_test_id("runs-empty")).to_have_text(
            "This thread's runs cannot be loaded."
        )
        expect(page.get_by_test_id("records-empty")).to_have_text(
            "This thread's effect-tool records cannot be loaded."
        )
        expect(page.get_by_test_id("schedule-submit")).to_be_disabled()
        expect(page.get_by_test_id("pause-thread")).to_be_disabled()
        # Still listed: the thread exists, only its file is damaged.
        expect(page.locator('[data-testid="thread-item"][data-thread-id="corrupt1"]')).to_be_visible()
        page.wait_for_timeout(2000)  # a retry of the stream would come within a second
        expect(page.get_by_test_id("toast")).to_have_count(0)
        expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "connected")
        snap(page, "corrupt-thread")
        assert all("500" in e for e in pane.errors), pane.errors


def test_at_420px_a_thread_opened_by_link_is_scrolled_into_the_thread_list(pane: Pane) -> None:
    page = pane.page
    page.set_viewport_size(PHONE)
    oldest = pane.new_thread()
    for _ in range(11):  # newer threads push it down, out of the short list
        pane.new_thread()
    page.goto(f"{pane.url}/#thread={oldest}")
    expect(page.get_by_test_id("thread-id")).to_have_text(oldest, timeout=WAIT_MS)
    item = page.locator(f'[data-testid="thread-item"][data-thread-id="{oldest}"]')
    expect(item).to_have_attribute("aria-current", "true", timeout=WAIT_MS)
    expect(item).to_be_in_viewport(ratio=0.95)
    assert page.evaluate("window.scrollY") == 0  # the list scrolled, not the page
    snap(page, "phone-linked-thread")


def test_effect_tool_records_show_live_next_to_the_runs(
    tmp_path: Path, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTES_WORLD", str(tmp_path / "world.txt"))
    monkeypatch.delenv("NOTES_HANG_FILE", raising=False)
    with serve_pane(tmp_path, browser, ROOT / "tests" / "apps" / "effect_tools") as pane:
        page = pane.page
        tid = pane.new_thread()
        pane.open_thread(tid)
        records = page.get_by_test_id("records")
        expect(records.get_by_test_id("records-empty")).to_contain_text(
            "No effect-tool records", timeout=WAIT_MS
        )
        page.evaluate("window.__noReload = true")
        # A turn whose effect tool posts a note (the demo model calls post_note).
        res = pane.http.post(f"/api/threads/{tid}/messages",
                             json={"content": "post a note about release: Shipped 1.2"},
                             timeout=WAIT_MS / 1000)
        assert res.status_code == 200, res.text
        row = page.locator('[data-testid="record-row"][data-key="note:release"]')
        expect(row).to_have_attribute("data-status", "applied", timeout=WAIT_MS)
        expect(row.get_by_test_id("record-status")).to_have_text("applied")
        expect(row.get_by_test_id("record-result")).to_have_text('{"note":1,"reconciled":false}')
        expect(row).to_contain_text("post_note")
        expect(row.get_by_test_id("record-turn")).to_have_attribute("title", res.json()["runId"])
        expect(records.get_by_test_id("records-empty")).to_be_hidden()
        expect(records.get_by_test_id("records-count")).to_have_text("(1)")
        assert page.evaluate("window.__noReload") is True
        # After a reload of the page the record comes from GET .../effect-records.
        page.reload()
        expect(row).to_have_attribute("data-status", "applied", timeout=WAIT_MS)
        assert pane.errors == []


def test_pause_and_resume_a_thread_from_the_pane(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    pane.open_thread(tid)
    item = page.locator(f'[data-testid="thread-item"][data-thread-id="{tid}"]')
    button = page.get_by_test_id("pause-thread")
    expect(button).to_have_text("Pause", timeout=WAIT_MS)
    expect(page.get_by_test_id("thread-paused")).to_be_hidden()

    button.click()
    expect(button).to_have_text("Resume", timeout=WAIT_MS)
    expect(page.get_by_test_id("thread-paused")).to_be_visible()
    expect(page.get_by_test_id("paused-note")).to_contain_text("due runs stay pending")
    expect(item.get_by_test_id("thread-paused-tag")).to_be_visible()
    assert pane.http.get(f"/api/threads/{tid}").json()["paused"] is True

    # A run due now stays pending while paused, and the state survives a reload.
    due = pane.schedule(tid, "send_reminder", {"text": "after the pause"})
    expect(pane.row(due)).to_have_attribute("data-status", "pending", timeout=WAIT_MS)
    # Its row says why it waits (in the due or the "When" column, whichever is shown).
    paused_note = pane.row(due).locator('[data-testid="run-paused"]:visible')
    expect(paused_note).to_have_text("· paused")
    page.reload()
    expect(page.get_by_test_id("thread-paused")).to_be_visible(timeout=WAIT_MS)
    expect(item.get_by_test_id("thread-paused-tag")).to_be_visible(timeout=WAIT_MS)
    expect(paused_note).to_have_text("· paused", timeout=WAIT_MS)
    snap(page, "thread-paused")
    assert pane.http.get(f"/api/threads/{tid}/effects/{due}").json()["status"] == "pending"

    button.click()
    expect(button).to_have_text("Pause", timeout=WAIT_MS)
    expect(pane.row(due)).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(pane.row(due).get_by_test_id("run-paused")).to_have_count(0)
    expect(page.get_by_test_id("thread-paused")).to_be_hidden()
    expect(page.get_by_test_id("paused-note")).to_be_hidden()
    expect(item.get_by_test_id("thread-paused-tag")).to_have_count(0)
    assert pane.errors == []


def test_cancel_asks_first_naming_the_run_and_stops_a_running_one(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    pane.open_thread(tid)
    pending = pane.schedule(tid, "send_reminder", {"text": "later"}, delay=3600, key="daily")
    row = pane.row(pending)
    expect(row.get_by_test_id("run-key")).to_have_text("key daily", timeout=WAIT_MS)

    # Refused: nothing happens to the run.
    pane.refuse = True
    row.get_by_test_id("cancel").click()
    expect(row.get_by_test_id("cancel")).to_be_enabled(timeout=WAIT_MS)
    assert len(pane.dialogs) == 1
    question = pane.dialogs[0]
    run_at = pane.http.get(f"/api/threads/{tid}/effects/{pending}").json()["runAt"]
    shown_due = page.evaluate(
        "async (iso) => (await import('/web/format.js')).fmtLocal(iso, { full: true })", run_at
    )
    assert "send_reminder" in question and pending in question and shown_due in question
    expect(row).to_have_attribute("data-status", "pending")

    # A running async run offers Cancel too, and stops when it is confirmed.
    pane.refuse = False
    slow = pane.schedule(tid, "slow_task", {"seconds": 600})
    slow_row = pane.row(slow)
    expect(slow_row).to_have_attribute("data-status", "running", timeout=WAIT_MS)
    slow_row.get_by_test_id("cancel").click()
    expect(slow_row).to_have_attribute("data-status", "canceled", timeout=WAIT_MS)
    assert "slow_task" in pane.dialogs[-1] and slow in pane.dialogs[-1]
    slow_row.click()
    detail = page.get_by_test_id("run-detail")
    expect(detail.get_by_test_id("detail-canceled-by")).to_have_text("pane", timeout=WAIT_MS)
    pane.row(pending).click()
    expect(detail.get_by_test_id("detail-key")).to_have_text("daily", timeout=WAIT_MS)
    assert pane.errors == []


def test_a_run_waiting_behind_a_running_one_says_so(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    pane.open_thread(tid)
    slow = pane.schedule(tid, "slow_task", {"seconds": 600})
    expect(pane.row(slow)).to_have_attribute("data-status", "running", timeout=WAIT_MS)
    due = pane.schedule(tid, "send_reminder", {"text": "on time?"})
    row = pane.row(due)
    expect(row.get_by_test_id("run-waiting")).to_have_attribute(
        "data-waiting-for", slow, timeout=WAIT_MS
    )
    expect(row.get_by_test_id("run-waiting")).to_be_visible()
    # Run now cannot help: it is disabled, saying why; in the detail and in All runs too.
    run_now = row.get_by_test_id("run-now")
    expect(run_now).to_be_disabled()
    expect(run_now).to_have_attribute("title", re.compile(f"waiting for run {slow}"))
    row.click()
    detail = page.get_by_test_id("run-detail")
    expect(detail.get_by_test_id("detail-waiting")).to_contain_text(slow, timeout=WAIT_MS)
    expect(detail.get_by_test_id("run-now")).to_be_disabled()
    page.get_by_test_id("show-all-runs").click()
    in_all = all_row(pane, due)
    expect(in_all.get_by_test_id("run-waiting")).to_be_visible(timeout=WAIT_MS)
    expect(in_all.get_by_test_id("run-now")).to_be_disabled()
    expect(in_all.get_by_test_id("run-now")).to_have_attribute(
        "title", re.compile(f"waiting for run {slow}"))
    page.go_back()
    expect(page.get_by_test_id("run-detail")).to_have_attribute("data-run-id", due,
                                                                timeout=WAIT_MS)
    # Once the long run is stopped (from its detail), the waiting one runs; the line goes.
    pane.row(slow).click()
    expect(detail.get_by_test_id("detail-status")).to_have_text("running", timeout=WAIT_MS)
    detail.get_by_test_id("cancel").click()
    expect(row).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(row.get_by_test_id("run-waiting")).to_have_count(0)
    assert pane.errors == []


def test_the_conversation_shows_a_turns_state_and_results_from_the_journal(
    tmp_path: Path, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, hang, fail = tmp_path / "world.txt", tmp_path / "hang", tmp_path / "fail"
    monkeypatch.setenv("SHOP_WORLD", str(world))
    monkeypatch.setenv("SHOP_HANG_FILE", str(hang))
    monkeypatch.setenv("SHOP_FAIL_FILE", str(fail))
    with serve_pane(tmp_path, browser, ROOT / "tests" / "apps" / "durable_turns") as pane:
        page = pane.page
        tid = pane.http.post("/api/threads", json={"agent_id": "shop"}).json()["id"]
        pane.open_thread(tid)
        page.get_by_test_id("tab-conversation").click()
        expect(page.get_by_test_id("messages-empty")).to_contain_text("No messages yet",
                                                                      timeout=WAIT_MS)
        users = page.locator('[data-testid="message-item"][data-role="user"]')

        def post(content: str, run_id: str) -> httpx.Response:
            return pane.http.post(f"/api/threads/{tid}/messages",
                                  json={"content": content, "run_id": run_id},
                                  timeout=WAIT_MS / 1000)

        # A turn whose model fails after the charge: failed.
        fail.touch()
        assert post("charge order 42", "t1").status_code == 502
        state = users.nth(0).get_by_test_id("turn-state")
        expect(state).to_have_attribute("data-state", "failed", timeout=WAIT_MS)
        expect(state).to_have_text("failed")
        # Sent again under its run id once the model works: resumed, charged once.
        fail.unlink()
        assert post("charge order 42", "t1").status_code == 200
        expect(state).to_have_attribute("data-state", "resumed", timeout=WAIT_MS)
        expect(state).to_have_text("resumed")
        assert world.read_text().splitlines() == ["charged order 42"]

        # The same receipt asked twice in a turn: the second result came from the journal.
        assert post("send the receipt of order 5", "t2").status_code == 200
        results = page.get_by_test_id("tool-result").filter(has_text="send_receipt")
        expect(results).to_have_count(2, timeout=WAIT_MS)
        expect(results.nth(0)).to_have_attribute("data-from-journal", "false")
        expect(results.nth(1)).to_have_attribute("data-from-journal", "true")
        expect(results.nth(1).get_by_test_id("from-journal")).to_have_text("from journal")
        expect(page.get_by_test_id("from-journal")).to_have_count(1)
        assert world.read_text().splitlines() == ["charged order 42",
                                                  "receipt 5 to a@example.com"]

        # A turn that runs says so until it has answered.
        hang.touch()
        answered: list[int] = []
        sender = threading.Thread(target=lambda: answered.append(
            post("charge order 7", "t3").status_code))
        sender.start()
        running = users.nth(2).get_by_test_id("turn-state")
        expect(running).to_have_attribute("data-state", "running", timeout=WAIT_MS)
        hang.unlink()
        sender.join(WAIT_MS / 1000)
        assert answered == [200]
        expect(running).to_have_count(0, timeout=WAIT_MS)  # succeeded at once: no tag
        expect(state).to_have_text("resumed")


BIG_NOTE_TOOL = """
from pydantic import BaseModel
from runtime import define_effect_tool

class Note(BaseModel):
    topic: str
    text: str

async def post_note(state, args: Note) -> dict:
    return {"topic": args.topic, "body": args.text * 1000}  # a result over 2,000 characters

tool = define_effect_tool("Posts a long note.", Note, post_note)  # the default key
"""


def test_at_420px_a_record_shows_its_tool_and_key_end_and_a_tap_opens_it(
    tmp_path: Path, browser: Browser
) -> None:
    app = tmp_path / "app"
    (app / "tools").mkdir(parents=True)
    (app / "agents").mkdir()
    (app / "tools" / "post_note.py").write_text(BIG_NOTE_TOOL)
    (app / "agents" / "notes.py").write_text(
        "from runtime import define_agent\n\n"
        "agent = define_agent('notes', 'Post notes.', tools=['post_note'])\n"
    )
    with serve_pane(tmp_path, browser, app) as pane:
        check_phone_records(pane)


def check_phone_records(pane: Pane) -> None:
    page = pane.page
    page.set_viewport_size(PHONE)
    tid = pane.new_thread()
    pane.open_thread(tid)
    for topic in ("release", "launch"):
        res = pane.http.post(f"/api/threads/{tid}/messages",
                             json={"content": f"post a note about {topic}: done"},
                             timeout=WAIT_MS / 1000)
        assert res.status_code == 200, res.text
    listed = pane.http.get(f"/api/threads/{tid}/effect-records").json()["records"]
    assert len(listed) == 2 and all(r["resultTruncated"] for r in listed)
    rows = page.get_by_test_id("record-row")
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    for record in listed:
        key = record["key"]
        row = page.locator(f'[data-testid="record-row"][data-key="{key}"]')
        expect(row).to_have_attribute("data-status", "applied", timeout=WAIT_MS)
        tool = row.get_by_test_id("record-key-tool")
        expect(tool).to_be_visible()
        expect(tool).to_have_text("post_note")
        shown = row.get_by_test_id("record-key")
        expect(shown).to_be_visible()
        # The visible part of the key is its end: the text's right edge is inside the cell.
        tail_box = shown.locator("span").bounding_box()
        cell_box = shown.bounding_box()
        assert tail_box is not None and cell_box is not None
        assert tail_box["x"] + tail_box["width"] <= cell_box["x"] + cell_box["width"] + 1
        assert tail_box["x"] < cell_box["x"]  # cut on the left, not the right
        expect(shown).to_contain_text(key[-8:])
        expect(row.get_by_test_id("record-result")).to_contain_text('{"topic":')
    snap(page, "phone-records")

    key = listed[0]["key"]
    row = page.locator(f'[data-testid="record-row"][data-key="{key}"]')
    status_head = page.locator(".records-table th.col-rstatus")
    before = status_head.bounding_box()
    row.click()
    detail = page.locator(f'[data-testid="record-detail"][data-key="{key}"]')
    expect(detail).to_be_visible(timeout=WAIT_MS)
    expect(detail.get_by_test_id("record-detail-key")).to_have_text(key)
    expect(detail.get_by_test_id("record-detail-tool")).to_have_text("post_note")
    # The listing cut the result: the detail shows it in full, fetched by its key.
    expect(detail.get_by_test_id("record-detail-result")).to_contain_text(
        "done" * 1000, timeout=WAIT_MS)
    assert detail.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
    assert status_head.bounding_box() == before  # the open detail leaves the columns be
    snap(page, "phone-record-detail")
    row.click()
    expect(detail).to_have_count(0)
    assert pane.errors == []


def test_the_counts_never_stay_above_what_retention_keeps(
    tmp_path: Path, browser: Browser
) -> None:
    from runtime.config import RetentionPolicy

    with serve_pane(tmp_path, browser, ROOT / "agents",
                    retention=RetentionPolicy(max_finished=5)) as pane:
        page = pane.page
        tid = pane.new_thread()
        pane.open_thread(tid)
        page.evaluate("window.__noReload = true")
        ids = [pane.schedule(tid, "send_reminder", {"text": f"r{i}"}) for i in range(12)]
        deadline = time.monotonic() + WAIT_MS / 1000
        while True:  # every run finished (pruned ones are gone: 404)
            states = [pane.http.get(f"/api/threads/{tid}/effects/{i}") for i in ids]
            if all(r.status_code == 404 or r.json()["status"] == "completed" for r in states):
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        counts = pane.http.get(f"/api/threads/{tid}/effects").json()["counts"]
        assert counts["completed"] < 12  # retention pruned some: the frames said 12
        completed = page.get_by_test_id("filter-completed")
        expect(completed).to_have_attribute("data-count", str(counts["completed"]),
                                            timeout=WAIT_MS)
        assert page.evaluate("window.__noReload") is True  # synced without a reload
        assert pane.errors == []


def test_a_failed_turn_is_retried_under_its_run_id_and_its_error_is_on_screen(
    tmp_path: Path, browser: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    world, fail = tmp_path / "world.txt", tmp_path / "fail"
    monkeypatch.setenv("SHOP_WORLD", str(world))
    monkeypatch.delenv("SHOP_HANG_FILE", raising=False)
    monkeypatch.setenv("SHOP_FAIL_FILE", str(fail))
    with serve_pane(tmp_path, browser, ROOT / "tests" / "apps" / "durable_turns") as pane:
        page = pane.page
        page.set_viewport_size({"width": 1400, "height": 900})
        tid = pane.http.post("/api/threads", json={"agent_id": "shop"}).json()["id"]
        pane.open_thread(tid)
        page.get_by_test_id("tab-conversation").click()
        expect(page.get_by_test_id("messages-empty")).to_contain_text("No messages yet",
                                                                      timeout=WAIT_MS)
        users = page.locator('[data-testid="message-item"][data-role="user"]')
        turns = lambda: pane.http.get(f"/api/threads/{tid}/turns").json()["turns"]  # noqa: E731

        # The model fails after the charge: 502, the error under the composer, in view.
        fail.touch()
        page.get_by_test_id("composer-input").fill("charge order 42")
        page.get_by_test_id("composer-send").click()
        error = page.get_by_test_id("composer-error")
        expect(error).to_contain_text("turn_failed", timeout=WAIT_MS)
        expect(error).to_contain_text("finished tool calls are not repeated")
        expect(error).to_be_in_viewport(ratio=1)
        box = error.bounding_box()
        assert box is not None and box["y"] + box["height"] <= 900
        assert world.read_text().splitlines() == ["charged order 42"]
        state = users.nth(0).get_by_test_id("turn-state")
        expect(state).to_have_attribute("data-state", "failed", timeout=WAIT_MS)
        [first] = turns()
        assert first["status"] == "failed"

        # Retry on the failed turn's mark: the same run id, the charge is not repeated.
        retry = users.nth(0).get_by_test_id("turn-retry")
        expect(retry).to_be_visible()
        retry.click()
        expect(error).to_contain_text("turn_failed", timeout=WAIT_MS)  # the model still fails
        expect(page.get_by_test_id("composer-send")).to_be_enabled(timeout=WAIT_MS)
        assert [(t["runId"], t["status"], t["attempts"]) for t in turns()] == [
            (first["runId"], "failed", 2)]

        # The same text sent again from the composer retries it too; now the model works.
        fail.unlink()
        page.get_by_test_id("composer-input").fill("charge order 42")
        page.get_by_test_id("composer-send").click()
        expect(state).to_have_attribute("data-state", "resumed", timeout=WAIT_MS)
        expect(error).to_be_hidden()
        expect(users).to_have_count(1)
        expect(page.get_by_test_id("turn-retry")).to_have_count(0)
        assert [(t["runId"], t["status"], t["attempts"]) for t in turns()] == [
            (first["runId"], "succeeded", 3)]
        assert world.read_text().splitlines() == ["charged order 42"]
        assert [e for e in pane.errors if "502" not in e] == []


def test_recurring_schedules_show_live_and_pause_resume_cancel(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    digest = pane.http.post(f"/api/threads/{tid}/schedules", json={
        "name": "send_reminder", "args": {"text": "digest"}, "cron": "0 9 * * 1-5",
        "timezone": "Europe/Istanbul",
    }).json()
    pane.open_thread(tid)
    rows = page.get_by_test_id("schedule-row")
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    row = page.locator(f'[data-testid="schedule-row"][data-schedule-id="{digest["id"]}"]')
    expect(row.get_by_test_id("schedule-when")).to_have_text(
        "cron 0 9 * * 1-5 (Europe/Istanbul)")
    expect(row.get_by_test_id("schedule-state")).to_have_text("active")
    expect(row.get_by_test_id("schedule-next").locator("time")).to_have_attribute(
        "datetime", digest["nextFireAt"])

    # One made while the pane is open comes from its frame; its runs show its id.
    tick = pane.http.post(f"/api/threads/{tid}/schedules", json={
        "name": "send_reminder", "args": {"text": "tick"}, "every_seconds": 1,
    }).json()
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    tick_row = page.locator(f'[data-testid="schedule-row"][data-schedule-id="{tick["id"]}"]')
    expect(tick_row.get_by_test_id("schedule-when")).to_have_text("every 1s")
    tagged = page.locator('[data-testid="run-row"]').get_by_test_id("run-schedule")
    expect(tagged.first).to_have_attribute(
        "title", f"An occurrence of recurring schedule {tick['id']}", timeout=WAIT_MS)
    # The run row and the schedule row show one short form of the id, uncut.
    short = f"schedule …{tick['id'][-8:]}"
    expect(tagged.first).to_have_text(short)
    expect(tick_row.get_by_test_id("schedule-id")).to_have_text(short)
    assert tagged.first.evaluate("e => e.scrollWidth <= e.clientWidth + 1 || "
                                 "getComputedStyle(e).textOverflow !== 'ellipsis'")
    # Beside "next in …", the next fire time itself, local with its zone.
    expect(row.get_by_test_id("schedule-next-at")).to_have_text(page.evaluate(
        """iso => new Intl.DateTimeFormat(undefined, {year: "numeric", month: "short",
        day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
        timeZoneName: "short"}).format(new Date(iso))""", digest["nextFireAt"]))
    expect(tick_row.get_by_test_id("schedule-counts")).not_to_contain_text(
        "0 runs", timeout=WAIT_MS)
    expect(row.get_by_test_id("schedule-counts")).to_have_text("0 runs · 0 skipped")

    # Pause: no more runs; the row says so.
    page.set_viewport_size({"width": 1400, "height": 900})
    snap(page, "schedules-1400")
    tick_row.get_by_test_id("schedule-pause").click()
    expect(tick_row.get_by_test_id("schedule-state")).to_have_text("paused", timeout=WAIT_MS)
    page.set_viewport_size({"width": 420, "height": 900})
    snap(page, "schedules-420", full_page=True)
    expect(tick_row.get_by_test_id("schedule-next")).to_have_text("paused")
    made = pane.http.get(f"/api/threads/{tid}/schedules/{tick['id']}").json()
    assert made["state"] == "paused" and made["nextFireAt"] is None
    tick_row.get_by_test_id("schedule-resume").click()
    expect(tick_row.get_by_test_id("schedule-state")).to_have_text("active", timeout=WAIT_MS)

    # Cancel asks first, naming the effect and when it fires; refused, nothing changes.
    pane.refuse = True
    row.get_by_test_id("schedule-cancel").click()
    expect(row.get_by_test_id("schedule-cancel")).to_be_enabled(timeout=WAIT_MS)
    question = pane.dialogs[-1]
    assert "send_reminder" in question and "cron 0 9 * * 1-5 (Europe/Istanbul)" in question
    assert digest["id"] in question
    expect(rows).to_have_count(2)
    pane.refuse = False
    row.get_by_test_id("schedule-cancel").click()
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    listed = pane.http.get(f"/api/threads/{tid}/schedules").json()["schedules"]
    assert [s["id"] for s in listed] == [tick["id"]]
    tick_row.get_by_test_id("schedule-cancel").click()
    expect(page.get_by_test_id("schedules")).to_be_hidden(timeout=WAIT_MS)
    assert pane.errors == []


def all_row(pane: Pane, run_id: str) -> Any:
    return pane.page.locator(f'[data-testid="all-run-row"][data-run-id="{run_id}"]')


def chip_count(pane: Pane, status: str) -> Any:
    return pane.page.get_by_test_id(f"all-filter-{status}")


def wait_for_dialog(pane: Pane, asked: int) -> None:
    """Wait until the page asked more than ``asked`` questions (a `confirm()`), up to WAIT_MS."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while len(pane.dialogs) <= asked:
        assert time.monotonic() < deadline, f"no question after {asked}: {pane.dialogs}"
        pane.page.wait_for_timeout(50)


def test_all_runs_filters_updates_live_and_cancels_in_bulk(pane: Pane) -> None:
    page = pane.page
    t1, t2, t3 = pane.new_thread(user_id="ann"), pane.new_thread(), pane.new_thread()
    t3_created = time.monotonic()
    mine = [pane.schedule(t1, "send_reminder", {"text": f"r{i}"}, delay=3600) for i in range(2)]
    theirs = pane.schedule(t2, "send_reminder", {"text": "other"}, delay=3600)
    failed = pane.schedule(t2, "fail_on_purpose", {})
    page.set_viewport_size(WIDE)
    page.goto(f"{pane.url}/")
    page.get_by_test_id("show-all-runs").click()
    expect(page).to_have_url(f"{pane.url}/#all-runs", timeout=WAIT_MS)
    expect(page.get_by_test_id("show-all-runs")).to_have_attribute("aria-current", "page")
    expect(all_row(pane, failed)).to_have_attribute("data-status", "failed", timeout=WAIT_MS)
    expect(page.get_by_test_id("all-run-row")).to_have_count(4)
    expect(chip_count(pane, "pending")).to_have_attribute("data-count", "3")
    expect(chip_count(pane, "failed")).to_have_attribute("data-count", "1")
    expect(all_row(pane, theirs).get_by_test_id("run-thread")).to_have_attribute(
        "aria-label", f"Open thread {t2}"
    )

    # By status: the chip shows only those rows; by name: the counts follow the filter.
    chip_count(pane, "failed").click()
    expect(page.get_by_test_id("all-run-row")).to_have_count(1)
    expect(all_row(pane, failed)).to_be_visible()
    expect(page).to_have_url(f"{pane.url}/#all-runs?status=failed")
    page.get_by_test_id("all-name").fill("  send_reminder ")  # spaces are trimmed away
    page.get_by_test_id("all-apply").click()
    expect(chip_count(pane, "failed")).to_have_attribute("data-count", "0", timeout=WAIT_MS)
    expect(page.get_by_test_id("all-name")).to_have_value("send_reminder")
    # The filters are in the URL: a reload (or a shared link) shows the same list.
    expect(page).to_have_url(f"{pane.url}/#all-runs?status=failed&name=send_reminder")
    page.reload()
    expect(page.get_by_test_id("all-name")).to_have_value("send_reminder", timeout=WAIT_MS)
    expect(chip_count(pane, "failed")).to_have_attribute("aria-pressed", "true")
    expect(chip_count(pane, "pending")).to_have_attribute("data-count", "3", timeout=WAIT_MS)
    expect(page.get_by_test_id("all-run-row")).to_have_count(0)
    chip_count(pane, "all").click()
    expect(page.get_by_test_id("all-run-row")).to_have_count(3, timeout=WAIT_MS)
    expect(chip_count(pane, "all")).to_have_attribute("data-count", "3")

    # Live, from another thread: a new run appears; one that runs and finishes changes.
    # The thread list follows the stream too: the thread moves up, "active" now.
    items = page.get_by_test_id("thread-item")
    expect(items.first).not_to_have_attribute("data-thread-id", t3)
    expect(page.locator(f'[data-testid="thread-item"][data-thread-id="{t3}"]')).to_contain_text(
        "created"
    )
    # The list says "active" for activity at least 1 s after creation (web/threads.js).
    time.sleep(max(0.0, t3_created + 1.2 - time.monotonic()))
    later = pane.schedule(t3, "send_reminder", {"text": "live"}, delay=3600)
    expect(all_row(pane, later)).to_have_attribute("data-status", "pending", timeout=WAIT_MS)
    expect(items.first).to_have_attribute("data-thread-id", t3, timeout=WAIT_MS)
    expect(items.first).to_contain_text("active", timeout=WAIT_MS)
    expect(chip_count(pane, "pending")).to_have_attribute("data-count", "4", timeout=WAIT_MS)
    assert pane.http.post(f"/api/threads/{t3}/effects/{later}/run").status_code == 200
    expect(all_row(pane, later)).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    expect(chip_count(pane, "completed")).to_have_attribute("data-count", "1", timeout=WAIT_MS)
    # Another name: the filtered list ignores it (the marker after it comes in its wake).
    ignored = pane.schedule(t3, "fail_on_purpose", {})
    marker = pane.schedule(t3, "send_reminder", {"text": "marker"}, delay=3600)
    expect(all_row(pane, marker)).to_have_attribute("data-status", "pending", timeout=WAIT_MS)
    expect(all_row(pane, ignored)).to_have_count(0)
    expect(chip_count(pane, "pending")).to_have_attribute("data-count", "4")
    expect(chip_count(pane, "failed")).to_have_attribute("data-count", "0")
    snap(page, "all-runs-1400")
    page.set_viewport_size(PHONE)
    snap(page, "all-runs-420")
    page.set_viewport_size(WIDE)

    # Bulk cancel acts on what the fields show, applied first (a user typed, no Apply):
    # the question names the server's count and every filter.
    page.get_by_test_id("all-user").fill(" ann ")
    page.get_by_test_id("all-since").fill("2020-01-01T00:00:00")
    pane.refuse = True
    asked = len(pane.dialogs)
    page.get_by_test_id("all-cancel-pending").click()
    # The question comes after the count is fetched: wait for it, not for the button.
    wait_for_dialog(pane, asked)
    expect(page.get_by_test_id("all-cancel-pending")).to_be_enabled(timeout=WAIT_MS)
    assert pane.dialogs[-1].startswith(
        "Cancel all 2 pending runs named send_reminder, of user ann, due from "
    )
    # The time in the question says its zone (the browser's: UTC here).
    assert re.search(r"due from Jan 1, 2020, 12:00:00\sAM UTC\?", pane.dialogs[-1]), (
        pane.dialogs[-1])
    expect(page).to_have_url(re.compile(re.escape(
        f"{pane.url}/#all-runs?name=send_reminder&user=ann&since=")))
    page.get_by_test_id("all-since").fill("")
    expect(page.get_by_test_id("all-user")).to_have_value("ann")
    expect(all_row(pane, theirs)).to_have_count(0, timeout=WAIT_MS)  # not ann's
    expect(all_row(pane, mine[0])).to_have_attribute("data-status", "pending")
    pane.refuse = False
    page.get_by_test_id("all-user").fill("")
    page.get_by_test_id("all-cancel-pending").click()
    expect(page.get_by_test_id("all-notice")).to_have_text(re.compile("Canceled 4 runs."),
                                                           timeout=WAIT_MS)
    for tid, run_id in [(t1, mine[0]), (t1, mine[1]), (t2, theirs), (t3, marker)]:
        expect(all_row(pane, run_id)).to_have_attribute("data-status", "canceled", timeout=WAIT_MS)
        body = pane.http.get(f"/api/threads/{tid}/effects/{run_id}")
        assert body.json()["status"] == "canceled"
    expect(chip_count(pane, "canceled")).to_have_attribute("data-count", "4")
    expect(chip_count(pane, "pending")).to_have_attribute("data-count", "0")
    expect(page.get_by_test_id("all-cancel-pending")).to_be_disabled()
    assert len(pane.dialogs) == 2

    # Without filters: replay every failed run, after a question with their number.
    page.get_by_test_id("all-clear").click()
    expect(chip_count(pane, "failed")).to_have_attribute("data-count", "2", timeout=WAIT_MS)
    expect(all_row(pane, ignored)).to_have_attribute("data-status", "failed")
    page.get_by_test_id("all-replay-failed").click()
    expect(page.get_by_test_id("all-notice")).to_have_text(re.compile("Replayed 2 failed runs."),
                                                           timeout=WAIT_MS)
    assert pane.dialogs[-1].startswith(
        "Replay all 2 failed runs of every thread (no filter) not replayed yet? Each replay"
    )
    replays = pane.http.get("/api/runs", params={"name": "fail_on_purpose"}).json()["runs"]
    assert sorted(r["replayOf"] or "" for r in replays) == sorted(["", "", failed, ignored])
    # The replays fail too. Pressed again, it replays those two, not the originals again.
    expect(chip_count(pane, "failed")).to_have_attribute("data-count", "4", timeout=WAIT_MS)
    page.get_by_test_id("all-notice").get_by_role("button", name="Dismiss").click()
    page.get_by_test_id("all-replay-failed").click()
    expect(page.get_by_test_id("all-notice")).to_have_text(re.compile("Replayed 2 failed runs."),
                                                           timeout=WAIT_MS)
    assert pane.dialogs[-1].startswith("Replay all 2 failed runs of every thread (no filter)")

    # A thread deleted elsewhere: its rows go, and the counts follow.
    expect(all_row(pane, later)).to_have_attribute("data-status", "completed")
    assert pane.http.delete(f"/api/threads/{t3}").status_code == 200
    for run_id in (later, ignored, marker):
        expect(all_row(pane, run_id)).to_have_count(0, timeout=WAIT_MS)
    expect(page.locator(f'[data-testid="thread-item"][data-thread-id="{t3}"]')).to_have_count(0)
    expect(chip_count(pane, "completed")).to_have_attribute("data-count", "0", timeout=WAIT_MS)
    expect(chip_count(pane, "canceled")).to_have_attribute("data-count", "3", timeout=WAIT_MS)

    # Selecting a run opens its thread with the run's detail; the URL keeps the run, so a
    # reload shows the detail again.
    all_row(pane, theirs).click()
    expect(page).to_have_url(f"{pane.url}/#thread={t2}&run={theirs}", timeout=WAIT_MS)
    expect(page.get_by_test_id("run-detail")).to_have_attribute("data-run-id", theirs)
    expect(page.get_by_test_id("detail-status")).to_have_text("canceled", timeout=WAIT_MS)
    expect(page.get_by_test_id("all-runs")).to_be_hidden()
    page.reload()
    expect(page.get_by_test_id("run-detail")).to_have_attribute("data-run-id", theirs,
                                                                timeout=WAIT_MS)
    expect(page.get_by_test_id("detail-status")).to_have_text("canceled", timeout=WAIT_MS)
    page.get_by_test_id("detail-close").click()
    expect(page).to_have_url(f"{pane.url}/#thread={t2}")
    assert pane.errors == []


def test_a_runs_detail_lists_each_attempt(tmp_path: Path, browser: Browser) -> None:
    # The first server stops while the run works: that attempt is interrupted and the
    # run goes back to pending; the next server runs it again (attempt 2).
    with serve_pane(tmp_path, browser, ROOT / "agents") as first:
        tid = first.new_thread(user_id="ann")
        run_id = first.schedule(tid, "slow_task", {"seconds": 600})
        deadline = time.monotonic() + 30
        run_url = f"/api/threads/{tid}/effects/{run_id}"
        while first.http.get(run_url).json()["status"] != "running":
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
    with serve_pane(tmp_path, browser, ROOT / "agents") as pane:
        page = pane.page
        page.set_viewport_size(WIDE)
        deadline = time.monotonic() + 30
        while pane.http.get(run_url).json()["attempts"] < 2:
            assert time.monotonic() < deadline, "the run never ran again"
            time.sleep(0.05)
        page.goto(f"{pane.url}/#all-runs")
        all_row(pane, run_id).click()  # All runs opens the thread view's detail
        expect(page.get_by_test_id("run-detail")).to_have_attribute("data-run-id", run_id,
                                                                    timeout=WAIT_MS)
        rows = page.get_by_test_id("attempt-row")
        expect(rows).to_have_count(2, timeout=WAIT_MS)
        expect(rows.nth(0)).to_have_attribute("data-outcome", "interrupted")
        expect(rows.nth(0)).to_contain_text("Attempt 1")
        expect(rows.nth(0).get_by_test_id("attempt-outcome")).to_contain_text("interrupted")
        # Why, as the server recorded it: this node's shutdown, not a generic guess.
        expect(rows.nth(0).get_by_test_id("attempt-reason")).to_have_text(
            re.compile(r"^Interrupted: node \S+ shut down before it ended$"))
        expect(rows.nth(0)).not_to_contain_text("ended —")  # it has ended
        expect(rows.nth(1)).to_have_attribute("data-outcome", "running")
        expect(rows.nth(1)).to_contain_text("ended —")  # still running
        # Canceled while it runs: the detail asks for the attempts again.
        res = pane.http.post(f"/api/threads/{tid}/effects/{run_id}/cancel", json={"by": "t"})
        assert res.status_code == 200, res.text
        expect(page.get_by_test_id("detail-status")).to_have_text("canceled", timeout=WAIT_MS)
        expect(rows.nth(1)).not_to_have_attribute("data-outcome", "running", timeout=WAIT_MS)
        expect(rows.nth(1)).not_to_contain_text("ended —")
        snap(page, "run-detail-attempts-1400")
        assert pane.errors == []


def test_schedules_of_a_paused_thread_say_held_never_next_ago(pane: Pane) -> None:
    page = pane.page
    tid = pane.new_thread()
    assert pane.http.post(f"/api/threads/{tid}/pause").status_code == 200
    tick = pane.http.post(f"/api/threads/{tid}/schedules", json={
        "name": "send_reminder", "args": {"text": "tick"}, "every_seconds": 1,
    }).json()
    long = pane.http.post(f"/api/threads/{tid}/schedules", json={
        "name": "send_reminder", "args": {"text": "rare"}, "every_seconds": 90061,
    }).json()
    # The paused thread does not fire: tick's next fire time passes and stays.
    deadline = time.monotonic() + 10
    while datetime.fromisoformat(tick["nextFireAt"].replace("Z", "+00:00")) >= datetime.now(UTC):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    pane.open_thread(tid)
    tick_row = page.locator(f'[data-testid="schedule-row"][data-schedule-id="{tick["id"]}"]')
    long_row = page.locator(f'[data-testid="schedule-row"][data-schedule-id="{long["id"]}"]')
    expect(tick_row.get_by_test_id("schedule-next")).to_have_text(
        "due · held: thread paused", timeout=WAIT_MS)
    expect(tick_row.get_by_test_id("schedule-next")).not_to_contain_text("ago")
    expect(long_row.get_by_test_id("schedule-next")).to_contain_text("· thread paused")
    # Each row names its schedule by the short id its runs show; periods keep seconds.
    expect(tick_row.get_by_test_id("schedule-id")).to_have_text(f"schedule …{tick['id'][-8:]}")
    expect(long_row.get_by_test_id("schedule-when")).to_have_text("every 25h 1m 1s")
    # Resumed: the thread fires and the rows no longer say it is paused.
    page.get_by_test_id("pause-thread").click()
    expect(long_row.get_by_test_id("schedule-next")).not_to_contain_text(
        "paused", timeout=WAIT_MS)
    expect(tick_row.get_by_test_id("schedule-counts")).not_to_contain_text(
        "0 runs", timeout=WAIT_MS)
    assert pane.errors == []
