// The orders application as a Lambda-style handler made idempotent by
// @aws-lambda-powertools/idempotency (makeIdempotent, its Redis/Valkey
// CachePersistenceLayer), behind a small HTTP wrapper that turns each
// request into an API Gateway (HTTP API) event and the handler's result
// back into an answer.
//
//     REDIS_URL=redis://127.0.0.1:6379 node powertools_app.js PORT
//
// The idempotency record's key is the Idempotency-Key header with the
// caller, the method and the path (a request without the header is
// refused: throwOnNoIdempotencyKey); the raw body is the payload checked
// on a replay (payloadValidationJmesPath), unless FIELD_PAYLOAD_VALIDATION
// is `off` (the library's default: no payload check). POST and PATCH go
// through it.

'use strict';

const http = require('node:http');
const { createClient } = require('@redis/client');
const { makeIdempotent, IdempotencyConfig } = require('@aws-lambda-powertools/idempotency');
const { CachePersistenceLayer } = require('@aws-lambda-powertools/idempotency/cache');

// A create takes FIELD_CREATE_MS milliseconds (default 50), as a database
// write does, so that concurrent duplicates overlap.
const CREATE_MS = Number(process.env.FIELD_CREATE_MS ?? 50);
const USERS = { 'Bearer field-a': 'a', 'Bearer field-b': 'b' };
const orders = new Map(); // id -> { user, order }
let nextId = 1;

// JSON with every number kept as its text, so that `1.0` and `1e2` are not
// taken for the integer they equal.
function parseJson(text) {
  let at = 0;
  const fail = () => {
    throw new SyntaxError(`not JSON at ${at}`);
  };
  const space = () => {
    while (/[ \t\r\n]/.test(text[at] ?? '')) at += 1;
  };
  function value() {
    space();
    const c = text[at];
    if (c === '{') {
      at += 1;
      const object = {};
      space();
      if (text[at] === '}') {
        at += 1;
        return object;
      }
      for (;;) {
        space();
        if (text[at] !== '"') fail();
        const name = string();
        space();
        if (text[at] !== ':') fail();
        at += 1;
        object[name] = value();
        space();
        if (text[at] === ',') at += 1;
        else if (text[at] === '}') {
          at += 1;
          return object;
        } else fail();
      }
    }
    if (c === '[') {
      at += 1;
      const array = [];
      space();
      if (text[at] === ']') {
        at += 1;
        return array;
      }
      for (;;) {
        array.push(value());
        space();
        if (text[at] === ',') at += 1;
        else if (text[at] === ']') {
          at += 1;
          return array;
        } else fail();
      }
    }
    if (c === '"') return string();
    for (const [word, meaning] of [['true', true], ['false', false], ['null', null]]) {
      if (text.startsWith(word, at)) {
        at += word.length;
        return meaning;
      }
    }
    const number = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(at));
    if (!number) fail();
    at += number[0].length;
    return { number: number[0] };
  }
  function string() {
    const match = /^"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/.exec(text.slice(at));
    if (!match) fail();
    at += match[0].length;
    return JSON.parse(match[0]);
  }
  const result = value();
  space();
  if (at !== text.length) fail();
  return result;
}

const isNumber = (v) => v !== null && typeof v === 'object' && typeof v.number === 'string';

function validate(data, partial) {
  const errors = [];
  const fields = {};
  if (data === null || typeof data !== 'object' || Array.isArray(data) || isNumber(data)) {
    return { errors: ['the body must be a JSON object'], fields };
  }
  if ('item' in data || !partial) {
    if (typeof data.item !== 'string' || data.item.trim() === '') {
      errors.push('item: a non-empty string is required');
    } else fields.item = data.item;
  }
  if ('quantity' in data || !partial) {
    const q = data.quantity;
    if (!isNumber(q) || !/^[1-9]\d*$/.test(q.number) || !Number.isSafeInteger(Number(q.number))) {
      errors.push('quantity: an integer >= 1 is required');
    } else fields.quantity = Number(q.number);
  }
  if ('price' in data || !partial) {
    const p = data.price;
    const ok = isNumber(p) && !p.number.startsWith('-') && hasCents(p.number);
    if (!ok) errors.push('price: a number >= 0 with at most two decimals is required');
    else fields.price = Number(p.number);
  }
  if (partial && errors.length === 0 && Object.keys(fields).length === 0) {
    errors.push('nothing to change');
  }
  return { errors, fields };
}

// At most two decimals once the exponent is applied.
function hasCents(text) {
  const [mantissa, exponent = '0'] = text.split(/[eE]/);
  const decimals = (mantissa.split('.')[1] ?? '').replace(/0+$/, '').length;
  return decimals - Number(exponent) <= 2 && Number.isFinite(Number(text));
}

