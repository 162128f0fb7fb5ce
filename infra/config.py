"""Deployment settings (CDK context or a config file) and the model catalog as the infrastructure sees it.

Precedence, lowest first:
1. the defaults in `InfraConfig`;
2. the `batchinfer` object in `cdk.json` context;
3. the file named by context `config_file` (YAML or JSON, same keys), e.g. one file per stage;
4. top-level context values, i.e. `cdk deploy -c stage=prod -c retain_data=true`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

# The catalog format, ${VAR:-default}, queue/secret names: owned by the core package, shared with the functions.
from batchinfer import catalog as core
from infra import bedrock

REPO_ROOT = Path(__file__).resolve().parent.parent
# The catalog the core layer ships, relative to the repo as cdk.json writes it (so the two compare equal).
# The functions read it unless MODELS_FILE names a custom one.
DEFAULT_MODELS_FILE = Path(core.DEFAULT_MODELS_FILE).resolve().relative_to(REPO_ROOT).as_posix()

CONTEXT_DEFAULTS_KEY = "batchinfer"
CONTEXT_CONFIG_FILE_KEY = "config_file"

# Lambda limits a synchronous invocation's request payload to 6 MB. API Gateway hands the body over inside a
# JSON event: base64 for binary bodies (multipart uploads: 4/3 larger), escaped for text, plus the headers.
# 4 MiB of body is what reliably fits (4 MiB * 4/3 = 5.33 MiB < 6 MB), so the API never promises more.
LAMBDA_PAYLOAD_LIMIT_BYTES = 6 * 1024 * 1024
LAMBDA_EVENT_BODY_LIMIT_BYTES = 4 * 1024 * 1024
# The one stage that may deploy a half-working stack (loopback backends, no alarm subscription): a warning.
DEV_STAGE = "dev"
# Host names that can only mean this machine (no DNS lookup at synth: the name alone decides).
_LOCAL_HOST_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_LOCAL_HOST_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain")
# arn:<partition>:sns:<region>:<account>:<name>
_SNS_TOPIC_ARN = re.compile(r"arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}")
# arn:<partition>:acm:<region>:<account>:certificate/<id>
_ACM_CERTIFICATE_ARN = re.compile(r"arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[A-Za-z0-9-]+")
_DOMAIN_NAME = re.compile(r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
# CloudWatch Logs accepts only these retention periods.
# fmt: off
VALID_LOG_RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
)
# fmt: on
# Lambda keeps 100 of an account's concurrency unreserved; a new account's limit is 1000 (it can be raised).
DEFAULT_ACCOUNT_CONCURRENCY = 1000
UNRESERVED_FLOOR = 100
# The worker's reserved concurrency when it is "auto": its models' budgets together, but never more than half
# of a default account's concurrency (the api and the webhooks function need the rest).
AUTO_WORKER_RESERVE_MAX = DEFAULT_ACCOUNT_CONCURRENCY // 2
# Lambda's event source mapping accepts MaximumConcurrency between 2 and 1000.
MIN_QUEUE_CONCURRENCY = 2
MAX_QUEUE_CONCURRENCY = 1000
# Environment variables the stack sets itself; catalog_env may not override them.
RESERVED_ENV_NAMES = frozenset(
    {
        "STAGE",
        "TABLE_NAME",
        "BUCKET_NAME",
        "MODEL_QUEUES",
        "MODEL_SECRETS",
        "MODELS_FILE",
        "LOG_LEVEL",
        "MAX_BODY_BYTES",
        "TIER_LIMITS",
        "TIER_REQUESTS_PER_MINUTE",
        "MAX_LONG_POLLS_PER_ACCOUNT",
        "BATCH_COMPLETION_WINDOW_SECONDS",
        "BATCH_RETENTION_SECONDS",
        "FILE_BATCHES_ENABLED",
        "MESSAGE_BATCHES_ENABLED",
        "EMBEDDINGS_RESPONSES_BATCHES_ENABLED",
        "BATCH_WEBHOOKS_ENABLED",
        "WEBHOOK_QUEUE_URL",
        "WEBHOOK_KEY_ID",
    }
)
# Settings for the local stack only. On Lambda, loopback is the Runtime API (127.0.0.1:9001): a webhook
# aimed there must stay refused.
LOCAL_ONLY_ENV_NAMES = frozenset({"WEBHOOK_ALLOW_LOOPBACK"})

# Characters a Secrets Manager secret name may hold; each queued model gets `<stage>/batchinfer/models/<id>`.
_SECRET_SAFE_ID = re.compile(r"[A-Za-z0-9/_+=.@-]+")
_NONE_STRINGS = {"", "none", "null"}


class InfraConfig(BaseModel):
    """Everything a deployment may choose. Field names are the context keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str = Field("dev", description="Stage name: prefixes resource names; one stack per stage.")
    models_file: str = Field(DEFAULT_MODELS_FILE, description="Model catalog, relative to the repo root.")
    tier_limits: str = Field(
        "free=8,pro=16,internal=64", description="Batch requests in flight per account tier."
    )
    completion_window_seconds: int = Field(86400, ge=60, description="Batch completion window.")
    retention_seconds: int = Field(604800, ge=0, description="How long finished batches are kept.")
    file_batches_enabled: bool = False
    message_batches_enabled: bool = False
    embeddings_responses_batches_enabled: bool = False
    batch_webhooks_enabled: bool = False
    max_body_bytes: int = Field(
        LAMBDA_EVENT_BODY_LIMIT_BYTES,
        gt=0,
        le=LAMBDA_EVENT_BODY_LIMIT_BYTES,
        description="Largest create body the API takes; what fits a Lambda event after API Gateway's encoding.",
    )
    log_level: str = "INFO"
    log_retention_days: int = 30
    alarm_email: str | None = Field(None, description="Subscribe this address to the alarm topic.")
    alarm_topic_arn: str | None = Field(
        None, description="Send alarms to this existing SNS topic instead of a topic the stack creates."
    )
    monthly_budget_usd: float | None = Field(
        100.0, gt=0, description="AWS Budgets cost guard: notify at 80% actual / 100% forecast; none for none."
    )
    monthly_budget_scope: str = Field(
        "stage",
        description="'stage': costs tagged batchinfer-stage=<stage> (activate the cost allocation tag); "
        "'account': every cost of the account.",
    )
    domain_name: str | None = Field(None, description="Custom domain of the API (with certificate_arn).")
    certificate_arn: str | None = Field(
        None, description="ACM certificate for domain_name, in the stack's region."
    )
    scheduled_reserved_concurrency: int | None = Field(
        2, ge=1, description="Reserved concurrency of dispatcher and sweeper; none to leave unreserved."
    )
    # Reserved concurrency is both a floor and a ceiling: the worker's keeps a flood of API calls from taking
    # the concurrency the scheduler's calls run on; the api's, when set, caps what all API calls may take.
    worker_reserved_concurrency: int | Literal["auto"] | None = Field(
        "auto",
        description="Reserved concurrency of the worker: 'auto' (the queued models' batch budgets together, "
        f"at most {AUTO_WORKER_RESERVE_MAX}), a number, or none to leave it unreserved.",
    )
    api_reserved_concurrency: int | None = Field(
        None, ge=1, description="Reserved concurrency of the api (its most at once); none to leave it unreserved."
    )
    tier_requests_per_minute: str = Field(
        "free=1800,pro=6000,internal=30000",
        description="API calls per minute per account, by tier (a token bucket per account; 0: no limit).",
    )
    max_long_polls_per_account: int = Field(
        20, ge=1, description="Results long polls (wait > 0) one account may hold at once."
    )
    retain_data: bool = Field(True, description="Keep table, bucket and secrets when the stack is deleted.")
    catalog_env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment for every function, e.g. catalog ${VAR}s."
    )
    api_throttle_rate_limit: int = Field(100, ge=1, description="API Gateway steady-state requests/s.")
    api_throttle_burst_limit: int = Field(200, ge=1, description="API Gateway burst.")
    full_index_projections: bool = Field(
        False,
        description="Project ALL into every GSI, as stages deployed before the lean projections have "
        "(CloudFormation cannot change an existing GSI's projection).",
    )
    skip_deps_build: bool = Field(False, description="Use an empty placeholder deps layer (tests only).")

    @field_validator("stage")
    @classmethod
    def _stage_shape(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,19}", value):
            raise ValueError("stage must be 1-20 characters of a-z, 0-9 and '-', starting with a letter")
        return value

    @field_validator("tier_limits", "tier_requests_per_minute")
    @classmethod
    def _tier_limits_shape(cls, value: str, info: ValidationInfo) -> str:
        value = value.replace(" ", "")
        if not re.fullmatch(r"[A-Za-z0-9_-]+=\d+(,[A-Za-z0-9_-]+=\d+)*", value):
            raise ValueError(f"{info.field_name} must look like 'free=8,pro=16,internal=64'")
        return value

    @field_validator("worker_reserved_concurrency")
    @classmethod
    def _worker_reserve_shape(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError("worker_reserved_concurrency must be at least 1, 'auto' or none")
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level_known(cls, value: str) -> str:
        value = value.upper()
        if value not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention_allowed(cls, value: int) -> int:
        if value not in VALID_LOG_RETENTION_DAYS:
            raise ValueError(f"log_retention_days must be one of {VALID_LOG_RETENTION_DAYS}")
        return value

    @field_validator(
        "alarm_email",
        "alarm_topic_arn",
        "monthly_budget_usd",
        "domain_name",
        "certificate_arn",
        "scheduled_reserved_concurrency",
        "worker_reserved_concurrency",
        "api_reserved_concurrency",
        mode="before",
    )
    @classmethod
    def _none_strings(cls, value: Any) -> Any:
        # `-c alarm_email=none` arrives as a string.
        if isinstance(value, str) and value.strip().lower() in _NONE_STRINGS:
            return None
        return value

    @field_validator("catalog_env", mode="before")
    @classmethod
    def _env_from_json(cls, value: Any) -> Any:
        # `-c catalog_env='{"SIMULATED_BACKEND_URL": "https://..."}'` arrives as a JSON string.
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("catalog_env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
                raise ValueError(f"catalog_env name {name!r} is not an environment variable name")
            if name in RESERVED_ENV_NAMES or name.startswith(("AWS_", "POWERTOOLS_", "LAMBDA_", "_")):
                raise ValueError(f"catalog_env may not set {name!r}: the stack or Lambda owns it")
            if name in LOCAL_ONLY_ENV_NAMES:
                raise ValueError(f"catalog_env may not set {name!r}: it is for the local stack only")
        return value

    @field_validator("alarm_topic_arn")
    @classmethod
    def _topic_arn_shape(cls, value: str | None) -> str | None:
        if value is not None and not _SNS_TOPIC_ARN.fullmatch(value):
            raise ValueError(f"alarm_topic_arn {value!r} is not an SNS topic ARN")
        return value

    @field_validator("certificate_arn")
    @classmethod
    def _certificate_arn_shape(cls, value: str | None) -> str | None:
        if value is not None and not _ACM_CERTIFICATE_ARN.fullmatch(value):
            raise ValueError(f"certificate_arn {value!r} is not an ACM certificate ARN")
        return value

    @field_validator("domain_name")
    @classmethod
    def _domain_shape(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip().lower().rstrip(".")
        if not _DOMAIN_NAME.fullmatch(value):
            raise ValueError(f"domain_name {value!r} is not a DNS name (no scheme, no path)")
        return value

    @field_validator("monthly_budget_scope")
    @classmethod
    def _budget_scope_known(cls, value: str) -> str:
        if value not in {"stage", "account"}:
            raise ValueError("monthly_budget_scope must be 'stage' or 'account'")
        return value

    @model_validator(mode="after")
    def _burst_covers_rate(self) -> InfraConfig:
        if self.api_throttle_burst_limit < self.api_throttle_rate_limit:
            raise ValueError("api_throttle_burst_limit must be at least api_throttle_rate_limit")
        return self

    @model_validator(mode="after")
    def _domain_needs_certificate(self) -> InfraConfig:
        if (self.domain_name is None) != (self.certificate_arn is None):
            raise ValueError("domain_name and certificate_arn go together: set both or neither")
        return self

    @property
    def is_dev(self) -> bool:
        """The dev stage may synthesize a stack that would not fully serve (with warnings); no other may."""
        return self.stage == DEV_STAGE

    @property
    def has_alarm_subscription(self) -> bool:
        return bool(self.alarm_email or self.alarm_topic_arn)

    @property
    def metrics_namespace(self) -> str:
        """The CloudWatch namespace of the application metrics: per stage, so that two stages in one
        account never feed each other's alarms. Functions get it as POWERTOOLS_METRICS_NAMESPACE."""
        return f"batchinfer/{self.stage}"

    @property
    def models_path(self) -> Path:
        path = Path(self.models_file)
        return path if path.is_absolute() else REPO_ROOT / path

    @property
    def custom_catalog(self) -> bool:
        """True when the catalog is not the one shipped in the core layer (then it is bundled separately)."""
        return self.models_path.resolve() != (REPO_ROOT / DEFAULT_MODELS_FILE).resolve()

    @property
    def batches_expire_after_days(self) -> int:
        """S3 safety net for `batches/`: window + retention + 1 day (the sweeper deletes on time)."""
        return _ceil_days(self.completion_window_seconds + self.retention_seconds) + 1

    @property
    def files_expire_after_days(self) -> int:
        """S3 safety net for `files/`: 30 days + retention."""
        return 30 + _ceil_days(self.retention_seconds)

    def settings_env(self) -> dict[str, str]:
        """The application settings every function receives, as environment variables."""
        return {
            "STAGE": self.stage,
            "LOG_LEVEL": self.log_level,
            "FILE_BATCHES_ENABLED": _flag(self.file_batches_enabled),
            "MESSAGE_BATCHES_ENABLED": _flag(self.message_batches_enabled),
            "EMBEDDINGS_RESPONSES_BATCHES_ENABLED": _flag(self.embeddings_responses_batches_enabled),
            "BATCH_WEBHOOKS_ENABLED": _flag(self.batch_webhooks_enabled),
            "BATCH_COMPLETION_WINDOW_SECONDS": str(self.completion_window_seconds),
            "BATCH_RETENTION_SECONDS": str(self.retention_seconds),
            "TIER_LIMITS": self.tier_limits,
            "TIER_REQUESTS_PER_MINUTE": self.tier_requests_per_minute,
            "MAX_LONG_POLLS_PER_ACCOUNT": str(self.max_long_polls_per_account),
        }

    def worker_reserve(self, models: Iterable[CatalogModel]) -> int | None:
        """The worker's reserved concurrency: as set, or for 'auto' what its queues' event sources may run at
        once (each model's MaximumConcurrency), at most AUTO_WORKER_RESERVE_MAX."""
        if self.worker_reserved_concurrency == "auto":
            return min(AUTO_WORKER_RESERVE_MAX, max(1, sum(m.max_concurrency for m in models)))
        return self.worker_reserved_concurrency

    def reserved_total(self, models: Iterable[CatalogModel]) -> int:
        """The concurrency the stack reserves, all functions together."""
        return (2 * (self.scheduled_reserved_concurrency or 0) + (self.worker_reserve(models) or 0)
                + (self.api_reserved_concurrency or 0))


@dataclass(frozen=True)
class CatalogModel:
    """One non-auto model of the catalog, with the names the infrastructure derives from it."""

    model_id: str
    slug: str
    batch_budget: int
    needs_secret: bool
    base_url: str | None
    api_key_env: str | None = None
    kind: str = "openai"
    # bedrock kind: what Converse/InvokeModel is called with, where, and through which endpoint (if not the
    # region's own); the stack grants the function roles exactly this model (infra/bedrock.py).
    bedrock_model_id: str | None = None
    region: str | None = None
    endpoint_url: str | None = None
    # Whether its part of a batch may go to its provider's batch tier (`provider_batch`): for a Bedrock model,
    # the stack makes the jobs' service role (infra/bedrock_batch.py).
    batch_tier: bool = False

    @classmethod
    def from_core(cls, model: core.Model, slug: str) -> CatalogModel:
        backend = model.backend
        bedrock = backend is not None and backend.kind == "bedrock"
        return cls(
            model_id=model.id,
            slug=slug,
            batch_budget=model.batch_budget,
            # A Bedrock model is called with the function's IAM role: no key, so no secret.
            needs_secret=bool(backend and not bedrock and (backend.api_key_env or backend.api_key_secret)),
            base_url=backend.base_url if backend else None,
            api_key_env=(backend.api_key_env if backend else None) or None,
            kind=backend.kind if backend else "openai",
            bedrock_model_id=backend.model_id if bedrock else None,
            region=backend.region if bedrock else None,
            endpoint_url=(backend.endpoint_url or None) if bedrock else None,
            batch_tier=model.provider_batch is not None,
        )

    @property
    def is_bedrock(self) -> bool:
        return self.kind == "bedrock"

    @property
    def backend_url(self) -> str | None:
        """The URL the functions call: base_url, or a Bedrock model's endpoint_url (None: its region's own)."""
        return self.endpoint_url if self.is_bedrock else self.base_url

    @property
    def max_concurrency(self) -> int:
        """Event source MaximumConcurrency: the model's batch budget, within Lambda's 2..1000."""
        return min(MAX_QUEUE_CONCURRENCY, max(MIN_QUEUE_CONCURRENCY, self.batch_budget))

    # The names come from batchinfer.catalog, which the local stack's bootstrap uses as well.
    def queue_name(self, stage: str) -> str:
        return core.queue_name(stage, self.model_id)

    def dlq_name(self, stage: str) -> str:
        return core.dlq_name(stage, self.model_id)

    def secret_name(self, stage: str) -> str:
        return core.secret_name(stage, self.model_id)

    @property
    def backend_is_loopback(self) -> bool:
        """A backend on 127.0.0.1 works locally but never from Lambda (kept for callers; see local_backend)."""
        return self.local_backend is not None

    @property
    def local_backend(self) -> str | None:
        """Why the backend is unreachable from Lambda, or None: a loopback, private, link-local or otherwise
        non-global address, or a host name that can only be local. The functions run outside any VPC, so
        only public addresses are reachable. Names are judged as written: no DNS lookup at synth."""
        url = self.backend_url
        return unreachable_host_reason(urlparse(url).hostname if url else None)


def unreachable_host_reason(host: str | None) -> str | None:
    """Why a backend host cannot be reached from a Lambda function outside a VPC, or None when it may be."""
    if not host:
        return None
    host = host.strip("[]").lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if host in _LOCAL_HOST_NAMES or host.endswith(_LOCAL_HOST_SUFFIXES):
            return f"{host} names this machine or a local network"
        return None
    if address.is_loopback:
        return f"{host} is a loopback address"
    if address.is_unspecified:
        return f"{host} is the unspecified address (this machine)"
    if address.is_private or address.is_link_local:
        return f"{host} is a private address"
    if not address.is_global:
        return f"{host} is not a public address"
    return None


@dataclass(frozen=True)
class Catalog:
    """The core catalog as the infrastructure sees it: queued models and the auto ids (which get no queue)."""

    path: Path
    models: tuple[CatalogModel, ...]
    auto_model_ids: tuple[str, ...]


def load_catalog(path: Path, *, stage: str, env: Mapping[str, str] | None = None) -> Catalog:
    """Parse the catalog with the core package (what the functions will read), then apply the checks a
    deployment needs on top: explicit budgets, secret-safe ids, one queue per model."""
    document = core.read_catalog_document(path)
    entries = document.get("models") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty 'models' list")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("id"):
            raise ValueError(f"{path}: models[{index}] has no id")
    try:
        catalog = core.parse_catalog(document, env or {})
    except core.CatalogError as error:
        raise ValueError(f"{path}: {error}") from error

    queued: list[core.Model] = []
    for model, entry in zip(catalog.models, entries, strict=True):  # the core keeps the file's order
        if model.auto:
            continue
        if not _SECRET_SAFE_ID.fullmatch(model.id):
            raise ValueError(f"{path}: model id {model.id!r} cannot name a Secrets Manager secret")
        # The core defaults a missing budget; a deployment must choose it, since it caps worker concurrency.
        if entry.get("batch_budget") is None:
            raise ValueError(f"{path}: model {model.id!r} needs a batch_budget")
        if model.batch_budget < 1:
            raise ValueError(f"{path}: model {model.id!r} batch_budget must be at least 1")
        backend = model.backend
        if backend is not None and backend.kind == "bedrock" and backend.model_id and backend.region:
            # The IAM grant is built from these: a malformed region or a wildcard id fails here, not at deploy.
            problem = bedrock.model_problem(backend.model_id, backend.region)
            if problem:
                raise ValueError(f"{path}: model {model.id!r}: {problem}")
        queued.append(model)
    if not queued:
        raise ValueError(f"{path}: no model with a backend (every entry is auto)")
    try:
        slugs = core.queue_slugs(stage, [model.id for model in queued])
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error
    return Catalog(
        path=path,
        models=tuple(CatalogModel.from_core(model, slugs[model.id]) for model in queued),
        auto_model_ids=tuple(m.id for m in catalog.models if m.auto),
    )


def resolve_config(get_context: Callable[[str], Any]) -> InfraConfig:
    """Merge defaults, cdk.json's `batchinfer` object, the optional config file and top-level context."""
    merged: dict[str, Any] = {}
    defaults = get_context(CONTEXT_DEFAULTS_KEY)
    if defaults is not None:
        if isinstance(defaults, str):
            defaults = json.loads(defaults)
        if not isinstance(defaults, dict):
            raise ValueError(f"context {CONTEXT_DEFAULTS_KEY!r} must be an object")
        merged.update(defaults)
    config_file = get_context(CONTEXT_CONFIG_FILE_KEY)
    if config_file:
        merged.update(_read_config_file(Path(str(config_file))))
    for name in InfraConfig.model_fields:
        value = get_context(name)
        if value is not None:
            merged[name] = value
    return InfraConfig.model_validate(merged)


def _read_config_file(path: Path) -> dict[str, Any]:
    path = path if path.is_absolute() else REPO_ROOT / path
    data = yaml.safe_load(path.read_text())  # YAML is a superset of JSON: one reader for both.
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings")
    return data


def _ceil_days(seconds: int) -> int:
    return -(-seconds // 86400)


def _flag(value: bool) -> str:
    return "true" if value else "false"
