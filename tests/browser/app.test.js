// The web client at /app/ in a real browser (Debian's Chromium, headless),
// against the release binary, on SQLite or PostgreSQL (BROWSER_TEST_DATABASE_URL).
// Run by scripts/browser-test.sh; each test has its own database, server,
// front and browser context. Every assertion is on what the server holds
// (read through the API with the token) and on what the front saw on the
// wire; every wait waits for a state of the page or an event.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  BACKEND, launchBrowser, outboxOf, queueOrder, screenshot, setUp, submitQuickly, waitForAll,
} from './harness.js';

const TEST = { timeout: 180_000 };
let browser;

before(async () => { browser = await launchBrowser(); });
after(async () => { await browser?.close(); });

/** Runs `body(t)` with a fresh set-up, tears it down, and checks the page broke no policy. */
async function withSetUp(body) {
  const t = await setUp(browser);
  try {
    await body(t);
    assert.deepEqual(t.problems, [], 'the page broke its policy or threw');
  } finally {
    await t.tearDown();
  }
}

/** Groups the front's mutations by key: key → entries. */
function byKey(proxy) {
  const keys = new Map();
  for (const entry of proxy.mutations()) keys.set(entry.key, [...(keys.get(entry.key) ?? []), entry]);
  return keys;
}

/** Each of `items` exactly once among the orders; the orders by item. */
function exactlyOnce(orders, items) {
  const byItem = new Map();
  for (const order of orders) byItem.set(order.item, [...(byItem.get(order.item) ?? []), order]);
  for (const item of items) assert.equal(byItem.get(item)?.length, 1, `one order "${item}": ${JSON.stringify(orders)}`);
  assert.equal(orders.length, items.length, `exactly ${items.length} orders: ${JSON.stringify(orders)}`);
  return new Map([...byItem].map(([item, [order]]) => [item, order]));
}

test(`${BACKEND}: the page and its files are served with a strict policy, and it needs no token to load`, TEST, async () => {
  await withSetUp(async (t) => {
    const res = await fetch(`${t.server.url}/app/`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^text\/html/);
    assert.match(res.headers.get('content-security-policy'), /script-src 'self'/);
    assert.equal(res.headers.get('x-content-type-options'), 'nosniff');

    const page = await t.open();
    assert.equal(await page.locator('input[name="token"]').count(), 1);
    for (const name of ['item', 'quantity', 'price']) {
      assert.equal(await page.locator(`#order-form input[name="${name}"]`).count(), 1, name);
    }
    // The token lives in this tab's sessionStorage only: not in localStorage, not in the URL.
    const stored = await page.evaluate(() => ({
      local: Object.keys(localStorage).length,
      session: Object.values(sessionStorage),
      href: location.href,
    }));
    assert.equal(stored.local, 0);
    assert.deepEqual(stored.session, [t.token]);
    assert.ok(!stored.href.includes(t.token));
    // An inline script the policy must refuse does not run (probed in a
    // page of its own: the refusal it logs is expected there).
    const probe = await t.context.newPage();
    await probe.goto(`${t.proxy.url}/app/`);
    const ran = await probe.evaluate(() => new Promise((resolve) => {
      document.addEventListener('securitypolicyviolation', (e) => resolve(`refused: ${e.violatedDirective}`), { once: true });
      const s = document.createElement('script');
      s.textContent = 'window.__inline = true';
      document.body.append(s);
    }).catch((e) => `refused: ${e.message}`));
    assert.match(ran, /refused/);
    // Numbers in answers keep the text the server wrote (no float on the way).
    const exact = await probe.evaluate(async () => (await import('/app/orders.js'))
      .parseExact('{"price":999998999990000.01,"quantity":2,"total_price":0.30}'));
    assert.deepEqual(exact, { price: '999998999990000.01', quantity: '2', total_price: '0.30' });
    assert.equal(await probe.evaluate(() => window.__inline ?? false), false);
  });
});

