"""batchctl's user commands: submit, status, list, wait, results, cancel and delete, as a client of the
service's own HTTP API (never its storage). Batch ids (`batch_...`) go to `/v1/batches`, Message Batch ids
(`msgbatch_...`) to `/v1/messages/batches`; the commands are the same for both.

stdout carries only what a command answers (a batch id, a status, results, or one JSON document with
--json); progress and notes go to stderr, and every failure is one line there: `batchctl: <message>`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import sys
import time
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from .api_client import ApiClient, ApiFailure, api_root
from .common import (
    EXIT_API,
    EXIT_INTERRUPTED,
    EXIT_NOT_COMPLETED,
    EXIT_OK,
    EXIT_USAGE,
    LOCAL_STACK_FILE,
    UsageError,
    one_line,
)

MESSAGE_BATCH_PREFIX = "msgbatch_"
CHAT = "/v1/chat/completions"
ENDPOINTS = (CHAT, "/v1/embeddings", "/v1/responses")
OPENAI_FINAL = ("completed", "failed", "expired", "cancelled")
# The inline body a submission may have before it goes as a file batch: a deployed API takes a JSON body of
# at most ~6 MB (Lambda's invoke payload, under API Gateway's 10 MB), far below MAX_BODY_BYTES (32 MiB);
# 4 MiB leaves room for the headers and the event around it (settings.py reasons the same for uploads).
INLINE_MAX_BYTES = 4 * 1024 * 1024
# The service's MAX_UPLOAD_PART_BYTES and MAX_DIRECT_UPLOAD_BYTES defaults: a file up to one part goes in
# one POST /v1/files, a larger one through the Uploads API in parts of this size.
UPLOAD_PART_BYTES = 4 * 1024 * 1024
# How long an input file uploaded with --idempotency-key is kept: a retry within the Idempotency-Key's life
# (the 24-hour window, then 24 hours after the batch ends) finds it and sends the very same create body.
KEPT_INPUT_SECONDS = 48 * 3600
# A short batch is seen ending soon: a look every POLL_START_SECONDS for the first POLL_FAST_FOR_SECONDS,
# then the interval grows to --poll-interval (one GET each: nothing the service notices).
POLL_START_SECONDS = 0.5
POLL_FAST_FOR_SECONDS = 5.0
PLAIN_PROGRESS_SECONDS = 5.0  # not a terminal: a progress line this often (and the last one)
SPEED_WINDOW_SECONDS = 30.0  # requests per second over this much of the recent past


class Interrupted(Exception):
    """Ctrl-C while the batch runs on: the message says how to pick up again."""


def note(text: str) -> None:
    print(f"batchctl: note: {text}", file=sys.stderr, flush=True)


# --- Configuration ----------------------------------------------------------------------------------------

def env_defaults() -> dict[str, str | None]:
    """The user commands' only reading of the environment (the service's own settings are settings.py's):
    BATCH_API_URL and BATCH_API_KEY, the defaults of --base-url and --api-key."""
    return {"base_url": os.environ.get("BATCH_API_URL") or None, "api_key": os.environ.get("BATCH_API_KEY") or None}


def _local_stack(path: Path, required: bool) -> dict:
    if not path.exists():
        if required:
            raise UsageError(f"stack file {path} not found")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read stack file {path}: {error}") from None
    return data if isinstance(data, dict) else {}


def connection(args: argparse.Namespace) -> tuple[str, str]:
    """(base URL, API key): --base-url / BATCH_API_URL, --api-key / BATCH_API_KEY, else the local stack's
    (.local/stack.json and .local/api-key, written by `make run`). The local key is only ever sent to the
    local stack's URL."""
    stack_path = args.stack_file or LOCAL_STACK_FILE
    stack = _local_stack(stack_path, required=args.stack_file is not None)
    local_url = stack.get("api_url") if isinstance(stack.get("api_url"), str) else None
    base_url = args.base_url or local_url
    if not base_url:
        if stack:
            raise UsageError(f"{stack_path} has no api_url (a local stack started before batchctl knew it): "
                             "restart `make run`, or pass --base-url or set BATCH_API_URL")
        raise UsageError(f"no API URL: pass --base-url or set BATCH_API_URL, or start the local stack with "
                         f"`make run` in this folder ({stack_path} not found)")
    key = args.api_key
    if not key and local_url and api_root(base_url) == api_root(local_url):
        key_file = stack_path.parent / "api-key"
        try:
            key = key_file.read_text().strip() or None
        except OSError:
            key = None
    if not key:
        raise UsageError("no API key: pass --api-key or set BATCH_API_KEY")
    return base_url, key


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
    inline += (b',"metadata":' + json.dumps(metadata).encode() if metadata else b"") + b"}"
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
    file_id = _uploaded(client, name, len(jsonl)) if keep else None
    if file_id:
        note(f"reusing {file_id} ({name}), uploaded by an earlier call with this Idempotency-Key")
    else:
        file_id = _upload(client, name, jsonl, args.upload_part_bytes, KEPT_INPUT_SECONDS if keep else None)
    body: dict = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
    if metadata:
        body["metadata"] = metadata
    reply = client.request("POST", "/v1/batches", json=body, headers=headers)
    if not keep:  # the batch has its own copy: the upload would only take up the account's stored-files room
        try:
            client.delete(f"/v1/files/{quote(file_id, safe='')}")
        except ApiFailure:
            pass
    return _replayed(reply.data, reply.headers)


