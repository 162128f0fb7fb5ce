"""The model catalog: which models exist, their aliases, backends, budgets and prices.

This module is also the one owner of what the core package and the CDK app (infra/) must agree on: the
catalog format and its `${VAR:-default}` expansion, the default catalog file, the per-model queue and secret
names, and the metrics namespace. infra/ imports it, so it stays pure (pydantic + PyYAML): no boto3, no
aws-cdk, no Powertools.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# The catalog shipped in the core layer; MODELS_FILE (functions) or models_file (infra) may name another.
DEFAULT_MODELS_FILE = str(Path(__file__).with_name("models.yaml"))

# CloudWatch namespace of the EMF metrics the functions emit; the CDK dashboard and alarms read the same one.
METRICS_NAMESPACE = "BatchInference"
# Metrics the functions emit and the CDK dashboard and alarms read (one spelling for both).
METRIC_REQUESTS_COMPLETED = "RequestsCompleted"  # worker, per model: requests that ended (completed or failed)
METRIC_BACKEND_ERRORS = "BackendErrors"  # worker, per model: attempts the backend refused (retried or final)
METRIC_REQUESTS_DISPATCHED = "RequestsDispatched"  # dispatcher
# sweeper, per run: seconds past its due time of the most overdue item it found (a lease that ran out, a
# webhook event to send again, a batch to expire); 0 when nothing was overdue
METRIC_SWEEP_LAG = "SweepLagSeconds"
METRIC_WEBHOOK_ATTEMPTS_FAILED = "WebhookAttemptsFailed"  # webhooks function: attempts without a 2xx
METRIC_WEBHOOK_DELIVERIES_FAILED = "WebhookDeliveriesFailed"  # webhooks function: events given up on
# Every background loop (sweeper, dispatcher, worker's pump, webhooks): an item whose step raised unexpectedly
# (logged with the item's id and the step; the loop went on with the next item)
METRIC_BACKGROUND_ITEM_FAILURES = "BackgroundItemFailures"
METRIC_API_LATENCY = "ApiLatency"  # api function, per request but long polls: milliseconds to answer (api.latency)
# From the storage layer (storage.dynamo), in whichever function wrote: writes DynamoDB refused.
METRIC_TRANSACTION_CONFLICTS = "TransactionConflicts"  # another transaction held an item (tried again)
METRIC_CONDITIONAL_CHECK_FAILURES = "ConditionalCheckFailures"  # a fenced write lost its condition
METRIC_DYNAMODB_THROTTLES = "DynamoDBThrottles"  # a write refused for capacity (tried again)

# What a model's backend-key secret holds from the deploy until the operator puts the real key: the worker
# never sends it, and fails the model's requests instead (infra/queues.py ModelSecrets writes it). Changing
# it changes the secret resource: the next deploy would put the placeholder back over the real key.
SECRET_PLACEHOLDER = "batchinfer:placeholder:put-the-backend-api-key-here"


def function_service_name(function: str) -> str:
    """A function's Powertools service name (POWERTOOLS_SERVICE_NAME; the `service` metric dimension)."""
    return f"batchinfer-{function}"


WORKER_METRICS_SERVICE = function_service_name("worker")

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

# SQS queue names are at most 80 characters, and the DLQ's name is the queue's plus "-dlq".
_SQS_NAME_LIMIT = 80
_DLQ_SUFFIX = "-dlq"
_HASH_CHARS = 8


# structured_outputs: a bedrock model that takes Converse's JSON schema output (chat `response_format`);
# thinking: a bedrock model that takes Anthropic's `thinking` (through additionalModelRequestFields).
BackendFeature = Literal["images", "top_k", "documents", "structured_outputs", "thinking"]
BEDROCK_ONLY_FEATURES = ("structured_outputs", "thinking")


CHAT_ENDPOINT = "/v1/chat/completions"
MESSAGES_ENDPOINT = "/v1/messages"


class CatalogError(ValueError):
    """The catalog cannot be loaded; the message names each fault: the model (by its id), the key, why."""


class _Strict(BaseModel):
    # A key the format does not know is refused, never ignored: `batch_budjet: 3` would otherwise run the model
    # at the default budget, past what its operator meant its backend to take.
    model_config = ConfigDict(extra="forbid")


