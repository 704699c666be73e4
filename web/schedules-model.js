// schedules-model.js — pure functions over a thread's recurring schedules (docs/scheduling.md):
// how a schedule recurs, in words, and merging the schedule_changed frames into the list the
// HTTP API gave (oldest first). No DOM here, so node's test runner checks it
// (tests/web/js/schedules-model.test.mjs).

import { fmtDuration } from "./format.js";

/** "cron 0 9 * * 1-5 (Europe/Istanbul)" or "every 1m 30s": how a schedule recurs. */
export function recurrenceText(s) {
  if (s.cron) return `cron ${s.cron} (${s.timezone || "UTC"})`;
  if (s.everySeconds != null) {
    const n = s.everySeconds;
    // Whole seconds under a minute as typed ("every 5s"), the rest as a duration.
    return `every ${Number.isInteger(n) && n < 60 ? `${n}s` : fmtDuration(n * 1000)}`;
  }
  return "";
}

/**
 * The list after one frame's `data` ({id, change, ...}): `canceled` removes the schedule,
 * any other change replaces it (or adds it, in creation order). Returns a new list.
 */
export function mergeSchedule(list, data) {
  if (data.change === "canceled") return list.filter((s) => s.id !== data.id);
  const next = { ...data };
  delete next.change;
  if (list.some((s) => s.id === data.id)) {
    return list.map((s) => (s.id === data.id ? { ...s, ...next } : s));
  }
  const out = [...list, next];
  out.sort((a, b) => (Date.parse(a.createdAt) || 0) - (Date.parse(b.createdAt) || 0));
  return out;
}

/** The question asked before canceling a schedule: its effect, when it fires, its id. */
export function cancelScheduleQuestion(s) {
  return `Cancel the recurring schedule of ${s.name} (${recurrenceText(s)}, ${s.id})? ` +
    "It makes no more runs; the runs it made stay.";
}
