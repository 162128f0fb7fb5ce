"""The FastAPI app: builds it, installs the error handlers, includes one router per protocol."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ..runtime import Services, services
from . import schemas
from .envelopes import install_error_handlers
from .routes import batches, console, files, health, inference, message_batches, messages, uploads, webhooks


def create_app(get_services: Callable[[], Services] = services) -> FastAPI:
    app = FastAPI(title="Batch inference", version="0.1.0", docs_url="/docs", openapi_url="/openapi.json")
    app.state.get_services = get_services
    install_error_handlers(app)
    for module in (health, batches, files, uploads, message_batches, webhooks, inference, messages, console):
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
