"""`/v1/messages/batches` and `/anthropic/v1/messages/batches`: Anthropic Message Batches (Anthropic's
error envelope), as the official `anthropic` SDKs call them. Every route needs `anthropic-version`
(2023-06-01 or 2026-10-21) and refuses `anthropic-beta`. While Message Batches are off, creating one
answers 403; those already created keep running and stay readable."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ...errors import PermissionDenied
from ...jsontext import to_json
from ...operations.anthropic import message_batches
from ...protocols.anthropic import PROTOCOL as ANTHROPIC
from ...runtime import Services
from ...service.accounts import Principal
from ...service.reading import finished_order
from ..auth import caller, services_of
from ..bodies import body_within
from ..envelopes import error_responses, route_class, unmatched_paths_under
from ..schemas import (
    ANTHROPIC_HEADERS,
    BATCH_ESTIMATE,
    CREATE_MESSAGE_BATCH_BODY,
    DELETED_MESSAGE_BATCH,
    FINISHED_MESSAGE_RESULTS,
    MESSAGE_BATCH,
    MESSAGE_BATCH_LIST,
    RETRY_IDEMPOTENCY_KEY,
    RetryMessageBatch,
    SetPriority,
)

PREFIXES = ("", ANTHROPIC.base_path)  # the service's own base URL, and the one Anthropic clients are given

router = APIRouter(route_class=route_class(ANTHROPIC), tags=["message batches"])
# A path under the Anthropic base URL that no route serves still answers in Anthropic's envelope.
unmatched_paths_under(ANTHROPIC, f"{ANTHROPIC.base_path}/", "/v1/messages")


def anthropic_version(request: Request) -> str:
    """The `anthropic-version` the call was made under (checked once the key is: a call without a key is a
    401 whatever its headers)."""
    return message_batches.check_headers(request.headers.get("anthropic-version"),
                                         request.headers.get("anthropic-beta"))


def _extra(*parts: dict) -> dict:
    """openapi_extra: the Anthropic headers, plus any other parameters and shapes."""
    merged: dict = {"parameters": list(ANTHROPIC_HEADERS)}
    for part in parts:
        for key, value in part.items():
            merged[key] = merged.get(key, []) + value if key == "parameters" else value
    return merged


def _add_routes(prefix: str) -> None:
    base = prefix + "/v1/messages/batches"

    def base_url(request: Request) -> str:
        """Where results_url points: the configured public base URL (PUBLIC_BASE_URL), else where the client
        reached this API (its Host header), and the base path the client used."""
        public = services_of(request).settings.public_base_url
        return (public or str(request.base_url).rstrip("/")) + prefix

    @router.post(base, summary="Create a Message Batch", responses=error_responses(ANTHROPIC, 403, 409, 410, 413, 429),
                 openapi_extra=_extra(CREATE_MESSAGE_BATCH_BODY, MESSAGE_BATCH))
    async def create_message_batch(request: Request, who: Principal = Depends(caller),
                                   version: str = Depends(anthropic_version), svc: Services = Depends(services_of)
                                   ) -> JSONResponse:
        if not svc.settings.message_batches_enabled:  # before reading a body that would be refused anyway
            raise PermissionDenied("Message Batches are not enabled.")
        raw = await body_within(request, svc.settings.max_body_bytes)
        item, created = await run_in_threadpool(message_batches.create, svc, who, raw,
                                                request.headers.get("idempotency-key"), version)
        return JSONResponse(message_batches.message_batch_object(item, base_url(request)),
                            headers=None if created else {"idempotent-replayed": "true"})

    @router.post(base + "/estimate",
                 summary="Estimate a Message Batch before creating it: tokens, cost, when it would end (an extension)",
                 responses=error_responses(ANTHROPIC, 403, 413, 429),
                 openapi_extra=_extra({"requestBody": CREATE_MESSAGE_BATCH_BODY["requestBody"]}, BATCH_ESTIMATE))
    async def estimate_message_batch(request: Request, who: Principal = Depends(caller),
                                     version: str = Depends(anthropic_version), svc: Services = Depends(services_of)
                                     ) -> dict:
        if not svc.settings.message_batches_enabled:
            raise PermissionDenied("Message Batches are not enabled.")
        raw = await body_within(request, svc.settings.max_body_bytes)
        return await run_in_threadpool(message_batches.estimate, svc, who, raw, version)

    @router.get(base, summary="List Message Batches, newest first", responses=error_responses(ANTHROPIC),
                openapi_extra=_extra(MESSAGE_BATCH_LIST))
    def list_message_batches(request: Request, limit: int = Query(20, description="1-1000"),
                             after_id: str | None = None, before_id: str | None = None,
                             who: Principal = Depends(caller), version: str = Depends(anthropic_version),
                             svc: Services = Depends(services_of)) -> dict:
        return message_batches.list_page(svc, who, limit, after_id, before_id, base_url(request))

    @router.get(base + "/{batch_id}", summary="Retrieve a Message Batch", responses=error_responses(ANTHROPIC),
                openapi_extra=_extra(MESSAGE_BATCH))
    def retrieve_message_batch(request: Request, batch_id: str, who: Principal = Depends(caller),
                               version: str = Depends(anthropic_version), svc: Services = Depends(services_of)) -> dict:
        return message_batches.message_batch_object(message_batches.owned(svc, who, batch_id), base_url(request))

    @router.get(base + "/{batch_id}/results", response_model=None,
                summary="Results, one JSON line per request in submission order, once ended",
                responses={**error_responses(ANTHROPIC),
                           200: {"description": "JSONL (LF line endings, no blank lines)",
                                 "content": {"application/x-jsonl": {}}},
                           302: {"description": "Large results: a short-lived URL to download them from"}},
                description="With `order=finished` (an extension beyond the Anthropic API, docs/api.md): a JSON "
                            "page of results in the order they finished, while the batch runs too.",
                openapi_extra=_extra(FINISHED_MESSAGE_RESULTS))
    async def message_batch_results(batch_id: str, who: Principal = Depends(caller),
                              version: str = Depends(anthropic_version), svc: Services = Depends(services_of),
                              order: finished_order.Order | None = Query(None, description=finished_order.ORDER_HELP),
                              after: str | None = Query(None, description="With order=finished: a page's last_id"),
                              limit: int = Query(100, ge=1, le=1000, description="With order=finished: 1-1000"),
                              wait: int | None = Query(None, ge=0, le=finished_order.MAX_WAIT_SECONDS,
                                                       description=finished_order.WAIT_HELP),
                              ) -> StreamingResponse | RedirectResponse | Response:
        if order is not None or wait is not None:  # the finished-order extension: a JSON page, while it runs too
            page = await message_batches.finished_results(svc, who, batch_id, order, after, limit, wait)
            if page is not None:
                return Response(to_json(page, ensure_ascii=False), media_type="application/json")
        location = await run_in_threadpool(message_batches.results_location, svc, who, batch_id)
        if location:  # large results: a short-lived presigned S3 URL (the SDK follows the redirect)
            return RedirectResponse(location, status_code=302)
        lines = await run_in_threadpool(message_batches.results_lines, svc, who, batch_id)
        return StreamingResponse(lines, media_type="application/x-jsonl")

    @router.post(base + "/{batch_id}/pause", summary="Pause (an extension): no request starts, running ones finish",
                 responses=error_responses(ANTHROPIC, 409), openapi_extra=_extra(MESSAGE_BATCH))
    def pause_message_batch(request: Request, batch_id: str, who: Principal = Depends(caller),
                            version: str = Depends(anthropic_version), svc: Services = Depends(services_of)) -> dict:
        return message_batches.message_batch_object(message_batches.pause(svc, who, batch_id), base_url(request))

    @router.post(base + "/{batch_id}/resume", summary="Resume a paused Message Batch (an extension)",
                 responses=error_responses(ANTHROPIC, 409), openapi_extra=_extra(MESSAGE_BATCH))
    def resume_message_batch(request: Request, batch_id: str, who: Principal = Depends(caller),
                             version: str = Depends(anthropic_version), svc: Services = Depends(services_of)) -> dict:
        return message_batches.message_batch_object(message_batches.resume(svc, who, batch_id), base_url(request))

    @router.post(base + "/{batch_id}/cancel", summary="Cancel: canceling until its running requests finish",
                 responses=error_responses(ANTHROPIC), openapi_extra=_extra(MESSAGE_BATCH))
    def cancel_message_batch(request: Request, batch_id: str, who: Principal = Depends(caller),
                             version: str = Depends(anthropic_version), svc: Services = Depends(services_of)) -> dict:
        return message_batches.message_batch_object(message_batches.cancel(svc, who, batch_id), base_url(request))

    @router.post(base + "/{batch_id}/retry",
                 summary="Retry in place: run again the requests that did not succeed (an extension)",
                 responses=error_responses(ANTHROPIC, 409, 410, 429),
                 openapi_extra=_extra({"parameters": [RETRY_IDEMPOTENCY_KEY]}, MESSAGE_BATCH))
    def retry_message_batch(request: Request, batch_id: str, wanted: RetryMessageBatch | None = None,
                            who: Principal = Depends(caller), version: str = Depends(anthropic_version),
                            svc: Services = Depends(services_of)) -> JSONResponse:
        item, replayed = message_batches.retry_batch(svc, who, batch_id, wanted.model_dump() if wanted else {},
                                                     request.headers.get("idempotency-key"))
        return JSONResponse(message_batches.message_batch_object(item, base_url(request)),
                            headers={"idempotent-replayed": "true"} if replayed else None)

    @router.post(base + "/{batch_id}/priority",
                 summary="Change a running Message Batch's priority among your batches (an extension)",
                 responses=error_responses(ANTHROPIC, 409), openapi_extra=_extra(MESSAGE_BATCH))
    def set_message_batch_priority(request: Request, batch_id: str, body: SetPriority,
                                   who: Principal = Depends(caller), version: str = Depends(anthropic_version),
                                   svc: Services = Depends(services_of)) -> dict:
        return message_batches.message_batch_object(message_batches.set_priority(svc, who, batch_id, body.priority),
                                                    base_url(request))

    @router.delete(base + "/{batch_id}", summary="Delete an ended Message Batch with its results",
                   responses=error_responses(ANTHROPIC), openapi_extra=_extra(DELETED_MESSAGE_BATCH))
    def delete_message_batch(batch_id: str, who: Principal = Depends(caller),
                             version: str = Depends(anthropic_version), svc: Services = Depends(services_of)) -> dict:
        return message_batches.delete(svc, who, batch_id)


for _prefix in PREFIXES:
    _add_routes(_prefix)
