// The page: the token, the order form, the outbox as it stands, and the
// orders the server has. Every change goes through the outbox (outbox.js)
// and is sent by the drainer (drain.js); nothing here sends a mutation.
//
// The DOM is built from the page's templates and textContent only (the page's
// policy refuses HTML strings); answers' numbers stay exact text.

import * as outbox from './outbox.js';
import { Drainer } from './drain.js';
import { InputError, createBody, listOrders, updateBody } from './orders.js';

const TOKEN_KEY = 'orders-api.token';
const CHANNEL = 'orders-api-outbox';

const $ = (selector, root = document) => root.querySelector(selector);

/** The token of this tab (sessionStorage only) and its owner name. */
const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  owner: null,
  refused: null,
  orders: [],
  ordersError: null,
  more: false,
};

/**
 * The name operations are stored under: a hash of the token, never the
 * token itself, so that an operation is only ever sent with the token of
 * the user who queued it.
 */
async function ownerOf(token) {
  const bytes = new TextEncoder().encode(`orders-api outbox owner\n${token}`);
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  return Array.from(digest.slice(0, 16), (b) => b.toString(16).padStart(2, '0')).join('');
}

const channel = 'BroadcastChannel' in self ? new BroadcastChannel(CHANNEL) : null;

const drainer = new Drainer({
  session: () => (state.token && state.owner && !state.refused ? { token: state.token, owner: state.owner } : null),
  changed: () => { channel?.postMessage('changed'); render(); },
  refused: (why) => { state.refused = why; render(); },
});

// ---- rendering ---------------------------------------------------------

function describe(op) {
  if (op.summary) return op.summary;
  return `${op.method} ${op.path ?? ''}`;
}

function renderOp(op) {
  const node = $('#op-template').content.firstElementChild.cloneNode(true);
  node.dataset.opSeq = String(op.seq);
  node.dataset.opState = op.state;
  node.dataset.opKind = op.kind;
  node.dataset.opKey = op.key;
  if (op.orderId) node.dataset.orderId = op.orderId;
  if (op.attempts) node.dataset.opAttempts = String(op.attempts);
  $('.op-state', node).textContent = op.state;
  $('.op-what', node).textContent = `${op.kind} ${describe(op)}`;
  $('.op-order', node).textContent = op.orderId ? `order ${op.orderId}` : '';
  $('.op-key', node).textContent = `Idempotency-Key ${op.key}`;
  let reason = '';
  if (op.state === outbox.FAILED) reason = op.reason ?? 'failed';
  else if (op.state === outbox.DONE) reason = op.status === 201 ? '' : `answered ${op.status}`;
  else if (op.lastError) reason = `attempt ${op.attempts}: ${op.lastError}; will retry with the same key`;
  $('.op-reason', node).textContent = reason;
  return node;
}

function orderForm(node, target, current) {
  const form = $('.order-change', node);
  const quantity = $('input[name="quantity"]', form);
  const price = $('input[name="price"]', form);
  quantity.value = current.quantity ?? '';
  price.value = current.price ?? '';
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const changes = {};
    if (quantity.value.trim() !== String(current.quantity ?? '')) changes.quantity = quantity.value;
    if (price.value.trim() !== String(current.price ?? '')) changes.price = price.value;
    queue('update', target, () => updateBody(changes), `${current.item}: ${Object.entries(changes).map(([k, v]) => `${k} ${v}`).join(', ')}`);
  });
  $('.cancel', form).addEventListener('click', () => queue('cancel', target, () => null, current.item));
}

function renderOrder(order, target, status) {
  const node = $('#order-template').content.firstElementChild.cloneNode(true);
  node.dataset.status = status;
  if (order.id) node.dataset.orderId = order.id;
  if (target.op != null) node.dataset.opSeq = String(target.op);
  $('.order-item', node).textContent = order.item;
  $('.order-status', node).textContent = status === 'unsent' ? 'not yet on the server' : status;
  const total = order.total_price != null ? ` = ${order.total_price}` : '';
  $('.order-figures', node).textContent = `${order.quantity} × ${order.price}${total}`;
  $('.order-id', node).textContent = order.id ?? '';
  orderForm(node, target, order);
  return node;
}

let rendering = null;
let renderAgain = false;

/** Redraws from the outbox (coalesced: one redraw at a time). */
function render() {
  if (rendering) { renderAgain = true; return rendering; }
  rendering = (async () => {
    do {
      renderAgain = false;
      await draw();
    } while (renderAgain);
    rendering = null;
  })();
  return rendering;
}

async function draw() {
  const network = $('#network');
  network.dataset.online = String(navigator.onLine);
  network.textContent = navigator.onLine ? 'online' : 'offline: operations wait in the outbox';

  const tokenState = $('#token-state');
  tokenState.textContent = state.refused
    ? `The server refused this token (${state.refused}). Enter another one.`
    : state.token
      ? 'Token set for this tab (sessionStorage only, never in the outbox or in a URL).'
      : 'No token yet: paste one (the demo token the server printed, or orders-api keys create USER).';
  document.body.dataset.token = state.token ? (state.refused ? 'refused' : 'set') : 'none';

  const ops = (await outbox.all()).filter((op) => op.owner === state.owner);
  const list = $('#outbox');
  list.replaceChildren(...ops.slice().reverse().map(renderOp));
  const count = (s) => ops.filter((op) => op.state === s).length;
  $('#outbox-summary').textContent = ops.length
    ? `${count(outbox.QUEUED)} queued, ${count(outbox.SENDING)} sending, ${count(outbox.DONE)} done, ${count(outbox.FAILED)} failed`
    : 'empty';

  // The orders: the server's, and those whose create is still in the outbox.
  const unsent = ops.filter((op) => op.kind === 'create' && (op.state === outbox.QUEUED || op.state === outbox.SENDING));
  const rows = unsent.reverse().map((op) => renderOrder(op.fields ?? {}, { op: op.seq }, 'unsent'));
  for (const order of state.orders) rows.push(renderOrder(order, { order: order.id }, order.status));
  $('#orders').replaceChildren(...rows);
  $('#orders-state').textContent = state.ordersError
    ?? (state.more ? 'the newest 100' : state.orders.length ? `${state.orders.length} on the server` : '');
}

