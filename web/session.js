// session.js — the selected thread, as the views share it. Each selection gets a new
// session; closing it aborts every request still in flight for it (AbortController), so an
// answer for a thread no longer shown never lands in the view.

export class ThreadSession {
  /**
   * `gone`: the thread does not exist (deleted, or a malformed id), or `broken`: its
   * database cannot be used (thread_storage_error); either way nothing acts on it.
   */
  constructor(tid, { gone = false, broken = false } = {}) {
    this.tid = tid;
    this.gone = gone || broken;
    this.broken = broken;
    this.controller = new AbortController();
    if (gone) this.controller.abort();
  }

  /** Pass as `{signal}` to the api calls made for this thread. */
  get signal() {
    return this.controller.signal;
  }

  /** The session was replaced: drop whatever its requests answer. */
  get closed() {
    return this.controller.signal.aborted;
  }

  close() {
    this.controller.abort();
  }
}
