"""Every setting of the service, read from the environment in one place and validated once."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .catalog import DEFAULT_MODELS_FILE, METRICS_NAMESPACE  # the catalog module owns them: infra reads them too


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    # Where things live.
    table_name: str = "batchinfer"
    bucket_name: str = "batchinfer"
    model_queues: dict[str, str] = Field(default_factory=dict)  # model id -> SQS queue URL
    model_secrets: dict[str, str] = Field(default_factory=dict)  # model id -> Secrets Manager ARN
    aws_endpoint_url: str | None = None  # the moto server locally; unset on AWS
    aws_region: str = "us-east-1"
    models_file: str = DEFAULT_MODELS_FILE
    stage: str = "local"
    port: int = 8000  # the local stack's API port
    moto_port: int = 5000  # the local stack's moto server
    sim_port: int = 8100  # the local stack's simulated backend
    log_level: str = "WARNING"
    # Where the functions' EMF metrics go: the stack sets a namespace per stage (its alarms watch that one).
    powertools_metrics_namespace: str = METRICS_NAMESPACE
    local_pollers_per_queue: int = 0  # local worker invocations per queue at once; 0: the model's budget

    # The service role Amazon Bedrock assumes to run a `bedrock` model's provider batch jobs (model invocation
    # jobs): it reads their input from, and writes their output to, the bucket's provider-jobs/ prefix. Unset:
    # a bedrock model's part of a batch runs directly (docs/provider-batch.md).
    bedrock_batch_role_arn: str | None = None

    batches_enabled: bool = True  # off: every batch route answers 404 "unavailable at the moment"
    # The API's public base URL (scheme and host, and a stage path if any, e.g. https://api.example.com), where
    # URLs the API hands out point (a Message Batch's results_url). Unset: the host the request came to (its
    # Host header), which a client, or a proxy in front, chooses.
    public_base_url: str | None = None

    # Extensions (each its own issue); off in a deployment unless the operator turns them on.
    file_batches_enabled: bool = False
    message_batches_enabled: bool = False
    embeddings_responses_batches_enabled: bool = False
    batch_webhooks_enabled: bool = False
    # Interactive `stream: true` relayed as server-sent events: only where the API is served by a server that
    # streams (the local stack's uvicorn); behind API Gateway + Lambda an answer is buffered whole, so off.
    interactive_streaming_enabled: bool = False
    # `/docs` (Swagger UI) and `/redoc`, served from pinned copies on the API's origin (api/routes/api_docs.py).
    # Off in a deployment: the pages share the console's origin, where keys are typed; `/openapi.json` stays.
    api_docs_enabled: bool = False

    # Batch lifetime.
    batch_completion_window_seconds: int = 24 * 3600
    batch_retention_seconds: int = 7 * 24 * 3600
    idempotency_retention_seconds: int = 24 * 3600  # after the batch ends

    # Limits.
    max_requests_per_batch: int = 50_000
    max_body_bytes: int = 32 * 1024 * 1024
    max_line_bytes: int = 4 * 1024 * 1024
    max_result_bytes: int = 4 * 1024 * 1024
    max_file_bytes: int = 32 * 1024 * 1024  # one uploaded input file
    max_stored_file_bytes: int = 512 * 1024 * 1024  # an account's uploads kept at once (413 past it)
    max_uploads_per_hour: int = 60  # an account's uploads per clock hour (429 past it)
    # One part of a file sent through the Uploads API (POST /v1/uploads/{id}/parts; 413 past it). API Gateway
    # HTTP API hands a binary body to Lambda base64-encoded (4/3 of its size) inside an invoke payload of at
    # most 6,291,456 bytes, with the headers and request context beside it: a raw body of about 4.5 MB at the
    # very most, multipart envelope included. 4 MiB (5.59 MB encoded) leaves room for that envelope and the
    # event around it; the same default applies locally, so what passes here passes deployed.
    max_upload_part_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    # The largest file POST /v1/files takes in one request, for the same reason (larger ones: the Uploads API).
    max_direct_upload_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    file_retention_seconds: int = 30 * 24 * 3600  # how long an uploaded input file is kept by default
    max_unfinished_batches: int = 10
    max_unfinished_requests: int = 100_000
    # NoDecode: these also take the plain forms "free=8,pro=16" and "pro,internal", parsed below.
    tier_limits: Annotated[dict[str, int], NoDecode] = Field(
        default_factory=lambda: {"free": 8, "pro": 16, "internal": 64})
    batch_access_tiers: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["internal"])

    # Per-account limits on calls (service.limits): what one account's calls may hold of what every account
    # shares (the API's server threads and Lambda concurrency). Generous: a console page open and a few
    # batches polled several times a second (20 calls a second) never meet them.
    # Calls a minute per tier, every authenticated call counted (interactive ones too), across every API
    # instance; a tier missing here, or at 0, has no rate limit.
    tier_requests_per_minute: Annotated[dict[str, int], NoDecode] = Field(
        default_factory=lambda: {"free": 1800, "pro": 6000, "internal": 30000})
    # The bucket holds this many seconds of the rate: an idle account may send that many calls at once.
    request_burst_seconds: int = Field(default=10, ge=1, le=60)
    # Results long polls (`wait` > 0) one account may hold at once, whatever its tier (429 past it).
    max_long_polls_per_account: int = Field(default=20, ge=1)

    # Running requests.
    max_attempts: int = 8
    backend_timeout_seconds: float = 120.0
    lease_seconds: int = 300  # a dispatched or running request whose lease runs out is recovered
    # The sweeper looks for leases that ran out at most this often (per process; a new one looks at once).
    # Leases run for minutes, and the look reads every lease shard of the index (`layout.LEASE_SHARDS`): on
    # a sweeper run every second (the local stack) that was most of the sweeper's reads.
    lease_scan_seconds: int = Field(default=10, ge=0)
    # A model's budget is split into one shard (a DynamoDB item of its own) per this many of its batch slots:
    # every slot take and give-back writes one shard, so a busy model's writes spread over several partitions
    # (records.Budget). A model with at most this many slots has one item, as before the shards.
    budget_shard_slots: int = Field(default=64, ge=1)
    retry_base_seconds: float = 1.0
    retry_max_seconds: float = 60.0
    # Exports whose results add up to more than this are written to S3 when the batch ends and downloaded
    # through a short-lived presigned URL (a Lambda answer carries at most 6 MB).
    export_redirect_bytes: int = 4 * 1024 * 1024
    # Result files and large exports are written a part at a time (a resumable step); S3 wants parts of
    # at least 5 MiB, but for the last.
    result_part_bytes: int = Field(default=8 * 1024 * 1024, ge=1)
    inline_result_bytes: int = 32 * 1024  # larger results go to S3, a pointer stays in DynamoDB
    # A backend's error body is kept with the failed request (in its DynamoDB item, at most 400 KB) up to this
    # size; a larger one is left out, its size said instead (its message is kept).
    max_error_body_bytes: int = Field(default=16 * 1024, ge=0)
    dispatcher_loop_seconds: float = 55.0  # how long one scheduled dispatcher invocation keeps refilling
    dispatcher_idle_sleep_seconds: float = 0.25
    # A worker keeps the slots of the group it was sent (a slot lease) and refills each one from work it
    # claims ahead (scheduling.pump.SlotPump); off: a worker runs its message's group and stops.
    worker_pull: bool = True
    worker_pull_limit: int = Field(default=50, ge=1, le=1000)  # free slots a retry's worker takes for its pump
    interactive_yield_per_request: int = 1  # batch slots given up per interactive request in flight

    # Completion webhooks (service.background.webhooks).
    webhook_queue_url: str | None = None  # the delivery queue (the local stack and CDK set it)
    webhook_key_id: str = "alias/batchinfer-webhooks"  # the KMS key signing secrets are sealed with
    webhook_retry_base_seconds: float = Field(default=60.0, ge=0)  # first retry's delay; each next one doubles
    webhook_max_attempts: int = Field(default=8, ge=1, le=20)  # attempts in all, the first included
    webhook_timeout_seconds: float = Field(default=5.0, gt=0)  # an attempt without a 2xx by then has failed
    # Only for local development and tests: lets http://127.0.0.1 and localhost targets through.
    webhook_allow_loopback: bool = False
    webhook_secret_overlap_seconds: int = 24 * 3600  # after a rotation, the old secret signs beside the new
    webhook_event_retention_seconds: int = 30 * 24 * 3600  # events (and their attempts) listed this long
    webhook_relay_seconds: int = Field(default=120, ge=1)  # a pending event not heard of this long is resent

    # Background loops (bulkheads): an item whose step raises is logged, counted and passed over; a batch whose
    # sweep raises this many times in a row (counted on the batch, across sweepers) ends failed, internal_error.
    sweep_failures_to_fail: int = Field(default=3, ge=1)

    @field_validator("public_base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        scheme, _, rest = value.partition("://")
        if scheme not in ("http", "https") or not rest or rest.startswith("/") or any(c in rest for c in "?#"):
            raise ValueError("PUBLIC_BASE_URL must be an http(s) URL without query or fragment, e.g. "
                             "https://api.example.com")
        return value.rstrip("/")

    @field_validator("tier_limits", "tier_requests_per_minute", mode="before")
    @classmethod
    def _parse_tiers(cls, value: object) -> object:
        # "free=8,pro=16,internal=64" is easier to pass on a command line than JSON.
        if isinstance(value, str) and not value.strip().startswith("{"):
            return {k.strip(): int(v) for k, v in (p.split("=") for p in value.split(",") if p.strip())}
        if isinstance(value, str):
            return json.loads(value)
        return value

    @field_validator("batch_access_tiers", mode="before")
    @classmethod
    def _parse_list(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip().startswith("["):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, str):
            return json.loads(value)
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def environment() -> dict[str, str]:
    """The process environment, for the catalog's ${VAR:-default} expansion and backend key variables."""
    import os

    return dict(os.environ)
