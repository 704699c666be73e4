// schedules-model.js — pure functions over a thread's recurring schedules (docs/scheduling.md):
// how a schedule recurs, in words, and merging the schedule_changed frames into the list the
// HTTP API gave (oldest first). No DOM here, so node's test runner checks it
// (tests/web/js/schedules-model.test.mjs).

import { fmtRelative, parseTime } from "./format.js";

/**
 * A period in seconds, exactly, in hours, minutes and seconds: "5s", "2.5s", "1m 30s",
 * "25h 1m 1s", "1h" (no part dropped, so two periods that differ show differently).
 */
export function periodText(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "";
  const h = Math.floor(seconds / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = Math.round((seconds % 60) * 1000) / 1000;
  const parts = [];
  if (h) parts.push(`${h}h`);
  if (m) parts.push(`${m}m`);
  if (s || !parts.length) parts.push(`${s}s`);
  return parts.join(" ");
}

/** "cron 0 9 * * 1-5 (Europe/Istanbul)" or "every 1m 30s": how a schedule recurs. */
export function recurrenceText(s) {
  if (s.cron) return `cron ${s.cron} (${s.timezone || "UTC"})`;
  if (s.everySeconds != null) return `every ${periodText(s.everySeconds)}`;
  return "";
}

/**
 * What the row says of the next fire time, given whether the thread is paused.
 * Returns {kind, text, title}: kind "paused" (the schedule is), "never" (no fire time
 * left), "held" (due, but the thread is paused: it fires once the thread is resumed),
 * "due" (due now: it fires when the thread drains, as a run waits its turn), or "next"
 * (in the future; `held` true when the thread is paused). A fire time in the past is
 * never shown as "next … ago".
 */
export function nextFireView(s, now = Date.now(), threadPaused = false) {
  if (s.state === "paused") {
    return { kind: "paused", text: "paused", title: "The schedule is paused: it makes no runs until resumed" };
  }
  const at = parseTime(s.nextFireAt);
  if (!s.nextFireAt || !Number.isFinite(at)) {
    return { kind: "never", text: "never again", title: "Its cron expression fires no more" };
  }
  if (at <= now) {
    return threadPaused
      ? { kind: "held", text: "due · held: thread paused",
          title: "The thread is paused: this fire time makes its run once the thread is resumed" }
      : { kind: "due", text: "due now", title: "Due: the thread makes its run when it next drains" };
  }
  return {
    kind: "next",
    text: `next ${fmtRelative(s.nextFireAt, now)}${threadPaused ? " · thread paused" : ""}`,
    title: threadPaused ? "The thread is paused: nothing fires until it is resumed" : "",
    held: threadPaused,
  };
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