class Backend(_Strict):
    # openai: an OpenAI-compatible server (vLLM, Ollama, OpenAI, ...); anthropic: an Anthropic-compatible
    # Messages server (Anthropic's API, or a proxy in front of it); bedrock: a model on Amazon Bedrock, called
    # request by request through the Converse API with the function's IAM role (no key, no secret).
    kind: Literal["openai", "anthropic", "bedrock"] = "openai"
    base_url: str | None = None  # openai and anthropic kinds: where the server answers
    api_key_env: str | None = None
    api_key_secret: str | None = None
    model: str | None = None  # the name the backend knows the model by, if not its catalog id
    # What an `openai` backend takes beyond text, for Messages requests translated to it (image blocks,
    # top_k, PDF documents); a request needing anything else errors rather than losing it.
    features: list[BackendFeature] = Field(default_factory=lambda: ["images"])
    # bedrock kind: the model id, inference profile id or ARN Converse is called with; the AWS region; an
    # endpoint to call instead of the region's own (tests, the local stack, VPC interface endpoints).
    model_id: str | None = None
    region: str | None = None
    endpoint_url: str | None = None
    # bedrock kind, /v1/embeddings: the InvokeModel body the model takes (Titan text or Cohere embed).
    embedding_format: Literal["titan", "cohere"] | None = None

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> Backend:
        # Fail at load (and at synth) rather than at the first call: each kind needs its own fields.
        if self.kind == "bedrock":
            missing = [name for name in ("model_id", "region") if not getattr(self, name)]
            if missing:
                raise ValueError(f"a bedrock backend needs {' and '.join(missing)}")
            if self.api_key_env or self.api_key_secret or self.base_url:
                raise ValueError("a bedrock backend is called with the function's IAM role through its region "
                                 "(or endpoint_url): it takes no base_url, api_key_env or api_key_secret")
        elif not self.base_url:
            raise ValueError(f"a {self.kind} backend needs base_url")
        elif only := sorted(set(self.features) & set(BEDROCK_ONLY_FEATURES)):  # only Converse carries them
            raise ValueError(f"the {', '.join(only)} feature is for bedrock backends, not {self.kind}")
        return self


class Price(_Strict):
    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    # Input the backend reports served from its prompt cache (`cached_tokens`), where it is sold for less
    # (hosted providers: a tenth of the input price); None: charged as any input.
    cached_input_per_mtok: float | None = Field(default=None, ge=0)


# Backend kinds whose provider sells a batch tier this service can hand requests to (`providers.batch_tiers`
# holds a client for each); the catalog refuses a `provider_batch` on any other kind.
BATCH_TIER_KINDS = ("openai", "anthropic", "bedrock")
# The longest completion window a batch has (24 h): a guard at least this long could never let a job run.
LONGEST_WINDOW_SECONDS = 24 * 3600
# The most requests one provider job may carry, by kind (OpenAI: 50,000 lines per input file; Anthropic:
# 100,000 requests per Message Batch; Bedrock: 50,000 records per model invocation job, its usual quota).
BATCH_TIER_MAX_REQUESTS = {"openai": 50_000, "anthropic": 100_000, "bedrock": 50_000}
# The fewest requests one provider job may carry, by kind: a Bedrock model invocation job with fewer records
# than its model's quota (100 for most models) fails validation, so a part smaller than that runs directly.
BATCH_TIER_MIN_REQUESTS = {"openai": 1, "anthropic": 1, "bedrock": 100}


class ProviderBatch(_Strict):
    """A model's provider batch tier (docs/provider-batch.md): its price, which parts of a batch go to it,
    how often a job is looked at and how long before the window's end unfinished work comes back."""

    price: Price
    min_requests: int = Field(default=100, ge=1)
    max_requests: int = Field(default=50_000, ge=1)
    poll_seconds: float = Field(default=60.0, gt=0)
    guard_seconds: float = Field(default=7200.0, ge=0)
    default: Literal["direct", "auto"] = "direct"

    @model_validator(mode="after")
    def _honourable(self) -> ProviderBatch:
        if self.max_requests < self.min_requests:
            raise ValueError("provider_batch.max_requests is below min_requests")
        if self.guard_seconds >= LONGEST_WINDOW_SECONDS:
            raise ValueError(f"provider_batch.guard_seconds ({self.guard_seconds:g}) is not shorter than a batch's "
                             f"window ({LONGEST_WINDOW_SECONDS} s): no job could ever run")
        return self

    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.price.input_per_mtok + output_tokens * self.price.output_per_mtok) / 1e6


