"""Batch files (`/v1/files`): uploads of JSONL input files (purpose `batch`) and the output and error files
batches write (purpose `batch_output`). Only batch files exist: nothing else can use them.

A file is one S3 object and one DynamoDB record under the account's `by_owner` partition. Its size and
SHA-256 are fixed when it is written, so every download has the same bytes and the same ETag.
"""

from __future__ import annotations

import hashlib
import time

from ...domain import FILE_IDS, new_file_id
from ...errors import ApiError, InvalidRequest, NotFound, PayloadTooLarge, RateLimited, clipped
from ...layout import file_object
from ...records import Account, File, FileItem
from ...runtime import Services
from ...service.accounts import Principal
from ...service.reading.listing import owner_page
from ...storage.dynamo import ConditionFailed

UPLOAD = "batch"
MAX_FILENAME_CHARS = 512  # a file's name, however it is sent (a multipart upload, the Uploads API)
EXPIRES_AFTER_SECONDS = (3600, 2592000)  # what OpenAI accepts for expires_after / output_expires_after
NOT_ENABLED = "File batches are not enabled."


def check_enabled(svc: Services, param: str | None = None) -> None:
    if not svc.settings.file_batches_enabled:
        raise InvalidRequest(NOT_ENABLED, code="file_batches_disabled", param=param)


def expires_after_seconds(anchor: object, seconds: object, param: str) -> int:
    """The seconds of an `expires_after` / `output_expires_after` ({anchor: created_at, seconds})."""
    if anchor != "created_at":
        raise InvalidRequest(f"{param}[anchor] must be 'created_at'.", param=f"{param}[anchor]")
    try:
        value = int(str(seconds).strip())
    except ValueError:
        value = -1
    low, high = EXPIRES_AFTER_SECONDS
    if not low <= value <= high:
        raise InvalidRequest(f"{param}[seconds] must be a whole number of seconds from {low} to {high}.",
                             param=f"{param}[seconds]")
    return value


def file_object_of(item: FileItem) -> dict:
    """The file as the OpenAI SDK parses it (`FileObject`)."""
    return {"id": item["id"], "object": "file", "bytes": item["bytes"], "created_at": item["created_at"],
            "expires_at": item.get("expires_at"), "filename": item["filename"], "purpose": item["purpose"],
            "status": "processed", "status_details": None}


def _not_found(file_id: str) -> ApiError:
    return NotFound(f"No such File object: {clipped(file_id)}", code="file_not_found", param="file_id")


def stored_file(svc: Services, account_id: str, file_id: str) -> FileItem | None:
    """The account's file, or None: not there, another account's, or expired."""
    item = File.get(svc.table, file_id) if FILE_IDS.names(file_id) else None
    if item is None or item.get("account_id") != account_id:
        return None
    if item.get("expires_at") and item["expires_at"] <= svc.now():
        return None
    return item


def owned_file(svc: Services, principal: Principal, file_id: str) -> FileItem:
    item = stored_file(svc, principal.account_id, file_id)
    if item is None:
        raise _not_found(file_id)
    return item


def _stored_upload_bytes(svc: Services, account_id: str) -> int:
    """What the account's unexpired uploads hold now (result files do not count)."""
    now = svc.now()
    return sum(int(f["bytes"]) for f in File.all_of_owner(svc.table, account_id)
               if f.get("purpose") == UPLOAD and not (f.get("expires_at") and f["expires_at"] <= now))


def check_storage(svc: Services, account_id: str, size: int, param: str = "file") -> None:
    """413 when `size` more bytes would take the account's stored uploads past the limit."""
    limit = svc.settings.max_stored_file_bytes
    stored = _stored_upload_bytes(svc, account_id)
    if stored + size > limit:
        raise PayloadTooLarge(f"This upload would take your stored files past the limit of {limit} bytes ({stored} "
                              "bytes stored now); delete files you no longer need.", code="file_storage_exceeded",
                              param=param)


