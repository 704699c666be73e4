// runs.js — the Runs tab: the selected thread's runs in a table, the status filters and
// their counts, paging, and the run-now / cancel / replay actions. The data lives in a
// runs model (runs-model.js, pure); this view loads it, folds frames into it and draws it
// with lit-html, whose keyed `repeat` patches only the rows whose values changed.

import { html, nothing, render } from "./vendor/lit-html/lit-html.js";
import { repeat } from "./vendor/lit-html/directives/repeat.js";
import { api, ApiError } from "./api.js";
import { fmtDuration, fmtLocal, fmtRelative, runDuration, shortId, timeParts, whenText } from "./format.js";
import {
  STATUSES,
  TERMINAL,
  applyFrame,
  emptyModel,
  mergeRun,
  progress,
  snapshotModel,
  statusCounts,
  visibleRuns,
  waitingFor,
} from "./runs-model.js";
import { toast, toastApiError } from "./toasts.js";

const $ = (id) => document.getElementById(id);

// Runs per page. 100 keeps "load more" clicks few on big threads; if the server refuses a
// limit that large (400/422) we fall back to its documented default once and for all.
let runPageSize = 100;

function newFeeds() {
  // One paging cursor for the whole list ("all") and one per status filter, so "load more"
  // on the Failed tab fetches more failed runs instead of paging through everything.
  const feeds = {};
  for (const key of ["all", ...STATUSES]) feeds[key] = { cursor: null, exhausted: false, started: false, loaded: 0 };
  return feeds;
}

export function statusClass(status) {
  return STATUSES.includes(status) ? `badge badge-${status}` : "badge badge-unknown";
}

// Frames after which retention may have pruned runs (the counts are fetched again).
const FINISHING = new Set(["completed", "failed", "canceled"]);
const COUNTS_SYNC_MS = 2000;

const ACTION_LABEL = { "run-now": "Run now", cancel: "Cancel", replay: "Replay" };

/**
 * The buttons a run offers: run now and cancel (pending), cancel (running), replay
 * (finished). `waiting`: the run of its thread that a due pending run waits for; its Run
 * now is disabled, saying so (it is due already: run now cannot start it sooner).
 */
export function actionButtons(run, waiting = null) {
  const mk = (action, cls, why = null) => {
    const label = ACTION_LABEL[action];
    return html`<button type="button" class="btn btn-small ${cls}" data-action=${action} data-testid=${action}
      ?disabled=${why !== null} title=${why ?? nothing}
      aria-label=${`${label} ${run.name || ""} ${run.id}`.replace(/\s+/g, " ").trim()}>${label}</button>`;
  };
  if (run.status === "pending") {
    const why = waiting
      ? `Due already, waiting for run ${waiting} of its thread to finish (one run at a time)`
      : null;
    return [mk("run-now", "btn-primary", why), mk("cancel", "btn-danger")];
  }
  if (run.status === "running") return [mk("cancel", "btn-danger")];
  if (TERMINAL.has(run.status)) return [mk("replay", "btn-secondary")];
  return [];
}

/** The question asked before canceling a run: its name, id and due time. */
export function cancelQuestion(run, now = Date.now()) {
  const name = run.name || "this run";
  const due = run.runAt ? fmtLocal(run.runAt, { full: true, now }) : "unknown";
  const what = run.status === "running" ? "Stop the running run" : "Cancel the run";
  const how =
    run.status === "running"
      ? " An async effect stops at its next await; a sync one cannot be stopped."
      : "";
  return `${what} ${name} (${run.id}), due ${due}?${how}`;
}

// Date (not today) and time, each unbreakable: a cell too narrow for both wraps between
// them instead of cutting either.
function timeText(iso, now) {
  if (!iso) return "—";
  const { date, time } = timeParts(iso, now);
  return html`${date ? html`<span class="nw">${date}</span> ` : nothing}<span class="nw">${time}</span>`;
}

function timeCell(cls, iso, now) {
  return html`<td class=${cls} title=${iso || ""}>${timeText(iso, now)}</td>`;
}

