"""Shapes for the OpenAPI document of routes that read or write raw JSON for speed (a 50,000-request
create is parsed once, not into 50,000 pydantic models; answers are built as dicts). The routes declare
these with `openapi_extra`; `components()` gives `app.openapi` their definitions. What the service accepts
is decided by `service.creating.validation`, whose messages name the faulty request; these describe it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from ..protocols import EVENT_TYPES

REF = "#/components/schemas/{model}"


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Any = None


class RequestBody(BaseModel):
    """The body the request would send to its endpoint (any of that endpoint's parameters)."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[ChatMessage] | None = Field(None, description="For /v1/chat/completions (required there)")
    input: Any = Field(None, description="For /v1/embeddings and /v1/responses")


class BatchRequest(BaseModel):
    custom_id: str = Field(..., min_length=1, max_length=512, description="Unique within the batch")
    method: Literal["POST"] = "POST"
    url: Literal["/v1/chat/completions", "/v1/embeddings", "/v1/responses"] = "/v1/chat/completions"
    body: RequestBody


class OutputExpiresAfter(BaseModel):
    anchor: Literal["created_at"]
    seconds: int = Field(..., ge=3600, le=2592000)


Priority = Literal["high", "normal", "low"]
PRIORITY_DESCRIPTION = ("An extension beyond the OpenAI and Anthropic APIs: the batch's priority among its own "
                        "account's batches (`normal` by default); never over another account's")
Execution = Literal["direct", "provider_batch", "auto"]
EXECUTION_DESCRIPTION = ("An extension: how each model's part runs. `direct`: request by request; `provider_batch`: "
                         "on the model's provider batch tier where the catalog offers one (at its price); `auto`: "
                         "as provider_batch but a high priority batch runs directly. Absent: each model's default")
SAVED_DESCRIPTION = "An extension: what running on a provider's batch tier saved against the model's price, in USD"


class CreateBatch(BaseModel):
    """Either `requests` (an inline batch) or `input_file_id` with `endpoint` and `completion_window` (a
    batch from an uploaded file, as the OpenAI SDK creates one)."""

    requests: list[BatchRequest] | None = Field(None, min_length=1, max_length=50_000)
    input_file_id: str | None = Field(None, description="An uploaded file (purpose batch)")
    endpoint: Literal["/v1/chat/completions", "/v1/embeddings", "/v1/responses"] | None = None
    completion_window: Literal["24h"] | None = None
    output_expires_after: OutputExpiresAfter | None = Field(None, description="How long the result files are kept")
    metadata: dict[str, str] | None = Field(None, description="Up to 16 pairs; keys <= 64, values <= 512 chars")
    webhook_url: str | None = Field(None, description="Where this batch's ending is announced instead of the "
                                                      "account's webhook (signed with the account's secret)")
    max_cost_usd: float | None = Field(None, gt=0, description=(
        "An extension: the most this batch may spend, in US dollars. No request starts whose worst case "
        "(its input at the input price, its max_tokens or the model's output limit at the output price) "
        "could take the batch's spend past it; then the batch stops as a cancel does, with error code "
        "max_cost_reached."))
    priority: Priority = Field("normal", description=PRIORITY_DESCRIPTION)
    execution: Execution | None = Field(None, description=EXECUTION_DESCRIPTION)
    admission: Literal["always", "reject_if_late"] = Field("always", description=(
        "An extension: `reject_if_late` refuses the batch (429 `batch_would_be_late`, not retried by the SDKs) "
        "when its estimate says it would not end within its completion window at the capacity there is now."))


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails | None = Field(None, description="Once a backend reported any")
    output_tokens_details: OutputTokensDetails | None = Field(None, description="Once a backend reported any")


class _BatchAnalytics(BaseModel):
    """An extension beyond the OpenAI and Anthropic APIs: how the batch ran (docs/api.md#analytics)."""

    running_seconds: int = Field(..., description="From started_at to last_finished_at, less its pauses and the "
                                                  "time it sat ended before a retry in place")
    requests_per_minute: float | None = Field(..., description="Requests ended by an attempt, per minute of "
                                                               "running time; null before any")
    output_tokens_per_second: float | None = Field(..., description="Output tokens per second of running time")
    p50_ms: float | None = Field(..., description="Median backend latency of its answered attempts (within 9.1 %)")
    p95_ms: float | None = Field(..., description="95th percentile of the same (within 9.1 %)")
    max_ms: float | None = Field(..., description="The longest of the same (within 9.1 %)")
    attempts: int = Field(..., description="Attempts ended, retries included; one a dead worker abandoned counts "
                                           "once")
    retries: int = Field(..., description="Attempts that were not their request's first")
    errors_by_code: dict[str, int] = Field(..., description="Attempts that ended in each error code, final or "
                                                            "retried")
    cached_input_share: float | None = Field(..., description="Of its input tokens, the share the backend served "
                                                              "from its prompt cache; null before any input")
    cache_saved_usd: float = Field(..., description="What its cached input cost less than input, where the catalog "
                                                    "prices cached input lower (cached_input_per_mtok)")


class BatchAnalytics(_BatchAnalytics):
    started_at: int | None = Field(..., description="When its first requests were dispatched to run (Unix seconds)")
    last_finished_at: int | None = Field(..., description="When its latest answered attempt was settled (Unix "
                                                          "seconds)")


class MessageBatchAnalytics(_BatchAnalytics):
    started_at: str | None = Field(..., description="When its first requests were dispatched to run (RFC 3339)")
    last_finished_at: str | None = Field(..., description="When its latest answered attempt was settled (RFC 3339)")


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    model: str | None = Field(None, description="The model every request of the batch runs on; null while a file "
                                                "batch is validated, and for an inline batch that mixes models")
    errors: None = None
    input_file_id: str | None
    completion_window: str
    status: Literal["validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
                    "cancelled"]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    webhook_url: str | None = None
    max_cost_usd: float | None = Field(None, description="An extension: the spending cap, where one was set")
    usage: Usage
    cost_usd: float
    cost_unknown_attempts: int
    results_expires_at: int | None
    error: dict | None
    paused_at: int | None = Field(None, description="An extension: when the batch was paused (Unix seconds), "
                                                    "null unless it is paused")
    retry_count: int | None = Field(None, description="Times it was retried in place, once it was (an extension)")
    priority: Priority = Field("normal", description=PRIORITY_DESCRIPTION)
    execution: Execution | None = Field(None, description=EXECUTION_DESCRIPTION)
    saved_usd: float = Field(0.0, description=SAVED_DESCRIPTION)
    analytics: BatchAnalytics = Field(..., description="An extension: how the batch ran")


class _RetryFields(BaseModel):
    """What every retry in place takes (an extension), whatever its API names its result statuses."""

    model_config = ConfigDict(extra="forbid")
    custom_ids: list[str] | None = Field(None, min_length=1, max_length=50_000, description="Only these requests")
    error_codes: list[str] | None = Field(None, min_length=1, max_length=100,
                                          description="Only requests whose error has one of these codes, as the "
                                                      "results show them (rate_limited, timeout, batch_expired, ...)")
    max_cost_usd: float | None = Field(None, description="A new spending cap, for a batch created with one: at "
                                                     "least what it has spent (a batch its cap stopped goes on)")


class RetryBatch(_RetryFields):
    """What a retry in place re-queues, among the requests that did not succeed (an extension). No body, or
    no field: every one of them but those whose input is at fault (`invalid_request` and the like), which a
    retry takes only when named by custom id or error code."""

    statuses: list[Literal["failed", "expired", "cancelled"]] | None = Field(
        None, min_length=1, max_length=3, description="Only requests whose result has one of these statuses")


class RetryMessageBatch(_RetryFields):
    """What a retry in place of a Message Batch re-queues (an extension): as `RetryBatch`, with statuses named
    as the batch's result types."""

    statuses: list[Literal["errored", "expired", "canceled"]] | None = Field(
        None, min_length=1, max_length=3, description="Only requests whose result has one of these types")


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResultError(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class Result(BaseModel):
    id: str = Field(..., description="batch_req_<n>: the request's place in the batch, from 1")
    custom_id: str
    status: Literal["queued", "running", "completed", "failed", "cancelled", "expired"]
    response: dict | None = Field(None, description="{status_code, request_id, body} once completed")
    error: ResultError | None


class ResultsPage(BaseModel):
    object: Literal["list"]
    data: list[Result]
    first_id: str | None = Field(..., description="With order=finished (an extension): null")
    last_id: str | None = Field(..., description="The last result's ID; with order=finished (an extension): the "
                                                 "opaque cursor to pass as `after` for the next page, even when empty")
    has_more: bool
    batch_status: str | None = Field(None, description="With order=finished (an extension): the batch's status "
                                                       "as the page was read; once final and has_more is false, "
                                                       "no more results come (unless the batch is retried)")


class FinishedMessageResults(BaseModel):
    """A page of a Message Batch's results in the order they finished (an extension beyond the Anthropic API):
    each line as the results JSONL has it."""

    object: Literal["list"]
    data: list[dict] = Field(..., description="{custom_id, result} per request, as a results JSONL line")
    first_id: None
    last_id: str = Field(..., description="The opaque cursor to pass as `after` for the next page")
    has_more: bool
    batch_status: str = Field(..., description="The batch's status (OpenAI's words) as the page was read")


class FileObject(BaseModel):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"]
    status_details: None = None


class FileList(BaseModel):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


class Upload(BaseModel):
    file: bytes = Field(..., description="The JSONL input file", json_schema_extra={"format": "binary"})
    purpose: Literal["batch"]
    expires_after_anchor: Literal["created_at"] | None = Field(None, alias="expires_after[anchor]")
    expires_after_seconds: int | None = Field(None, alias="expires_after[seconds]", ge=3600, le=2592000)


class DeletedBatch(BaseModel):
    id: str
    object: Literal["batch.deleted"]
    deleted: bool


_MODELS = (CreateBatch, BatchObject, BatchList, ResultsPage, DeletedBatch, FileObject, FileList, FileDeleted, Upload)


def components() -> dict[str, dict]:
    """Every schema above (and what they refer to), keyed by name, for `components.schemas`."""
    _, top = models_json_schema([(m, "serialization") for m in _MODELS], ref_template=REF)
    return top.get("$defs", {})


def _ref(model: type[BaseModel]) -> dict:
    return {"$ref": REF.format(model=model.__name__)}


def _ok(model: type[BaseModel], description: str) -> dict:
    return {"responses": {"200": {"description": description, "content": {"application/json": {
        "schema": _ref(model)}}}}}


# --- Estimates before running (an extension): POST .../batches/estimate ---------------------------------

class CostRange(BaseModel):
    min: float = Field(description="Input tokens at the input price (cached input at the cached input price, "
                                   "where the catalog has one)")
    max: float | None = Field(description="Plus every output token allowed at the output price (null: a request "
                                          "has no output limit of its own nor in the catalog)")


class ModelEstimate(BaseModel):
    model: str
    request_count: int
    input_tokens: int
    cached_input_tokens: int = Field(description="Of the input, what a prompt cache would serve: the shared part "
                                                "(system prompt, tools, leading messages) of each request after "
                                                "its prefix's first, on a model whose backend has a cache")
    max_output_tokens: int | None
    cost_usd: CostRange
    tokenizer: str = Field(description="The tiktoken encoding input tokens were counted with")
    execution: Literal["direct", "provider_batch"] = Field("direct", description=(
        "An extension: how this part would run (provider_batch: on the model's provider batch tier, cost_usd at "
        "its price for the requests a job would carry)"))
    provider_batch_request_count: int = Field(0, description=(
        "An extension: of request_count, those that would run on the tier (the rest, which a job cannot carry, "
        "run directly, priced at the model's price); 0 when the part runs directly"))
    queue_ahead: int = Field(description="Unstarted batch requests of all accounts on the model now, rounded "
                                         "down to 0, 1, 2, 5, 10, 20, 50, 100, ... (a lower bound)")
    batch_budget: int = Field(description="The model's batch slots (the catalog)")
    batch_cap_now: int = Field(description="Its slots now, as interactive load and backend 429s leave them")
    tier_limit: int = Field(description="Your account's batch requests in flight at most")
    mean_latency_seconds: float | None = Field(description="The mean duration of its recent calls (null: none "
                                                           "measured yet)")
    latency_used_seconds: float = Field(description="What the estimate took a call to last")
    estimated_seconds: float | None = Field(description="From now until this model's last request would end")


class RejectedEstimate(BaseModel):
    custom_id: str
    error: dict


class BatchEstimate(BaseModel):
    object: Literal["batch.estimate"]
    endpoint: str
    created_at: int
    request_count: int
    input_tokens: int
    cached_input_tokens: int = Field(description="Of the input, what a prompt cache would serve: the shared part "
                                                "(system prompt, tools, leading messages) of each request after "
                                                "its prefix's first, on a model whose backend has a cache")
    max_output_tokens: int | None
    cost_usd: CostRange
    tokenizer: str = Field(description="The tiktoken encoding(s) input tokens were counted with (o200k_base unless "
                                       "the catalog names one per model)")
    models: list[ModelEstimate]
    completion_window_seconds: int
    estimated_completion_at: int | None = Field(description="Unix seconds: when the batch would end if submitted "
                                                            "now (null: never at the capacity there is now)")
    fits_window: bool = Field(description="Whether that is before its completion window would close")
    rejected: list[RejectedEstimate] = Field(description="A Message Batch's requests that would error at once")


_MODELS = (*_MODELS, BatchEstimate)  # for components()
BATCH_ESTIMATE = _ok(BatchEstimate, "The estimate (nothing is stored)")


# The header `service.creating.intake.check_idempotency_key` reads (the route reads it raw, so FastAPI cannot say it).
IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "description": "1-255 printable ASCII characters. A retry with the same key and body answers "
                                  "with the batch the first call created (and `idempotent-replayed: true`); "
                                  "another body is a 409, and once that batch is deleted, a 410.",
                   "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"}}
