"""Frames fanned out to many WebSocket clients of one thread, beside the same runs without clients.

    .venv/bin/python bench/bench_fanout.py [--clients 200] [--runs 2000]
                                           [--synchronous FULL] [--repeat 1] [--json]
                                           [--client websockets|raw] [--source TREE]

A real server (uvicorn + `runtime.http.create_app` with the no-op app of ``bench/app``)
runs in a child process; this process is the clients (the ``websockets`` library), so the
clients' own parsing does not share the server's CPU. In the child, one caller schedules
``--runs`` no-op runs on one thread, due at once, one after another, and waits until all
ran; the runs/s figure is runs / (first schedule call → `wait_idle` returns). That is done
once with no client connected and once with ``--clients`` clients on the thread's stream,
each in a fresh child. Each run sends three frames (scheduled, started, completed); a
client must receive all of them or be closed with 1013 (too slow). Delivered frames/s is
every client's frames / (first schedule call → the last client has its last frame).

Prints one Markdown table (or one JSON line with ``--json``): runs/s with and without
clients, their ratio (issue 14, target 5: ≥ 0.8), delivered frames/s (goal ≥ 20,000/s),
how many clients got every frame, how many were closed with 1013, whether every
client that got every frame got the same bytes, the server's CPU per run and the clients'
(this process's CPU while they receive: on a 2-core machine it competes with the server),
and the latency of reads of the busy thread while its runs run (``GET
/api/threads/{tid}/effects?limit=5`` every 0.2 s from a process of its own, not from the
clients' process, whose event loop lags by seconds while it parses the frames) with
``--reads``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _args import positive_int, source_tree  # bench/_args.py: bench/ is on the path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT  # the tree whose runtime serves (--source)
CLIENT = "websockets"  # --client
READS = False  # --reads
FRAMES_PER_RUN = 3  # scheduled, started, completed
GUARD_SECONDS = 600.0
PROBE_INTERVAL_SECONDS = 0.2
"""The read prober's pause between two reads (as issue 14's tester polled)."""


async def _serve(runs: int, synchronous: str) -> None:
    """The child: serve, print ``{"port", "tid"}``, wait for a line on stdin, run, report."""
    import uvicorn

    from runtime import Runtime
    from runtime.http import create_app, server_options

    with tempfile.TemporaryDirectory() as data_dir:
        app = create_app(
            data_dir=data_dir, app_dir=ROOT / "bench" / "app", web_dir=None,
            load_packages=False, synchronous=synchronous, freeze_gc=True,
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(
            app, lifespan="on", log_config=None, log_level="warning", **server_options()
        )
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:  # noqa: ASYNC110 (uvicorn offers no event)
            await asyncio.sleep(0.01)
        rt: Runtime = app.state.runtime
        thread = await rt.create_thread()
        print(json.dumps({"port": sock.getsockname()[1], "tid": thread.thread_id}), flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline)  # the clients are connected
        gc.collect()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        now = time.time()
        for _ in range(runs):
            await thread.schedule_effect("noop", {"due": now}, delay=0)
        await rt.wait_idle(GUARD_SECONDS)
        cpu1, wall1 = time.process_time(), time.perf_counter()
        print(json.dumps({
            "runs_per_second": runs / (wall1 - wall0),
            "cpu_us_per_run": (cpu1 - cpu0) * 1e6 / runs,
        }), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # the clients are done
        server.should_exit = True
        await serving


async def _client(url: str, expected: int, ready: asyncio.Event) -> dict[str, Any]:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    got, crc, last = 0, 0, 0.0
    code: int | None = None
    async with connect(url, ping_interval=None, max_queue=None, compression=None) as ws:
        ready.set()
        try:
            while got < expected:
                raw = await ws.recv(decode=False)
                crc = zlib.crc32(raw, crc)
                got += 1
                last = time.perf_counter()
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
    return {"frames": got, "crc": crc, "last": last, "code": code}


async def _raw_client(url: str, expected: int, ready: asyncio.Event) -> dict[str, Any]:
    """`_client` on a bare socket: the handshake, then the server's frames parsed by hand.

    A server's frames are unmasked, so a client only walks their headers: about a
    microsecond of this process's CPU per message instead of the ``websockets`` library's
    several, which on a 2-core machine the server would otherwise share.
    """
    rest = url.removeprefix("ws://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"handshake refused: {head[:80]!r}")
    ready.set()
    got, crc, last = 0, 0, 0.0
    code: int | None = None
    buf = bytearray()
    crc32 = zlib.crc32
    while got < expected and code is None:
        chunk = await reader.read(1 << 18)
        if not chunk:
            break
        buf += chunk
        view = memoryview(buf)
        i, size, before = 0, len(buf), got
        while size - i >= 2:
            opcode, n, h = buf[i] & 0x0F, buf[i + 1] & 0x7F, 2
            if n == 126:
                if size - i < 4:
                    break
                n, h = int.from_bytes(buf[i + 2:i + 4], "big"), 4
            elif n == 127:
                if size - i < 10:
                    break
                n, h = int.from_bytes(buf[i + 2:i + 10], "big"), 10
            if size - i < h + n:
                break
            if opcode == 1:
                crc = crc32(view[i + h:i + h + n], crc)
                got += 1
            elif opcode == 8:
                code = int.from_bytes(buf[i + h:i + h + 2], "big") if n >= 2 else 1005
                break
            i += h + n
        view.release()
        del buf[:i]
        if got > before:
            last = time.perf_counter()
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return {"frames": got, "crc": crc, "last": last, "code": code}


def _probe(port: int, path: str) -> None:
    """The read prober (a process of its own): ``GET path`` every `PROBE_INTERVAL_SECONDS`.

    Reads once, prints ``ready``, reads until a line comes on stdin, then prints
    ``{"reads": [seconds, ...]}``: each read's latency (request sent → body read, one
    keep-alive connection). It is a process of its own because the clients' process is
    saturated while it parses the frames (its event loop lags by seconds): a read timed
    there measures the clients, not the server.
    """
    import http.client
    import threading

    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=GUARD_SECONDS)
    latencies: list[float] = []
    while True:
        start = time.perf_counter()
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path} answered {response.status}")
        latencies.append(time.perf_counter() - start)
        if len(latencies) == 1:
            print("ready", flush=True)  # the first read answered: the runs may start
        if stop.wait(PROBE_INTERVAL_SECONDS):
            break
    conn.close()
    print(json.dumps({"reads": latencies}), flush=True)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


async def _one(clients: int, runs: int, synchronous: str) -> dict[str, Any]:
    if READS:
        return await _one_probed(clients, runs, synchronous)
    return await _one_unprobed(clients, runs, synchronous, None)


async def _one_probed(clients: int, runs: int, synchronous: str) -> dict[str, Any]:
    """`_one_unprobed` with the read prober reading the busy thread meanwhile."""
    async def start_prober(port: int, tid: str) -> asyncio.subprocess.Process:
        prober = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--probe", str(port),
            f"/api/threads/{tid}/effects?limit=5",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        assert prober.stdout is not None
        await prober.stdout.readline()  # "ready"
        return prober

    return await _one_unprobed(clients, runs, synchronous, start_prober)


async def _one_unprobed(
    clients: int, runs: int, synchronous: str,
    start_prober: Callable[[int, str], Awaitable[asyncio.subprocess.Process]] | None,
) -> dict[str, Any]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", "--runs", str(runs),
        "--synchronous", synchronous,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=SOURCE,
        env={**os.environ, "PYTHONPATH": str(SOURCE)},
    )
    assert child.stdin is not None and child.stdout is not None
    hello = json.loads(await child.stdout.readline())
    url = f"ws://127.0.0.1:{hello['port']}/api/threads/{hello['tid']}/stream"
    expected = FRAMES_PER_RUN * runs
    readies = [asyncio.Event() for _ in range(clients)]
    client = _raw_client if CLIENT == "raw" else _client
    tasks = [asyncio.create_task(client(url, expected, r)) for r in readies]
    for r in readies:
        await r.wait()
    prober = (await start_prober(hello["port"], hello["tid"])
              if start_prober is not None else None)
    start = time.perf_counter()
    cpu0 = time.process_time()
    child.stdin.write(b"go\n")
    await child.stdin.drain()
    result = json.loads(await child.stdout.readline())
    if prober is not None:
        assert prober.stdin is not None and prober.stdout is not None
        prober.stdin.write(b"stop\n")
        await prober.stdin.drain()
        reads = json.loads(await prober.stdout.readline())["reads"]
        await prober.wait()
        result.update(
            reads=len(reads), read_p50_ms=_quantile(reads, 0.5) * 1000,
            read_p99_ms=_quantile(reads, 0.99) * 1000,
            read_max_ms=max(reads, default=0.0) * 1000,
        )
    async with asyncio.timeout(GUARD_SECONDS):
        got = await asyncio.gather(*tasks)
    clients_cpu = time.process_time() - cpu0
    child.stdin.write(b"done\n")
    await child.stdin.drain()
    await child.wait()
    complete = [g for g in got if g["frames"] == expected]
    delivered = sum(g["frames"] for g in got)
    if got:
        end = max(g["last"] for g in got)
        result["frames_per_second"] = delivered / (end - start) if end > start else 0.0
    result.update(
        clients=clients,
        complete=len(complete),
        closed_1013=sum(1 for g in got if g["code"] == 1013 and g["frames"] < expected),
        other=sum(1 for g in got if g["frames"] < expected and g["code"] != 1013),
        identical=len({g["crc"] for g in complete}) <= 1,
        delivered=delivered,
        clients_cpu_us_per_run=clients_cpu * 1e6 / runs,
    )
    return result


async def measure(clients: int, runs: int, synchronous: str, repeat: int) -> dict[str, Any]:
    """Run the pair ``repeat`` times (without, then with clients); medians of each figure."""
    pairs = []
    for i in range(repeat):
        print(f"[{i + 1}/{repeat}] {runs} runs, no client", file=sys.stderr)
        alone = await _one(0, runs, synchronous)
        print(f"[{i + 1}/{repeat}] {runs} runs, {clients} clients", file=sys.stderr)
        fanned = await _one(clients, runs, synchronous)
        pairs.append((alone, fanned))

    def med(values: list[float]) -> float:
        return statistics.median(values)

    alone_rate = med([a["runs_per_second"] for a, _ in pairs])
    fanned_rate = med([f["runs_per_second"] for _, f in pairs])
    return {
        "synchronous": synchronous, "runs": runs, "clients": clients, "repeat": repeat,
        "client": CLIENT,
        "runs_per_second_alone": alone_rate,
        "runs_per_second_with_clients": fanned_rate,
        "ratio": med([f["runs_per_second"] / a["runs_per_second"] for a, f in pairs]),
        "cpu_us_per_run_alone": med([a["cpu_us_per_run"] for a, _ in pairs]),
        "cpu_us_per_run_with_clients": med([f["cpu_us_per_run"] for _, f in pairs]),
        "clients_cpu_us_per_run": med([f["clients_cpu_us_per_run"] for _, f in pairs]),
        "frames_per_second": med([f.get("frames_per_second", 0.0) for _, f in pairs]),
        "complete": min(f["complete"] for _, f in pairs),
        "closed_1013": max(f["closed_1013"] for _, f in pairs),
        "other": max(f["other"] for _, f in pairs),
        "identical": all(f["identical"] for _, f in pairs),
        "reads": None if not READS else {
            key: {
                "n": sum(r["reads"] for r in results),
                "p50_ms": med([r["read_p50_ms"] for r in results]),
                "p99_ms": med([r["read_p99_ms"] for r in results]),
                "max_ms": max(r["read_max_ms"] for r in results),
            }
            for key, results in (("alone", [a for a, _ in pairs]),
                                 ("with_clients", [f for _, f in pairs]))
        },
    }


def table(r: dict[str, Any]) -> str:
    """The Markdown table of `measure`'s result."""
    ok = r["ratio"] >= 0.8 and r["complete"] + r["closed_1013"] == r["clients"] and r["other"] == 0
    rows = [
        "| figure | value | target | result |",
        "|---|--:|---|---|",
        f"| runs/s, no client ({r['runs']} runs, one thread, {r['synchronous']}) "
        f"| {r['runs_per_second_alone']:,.0f} |  |  |",
        f"| runs/s, {r['clients']} clients ({r['client']}) "
        f"| {r['runs_per_second_with_clients']:,.0f} |  |  |",
        f"| ratio | {r['ratio']:.2f} | ≥ 0.80, every client every frame or 1013 "
        f"| {'PASS' if ok else 'MISS'} |",
        f"| delivered frames/s | {r['frames_per_second']:,.0f} | ≥ 20,000 "
        f"| {'PASS' if r['frames_per_second'] >= 20_000 else 'MISS'} |",
        f"| clients with every frame / closed 1013 / other | {r['complete']} / "
        f"{r['closed_1013']} / {r['other']} |  |  |",
        f"| every complete client got the same bytes | {'yes' if r['identical'] else 'NO'} "
        "|  |  |",
        f"| server CPU µs per run, no client / {r['clients']} clients "
        f"| {r['cpu_us_per_run_alone']:,.0f} / {r['cpu_us_per_run_with_clients']:,.0f} |  |  |",
        f"| the clients' process CPU µs per run (on the same cores) "
        f"| {r['clients_cpu_us_per_run']:,.0f} |  |  |",
    ]
    for key, what in (("alone", "no client"), ("with_clients", f"{r['clients']} clients")):
        if r["reads"] is None:
            break
        reads = r["reads"][key]
        rows.append(
            f"| reads while the runs run, {what}: GET …/effects?limit=5 every "
            f"{PROBE_INTERVAL_SECONDS:g} s from a process of its own, p50 / p99 / max ms "
            f"({reads['n']} reads) | {reads['p50_ms']:,.0f} / {reads['p99_ms']:,.0f} / "
            f"{reads['max_ms']:,.0f} | p99 < 1,000 "
            f"| {'PASS' if reads['p99_ms'] < 1000 else 'MISS'} |"
        )
    return "\n".join(rows)


