"""The five Lambda functions, their layers, log groups and least-privilege roles."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

from aws_cdk import Annotations, AssetHashType, Duration, Fn, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_logs as logs
from constructs import Construct

from batchinfer.catalog import function_service_name
from infra import bedrock, layers
from infra.bedrock_batch import LIST_REASON, ROLE_ENV, BedrockBatchJobs, tier_models
from infra.config import (
    DEFAULT_ACCOUNT_CONCURRENCY,
    REPO_ROOT,
    UNRESERVED_FLOOR,
    CatalogModel,
    InfraConfig,
)
from infra.nag import acknowledge, acknowledge_all, nag_ref
from infra.queues import ModelQueues, ModelSecrets
from infra.storage import Storage
from infra.webhooks import WebhookDelivery

RUNTIME = lambda_.Runtime.PYTHON_3_12
# arm64 (Graviton): ~20% cheaper per GB-s than x86_64, and the functions mostly wait on HTTP and DynamoDB, so
# the CPU makes no difference; every binary wheel of the lock (pydantic-core, PyYAML, wrapt) exists for
# aarch64/cp312. Must match infra/layers.py's LAMBDA_PLATFORM (docs/operations.md).
ARCHITECTURE = lambda_.Architecture.ARM_64
HANDLER = "handler.handler"
FUNCTIONS_DIR = REPO_ROOT / "functions"
# Lambda refuses environments over 4 KB (keys + values), a limit a large catalog can reach.
LAMBDA_ENV_LIMIT_BYTES = 4096
# A resolved token (queue URL, secret ARN, table name) is at most about this long.
_TOKEN_ESTIMATE_BYTES = 140
_TOKEN = re.compile(r"\$\{Token\[[^\]]*\]\}")
# Where a custom catalog lands in the Lambda file system (layers unpack under /opt).
CUSTOM_CATALOG_DIR = "batchinfer-catalog"


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    description: str
    timeout: Duration
    memory_mb: int


API = FunctionSpec("api", "HTTP API (FastAPI behind Mangum)", Duration.seconds(29), 1024)
DISPATCHER = FunctionSpec(
    "dispatcher", "Sends due requests to the model queues, looping ~55 s per tick", Duration.seconds(70), 512
)
# A worker batch is up to 10 backend calls; ~180 s leaves room for slow generations and retries.
WORKER = FunctionSpec(
    "worker", "Runs requests from the model queues against their backends", Duration.seconds(180), 512
)
SWEEPER = FunctionSpec(
    "sweeper",
    "Expiry, cancellation, finalization, retention, lease recovery, webhooks",
    Duration.seconds(70),
    1024,
)
# One attempt per record (WEBHOOK_TIMEOUT_SECONDS, 5 s), the records of a call run at once: ~30 s covers a
# batch of 10 slow receivers with room for the bookkeeping.
WEBHOOKS = FunctionSpec(
    "webhooks",
    "Delivers completion webhooks from the delivery queue, one attempt per message",
    Duration.seconds(30),
    256,
)
SPECS = (API, DISPATCHER, WORKER, SWEEPER, WEBHOOKS)

# Event source mapping: records per invocation, and partial batch failures reported by the handler.
WORKER_BATCH_SIZE = 10
WEBHOOKS_BATCH_SIZE = 10
# Receivers are other people's servers: a burst of endings is spread out rather than fanned out wide.
WEBHOOKS_MAX_CONCURRENCY = 10

_XRAY_REASON = "X-Ray PutTraceSegments/PutTelemetryRecords support no resource-level permissions."
_BUCKET_OBJECTS_REASON = "Object keys are per batch and per file, created at run time; scoped to this bucket."


@dataclass(frozen=True)
class DataAccess:
    """What one function does with the table and the bucket: exact IAM actions, no grant groups.

    DynamoDB, from the calls of `batchinfer.storage.dynamo.Table` each function's code reaches: get ->
    GetItem, get_many -> BatchGetItem, put -> PutItem, update -> UpdateItem, delete -> DeleteItem, query /
    query_all -> Query (on the table, and on `indexes` only), delete_many -> BatchWriteItem; transact
    (TransactWriteItems) is authorized per item as PutItem / UpdateItem / DeleteItem / ConditionCheckItem.
    Never Scan, DescribeTable or any stream action. S3, from `batchinfer.storage.blobs.Blobs`: get, stream,
    head and presigned downloads -> GetObject; put, copy and multipart parts -> PutObject (and
    AbortMultipartUpload); delete / delete_prefix -> DeleteObject; s3:ListBucket for delete_prefix's
    listing and so that a missing object answers 404 (NoSuchKey), not 403: `Blobs.get` relies on it.
    """

    table_actions: tuple[str, ...] = ()
    indexes: tuple[str, ...] = ()
    object_actions: tuple[str, ...] = ()


_READ_OBJECTS = ("s3:GetObject",)
_WRITE_OBJECTS = ("s3:PutObject", "s3:AbortMultipartUpload")
_DELETE_OBJECTS = ("s3:DeleteObject",)
# Transactions: every op kind the storage layer builds (records: op_put/op_update/op_delete/op_check).
_TRANSACT = ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:ConditionCheckItem")
DATA_ACCESS: dict[str, DataAccess] = {
    # Routes: create (transactions), list (by_owner), get, cancel (settle), delete (purge: delete_many, S3
    # delete_prefix), files and uploads (objects in and out, presigned downloads), webhooks settings.
    "api": DataAccess(
        table_actions=("dynamodb:GetItem", "dynamodb:Query", "dynamodb:BatchWriteItem", *_TRANSACT),
        indexes=("by_owner",),
        object_actions=(*_READ_OBJECTS, *_WRITE_OBJECTS, *_DELETE_OBJECTS),
    ),
    # Dispatcher: lanes (query, discard), due retries (by_due), budgets, claims (transactions); reads the
    # request index objects it sends from.
    "dispatcher": DataAccess(
        table_actions=("dynamodb:GetItem", "dynamodb:Query", *_TRANSACT),
        indexes=("by_due",),
        object_actions=_READ_OBJECTS,
    ),
    # Worker: the dispatcher's claims (it pulls more work itself), key/account/usage in one BatchGetItem,
    # outcomes (put), settling and finalizing a batch it ended (result files: objects written).
    "worker": DataAccess(
        table_actions=("dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query", *_TRANSACT),
        indexes=("by_due",),
        object_actions=(*_READ_OBJECTS, *_WRITE_OBJECTS),
    ),
    # Sweeper: active batches (by_active), leases, purges and webhook relays (by_due), batch reads of
    # requests, finalization (result files), retention purges (delete_many, delete_prefix).
    "sweeper": DataAccess(
        table_actions=(
            "dynamodb:GetItem",
            "dynamodb:BatchGetItem",
            "dynamodb:Query",
            "dynamodb:BatchWriteItem",
            *_TRANSACT,
        ),
        indexes=("by_due", "by_active"),
        object_actions=(*_READ_OBJECTS, *_WRITE_OBJECTS, *_DELETE_OBJECTS),
    ),
    # Webhooks: reads the event and the account's webhook, records each attempt (conditional updates).
    "webhooks": DataAccess(table_actions=("dynamodb:GetItem", "dynamodb:UpdateItem")),
}


class ServiceFunctions(Construct):
    """Builds the layers and the api, dispatcher, worker, sweeper and webhooks functions with their grants."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: InfraConfig,
        storage: Storage,
        queues: ModelQueues,
        secrets: ModelSecrets,
        webhooks: WebhookDelivery,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._storage = storage

        self.core_layer = lambda_.LayerVersion(
            self,
            "CoreLayer",
            code=lambda_.Code.from_asset(str(layers.CORE_LAYER_DIR), exclude=["**/__pycache__", "**/*.pyc"]),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="batchinfer core package",
        )
        deps = layers.deps_layer(skip=config.skip_deps_build or layers.skip_requested())
        if deps.placeholder:
            Annotations.of(self).add_warning_v2(
                "batchinfer:placeholder-deps-layer",
                "The deps layer is an empty placeholder (BATCHINFER_SKIP_DEPS_BUILD): do not deploy this.",
            )
        self.deps_layer = lambda_.LayerVersion(
            self,
            "DepsLayer",
            # The stamp hash identifies the content, so CDK need not fingerprint ~50 MB on every synth.
            code=lambda_.Code.from_asset(
                str(deps.path), asset_hash=deps.asset_hash, asset_hash_type=AssetHashType.CUSTOM
            ),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="batchinfer third-party dependencies (requirements-layer.lock)",
        )
        self.layers: list[lambda_.ILayerVersion] = [self.core_layer, self.deps_layer]

        common_env = {
            **config.catalog_env,
            **config.settings_env(),
            "TABLE_NAME": storage.table.table_name,
            "BUCKET_NAME": storage.bucket.bucket_name,
            # Per stage, so two stages in one account never feed each other's alarms (infra/monitoring.py
            # reads the same config.metrics_namespace).
            "POWERTOOLS_METRICS_NAMESPACE": config.metrics_namespace,
            # Tracer must not copy return values (prompts, results) into X-Ray.
            "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
        }
        if config.custom_catalog:
            self.layers.append(self._custom_catalog_layer())
            common_env["MODELS_FILE"] = f"/opt/{CUSTOM_CATALOG_DIR}/{config.models_path.name}"

        # Only the functions that announce endings (api: cancel; worker, sweeper) or deliver them get the
        # delivery queue and the secrets' key; the dispatcher never ends a batch.
        webhook_env = {
            "WEBHOOK_QUEUE_URL": webhooks.queue.queue_url,
            "WEBHOOK_KEY_ID": webhooks.key.key_arn,
        }
        # api and worker call backends (interactive requests; batches), so both read the backend keys.
        model_secrets = {"MODEL_SECRETS": secrets.secret_arns_json()}
        # Reserved concurrency: the worker's keeps what the scheduler's calls run on out of a flood of API
        # calls' reach (and the dispatcher's and sweeper's, below); the api's, when set, caps the API.
        models = [entry.model for entry in queues.by_model.values()]
        # Bedrock's batch inference (infra/bedrock_batch.py): its service role, named to the functions that
        # plan parts of batches (api: create; worker and sweeper: file batches validated).
        self.bedrock_batch = (BedrockBatchJobs(self, "BedrockBatch", storage=storage, models=models)
                              if tier_models(models) else None)
        tier_env = {ROLE_ENV: self.bedrock_batch.role.role_arn} if self.bedrock_batch else {}
        self.api = self._function(
            API,
            common_env,
            {"MAX_BODY_BYTES": str(config.max_body_bytes), **model_secrets, **webhook_env, **tier_env},
            reserved=config.api_reserved_concurrency,
        )
        self.dispatcher = self._function(
            DISPATCHER, common_env, {"MODEL_QUEUES": queues.queue_urls_json()}, scheduled=True
        )
        self.worker = self._function(
            WORKER, common_env, {**model_secrets, **webhook_env, **tier_env}, reserved=config.worker_reserve(models)
        )
        self.sweeper = self._function(
            SWEEPER, common_env, {"MODEL_QUEUES": queues.queue_urls_json(), **webhook_env, **tier_env},
            scheduled=True
        )
        self.webhooks = self._function(WEBHOOKS, common_env, webhook_env)
        reserved = config.reserved_total(models)
        if reserved > DEFAULT_ACCOUNT_CONCURRENCY - UNRESERVED_FLOOR:
            Annotations.of(self).add_warning_v2(
                "batchinfer:reserved-concurrency",
                f"The functions reserve {reserved} concurrent executions: a deploy fails unless the account's "
                f"Lambda concurrency is at least {reserved + UNRESERVED_FLOOR} (a new account's is "
                f"{DEFAULT_ACCOUNT_CONCURRENCY}).",
            )

        # Table and bucket: exactly the actions each function calls (DATA_ACCESS), no grant groups.
        for name, function in self.functions.items():
            self._grant_data(function, DATA_ACCESS[name])
        # api (interactive requests) and worker (batches): read backend keys.
        for secret in secrets.secrets:
            secret.grant_read(self.api)
            secret.grant_read(self.worker)
        # Bedrock models: the functions that call backends (worker: batches; api: interactive requests) may
        # invoke exactly the catalog's models and inference profiles.
        for function in (self.api, self.worker):
            self._grant_bedrock(function, models)
        # The sweeper alone makes Bedrock's batch jobs (service.offloading.jobs), and alone may pass their role.
        if self.bedrock_batch is not None:
            self.bedrock_batch.allow_jobs(self.sweeper)
        # dispatcher and sweeper (lease recovery) send to the model queues; the worker consumes them.
        for queue in queues.queues:
            queue.grant_send_messages(self.dispatcher)
            queue.grant_send_messages(self.sweeper)
        # The webhooks function consumes the delivery queue (event source below) and sends its retries back.
        for function in (self.api, self.worker, self.sweeper, self.webhooks):
            webhooks.queue.grant_send_messages(function)
        # Secrets: the api seals them (PUT /v1/batch_webhook), the webhooks function opens them to sign.
        # Exactly these actions: grant_encrypt/grant_decrypt would add ReEncrypt*/GenerateDataKey*.
        webhooks.key.grant(self.api, "kms:Encrypt")
        webhooks.key.grant(self.webhooks, "kms:Decrypt")

        for entry in queues.by_model.values():
            self.worker.add_event_source(
                event_sources.SqsEventSource(
                    entry.queue,
                    batch_size=WORKER_BATCH_SIZE,
                    report_batch_item_failures=True,
                    # Never more workers on a model than its batch budget lets run at once.
                    max_concurrency=entry.model.max_concurrency,
                )
            )
        self.webhooks.add_event_source(
            event_sources.SqsEventSource(
                webhooks.queue,
                batch_size=WEBHOOKS_BATCH_SIZE,
                report_batch_item_failures=True,
                max_concurrency=WEBHOOKS_MAX_CONCURRENCY,
            )
        )

        self._acknowledge_grant_wildcards()

    @property
    def functions(self) -> dict[str, lambda_.Function]:
        return {
            "api": self.api,
            "dispatcher": self.dispatcher,
            "worker": self.worker,
            "sweeper": self.sweeper,
            "webhooks": self.webhooks,
        }

    def _function(
        self,
        spec: FunctionSpec,
        common_env: dict[str, str],
        own_env: dict[str, str],
        *,
        scheduled: bool = False,
        reserved: int | None = None,
    ) -> lambda_.Function:
        config = self._config
        removal = RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY
        group = Construct(self, spec.name.capitalize())
        log_group = logs.LogGroup(
            group,
            "Logs",
            retention=log_retention(config.log_retention_days),
            removal_policy=removal,
        )
        # An own role per function, with logging scoped to its log group: no AWSLambdaBasicExecutionRole.
        role = iam.Role(
            group,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"batchinfer {config.stage} {spec.name} function",
        )
        log_group.grant_write(role)
        environment = {**common_env, **own_env, "POWERTOOLS_SERVICE_NAME": function_service_name(spec.name)}
        estimate = estimated_env_bytes(environment)
        if estimate > LAMBDA_ENV_LIMIT_BYTES * 0.9:
            Annotations.of(group).add_warning_v2(
                "batchinfer:environment-size",
                f"{spec.name}: environment is ~{estimate} bytes once deployed; Lambda refuses more than 4 KB "
                "(MODEL_QUEUES/MODEL_SECRETS grow with the catalog).",
            )
        function = lambda_.Function(
            group,
            "Function",
            function_name=f"{config.stage}-batchinfer-{spec.name}",
            description=spec.description,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=HANDLER,
            code=lambda_.Code.from_asset(
                str(FUNCTIONS_DIR / spec.name), exclude=["**/__pycache__", "**/*.pyc", "tests"]
            ),
            layers=self.layers,
            timeout=spec.timeout,
            memory_size=spec.memory_mb,
            environment=environment,
            tracing=lambda_.Tracing.ACTIVE,
            role=role,
            log_group=log_group,
            # Scheduled functions: a failed tick is not retried (the next tick, a minute later, does the
            # same work); reserved concurrency keeps overlapping ticks few.
            reserved_concurrent_executions=config.scheduled_reserved_concurrency if scheduled else reserved,
            retry_attempts=0 if scheduled else None,
            max_event_age=Duration.minutes(1) if scheduled else None,
        )
        acknowledge(
            function,
            "AwsSolutions-L1",
            "Pinned to Python 3.12: the deps layer's binary wheels (pydantic-core, PyYAML) are built for "
            "cp312; move runtime and layer build together.",
        )
        return function

    def _custom_catalog_layer(self) -> lambda_.LayerVersion:
        """Bundle a non-default catalog file as a small layer at /opt/batchinfer-catalog/."""
        source = self._config.models_path
        target_root = layers.BUILD_DIR / "catalog" / self._config.stage
        target_dir = target_root / CUSTOM_CATALOG_DIR
        if target_root.exists():
            shutil.rmtree(target_root)
        target_dir.mkdir(parents=True)
        shutil.copy2(source, target_dir / source.name)
        return lambda_.LayerVersion(
            self,
            "CatalogLayer",
            code=lambda_.Code.from_asset(str(target_root)),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description=f"batchinfer model catalog {source.name}",
        )

    def _grant_data(self, function: lambda_.Function, access: DataAccess) -> None:
        table, bucket = self._storage.table, self._storage.bucket
        if access.table_actions:
            function.add_to_role_policy(
                iam.PolicyStatement(actions=list(access.table_actions), resources=[table.table_arn])
            )
        if access.indexes:
            function.add_to_role_policy(
                iam.PolicyStatement(
                    actions=["dynamodb:Query"],
                    resources=[f"{table.table_arn}/index/{index}" for index in access.indexes],
                )
            )
        if access.object_actions:
            function.add_to_role_policy(
                iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket.bucket_arn])
            )
            function.add_to_role_policy(
                iam.PolicyStatement(
                    actions=list(access.object_actions), resources=[bucket.arn_for_objects("*")]
                )
            )

    def _grant_bedrock(self, function: lambda_.Function, models: list[CatalogModel]) -> None:
        """bedrock:InvokeModel on each Bedrock model's own ARN; a profile's foundation models (Region `*`)
        in a statement of their own that holds only for calls through that profile."""
        accesses = [
            bedrock.access(m.model_id, m.bedrock_model_id, m.region)
            for m in models
            if m.is_bedrock and m.bedrock_model_id and m.region
        ]
        if not accesses:
            return
        actions = bedrock.actions(streams=function is self.api)
        invoked = sorted({a.invoked for a in accesses})
        function.add_to_role_policy(
            iam.PolicyStatement(actions=actions, resources=[_arn(arn) for arn in invoked])
        )
        assert function.role is not None
        routed = {(a.invoked, a.routed): a for a in accesses if a.routed is not None}  # one per profile
        for entry in routed.values():
            assert entry.routed is not None
            function.add_to_role_policy(
                iam.PolicyStatement(
                    actions=actions,
                    resources=[_arn(entry.routed)],
                    conditions={"StringEquals": {bedrock.PROFILE_CONDITION_KEY: _arn(entry.invoked)}},
                )
            )
            acknowledge(
                function.role,
                f"AwsSolutions-IAM5[Resource::{_nag_arn(entry.routed)}]",
                f"Model {entry.model_id} is an inference profile: Bedrock also checks the foundation model in "
                "whichever Region the profile routes a call to, and AWS may add Regions, so the model ARN takes "
                f"Region *. The statement holds only for calls through that profile ({bedrock.PROFILE_CONDITION_KEY}).",
            )

    def _acknowledge_grant_wildcards(self) -> None:
        """The wildcards left, acknowledged per role with what they are scoped to."""
        bucket = nag_ref(self._storage.bucket)
        for name, function in self.functions.items():
            assert function.role is not None
            findings = {"AwsSolutions-IAM5[Resource::*]": _XRAY_REASON + (
                " " + LIST_REASON if name == "sweeper" and self.bedrock_batch is not None else "")}
            if DATA_ACCESS[name].object_actions:
                findings[f"AwsSolutions-IAM5[Resource::{bucket}/*]"] = _BUCKET_OBJECTS_REASON
            acknowledge_all(function.role, findings)


