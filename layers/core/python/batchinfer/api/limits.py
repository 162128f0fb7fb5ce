"""The rate headers of every authenticated call: OpenAI's `x-ratelimit-*-requests` (the SDKs and clients
that pace themselves read them), and beside them the route's protocol's own (Anthropic's
`anthropic-ratelimit-requests-*` on its routes). Written from what the caller's key check left on the request
(`auth.RATE_STATE`), on answers and refusals alike."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import protocols
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
    protocol = protocols.named(scope.get(SCOPE_KEY) or protocols.DEFAULT.name)
    headers.update(protocol.rate_headers(rate.limit, rate.remaining, rate.reset_seconds))
    return headers