export class RunsView {
  /** `ctx`: {handledAsGone(session, err), detailId(), openDetail(id), onChange(ids)}. */
  constructor(ctx) {
    this.ctx = ctx;
    this.session = null;
    this.filter = "all";
    this.notice = null; // {text, openId}: what the last action did
    this.el = {
      filters: $("filters"),
      loadedNote: $("loaded-note"),
      table: $("runs-table"),
      tbody: $("runs-body"),
      empty: $("runs-empty"),
      more: $("runs-more"),
      reload: $("reload-runs"),
      notice: $("runs-notice"),
    };
    this.resetState();
    this.wire();
  }

  resetState() {
    if (this.countsTimer) clearTimeout(this.countsTimer);
    this.countsTimer = null; // a pending re-sync of the counts with the server's
    this.model = emptyModel();
    this.feeds = newFeeds();
    this.loading = false;
    this.loadingMore = false;
    this.reloadQueued = false;
    this.loadedOnce = false;
    this.framesDuringLoad = null; // ids changed by frames while a reload was in flight
    this.drawScheduled = false;
    this.notice = null;
    this.paused = false; // the thread is paused: due runs wait for it to be resumed
  }

  /** The thread was paused or resumed (pause.js): its due runs say why they wait. */
  setPaused(paused) {
    if (this.paused === paused) return;
    this.paused = paused;
    this.draw();
  }

  /** Show `session`'s thread (null: none): everything of the previous one is dropped. */
  reset(session) {
    this.session = session;
    this.resetState();
    this.el.table.removeAttribute("aria-busy");
    this.draw();
  }

  get(id) {
    return this.model.runs.get(id);
  }