# fmt: off
_RETENTION = {
    1: logs.RetentionDays.ONE_DAY, 3: logs.RetentionDays.THREE_DAYS, 5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK, 14: logs.RetentionDays.TWO_WEEKS, 30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS, 90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS, 150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS, 365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS, 545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS, 1096: logs.RetentionDays.THREE_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS, 2192: logs.RetentionDays.SIX_YEARS,
    2557: logs.RetentionDays.SEVEN_YEARS, 2922: logs.RetentionDays.EIGHT_YEARS,
    3288: logs.RetentionDays.NINE_YEARS, 3653: logs.RetentionDays.TEN_YEARS,
}
# fmt: on


def _arn(template: str) -> str:
    """An ARN from infra.bedrock: `${AWS::Partition}`/`${AWS::AccountId}` filled in by CloudFormation."""
    return Fn.sub(template) if "${" in template else template


def _nag_arn(template: str) -> str:
    """How cdk-nag prints such an ARN in a finding id (pseudo parameters as `<AWS::Partition>`)."""
    return re.sub(r"\$\{([^}]+)\}", r"<\1>", template)


def estimated_env_bytes(environment: dict[str, str]) -> int:
    """Size of an environment once CloudFormation has resolved its tokens (upper estimate)."""
    total = 0
    for key, value in environment.items():
        tokens = len(_TOKEN.findall(value))
        total += len(key) + len(_TOKEN.sub("", value)) + tokens * _TOKEN_ESTIMATE_BYTES
    return total


def log_retention(days: int) -> logs.RetentionDays:
    """CloudWatch Logs retention for a number of days (config validates the allowed values)."""
    return _RETENTION[days]
