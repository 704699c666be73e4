"""Several ``server.py`` processes (nodes) on one PostgreSQL schema, killed for real.

Each node is a real process with its own node id and a short lease (`LEASE_SECONDS`), all
on one fresh schema of this session's database. The effect (tests/apps/multinode) writes a
line to a file the nodes share when it starts and when it ends, so that "ran exactly
once" is counted from the effect's side, not only from the runs' statuses.

The loops below poll the API until a state appears (with a generous bound against hangs);
they never assert how long anything took.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from test_server_process import ROOT, ServerProcess
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from runtime.cluster import rank

pytestmark = pytest.mark.slow

APP = ROOT / "tests" / "apps" / "multinode"
LEASE_SECONDS = 3.0
"""The nodes' lease: a killed node's runs are re-queued by another node after this."""
NO_CLAIMS = ("--max-concurrent-runs", "0")
"""A node started with these serves the API but runs no runs."""
GUARD_SECONDS = 90.0


class Cluster:
    """Nodes on one PostgreSQL schema, each with its own data directory and log."""

    def __init__(self, tmp_path: Path, database_url: str) -> None:
        self.tmp_path = tmp_path
        self.database_url = database_url
        self.executions = tmp_path / "executions.jsonl"
        self.nodes: dict[str, ServerProcess] = {}

    def start(self, name: str, *args: str, database_url: str | None = None,
              lease_seconds: float = LEASE_SECONDS, app: Path = APP,
              **env: str) -> ServerProcess:
        data = self.tmp_path / name
        data.mkdir()
        server = ServerProcess(
            data, self.tmp_path / f"{name}.log", "--app-dir", str(app), "--no-packages",
            "--node-id", name, "--lease-seconds", f"{lease_seconds:g}", *args,
            THREAD_EFFECTS_DATABASE_URL=database_url or self.database_url,
            MULTINODE_LOG=str(self.executions), MULTINODE_NODE=name, **env,
        )
        self.nodes[name] = server
        return server.start()

    def stop(self) -> None:
        for server in self.nodes.values():
            server.stop()

    def read_executions(self) -> list[dict[str, Any]]:
        """The effect's lines, in the order they were written."""
        if not self.executions.exists():
            return []
        return [json.loads(line) for line in self.executions.read_text().splitlines()]

    def logs(self) -> str:
        return "\n".join(f"--- {name}:\n{server.output()}" for name, server in self.nodes.items())


@pytest.fixture
def cluster(tmp_path: Path, pg_url: str) -> Iterator[Cluster]:
    running = Cluster(tmp_path, pg_url)
    try:
        yield running
    finally:
        running.stop()


class FrameCollector:
    """A WebSocket client on one thread's stream, collecting frames in the background."""

    def __init__(self, server: ServerProcess, thread_id: str) -> None:
        self.url = f"ws://127.0.0.1:{server.port}/api/threads/{thread_id}/stream"
        self.frames: list[dict[str, Any]] = []
        self.closed: str | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> FrameCollector:
        self._thread.start()
        assert self._ready.wait(GUARD_SECONDS), "the stream did not open"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(GUARD_SECONDS)

    def _read(self) -> None:
        with ws_connect(self.url, origin=None, open_timeout=GUARD_SECONDS) as ws:
            self._ready.set()
            while not self._stop.is_set():
                try:
                    self.frames.append(json.loads(ws.recv(timeout=0.2)))
                except TimeoutError:
                    continue
                except ConnectionClosed as exc:
                    self.closed = repr(exc)
                    return


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def _ts(iso: str | None) -> float:
    assert iso is not None
    return datetime.fromisoformat(iso).timestamp()


def _wait_until_finished(nodes: list[ServerProcess], thread_ids: list[str],
                         deadline: float, cluster: Cluster) -> None:
    left = set(thread_ids)
    with httpx.Client(timeout=30) as client:
        while left:
            for k, tid in enumerate(sorted(left)):
                node = nodes[k % len(nodes)]
                res = client.get(f"{node.url}/api/threads/{tid}/effects")
                if res.status_code != 200:  # 503 while a node reconnects: asked again
                    continue
                counts = res.json()["counts"]
                if counts["pending"] == 0 and counts["running"] == 0:
                    left.discard(tid)
            if time.time() >= deadline:
                stuck = [
                    (tid, [(r["id"], r["status"], r["runAt"], r["attempts"])
                           for r in client.get(f"{nodes[0].url}/api/threads/{tid}/effects",
                                               params={"status": status}).json()["runs"]])
                    for tid in sorted(left)[:5] for status in ("running", "pending")
                ]
                raise AssertionError(f"{len(left)} threads still have runs pending or "
                                     f"running, e.g. {stuck}\n{cluster.logs()}")
            if left:
                time.sleep(0.5)


