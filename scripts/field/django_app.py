"""The orders application on Django, behind one of two middlewares.

    python django_app.py idempotency-key PORT   # django-idempotency-key
    python django_app.py drf-idempotency PORT   # drf-idempotency, Redis backend

The second needs REDIS_URL. Each middleware is set up as its README shows,
with its defaults except where noted; the views are the shared application.
"""

import os
import sys

import django
from django.conf import settings

WHICH, PORT = sys.argv[1], sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

if WHICH == "idempotency-key":
    # django-idempotency-key: every unsafe method needs a key; its defaults
    # (in-memory storage, a thread lock, 409 for a known key).
    MIDDLEWARE = ["idempotency_key.middleware.IdempotencyKeyMiddleware"]
    EXTRA = {"IDEMPOTENCY_KEY": {}}
    APPS = ["idempotency_key"]
elif WHICH == "drf-idempotency":
    # drf-idempotency: the project-wide middleware, the Redis backend, and a
    # key required (REQUIRE_KEY defaults to False); the rest its defaults.
    MIDDLEWARE = ["drf_idempotency.middleware.IdempotencyMiddleware"]
    EXTRA = {
        "IDEMPOTENCY": {
            "BACKEND": "drf_idempotency.backends.redis.RedisBackend",
            "BACKEND_OPTIONS": {"url": os.environ["REDIS_URL"]},
            "REQUIRE_KEY": True,
        },
        "REST_FRAMEWORK": {
            "DEFAULT_AUTHENTICATION_CLASSES": [],
            "DEFAULT_PERMISSION_CLASSES": [],
            "UNAUTHENTICATED_USER": None,
            "DEFAULT_PARSER_CLASSES": [],
            "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
        },
    }
    APPS = ["rest_framework", "drf_idempotency"]
else:
    sys.exit(f"unknown middleware {WHICH!r}")

settings.configure(
    DEBUG=False,
    SECRET_KEY="field-report",
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=MIDDLEWARE,
    INSTALLED_APPS=APPS,
    DATABASES={},
    APPEND_SLASH=False,
    LOGGING_CONFIG=None,
    **EXTRA,
)
django.setup()

from django.http import HttpResponse  # noqa: E402
from django.urls import re_path  # noqa: E402

import orders_common  # noqa: E402


def _answer(request):
    headers = {name.lower(): value for name, value in request.headers.items()}
    status, extra, payload = orders_common.handle(
        request.method, request.path, headers, request.body
    )
    response = HttpResponse(
        orders_common.encode(payload),
        status=status,
        content_type="application/json" if payload is not None else None,
    )
    for name, value in extra.items():
        response[name] = value
    return response


if WHICH == "drf-idempotency":
    from rest_framework.views import APIView

    class Orders(APIView):
        def dispatch(self, request, *args, **kwargs):
            # DRF's own request handling, the shared application's answer.
            self.args, self.kwargs, self.request = args, kwargs, request
            self.headers = self.default_response_headers
            return _answer(request)

    view = Orders.as_view()
else:

    def view(request):
        return _answer(request)


urlpatterns = [re_path(r"^.*$", view)]

if __name__ == "__main__":
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.servers.basehttp import WSGIServer, run

    class Server(WSGIServer):
        # runserver's server, a thread per request, with room for the
        # runner's 50 concurrent connections (runserver's backlog is 10).
        request_queue_size = 128

    run("127.0.0.1", int(PORT), WSGIHandler(), threading=True, server_cls=Server)
