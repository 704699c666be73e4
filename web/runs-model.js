// runs-model.js — the selected thread's runs as data: ordering, merging what the API and
// the frames say, and the per-status counts. No DOM, no I/O and no clock (callers pass
// `now`), so node's test runner checks it directly (tests/web/js/runs-model.test.mjs).
//
// A model is `{runs: Map(id -> run), order: [id, newest first], maxT, counts}`; `counts`
// are the server's per-status totals of the whole thread (null until a list answer brings
// them), kept current from frames. Functions named apply*/merge* update the model they are
// given in place (a thread can hold thousands of runs; copying them per frame would cost
// more than it clarifies); the others only read.

export const STATUSES = ["pending", "running", "completed", "failed", "canceled"];
export const TERMINAL = new Set(["completed", "failed", "canceled"]);

/** An empty model. */
export function emptyModel() {
  return { runs: new Map(), order: [], maxT: 0, counts: null };
}

// A run only known from a frame has no createdAt; it was just made (or just became
// interesting), so it goes on top, newer arrivals above older ones.
function timeOf(model, run, now) {
  const t = Date.parse(run.createdAt);
  if (Number.isFinite(t)) {
    if (t > model.maxT) model.maxT = t;
    return t;
  }
  if (Number.isFinite(run._t)) return run._t;
  model.maxT = Math.max(now, model.maxT + 1);
  return model.maxT;
}

/** Newest first; ties broken by id (descending) so the order is stable. */
export function compareRuns(a, b) {
  return b._t - a._t || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0);
}