def test_three_nodes_one_killed_every_run_completes_once_in_due_order(
    cluster: Cluster,
) -> None:
    names = ["a", "b", "c"]
    nodes = [cluster.start(name) for name in names]
    killed = "c"
    survivors = [cluster.nodes["a"], cluster.nodes["b"]]
    threads = [f"t{k:03d}" for k in range(100)]
    with httpx.Client(timeout=30) as client:
        for k, tid in enumerate(threads):
            res = client.post(f"{nodes[k % 3].url}/api/threads", json={"id": tid})
            assert res.status_code == 201, res.text
    # Node health names the node.
    for name, node in zip(names, nodes, strict=True):
        assert httpx.get(f"{node.url}/api/health").json()["nodeId"] == name

    runs = 1000
    order = list(range(runs))
    random.Random(13).shuffle(order)
    base = time.time() + 8.0  # scheduling ends before the first run is due
    due = [base + 10.0 * order[i] / runs for i in range(runs)]
    run_ids: dict[int, str] = {}
    stored_by: dict[int, float] = {}  # when the scheduling call returned: committed by then

    def schedule_share(k: int) -> None:
        with httpx.Client(timeout=30) as client:
            for i in range(k, runs, 3):  # through node k, one after another
                res = client.post(
                    f"{nodes[k].url}/api/threads/{threads[i % 100]}/effects",
                    json={"name": "work", "args": {"item": i, "seconds": 0.2},
                          "run_at": _iso(due[i])},
                )
                assert res.status_code == 201, res.text
                stored_by[i] = time.time()
                run_ids[i] = res.json()["id"]

    watched = threads[0]
    with FrameCollector(survivors[0], watched) as stream:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(schedule_share, range(3)))
        assert len(run_ids) == runs
        # SIGKILL one node in the middle of the runs' due window.
        time.sleep(max(0.0, base + 5.0 - time.time()))
        assert cluster.nodes[killed].signal(signal.SIGKILL) == -signal.SIGKILL
        _wait_until_finished(survivors, threads, base + 10.0 + GUARD_SECONDS, cluster)
        time.sleep(1.0)  # the last frames are on their way
    assert stream.closed is None, stream.closed

    # Every run, read over HTTP from the surviving nodes.
    details: dict[int, dict[str, Any]] = {}
    with httpx.Client(timeout=30) as client:
        for i in range(runs):
            node = survivors[i % 2]
            res = client.get(f"{node.url}/api/threads/{threads[i % 100]}/effects/{run_ids[i]}")
            assert res.status_code == 200, res.text
            details[i] = res.json()

    # Every survivor's run index lists every run completed: a batch of index rows the
    # killed node lost (written after its runs' commits) was rewritten by the survivor
    # that found it dead.
    with httpx.Client(timeout=30) as client:
        for node in survivors:
            counts = client.get(f"{node.url}/api/runs", params={"limit": 1}).json()["counts"]
            assert counts["completed"] == runs == sum(counts.values()), counts

    executions = cluster.read_executions()
    starts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in executions:
        if line["event"] != "canceled":
            (starts if line["event"] == "start" else ends)[line["item"]].append(line)

    requeued_from_killed = 0
    ran_on: set[str] = set()
    for i, run in details.items():
        attempts = run["attemptDetails"]
        assert run["status"] == "completed", run
        assert 1 <= run["attempts"] == len(attempts) <= 3, run
        final = attempts[-1]
        assert final["outcome"] == "completed", run
        ran_on.add(final["nodeId"])
        # Only the killed node can have left an attempt unfinished.
        for attempt in attempts[:-1]:
            assert (attempt["nodeId"], attempt["outcome"]) == (killed, "interrupted"), run
            # What the detail (and the pane) says of it: the lease, not a restart.
            assert attempt["error"].startswith("its node's lease expired (the node stopped "
                                               "or lost the database); node "), run
        if len(attempts) > 1:
            requeued_from_killed += 1
        # From the effect's side: it ended exactly once on the surviving nodes, on the
        # node of the final attempt (or, if the killed node completed it, there alone);
        # the killed node may also have ended it in an attempt it could not record (the
        # attempt rule: that attempt counts, and the run ran again). It started once per
        # attempt at most (a node killed after its claim may not have started the
        # effect), and only on the nodes that held an attempt.
        attempt_nodes = [a["nodeId"] for a in attempts]
        ended_on = [e["node"] for e in ends[i]]
        if final["nodeId"] == killed:
            assert ended_on == [killed], (run, ends[i])
        else:
            assert [n for n in ended_on if n != killed] == [final["nodeId"]], (run, ends[i])
        assert ended_on.count(killed) <= attempt_nodes.count(killed), (run, ends[i])
        started_on = [s["node"] for s in starts[i]]
        assert started_on[-1] == final["nodeId"], (run, starts[i])
        assert len(started_on) <= len(attempt_nodes), (run, starts[i])
        assert all(started_on.count(n) <= attempt_nodes.count(n) for n in set(started_on))
    assert requeued_from_killed >= 1, "the kill hit no running run; nothing was re-queued"
    assert ran_on == set(names), ran_on  # every node ran runs (c before it was killed)

    # Per thread: one run at a time (the final attempts, as the runs and as the effect
    # saw them), in due order: a run never starts while an earlier-due run of its thread
    # is already stored (a run stored after a later one started cannot go first; its
    # createdAt is taken before its commit, so the time its scheduling call returned is
    # what says it was stored).
    for tid in threads:
        items = [i for i in range(runs) if threads[i % 100] == tid]
        final = {i: details[i]["attemptDetails"][-1] for i in items}
        by_start = sorted(items, key=lambda i: _ts(final[i]["startedAt"]))
        for before, after in pairwise(by_start):
            assert _ts(final[after]["startedAt"]) >= _ts(final[before]["endedAt"]), (
                tid, details[before]["attemptDetails"], details[after]["attemptDetails"],
                [(e["item"], e["event"], e["node"], e["at"]) for e in executions
                 if e["thread"] == tid])
            # The effect's own record: the final execution of each ended before the next
            # one started.
            assert starts[after][-1]["at"] >= ends[before][-1]["at"], (tid, before, after)
        for early in items:
            for late in items:
                if (_ts(details[early]["runAt"]) < _ts(details[late]["runAt"])
                        and stored_by[early] < _ts(final[late]["startedAt"])):
                    assert _ts(final[early]["startedAt"]) <= _ts(final[late]["startedAt"]), (
                        tid, details[early], details[late])

    # The stream on a surviving node saw every frame of its thread, seq continuous, made
    # by whichever node made the change.
    seqs = [f["seq"] for f in stream.frames]
    # The frames' numbers rise by one, except that the node that finds the killed node
    # skips one number of each thread the killed node may have changed without relaying
    # its frame (docs/scale-out.md, "Frames across nodes"): at most one gap of one number.
    steps = [b - a for a, b in pairwise(seqs)]
    assert all(step in (1, 2) for step in steps), seqs
    gaps = steps.count(2)
    assert gaps <= 1, seqs
    changes: dict[str, list[str]] = defaultdict(list)
    for frame in stream.frames:
        if frame["eventType"] == "effect_changed":
            changes[frame["data"]["id"]].append(frame["data"]["change"])
    watched_items = [i for i in range(runs) if threads[i % 100] == watched]
    for i in watched_items:
        seen_changes = changes[run_ids[i]]
        complete = (bool(seen_changes) and seen_changes[0] == "scheduled"
                    and seen_changes[-1] == "completed"
                    and seen_changes.count("started") == details[i]["attempts"])
        # A frame the killed node never relayed shows as that gap (the client reloads).
        assert complete or gaps == 1, (i, seen_changes, seqs)


