"""The Effects pane in a real browser: Playwright driving Debian's chromium against a real
uvicorn server (in a thread) serving the demo app.

Waits below are Playwright's auto-waiting for a state to appear (with a generous upper
bound against hangs), never assertions about how long something took.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from playwright.sync_api import Browser, ConsoleMessage, Error, Page, expect, sync_playwright

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

    def new_thread(self) -> str:
        res = self.http.post("/api/threads", json={})
        assert res.status_code == 201, res.text
        tid: str = res.json()["id"]
        return tid

    def schedule(self, tid: str, name: str, args: Any = None, delay: float = 0) -> str:
        res = self.http.post(
            f"/api/threads/{tid}/effects",
            json={"name": name, "args": args, "delay_seconds": delay},
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
    app = create_app(
        data_dir=tmp_path / "data",
        app_dir=ROOT / "agents",
        web_dir=DEFAULT_WEB_DIR,
        load_packages=False,
        synchronous="NORMAL",
        shutdown_grace_seconds=0,
    )
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url) as http:
        context = browser.new_context()
        page = context.new_page()
        result = Pane(server.url, http, page)

        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error":
                result.errors.append(msg.text)

        page.on("pageerror", lambda exc: result.errors.append(str(exc)))
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
