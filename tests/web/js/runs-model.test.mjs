// Unit tests of web/runs-model.js (node --test; run by tests/web/test_js_units.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  applyFrame,
  countChange,
  emptyModel,
  mergeRun,
  snapshotModel,
  statusCounts,
  visibleRuns,
  waitingFor,
} from "../../../web/runs-model.js";

const NOW = Date.parse("2026-11-30T12:00:00Z");
const at = (s) => new Date(NOW + s * 1000).toISOString();
const ids = (model) => model.order.join(",");

test("runs are ordered newest first, ties by id, whatever order they arrive in", () => {
  const m = emptyModel();
  mergeRun(m, { id: "a", status: "pending", createdAt: at(1) }, NOW);
  mergeRun(m, { id: "c", status: "pending", createdAt: at(3) }, NOW);
  mergeRun(m, { id: "b", status: "pending", createdAt: at(3) }, NOW);
  mergeRun(m, { id: "d", status: "pending", createdAt: at(2) }, NOW);
  assert.equal(ids(m), "c,b,d,a");
});

test("a run known only from a frame goes on top, later arrivals above it", () => {
  const m = emptyModel();
  mergeRun(m, { id: "old", status: "completed", createdAt: at(-60) }, NOW);
  applyFrame(m, { id: "f1", status: "pending", change: "scheduled" }, NOW);
  applyFrame(m, { id: "f2", status: "pending", change: "scheduled" }, NOW);
  assert.equal(ids(m), "f2,f1,old");
  // Its createdAt, learnt later, places it for good.
  mergeRun(m, { id: "f1", createdAt: at(-120) }, NOW);
  assert.equal(ids(m), "f2,old,f1");
});

test("a frame never clobbers args and never moves a finished run back", () => {
  const m = emptyModel();
  mergeRun(m, { id: "r", status: "running", attempts: 1, args: { text: "x" }, createdAt: at(0) }, NOW);
  applyFrame(m, { id: "r", status: "completed", attempts: 1, change: "completed", args: null }, NOW);
  assert.deepEqual(m.runs.get("r").args, { text: "x" });
  assert.equal(m.runs.get("r").lastChange, "completed");
  // A late "started" (or an old snapshot) is older news.
  applyFrame(m, { id: "r", status: "running", attempts: 1, change: "started" }, NOW);
  assert.equal(m.runs.get("r").status, "completed");
  // Fewer attempts than we know is stale too.
  mergeRun(m, { id: "q", status: "pending", attempts: 2, createdAt: at(0) }, NOW);
  mergeRun(m, { id: "q", status: "running", attempts: 1 }, NOW);
  assert.equal(m.runs.get("q").status, "pending");
});

test("every change bumps the run's version", () => {
  const m = emptyModel();
  const run = mergeRun(m, { id: "r", status: "pending", createdAt: at(0) }, NOW);
  assert.equal(run._v, 1);
  mergeRun(m, { id: "r", status: "running" }, NOW);
  assert.equal(run._v, 2);
});

test("server counts follow the frames' changes, never below zero", () => {
  let counts = { pending: 1, running: 0, completed: 0, failed: 0, canceled: 0 };
  counts = countChange(counts, "started");
  assert.deepEqual(counts, { pending: 0, running: 1, completed: 0, failed: 0, canceled: 0 });
  counts = countChange(counts, "failed");
  counts = countChange(counts, "started"); // a run beyond what we know: no negative pending
  assert.equal(counts.pending, 0);
  assert.equal(counts.running, 1);
  assert.equal(countChange(null, "scheduled"), null);
  assert.equal(countChange(counts, "unknown_change"), counts);
});

test("status counts are the server's totals when known, else the loaded runs", () => {
  const m = emptyModel();
  mergeRun(m, { id: "a", status: "pending", createdAt: at(0) }, NOW);
  mergeRun(m, { id: "b", status: "failed", createdAt: at(1) }, NOW);
  assert.deepEqual(statusCounts(m), { all: 2, pending: 1, running: 0, completed: 0, failed: 1, canceled: 0 });
  m.counts = { pending: 1000, running: 0, completed: 3, failed: 1, canceled: 0 };
  applyFrame(m, { id: "a", status: "running", change: "started" }, NOW);
  assert.deepEqual(statusCounts(m), { all: 1004, pending: 999, running: 1, completed: 3, failed: 1, canceled: 0 });
});