def test_a_run_canceled_on_one_node_never_runs_on_the_node_that_claims(
    cluster: Cluster,
) -> None:
    front = cluster.start("a", *NO_CLAIMS)  # serves the API, runs nothing
    worker = cluster.start("b")
    tid = httpx.post(f"{front.url}/api/threads", json={}).json()["id"]
    runs_url = f"{front.url}/api/threads/{tid}/effects"

    canceled = httpx.post(runs_url, json={"name": "work", "args": {"item": 1},
                                          "delay_seconds": 1}).json()["id"]
    res = httpx.post(f"{runs_url}/{canceled}/cancel", json={})
    assert res.status_code == 200 and res.json() == {"canceled": True}, res.text
    # A run due at the same moment, not canceled: node b claims and runs it, so b was
    # claiming this thread's runs when the canceled one came due.
    control = httpx.post(runs_url, json={"name": "work", "args": {"item": 2},
                                         "delay_seconds": 1}).json()["id"]
    deadline = time.monotonic() + GUARD_SECONDS
    while (run := httpx.get(f"{worker.url}/api/threads/{tid}/effects/{control}").json())[
            "status"] != "completed":
        assert time.monotonic() < deadline, f"the control run never ran: {run}\n{cluster.logs()}"
        time.sleep(0.05)
    assert [a["nodeId"] for a in run["attemptDetails"]] == ["b"]
    time.sleep(2 * LEASE_SECONDS)  # past any poll or lease bound: it would have run by now

    assert [e["item"] for e in cluster.read_executions()] == [2, 2]  # start, end of item 2
    for node in (front, worker):
        run = httpx.get(f"{node.url}/api/threads/{tid}/effects/{canceled}").json()
        assert (run["status"], run["attempts"], run["startedAt"]) == ("canceled", 0, None)


POLL_SECONDS = 5.0
"""The nodes' alarm poll (`cluster_poll_seconds`, its default)."""
WAKE_GRACE_SECONDS = 1.0
"""The nodes' wake-up grace (`cluster_wake_grace_seconds`, its default)."""


