// schedule.js — the "Schedule effect" form. The args box always holds args for the chosen
// effect: its skeleton (args.js: only values its schema accepts), or what the user typed
// for it earlier. Args typed for another effect are set aside, never sent to this one, and
// "back to …" returns to them in one step. Each thread starts with a fresh form: nothing
// typed for one thread is scheduled on another.

import { html, nothing, render } from "./vendor/lit-html/lit-html.js";
import { api, ApiError } from "./api.js";
import { argsEdited, argsSkeleton } from "./args.js";
import { errorText } from "./format.js";
import { toastApiError } from "./toasts.js";

const $ = (id) => document.getElementById(id);

export class ScheduleForm {
  /** `ctx`: {handledAsGone(session, err), onScheduled(id) -> Promise}. */
  constructor(ctx) {
    this.ctx = ctx;
    this.session = null;
    this.effects = [];
    this.argsFor = null; // the effect the args box holds args for
    this.drafts = new Map(); // effect name -> args the user edited, set aside on switching effect
    this.el = {
      box: $("schedule-box"),
      form: $("schedule-form"),
      name: $("schedule-name"),
      desc: $("schedule-desc"),
      args: $("schedule-args"),
      hint: $("schedule-args-hint"),
      restore: $("schedule-args-restore"),
      delay: $("schedule-delay"),
      submit: $("schedule-submit"),
      error: $("schedule-error"),
      result: $("schedule-result"),
    };
    this.el.form.addEventListener("submit", (ev) => this.submit(ev));
    this.el.name.addEventListener("change", () => this.effectChosen());
    this.el.restore.addEventListener("click", () => this.restore());
  }

  /** A new thread (or none): the effect, args, delay, drafts and messages start over. */
  reset(session) {
    this.session = session;
    this.drafts.clear();
    this.argsFor = null;
    if (this.el.name.options.length) this.el.name.selectedIndex = 0; // as on a fresh load
    this.el.delay.value = "0";
    this.el.args.value = "";
    this.showError("");
    this.el.result.hidden = true;
    this.effectChosen();
    this.setDisabled(!session || session.gone);
  }

  setDisabled(disabled) {
    const el = this.el;
    for (const control of [el.name, el.args, el.delay, el.submit, el.restore]) control.disabled = disabled;
  }

  effect(name = this.el.name.value) {
    return this.effects.find((e) => e.name === name) || null;
  }

  schemaOf(name) {
    const effect = this.effect(name);
    return effect ? effect.argsSchema : null;
  }

  async load() {
    try {
      const res = await api.listEffects();
      this.effects = Array.isArray(res && res.effects) ? res.effects : [];
    } catch (err) {
      toastApiError("Could not load the effect list", err);
      return;
    }
    const current = this.el.name.value;
    render(
      this.effects.length
        ? this.effects.map((e) => html`<option value=${e.name} title=${e.description || ""}>${e.name}</option>`)
        : html`<option value="" disabled>No effects defined</option>`,
      this.el.name,
    );
    if (current && this.effect(current)) this.el.name.value = current;
    this.effectChosen();
  }

  /** The effect changed (or the list was reloaded, or the thread). */
  effectChosen() {
    const el = this.el;
    const effect = this.effect();
    const name = effect ? effect.name : null;
    const schema = effect ? effect.argsSchema : null;
    const skeleton = argsSkeleton(schema);
    el.desc.textContent = effect && effect.description ? effect.description : "";
    el.args.title = schema ? JSON.stringify(schema, null, 2) : "This effect takes no arguments";
    // An empty box is sent as null, which is what an effect without arguments expects.
    el.args.placeholder = skeleton.placeholder;
    render(
      skeleton.needs.length
        ? html`Needs ${skeleton.needs.map((n, i) => {
            const about = [n.description.replace(/\.$/, ""), n.limits].filter(Boolean).join("; ");
            return html`${i ? ", " : ""}<code>${n.name}</code>${about ? ` (${about})` : ""}`;
          })}.`
        : nothing,
      el.hint,
    );
    el.hint.hidden = !skeleton.needs.length;

    const previous = this.argsFor;
    if (name === previous) {
      // Same effect (the list was reloaded): keep what the user typed, refresh a skeleton.
      if (!argsEdited(schema, el.args.value)) el.args.value = skeleton.text;
      return;
    }
    let setAside = null;
    if (previous !== null && argsEdited(this.schemaOf(previous), el.args.value)) {
      this.drafts.set(previous, el.args.value);
      setAside = previous;
    } else if (previous !== null) {
      this.drafts.delete(previous);
    }
    el.args.value = (name !== null && this.drafts.get(name)) || skeleton.text;
    this.argsFor = name;
    this.offerRestore(setAside);
  }

  /** Offer the way back to the args just set aside for `name` (null: hide the link). */
  offerRestore(name) {
    const r = this.el.restore;
    r.hidden = !name;
    if (!name) {
      delete r.dataset.effect;
      return;
    }
    r.dataset.effect = name;
    r.textContent = `↩ Back to ${name} and the args you typed`;
  }

  restore() {
    const name = this.el.restore.dataset.effect;
    if (!name || !this.effect(name)) return;
    this.el.name.value = name;
    this.effectChosen(); // brings back its draft, and offers the way back to this effect's
    this.el.args.focus();
  }

  showError(message) {
    this.el.error.textContent = message;
    this.el.error.hidden = !message;
  }

  async submit(ev) {
    ev.preventDefault();
    const s = this.session;
    const el = this.el;
    if (!s || s.gone) return;
    this.showError("");
    el.result.hidden = true;
    const name = el.name.value;
    if (!name) {
      this.showError("Choose an effect to schedule.");
      return;
    }
    let args = null;
    const text = el.args.value.trim();
    if (text) {
      try {
        args = JSON.parse(text);
      } catch (err) {
        this.showError(`Args are not valid JSON: ${err.message}`);
        el.args.focus();
        return;
      }
    }
    const rawDelay = el.delay.value.trim();
    if (el.delay.validity.badInput) {
      this.showError("Delay must be a number of seconds.");
      return;
    }
    // Range checks (negative, too large) are the server's: its 422 message is shown as is.
    const delay = rawDelay === "" ? 0 : Number(rawDelay);
    el.submit.disabled = true;
    try {
      const res = await api.schedule(s.tid, name, args, delay, { signal: s.signal });
      const id = String(res.id);
      el.result.textContent = `Scheduled ${name} as ${id}.`;
      el.result.hidden = false;
      await this.ctx.onScheduled(id);
    } catch (err) {
      if (s.closed || this.ctx.handledAsGone(s, err)) return;
      const code = err instanceof ApiError && err.status ? ` (${err.status} ${err.code})` : "";
      this.showError(`${errorText(err)}${code}`);
    } finally {
      if (!s.closed) el.submit.disabled = false;
    }
  }
}
