// all-runs.js — the "All runs" view (#all-runs): the runs of every thread from
// `GET /api/runs`, its filters (status chips with the server's counts, effect name, user,
// tag, due time range), paging by the API's cursor, the per-run actions of the thread view,
// bulk "cancel all pending" / "replay all failed" on the filtered list, and live updates
// from `WS /api/stream`. Selecting a run opens its thread and its detail (app.js).
//
// The runs live in a runs model (runs-model.js) as a thread's do; what belongs to the
// filtered list and what the bulk actions ask is pure (all-runs-model.js).

import { html, nothing, render } from "./vendor/lit-html/lit-html.js";
import { repeat } from "./vendor/lit-html/directives/repeat.js";
import { api, ApiError, RunStream, askForToken } from "./api.js";
import {
  bulkBody,
  bulkOutcome,
  bulkQuestion,
  dropThread,
  emptyFilters,
  filtersHash,
  frameMatches,
  listQuery,
  sameFilters,
} from "./all-runs-model.js";
import { fmtDuration, fmtRelative, fmtZoned, runDuration, shortId, timeParts, whenText } from "./format.js";
import { actionButtons, cancelQuestion, statusClass } from "./runs.js";
import {
  applyFrame,
  emptyModel,
  mergeRun,
  progress,
  snapshotModel,
  statusCounts,
  visibleRuns,
  waitingFor,
} from "./runs-model.js";
import { ThreadSession } from "./session.js";
import { toast, toastApiError } from "./toasts.js";

const $ = (id) => document.getElementById(id);
const PAGE = 100;
const FINISHING = new Set(["completed", "failed", "canceled"]);
const COUNTS_SYNC_MS = 2000; // as runs.js: retention prunes without a frame
const RELOAD_MS = 500; // a frame the view cannot place (user / tag filter): ask again, once
const ACTION_LABEL = { "run-now": "Run now", cancel: "Cancel", replay: "Replay" };

function timeText(iso, now) {
  if (!iso) return "—";
  const { date, time } = timeParts(iso, now);
  return html`${date ? html`<span class="nw">${date}</span> ` : nothing}<span class="nw">${time}</span>`;
}

// A datetime-local input's value (local time) as an ISO 8601 instant, or "".
function isoFromLocal(value) {
  if (!value) return "";
  const t = new Date(value).getTime();
  return Number.isFinite(t) ? new Date(t).toISOString() : "";
}

