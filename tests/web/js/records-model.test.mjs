// Unit tests of web/records-model.js (node --test; run by tests/web/test_js_units.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  mergeRecord,
  resultText,
  snapshotRecords,
  statusLabel,
} from "../../../web/records-model.js";

const rec = (key, second, extra = {}) => ({
  key,
  toolName: "post_note",
  runId: "turn-1",
  status: "in_progress",
  result: null,
  createdAt: `2026-11-30T12:00:0${second}Z`,
  ...extra,
});

test("frames claim, apply and release records, newest first", () => {
  let list = [];
  list = mergeRecord(list, { ...rec("a", 1), change: "claimed" });
  list = mergeRecord(list, { ...rec("b", 2), change: "claimed" });
  assert.deepEqual(list.map((r) => r.key), ["b", "a"]);
  list = mergeRecord(list, { ...rec("a", 1, { status: "applied", result: { id: 7 } }), change: "applied" });
  assert.deepEqual(list.map((r) => [r.key, r.status]), [["b", "in_progress"], ["a", "applied"]]);
  assert.equal("change" in list[1], false);
  list = mergeRecord(list, { ...rec("b", 2), change: "released" });
  assert.deepEqual(list.map((r) => r.key), ["a"]);
});

test("ties in time go by key, descending, and a frame without a key changes nothing", () => {
  const list = snapshotRecords([rec("a", 1), rec("c", 1)], [{ ...rec("b", 1), change: "claimed" }]);
  assert.deepEqual(list.map((r) => r.key), ["c", "b", "a"]);
  assert.equal(mergeRecord(list, { change: "applied" }), list);
});

test("frames that came during a load win over the page", () => {
  const page = [rec("a", 1)];
  const list = snapshotRecords(page, [{ ...rec("a", 1, { status: "applied", result: 1 }), change: "applied" }]);
  assert.deepEqual(list.map((r) => r.status), ["applied"]);
  assert.equal(page[0].status, "in_progress");
});

test("results and statuses as the pane shows them", () => {
  assert.equal(resultText(rec("a", 1)), "");
  assert.equal(resultText(rec("a", 1, { status: "applied", result: { note: 1 } })), '{"note":1}');
  assert.equal(resultText(rec("a", 1, { status: "applied", result: null })), "null");
  assert.equal(resultText(rec("a", 1, { status: "applied", result: "x".repeat(300) }), 10), `"${"x".repeat(9)}…`);
  assert.equal(statusLabel("in_progress"), "in progress");
});

test("a key shows its distinguishing end", async () => {
  const { keyTail } = await import("../../../web/records-model.js");
  assert.equal(keyTail("note:release"), "note:release");
  const key = "01a22c9b9d36f3d283e8ed1621ea3445:note:release";
  assert.equal(keyTail(key), `…${key.slice(-27)}`);
  assert.equal(keyTail(key).length, 28);
  assert.ok(keyTail(key).endsWith(":note:release"));
});

test("a result cut by the listing shows its preview, marked as cut", async () => {
  const { resultBlock } = await import("../../../web/records-model.js");
  const cut = rec("a", 1, {
    status: "applied", result: null, resultTruncated: true,
    resultPreview: `{"text":"${"x".repeat(1990)}…`, resultChars: 5012,
  });
  assert.equal(resultText(cut, 20), `{"text":"${"x".repeat(11)}…`);
  assert.ok(resultText(cut, 4000).endsWith("x…"));
  const failed = rec("b", 2, { status: "failed", result: { error: "boom" } });
  assert.equal(resultText(failed), '{"error":"boom"}');
  assert.equal(resultBlock(failed), '{\n  "error": "boom"\n}');
  assert.equal(resultText(rec("c", 3)), "");
});
