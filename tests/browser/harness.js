// What the browser tests stand on: the release binary as a process (killed
// with SIGKILL and started again when a test says so), a fresh database per
// test (SQLite or PostgreSQL), a front on 127.0.0.1 that forwards every
// request and can lose answers or hold them, and Debian's Chromium driven by
// playwright-core. Every wait here waits for an event (a log line, a
// request, an exit), bounded by a deadline; none sleeps.

import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { chromium } from 'playwright-core';

export const BIN = process.env.ORDERS_API_BIN;
/** A PostgreSQL URL whose user may create databases; unset: SQLite. */
export const PG_URL = process.env.BROWSER_TEST_DATABASE_URL || '';
export const BACKEND = PG_URL ? 'postgres' : 'sqlite';
export const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
/** Where the screenshots go (scripts/browser-test.sh: a temp dir, or docs/img to refresh them). */
export const SCREENSHOTS = process.env.BROWSER_TEST_SCREENSHOTS || '';

if (!BIN) throw new Error('ORDERS_API_BIN must name the release binary (scripts/browser-test.sh sets it)');

const work = mkdtempSync(path.join(tmpdir(), 'orders-api-browser-'));
process.on('exit', () => rmSync(work, { recursive: true, force: true }));

/** Resolves with `promise`, or rejects after `ms` saying what was awaited. */
export function within(ms, what, promise) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Every server process started, so that none outlives the tests. */
const children = new Set();
process.on('exit', () => { for (const child of children) child.kill('SIGKILL'); });

/**
 * A database no test has used: a SQLite file in a temp dir, or a new
 * PostgreSQL database (`migrate` creates it); `drop()` removes it.
 */
export function freshDatabase() {
  const name = `browser_${randomUUID().replaceAll('-', '')}`;
  if (!PG_URL) return { url: `sqlite://${path.join(work, `${name}.db`)}`, drop() {} };
  const url = new URL(PG_URL);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop() {
      execFileSync('psql', [PG_URL, '-qc', `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`], { stdio: 'ignore' });
    },
  };
}

function run(args, databaseUrl) {
  return execFileSync(BIN, args, {
    env: { ...process.env, DATABASE_URL: databaseUrl, RUST_LOG: 'warn' },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  }).trim();
}

/** The server: `orders-api serve` on a port of its own choosing. */
export class Server {
  constructor(databaseUrl) {
    this.databaseUrl = databaseUrl;
    this.child = null;
    this.address = null;
    /** How many times it was started. */
    this.starts = 0;
  }

  /** Migrates a new database and creates a key for `user`: its token. */
  static prepare(databaseUrl, user) {
    run(['migrate'], databaseUrl);
    return run(['keys', 'create', user], databaseUrl);
  }