# The same header on a retry in place: a second call with the key and body answers as the first did.
RETRY_IDEMPOTENCY_KEY = {**IDEMPOTENCY_KEY, "description": "1-255 printable ASCII characters. A second call "
                         "with the same key and body retries nothing more: it answers with the batch as it is "
                         "now (and `idempotent-replayed: true`); another body is a 409."}
CREATE_BATCH_BODY = {"parameters": [IDEMPOTENCY_KEY],
                     "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(CreateBatch)}}}}
BATCH_OBJECT = _ok(BatchObject, "The batch")
BATCH_LIST = _ok(BatchList, "A page of batches")
RESULTS_PAGE = _ok(ResultsPage, "A page of results")
FINISHED_MESSAGE_RESULTS = _ok(FinishedMessageResults, "With order=finished: a page of results as they finished")
_MODELS = (*_MODELS, FinishedMessageResults)  # for components()
DELETED_BATCH = _ok(DeletedBatch, "Deleted")
FILE_OBJECT = _ok(FileObject, "The file")
FILE_LIST = _ok(FileList, "A page of files")
FILE_DELETED = _ok(FileDeleted, "Deleted")
UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _ref(Upload)}}}}


# --- The Uploads API (/v1/uploads): a file sent in parts ------------------------------------------------

class CreateUpload(BaseModel):
    """What `client.uploads.create` (and `upload_file_chunked`) sends."""

    filename: str = Field(..., min_length=1, max_length=512)
    purpose: Literal["batch"]
    bytes: int = Field(..., ge=0, description="The file's size; at most the file limit (MAX_FILE_BYTES)")
    mime_type: str = Field(..., min_length=1, max_length=512, description="e.g. application/jsonl")
    expires_after: OutputExpiresAfter | None = Field(None, description="How long the completed file is kept")


