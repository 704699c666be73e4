"""The cost of a node's rounds on PostgreSQL with many threads: the dead-node look, the
removal of rows deleted threads left, and the resync read after the bus listens again.

Fills a fresh schema with ``--threads`` registered threads (their registry rows and store
meta, written directly in two statements), then times, ``--rounds`` times each:

- ``round``: one round of the dead-node look's storage calls (`mark_dead_nodes_gaps`,
  `orphaned_runs`) plus, where the tree has it, the look-up by id of 100 heard deletions
  (`discard_orphaned_threads(thread_ids=...)`);
- ``sweep``: the look at every thread's store (`discard_orphaned_threads()`), where the tree
  has it;
- ``resync``: the read of 1,000 threads' registry entries and pause marks
  (`RuntimeStore.paused_flags`), where the tree has it.

Run it from a tree's root (``cd /tmp/before && python /path/to/bench_orphans.py``) to
measure that tree: the first entry of ``sys.path`` is the current directory.

    .venv/bin/python bench/bench_orphans.py --database-url postgresql://postgres@127.0.0.1/db
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.getcwd())

from runtime.storage.postgres import PostgresBackend


def timed(fn: Callable[[], object], rounds: int) -> str:
    ms: list[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - start) * 1000)
    return (f"median {statistics.median(ms):.2f} ms (range {min(ms):.2f}-{max(ms):.2f}, "
            f"{rounds} rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--threads", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    schema = f"bench_orphans_{secrets.token_hex(4)}"
    sep = "&" if "?" in args.database_url else "?"
    backend = PostgresBackend(f"{args.database_url}{sep}schema={schema}", node_id="bench")
    store = backend.open()
    try:
        with backend.transaction() as c:
            c.execute("INSERT INTO threads (id, created_at, tags, last_activity_at) "
                      "SELECT 't' || g, 1e9, '[]', 1e9 FROM generate_series(1, %s) g",
                      (args.threads,))
            c.execute("INSERT INTO thread_meta (thread_id, key, value) SELECT 't' || g, k, "
                      "CASE WHEN k = 'created_at' THEN '1000000000.0' ELSE 't' || g END "
                      "FROM generate_series(1, %s) g, "
                      "unnest(ARRAY['thread_id', 'created_at']) k", (args.threads,))
            c.execute("ANALYZE threads")
            c.execute("ANALYZE thread_meta")
        heard = [f"t{i}" for i in range(1, args.threads + 1, max(1, args.threads // 100))]
        held = [f"t{i}" for i in range(1, min(args.threads, 1000) + 1)]
        has = hasattr(backend, "discard_orphaned_threads")

        def one_round() -> None:
            backend.mark_dead_nodes_gaps()
            backend.orphaned_runs()
            if has:
                backend.discard_orphaned_threads(time.time() - 60, thread_ids=heard[:100],
                                                 limit=100)

        print(f"tree {os.getcwd()} threads {args.threads} load {os.getloadavg()[0]:.2f}")
        print(f"  round  {timed(one_round, args.rounds)}")
        if has:
            sweep = timed(lambda: backend.discard_orphaned_threads(time.time() - 60),
                          max(3, args.rounds // 3))
            print(f"  sweep  {sweep}")
            print(f"  resync {timed(lambda: store.paused_flags(held), args.rounds)}")
        print(f"  load {os.getloadavg()[0]:.2f}")
    finally:
        with backend.transaction() as c:
            c.execute(f"DROP SCHEMA {schema} CASCADE")
        store.close()
        backend.close()


if __name__ == "__main__":
    main()