test(`${BACKEND}: three orders queued offline survive a reload and are created exactly once when the browser is back online`, TEST, async () => {
  await withSetUp(async (t) => {
    const page = await t.open();
    // Let the page's service worker take its files, so that the reload works offline.
    await page.evaluate(() => navigator.serviceWorker.ready.then(() => true));

    await t.context.setOffline(true);
    await page.waitForSelector('#network[data-online="false"]');
    const items = ['Widget', 'Gadget', 'Sprocket'];
    const prices = ['9.99', '0.10', '1234567.89'];
    for (const [i, item] of items.entries()) await queueOrder(page, { item, quantity: i + 1, price: prices[i] });
    await waitForAll(page, 3, 'queued');
    const queued = await outboxOf(page);
    assert.equal(new Set(queued.map((o) => o.key)).size, 3, 'a key of its own for each operation');
    assert.equal(t.proxy.mutations().length, 0, 'nothing is sent while offline');
    await screenshot(page, 'outbox-offline');

    await page.reload();
    await page.waitForSelector('body[data-token="set"]');
    await waitForAll(page, 3, 'queued');
    assert.deepEqual((await outboxOf(page)).map((o) => o.key), queued.map((o) => o.key), 'the reload kept every operation and its key');

    await t.context.setOffline(false);
    await waitForAll(page, 3, 'done');
    await page.waitForFunction(() => document.querySelectorAll('#orders [data-status="pending"]').length === 3);
    await screenshot(page, 'outbox-synced');

    const { orders, text } = await t.server.orders(t.token);
    const made = exactlyOnce(orders, items);
    assert.equal(made.get('Widget').quantity, 1);
    assert.match(text, /"price":9\.99[,}]/, 'the price typed is the price stored, to the cent');
    assert.match(text, /"price":1234567\.89[,}]/);
    const done = await outboxOf(page);
    for (const op of done) {
      const order = orders.find((o) => o.id === op.orderId);
      assert.ok(order, `operation ${op.seq} shows the id of the order it created`);
      assert.deepEqual(byKey(t.proxy).get(op.key).map((e) => e.status), [201], 'sent once, with its key');
    }
  });
});

test(`${BACKEND}: answers lost by the front and the server killed and restarted during a drain apply every operation exactly once`, TEST, async () => {
  await withSetUp(async (t) => {
    const page = await t.open();
    await t.context.setOffline(true);
    await page.waitForSelector('#network[data-online="false"]');
    const items = ['one', 'two', 'three', 'four'];
    for (const item of items) await queueOrder(page, { item, quantity: 1, price: '2.50' });
    // An update and a cancel of "one", queued behind its create.
    const one = page.locator('#orders [data-status="unsent"]', { hasText: 'one' });
    await one.locator('input[name="quantity"]').fill('7');
    await one.locator('button.update').click();
    await page.waitForSelector('[data-op-kind="update"]');
    await page.locator('#orders [data-status="unsent"]', { hasText: 'two' }).locator('button.cancel').click();
    await page.waitForSelector('[data-op-kind="cancel"]');
    await waitForAll(page, 6, 'queued');

    // The first answer to every key is lost (the server did answer); the
    // third request is held until the server has been killed, so it finds
    // no server, which then comes back; the first answer after that, already
    // committed, is lost together with the server, killed again.
    const firstAnswer = new Set();
    let restarted = false;
    let lostWithTheServer = null;
    t.proxy.onRequest = async (entry) => {
      if (entry.key && t.proxy.mutations().indexOf(entry) === 2) await t.server.kill();
    };
    t.proxy.onAnswer = async (entry) => {
      if (!entry.key) return 'pass';
      if (restarted && !lostWithTheServer) {
        lostWithTheServer = entry;
        await t.server.kill();
        await t.server.start();
        return 'drop';
      }
      if (!firstAnswer.has(entry.key)) { firstAnswer.add(entry.key); return 'drop'; }
      return 'pass';
    };

    await t.context.setOffline(false);
    await t.proxy.waitFor('a send to find the server gone', (e) => e.outcome === 'bad gateway', 60_000);
    await t.server.start();
    restarted = true;
    await waitForAll(page, 6, 'done', 120_000);

    const { orders } = await t.server.orders(t.token);
    const made = exactlyOnce(orders, items);
    assert.equal(made.get('one').quantity, 7, 'the update reached "one"');
    assert.equal(made.get('one').status, 'pending');
    assert.equal(made.get('two').status, 'cancelled', 'the cancel reached "two"');
    assert.equal(made.get('three').status, 'pending');
    assert.deepEqual(t.proxy.overlaps, [], 'no key was in flight twice at once');
    const ops = await outboxOf(page);
    const keys = byKey(t.proxy);
    assert.equal(keys.size, 6, 'every operation was sent under its own key, and no other key was sent');
    for (const op of ops) {
      const sent = keys.get(op.key);
      assert.ok(sent.length >= 2, `operation ${op.seq} lost its first answer and was sent again with its key`);
      assert.ok(sent.every((e) => e.method === sent[0].method && e.body === sent[0].body), 'every attempt is the same request');
    }
    assert.ok(t.proxy.mutations().some((e) => e.outcome === 'bad gateway'), 'a send found the server gone');
    assert.equal(t.server.starts, 3, 'the server was killed twice during the drain, and came back');
    const lost = lostWithTheServer;
    assert.equal(lost.outcome, 'dropped');
    assert.ok(lost.status < 300, `the lost answer was a success: ${lost.status}`);
    assert.ok(keys.get(lost.key).some((e) => e.n > lost.n && e.replayed), 'the answer lost with the server is replayed by the restarted one');
  });
});

