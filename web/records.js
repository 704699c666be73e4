// records.js — the selected thread's effect-tool records (docs/effect-tools.md), below its
// runs: key, tool, status (in progress / applied), result, when, and the turn that claimed
// it. Loaded over HTTP (GET .../effect-records, newest first, paged) and kept live by the
// effect_record_changed frames of the thread's stream; the list logic is records-model.js.

import { html, render } from "./vendor/lit-html/lit-html.js";
import { repeat } from "./vendor/lit-html/directives/repeat.js";
import { api } from "./api.js";
import { fmtLocal, fmtRelative, shortId } from "./format.js";
import { mergeRecord, resultText, snapshotRecords, statusLabel } from "./records-model.js";
import { toastApiError } from "./toasts.js";

const PAGE = 50;
const $ = (id) => document.getElementById(id);

function recordRow(r, now) {
  const status = String(r.status || "");
  return html`<tr data-testid="record-row" data-key=${r.key} data-status=${status}>
    <td class="rec-key mono" title=${r.key}>${r.key}</td>
    <td class="rec-tool">${r.toolName}</td>
    <td class="rec-status"><span class="badge badge-${status === "applied" ? "completed" : "running"}"
      data-testid="record-status">${statusLabel(status)}</span></td>
    <td class="rec-result mono" data-testid="record-result" title=${resultText(r, 4000)}>${resultText(r)}</td>
    <td class="rec-when"><time datetime=${r.updatedAt || r.createdAt || ""}
      title=${r.updatedAt ? fmtLocal(r.updatedAt, { full: true }) : ""}>${fmtRelative(r.updatedAt || r.createdAt, now)}</time></td>
    <td class="rec-turn mono" data-testid="record-turn" title=${r.runId || ""}>${r.runId ? shortId(r.runId) : ""}</td>
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
    this.resetState();
  }

  resetState() {
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

  /** An effect_record_changed frame's `data`. */
  onFrame(data) {
    if (!this.session || this.session.gone) return;
    if (this.during) this.during.push(data);
    this.records = mergeRecord(this.records, data);
    this.draw();
  }

  draw(now = Date.now()) {
    const list = this.session && !this.session.gone ? this.records : [];
    render(repeat(list, (r) => r.key, (r) => recordRow(r, now)), this.el.tbody);
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