class UploadObject(BaseModel):
    id: str = Field(..., description="upload_...")
    object: Literal["upload"]
    bytes: int
    created_at: int
    expires_at: int = Field(..., description="A pending upload is gone from then on (an hour after it was created)")
    filename: str
    purpose: Literal["batch"]
    status: Literal["pending", "completed", "cancelled"]
    file: FileObject | None = Field(..., description="The file, once completed")


class UploadPart(BaseModel):
    id: str = Field(..., description="part_...")
    object: Literal["upload.part"]
    created_at: int
    upload_id: str


class AddUploadPart(BaseModel):
    data: bytes = Field(..., description="The part's bytes: at most MAX_UPLOAD_PART_BYTES (4 MiB by default)",
                        json_schema_extra={"format": "binary"})


class CompleteUpload(BaseModel):
    part_ids: list[str] = Field(..., description="The parts, in the file's order; their sizes add up to `bytes`")
    md5: str | None = Field(None, description="The file's MD5 (hexadecimal), checked when given")


_MODELS = (*_MODELS, CreateUpload, UploadObject, UploadPart, AddUploadPart, CompleteUpload)  # for components()


CREATE_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": _ref(CreateUpload)}}}}
ADD_UPLOAD_PART_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {
    "schema": _ref(AddUploadPart)}}}}