def test_two_of_three_nodes_killed_every_pending_run_completes_on_the_last(
    cluster: Cluster,
) -> None:
    """Wake-ups rank over the live leases: the dead leave the ranking once their leases end.

    Runs are scheduled through all three nodes (each thread through one), due shortly
    after two of them are SIGKILLed: nothing is running or re-queued, so what starts
    them on the survivor is its wake-ups alone, whichever node's timer and ranking they
    depended on (a thread scheduled through a killed node whose ranking puts the
    survivor last).
    """
    names = ["a", "b", "c"]
    nodes = [cluster.start(name) for name in names]
    survivor = cluster.nodes["a"]
    threads = [f"k{k:02d}" for k in range(30)]
    with httpx.Client(timeout=30) as client:
        for k, tid in enumerate(threads):
            res = client.post(f"{nodes[k % 3].url}/api/threads", json={"id": tid})
            assert res.status_code == 201, res.text
    runs = 150
    base = time.time() + 12.0  # scheduling ends well before the first run is due
    due = [base + 4.0 * i / runs for i in range(runs)]  # due over 4 s
    run_ids: dict[int, str] = {}

    def schedule_share(k: int) -> None:
        with httpx.Client(timeout=30) as client:
            for i in range(k, runs, 3):
                res = client.post(
                    f"{nodes[k].url}/api/threads/{threads[i % len(threads)]}/effects",
                    json={"name": "work", "args": {"item": i, "seconds": 0.1},
                          "run_at": _iso(due[i])},
                )
                assert res.status_code == 201, res.text
                run_ids[i] = res.json()["id"]

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(schedule_share, range(3)))
    assert len(run_ids) == runs
    # Kill two nodes a second before the first run is due.
    time.sleep(max(0.0, base - 1.0 - time.time()))
    for name in ("b", "c"):
        assert cluster.nodes[name].signal(signal.SIGKILL) == -signal.SIGKILL
    killed_at = time.time()
    assert killed_at < base, "scheduling took too long: runs came due before the kill"
    _wait_until_finished([survivor], threads, killed_at + GUARD_SECONDS, cluster)

    # The bound of docs/scale-out.md ("Wake-ups"): a pending run is armed by the
    # survivor at its next poll at the latest once overdue by the grace (or once the
    # dead nodes' leases expired, the survivor ranks first everywhere). A few seconds on
    # top for the loaded machine: the old ranking (the nodes heard within three polls)
    # kept dead nodes ranked for 15 s.
    bound = POLL_SECONDS + WAKE_GRACE_SECONDS + 3.0
    late: list[tuple[int, float]] = []
    executions = cluster.read_executions()
    with httpx.Client(timeout=30) as client:
        for i in range(runs):
            run = client.get(f"{survivor.url}/api/threads/{threads[i % len(threads)]}"
                             f"/effects/{run_ids[i]}").json()
            attempts = run["attemptDetails"]
            assert run["status"] == "completed", run
            final = attempts[-1]
            assert len(attempts) == 1, run
            if final["nodeId"] == "a":
                lag = _ts(final["startedAt"]) - max(_ts(run["runAt"]), killed_at)
                if lag > bound:
                    late.append((i, round(lag, 1)))
            else:
                raise AssertionError(f"run {i} ran on a killed node: {run}")
            ended = [e["node"] for e in executions if e["item"] == i and e["event"] == "end"]
            assert [n for n in ended if n == "a"] == (["a"] if final["nodeId"] == "a" else [])
    assert not late, f"runs started more than {bound:g} s late: {late[:10]}\n{cluster.logs()}"
    assert any(e["node"] == "a" and e["at"] > killed_at for e in executions)


def test_three_nodes_through_a_ten_second_database_outage(cluster: Cluster) -> None:
    """The database refuses every connection for 10 s (past the nodes' leases) mid-run.

    Every node loses its lease, cancels the effects it runs and claims nothing; when the
    database is back they renew their leases and re-queue what they gave up. No run stays
    ``running`` for good, and no run ran more often than its attempts say (at most three).
    """
    from runtime.storage.postgres import split_schema

    nodes = [cluster.start(name) for name in ("a", "b", "c")]
    threads = [f"o{k:02d}" for k in range(20)]
    with httpx.Client(timeout=30) as client:
        for k, tid in enumerate(threads):
            assert client.post(f"{nodes[k % 3].url}/api/threads",
                               json={"id": tid}).status_code == 201
    runs = 100
    base = time.time() + 4.0
    run_ids: dict[int, str] = {}
    with httpx.Client(timeout=30) as client:
        for i in range(runs):
            res = client.post(
                f"{nodes[i % 3].url}/api/threads/{threads[i % len(threads)]}/effects",
                # Some effects outlast the lease: the outage finds them running.
                json={"name": "work", "args": {"item": i, "seconds": 6.0 if i % 5 == 0 else 0.3},
                      "run_at": _iso(base + 6.0 * i / runs)})
            assert res.status_code == 201, res.text
            run_ids[i] = res.json()["id"]

    database = split_schema(cluster.database_url)[0].rsplit("/", 1)
    admin_url, name = f"{database[0]}/postgres", database[1]
    time.sleep(max(0.0, base + 2.0 - time.time()))  # runs are running
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
            time.sleep(10.0)
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    _wait_until_finished(nodes, threads, time.time() + GUARD_SECONDS, cluster)

    executions = cluster.read_executions()
    interrupted = 0
    with httpx.Client(timeout=30) as client:
        for i in range(runs):
            run = client.get(f"{nodes[i % 3].url}/api/threads/{threads[i % len(threads)]}"
                             f"/effects/{run_ids[i]}").json()
            attempts = run["attemptDetails"]
            assert 1 <= run["attempts"] == len(attempts) <= 3, run
            interrupted += len(attempts) > 1
            if run["status"] == "failed":  # the attempt rule: interrupted three times
                assert [a["outcome"] for a in attempts] == ["interrupted"] * 3, run
            else:
                assert run["status"] == "completed", run
                assert attempts[-1]["outcome"] == "completed", run
                assert all(a["outcome"] == "interrupted" for a in attempts[:-1]), run
            mine = [e for e in executions if e["item"] == i]
            # Each attempt started the effect at most once, and ended it at most once.
            assert len([e for e in mine if e["event"] == "start"]) <= len(attempts), (run, mine)
            assert len([e for e in mine if e["event"] == "end"]) <= len(attempts), (run, mine)
    assert interrupted >= 1, "the outage interrupted no running run"
    assert all("lost its lease" in server.log.read_text(errors="replace")
               for server in cluster.nodes.values())