def main() -> None:
    """Parse the options; serve (child) or measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=positive_int, default=200)
    parser.add_argument("--runs", type=positive_int, default=2000)
    parser.add_argument("--synchronous", choices=["FULL", "NORMAL"], default="FULL")
    parser.add_argument("--repeat", type=positive_int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--source", type=source_tree, default=ROOT,
                        help="the source tree whose runtime serves (A/B against a checkout)")
    parser.add_argument(
        "--client", choices=["websockets", "raw"], default="websockets",
        help="the clients: the websockets library, or a bare socket that only walks the "
        "frame headers (far less of the shared CPU)",
    )
    parser.add_argument(
        "--reads", action="store_true",
        help="also time reads of the busy thread while its runs run, from a process of its "
        "own (GET .../effects?limit=5 every 0.2 s); off by default, so that the runs/s "
        "figures stay comparable with earlier rounds (a read takes the thread store's "
        "lock, and first syncs outcomes a group commit left unsynced)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe", nargs=2, metavar=("PORT", "PATH"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.probe:
        _probe(int(opts.probe[0]), opts.probe[1])
        return
    global SOURCE, CLIENT, READS
    SOURCE = opts.source.resolve()
    CLIENT = opts.client
    READS = opts.reads
    if opts.serve:
        asyncio.run(_serve(opts.runs, opts.synchronous))
        return
    result = asyncio.run(measure(opts.clients, opts.runs, opts.synchronous, opts.repeat))
    print(json.dumps(result) if opts.json else table(result))


if __name__ == "__main__":
    main()
