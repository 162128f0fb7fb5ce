"""Error envelopes: each protocol's own (`protocols.Protocol.error_body`, its shape `error_model`), e.g.
OpenAI's `{"error": {message, type, param, code}}` and Anthropic's `{"type": "error", "error": {type, message}}`.

A route's envelope is the one of the protocol it belongs to, chosen by its router's route class
(`route_class(protocol)`), never by sniffing the path: the route marks the request's scope when it
matches, and the app's error handlers read the mark. A request no route matches gets the envelope of
the protocol whose module claimed its path's prefix (`unmatched_paths_under`), else the default
protocol's.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import cache
from typing import Any

from fastapi import FastAPI, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from .. import protocols
from ..errors import ApiError, InternalError, InvalidRequest
from ..jsontext import DuplicateKey
from ..jsontext import loads as read_json
from ..protocols import Protocol
from ..service.creating.validation import duplicate_key_fault

SCOPE_KEY = "batchinfer.envelope"
FINAL_STATUSES = (410, 413)  # answers a retry cannot change
# batch_ended, batch_not_running: a pause or resume; batch_not_ended: a retry in place of a batch still
# running. The SDK's own retries must not repeat them.
FINAL_CODES = ("idempotency_key_reused", "batch_ended", "batch_not_running", "batch_not_ended",
               "batch_would_be_late")  # the last: admission reject_if_late (capacity does not free up in seconds)


ERROR_DESCRIPTIONS = {400: "Invalid request", 401: "Missing, invalid, revoked or expired API key",
                      403: "Not allowed for this account", 404: "Not found (or batches unavailable)",
                      409: "Conflicts with the batch's state", 410: "Gone", 413: "Body too large",
                      429: "The account's request rate, a limit or the daily quota is reached", 500: "Server error"}


def error_responses(protocol: Protocol, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: its error statuses, in its protocol's envelope (401, 404, 500 and 429 on every
    route: each call takes a token of its account's request rate)."""
    codes = sorted({400, 401, 404, 429, 500, *statuses})
    return {code: {"model": protocol.error_model, "description": ERROR_DESCRIPTIONS.get(code, "Error")}
            for code in codes}


# --- Route classes --------------------------------------------------------------------------------------

class ProtocolRoute(APIRoute):
    """A route that marks the requests it matches as its protocol's (`protocol`: a registered name)."""

    protocol = protocols.DEFAULT.name

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:  # a full match, or the path with another method (405)
            child = {**child, SCOPE_KEY: self.protocol}
        return match, child

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler; for a route whose JSON body FastAPI reads into a pydantic model, the body is
        first read as the routes that parse their own bodies read it (`jsontext.loads`): a key named twice is
        a 400 naming it, not a last-one-wins read. Its bodies are small, so reading one twice costs nothing."""
        handler = super().get_route_handler()
        if self.body_field is None or isinstance(self.body_field.field_info, params.Form):
            return handler

        async def strict_json(request: Request) -> Response:
            body = await request.body()  # kept by the request: FastAPI's read after this one gets it again
            kind = request.headers.get("content-type", "")
            if body.strip() and (not kind or "json" in kind.split(";")[0]):
                try:
                    read_json(body)
                except DuplicateKey as twice:
                    message, param = duplicate_key_fault(twice)
                    raise InvalidRequest(message, code="duplicate_key", param=param) from None
                except (ValueError, RecursionError):
                    pass  # not JSON: FastAPI refuses it as it does
            return await handler(request)

        return strict_json


@cache
def route_class(protocol: Protocol) -> type[ProtocolRoute]:
    """The route class of a router whose routes answer in `protocol`'s envelope."""
    return type(f"{protocol.name.title()}Route", (ProtocolRoute,), {"protocol": protocol.name})


# --- Rendering ------------------------------------------------------------------------------------------

def render(protocol: str, error: ApiError) -> JSONResponse:
    body = protocols.named(protocol).error_body(error)
    headers = {}
    if error.retry_after is not None:
        headers["retry-after"] = str(error.retry_after)
    if error.status in FINAL_STATUSES or error.code in FINAL_CODES:
        headers["x-should-retry"] = "false"  # the OpenAI SDK retries 409 and more unless told it cannot help
    return JSONResponse(body, status_code=error.status, headers=headers or None)


_UNMATCHED: dict[str, str] = {}  # path prefix -> protocol name, for requests no route matches


def unmatched_paths_under(protocol: Protocol, *prefixes: str) -> None:
    """Declare that requests under these prefixes that no route serves belong to `protocol`."""
    for prefix in prefixes:
        _UNMATCHED[prefix] = protocol.name


def _envelope(request: Request) -> str:
    marked = request.scope.get(SCOPE_KEY)
    if marked:
        return marked
    path = request.url.path
    return next((name for prefix, name in _UNMATCHED.items() if path.startswith(prefix)), protocols.DEFAULT.name)


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal in the envelope of the API its route belongs to; no plain-text errors."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return render(_envelope(request), error)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "body", "path"))
        return render(_envelope(request), InvalidRequest(f"{where}: {first.get('msg', 'invalid')}",
                                                         param=where or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = "Not found." if error.status_code == 404 else str(error.detail)
        return render(_envelope(request), ApiError(error.status_code, message))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        # Still a 500, but in the envelope the SDKs parse rather than Starlette's plain text.
        return render(_envelope(request), InternalError("The server had an error while processing your request."))
