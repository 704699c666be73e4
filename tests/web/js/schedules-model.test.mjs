// Unit tests of web/schedules-model.js (node --test; run by tests/web/test_js_units.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  cancelScheduleQuestion, mergeSchedule, nextFireView, periodText, recurrenceText,
} from "../../../web/schedules-model.js";

const sch = (id, second, extra = {}) => ({
  id,
  name: "send_reminder",
  cron: null,
  timezone: null,
  everySeconds: 60,
  state: "active",
  occurrences: 0,
  skipped: 0,
  createdAt: `2026-11-30T12:00:0${second}Z`,
  ...extra,
});

test("how a schedule recurs, in words", () => {
  assert.equal(recurrenceText(sch("a", 1, { cron: "0 9 * * 1-5", timezone: "Europe/Istanbul" })),
    "cron 0 9 * * 1-5 (Europe/Istanbul)");
  assert.equal(recurrenceText(sch("a", 1, { everySeconds: 90 })), "every 1m 30s");
  assert.equal(recurrenceText(sch("a", 1, { everySeconds: 5 })), "every 5s");
  assert.equal(recurrenceText(sch("a", 1, { everySeconds: 2.5 })), "every 2.5s");
  assert.equal(recurrenceText(sch("a", 1, { cron: "* * * * *" })), "cron * * * * * (UTC)");
  // No part of a period is dropped: seconds stay beside hours.
  assert.equal(recurrenceText(sch("a", 1, { everySeconds: 90061 })), "every 25h 1m 1s");
});

test("periods in hours, minutes and seconds, exactly", () => {
  assert.equal(periodText(3600), "1h");
  assert.equal(periodText(3601), "1h 1s");
  assert.equal(periodText(60), "1m");
  assert.equal(periodText(86400 * 2), "48h");
  assert.equal(periodText(1.25), "1.25s");
  assert.equal(periodText(0), "0s");
});

test("the next fire time never reads 'next … ago' and says when the thread is paused", () => {
  const now = Date.parse("2026-11-30T12:00:00Z");
  const past = sch("a", 1, { nextFireAt: "2026-11-30T11:59:51Z" });
  const future = sch("a", 1, { nextFireAt: "2026-11-30T12:05:00Z" });
  assert.deepEqual([nextFireView(past, now, false).kind, nextFireView(past, now, false).text],
    ["due", "due now"]);
  assert.deepEqual([nextFireView(past, now, true).kind, nextFireView(past, now, true).text],
    ["held", "due · held: thread paused"]);
  assert.equal(nextFireView(future, now, false).text, "next in 5m");
  assert.equal(nextFireView(future, now, true).text, "next in 5m · thread paused");
  assert.equal(nextFireView({ ...future, state: "paused", nextFireAt: null }, now, true).text, "paused");
  assert.equal(nextFireView({ ...future, nextFireAt: null }, now, false).text, "never again");
  for (const paused of [false, true]) {
    assert.ok(!nextFireView(past, now, paused).text.includes("ago"));
  }
});

test("frames add, update and remove schedules, oldest first", () => {
  let list = [];
  list = mergeSchedule(list, { ...sch("b", 2), change: "created" });
  list = mergeSchedule(list, { ...sch("a", 1), change: "created" });
  assert.deepEqual(list.map((s) => s.id), ["a", "b"]);
  list = mergeSchedule(list, { ...sch("a", 1, { occurrences: 1 }), change: "fired" });
  list = mergeSchedule(list, { ...sch("b", 2, { state: "paused" }), change: "paused" });
  assert.deepEqual(list.map((s) => [s.id, s.occurrences, s.state]), [["a", 1, "active"], ["b", 0, "paused"]]);
  assert.equal("change" in list[0], false);
  list = mergeSchedule(list, { ...sch("a", 1), change: "canceled" });
  assert.deepEqual(list.map((s) => s.id), ["b"]);
  assert.deepEqual(mergeSchedule(list, { ...sch("zz", 3), change: "canceled" }), list);
});

test("the cancel question names the effect, when it fires and the id", () => {
  const q = cancelScheduleQuestion(sch("s1", 1, { cron: "0 9 * * *", timezone: "UTC" }));
  assert.match(q, /send_reminder/);
  assert.match(q, /cron 0 9 \* \* \* \(UTC\)/);
  assert.match(q, /s1/);
});
