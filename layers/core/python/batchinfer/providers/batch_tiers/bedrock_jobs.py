"""Amazon Bedrock's batch inference (the `bedrock` kind's tier): model invocation jobs on the control plane
(`boto3.client("bedrock")`, called through `providers.bedrock.control_call`), their input and output in the
service's own bucket (`storage.blobs`). Contracts: ../shared/reference/provider-batch-contracts.md, section 3.

- Submit: one JSONL input file, `provider-jobs/in/<job name>.jsonl`, one record per request:
  `{"recordId": <the request's index>, "modelInput": <its Converse request>}`, the very request a direct call
  sends (`converse.from_chat` / `from_messages`, bytes as base64), in a `modelInvocationType: Converse` job;
  an embeddings request on a Titan text model is its one InvokeModel body (`{"inputText", "dimensions"?}`, as
  a direct call sends it) in an `InvokeModel` job. Then CreateModelInvocationJob with the backend's model
  id, the service role (`Staging.role_arn`), the output under `provider-jobs/out/<job name>/`,
  `timeoutDurationInHours` 24 (Bedrock's least; the service's own guard keeps the batch's window) and a
  `clientRequestToken` derived from the job's key, so a create tried again makes no second job.
- Find: ListModelInvocationJobs by the job's name (`nameContains`), the one whose name and token are the job's.
- Look / cancel: GetModelInvocationJob / StopModelInvocationJob by the job's ARN (`provider_id`). Ended:
  Completed, PartiallyCompleted, Failed, Stopped, Expired; failed as a whole: Failed and Expired.
- Results: the job's `.jsonl.out` file(s) under its output prefix (`<prefix>/<job id>/<input>.jsonl.out`),
  read a page of records at a time from a byte cursor: `modelOutput` is the Converse answer (or Titan's
  `{"embedding", "inputTextTokenCount"}`), shown as a direct call's (`as_asked`: a chat completion, a message
  or an embeddings list, named as the caller named the model); `error`
  `{errorCode, errorMessage}` is the HTTP status a direct call would have got (4xx final; 429, 5xx
  retryable); a record not in the output never ran and runs directly.

Converse jobs rather than InvokeModel ones: the records are then exactly what a direct call sends (for every
model Converse serves, not only Anthropic's), and their answers are shown by the same code. What a Converse
job cannot carry runs directly (`takes_request`): tools (a Converse job refuses a record with a toolConfig)
and structured output (its support in batch is not settled). Embeddings go only on a Titan text model (AWS
offers Titan Text Embeddings through batch jobs), one text a record: a request of several texts, or on a
Cohere embed model, runs directly (Titan embeds one text a call, and one request's answer is one record)."""

from __future__ import annotations

import base64
import hashlib
import json
import time

from ...catalog import BATCH_TIER_MIN_REQUESTS, CHAT_ENDPOINT, MESSAGES_ENDPOINT, Model
from ...domain import Attempt
from ...layout import PROVIDER_JOBS_INPUT_PREFIX, PROVIDER_JOBS_OUTPUT_PREFIX
from ...translating import Untranslatable
from ..bedrock import ControlError, control_call
from ..bedrock_embeddings import EMBEDDINGS_ENDPOINT, embedding_bodies, to_embeddings, vectors_of
from ..converse import from_chat, from_messages
from ..converse_answers import to_chat_completion, to_message, usage_of
from .common import JobView, LineAnswer, Page, Staging, TierError

ENDPOINTS = (CHAT_ENDPOINT, MESSAGES_ENDPOINT)  # both sent as Converse requests
TITAN = "titan"  # the one embedding format whose model Bedrock's batch jobs are documented to take
STAGED = True  # its jobs read and write the service's bucket: no job without the service role
MIN_REQUESTS = BATCH_TIER_MIN_REQUESTS["bedrock"]  # fewer records: Bedrock fails the job at validation
TIMEOUT_HOURS = 24  # timeoutDurationInHours: Bedrock's least (24 to 168)
ENDED = ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")
FAILED = ("Failed", "Expired")  # nothing of the job ran
RANGE_BYTES = 1 << 20  # what one page reads (a record longer than that: a longer range, never the whole file)
LIST_PAGES = 5  # pages of jobs a lookup reads at most (the name is the job's own: one page is the rule)
# A Converse request field a model invocation job cannot carry: such a request runs directly.
NOT_IN_JOBS = ("toolConfig", "outputConfig")


def job_name(job_key: str) -> str:
    """The job's name at Bedrock (`[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9+\\-.]){0,63}`), from the service's key of it."""
    return "batchinfer-" + hashlib.sha256(job_key.encode()).hexdigest()[:40]


def request_token(job_key: str) -> str:
    """Its clientRequestToken (`[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}`): the same for every create of the job."""
    return "bi" + hashlib.sha256(f"token:{job_key}".encode()).hexdigest()[:48]


def _call(model: Model, operation: str, **params: object) -> dict:
    backend = model.backend
    assert backend is not None and backend.region
    try:
        return control_call(backend.region, backend.endpoint_url, operation, **params)
    except ControlError as error:
        raise TierError(str(error)) from error


