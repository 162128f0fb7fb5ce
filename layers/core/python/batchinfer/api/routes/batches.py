"""`/v1/batches`: OpenAI-shaped inline batches (OpenAI's error envelope)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ...errors import InvalidRequest
from ...jsontext import to_json
from ...operations.openai import batches
from ...protocols.openai import PROTOCOL as OPENAI
from ...runtime import Services
from ...service.accounts import Principal
from ...service.reading import finished_order
from ..auth import caller, services_of
from ..bodies import body_within
from ..envelopes import error_responses, route_class
from ..schemas import (
    BATCH_ESTIMATE,
    BATCH_LIST,
    BATCH_OBJECT,
    CREATE_BATCH_BODY,
    DELETED_BATCH,
    RESULTS_PAGE,
    RETRY_IDEMPOTENCY_KEY,
    RetryBatch,
    SetPriority,
)

router = APIRouter(prefix="/v1/batches", route_class=route_class(OPENAI), tags=["batches"])


@router.post("", summary="Create an inline batch", responses=error_responses(OPENAI, 403, 409, 410, 413, 429),
             openapi_extra={**CREATE_BATCH_BODY, **BATCH_OBJECT})
async def create(request: Request, who: Principal = Depends(caller), svc: Services = Depends(services_of)
                 ) -> JSONResponse:
    # The body is read raw and parsed once (50,000 requests: no pydantic model per request); its schema
    # is declared for the OpenAPI document only.
    raw = await body_within(request, svc.settings.max_body_bytes)
    obj, created = await run_in_threadpool(batches.create_batch, svc, who, raw,
                                           request.headers.get("idempotency-key"))
    # A replay answers with the batch the first call created, 200 both times as OpenAI's create answers;
    # the header tells a client that looks which one it got (as Stripe's Idempotent-Replayed does).
    return JSONResponse(obj, status_code=200, headers=None if created else {"idempotent-replayed": "true"})


@router.post("/estimate", summary="Estimate a batch before creating it: tokens, cost, when it would end (an extension)",
             responses=error_responses(OPENAI, 403, 413, 429),
             openapi_extra={"requestBody": CREATE_BATCH_BODY["requestBody"], **BATCH_ESTIMATE})
async def estimate(request: Request, who: Principal = Depends(caller), svc: Services = Depends(services_of)
                   ) -> dict:
    # The body of a create call, read raw as create reads it (see create).
    raw = await body_within(request, svc.settings.max_body_bytes)
    return await run_in_threadpool(batches.estimate_batch, svc, who, raw)


@router.get("", summary="List your batches, newest first", responses=error_responses(OPENAI),
            openapi_extra=BATCH_LIST)
def list_batches(limit: int = Query(20, description="1-100"), after: str | None = None,
                 who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return batches.list_batches(svc, who, limit, after)


@router.get("/{batch_id}", summary="Retrieve a batch", responses=error_responses(OPENAI),
            openapi_extra=BATCH_OBJECT)
def retrieve(batch_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return batches.batch_object(batches.owned_batch(svc, who, batch_id))


@router.get("/{batch_id}/results", response_model=None, summary="Results in submission order, finished or not",
            description=finished_order.RESULTS_HELP, responses=error_responses(OPENAI), openapi_extra=RESULTS_PAGE)
async def results(batch_id: str, limit: int = Query(100, description="1-1000"), after: str | None = None,
                  order: finished_order.Order | None = Query(None, description=finished_order.ORDER_HELP),
                  wait: int | None = Query(None, ge=0, le=finished_order.MAX_WAIT_SECONDS,
                                           description=finished_order.WAIT_HELP),
                  status: finished_order.ResultStatus | None = Query(None, description=finished_order.STATUS_HELP),
                  custom_id: str | None = Query(None, description=finished_order.CUSTOM_ID_HELP),
                  who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> Response:
    # Async: a page held open (`wait`) waits without holding a server thread; every read runs in the pool.
    # Written here, not by FastAPI's encoder: each response body goes out as the text the backend sent.
    page = None
    if order is not None or wait is not None or status is not None or custom_id is not None:  # the extensions
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be between 1 and 1000.", param="limit")
        page = await finished_order.results_view_async(svc, lambda: batches.owned_batch(svc, who, batch_id),
                                                       limit=limit, after=after, order=order, wait=wait, status=status,
                                             custom_id=custom_id)
    page = page or await run_in_threadpool(batches.results_page, svc, who, batch_id, limit, after)
    return Response(to_json(page, ensure_ascii=False), media_type="application/json")


@router.get("/{batch_id}/output.jsonl", response_model=None, summary="Every result as JSONL, once final",
            responses={**error_responses(OPENAI, 409),
                       200: {"description": "JSONL, one result per line", "content": {"application/jsonl": {}}},
                       302: {"description": "A large export: a short-lived URL to download it from"}})
def output(batch_id: str, who: Principal = Depends(caller),
           svc: Services = Depends(services_of)) -> StreamingResponse | RedirectResponse:
    location = batches.export_location(svc, who, batch_id)
    if location:  # large exports: a short-lived presigned S3 URL (clients follow the redirect)
        return RedirectResponse(location, status_code=302)
    lines = batches.export_lines(svc, who, batch_id)
    return StreamingResponse(lines, media_type="application/jsonl",
                             headers={"Content-Disposition": f'attachment; filename="{batch_id}.jsonl"'})


@router.post("/{batch_id}/pause", summary="Pause (an extension): no request starts, running ones finish",
             responses=error_responses(OPENAI, 409), openapi_extra=BATCH_OBJECT)
def pause(batch_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return batches.pause_batch(svc, who, batch_id)


@router.post("/{batch_id}/resume", summary="Resume a paused batch (an extension)",
             responses=error_responses(OPENAI, 409), openapi_extra=BATCH_OBJECT)
def resume(batch_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return batches.resume_batch(svc, who, batch_id)


@router.post("/{batch_id}/cancel", summary="Cancel: unstarted requests are cancelled, running ones finish",
             responses=error_responses(OPENAI), openapi_extra=BATCH_OBJECT)
def cancel(batch_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return batches.cancel_batch(svc, who, batch_id)


@router.post("/{batch_id}/retry", summary="Retry in place: run again the requests that did not succeed (an extension)",
             responses=error_responses(OPENAI, 409, 410, 429),
             openapi_extra={"parameters": [RETRY_IDEMPOTENCY_KEY], **BATCH_OBJECT})
def retry(batch_id: str, request: Request, wanted: RetryBatch | None = None, who: Principal = Depends(caller),
          svc: Services = Depends(services_of)) -> JSONResponse:
    obj, replayed = batches.retry_batch(svc, who, batch_id, wanted.model_dump() if wanted else {},
                                        request.headers.get("idempotency-key"))
    return JSONResponse(obj, headers={"idempotent-replayed": "true"} if replayed else None)


@router.post("/{batch_id}/priority", summary="Change a running batch's priority among your batches (an extension)",
             responses=error_responses(OPENAI, 409), openapi_extra=BATCH_OBJECT)
def set_priority(batch_id: str, body: SetPriority, who: Principal = Depends(caller),
                 svc: Services = Depends(services_of)) -> dict:
    return batches.set_priority(svc, who, batch_id, body.priority)


@router.delete("/{batch_id}", summary="Delete a batch with its results", responses=error_responses(OPENAI, 409),
               openapi_extra=DELETED_BATCH)
def delete(batch_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return batches.delete_batch(svc, who, batch_id)
