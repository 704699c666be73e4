// Unit tests of web/all-runs-model.js (node --test; run by tests/web/test_js_units.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  bulkBody,
  bulkOutcome,
  bulkQuestion,
  describeFilters,
  emptyFilters,
  frameMatches,
  dropThread,
  filtersFromHash,
  filtersHash,
  isAllRunsHash,
  listQuery,
  sameFilters,
} from "../../../web/all-runs-model.js";
import { emptyModel, snapshotModel, visibleRuns } from "../../../web/runs-model.js";

const filters = (over) => ({ ...emptyFilters(), ...over });

test("the list query carries the status unless all, the bulk body never does", () => {
  const f = filters({ status: "failed", name: " ping ", user: "u1", tag: "", since: "2026-11-30T00:00:00.000Z" });
  assert.deepEqual(listQuery(f), { status: "failed", name: "ping", user_id: "u1", since: "2026-11-30T00:00:00.000Z" });
  assert.deepEqual(bulkBody(f), { name: "ping", user_id: "u1", since: "2026-11-30T00:00:00.000Z" });
  assert.deepEqual(listQuery(emptyFilters()), {});
  assert.deepEqual(bulkBody(emptyFilters()), {});
});

test("a frame joins the list when its name and due time match, whatever its status", () => {
  const f = filters({ status: "pending", name: "ping", since: "2026-11-30T10:00:00Z", until: "2026-11-30T11:00:00Z" });
  const run = { id: "r", name: "ping", status: "completed", runAt: "2026-11-30T10:30:00Z" };
  assert.equal(frameMatches(f, run, false), true);
  assert.equal(frameMatches(f, { ...run, name: "pong" }, false), false);
  assert.equal(frameMatches(f, { ...run, runAt: "2026-11-30T09:59:59Z" }, false), false);
  assert.equal(frameMatches(f, { ...run, runAt: "2026-11-30T11:00:00Z" }, false), false); // until is exclusive
  assert.equal(frameMatches(f, { ...run, runAt: "2026-11-30T10:00:00Z" }, false), true); // since is inclusive
});

test("with a user or tag filter only runs the list holds are known to match", () => {
  const f = filters({ user: "u1" });
  const run = { id: "r", name: "ping", status: "running", runAt: "2026-11-30T10:30:00Z" };
  assert.equal(frameMatches(f, run, false), null);
  assert.equal(frameMatches(f, run, true), true);
  assert.equal(frameMatches(filters({ tag: "vip", name: "other" }), run, true), false);
});

test("the bulk questions say how many runs and which", () => {
  const f = filters({ name: "ping", user: "u1", status: "failed" });
  assert.equal(
    bulkQuestion("cancel", 12, f),
    "Cancel all 12 pending runs named ping, of user u1? Each is canceled in its own thread; one that starts meanwhile is stopped.",
  );
  assert.equal(
    bulkQuestion("replay", 1, emptyFilters()),
    "Replay all 1 failed run of every thread (no filter) not replayed yet? Each replay is a new run " +
      "with the same args, due now; failed runs already replayed are left alone.",
  );
  assert.equal(
    bulkQuestion("cancel", 1500, emptyFilters()).startsWith("Cancel all 1,500 pending runs of every thread (no filter)?"),
    true,
  );
  assert.equal(
    describeFilters(filters({ since: "A", until: "B", tag: "vip" }), (iso) => `<${iso}>`),
    " tagged vip, due from <A> to <B>",
  );
  assert.equal(describeFilters(filters({ until: "B" })), " due before B");
});

test("a bulk answer becomes a notice, saying when more runs remain", () => {
  assert.equal(bulkOutcome("cancel", { canceled: 3, ids: [], more: false }), "Canceled 3 runs.");
  assert.equal(
    bulkOutcome("replay", {
      replayed: 2, ids: ["x", "y"], more: false, skipped: 1,
      skippedRuns: [{ id: "r", threadId: "t", error: "effect_not_found", message: "No effect named 'gone'" }],
    }),
    "Replayed 2 failed runs. Skipped 1 failed run that cannot be replayed here (No effect named 'gone').",
  );
  assert.equal(bulkOutcome("replay", { replayed: 1, ids: ["x"], more: true }),
    "Replayed 1 failed run. More match: run it again for the rest.");
});

test("the filters go into the URL hash and come back from it", () => {
  const f = filters({ status: "failed", user: "u 1", tag: "vip&x", since: "2026-11-30T00:00:00.000Z" });
  const hash = filtersHash(f);
  assert.equal(hash, "#all-runs?status=failed&user=u+1&tag=vip%26x&since=2026-11-30T00%3A00%3A00.000Z");
  assert.deepEqual(filtersFromHash(hash), f);
  assert.equal(filtersHash(emptyFilters()), "#all-runs");
  assert.deepEqual(filtersFromHash("#all-runs"), emptyFilters());
  assert.deepEqual(filtersFromHash("#all-runs?status=done&since=yesterday&name=%20ping%20"),
    filters({ name: "ping" }));
  assert.equal(isAllRunsHash("#all-runs"), true);
  assert.equal(isAllRunsHash(hash), true);
  assert.equal(isAllRunsHash("#all-runsx"), false);
  assert.equal(isAllRunsHash("#thread=all-runs"), false);
});

test("filters compare trimmed: what the fields show against what was applied", () => {
  assert.equal(sameFilters(filters({ user: " u1 " }), filters({ user: "u1" })), true);
  assert.equal(sameFilters(filters({ user: "u1" }), emptyFilters()), false);
  assert.equal(sameFilters(filters({ status: "failed" }), emptyFilters()), false);
});

test("a deleted thread's runs leave the model and its counts", () => {
  const runs = [
    { id: "a1", threadId: "a", status: "pending", createdAt: "2026-11-30T10:00:00Z" },
    { id: "b1", threadId: "b", status: "failed", createdAt: "2026-11-30T10:00:01Z" },
    { id: "a2", threadId: "a", status: "failed", createdAt: "2026-11-30T10:00:02Z" },
  ];
  const counts = { pending: 1, running: 0, completed: 0, failed: 2, canceled: 0 };
  const model = snapshotModel(emptyModel(), runs, { counts, now: 0 });
  assert.equal(dropThread(model, "a"), 2);
  assert.deepEqual(visibleRuns(model, "all").map((r) => r.id), ["b1"]);
  assert.deepEqual(model.counts, { pending: 0, running: 0, completed: 0, failed: 1, canceled: 0 });
  assert.equal(dropThread(model, "nobody"), 0);
});