const answer = (statusCode, payload, headers = {}) => ({
  statusCode,
  headers: payload === undefined ? headers : { 'content-type': 'application/json', ...headers },
  body: payload === undefined ? '' : JSON.stringify(payload),
});
const NOT_FOUND = () => answer(404, { error: 'not found' });

function readBody(event, partial) {
  const type = (event.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase();
  if (type !== 'application/json') {
    return { refusal: answer(415, { error: 'the body must be application/json' }) };
  }
  let data;
  try {
    data = parseJson(event.body ?? '');
  } catch {
    return { refusal: answer(422, { error: 'invalid order', errors: ['the body is not JSON'] }) };
  }
  const { errors, fields } = validate(data, partial);
  if (errors.length > 0) return { refusal: answer(422, { error: 'invalid order', errors }) };
  return { fields };
}

// The application: a Lambda handler over an API Gateway HTTP API event.
async function handler(event) {
  const method = event.requestContext.http.method;
  const path = event.rawPath.replace(/\/+$/, '') || '/';
  const user = USERS[event.headers.authorization ?? ''];
  if (path !== '/orders' && !path.startsWith('/orders/')) return NOT_FOUND();
  if (user === undefined) return answer(401, { error: 'a valid bearer token is required' });
  if (path === '/orders') {
    if (method === 'GET') {
      return answer(200, [...orders.values()].filter((o) => o.user === user).map((o) => o.order));
    }
    if (method !== 'POST') return answer(405, { error: 'method not allowed' }, { allow: 'GET, POST' });
    const { refusal, fields } = readBody(event, false);
    if (refusal) return refusal;
    await new Promise((resolve) => setTimeout(resolve, CREATE_MS));
    const order = { id: nextId, ...fields };
    nextId += 1;
    orders.set(order.id, { user, order });
    return answer(201, order, { location: `/orders/${order.id}` });
  }
  const tail = path.slice('/orders/'.length);
  const found = /^\d+$/.test(tail) ? orders.get(Number(tail)) : undefined;
  if (found === undefined || found.user !== user) return NOT_FOUND();
  if (method === 'GET') return answer(200, found.order);
  if (method === 'DELETE') {
    orders.delete(found.order.id);
    return answer(204);
  }
  if (method === 'PATCH') {
    const { refusal, fields } = readBody(event, true);
    if (refusal) return refusal;
    Object.assign(found.order, fields);
    return answer(200, found.order);
  }
  return answer(405, { error: 'method not allowed' }, { allow: 'GET, PATCH, DELETE' });
}

async function main() {
  const port = Number(process.argv[2]);
  const client = await createClient({ url: process.env.REDIS_URL }).connect();
  const persistenceStore = new CachePersistenceLayer({ client });
  const config = new IdempotencyConfig({
    eventKeyJmesPath:
      'headers."idempotency-key" && [headers.authorization, requestContext.http.method, rawPath, headers."idempotency-key"]',
    payloadValidationJmesPath: process.env.FIELD_PAYLOAD_VALIDATION === 'off' ? undefined : 'body',
    throwOnNoIdempotencyKey: true,
  });
  const idempotent = makeIdempotent(handler, { persistenceStore, config });

  const server = http.createServer((request, response) => {
    const chunks = [];
    request.on('data', (chunk) => chunks.push(chunk));
    request.on('end', async () => {
      const url = new URL(request.url, 'http://localhost');
      const headers = {};
      for (const [name, value] of Object.entries(request.headers)) {
        headers[name] = Array.isArray(value) ? value.join(',') : value;
      }
      const event = {
        version: '2.0',
        rawPath: url.pathname,
        rawQueryString: url.search.slice(1),
        headers,
        requestContext: { http: { method: request.method, path: url.pathname } },
        body: Buffer.concat(chunks).toString('utf8'),
        isBase64Encoded: false,
      };
      const context = { getRemainingTimeInMillis: () => 30_000 };
      let result;
      try {
        const through = request.method === 'POST' || request.method === 'PATCH';
        result = await (through ? idempotent : handler)(event, context);
      } catch (error) {
        // What API Gateway would make of the function's error, with a status
        // per Powertools error so that the runner can tell them apart.
        const status = {
          IdempotencyKeyError: 400,
          IdempotencyValidationError: 422,
          IdempotencyAlreadyInProgressError: 409,
        }[error?.name] ?? 500;
        result = answer(status, { error: error?.name ?? 'InternalError' });
      }
      response.writeHead(result.statusCode, result.headers ?? {});
      response.end(result.body ?? '');
    });
  });
  server.listen(port, '127.0.0.1');
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