test(`${BACKEND}: a reload in the middle of a send sends the operation again with its key, and it is created once`, TEST, async () => {
  await withSetUp(async (t) => {
    const page = await t.open();
    // The server executes the first send; its answer is held until the page is gone.
    let release;
    const held = new Promise((resolve) => { release = resolve; });
    t.proxy.onAnswer = async (entry) => (entry.key && t.proxy.mutations().indexOf(entry) === 0 ? held : 'pass');

    await queueOrder(page, { item: 'Interrupted', quantity: 2, price: '3.00' });
    await page.waitForSelector('[data-op-state="sending"]');
    const [sending] = await outboxOf(page);
    const first = await t.proxy.waitFor('the first send to be answered by the server', (e) => e.key === sending.key && e.status === 201);
    await page.reload();
    release('pass');

    await page.waitForSelector('body[data-token="set"]');
    await waitForAll(page, 1, 'done');
    const sends = byKey(t.proxy).get(sending.key);
    assert.equal(sends.length, 2, 'sent twice, both times with the key it was stored with');
    assert.equal(sends[0], first);
    assert.equal(sends[1].status, 200);
    assert.equal(sends[1].replayed, true, 'the second send is answered by the server\'s replay');
    const { orders } = await t.server.orders(t.token);
    exactlyOnce(orders, ['Interrupted']);
    const [done] = await outboxOf(page);
    assert.equal(done.orderId, orders[0].id);
  });
});

test(`${BACKEND}: a tab closed in the middle of a send leaves the operation to another tab, which sends it with its key`, TEST, async () => {
  await withSetUp(async (t) => {
    const a = await t.open('tab a');
    const b = await t.open('tab b');
    let release;
    const held = new Promise((resolve) => { release = resolve; });
    t.proxy.onAnswer = async (entry) => (entry.key && t.proxy.mutations().indexOf(entry) === 0 ? held : 'pass');

    await queueOrder(a, { item: 'Orphaned', quantity: 1, price: '8.00' });
    await a.waitForSelector('[data-op-state="sending"]');
    const [sending] = await outboxOf(a);
    await t.proxy.waitFor('the first send to be answered by the server', (e) => e.key === sending.key && e.status === 201);
    await a.close();
    release('pass');

    // Tab b takes the lock the closed tab held, finds the operation
    // `sending` and sends it again, with the same key.
    await waitForAll(b, 1, 'done');
    const sends = byKey(t.proxy).get(sending.key);
    assert.deepEqual(sends.map((e) => [e.status, e.replayed]), [[201, false], [200, true]]);
    const { orders } = await t.server.orders(t.token);
    exactlyOnce(orders, ['Orphaned']);
  });
});

