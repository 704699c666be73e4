// threads.js — the thread list (left): paging, "New thread" (asking which agent when the
// app has several and none is the default), deleting a thread, and a "paused" tag on
// paused threads.

import { html, render } from "./vendor/lit-html/lit-html.js";
import { repeat } from "./vendor/lit-html/directives/repeat.js";
import { api, ApiError } from "./api.js";
import { fmtRelative } from "./format.js";
import { toast, toastApiError } from "./toasts.js";

const PAGE = 50;
const $ = (id) => document.getElementById(id);

// The list is most recently active first (GET /api/threads): each thread says when it last
// did something (a run changed, a message), or when it was created if nothing since.
function activityText(thread, now) {
  const created = Date.parse(thread.createdAt);
  const active = Date.parse(thread.lastActivityAt);
  if (Number.isFinite(active) && (!Number.isFinite(created) || active - created >= 1000)) {
    return html`<span class="muted" title=${`Last activity ${thread.lastActivityAt}; created ${thread.createdAt}`}
      >active ${fmtRelative(thread.lastActivityAt, now)}</span>`;
  }
  return thread.createdAt
    ? html`<span class="muted" title=${thread.createdAt}>created ${fmtRelative(thread.createdAt, now)}</span>`
    : null;
}

/**
 * When a frame says its thread was last active (ms since the epoch), or NaN: a run's
 * latest time (created, started, finished), a message's creation — the server's rule for
 * `lastActivityAt`.
 */
export function frameActivity(frame) {
  const data = frame && frame.data;
  if (!data || frame.type !== "event") return NaN;
  if (frame.eventType === "message_created") return Date.parse(data.createdAt);
  if (frame.eventType !== "effect_changed") return NaN;
  const times = [data.createdAt, data.startedAt, data.finishedAt].map((t) => Date.parse(t)).filter(Number.isFinite);
  return times.length ? Math.max(...times) : NaN;
}

const activityOf = (t) => {
  const active = Date.parse(t.lastActivityAt);
  return Number.isFinite(active) ? active : Date.parse(t.createdAt) || 0;
};

export class ThreadsView {
  /** `onSelect(tid)`: a thread was chosen or created; `onForget(tid)`: it is gone. */
  constructor({ onSelect, onForget }) {
    this.onSelect = onSelect;
    this.onForget = onForget;
    this.threads = new Map(); // id -> thread, in list order
    this.cursor = null;
    this.loading = false;
    this.selected = null;
    this.agents = null; // GET /api/agents answer (null until known, or when it failed)
    this.agentsLoad = null; // the in-flight loadAgents() promise
    this.el = {
      list: $("thread-list"),
      empty: $("threads-empty"),
      more: $("threads-more"),
      newThread: $("new-thread"),
      menu: $("agent-menu"),
      options: $("agent-options"),
    };
    this.wire();
  }

  wire() {
    const el = this.el;
    el.newThread.addEventListener("click", () => this.onNewThread());
    el.more.addEventListener("click", () => this.load(true));
    el.options.addEventListener("click", (ev) => {
      const option = ev.target.closest("button[data-agent-id]");
      if (option) this.create(option.dataset.agentId);
    });
    el.menu.addEventListener("keydown", (ev) => {
      const items = [...el.options.querySelectorAll("button")];
      const i = items.indexOf(document.activeElement);
      if (ev.key === "Escape") {
        ev.preventDefault();
        ev.stopPropagation();
        this.closeMenu();
        el.newThread.focus();
      } else if ((ev.key === "ArrowDown" || ev.key === "ArrowUp") && items.length) {
        ev.preventDefault();
        const step = ev.key === "ArrowDown" ? 1 : -1;
        items[(i + step + items.length) % items.length].focus();
      }
    });
    document.addEventListener("click", (ev) => {
      if (!el.menu.hidden && !el.menu.contains(ev.target) && ev.target !== el.newThread) this.closeMenu();
    });
    document.addEventListener("keydown", (ev) => {
      if (ev.key !== "Escape" || !this.menuOpen) return;
      ev.preventDefault(); // this Escape closed the menu, nothing else (app.js checks)
      this.closeMenu();
    });
  }