def admit_upload(svc: Services, principal: Principal, *, purpose: object, size: int, param: str = "file") -> None:
    """The checks an input file passes before anything of it is stored, whichever way it comes (`upload`
    below, or the Uploads API for a file sent in parts, `uploads`), then its place among the
    account's uploads this hour (counted last: a refused upload does not count). `param`: what names the
    size in the caller's request."""
    s = svc.settings
    check_enabled(svc)
    if purpose != UPLOAD:
        raise InvalidRequest(f"purpose must be 'batch', not {purpose!r}: only batch input files can be uploaded.",
                             param="purpose")
    if size > s.max_file_bytes:
        raise PayloadTooLarge(f"The file is {size} bytes, larger than the limit of {s.max_file_bytes} bytes.",
                              param=param)
    check_storage(svc, principal.account_id, size, param)
    now = svc.now()
    try:
        Account.count_upload(svc.table, principal.account_id, now // 3600, s.max_uploads_per_hour)
    except ConditionFailed:
        raise RateLimited(f"You have uploaded {s.max_uploads_per_hour} files this hour, the most allowed; try "
                          "again next hour.", code="too_many_uploads",
                          retry_after=3600 - now % 3600) from None


def upload_record(svc: Services, principal: Principal, *, file_id: str, filename: str, size: int, sha256: str,
                  expires_after: int | None) -> FileItem:
    """The record of an input file whose bytes are stored (layout.file_object), to be created."""
    now = svc.now()
    return File.new(file_id=file_id, account_id=principal.account_id, filename=filename or "upload", purpose=UPLOAD,
                    size=size, sha256=sha256, now=now,
                    expires_at=now + (expires_after or svc.settings.file_retention_seconds),
                    owner_created_us=time.time_ns() // 1000)


def too_large_for_one_request(svc: Services, size: int | None) -> ApiError:
    """The 413 for a file past what one request carries through API Gateway + Lambda: use the Uploads API."""
    limit, part = svc.settings.max_direct_upload_bytes, svc.settings.max_upload_part_bytes
    said = f"The file is {size} bytes; one" if size is not None else "One"
    return PayloadTooLarge(f"{said} request carries at most {limit} bytes here. Send larger files in parts with the "
                           "Uploads API: client.uploads.upload_file_chunked(file=..., mime_type='application/jsonl', "
                           f"purpose='batch', part_size={part}).", param="file", code="file_too_large_for_one_request")


def upload(svc: Services, principal: Principal, *, filename: str, purpose: object, data: bytes,
           expires_after: int | None) -> dict:
    """Store an uploaded input file. Checks come first; nothing is stored for a refused upload."""
    if len(data) > svc.settings.max_direct_upload_bytes and purpose == UPLOAD:
        raise too_large_for_one_request(svc, len(data))
    admit_upload(svc, principal, purpose=purpose, size=len(data))
    file_id = new_file_id()
    svc.blobs.put(file_object(file_id), data, "application/jsonl")
    item = upload_record(svc, principal, file_id=file_id, filename=filename, size=len(data),
                         sha256=hashlib.sha256(data).hexdigest(), expires_after=expires_after)
    svc.table.transact([File.create(svc.table, item)])
    return file_object_of(item)


def list_files(svc: Services, principal: Principal, *, after: str | None, limit: int, order: str,
               purpose: str | None) -> dict:
    if not 1 <= limit <= 10000:
        raise InvalidRequest("limit must be between 1 and 10000.", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequest(f"order must be 'asc' or 'desc', not '{order}'.", param="order")
    now = svc.now()
    return owner_page(svc, principal, File, ids=FILE_IDS, noun="file", after=after, limit=limit,
                      newest_first=order == "desc", shown=file_object_of,
                      visible=lambda f: not (f.get("expires_at") and f["expires_at"] <= now)
                      and (purpose is None or f.get("purpose") == purpose))


def content(svc: Services, principal: Principal, file_id: str) -> tuple[FileItem, bytes | None, str | None]:
    """(file, its bytes, None) for a file small enough for one API answer, else (file, None, a short-lived
    URL to download it from)."""
    item = owned_file(svc, principal, file_id)
    if item["bytes"] > svc.settings.export_redirect_bytes:
        return item, None, svc.blobs.presigned_get(file_object(file_id))
    data = svc.blobs.get(file_object(file_id))
    if data is None:  # deleted meanwhile
        raise _not_found(file_id)
    return item, data, None


def delete(svc: Services, principal: Principal, file_id: str) -> dict:
    """Delete a file for good. A batch created from an upload keeps its own copy of the requests; a deleted
    result file is not written again (its batch keeps naming it, its download answers 404)."""
    owned_file(svc, principal, file_id)
    svc.blobs.delete(file_object(file_id))
    File.delete(svc.table, file_id)
    return {"id": file_id, "object": "file", "deleted": True}


def read_upload(svc: Services, item: FileItem) -> bytes | None:
    return svc.blobs.get(file_object(item["id"]))