test(`${BACKEND}: a send that gets no answer within 10 s is abandoned and sent again with its key`, TEST, async () => {
  await withSetUp(async (t) => {
    const page = await t.open();
    // The server executes the first send; its answer is held until the browser gives up on it.
    t.proxy.onAnswer = async (entry) => (entry.key && t.proxy.mutations().indexOf(entry) === 0 ? entry.gone.then(() => 'pass') : 'pass');

    await queueOrder(page, { item: 'Slow', quantity: 1, price: '1.00' });
    await page.waitForSelector('[data-op-state="sending"]');
    await waitForAll(page, 1, 'done', 40_000);

    const [op] = await outboxOf(page);
    const sends = byKey(t.proxy).get(op.key);
    assert.deepEqual(sends.map((e) => [e.status, e.replayed, e.outcome]), [[201, false, 'browser gone'], [200, true, 'passed']]);
    assert.ok(sends[1].at - sends[0].at >= 10_000, `sent again only after the 10 s timeout (${sends[1].at - sends[0].at} ms)`);
    const { orders } = await t.server.orders(t.token);
    exactlyOnce(orders, ['Slow']);
  });
});

test(`${BACKEND}: the page lists the newest 100 orders and says there are more`, TEST, async () => {
  await withSetUp(async (t) => {
    for (let i = 1; i <= 101; i += 1) {
      const res = await fetch(`${t.server.url}/v1/orders`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${t.token}`, 'Idempotency-Key': `seed-${i}`, 'Content-Type': 'application/json' },
        body: `{"item":"seeded ${i}","quantity":1,"price":1}`,
      });
      assert.equal(res.status, 201, await res.text());
    }
    const page = await t.open();
    await page.waitForFunction(() => document.querySelectorAll('#orders [data-order-id]').length === 100);
    assert.equal(await page.locator('#orders-state').textContent(), 'the newest 100');
    assert.equal(await page.locator('#orders .order-item').first().textContent(), 'seeded 101');
  });
});

test(`${BACKEND}: two tabs draining at once send every operation once`, TEST, async () => {
  await withSetUp(async (t) => {
    const a = await t.open('tab a');
    const b = await t.open('tab b');
    await t.context.setOffline(true);
    await a.waitForSelector('#network[data-online="false"]');
    await b.waitForSelector('#network[data-online="false"]');
    const items = [];
    for (let i = 1; i <= 3; i += 1) {
      items.push(`a-${i}`, `b-${i}`);
      await queueOrder(a, { item: `a-${i}`, quantity: i, price: '1.25' });
      await queueOrder(b, { item: `b-${i}`, quantity: i, price: '1.25' });
    }
    // Both tabs see the one outbox.
    await b.waitForFunction(() => document.querySelectorAll('[data-op-state="queued"]').length === 6);
    await a.waitForFunction(() => document.querySelectorAll('[data-op-state="queued"]').length === 6);

    // Both hear `online` at once and try to drain.
    await t.context.setOffline(false);
    await waitForAll(a, 6, 'done');
    await waitForAll(b, 6, 'done');

    const { orders } = await t.server.orders(t.token);
    exactlyOnce(orders, items);
    assert.deepEqual(t.proxy.overlaps, [], 'no key was in flight twice at once');
    const keys = byKey(t.proxy);
    assert.equal(keys.size, 6);
    for (const [key, sends] of keys) assert.deepEqual(sends.map((e) => e.status), [201], `key ${key} sent exactly once`);
  });
});

/**
 * Two tabs each submit orders as fast as a script can (three in one tick,
 * then three each typed while the one before is being stored); `online`
 * says whether the browser is online meanwhile. Each order must be queued
 * once, under a key of its own, sent exactly once, and made once.
 */
async function quickSubmits(t, online) {
  const a = await t.open('tab a');
  const b = await t.open('tab b');
  if (!online) {
    await t.context.setOffline(true);
    await a.waitForSelector('#network[data-online="false"]');
    await b.waitForSelector('#network[data-online="false"]');
  }
  const orders = (tab) => ({
    burst: [1, 2, 3].map((i) => ({ item: `${tab} burst ${i}`, quantity: i, price: `${i}.25` })),
    typed: [1, 2, 3].map((i) => ({ item: `${tab} typed ${i}`, quantity: i, price: `${i}.50` })),
  });
  const [mine, theirs] = [orders('a'), orders('b')];
  const items = [mine, theirs].flatMap((o) => [...o.burst, ...o.typed].map((order) => order.item));
  const [fromA, fromB] = await Promise.all([submitQuickly(a, mine), submitQuickly(b, theirs)]);
  assert.deepEqual([...fromA, ...fromB].sort(), [...items].sort(), 'every order typed was submitted with its own item');

  const wanted = online ? 'done' : 'queued';
  await waitForAll(a, items.length, wanted, 30_000).catch(() => {});
  const ops = await outboxOf(a);
  const queued = ops.map((op) => /create (.+?) × /.exec(op.text)?.[1] ?? op.text);
  assert.deepEqual([...queued].sort(), [...items].sort(), `each order queued once: ${JSON.stringify(ops.map((o) => o.text))}`);
  assert.equal(new Set(ops.map((op) => op.key)).size, items.length, 'a key of its own for each');
  if (!online) {
    assert.equal(t.proxy.mutations().length, 0, 'nothing is sent while offline');
    await t.context.setOffline(false);
  }
  await waitForAll(a, items.length, 'done');
  await waitForAll(b, items.length, 'done');

  const { orders: made } = await t.server.orders(t.token);
  exactlyOnce(made, items);
  assert.deepEqual(t.proxy.overlaps, [], 'no key was in flight twice at once');
  const keys = byKey(t.proxy);
  assert.equal(keys.size, items.length, 'every operation was sent under its own key, and no other key was sent');
  for (const [key, sends] of keys) assert.deepEqual(sends.map((e) => e.status), [201], `key ${key} sent exactly once`);
}

test(`${BACKEND}: orders submitted one right after another offline, in two tabs, are each queued once and created exactly once`, TEST, async () => {
  await withSetUp((t) => quickSubmits(t, false));
});

test(`${BACKEND}: orders submitted one right after another online, in two tabs, are each queued once and sent exactly once`, TEST, async () => {
  await withSetUp((t) => quickSubmits(t, true));
});

test(`${BACKEND}: an update queued behind its offline create is applied to the order that create made`, TEST, async () => {
  await withSetUp(async (t) => {
    const page = await t.open();
    // Another order already on the server, which the update must not touch.
    await queueOrder(page, { item: 'already there', quantity: 1, price: '5' });
    await waitForAll(page, 1, 'done');

    await t.context.setOffline(true);
    await page.waitForSelector('#network[data-online="false"]');
    await queueOrder(page, { item: 'offline', quantity: 1, price: '4.20' });
    const row = page.locator('#orders [data-status="unsent"]', { hasText: 'offline' });
    await row.locator('input[name="quantity"]').fill('9');
    await row.locator('input[name="price"]').fill('4.35');
    await row.locator('button.update').click();
    await page.waitForSelector('[data-op-kind="update"][data-op-state="queued"]');

    await t.context.setOffline(false);
    await waitForAll(page, 3, 'done');

    const { orders, text } = await t.server.orders(t.token);
    const made = exactlyOnce(orders, ['already there', 'offline']);
    assert.equal(made.get('offline').quantity, 9);
    assert.equal(made.get('already there').quantity, 1);
    assert.match(text, /"price":4\.35[,}]/);
    const ops = await outboxOf(page);
    const create = ops.find((o) => o.kind === 'create' && o.text.includes('offline'));
    const update = ops.find((o) => o.kind === 'update');
    assert.equal(update.orderId, made.get('offline').id, 'the update went to the id its create was answered with');
    assert.equal(create.orderId, update.orderId);
    const [patch] = byKey(t.proxy).get(update.key);
    assert.equal(patch.method, 'PATCH');
    assert.equal(patch.path, `/v1/orders/${made.get('offline').id}`);
    assert.equal(patch.body, '{"quantity":9,"price":4.35}', 'the body is the exact text typed');
  });
});

test(`${BACKEND}: an operation the server refuses fails with the server's reason and is never sent again`, TEST, async () => {
  await withSetUp(async (t) => {
    const page = await t.open();
    await queueOrder(page, { item: 'Too precise', quantity: 1, price: '9.999' });
    await page.waitForSelector('[data-op-state="failed"]');
    const [failed] = await outboxOf(page);
    assert.match(failed.text, /422/);
    assert.match(failed.text, /price/i, `the reason names the field: ${failed.text}`);
    // Sync again (and let the timer run past a drain): it is not sent again.
    await page.click('#sync-now');
    await queueOrder(page, { item: 'Fine', quantity: 1, price: '9.99' });
    await page.waitForSelector('[data-op-state="done"]');
    assert.equal(byKey(t.proxy).get(failed.key).length, 1, 'a refused operation is sent once');
    const { orders } = await t.server.orders(t.token);
    exactlyOnce(orders, ['Fine']);
    // The outbox in IndexedDB holds no token.
    const dump = await page.evaluate(() => new Promise((resolve, reject) => {
      const open = indexedDB.open('orders-api-outbox');
      open.onsuccess = () => {
        const req = open.result.transaction('operations').objectStore('operations').getAll();
        req.onsuccess = () => resolve(JSON.stringify(req.result));
        req.onerror = () => reject(req.error);
      };
      open.onerror = () => reject(open.error);
    }));
    assert.ok(!dump.includes(t.token), 'the token is not in the outbox');
    assert.ok(dump.includes(failed.key));

    // Clearing the answered operations removes them; nothing is sent.
    const sent = t.proxy.mutations().length;
    await page.click('#clear-finished');
    await page.waitForFunction(() => document.querySelectorAll('[data-op-state]').length === 0);
    assert.equal(t.proxy.mutations().length, sent);
  });
});

test(`${BACKEND}: an operation changed in IndexedDB so that it no longer reads back fails unsent`, TEST, async () => {
  await withSetUp(async (t) => {
    const page = await t.open();
    await t.context.setOffline(true);
    await page.waitForSelector('#network[data-online="false"]');
    await queueOrder(page, { item: 'Tampered', quantity: 1, price: '1.00' });
    await queueOrder(page, { item: 'Intact', quantity: 1, price: '1.00' });
    // Another script of this origin (or devtools) rewrites the first operation's key and kind.
    await page.evaluate(() => new Promise((resolve, reject) => {
      const open = indexedDB.open('orders-api-outbox');
      open.onsuccess = () => {
        const store = open.result.transaction('operations', 'readwrite').objectStore('operations');
        const get = store.getAll();
        get.onsuccess = () => {
          const [first] = get.result;
          first.key = 'x\r\nInjected: header';
          store.put(first).onsuccess = () => resolve();
        };
        get.onerror = () => reject(get.error);
      };
      open.onerror = () => reject(open.error);
    }));

    await t.context.setOffline(false);
    await page.waitForSelector('[data-op-state="failed"]');
    await page.waitForSelector('[data-op-state="done"]');
    const ops = await outboxOf(page);
    assert.match(ops[0].text, /does not read back/);
    assert.equal(t.proxy.mutations().length, 1, 'only the intact operation was sent');
    const { orders } = await t.server.orders(t.token);
    exactlyOnce(orders, ['Intact']);
  });
});
