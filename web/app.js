// app.js — the Effects pane: threads on the left, the selected thread's runs (or, on the
// Conversation tab, its messages) in the middle, one run's detail on the right, kept live by
// the thread's WebSocket stream (effect_changed and message_created frames, one seq).
//
// Rendering model: `state.runs` (Map id -> run) is the only copy of the data. Rows are built
// once per run and cached in `state.rows`; a frame marks its run dirty and the next animation
// frame patches just those rows and the counts. Only loads, reloads and filter changes rebuild
// the table body, and even then they reuse the cached rows through one DocumentFragment.
// All server text goes in through textContent / attributes, never innerHTML.

import { api, ApiError, RunStream, askForToken, getToken, onReach, onTokenNeeded, setToken } from "./api.js";

const STATUSES = ["pending", "running", "completed", "failed", "canceled"];
const TERMINAL = new Set(["completed", "failed", "canceled"]);
const THREAD_PAGE = 50;
// The header badge: the selected thread's stream (live, connecting…, offline) while there is
// one; otherwise whether the server answers (idle; offline; token needed; connecting… at first).
const CONN_TEXT = {
  live: "live",
  connecting: "connecting…",
  offline: "offline",
  idle: "idle",
  unauthorized: "token needed",
};
const CLOSE_INVALID_THREAD_ID = 4400; // the stream's close code for a malformed thread id

// Runs per page. 100 keeps "load more" clicks few on big threads; if the server refuses a
// limit that large (400/422) we fall back to its documented default once and for all.
let runPageSize = 100;

const $ = (id) => document.getElementById(id);
const el = {
  conn: $("conn-state"),
  tokenButton: $("token-button"),
  layout: $("layout"),
  threadList: $("thread-list"),
  threadsEmpty: $("threads-empty"),
  threadsMore: $("threads-more"),
  newThread: $("new-thread"),
  agentMenu: $("agent-menu"),
  agentOptions: $("agent-options"),
  tabs: $("tabs"),
  tabRuns: $("tab-runs"),
  tabConversation: $("tab-conversation"),
  conversationUnread: $("conversation-unread"),
  runsPanel: $("runs-panel"),
  conversationPanel: $("conversation-panel"),
  messageScroll: $("message-scroll"),
  messageList: $("message-list"),
  messagesEmpty: $("messages-empty"),
  messagesOlder: $("messages-older"),
  composer: $("composer"),
  composerInput: $("composer-input"),
  composerSend: $("composer-send"),
  composerStatus: $("composer-status"),
  composerError: $("composer-error"),
  noThread: $("no-thread"),
  threadView: $("thread-view"),
  threadId: $("thread-id"),
  threadError: $("thread-error"),
  reloadRuns: $("reload-runs"),
  scheduleForm: $("schedule-form"),
  scheduleName: $("schedule-name"),
  scheduleDesc: $("schedule-desc"),
  scheduleArgs: $("schedule-args"),
  argsRestore: $("schedule-args-restore"),
  scheduleDelay: $("schedule-delay"),
  scheduleSubmit: $("schedule-submit"),
  scheduleError: $("schedule-error"),
  scheduleResult: $("schedule-result"),
  filters: $("filters"),
  loadedNote: $("loaded-note"),
  table: $("runs-table"),
  tbody: $("runs-body"),
  runsEmpty: $("runs-empty"),
  runsMore: $("runs-more"),
  detail: $("run-detail"),
  detailName: $("detail-name"),
  detailStatus: $("detail-status"),
  detailClose: $("detail-close"),
  detailActions: $("detail-actions"),
  detailFields: $("detail-fields"),
  detailError: $("detail-error"),
  detailArgs: $("detail-args"),
  toasts: $("toasts"),
  tokenDialog: $("token-dialog"),
  tokenForm: $("token-form"),
  tokenReason: $("token-reason"),
  tokenInput: $("token-input"),
  tokenCancel: $("token-cancel"),
  tokenForget: $("token-forget"),
};

function newFeeds() {
  // One paging cursor for the whole list ("all") and one per status filter, so "load more"
  // on the Failed tab fetches more failed runs instead of paging through everything.
  const feeds = {};
  for (const key of ["all", ...STATUSES]) {
    feeds[key] = { cursor: null, exhausted: false, started: false, loaded: 0 };
  }
  return feeds;
}

const state = {
  threads: new Map(), // id -> thread, in list order
  threadCursor: null,
  threadsLoading: false,

  tid: null, // selected thread id
  gen: 0, // bumped on every thread switch; answers for an older generation are dropped
  runs: new Map(), // id -> run
  order: [], // run ids, newest first
  rows: new Map(), // id -> <tr>, built once per run
  feeds: newFeeds(),
  filter: "all",
  maxT: 0, // newest createdAt seen (ms), to place runs only known from frames

  stream: null,
  streamConn: null, // {conn, detail}: the stream's last state, shown in the header badge
  gone: false, // the selected thread does not exist (deleted elsewhere, or a malformed id)
  reach: "unknown", // "unknown" | "ok" | "offline" | "unauthorized": the last API answer
  probeTimer: null, // while offline with no stream: when to try the server again
  probeFailures: 0,
  lastSeq: null,
  loading: false, // a full (re)load is in flight
  loadingMore: false,
  reloadQueued: false,
  loadedOnce: false,
  framesDuringLoad: null, // ids changed by frames while a reload was in flight
  fallbackTimer: null,

  dirty: new Set(), // run ids whose row needs patching on the next animation frame
  flushScheduled: false,

  detailId: null,
  effects: [],
  argsFor: null, // the effect the args box holds args for
  argsDrafts: new Map(), // effect name -> args the user edited, set aside on switching effect
  tokenDismissed: false,

  view: "runs", // "runs" | "conversation": the tab shown for the selected thread
  conv: null, // the selected thread's conversation, see newConversation()
  agents: null, // GET /api/agents answer (null until known, or when it failed)
  agentsLoad: null, // the in-flight loadAgents() promise
};

// ---------------------------------------------------------------------------------------
// Small helpers

function make(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("data-") || key.startsWith("aria-") || key === "role" || key === "title") {
      node.setAttribute(key, value === true ? "" : String(value));
    } else node[key] = value;
  }
  for (const child of children) if (child != null) node.append(child);
  return node;
}

function parseTime(iso) {
  if (!iso) return NaN;
  return Date.parse(iso);
}

const timeFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
const dateTimeFmt = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
});

/** Local time; the date is left out when it is today. */
function fmtLocal(iso, { full = false } = {}) {
  const t = parseTime(iso);
  if (!Number.isFinite(t)) return iso ? String(iso) : "—";
  const d = new Date(t);
  const today = new Date().toDateString() === d.toDateString();
  return !full && today ? timeFmt.format(d) : dateTimeFmt.format(d);
}

/** "in 5s", "3m ago", "now". */
function fmtRelative(iso, now = Date.now()) {
  const t = parseTime(iso);
  if (!Number.isFinite(t)) return "";
  const diff = t - now;
  const s = Math.round(Math.abs(diff) / 1000);
  if (s < 1) return "now";
  let txt;
  if (s < 60) txt = `${s}s`;
  else if (s < 3600) txt = `${Math.floor(s / 60)}m`;
  else if (s < 86400) txt = `${Math.floor(s / 3600)}h`;
  else txt = `${Math.floor(s / 86400)}d`;
  return diff > 0 ? `in ${txt}` : `${txt} ago`;
}

/** A span whose relative text the once-a-second ticker keeps current. */
function relSpan(iso, cls = "rel") {
  const span = make("span", { class: cls });
  setRel(span, iso);
  return span;
}

function setRel(span, iso) {
  if (iso) span.dataset.time = iso;
  else delete span.dataset.time;
  const text = iso ? fmtRelative(iso) : "";
  if (span.textContent !== text) span.textContent = text;
}

// Ids may be ULIDs or UUIDv7, whose leading characters are a timestamp shared by runs made
// together, so the short form keeps the (random) tail. The full id is in the title.
function shortId(id) {
  const s = String(id ?? "");
  return s.length > 12 ? `…${s.slice(-8)}` : s;
}

function statusClass(status) {
  return STATUSES.includes(status) ? `badge badge-${status}` : "badge badge-unknown";
}

function errorText(err) {
  if (err instanceof ApiError) return err.message;
  return err && err.message ? err.message : String(err);
}

// ---------------------------------------------------------------------------------------
// Toasts and the connection indicator

function toast(message, { kind = "error", detail, action, timeout } = {}) {
  const box = make("div", {
    class: `toast toast-${kind}`,
    role: kind === "error" ? "alert" : "status",
    "data-testid": "toast",
    "data-kind": kind,
  });
  box.append(make("span", { class: "toast-text", text: message }));
  if (detail) box.append(make("span", { class: "toast-detail mono", text: detail }));
  if (action) {
    const btn = make("button", { type: "button", class: "btn btn-ghost btn-small", text: action.label });
    btn.addEventListener("click", () => {
      action.run();
      box.remove();
    });
    box.append(btn);
  }
  const close = make("button", {
    type: "button",
    class: "toast-close",
    text: "✕",
    "aria-label": "Dismiss",
  });
  close.addEventListener("click", () => box.remove());
  box.append(close);
  el.toasts.append(box);
  while (el.toasts.childElementCount > 5) el.toasts.firstElementChild.remove();
  setTimeout(() => box.remove(), timeout ?? (kind === "error" ? 10000 : 5000));
}

