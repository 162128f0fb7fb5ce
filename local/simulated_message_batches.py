"""The simulated backend's Anthropic Message Batches API (a test double of Anthropic's batch tier): `POST
/v1/messages/batches`, `GET /v1/messages/batches` (newest first, `after_id`), `GET /v1/messages/batches/{id}`,
`POST /v1/messages/batches/{id}/cancel` and `GET /v1/messages/batches/{id}/results` (the `results_url`, JSONL,
answering `Range`). Each entry's `params` is answered as `/v1/messages` would answer it, with the same markers:
`[[sim:400]]` (errored, invalid_request_error), `[[sim:fail-always]]` and `[[sim:tier-500]]` (errored,
api_error; run directly, the latter succeeds) and `[[sim:batch-expired]]` (expired).

The knobs are the OpenAI Batches simulator's (`PUT /_sim/batches/config`): `turnaround_seconds`,
`never_finish` (with `answered_before_cancel`), `fail_jobs` (Anthropic fails no batch as a whole: every
request of such a batch ends errored, api_error). `GET /_sim/batches` counts these under `message_batches`;
`POST /_sim/batches/reset` forgets them with the rest."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from local.simulated_answers import MARK_400, MARK_FAIL, SimError, build_anthropic, parse_chat
from local.simulated_batches import MARK_EXPIRED, MARK_TIER_500

CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_REQUESTS = 100_000


def _stamp(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


def _errored(kind: str, message: str) -> dict[str, Any]:
    return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": message},
                                         "request_id": f"req_{uuid.uuid4().hex[:24]}"}}


def answer(params: dict[str, Any], fail: bool) -> dict[str, Any]:
    """One entry's `result`, as `/v1/messages` would have answered its params."""
    text = json.dumps(params)
    if MARK_EXPIRED in text:
        return {"type": "expired"}
    if MARK_400 in text:
        return _errored("invalid_request_error", "Simulated batch line error 400")
    if fail or MARK_FAIL in text or MARK_TIER_500 in text:
        return _errored("api_error", "Simulated batch line error 500")
    try:
        return {"type": "succeeded", "message": build_anthropic(parse_chat(params, ("max_tokens",)), params)}
    except SimError as err:
        return _errored("invalid_request_error", err.message)