  wire() {
    const el = this.el;
    el.reload.addEventListener("click", () => this.reload());
    el.more.addEventListener("click", () => this.loadMore());
    el.filters.addEventListener("click", (ev) => {
      const btn = ev.target.closest("button[data-filter]");
      if (btn) this.setFilter(btn.dataset.filter);
    });
    el.tbody.addEventListener("click", (ev) => {
      const tr = ev.target.closest("tr[data-run-id]");
      if (!tr) return;
      const btn = ev.target.closest("button[data-action]");
      if (btn) this.act(btn.dataset.action, tr.dataset.runId, btn);
      else this.ctx.openDetail(tr.dataset.runId);
    });
    el.tbody.addEventListener("keydown", (ev) => {
      const tr = ev.target;
      if (!(tr instanceof HTMLTableRowElement) || !tr.dataset.runId) return;
      if (ev.key === "Enter" || ev.key === " ") {
        ev.preventDefault();
        this.ctx.openDetail(tr.dataset.runId, { focus: true });
      } else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
        ev.preventDefault();
        const next = ev.key === "ArrowDown" ? tr.nextElementSibling : tr.previousElementSibling;
        if (next) next.focus();
      }
    });
  }

  /** Focus the row of run `id` (after closing its detail). */
  focusRow(id) {
    for (const tr of this.el.tbody.children) if (tr.dataset.runId === id) tr.focus();
  }

  // -------------------------------------------------------------------- drawing

  row(run, now, selectedId) {
    const err = run.error ? String(run.error) : "";
    const firstLine = err.split("\n", 1)[0].slice(0, 300);
    const pending = run.status === "pending";
    const held = pending && this.paused;
    const waiting = waitingFor(this.model, run, now);
    const badgeTitle = err
      ? firstLine // the error column may be hidden
      : held
        ? "The thread is paused: this run starts once it is resumed and the run is due"
        : pending
          ? "Runs when due, once no other run of this thread is running (one at a time)"
          : "";
    return html`<tr class="run-row ${run.id === selectedId ? "selected" : ""}" data-testid="run-row"
        data-run-id=${run.id} data-status=${run.status || ""} tabindex="0">
      <td class="mono cell-id" title=${run.id}>${shortId(run.id)}</td>
      <td class="cell-name" title=${run.name || ""}>${run.name || ""}${
        run.key
          ? html`<span class="run-key muted mono" data-testid="run-key" title=${`Key: ${run.key}`}>key ${run.key}</span>`
          : nothing
      }${
        run.scheduleId
          ? html`<span class="run-key run-schedule muted mono" data-testid="run-schedule"
              title=${`An occurrence of recurring schedule ${run.scheduleId}`}>schedule ${shortId(run.scheduleId)}</span>`
          : nothing
      }</td>
      <td class="cell-status"><span class=${statusClass(run.status)} title=${badgeTitle}>${run.status || "?"}</span>${
        waiting
          ? html`<span class="run-waiting" data-testid="run-waiting" data-waiting-for=${waiting}
              title=${`Due, waiting for run ${waiting} to finish: this thread runs one run at a time`}>waiting for ${shortId(waiting)}</span>`
          : nothing
      }</td>
      <td class="cell-due" title=${run.runAt || ""}>${timeText(run.runAt, now)}${
        pending ? html` <span class="rel muted nw">${fmtRelative(run.runAt, now)}</span>` : nothing
      }${held ? html` <span class="paused-text nw" data-testid="run-paused" title=${badgeTitle}>· paused</span>` : nothing}</td>
      ${timeCell("cell-started", run.startedAt, now)}
      ${timeCell("cell-finished", run.finishedAt, now)}
      <td class="num cell-dur">${fmtDuration(runDuration(run, now)) || "—"}</td>
      <td class="cell-when" data-testid="run-when">${whenText(run, now)}${
        held ? html` <span class="paused-text nw" data-testid="run-paused" title=${badgeTitle}>· paused</span>` : nothing
      }</td>
      <td class="num cell-att">${run.attempts == null ? "" : String(run.attempts)}</td>
      <td class="cell-error"><div class="error-line">
        <span class="error-text" title=${err.slice(0, 2000)}>${firstLine}</span>
        <span class="cell-actions">${actionButtons(run, waiting)}</span>
      </div></td>
      <td class="cell-open" data-testid="row-open" aria-hidden="true">›</td>
    </tr>`;
  }

  /** Redraw the table, counts, footer and notice from the model (lit patches what changed). */
  draw(now = Date.now()) {
    const selectedId = this.ctx.detailId();
    const runs = this.session && !this.session.gone ? visibleRuns(this.model, this.filter) : [];
    render(
      repeat(
        runs,
        (run) => run.id,
        (run) => this.row(run, now, selectedId),
      ),
      this.el.tbody,
    );
    this.drawCounts();
    this.drawFooter(runs.length);
    this.drawNotice();
  }

  /** Draw on the next animation frame, however many frames arrive before it. */
  scheduleDraw() {
    if (this.drawScheduled) return;
    this.drawScheduled = true;
    requestAnimationFrame(() => {
      this.drawScheduled = false;
      this.draw();
    });
  }

  drawCounts() {
    const counts = statusCounts(this.model);
    for (const btn of this.el.filters.querySelectorAll("button[data-filter]")) {
      const n = counts[btn.dataset.filter] ?? 0;
      const span = btn.querySelector(".count");
      const text = n.toLocaleString();
      if (span.textContent !== text) span.textContent = text;
      btn.dataset.count = String(n);
      btn.setAttribute("aria-pressed", String(btn.dataset.filter === this.filter));
    }
  }

  feedKey() {
    // Once the whole list is loaded every status is complete too.
    return this.filter === "all" || this.feeds.all.exhausted ? "all" : this.filter;
  }

  drawFooter(shown) {
    const el = this.el;
    if (!this.session) return;
    const key = this.feedKey();
    const more = !this.feeds[key].exhausted;
    el.more.hidden = !this.loadedOnce || !more || this.session.gone;
    el.more.disabled = this.loading || this.loadingMore;
    el.more.textContent = this.loadingMore ? "Loading…" : key === "all" ? "Load more" : `Load more ${key} runs`;
    el.empty.hidden = shown > 0;
    if (this.session.broken) el.empty.textContent = "This thread's runs cannot be loaded.";
    else if (this.session.gone) el.empty.textContent = "This thread does not exist.";
    else if (!this.loadedOnce) el.empty.textContent = "Loading runs…";
    else if (this.filter === "all") el.empty.textContent = "No runs in this thread yet.";
    else el.empty.textContent = `No ${this.filter} runs loaded.`;
    const total = this.model.runs.size;
    el.loadedNote.textContent = this.loadedOnce
      ? `${total.toLocaleString()} loaded${this.feeds.all.exhausted ? "" : " · more on the server"}`
      : "";
  }

  drawNotice() {
    const n = this.notice;
    render(
      n
        ? html`<span>${n.text}</span>
            ${n.openId
              ? html`<button type="button" class="link" data-testid="notice-open"
                  @click=${() => this.ctx.openDetail(n.openId)}>Open</button>`
              : nothing}
            <button type="button" class="toast-close" aria-label="Dismiss" @click=${() => this.setNotice(null)}>✕</button>`
        : nothing,
      this.el.notice,
    );
    this.el.notice.hidden = !n;
  }

  /** What the last action did, shown above the list (and in the detail of that run). */
  setNotice(notice) {
    this.notice = notice;
    this.drawNotice();
    this.ctx.onChange([]);
  }

  setFilter(filter) {
    if (filter === this.filter) return;
    this.filter = filter;
    this.draw();
    // The newest runs of that status may lie beyond what the "all" pages brought in.
    const key = this.feedKey();
    if (this.session && this.loadedOnce && key !== "all" && !this.feeds[key].started) this.loadMore();
  }

  // -------------------------------------------------------------------- loading

  async fetchPage(session, key, feed) {
    const opts = { limit: runPageSize, cursor: feed.cursor || undefined };
    if (key !== "all") opts.status = key;
    let res;
    try {
      res = await api.listRuns(session.tid, opts, { signal: session.signal });
    } catch (err) {
      // Only a refused limit (not, say, a malformed thread id) lowers the page size.
      const refusedLimit = err instanceof ApiError && (err.code === "invalid_parameter" || err.status === 422);
      if (refusedLimit && runPageSize > 50) {
        runPageSize = 50;
        return this.fetchPage(session, key, feed);
      }
      throw err;
    }
    const runs = Array.isArray(res && res.runs) ? res.runs : [];
    // The server's per-status totals for the whole thread, from the first page of a load.
    if (!feed.started && res && res.counts && typeof res.counts === "object") feed.counts = res.counts;
    feed.cursor = (res && res.nextCursor) || null;
    feed.exhausted = !feed.cursor;
    feed.started = true;
    feed.loaded += runs.length;
    return runs;
  }

  /**
   * (Re)load the runs over HTTP: on first selection, on every socket (re)connect, after a
   * seq gap, and from the Reload button. It fetches again as many runs as were loaded, so
   * a reload never shrinks what the user paged in.
   */
  async reload() {
    const s = this.session;
    if (!s || s.gone) return;
    if (this.loading) {
      this.reloadQueued = true; // one more pass after this one, however many asked
      return;
    }
    this.loading = true;
    this.reloadQueued = false;
    this.framesDuringLoad = new Set();
    this.el.table.setAttribute("aria-busy", "true");
    this.drawFooter(this.el.tbody.childElementCount);

    const prev = this.feeds;
    const feeds = newFeeds();
    const fetched = [];
    try {
      const wantAll = Math.max(prev.all.loaded, 1);
      do fetched.push(...(await this.fetchPage(s, "all", feeds.all)));
      while (!feeds.all.exhausted && feeds.all.loaded < wantAll);
      const f = this.filter;
      if (f !== "all" && !feeds.all.exhausted) {
        const want = Math.max(prev[f].loaded, 1);
        do fetched.push(...(await this.fetchPage(s, f, feeds[f])));
        while (!feeds[f].exhausted && feeds[f].loaded < want);
      }
      if (s.closed) return;
      this.model = snapshotModel(this.model, fetched, {
        during: this.framesDuringLoad,
        keep: this.ctx.detailId(),
        counts: feeds.all.counts,
        now: Date.now(),
      });
      this.feeds = feeds;
      this.loadedOnce = true;
      this.ctx.onChange(null);
    } catch (err) {
      if (s.closed) return;
      if (!this.ctx.handledAsGone(s, err)) toastApiError("Could not load runs", err);
    } finally {
      if (!s.closed) {
        this.loading = false;
        this.framesDuringLoad = null;
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
    if (!s || s.gone || this.loading || this.loadingMore) return;
    const key = this.feedKey();
    const feed = this.feeds[key];
    if (feed.exhausted) return;
    this.loadingMore = true;
    this.draw();
    try {
      const runs = await this.fetchPage(s, key, feed);
      if (s.closed) return;
      const now = Date.now();
      for (const r of runs) mergeRun(this.model, r, now);
    } catch (err) {
      if (!s.closed && !this.ctx.handledAsGone(s, err)) toastApiError("Could not load more runs", err);
    } finally {
      if (!s.closed) {
        this.loadingMore = false;
        this.draw();
      }
    }
  }

  /** Fetch one run (with args) and fold it into the model. Throws the API's error. */
  async refreshRun(id) {
    const s = this.session;
    const run = await api.getRun(s.tid, id, { signal: s.signal });
    if (s.closed) return null;
    // The attempts the answer lists belong to this status and attempt count (detail.js).
    if (Array.isArray(run.attemptDetails)) run.attemptsFor = `${run.status}/${run.attempts}`;
    const merged = mergeRun(this.model, run, Date.now());
    this.changed([String(id)]);
    return merged;
  }

  changed(ids) {
    this.scheduleDraw();
    this.ctx.onChange(ids);
  }

  /** One effect_changed frame's data. */
  onFrame(data) {
    const id = applyFrame(this.model, data, Date.now());
    if (id === null) return;
    if (this.framesDuringLoad) this.framesDuringLoad.add(id);
    this.changed([id]);
    if (FINISHING.has(data.change)) this.scheduleCountsSync();
  }

  /**
   * Counts follow the frames, but retention prunes old finished runs without a frame
   * (docs/http-api.md: counts are of the runs kept): once runs finish, the server's counts
   * are fetched again — COUNTS_SYNC_MS after the first such frame, so a busy thread costs
   * one small request per interval, and the pane never shows more than retention keeps
   * for longer than that.
   */
  scheduleCountsSync() {
    if (this.countsTimer) return;
    const s = this.session;
    this.countsTimer = setTimeout(async () => {
      this.countsTimer = null;
      if (!s || s.closed || s.gone || s !== this.session) return;
      try {
        const res = await api.listRuns(s.tid, { limit: 1 }, { signal: s.signal });
        if (s.closed || s !== this.session || !res || typeof res.counts !== "object") return;
        this.model.counts = { ...res.counts };
        this.scheduleDraw();
      } catch {
        // The next finishing frame (or reload) tries again; nothing to tell the user.
      }
    }, COUNTS_SYNC_MS);
  }

  // -------------------------------------------------------------------- actions

  /** Run now, cancel or replay run `id`; `button` is disabled meanwhile. */
  async act(action, id, button) {
    const s = this.session;
    if (!s || s.gone) return;
    if (button) button.disabled = true;
    try {
      if (action === "run-now") {
        const res = await api.runNow(s.tid, id, { signal: s.signal });
        if (s.closed) return;
        // The "started" frame may have overtaken this answer; only ever move the run forward.
        const run = this.get(id);
        if (res && res.status && (!run || progress({ ...run, status: res.status }) > progress(run))) {
          mergeRun(this.model, { id, status: res.status }, Date.now());
          this.changed([id]);
        }
      } else if (action === "cancel") {
        const run = this.get(id) || { id };
        if (!window.confirm(cancelQuestion(run))) return;
        const res = await api.cancel(s.tid, id, { signal: s.signal });
        if (s.closed) return;
        if (res && res.canceled && run.status !== "running") {
          mergeRun(this.model, { id, status: "canceled" }, Date.now());
          this.changed([id]);
        } else if (res && res.canceled) {
          // The "canceled" frame says when it stopped; fetch it in case the socket is down.
          await this.refreshRun(id).catch(() => {});
        } else {
          toast(`Run ${id} was not canceled: it is no longer pending or running.`);
          await this.refreshRun(id).catch(() => {});
        }
      } else if (action === "replay") {
        const res = await api.replay(s.tid, id, { signal: s.signal });
        if (s.closed) return;
        const newId = String(res.id);
        const name = this.get(id)?.name || "run";
        // Said in place, not in a toast: nothing floats over the page's controls.
        this.setNotice({ text: `Replay of ${name} scheduled as ${newId}.`, openId: newId, forId: id });
        // The frame normally brings it in first; this covers a socket that is down.
        await this.refreshRun(newId).catch(() => {});
      }
    } catch (err) {
      if (s.closed || this.ctx.handledAsGone(s, err)) return;
      toastApiError(`${ACTION_LABEL[action] || action} failed for run ${id}`, err);
      // A 409 means our idea of the run's status is out of date.
      if (err instanceof ApiError && err.status === 409) this.refreshRun(id).catch(() => {});
    } finally {
      if (button && button.isConnected) button.disabled = false;
    }
  }
}
