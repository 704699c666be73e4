// api.js — HTTP and WebSocket helpers for the Effects pane.
//
// The contract is docs/http-api.md. Every call goes through request(), which adds the
// bearer token, turns error bodies into ApiError, and on a 401 asks the page (once, however
// many calls failed together) for a token and retries.

const TOKEN_KEY = "thread-effects.apiToken";

/** An error answer from the API: `status` is the HTTP status (0 when unreachable). */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

export function getToken() {
  try {
    return localStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return ""; // storage disabled (private mode, file://): behave as "no token"
  }
}

export function setToken(token) {
  try {
    if (token) localStorage.setItem(TOKEN_KEY, token);
    else localStorage.removeItem(TOKEN_KEY);
  } catch {
    /* nothing useful to do: the token just will not survive a reload */
  }
}

// The page registers how to ask for a token; it resolves to the new token or null.
let tokenPrompt = null;
// Several calls can fail with 401 at once (threads, effects, runs on start-up); they all
// wait on the same prompt instead of opening one dialog each.
let pendingPrompt = null;

export function onTokenNeeded(prompt) {
  tokenPrompt = prompt;
}

// The page registers how to hear whether the server answers: reach("ok") after any answer,
// reach("unauthorized") after a 401 nobody could fix, reach("offline") when it cannot be
// reached at all. The header's connection badge shows it while no thread is streaming.
let reachListener = () => {};

export function onReach(listener) {
  reachListener = listener;
}

/** Ask for a token (shared between concurrent callers). `rejected`: a token was sent and refused. */
export function askForToken(rejected) {
  if (!tokenPrompt) return Promise.resolve(null);
  if (!pendingPrompt) {
    pendingPrompt = Promise.resolve()
      .then(() => tokenPrompt(rejected))
      .finally(() => {
        pendingPrompt = null;
      });
  }
  return pendingPrompt;
}

async function readBody(res) {
  const text = await res.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return { error: { code: "bad_response", message: text.slice(0, 300) } };
  }
}

/**
 * Call the API and return the parsed JSON answer.
 * Throws ApiError carrying the server's error.code and error.message; when `signal` aborts
 * (the thread it was for is no longer shown) it throws the fetch's AbortError instead,
 * which says nothing about the server.
 */
export async function request(method, path, body, { signal } = {}) {
  for (let attempt = 0; ; attempt++) {
    const token = getToken();
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (token) headers.Authorization = `Bearer ${token}`;

    let res;
    try {
      res = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        signal,
      });
    } catch (err) {
      if (signal && signal.aborted) throw err;
      reachListener("offline");
      throw new ApiError(0, "network_error", `Cannot reach the server (${method} ${path}): ${err.message}`);
    }

    if (res.status === 401 && attempt < 3) {
      // Another call may already have obtained a new token while this one was in flight.
      if (getToken() !== token) continue;
      const fresh = await askForToken(Boolean(token));
      if (fresh) continue;
    }
    reachListener(res.status === 401 ? "unauthorized" : "ok");

    const data = await readBody(res);
    if (signal && signal.aborted) throw signal.reason;
    if (!res.ok) {
      const err = (data && data.error) || {};
      throw new ApiError(
        res.status,
        err.code || `http_${res.status}`,
        err.message || `${method} ${path} failed with HTTP ${res.status}`,
      );
    }
    return data;
  }
}

function query(params) {
  const qs = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") qs.set(key, String(value));
  }
  const s = qs.toString();
  return s ? `?${s}` : "";
}

const seg = encodeURIComponent;

/**
 * One function per endpoint of docs/http-api.md. The last argument of the thread-scoped
 * calls is `{signal}` (an AbortSignal): the views pass their thread's signal, so answers
 * for a thread no longer shown are dropped by the abort instead of by hand-kept counters.
 */
