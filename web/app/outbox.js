// The outbox: every operation, with its Idempotency-Key, stored in IndexedDB
// before it is ever sent. The same design as the Rust client's outbox
// (crates/orders-client): enqueue commits first; a drainer claims the next
// operation that may be sent, sends it with its stored key, and records the
// answer; nothing is sent that is not stored, nothing stored is lost.
//
// States (data-op-state in the page):
//   queued   stored; never sent, or sent without an answer that settles it
//            (it is sent again, with the same key, when it is due);
//   sending  a drainer is sending it. Only the tab holding the drain lock
//            sends, so a `sending` operation found by the next holder of the
//            lock was being sent by a page that died (reload, closed tab,
//            crash): it is sent again with the same key, and the server
//            replays its answer if the first send did reach it;
//   done     answered 2xx; never sent again;
//   failed   answered with a 4xx that retrying cannot change (or its
//            create failed); never sent again, the reason is kept.
//
// Every write is one IndexedDB transaction with strict durability: it has
// reached the disk when its promise resolves.

import { ORDERS_PATH } from './orders.js';

const DB_NAME = 'orders-api-outbox';
const DB_VERSION = 1;
const STORE = 'operations';
const STRICT = { durability: 'strict' };

/** The method of each kind of operation: read from the kind when sent, never from the row. */
export const METHODS = { create: 'POST', update: 'PATCH', cancel: 'DELETE' };
/** An order id as the server writes it: a UUID, lower case. */
export const ORDER_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** A key as this outbox writes it (crypto.randomUUID()). */
const KEY = ORDER_ID;

export const QUEUED = 'queued';
export const SENDING = 'sending';
export const DONE = 'done';
export const FAILED = 'failed';

let opened = null;

function database() {
  if (!opened) {
    opened = new Promise((resolve, reject) => {
      const request = indexedDB.open(DB_NAME, DB_VERSION);
      request.onupgradeneeded = () => {
        request.result.createObjectStore(STORE, { keyPath: 'seq', autoIncrement: true });
      };
      request.onsuccess = () => {
        const db = request.result;
        // Another tab opening a newer version: step aside, reopen later.
        db.onversionchange = () => { db.close(); opened = null; };
        resolve(db);
      };
      request.onerror = () => { opened = null; reject(request.error); };
      request.onblocked = () => reject(new Error('the outbox is held open by an older version of this page in another tab'));
    });
  }
  return opened;
}

/**
 * Runs `work(store)` in one transaction and resolves with its result once
 * the transaction has committed (for writes: durably).
 */
async function transaction(mode, work) {
  const db = await database();
  return new Promise((resolve, reject) => {
    const tx = mode === 'readwrite' ? db.transaction(STORE, mode, STRICT) : db.transaction(STORE, mode);
    let result;
    tx.oncomplete = () => resolve(result);
    tx.onabort = () => reject(tx.error ?? new Error('the outbox transaction was aborted'));
    tx.onerror = () => reject(tx.error);
    Promise.resolve(work(tx.objectStore(STORE))).then(
      (value) => { result = value; },
      (error) => { try { tx.abort(); } catch { /* already finished */ } reject(error); },
    );
  });
}

