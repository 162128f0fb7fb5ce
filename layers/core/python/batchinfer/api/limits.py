"""The rate headers of every authenticated call: OpenAI's `x-ratelimit-*-requests` (the SDKs and clients
that pace themselves read them), and on the Anthropic API's routes Anthropic's `anthropic-ratelimit-requests-*`
beside them. Written from what the caller's key check left on the request (`auth.RATE_STATE`), on answers
and refusals alike."""

from __future__ import annotations

import datetime as dt

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..service.limits import RateState
from .auth import RATE_STATE
from .envelopes import SCOPE_KEY


class RateLimitHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                rate = scope.get("state", {}).get(RATE_STATE)
                if isinstance(rate, RateState):
                    headers = list(message.get("headers", []))
                    headers += [(k.encode(), v.encode()) for k, v in rate_headers(rate, scope).items()]
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def rate_headers(rate: RateState, scope: Scope) -> dict[str, str]:
    headers = rate.headers()
    if rate.retry_after is not None:
        headers["retry-after-ms"] = str(rate.retry_after * 1000)
    if scope.get(SCOPE_KEY) == "anthropic":
        reset = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=rate.reset_seconds)
        headers.update({"anthropic-ratelimit-requests-limit": str(rate.limit),
                        "anthropic-ratelimit-requests-remaining": str(rate.remaining),
                        "anthropic-ratelimit-requests-reset": reset.isoformat(timespec="seconds")
                        .replace("+00:00", "Z")})
    return headers
