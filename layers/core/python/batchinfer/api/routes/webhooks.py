"""`/v1/batch_webhook`: the account's completion webhook. While webhooks are off, it answers as the
specification's "extension is off" table says (OpenAI's error envelope)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ...errors import ApiError
from ...service.accounts import Principal
from ..auth import caller
from ..envelopes import OPENAI, OpenAIRoute, error_responses

router = APIRouter(prefix="/v1/batch_webhook", route_class=OpenAIRoute, tags=["webhooks"])


@router.put("", summary="Set the completion webhook (webhooks are off)", responses=error_responses(OPENAI))
def set_webhook(who: Principal = Depends(caller)) -> dict:
    raise ApiError(400, "Batch webhooks are not enabled.", code="webhooks_disabled")


@router.get("", summary="The completion webhook", responses=error_responses(OPENAI))
@router.delete("", summary="Remove the completion webhook", responses=error_responses(OPENAI))
def webhook_not_found(who: Principal = Depends(caller)) -> dict:
    raise ApiError(404, "No batch webhook is set.", code="webhook_not_found")


@router.get("/events", summary="Recent deliveries", responses=error_responses(OPENAI))
def webhook_events(who: Principal = Depends(caller)) -> dict:
    return {"object": "list", "data": [], "has_more": False}
