// app.js — the Effects pane's entry: threads on the left (threads.js), the selected thread's
// runs (runs.js) with its effect-tool records (records.js) or messages (conversation.js) in
// the middle, one run's detail on the right
// (detail.js), the schedule form (schedule.js), the header badge (connection.js). This
// module owns only the selection: which thread is shown, its session (an AbortController
// that drops answers meant for a thread no longer shown), its stream and the URL hash.
//
// Plain ES modules, no build step. lit-html (web/vendor/lit-html, BSD-3-Clause) draws the
// lists: its keyed `repeat` replaces the row caches and patching this file used to keep by
// hand, and its templates bind text as text (never markup). It was chosen over preact+htm
// because it needs no virtual DOM nor a template compiler, and over uhtml for its longer
// record and larger user base; see docs/design.md.

import { AllRunsView } from "./all-runs.js";
import { filtersFromHash, isAllRunsHash } from "./all-runs-model.js";
import { ApiError, RunStream, askForToken, onReach } from "./api.js";
import { Connection } from "./connection.js";
import { ConversationView } from "./conversation.js";
import { DetailView } from "./detail.js";
import { RecordsView } from "./records.js";
import { PauseControl } from "./pause.js";
import { RunsView } from "./runs.js";
import { ScheduleForm } from "./schedule.js";
import { SchedulesView } from "./schedules.js";
import { ThreadSession } from "./session.js";
import { ThreadsView } from "./threads.js";
import { mountToasts } from "./toasts.js";
import { installTokenDialog, tokenDialogOpen } from "./token.js";

const CLOSE_INVALID_THREAD_ID = 4400; // the stream's close code for a malformed thread id
const CLOSE_THREAD_STORAGE = 4500; // ... and for a thread whose database cannot be used
const $ = (id) => document.getElementById(id);

const el = {
  noThread: $("no-thread"),
  threadView: $("thread-view"),
  threadId: $("thread-id"),
  threadError: $("thread-error"),
  reloadRuns: $("reload-runs"),
  filters: $("filters"),
  tabs: $("tabs"),
  tabRuns: $("tab-runs"),
  tabConversation: $("tab-conversation"),
  unread: $("conversation-unread"),
  runsPanel: $("runs-panel"),
  conversationPanel: $("conversation-panel"),
  scheduleBox: $("schedule-box"),
  showThreads: $("show-threads"),
  showAllRuns: $("show-all-runs"),
};

// The selection: the only state this module keeps.
let session = null; // ThreadSession of the shown thread, or null
let stream = null; // its RunStream
let lastSeq = null; // seq of the last frame, to notice a gap
let view = "runs"; // "runs" | "conversation"
let fallbackTimer = null;

const notFoundText = (tid) => `Thread not found: ${tid}. It may have been deleted.`;
const invalidIdText = (tid) => `Invalid thread id: ${tid}. Thread ids are 1 to 64 letters, digits, "_" or "-".`;
const brokenText = (tid) =>
  `Thread ${tid} cannot be used: its database file is damaged or unreadable (thread storage error). ` +
  "Its runs and messages cannot be shown; the server log names the file.";

/**
 * When an answer says the session's thread does not exist (404 thread_not_found, or 400
 * invalid_thread_id) or cannot be used (500 thread_storage_error), say so once in the view
 * and return true; otherwise return false.
 */
function handledAsGone(s, err) {
  if (!(err instanceof ApiError) || s !== session) return false;
  if (err.status === 404 && err.code === "thread_not_found") threadGone(s.tid, notFoundText(s.tid));
  else if (err.status === 400 && err.code === "invalid_thread_id") threadGone(s.tid, invalidIdText(s.tid));
  else if (err.status === 500 && err.code === "thread_storage_error") threadBroken(s.tid);
  else return false;
  return true;
}

const connection = new Connection($("conn-state"), {
  onBack: () => {
    threads.load(false);
    if (!schedule.effects.length) schedule.load();
    if (threads.agents === null) threads.loadAgents();
  },
});

const threads = new ThreadsView({
  onSelect: (tid) => selectThread(tid),
  onForget: (tid) => {
    if (session && session.tid === tid) selectThread(null);
  },
});

const pause = new PauseControl({
  onChange: (tid, paused) => {
    threads.setPaused(tid, paused);
    runs.setPaused(paused);
    schedules.setPaused(paused);
  },
  onGone: (s, err) => handledAsGone(s, err),
});