def takes_endpoint(model: Model, endpoint: str) -> bool:
    """Whether the model's jobs take requests of `endpoint`: chat completions and Messages (as Converse), and
    embeddings on a Titan text model."""
    titan = model.backend is not None and model.backend.embedding_format == TITAN
    return endpoint in ENDPOINTS or (endpoint == EMBEDDINGS_ENDPOINT and titan)


def invocation_type(endpoint: str) -> str:
    """The job's `modelInvocationType`: Titan's embeddings are InvokeModel bodies, the rest Converse requests."""
    return "InvokeModel" if endpoint == EMBEDDINGS_ENDPOINT else "Converse"


def _model_input(model: Model, endpoint: str, body: dict) -> dict:
    """A request's record `modelInput`, as a direct call sends it; Untranslatable when a job cannot carry it."""
    if endpoint == EMBEDDINGS_ENDPOINT:
        bodies = embedding_bodies(body, model.backend.embedding_format if model.backend else None)
        if len(bodies) != 1:
            raise Untranslatable("input: a model invocation job embeds one text a record")
        return bodies[0]
    features = model.backend.features if model.backend else ()
    request = from_chat(body, features) if endpoint == CHAT_ENDPOINT else from_messages(body, features)
    if body.get("stream") is True:
        raise Untranslatable("stream: a model invocation job does not stream")
    for name in NOT_IN_JOBS:
        if name in request:
            raise Untranslatable(f"{name}: a model invocation job does not carry it")
    return request


def takes_request(model: Model, endpoint: str, body: dict) -> bool:
    """Whether a model invocation job carries this request (else it runs directly): tools, structured output,
    streaming and embeddings of several texts do not go."""
    if not takes_endpoint(model, endpoint):
        return False
    try:
        _model_input(model, endpoint, body)
    except Untranslatable:
        return False
    return True


def _json(value: object) -> object:
    if isinstance(value, bytes | bytearray):  # an image's or document's bytes, as JSON carries them
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _view(job: dict) -> JobView:
    status = str(job.get("status"))
    ended = status in ENDED
    output = ((job.get("outputDataConfig") or {}).get("s3OutputDataConfig") or {}).get("s3Uri")
    return JobView(provider_id=str(job["jobArn"]), status=status, ended=ended, failed=status in FAILED,
                   output_file=_key_of(str(output)) if ended and output else None,
                   message=str(job.get("message") or ""))


def _key_of(uri: str) -> str:
    """The object key of an `s3://bucket/key` URI (the bucket is the service's own)."""
    return uri.removeprefix("s3://").partition("/")[2]


def find(model: Model, api_key: str | None, job_key: str, count: int = 0, since: int | None = None) -> JobView | None:
    """The job made for `job_key`, if one was: listed by its name, matched on name and token."""
    name, token, after = job_name(job_key), request_token(job_key), None
    for _ in range(LIST_PAGES):
        page = _call(model, "list_model_invocation_jobs", nameContains=name, maxResults=100,
                     **({"nextToken": after} if after else {}))
        for job in page.get("invocationJobSummaries") or []:
            if job.get("jobName") == name and job.get("clientRequestToken") in (token, None):
                return _view(job)
        after = page.get("nextToken")
        if not after:
            return None
    return None


def submit(model: Model, api_key: str | None, job_key: str, endpoint: str, lines: list[tuple[str, dict]],
           version: str | None = None, staging: Staging | None = None) -> JobView:
    """Write the input file (one record per request it takes) and create the model invocation job."""
    backend = model.backend
    assert backend is not None and backend.model_id
    if staging is None or not staging.role_arn:
        raise TierError("no service role for Bedrock's batch jobs (BEDROCK_BATCH_ROLE_ARN) is configured")
    records = []
    for key, body in lines:
        try:
            request = _model_input(model, endpoint, body)
        except Untranslatable:
            continue  # not in the input: it runs directly
        records.append(json.dumps({"recordId": key, "modelInput": request}, default=_json,
                                  separators=(",", ":")) + "\n")
    if len(records) < MIN_REQUESTS:
        raise TierError(f"{len(records)} records: fewer than the {MIN_REQUESTS} a model invocation job takes")
    name = job_name(job_key)
    source = f"{PROVIDER_JOBS_INPUT_PREFIX}{name}.jsonl"
    staging.blobs.put(source, "".join(records).encode(), "application/jsonl")
    bucket = staging.blobs.bucket
    made = _call(model, "create_model_invocation_job", jobName=name, roleArn=staging.role_arn,
                 clientRequestToken=request_token(job_key), modelId=backend.model_id,
                 modelInvocationType=invocation_type(endpoint), timeoutDurationInHours=TIMEOUT_HOURS,
                 inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{bucket}/{source}", "s3InputFormat": "JSONL"}},
                 outputDataConfig={"s3OutputDataConfig": {
                     "s3Uri": f"s3://{bucket}/{PROVIDER_JOBS_OUTPUT_PREFIX}{name}/"}})
    return look(model, api_key, str(made["jobArn"]))


