"""A file batch's input file, put on the service through its Files API: in one POST /v1/files, or through
the Uploads API in parts when it is larger than one part."""

from __future__ import annotations

import hashlib
from urllib.parse import quote

from .api_client import ApiClient, ApiFailure
from .common import note

# The service's MAX_UPLOAD_PART_BYTES and MAX_DIRECT_UPLOAD_BYTES defaults: a file up to one part goes in
# one POST /v1/files, a larger one through the Uploads API in parts of this size.
UPLOAD_PART_BYTES = 4 * 1024 * 1024
# How long an input file uploaded with --idempotency-key is kept: a retry within the Idempotency-Key's life
# (the 24-hour window, then 24 hours after the batch ends) finds it and sends the very same create body.
KEPT_INPUT_SECONDS = 48 * 3600


def find_upload(client: ApiClient, name: str, size: int) -> str | None:
    """An input file already uploaded under this name and size, if there is one."""
    after = None
    while True:
        page = client.get("/v1/files", purpose="batch", limit=10000, after=after)
        for item in page.get("data") or []:
            if item.get("filename") == name and item.get("bytes") == size:
                return item["id"]
        if not page.get("has_more") or not page.get("data"):
            return None
        after = page["data"][-1]["id"]


def upload(client: ApiClient, name: str, data: bytes, part_bytes: int, expires_seconds: int | None) -> str:
    """Upload the input file: one POST /v1/files when it fits in a part, else the Uploads API."""
    if len(data) <= part_bytes:
        form = {"purpose": "batch"}
        if expires_seconds:
            form |= {"expires_after[anchor]": "created_at", "expires_after[seconds]": str(expires_seconds)}
        item = client.request("POST", "/v1/files", files={"file": (name, data, "application/jsonl")}, data=form).data
        note(f"file batch: uploaded {name} ({len(data)} bytes) as {item['id']}")
        return item["id"]
    create: dict = {"filename": name, "purpose": "batch", "bytes": len(data), "mime_type": "application/jsonl"}
    if expires_seconds:
        create["expires_after"] = {"anchor": "created_at", "seconds": expires_seconds}
    upload_id = client.post("/v1/uploads", create)["id"]
    path = f"/v1/uploads/{quote(upload_id, safe='')}"
    try:
        part_ids = [client.request("POST", f"{path}/parts", files={
            "data": ("part", data[start:start + part_bytes], "application/octet-stream")}).data["id"]
            for start in range(0, len(data), part_bytes)]
        done = client.post(f"{path}/complete", {
            "part_ids": part_ids, "md5": hashlib.md5(data, usedforsecurity=False).hexdigest()})
    except (ApiFailure, KeyboardInterrupt):
        try:  # its parts would otherwise wait an hour for the upload to expire
            client.post(f"{path}/cancel")
        except ApiFailure:
            pass
        raise
    note(f"file batch: uploaded {name} ({len(data)} bytes, {len(part_ids)} parts) as {done['file']['id']}")
    return done["file"]["id"]