const runs = new RunsView({
  handledAsGone,
  detailId: () => detail.id,
  openDetail: (id, opts) => detail.open(id, opts),
  onChange: (ids) => {
    if (detail.id !== null && (ids === null || ids.length === 0 || ids.includes(detail.id))) detail.draw();
  },
});

const detail = new DetailView(runs, {
  handledAsGone,
  onToggle: () => {
    runs.draw();
    detailToggled();
  },
});

const records = new RecordsView({ handledAsGone });

const schedules = new SchedulesView({ handledAsGone });

const conversation = new ConversationView({
  handledAsGone,
  visible: () => view === "conversation" && !el.conversationPanel.hidden,
  onUnread: (n) => {
    el.unread.hidden = n === 0;
    el.unread.textContent = n > 99 ? "99+" : String(n);
    el.unread.title = n ? `${n} new message${n === 1 ? "" : "s"}` : "";
  },
});

const allRuns = new AllRunsView({
  openRun: (tid, id) => openRun(tid, id),
  onStreamState: (conn, detailText) => connection.setStreamState(conn, detailText),
  onThreadFrame: (frame) => threads.onFrame(frame.threadId, frame),
  effects: () => schedule.effects,
});

const schedule = new ScheduleForm({
  handledAsGone,
  // The frame usually wins; fetching covers a dead socket.
  onScheduled: (id) => runs.refreshRun(id).catch(() => {}),
});

// ---------------------------------------------------------------------------------------
// The URL hash: #thread=<id>[&run=<id>][&view=conversation] (`run`: the run whose
// detail is open, so a reload or Back shows it again)

