// detail.js — one run's detail (right): its fields, error and args, and its actions. It
// reads the run from the runs view's model and fetches it once (the list has no args).

import { html, nothing, render } from "./vendor/lit-html/lit-html.js";
import { fmtDuration, fmtLocal, fmtRelative, runDuration } from "./format.js";
import { actionButtons, statusClass } from "./runs.js";
import { waitingFor } from "./runs-model.js";
import { toastApiError } from "./toasts.js";

const $ = (id) => document.getElementById(id);

// `relative`: add "in 5m" / "3m ago". The due time of a run that will not run (finished,
// canceled) goes without it: "in 29m" would promise a run that never comes.
function timeField(iso, now, { relative = true } = {}) {
  if (!iso) return html`<span class="muted">—</span>`;
  return html`<span title=${iso}><span>${fmtLocal(iso, { full: true, now })}</span>
    ${relative ? html`<span class="rel muted">${fmtRelative(iso, now)}</span>` : nothing}<br><span
      class="mono small muted">${iso}</span></span>`;
}

function argsText(run) {
  if (!("args" in run)) return "Loading…";
  try {
    const text = JSON.stringify(run.args, null, 2);
    return text === undefined ? "null" : text;
  } catch {
    return String(run.args);
  }
}

// How each attempt ended, in words (the API's `outcome`).
const OUTCOME = {
  running: "running",
  completed: "completed",
  failed: "failed",
  interrupted: "interrupted",
};

/**
 * Why an interrupted attempt stopped: the reason the server stored as its error (a
 * shutdown, a crash or restart, its node's lost lease, the database), or, for an attempt
 * stored before reasons were, every cause it may have been.
 */
function interruptedBy(a) {
  return a.error
    ? `Interrupted: ${String(a.error)}`
    : "Interrupted by a restart, a shutdown or its node's lost lease (not recorded which).";
}

/**
 * The run's attempts, first first, from the single-run answer's `attemptDetails`: when
 * each started and ended, on which node, how it ended and its error. Nothing until that
 * answer is in.
 */
function attemptsSection(run, now) {
  const attempts = Array.isArray(run.attemptDetails) ? run.attemptDetails : null;
  if (!attempts) return nothing;
  return html`<h3>Attempts</h3>
    ${attempts.length === 0
      ? html`<p class="muted" data-testid="attempts-none">Not started yet.</p>`
      : html`<ol class="attempts" data-testid="attempts">${attempts.map((a) => html`
          <li data-testid="attempt-row" data-outcome=${a.outcome || ""}>
            <div><strong>Attempt ${a.attempt}</strong>
              <span class=${statusClass(a.outcome === "interrupted" ? "canceled" : a.outcome)}
                data-testid="attempt-outcome">${OUTCOME[a.outcome] || a.outcome || "?"}</span></div>
            <div class="small">Started <span title=${a.startedAt || ""}>${a.startedAt ? fmtLocal(a.startedAt, { full: true, now }) : "—"}</span>,
              ended <span title=${a.endedAt || ""}>${a.endedAt ? fmtLocal(a.endedAt, { full: true, now }) : "—"}</span>${a.nodeId
                ? html`, on node <code data-testid="attempt-node">${String(a.nodeId)}</code>` : nothing}</div>
            ${a.outcome === "interrupted"
              ? html`<div class="small muted" data-testid="attempt-reason">${interruptedBy(a)}</div>`
              : a.error ? html`<pre class="pre pre-error" data-testid="attempt-error">${String(a.error)}</pre>` : nothing}
          </li>`)}</ol>`}`;
}

// What the attempts were fetched for: a change of either (a frame) fetches them again.
const attemptsKey = (run) => `${run.status}/${run.attempts}`;

export class DetailView {
  /** `runs`: the RunsView; `ctx`: {handledAsGone(session, err), onToggle()}. */
  constructor(runs, ctx) {
    this.runs = runs;
    this.ctx = ctx;
    this.id = null;
    this.loadError = null;
    this.el = {
      layout: $("layout"),
      box: $("run-detail"),
      body: $("detail-body"),
      close: $("detail-close"),
    };
    this.el.close.addEventListener("click", () => {
      const id = this.id;
      this.close();
      if (id) this.runs.focusRow(id);
    });
    this.el.body.addEventListener("click", (ev) => {
      const btn = ev.target.closest("button[data-action]");
      if (btn && this.id) this.runs.act(btn.dataset.action, this.id, btn);
    });
  }