def test_a_node_cut_off_silently_stops_its_effects_and_answers_503_while_another_reruns_them(
    cluster: Cluster,
) -> None:
    """Node p reaches the database through a proxy that goes silent (no connection closes).

    p cancels the effects it runs before node b re-queues them (none of p's executions
    ends: before, they ran on to their end beside b's second attempts); p's API answers
    503 instead of hanging; when the network is back p holds its lease again and serves.
    """
    from test_postgres_outage import TcpProxy

    proxy, url = TcpProxy.to_local(cluster.database_url)
    try:
        p = cluster.start("p", database_url=url, lease_seconds=6)
        threads = [httpx.post(f"{p.url}/api/threads", json={}).json()["id"] for _ in range(4)]
        run_ids = [httpx.post(f"{p.url}/api/threads/{tid}/effects",
                              json={"name": "work", "args": {"item": i, "seconds": 20}}
                              ).json()["id"] for i, tid in enumerate(threads)]
        deadline = time.monotonic() + GUARD_SECONDS
        while len([e for e in cluster.read_executions() if e["event"] == "start"]) < 4:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.05)
        b = cluster.start("b", lease_seconds=6)
        proxy.go_silent()
        try:
            # b re-queues p's runs once p's lease expired, and runs them again to their
            # end (p's executions, begun earlier, would have ended by then).
            while len({e["item"] for e in cluster.read_executions()
                       if e["event"] == "end" and e["node"] == "b"}) < 4:
                assert time.monotonic() < deadline, cluster.logs()
                time.sleep(0.05)
            # p answers at once (a client timeout of 15 s: before, these hung).
            with httpx.Client(timeout=15) as client:
                assert client.get(f"{p.url}/api/ready").status_code == 503
                assert client.get(f"{p.url}/api/health").json()["databaseConnected"] is False
                res = client.get(f"{p.url}/api/threads/{threads[0]}/effects/{run_ids[0]}")
                assert res.status_code == 503, res.text
                assert res.json()["error"]["code"] == "database_unavailable"
            # A stream asked for meanwhile is refused with 1013 (try again later).
            stream_url = f"ws://127.0.0.1:{p.port}/api/threads/{threads[0]}/stream"
            with (ws_connect(stream_url, origin=None, open_timeout=GUARD_SECONDS) as ws,
                  pytest.raises(ConnectionClosed) as closed):
                ws.recv(timeout=GUARD_SECONDS)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1013, closed.value
        finally:
            proxy.resume()
        while not all(httpx.get(f"{b.url}/api/threads/{tid}/effects/{rid}").json()["status"]
                      == "completed" for tid, rid in zip(threads, run_ids, strict=True)):
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.2)
        executions = cluster.read_executions()
        # p's executions were canceled: none of them ended (b's did, once each).
        assert [e["item"] for e in executions if e["event"] == "end" and e["node"] == "p"] == []
        assert sorted(e["item"] for e in executions
                      if e["event"] == "end" and e["node"] == "b") == [0, 1, 2, 3]
        for tid, rid in zip(threads, run_ids, strict=True):
            run = httpx.get(f"{b.url}/api/threads/{tid}/effects/{rid}").json()
            assert [(a["nodeId"], a["outcome"]) for a in run["attemptDetails"]] == [
                ("p", "interrupted"), ("b", "completed")], run
        # p is back: it holds its lease again and answers.
        while httpx.get(f"{p.url}/api/ready", timeout=15).status_code != 200:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.2)
        assert httpx.get(f"{p.url}/api/threads/{threads[0]}/effects/{run_ids[0]}",
                         timeout=15).json()["status"] == "completed"
        assert "lost its lease" in p.log.read_text(errors="replace")
    finally:
        proxy.stop()


def test_a_thread_deleted_on_one_node_ends_its_stream_on_another_with_4404(
    cluster: Cluster,
) -> None:
    x = cluster.start("x")
    y = cluster.start("y")
    tid = httpx.post(f"{y.url}/api/threads", json={}).json()["id"]
    with ws_connect(f"ws://127.0.0.1:{x.port}/api/threads/{tid}/stream", origin=None,
                    open_timeout=GUARD_SECONDS) as ws:
        assert httpx.delete(f"{y.url}/api/threads/{tid}").status_code == 200
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=GUARD_SECONDS)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4404, f"Thread deleted: {tid}")


def test_a_thread_deleted_with_two_nodes_up_is_announced_once_on_each_server_wide_stream(
    cluster: Cluster,
) -> None:
    x = cluster.start("x")
    y = cluster.start("y")
    first, second = (httpx.post(f"{y.url}/api/threads", json={}).json()["id"]
                     for _ in range(2))
    with (ws_connect(f"ws://127.0.0.1:{x.port}/api/stream", origin=None,
                     open_timeout=GUARD_SECONDS) as on_x,
          ws_connect(f"ws://127.0.0.1:{y.port}/api/stream", origin=None,
                     open_timeout=GUARD_SECONDS) as on_y):
        for tid in (first, second):
            assert httpx.delete(f"{y.url}/api/threads/{tid}").status_code == 200
        for ws in (on_x, on_y):
            deleted: list[str] = []
            while second not in deleted:  # the second thread's frame comes after the first's
                frame = json.loads(ws.recv(timeout=GUARD_SECONDS))
                if frame["eventType"] == "thread_deleted":
                    deleted.append(frame["threadId"])
            assert deleted == [first, second], deleted


