"""The orders application the Python apps of the field report share.

Framework-free: `handle(method, path, headers, body)` answers
`(status, headers, payload)`; each app puts it behind one middleware.
Two bearer tokens (`field-a`, `field-b`) are two users, each seeing only
its own orders. Validation is strict, so that what the runner sees is the
idempotency layer: a body is a JSON object (`Content-Type:
application/json`), `item` a non-empty string, `quantity` a JSON integer
literal >= 1, `price` a JSON number >= 0 with at most two decimals.
A create takes FIELD_CREATE_MS milliseconds (default 50), as a database
write does, so that concurrent duplicates overlap. FIELD_LAX=1 makes the
application lax on purpose (a quantity of `1.0` or `1e2` is taken for the
integer it equals), to see whether a check reaches the application or only
the idempotency layer in front of it.
"""

import json
import os
import threading
import time
from decimal import Decimal, InvalidOperation

USERS = {"Bearer field-a": "a", "Bearer field-b": "b"}
NOT_FOUND = (404, {}, {"error": "not found"})
CREATE_SECONDS = int(os.environ.get("FIELD_CREATE_MS", "50")) / 1000
LAX = os.environ.get("FIELD_LAX") == "1"

_lock = threading.Lock()
_orders = {}  # id -> (user, order)
_next_id = [1]


class _Integer(int):
    """An integer written as an integer literal (not 1.0, not 1e2)."""


def _parse(body):
    try:
        text = body.decode("utf-8")
        return json.loads(text, parse_float=Decimal, parse_int=_Integer), None
    except (UnicodeDecodeError, ValueError):
        return None, "the body is not JSON"


def _number(value):
    return isinstance(value, (_Integer, Decimal)) and not isinstance(value, bool)


def _validate(data, partial):
    errors = []
    if not isinstance(data, dict):
        return ["the body must be a JSON object"], {}
    fields = {}
    if "item" in data or not partial:
        item = data.get("item")
        if not isinstance(item, str) or not item.strip():
            errors.append("item: a non-empty string is required")
        else:
            fields["item"] = item
    if "quantity" in data or not partial:
        quantity = data.get("quantity")
        if LAX and isinstance(quantity, Decimal) and quantity == quantity.to_integral_value():
            quantity = _Integer(quantity)
        if type(quantity) is not _Integer or quantity < 1:
            errors.append("quantity: an integer >= 1 is required")
        else:
            fields["quantity"] = int(quantity)
    if "price" in data or not partial:
        price = data.get("price")
        try:
            cents_ok = _number(price) and Decimal(price).as_tuple().exponent >= -2
        except (InvalidOperation, TypeError):
            cents_ok = False
        if not cents_ok or price < 0:
            errors.append("price: a number >= 0 with at most two decimals is required")
        else:
            fields["price"] = float(price) if isinstance(price, Decimal) else int(price)
    if partial and not fields and not errors:
        errors.append("nothing to change")
    return errors, fields


def _order_id(path):
    tail = path[len("/orders/"):]
    return int(tail) if tail.isdigit() else None


def handle(method, path, headers, body):
    """One request: `headers` maps lower-case names to values."""
    path = path.rstrip("/") or "/"
    user = USERS.get(headers.get("authorization", ""))
    if path != "/orders" and not path.startswith("/orders/"):
        return NOT_FOUND
    if user is None:
        return 401, {}, {"error": "a valid bearer token is required"}
    if path == "/orders":
        if method == "GET":
            with _lock:
                mine = [o for (u, o) in _orders.values() if u == user]
            return 200, {}, mine
        if method != "POST":
            return 405, {"Allow": "GET, POST"}, {"error": "method not allowed"}
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return 415, {}, {"error": "the body must be application/json"}
        data, problem = _parse(body)
        errors, fields = ([problem], {}) if problem else _validate(data, partial=False)
        if errors:
            return 422, {}, {"error": "invalid order", "errors": errors}
        time.sleep(CREATE_SECONDS)
        with _lock:
            order_id = _next_id[0]
            _next_id[0] += 1
            order = {"id": order_id, **fields}
            _orders[order_id] = (user, order)
        return 201, {"Location": f"/orders/{order_id}"}, order
    order_id = _order_id(path)
    with _lock:
        found = _orders.get(order_id)
    if found is None or found[0] != user:
        return NOT_FOUND
    if method == "GET":
        return 200, {}, found[1]
    if method == "DELETE":
        with _lock:
            _orders.pop(order_id, None)
        return 204, {}, None
    if method == "PATCH":
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return 415, {}, {"error": "the body must be application/json"}
        data, problem = _parse(body)
        errors, fields = ([problem], {}) if problem else _validate(data, partial=True)
        if errors:
            return 422, {}, {"error": "invalid change", "errors": errors}
        with _lock:
            found[1].update(fields)
            return 200, {}, dict(found[1])
    return 405, {"Allow": "GET, PATCH, DELETE"}, {"error": "method not allowed"}


def encode(payload):
    return b"" if payload is None else json.dumps(payload).encode()
