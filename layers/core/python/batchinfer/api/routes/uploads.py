"""`/v1/uploads`: a batch input file sent in parts, as the OpenAI SDK's `client.uploads.upload_file_chunked`
sends one (create, parts, complete; and cancel), in OpenAI's error envelope. While file batches are off, an
upload cannot be created, take parts or be completed (400 "File batches are not enabled"); one can still
be cancelled."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from ...errors import BodyTooLarge
from ...operations.openai import files, uploads
from ...protocols.openai import PROTOCOL as OPENAI
from ...runtime import Services
from ...service.accounts import Principal
from ..auth import caller, services_of
from ..bodies import declared_over, form_with_file
from ..envelopes import error_responses, route_class
from ..schemas import ADD_UPLOAD_PART_BODY, COMPLETE_UPLOAD_BODY, CREATE_UPLOAD_BODY, UPLOAD_OBJECT, UPLOAD_PART

router = APIRouter(prefix="/v1/uploads", route_class=route_class(OPENAI), tags=["uploads"])
JSON_BODY_BYTES = 1 << 20  # a create or complete call is a few hundred bytes (a thousand part ids: 30 KB)
MULTIPART_ENVELOPE_BYTES = 64 << 10  # what a part's request may hold besides the part's bytes


async def _json_body(request: Request) -> bytes:
    if declared_over(request, JSON_BODY_BYTES):
        raise BodyTooLarge(JSON_BODY_BYTES)
    return await request.body()


@router.post("", summary="Start an upload of a batch input file sent in parts",
             responses=error_responses(OPENAI, 413, 429), openapi_extra={**CREATE_UPLOAD_BODY, **UPLOAD_OBJECT})
async def create_upload(request: Request, who: Principal = Depends(caller), svc: Services = Depends(services_of)
                        ) -> dict:
    files.check_enabled(svc)
    return await run_in_threadpool(uploads.create, svc, who, await _json_body(request))


@router.post("/{upload_id}/parts", summary="Add a part (multipart: data)", responses=error_responses(OPENAI, 413),
             openapi_extra={**ADD_UPLOAD_PART_BODY, **UPLOAD_PART})
async def add_part(upload_id: str, request: Request, who: Principal = Depends(caller),
                   svc: Services = Depends(services_of)) -> dict:
    files.check_enabled(svc)
    limit = svc.settings.max_upload_part_bytes
    if declared_over(request, limit + MULTIPART_ENVELOPE_BYTES):  # refused before its bytes are read
        raise uploads.part_too_large(limit, None)
    _, part = await form_with_file(request, "data", "Send the part as multipart/form-data with a 'data' file part.",
                                   max_fields=4)
    data = await part.read()
    return await run_in_threadpool(uploads.add_part, svc, who, upload_id, data)


@router.post("/{upload_id}/complete", summary="Complete an upload into a file, from its parts in order",
             responses=error_responses(OPENAI, 413), openapi_extra={**COMPLETE_UPLOAD_BODY, **UPLOAD_OBJECT})
async def complete_upload(upload_id: str, request: Request, who: Principal = Depends(caller),
                          svc: Services = Depends(services_of)) -> dict:
    files.check_enabled(svc)
    return await run_in_threadpool(uploads.complete, svc, who, upload_id, await _json_body(request))


@router.post("/{upload_id}/cancel", summary="Cancel an upload (its parts are deleted)",
             responses=error_responses(OPENAI), openapi_extra=UPLOAD_OBJECT)
def cancel_upload(upload_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return uploads.cancel(svc, who, upload_id)