def test_a_thread_deleted_by_a_node_killed_right_after_its_commit_ends_its_streams_elsewhere(
    cluster: Cluster,
) -> None:
    """The deleting node dies between its deletion's commit and anything else it would do.

    Its deletion reaches the other node all the same: the stream of the thread there ends
    with 4404, its server-wide stream gets the deletion once (before the next one), the
    thread and its runs answer 404 there, and the thread's run running there is canceled
    mid-effect (its effect code sees the cancellation and never ends). The rows the dead
    node did not remove (the thread's runs, attempts, store meta) are removed by the live
    node, which is not restarted.
    """
    x = cluster.start("x")
    y = cluster.start("y", *NO_CLAIMS, MULTINODE_EXIT_AFTER_DELETE="1")
    tid, other = (httpx.post(f"{x.url}/api/threads", json={}).json()["id"] for _ in range(2))
    run_id = httpx.post(f"{x.url}/api/threads/{tid}/effects",
                        json={"name": "work", "args": {"item": 1, "seconds": 25}}).json()["id"]
    deadline = time.monotonic() + GUARD_SECONDS
    while not any(e["item"] == 1 for e in cluster.read_executions()):  # running on x
        assert time.monotonic() < deadline, f"the run never started\n{cluster.logs()}"
        time.sleep(0.05)
    with (ws_connect(f"ws://127.0.0.1:{x.port}/api/threads/{tid}/stream", origin=None,
                     open_timeout=GUARD_SECONDS) as ws,
          ws_connect(f"ws://127.0.0.1:{x.port}/api/stream", origin=None,
                     open_timeout=GUARD_SECONDS) as everything):
        with pytest.raises(httpx.TransportError):  # y exits before it answers
            httpx.delete(f"{y.url}/api/threads/{tid}", timeout=GUARD_SECONDS)
        assert y.proc is not None and y.proc.wait(GUARD_SECONDS) == 70, cluster.logs()
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=2 * LEASE_SECONDS)
        assert closed.value.rcvd is not None, cluster.logs()
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            4404, f"Thread deleted: {tid}")
        # The deletion's command came with its frame: applied a moment after the 4404
        # (before, x answered 200 from its cached entry for as long as it ran).
        deadline = time.monotonic() + 5 * LEASE_SECONDS
        while httpx.get(f"{x.url}/api/threads/{tid}").status_code != 404:
            assert time.monotonic() < deadline, f"x still serves the thread\n{cluster.logs()}"
            time.sleep(0.1)
        assert httpx.get(f"{x.url}/api/threads/{tid}/effects").status_code == 404
        assert httpx.get(f"{x.url}/api/threads/{tid}/effects/{run_id}").status_code == 404
        deadline = time.monotonic() + GUARD_SECONDS
        while [e["event"] for e in cluster.read_executions()] != ["start", "canceled"]:
            assert time.monotonic() < deadline, cluster.read_executions()
            time.sleep(0.05)
        assert [e["node"] for e in cluster.read_executions()] == ["x", "x"]
        assert httpx.delete(f"{x.url}/api/threads/{other}").status_code == 200
        deleted: list[str] = []
        while other not in deleted:
            frame = json.loads(everything.recv(timeout=GUARD_SECONDS))
            if frame["eventType"] == "thread_deleted":
                deleted.append(frame["threadId"])
        assert deleted == [tid, other], deleted
    # Created more than two lease periods ago by now: its rows go at x's next round.
    deadline = time.monotonic() + 6 * LEASE_SECONDS
    while (left := _thread_rows(cluster, tid)) != 0:
        assert time.monotonic() < deadline, f"{left} rows of {tid} left\n{cluster.logs()}"
        time.sleep(0.2)
    assert x.proc is not None and x.proc.poll() is None  # x ran all along