export const api = {
  listThreads: ({ limit, cursor } = {}) => request("GET", `/api/threads${query({ limit, cursor })}`),
  // agentId: needed when the app has several agents and none is the default.
  createThread: (agentId) => request("POST", "/api/threads", agentId ? { agent_id: agentId } : {}),
  deleteThread: (tid) => request("DELETE", `/api/threads/${seg(tid)}`),
  getThread: (tid, opts) => request("GET", `/api/threads/${seg(tid)}`, undefined, opts),
  pauseThread: (tid, opts) => request("POST", `/api/threads/${seg(tid)}/pause`, undefined, opts),
  resumeThread: (tid, opts) => request("POST", `/api/threads/${seg(tid)}/resume`, undefined, opts),

  listRuns: (tid, { status, name, limit, cursor } = {}, opts) =>
    request("GET", `/api/threads/${seg(tid)}/effects${query({ status, name, limit, cursor })}`, undefined, opts),
  getRun: (tid, id, opts) => request("GET", `/api/threads/${seg(tid)}/effects/${seg(id)}`, undefined, opts),
  schedule: (tid, name, args, delaySeconds, opts) =>
    request("POST", `/api/threads/${seg(tid)}/effects`, { name, args, delay_seconds: delaySeconds }, opts),
  runNow: (tid, id, opts) => request("POST", `/api/threads/${seg(tid)}/effects/${seg(id)}/run`, undefined, opts),
  replay: (tid, id, opts) => request("POST", `/api/threads/${seg(tid)}/effects/${seg(id)}/replay`, undefined, opts),
  cancel: (tid, id, opts) => request("POST", `/api/threads/${seg(tid)}/effects/${seg(id)}/cancel`, { by: "pane" }, opts),

  // Recurring schedules, oldest first (docs/scheduling.md).
  listSchedules: (tid, opts) => request("GET", `/api/threads/${seg(tid)}/schedules`, undefined, opts),
  // action: "pause" | "resume" | "cancel"; answers the schedule (as it was, for cancel).
  scheduleAction: (tid, sid, action, opts) =>
    request("POST", `/api/threads/${seg(tid)}/schedules/${seg(sid)}/${action}`, undefined, opts),

  // Effect-tool records, newest first (docs/effect-tools.md).
  effectRecords: (tid, { status, limit, cursor } = {}, opts) =>
    request("GET", `/api/threads/${seg(tid)}/effect-records${query({ status, limit, cursor })}`, undefined, opts),
  // One record, its result in full (listings cut results over 2,000 characters).
  effectRecord: (tid, key, opts) =>
    request("GET", `/api/threads/${seg(tid)}/effect-records/${seg(key)}`, undefined, opts),

  // Runs across threads (GET /api/runs): query {status, name, user_id, tag, since, until,
  // limit, cursor}; bulk actions take the same filters (no status) as their body.
  listAllRuns: (q = {}, opts) => request("GET", `/api/runs${query(q)}`, undefined, opts),
  cancelAll: (filters, opts) => request("POST", "/api/runs/cancel", { ...filters, by: "pane" }, opts),
  replayAll: (filters, opts) => request("POST", "/api/runs/replay", filters, opts),

  listEffects: () => request("GET", "/api/effects"),
  listAgents: () => request("GET", "/api/agents"),

  // Oldest first. At most one of: after (newer than), before (older than), latest (newest page).
  listMessages: (tid, { limit, after, before, latest } = {}, opts) =>
    request(
      "GET",
      `/api/threads/${seg(tid)}/messages${query({ limit, after, before, latest: latest ? "true" : undefined })}`,
      undefined,
      opts,
    ),
  // Runs one turn of the thread's agent; resolves when it has answered. Sent again with the
  // same runId, it is the same turn (its stored answer, or resumed), never a second one.
  sendMessage: (tid, content, opts, runId) =>
    request("POST", `/api/threads/${seg(tid)}/messages`, runId ? { content, run_id: runId } : { content }, opts),
  // The thread's turns: {turns: [{runId, status, attempts, resumed, error, ...}]}.
  listTurns: (tid, opts) => request("GET", `/api/threads/${seg(tid)}/turns`, undefined, opts),
};

// Close codes that say "retrying will not help as is".
const CLOSE_INVALID_THREAD_ID = 4400; // the id is malformed: it never names a thread
const CLOSE_UNKNOWN_THREAD = 4404; // no such thread (never created, or deleted)
const CLOSE_THREAD_STORAGE = 4500; // the thread's database cannot be used
const AUTH_CLOSE_CODES = new Set([1008, 4001, 4003, 4401, 4403]);