function toastApiError(what, err) {
  const code = err instanceof ApiError && err.status ? `${err.status} ${err.code}` : undefined;
  toast(`${what}: ${errorText(err)}`, { detail: code });
}

/** The selected thread's stream changed state ("connecting" | "live" | "offline"). */
function setConn(conn, detail) {
  state.streamConn = { conn, detail };
  if (conn === "live") setReach("ok");
  else renderConn();
  // If the socket cannot be opened at all, still show the list over plain HTTP.
  if (conn === "offline" && state.tid && !state.loadedOnce && !state.loading) reload();
}

function renderConn() {
  let conn;
  let title;
  if (state.stream && state.streamConn) {
    const { detail } = state.streamConn;
    conn = state.streamConn.conn;
    title = detail ? `Live updates: ${detail}` : "Live updates for the selected thread";
  } else if (state.reach === "ok") {
    conn = "idle";
    title = state.tid
      ? "The server answers; this thread has no live updates"
      : "The server answers; select a thread for live updates";
  } else if (state.reach === "offline") {
    conn = "offline";
    title = "Cannot reach the server; trying again";
  } else if (state.reach === "unauthorized") {
    conn = "unauthorized";
    title = "The server needs an API token: set it with the API token button";
  } else {
    conn = "connecting";
    title = "Contacting the server";
  }
  // It runs on every API answer: touch the live region only when something changed.
  const text = CONN_TEXT[conn] || conn;
  if (el.conn.dataset.state !== conn) el.conn.dataset.state = conn;
  if (el.conn.textContent !== text) el.conn.textContent = text;
  if (el.conn.title !== title) el.conn.title = title;
}

/** Every API answer (or failure to get one) lands here, through api.js's onReach. */
function setReach(reach) {
  const was = state.reach;
  state.reach = reach;
  if (reach === "offline") {
    scheduleProbe();
  } else {
    clearTimeout(state.probeTimer);
    state.probeTimer = null;
    state.probeFailures = 0;
    // Back after an outage: fetch again what could not be fetched meanwhile.
    if (was === "offline") recoverLists();
  }
  renderConn();
}

// While the server cannot be reached and no stream is retrying on its own, knock again now
// and then (2 s doubling to 30 s), so the badge and the lists come back by themselves.
function scheduleProbe({ now = false } = {}) {
  if (state.reach !== "offline" || state.stream) return;
  if (state.probeTimer) {
    if (!now) return;
    clearTimeout(state.probeTimer);
  }
  const delay = now ? 0 : Math.min(30000, 2000 * 2 ** state.probeFailures);
  state.probeTimer = setTimeout(() => {
    state.probeTimer = null;
    if (state.reach !== "offline" || state.stream) return;
    state.probeFailures += 1;
    api.listThreads({ limit: 1 }).catch(() => {}); // its outcome goes through setReach
  }, delay);
}

function recoverLists() {
  loadThreads(false);
  if (!state.effects.length) loadEffects();
  if (state.agents === null) loadAgents();
}

// ---------------------------------------------------------------------------------------
// Auth

/** Opens the token dialog; resolves to the saved token, or null when dismissed. */
function openTokenDialog(reason) {
  return new Promise((resolve) => {
    const dlg = el.tokenDialog;
    el.tokenReason.textContent = reason;
    el.tokenInput.value = "";
    el.tokenForget.hidden = !getToken();
    let settled = false;
    const finish = (value) => {
      if (settled) return;
      settled = true;
      el.tokenForm.removeEventListener("submit", onSubmit);
      el.tokenCancel.removeEventListener("click", onCancel);
      el.tokenForget.removeEventListener("click", onForget);
      dlg.removeEventListener("cancel", onCancel);
      if (dlg.open) dlg.close();
      resolve(value);
    };
    const onSubmit = (ev) => {
      ev.preventDefault();
      const token = el.tokenInput.value.trim();
      if (!token) {
        el.tokenInput.focus();
        return;
      }
      setToken(token);
      finish(token);
    };
    const onCancel = (ev) => {
      ev.preventDefault();
      finish(null);
    };
    const onForget = () => {
      setToken("");
      finish(null);
    };
    el.tokenForm.addEventListener("submit", onSubmit);
    el.tokenCancel.addEventListener("click", onCancel);
    el.tokenForget.addEventListener("click", onForget);
    dlg.addEventListener("cancel", onCancel);
    if (!dlg.open) dlg.showModal();
    el.tokenInput.focus();
  });
}

// Asked by api.js on a 401. After one dismissal we stop interrupting: the calls fail with
// a toast and the "API token" button in the header is the way back.
onTokenNeeded(async (rejected) => {
  if (state.tokenDismissed || el.tokenDialog.open) return null;
  const token = await openTokenDialog(
    rejected
      ? "The server refused the stored API token. Enter a valid one."
      : "The server requires an API token.",
  );
  if (!token) {
    state.tokenDismissed = true;
    return null;
  }
  // The socket was probably refused too; retry it with the token now.
  if (state.stream && el.conn.dataset.state !== "live") state.stream.reconnectNow();
  return token;
});

async function onTokenButton() {
  if (el.tokenDialog.open) return;
  const had = getToken();
  const token = await openTokenDialog("Set the API token sent with every call to this server.");
  if (token === null && getToken() === had) return; // cancelled without change
  state.tokenDismissed = false;
  // Everything loaded so far may have failed for want of a token: start over.
  loadThreads(false);
  loadEffects();
  loadAgents();
  if (state.stream) state.stream.reconnectNow();
  else if (state.tid) reload();
}

// ---------------------------------------------------------------------------------------
// Threads

function threadItem(thread) {
  const id = String(thread.id);
  const li = make("li", {
    class: "thread-item",
    "data-testid": "thread-item",
    "data-thread-id": id,
  });
  const meta = make("span", { class: "thread-meta" });
  if (thread.createdAt) {
    meta.append(make("span", { class: "muted", title: thread.createdAt, text: "created " }));
    meta.append(relSpan(thread.createdAt, "rel muted"));
  }
  for (const [label, value] of [
    ["agent", thread.agentId],
    ["user", thread.userId],
  ]) {
    if (value) meta.append(make("span", { class: "thread-tag", title: label, text: `${label}: ${value}` }));
  }
  if (Array.isArray(thread.tags)) {
    for (const tag of thread.tags) meta.append(make("span", { class: "thread-tag", text: String(tag) }));
  }
  const select = make(
    "button",
    { type: "button", class: "thread-select", title: id },
    make("span", { class: "thread-id mono", text: id }),
    meta,
  );
  const del = make("button", {
    type: "button",
    class: "thread-delete",
    "data-testid": "delete-thread",
    "aria-label": `Delete thread ${id}`,
    title: "Delete thread",
    text: "Delete",
  });
  li.append(select, del);
  if (id === state.tid) li.setAttribute("aria-current", "true");
  return li;
}

function renderThreadsFooter() {
  el.threadsMore.hidden = !state.threadCursor;
  el.threadsEmpty.hidden = state.threads.size > 0 || state.threadsLoading;
}

async function loadThreads(more) {
  if (state.threadsLoading) return;
  state.threadsLoading = true;
  el.threadsMore.disabled = true;
  try {
    const res = await api.listThreads({ limit: THREAD_PAGE, cursor: more ? state.threadCursor : undefined });
    if (!more) {
      state.threads.clear();
      el.threadList.replaceChildren();
    }
    const frag = document.createDocumentFragment();
    for (const thread of res.threads || []) {
      const id = String(thread.id);
      if (state.threads.has(id)) continue;
      state.threads.set(id, thread);
      frag.append(threadItem(thread));
    }
    el.threadList.append(frag);
    state.threadCursor = res.nextCursor || null;
  } catch (err) {
    toastApiError("Could not load threads", err);
  } finally {
    state.threadsLoading = false;
    el.threadsMore.disabled = false;
    renderThreadsFooter();
  }
}

async function createThread(agentId) {
  closeAgentMenu();
  el.newThread.disabled = true;
  try {
    const res = await api.createThread(agentId);
    const thread = { createdAt: new Date().toISOString(), tags: [], agentId, ...res, id: String(res.id) };
    state.threads.set(thread.id, thread);
    el.threadList.prepend(threadItem(thread));
    renderThreadsFooter();
    selectThread(thread.id);
  } catch (err) {
    // The app's agents may have changed since the page loaded: offer the choice now.
    if (!agentId && err instanceof ApiError && err.code === "agent_not_found") {
      await loadAgents();
      if (needsAgentChoice()) {
        el.newThread.disabled = false;
        openAgentMenu();
        return;
      }
    }
    toastApiError("Could not create a thread", err);
  } finally {
    el.newThread.disabled = false;
  }
}

// ---------------------------------------------------------------------------------------
// Agents: "New thread" asks which one when the app has several and none is the default.

function loadAgents() {
  if (!state.agentsLoad) {
    state.agentsLoad = api
      .listAgents()
      .then((res) => {
        state.agents = Array.isArray(res && res.agents) ? res.agents : [];
      })
      .catch(() => {
        state.agents = null; // unknown: create as before and let the server say what is wrong
      })
      .finally(() => {
        state.agentsLoad = null;
      });
  }
  return state.agentsLoad;
}

