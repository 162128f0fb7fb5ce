"""`/v1/messages` (also under `/anthropic`): Anthropic's Messages endpoint, interactive (Anthropic's error
envelope), as `client.messages.create` calls it. Thin: `service.running.interactive` checks (as a Message Batch
request is checked), routes, runs (translated for `openai` backends) and charges."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ...catalog import MESSAGES_ENDPOINT
from ...errors import BodyTooLarge
from ...protocols.anthropic import PROTOCOL as ANTHROPIC
from ...runtime import Services
from ...service.accounts import Principal
from ...service.creating.intake import parse_json_body
from ...service.running import interactive
from ..auth import key_holder, services_of
from ..bodies import declared_over
from ..envelopes import error_responses, route_class
from ..schemas import ANTHROPIC_HEADERS
from .interactive import ANSWER, INTERACTIVE_BODY_BYTES, answer
from .message_batches import PREFIXES, anthropic_version

router = APIRouter(route_class=route_class(ANTHROPIC), tags=["interactive"])


def _add_route(prefix: str) -> None:
    @router.post(prefix + MESSAGES_ENDPOINT, summary="Create a message",
                 responses=error_responses(ANTHROPIC, 429, 502, 503, 504),
                 openapi_extra={**ANSWER, "parameters": list(ANTHROPIC_HEADERS)})
    async def create_message(request: Request, who: Principal = Depends(key_holder),
                             version: str = Depends(anthropic_version),
                             svc: Services = Depends(services_of)) -> Response:
        if declared_over(request, INTERACTIVE_BODY_BYTES):
            raise BodyTooLarge(INTERACTIVE_BODY_BYTES)
        return answer(await interactive.serve_messages(svc, who, parse_json_body(await request.body()), version))


for _prefix in PREFIXES:
    _add_route(_prefix)
