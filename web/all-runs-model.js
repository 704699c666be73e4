// all-runs-model.js — the "All runs" view's filters as data: the query of `GET /api/runs`,
// the body of the bulk actions, whether a frame belongs to the filtered list, and the
// questions asked before a bulk action. No DOM, no I/O and no clock, so node's test runner
// checks it directly (tests/web/js/all-runs-model.test.mjs). The runs themselves live in a
// runs model (runs-model.js), as a thread's runs do.

/** No filter: every status, every effect, user, tag and due time. */
export function emptyFilters() {
  return { status: "all", name: "", user: "", tag: "", since: "", until: "" };
}

// Filter -> query parameter of GET /api/runs (and field of the bulk bodies).
const PARAMS = [
  ["name", "name"],
  ["user", "user_id"],
  ["tag", "tag"],
  ["since", "since"],
  ["until", "until"],
];

/**
 * The body of `POST /api/runs/cancel|replay` for `filters`: every filter but the status
 * (a bulk action picks its own: pending runs to cancel, failed runs to replay). `since`
 * and `until` are ISO 8601 times. Empty filters are left out.
 */
export function bulkBody(filters) {
  const body = {};
  for (const [key, param] of PARAMS) {
    const value = String(filters[key] ?? "").trim();
    if (value) body[param] = value;
  }
  return body;
}

/** The query of `GET /api/runs` for `filters` (`status` unless "all"), without paging. */
export function listQuery(filters) {
  const query = bulkBody(filters);
  if (filters.status && filters.status !== "all") query.status = filters.status;
  return query;
}

/**
 * Whether a run a frame describes belongs to the list `filters` select, every filter but
 * the status (the list holds every status; the chips pick what is shown): true, false,
 * or null when it cannot tell. Frames say nothing about the run's thread, so with a user
 * or tag filter a run the list does not hold yet is null (the caller asks the server);
 * one it holds (`known`) stays: a run never changes thread.
 */
export function frameMatches(filters, run, known) {
  if (!run) return false;
  if (filters.name && run.name !== filters.name.trim()) return false;
  const due = Date.parse(run.runAt);
  if (filters.since && !(due >= Date.parse(filters.since))) return false;
  if (filters.until && !(due < Date.parse(filters.until))) return false;
  if (known) return true;
  if (String(filters.user ?? "").trim() || String(filters.tag ?? "").trim()) return null;
  return true;
}

/** The filters in words, for the confirmations: ` named ping, of user u1` ("" for none). */
export function describeFilters(filters, fmtTime = (iso) => iso) {
  const parts = [];
  const value = (key) => String(filters[key] ?? "").trim();
  if (value("name")) parts.push(`named ${value("name")}`);
  if (value("user")) parts.push(`of user ${value("user")}`);
  if (value("tag")) parts.push(`tagged ${value("tag")}`);
  if (value("since") && value("until")) parts.push(`due from ${fmtTime(value("since"))} to ${fmtTime(value("until"))}`);
  else if (value("since")) parts.push(`due from ${fmtTime(value("since"))}`);
  else if (value("until")) parts.push(`due before ${fmtTime(value("until"))}`);
  return parts.length ? ` ${parts.join(", ")}` : "";
}

const plural = (n, word) => `${n.toLocaleString("en-US")} ${word}${n === 1 ? "" : "s"}`;

/**
 * The question asked before a bulk action: how many runs (`count`, the server's count for
 * the same filters) and which, naming every filter (or saying there is none). `action`:
 * "cancel" (pending runs) or "replay" (failed runs no run replays yet, as the server does).
 */
export function bulkQuestion(action, count, filters, fmtTime) {
  const which = describeFilters(filters, fmtTime) || " of every thread (no filter)";
  if (action === "cancel") {
    return `Cancel all ${plural(count, "pending run")}${which}? ` +
      "Each is canceled in its own thread; one that starts meanwhile is stopped.";
  }
  return `Replay all ${plural(count, "failed run")}${which} not replayed yet? ` +
    "Each replay is a new run with the same args, due now; failed runs already replayed are left alone.";
}

/** What a bulk action's answer says, for the notice above the list. */
export function bulkOutcome(action, answer) {
  const n = Number(action === "cancel" ? answer?.canceled : answer?.replayed) || 0;
  let done = action === "cancel" ? `Canceled ${plural(n, "run")}.` : `Replayed ${plural(n, "failed run")}.`;
  const skipped = Number(answer?.skipped) || 0;
  if (action === "replay" && skipped > 0) {
    // Runs this server cannot replay (their effect is gone here, or their args no longer
    // pass its schema): the first one's reason stands for them.
    const first = answer?.skippedRuns?.[0]?.message;
    done += ` Skipped ${plural(skipped, "failed run")} that cannot be replayed here` +
      (first ? ` (${first}).` : ".");
  }
  return answer?.more ? `${done} More match: run it again for the rest.` : done;
}

const FILTER_KEYS = ["status", "name", "user", "tag", "since", "until"];
const STATUS_CHIPS = new Set(["all", "pending", "running", "completed", "failed", "canceled"]);

/** Whether two filter sets select the same runs (values compared trimmed). */
export function sameFilters(a, b) {
  return FILTER_KEYS.every((k) => String(a?.[k] ?? "").trim() === String(b?.[k] ?? "").trim());
}

export const ALL_RUNS_HASH = "#all-runs";

/** Whether a URL hash is the All runs view's (`#all-runs`, with or without filters). */
export function isAllRunsHash(hash) {
  return hash === ALL_RUNS_HASH || String(hash).startsWith(`${ALL_RUNS_HASH}?`);
}

/**
 * The URL hash of the All runs view with `filters`: `#all-runs?status=failed&user=u1`
 * (only the filters given; `#all-runs` for none), so a reload, Back or a shared link
 * shows the same list.
 */
export function filtersHash(filters) {
  const params = new URLSearchParams();
  for (const key of FILTER_KEYS) {
    const value = String(filters?.[key] ?? "").trim();
    if (value && !(key === "status" && value === "all")) params.set(key, value);
  }
  const text = params.toString();
  return text ? `${ALL_RUNS_HASH}?${text}` : ALL_RUNS_HASH;
}

/**
 * The filters a hash of `filtersHash` names (the others empty). An unknown status is
 * "all"; a time that is not one is dropped.
 */
export function filtersFromHash(hash) {
  const filters = emptyFilters();
  const at = String(hash).indexOf("?");
  if (at < 0) return filters;
  const params = new URLSearchParams(String(hash).slice(at + 1));
  for (const key of FILTER_KEYS) {
    const value = (params.get(key) ?? "").trim();
    if (!value) continue;
    if (key === "status") filters.status = STATUS_CHIPS.has(value) ? value : "all";
    else if (key === "since" || key === "until") {
      if (Number.isFinite(Date.parse(value))) filters[key] = value;
    } else filters[key] = value;
  }
  return filters;
}

/**
 * Drop the runs of a deleted thread from a runs model (runs-model.js), in place, and take
 * them off its counts (the server's counts are asked for again after). Returns how many
 * runs it dropped.
 */
export function dropThread(model, threadId) {
  const tid = String(threadId);
  let dropped = 0;
  for (const [id, run] of model.runs) {
    if (String(run.threadId) !== tid) continue;
    model.runs.delete(id);
    dropped += 1;
    if (model.counts && Number(model.counts[run.status]) > 0) model.counts[run.status] -= 1;
  }
  if (dropped) model.order = model.order.filter((id) => model.runs.has(id));
  return dropped;
}
