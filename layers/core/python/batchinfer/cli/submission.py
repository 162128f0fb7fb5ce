"""`batchctl submit`'s input and its way to the service: FILE read as OpenAI batch lines or prompts, then
sent inline, or as a file batch (uploaded first, `uploads`) when it is too large for an inline body."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from .api_client import ApiClient, ApiFailure
from .common import UsageError, note
from .uploads import KEPT_INPUT_SECONDS, find_upload, upload

CHAT = "/v1/chat/completions"
ENDPOINTS = (CHAT, "/v1/embeddings", "/v1/responses")
# The inline body a submission may have before it goes as a file batch: a deployed API takes a JSON body of
# at most ~6 MB (Lambda's invoke payload, under API Gateway's 10 MB), far below MAX_BODY_BYTES (32 MiB);
# 4 MiB leaves room for the headers and the event around it (settings.py reasons the same for uploads).
INLINE_MAX_BYTES = 4 * 1024 * 1024


# --- Reading a submission -----------------------------------------------------------------------------------

def _text_lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of FILE (or stdin for '-'), decoded one line at a time."""
    try:
        handle: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a BOM some editors write
                raw = raw[3:]
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise UsageError(f"{path} line {number}: not UTF-8 text") from None


def _json_or_none(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _prompt_request(prompt: str, number: int, model: str, endpoint: str) -> dict:
    if endpoint == CHAT:
        body: dict = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    else:  # /v1/embeddings and /v1/responses both take the text as `input`
        body = {"model": model, "input": prompt}
    return {"custom_id": f"request-{number}", "method": "POST", "url": endpoint, "body": body}


def _batch_request(line: dict, number: int, model: str | None, endpoint: str | None) -> dict:
    """An OpenAI batch line, with what it leaves out filled in (the service checks the rest)."""
    request = {"custom_id": f"request-{number}", "method": "POST", "url": endpoint or CHAT, **line}
    body = request.get("body")
    if model and isinstance(body, dict) and "model" not in body:  # --model: for lines that name none
        request["body"] = {**body, "model": model}
    return request


def read_requests(path: str, model: str | None, endpoint: str | None) -> list[dict]:
    """FILE's requests as OpenAI batch lines. FILE is either batch lines (JSON objects with custom_id,
    method, url, body) or prompts, one a line (plain text or a JSON string), which need --model; which one
    its first line says. Blank lines are skipped."""
    requests: list[dict] = []
    prompts: bool | None = None
    for number, text in _text_lines(path):
        if not text.strip():
            continue
        parsed = _json_or_none(text)
        if prompts is None:
            prompts = not isinstance(parsed, dict)
            if prompts and not model:
                raise UsageError(f"{path} holds prompts (its first line is not a JSON object): give --model")
        if prompts:
            prompt = parsed if isinstance(parsed, str) else text
            requests.append(_prompt_request(prompt, len(requests) + 1, model or "", endpoint or CHAT))
        elif isinstance(parsed, dict):
            requests.append(_batch_request(parsed, len(requests) + 1, model, endpoint))
        else:
            raise UsageError(f"{path} line {number}: not a JSON object (the lines before it are batch requests)")
    if not requests:
        raise UsageError(f"{path} holds no requests")
    return requests



# --- Submitting ---------------------------------------------------------------------------------------------

def _single(values: set) -> Any:
    return next(iter(values)) if len(values) == 1 else None


def extensions(args: argparse.Namespace) -> dict:
    """The create body's extension fields the command was given: the spending cap (`max_cost_usd`), the
    priority among the account's batches and `execution` (direct, or on each model's provider batch tier)."""
    given = {"max_cost_usd": getattr(args, "max_cost", None), "priority": getattr(args, "priority", None),
             "execution": getattr(args, "execution", None)}
    return {name: value for name, value in given.items() if value is not None}


def submit_batch(client: ApiClient, args: argparse.Namespace) -> dict:
    """Create the batch by the route its size calls for (see INLINE_MAX_BYTES); the batch object."""
    requests = read_requests(args.file, args.model, args.endpoint)
    # A file batch takes one model and one endpoint for the whole file (the service checks every line).
    model = _single({r["body"].get("model") if isinstance(r.get("body"), dict) else None for r in requests})
    endpoint = _single({r.get("url") for r in requests})
    lines = [json.dumps(r, separators=(",", ":")).encode() for r in requests]
    del requests  # the encoded lines are all that is sent from here on
    metadata = dict(args.metadata) if args.metadata else None
    inline = b'{"requests":[' + b",".join(lines) + b"]"
    inline += b',"metadata":' + json.dumps(metadata).encode() if metadata else b""
    for name, value in extensions(args).items():
        inline += b',"' + name.encode() + b'":' + json.dumps(value).encode()
    inline += b"}"
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    if len(inline) <= args.inline_max_bytes:
        return _create(client, inline, headers)
    if not isinstance(model, str) or not isinstance(endpoint, str):
        note(f"{len(inline)} bytes is more than an inline batch should carry ({args.inline_max_bytes}), but a file "
             "batch takes one model and one url: sending it inline")
        return _create(client, inline, headers, hint="split FILE into one batch per model")
    jsonl = b"\n".join(lines) + b"\n"
    del lines
    try:
        return _create_from_file(client, args, jsonl, endpoint, metadata, headers)
    except ApiFailure as failure:
        if failure.code != "file_batches_disabled":
            raise
    note(f"file batches are not enabled on this service: sending the {len(inline)}-byte batch inline")
    return _create(client, inline, headers, hint="file batches are not enabled here: split FILE into smaller batches")


def _create(client: ApiClient, body: bytes, headers: dict[str, str] | None, hint: str | None = None) -> dict:
    try:
        reply = client.request("POST", "/v1/batches", content=body, headers=headers)
    except ApiFailure as failure:
        if hint and failure.status == 413:
            raise ApiFailure(failure.status, f"{failure.message} ({hint})", failure.code) from None
        raise
    return _replayed(reply.data, reply.headers)


def _replayed(batch: dict, headers: dict[str, str]) -> dict:
    if headers.get("idempotent-replayed") == "true":
        note(f"this Idempotency-Key already created {batch['id']}: nothing submitted again")
    return batch


def _create_from_file(client: ApiClient, args: argparse.Namespace, jsonl: bytes, endpoint: str,
                      metadata: dict | None, headers: dict[str, str] | None) -> dict:
    stem = "stdin" if args.file == "-" else Path(args.file).stem
    # The content's hash in the name: a retry with the same Idempotency-Key finds this very upload, so the
    # create body (its input_file_id) is the same and the service answers with the first call's batch.
    name = f"{stem}.{hashlib.sha256(jsonl).hexdigest()[:16]}.jsonl"
    keep = args.idempotency_key is not None
    file_id = find_upload(client, name, len(jsonl)) if keep else None
    if file_id:
        note(f"reusing {file_id} ({name}), uploaded by an earlier call with this Idempotency-Key")
    else:
        file_id = upload(client, name, jsonl, args.upload_part_bytes, KEPT_INPUT_SECONDS if keep else None)
    body: dict = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
    if metadata:
        body["metadata"] = metadata
    body.update(extensions(args))
    reply = client.request("POST", "/v1/batches", json=body, headers=headers)
    if not keep:  # the batch has its own copy: the upload would only take up the account's stored-files room
        try:
            client.delete(f"/v1/files/{quote(file_id, safe='')}")
        except ApiFailure:
            pass
    return _replayed(reply.data, reply.headers)