  get menuOpen() {
    return !this.el.menu.hidden;
  }

  item(thread, now) {
    const id = String(thread.id);
    const tags = [
      ...(thread.paused ? [html`<span class="thread-tag thread-paused" data-testid="thread-paused-tag"
          title="Paused: starts no run until resumed">paused</span>`] : []),
      ...[
        ["agent", thread.agentId],
        ["user", thread.userId],
      ]
        .filter(([, v]) => v)
        .map(([label, v]) => html`<span class="thread-tag" title=${label}>${label}: ${v}</span>`),
      ...(Array.isArray(thread.tags) ? thread.tags : []).map((t) => html`<span class="thread-tag">${String(t)}</span>`),
    ];
    return html`<li class="thread-item" data-testid="thread-item" data-thread-id=${id}
        aria-current=${id === this.selected ? "true" : "false"}>
      <button type="button" class="thread-select" title=${id} @click=${() => this.onSelect(id)}>
        <span class="thread-id mono">${id}</span>
        <span class="thread-meta">${activityText(thread, now)}${tags}</span>
      </button>
      <button type="button" class="thread-delete" data-testid="delete-thread" aria-label="Delete thread ${id}"
        title="Delete thread" @click=${(ev) => this.remove(id, ev.currentTarget)}>Delete</button>
    </li>`;
  }

  render(now = Date.now()) {
    render(
      repeat(
        [...this.threads.values()],
        (t) => String(t.id),
        (t) => this.item(t, now),
      ),
      this.el.list,
    );
    this.el.more.hidden = !this.cursor;
    this.el.more.disabled = this.loading;
    this.el.empty.hidden = this.threads.size > 0 || this.loading;
  }

  /** Mark `tid` (or none) as the selected thread, and scroll the list to show it. */
  select(tid) {
    this.selected = tid;
    this.render();
    this.revealSelected();
  }

  /**
   * Scroll the thread list (only the list, never the page) so the selected thread is in
   * view: on a phone the list is a short box, and a thread opened from a link may be
   * further down.
   */
  revealSelected() {
    if (this.selected === null) return;
    const item = [...this.el.list.children].find((li) => li.dataset.threadId === this.selected);
    let box = this.el.list.parentElement;
    while (box && box.scrollHeight <= box.clientHeight) box = box.parentElement;
    if (!item || !box || box === document.body || box === document.documentElement) return;
    const outer = box.getBoundingClientRect();
    const r = item.getBoundingClientRect();
    if (r.top < outer.top) box.scrollTop -= Math.ceil(outer.top - r.top);
    else if (r.bottom > outer.bottom) box.scrollTop += Math.ceil(Math.min(r.bottom - outer.bottom, r.top - outer.top));
  }

  async load(more) {
    if (this.loading) return;
    this.loading = true;
    this.render();
    try {
      const res = await api.listThreads({ limit: PAGE, cursor: more ? this.cursor : undefined });
      if (!more) this.threads.clear();
      for (const thread of res.threads || []) {
        const id = String(thread.id);
        if (!this.threads.has(id)) this.threads.set(id, { ...thread, id });
      }
      this.cursor = res.nextCursor || null;
    } catch (err) {
      toastApiError("Could not load threads", err);
    } finally {
      this.loading = false;
      this.render();
      if (!more) this.revealSelected();
    }
  }

  loadAgents() {
    if (!this.agentsLoad) {
      this.agentsLoad = api
        .listAgents()
        .then((res) => {
          this.agents = Array.isArray(res && res.agents) ? res.agents : [];
        })
        .catch(() => {
          this.agents = null; // unknown: create as before and let the server say what is wrong
        })
        .finally(() => {
          this.agentsLoad = null;
        });
    }
    return this.agentsLoad;
  }

  needsAgentChoice() {
    const agents = this.agents;
    return Array.isArray(agents) && agents.length > 1 && !agents.some((a) => a.default);
  }

