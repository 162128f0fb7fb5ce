"""`/v1/batch_webhook`: the account's completion webhook and its recent deliveries (OpenAI's error envelope).
While webhooks are off, setting one answers 400 "Batch webhooks are not enabled"; reading and removing
still work."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from ...protocols.openai import PROTOCOL as OPENAI
from ...runtime import Services
from ...service.accounts import Principal
from ...service.background import webhooks
from ..auth import caller, services_of
from ..envelopes import error_responses, route_class
from ..schemas import SetWebhook, WebhookDeleted, WebhookEventList, WebhookObject

router = APIRouter(prefix="/v1/batch_webhook", route_class=route_class(OPENAI), tags=["webhooks"])


@router.put("", summary="Set the completion webhook", response_model=WebhookObject, response_model_exclude_none=True,
            responses=error_responses(OPENAI, 409))
async def set_webhook(body: SetWebhook, who: Principal = Depends(caller), svc: Services = Depends(services_of)
                      ) -> dict:
    # In a thread: the URL's host is resolved and the secret sealed by KMS, both blocking calls.
    return await run_in_threadpool(webhooks.set_webhook, svc, who, body.url, body.rotate_secret)


@router.get("", summary="The completion webhook (never its secret)", response_model=WebhookObject,
            response_model_exclude_none=True, responses=error_responses(OPENAI))
def get_webhook(who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return webhooks.get_webhook(svc, who)


@router.delete("", summary="Remove the completion webhook and its secret", response_model=WebhookDeleted,
               responses=error_responses(OPENAI))
def delete_webhook(who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return webhooks.delete_webhook(svc, who)


@router.get("/events", summary="Recent events and their deliveries, newest first", response_model=WebhookEventList,
            responses=error_responses(OPENAI))
def webhook_events(limit: int = Query(20, description="1-100"), after: str | None = Query(
                       None, description="An event id: the page after it"),
                   who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return webhooks.events_page(svc, who, limit, after)
