"""The Uploads API (`/v1/uploads`): a batch input file sent in parts, as the OpenAI SDK's
`client.uploads.upload_file_chunked(file=..., mime_type=..., purpose="batch", part_size=...)` sends one, for
files larger than one API request may carry (`POST /v1/files` takes a file in one body, and a Lambda's at
most 6 MB).

An upload is one DynamoDB record (`records.Upload`) and one S3 object per part (`layout.upload_part_object`):
S3's own multipart upload wants parts of at least 5 MiB but the last, and a part that passes API Gateway and
Lambda is smaller (`settings.max_upload_part_bytes`). Completing it streams the named parts, in the order
named, into the file's object (`Blobs.put_stream`, 8 MiB of S3 multipart at a time) with its size and
SHA-256 taken on the way; the file's record and the upload's completion are then one transaction, and the
parts are deleted.

An upload is counted against the account's upload limits when it is created, as a file sent to
`POST /v1/files` is (`files.admit_upload`), and the stored-bytes limit is checked again when it completes.
A pending upload expires an hour after it was created and reads as not found from then on. Nothing deletes
the parts of an expired upload on time: the data bucket's lifecycle rule for `files/` (`expire-files` in
infra/storage.py; the parts lie under `files/<upload id>/parts/`) removes them later, and DynamoDB's TTL
removes the record a day after the upload expired.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterator

from ...domain import UPLOAD_IDS, new_file_id, new_upload_id
from ...errors import ApiError, InternalError, InvalidRequest, NotFound, PayloadTooLarge, clipped
from ...layout import file_object, upload_part_object, upload_parts_prefix
from ...records import File, Upload, UploadItem
from ...runtime import Services
from ...service.accounts import Principal
from ...service.creating.intake import parse_json_body
from ...storage.dynamo import ConditionFailed
from . import files

UPLOAD_SECONDS = 3600  # a pending upload expires an hour after it was created, as OpenAI's do
MAX_PARTS = 1000  # parts one upload may hold (32 MiB in parts of 4 MiB is 8)
RECEIVED_FACTOR = 2  # an upload's parts may hold up to twice its bytes: room for parts sent again
MAX_NAME_CHARS = files.MAX_FILENAME_CHARS  # a filename's and a MIME type's
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def new_part_id() -> str:
    return "part_" + secrets.token_hex(12)


def upload_object_of(item: UploadItem, file: dict | None = None) -> dict:
    """The upload as the OpenAI SDK parses it (`Upload`); `file`: the FileObject, once completed."""
    return {"id": item["id"], "object": "upload", "bytes": item["bytes"], "created_at": item["created_at"],
            "expires_at": item["expires_at"], "filename": item["filename"], "purpose": item["purpose"],
            "status": item["status"], "file": file}


def part_too_large(limit: int, size: int | None) -> ApiError:
    """413 for a part over the limit, naming the part size that passes. `size`: the part's, when it was read
    (else only the request's declared length was)."""
    what = (f"The part is {size} bytes, larger than the limit of {limit} bytes a part." if size is not None
            else f"The request is larger than a part of at most {limit} bytes (the limit) makes.")
    return PayloadTooLarge(f"{what} Send parts of at most {limit} bytes: pass part_size={limit} to "
                           "client.uploads.upload_file_chunked(...).", code="part_too_large", param="data")


def _object(raw: bytes) -> dict:
    payload = parse_json_body(raw)
    if not isinstance(payload, dict):
        raise InvalidRequest("The body must be a JSON object.")
    return payload


def _text(payload: dict, name: str) -> str:
    value = payload.get(name)
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME_CHARS or _CONTROL.search(value):
        raise InvalidRequest(f"{name} must be a non-empty string of at most {MAX_NAME_CHARS} characters, without "
                             "control characters.", param=name)
    return value


# --- Create ---------------------------------------------------------------------------------------------

def create(svc: Services, principal: Principal, raw: bytes) -> dict:
    """Start an upload (`POST /v1/uploads`): checked and counted as an upload of `bytes` bytes."""
    files.check_enabled(svc)
    payload = _object(raw)
    filename, mime_type = _text(payload, "filename"), _text(payload, "mime_type")
    size = payload.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidRequest("bytes must be the file's size: a whole number of bytes, 0 or more.", param="bytes")
    expires_after = payload.get("expires_after")
    if expires_after is not None:
        if not isinstance(expires_after, dict):
            raise InvalidRequest("expires_after must be an object {anchor, seconds}.", param="expires_after")
        expires_after = files.expires_after_seconds(expires_after.get("anchor"), expires_after.get("seconds"),
                                                    "expires_after")
    files.admit_upload(svc, principal, purpose=payload.get("purpose"), size=size, param="bytes")
    now = svc.now()
    item = Upload.new(upload_id=new_upload_id(), account_id=principal.account_id, filename=filename,
                      purpose=files.UPLOAD, mime_type=mime_type, size=size, now=now, expires_at=now + UPLOAD_SECONDS,
                      file_expires_after=expires_after)
    Upload.create(svc.table, item)
    return upload_object_of(item)


# --- Find -----------------------------------------------------------------------------------------------

def owned_upload(svc: Services, principal: Principal, upload_id: str) -> UploadItem:
    """The account's upload; 404 when it is not there, another account's, or pending past its hour."""
    item = Upload.get(svc.table, upload_id) if UPLOAD_IDS.names(upload_id) else None
    if (item is None or item.get("account_id") != principal.account_id
            or (item["status"] == Upload.PENDING and item["expires_at"] <= svc.now())):
        raise NotFound(f"No such Upload object: {clipped(upload_id)}", code="upload_not_found", param="upload_id")
    return item


def _still_pending(item: UploadItem) -> UploadItem:
    if item["status"] != Upload.PENDING:
        raise InvalidRequest(f"Upload {item['id']} is already {item['status']}; it takes no more parts and cannot "
                             "be completed or cancelled again.", code="upload_not_pending", param="upload_id")
    return item


# --- Parts ----------------------------------------------------------------------------------------------

def add_part(svc: Services, principal: Principal, upload_id: str, data: bytes) -> dict:
    """Store one part (`POST /v1/uploads/{id}/parts`): its bytes first, then its place in the record (a
    part whose record never comes is only an object the lifecycle rule removes)."""
    files.check_enabled(svc)
    item = _still_pending(owned_upload(svc, principal, upload_id))
    limit = svc.settings.max_upload_part_bytes
    if len(data) > limit:
        raise part_too_large(limit, len(data))
    part_id, now = new_part_id(), svc.now()
    key = upload_part_object(upload_id, part_id)
    svc.blobs.put(key, data)
    try:
        Upload.add_part(svc.table, upload_id, part_id, len(data), now, RECEIVED_FACTOR * item["bytes"], MAX_PARTS)
    except ConditionFailed:
        svc.blobs.delete(key)
        item = _still_pending(owned_upload(svc, principal, upload_id))  # completed, cancelled or expired since?
        raise InvalidRequest(f"Upload {upload_id} has no room for this part: it holds {len(item['parts'])} parts "
                             f"of {item['received']} bytes together, and takes at most {MAX_PARTS} parts of "
                             f"{RECEIVED_FACTOR * item['bytes']} bytes together ({RECEIVED_FACTOR} times its "
                             "bytes). Complete it with the parts it needs, or cancel it.",
                             code="upload_full", param="data") from None
    return {"id": part_id, "object": "upload.part", "created_at": now, "upload_id": upload_id}


# --- Complete and cancel --------------------------------------------------------------------------------

def _replay(svc: Services, item: UploadItem) -> dict:
    """The answer of a completion already made (a client that did not get it sends it again)."""
    found = File.get(svc.table, item["file_id"])
    return upload_object_of(item, files.file_object_of(found) if found else None)


def _part_ids(payload: dict, item: UploadItem) -> list[str]:
    part_ids = payload.get("part_ids")
    if not isinstance(part_ids, list) or not all(isinstance(p, str) for p in part_ids):
        raise InvalidRequest("part_ids must be the list of the upload's part ids, in the file's order.",
                             param="part_ids")
    if len(set(part_ids)) != len(part_ids):
        raise InvalidRequest("part_ids names a part more than once.", param="part_ids")
    unknown = [p for p in part_ids if p not in item["parts"]]
    if unknown:
        raise InvalidRequest(f"part_ids: upload {item['id']} has no part {unknown[0]!r}.", param="part_ids")
    total = sum(item["parts"][p] for p in part_ids)
    if total != item["bytes"]:
        raise InvalidRequest(f"The parts named add up to {total} bytes, not the {item['bytes']} bytes the upload "
                             "was created with.", code="upload_size_mismatch", param="part_ids")
    return part_ids


def complete(svc: Services, principal: Principal, upload_id: str, raw: bytes) -> dict:
    """Make the file of the named parts, in that order (`POST /v1/uploads/{id}/complete`), and answer the
    upload completed with its file. The same call again answers the same upload."""
    files.check_enabled(svc)
    payload = _object(raw)
    item = owned_upload(svc, principal, upload_id)
    if item["status"] == Upload.COMPLETED and payload.get("part_ids") == item.get("part_ids"):
        return _replay(svc, item)
    part_ids = _part_ids(payload, _still_pending(item))
    md5 = payload.get("md5")
    if md5 is not None and not isinstance(md5, str):
        raise InvalidRequest("md5 must be the file's MD5 as a hexadecimal string.", param="md5")
    files.check_storage(svc, principal.account_id, item["bytes"], "bytes")
    file_id, sha256, md5_of = new_file_id(), hashlib.sha256(), hashlib.md5(usedforsecurity=False)

    def concatenated() -> Iterator[bytes]:
        for part_id in part_ids:
            for chunk in svc.blobs.stream(upload_part_object(upload_id, part_id)):
                sha256.update(chunk)
                md5_of.update(chunk)
                yield chunk

    size = svc.blobs.put_stream(file_object(file_id), concatenated(), "application/jsonl")
    if md5 is not None and md5.strip().lower() != md5_of.hexdigest():
        svc.blobs.delete(file_object(file_id))
        raise InvalidRequest(f"The parts' MD5 is {md5_of.hexdigest()}, not the md5 given ({md5}).", param="md5")
    if size != item["bytes"]:  # the parts' objects no longer hold what their records say
        svc.blobs.delete(file_object(file_id))
        raise InternalError(f"Upload {upload_id}'s parts hold {size} bytes, not {item['bytes']}.")
    record = files.upload_record(svc, principal, file_id=file_id, filename=item["filename"], size=size,
                                 sha256=sha256.hexdigest(), expires_after=item.get("file_expires_after"))
    try:
        svc.table.transact([File.create(svc.table, record),
                            Upload.complete(svc.table, upload_id, file_id, part_ids, svc.now())])
    except ConditionFailed:  # completed (by the same call sent twice at once), cancelled or expired meanwhile
        svc.blobs.delete(file_object(file_id))
        again = owned_upload(svc, principal, upload_id)
        if again["status"] == Upload.COMPLETED and again.get("part_ids") == part_ids:
            return _replay(svc, again)
        _still_pending(again)
        raise
    svc.blobs.delete_prefix(upload_parts_prefix(upload_id))
    return upload_object_of({**item, "status": Upload.COMPLETED}, files.file_object_of(record))


def cancel(svc: Services, principal: Principal, upload_id: str) -> dict:
    """Cancel a pending upload and delete its parts (`POST /v1/uploads/{id}/cancel`); a cancelled one
    answers the same again."""
    item = owned_upload(svc, principal, upload_id)
    if item["status"] != Upload.CANCELLED:
        try:
            Upload.cancel(svc.table, _still_pending(item)["id"], svc.now())
        except ConditionFailed:  # completed or cancelled meanwhile
            item = owned_upload(svc, principal, upload_id)
            if item["status"] != Upload.CANCELLED:
                _still_pending(item)
                raise
        svc.blobs.delete_prefix(upload_parts_prefix(upload_id))
    return upload_object_of({**item, "status": Upload.CANCELLED})
