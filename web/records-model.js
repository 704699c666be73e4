// records-model.js — pure functions over a thread's effect-tool records (docs/effect-tools.md):
// merging the effect_record_changed frames into the list the HTTP API gave, newest first.
// No DOM here, so node's test runner checks it (tests/web/js/records-model.test.mjs).

/** Newest first: by createdAt, then key (both descending), as GET .../effect-records pages. */
export function compareRecords(a, b) {
  const ta = Date.parse(a.createdAt) || 0;
  const tb = Date.parse(b.createdAt) || 0;
  if (ta !== tb) return tb - ta;
  return a.key < b.key ? 1 : a.key > b.key ? -1 : 0;
}

/**
 * The list after one frame's `data` ({key, status, change, ...}): a claimed or applied record
 * replaces the one with its key (or joins the list), a released one leaves it. Returns a new
 * array; `records` is not changed. A frame without a key changes nothing.
 */
export function mergeRecord(records, data) {
  if (!data || typeof data.key !== "string") return records;
  const rest = records.filter((r) => r.key !== data.key);
  if (data.change === "released") return rest;
  const { change: _change, ...record } = data;
  return [...rest, record].sort(compareRecords);
}

/** The records of a fresh page merged with frames that arrived while it loaded (by key). */
export function snapshotRecords(fetched, during) {
  let list = [...fetched].sort(compareRecords);
  for (const data of during) list = mergeRecord(list, data);
  return list;
}

/** A record's result as one line of JSON, cut to `max` characters ("" while in progress). */
export function resultText(record, max = 200) {
  if (record.status !== "applied") return "";
  let text;
  try {
    text = JSON.stringify(record.result);
  } catch {
    text = String(record.result);
  }
  if (text === undefined) text = "null";
  return text.length > max ? `${text.slice(0, max)}…` : text;
}

/** "applied" → "applied", "in_progress" → "in progress": the status as the pane says it. */
export function statusLabel(status) {
  return String(status || "").replace(/_/g, " ");
}