def _thread_rows(cluster: Cluster, thread_id: str) -> int:
    """How many rows a thread's store holds in the cluster's schema (every table)."""
    from runtime.storage.pg_schema import THREAD_TABLES
    from runtime.storage.postgres import split_schema

    url, schema = split_schema(cluster.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        return sum(
            int(conn.execute(f"SELECT count(*) FROM {schema}.{table} WHERE thread_id = %s",
                             (thread_id,)).fetchone()[0])  # type: ignore[index]
            for table in THREAD_TABLES)


ONLY_B = '''"""An effect only node b has (a rolling deploy adds it): records its start and end."""

from pydantic import BaseModel

from runtime import ThreadState, define_effect

from tests.apps._multinode_log import note


class Item(BaseModel):
    item: int


async def only_b(state: ThreadState, args: Item) -> None:
    note(state, "start", item=args.item)
    note(state, "end", item=args.item)


effect = define_effect("Records its start and end in $MULTINODE_LOG.", Item, only_b)
'''


def test_an_effect_only_one_node_has_runs_there_and_fails_once_no_live_node_has_it(
    cluster: Cluster,
) -> None:
    # Node b's app has one effect more than node a's (a rolling deploy adding it).
    app_b = cluster.tmp_path / "app_b"
    shutil.copytree(APP, app_b)
    (app_b / "effects" / "only_b.py").write_text(ONLY_B)
    a = cluster.start("a")
    b = cluster.start("b", app=app_b)
    runs: dict[str, list[str]] = {}
    with httpx.Client(timeout=30) as client:
        tids = [client.post(f"{b.url}/api/threads", json={}).json()["id"] for _ in range(10)]
        for k, tid in enumerate(tids):
            res = client.post(f"{b.url}/api/threads/{tid}/effects", json={
                "name": "only_b", "args": {"item": k}, "delay_seconds": 2})
            assert res.status_code in (200, 201), res.text
            runs[tid] = [res.json()["id"]]
        # Due right after the only_b run of its thread: never run ahead of it (due order).
        later = client.post(f"{b.url}/api/threads/{tids[0]}/effects", json={
            "name": "work", "args": {"item": 100}, "delay_seconds": 2.05}).json()["id"]
        res = client.post(f"{b.url}/api/threads/{tids[1]}/schedules",
                          json={"name": "only_b", "args": {"item": 200}, "every_seconds": 1})
        assert res.status_code == 201, res.text
        sid = res.json()["id"]
        time.sleep(POLL_SECONDS + 2)  # every node has polled its alarms since they came due
        schedule = client.get(f"{a.url}/api/threads/{tids[1]}/schedules/{sid}").json()
        assert (schedule["state"], schedule["pausedReason"]) == ("active", None), schedule
        res = client.post(f"{b.url}/api/threads/{tids[1]}/schedules/{sid}/cancel", json={})
        assert res.status_code == 200, res.text
        _wait_until_finished([a, b], tids, time.time() + GUARD_SECONDS, cluster)

        for tid in tids:
            listed = client.get(f"{a.url}/api/threads/{tid}/effects").json()["runs"]
            for run in listed:
                if run["name"] != "only_b":
                    continue
                run = client.get(f"{a.url}/api/threads/{tid}/effects/{run['id']}").json()
                assert run["status"] == "completed", (run, cluster.logs())
                assert [x["nodeId"] for x in run["attemptDetails"]] == ["b"], run
        fired = [e for e in cluster.read_executions() if e["item"] == 200]
        assert len(fired) >= 4, fired  # it kept firing, every fire run on b
        starts = {e["item"]: e["at"] for e in cluster.read_executions() if e["event"] == "start"}
        ends = {e["item"]: e["at"] for e in cluster.read_executions() if e["event"] == "end"}
        assert starts[100] >= ends[0]
        assert client.get(f"{a.url}/api/threads/{tids[0]}/effects/{later}").json()[
            "status"] == "completed"

        # Once no live node has it, a node that lacks it fails its run, as one node does.
        res = client.post(f"{b.url}/api/threads/{tids[2]}/effects",
                          json={"name": "only_b", "args": {"item": 300}, "delay_seconds": 3})
        assert res.status_code in (200, 201), res.text
        run_id = res.json()["id"]
        assert b.signal(signal.SIGTERM) in (0, -signal.SIGTERM)  # its lease ends now
        deadline = time.monotonic() + GUARD_SECONDS
        while (run := client.get(f"{a.url}/api/threads/{tids[2]}/effects/{run_id}").json())[
                "status"] in ("pending", "running"):
            assert time.monotonic() < deadline, f"never ended: {run}\n{cluster.logs()}"
            time.sleep(0.1)
        assert (run["status"], run["error"]) == ("failed", "Effect not found: only_b"), run


def test_bulk_cancel_waiting_for_and_run_now_answer_the_same_on_every_node(
    cluster: Cluster,
) -> None:
    a = cluster.start("a")
    b = cluster.start("b", *NO_CLAIMS)  # serves the API, runs nothing
    tid = httpx.post(f"{a.url}/api/threads", json={}).json()["id"]
    runs_a = f"{a.url}/api/threads/{tid}/effects"
    runs_b = f"{b.url}/api/threads/{tid}/effects"

    # A run scheduled on a, canceled at once by a bulk cancel on b.
    res = httpx.post(runs_a, json={"name": "work", "args": {"item": 1}, "delay_seconds": 600})
    assert res.status_code == 201, res.text
    later = res.json()["id"]
    res = httpx.post(f"{b.url}/api/runs/cancel", json={"thread_id": tid})
    assert res.status_code == 200 and res.json()["ids"] == [later], res.text
    assert httpx.get(f"{runs_a}/{later}").json()["status"] == "canceled"

    # A run running on a, and one due behind it: every node says what it waits for.
    running = httpx.post(runs_a, json={"name": "work", "args": {"item": 2, "seconds": 60}}
                         ).json()["id"]
    deadline = time.monotonic() + GUARD_SECONDS
    while httpx.get(f"{runs_a}/{running}").json()["status"] != "running":
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.05)
    waiting = httpx.post(runs_a, json={"name": "work", "args": {"item": 3}}).json()["id"]
    for node, runs_url in ((a, runs_a), (b, runs_b)):
        assert httpx.get(f"{runs_url}/{waiting}").json()["waitingFor"] == running
        listed = httpx.get(runs_url).json()["runs"]
        assert {r["id"]: r["waitingFor"] for r in listed}[waiting] == running
        page = httpx.get(f"{node.url}/api/runs", params={"thread_id": tid,
                                                         "status": "pending"}).json()
        assert [(r["id"], r["waitingFor"]) for r in page["runs"]] == [(waiting, running)]
        res = httpx.post(f"{runs_url}/{waiting}/run", json={})
        assert res.status_code == 409, res.text
        assert res.json()["error"]["code"] == "run_state_conflict", res.text
    res = httpx.post(f"{runs_b}/{running}/cancel", json={})
    assert res.status_code == 200, res.text