COMPLETE_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": _ref(CompleteUpload)}}}}
UPLOAD_OBJECT = _ok(UploadObject, "The upload")
UPLOAD_PART = _ok(UploadPart, "The part")


# --- Anthropic Message Batches ---------------------------------------------------------------------------

class MessageBatchRequest(BaseModel):
    custom_id: str = Field(..., pattern=r"^[A-Za-z0-9_-]{1,64}$", description="Unique within the batch")
    params: dict[str, Any] = Field(..., description="A Messages API request body (model, max_tokens, messages, ...)"
                                                    "; checked on its own: a fault makes this request errored")


class CreateMessageBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: list[MessageBatchRequest] = Field(..., min_length=1, max_length=50_000)
    max_cost_usd: float | None = Field(None, gt=0, description=(
        "An extension: the most this batch may spend, in US dollars. No request starts whose worst case "
        "(its input at the input price, its max_tokens or the model's output limit at the output price) "
        "could take the batch's spend past it; then the batch stops as a cancel does, with error code "
        "max_cost_reached."))
    priority: Priority = Field("normal", description=PRIORITY_DESCRIPTION)
    execution: Execution | None = Field(None, description=EXECUTION_DESCRIPTION)


class MessageBatchRequestCounts(BaseModel):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(BaseModel):
    id: str = Field(..., description="msgbatch_...")
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageBatchRequestCounts
    created_at: str = Field(..., description="RFC 3339")
    expires_at: str = Field(..., description="RFC 3339: created_at + 24 hours")
    ended_at: str | None = None
    cancel_initiated_at: str | None = None
    archived_at: str | None = None
    results_url: str | None = Field(None, description="Set once processing_status is 'ended'")
    usage: Usage | None = Field(None, description="Extension: the batch's tokens so far")
    cost_usd: float | None = Field(None, description="Extension: the batch's known cost so far, in USD")
    cost_unknown_attempts: int | None = Field(None, description="Extension: attempts whose cost is not known "
                                                                "(not in cost_usd)")
    # Extensions, on a batch created with a spending cap only.
    max_cost_usd: float | None = Field(None, description="An extension: the spending cap, where one was set")
    error: dict | None = Field(None, description="An extension, with max_cost_usd: {code: max_cost_reached, "
                                                 "message} once the cap stopped the batch")
    paused_at: str | None = Field(None, description="An extension: when the batch was paused (RFC 3339), null "
                                                    "unless it is paused")
    retry_count: int | None = Field(None, description="Times it was retried in place, once it was (an extension)")
    priority: Priority = Field("normal", description=PRIORITY_DESCRIPTION)
    execution: Execution | None = Field(None, description=EXECUTION_DESCRIPTION)
    saved_usd: float = Field(0.0, description=SAVED_DESCRIPTION)
    analytics: MessageBatchAnalytics = Field(..., description="An extension: how the batch ran")


