// records.js — the selected thread's effect-tool records (docs/effect-tools.md), below its
// runs: key, tool, status (in progress / applied), result, when, and the turn that claimed
// it. Loaded over HTTP (GET .../effect-records, newest first, paged) and kept live by the
// effect_record_changed frames of the thread's stream; the list logic is records-model.js.
// A key shows its distinguishing end (keys of one turn share their start); at phone width
// the tool goes above it. Tapping a row (or Enter on it) opens the full record below it,
// its result fetched in full (GET .../effect-records/{key}) when the listing cut it.

import { html, render } from "./vendor/lit-html/lit-html.js";
import { repeat } from "./vendor/lit-html/directives/repeat.js";
import { api } from "./api.js";
import { fmtLocal, fmtRelative, shortId } from "./format.js";
import {
  keyTail, mergeRecord, resultBlock, resultText, snapshotRecords, statusLabel,
} from "./records-model.js";
import { toastApiError } from "./toasts.js";

const PAGE = 50;
const NARROW = window.matchMedia("(max-width: 700px)"); // as style.css hides Tool and Turn
const $ = (id) => document.getElementById(id);

function recordRow(r, now, view) {
  const status = String(r.status || "");
  const open = view.openKey === r.key;
  const toggle = () => view.toggle(r.key);
  const onKey = (e) => {
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      toggle();
    }
  };
  return html`<tr data-testid="record-row" data-key=${r.key} data-status=${status}
      class="rec-row${open ? " open" : ""}" tabindex="0" aria-expanded=${open ? "true" : "false"}
      @click=${toggle} @keydown=${onKey}>
    <td class="rec-key mono" title=${r.key}><span class="rec-key-tool"
      data-testid="record-key-tool">${r.toolName}</span><span class="rec-key-tail"
      data-testid="record-key"><span>${keyTail(r.key)}</span></span></td>
    <td class="rec-tool">${r.toolName}</td>
    <td class="rec-status"><span class="badge badge-${status === "applied" ? "completed" : "running"}"
      data-testid="record-status">${statusLabel(status)}</span></td>
    <td class="rec-result mono" data-testid="record-result" title=${resultText(r, 4000)}>${resultText(r)}</td>
    <td class="rec-when"><time datetime=${r.updatedAt || r.createdAt || ""}
      title=${r.updatedAt ? fmtLocal(r.updatedAt, { full: true }) : ""}>${fmtRelative(r.updatedAt || r.createdAt, now)}</time></td>
    <td class="rec-turn mono" data-testid="record-turn" title=${r.runId || ""}>${r.runId ? shortId(r.runId) : ""}</td>
  </tr>`;
}

function recordDetail(r, view) {
  const full = r.resultTruncated ? view.full.get(r.key) : r;
  const result = r.status === "in_progress"
    ? "(in progress: nothing recorded yet)"
    : full ? resultBlock(full) : "Loading the full result…";
  // Span the columns shown (style.css hides two at phone width), or the fixed layout of the
  // table would make room for the hidden ones and squeeze the visible.
  const span = NARROW.matches ? 4 : 6;
  return html`<tr class="rec-detail" data-testid="record-detail" data-key=${r.key}>
    <td colspan=${span}><dl class="rec-fields">
      <dt>Effect key</dt><dd class="mono" data-testid="record-detail-key">${r.key}</dd>
      <dt>Tool</dt><dd data-testid="record-detail-tool">${r.toolName}</dd>
      <dt>Status</dt><dd>${statusLabel(r.status)}</dd>
      <dt>Turn</dt><dd class="mono">${r.runId || "—"}</dd>
      <dt>Updated</dt><dd>${r.updatedAt ? fmtLocal(r.updatedAt, { full: true }) : "—"}</dd>
      <dt>Result</dt><dd><pre class="rec-result-full mono"
        data-testid="record-detail-result">${result}</pre></dd>
    </dl></td>
  </tr>`;
}

export class RecordsView {
  /** `ctx`: {handledAsGone(session, err)}. */
  constructor(ctx) {
    this.ctx = ctx;
    this.session = null;
    this.el = {
      section: $("records-section"),
      tbody: $("records-body"),
      empty: $("records-empty"),
      more: $("records-more"),
      count: $("records-count"),
    };
    this.el.more.addEventListener("click", () => this.loadMore());
    NARROW.addEventListener("change", () => this.draw());
    this.resetState();
  }