function hashParams() {
  return new URLSearchParams(location.hash.replace(/^#/, ""));
}

function hashFor(tid, run = detail.id) {
  if (!tid) return "";
  return `#thread=${encodeURIComponent(tid)}${run ? `&run=${encodeURIComponent(run)}` : ""}${
    view === "conversation" ? "&view=conversation" : ""}`;
}

/** The detail opened or closed: the hash of the thread shown follows (replaced, not pushed). */
function detailToggled() {
  if (!session || hashParams().get("thread") !== session.tid) return; // switching threads
  const want = hashFor(session.tid);
  if (location.hash !== want) history.replaceState(null, "", location.pathname + location.search + want);
}

// ---------------------------------------------------------------------------------------
// Selecting a thread

/** Every view shows `s` (a thread, a thread that is gone, or null): the old one is dropped. */
function showSession(s) {
  if (session && session !== s) session.close();
  session = s;
  if (stream) stream.stop();
  stream = null;
  lastSeq = null;
  clearTimeout(fallbackTimer);
  detail.close();
  runs.reset(s);
  records.reset(s);
  schedules.reset(s);
  conversation.reset(s);
  schedule.reset(s);
  pause.reset(s, s ? threads.threads.get(s.tid)?.paused : false);
  const disabled = Boolean(s && s.gone);
  el.threadView.toggleAttribute("data-gone", disabled);
  for (const control of [el.reloadRuns, ...el.filters.querySelectorAll("button")]) control.disabled = disabled;
}

function selectThread(tid) {
  tid = tid ? String(tid) : null;
  if (tid) leaveAllRuns();
  if (tid === (session ? session.tid : null)) return;
  const s = tid ? new ThreadSession(tid) : null;
  showSession(s);
  el.threadError.hidden = true;

  const want = hashFor(tid, null);
  // A hash naming this thread already (with a run, from a link or a reload) stays.
  if (location.hash !== want && !(tid && hashParams().get("thread") === tid)) {
    if (want) location.hash = want;
    else history.replaceState(null, "", location.pathname + location.search);
  }
  threads.select(tid);
  el.noThread.hidden = Boolean(tid);
  el.threadView.hidden = !tid;
  document.title = tid ? `${tid} · Effects pane` : "Effects pane · thread-effects";
  if (!tid) {
    connection.setThread(false, false);
    return;
  }
  el.threadId.textContent = tid;
  // On a phone the form would push the runs below the fold: it starts folded there.
  el.scheduleBox.open = !window.matchMedia("(max-width: 900px)").matches;
  if (view === "conversation") conversation.shown();

  stream = new RunStream(tid, {
    onState: (conn, detailText) => {
      if (s !== session) return;
      connection.setStreamState(conn, detailText);
      // If the socket cannot be opened at all, still show the list over plain HTTP.
      if (conn === "offline" && !runs.loadedOnce && !runs.loading) {
        runs.reload().then(() => schedules.reload());
        records.reload();
      }
    },
    onOpen: () => {
      if (s !== session) return;
      // Frames sent while we were away are gone: reload on every (re)connect, and seq
      // numbering restarts from whatever the first frame says.
      lastSeq = null;
      // Then whether it was paused or resumed elsewhere meanwhile, and its schedules:
      // after the runs, so a thread the runs answer says does not exist is asked nothing more.
      runs.reload().then(() => {
        pause.refresh();
        schedules.reload();
      });
      records.reload();
      conversation.catchUp();
    },
    onFrame: (frame) => {
      if (s === session) onFrame(frame);
    },
    onNotFound: (code) => {
      if (s !== session) return;
      if (code === CLOSE_THREAD_STORAGE) threadBroken(tid);
      else threadGone(tid, code === CLOSE_INVALID_THREAD_ID ? invalidIdText(tid) : notFoundText(tid));
    },
    onAuth: () => askForToken(true),
  });
  connection.setThread(true, true);
  stream.start();
  // The list normally loads when the socket opens; don't leave the page empty if that is slow.
  fallbackTimer = setTimeout(() => {
    if (s === session && !runs.loadedOnce && !runs.loading) runs.reload();
    if (s === session && !records.loadedOnce && !records.loading) records.reload();
    if (s === session && !schedules.loading && !schedules.schedules.length) schedules.reload();
  }, 1500);
}

/**
 * The selected thread does not exist (deleted in another browser, or never could): drop it
 * from the list, clear its runs and messages, stop its stream, disable everything that would
 * act on it, and say why. The thread stays selected so the message stays in view.
 */
function threadGone(tid, message) {
  if (!session || session.tid !== tid) return;
  if (!session.gone) {
    showSession(new ThreadSession(tid, { gone: true }));
    if (threads.threads.delete(tid)) threads.render();
    connection.setThread(true, false);
  }
  el.threadError.textContent = message;
  el.threadError.hidden = false;
}

/**
 * The selected thread exists but its database cannot be used: like a thread that is gone
 * (nothing loads or acts on it, one message says why), but it stays in the thread list.
 */
function threadBroken(tid) {
  if (!session || session.tid !== tid) return;
  if (!session.broken) {
    showSession(new ThreadSession(tid, { broken: true }));
    connection.setThread(true, false);
  }
  el.threadError.textContent = brokenText(tid);
  el.threadError.hidden = false;
}

function onFrame(frame) {
  if (!frame || typeof frame !== "object") return;
  if (frame.threadId != null && String(frame.threadId) !== session.tid) return;
  // seq counts every frame of the thread, so check it before looking at the type.
  if (Number.isInteger(frame.seq)) {
    const gap = lastSeq !== null && frame.seq !== lastSeq + 1;
    lastSeq = frame.seq;
    if (gap) {
      // Then whether it was paused or resumed elsewhere meanwhile, and its schedules:
      // after the runs, so a thread the runs answer says does not exist is asked nothing more.
      runs.reload().then(() => {
        pause.refresh();
        schedules.reload();
      });
      records.reload();
      conversation.catchUp();
    }
  }
  if (frame.type !== "event") return;
  threads.onFrame(session.tid, frame);
  if (frame.eventType === "message_created") conversation.onFrame(frame.data);
  else if (frame.eventType === "effect_changed") runs.onFrame(frame.data);
  else if (frame.eventType === "effect_record_changed") records.onFrame(frame.data);
  else if (frame.eventType === "schedule_changed") schedules.onFrame(frame.data);
}

// ---------------------------------------------------------------------------------------
// All runs (#all-runs): the runs of every thread, instead of one thread's view

function markView(all) {
  const [on, off] = all ? [el.showAllRuns, el.showThreads] : [el.showThreads, el.showAllRuns];
  on.setAttribute("aria-current", "page");
  off.removeAttribute("aria-current");
}

/** Show All runs with the filters of the URL hash (#all-runs?status=failed&user=u1). */
function showAllRuns() {
  const filters = filtersFromHash(location.hash);
  if (allRuns.shown) {
    allRuns.show(filters);
    return;
  }
  selectThread(null);
  el.noThread.hidden = true;
  markView(true);
  document.title = "All runs · Effects pane";
  connection.setThread(true, true);
  allRuns.show(filters);
}

function leaveAllRuns() {
  if (!allRuns.shown) return;
  allRuns.hide();
  markView(false);
  document.title = "Effects pane · thread-effects";
  el.noThread.hidden = Boolean(session);
  if (!session) connection.setThread(false, false);
}

/** A run chosen in All runs: its thread's Runs tab, with the run's detail open. */
function openRun(tid, id) {
  if (!tid) return;
  setView("runs", { writeHash: false });
  selectThread(tid);
  if (session && session.tid === tid) detail.open(id);
}

// ---------------------------------------------------------------------------------------
// Tabs

function setView(next, { writeHash = true } = {}) {
  view = next === "conversation" ? "conversation" : "runs";
  const conv = view === "conversation";
  document.body.dataset.view = view; // the toasts move above the composer (style.css)
  el.tabRuns.setAttribute("aria-selected", String(!conv));
  el.tabConversation.setAttribute("aria-selected", String(conv));
  el.tabRuns.tabIndex = conv ? -1 : 0;
  el.tabConversation.tabIndex = conv ? 0 : -1;
  el.runsPanel.hidden = conv;
  el.conversationPanel.hidden = !conv;
  if (writeHash && session) {
    const want = hashFor(session.tid);
    // A tab is not a place in the history: replace, so Back still leaves the thread.
    if (location.hash !== want) history.replaceState(null, "", location.pathname + location.search + want);
  }
  if (conv && session) conversation.shown();
}

// ---------------------------------------------------------------------------------------
// Wiring

function wire() {
  el.reloadRuns.addEventListener("click", () => records.reload());
  el.tabs.addEventListener("click", (ev) => {
    const tab = ev.target.closest("button[data-view]");
    if (tab) setView(tab.dataset.view);
  });
  el.tabs.addEventListener("keydown", (ev) => {
    // Tabs pattern (WAI-ARIA): arrows move between the tabs and show the one reached.
    if (!["ArrowLeft", "ArrowRight", "Home", "End"].includes(ev.key)) return;
    ev.preventDefault();
    const next = view === "runs" ? el.tabConversation : el.tabRuns;
    const target = ev.key === "Home" ? el.tabRuns : ev.key === "End" ? el.tabConversation : next;
    setView(target.dataset.view);
    target.focus();
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && !ev.defaultPrevented && !tokenDialogOpen() && detail.id !== null) detail.close();
  });
  window.addEventListener("hashchange", () => {
    if (isAllRunsHash(location.hash)) {
      showAllRuns();
      return;
    }
    leaveAllRuns();
    const params = hashParams();
    const next = params.get("view") === "conversation" ? "conversation" : "runs";
    if (next !== view) setView(next, { writeHash: false });
    const tid = params.get("thread") || null;
    if (tid !== (session ? session.tid : null)) selectThread(tid);
    const run = params.get("run");
    if (tid && run && run !== detail.id && session && session.tid === tid) detail.open(run);
  });
  window.addEventListener("online", () => connection.probeNow());
  // Keeps "in 5s" / "3m ago" current: lit rewrites only the text that changed.
  setInterval(() => {
    if (document.hidden) return;
    const now = Date.now();
    runs.draw(now);
    records.draw(now);
    schedules.draw(now);
    allRuns.draw(now);
    detail.draw(now);
    threads.render(now);
  }, 1000);
}

function init() {
  mountToasts($("toasts"));
  onReach((reach) => connection.setReach(reach));
  installTokenDialog({
    // The socket was probably refused too; retry it with the token now.
    onSaved: () => {
      if (stream && connection.stream && connection.stream.conn !== "live") stream.reconnectNow();
    },
    // Everything loaded so far may have failed for want of a token: start over.
    onChanged: () => {
      threads.load(false);
      schedule.load();
      threads.loadAgents();
      allRuns.reconnect();
      if (stream) stream.reconnectNow();
      else if (session) {
        runs.reload();
        records.reload();
      }
    },
  });
  wire();
  setView(hashParams().get("view"), { writeHash: false });
  connection.render();
  threads.load(false);
  schedule.load();
  threads.loadAgents();
  const tid = hashParams().get("thread");
  if (isAllRunsHash(location.hash)) showAllRuns();
  else if (tid) {
    const run = hashParams().get("run");
    selectThread(tid);
    if (run && session && session.tid === tid) detail.open(run);
  } else connection.setThread(false, false);
}

init();