test("a snapshot keeps runs that frames brought or advanced while it was read", () => {
  let m = emptyModel();
  mergeRun(m, { id: "a", status: "pending", attempts: 0, createdAt: at(0), args: { n: 1 } }, NOW);
  mergeRun(m, { id: "detail", status: "completed", createdAt: at(-999) }, NOW);
  // While the list was read: "a" started and "new" was scheduled.
  const during = new Set([applyFrame(m, { id: "a", status: "running", attempts: 1, change: "started" }, NOW)]);
  during.add(applyFrame(m, { id: "new", status: "pending", change: "scheduled" }, NOW));
  m = snapshotModel(
    m,
    [
      { id: "a", status: "pending", attempts: 0, createdAt: at(0) },
      { id: "b", status: "completed", createdAt: at(-5) },
      { id: "b", status: "completed", createdAt: at(-5) },
    ],
    { during, keep: "detail", counts: { pending: 2 }, now: NOW },
  );
  assert.equal(ids(m), "new,a,b,detail");
  assert.equal(m.runs.get("a").status, "running");
  assert.deepEqual(m.runs.get("a").args, { n: 1 });
  assert.deepEqual(m.counts, { pending: 2 });
});

test("visible runs follow the filter, in order", () => {
  const m = emptyModel();
  mergeRun(m, { id: "a", status: "pending", createdAt: at(0) }, NOW);
  mergeRun(m, { id: "b", status: "failed", createdAt: at(1) }, NOW);
  mergeRun(m, { id: "c", status: "pending", createdAt: at(2) }, NOW);
  assert.deepEqual(visibleRuns(m, "all").map((r) => r.id), ["c", "b", "a"]);
  assert.deepEqual(visibleRuns(m, "pending").map((r) => r.id), ["c", "a"]);
  assert.deepEqual(visibleRuns(m, "canceled"), []);
});

test("a due pending run behind a running one says which run it waits for", () => {
  const m = emptyModel();
  mergeRun(m, { id: "long", status: "running", createdAt: at(-10), runAt: at(-10) }, NOW);
  mergeRun(m, { id: "due", status: "pending", createdAt: at(-5), runAt: at(-1) }, NOW);
  mergeRun(m, { id: "later", status: "pending", createdAt: at(-4), runAt: at(60) }, NOW);
  assert.equal(waitingFor(m, m.runs.get("due"), NOW), "long");
  assert.equal(waitingFor(m, m.runs.get("later"), NOW), null); // not due yet
  assert.equal(waitingFor(m, m.runs.get("later"), NOW + 61_000), "long");
  assert.equal(waitingFor(m, m.runs.get("long"), NOW), null); // running runs wait for nothing
  // The server's answer names the run; once it ended, the model's running run stands in.
  mergeRun(m, { id: "other", status: "running", createdAt: at(-20) }, NOW);
  mergeRun(m, { id: "due", waitingFor: "other" }, NOW);
  assert.equal(waitingFor(m, m.runs.get("due"), NOW), "other");
  mergeRun(m, { id: "other", status: "completed" }, NOW);
  assert.equal(waitingFor(m, m.runs.get("due"), NOW), "long");
  mergeRun(m, { id: "long", status: "completed" }, NOW);
  assert.equal(waitingFor(m, m.runs.get("due"), NOW), null);
});

test("canceling a running run moves it out of the running count", () => {
  const m = emptyModel();
  m.counts = { pending: 1, running: 1, completed: 0, failed: 0, canceled: 0 };
  mergeRun(m, { id: "r", status: "running", createdAt: at(-10) }, NOW);
  applyFrame(m, { id: "r", status: "canceled", change: "canceled", attempts: 1 }, NOW);
  assert.deepEqual(m.counts, { pending: 1, running: 0, completed: 0, failed: 0, canceled: 1 });
  assert.deepEqual(countChange(m.counts, "canceled"), {
    pending: 0, running: 0, completed: 0, failed: 0, canceled: 2,
  });
});

test("across threads, only a running run of the same thread holds a due run back", () => {
  const m = emptyModel();
  mergeRun(m, { id: "busy", threadId: "t1", status: "running", createdAt: at(-10), runAt: at(-10) }, NOW);
  mergeRun(m, { id: "mine", threadId: "t1", status: "pending", createdAt: at(-5), runAt: at(-5) }, NOW);
  mergeRun(m, { id: "theirs", threadId: "t2", status: "pending", createdAt: at(-4), runAt: at(-4) }, NOW);
  assert.equal(waitingFor(m, m.runs.get("mine"), NOW), "busy");
  assert.equal(waitingFor(m, m.runs.get("theirs"), NOW), null);
});
