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

/**
 * A record's result as one line of JSON, cut to `max` characters ("" while in progress).
 * A listing cuts results over 2,000 characters (`resultTruncated`): its `resultPreview` is
 * shown then; the full result comes from GET .../effect-records/{key}.
 */
export function resultText(record, max = 200) {
  if (!record || record.status === "in_progress") return "";
  let text;
  if (record.resultTruncated && typeof record.resultPreview === "string") {
    text = record.resultPreview.replace(/…$/, "");
  } else {
    try {
      text = JSON.stringify(record.result);
    } catch {
      text = String(record.result);
    }
  }
  if (text === undefined) text = "null";
  const cut = text.length > max || record.resultTruncated;
  return cut ? `${text.slice(0, max)}…` : text;
}

/** A record's full result as indented JSON (for the record's detail). */
export function resultBlock(record) {
  if (!record || record.status === "in_progress") return "";
  try {
    const text = JSON.stringify(record.result, null, 2);
    return text === undefined ? "null" : text;
  } catch {
    return String(record.result);
  }
}

/**
 * The end of an effect key, which tells keys apart (keys of one turn share their start,
 * the turn's run id): the whole key when it has at most `max` characters, else "…" and its
 * last `max - 1`.
 */
export function keyTail(key, max = 28) {
  const text = String(key ?? "");
  return text.length > max ? `…${text.slice(text.length - (max - 1))}` : text;
}

/** "applied" → "applied", "in_progress" → "in progress": the status as the pane says it. */
export function statusLabel(status) {
  return String(status || "").replace(/_/g, " ");
}
