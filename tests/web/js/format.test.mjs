// Unit tests of web/format.js and web/args.js (node --test; run by tests/web/test_js_units.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { argsEdited, argsSkeleton } from "../../../web/args.js";
import { fmtDuration, fmtRelative, shortId, timeParts, whenText } from "../../../web/format.js";

const NOW = Date.parse("2026-11-30T12:00:00Z");
const at = (s) => new Date(NOW + s * 1000).toISOString();

test("relative times", () => {
  assert.equal(fmtRelative(at(5), NOW), "in 5s");
  assert.equal(fmtRelative(at(-180), NOW), "3m ago");
  assert.equal(fmtRelative(at(0.2), NOW), "now");
  assert.equal(fmtRelative(null, NOW), "");
});

test("durations", () => {
  assert.equal(fmtDuration(240), "240ms");
  assert.equal(fmtDuration(0.4), "<1ms");
  assert.equal(fmtDuration(4200), "4.2s");
  assert.equal(fmtDuration(185000), "3m 5s");
  assert.equal(fmtDuration(-1), "");
  assert.equal(fmtDuration(NaN), "");
});

test("a canceled run never says when it would have run", () => {
  const canceled = { status: "canceled", runAt: at(1740), finishedAt: at(-60) };
  assert.equal(whenText(canceled, NOW), "canceled 1m ago");
  assert.equal(whenText({ status: "canceled", runAt: at(1740) }, NOW), "canceled");
  assert.equal(whenText({ status: "pending", runAt: at(1740) }, NOW), "in 29m");
});

test("finished and running runs say how long they took", () => {
  const done = { status: "completed", startedAt: at(-10), finishedAt: at(-5.8) };
  assert.equal(whenText(done, NOW), "4.2s · 6s ago");
  assert.equal(whenText({ status: "running", startedAt: at(-3) }, NOW), "running 3.0s");
});

test("short ids keep the random tail", () => {
  assert.equal(shortId("01JABCDEFGHJKMNPQRSTVWXYZ"), "…RSTVWXYZ");
  assert.equal(shortId("short"), "short");
});

const reminder = {
  properties: { text: { type: "string", minLength: 1, maxLength: 2000, description: "What to remind of." } },
  required: ["text"],
};

test("the skeleton never pre-fills args the schema refuses", () => {
  const s = argsSkeleton(reminder);
  assert.equal(s.text, "");
  assert.deepEqual(JSON.parse(s.placeholder), { text: "…" });
  assert.deepEqual(s.needs, [{ name: "text", description: "What to remind of.", limits: "1 to 2000 characters" }]);
});

test("the skeleton uses defaults and values the limits allow", () => {
  const schema = {
    properties: {
      seconds: { type: "number", default: 10, minimum: 0 },
      count: { type: "integer", minimum: 3 },
      url: { anyOf: [{ type: "string" }, { type: "null" }], default: null },
      tag: { type: "string" },
      mode: { enum: ["fast", "slow"] },
    },
    required: ["count", "tag", "mode"],
  };
  assert.deepEqual(JSON.parse(argsSkeleton(schema).text), { seconds: 10, count: 3, url: null, tag: "", mode: "fast" });
  assert.equal(argsSkeleton(null).text, "");
  assert.equal(argsSkeleton({ properties: {} }).text, "{}");
});

test("args count as edited only when they differ from the skeleton", () => {
  const schema = { properties: { reason: { type: "string", default: "x" } } };
  assert.equal(argsEdited(schema, '{"reason":"x"}'), false);
  assert.equal(argsEdited(schema, '{"reason": "y"}'), true);
  assert.equal(argsEdited(reminder, ""), false);
  assert.equal(argsEdited(reminder, '{"text": "hi"}'), true);
  assert.equal(argsEdited(schema, "{not json"), true);
});

test("a time in a cell carries its date only when it is not today", () => {
  assert.equal(timeParts(at(60), NOW).date, "");
  assert.match(timeParts(at(60), NOW).time, /\d\d:\d\d:\d\d/);
  assert.notEqual(timeParts(at(2 * 86400), NOW).date, "");
  assert.doesNotMatch(timeParts(at(2 * 86400), NOW).date, /2026/);
  assert.match(timeParts(at(-400 * 86400), NOW).date, /2025/);
  assert.deepEqual(timeParts(null, NOW), { date: "", time: "—" });
});
