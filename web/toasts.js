// toasts.js — short notices in the corner. Errors stay 10 s, notices 4 s; at most five.
// While the Conversation tab is shown they sit above the composer (see style.css), so they
// never cover the Send button.

import { html, render } from "./vendor/lit-html/lit-html.js";
import { repeat } from "./vendor/lit-html/directives/repeat.js";
import { ApiError } from "./api.js";
import { errorText } from "./format.js";

const MAX_TOASTS = 5;
let container = null;
let items = [];
let nextKey = 1;

function draw() {
  render(
    repeat(
      items,
      (t) => t.key,
      (t) => html`<div class="toast toast-${t.kind}" role=${t.kind === "error" ? "alert" : "status"}
          data-testid="toast" data-kind=${t.kind}>
        <span class="toast-text">${t.message}</span>
        ${t.detail ? html`<span class="toast-detail mono">${t.detail}</span>` : null}
        ${t.action
          ? html`<button type="button" class="btn btn-ghost btn-small"
              @click=${() => {
                t.action.run();
                dismiss(t.key);
              }}>${t.action.label}</button>`
          : null}
        <button type="button" class="toast-close" aria-label="Dismiss" @click=${() => dismiss(t.key)}>✕</button>
      </div>`,
    ),
    container,
  );
}

function dismiss(key) {
  const before = items.length;
  items = items.filter((t) => t.key !== key);
  if (items.length !== before) draw();
}

/** Show where toasts go: the `#toasts` element. */
export function mountToasts(element) {
  container = element;
}

/** A notice: kind "error" (default) or "info"; `action`: {label, run}; `timeout` in ms. */
export function toast(message, { kind = "error", detail, action, timeout } = {}) {
  const key = nextKey++;
  items = [...items, { key, kind, message, detail, action }].slice(-MAX_TOASTS);
  draw();
  setTimeout(() => dismiss(key), timeout ?? (kind === "error" ? 10000 : 4000));
}

/** "<what>: <server message>", with "<status> <code>" underneath. */
export function toastApiError(what, err) {
  const code = err instanceof ApiError && err.status ? `${err.status} ${err.code}` : undefined;
  toast(`${what}: ${errorText(err)}`, { detail: code });
}