  /** Starts it; resolves once it logged the address it listens on. */
  async start() {
    const child = spawn(BIN, ['serve', '--bind', '127.0.0.1:0'], {
      env: { ...process.env, DATABASE_URL: this.databaseUrl, RUST_LOG: 'info', LOG_FORMAT: 'text' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    this.child = child;
    children.add(child);
    child.once('exit', () => children.delete(child));
    this.starts += 1;
    this.exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    let log = '';
    this.address = await within(30_000, 'the server to listen', new Promise((resolve, reject) => {
      child.stderr.setEncoding('utf8');
      child.stderr.on('data', (chunk) => {
        log += chunk;
        const found = /listening on http:\/\/([0-9.]+:[0-9]+)/.exec(log);
        if (found) resolve(found[1]);
      });
      child.once('exit', (code) => reject(new Error(`the server exited (${code}) before listening:\n${log}`)));
    }));
    const [host, port] = this.address.split(':');
    this.host = host;
    this.port = Number(port);
    this.url = `http://${this.address}`;
    return this;
  }

  /** SIGKILL: no shutdown, nothing flushed that was not already durable. */
  async kill() {
    this.child.kill('SIGKILL');
    await within(10_000, 'the killed server to exit', this.exited);
  }

  async stop() {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.child.kill('SIGTERM');
    await within(40_000, 'the server to stop', this.exited);
  }

  /** Every order of the token's user, from the API (all pages), as parsed JSON and as text. */
  async orders(token) {
    const all = [];
    const texts = [];
    let cursor = null;
    for (;;) {
      const query = new URLSearchParams({ limit: '100' });
      if (cursor) query.set('cursor', cursor);
      const res = await fetch(`${this.url}/v1/orders?${query}`, { headers: { Authorization: `Bearer ${token}` } });
      const text = await res.text();
      if (res.status !== 200) throw new Error(`GET /v1/orders: ${res.status} ${text}`);
      texts.push(text);
      const page = JSON.parse(text);
      all.push(...page.data);
      if (!page.next_cursor) return { orders: all, text: texts.join('\n') };
      cursor = page.next_cursor;
    }
  }
}

/**
 * The front the browser talks to: it forwards every request to the server
 * (whose address may change when it is restarted) and logs each one with
 * its Idempotency-Key. A test may lose the answer of a request (the server
 * answered; the browser's connection is cut instead) or run code before a
 * request is forwarded or before its answer is passed on.
 */
export class Proxy {
  constructor(server) {
    this.upstream = server;
    this.log = [];
    this.inFlight = new Map();
    this.overlaps = [];
    /** (entry) => 'drop' | 'pass' | Promise of either, before the answer is passed on. */
    this.onAnswer = null;
    /** (entry) => Promise, before the request is forwarded. */
    this.onRequest = null;
    this.waiters = [];
  }

  async start() {
    this.http = http.createServer((req, res) => this.handle(req, res));
    this.http.keepAliveTimeout = 1_000;
    await new Promise((resolve) => this.http.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${this.http.address().port}`;
    return this;
  }

  async close() {
    this.http.closeAllConnections();
    await new Promise((resolve) => this.http.close(resolve));
  }

  /** The logged requests that carried an Idempotency-Key (the mutations). */
  mutations() {
    return this.log.filter((e) => e.key);
  }

  /** Resolves with the first logged request for which `test(entry)` holds (now or later). */
  waitFor(what, test, ms = 30_000) {
    const found = this.log.find(test);
    if (found) return Promise.resolve(found);
    return within(ms, what, new Promise((resolve) => this.waiters.push({ test, resolve })));
  }

  notify(entry) {
    this.waiters = this.waiters.filter((w) => {
      if (!w.test(entry)) return true;
      w.resolve(entry);
      return false;
    });
  }

  async handle(req, res) {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = Buffer.concat(chunks);
    const key = req.headers['idempotency-key'] ?? null;
    const entry = { n: this.log.length + 1, at: Date.now(), method: req.method, path: req.url, key, body: body.toString('utf8'), status: null, outcome: 'pending' };
    /** Resolves when the browser closed this request's connection. */
    entry.gone = new Promise((resolve) => {
      if (req.socket.destroyed) resolve();
      else req.socket.once('close', resolve);
    });
    this.log.push(entry);
    if (key) {
      if (this.inFlight.has(key)) this.overlaps.push(key);
      this.inFlight.set(key, (this.inFlight.get(key) ?? 0) + 1);
    }
    try {
      this.notify(entry);
      if (this.onRequest) await this.onRequest(entry);
      const answer = await this.forward(req, body).catch((error) => ({ error }));
      if (answer.error) {
        entry.outcome = 'bad gateway';
        entry.status = 502;
        this.notify(entry);
        if (!res.destroyed) res.writeHead(502, { 'content-type': 'text/plain' }).end('the server did not answer');
        return;
      }
      entry.status = answer.status;
      entry.replayed = answer.headers['idempotent-replayed'] === 'true';
      this.notify(entry); // answered by the server, not yet passed on
      const verdict = this.onAnswer ? await this.onAnswer(entry) : 'pass';
      if (verdict === 'drop') {
        entry.outcome = 'dropped';
        req.socket.destroy();
      } else if (res.destroyed || req.socket.destroyed) {
        entry.outcome = 'browser gone';
      } else {
        entry.outcome = 'passed';
        const headers = { ...answer.headers };
        delete headers['transfer-encoding'];
        delete headers.connection;
        delete headers['keep-alive'];
        headers['content-length'] = String(answer.body.length);
        res.writeHead(answer.status, headers).end(answer.body);
      }
      this.notify(entry);
    } finally {
      if (key) {
        const left = this.inFlight.get(key) - 1;
        if (left > 0) this.inFlight.set(key, left);
        else this.inFlight.delete(key);
      }
    }
  }

  forward(req, body) {
    const { host, port } = this.upstream;
    return new Promise((resolve, reject) => {
      const headers = { ...req.headers, host: `${host}:${port}`, 'content-length': String(body.length) };
      delete headers.connection;
      delete headers['keep-alive'];
      const upstream = http.request({ host, port, method: req.method, path: req.url, headers, agent: false }, (answer) => {
        const parts = [];
        answer.on('data', (c) => parts.push(c));
        answer.on('end', () => resolve({ status: answer.statusCode, headers: answer.headers, body: Buffer.concat(parts) }));
        answer.on('error', reject);
      });
      upstream.on('error', reject);
      upstream.end(body);
    });
  }
}

/** Debian's Chromium, headless, with a fresh profile (playwright-core's own temp dir), no download. */
export function launchBrowser() {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--no-first-run',
    ],
    timeout: 60_000,
  });
}

/**
 * Everything one test needs: a database, the server, the front, a browser
 * context (its own IndexedDB, locks and service workers), alice's token.
 */
export async function setUp(browser) {
  const database = freshDatabase();
  const databaseUrl = database.url;
  const token = Server.prepare(databaseUrl, 'alice');
  const server = await new Server(databaseUrl).start();
  const proxy = await new Proxy(server).start();
  const context = await browser.newContext({ viewport: { width: 900, height: 900 } });
  context.setDefaultTimeout(30_000);
  const problems = [];
  const watch = (page, name) => {
    page.on('pageerror', (error) => problems.push(`${name}: uncaught ${error.message}`));
    page.on('console', (message) => {
      const text = message.text();
      if (/Content Security Policy|Trusted Type|TrustedScriptURL|TrustedHTML/i.test(text)) problems.push(`${name}: ${text}`);
    });
    return page;
  };
  const t = {
    databaseUrl, token, server, proxy, context, problems, pages: 0,
    /** A new tab on /app/ through the front, with alice's token entered. */
    async open(name = `tab ${++t.pages}`) {
      const page = watch(await context.newPage(), name);
      await page.goto(`${proxy.url}/app/`);
      await signIn(page, token);
      return page;
    },
    async tearDown() {
      await context.close();
      await proxy.close();
      await server.stop();
      database.drop();
    },
  };
  return t;
}

/** Enters `token` and waits until the page uses it. */
export async function signIn(page, token) {
  await page.fill('input[name="token"]', token);
  await page.click('#token-form button[type="submit"]');
  await page.waitForSelector('body[data-token="set"]');
}

/** Queues one order through the form. */
export async function queueOrder(page, { item, quantity, price }) {
  const before = await page.locator('[data-op-kind="create"]').count();
  await page.fill('input[name="item"]', item);
  await page.fill('#order-form input[name="quantity"]', String(quantity));
  await page.fill('#order-form input[name="price"]', String(price));
  await page.click('#order-form button[type="submit"]');
  await page.waitForFunction((n) => document.querySelectorAll('[data-op-kind="create"]').length > n, before);
}

/** The outbox as the page shows it. */
export function outboxOf(page) {
  return page.$$eval('[data-op-state]', (nodes) => nodes.map((n) => ({
    seq: Number(n.dataset.opSeq),
    state: n.dataset.opState,
    kind: n.dataset.opKind,
    key: n.dataset.opKey,
    orderId: n.dataset.orderId ?? null,
    attempts: Number(n.dataset.opAttempts ?? 0),
    text: n.textContent,
  })).sort((a, b) => a.seq - b.seq));
}

/** Waits until the page shows `n` operations, every one in `state`. */
export async function waitForAll(page, n, state, ms = 60_000) {
  await page.waitForFunction(([count, wanted]) => {
    const ops = document.querySelectorAll('[data-op-state]');
    return ops.length === count && [...ops].every((o) => o.dataset.opState === wanted);
  }, [n, state], { timeout: ms });
}

/** Takes a screenshot when BROWSER_TEST_SCREENSHOTS names a folder. */
export async function screenshot(page, name) {
  if (!SCREENSHOTS) return;
  await page.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

/**
 * Submits `orders` through the form as fast as a script can, in the page
 * itself: `burst` are each typed and submitted in one tick, one right after
 * another; then each of `typed` is typed the moment the order before it was
 * submitted (while the page is still storing that one) and submitted as soon
 * as the page shows the one before it in its outbox. Resolves with the items
 * the form let through (a submit the browser's own validation stopped, an
 * emptied required field, is not among them) once the outbox shows each of
 * them, or after 15 s.
 */
export function submitQuickly(page, { burst = [], typed = [] }) {
  return page.evaluate(async ({ burst, typed }) => {
    const form = document.querySelector('#order-form');
    const field = (name) => form.elements.namedItem(name);
    const type = ({ item, quantity, price }) => {
      field('item').value = item;
      field('quantity').value = String(quantity);
      field('price').value = String(price);
    };
    const submitted = [];
    const note = () => submitted.push(field('item').value);
    form.addEventListener('submit', note, { capture: true });
    const shown = (item) => [...document.querySelectorAll('[data-op-kind="create"] .op-what')]
      .some((node) => node.textContent.startsWith(`create ${item} ×`));
    const deadline = Date.now() + 15_000;
    const turn = () => new Promise((resolve) => { setTimeout(resolve, 0); });
    const allShown = async () => {
      while (!submitted.every(shown) && Date.now() < deadline) await turn();
    };
    try {
      for (const order of burst) { type(order); form.requestSubmit(); }
      if (typed.length > 0) type(typed[0]);
      for (let i = 0; i < typed.length; i += 1) {
        form.requestSubmit();
        if (i + 1 < typed.length) {
          // The next order is typed while this one is being stored, and
          // submitted as soon as this one is in the outbox.
          type(typed[i + 1]);
          await allShown();
        }
      }
      await allShown();
      return submitted;
    } finally {
      form.removeEventListener('submit', note, { capture: true });
    }
  }, { burst, typed });
}