def mount(app: FastAPI) -> None:
    """Add the Message Batches routes beside the OpenAI ones (`simulated_batches.mount` first: its state and
    knobs are shared)."""
    sim = app.state.sim_batches

    def finish(job: dict[str, Any], answered: int | None) -> None:
        """End the batch: its first `answered` entries (all: None) run, the rest canceled."""
        lines, counts = [], dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
        for n, entry in enumerate(job["_requests"]):
            result = answer(entry["params"], job["_fail"]) if answered is None or n < answered else \
                {"type": "canceled"}
            counts[result["type"]] += 1
            lines.append(json.dumps({"custom_id": entry["custom_id"], "result": result}, separators=(",", ":")))
        job["_results"] = ("\n".join(lines) + "\n").encode()
        job.update(processing_status="ended", request_counts=counts, ended_at=_stamp(time.time()),
                   results_url=f"{job['_base']}/v1/messages/batches/{job['id']}/results")

    def look(job: dict[str, Any]) -> dict[str, Any]:
        if job["processing_status"] == "canceling":
            finish(job, sim.config.answered_before_cancel if job["_never"] else 0)
        elif job["processing_status"] == "in_progress" and not job["_never"] and \
                time.monotonic() - job["_made"] >= sim.config.turnaround_seconds:
            finish(job, None)
        return job

    def shown(job: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in job.items() if not k.startswith("_")}

    def seen(request: Request) -> JSONResponse | None:
        """The headers every call needs (anthropic-version; the key is noted for the tests)."""
        sim.message_batch_keys.add(request.headers.get("x-api-key"))
        if not request.headers.get("anthropic-version"):
            return _error(400, "invalid_request_error", "anthropic-version: header is required")
        return None

    @app.post("/v1/messages/batches")
    async def create(request: Request) -> Response:
        if refused := seen(request):
            return refused
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "invalid_request_error", "The request body is not valid JSON.")
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not 1 <= len(requests) <= MAX_REQUESTS:
            return _error(400, "invalid_request_error", "requests: between 1 and 100000 items are required")
        ids = [entry.get("custom_id") if isinstance(entry, dict) else None for entry in requests]
        bad = next((i for i in ids if not isinstance(i, str) or not CUSTOM_ID.fullmatch(i)), "")
        if bad != "" or len(set(ids)) != len(ids):
            return _error(400, "invalid_request_error", f"requests: invalid or duplicate custom_id {bad!r}")
        if any(not isinstance(entry.get("params"), dict) for entry in requests):
            return _error(400, "invalid_request_error", "requests.params: an object is required")
        now = time.time()
        job = {"id": f"msgbatch_{uuid.uuid4().hex[:24]}", "type": "message_batch",
               "processing_status": "in_progress",
               "request_counts": {"processing": len(requests), "succeeded": 0, "errored": 0, "canceled": 0,
                                  "expired": 0},
               "ended_at": None, "created_at": _stamp(now), "expires_at": _stamp(now + 86400),
               "cancel_initiated_at": None, "archived_at": None, "results_url": None,
               "_requests": requests, "_made": time.monotonic(), "_never": sim.config.never_finish,
               "_fail": sim.config.fail_jobs, "_base": str(request.base_url).rstrip("/")}
        sim.message_batches[job["id"]] = job
        return JSONResponse(shown(job))

    @app.get("/v1/messages/batches")
    async def listed(request: Request, limit: int = 20, after_id: str | None = None) -> Response:
        if refused := seen(request):
            return refused
        jobs = list(reversed(sim.message_batches.values()))
        if after_id is not None:
            ids = [job["id"] for job in jobs]
            jobs = jobs[ids.index(after_id) + 1:] if after_id in ids else []
        page = [shown(look(job)) for job in jobs[:limit]]
        return JSONResponse({"data": page, "has_more": len(jobs) > limit,
                             "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None})

    @app.get("/v1/messages/batches/{batch_id}")
    async def retrieve(batch_id: str, request: Request) -> Response:
        if refused := seen(request):
            return refused
        job = sim.message_batches.get(batch_id)
        return JSONResponse(shown(look(job))) if job else _error(404, "not_found_error", f"No batch {batch_id}")

    @app.post("/v1/messages/batches/{batch_id}/cancel")
    async def cancel(batch_id: str, request: Request) -> Response:
        if refused := seen(request):
            return refused
        job = sim.message_batches.get(batch_id)
        if job is None:
            return _error(404, "not_found_error", f"No batch {batch_id}")
        if job["processing_status"] == "in_progress":
            sim.message_batch_cancels += 1
            job.update(processing_status="canceling", cancel_initiated_at=_stamp(time.time()))
        return JSONResponse(shown(job))

    @app.get("/v1/messages/batches/{batch_id}/results")
    async def results(batch_id: str, request: Request) -> Response:
        if refused := seen(request):
            return refused
        job = sim.message_batches.get(batch_id)
        if job is None or job["processing_status"] != "ended":
            return _error(404, "not_found_error", f"No results for batch {batch_id} (not ended)")
        data = memoryview(job["_results"])
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("range", ""))
        if asked:
            start = int(asked.group(1))
            end = min(int(asked.group(2)) if asked.group(2) else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return Response(status_code=416, headers={"content-range": f"bytes */{len(data)}"})
            return Response(bytes(data[start:end + 1]), status_code=206, media_type="application/x-jsonl",
                            headers={"content-range": f"bytes {start}-{end}/{len(data)}"})
        return Response(bytes(data), media_type="application/x-jsonl")
