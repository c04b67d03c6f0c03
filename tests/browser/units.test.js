// The page's pure parts, in node (no browser): how a typed order becomes the
// exact JSON text sent, how answers are read without floats, and how the
// drainer spaces its retries. (Reading answers without floats needs the
// browser's JSON.parse source text: app.test.js checks it in Chromium.)

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createBody, InputError, priceLiteral, problemText, quantityLiteral, updateBody } from '../../web/app/orders.js';
import { backoff, retryAfterMs } from '../../web/app/drain.js';

test('a typed price is sent as exactly the decimal text typed', () => {
  assert.equal(priceLiteral('9.99'), '9.99');
  assert.equal(priceLiteral(' 0.10 '), '0.10');
  assert.equal(priceLiteral('999999999.99'), '999999999.99');
  assert.equal(priceLiteral('1e2'), '1e2');
  assert.equal(createBody({ item: ' Widget ', quantity: '2', price: '9.99' }), '{"item":"Widget","quantity":2,"price":9.99}');
  // 0.1 + 0.2 would be 0.30000000000000004 through a float; the text never is one.
  assert.equal(createBody({ item: 'x', quantity: 3, price: '0.30' }), '{"item":"x","quantity":3,"price":0.30}');
});

test('what is not a JSON number is refused before anything is stored', () => {
  for (const typed of ['9,99', '.5', '5.', '+1', '0x10', 'NaN', 'Infinity', '', '1 000', '09.99']) {
    assert.throws(() => priceLiteral(typed), InputError, typed);
  }
});

test('a typed quantity is sent as a JSON integer literal', () => {
  assert.equal(quantityLiteral('007'), '7');
  assert.equal(quantityLiteral('-3'), '-3');
  assert.equal(quantityLiteral('123456789012345678901234567890'), '123456789012345678901234567890');
  for (const typed of ['1.5', '1e2', 'two', '', '1.0']) assert.throws(() => quantityLiteral(typed), InputError, typed);
});

test('an update sends only what changed, and something must have', () => {
  assert.equal(updateBody({ quantity: '9', price: '4.35' }), '{"quantity":9,"price":4.35}');
  assert.equal(updateBody({ item: 'New "name"' }), '{"item":"New \\"name\\""}');
  assert.throws(() => updateBody({}), InputError);
});

test("a refusal is shown with the problem's status, code, title, detail and fields", () => {
  const text = problemText(422, {
    title: 'Validation failed', detail: 'the request body failed validation', error: 'VALIDATION_FAILED',
    errors: [{ field: 'price', message: 'must be a whole number of cents' }],
  });
  assert.equal(text, '422 VALIDATION_FAILED: Validation failed — the request body failed validation — price: must be a whole number of cents');
  assert.equal(problemText(404, null), '404: the server refused the request');
});

test('the backoff stays under its doubling ceiling, and reaches past half of it', () => {
  for (let attempt = 1; attempt < 40; attempt += 1) {
    const ceiling = Math.min(10_000, 200 * 2 ** (attempt - 1));
    let highest = 0;
    for (let i = 0; i < 200; i += 1) {
      const wait = backoff(attempt);
      assert.ok(wait >= 0 && wait <= ceiling && Number.isInteger(wait), `${attempt}: ${wait}`);
      highest = Math.max(highest, wait);
    }
    assert.ok(highest > ceiling / 2, `attempt ${attempt}: full jitter spreads over its range (${highest} of ${ceiling})`);
  }
});

test('Retry-After is read as seconds or as a date, and a broken one is bounded', () => {
  const now = Date.parse('2026-12-01T10:00:00Z');
  assert.equal(retryAfterMs('2', now), 2_000);
  assert.equal(retryAfterMs(' 1 ', now), 1_000);
  assert.equal(retryAfterMs('Tue, 01 Dec 2026 10:00:03 GMT', now), 3_000);
  assert.equal(retryAfterMs(null, now), 0);
  assert.equal(retryAfterMs('soon', now), 0);
  assert.equal(retryAfterMs('-5', now), 0);
  assert.equal(retryAfterMs('999999999', now), 300_000);
});
