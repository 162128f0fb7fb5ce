"""The simulated backend's OpenAI Files and Batches API (a test double of OpenAI's batch tier): `POST
/v1/files` (purpose batch), `POST /v1/batches`, `GET /v1/batches` (listed newest first), `GET
/v1/batches/{id}`, `POST /v1/batches/{id}/cancel` and `GET /v1/files/{id}/content` for the output and error
files. Each line is answered as the direct endpoint would answer it, with the same markers: `[[sim:400]]`
(an error line with a 400 body), `[[sim:fail-always]]` (a 500), and beside them `[[sim:tier-500]]` (a 500
from the tier only: run directly, it succeeds) and `[[sim:batch-expired]]` (never run: `error.code`
`batch_expired`).

Settable through `PUT /_sim/batches/config`: `turnaround_seconds` (a job completes at the first look after
it), `never_finish` (jobs stay in_progress until cancelled; `answered_before_cancel` of their first lines are
in the output then), `fail_jobs` (jobs fail validation as a whole). `GET /_sim/batches` counts what was made,
`POST /_sim/batches/reset` forgets every job and file and puts the settings back."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from local.simulated_answers import (
    MARK_400,
    MARK_FAIL,
    build_chat,
    build_embeddings,
    build_responses,
    parse_chat,
    parse_embeddings,
    parse_responses,
)

MARK_EXPIRED = "[[sim:batch-expired]]"
MARK_TIER_500 = "[[sim:tier-500]]"  # a 500 line from the batch tier only (run directly, it succeeds)
_BUILDERS = {"/v1/chat/completions": (parse_chat, build_chat), "/v1/embeddings": (parse_embeddings, build_embeddings),
             "/v1/responses": (parse_responses, build_responses)}


class BatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    turnaround_seconds: float = Field(0.0, ge=0)
    never_finish: bool = False
    answered_before_cancel: int = Field(0, ge=0)
    fail_jobs: bool = False


class _Batches:
    def __init__(self) -> None:
        self.config = BatchConfig()
        self.files: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.cancels = 0
        # Anthropic's Message Batches (local.simulated_message_batches): the same knobs, their own jobs.
        self.message_batches: dict[str, dict[str, Any]] = {}
        self.message_batch_cancels = 0
        self.message_batch_keys: set[str | None] = set()
        # Amazon Bedrock's model invocation jobs (local.simulated_bedrock_jobs), by ARN.
        self.bedrock_jobs: dict[str, dict[str, Any]] = {}
        self.bedrock_stops = 0

    def answer(self, line: dict[str, Any], endpoint: str) -> tuple[dict[str, Any], bool]:
        """(the output or error line for one input line, whether it goes to the output file)."""
        text = json.dumps(line.get("body"))
        base = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": line.get("custom_id")}
        if MARK_EXPIRED in text:
            return {**base, "response": None,
                    "error": {"code": "batch_expired", "message": "This request could not be executed before the "
                                                                  "completion window expired."}}, False
        if MARK_400 in text or MARK_FAIL in text or MARK_TIER_500 in text:
            status = 400 if MARK_400 in text else 500
            kind = "invalid_request_error" if status == 400 else "server_error"
            body = {"error": {"message": f"Simulated batch line error {status}", "type": kind, "param": None,
                              "code": "sim_rejected" if status == 400 else None}}
            return {**base, "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": body},
                    "error": None}, False
        parse, build = _BUILDERS[endpoint]
        body = line.get("body") or {}
        answer = build(parse(body), body)
        return {**base, "response": {"status_code": 200, "request_id": f"req_{uuid.uuid4().hex}", "body": answer},
                "error": None}, True

    def finish(self, job: dict[str, Any], lines: list[dict[str, Any]], status: str) -> None:
        out, err = [], []
        for line in lines:
            answered, ok = self.answer(line, job["endpoint"])
            (out if ok else err).append(json.dumps(answered, separators=(",", ":")))
        for kind, rows in (("output", out), ("error", err)):
            if rows:
                file_id = f"file-{uuid.uuid4().hex[:24]}"
                self.files[file_id] = {"id": file_id, "purpose": "batch_output",
                                       "content": ("\n".join(rows) + "\n").encode()}
                job[f"{kind}_file_id"] = file_id
        job["request_counts"] = {"total": len(job["_lines"]), "completed": len(out), "failed": len(err)}
        job["status"] = status
        job[f"{status}_at"] = int(time.time())

    def look(self, job: dict[str, Any]) -> dict[str, Any]:
        if job["status"] in ("completed", "failed", "expired", "cancelled"):
            return job
        lines = job["_lines"]
        if job["status"] == "cancelling":
            self.finish(job, lines[:self.config.answered_before_cancel] if job["_never"] else [], "cancelled")
        elif job["_fail"]:
            job.update(status="failed", failed_at=int(time.time()), errors={"object": "list", "data": [
                {"code": "invalid_request", "line": None, "message": "Simulated job failure", "param": None}]})
        elif job["_never"]:
            job.update(status="in_progress", in_progress_at=job.get("in_progress_at") or int(time.time()))
        elif time.monotonic() - job["_made"] >= self.config.turnaround_seconds:
            self.finish(job, lines, "completed")
        else:
            job.update(status="in_progress", in_progress_at=job.get("in_progress_at") or int(time.time()))
        return job


def _shown(job: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in job.items() if not k.startswith("_")}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": None}}, status_code=status)


def mount(app: FastAPI) -> None:
    """Add the Files and Batches routes (and their `/_sim/batches` controls) to the simulated backend."""
    app.state.sim_batches = sim = _Batches()

    @app.post("/v1/files")
    async def upload(request: Request) -> Response:
        form = await request.form()
        upload = form.get("file")
        if form.get("purpose") != "batch" or upload is None or isinstance(upload, str):
            return _error(400, "A batch input file needs purpose 'batch' and a file.")
        content = await upload.read()
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        sim.files[file_id] = {"id": file_id, "object": "file", "bytes": len(content), "created_at": int(time.time()),
                              "filename": upload.filename, "purpose": "batch", "content": content}
        return JSONResponse({k: v for k, v in sim.files[file_id].items() if k != "content"})

    @app.get("/v1/files/{file_id}/content")
    async def content(file_id: str, request: Request) -> Response:
        if file_id not in sim.files:
            return _error(404, f"No such File object: {file_id}")
        data = memoryview(sim.files[file_id]["content"])
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("range", ""))
        if asked:  # bytes=N- or bytes=N-M
            start = int(asked.group(1))
            end = min(int(asked.group(2)) if asked.group(2) else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return Response(status_code=416, headers={"content-range": f"bytes */{len(data)}"})
            return Response(bytes(data[start:end + 1]), status_code=206, media_type="application/octet-stream",
                            headers={"content-range": f"bytes {start}-{end}/{len(data)}"})
        return Response(bytes(data), media_type="application/octet-stream")

    @app.post("/v1/batches")
    async def create(request: Request) -> Response:
        body = json.loads(await request.body())
        source = sim.files.get(body.get("input_file_id"))
        if source is None or body.get("endpoint") not in _BUILDERS or body.get("completion_window") != "24h":
            return _error(400, "Invalid input_file_id, endpoint or completion_window.")
        lines = [json.loads(line) for line in source["content"].decode().splitlines() if line.strip()]
        now = int(time.time())
        job = {"id": f"batch_{uuid.uuid4().hex[:24]}", "object": "batch", "endpoint": body["endpoint"],
               "input_file_id": source["id"], "completion_window": "24h", "status": "validating",
               "output_file_id": None, "error_file_id": None, "created_at": now, "expires_at": now + 86400,
               "request_counts": {"total": len(lines), "completed": 0, "failed": 0}, "errors": None,
               "metadata": body.get("metadata"), "_lines": lines, "_made": time.monotonic(),
               "_never": sim.config.never_finish, "_fail": sim.config.fail_jobs}
        sim.jobs[job["id"]] = job
        return JSONResponse(_shown(job))

    @app.get("/v1/batches")
    async def listed(limit: int = 20, after: str | None = None) -> dict[str, Any]:
        jobs = list(reversed(sim.jobs.values()))
        if after is not None:
            ids = [job["id"] for job in jobs]
            jobs = jobs[ids.index(after) + 1:] if after in ids else []
        page = [_shown(sim.look(job)) for job in jobs[:limit]]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(jobs) > limit}

    @app.get("/v1/batches/{batch_id}")
    async def retrieve(batch_id: str) -> Response:
        job = sim.jobs.get(batch_id)
        return JSONResponse(_shown(sim.look(job))) if job else _error(404, f"No batch {batch_id}")

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel(batch_id: str) -> Response:
        job = sim.jobs.get(batch_id)
        if job is None:
            return _error(404, f"No batch {batch_id}")
        if job["status"] in ("validating", "in_progress", "finalizing"):
            sim.cancels += 1
            job.update(status="cancelling", cancelling_at=int(time.time()))
        return JSONResponse(_shown(job))

    @app.get("/_sim/batches")
    async def batches_stats() -> dict[str, Any]:
        return {"jobs": len(sim.jobs), "cancels": sim.cancels, "config": sim.config.model_dump(),
                "by_status": {s: sum(1 for j in sim.jobs.values() if j["status"] == s)
                              for s in {j["status"] for j in sim.jobs.values()}},
                "lines": sum(len(j["_lines"]) for j in sim.jobs.values()),
                "message_batches": {"jobs": len(sim.message_batches), "cancels": sim.message_batch_cancels,
                                    "lines": sum(len(j["_requests"]) for j in sim.message_batches.values()),
                                    "api_keys": sorted(k or "" for k in sim.message_batch_keys)},
                "bedrock_jobs": {"jobs": len(sim.bedrock_jobs), "stops": sim.bedrock_stops,
                                 "records": sum(len(j["_records"]) for j in sim.bedrock_jobs.values()),
                                 "by_status": {s: sum(1 for j in sim.bedrock_jobs.values() if j["status"] == s)
                                               for s in {j["status"] for j in sim.bedrock_jobs.values()}},
                                 "role_arns": sorted({j["roleArn"] for j in sim.bedrock_jobs.values()}),
                                 "timeouts": sorted({j["timeoutDurationInHours"] for j in sim.bedrock_jobs.values()}),
                                 "invocation_types": sorted({j["modelInvocationType"]
                                                             for j in sim.bedrock_jobs.values()})}}

    @app.put("/_sim/batches/config")
    async def batches_config(request: Request) -> Response:
        try:
            sim.config = BatchConfig.model_validate({**sim.config.model_dump(), **json.loads(await request.body())})
        except ValueError as error:
            return _error(400, str(error))
        return JSONResponse(sim.config.model_dump())

    @app.post("/_sim/batches/reset")
    async def batches_reset() -> dict[str, Any]:
        sim.__init__()  # type: ignore[misc]
        return {"jobs": 0}