  resetState() {
    this.openKey = null; // the record whose detail is open
    this.full = new Map(); // key -> the full record, for results the listing cut
    this.records = [];
    this.cursor = null;
    this.loading = false;
    this.reloadQueued = false;
    this.during = null; // frames that arrive while a page loads
    this.loadedOnce = false;
  }

  reset(session) {
    this.session = session;
    this.resetState();
    this.draw();
  }

  /** The first page again (on every (re)connect of the stream, and after a seq gap). */
  async reload() {
    const s = this.session;
    if (!s || s.gone) return;
    if (this.loading) {
      this.reloadQueued = true;
      return;
    }
    this.loading = true;
    this.reloadQueued = false;
    this.during = [];
    try {
      const page = await api.effectRecords(s.tid, { limit: PAGE }, { signal: s.signal });
      if (s.closed) return;
      this.records = snapshotRecords(page.records || [], this.during);
      this.cursor = page.nextCursor || null;
      this.loadedOnce = true;
    } catch (err) {
      if (s.closed) return;
      if (!this.ctx.handledAsGone(s, err)) toastApiError("Could not load effect records", err);
    } finally {
      if (!s.closed) {
        this.loading = false;
        this.during = null;
        this.draw();
        if (this.reloadQueued) this.reload();
      }
    }
  }

  async loadMore() {
    const s = this.session;
    if (!s || s.gone || !this.cursor || this.loading) return;
    this.loading = true;
    try {
      const page = await api.effectRecords(s.tid, { limit: PAGE, cursor: this.cursor }, { signal: s.signal });
      if (s.closed) return;
      const known = new Set(this.records.map((r) => r.key));
      this.records = snapshotRecords(
        [...this.records, ...(page.records || []).filter((r) => !known.has(r.key))],
        [],
      );
      this.cursor = page.nextCursor || null;
    } catch (err) {
      if (s.closed) return;
      if (!this.ctx.handledAsGone(s, err)) toastApiError("Could not load effect records", err);
    } finally {
      if (!s.closed) {
        this.loading = false;
        this.draw();
      }
    }
  }

  /** Open (or close) a record's detail; fetch its full result when the listing cut it. */
  async toggle(key) {
    this.openKey = this.openKey === key ? null : key;
    this.draw();
    const s = this.session;
    const r = this.records.find((x) => x.key === key);
    if (!s || !r || this.openKey !== key || !r.resultTruncated || this.full.has(key)) return;
    try {
      const record = await api.effectRecord(s.tid, key, { signal: s.signal });
      if (s.closed) return;
      this.full.set(key, record);
      this.draw();
    } catch (err) {
      if (s.closed) return;
      if (!this.ctx.handledAsGone(s, err)) toastApiError("Could not load the effect record", err);
    }
  }

  /** An effect_record_changed frame's `data`. */
  onFrame(data) {
    if (!this.session || this.session.gone) return;
    if (this.during) this.during.push(data);
    this.records = mergeRecord(this.records, data);
    this.full.delete(data.key); // a changed record's full result is fetched again
    this.draw();
  }

  draw(now = Date.now()) {
    const list = this.session && !this.session.gone ? this.records : [];
    const rows = [];
    for (const r of list) {
      rows.push({ id: `row:${r.key}`, tpl: () => recordRow(r, now, this) });
      if (r.key === this.openKey) rows.push({ id: `detail:${r.key}`, tpl: () => recordDetail(r, this) });
    }
    render(repeat(rows, (x) => x.id, (x) => x.tpl()), this.el.tbody);
    this.el.empty.hidden = list.length > 0;
    const s = this.session;
    this.el.empty.textContent = s && s.broken
      ? "This thread's effect-tool records cannot be loaded."
      : s && s.gone
        ? "This thread does not exist."
        : this.loadedOnce || !s
          ? "No effect-tool records: an agent's effect tools record here what they applied."
          : "Loading…";
    this.el.more.hidden = !this.cursor;
    this.el.count.textContent = list.length ? `(${list.length}${this.cursor ? "+" : ""})` : "";
  }
}