  async onNewThread() {
    if (this.menuOpen) {
      this.closeMenu();
      return;
    }
    if (this.agents === null || this.agentsLoad) await this.loadAgents();
    if (this.needsAgentChoice()) this.openMenu();
    else this.create();
  }

  async create(agentId) {
    this.closeMenu();
    const button = this.el.newThread;
    button.disabled = true;
    try {
      const res = await api.createThread(agentId);
      const thread = { createdAt: new Date().toISOString(), tags: [], agentId, ...res, id: String(res.id) };
      this.threads = new Map([[thread.id, thread], ...this.threads]);
      this.render();
      this.onSelect(thread.id);
    } catch (err) {
      // The app's agents may have changed since the page loaded: offer the choice now.
      if (!agentId && err instanceof ApiError && err.code === "agent_not_found") {
        await this.loadAgents();
        if (this.needsAgentChoice()) {
          button.disabled = false;
          this.openMenu();
          return;
        }
      }
      toastApiError("Could not create a thread", err);
    } finally {
      button.disabled = false;
    }
  }

  openMenu() {
    render(
      (this.agents || []).map(
        (agent) => html`<button type="button" class="menu-item" role="menuitem" data-testid="agent-option"
            data-agent-id=${String(agent.id)}>
          <span class="menu-item-name mono">${String(agent.id)}</span>
          ${agent.description ? html`<span class="menu-item-desc">${String(agent.description)}</span>` : null}
        </button>`,
      ),
      this.el.options,
    );
    this.el.menu.hidden = false;
    this.el.newThread.setAttribute("aria-expanded", "true");
    this.el.options.querySelector("button")?.focus();
  }

  closeMenu() {
    if (this.el.menu.hidden) return;
    this.el.menu.hidden = true;
    this.el.newThread.setAttribute("aria-expanded", "false");
  }

  async remove(id, button) {
    const question = `Delete thread ${id}?\n\nIts history and every scheduled run are discarded; nothing of it runs later.`;
    if (!window.confirm(question)) return;
    button.disabled = true;
    try {
      await api.deleteThread(id);
      this.forget(id);
      toast(`Thread ${id} deleted.`, { kind: "info" });
    } catch (err) {
      button.disabled = false;
      if (err instanceof ApiError && err.status === 404) this.forget(id); // the list was out of date
      toastApiError(`Could not delete thread ${id}`, err);
    }
  }

  /**
   * A frame of thread `id` (its own stream, or the stream of every thread): if it is newer
   * than the thread's last activity, the thread says so and moves up (the list is most
   * recently active first). Threads not loaded are left alone. Drawn once per frame burst.
   */
  onFrame(id, frame) {
    if (frame && frame.type === "event" && frame.eventType === "thread_deleted") {
      if (this.threads.has(String(id))) this.forget(String(id));
      return;
    }
    const at = frameActivity(frame);
    const thread = id == null ? undefined : this.threads.get(String(id));
    if (!thread || !Number.isFinite(at) || at <= activityOf(thread)) return;
    this.threads.set(thread.id, { ...thread, lastActivityAt: new Date(at).toISOString() });
    if (this.resortQueued) return;
    this.resortQueued = true;
    requestAnimationFrame(() => {
      this.resortQueued = false;
      const sorted = [...this.threads.values()].sort(
        (a, b) => activityOf(b) - activityOf(a) || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0),
      );
      this.threads = new Map(sorted.map((t) => [String(t.id), t]));
      this.render();
    });
  }

  /** Note thread `id`'s paused state (from its header), if it is in the list. */
  setPaused(id, paused) {
    const thread = id == null ? undefined : this.threads.get(id);
    if (!thread || Boolean(thread.paused) === paused) return;
    this.threads.set(id, { ...thread, paused });
    this.render();
  }

  /** Drop `id` from the list (deleted here or elsewhere). */
  forget(id) {
    if (this.threads.delete(id)) this.render();
    this.onForget(id);
  }
}
