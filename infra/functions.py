"""The five Lambda functions, their layers, log groups and least-privilege roles."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass

from aws_cdk import Annotations, AssetHashType, Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_logs as logs
from constructs import Construct

from batchinfer.catalog import METRICS_NAMESPACE, function_service_name  # the namespace observability emits in
from infra import layers
from infra.config import REPO_ROOT, InfraConfig
from infra.nag import acknowledge, acknowledge_all, nag_ref
from infra.queues import ModelQueues, ModelSecrets
from infra.storage import Storage
from infra.webhooks import WebhookDelivery

RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.X86_64
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
_TABLE_INDEX_REASON = "Queries the table's own GSIs (by_owner, by_due, by_active); scoped to this table."
_BUCKET_OBJECTS_REASON = "Object keys are per batch and per file, created at run time; scoped to this bucket."
_S3_ACTIONS_REASON = (
    "Action groups from the CDK bucket grant; resources are this bucket and its objects only."
)


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
            description="batchinfer third-party dependencies (requirements.txt)",
        )
        self.layers: list[lambda_.ILayerVersion] = [self.core_layer, self.deps_layer]

        common_env = {
            **config.catalog_env,
            **config.settings_env(),
            "TABLE_NAME": storage.table.table_name,
            "BUCKET_NAME": storage.bucket.bucket_name,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
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
        self.api = self._function(
            API, common_env, {"MAX_BODY_BYTES": str(config.max_body_bytes), **webhook_env}
        )
        self.dispatcher = self._function(
            DISPATCHER, common_env, {"MODEL_QUEUES": queues.queue_urls_json()}, scheduled=True
        )
        self.worker = self._function(
            WORKER, common_env, {"MODEL_SECRETS": secrets.secret_arns_json(), **webhook_env}
        )
        self.sweeper = self._function(
            SWEEPER, common_env, {"MODEL_QUEUES": queues.queue_urls_json(), **webhook_env}, scheduled=True
        )
        self.webhooks = self._function(WEBHOOKS, common_env, webhook_env)

        # api: state and objects, no model queues. It presigns downloads with its own role (needs GetObject) and
        # deletes what it wrote when a batch create fails its transaction (Blobs.delete_prefix).
        storage.table.grant_read_write_data(self.api)
        storage.bucket.grant_read_write(self.api)
        # dispatcher: reads request bodies' pointers, sends to the model queues.
        storage.table.grant_read_write_data(self.dispatcher)
        storage.bucket.grant_read(self.dispatcher)
        # worker: runs requests, writes results; consumes its queues (event sources); reads backend keys.
        storage.table.grant_read_write_data(self.worker)
        storage.bucket.grant_read(self.worker)
        storage.bucket.grant_put(self.worker)
        for secret in secrets.secrets:
            secret.grant_read(self.worker)
        # sweeper: finalization writes result files, retention deletes objects, lease recovery re-queues.
        storage.table.grant_read_write_data(self.sweeper)
        storage.bucket.grant_read_write(self.sweeper)
        for queue in queues.queues:
            queue.grant_send_messages(self.dispatcher)
            queue.grant_send_messages(self.sweeper)
        # webhooks: events and the accounts' webhooks in the table; no objects. Consumes the delivery queue
        # (event source below) and sends its retries back to it.
        storage.table.grant_read_write_data(self.webhooks)
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
            reserved_concurrent_executions=config.scheduled_reserved_concurrency if scheduled else None,
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

    def _acknowledge_grant_wildcards(self) -> None:
        """The wildcards that CDK grants produce, acknowledged per role with what they are scoped to."""
        table = nag_ref(self._storage.table)
        bucket = nag_ref(self._storage.bucket)
        read = {
            "AwsSolutions-IAM5[Action::s3:GetObject*]": _S3_ACTIONS_REASON,
            "AwsSolutions-IAM5[Action::s3:GetBucket*]": _S3_ACTIONS_REASON,
            "AwsSolutions-IAM5[Action::s3:List*]": _S3_ACTIONS_REASON,
            f"AwsSolutions-IAM5[Resource::{bucket}/*]": _BUCKET_OBJECTS_REASON,
        }
        put = {"AwsSolutions-IAM5[Action::s3:Abort*]": _S3_ACTIONS_REASON}
        delete = {"AwsSolutions-IAM5[Action::s3:DeleteObject*]": _S3_ACTIONS_REASON}
        common = {
            "AwsSolutions-IAM5[Resource::*]": _XRAY_REASON,
            f"AwsSolutions-IAM5[Resource::{table}/index/*]": _TABLE_INDEX_REASON,
        }
        per_function = {
            "api": {**common, **read, **put, **delete},
            "dispatcher": {**common, **read},
            "worker": {**common, **read, **put},
            "sweeper": {**common, **read, **put, **delete},
            "webhooks": common,
        }
        for name, function in self.functions.items():
            assert function.role is not None
            acknowledge_all(function.role, per_function[name])


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