class Model(_Strict):
    id: str
    aliases: list[str] = Field(default_factory=list)
    auto: bool = False
    backend: Backend | None = None
    batch_budget: int = 8
    batch_floor: int = 1
    price: Price = Field(default_factory=Price)
    endpoints: list[str] = Field(default_factory=lambda: ["/v1/chat/completions"])
    # An auto model's candidates, in order of preference (none given: every runnable model, in catalog
    # order); an interactive request goes to the first that serves its endpoint and the key may use.
    route: list[str] | None = None
    # How tokens are counted when a streamed answer's backend reports no usage (llama-cpp-python): the
    # request's text and the streamed text, this many characters a token. An estimate, marked as one.
    estimate_chars_per_token: float = Field(default=4.0, gt=0)
    # The longest answer the backend gives, in tokens: a spending cap counts it as the worst case of a
    # request that sets no limit of its own (None: such a request cannot run under a cap).
    max_output_tokens: int | None = Field(default=None, gt=0)
    # The tiktoken encoding a batch estimate counts this model's input tokens with (None: o200k_base). Only
    # encodings whose rank files ship with the service (service/creating/tokenizer.py) can be named.
    tokenizer: Literal["o200k_base", "cl100k_base"] | None = None
    # Its provider's own batch tier, if the catalog offers one (docs/provider-batch.md).
    provider_batch: ProviderBatch | None = None
    # What kind of prompt cache its backend has, which decides the order a batch's work runs in
    # (scheduling.prefix_order): `slot` (a cache per slot, llama.cpp's server), `shared` (one cache across
    # sequences, vLLM, SGLang), `provider` (Anthropic's or OpenAI's prompt caching) or `off` (submission
    # order). None: its backend kind's default (`cache_kind`).
    prompt_cache: Literal["slot", "shared", "provider", "off"] | None = None

    def serves(self, endpoint: str) -> bool:
        """Whether batches may send this model requests of `endpoint`. Anthropic Messages requests
        (`/v1/messages`) go as they are to an `anthropic` backend, or translated to a chat completion to an
        `openai` backend that serves chat; an `anthropic` backend serves nothing else."""
        if self.backend is None or self.auto:
            return False
        if self.backend.kind == "anthropic":
            return endpoint == MESSAGES_ENDPOINT
        if endpoint == MESSAGES_ENDPOINT:
            return CHAT_ENDPOINT in self.endpoints
        return endpoint in self.endpoints

    @model_validator(mode="after")
    def _endpoints_its_backend_serves(self) -> Model:
        # Bedrock models are reached through Converse (chat, and Messages translated) and InvokeModel
        # (embeddings, in the body format the catalog names): refuse at load what they cannot serve.
        if self.backend is not None and self.backend.kind == "bedrock":
            extra = sorted(set(self.endpoints) - {CHAT_ENDPOINT, "/v1/embeddings"})
            if extra:
                raise ValueError(f"model {self.id!r}: a bedrock backend does not serve {', '.join(extra)}")
            if "/v1/embeddings" in self.endpoints and not self.backend.embedding_format:
                raise ValueError(f"model {self.id!r}: /v1/embeddings on a bedrock backend needs embedding_format")
        return self

    @model_validator(mode="after")
    def _batch_tier_it_can_honour(self) -> Model:
        tier = self.provider_batch
        if tier is None:
            return self
        kind = self.backend.kind if self.backend else None
        if kind not in BATCH_TIER_KINDS:
            raise ValueError(f"model {self.id!r}: provider_batch: the {kind or 'no'} backend kind has no batch tier "
                             f"this service can use (only {', '.join(BATCH_TIER_KINDS)})")
        for name in ("input_per_mtok", "output_per_mtok"):
            if getattr(tier.price, name) > getattr(self.price, name):
                raise ValueError(f"model {self.id!r}: provider_batch.price.{name} is above the model's own price")
        if tier.max_requests > BATCH_TIER_MAX_REQUESTS[kind]:
            raise ValueError(f"model {self.id!r}: provider_batch.max_requests is above what one {kind} job "
                             f"takes ({BATCH_TIER_MAX_REQUESTS[kind]})")
        if tier.min_requests < BATCH_TIER_MIN_REQUESTS[kind]:
            raise ValueError(f"model {self.id!r}: provider_batch.min_requests ({tier.min_requests}) is below the "
                             f"fewest requests one {kind} job takes ({BATCH_TIER_MIN_REQUESTS[kind]})")
        return self

    @property
    def cache_kind(self) -> str:
        """Its `prompt_cache`, or its backend kind's default: an `openai` backend is most often a server of
        our own (llama.cpp's, vLLM's): `slot`, whose order (each prefix primed once, then kept on the runner
        that holds it) serves a shared cache as well; an `anthropic` backend caches what `cache_control` marks:
        `provider`; a `bedrock` one is sent no cache points by this service (Converse refuses `cache_control`
        here): `off`."""
        if self.prompt_cache is not None:
            return self.prompt_cache
        kind = self.backend.kind if self.backend is not None else "openai"
        return {"openai": "slot", "anthropic": "provider"}.get(kind, "off")

    @property
    def backend_model(self) -> str:
        return (self.backend.model if self.backend else None) or self.id

    def cost_usd(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
        """What the tokens cost; `cached_tokens` (of the input) at the cached input price where there is one."""
        return (input_tokens * self.price.input_per_mtok + output_tokens * self.price.output_per_mtok) / 1e6 \
            - self.cache_saving_usd(input_tokens, cached_tokens)

    def cache_saving_usd(self, input_tokens: int, cached_tokens: int) -> float:
        """What `cached_tokens` of the input cost less at the cached input price than at the input price."""
        if self.price.cached_input_per_mtok is None:
            return 0.0
        cached = max(0, min(cached_tokens, input_tokens))
        return cached * (self.price.input_per_mtok - self.price.cached_input_per_mtok) / 1e6


class Catalog(_Strict):
    models: list[Model]

    def model_post_init(self, _context: object) -> None:
        self._by_name: dict[str, Model] = {}
        for model in self.models:
            for name in [model.id, *model.aliases]:
                if name in self._by_name:
                    raise ValueError(f"model catalog: the name {name!r} is used twice")
                self._by_name[name] = model

    def lookup(self, name: str) -> Model | None:
        """The model a name (id or alias) points to now, or None."""
        return self._by_name.get(name)

    def get(self, model_id: str) -> Model:
        return self._by_name[model_id]

    @property
    def runnable(self) -> list[Model]:
        """Models that batches can run on (auto models are routed per request and refused)."""
        return [m for m in self.models if not m.auto and m.backend is not None]

    def route(self, auto: Model, endpoint: str, allowed: Callable[[Model], bool]) -> Model | None:
        """Where an interactive request naming an auto model goes: the first of its `route` (or of the runnable
        models) that serves the endpoint and that `allowed` lets the caller use."""
        names = auto.route if auto.route is not None else [m.id for m in self.runnable]
        for name in names:
            model = self.lookup(name)
            if model is not None and not model.auto and model.serves(endpoint) and allowed(model):
                return model
        return None


# -- ${VAR:-default} ------------------------------------------------------------------------------------


def expand(value: str, env: Mapping[str, str]) -> str:
    """Expand `${VAR}` and `${VAR:-default}` from `env` only (infra passes catalog_env, so synth is reproducible).

    As in bash, `:-` also applies to a variable that is set but empty: `SIMULATED_BACKEND_URL=` must not
    turn `${SIMULATED_BACKEND_URL:-http://...}/v1` into the relative URL `/v1`.
    """
    return _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)


