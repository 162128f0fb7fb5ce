"""The caller of a route: its API key, checked, and the services it is served with."""

from __future__ import annotations

from fastapi import Depends, Request

from ..errors import AuthenticationFailed, NotFound
from ..runtime import Services
from ..service.accounts import AuthError, Principal, authenticate
from ..service.limits import refuse_rate, take_request

RATE_STATE = "rate_limit"  # request.state's name for the caller's rate (api.limits writes its headers)


def services_of(request: Request) -> Services:
    """The services the app was built with (`create_app(get_services)`)."""
    return request.app.state.get_services()


def api_key_of(request: Request) -> str | None:
    """The key as either SDK sends it: `Authorization: Bearer <key>` (OpenAI, Anthropic 2.x) or
    `X-API-Key: <key>` (Anthropic 1.x)."""
    auth = request.headers.get("authorization", "")
    raw = auth[7:].strip() if auth.lower().startswith("bearer ") else None
    return raw or request.headers.get("x-api-key")


def key_holder(request: Request, svc: Services = Depends(services_of)) -> Principal:
    """The authenticated caller of an interactive route (served whether batches are on or not)."""
    try:
        who = authenticate(svc, api_key_of(request))
    except AuthError as error:
        raise AuthenticationFailed(str(error), code="invalid_api_key") from None
    # Every authenticated call takes one of its account's tokens (service.limits); over the rate: a 429.
    rate = take_request(svc, who.account)
    setattr(request.state, RATE_STATE, rate)
    if rate is not None and rate.retry_after is not None:
        raise refuse_rate(rate, who.account.get("tier", "free"))
    return who


def caller(request: Request, svc: Services = Depends(services_of)) -> Principal:
    """The authenticated caller; every batch route depends on it (batches switched off: 404 for all)."""
    if not svc.settings.batches_enabled:
        raise NotFound("Batch inference is unavailable at the moment.", code="batches_unavailable")
    return key_holder(request, svc)