function request(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

/** Every operation, oldest first. */
export function all() {
  return transaction('readonly', (store) => request(store.getAll()));
}

/**
 * Stores an operation with a fresh key and resolves with it once it is on
 * disk. `owner` names the token's user (a hash, never the token); `target`
 * is `{op: seq}` for an order whose create is in this outbox, or
 * `{order: id}`; `summary` and `fields` (a create's typed values) are
 * only shown.
 */
export function enqueue(owner, { kind, target = null, body = null, summary = '', fields = null }) {
  const method = METHODS[kind];
  if (!method) throw new Error(`unknown operation ${kind}`);
  const key = crypto.randomUUID();
  return transaction('readwrite', async (store) => {
    const ops = await request(store.getAll());
    // The resource orders the operations on one order: an update or cancel
    // joins its create's, so it is never sent before the create is answered.
    let resource = null;
    if (target?.op != null) {
      const created = ops.find((o) => o.seq === target.op);
      if (!created) throw new Error(`operation ${target.op} is not in the outbox`);
      resource = created.resource;
    } else if (target?.order != null) {
      const created = ops.find((o) => o.kind === 'create' && o.orderId === target.order);
      resource = created ? created.resource : `order:${target.order}`;
    }
    const op = {
      owner,
      kind,
      method,
      target,
      body,
      summary,
      fields,
      key,
      resource: resource ?? `create:${key}`,
      state: QUEUED,
      attempts: 0,
      createdAt: Date.now(),
      nextAttemptAt: 0,
      notBefore: 0,
      lastTriedAt: 0,
      orderId: target?.order ?? null,
      status: null,
      answer: null,
      reason: null,
      lastError: null,
    };
    op.seq = await request(store.add(op));
    return op;
  });
}

/**
 * Leases the next operation of `owner` that may be sent now, marking it
 * `sending` (one more attempt) in the same transaction; null when none is.
 * The caller must hold the drain lock. An operation is next when nothing
 * earlier on its resource is still queued or sending, and it is due: a
 * `sending` one at once (its page died), a queued one once its backoff has
 * passed (or, with `force`, when it was last tried before `forcedSince`)
 * and never before the server's Retry-After. An update or cancel of an
 * order still queued is sent to the id its create was answered with; if the
 * create failed, it fails too, unsent.
 *
 * Resolves with `{op, due}`: `due` is when the earliest operation not yet
 * due will be (null: none waits).
 */
export function claim(owner, { force = false, forcedSince = 0 } = {}) {
  return transaction('readwrite', async (store) => {
    const now = Date.now();
    const ops = await request(store.getAll());
    const open = new Set();
    let due = null;
    for (const op of ops) {
      if (op.state !== QUEUED && op.state !== SENDING) continue;
      const blocked = open.has(op.resource);
      open.add(op.resource);
      if (blocked || op.owner !== owner) continue;
      if (op.state === QUEUED) {
        const ready = force && op.lastTriedAt <= forcedSince ? op.notBefore : Math.max(op.notBefore, op.nextAttemptAt);
        if (ready > now) {
          due = due == null ? ready : Math.min(due, ready);
          continue;
        }
      }
      // The row is read back as this outbox writes it (another script of
      // this origin, or the browser's devtools, may have changed it): an
      // operation that does not read back fails unsent.
      const unreadable = !METHODS[op.kind] ? `its kind "${op.kind}" is not create, update or cancel`
        : typeof op.key !== 'string' || !KEY.test(op.key) ? 'its Idempotency-Key is not one this outbox writes'
          : op.kind === 'cancel' ? (op.body == null ? null : 'a cancel has no body')
            : typeof op.body !== 'string' ? 'it has no body' : null;
      if (unreadable) {
        op.state = FAILED;
        op.reason = `not sent: the stored operation does not read back (${unreadable})`;
        store.put(op);
        open.delete(op.resource);
        continue;
      }
      op.method = METHODS[op.kind];
      let path = ORDERS_PATH;
      if (op.kind !== 'create') {
        let id = op.target?.order ?? null;
        if (op.target?.op != null) {
          const created = ops.find((o) => o.seq === op.target.op);
          id = created?.state === DONE ? created.orderId : null;
          if (id == null) {
            op.state = FAILED;
            op.reason = `not sent: its order's create (operation ${op.target.op}) ${created ? `is ${created.state} without an order` : 'is not in the outbox'}`;
            store.put(op);
            open.delete(op.resource);
            continue;
          }
          op.orderId = id;
        }
        if (typeof id !== 'string' || !ORDER_ID.test(id)) {
          op.state = FAILED;
          op.reason = 'not sent: its order id is not one the server gives';
          store.put(op);
          open.delete(op.resource);
          continue;
        }
        path = `${ORDERS_PATH}/${id}`;
      }
      op.state = SENDING;
      op.path = path;
      op.attempts += 1;
      op.lastTriedAt = now;
      await request(store.put(op));
      return { op, due: null };
    }
    return { op: null, due };
  });
}

/**
 * Records what one send of `op` came to: `{answered: {status, answer,
 * orderId, reason}}` (done for a 2xx, else failed) or `{retry: {after,
 * notBefore, reason}}` (queued again). Only an operation still `sending` is
 * changed: an answer is recorded once.
 */
export function record(seq, outcome) {
  return transaction('readwrite', async (store) => {
    const op = await request(store.get(seq));
    if (!op || op.state !== SENDING) return op;
    const now = Date.now();
    if (outcome.answered) {
      const { status, answer, orderId, reason } = outcome.answered;
      op.state = status >= 200 && status < 300 ? DONE : FAILED;
      op.status = status;
      op.answer = answer;
      if (orderId != null) op.orderId = orderId;
      op.reason = op.state === FAILED ? reason : null;
      op.lastError = null;
    } else {
      const { after, notBefore = 0, reason } = outcome.retry;
      op.state = QUEUED;
      op.nextAttemptAt = now + after;
      op.notBefore = notBefore;
      op.lastError = reason;
    }
    await request(store.put(op));
    return op;
  });
}

/**
 * Removes the answered operations of `owner` whose order has nothing left
 * to send (an update still queued needs its create's answer).
 */
export function clearFinished(owner) {
  return transaction('readwrite', async (store) => {
    const ops = await request(store.getAll());
    const open = new Set(ops.filter((o) => o.state === QUEUED || o.state === SENDING).map((o) => o.resource));
    let removed = 0;
    for (const op of ops) {
      if (op.owner === owner && (op.state === DONE || op.state === FAILED) && !open.has(op.resource)) {
        store.delete(op.seq);
        removed += 1;
      }
    }
    return removed;
  });
}
