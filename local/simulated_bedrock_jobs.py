"""The simulated backend's Amazon Bedrock batch inference (a test double of Bedrock's model invocation jobs, the
`bedrock` kind's tier), served where boto3's `bedrock` control-plane client calls it (the catalog's
`endpoint_url`, as the runtime routes are): `POST /model-invocation-job` (CreateModelInvocationJob), `GET
/model-invocation-job/{arn}` (Get), `GET /model-invocation-jobs` (List: `nameContains`, newest first,
`maxResults`, `nextToken`) and `POST /model-invocation-job/{arn}/stop` (Stop). moto has none of these (its
`bedrock` backend stops at custom models and logging settings); this runs the jobs as Bedrock does: the input
JSONL is read from the bucket (moto's: in process in the tests, the moto server under `make run`), each
record's `modelInput` answered as `/model/{id}/converse` would answer it (an InvokeModel job's Titan embedding
bodies as `/model/{id}/invoke` would), and `<output s3Uri><job
id>/<input name>.out` (with `manifest.json.out`) written back.

A create is checked as Bedrock checks it (jobName, roleArn and clientRequestToken patterns,
timeoutDurationInHours 24 to 168, the invocation type); the same clientRequestToken gives back the job it made.
A job whose input cannot be read, or holds fewer than MIN_RECORDS records, fails at validation. Records:
`[[sim:400]]` an `error` with errorCode 400, `[[sim:fail-always]]` and `[[sim:tier-500]]` one with 500 (run
directly, the latter succeeds), `[[sim:batch-expired]]` left out of the output (never run); a Converse job's
record with a `toolConfig` fails with 400, as Bedrock's do.

The knobs are the other tiers' (`PUT /_sim/batches/config`): `turnaround_seconds`, `never_finish` (a job stays
InProgress until stopped; `answered_before_cancel` of its records are in the output then), `fail_jobs` (jobs
fail as a whole). `GET /_sim/batches` counts these under `bedrock_jobs`; `POST /_sim/batches/reset` forgets
them with the rest."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import boto3
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from local.simulated_answers import (
    MARK_400,
    MARK_FAIL,
    SimError,
    build_converse,
    build_invoke,
    parse_converse,
    parse_invoke,
)
from local.simulated_batches import MARK_EXPIRED, MARK_TIER_500

MIN_RECORDS = 100  # Bedrock's usual per-model quota: fewer records fail the job at validation
MAX_RECORDS = 50_000
ACCOUNT = "123456789012"
JOB_NAME = re.compile(r"[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}")
TOKEN = re.compile(r"[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}")
ROLE_ARN = re.compile(r"arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+")
ENDED = ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status,
                        headers={"x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"})


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def record_output(record: dict[str, Any], model_id: str, invocation_type: str = "Converse") -> dict[str, Any] | None:
    """One input record's output record, as a job of `invocation_type` writes it (None: never run): a Converse
    job answers Converse requests; an InvokeModel job answers Titan text embeddings (`{"inputText"}`) as
    `/model/{id}/invoke` does, and refuses any other body, as Bedrock does a model-native body not the model's."""
    model_input = record.get("modelInput")
    text = json.dumps(model_input)
    base = {"recordId": record.get("recordId"), "modelInput": model_input}
    if MARK_EXPIRED in text:
        return None
    if MARK_400 in text:
        return {**base, "error": {"errorCode": 400, "errorMessage": "Simulated batch line error 400"}}
    if MARK_FAIL in text or MARK_TIER_500 in text:
        return {**base, "error": {"errorCode": 500, "errorMessage": "Simulated batch line error 500"}}
    if not isinstance(model_input, dict):
        return {**base, "error": {"errorCode": 400, "errorMessage": "modelInput: a JSON object is required"}}
    invoke = invocation_type == "InvokeModel"
    if invoke and "inputText" not in model_input:
        return {**base, "error": {"errorCode": 400, "errorMessage": "Malformed input request: expected "
                                                                    "inputText, please reformat your input."}}
    if not invoke and "toolConfig" in model_input:
        return {**base, "error": {"errorCode": 400, "errorMessage": "toolConfig is not supported in batch "
                                                                    "inference jobs of the Converse type"}}
    body = {**model_input, "modelId": model_id}
    parse, build = (parse_invoke, build_invoke) if invoke else (parse_converse, build_converse)
    try:
        return {**base, "modelOutput": build(parse(body), body)}
    except SimError as err:
        return {**base, "error": {"errorCode": err.status, "errorMessage": err.message}}