// ---- actions -------------------------------------------------------------

/**
 * Queues an operation. Everything it sends (the owner, the body's text) is
 * read and checked here, before anything is awaited, so that the caller can
 * clear its form in the same tick: an operation submitted right after this
 * one is never read from, or wiped by, what this one awaits. `null` when
 * the page refused it (no token, or a field the body cannot carry; the
 * reason is shown), else the promise of the stored operation.
 */
function queue(kind, target, body, summary, fields) {
  const error = $('#order-error');
  error.textContent = '';
  const owner = state.owner;
  if (!owner) { error.textContent = 'Enter a token first.'; return null; }
  let text;
  try { text = body(); } catch (e) {
    if (e instanceof InputError) { error.textContent = e.message; return null; }
    throw e;
  }
  const stored = (async () => {
    const op = await outbox.enqueue(owner, { kind, target, body: text, summary, fields });
    channel?.postMessage('changed');
    await render();
    drainer.drain();
    return op;
  })();
  stored.catch((e) => { error.textContent = `not queued: ${e.message}`; });
  return stored;
}

let refreshing = null;

/** Reads the orders from the server (when online and a token is set). */
async function refreshOrders() {
  if (!state.token || state.refused || !navigator.onLine) return;
  if (refreshing) return refreshing;
  refreshing = (async () => {
    try {
      const { orders, more } = await listOrders(state.token);
      state.orders = orders;
      state.more = more;
      state.ordersError = null;
    } catch (e) {
      if (e.status === 401) state.refused = e.message;
      state.ordersError = `could not read the orders: ${e.message}`;
    } finally {
      refreshing = null;
    }
    await render();
  })();
  return refreshing;
}

async function useToken(token) {
  state.token = token || null;
  state.refused = null;
  state.orders = [];
  if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
  else sessionStorage.removeItem(TOKEN_KEY);
  state.owner = state.token ? await ownerOf(state.token) : null;
  await render();
  await refreshOrders();
  drainer.drain({ force: true });
}

$('#token-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const input = $('input[name="token"]', event.target);
  useToken(input.value.trim());
  input.value = '';
});
$('#forget-token').addEventListener('click', () => useToken(null));

$('#order-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const form = event.target;
  const field = (name) => form.elements.namedItem(name);
  const fields = {
    item: field('item').value.trim(),
    quantity: field('quantity').value.trim(),
    price: field('price').value.trim(),
  };
  const stored = queue('create', null, () => createBody(fields), `${fields.item} × ${fields.quantity} at ${fields.price}`, fields);
  if (!stored) return;
  // Cleared in the tick it was read in, before anything is awaited: the
  // next order can be typed and submitted at once, and is its own.
  field('item').value = '';
  field('item').focus();
  // Not stored after all (IndexedDB refused it): the item comes back when
  // the field is still empty.
  stored.catch(() => { if (field('item').value === '') field('item').value = fields.item; });
});

$('#sync-now').addEventListener('click', () => { drainer.drain({ force: true }); refreshOrders(); });
$('#refresh-orders').addEventListener('click', () => refreshOrders());
$('#clear-finished').addEventListener('click', async () => {
  if (!state.owner) return;
  await outbox.clearFinished(state.owner);
  channel?.postMessage('changed');
  await render();
});

addEventListener('online', () => { render(); refreshOrders(); });
addEventListener('offline', () => render());
channel?.addEventListener('message', () => render());

let doneSeen = 0;
setInterval(async () => {
  // Refresh the server's orders when an operation of this user got done
  // (in this tab or another), and now and then in any case.
  const done = (await outbox.all()).filter((op) => op.owner === state.owner && op.state === outbox.DONE).length;
  if (done !== doneSeen) { doneSeen = done; refreshOrders(); }
}, 1_000);
setInterval(() => refreshOrders(), 15_000);

// The page keeps working offline once it has loaded: a service worker
// keeps its files (never an API answer) and serves them when the network
// is gone. The Trusted Types policy lets exactly that one script URL through.
async function registerServiceWorker() {
  const policy = self.trustedTypes?.createPolicy('orders-app', {
    createScriptURL: (url) => {
      if (url !== 'sw.js') throw new TypeError(`not the page's service worker: ${url}`);
      return url;
    },
  });
  return navigator.serviceWorker.register(policy ? policy.createScriptURL('sw.js') : 'sw.js', { scope: './' });
}
// Ask the browser not to evict the outbox under storage pressure (it may
// say no; an outbox in best-effort storage survives everything else).
navigator.storage?.persist?.().catch(() => {});

if ('serviceWorker' in navigator) {
  // Without it (a plain-HTTP host other than localhost, say) the page still
  // works while it stays open.
  registerServiceWorker().catch((error) => console.warn(`no offline copy of the page: ${error.message}`));
}

await useToken(state.token);