function needsAgentChoice() {
  const agents = state.agents;
  return Array.isArray(agents) && agents.length > 1 && !agents.some((a) => a.default);
}

async function onNewThread() {
  if (!el.agentMenu.hidden) {
    closeAgentMenu();
    return;
  }
  if (state.agents === null || state.agentsLoad) await loadAgents();
  if (needsAgentChoice()) openAgentMenu();
  else createThread();
}

function openAgentMenu() {
  const frag = document.createDocumentFragment();
  for (const agent of state.agents || []) {
    const id = String(agent.id);
    const item = make(
      "button",
      {
        type: "button",
        class: "menu-item",
        role: "menuitem",
        "data-testid": "agent-option",
        "data-agent-id": id,
      },
      make("span", { class: "menu-item-name mono", text: id }),
    );
    if (agent.description) {
      item.append(make("span", { class: "menu-item-desc", text: String(agent.description) }));
    }
    frag.append(item);
  }
  el.agentOptions.replaceChildren(frag);
  el.agentMenu.hidden = false;
  el.newThread.setAttribute("aria-expanded", "true");
  el.agentOptions.querySelector("button")?.focus();
}

function closeAgentMenu() {
  if (el.agentMenu.hidden) return;
  el.agentMenu.hidden = true;
  el.newThread.setAttribute("aria-expanded", "false");
}

async function deleteThread(id, button) {
  if (!window.confirm(`Delete thread ${id}?\n\nIts history and every scheduled run are discarded; nothing of it runs later.`)) {
    return;
  }
  button.disabled = true;
  try {
    await api.deleteThread(id);
    forgetThread(id);
    toast(`Thread ${id} deleted.`, { kind: "info" });
  } catch (err) {
    button.disabled = false;
    if (err instanceof ApiError && err.status === 404) {
      forgetThread(id); // already gone: the list was just out of date
    }
    toastApiError(`Could not delete thread ${id}`, err);
  }
}

function forgetThread(id) {
  state.threads.delete(id);
  threadEl(id)?.remove();
  renderThreadsFooter();
  if (state.tid === id) selectThread(null);
}

function threadEl(id) {
  for (const li of el.threadList.children) if (li.dataset.threadId === id) return li;
  return null;
}

function markSelectedThread() {
  for (const li of el.threadList.children) {
    if (li.dataset.threadId === state.tid) li.setAttribute("aria-current", "true");
    else li.removeAttribute("aria-current");
  }
}

// ---------------------------------------------------------------------------------------
// Selecting a thread

function threadFromHash() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  return params.get("thread") || null;
}

function viewFromHash() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  return params.get("view") === "conversation" ? "conversation" : "runs";
}

function hashFor(tid) {
  if (!tid) return "";
  return `#thread=${encodeURIComponent(tid)}${state.view === "conversation" ? "&view=conversation" : ""}`;
}

/**
 * Forget the shown thread's runs, messages, stream and detail (for a new selection, or a
 * thread that turned out not to exist). Bumping `gen` drops answers still in flight.
 */
function dropThreadView() {
  state.gen += 1;
  if (state.stream) state.stream.stop();
  state.stream = null;
  state.streamConn = null;
  clearTimeout(state.fallbackTimer);
  state.runs = new Map();
  state.order = [];
  state.rows = new Map();
  state.feeds = newFeeds();
  state.serverCounts = null;
  state.loading = false;
  state.loadingMore = false;
  state.reloadQueued = false;
  state.loadedOnce = false;
  state.framesDuringLoad = null;
  state.dirty.clear();
  closeDetail();
  el.tbody.replaceChildren();
  el.scheduleResult.hidden = true;
  resetConversation();
}

function selectThread(tid) {
  tid = tid ? String(tid) : null;
  if (tid === state.tid) return;

  // Tear down everything that belonged to the previous thread.
  dropThreadView();
  state.tid = tid;
  state.gone = false;
  state.maxT = 0;
  state.lastSeq = null;
  el.threadError.hidden = true;
  el.scheduleError.hidden = true;
  setThreadDisabled(false);

  const want = hashFor(tid);
  if (location.hash !== want) {
    if (want) location.hash = want;
    else history.replaceState(null, "", location.pathname + location.search);
  }
  markSelectedThread();
  el.noThread.hidden = Boolean(tid);
  el.threadView.hidden = !tid;
  document.title = tid ? `${tid} · Effects pane` : "Effects pane · thread-effects";

  if (!tid) {
    renderConn();
    scheduleProbe(); // when offline: nothing else retries now
    return;
  }
  el.threadId.textContent = tid;
  renderCounts();
  renderFooter();
  if (state.view === "conversation") loadMessages();

  const gen = state.gen;
  state.stream = new RunStream(tid, {
    onState: (conn, detail) => {
      if (gen === state.gen) setConn(conn, detail);
    },
    onOpen: () => {
      if (gen !== state.gen) return;
      // Frames sent while we were away are gone: the list is reloaded on every (re)connect
      // and seq numbering restarts from whatever the first frame says.
      state.lastSeq = null;
      reload();
      if (state.conv.loadedOnce) loadMessages(); // catch up on what was said meanwhile
    },
    onFrame: (frame) => {
      if (gen === state.gen) handleFrame(frame);
    },
    onNotFound: (code) => {
      if (gen !== state.gen) return;
      threadGone(tid, code === CLOSE_INVALID_THREAD_ID ? invalidIdText(tid) : notFoundText(tid));
    },
    onAuth: () => askForToken(true),
  });
  state.stream.start();
  // The list normally loads when the socket opens; don't leave the page empty if that is slow.
  state.fallbackTimer = setTimeout(() => {
    if (gen === state.gen && !state.loadedOnce && !state.loading) reload();
  }, 1500);
}

function showThreadError(message) {
  el.threadError.textContent = message;
  el.threadError.hidden = false;
}

function notFoundText(tid) {
  return `Thread not found: ${tid}. It may have been deleted.`;
}

function invalidIdText(tid) {
  return `Invalid thread id: ${tid}. Thread ids are 1 to 64 letters, digits, "_" or "-".`;
}

/**
 * When an answer says the selected thread does not exist (404 thread_not_found, or 400
 * invalid_thread_id), treat it as gone and return true; otherwise return false.
 */
function handledAsGone(tid, err) {
  if (!(err instanceof ApiError)) return false;
  if (err.status === 404 && err.code === "thread_not_found") threadGone(tid, notFoundText(tid));
  else if (err.status === 400 && err.code === "invalid_thread_id") threadGone(tid, invalidIdText(tid));
  else return false;
  return true;
}

/**
 * The selected thread does not exist (deleted in another browser, or never could): drop it
 * from the list, clear its runs and messages, stop its stream, disable everything that would
 * act on it, and say why. The thread stays selected so the message stays in view.
 */
function threadGone(tid, message) {
  if (tid !== state.tid) return;
  if (!state.gone) {
    state.gone = true;
    dropThreadView(); // answers still in flight for it are dropped
    el.table.removeAttribute("aria-busy");
    state.threads.delete(tid);
    threadEl(tid)?.remove();
    renderThreadsFooter();
    setThreadDisabled(true);
    renderCounts();
    renderFooter();
    renderConn();
    scheduleProbe();
  }
  showThreadError(message);
}

/** Enable or disable every control that acts on the selected thread. */
function setThreadDisabled(disabled) {
  el.threadView.toggleAttribute("data-gone", disabled);
  const controls = [
    el.scheduleName,
    el.scheduleArgs,
    el.scheduleDelay,
    el.scheduleSubmit,
    el.argsRestore,
    el.reloadRuns,
    el.composerInput,
    ...el.filters.querySelectorAll("button"),
  ];
  for (const control of controls) control.disabled = disabled;
  renderComposer();
}

// ---------------------------------------------------------------------------------------
// Runs: the model

function approxT() {
  // A run only known from a frame has no createdAt; it was just made (or just became
  // interesting), so it goes on top, newer arrivals above older ones.
  state.maxT = Math.max(Date.now(), state.maxT + 1);
  return state.maxT;
}

function timeOf(run) {
  const t = parseTime(run.createdAt);
  if (Number.isFinite(t)) {
    if (t > state.maxT) state.maxT = t;
    return t;
  }
  return Number.isFinite(run._t) ? run._t : approxT();
}

/** Newest first; ties broken by id so the order is stable. */
function cmp(a, b) {
  return b._t - a._t || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0);
}