def mount(app: FastAPI, s3_endpoint_url: str | None = None) -> None:
    """Add the model invocation job routes beside the other tiers' (`simulated_batches.mount` first: its
    state and knobs are shared). `s3_endpoint_url`: where the bucket is (None: AWS's own, which the tests'
    in-process moto answers)."""
    sim = app.state.sim_batches
    lock = threading.Lock()
    made: list[Any] = []

    def s3() -> Any:
        with lock:
            if not made:
                made.append(boto3.client("s3", region_name="us-east-1", endpoint_url=s3_endpoint_url))
            return made[0]

    def validate(job: dict[str, Any]) -> None:
        """Read the input as Bedrock's validation does: the records, or the reason the job fails."""
        bucket, key = _split(job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
        try:
            text = s3().get_object(Bucket=bucket, Key=key)["Body"].read().decode()
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except Exception as error:  # noqa: BLE001 - any failure to read it fails the job, as Bedrock's does
            job["_problem"] = f"The input could not be read from S3 ({type(error).__name__})."
            return
        if not MIN_RECORDS <= len(records) <= MAX_RECORDS:
            job["_problem"] = (f"The job holds {len(records)} records; a job takes between {MIN_RECORDS} and "
                               f"{MAX_RECORDS}.")
        job["_records"] = records
        job["totalRecordCount"] = len(records)

    def finish(job: dict[str, Any], answered: int | None, status: str) -> None:
        """Run its first `answered` records (all: None), write the output and the manifest, end it."""
        records = job["_records"] if answered is None else job["_records"][:answered]
        rows = [out for record in records
                if (out := record_output(record, job["modelId"], job["modelInvocationType"])) is not None]
        bucket, prefix = _split(job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        folder = f"{prefix.rstrip('/')}/{job['jobArn'].rpartition('/')[2]}/"
        source = _split(job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])[1].rpartition("/")[2]
        if rows or status == "Completed":
            body = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
            s3().put_object(Bucket=bucket, Key=f"{folder}{source}.out", Body=body.encode())
        succeeded = sum(1 for row in rows if "modelOutput" in row)
        manifest = {"totalRecordCount": len(job["_records"]), "processedRecordCount": len(rows),
                    "successRecordCount": succeeded, "errorRecordCount": len(rows) - succeeded}
        s3().put_object(Bucket=bucket, Key=f"{folder}manifest.json.out", Body=json.dumps(manifest).encode())
        job.update(status=status, endTime=_stamp(time.time()), lastModifiedTime=_stamp(time.time()),
                   processedRecordCount=len(rows), successRecordCount=succeeded,
                   errorRecordCount=len(rows) - succeeded)

    def look(job: dict[str, Any]) -> dict[str, Any]:
        if job["status"] in ENDED:
            return job
        if job["status"] == "Stopping":
            finish(job, sim.config.answered_before_cancel if job["_never"] else 0, "Stopped")
        elif job.get("_problem") or job["_fail"]:
            job.update(status="Failed", message=job.get("_problem") or "Simulated job failure",
                       endTime=_stamp(time.time()))
        elif job["_never"]:
            job["status"] = "InProgress"
        elif time.monotonic() - job["_made"] >= sim.config.turnaround_seconds:
            finish(job, None, "Completed")
        else:
            job["status"] = "InProgress"
        return job

    def shown(job: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in job.items() if not k.startswith("_")}

    @app.post("/model-invocation-job")
    async def create(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "ValidationException", "The request body is not valid JSON.")
        token = body.get("clientRequestToken")
        if token is not None:
            if not isinstance(token, str) or not TOKEN.fullmatch(token):
                return _error(400, "ValidationException", "clientRequestToken does not match its pattern.")
            for job in sim.bedrock_jobs.values():
                if job.get("clientRequestToken") == token:  # the same request again: the job it made
                    return JSONResponse({"jobArn": job["jobArn"]})
        name, role = body.get("jobName"), body.get("roleArn")
        if not isinstance(name, str) or not JOB_NAME.fullmatch(name):
            return _error(400, "ValidationException", "jobName does not match its pattern.")
        if not isinstance(role, str) or not ROLE_ARN.fullmatch(role):
            return _error(400, "ValidationException", "roleArn is not an IAM role ARN.")
        if any(job["jobName"] == name for job in sim.bedrock_jobs.values()):
            return _error(400, "ConflictException", f"A job named {name} exists already.")
        hours = body.get("timeoutDurationInHours", 24)
        if not isinstance(hours, int) or not 24 <= hours <= 168:
            return _error(400, "ValidationException", "timeoutDurationInHours must be between 24 and 168.")
        if body.get("modelInvocationType", "InvokeModel") not in ("InvokeModel", "Converse"):
            return _error(400, "ValidationException", "modelInvocationType must be InvokeModel or Converse.")
        source = ((body.get("inputDataConfig") or {}).get("s3InputDataConfig") or {}).get("s3Uri")
        target = ((body.get("outputDataConfig") or {}).get("s3OutputDataConfig") or {}).get("s3Uri")
        if not (isinstance(source, str) and source.startswith("s3://") and isinstance(target, str)
                and target.startswith("s3://") and body.get("modelId")):
            return _error(400, "ValidationException", "modelId and the input and output s3Uri are required.")
        now = time.time()
        job_id = uuid.uuid4().hex[:12]
        job = {"jobArn": f"arn:aws:bedrock:us-east-1:{ACCOUNT}:model-invocation-job/{job_id}", "jobName": name,
               "modelId": body["modelId"], "clientRequestToken": token, "roleArn": role, "status": "Submitted",
               "submitTime": _stamp(now), "lastModifiedTime": _stamp(now), "inputDataConfig": body["inputDataConfig"],
               "outputDataConfig": body["outputDataConfig"], "timeoutDurationInHours": hours,
               "jobExpirationTime": _stamp(now + hours * 3600),
               "modelInvocationType": body.get("modelInvocationType", "InvokeModel"),
               "_made": time.monotonic(), "_never": sim.config.never_finish, "_fail": sim.config.fail_jobs,
               "_records": []}
        validate(job)
        sim.bedrock_jobs[job["jobArn"]] = job
        return JSONResponse({"jobArn": job["jobArn"]})

    def the_job(identifier: str) -> dict[str, Any] | None:
        found = sim.bedrock_jobs.get(identifier)
        return found or next((j for j in sim.bedrock_jobs.values() if j["jobArn"].endswith("/" + identifier)), None)

    @app.get("/model-invocation-jobs")
    async def listed(nameContains: str | None = None, maxResults: int = 100,  # noqa: N803 - Bedrock's names
                     nextToken: str | None = None) -> Response:  # noqa: N803
        jobs = [j for j in reversed(sim.bedrock_jobs.values()) if not nameContains or nameContains in j["jobName"]]
        start = int(nextToken) if nextToken and nextToken.isdigit() else 0
        page = [shown(look(j)) for j in jobs[start:start + maxResults]]
        more = {"nextToken": str(start + maxResults)} if start + maxResults < len(jobs) else {}
        return JSONResponse({"invocationJobSummaries": page, **more})

    @app.post("/model-invocation-job/{identifier:path}/stop")
    async def stop(identifier: str) -> Response:
        job = the_job(identifier)
        if job is None:
            return _error(404, "ResourceNotFoundException", f"No job {identifier}")
        if job["status"] in ENDED or job["status"] == "Stopping":
            return _error(400, "ValidationException", f"The job is {job['status']}: it cannot be stopped.")
        sim.bedrock_stops += 1
        job.update(status="Stopping", lastModifiedTime=_stamp(time.time()))
        return JSONResponse({})

    @app.get("/model-invocation-job/{identifier:path}")
    async def retrieve(identifier: str) -> Response:
        job = the_job(identifier)
        return JSONResponse(shown(look(job))) if job else _error(404, "ResourceNotFoundException",
                                                                 f"No job {identifier}")
