"""`/v1/files`: batch input and output files, as the OpenAI SDK uploads, lists, reads and deletes them
(OpenAI's error envelope). While file batches are off, an upload answers 400 "File batches are not
enabled"; files already stored stay readable and deletable."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from ...errors import ApiError
from ...runtime import Services
from ...service import files
from ...service.accounts import Principal
from ..auth import caller, services_of
from ..envelopes import OPENAI, OpenAIRoute, error_responses
from ..schemas import FILE_DELETED, FILE_LIST, FILE_OBJECT, UPLOAD_BODY

router = APIRouter(prefix="/v1/files", route_class=OpenAIRoute, tags=["files"])


@router.post("", summary="Upload a batch input file (multipart: file, purpose=batch)",
             responses=error_responses(OPENAI, 413, 429), openapi_extra={**UPLOAD_BODY, **FILE_OBJECT})
async def upload_file(request: Request, who: Principal = Depends(caller), svc: Services = Depends(services_of)
                      ) -> dict:
    files.check_enabled(svc)
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared[:18]) > svc.settings.max_file_bytes + 65536:
        raise ApiError(413, f"The file is larger than the limit of {svc.settings.max_file_bytes} bytes.",
                       param="file")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise ApiError(400, "Upload the file as multipart/form-data with a 'file' part and purpose=batch.",
                       param="file")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception as error:  # a malformed multipart body is the caller's mistake, not a 500
        raise ApiError(400, f"The multipart body could not be read: {error}", param="file") from None
    part = form.get("file")
    if not isinstance(part, UploadFile):
        raise ApiError(400, "The upload has no 'file' part.", param="file")
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
        "ETag": etag, "Content-Disposition": f'attachment; filename="{item["filename"]}"'})


@router.delete("/{file_id}", summary="Delete a file", responses=error_responses(OPENAI),
               openapi_extra=FILE_DELETED)
def delete_file(file_id: str, who: Principal = Depends(caller), svc: Services = Depends(services_of)) -> dict:
    return files.delete(svc, who, file_id)
