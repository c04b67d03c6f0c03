"""The orders application on Starlette, behind one of two ASGI middlewares.

    python asgi_app.py fastapi-idempotency PORT
    REDIS_URL=… python asgi_app.py asgi-idempotency-header PORT

Each middleware is set up as its README shows (fastapi-idempotency with its
in-memory store, asgi-idempotency-header with its Redis backend); served by
uvicorn, one process.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

import orders_common  # noqa: E402

WHICH, PORT = sys.argv[1], int(sys.argv[2])


async def answer(request: Request) -> Response:
    headers = {name.lower(): value for name, value in request.headers.items()}
    status, extra, payload = orders_common.handle(
        request.method, request.url.path, headers, await request.body()
    )
    response = Response(
        orders_common.encode(payload),
        status_code=status,
        media_type="application/json" if payload is not None else None,
    )
    for name, value in extra.items():
        response.headers[name] = value
    return response


METHODS = ["GET", "POST", "PATCH", "DELETE", "PUT", "OPTIONS"]
routes = [Route("/{path:path}", answer, methods=METHODS)]

if WHICH == "fastapi-idempotency":
    from fastapi_idempotency import IdempotencyMiddleware

    def scope(request: Request) -> str:
        # The README's advice for a logged-in API: group by user, not by IP.
        return request.headers.get("authorization", "")

    middleware = [Middleware(IdempotencyMiddleware, scope=scope)]
elif WHICH == "asgi-idempotency-header":
    from idempotency_header_middleware import IdempotencyHeaderMiddleware
    from idempotency_header_middleware.backends.redis import RedisBackend
    from redis.asyncio import Redis

    backend = RedisBackend(redis=Redis.from_url(os.environ["REDIS_URL"]))
    middleware = [Middleware(IdempotencyHeaderMiddleware, backend=backend)]
else:
    sys.exit(f"unknown middleware {WHICH!r}")

app = Starlette(routes=routes, middleware=middleware)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning")