def expand_tree(value: object, env: Mapping[str, str]) -> object:
    """`expand` applied to every string inside a parsed YAML document (keys are left alone)."""
    if isinstance(value, str):
        return expand(value, env)
    if isinstance(value, list):
        return [expand_tree(v, env) for v in value]
    if isinstance(value, dict):
        return {k: expand_tree(v, env) for k, v in value.items()}
    return value


# -- the catalog file -----------------------------------------------------------------------------------


def read_catalog_document(path: str | Path) -> object:
    """The catalog file as parsed YAML, before expansion (infra checks what the file itself says)."""
    return yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}


def parse_catalog(document: object, env: Mapping[str, str]) -> Catalog:
    """The catalog from its parsed document; a CatalogError naming every fault (model, key, why)."""
    try:
        return Catalog.model_validate(expand_tree(document, env))
    except ValidationError as error:
        raise CatalogError(describe_errors(error, document)) from None


def describe_errors(error: ValidationError, document: object) -> str:
    """A catalog's validation errors, each naming the model (by the id its entry gives, else its position),
    the key (with its section: `backend.`, `price.`) and what is wrong with it."""
    entries = document.get("models") if isinstance(document, dict) else None
    problems = []
    for item in error.errors():
        loc = item["loc"]
        # "Value error, " is pydantic's prefix for a validator's own message: the message says it all.
        message = item["msg"].removeprefix("Value error, ")
        where = "the catalog"
        if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
            entry = entries[loc[1]] if isinstance(entries, list) and loc[1] < len(entries) else None
            model_id = entry.get("id") if isinstance(entry, dict) else None
            where = f"model {model_id!r}" if model_id else f"models[{loc[1]}]"
            loc = loc[2:]
        key = ".".join(str(part) for part in loc)
        if item["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown key {key!r} (a misspelling? it would be ignored)")
        elif key:
            problems.append(f"{where}: {key}: {message}")
        else:
            problems.append(f"{where}: {message}")
    return "; ".join(problems)


