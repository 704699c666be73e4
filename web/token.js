// token.js — the API token dialog. api.js asks for a token on a 401; after one dismissal
// the pane stops interrupting: calls fail with a toast and the header's "API token" button
// is the way back.

import { getToken, onTokenNeeded, setToken } from "./api.js";

const $ = (id) => document.getElementById(id);

/** Opens the dialog; resolves to the saved token, or null when dismissed. */
function openTokenDialog(reason) {
  const dlg = $("token-dialog");
  const form = $("token-form");
  const input = $("token-input");
  const cancel = $("token-cancel");
  const forget = $("token-forget");
  return new Promise((resolve) => {
    $("token-reason").textContent = reason;
    input.value = "";
    forget.hidden = !getToken();
    // One controller removes every listener of this opening at once.
    const listeners = new AbortController();
    const finish = (value) => {
      if (listeners.signal.aborted) return;
      listeners.abort();
      if (dlg.open) dlg.close();
      resolve(value);
    };
    const onCancel = (ev) => {
      ev.preventDefault();
      finish(null);
    };
    const opts = { signal: listeners.signal };
    form.addEventListener(
      "submit",
      (ev) => {
        ev.preventDefault();
        const token = input.value.trim();
        if (!token) {
          input.focus();
          return;
        }
        setToken(token);
        finish(token);
      },
      opts,
    );
    cancel.addEventListener("click", onCancel, opts);
    dlg.addEventListener("cancel", onCancel, opts);
    forget.addEventListener(
      "click",
      () => {
        setToken("");
        finish(null);
      },
      opts,
    );
    if (!dlg.open) dlg.showModal();
    input.focus();
  });
}

/** Whether the token dialog is open (Escape then belongs to it). */
export function tokenDialogOpen() {
  return $("token-dialog").open;
}

/**
 * Wire the dialog: api.js's 401 prompt, and the header button. `onSaved()` runs after a
 * token was asked for and given on a 401; `onChanged()` after the button changed the token.
 */
export function installTokenDialog({ onSaved, onChanged }) {
  let dismissed = false;
  onTokenNeeded(async (rejected) => {
    if (dismissed || tokenDialogOpen()) return null;
    const token = await openTokenDialog(
      rejected ? "The server refused the stored API token. Enter a valid one." : "The server requires an API token.",
    );
    if (!token) {
      dismissed = true;
      return null;
    }
    onSaved();
    return token;
  });
  $("token-button").addEventListener("click", async () => {
    if (tokenDialogOpen()) return;
    const had = getToken();
    const token = await openTokenDialog("Set the API token sent with every call to this server.");
    if (token === null && getToken() === had) return; // cancelled without change
    dismissed = false;
    onChanged();
  });
}