class MessageBatchList(BaseModel):
    data: list[MessageBatch]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class DeletedMessageBatch(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


_MODELS = (*_MODELS, CreateMessageBatch, MessageBatch, MessageBatchList, DeletedMessageBatch)  # for components()

ANTHROPIC_HEADERS = [{"name": "anthropic-version", "in": "header", "required": True,
                      "schema": {"type": "string", "enum": ["2023-06-01", "2026-10-21"]}}]
CREATE_MESSAGE_BATCH_BODY = {"parameters": [IDEMPOTENCY_KEY],
                             "requestBody": {"required": True, "content": {"application/json": {
                                 "schema": _ref(CreateMessageBatch)}}}}
MESSAGE_BATCH = _ok(MessageBatch, "The Message Batch")
MESSAGE_BATCH_LIST = _ok(MessageBatchList, "A page of Message Batches")
DELETED_MESSAGE_BATCH = _ok(DeletedMessageBatch, "Deleted")


# --- A batch's priority (an extension: POST .../{batch_id}/priority) ---------------------------------------

class SetPriority(BaseModel):
    """The body of `POST /v1/batches/{batch_id}/priority` (and of a Message Batch's): read by the route."""

    model_config = ConfigDict(extra="forbid")
    priority: Priority = Field(..., description="high, normal or low: among the account's own batches")


# --- Completion webhooks (/v1/batch_webhook) ---------------------------------------------------------------

class SetWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(..., description="HTTPS URL reaching a public address", max_length=2048)
    rotate_secret: bool = Field(False, description="Issue a new signing secret (the old one signs beside it "
                                                   "for 24 hours)")


class WebhookObject(BaseModel):
    object: Literal["batch_webhook"]
    url: str
    created_at: int
    updated_at: int
    secret_created_at: int
    secret: str | None = Field(None, description="`whsec_...`: only in the answer that created it")


class WebhookDeleted(BaseModel):
    object: Literal["batch_webhook.deleted"]
    url: str
    deleted: bool


class DeliveryAttempt(BaseModel):
    at: int
    url: str
    status_code: int | None = Field(None, description="The receiver's answer; none if it gave none")
    error: str | None = Field(None, description="Why the attempt failed; none when it got a 2xx")
    duration_ms: int


class Delivery(BaseModel):
    status: Literal["pending", "delivered", "failed", "skipped"]
    attempts: list[DeliveryAttempt]
    next_attempt_at: int | None
    reason: str | None = None


class EventData(BaseModel):
    id: str


class WebhookEventObject(BaseModel):
    id: str
    object: Literal["event"]
    type: Literal[EVENT_TYPES]  # type: ignore[valid-type]  # every protocol's ending events
    created_at: int
    data: EventData
    delivery: Delivery


class WebhookEventList(BaseModel):
    object: Literal["list"]
    data: list[WebhookEventObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