/**
 * The live stream of one thread's frames (effect_changed, message_created,
 * effect_record_changed), reconnecting
 * with backoff.
 *
 * Callbacks: onState("connecting" | "live" | "offline", detail), onOpen() after every
 * (re)connect — the caller reloads over HTTP then, since frames sent while the socket was
 * down are gone — onFrame(frame), onNotFound(code, reason) when the server says the thread
 * does not exist (4404), its id is malformed (4400) or its database cannot be used (4500):
 * the stream stops for good then —
 * and onAuth() (resolve to retry).
 *
 * `threadId` null: the stream of every thread (`WS /api/stream`, effect_changed frames only).
 */
export class RunStream {
  constructor(threadId, handlers) {
    this.threadId = threadId;
    this.h = handlers;
    this.ws = null;
    this.timer = null;
    this.failures = 0;
    this.stopped = false;
    this.onOnline = () => this.reconnectNow();
  }

  start() {
    window.addEventListener("online", this.onOnline);
    this.connect();
  }

  stop() {
    this.stopped = true;
    window.removeEventListener("online", this.onOnline);
    clearTimeout(this.timer);
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000, "thread deselected");
  }

  /** Drop any wait and connect again (token changed, network came back). */
  reconnectNow() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.failures = 0;
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000, "reconnecting");
    this.connect();
  }

  url() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const path = this.threadId === null ? "/api/stream" : `/api/threads/${seg(this.threadId)}/stream`;
    let url = `${proto}//${location.host}${path}`;
    const token = getToken();
    if (token) url += `?token=${encodeURIComponent(token)}`;
    return url;
  }

  connect() {
    if (this.stopped) return;
    this.h.onState("connecting");
    let ws;
    try {
      ws = new WebSocket(this.url());
    } catch (err) {
      this.retry(`cannot open socket: ${err.message}`);
      return;
    }
    this.ws = ws;
    let opened = false;

    ws.onopen = () => {
      if (this.ws !== ws) return;
      opened = true;
      this.failures = 0;
      this.h.onState("live");
      this.h.onOpen();
    };
    ws.onmessage = (ev) => {
      if (this.ws !== ws) return;
      let frame;
      try {
        frame = JSON.parse(ev.data);
      } catch {
        return; // not ours to understand; the seq check will notice anything lost
      }
      this.h.onFrame(frame);
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return; // replaced or stopped on purpose
      this.ws = null;
      if (this.stopped) return;
      if ([CLOSE_UNKNOWN_THREAD, CLOSE_INVALID_THREAD_ID, CLOSE_THREAD_STORAGE].includes(ev.code)) {
        this.stop(); // no retry can make it exist
        this.h.onNotFound(ev.code, ev.reason);
        return;
      }
      if (AUTH_CLOSE_CODES.has(ev.code)) {
        this.h.onState("offline", "token refused");
        Promise.resolve(this.h.onAuth()).then((ok) => {
          if (ok) this.reconnectNow();
          else this.retry("token refused");
        });
        return;
      }
      // 1013: we read too slowly and the server dropped us; come back at once, the
      // reload on open fills in what was missed.
      if (ev.code === 1013 && opened) this.failures = 0;
      this.retry(ev.reason || `closed (${ev.code})`);
    };
    // Errors are always followed by a close event, which does the work.
    ws.onerror = () => {};
  }

  retry(reason) {
    if (this.stopped) return;
    clearTimeout(this.timer);
    // Exponential backoff, 0.5 s doubling to 30 s, with jitter so that many open panes
    // do not all hit a restarted server in the same instant.
    const base = Math.min(30000, 500 * 2 ** this.failures);
    const delay = Math.round(base * (0.5 + Math.random() / 2));
    this.failures += 1;
    this.h.onState("offline", `${reason}; retrying in ${Math.ceil(delay / 1000)} s`);
    this.timer = setTimeout(() => this.connect(), delay);
  }
}