function lowerBound(run) {
  const order = state.order;
  let lo = 0;
  let hi = order.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (cmp(state.runs.get(order[mid]), run) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

function indexOfRun(run) {
  const i = lowerBound(run);
  return state.order[i] === run.id ? i : state.order.indexOf(run.id);
}

// A finished run never runs again (a replay is a new run), and attempts only grow: an
// answer contradicting either is older than what we already show.
function isStale(existing, incoming) {
  if (TERMINAL.has(existing.status) && incoming.status && !TERMINAL.has(incoming.status)) return true;
  if (Number.isFinite(incoming.attempts) && Number.isFinite(existing.attempts)) {
    return incoming.attempts < existing.attempts;
  }
  return false;
}

// How far along a run is; used to pick between a frame and a snapshot that raced.
function progress(run) {
  if (TERMINAL.has(run.status)) return Number.MAX_SAFE_INTEGER;
  return (Number(run.attempts) || 0) * 2 + (run.status === "running" ? 1 : 0);
}

/** Upsert one run (from a list, a single GET, a frame or an action's answer). */
function mergeRun(incoming) {
  if (!incoming || incoming.id == null) return null;
  const id = String(incoming.id);
  const existing = state.runs.get(id);
  if (!existing) {
    const run = { ...incoming, id, _v: 1 };
    run._t = timeOf(run);
    state.runs.set(id, run);
    state.order.splice(lowerBound(run), 0, id);
    return run;
  }
  if (isStale(existing, incoming)) return existing;
  const oldT = existing._t;
  Object.assign(existing, incoming, { id });
  existing._v += 1;
  const t = timeOf(existing);
  if (t !== oldT) {
    const i = state.order.indexOf(id);
    if (i >= 0) state.order.splice(i, 1);
    existing._t = t;
    state.order.splice(lowerBound(existing), 0, id);
  }
  return existing;
}

function matchesFilter(run) {
  return state.filter === "all" || run.status === state.filter;
}

// ---------------------------------------------------------------------------------------
// Runs: loading

function feedKey() {
  // Once the whole list is loaded every status is complete too.
  return state.filter === "all" || state.feeds.all.exhausted ? "all" : state.filter;
}

async function fetchPage(tid, key, feed) {
  const opts = { limit: runPageSize, cursor: feed.cursor || undefined };
  if (key !== "all") opts.status = key;
  let res;
  try {
    res = await api.listRuns(tid, opts);
  } catch (err) {
    // Only a refused limit (not, say, a malformed thread id) lowers the page size.
    const refusedLimit = err instanceof ApiError && (err.code === "invalid_parameter" || err.status === 422);
    if (refusedLimit && runPageSize > 50) {
      runPageSize = 50;
      return fetchPage(tid, key, feed);
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
 * (Re)load the selected thread's runs over HTTP: on first selection, on every socket
 * (re)connect, after a seq gap, and from the Reload button. It fetches again as many runs
 * as were loaded, so a reload never shrinks what the user paged in.
 */
async function reload() {
  const tid = state.tid;
  if (!tid || state.gone) return;
  if (state.loading) {
    state.reloadQueued = true; // one more pass after this one, however many asked
    return;
  }
  const gen = state.gen;
  state.loading = true;
  state.reloadQueued = false;
  state.framesDuringLoad = new Set();
  el.table.setAttribute("aria-busy", "true");
  renderFooter();

  const prev = state.feeds;
  const feeds = newFeeds();
  const fetched = [];
  try {
    const wantAll = Math.max(prev.all.loaded, 1);
    do {
      fetched.push(...(await fetchPage(tid, "all", feeds.all)));
      if (gen !== state.gen) return;
    } while (!feeds.all.exhausted && feeds.all.loaded < wantAll);

    const f = state.filter;
    if (f !== "all" && !feeds.all.exhausted) {
      const want = Math.max(prev[f].loaded, 1);
      do {
        fetched.push(...(await fetchPage(tid, f, feeds[f])));
        if (gen !== state.gen) return;
      } while (!feeds[f].exhausted && feeds[f].loaded < want);
    }
    applySnapshot(fetched, feeds);
  } catch (err) {
    if (gen !== state.gen) return;
    if (!handledAsGone(tid, err)) toastApiError("Could not load runs", err);
  } finally {
    if (gen === state.gen) {
      state.loading = false;
      state.framesDuringLoad = null;
      el.table.removeAttribute("aria-busy");
      renderFooter();
      if (state.reloadQueued) {
        state.reloadQueued = false;
        reload();
      }
    }
  }
}

function applySnapshot(fetched, feeds) {
  const old = state.runs;
  const during = state.framesDuringLoad || new Set();
  const runs = new Map();
  for (const r of fetched) {
    const id = String(r.id);
    if (runs.has(id)) continue;
    const before = old.get(id);
    let run = { ...r, id };
    if (before) {
      // A frame that arrived while this snapshot was being read may be newer than it.
      if (during.has(id) && progress(before) > progress(run)) run = { ...run, ...before };
      else if ("args" in before && !("args" in run)) run.args = before.args;
      run._v = before._v + 1;
      run._t = before._t;
    } else {
      run._v = 1;
    }
    runs.set(id, run);
  }
  // Runs first seen in frames during the load were scheduled after the snapshot was taken.
  for (const id of during) if (!runs.has(id) && old.has(id)) runs.set(id, old.get(id));
  // Keep the run open in the detail view even when it lies beyond the loaded pages.
  if (state.detailId && !runs.has(state.detailId) && old.has(state.detailId)) {
    runs.set(state.detailId, old.get(state.detailId));
  }

  state.runs = runs;
  for (const run of runs.values()) run._t = timeOf(run);
  state.order = [...runs.values()].sort(cmp).map((run) => run.id);
  for (const [id, row] of state.rows) {
    if (!runs.has(id)) {
      row.remove();
      state.rows.delete(id);
    }
  }
  state.feeds = feeds;
  state.serverCounts = feeds.all.counts ? { ...feeds.all.counts } : null;
  state.loadedOnce = true;
  el.threadError.hidden = true;
  renderAll();
}

// How each change moves a run between statuses, so the server's totals stay current from
// frames alone, even for runs beyond the loaded pages.
const TRANSITIONS = {
  scheduled: [null, "pending"],
  started: ["pending", "running"],
  completed: ["running", "completed"],
  failed: ["running", "failed"],
  canceled: ["pending", "canceled"],
  requeued: ["running", "pending"],
};

function countChange(change) {
  const t = TRANSITIONS[change];
  if (!state.serverCounts || !t) return;
  const [from, to] = t;
  if (from && state.serverCounts[from] > 0) state.serverCounts[from] -= 1;
  state.serverCounts[to] = (state.serverCounts[to] || 0) + 1;
}

async function loadMore() {
  const tid = state.tid;
  if (!tid || state.gone || state.loading || state.loadingMore) return;
  const key = feedKey();
  const feed = state.feeds[key];
  if (feed.exhausted) return;
  const gen = state.gen;
  state.loadingMore = true;
  renderFooter();
  try {
    const runs = await fetchPage(tid, key, feed);
    if (gen !== state.gen) return;
    for (const r of runs) mergeRun(r);
    renderAll();
  } catch (err) {
    if (gen === state.gen && !handledAsGone(tid, err)) toastApiError("Could not load more runs", err);
  } finally {
    if (gen === state.gen) {
      state.loadingMore = false;
      renderFooter();
    }
  }
}

/** Fetch one run (with args) and fold it into the model. */
async function refreshRun(id) {
  const tid = state.tid;
  const gen = state.gen;
  const run = await api.getRun(tid, id);
  if (gen !== state.gen) return null;
  const merged = mergeRun(run);
  markDirty(String(id));
  return merged;
}

// ---------------------------------------------------------------------------------------
// Live frames

function handleFrame(frame) {
  if (!frame || typeof frame !== "object") return;
  if (frame.threadId != null && String(frame.threadId) !== state.tid) return;

  // seq counts every frame of the thread, so check it before looking at the type.
  if (Number.isInteger(frame.seq)) {
    const gap = state.lastSeq !== null && frame.seq !== state.lastSeq + 1;
    state.lastSeq = frame.seq;
    if (gap) {
      reload();
      if (state.conv.loadedOnce) loadMessages();
    }
  }
  if (frame.type === "event" && frame.eventType === "message_created") {
    handleMessageFrame(frame.data);
    return;
  }
  if (frame.type !== "event" || frame.eventType !== "effect_changed") return;
  const data = frame.data;
  if (!data || data.id == null) return;

  const { change, args: _ignored, ...fields } = data; // frames never carry args; never clobber ours
  if (change) fields.lastChange = change;
  countChange(change);
  const id = String(data.id);
  if (state.framesDuringLoad) state.framesDuringLoad.add(id);
  mergeRun(fields);
  markDirty(id);
}

function markDirty(id) {
  state.dirty.add(id);
  if (state.flushScheduled) return;
  state.flushScheduled = true;
  requestAnimationFrame(flush);
}

/** Patch the rows that changed since the last animation frame, then the counts. */
function flush() {
  state.flushScheduled = false;
  if (!state.dirty.size) return;
  const detailDirty = state.detailId !== null && state.dirty.has(state.detailId);
  for (const id of state.dirty) placeRow(id);
  state.dirty.clear();
  renderCounts();
  renderFooter();
  if (detailDirty) renderDetail();
}

// ---------------------------------------------------------------------------------------
// Runs: rendering

function actionButtons(run) {
  const buttons = [];
  const mk = (action, label, cls) =>
    make("button", {
      type: "button",
      class: `btn btn-small ${cls}`,
      "data-action": action,
      "data-testid": action,
      "aria-label": `${label} ${run.name || ""} ${run.id}`.replace(/\s+/g, " ").trim(),
      text: label,
    });
  if (run.status === "pending") {
    buttons.push(mk("run-now", "Run now", "btn-primary"), mk("cancel", "Cancel", "btn-danger"));
  } else if (TERMINAL.has(run.status)) {
    buttons.push(mk("replay", "Replay", "btn-secondary"));
  }
  return buttons;
}

function createRow(run) {
  const tr = make("tr", {
    class: "run-row",
    "data-testid": "run-row",
    "data-run-id": run.id,
    tabIndex: 0,
  });
  const c = {
    id: make("td", { class: "mono cell-id" }),
    name: make("td", { class: "cell-name" }),
    badge: make("span"),
    dueAbs: make("span", { class: "due-abs" }),
    dueRel: make("span", { class: "rel muted" }),
    due: make("td", { class: "cell-due" }),
    att: make("td", { class: "num cell-att" }),
    err: make("td", { class: "cell-error" }),
    act: make("td", { class: "cell-actions" }),
  };
  // Shown instead of the actions when the list is narrow: the row opens the detail.
  const open = make("td", { class: "cell-open", "data-testid": "row-open", "aria-hidden": "true", text: "›" });
  const statusTd = make("td", {}, c.badge);
  c.due.append(c.dueAbs, " ", c.dueRel);
  tr.append(c.id, c.name, statusTd, c.due, c.att, c.err, c.act, open);
  tr._cells = c;
  tr._v = -1;
  tr._status = null;
  c.id.textContent = shortId(run.id);
  c.id.title = run.id;
  if (run.id === state.detailId) tr.classList.add("selected");
  return tr;
}

function updateRow(tr, run) {
  if (tr._v === run._v) return; // nothing changed since the row was last drawn
  tr._v = run._v;
  const c = tr._cells;
  tr.dataset.status = run.status || "";
  c.name.textContent = run.name || "";
  c.name.title = run.name || "";
  c.badge.className = statusClass(run.status);
  c.badge.textContent = run.status || "?";
  c.dueAbs.textContent = run.runAt ? fmtLocal(run.runAt) : "—";
  c.due.title = run.runAt || "";
  setRel(c.dueRel, run.runAt);
  c.att.textContent = run.attempts == null ? "" : String(run.attempts);
  const err = run.error ? String(run.error) : "";
  c.err.textContent = err.split("\n", 1)[0].slice(0, 300);
  c.err.title = err.slice(0, 2000);
  c.badge.title = err
    ? err.split("\n", 1)[0].slice(0, 300) // the error column may be hidden
    : run.status === "pending"
      ? "Runs when due, once no other run of this thread is running (one at a time)"
      : "";
  if (tr._status !== run.status) {
    tr._status = run.status;
    c.act.replaceChildren(...actionButtons(run));
  }
}

function rowFor(run) {
  let tr = state.rows.get(run.id);
  if (!tr) {
    tr = createRow(run);
    state.rows.set(run.id, tr);
  }
  updateRow(tr, run);
  return tr;
}

/** Rebuild the table body from the model, reusing cached rows. */
function renderAll() {
  const frag = document.createDocumentFragment();
  for (const id of state.order) {
    const run = state.runs.get(id);
    if (run && matchesFilter(run)) frag.append(rowFor(run));
  }
  el.tbody.replaceChildren(frag);
  const detailDirty = state.detailId !== null && state.dirty.has(state.detailId);
  state.dirty.clear();
  renderCounts();
  renderFooter();
  if (detailDirty || state.detailId !== null) renderDetail();
}

/** Put one run's row where it belongs (or take it out), touching nothing else. */
function placeRow(id) {
  const run = state.runs.get(id);
  const existing = state.rows.get(id);
  if (!run || !matchesFilter(run)) {
    if (existing && existing.parentNode) existing.remove();
    return;
  }
  const tr = rowFor(run);
  const i = indexOfRun(run);
  let next = null;
  for (let j = i + 1; j < state.order.length; j++) {
    const candidate = state.rows.get(state.order[j]);
    if (candidate && candidate.parentNode === el.tbody) {
      next = candidate;
      break;
    }
  }
  if (tr.parentNode !== el.tbody || tr.nextSibling !== next) el.tbody.insertBefore(tr, next);
}

function renderCounts() {
  const counts = { all: 0 };
  for (const s of STATUSES) counts[s] = 0;
  if (state.serverCounts) {
    for (const s of STATUSES) counts[s] = state.serverCounts[s] || 0;
    counts.all = STATUSES.reduce((n, s) => n + counts[s], 0);
  } else {
    for (const run of state.runs.values()) {
      counts.all += 1;
      if (run.status in counts) counts[run.status] += 1;
    }
  }
  for (const btn of el.filters.querySelectorAll("button[data-filter]")) {
    const n = counts[btn.dataset.filter] ?? 0;
    const span = btn.querySelector(".count");
    const text = n.toLocaleString();
    if (span.textContent !== text) span.textContent = text;
    btn.dataset.count = String(n);
  }
}

function renderFooter() {
  if (!state.tid) return;
  const shown = el.tbody.childElementCount;
  const key = feedKey();
  const more = !state.feeds[key].exhausted;
  const busy = state.loading || state.loadingMore;

  el.runsMore.hidden = !state.loadedOnce || !more;
  el.runsMore.disabled = busy;
  el.runsMore.textContent = state.loadingMore
    ? "Loading…"
    : key === "all"
      ? "Load more"
      : `Load more ${key} runs`;

  if (shown > 0) {
    el.runsEmpty.hidden = true;
  } else {
    el.runsEmpty.hidden = false;
    if (state.gone) el.runsEmpty.textContent = "This thread does not exist.";
    else if (!state.loadedOnce) el.runsEmpty.textContent = "Loading runs…";
    else if (state.filter === "all") el.runsEmpty.textContent = "No runs in this thread yet.";
    else el.runsEmpty.textContent = `No ${state.filter} runs loaded.`;
  }

  const total = state.runs.size;
  el.loadedNote.textContent = state.loadedOnce
    ? `${total.toLocaleString()} loaded${state.feeds.all.exhausted ? "" : " · more on the server"}`
    : "";
}

function setFilter(filter) {
  if (filter === state.filter) return;
  state.filter = filter;
  for (const btn of el.filters.querySelectorAll("button[data-filter]")) {
    btn.setAttribute("aria-pressed", String(btn.dataset.filter === filter));
  }
  renderAll();
  // The newest runs of that status may lie beyond what the "all" pages brought in.
  const key = feedKey();
  if (state.tid && state.loadedOnce && key !== "all" && !state.feeds[key].started) loadMore();
}

// ---------------------------------------------------------------------------------------
// Actions: run now, cancel, replay

async function runAction(action, id, button) {
  const tid = state.tid;
  const gen = state.gen;
  if (!tid) return;
  if (button) button.disabled = true;
  try {
    if (action === "run-now") {
      const res = await api.runNow(tid, id);
      if (gen !== state.gen) return;
      // The "started" frame may have overtaken this answer; only ever move the run forward.
      const run = state.runs.get(id);
      if (res && res.status && (!run || progress({ ...run, status: res.status }) > progress(run))) {
        mergeRun({ id, status: res.status });
        markDirty(id);
      }
    } else if (action === "cancel") {
      const res = await api.cancel(tid, id);
      if (gen !== state.gen) return;
      if (res && res.canceled) {
        mergeRun({ id, status: "canceled" });
        markDirty(id);
      } else {
        toast(`Run ${id} was not canceled: it is no longer pending.`);
        await refreshRun(id).catch(() => {});
      }
    } else if (action === "replay") {
      const res = await api.replay(tid, id);
      if (gen !== state.gen) return;
      const newId = String(res.id);
      toast(`Replay scheduled as ${newId}.`, {
        kind: "info",
        action: { label: "Open", run: () => openDetail(newId) },
      });
      // The frame normally brings it in first; fetching it makes sure it appears even
      // when the socket is down.
      await refreshRun(newId).catch(() => {});
    }
  } catch (err) {
    if (gen !== state.gen || handledAsGone(tid, err)) return;
    const label = { "run-now": "Run now", cancel: "Cancel", replay: "Replay" }[action] || action;
    toastApiError(`${label} failed for run ${id}`, err);
    // A 409 means our idea of the run's status is out of date.
    if (err instanceof ApiError && err.status === 409) refreshRun(id).catch(() => {});
  } finally {
    if (button && button.isConnected) button.disabled = false;
  }
}

// ---------------------------------------------------------------------------------------
// Detail view

async function openDetail(id, { focus = false } = {}) {
  id = String(id);
  if (!state.tid) return;
  const previous = state.detailId;
  state.detailId = id;
  if (previous && previous !== id) state.rows.get(previous)?.classList.remove("selected");
  state.rows.get(id)?.classList.add("selected");
  el.detail.hidden = false;
  el.layout.classList.add("has-detail");
  el.detail.dataset.runId = id;
  renderDetail();
  if (focus) el.detailClose.focus();
  const gen = state.gen;
  try {
    await refreshRun(id);
  } catch (err) {
    if (gen !== state.gen || state.detailId !== id || handledAsGone(state.tid, err)) return;
    if (!state.runs.has(id)) {
      el.detailName.textContent = id;
      el.detailArgs.textContent = "";
      el.detailError.textContent = errorText(err);
    }
    toastApiError(`Could not load run ${id}`, err);
    return;
  }
  if (gen === state.gen && state.detailId === id) renderDetail();
}

function closeDetail() {
  if (state.detailId) state.rows.get(state.detailId)?.classList.remove("selected");
  state.detailId = null;
  el.detail.hidden = true;
  el.detailActions.replaceChildren(); // no hidden Run now / Cancel of a run no longer shown
  delete el.detail.dataset.runId;
  el.layout.classList.remove("has-detail");
}

function timeField(iso) {
  if (!iso) return make("span", { class: "muted", text: "—" });
  return make(
    "span",
    { title: iso },
    make("span", { text: fmtLocal(iso, { full: true }) }),
    " ",
    relSpan(iso, "rel muted"),
    make("br"),
    make("span", { class: "mono small muted", text: iso }),
  );
}

function renderDetail() {
  const id = state.detailId;
  if (!id) return;
  const run = state.runs.get(id);
  if (!run) {
    el.detailName.textContent = id;
    el.detailStatus.className = "badge badge-unknown";
    el.detailStatus.textContent = "loading";
    el.detailFields.replaceChildren();
    el.detailActions.replaceChildren();
    el.detailError.textContent = "";
    el.detailArgs.textContent = "Loading…";
    return;
  }
  el.detail.dataset.status = run.status || "";
  el.detailName.textContent = run.name || "(unnamed)";
  el.detailStatus.className = statusClass(run.status);
  el.detailStatus.textContent = run.status || "?";
  el.detailActions.replaceChildren(...actionButtons(run));

  const rows = [
    ["ID", make("code", { class: "mono", text: run.id })],
    ["Thread", make("code", { class: "mono", text: run.threadId || state.tid })],
    ["Name", make("span", { text: run.name || "" })],
    ["Status", make("span", { text: run.status || "" })],
    ["Due (runAt)", timeField(run.runAt)],
    ["Created", timeField(run.createdAt)],
    ["Started", timeField(run.startedAt)],
    ["Finished", timeField(run.finishedAt)],
    ["Attempts", make("span", { text: run.attempts == null ? "—" : String(run.attempts) })],
  ];
  if (run.lastChange) rows.push(["Last change", make("span", { text: run.lastChange })]);
  if (run.replayOf) {
    const link = make("button", {
      type: "button",
      class: "link mono",
      "data-testid": "replay-of",
      "data-run-id": String(run.replayOf),
      text: String(run.replayOf),
      title: "Open the original run",
    });
    link.addEventListener("click", () => openDetail(String(run.replayOf)));
    rows.push(["Replay of", link]);
  }
  const frag = document.createDocumentFragment();
  for (const [label, value] of rows) frag.append(make("dt", { text: label }), make("dd", {}, value));
  el.detailFields.replaceChildren(frag);

  el.detailError.textContent = run.error ? String(run.error) : "—";
  el.detailError.classList.toggle("pre-empty", !run.error);
  if ("args" in run) {
    let text;
    try {
      text = JSON.stringify(run.args, null, 2);
    } catch {
      text = String(run.args);
    }
    el.detailArgs.textContent = text === undefined ? "null" : text;
  } else {
    el.detailArgs.textContent = "Loading…";
  }
}

// ---------------------------------------------------------------------------------------
// Conversation: the selected thread's messages, oldest at the top, kept live by the
// message_created frames of the same stream. Like the runs, state.conv is the only copy of
// the data; items are built once per message. Text goes in through textContent only.

const MESSAGE_PAGE = 50;
const ROLE_LABEL = { user: "You", assistant: "Assistant", tool: "Tool", system: "System" };
const TOOL_TEXT_MAX = 600; // tool args and results are shown cut to this many characters

function newConversation() {
  return {
    messages: new Map(), // id -> message
    order: [], // message ids, oldest first
    items: new Map(), // id -> <li>
    prevCursor: null, // set when older messages exist before order[0]
    loadedOnce: false,
    loading: false,
    reloadQueued: false,
    loadingOlder: false,
    sending: false,
    unread: 0, // messages that arrived while the Runs tab was shown
    stick: true, // the list is scrolled to its end: keep it there as messages arrive
  };
}

function resetConversation() {
  state.conv = newConversation();
  el.messageList.replaceChildren();
  el.composerInput.value = "";
  showComposerError("");
  showComposerStatus("");
  renderComposer();
  renderUnread();
  renderConversation();
}

function setView(view, { writeHash = true } = {}) {
  view = view === "conversation" ? "conversation" : "runs";
  const conv = view === "conversation";
  state.view = view;
  el.tabRuns.setAttribute("aria-selected", String(!conv));
  el.tabConversation.setAttribute("aria-selected", String(conv));
  el.tabRuns.tabIndex = conv ? -1 : 0;
  el.tabConversation.tabIndex = conv ? 0 : -1;
  el.runsPanel.hidden = conv;
  el.conversationPanel.hidden = !conv;
  if (writeHash && state.tid) {
    const want = hashFor(state.tid);
    // A tab is not a place in the history: replace, so Back still leaves the thread.
    if (location.hash !== want) history.replaceState(null, "", location.pathname + location.search + want);
  }
  if (!conv || !state.tid) return;
  state.conv.unread = 0;
  renderUnread();
  if (!state.conv.loadedOnce && !state.conv.loading) loadMessages();
  else if (state.conv.stick) scrollToEnd();
}

function renderUnread() {
  const n = state.conv ? state.conv.unread : 0;
  el.conversationUnread.hidden = n === 0;
  el.conversationUnread.textContent = n > 99 ? "99+" : String(n);
  el.conversationUnread.title = n ? `${n} new message${n === 1 ? "" : "s"}` : "";
}

function atEnd() {
  const s = el.messageScroll;
  return s.scrollHeight - s.scrollTop - s.clientHeight < 48;
}

function scrollToEnd() {
  el.messageScroll.scrollTop = el.messageScroll.scrollHeight;
}

function clip(text, max = TOOL_TEXT_MAX) {
  const s = String(text ?? "");
  return s.length > max ? `${s.slice(0, max)}…` : s;
}

function jsonText(value) {
  try {
    return JSON.stringify(value);
  } catch {
    return String(value);
  }
}

function messageItem(m) {
  const role = String(m.role || "");
  const known = role in ROLE_LABEL;
  const li = make("li", {
    class: `msg msg-${known ? role : "other"}${m.injected ? " msg-injected" : ""}`,
    "data-testid": "message-item",
    "data-role": role,
    "data-message-id": m.id,
    "data-injected": m.injected ? "true" : undefined,
  });
  const head = make(
    "div",
    { class: "msg-head" },
    make("span", { class: "msg-role", text: known ? ROLE_LABEL[role] : role || "?" }),
  );
  if (m.injected) {
    head.append(
      make("span", {
        class: "msg-tag",
        text: "injected",
        title: "Added by code (an effect, a hook, an endpoint), not by a turn",
      }),
    );
  }
  head.append(
    make("time", {
      class: "msg-time",
      dateTime: m.createdAt || "",
      title: m.createdAt || "",
      text: m.createdAt ? fmtLocal(m.createdAt) : "",
    }),
  );
  li.append(head);
  const results = Array.isArray(m.toolResults) ? m.toolResults : [];
  // A tool message's content is its results joined: they are listed below instead.
  if (m.content && !results.length) li.append(make("div", { class: "msg-text", text: String(m.content) }));
  const tools = make("ul", { class: "msg-tools" });
  for (const call of Array.isArray(m.toolCalls) ? m.toolCalls : []) {
    tools.append(
      make("li", {
        class: "msg-tool-call",
        title: "Tool call",
        text: `→ ${call.name}(${clip(jsonText(call.args))})`,
      }),
    );
  }
  for (const result of results) {
    tools.append(
      make("li", {
        class: result.isError ? "msg-tool-result is-error" : "msg-tool-result",
        title: result.isError ? "Tool error" : "Tool result",
        text: `← ${result.toolName}: ${clip(result.content)}`,
      }),
    );
  }
  if (tools.childElementCount) li.append(tools);
  if (!m.content && !tools.childElementCount) li.append(make("div", { class: "msg-text muted", text: "(empty)" }));
  return li;
}

function itemFor(id) {
  const conv = state.conv;
  let li = conv.items.get(id);
  if (!li) {
    li = messageItem(conv.messages.get(id));
    conv.items.set(id, li);
  }
  return li;
}

/** Redraw the list from state.conv (cached items), keeping the reader's place. */
function renderMessages({ keepBottomOffset = false } = {}) {
  const conv = state.conv;
  const s = el.messageScroll;
  const fromBottom = s.scrollHeight - s.scrollTop;
  const frag = document.createDocumentFragment();
  for (const id of conv.order) frag.append(itemFor(id));
  el.messageList.replaceChildren(frag);
  renderConversation();
  if (keepBottomOffset) s.scrollTop = s.scrollHeight - fromBottom; // older messages went on top
  else if (conv.stick) scrollToEnd();
}

function renderConversation() {
  const conv = state.conv;
  if (!conv) return;
  el.messagesOlder.hidden = !conv.prevCursor;
  el.messagesOlder.disabled = conv.loadingOlder;
  el.messagesOlder.textContent = conv.loadingOlder ? "Loading…" : "Load older messages";
  if (conv.order.length) {
    el.messagesEmpty.hidden = true;
  } else {
    el.messagesEmpty.hidden = false;
    el.messagesEmpty.textContent = state.gone
      ? "This thread does not exist."
      : conv.loadedOnce
        ? "No messages yet. Write one below."
        : "Loading messages…";
  }
  el.messageList.setAttribute("aria-busy", String(conv.loading));
}

function addMessage(m) {
  const id = String(m.id);
  const conv = state.conv;
  if (conv.messages.has(id)) return false;
  conv.messages.set(id, { ...m, id });
  return true;
}

/**
 * Fold messages fetched in server order into the list: they go right after `anchor` (the
 * id they were fetched after; null: they are the newest page). Messages that frames brought
 * in meanwhile and that the fetch did not return are newer, so they stay at the end.
 */
function foldFetched(fetched, anchor) {
  const conv = state.conv;
  const ids = [];
  for (const m of fetched) {
    if (!m || m.id == null) continue;
    const id = String(m.id);
    addMessage(m);
    ids.push(id);
  }
  const got = new Set(ids);
  const i = anchor === null ? -1 : conv.order.indexOf(anchor);
  const head = i < 0 ? [] : conv.order.slice(0, i + 1);
  const tail = (i < 0 ? conv.order : conv.order.slice(i + 1)).filter((id) => !got.has(id));
  const seen = new Set(head);
  conv.order = [...head, ...ids.filter((id) => !seen.has(id)), ...tail];
}

/**
 * Load the newest page (first time), or catch up on everything after the newest message we
 * have (after a reconnect or a seq gap): nothing said meanwhile is lost.
 */
async function loadMessages() {
  const tid = state.tid;
  const conv = state.conv;
  if (!tid || state.gone) return;
  if (conv.loading) {
    conv.reloadQueued = true;
    return;
  }
  const gen = state.gen;
  conv.loading = true;
  conv.reloadQueued = false;
  renderConversation();
  try {
    const last = conv.loadedOnce ? conv.order[conv.order.length - 1] : undefined;
    if (last === undefined) {
      const res = await api.listMessages(tid, { latest: true, limit: MESSAGE_PAGE });
      if (gen !== state.gen) return;
      foldFetched(Array.isArray(res.messages) ? res.messages : [], null);
      conv.prevCursor = res.prevCursor || null;
    } else {
      let after = last;
      for (;;) {
        const res = await api.listMessages(tid, { after, limit: 100 });
        if (gen !== state.gen) return;
        const page = Array.isArray(res.messages) ? res.messages : [];
        foldFetched(page, after);
        if (!res.nextCursor || !page.length) break;
        after = String(page[page.length - 1].id);
      }
    }
    conv.loadedOnce = true;
    renderMessages();
  } catch (err) {
    if (gen !== state.gen) return;
    if (!handledAsGone(tid, err)) toastApiError("Could not load the messages", err);
  } finally {
    if (gen === state.gen) {
      conv.loading = false;
      renderConversation();
      if (conv.reloadQueued) {
        conv.reloadQueued = false;
        loadMessages();
      }
    }
  }
}

async function loadOlderMessages() {
  const tid = state.tid;
  const conv = state.conv;
  if (!tid || state.gone || !conv.prevCursor || conv.loadingOlder) return;
  const gen = state.gen;
  conv.loadingOlder = true;
  renderConversation();
  try {
    const res = await api.listMessages(tid, { before: conv.prevCursor, limit: MESSAGE_PAGE });
    if (gen !== state.gen) return;
    const older = [];
    for (const m of Array.isArray(res.messages) ? res.messages : []) {
      if (m && m.id != null && addMessage(m)) older.push(String(m.id));
    }
    conv.order = [...older, ...conv.order];
    conv.prevCursor = res.prevCursor || null;
    conv.loadingOlder = false;
    renderMessages({ keepBottomOffset: true });
  } catch (err) {
    if (gen === state.gen && !handledAsGone(tid, err)) toastApiError("Could not load older messages", err);
  } finally {
    if (gen === state.gen) {
      conv.loadingOlder = false;
      renderConversation();
    }
  }
}

function handleMessageFrame(data) {
  const conv = state.conv;
  if (!data || data.id == null) return;
  if (state.view !== "conversation") {
    conv.unread += 1;
    renderUnread();
  }
  // Before the first load the newest page will bring it (frames during that load are kept).
  if (!conv.loadedOnce && !conv.loading) return;
  const stick = conv.stick || atEnd();
  if (!addMessage(data)) return;
  conv.order.push(String(data.id));
  const s = el.messageScroll;
  el.messageList.append(itemFor(String(data.id)));
  renderConversation();
  if (stick && !el.conversationPanel.hidden) s.scrollTop = s.scrollHeight;
}

function showComposerError(message) {
  el.composerError.textContent = message;
  el.composerError.hidden = !message;
}

function showComposerStatus(message) {
  el.composerStatus.textContent = message;
  el.composerStatus.hidden = !message;
}

function renderComposer() {
  const sending = Boolean(state.conv && state.conv.sending);
  el.composerSend.disabled = sending || state.gone;
  el.composerSend.textContent = sending ? "Sending…" : "Send";
  el.composer.setAttribute("aria-busy", String(sending));
}

async function onSend(ev) {
  ev.preventDefault();
  const tid = state.tid;
  const conv = state.conv;
  if (!tid || state.gone || conv.sending) return;
  const text = el.composerInput.value;
  if (!text.trim()) {
    showComposerError("Write a message first.");
    el.composerInput.focus();
    return;
  }
  showComposerError("");
  const gen = state.gen;
  conv.sending = true;
  conv.stick = true;
  renderComposer();
  showComposerStatus("The agent is answering…");
  el.composerInput.value = "";
  try {
    const res = await api.sendMessage(tid, text);
    if (gen !== state.gen) return;
    // The frames normally brought these in already; this covers a socket that is down.
    const last = conv.order[conv.order.length - 1] ?? null;
    const fresh = (Array.isArray(res.messages) ? res.messages : []).filter((m) => !conv.messages.has(String(m.id)));
    if (fresh.length) {
      foldFetched(fresh, last);
      conv.loadedOnce = true;
      renderMessages();
    }
    showComposerStatus(res.reply ? "" : "The agent answered without text.");
  } catch (err) {
    if (gen !== state.gen) return;
    showComposerStatus("");
    if (handledAsGone(tid, err)) return;
    // Nothing was stored, except for a turn whose model failed (502): its message stays.
    const stored = err instanceof ApiError && err.code === "turn_failed";
    if (!stored && !el.composerInput.value) el.composerInput.value = text;
    const code = err instanceof ApiError && err.status ? ` (${err.status} ${err.code})` : "";
    const message =
      err instanceof ApiError && err.code === "turn_in_progress"
        ? "Another turn of this thread is running; send again once it has answered."
        : errorText(err);
    showComposerError(`${message}${code}`);
  } finally {
    if (gen === state.gen) {
      conv.sending = false;
      renderComposer();
    }
  }
}

// ---------------------------------------------------------------------------------------
// Schedule form

function argsTemplate(schema) {
  if (!schema || typeof schema !== "object") return "";
  const props = schema.properties;
  if (!props || typeof props !== "object" || !Object.keys(props).length) return "{}";
  const sample = (p) => {
    if (!p || typeof p !== "object") return null;
    if ("default" in p) return p.default;
    switch (p.type) {
      case "string":
        return "";
      case "integer":
      case "number":
        return 0;
      case "boolean":
        return false;
      case "array":
        return [];
      case "object":
        return {};
      default:
        return null;
    }
  };
  const obj = {};
  for (const [key, p] of Object.entries(props)) obj[key] = sample(p);
  return JSON.stringify(obj, null, 2);
}

function selectedEffect() {
  return state.effects.find((e) => e.name === el.scheduleName.value) || null;
}

function templateFor(name) {
  const effect = state.effects.find((e) => e.name === name);
  return effect ? argsTemplate(effect.argsSchema) : "";
}

/** Whether `text` differs from the skeleton offered for effect `name` (ignoring layout). */
function argsEdited(name, text) {
  const typed = text.trim();
  const template = templateFor(name).trim();
  if (!typed || typed === template) return false;
  try {
    return JSON.stringify(JSON.parse(typed)) !== JSON.stringify(JSON.parse(template || "null"));
  } catch {
    return true;
  }
}

/**
 * The effect changed (or the list was reloaded). The args box always holds args for the
 * chosen effect: its skeleton, or what the user typed for it earlier. Args typed for the
 * previous effect are set aside, never sent to another one, and the "back to …" link
 * returns to them in one step.
 */
function onEffectChosen() {
  const effect = selectedEffect();
  const name = effect ? effect.name : null;
  el.scheduleDesc.textContent = effect && effect.description ? effect.description : "";
  const takesArgs = Boolean(effect && effect.argsSchema);
  el.scheduleArgs.title = takesArgs ? JSON.stringify(effect.argsSchema, null, 2) : "This effect takes no arguments";
  // An empty box is sent as null, which is what an effect without arguments expects.
  el.scheduleArgs.placeholder = takesArgs ? "{}" : "no arguments (sent as null)";

  const previous = state.argsFor;
  if (name === previous) {
    // Same effect (the list was reloaded): keep what the user typed, refresh a skeleton.
    if (!argsEdited(name, el.scheduleArgs.value)) el.scheduleArgs.value = templateFor(name);
    return;
  }
  let setAside = null;
  if (previous !== null && argsEdited(previous, el.scheduleArgs.value)) {
    state.argsDrafts.set(previous, el.scheduleArgs.value);
    setAside = previous;
  } else if (previous !== null) {
    state.argsDrafts.delete(previous);
  }
  el.scheduleArgs.value = (name !== null && state.argsDrafts.get(name)) || templateFor(name);
  state.argsFor = name;
  showArgsRestore(setAside);
}

/** Offer the way back to the args just set aside for `name` (null: hide the link). */
function showArgsRestore(name) {
  el.argsRestore.hidden = !name;
  if (!name) {
    delete el.argsRestore.dataset.effect;
    return;
  }
  el.argsRestore.dataset.effect = name;
  el.argsRestore.textContent = `↩ Back to ${name} and the args you typed`;
}

function onArgsRestore() {
  const name = el.argsRestore.dataset.effect;
  if (!name || !state.effects.some((e) => e.name === name)) return;
  el.scheduleName.value = name;
  onEffectChosen(); // brings back its draft, and offers the way back to this effect's
  el.scheduleArgs.focus();
}

async function loadEffects() {
  try {
    const res = await api.listEffects();
    state.effects = Array.isArray(res && res.effects) ? res.effects : [];
  } catch (err) {
    toastApiError("Could not load the effect list", err);
    return;
  }
  const current = el.scheduleName.value;
  const frag = document.createDocumentFragment();
  if (!state.effects.length) {
    frag.append(make("option", { value: "", text: "No effects defined", disabled: true }));
  }
  for (const effect of state.effects) {
    frag.append(make("option", { value: effect.name, text: effect.name, title: effect.description || "" }));
  }
  el.scheduleName.replaceChildren(frag);
  if (current && state.effects.some((e) => e.name === current)) el.scheduleName.value = current;
  onEffectChosen();
}

function showScheduleError(message) {
  el.scheduleError.textContent = message;
  el.scheduleError.hidden = !message;
}

async function onSchedule(ev) {
  ev.preventDefault();
  const tid = state.tid;
  if (!tid || state.gone) return;
  showScheduleError("");
  el.scheduleResult.hidden = true;

  const name = el.scheduleName.value;
  if (!name) {
    showScheduleError("Choose an effect to schedule.");
    return;
  }
  let args = null;
  const text = el.scheduleArgs.value.trim();
  if (text) {
    try {
      args = JSON.parse(text);
    } catch (err) {
      showScheduleError(`Args are not valid JSON: ${err.message}`);
      el.scheduleArgs.focus();
      return;
    }
  }
  const rawDelay = el.scheduleDelay.value.trim();
  if (el.scheduleDelay.validity.badInput) {
    showScheduleError("Delay must be a number of seconds.");
    return;
  }
  // Range checks (negative, too large) are the server's: its 422 message is shown as is.
  const delay = rawDelay === "" ? 0 : Number(rawDelay);

  const gen = state.gen;
  el.scheduleSubmit.disabled = true;
  try {
    const res = await api.schedule(tid, name, args, delay);
    if (gen !== state.gen) return;
    const id = String(res.id);
    el.scheduleResult.textContent = `Scheduled ${name} as ${id}.`;
    el.scheduleResult.hidden = false;
    await refreshRun(id).catch(() => {}); // the frame usually wins; this covers a dead socket
  } catch (err) {
    if (gen !== state.gen || handledAsGone(tid, err)) return;
    const code = err instanceof ApiError && err.status ? ` (${err.status} ${err.code})` : "";
    showScheduleError(`${errorText(err)}${code}`);
  } finally {
    el.scheduleSubmit.disabled = state.gone;
  }
}

// ---------------------------------------------------------------------------------------
// Wiring

// Keeps "in 5s" / "3m ago" hints current. Only text that changed is written, so even a
// thousand rows cost a handful of DOM writes per second.
function tick() {
  if (document.hidden) return;
  const now = Date.now();
  for (const span of document.querySelectorAll(".rel[data-time]")) {
    const text = fmtRelative(span.dataset.time, now);
    if (span.textContent !== text) span.textContent = text;
  }
}

function wireConversation() {
  el.tabs.addEventListener("click", (ev) => {
    const tab = ev.target.closest("button[data-view]");
    if (tab) setView(tab.dataset.view);
  });
  el.tabs.addEventListener("keydown", (ev) => {
    // Tabs pattern (WAI-ARIA): arrows move between the tabs and show the one reached.
    if (ev.key !== "ArrowLeft" && ev.key !== "ArrowRight" && ev.key !== "Home" && ev.key !== "End") return;
    ev.preventDefault();
    const next = state.view === "runs" ? el.tabConversation : el.tabRuns;
    const target = ev.key === "Home" ? el.tabRuns : ev.key === "End" ? el.tabConversation : next;
    setView(target.dataset.view);
    target.focus();
  });
  el.messagesOlder.addEventListener("click", loadOlderMessages);
  el.messageScroll.addEventListener("scroll", () => {
    if (state.conv) state.conv.stick = atEnd();
  });
  el.composer.addEventListener("submit", onSend);
  el.composerInput.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      el.composer.requestSubmit();
    }
  });

  el.agentOptions.addEventListener("click", (ev) => {
    const option = ev.target.closest("button[data-agent-id]");
    if (option) createThread(option.dataset.agentId);
  });
  el.agentMenu.addEventListener("keydown", (ev) => {
    const items = [...el.agentOptions.querySelectorAll("button")];
    const i = items.indexOf(document.activeElement);
    if (ev.key === "Escape") {
      ev.preventDefault();
      ev.stopPropagation();
      closeAgentMenu();
      el.newThread.focus();
    } else if ((ev.key === "ArrowDown" || ev.key === "ArrowUp") && items.length) {
      ev.preventDefault();
      const step = ev.key === "ArrowDown" ? 1 : -1;
      items[(i + step + items.length) % items.length].focus();
    }
  });
  document.addEventListener("click", (ev) => {
    if (!el.agentMenu.hidden && !el.agentMenu.contains(ev.target) && ev.target !== el.newThread) closeAgentMenu();
  });
}

function wire() {
  wireConversation();
  el.newThread.addEventListener("click", onNewThread);
  el.threadsMore.addEventListener("click", () => loadThreads(true));
  el.threadList.addEventListener("click", (ev) => {
    const li = ev.target.closest("li[data-thread-id]");
    if (!li) return;
    const del = ev.target.closest("button.thread-delete");
    if (del) deleteThread(li.dataset.threadId, del);
    else selectThread(li.dataset.threadId);
  });

  el.tokenButton.addEventListener("click", onTokenButton);
  el.reloadRuns.addEventListener("click", () => reload());
  el.runsMore.addEventListener("click", loadMore);

  el.filters.addEventListener("click", (ev) => {
    const btn = ev.target.closest("button[data-filter]");
    if (btn) setFilter(btn.dataset.filter);
  });

  el.tbody.addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-run-id]");
    if (!tr) return;
    const btn = ev.target.closest("button[data-action]");
    if (btn) runAction(btn.dataset.action, tr.dataset.runId, btn);
    else openDetail(tr.dataset.runId);
  });
  el.tbody.addEventListener("keydown", (ev) => {
    const tr = ev.target;
    if (!(tr instanceof HTMLTableRowElement) || !tr.dataset.runId) return;
    if (ev.key === "Enter" || ev.key === " ") {
      ev.preventDefault();
      openDetail(tr.dataset.runId, { focus: true });
    } else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
      ev.preventDefault();
      const next = ev.key === "ArrowDown" ? tr.nextElementSibling : tr.previousElementSibling;
      if (next) next.focus();
    }
  });

  el.detailActions.addEventListener("click", (ev) => {
    const btn = ev.target.closest("button[data-action]");
    if (btn && state.detailId) runAction(btn.dataset.action, state.detailId, btn);
  });
  el.detailClose.addEventListener("click", () => {
    const id = state.detailId;
    closeDetail();
    state.rows.get(id)?.focus();
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && !el.agentMenu.hidden) closeAgentMenu();
    else if (ev.key === "Escape" && !el.tokenDialog.open && state.detailId) closeDetail();
  });

  el.scheduleForm.addEventListener("submit", onSchedule);
  el.scheduleName.addEventListener("change", onEffectChosen);
  el.argsRestore.addEventListener("click", onArgsRestore);

  window.addEventListener("hashchange", () => {
    const tid = threadFromHash();
    const view = viewFromHash();
    if (view !== state.view) setView(view, { writeHash: false });
    if (tid !== state.tid) selectThread(tid);
  });
  setInterval(tick, 1000);
}

function init() {
  wire();
  state.conv = newConversation();
  setView(viewFromHash(), { writeHash: false });
  onReach(setReach);
  window.addEventListener("online", () => scheduleProbe({ now: true }));
  renderConn();
  loadThreads(false);
  loadEffects();
  loadAgents();
  const tid = threadFromHash();
  if (tid) selectThread(tid);
}

init();
