// conversation.js — the Conversation tab: the selected thread's messages, oldest at the
// top, kept live by the message_created frames of the same stream, and the composer that
// runs a turn. Text goes in through lit-html bindings, which never parse it as markup.

import { html, render } from "./vendor/lit-html/lit-html.js";
import { repeat } from "./vendor/lit-html/directives/repeat.js";
import { api, ApiError } from "./api.js";
import { errorText, fmtLocal } from "./format.js";
import { toastApiError } from "./toasts.js";

const PAGE = 50;
const ROLE_LABEL = { user: "You", assistant: "Assistant", tool: "Tool", system: "System" };
const TOOL_TEXT_MAX = 600; // tool args and results are shown cut to this many characters
const $ = (id) => document.getElementById(id);

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

/**
 * What a turn's state says next to its user message (null: nothing to say). Every turn is
 * durable: one interrupted by a crash or a shutdown is resumed at the next start, and fails
 * after its third interruption.
 */
export function turnState(turn) {
  if (!turn) return null;
  const attempts = Number(turn.attempts) || 1;
  const error = String(turn.error || "");
  if (turn.status === "running") {
    return attempts > 1
      ? { state: "resumed", text: `resumed · attempt ${attempts}`, title: "Interrupted, resumed from its journal; running" }
      : { state: "running", text: "running", title: "The agent is answering" };
  }
  if (turn.status === "failed") {
    const interrupted = /^interrupted (\d+) times/.exec(error);
    return interrupted
      ? { state: "failed", text: `failed after ${interrupted[1]} interruptions`, title: error }
      : { state: "failed", text: "failed", title: error || "The turn failed" };
  }
  if (turn.status === "succeeded" && attempts > 1) {
    return { state: "resumed", text: "resumed", title: `Finished after ${attempts} attempts; finished tool calls did not run again` };
  }
  return null;
}

function messageItem(m, turn) {
  const role = String(m.role || "");
  const known = role in ROLE_LABEL;
  const results = Array.isArray(m.toolResults) ? m.toolResults : [];
  const calls = Array.isArray(m.toolCalls) ? m.toolCalls : [];
  const state = role === "user" && !m.injected ? turnState(turn) : null;
  const tools = [
    ...calls.map((c) => html`<li class="msg-tool-call" title="Tool call">→ ${c.name}(${clip(jsonText(c.args))})</li>`),
    ...results.map(
      (r) => html`<li class=${r.isError ? "msg-tool-result is-error" : "msg-tool-result"} data-testid="tool-result"
        data-from-journal=${r.fromJournal ? "true" : "false"}
        title=${r.isError ? "Tool error" : "Tool result"}>← ${r.toolName}: ${clip(r.content)}${r.fromJournal
          ? html` <span class="msg-tag" data-testid="from-journal"
              title="The call had already run: its result came from the turn's journal and the tool did not run again">from journal</span>`
          : null}</li>`,
    ),
  ];
  return html`<li class="msg msg-${known ? role : "other"} ${m.injected ? "msg-injected" : ""}" data-testid="message-item"
      data-role=${role} data-message-id=${m.id} data-injected=${m.injected ? "true" : "false"}>
    <div class="msg-head">
      <span class="msg-role">${known ? ROLE_LABEL[role] : role || "?"}</span>
      ${m.injected
        ? html`<span class="msg-tag" title="Added by code (an effect, a hook, an endpoint), not by a turn">injected</span>`
        : null}
      ${state
        ? html`<span class="msg-tag turn-state turn-${state.state}" data-testid="turn-state" data-state=${state.state}
            title=${state.title}>${state.text}</span>`
        : null}
      ${state && state.state === "failed"
        ? html`<button type="button" class="btn btn-ghost btn-retry" data-testid="turn-retry"
            data-retry-message=${m.id}
            title="Run this turn again under its run id: tool calls that finished are not run again">Retry</button>`
        : null}
      <time class="msg-time" datetime=${m.createdAt || ""} title=${m.createdAt || ""}>${m.createdAt ? fmtLocal(m.createdAt) : ""}</time>
    </div>
    ${m.content && !results.length ? html`<div class="msg-text">${String(m.content)}</div>` : null}
    ${tools.length ? html`<ul class="msg-tools">${tools}</ul>` : null}
    ${!m.content && !tools.length ? html`<div class="msg-text muted">(empty)</div>` : null}
  </li>`;
}

