// The orders API as the page speaks it: request bodies built as text from
// what was typed, and answers read without turning a number into a float.
//
// Money is exact end to end: the price typed ("9.99") is written into the
// JSON body as that very text, and every number in an answer is kept as the
// text the server wrote (JSON.parse's source text), never as a binary float.

export const ORDERS_PATH = '/v1/orders';

/** A JSON number literal, as RFC 8259 writes one. */
const JSON_NUMBER = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$/;
/** An integer as a person types it: digits, maybe a sign. */
const TYPED_INTEGER = /^[+-]?[0-9]+$/;

/** Why a typed value cannot be sent. */
export class InputError extends Error {}

/**
 * The quantity typed, as a JSON integer literal ("007" is written 7). Its
 * range is the server's to judge (a 422 is shown on the operation).
 */
export function quantityLiteral(typed) {
  const text = String(typed).trim();
  if (!TYPED_INTEGER.test(text)) {
    throw new InputError(`quantity must be a whole number, not "${text}"`);
  }
  return BigInt(text).toString(); // exact at any length
}

/**
 * The price typed, as the JSON number literal that is exactly its text
 * ("9.99" is sent as 9.99). Whole cents and the range are the server's to
 * judge.
 */
export function priceLiteral(typed) {
  const text = String(typed).trim();
  if (!JSON_NUMBER.test(text)) {
    throw new InputError(`price must be a number such as 9.99, not "${text}"`);
  }
  return text;
}

/** The body of a create, as JSON text: `{"item":…,"quantity":…,"price":…}`. */
export function createBody({ item, quantity, price }) {
  const name = String(item).trim();
  if (name === '') throw new InputError('item is required');
  return `{"item":${JSON.stringify(name)},"quantity":${quantityLiteral(quantity)},"price":${priceLiteral(price)}}`;
}

/** The body of an update: only the members given (at least one). */
export function updateBody(changes) {
  const members = [];
  if (changes.item !== undefined) members.push(`"item":${JSON.stringify(String(changes.item).trim())}`);
  if (changes.quantity !== undefined) members.push(`"quantity":${quantityLiteral(changes.quantity)}`);
  if (changes.price !== undefined) members.push(`"price":${priceLiteral(changes.price)}`);
  if (members.length === 0) throw new InputError('nothing to change');
  return `{${members.join(',')}}`;
}

/**
 * Parses JSON, keeping every number as the exact text it was written with
 * (a string), so that 999998999990000.01 stays what it is. Browsers without
 * JSON.parse's source text fall back to the shortest text of the double,
 * which is exact for every price the API accepts (at most 12 digits).
 */
export function parseExact(text) {
  return JSON.parse(text, (_key, value, context) =>
    typeof value === 'number' ? (context && typeof context.source === 'string' ? context.source : String(value)) : value);
}

/** What an answer says went wrong: the problem's title and detail. */
export function problemText(status, answer) {
  if (answer && typeof answer === 'object') {
    const parts = [answer.title, answer.detail].filter((p) => typeof p === 'string' && p !== '');
    const fields = Array.isArray(answer.errors)
      ? answer.errors.map((e) => `${e.field}: ${e.message}`).join('; ')
      : '';
    if (fields) parts.push(fields);
    const code = typeof answer.error === 'string' ? ` ${answer.error}` : '';
    if (parts.length) return `${status}${code}: ${parts.join(' — ')}`;
  }
  return `${status}: the server refused the request`;
}

/** The newest orders of the token's user (one page of at most 100). */
export async function listOrders(token) {
  const res = await fetch(`${ORDERS_PATH}?limit=100`, {
    headers: { Authorization: `Bearer ${token}` },
    cache: 'no-store',
    credentials: 'omit',
  });
  const text = await res.text();
  let body = null;
  try { body = parseExact(text); } catch { /* reported below */ }
  if (!res.ok) {
    const error = new Error(problemText(res.status, body));
    error.status = res.status;
    throw error;
  }
  return { orders: Array.isArray(body?.data) ? body.data : [], more: body?.next_cursor != null };
}
