"""What a database blink and an outage cost two real server processes on PostgreSQL.

    .venv/bin/python bench/bench_blink.py [--tree DIR] [--blinks 4] [--outage 23]
        [--port 18210] [--server postgresql://postgres@127.0.0.1:5432] [--json]

Starts two ``server.py`` nodes of ``--tree`` (a checkout; default this one), lease 6 s, on
a fresh database ``blink_bench_<random>`` (dropped at the end), ports ``--port`` and the
next, then measures, from node 1's HTTP API:

- **Blink** (``--blinks`` times, 4 s apart): the node's pool filled by concurrent calls,
  every connection of the database ended (``pg_terminate_backend``, the server stays up);
  then the seconds and status of a schedule (``POST .../effects``), a thread read and
  ``/api/ready``, one after another; and how long each node's listening connection
  (``application_name`` ``thread-effects-bus:...``) stayed away.
- **Cancel after a bus cut**: a 12 s run on node 1, node 1's listening connection ended,
  the run canceled through node 2 at once: its answer and seconds.
- **Outage** (``--outage`` s): the database closed (``ALLOW_CONNECTIONS false``, its
  sessions ended) while ``/api/ready`` is probed every 0.25 s: the slowest answer and when
  the first 503 came; then the database opened again: seconds until ``/api/ready`` is 200.

Progress on stderr, one Markdown row per figure (or ``--json``) on stdout. Run it on the
tree before and after a change alternately (the machine is shared; see README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from _args import nonnegative_float, positive_int  # bench/_args.py: bench/ is on the path

ROOT = Path(__file__).resolve().parent.parent

EFFECT = '''import asyncio
from pydantic import BaseModel
from runtime import ThreadState, define_effect

class Args(BaseModel):
    seconds: float = 0.01

async def work(state: ThreadState, args: Args) -> None:
    await asyncio.sleep(args.seconds)

effect = define_effect("Sleeps.", Args, work)
'''


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Cluster:
    """Two server processes of one tree on one fresh database."""

    def __init__(self, tree: Path, server: str, port: int, work: Path) -> None:
        self.tree, self.server, self.work = tree, server, work
        self.db = f"blink_bench_{secrets.token_hex(3)}"
        self.urls = [f"http://127.0.0.1:{port + i}" for i in range(2)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def sql(self, query: str, db: str = "postgres") -> list[tuple[Any, ...]]:
        with psycopg.connect(f"{self.server}/{db}", autocommit=True) as conn:
            cur = conn.execute(query)
            return cur.fetchall() if cur.description else []

    def start(self) -> None:
        self.sql(f"CREATE DATABASE {self.db}")
        app = self.work / "app" / "effects"
        app.mkdir(parents=True)
        (app / "work.py").write_text(EFFECT)
        for i, url in enumerate(self.urls):
            log = (self.work / f"node{i + 1}.log").open("wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, str(self.tree / "server.py"), "--app-dir",
                 str(self.work / "app"), "--database-url", f"{self.server}/{self.db}",
                 "--port", url.rsplit(":", 1)[1], "--node-id", f"node{i + 1}",
                 "--lease-seconds", "6", "--data-dir", str(self.work / f"d{i + 1}")],
                cwd=self.tree, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self) -> None:
        for proc in self.procs:
            with _suppress():
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            with _suppress():
                proc.wait(timeout=20)
        self.sql(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")

    def end_sessions(self, app_like: str = "%") -> int:
        rows = self.sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = "
            f"'{self.db}' AND pid <> pg_backend_pid() AND application_name LIKE '{app_like}'")
        return int(rows[0][0])

    def bus_count(self) -> int:
        rows = self.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        f"'{self.db}' AND application_name LIKE 'thread-effects-bus%'")
        return int(rows[0][0])


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


async def _timed(client: httpx.AsyncClient, method: str, url: str,
                 **kwargs: Any) -> tuple[int | str, float]:
    started = time.monotonic()
    try:
        status: int | str = (await client.request(method, url, **kwargs)).status_code
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    return status, time.monotonic() - started


async def _bus_back(cluster: Cluster) -> float:
    started = time.monotonic()
    await asyncio.sleep(0.02)
    while await asyncio.to_thread(cluster.bus_count) < 2:
        if time.monotonic() - started > 30:
            return float("inf")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def measure(cluster: Cluster, blinks: int, outage: float) -> dict[str, Any]:
    n1, n2 = cluster.urls
    out: dict[str, Any] = {"blink": [], "bus_back": []}
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(300):
            if (await _timed(client, "GET", f"{n1}/api/ready"))[0] == 200 and (
                    await _timed(client, "GET", f"{n2}/api/ready"))[0] == 200:
                break
            await asyncio.sleep(0.2)
        await client.post(f"{n1}/api/threads", json={"id": "bench"})
        for k in range(blinks):
            for _ in range(5):
                await asyncio.gather(*[client.get(f"{n1}/api/threads/bench")
                                       for _ in range(30)])
            await asyncio.to_thread(cluster.end_sessions)
            back = asyncio.create_task(_bus_back(cluster))
            await asyncio.sleep(0.2)
            row = [await _timed(client, "POST", f"{n1}/api/threads/bench/effects",
                                json={"name": "work", "args": {}}),
                   await _timed(client, "GET", f"{n1}/api/threads/bench"),
                   await _timed(client, "GET", f"{n1}/api/ready")]
            out["blink"].append(row)
            out["bus_back"].append(await back)
            _say(f"blink {k}: {row}, bus back after {out['bus_back'][-1]:.2f} s")
            await asyncio.sleep(4)
        run = (await client.post(f"{n1}/api/threads/bench/effects",
                                 json={"name": "work", "args": {"seconds": 12}})).json()["id"]
        for _ in range(100):
            got = (await client.get(f"{n1}/api/threads/bench/effects/{run}")).json()
            if got["status"] == "running":
                break
            await asyncio.sleep(0.1)
        await asyncio.to_thread(cluster.end_sessions, "thread-effects-bus%")
        started = time.monotonic()
        answer = (await client.post(f"{n2}/api/threads/bench/effects/{run}/cancel")).json()
        out["cancel"] = (answer.get("canceled"), time.monotonic() - started)
        _say(f"cancel after a bus cut: {out['cancel']}")
        await asyncio.sleep(1)
        cluster.sql(f"ALTER DATABASE {cluster.db} ALLOW_CONNECTIONS false")
        await asyncio.to_thread(cluster.end_sessions)
        t0 = time.monotonic()
        first_503, slowest = None, 0.0
        while time.monotonic() - t0 < outage:
            status, seconds = await _timed(client, "GET", f"{n1}/api/ready")
            slowest = max(slowest, seconds)
            if status == 503 and first_503 is None:
                first_503 = time.monotonic() - t0
            await asyncio.sleep(0.25)
        cluster.sql(f"ALTER DATABASE {cluster.db} ALLOW_CONNECTIONS true")
        t1 = time.monotonic()
        ready_again = float("inf")
        while time.monotonic() - t1 < 60:
            if (await _timed(client, "GET", f"{n1}/api/ready"))[0] == 200:
                ready_again = time.monotonic() - t1
                break
            await asyncio.sleep(0.1)
        out["outage"] = {"first_503": first_503, "slowest_ready": slowest,
                         "ready_again": ready_again}
        _say(f"outage: {out['outage']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--blinks", type=positive_int, default=4)
    parser.add_argument("--outage", type=nonnegative_float, default=23.0)
    parser.add_argument("--port", type=positive_int, default=18210)
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-blink-") as work:
        cluster = Cluster(args.tree.resolve(), args.server, args.port, Path(work))
        cluster.start()
        try:
            out = asyncio.run(measure(cluster, args.blinks, args.outage))
        finally:
            cluster.stop()
    out["load_average"] = os.getloadavg()
    if args.json:
        print(json.dumps(out))
        return
    worst = max(max(s for _, s in row) for row in out["blink"])
    statuses = sorted({str(st) for row in out["blink"] for st, _ in row})
    o = out["outage"]
    print("| figure | value |\n|---|---|")
    print(f"| slowest call after a blink (schedule, thread, ready) | {worst:.2f} s |")
    print(f"| statuses after a blink | {', '.join(statuses)} |")
    print(f"| bus back after each blink | "
          f"{', '.join(f'{x:.2f}' for x in out['bus_back'])} s |")
    print(f"| cancel through node 2 right after node 1's bus cut | "
          f"{out['cancel'][0]} in {out['cancel'][1]:.2f} s |")
    print(f"| outage: first 503 of /api/ready, slowest answer | "
          f"{o['first_503']:.2f} s, {o['slowest_ready']:.2f} s |")
    print(f"| /api/ready 200 after the database opened | {o['ready_again']:.2f} s |")
    print(f"| load average | {' '.join(f'{x:.1f}' for x in out['load_average'])} |")


if __name__ == "__main__":
    main()