export class ConversationView {
  /** `ctx`: {handledAsGone(session, err), visible(), onUnread(n)}. */
  constructor(ctx) {
    this.ctx = ctx;
    this.session = null;
    this.el = {
      panel: $("conversation-panel"),
      scroll: $("message-scroll"),
      list: $("message-list"),
      empty: $("messages-empty"),
      older: $("messages-older"),
      composer: $("composer"),
      input: $("composer-input"),
      send: $("composer-send"),
      status: $("composer-status"),
      error: $("composer-error"),
    };
    this.resetState();
    this.wire();
  }

  resetState() {
    this.messages = new Map(); // id -> message
    this.turns = new Map(); // runId -> turn (GET .../turns)
    this.turnsTimer = null;
    this.order = []; // message ids, oldest first
    this.prevCursor = null; // set when older messages exist before order[0]
    this.loadedOnce = false;
    this.loading = false;
    this.reloadQueued = false;
    this.loadingOlder = false;
    this.sending = false;
    this.unread = 0; // messages that arrived while the Runs tab was shown
    this.stick = true; // the list is scrolled to its end: keep it there as messages arrive
  }

  reset(session) {
    this.session = session;
    this.resetState();
    this.el.input.value = "";
    this.showError("");
    this.showStatus("");
    this.draw();
    this.ctx.onUnread(0);
  }