  async open(id, { focus = false } = {}) {
    id = String(id);
    const s = this.runs.session;
    if (!s || s.gone) return;
    this.id = id;
    this.loadError = null;
    this.el.box.hidden = false;
    this.el.layout.classList.add("has-detail");
    this.el.box.dataset.runId = id;
    this.ctx.onToggle();
    this.draw();
    if (focus) this.el.close.focus();
    try {
      await this.runs.refreshRun(id);
    } catch (err) {
      if (s.closed || this.id !== id || this.ctx.handledAsGone(s, err)) return;
      this.loadError = err;
      toastApiError(`Could not load run ${id}`, err);
    }
    if (!s.closed && this.id === id) this.draw();
  }

  close() {
    if (this.id === null) return;
    this.id = null;
    this.el.box.hidden = true;
    render(nothing, this.el.body); // no hidden Run now / Cancel of a run no longer shown
    delete this.el.box.dataset.runId;
    delete this.el.box.dataset.status;
    this.el.layout.classList.remove("has-detail");
    this.ctx.onToggle();
  }

  draw(now = Date.now()) {
    const id = this.id;
    if (id === null) return;
    const run = this.runs.get(id);
    const head = $("detail-head-text");
    if (!run) {
      render(html`${id} <span class="badge badge-unknown">loading</span>`, head);
      render(
        html`<h3>Error</h3><pre class="pre pre-error" data-testid="run-error">${this.loadError ? this.loadError.message : ""}</pre>
          <h3>Args</h3><pre class="pre" data-testid="run-args">${this.loadError ? "" : "Loading…"}</pre>`,
        this.el.body,
      );
      return;
    }
    this.el.box.dataset.status = run.status || "";
    // Frames carry no attempts: when the run moves on, its answer is asked for again.
    if (Array.isArray(run.attemptDetails) && run.attemptsFor !== attemptsKey(run)
        && this.refetching !== id) {
      this.refetching = id;
      this.runs.refreshRun(id).catch(() => {}).finally(() => {
        if (this.refetching === id) this.refetching = null;
      });
    }
    render(html`<span>${run.name || "(unnamed)"}</span> <span class=${statusClass(run.status)}
      data-testid="detail-status">${run.status || "?"}</span>`, head);
    const notice = this.runs.notice && this.runs.notice.forId === id ? this.runs.notice : null;
    const duration = fmtDuration(runDuration(run, now));
    const fields = [
      ["ID", html`<code class="mono">${run.id}</code>`],
      ["Thread", html`<code class="mono">${run.threadId || this.runs.session.tid}</code>`],
      ["Status", run.status || ""],
      ["Due (runAt)", timeField(run.runAt, now, { relative: run.status === "pending" })],
      ["Created", timeField(run.createdAt, now)],
      ["Started", timeField(run.startedAt, now)],
      ["Finished", timeField(run.finishedAt, now)],
      ["Duration", duration ? `${duration}${run.status === "running" ? " so far" : ""}` : "—"],
      ["Attempts", run.attempts == null ? "—" : String(run.attempts)],
      ["Key", run.key ? html`<code class="mono" data-testid="detail-key">${run.key}</code>` : "—"],
      ["Schedule", run.scheduleId
        ? html`<code class="mono" data-testid="detail-schedule">${run.scheduleId}</code>` : "—"],
    ];
    const waiting = waitingFor(this.runs.model, run, now);
    if (waiting) {
      fields.push([
        "Waiting for",
        html`<span data-testid="detail-waiting">due, waiting for run
          <button type="button" class="link mono" data-run-id=${waiting} title="Open the running run"
            @click=${() => this.open(waiting)}>${waiting}</button> to finish (one run at a time)</span>`,
      ]);
    }
    if (run.canceledBy) {
      fields.push(["Canceled by", html`<span data-testid="detail-canceled-by">${run.canceledBy}</span>`]);
    }
    if (run.lastChange) fields.push(["Last change", run.lastChange]);
    if (run.replayOf) {
      const of = String(run.replayOf);
      fields.push([
        "Replay of",
        html`<button type="button" class="link mono" data-testid="replay-of" data-run-id=${of}
          title="Open the original run" @click=${() => this.open(of)}>${of}</button>`,
      ]);
    }
    render(
      html`<div class="detail-actions">${actionButtons(run, waiting)}</div>
        ${notice
          ? html`<p class="form-ok" role="status" data-testid="detail-notice">${notice.text}
              <button type="button" class="link" @click=${() => this.open(notice.openId)}>Open</button></p>`
          : nothing}
        <dl class="detail-fields">${fields.map(([label, value]) => html`<dt>${label}</dt><dd>${value}</dd>`)}</dl>
        <h3>Error</h3>
        <pre class="pre pre-error ${run.error ? "" : "pre-empty"}" data-testid="run-error">${run.error ? String(run.error) : "—"}</pre>
        ${attemptsSection(run, now)}
        <h3>Args</h3>
        <pre class="pre" data-testid="run-args">${argsText(run)}</pre>`,
      this.el.body,
    );
  }
}