function lowerBound(model, run) {
  const { order, runs } = model;
  let lo = 0;
  let hi = order.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (compareRuns(runs.get(order[mid]), run) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * Whether `incoming` is older news than `existing`: a finished run never runs again (a
 * replay is a new run), and attempts only grow.
 */
export function isStale(existing, incoming) {
  if (TERMINAL.has(existing.status) && incoming.status && !TERMINAL.has(incoming.status)) return true;
  if (Number.isFinite(incoming.attempts) && Number.isFinite(existing.attempts)) {
    return incoming.attempts < existing.attempts;
  }
  return false;
}

/** How far along a run is; picks between a frame and a snapshot that raced. */
export function progress(run) {
  if (TERMINAL.has(run.status)) return Number.MAX_SAFE_INTEGER;
  return (Number(run.attempts) || 0) * 2 + (run.status === "running" ? 1 : 0);
}

/**
 * Upsert one run (from a list, a single GET, a frame or an action's answer) and keep the
 * order. Returns the run as stored, or null for something without an id. Every change
 * bumps the run's `_v`.
 */
export function mergeRun(model, incoming, now) {
  if (!incoming || incoming.id == null) return null;
  const id = String(incoming.id);
  const existing = model.runs.get(id);
  if (!existing) {
    const run = { ...incoming, id, _v: 1 };
    run._t = timeOf(model, run, now);
    model.runs.set(id, run);
    model.order.splice(lowerBound(model, run), 0, id);
    return run;
  }
  if (isStale(existing, incoming)) return existing;
  const oldT = existing._t;
  Object.assign(existing, incoming, { id });
  existing._v += 1;
  const t = timeOf(model, existing, now);
  if (t !== oldT) {
    const i = model.order.indexOf(id);
    if (i >= 0) model.order.splice(i, 1);
    existing._t = t;
    model.order.splice(lowerBound(model, existing), 0, id);
  }
  return existing;
}

// How each change moves a run between statuses, so the server's totals stay current from
// frames alone, even for runs beyond the loaded pages.
const TRANSITIONS = {
  scheduled: [null, "pending"],
  started: ["pending", "running"],
  completed: ["running", "completed"],
  failed: ["running", "failed"],
  canceled: ["pending", "canceled"],
  requeued: ["running", "pending"],
};

/**
 * The server totals after one change (`data.change` of a frame); null stays null.
 * `known`: the run's status before the change, when the model has it (a cancel ends a
 * pending or a running run).
 */
export function countChange(counts, change, known = null) {
  const t = TRANSITIONS[change];
  if (!counts || !t) return counts;
  let [from, to] = t;
  if (change === "canceled" && (known === "pending" || known === "running")) from = known;
  const next = { ...counts };
  if (from && next[from] > 0) next[from] -= 1;
  next[to] = (next[to] || 0) + 1;
  return next;
}

/**
 * Fold the `data` of one effect_changed frame into the model. Frames never carry args,
 * and never clobber the args we have. Returns the run's id, or null when the frame names
 * no run.
 */
export function applyFrame(model, data, now) {
  if (!data || data.id == null) return null;
  const { change, args: _ignored, ...fields } = data;
  if (change) fields.lastChange = change;
  const before = model.runs.get(String(data.id));
  model.counts = countChange(model.counts, change, before && !isStale(before, fields) ? before.status : null);
  mergeRun(model, fields, now);
  return String(data.id);
}

/**
 * A new model from a fresh list answer (`fetched`, in any order, duplicates allowed).
 *
 * `during`: ids that frames changed while the list was read; for those the model's copy
 * wins when it is further along, and runs only frames brought stay. `keep`: an id kept
 * even when the list no longer reaches it (the run open in the detail view). `counts`:
 * the server's totals from the list answer.
 */
export function snapshotModel(previous, fetched, { during = new Set(), keep = null, counts = null, now }) {
  const old = previous.runs;
  const runs = new Map();
  for (const r of fetched) {
    if (!r || r.id == null) continue;
    const id = String(r.id);
    if (runs.has(id)) continue;
    const before = old.get(id);
    let run = { ...r, id };
    if (before) {
      if (during.has(id) && progress(before) > progress(run)) run = { ...run, ...before };
      else {
        // Lists carry neither args nor attempts: keep those a single GET brought (the
        // detail asks again when the run's status or attempt count moves on).
        if ("args" in before && !("args" in run)) run.args = before.args;
        if ("attemptDetails" in before && !("attemptDetails" in run)) {
          run.attemptDetails = before.attemptDetails;
          run.attemptsFor = before.attemptsFor;
        }
      }
      run._v = before._v + 1;
      run._t = before._t;
    } else {
      run._v = 1;
    }
    runs.set(id, run);
  }
  for (const id of during) if (!runs.has(id) && old.has(id)) runs.set(id, old.get(id));
  if (keep !== null && !runs.has(keep) && old.has(keep)) runs.set(keep, old.get(keep));

  const model = { runs, order: [], maxT: previous.maxT, counts: counts ? { ...counts } : null };
  for (const run of runs.values()) run._t = timeOf(model, run, now);
  model.order = [...runs.values()].sort(compareRuns).map((run) => run.id);
  return model;
}

/** Per-status counts and their sum ("all"): the server's totals when known, else the loaded runs. */
export function statusCounts(model) {
  const counts = { all: 0 };
  for (const s of STATUSES) counts[s] = 0;
  if (model.counts) {
    for (const s of STATUSES) counts[s] = Number(model.counts[s]) || 0;
    counts.all = STATUSES.reduce((n, s) => n + counts[s], 0);
  } else {
    for (const run of model.runs.values()) {
      counts.all += 1;
      if (run.status in counts) counts[run.status] += 1;
    }
  }
  return counts;
}

/** The runs a filter ("all" or a status) shows, newest first. */
export function visibleRuns(model, filter) {
  const out = [];
  for (const id of model.order) {
    const run = model.runs.get(id);
    if (run && (filter === "all" || run.status === filter)) out.push(run);
  }
  return out;
}

/**
 * The id of the running run a pending run waits behind, or null: the run is due (by
 * `now`, ms) and its thread runs another run (one at a time). The server's `waitingFor`
 * (from a list or a single-run answer) wins while that run still runs; frames carry none,
 * so between answers the running run of the model stands in.
 */
export function waitingFor(model, run, now) {
  if (!run || run.status !== "pending") return null;
  const due = Date.parse(run.runAt);
  if (!Number.isFinite(due) || due > now) return null;
  if (run.waitingFor) {
    const named = model.runs.get(String(run.waitingFor));
    if (!named || named.status === "running") return String(run.waitingFor);
  }
  for (const id of model.order) {
    const other = model.runs.get(id);
    if (other.status === "running" && id !== String(run.id) && sameThread(run, other)) return id;
  }
  return null;
}

// A model of runs across threads (the "All runs" view) holds runs of many threads; only a
// running run of the same thread holds a run back. Runs of one thread's model may lack it.
function sameThread(a, b) {
  return a.threadId == null || b.threadId == null || String(a.threadId) === String(b.threadId);
}