def look(model: Model, api_key: str | None, provider_id: str) -> JobView:
    return _view(_call(model, "get_model_invocation_job", jobIdentifier=provider_id))


def cancel(model: Model, api_key: str | None, provider_id: str) -> JobView:
    view = look(model, api_key, provider_id)
    if view.ended or view.status == "Stopping":
        return view
    _call(model, "stop_model_invocation_job", jobIdentifier=provider_id)  # an empty answer: Stopping, then Stopped
    return JobView(provider_id=provider_id, status="Stopping", ended=False)


def results(model: Model, api_key: str | None, file_id: str, start: int, limit: int,
            staging: Staging | None = None) -> Page:
    """Up to `limit` records of the job's output from byte `start`. `file_id`: its output prefix; the records
    are in the `.jsonl.out` file Bedrock writes under it (one input file: one output file)."""
    if staging is None:
        raise TierError("reading a Bedrock job's output needs the service's bucket")
    outputs = sorted(k for k in staging.blobs.keys(file_id) if k.endswith(".jsonl.out"))
    if not outputs:  # stopped or failed before it wrote any: every request runs directly
        return Page()
    length = RANGE_BYTES
    while True:  # a record longer than the range: a range four times as long, until it holds it whole
        page = _read(staging, outputs[0], start, limit, length)
        if page.answers or page.next is None:
            return page
        length *= 4


def forget(model: Model, job_key: str, staging: Staging) -> None:
    """Delete what the job kept in the bucket (its input, its output and manifest) once it is done: a deleted
    batch's requests and answers must not outlive it there (the bucket's lifecycle rule catches what a worker
    that died here left)."""
    name = job_name(job_key)
    staging.blobs.delete(f"{PROVIDER_JOBS_INPUT_PREFIX}{name}.jsonl")
    staging.blobs.delete_prefix(f"{PROVIDER_JOBS_OUTPUT_PREFIX}{name}/")


def _read(staging: Staging, key: str, start: int, limit: int, length: int) -> Page:
    page = Page()
    data, total = staging.blobs.read_range(key, start, length)
    at = start
    for raw in data.splitlines(keepends=True):
        whole = raw.endswith(b"\n") or at + len(raw) >= total
        if not whole:  # cut by the range: the next page starts with it
            break
        at += len(raw)
        if raw.strip():
            page.answers.append(_answer(raw.decode(), key))
        if len(page.answers) >= limit:
            break
    if at < total:
        page.next = at
    return page


def _answer(line: str, key: str) -> LineAnswer:
    """One output record: `modelOutput` (the Converse answer or Titan's embedding, a 200) or `error` (its HTTP
    status)."""
    record = json.loads(line)
    job_id = key.rpartition("/")[0].rpartition("/")[2]  # <prefix>/<job id>/<input>.jsonl.out
    record_id = str(record.get("recordId"))
    output, error = record.get("modelOutput"), record.get("error")
    if isinstance(output, dict):
        counted = output.get("inputTextTokenCount")  # Titan's embedding counts its input tokens
        prompt, completion, cached = (int(counted), 0, 0) if isinstance(counted, int) else usage_of(output)
        return LineAnswer(record_id, Attempt(status_code=200, body=output, request_id=f"{job_id}-{record_id}",
                                             input_tokens=prompt, output_tokens=completion, cached_tokens=cached))
    if isinstance(error, dict):
        code = str(error.get("errorCode") or "")
        status = int(code) if code.isdigit() and 400 <= int(code) < 600 else 500
        message = str(error.get("errorMessage") or f"Amazon Bedrock's batch answered {status}.")
        return LineAnswer(record_id, Attempt(status_code=status, body={"error": {"type": "bedrock_batch_error",
                                                                                   "message": message}},
                                             message=f"Amazon Bedrock: {message}"))
    return LineAnswer(record_id, None)


def as_asked(model: Model, endpoint: str, body: dict, attempt: Attempt) -> Attempt:
    """A record's answer shown as a direct call shows it: a chat completion, a message or an embeddings list,
    named as the caller named the model (an answer that cannot be shown: a 502, its cost still counted)."""
    if not attempt.ok or not isinstance(attempt.body, dict):
        return attempt
    name = str(body.get("model") or model.id)
    request_id = attempt.request_id or ""
    try:
        if endpoint == EMBEDDINGS_ENDPOINT:
            shown = to_embeddings(vectors_of(attempt.body, TITAN), name, attempt.input_tokens,
                                  body.get("encoding_format"))
        elif endpoint == CHAT_ENDPOINT:
            shown = to_chat_completion(attempt.body, name, request_id, int(time.time()))
        else:
            shown = to_message(attempt.body, name, request_id, tuple(body.get("stop_sequences") or ()))
    except ValueError as error:
        return Attempt(status_code=502, request_id=attempt.request_id, input_tokens=attempt.input_tokens,
                       output_tokens=attempt.output_tokens,
                       message=f"Amazon Bedrock's answer could not be translated: {error}")
    return Attempt(status_code=200, body=shown, request_id=attempt.request_id, input_tokens=attempt.input_tokens,
                   output_tokens=attempt.output_tokens, cached_tokens=attempt.cached_tokens)
