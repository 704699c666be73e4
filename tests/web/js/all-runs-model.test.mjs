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
  listQuery,
} from "../../../web/all-runs-model.js";

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
    "Replay all 1 failed run? Each replay is a new run with the same args, due now.",
  );
  assert.equal(bulkQuestion("cancel", 1500, emptyFilters()).startsWith("Cancel all 1,500 pending runs?"), true);
  assert.equal(
    describeFilters(filters({ since: "A", until: "B", tag: "vip" }), (iso) => `<${iso}>`),
    " tagged vip, due from <A> to <B>",
  );
  assert.equal(describeFilters(filters({ until: "B" })), " due before B");
});

test("a bulk answer becomes a notice, saying when more runs remain", () => {
  assert.equal(bulkOutcome("cancel", { canceled: 3, ids: [], more: false }), "Canceled 3 runs.");
  assert.equal(bulkOutcome("replay", { replayed: 1, ids: ["x"], more: true }),
    "Replayed 1 failed run. More match: run it again for the rest.");
});