CONCURRENT_APP = ROOT / "tests" / "apps" / "multinode_concurrent"
LONG_RUN_SECONDS = 12.0
STARTED_WITHIN_SECONDS = 3.0
"""A generous bound on how long after its due time a concurrent run starts (against a
12 s long run: waiting for the long run would take about 10 s more)."""


def _starts(cluster: Cluster, effect: str) -> list[dict[str, Any]]:
    return [e for e in cluster.read_executions()
            if e.get("effect") == effect and e["event"] == "start"]


def _wait_for_start(cluster: Cluster, effect: str, count: int = 1) -> list[dict[str, Any]]:
    deadline = time.time() + GUARD_SECONDS
    while len(starts := _starts(cluster, effect)) < count:
        assert time.time() < deadline, f"{effect} did not start\n{cluster.logs()}"
        time.sleep(0.05)
    return starts


def _long_run_on(cluster: Cluster, runner: ServerProcess, thread_id: str) -> dict[str, Any]:
    """Create the thread and start the long run through ``runner``; its start line."""
    with httpx.Client(timeout=30) as client:
        res = client.post(f"{runner.url}/api/threads", json={"id": thread_id})
        assert res.status_code == 201, res.text
        res = client.post(f"{runner.url}/api/threads/{thread_id}/effects",
                          json={"name": "slow_task", "args": {"seconds": LONG_RUN_SECONDS}})
        assert res.status_code == 201, res.text
    return _wait_for_start(cluster, "slow_task")[0]


@pytest.mark.parametrize("runner_name, other_name", [("a", "b"), ("b", "a")])
def test_a_concurrent_run_scheduled_through_another_node_starts_beside_the_long_run(
    cluster: Cluster, runner_name: str, other_name: str,
) -> None:
    names = sorted({runner_name, other_name})
    nodes = {n: cluster.start(n, lease_seconds=6, app=CONCURRENT_APP) for n in names}
    runner, other = nodes[runner_name], nodes[other_name]
    slow = _long_run_on(cluster, runner, "tc5")
    time.sleep(1.0)
    with httpx.Client(timeout=30) as client:
        # Due now, then due in 3 s: both through the node that does not run the thread.
        asked = time.time()
        res = client.post(f"{other.url}/api/threads/tc5/effects",
                          json={"name": "conc_task", "args": {"seconds": 1}})
        assert res.status_code == 201, res.text
        later = time.time() + 3.0
        res = client.post(f"{other.url}/api/threads/tc5/effects",
                          json={"name": "conc_task", "args": {"seconds": 1},
                                "run_at": _iso(later)})
        assert res.status_code == 201, res.text
    first, second = _wait_for_start(cluster, "conc_task", 2)[:2]
    ends = [e for e in cluster.read_executions()
            if e.get("effect") == "slow_task" and e["event"] == "end"]
    assert first["at"] - asked < STARTED_WITHIN_SECONDS, (first, asked, cluster.logs())
    assert later - 0.5 <= second["at"] < later + STARTED_WITHIN_SECONDS, (second, later)
    assert first["node"] == second["node"] == slow["node"] == runner_name
    assert not ends or ends[0]["at"] > second["at"]  # beside the long run, not after it


def test_an_occurrence_of_a_concurrent_schedule_made_on_another_node_starts_beside(
    cluster: Cluster,
) -> None:
    runner = cluster.start("a", lease_seconds=6, app=CONCURRENT_APP)
    other = cluster.start("b", lease_seconds=6, app=CONCURRENT_APP)
    slow = _long_run_on(cluster, runner, "tc6")
    time.sleep(1.0)
    with httpx.Client(timeout=30) as client:
        res = client.post(f"{other.url}/api/threads/tc6/schedules",
                          json={"name": "conc_task", "args": {"seconds": 0.5},
                                "every_seconds": 3})
        assert res.status_code == 201, res.text
        fire = _ts(res.json()["nextFireAt"])
    first, second = _wait_for_start(cluster, "conc_task", 2)[:2]
    ends = [e for e in cluster.read_executions()
            if e.get("effect") == "slow_task" and e["event"] == "end"]
    assert fire - 0.5 <= first["at"] < fire + STARTED_WITHIN_SECONDS, (first, fire,
                                                                       cluster.logs())
    assert second["at"] < fire + 3.0 + STARTED_WITHIN_SECONDS, (second, fire)
    assert first["node"] == slow["node"] == "a"
    assert not ends or ends[0]["at"] > second["at"]


def test_a_concurrent_run_starts_beside_on_the_running_node_ranked_after_another(
    cluster: Cluster,
) -> None:
    # Three nodes: the wake-up sent by b ranks c first among the others, yet a runs the
    # thread and alone can start the run.
    tid = next(t for t in (f"tr{k}" for k in range(100)) if rank(["a", "c"], t)[0] == "c")
    nodes = {n: cluster.start(n, lease_seconds=6, app=CONCURRENT_APP) for n in "abc"}
    slow = _long_run_on(cluster, nodes["a"], tid)
    time.sleep(1.0)
    with httpx.Client(timeout=30) as client:
        asked = time.time()
        res = client.post(f"{nodes['b'].url}/api/threads/{tid}/effects",
                          json={"name": "conc_task", "args": {"seconds": 1}})
        assert res.status_code == 201, res.text
    first = _wait_for_start(cluster, "conc_task")[0]
    assert first["at"] - asked < STARTED_WITHIN_SECONDS, (first, asked, cluster.logs())
    assert first["node"] == slow["node"] == "a"
