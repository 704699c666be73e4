// format.js — pure text helpers shared by the views (times, durations, ids, JSON args).
// No DOM here: node's test runner imports this module as is (tests/web/js/).

/** Milliseconds since the epoch of an ISO 8601 instant, or NaN. */
export function parseTime(iso) {
  if (!iso) return NaN;
  return Date.parse(iso);
}

const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
const dateTimeFmt = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
});

/** Local time; the date is left out when it is today (unless `full`). "—" for no time. */
export function fmtLocal(iso, { full = false, now = Date.now() } = {}) {
  const t = parseTime(iso);
  if (!Number.isFinite(t)) return iso ? String(iso) : "—";
  const d = new Date(t);
  const today = new Date(now).toDateString() === d.toDateString();
  return !full && today ? timeFmt.format(d) : dateTimeFmt.format(d);
}

const zonedFmt = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  timeZoneName: "short",
});

/** Local date and time with the zone ("Nov 30, 2026, 04:46:28 PM UTC"), for questions. */
export function fmtZoned(iso) {
  const t = parseTime(iso);
  return Number.isFinite(t) ? zonedFmt.format(new Date(t)) : iso ? String(iso) : "—";
}

const dayFmt = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric" });
const dayYearFmt = new Intl.DateTimeFormat(undefined, { year: "numeric", month: "short", day: "numeric" });

/**
 * An instant split for a narrow cell: `{date, time}`, local. `date` is "" today, "Nov 29"
 * this year, "Nov 29, 2025" before; `time` has seconds. The cell may wrap between them.
 */
export function timeParts(iso, now = Date.now()) {
  const t = parseTime(iso);
  if (!Number.isFinite(t)) return { date: "", time: iso ? String(iso) : "—" };
  const d = new Date(t);
  const today = new Date(now);
  let date = "";
  if (today.toDateString() !== d.toDateString()) {
    date = (today.getFullYear() === d.getFullYear() ? dayFmt : dayYearFmt).format(d);
  }
  return { date, time: timeFmt.format(d) };
}

function span(s) {
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/** "in 5s", "3m ago", "now"; "" for no time. */
export function fmtRelative(iso, now = Date.now()) {
  const t = parseTime(iso);
  if (!Number.isFinite(t)) return "";
  const diff = t - now;
  const s = Math.round(Math.abs(diff) / 1000);
  if (s < 1) return "now";
  return diff > 0 ? `in ${span(s)}` : `${span(s)} ago`;
}

/** A duration in milliseconds: "<1ms", "240ms", "4.2s", "3m 5s", "2h 10m"; "" when unknown or negative. */
export function fmtDuration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return "";
  if (ms < 1) return "<1ms";
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 10000) return `${(ms / 1000).toFixed(1)}s`;
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

/** How long a run ran (finished - started), or has been running (now - started), in ms. */
export function runDuration(run, now = Date.now()) {
  const start = parseTime(run.startedAt);
  if (!Number.isFinite(start)) return NaN;
  const end = run.status === "running" ? now : parseTime(run.finishedAt);
  return Number.isFinite(end) ? end - start : NaN;
}

/**
 * The one-cell summary of when a run ran, for lists too narrow for the due, started,
 * finished and duration columns: a pending run says when it is due ("in 29m"), a running
 * one how long it has run, a finished one how long it took and when it ended. A canceled
 * run never says "in …": it will not run.
 */
export function whenText(run, now = Date.now()) {
  switch (run.status) {
    case "pending":
      return fmtRelative(run.runAt, now) || "—";
    case "running": {
      const d = fmtDuration(runDuration(run, now));
      return d ? `running ${d}` : "running";
    }
    case "completed":
    case "failed": {
      const d = fmtDuration(runDuration(run, now));
      const ago = fmtRelative(run.finishedAt, now);
      return [d, ago].filter(Boolean).join(" · ") || "—";
    }
    case "canceled": {
      const ago = fmtRelative(run.finishedAt, now);
      return ago ? `canceled ${ago}` : "canceled";
    }
    default:
      return "—";
  }
}

// Ids may be ULIDs or UUIDv7, whose leading characters are a timestamp shared by runs made
// together, so the short form keeps the (random) tail. The full id is in the title.
export function shortId(id) {
  const s = String(id ?? "");
  return s.length > 12 ? `…${s.slice(-8)}` : s;
}

/** The message of any thrown value. */
export function errorText(err) {
  return err && err.message ? err.message : String(err);
}
