// connection.js — the header badge: the selected thread's stream (live, connecting…,
// offline) while there is one; otherwise whether the server answers ("connected", offline,
// token needed; connecting… at first). While the server cannot be reached and no stream
// retries on its own, it knocks again now and then so the badge and lists recover alone.

import { api } from "./api.js";

const TEXT = {
  live: "live",
  connecting: "connecting…",
  offline: "offline",
  connected: "connected",
  unauthorized: "token needed",
};

export class Connection {
  /** `badge`: the header element; `onBack()`: the server answers again after an outage. */
  constructor(badge, { onBack }) {
    this.badge = badge;
    this.onBack = onBack;
    this.stream = null; // {conn, detail} of the selected thread's stream; null: no stream
    this.hasThread = false;
    this.reach = "unknown"; // "unknown" | "ok" | "offline" | "unauthorized": the last API answer
    this.probeTimer = null;
    this.probeFailures = 0;
  }

  /** A thread is (or no longer is) selected; `streaming`: it has a stream. */
  setThread(hasThread, streaming) {
    this.hasThread = hasThread;
    this.stream = streaming ? { conn: "connecting", detail: undefined } : null;
    if (!streaming) this.scheduleProbe();
    this.render();
  }

  /** The selected thread's stream changed state ("connecting" | "live" | "offline"). */
  setStreamState(conn, detail) {
    this.stream = { conn, detail };
    if (conn === "live") this.setReach("ok");
    else this.render();
  }

  /** Every API answer (or failure to get one) lands here, through api.js's onReach. */
  setReach(reach) {
    const was = this.reach;
    this.reach = reach;
    if (reach === "offline") {
      this.scheduleProbe();
    } else {
      clearTimeout(this.probeTimer);
      this.probeTimer = null;
      this.probeFailures = 0;
      if (was === "offline") this.onBack();
    }
    this.render();
  }

  /** Knock again at once (the browser says the network is back). */
  probeNow() {
    this.scheduleProbe({ now: true });
  }

  scheduleProbe({ now = false } = {}) {
    if (this.reach !== "offline" || this.stream) return;
    if (this.probeTimer) {
      if (!now) return;
      clearTimeout(this.probeTimer);
    }
    const delay = now ? 0 : Math.min(30000, 2000 * 2 ** this.probeFailures);
    this.probeTimer = setTimeout(() => {
      this.probeTimer = null;
      if (this.reach !== "offline" || this.stream) return;
      this.probeFailures += 1;
      api.listThreads({ limit: 1 }).catch(() => {}); // its outcome comes back through setReach
    }, delay);
  }

  render() {
    let conn;
    let title;
    if (this.stream) {
      conn = this.stream.conn;
      title = this.stream.detail ? `Live updates: ${this.stream.detail}` : "Live updates for the selected thread";
    } else if (this.reach === "ok") {
      conn = "connected";
      title = this.hasThread
        ? "The server answers; this thread has no live updates"
        : "The server answers; select a thread for live updates";
    } else if (this.reach === "offline") {
      conn = "offline";
      title = "Cannot reach the server; trying again";
    } else if (this.reach === "unauthorized") {
      conn = "unauthorized";
      title = "The server needs an API token: set it with the API token button";
    } else {
      conn = "connecting";
      title = "Contacting the server";
    }
    // It runs on every API answer: touch the live region only when something changed.
    const b = this.badge;
    const text = TEXT[conn] || conn;
    if (b.dataset.state !== conn) b.dataset.state = conn;
    if (b.textContent !== text) b.textContent = text;
    if (b.title !== title) b.title = title;
  }
}