def _uploaded(client: ApiClient, name: str, size: int) -> str | None:
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


def _upload(client: ApiClient, name: str, data: bytes, part_bytes: int, expires_seconds: int | None) -> str:
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


# --- Reading batches ----------------------------------------------------------------------------------------

def is_message_batch(batch_id: str) -> bool:
    return batch_id.startswith(MESSAGE_BATCH_PREFIX)


def batch_path(batch_id: str) -> str:
    base = "/v1/messages/batches" if is_message_batch(batch_id) else "/v1/batches"
    return f"{base}/{quote(batch_id, safe='')}"


def _epoch(value: object) -> float:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):  # a Message Batch's RFC 3339 times
        try:
            return dt.datetime.fromisoformat(value).timestamp()
        except ValueError:
            return 0.0
    return 0.0


@dataclass(frozen=True)
class BatchView:
    """Either kind of batch, as the commands show it."""

    id: str
    status: str  # a batch's status; a Message Batch's processing_status
    total: int
    completed: int  # a Message Batch: succeeded
    failed: int  # a Message Batch: errored, canceled and expired
    ended: bool
    completed_ok: bool  # ended as completed (else `wait` exits 3)
    created_at: float
    raw: dict

    @classmethod
    def of(cls, raw: dict) -> BatchView:
        if raw.get("type") == "message_batch":
            counts = raw.get("request_counts") or {}
            total = sum(int(counts.get(k, 0)) for k in ("processing", "succeeded", "errored", "canceled", "expired"))
            ended = raw.get("processing_status") == "ended"
            # Ended after a cancel, or with requests its window ran out on: not completed. Errored requests
            # alone are like failed requests in a completed batch: the batch completed.
            ok = ended and not raw.get("cancel_initiated_at") and not counts.get("expired")
            return cls(raw["id"], raw.get("processing_status", "?"), total, int(counts.get("succeeded", 0)),
                       sum(int(counts.get(k, 0)) for k in ("errored", "canceled", "expired")), ended, ok,
                       _epoch(raw.get("created_at")), raw)
        counts = raw.get("request_counts") or {}
        status = raw.get("status", "?")
        return cls(raw["id"], status, int(counts.get("total", 0)), int(counts.get("completed", 0)),
                   int(counts.get("failed", 0)), status in OPENAI_FINAL, status == "completed",
                   _epoch(raw.get("created_at")), raw)

    def counts_text(self) -> str:
        if self.raw.get("type") == "message_batch":
            c = self.raw.get("request_counts") or {}
            text = (f"{self.total} total, {c.get('succeeded', 0)} succeeded, {c.get('errored', 0)} errored, "
                    f"{c.get('canceled', 0)} canceled, {c.get('expired', 0)} expired")
            return text + (f", {c['processing']} processing" if c.get("processing") else "")
        return f"{self.total} total, {self.completed} completed, {self.failed} failed"

    def summary(self) -> str:
        return f"{self.id} {self.status}: {self.counts_text()}"


def fetch(client: ApiClient, batch_id: str) -> BatchView:
    return BatchView.of(client.get(batch_path(batch_id)))


