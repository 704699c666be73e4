// pause.js — the selected thread's paused state in the header: the "paused" badge, the
// Pause / Resume button and the note that says why due runs stay pending. A paused thread
// starts no run until resumed (docs/http-api.md, "Threads"); a run already running ends.

import { api } from "./api.js";
import { toastApiError } from "./toasts.js";

const $ = (id) => document.getElementById(id);

export class PauseControl {
  /** `onChange(tid, paused)`: the shown thread's (tid null: none) paused state is known or changed. */
  constructor({ onChange, onGone }) {
    this.onChange = onChange;
    this.onGone = onGone; // (session, err) -> true if the error meant the thread is gone
    this.session = null;
    this.paused = false;
    this.busy = false;
    this.el = { button: $("pause-thread"), badge: $("thread-paused"), note: $("paused-note") };
    this.el.button.addEventListener("click", () => this.toggle());
  }

  /**
   * Show session `s`'s thread; `known` is its paused flag from the list, if any, until
   * `refresh` (called when its stream opens, after the runs loaded) says what it is now.
   */
  reset(s, known) {
    this.session = s;
    this.busy = false;
    this.set(Boolean(known));
  }

  async refresh() {
    const s = this.session;
    if (!s || s.gone) return;
    try {
      const thread = await api.getThread(s.tid, { signal: s.signal });
      if (s !== this.session) return;
      this.set(Boolean(thread.paused));
    } catch (err) {
      if (s !== this.session || (err && err.name === "AbortError")) return;
      if (!this.onGone(s, err)) toastApiError(`Could not load thread ${s.tid}`, err);
    }
  }

  set(paused) {
    this.paused = paused;
    this.render();
    this.onChange(this.session ? this.session.tid : null, paused);
  }

  async toggle() {
    const s = this.session;
    if (!s || this.busy) return;
    const resume = this.paused;
    this.busy = true;
    this.render();
    try {
      const call = resume ? api.resumeThread : api.pauseThread;
      const thread = await call(s.tid, { signal: s.signal });
      if (s !== this.session) return;
      this.busy = false;
      this.set(Boolean(thread.paused));
    } catch (err) {
      if (s !== this.session || (err && err.name === "AbortError")) return;
      this.busy = false;
      this.render();
      if (!this.onGone(s, err)) toastApiError(`Could not ${resume ? "resume" : "pause"} thread ${s.tid}`, err);
    }
  }

  render() {
    const { button, badge, note } = this.el;
    const shown = Boolean(this.session);
    const gone = Boolean(this.session && this.session.gone);
    button.hidden = !shown;
    button.disabled = gone || this.busy;
    button.textContent = this.paused ? "Resume" : "Pause";
    button.title = this.paused
      ? "Resume: due runs start, in due order"
      : "Pause: start no run until resumed (a running run finishes)";
    button.setAttribute("aria-pressed", this.paused ? "true" : "false");
    badge.hidden = !shown || !this.paused;
    note.hidden = !shown || !this.paused || gone;
  }
}
