"""The interactive OpenAI endpoints batches mirror (OpenAI's error envelope): chat completions, embeddings,
Responses (stateless) and the models the key may use. Thin: `service.running.interactive` checks, routes, runs and
charges."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from ...errors import BodyTooLarge
from ...jsontext import to_json
from ...protocols.openai import PROTOCOL as OPENAI
from ...request_bodies import CHAT, EMBEDDINGS, RESPONSES
from ...runtime import Services
from ...service.accounts import Principal
from ...service.creating.intake import parse_json_body
from ...service.running import interactive
from ..auth import key_holder, services_of
from ..bodies import declared_over
from ..envelopes import error_responses, route_class

router = APIRouter(route_class=route_class(OPENAI), tags=["interactive"])
ANSWER = {"responses": {"200": {"description": "The backend's answer, as the endpoint defines it (server-sent "
                                               "events for stream: true, where streaming is enabled)",
                                "content": {"application/json": {"schema": {"type": "object"}},
                                            "text/event-stream": {"schema": {"type": "string"}}}}},
          "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}}}
ERRORS = error_responses(OPENAI, 429, 502, 503, 504)
INTERACTIVE_BODY_BYTES = 6 * 1024 * 1024  # a Lambda invoke payload; the backends' own limits are lower
# Proxies must pass server-sent events on as they come, not gather them.
EVENT_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def answer(served: interactive.Served | interactive.Streamed) -> Response:
    """The answer of an interactive call: JSON, or server-sent events for `stream: true`."""
    if isinstance(served, interactive.Streamed):
        return StreamingResponse(served.events, media_type="text/event-stream", headers=EVENT_HEADERS)
    # The backend's body as it sent it (not re-encoded: its numbers keep their spelling).
    return Response(to_json(served.body, ensure_ascii=False), status_code=served.status,
                    media_type="application/json")


async def _serve(request: Request, who: Principal, svc: Services, endpoint: str) -> Response:
    if declared_over(request, INTERACTIVE_BODY_BYTES):
        raise BodyTooLarge(INTERACTIVE_BODY_BYTES)
    return answer(await interactive.serve_openai(svc, who, endpoint, parse_json_body(await request.body())))


@router.post(CHAT, summary="Create a chat completion", responses=ERRORS, openapi_extra=ANSWER)
async def chat_completions(request: Request, who: Principal = Depends(key_holder),
                           svc: Services = Depends(services_of)) -> Response:
    return await _serve(request, who, svc, CHAT)


@router.post(EMBEDDINGS, summary="Create embeddings", responses=ERRORS, openapi_extra=ANSWER)
async def embeddings(request: Request, who: Principal = Depends(key_holder),
                     svc: Services = Depends(services_of)) -> Response:
    return await _serve(request, who, svc, EMBEDDINGS)


@router.post(RESPONSES, summary="Create a response (stateless: store false)", responses=ERRORS,
             openapi_extra=ANSWER)
async def responses(request: Request, who: Principal = Depends(key_holder),
                    svc: Services = Depends(services_of)) -> Response:
    return await _serve(request, who, svc, RESPONSES)


@router.get("/v1/models", summary="The models this key may use", responses=error_responses(OPENAI))
def list_models(who: Principal = Depends(key_holder), svc: Services = Depends(services_of)) -> dict:
    return interactive.models_page(svc, who)


@router.get("/v1/models/{model_id:path}", summary="One model", responses=error_responses(OPENAI))
def retrieve_model(model_id: str, who: Principal = Depends(key_holder), svc: Services = Depends(services_of)) -> dict:
    return interactive.one_model(svc, who, model_id)