def _time(epoch: object) -> str:
    if not epoch:
        return "-"
    return dt.datetime.fromtimestamp(_epoch(epoch), dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def describe(view: BatchView) -> str:
    """`status` for a person: the batch and what is known about it, one field a line."""
    raw = view.raw
    rows = [("requests", view.counts_text())]
    if raw.get("type") == "message_batch":
        rows += [("created", _time(raw.get("created_at"))), ("expires", _time(raw.get("expires_at"))),
                 ("cancel asked", _time(raw.get("cancel_initiated_at"))), ("ended", _time(raw.get("ended_at"))),
                 ("results", raw.get("results_url") or "-")]
    else:
        ended_at = next((raw[f"{s}_at"] for s in OPENAI_FINAL if raw.get(f"{s}_at")), None)
        usage = raw.get("usage") or {}
        rows += [("endpoint", raw.get("endpoint", "-")), ("created", _time(raw.get("created_at"))),
                 ("expires", _time(raw.get("expires_at"))), ("ended", _time(ended_at)),
                 ("input file", raw.get("input_file_id") or "-"), ("output file", raw.get("output_file_id") or "-"),
                 ("error file", raw.get("error_file_id") or "-"),
                 ("usage", f"{usage.get('input_tokens', 0)} input + {usage.get('output_tokens', 0)} output tokens, "
                           f"${float(raw.get('cost_usd') or 0):.6f}"),
                 ("metadata", ", ".join(f"{k}={v}" for k, v in (raw.get("metadata") or {}).items()) or "-")]
        errors = (raw.get("errors") or {}).get("data") or []
        rows += [("error", f"line {e.get('line')}: {e.get('code')}: {e.get('message')}") for e in errors[:5]]
        if raw.get("error"):
            rows.append(("error", f"{raw['error'].get('code')}: {raw['error'].get('message')}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"{view.id}  {view.status}", *(f"  {k:<{width}}  {v}" for k, v in rows)])


def list_batches(client: ApiClient, limit: int) -> tuple[list[BatchView], bool]:
    """The newest `limit` batches of both kinds, newest first, and whether there are more."""
    def collect(path: str, page_max: int, cursor: str) -> tuple[list[dict], bool]:
        items: list[dict] = []
        after = None
        while len(items) < limit:
            page = client.get(path, limit=min(page_max, limit - len(items)), **{cursor: after})
            items += page.get("data") or []
            if not page.get("has_more") or not page.get("data"):
                return items, False
            after = page["data"][-1]["id"]
        return items, True

    batches, more = collect("/v1/batches", 100, "after")
    try:
        messages, more_messages = collect("/v1/messages/batches", 1000, "after_id")
    except ApiFailure as failure:
        if failure.status != 404:  # a service without Message Batches
            raise
        messages, more_messages = [], False
    views = sorted((BatchView.of(b) for b in batches + messages), key=lambda v: (v.created_at, v.id), reverse=True)
    return views[:limit], more or more_messages or len(views) > limit


def _table(views: list[BatchView]) -> str:
    rows = [("ID", "STATUS", "REQUESTS", "CREATED")]
    rows += [(v.id, v.status, v.counts_text(), _time(v.created_at)) for v in views]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows)


# --- Waiting ------------------------------------------------------------------------------------------------

class Speed:
    """Requests finished per second over the recent past, and the time left at that pace."""

    def __init__(self, window: float = SPEED_WINDOW_SECONDS) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def observe(self, now: float, done: int, total: int) -> tuple[float | None, float | None]:
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        start, done_then = self.samples[0]
        if now <= start:
            return None, None
        rate = max(done - done_then, 0) / (now - start)
        return rate, (max(total - done, 0) / rate if rate > 0 else None)


def _rate_text(rate: float | None) -> str:
    return "--" if rate is None else f"{rate:.1f}"


def _eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_line(view: BatchView, rate: float | None, eta: float | None) -> str:
    """e.g. `batch_x: 120/1000 completed, 3 failed, 40.0 req/s, ETA 22s [in_progress]`. A Message Batch
    reports its counts only once it has ended."""
    return (f"{view.id}: {view.completed}/{view.total} completed, {view.failed} failed, {_rate_text(rate)} req/s, "
            f"ETA {_eta_text(eta)} [{view.status}]")


class PlainProgress:
    """Not a terminal (a log, a CI job): a line now and then, and one when the batch has ended."""

    def __init__(self, stream: IO[str], every: float = PLAIN_PROGRESS_SECONDS) -> None:
        self.stream, self.every, self.last = stream, every, None

    def update(self, view: BatchView, rate: float | None, eta: float | None) -> None:
        now = time.monotonic()
        if view.ended or self.last is None or now - self.last >= self.every:
            print(progress_line(view, rate, eta), file=self.stream, flush=True)
            self.last = now

    def close(self) -> None:
        pass


class LiveProgress:
    """A terminal: a live bar (rich), redrawn in place. The id goes on a line of its own above it, so the bar's
    row fits in 80 columns: status, bar, completed/total, failed, req/s, ETA."""

    def __init__(self, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.console = Console(file=stream)
        self.progress = Progress(
            TextColumn("{task.fields[status]:<11}"), BarColumn(bar_width=20),
            TextColumn("{task.fields[counts]}"), TextColumn("{task.fields[speed]} req/s"),
            TextColumn("ETA {task.fields[eta]}"), console=self.console, transient=False)
        self.task: Any = None

    def update(self, view: BatchView, rate: float | None, eta: float | None) -> None:
        fields = {"counts": f"{view.completed}/{view.total} completed, {view.failed} failed",
                  "speed": _rate_text(rate), "eta": _eta_text(eta), "status": view.status}
        done = view.completed + view.failed
        if self.task is None:
            self.console.print(f"{view.id} [dim](Ctrl-C stops waiting; the batch runs on)[/dim]", highlight=False)
            self.progress.start()
            self.task = self.progress.add_task(view.id, total=view.total or None, completed=done, **fields)
        else:
            self.progress.update(self.task, total=view.total or None, completed=done, **fields)

    def close(self) -> None:
        self.progress.stop()


def progress_for(stream: IO[str]) -> PlainProgress | LiveProgress:
    if stream.isatty():
        try:
            return LiveProgress(stream)
        except ImportError:  # rich is a dependency of batchctl's venv, not of the service's Lambda layer
            pass
    return PlainProgress(stream)


def wait_for(client: ApiClient, batch_id: str, poll_seconds: float, resume_hint: str) -> BatchView:
    """Poll until the batch has ended, showing progress on stderr. Ctrl-C: Interrupted (it runs on)."""
    view = fetch(client, batch_id)
    display = progress_for(sys.stderr)
    speed = Speed()
    started = time.monotonic()
    delay = min(POLL_START_SECONDS, poll_seconds)
    try:
        while True:
            now = time.monotonic()
            rate, eta = speed.observe(now, view.completed + view.failed, view.total)
            display.update(view, rate, 0.0 if view.ended else eta)
            if view.ended:
                return view
            time.sleep(delay)
            if now - started >= POLL_FAST_FOR_SECONDS:
                delay = min(delay * 1.5, poll_seconds)
            view = fetch(client, batch_id)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: {batch_id} keeps running; resume waiting with `{resume_hint}`") from None
    finally:
        display.close()


# --- Results ------------------------------------------------------------------------------------------------

def _is_failed(entry: dict, message_batch: bool) -> bool:
    if message_batch:
        return (entry.get("result") or {}).get("type") != "succeeded"
    response = entry.get("response") or {}
    return entry.get("error") is not None or not 200 <= int(response.get("status_code") or 0) < 300


def download_results(client: ApiClient, batch_id: str, out: str | None, failed_only: bool) -> tuple[int, int]:
    """Stream the batch's results (every line, or only those that did not succeed) to `out` (stdout when
    None or '-'), never holding more than a line. A file appears whole or not at all. (lines, failed)."""
    message_batch = is_message_batch(batch_id)
    # output.jsonl: every result in submission order, as OpenAI's output file lines; a Message Batch's
    # results: Anthropic's lines. Both stream (or redirect to storage when large) once the batch has ended.
    path = batch_path(batch_id) + ("/results" if message_batch else "/output.jsonl")
    lines = failed = 0
    to_stdout = out in (None, "-")
    part = None if to_stdout else Path(f"{out}.part")
    try:
        sink: IO[bytes] = sys.stdout.buffer if part is None else part.open("wb")
    except OSError as error:
        raise UsageError(f"cannot write {out}: {error.strerror or error}") from None
    try:
        for line in client.stream_lines(path):
            bad = _is_failed(json.loads(line), message_batch)
            failed += bad
            if bad or not failed_only:
                sink.write(line + b"\n")
                lines += 1
        sink.flush()
        if part is not None:
            sink.close()
            os.replace(part, out)
    except BaseException:
        if part is not None:
            sink.close()
            part.unlink(missing_ok=True)
        raise
    return lines, failed


# --- Commands -----------------------------------------------------------------------------------------------

def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2), flush=True)


def _finish_wait(client: ApiClient, args: argparse.Namespace, view: BatchView, out: str | None,
                 summary_to_stdout: bool) -> int:
    print(view.summary(), file=sys.stdout if summary_to_stdout and not args.json else sys.stderr, flush=True)
    problems = (view.raw.get("errors") or {}).get("data") or []  # a file batch whose lines were refused
    for problem in problems[:5]:
        print(f"{view.id}: line {problem.get('line')}: {problem.get('code')}: {problem.get('message')}",
              file=sys.stderr)
    if len(problems) > 5:
        print(f"{view.id}: ... and more: batchctl status {view.id} --json", file=sys.stderr)
    if out:
        lines, failed = download_results(client, view.id, out, failed_only=False)
        print(f"wrote {lines} results ({failed} not succeeded) to {out}", file=sys.stderr, flush=True)
    if args.json:
        _print_json(view.raw)
    return EXIT_OK if view.completed_ok else EXIT_NOT_COMPLETED


def cmd_submit(client: ApiClient, args: argparse.Namespace) -> int:
    batch = submit_batch(client, args)
    if not args.json:
        print(batch["id"], flush=True)  # at once: a script (or a person) has it before the wait starts
    if not args.wait:
        if args.json:
            _print_json(batch)
        return EXIT_OK
    hint = f"batchctl wait {batch['id']}" + (f" -o {args.output}" if args.output else "")
    view = wait_for(client, batch["id"], args.poll_interval, hint)
    return _finish_wait(client, args, view, args.output, summary_to_stdout=False)


def cmd_wait(client: ApiClient, args: argparse.Namespace) -> int:
    hint = f"batchctl wait {args.id}" + (f" -o {args.output}" if args.output else "")
    view = wait_for(client, args.id, args.poll_interval, hint)
    return _finish_wait(client, args, view, args.output, summary_to_stdout=True)


def cmd_status(client: ApiClient, args: argparse.Namespace) -> int:
    view = fetch(client, args.id)
    if args.json:
        _print_json(view.raw)
    else:
        print(describe(view))
    return EXIT_OK


def cmd_list(client: ApiClient, args: argparse.Namespace) -> int:
    views, more = list_batches(client, args.limit)
    if args.json:
        _print_json({"object": "list", "data": [v.raw for v in views], "has_more": more})
    elif views:
        print(_table(views))
        if more:
            print(f"(more: --limit {args.limit * 2})", file=sys.stderr)
    else:
        print("no batches", file=sys.stderr)
    return EXIT_OK


def cmd_results(client: ApiClient, args: argparse.Namespace) -> int:
    lines, failed = download_results(client, args.id, args.output, args.failed)
    if args.output and args.output != "-":
        if args.json:
            _print_json({"id": args.id, "path": args.output, "lines": lines, "not_succeeded": failed})
        else:
            print(f"wrote {lines} results to {args.output}", file=sys.stderr)
    return EXIT_OK


def cmd_cancel(client: ApiClient, args: argparse.Namespace) -> int:
    view = BatchView.of(client.post(batch_path(args.id) + "/cancel"))
    if args.json:
        _print_json(view.raw)
    else:
        print(f"{view.id} {view.status}")
    return EXIT_OK


def cmd_delete(client: ApiClient, args: argparse.Namespace) -> int:
    answer = client.delete(batch_path(args.id))
    if args.json:
        _print_json(answer)
    else:
        print(f"{args.id} deleted")
    return EXIT_OK


# --- Arguments ----------------------------------------------------------------------------------------------

def _metadata(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {value!r}")
    return key, val


def _positive(kind: type) -> Any:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not {value!r}") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, not {value}")
        return number
    return parse


def _common(env: dict[str, str | None]) -> argparse.ArgumentParser:
    """Options every user command takes, after its name (or before it: SUPPRESS keeps a value given
    before the command from being reset by the subcommand's default)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--base-url", default=env["base_url"],
                        help="the API's base URL, e.g. http://127.0.0.1:8000/v1 (default: $BATCH_API_URL, else the "
                             "local stack's, from .local/stack.json)")
    common.add_argument("--api-key", default=env["api_key"],
                        help="the API key (default: $BATCH_API_KEY, else the local stack's, .local/api-key)")
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument("--stack-file", type=Path, default=argparse.SUPPRESS,
                        help=f"the local stack's description (default: {LOCAL_STACK_FILE})")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="print the traceback of an error")
    return common


def _waiting(p: argparse.ArgumentParser) -> None:
    p.add_argument("--poll-interval", type=_positive(float), default=2.0, metavar="SECONDS",
                   help="the longest time between two looks at the batch (default: 2)")


def add_commands(groups: argparse._SubParsersAction) -> None:
    """The user commands and their options."""
    common = _common(env_defaults())

    p = groups.add_parser("submit", parents=[common], help="submit a batch; prints its id",
                          description="Submit FILE as a batch and print its id. FILE (or - for stdin) holds OpenAI "
                                      "batch lines ({custom_id, method, url, body}) or prompts, one a line (text or "
                                      "a JSON string), with --model. Small batches go inline; larger ones as a file "
                                      "batch (uploaded first).")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--model", help="the model of prompts, and of batch lines whose body names none")
    p.add_argument("--endpoint", choices=ENDPOINTS, default=None,
                   help=f"the url of prompts and of batch lines that give none (default: {CHAT})")
    p.add_argument("--metadata", type=_metadata, action="append", metavar="KEY=VALUE", help="repeatable")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help="sent as Idempotency-Key: submitting again with it answers with the first batch")
    p.add_argument("--wait", action="store_true", help="wait for the batch to end, showing progress")
    p.add_argument("-o", "--output", metavar="OUT", help="with --wait: write the results there (JSONL)")
    p.add_argument("--inline-max-bytes", type=int, default=INLINE_MAX_BYTES, metavar="BYTES",
                   help=f"larger batches go as a file batch (default: {INLINE_MAX_BYTES})")
    p.add_argument("--upload-part-bytes", type=_positive(int), default=UPLOAD_PART_BYTES, metavar="BYTES",
                   help="a file batch's input larger than this goes through the Uploads API in parts of this size "
                        f"(default: {UPLOAD_PART_BYTES}, the service's part limit)")
    _waiting(p)
    p.set_defaults(handler=cmd_submit)

    p = groups.add_parser("status", parents=[common], help="a batch's status and counts")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_status)

    p = groups.add_parser("list", parents=[common], help="your batches of both kinds, newest first")
    p.add_argument("--limit", type=_positive(int), default=20, metavar="N", help="at most N (default: 20)")
    p.set_defaults(handler=cmd_list)

    p = groups.add_parser("wait", parents=[common], help="wait for a batch to end, showing progress",
                          description="Wait for a batch to end. Exits 0 when it completed, 3 when it ended "
                                      "otherwise (failed, expired, cancelled), 130 on Ctrl-C (it runs on).")
    p.add_argument("id", metavar="ID")
    p.add_argument("-o", "--output", metavar="OUT", help="then write its results there (JSONL)")
    _waiting(p)
    p.set_defaults(handler=cmd_wait)

    p = groups.add_parser("results", parents=[common], help="a batch's results as JSONL, once it has ended")
    p.add_argument("id", metavar="ID")
    p.add_argument("-o", "--output", metavar="FILE", help="write them there (default: stdout)")
    p.add_argument("--failed", action="store_true", help="only the requests that did not succeed")
    p.set_defaults(handler=cmd_results)

    p = groups.add_parser("cancel", parents=[common], help="cancel a batch (running requests finish)")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_cancel)

    p = groups.add_parser("delete", parents=[common], help="delete a batch with its results")
    p.add_argument("id", metavar="ID")
    p.set_defaults(handler=cmd_delete)


def run_command(args: argparse.Namespace) -> int:
    """Run one user command. Exit codes: see common.py (0, 1, 2, 3, 130)."""
    try:
        if args.handler is cmd_submit and args.output and not args.wait:
            raise UsageError("-o/--output needs --wait (or use `batchctl results ID -o OUT` later)")
        base_url, key = connection(args)
        with ApiClient(base_url, key) as client:
            return args.handler(client, args)
    except (UsageError, ApiFailure, Interrupted) as error:
        code = EXIT_USAGE if isinstance(error, UsageError) else EXIT_API if isinstance(error, ApiFailure) \
            else EXIT_INTERRUPTED
        return _fail(args, error, code)
    except KeyboardInterrupt as error:
        return _fail(args, error, EXIT_INTERRUPTED, "interrupted")
    except BrokenPipeError:  # `batchctl results ID | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as error:  # a bug: still one line; --debug shows where
        return _fail(args, error, EXIT_API, f"unexpected error: {type(error).__name__}: {error}")


def _fail(args: argparse.Namespace, error: BaseException, code: int, text: str | None = None) -> int:
    if getattr(args, "debug", False):
        traceback.print_exception(error)
    print(f"batchctl: {one_line(text or error)}", file=sys.stderr, flush=True)
    return code
