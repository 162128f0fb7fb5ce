"""The FastAPI app: builds it, installs the error handlers, includes one router per protocol."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import protocols
from ..runtime import Services, services
from . import schemas
from .envelopes import install_error_handlers
from .latency import RequestLatency
from .limits import RateLimitHeaders
from .routes import api_docs, batches, console, files, health, interactive, message_batches, messages, uploads, webhooks

# The API's paths, where a trailing slash is served as if it were not there: the service's own base URL,
# and the other base URLs protocols give their clients.
API_PREFIXES = ("/v1/", *(f"{p.base_path}/" for p in protocols.PROTOCOLS.values() if p.base_path))


class TrailingSlashServed:
    """An API path with a trailing slash is served as the path without it. Starlette's default answers it
    with a redirect to a URL built from the Host header, a host the client chose: that is off
    (`redirect_slashes=False`), so any other path with a trailing slash is a 404."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (scope["type"] == "http" and path.endswith("/") and path.startswith(API_PREFIXES)
                and path not in API_PREFIXES):
            raw_path = scope.get("raw_path")
            scope = {**scope, "path": path[:-1],
                     "raw_path": raw_path[:-1] if raw_path and raw_path.endswith(b"/") else raw_path}
        await self.app(scope, receive, send)


def create_app(get_services: Callable[[], Services] = services) -> FastAPI:
    app = FastAPI(title="Batch inference", version="0.1.0", docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json",
                  redirect_slashes=False)
    app.add_middleware(RateLimitHeaders)  # the caller's rate, on every answer of an authenticated call
    app.add_middleware(RequestLatency)  # inside TrailingSlashServed: it sees the path the routes see
    app.add_middleware(TrailingSlashServed)
    app.state.get_services = get_services
    install_error_handlers(app)
    for module in (health, batches, files, uploads, message_batches, webhooks, interactive, messages, console,
                   api_docs):
        app.include_router(module.router)
    app.openapi = lambda: _openapi(app)
    return app


def _openapi(app: FastAPI) -> dict:
    """FastAPI's document, plus the shapes of raw-JSON routes (`schemas`); without FastAPI's default 422,
    which this app never answers (a parameter it cannot read is a 400 in the route's envelope)."""
    if app.openapi_schema is None:
        document = get_openapi(title=app.title, version=app.version, routes=app.routes)
        document.setdefault("components", {}).setdefault("schemas", {}).update(schemas.components())
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            document["components"]["schemas"].pop(name, None)
        app.openapi_schema = document
    return app.openapi_schema