def load_catalog(path: str | Path, env: Mapping[str, str]) -> Catalog:
    try:
        return parse_catalog(read_catalog_document(path), env)
    except CatalogError as error:
        raise CatalogError(f"model catalog {path}: {error}") from None


# -- names derived from a model id ----------------------------------------------------------------------
# The local stack (storage/bootstrap.py) and the CDK app create these, and the deployed functions find them
# by name, so both must derive them here.


def queue_prefix(stage: str) -> str:
    return f"{stage}-batchinfer-"


def slugify(model_id: str) -> str:
    """A queue-name-safe form of a model id: lowercase, [a-z0-9_-], dashes collapsed, none at the ends."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", model_id.lower())
    return re.sub(r"-{2,}", "-", slug).strip("-")


def queue_slug(stage: str, model_id: str) -> str:
    """The model's part of its queue names: the slug, shortened with a hash of the id if the DLQ name would
    pass SQS's 80 characters (the hash keeps two long ids with one prefix apart)."""
    slug = slugify(model_id)
    if not slug:
        raise ValueError(f"model id {model_id!r} has no character usable in a queue name")
    room = _SQS_NAME_LIMIT - len(_DLQ_SUFFIX) - len(queue_prefix(stage))
    if len(slug) <= room:
        return slug
    if room < _HASH_CHARS + 2:
        raise ValueError(f"stage {stage!r} is too long to leave room for a queue name")
    suffix = hashlib.sha256(model_id.encode()).hexdigest()[:_HASH_CHARS]
    return f"{slug[: room - _HASH_CHARS - 1].rstrip('-')}-{suffix}"


def queue_slugs(stage: str, model_ids: Iterable[str]) -> dict[str, str]:
    """`queue_slug` for each model; refuses two models whose queue names would be one queue."""
    slugs: dict[str, str] = {}
    owners: dict[str, str] = {}
    for model_id in model_ids:
        slug = queue_slug(stage, model_id)
        if slug in owners:
            raise ValueError(f"models {owners[slug]!r} and {model_id!r} map to one queue name {slug!r}")
        owners[slug], slugs[model_id] = model_id, slug
    return slugs


def queue_name(stage: str, model_id: str) -> str:
    return queue_prefix(stage) + queue_slug(stage, model_id)


def webhook_queue_name(stage: str) -> str:
    """The webhook delivery queue: a double dash, which no model's slug holds, keeps it apart from theirs."""
    return queue_prefix(stage) + "-webhooks"


def dlq_name(stage: str, model_id: str) -> str:
    return queue_name(stage, model_id) + _DLQ_SUFFIX


def secret_name(stage: str, model_id: str) -> str:
    """The Secrets Manager secret holding a model's backend key in a deployed stage."""
    return f"{stage}/batchinfer/models/{model_id}"