  wire() {
    const el = this.el;
    el.older.addEventListener("click", () => this.loadOlder());
    el.scroll.addEventListener("scroll", () => {
      this.stick = this.atEnd();
    });
    el.composer.addEventListener("submit", (ev) => this.send(ev));
    el.list.addEventListener("click", (ev) => {
      const btn = ev.target instanceof Element ? ev.target.closest("[data-retry-message]") : null;
      const m = btn ? this.messages.get(btn.dataset.retryMessage) : null;
      if (m && m.runId) this.submit(String(m.content || ""), String(m.runId));
    });
    el.input.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        el.composer.requestSubmit();
      }
    });
  }

  /** The tab was shown: clear the unread count, load or scroll to the end. */
  shown() {
    this.unread = 0;
    this.ctx.onUnread(0);
    if (!this.session || this.session.gone) return;
    if (!this.loadedOnce && !this.loading) this.load();
    else if (this.stick) this.scrollToEnd();
  }

  atEnd() {
    const s = this.el.scroll;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 48;
  }

  scrollToEnd() {
    this.el.scroll.scrollTop = this.el.scroll.scrollHeight;
  }

  /** Redraw the list and its footer; `keepBottomOffset`: older messages went on top. */
  draw({ keepBottomOffset = false, scroll = true } = {}) {
    const el = this.el;
    const s = el.scroll;
    const fromBottom = s.scrollHeight - s.scrollTop;
    render(
      repeat(
        this.order,
        (id) => id,
        (id) => {
          const m = this.messages.get(id);
          return messageItem(m, m.runId ? this.turns.get(String(m.runId)) : undefined);
        },
      ),
      el.list,
    );
    el.older.hidden = !this.prevCursor;
    el.older.disabled = this.loadingOlder;
    el.older.textContent = this.loadingOlder ? "Loading…" : "Load older messages";
    el.empty.hidden = this.order.length > 0;
    el.empty.textContent =
      this.session && this.session.gone
        ? "This thread does not exist."
        : this.loadedOnce
          ? "No messages yet. Write one below."
          : "Loading messages…";
    el.list.setAttribute("aria-busy", String(this.loading));
    const sending = this.sending;
    el.send.disabled = sending || !this.session || this.session.gone;
    el.input.disabled = !this.session || this.session.gone;
    el.send.textContent = sending ? "Sending…" : "Send";
    el.composer.setAttribute("aria-busy", String(sending));
    if (!scroll) return;
    if (keepBottomOffset) s.scrollTop = s.scrollHeight - fromBottom;
    else if (this.stick) this.scrollToEnd();
  }

  add(m) {
    const id = String(m.id);
    if (this.messages.has(id)) return false;
    this.messages.set(id, { ...m, id });
    return true;
  }

  /**
   * Fold messages fetched in server order into the list: they go right after `anchor` (the
   * id they were fetched after; null: they are the newest page). Messages that frames
   * brought in meanwhile and that the fetch did not return are newer: they stay at the end.
   */
  fold(fetched, anchor) {
    const ids = [];
    for (const m of fetched) {
      if (!m || m.id == null) continue;
      this.add(m);
      ids.push(String(m.id));
    }
    const got = new Set(ids);
    const i = anchor === null ? -1 : this.order.indexOf(anchor);
    const head = i < 0 ? [] : this.order.slice(0, i + 1);
    const tail = (i < 0 ? this.order : this.order.slice(i + 1)).filter((id) => !got.has(id));
    const seen = new Set(head);
    this.order = [...head, ...ids.filter((id) => !seen.has(id)), ...tail];
  }

  /**
   * Load the newest page (first time), or catch up on everything after the newest message
   * we have (after a reconnect or a seq gap): nothing said meanwhile is lost.
   */
  async load() {
    const s = this.session;
    if (!s || s.gone) return;
    if (this.loading) {
      this.reloadQueued = true;
      return;
    }
    this.loading = true;
    this.reloadQueued = false;
    this.draw({ scroll: false });
    const opts = { signal: s.signal };
    try {
      const last = this.loadedOnce ? this.order[this.order.length - 1] : undefined;
      if (last === undefined) {
        const res = await api.listMessages(s.tid, { latest: true, limit: PAGE }, opts);
        this.fold(Array.isArray(res.messages) ? res.messages : [], null);
        this.prevCursor = res.prevCursor || null;
      } else {
        let after = last;
        for (;;) {
          const res = await api.listMessages(s.tid, { after, limit: 100 }, opts);
          const page = Array.isArray(res.messages) ? res.messages : [];
          this.fold(page, after);
          if (!res.nextCursor || !page.length) break;
          after = String(page[page.length - 1].id);
        }
      }
      this.loadedOnce = true;
      this.refreshTurns();
    } catch (err) {
      if (s.closed) return;
      if (!this.ctx.handledAsGone(s, err)) toastApiError("Could not load the messages", err);
    } finally {
      if (!s.closed) {
        this.loading = false;
        this.draw();
        if (this.reloadQueued) {
          this.reloadQueued = false;
          this.load();
        }
      }
    }
  }

  /** Reload the turns' states soon (a frame of a turn arrived; several make one request). */
  refreshTurns(delayMs = 0) {
    const s = this.session;
    if (!s || s.gone || this.turnsTimer !== null) return;
    this.turnsTimer = setTimeout(async () => {
      this.turnsTimer = null;
      try {
        const res = await api.listTurns(s.tid, { signal: s.signal });
        if (s.closed || s !== this.session) return;
        this.turns = new Map((Array.isArray(res.turns) ? res.turns : []).map((t) => [String(t.runId), t]));
        this.draw({ scroll: false });
      } catch {
        // The states are a hint; the messages stay right without them.
      }
    }, delayMs);
  }

  /** After a reconnect or a seq gap: catch up if the messages were ever shown. */
  catchUp() {
    if (this.loadedOnce) this.load();
  }

  async loadOlder() {
    const s = this.session;
    if (!s || s.gone || !this.prevCursor || this.loadingOlder) return;
    this.loadingOlder = true;
    this.draw({ scroll: false });
    try {
      const res = await api.listMessages(s.tid, { before: this.prevCursor, limit: PAGE }, { signal: s.signal });
      const older = [];
      for (const m of Array.isArray(res.messages) ? res.messages : []) {
        if (m && m.id != null && this.add(m)) older.push(String(m.id));
      }
      this.order = [...older, ...this.order];
      this.prevCursor = res.prevCursor || null;
      this.loadingOlder = false;
      this.draw({ keepBottomOffset: true });
    } catch (err) {
      if (!s.closed && !this.ctx.handledAsGone(s, err)) toastApiError("Could not load older messages", err);
    } finally {
      if (!s.closed) {
        this.loadingOlder = false;
        this.draw({ scroll: false });
      }
    }
  }

  /** One message_created frame's data. */
  onFrame(data) {
    if (!data || data.id == null) return;
    if (!this.ctx.visible()) {
      this.unread += 1;
      this.ctx.onUnread(this.unread);
    }
    // Before the first load the newest page will bring it (frames during that load are kept).
    if (!this.loadedOnce && !this.loading) return;
    const stick = this.stick || this.atEnd();
    if (!this.add(data)) return;
    this.order.push(String(data.id));
    if (data.runId) this.refreshTurns(100);
    this.draw({ scroll: false });
    if (stick && this.ctx.visible()) this.scrollToEnd();
  }

  showError(message) {
    this.el.error.textContent = message;
    this.el.error.hidden = !message;
  }

  showStatus(message) {
    this.el.status.textContent = message;
    this.el.status.hidden = !message;
  }

  /** The run id of the newest failed turn whose message is `text` (undefined: none). */
  failedRunId(text) {
    for (let i = this.order.length - 1; i >= 0; i -= 1) {
      const m = this.messages.get(this.order[i]);
      if (!m || m.role !== "user" || m.injected || !m.runId || m.content !== text) continue;
      const turn = this.turns.get(String(m.runId));
      if (turn && turn.status === "failed") return String(m.runId);
    }
    return undefined;
  }

  async send(ev) {
    ev.preventDefault();
    const text = this.el.input.value;
    if (!text.trim()) {
      this.showError("Write a message first.");
      this.el.input.focus();
      return;
    }
    // The message of a failed turn, sent again, retries that turn under its run id: its
    // finished tool calls are replayed from the journal, not run again.
    await this.submit(text, this.failedRunId(text), { fromComposer: true });
  }

  /** Post `text` as a turn (`runId`: retry that turn; else a fresh run id). */
  async submit(text, runId, { fromComposer = false } = {}) {
    const s = this.session;
    if (!s || s.gone || this.sending) return;
    const input = this.el.input;
    this.showError("");
    this.sending = true;
    this.stick = true;
    this.draw({ scroll: false });
    this.showStatus("The agent is answering…");
    if (fromComposer) input.value = "";
    try {
      // A run id of our own: a turn whose answer got lost can be asked for again.
      if (!runId && globalThis.crypto?.randomUUID) runId = crypto.randomUUID();
      const res = await api.sendMessage(s.tid, text, { signal: s.signal }, runId);
      this.refreshTurns();
      // The frames normally brought these in already; this covers a socket that is down.
      const last = this.order[this.order.length - 1] ?? null;
      const fresh = (Array.isArray(res.messages) ? res.messages : []).filter((m) => !this.messages.has(String(m.id)));
      if (fresh.length) {
        this.fold(fresh, last);
        this.loadedOnce = true;
      }
      this.showStatus(res.reply ? "" : "The agent answered without text.");
    } catch (err) {
      if (s.closed) return;
      this.showStatus("");
      this.refreshTurns();
      if (this.ctx.handledAsGone(s, err)) return;
      // Nothing was stored, except for a turn whose model failed (502): its message stays.
      const stored = err instanceof ApiError && err.code === "turn_failed";
      if (fromComposer && !stored && !input.value) input.value = text;
      const code = err instanceof ApiError && err.status ? ` (${err.status} ${err.code})` : "";
      const message =
        err instanceof ApiError && err.code === "turn_in_progress"
          ? "Another turn of this thread is running; send again once it has answered."
          : stored
            ? `${errorText(err)} — Retry on the message (or send it again) retries it: finished tool calls are not repeated.`
            : errorText(err);
      this.showError(`${message}${code}`);
    } finally {
      if (!s.closed) {
        this.sending = false;
        this.draw();
      }
    }
  }
}
