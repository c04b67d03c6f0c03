// The drainer: sends what the outbox holds, each operation with its stored
// Idempotency-Key, one operation at a time and one tab at a time.
//
// One tab at a time: the drain runs under a Web Lock (navigator.locks),
// which the browser holds for one page of this origin at most and releases
// when that page goes away (reload, closed tab, crash) — the browser's
// counterpart of the Rust client's flock on its drainer file. The lock is
// held only while something is due; waits between retries hold nothing, so
// another tab (another token) is never starved.
//
// When: on demand (after an operation is queued, "Sync now"), on the
// `online` event, and on a timer (the next due time, and every
// SAFETY_INTERVAL_MS in any case).
//
// Retries: no answer (offline, connection cut, timeout), 408, 429, 5xx and
// 409 IDEMPOTENCY_IN_PROGRESS are sent again after a full-jitter backoff and
// never before the answer's Retry-After; `X-Should-Retry: true` makes any
// answer a retry, `false` makes it definitive. Any other 4xx is definitive:
// the operation fails, showing the problem's title and detail. 401 says
// the token is wrong, not the operation: it stays queued and the drain stops.

import * as outbox from './outbox.js';
import { ORDER_ID } from './outbox.js';
import { parseExact, problemText } from './orders.js';

export const LOCK_NAME = 'orders-api-outbox-drain';
const REQUEST_TIMEOUT_MS = 10_000;
const BASE_DELAY_MS = 200;
const MAX_DELAY_MS = 10_000;
/** No Retry-After is honoured beyond this: a longer one is a broken header. */
const MAX_RETRY_AFTER_MS = 300_000;
const SAFETY_INTERVAL_MS = 5_000;
const LOCK_BUSY_RETRY_MS = 1_000;

/** Full jitter: a random wait in 0 ..= min(MAX, BASE × 2^(attempt-1)). */
export function backoff(attempt) {
  const ceiling = Math.min(MAX_DELAY_MS, BASE_DELAY_MS * 2 ** Math.min(Math.max(attempt - 1, 0), 30));
  return Math.floor(Math.random() * (ceiling + 1));
}

/** Retry-After in milliseconds: delay-seconds or an HTTP date; 0 if absent or unreadable. */
export function retryAfterMs(value, now = Date.now()) {
  if (value == null) return 0;
  const text = value.trim();
  let ms = 0;
  if (/^[0-9]+$/.test(text)) ms = Number(text) * 1000;
  else {
    const at = Date.parse(text);
    if (!Number.isNaN(at)) ms = at - now;
  }
  return Math.min(Math.max(ms, 0), MAX_RETRY_AFTER_MS);
}

/** One request for `op`, classified. */
export async function send(op, token) {
  const retry = (reason, waitMs = 0) => ({
    retry: {
      after: Math.max(backoff(op.attempts), waitMs),
      notBefore: waitMs > 0 ? Date.now() + waitMs : 0,
      reason,
    },
  });
  const headers = { Authorization: `Bearer ${token}`, 'Idempotency-Key': op.key };
  if (op.body != null) headers['Content-Type'] = 'application/json';
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(new Error(`no answer within ${REQUEST_TIMEOUT_MS / 1000} s`)), REQUEST_TIMEOUT_MS);
  let res;
  let text;
  try {
    res = await fetch(op.path, {
      method: op.method,
      headers,
      body: op.body ?? undefined,
      signal: abort.signal,
      cache: 'no-store',
      credentials: 'omit',
      redirect: 'error',
      keepalive: false,
    });
    text = await res.text();
  } catch (error) {
    // Offline, refused, cut, timed out: it may have run; the key makes the retry safe.
    return retry(`no answer (${error?.message ?? error})`);
  } finally {
    clearTimeout(timer);
  }
  let answer = null;
  try { answer = text ? parseExact(text) : null; } catch { answer = null; }
  const status = res.status;
  const code = typeof answer?.error === 'string' ? answer.error : '';
  const wait = retryAfterMs(res.headers.get('Retry-After'));
  const hint = (res.headers.get('X-Should-Retry') ?? '').trim().toLowerCase();
  if (status === 401) return { unauthorized: problemText(status, answer) };
  const retryable = hint === 'true'
    || (hint !== 'false' && (status === 408 || status === 429 || status >= 500
      || (status === 409 && code === 'IDEMPOTENCY_IN_PROGRESS')));
  if (retryable && !(status >= 200 && status < 300)) {
    return retry(`${status}${code ? ` ${code}` : ''}`, wait);
  }
  let orderId = null;
  // An answer's order is read once, here, and only as an order id: the
  // path of every later operation on it is built from that, never from text.
  if (status >= 200 && status < 300 && op.kind === 'create' && typeof answer?.id === 'string') {
    const id = answer.id.toLowerCase();
    if (ORDER_ID.test(id)) orderId = id;
  }
  const reason = status >= 200 && status < 300 ? null : problemText(status, answer);
  return { answered: { status, answer, orderId, reason } };
}

/**
 * Drains the outbox of the token's user. `session()` gives `{token, owner}`
 * or null; `changed()` is called after each recorded step.
 */
export class Drainer {
  constructor({ session, changed, refused }) {
    this.session = session;
    this.changed = changed;
    this.refused = refused;
    this.timer = null;
    this.forceNext = false;
    setInterval(() => this.drain(), SAFETY_INTERVAL_MS);
    addEventListener('online', () => this.drain({ force: true }));
  }

  /** Schedules the next drain `ms` from now (an earlier one wins). */
  schedule(ms) {
    const at = Date.now() + ms;
    if (this.timer && this.timerAt <= at) return;
    clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => { this.timer = null; this.drain(); }, Math.max(ms, 0));
  }

  /**
   * Sends everything due, under the drain lock. `force`: what failed for
   * want of an answer is due now (the network just came back, or the user
   * asked); a server's Retry-After still holds.
   */
  async drain({ force = false } = {}) {
    const current = this.session();
    if (!current) return;
    if (navigator.onLine === false) return; // the `online` event brings it back
    const forcedSince = Date.now();
    await navigator.locks.request(LOCK_NAME, { ifAvailable: true }, async (lock) => {
      if (!lock) {
        // Another tab drains; look again soon (it may drain another token's operations).
        this.schedule(LOCK_BUSY_RETRY_MS);
        return;
      }
      for (;;) {
        const { token, owner } = this.session() ?? {};
        if (!token || owner !== current.owner) return;
        const { op, due } = await outbox.claim(owner, { force, forcedSince });
        if (!op) {
          if (due != null) this.schedule(due - Date.now());
          this.changed();
          return;
        }
        this.changed();
        const outcome = await send(op, token);
        if (outcome.unauthorized) {
          await outbox.record(op.seq, { retry: { after: 0, reason: outcome.unauthorized } });
          this.changed();
          this.refused(outcome.unauthorized);
          return;
        }
        await outbox.record(op.seq, outcome);
        this.changed();
      }
    });
  }
}
