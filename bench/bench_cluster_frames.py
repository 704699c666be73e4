"""The cost of a frame across nodes on PostgreSQL, beside a raw psycopg INSERT+COMMIT.

    .venv/bin/python bench/bench_cluster_frames.py [--frames 5000] [--threads 50]
        [--rate 500] [--url postgresql://postgres@127.0.0.1:5432/postgres] [--json]

Two runtimes ("nodes" A and B) share one fresh schema (two `PostgresBackend`s with node ids
``bench-a`` and ``bench-b``, each its own pool, node lease and listening connection, in
this process). A subscriber on B follows
each of ``--threads`` threads. Two phases:

- **Throughput.** A publishes ``--frames`` events (effect-record changes: small frames) as
  fast as its hub takes them, spread over the threads; the figure is frames / (first
  publish → B's subscribers have them all), frames numbered, stored, announced and
  delivered in ``seq`` order. Beside it, in the same run on the same server: a raw psycopg
  loop of one-row INSERT+COMMIT (autocommit) of the same shape into a scratch table, from
  one connection, and their ratio (how many baseline commits one frame costs).
- **Latency.** A publishes ``--frames`` events at ``--rate`` per second; each event's time
  from `ChangeHub` publish on A to its delivery to B's subscriber (p50, p99, max).

The schema is dropped afterwards. Progress on stderr, a Markdown table (or ``--json``) on
stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _args import positive_float, positive_int  # bench/_args.py: bench/ is on the path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _raw_baseline(url: str, schema: str, n: int) -> float:
    """One-row INSERT+COMMIT per statement from one connection: commits per second."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {schema}.raw_frames (thread_id VARCHAR NOT NULL, "
                     f"frame_seq BIGINT NOT NULL, kind VARCHAR NOT NULL, frame VARCHAR NOT "
                     f"NULL, created_at FLOAT NOT NULL, PRIMARY KEY (thread_id, frame_seq))")
        text = json.dumps({"type": "event", "eventType": "effect_record_changed",
                           "threadId": "t", "seq": 1, "data": {"key": "k" * 20}})
        start = time.perf_counter()
        for i in range(n):
            conn.execute(f"INSERT INTO {schema}.raw_frames VALUES (%s, %s, %s, %s, %s)",
                         (f"t{i % 50}", i, "effect_record_changed", text, time.time()))
        return n / (time.perf_counter() - start)


async def _run(url: str, frames: int, threads: int, rate: float) -> dict[str, Any]:
    from runtime import Runtime
    from runtime.events import RecordChange
    from runtime.storage.postgres import PostgresBackend

    schema = f"bench_frames_{secrets.token_hex(4)}"
    scoped = f"{url}{'&' if '?' in url else '?'}schema={schema}"
    results: dict[str, Any] = {"frames": frames, "threads": threads}
    with tempfile.TemporaryDirectory() as tmp:
        a = Runtime(data_dir=Path(tmp) / "a", load_packages=False, node_id="bench-a",
                    storage=PostgresBackend(scoped))
        b = Runtime(data_dir=Path(tmp) / "b", load_packages=False, node_id="bench-b",
                    storage=PostgresBackend(scoped))
        await a.start()
        await b.start()
        try:
            assert b.cluster is not None
            await asyncio.to_thread(b.cluster.bus.flush, 30.0)
            tids = [f"bench{i}" for i in range(threads)]
            subs = [b.hub.subscribe(t) for t in tids]
            for s in subs:
                s.maxsize = frames + 10
            sent: dict[tuple[str, int], float] = {}
            got: list[float] = []

            async def drain(sub: Any, n: int) -> None:
                count = 0
                async for event in sub:
                    key = json.loads(event.frame_text())["data"]["key"]
                    got.append(time.perf_counter() - sent[(sub.thread_id, int(key))])
                    count += 1
                    if count == n:
                        return

            def publish(i: int) -> None:
                tid = tids[i % threads]
                sent[(tid, i)] = time.perf_counter()
                a.hub.publish_record(tid, RecordChange.CLAIMED, {"key": str(i)})

            # Throughput.
            per = [frames // threads + (1 if i < frames % threads else 0)
                   for i in range(threads)]
            readers = [asyncio.create_task(drain(s, n)) for s, n in zip(subs, per, strict=True)]
            print(f"throughput: {frames} frames over {threads} threads", file=sys.stderr)
            start = time.perf_counter()
            for i in range(frames):
                publish(i)
                if i % 200 == 0:
                    await asyncio.sleep(0)
            await asyncio.wait_for(asyncio.gather(*readers), 600)
            elapsed = time.perf_counter() - start
            results["frames_per_second"] = frames / elapsed
            results["throughput_p99_ms"] = sorted(got)[int(0.99 * (len(got) - 1))] * 1000
            # Latency at a steady rate.
            got.clear()
            sent.clear()
            readers = [asyncio.create_task(drain(s, n)) for s, n in zip(subs, per, strict=True)]
            print(f"latency: {frames} frames at {rate:g}/s", file=sys.stderr)
            start = time.perf_counter()
            for i in range(frames):
                publish(i)
                delay = start + (i + 1) / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await asyncio.wait_for(asyncio.gather(*readers), 600)
            lat = sorted(got)
            results["latency_p50_ms"] = statistics.median(lat) * 1000
            results["latency_p99_ms"] = lat[int(0.99 * (len(lat) - 1))] * 1000
            results["latency_max_ms"] = lat[-1] * 1000
            base, _, _ = scoped.partition("?")
            print("baseline: raw INSERT+COMMIT", file=sys.stderr)
            results["raw_commits_per_second"] = await asyncio.to_thread(
                _raw_baseline, base if "?" not in url else url.partition("?")[0], schema,
                frames)
            results["frame_cost_in_commits"] = (
                results["raw_commits_per_second"] / results["frames_per_second"])
        finally:
            await a.close()
            await b.close()
            import psycopg

            with psycopg.connect(url.partition("?")[0], autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return results


def main() -> None:
    """Parse the options, run both phases, print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--frames", type=positive_int, default=5000)
    p.add_argument("--threads", type=positive_int, default=50)
    p.add_argument("--rate", type=positive_float, default=500.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    r = asyncio.run(_run(args.url, args.frames, args.threads, args.rate))
    if args.json:
        print(json.dumps(r))
        return
    print("| measure | value |")
    print("|---|---|")
    print(f"| frames across nodes, throughput | {r['frames_per_second']:,.0f} frames/s "
          f"(p99 publish→delivery {r['throughput_p99_ms']:.0f} ms under that load) |")
    print(f"| raw psycopg INSERT+COMMIT, one connection | "
          f"{r['raw_commits_per_second']:,.0f} commits/s |")
    print(f"| one frame costs | {r['frame_cost_in_commits']:.2f} raw commits |")
    print(f"| latency at {args.rate:g} frames/s (A publish → B subscriber) | "
          f"p50 {r['latency_p50_ms']:.1f} ms, p99 {r['latency_p99_ms']:.1f} ms, "
          f"max {r['latency_max_ms']:.1f} ms |")


if __name__ == "__main__":
    main()
