// schedules.js — the selected thread's recurring schedules (docs/scheduling.md), above its
// runs: the effect, when it fires (cron and time zone, or every N), the next fire time,
// its state, how many runs it made and how many fire times it skipped (its previous run was
// still going), with Pause / Resume / Cancel. Loaded over HTTP (GET .../schedules) and kept
// live by the thread's schedule_changed frames; each occurrence is an ordinary run, shown
// in the runs list with its schedule id. Cancel asks first, naming the effect and when.

import { html, nothing, render } from "./vendor/lit-html/lit-html.js";
import { repeat } from "./vendor/lit-html/directives/repeat.js";
import { api } from "./api.js";
import { fmtLocal, fmtZoned, shortId } from "./format.js";
import { cancelScheduleQuestion, mergeSchedule, nextFireView, recurrenceText } from "./schedules-model.js";
import { toastApiError } from "./toasts.js";

const $ = (id) => document.getElementById(id);

function scheduleRow(s, now, view) {
  const paused = s.state === "paused";
  const when = recurrenceText(s);
  const view_ = nextFireView(s, now, view.threadPaused);
  const stamp = s.nextFireAt ? fmtLocal(s.nextFireAt, { full: true }) : "";
  const next = view_.kind === "paused" || view_.kind === "never"
    ? html`<span class="muted" title=${view_.title}>${view_.text}</span>`
    : html`<time datetime=${s.nextFireAt} data-kind=${view_.kind}
        class=${view_.kind === "held" || view_.held ? "paused-text" : ""}
        title=${[stamp, view_.title].filter(Boolean).join(" · ")}>${view_.text}</time>`;
  const runs = `${s.occurrences} run${s.occurrences === 1 ? "" : "s"} · ${s.skipped} skipped`;
  return html`<li class="schedule-item" data-testid="schedule-row" data-schedule-id=${s.id} data-state=${s.state}>
    <span class="sch-what">
      <span class="sch-name" title=${`${s.name} (schedule ${s.id})`}>${s.name}</span>
      <span class="muted mono nw" data-testid="schedule-id" title=${`Schedule ${s.id} (its runs show this id)`}>schedule ${shortId(s.id)}</span>
      <code class="sch-when mono" data-testid="schedule-when" title=${when}>${when}</code>${
        s.key ? html`<span class="run-key muted mono" title=${`Key: ${s.key}`}>key ${s.key}</span>` : nothing
      }
    </span>
    <span class="sch-status">
      <span class="badge badge-${paused ? "canceled" : "completed"}" data-testid="schedule-state">${s.state}</span>
      <span data-testid="schedule-next">${next}</span>${
        s.nextFireAt && view_.kind !== "paused" && view_.kind !== "never"
          ? html`<span class="muted nw" data-testid="schedule-next-at"
              title="The next fire time, in this browser's zone">${fmtZoned(s.nextFireAt)}</span>`
          : nothing
      }${
        paused && s.pausedReason
          ? html`<span class="error-text" data-testid="schedule-paused-reason"
              title="Why the runtime paused it">${s.pausedReason}</span>`
          : nothing
      }
      <span class="muted" data-testid="schedule-counts"
        title="Runs made · fire times skipped (the previous run was still pending or running)">${runs}</span>
    </span>
    <span class="sch-actions">
      <button type="button" class="btn btn-small" data-testid=${paused ? "schedule-resume" : "schedule-pause"}
        ?disabled=${view.busy.has(s.id)} @click=${() => view.act(s, paused ? "resume" : "pause")}>${paused ? "Resume" : "Pause"}</button>
      <button type="button" class="btn btn-small btn-danger" data-testid="schedule-cancel"
        ?disabled=${view.busy.has(s.id)} @click=${() => view.act(s, "cancel")}>Cancel</button>
    </span>
  </li>`;
}

export class SchedulesView {
  /** `ctx`: {handledAsGone(session, err)}. */
  constructor(ctx) {
    this.ctx = ctx;
    this.session = null;
    this.schedules = [];
    this.busy = new Set();
    this.loading = false;
    this.threadPaused = false; // the thread is paused: nothing fires until it is resumed
    this.el = { section: $("schedules-section"), tbody: $("schedules-body"), count: $("schedules-count") };
  }

  /** The thread was paused or resumed (pause.js): rows say so beside the next fire time. */
  setPaused(paused) {
    if (this.threadPaused === paused) return;
    this.threadPaused = paused;
    this.draw();
  }

  reset(session) {
    this.session = session;
    this.schedules = [];
    this.busy.clear();
    this.draw();
  }

  /** The whole list again (on every (re)connect of the stream, and after a seq gap). */
  async reload() {
    const s = this.session;
    if (!s || s.gone) return;
    this.loading = true;
    try {
      const res = await api.listSchedules(s.tid, { signal: s.signal });
      if (s.closed) return;
      this.schedules = Array.isArray(res && res.schedules) ? res.schedules : [];
    } catch (err) {
      if (s.closed || (err && err.name === "AbortError") || this.ctx.handledAsGone(s, err)) return;
      toastApiError(`Could not load the schedules of thread ${s.tid}`, err);
    } finally {
      this.loading = false;
    }
    this.draw();
  }

  onFrame(data) {
    if (!data || typeof data.id !== "string") return;
    this.schedules = mergeSchedule(this.schedules, data);
    this.draw();
  }

  async act(schedule, action) {
    const s = this.session;
    if (!s || s.gone || this.busy.has(schedule.id)) return;
    if (action === "cancel" && !window.confirm(cancelScheduleQuestion(schedule))) return;
    this.busy.add(schedule.id);
    this.draw();
    try {
      const res = await api.scheduleAction(s.tid, schedule.id, action, { signal: s.signal });
      if (s.closed) return;
      // The frame usually comes first; the answer covers a socket that is down.
      this.schedules = mergeSchedule(this.schedules, { ...res, change: action === "cancel" ? "canceled" : action });
    } catch (err) {
      if (s.closed || this.ctx.handledAsGone(s, err)) return;
      toastApiError(`Could not ${action} schedule ${shortId(schedule.id)}`, err);
      this.reload();
    } finally {
      this.busy.delete(schedule.id);
      this.draw();
    }
  }

  draw(now = Date.now()) {
    const { section, tbody, count } = this.el;
    section.hidden = this.schedules.length === 0;
    count.textContent = this.schedules.length ? `(${this.schedules.length})` : "";
    render(repeat(this.schedules, (x) => x.id, (x) => scheduleRow(x, now, this)), tbody);
  }
}