// An ISO 8601 instant as a datetime-local input's value (local time, to the second), or "".
function localFromIso(iso) {
  const t = Date.parse(iso);
  if (!iso || !Number.isFinite(t)) return "";
  const d = new Date(t);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export class AllRunsView {
  /**
   * `ctx`: {openRun(threadId, runId), onStreamState(conn, detail), onThreadFrame(frame),
   * effects()} — onThreadFrame: every frame, for the thread list; effects(): the
   * discovered effects, for the name filter's suggestions.
   */
  constructor(ctx) {
    this.ctx = ctx;
    this.filters = emptyFilters();
    this.session = null; // a ThreadSession per load: aborting it drops its answers
    this.stream = null;
    this.shown = false;
    this.el = {
      section: $("all-runs-view"),
      form: $("all-filter-form"),
      name: $("all-name"),
      names: $("all-effect-names"),
      user: $("all-user"),
      tag: $("all-tag"),
      since: $("all-since"),
      until: $("all-until"),
      clear: $("all-clear"),
      chips: $("all-filters"),
      cancelAll: $("all-cancel-pending"),
      replayAll: $("all-replay-failed"),
      notice: $("all-notice"),
      incomplete: $("all-incomplete"),
      table: $("all-table"),
      tbody: $("all-body"),
      empty: $("all-empty"),
      more: $("all-more"),
      reload: $("all-reload"),
    };
    this.resetState();
    this.wire();
  }

  resetState() {
    clearTimeout(this.countsTimer);
    clearTimeout(this.reloadTimer);
    this.countsTimer = null;
    this.reloadTimer = null;
    this.model = emptyModel();
    this.cursor = null;
    this.exhausted = false;
    this.loadedOnce = false;
    this.loading = false;
    this.loadingMore = false;
    this.reloadQueued = false;
    this.framesDuringLoad = null;
    this.deletedDuringLoad = null; // threads deleted while a reload was on its way
    this.complete = true;
    this.drawScheduled = false;
  }

  wire() {
    const el = this.el;
    el.form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.applyForm();
    });
    el.clear.addEventListener("click", () => {
      el.form.reset();
      this.applyForm();
    });
    el.reload.addEventListener("click", () => this.reload());
    el.more.addEventListener("click", () => this.loadMore());
    el.chips.addEventListener("click", (ev) => {
      const chip = ev.target.closest("button[data-filter]");
      if (chip) this.setFilters({ ...this.filters, status: chip.dataset.filter });
    });
    el.cancelAll.addEventListener("click", () => this.bulk("cancel", el.cancelAll));
    el.replayAll.addEventListener("click", () => this.bulk("replay", el.replayAll));
    el.tbody.addEventListener("click", (ev) => {
      const tr = ev.target.closest("tr[data-run-id]");
      if (!tr) return;
      const btn = ev.target.closest("button[data-action]");
      if (btn) this.act(btn.dataset.action, tr.dataset.runId, btn);
      else this.ctx.openRun(tr.dataset.threadId, tr.dataset.runId);
    });
    el.tbody.addEventListener("keydown", (ev) => {
      const tr = ev.target;
      if (!(tr instanceof HTMLTableRowElement) || !tr.dataset.runId) return;
      if (ev.key === "Enter" || ev.key === " ") {
        ev.preventDefault();
        this.ctx.openRun(tr.dataset.threadId, tr.dataset.runId);
      } else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
        ev.preventDefault();
        const next = ev.key === "ArrowDown" ? tr.nextElementSibling : tr.previousElementSibling;
        if (next) next.focus();
      }
    });
  }

  /** What the filter fields show (trimmed), with the applied status. */
  formFilters() {
    const el = this.el;
    return {
      status: this.filters.status,
      name: el.name.value.trim(),
      user: el.user.value.trim(),
      tag: el.tag.value.trim(),
      since: isoFromLocal(el.since.value),
      until: isoFromLocal(el.until.value),
    };
  }

  applyForm() {
    this.setFilters(this.formFilters());
  }

  /** Show `filters` in the fields (the spaces trimmed away, times in local time). */
  fillForm(filters) {
    const el = this.el;
    for (const key of ["name", "user", "tag"]) {
      if (el[key].value !== filters[key]) el[key].value = filters[key];
    }
    for (const key of ["since", "until"]) {
      // The field shows seconds at most: keep its value while it names the same time.
      if (isoFromLocal(el[key].value) !== filters[key]) el[key].value = localFromIso(filters[key]);
    }
  }

  /** Apply `filters`: the fields and the URL hash show them; a new list is loaded. */
  setFilters(filters) {
    const same = sameFilters(filters, this.filters);
    this.filters = { ...filters };
    this.fillForm(this.filters);
    this.writeHash();
    if (same) return;
    this.setNotice(null);
    this.restart();
  }

  // The filters live in the URL hash (#all-runs?status=failed&user=u1): a reload, Back or
  // a shared link shows the same list. Replaced, not pushed: Back leaves the view.
  writeHash() {
    if (!this.shown) return;
    const want = filtersHash(this.filters);
    if (location.hash !== want) history.replaceState(null, "", location.pathname + location.search + want);
  }

  // ---------------------------------------------------------------- showing

  /** Show the view with `filters` (those of the URL hash): load the list and follow every thread's run changes. */
  show(filters = emptyFilters()) {
    if (this.shown) {
      this.setFilters(filters);
      return;
    }
    this.shown = true;
    this.el.section.hidden = false;
    this.drawEffectNames();
    this.filters = { ...filters };
    this.fillForm(this.filters);
    this.writeHash();
    this.restart();
    const stream = new RunStream(null, {
      onState: (conn, detail) => {
        if (this.stream !== stream) return;
        this.ctx.onStreamState(conn, detail);
        if (conn === "offline" && !this.loadedOnce && !this.loading) this.reload();
      },
      // Frames sent while the socket was down are gone: load again on every (re)connect.
      onOpen: () => {
        if (this.stream === stream) this.reload();
      },
      onFrame: (frame) => {
        if (this.stream === stream) this.onFrame(frame);
      },
      onNotFound: () => {},
      onAuth: () => askForToken(true),
    });
    this.stream = stream;
    stream.start();
  }

  hide() {
    if (!this.shown) return;
    this.shown = false;
    this.el.section.hidden = true;
    if (this.stream) this.stream.stop();
    this.stream = null;
    if (this.session) this.session.close();
    this.session = null;
    this.resetState();
    render(nothing, this.el.tbody);
  }

  /** The token changed: everything may have failed for want of it. */
  reconnect() {
    if (!this.shown) return;
    if (this.stream) this.stream.reconnectNow();
    this.reload();
  }

  // A fresh list for new filters: answers for the old ones are dropped.
  restart() {
    if (this.session) this.session.close();
    this.session = new ThreadSession("*");
    this.resetState();
    this.draw();
    if (this.shown) this.reload();
  }

  drawEffectNames() {
    const names = (this.ctx.effects() || []).map((e) => e.name);
    render(names.map((n) => html`<option value=${n}></option>`), this.el.names);
  }

  // ---------------------------------------------------------------- loading

  async fetchPage(s, cursor, extra = {}) {
    return api.listAllRuns(
      { ...listQuery(this.filters), limit: PAGE, cursor: cursor || undefined, ...extra },
      { signal: s.signal },
    );
  }

  /** (Re)load as many runs as are loaded (at least a page), with the server's counts. */
  async reload() {
    const s = this.session;
    if (!s || !this.shown) return;
    if (this.loading) {
      this.reloadQueued = true;
      return;
    }
    this.loading = true;
    this.framesDuringLoad = new Set();
    this.deletedDuringLoad = new Set();
    this.el.table.setAttribute("aria-busy", "true");
    this.drawEffectNames(); // the effects may have arrived since the view was shown
    const want = Math.max(this.loadedOnce ? this.model.runs.size : 0, 1);
    const fetched = [];
    let counts = null;
    let cursor = null;
    let complete = true;
    try {
      do {
        const res = await this.fetchPage(s, cursor);
        if (s.closed) return;
        if (counts === null) counts = res.counts || null;
        complete = complete && res.complete !== false;
        fetched.push(...(Array.isArray(res.runs) ? res.runs : []));
        cursor = res.nextCursor || null;
      } while (cursor && fetched.length < want);
      this.model = snapshotModel(this.model, fetched, { during: this.framesDuringLoad, counts, now: Date.now() });
      // A thread deleted while the pages were on their way: the pages may still have its runs.
      for (const threadId of this.deletedDuringLoad) dropThread(this.model, threadId);
      this.cursor = cursor;
      this.exhausted = !cursor;
      this.complete = complete;
      this.loadedOnce = true;
    } catch (err) {
      if (!s.closed) toastApiError("Could not load the runs of every thread", err);
    } finally {
      if (!s.closed) {
        this.loading = false;
        this.framesDuringLoad = null;
        this.deletedDuringLoad = null;
        this.el.table.removeAttribute("aria-busy");
        this.draw();
        if (this.reloadQueued) {
          this.reloadQueued = false;
          this.reload();
        }
      }
    }
  }

  async loadMore() {
    const s = this.session;
    if (!s || this.loading || this.loadingMore || this.exhausted) return;
    this.loadingMore = true;
    this.draw();
    try {
      const res = await this.fetchPage(s, this.cursor);
      if (s.closed) return;
      const now = Date.now();
      for (const r of Array.isArray(res.runs) ? res.runs : []) mergeRun(this.model, r, now);
      this.cursor = res.nextCursor || null;
      this.exhausted = !this.cursor;
    } catch (err) {
      if (!s.closed) toastApiError("Could not load more runs", err);
    } finally {
      if (!s.closed) {
        this.loadingMore = false;
        this.draw();
      }
    }
  }

  /** One frame of `WS /api/stream`: an effect_changed or a thread_deleted of any thread. */
  onFrame(frame) {
    if (!frame || frame.type !== "event") return;
    if (frame.threadId != null) this.ctx.onThreadFrame(frame); // the thread list follows too
    if (frame.eventType === "thread_deleted") {
      if (frame.threadId == null) return;
      // Its runs are gone: nothing to show or act on; the counts are asked for again.
      dropThread(this.model, frame.threadId);
      if (this.deletedDuringLoad) this.deletedDuringLoad.add(String(frame.threadId));
      this.scheduleDraw();
      this.scheduleCountsSync(0);
      return;
    }
    if (frame.eventType !== "effect_changed") return;
    const data = frame.data;
    if (!data || data.id == null) return;
    const run = { ...data, threadId: frame.threadId ?? data.threadId };
    const known = this.model.runs.has(String(data.id));
    const verdict = frameMatches(this.filters, { ...this.model.runs.get(String(data.id)), ...run }, known);
    if (verdict === false) return;
    if (verdict === null) {
      // A run of a thread the frame does not describe (user or tag filter): ask the server.
      if (!this.reloadTimer) {
        this.reloadTimer = setTimeout(() => {
          this.reloadTimer = null;
          this.reload();
        }, RELOAD_MS);
      }
      return;
    }
    const id = applyFrame(this.model, run, Date.now());
    if (id === null) return;
    if (this.framesDuringLoad) this.framesDuringLoad.add(id);
    this.scheduleDraw();
    if (FINISHING.has(data.change)) this.scheduleCountsSync();
  }

  scheduleCountsSync(delay = COUNTS_SYNC_MS) {
    if (this.countsTimer) return;
    const s = this.session;
    this.countsTimer = setTimeout(async () => {
      this.countsTimer = null;
      if (!s || s.closed || s !== this.session) return;
      try {
        const res = await api.listAllRuns({ ...listQuery(this.filters), limit: 1 }, { signal: s.signal });
        if (s.closed || !res || typeof res.counts !== "object") return;
        this.model.counts = { ...res.counts };
        this.scheduleDraw();
      } catch {
        // The next finishing frame (or reload) tries again.
      }
    }, delay);
  }

  // ---------------------------------------------------------------- drawing

  row(run, now) {
    const err = run.error ? String(run.error) : "";
    const firstLine = err.split("\n", 1)[0].slice(0, 300);
    const waiting = waitingFor(this.model, run, now);
    const tid = run.threadId == null ? "" : String(run.threadId);
    return html`<tr class="run-row" data-testid="all-run-row" data-run-id=${run.id} data-thread-id=${tid}
        data-status=${run.status || ""} tabindex="0">
      <td class="mono cell-id" title=${run.id}>${shortId(run.id)}</td>
      <td class="cell-name" title=${run.name || ""}>${run.name || ""}${
        run.key ? html`<span class="run-key muted mono" title=${`Key: ${run.key}`}>key ${run.key}</span>` : nothing
      }</td>
      <td class="cell-status"><span class=${statusClass(run.status)} title=${firstLine}>${run.status || "?"}</span>${
        waiting
          ? html`<span class="run-waiting" data-testid="run-waiting" data-waiting-for=${waiting}
              title=${`Due, waiting for run ${waiting} of its thread to finish (one at a time)`}>waiting for ${shortId(waiting)}</span>`
          : nothing
      }</td>
      <td class="cell-thread" title=${tid}><button type="button" class="link" data-testid="run-thread"
        aria-label=${`Open thread ${tid}`}>${shortId(tid)}</button></td>
      <td class="cell-due" title=${run.runAt || ""}>${timeText(run.runAt, now)}${
        run.status === "pending" ? html` <span class="rel muted nw">${fmtRelative(run.runAt, now)}</span>` : nothing
      }</td>
      <td class="cell-started" title=${run.startedAt || ""}>${timeText(run.startedAt, now)}</td>
      <td class="cell-finished" title=${run.finishedAt || ""}>${timeText(run.finishedAt, now)}</td>
      <td class="num cell-dur">${fmtDuration(runDuration(run, now)) || "—"}</td>
      <td class="cell-when">${whenText(run, now)}</td>
      <td class="num cell-att">${run.attempts == null ? "" : String(run.attempts)}</td>
      <td class="cell-error"><div class="error-line">
        <span class="error-text" title=${err.slice(0, 2000)}>${firstLine}</span>
        <span class="cell-actions">${actionButtons(run, waiting)}</span>
      </div></td>
      <td class="cell-open" aria-hidden="true">›</td>
    </tr>`;
  }

  draw(now = Date.now()) {
    if (!this.shown) return;
    const runs = visibleRuns(this.model, this.filters.status);
    render(repeat(runs, (run) => run.id, (run) => this.row(run, now)), this.el.tbody);
    const counts = statusCounts(this.model);
    for (const chip of this.el.chips.querySelectorAll("button[data-filter]")) {
      const n = counts[chip.dataset.filter] ?? 0;
      const span = chip.querySelector(".count");
      const text = n.toLocaleString();
      if (span.textContent !== text) span.textContent = text;
      chip.dataset.count = String(n);
      chip.setAttribute("aria-pressed", String(chip.dataset.filter === this.filters.status));
    }
    const el = this.el;
    el.cancelAll.disabled = !this.loadedOnce || counts.pending === 0;
    el.replayAll.disabled = !this.loadedOnce || counts.failed === 0;
    el.cancelAll.textContent = `Cancel all pending (${counts.pending.toLocaleString()})`;
    // Not a count: replay all acts on failed runs not replayed yet, which the question counts.
    el.replayAll.textContent = "Replay all failed";
    el.more.hidden = !this.loadedOnce || this.exhausted;
    el.more.disabled = this.loading || this.loadingMore;
    el.more.textContent = this.loadingMore ? "Loading…" : "Load more";
    el.empty.hidden = runs.length > 0;
    el.empty.textContent = !this.loadedOnce
      ? "Loading runs…"
      : this.filters.status === "all"
        ? "No runs match these filters."
        : `No ${this.filters.status} runs loaded.`;
    el.incomplete.hidden = this.complete;
    this.drawNotice();
  }

  scheduleDraw() {
    if (this.drawScheduled) return;
    this.drawScheduled = true;
    requestAnimationFrame(() => {
      this.drawScheduled = false;
      this.draw();
    });
  }

  drawNotice() {
    const n = this.notice;
    render(
      n
        ? html`<span>${n}</span>
            <button type="button" class="toast-close" aria-label="Dismiss" @click=${() => this.setNotice(null)}>✕</button>`
        : nothing,
      this.el.notice,
    );
    this.el.notice.hidden = !n;
  }

  setNotice(text) {
    this.notice = text;
    this.drawNotice();
  }

  // ---------------------------------------------------------------- actions

  /** Run now, cancel or replay one run, in its thread. */
  async act(action, id, button) {
    const s = this.session;
    const run = this.model.runs.get(String(id));
    if (!s || !run || run.threadId == null) return;
    const tid = String(run.threadId);
    if (button) button.disabled = true;
    try {
      if (action === "run-now") {
        const res = await api.runNow(tid, id, { signal: s.signal });
        if (s.closed) return;
        if (res && res.status && progress({ ...run, status: res.status }) > progress(run)) {
          mergeRun(this.model, { id, status: res.status }, Date.now());
          this.scheduleDraw();
        }
      } else if (action === "cancel") {
        if (!window.confirm(cancelQuestion(run))) return;
        const res = await api.cancel(tid, id, { signal: s.signal });
        if (s.closed) return;
        if (!(res && res.canceled)) toast(`Run ${id} was not canceled: it is no longer pending or running.`);
        await this.refreshRun(tid, id);
      } else if (action === "replay") {
        const res = await api.replay(tid, id, { signal: s.signal });
        if (s.closed) return;
        this.setNotice(`Replay of ${run.name || "run"} scheduled as ${res.id} (thread ${tid}).`);
      }
    } catch (err) {
      if (s.closed) return;
      toastApiError(`${ACTION_LABEL[action] || action} failed for run ${id}`, err);
      if (err instanceof ApiError && err.status === 409) this.refreshRun(tid, id);
    } finally {
      if (button && button.isConnected) button.disabled = false;
    }
  }

  async refreshRun(tid, id) {
    const s = this.session;
    try {
      const run = await api.getRun(tid, id, { signal: s.signal });
      if (s.closed) return;
      const { args: _args, ...bare } = run; // the list never holds args
      mergeRun(this.model, bare, Date.now());
      this.scheduleDraw();
    } catch {
      // The frame (or the next reload) brings it.
    }
  }

  /**
   * Cancel every pending run, or replay every failed run not replayed yet, of the filtered
   * list: first apply what the filter fields show (typed but not applied yet), then ask
   * the server how many match now, then say that number and the filters in the
   * confirmation.
   */
  async bulk(action, button) {
    const fields = this.formFilters();
    if (!sameFilters(fields, this.filters)) this.setFilters(fields);
    const s = this.session;
    if (!s) return;
    const status = action === "cancel" ? "pending" : "failed";
    button.disabled = true;
    try {
      const body = bulkBody(this.filters);
      // The server replays failed runs that no run replays yet: count those.
      const extra = action === "replay" ? { status: "failed", replayed: "false" } : {};
      const res = await api.listAllRuns({ ...body, ...extra, limit: 1 }, { signal: s.signal });
      if (s.closed) return;
      if (action === "cancel" && res && typeof res.counts === "object") {
        this.model.counts = { ...res.counts };
        this.draw();
      }
      const count = Number(res?.counts?.[status]) || 0;
      if (count === 0) {
        this.setNotice(action === "cancel"
          ? "No pending runs match these filters."
          : "No failed runs match these filters that are not replayed yet.");
        return;
      }
      const question = bulkQuestion(action, count, this.filters, fmtZoned);
      if (!window.confirm(question)) return;
      const answer = action === "cancel"
        ? await api.cancelAll(body, { signal: s.signal })
        : await api.replayAll(body, { signal: s.signal });
      if (s.closed) return;
      this.setNotice(bulkOutcome(action, answer));
      await this.reload();
    } catch (err) {
      if (!s.closed) toastApiError(action === "cancel" ? "Canceling the pending runs failed" : "Replaying the failed runs failed", err);
    } finally {
      if (button.isConnected) this.draw();
    }
  }
}
