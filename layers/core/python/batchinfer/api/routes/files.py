"""`/v1/files`: batch input and output files, as the OpenAI SDK uploads, lists, reads and deletes them
(OpenAI's error envelope). While file batches are off, an upload answers 400 "File batches are not
enabled"; files already stored stay readable and deletable."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from ...operations.openai import files
from ...protocols.openai import PROTOCOL as OPENAI
from ...runtime import Services
from ...service.accounts import Principal
from ..auth import caller, services_of
from ..bodies import declared_over, form_with_file
from ..envelopes import error_responses, route_class
from ..schemas import FILE_DELETED, FILE_LIST, FILE_OBJECT, UPLOAD_BODY


def attachment(filename: str) -> str:
    """Content-Disposition for any filename: an ASCII fallback, and the name itself per RFC 6266/5987 (a header
    holds Latin-1 only, so a raw non-ASCII or quoted name would break the answer)."""
    fallback = "".join(c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else "_" for c in filename) or "file"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


router = APIRouter(prefix="/v1/files", route_class=route_class(OPENAI), tags=["files"])


@router.post("", summary="Upload a batch input file (multipart: file, purpose=batch)",
             responses=error_responses(OPENAI, 413, 429), openapi_extra={**UPLOAD_BODY, **FILE_OBJECT})
async def upload_file(request: Request, who: Principal = Depends(caller), svc: Services = Depends(services_of)
                      ) -> dict:
    files.check_enabled(svc)
    # Refused before its bytes are read: past what one request carries (the multipart envelope aside).
    if declared_over(request, svc.settings.max_direct_upload_bytes + 65536):
        raise files.too_large_for_one_request(svc, None)
    form, part = await form_with_file(
        request, "file", "Upload the file as multipart/form-data with a 'file' part and purpose=batch.", max_fields=8)
    expires_after = None
    if form.get("expires_after[anchor]") is not None or form.get("expires_after[seconds]") is not None:
        expires_after = files.expires_after_seconds(form.get("expires_after[anchor]"),
                                                    form.get("expires_after[seconds]"), "expires_after")
    data = await part.read()
    return await run_in_threadpool(files.upload, svc, who, filename=part.filename or "upload",
                                   purpose=form.get("purpose"), data=data, expires_after=expires_after)


@router.get("", summary="List your files: uploads (batch) and result files (batch_output)",
            responses=error_responses(OPENAI), openapi_extra=FILE_LIST)
def list_files(after: str | None = None, limit: int = Query(10000, description="1-10000"),
               order: str = Query("desc", description="desc (newest first) or asc"),
               purpose: str | None = None, who: Principal = Depends(caller),
               svc: Services = Depends(services_of)) -> dict:
    return files.list_files(svc, who, after=after, limit=limit, order=order, purpose=purpose)


@router.get("/{file_id}", summary="A file", responses=error_responses(OPENAI), openapi_extra=FILE_OBJECT)
def retrieve_file(file_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return files.file_object_of(files.owned_file(svc, who, file_id))


@router.get("/{file_id}/content", response_model=None, summary="A file's bytes (ETag: their SHA-256)",
            responses={**error_responses(OPENAI),
                       200: {"description": "The bytes", "content": {"application/jsonl": {}}},
                       302: {"description": "A large file: a short-lived URL to download it from"}})
def file_content(file_id: str, who: Principal = Depends(caller),
                 svc: Services = Depends(services_of)) -> Response:
    item, data, location = files.content(svc, who, file_id)
    etag = f'"{item["sha256"]}"'  # strong: the bytes never change
    if location:
        return RedirectResponse(location, status_code=302, headers={"ETag": etag})
    return Response(data, media_type="application/jsonl", headers={
        "ETag": etag, "Content-Disposition": attachment(item["filename"])})


@router.delete("/{file_id}", summary="Delete a file", responses=error_responses(OPENAI),
               openapi_extra=FILE_DELETED)
def delete_file(file_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return files.delete(svc, who, file_id)
