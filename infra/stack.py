"""The batchinfer stack: storage, per-model queues and secrets, webhook delivery, functions, API, schedules,
monitoring."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from aws_cdk import Annotations, App, CfnOutput, Stack, Tags
from constructs import Construct

from infra.api import HttpApiFront
from infra.config import REPO_ROOT, Catalog, InfraConfig, load_catalog, resolve_config
from infra.functions import WEBHOOKS as WEBHOOKS_SPEC
from infra.functions import WORKER as WORKER_SPEC
from infra.functions import ServiceFunctions, log_retention
from infra.monitoring import COST_TAG, Monitoring
from infra.nag import apply_nag
from infra.queues import ModelQueues, ModelSecrets
from infra.schedules import Schedules
from infra.storage import Storage
from infra.webhooks import WebhookDelivery


class DeploymentConfigError(ValueError):
    """The configuration would deploy a stack that does not serve, or fails without anyone hearing of it."""


def deployment_problems(config: InfraConfig, catalog: Catalog) -> list[tuple[str, str]]:
    """(code, message) of each problem that makes a deployment half-working: errors outside `dev`, warnings
    in it."""
    problems: list[tuple[str, str]] = []
    for model in catalog.models:
        reason = model.local_backend
        if reason and model.is_bedrock:
            problems.append(
                (
                    f"loopback-backend:{model.slug}",
                    f"model {model.model_id}: Bedrock endpoint_url {model.endpoint_url} is unreachable from "
                    f"Lambda ({reason}; the functions run outside any VPC). Drop endpoint_url to call the "
                    f"Bedrock endpoint of region {model.region}, or point it at a public one: models_file, or "
                    "catalog_env for a ${VAR} in it.",
                )
            )
        elif reason:
            problems.append(
                (
                    f"loopback-backend:{model.slug}",
                    f"model {model.model_id}: backend {model.base_url} is unreachable from Lambda ({reason}; "
                    "the functions run outside any VPC). Point the catalog at a public backend: "
                    "models_file, or catalog_env for a ${VAR} in its base_url (e.g. SIMULATED_BACKEND_URL).",
                )
            )
    if not config.has_alarm_subscription:
        problems.append(
            (
                "no-alarm-subscription",
                "no alarm subscription: alarms would fire into a topic nobody reads. Set alarm_email "
                "(-c alarm_email=ops@example.com) or alarm_topic_arn (an existing SNS topic).",
            )
        )
    return problems


class BatchInferenceStack(Stack):
    """Everything one stage of the service needs; environment-agnostic, so it synthesizes offline."""

    def __init__(self, scope: Construct, construct_id: str, *, config: InfraConfig, catalog: Catalog) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"batchinfer {config.stage}: serverless batch inference (OpenAI/Anthropic batches)",
        )
        self.config = config
        self.catalog = catalog
        Tags.of(self).add("project", "batchinfer")
        Tags.of(self).add("stage", config.stage)
        # The cost allocation tag the stage-scoped budget filters on (activate it once in Billing).
        Tags.of(self).add(COST_TAG, config.stage)

        problems = deployment_problems(config, catalog)
        if problems and not config.is_dev:
            # Outside dev a stack that synthesizes but would not serve (or would fail silently) is refused.
            raise DeploymentConfigError(
                f"stage {config.stage!r} cannot be deployed as configured:\n"
                + "\n".join(f"  - {text}" for _, text in problems)
            )
        for code, text in problems:
            Annotations.of(self).add_warning_v2(f"batchinfer:{code}", text)

        self.storage = Storage(self, "Storage", config=config)
        self.queues = ModelQueues(
            self, "ModelQueues", config=config, models=catalog.models, worker_timeout=WORKER_SPEC.timeout
        )
        self.secrets = ModelSecrets(self, "ModelSecrets", config=config, models=catalog.models)
        self.webhooks = WebhookDelivery(
            self, "WebhookDelivery", config=config, function_timeout=WEBHOOKS_SPEC.timeout
        )
        self.functions = ServiceFunctions(
            self,
            "Functions",
            config=config,
            storage=self.storage,
            queues=self.queues,
            secrets=self.secrets,
            webhooks=self.webhooks,
        )
        self.api = HttpApiFront(
            self,
            "Api",
            config=config,
            function=self.functions.api,
            log_retention=log_retention(config.log_retention_days),
        )
        # URLs the API hands out (a Message Batch's results_url) name the API's own URL, not whatever Host
        # header a request came with. No cycle: the HTTP API itself does not depend on the function.
        self.functions.api.add_environment("PUBLIC_BASE_URL", self.api.url)
        self.schedules = Schedules(
            self,
            "Schedules",
            config=config,
            dispatcher=self.functions.dispatcher,
            sweeper=self.functions.sweeper,
        )
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            config=config,
            functions=self.functions,
            queues=self.queues,
            webhooks=self.webhooks,
            api=self.api,
            storage=self.storage,
            schedule_group=self.schedules.group,
        )

        CfnOutput(
            self,
            "ApiUrl",
            value=self.api.url,
            description="Base URL for the SDKs (add /v1 for OpenAI): the custom domain's when one is set",
        )
        CfnOutput(self, "ApiEndpoint", value=self.api.http_api.api_endpoint, description="execute-api URL")
        if self.api.domain is not None:
            CfnOutput(
                self,
                "DomainTarget",
                value=self.api.domain.regional_domain_name,
                description=f"Point {config.domain_name} here (CNAME, or a Route 53 alias with the zone id "
                "output DomainHostedZoneId)",
            )
            CfnOutput(self, "DomainHostedZoneId", value=self.api.domain.regional_hosted_zone_id)
        CfnOutput(self, "TableName", value=self.storage.table.table_name)
        CfnOutput(self, "BucketName", value=self.storage.bucket.bucket_name)
        CfnOutput(self, "AlarmTopicArn", value=self.monitoring.topic.topic_arn)
        CfnOutput(self, "MetricsNamespace", value=config.metrics_namespace)
        CfnOutput(self, "DashboardName", value=self.monitoring.dashboard.dashboard_name)
        CfnOutput(
            self,
            "ModelSecretNames",
            value=json.dumps(
                {m.model_id: m.secret_name(config.stage) for m in catalog.models if m.needs_secret}
            ),
            description="Put each backend key with: aws secretsmanager put-secret-value --secret-id <name>",
        )


def cdk_json_context() -> dict[str, Any]:
    """The `context` object of the repo's cdk.json."""
    path = REPO_ROOT / "cdk.json"
    return dict(json.loads(path.read_text()).get("context", {})) if path.is_file() else {}


def stack_name(stage: str) -> str:
    return f"batchinfer-{stage}"


def build_app(
    context: Mapping[str, Any] | None = None, *, outdir: str | None = None, nag: bool = True
) -> tuple[App, BatchInferenceStack]:
    """Create the CDK app with one stage's stack; with `nag`, synthesis fails on cdk-nag findings."""
    # cdk.json's context (feature flags, `batchinfer` defaults) is the base, so `python app.py` and the
    # tests synthesize what `cdk deploy` would; the CLI's own context (cdk.json, -c) still wins over it.
    app_kwargs: dict[str, Any] = {"context": {**cdk_json_context(), **dict(context or {})}}
    if outdir is not None:
        app_kwargs["outdir"] = outdir
    elif "CDK_OUTDIR" not in os.environ:
        # Run as `python app.py` (make synth), not under the CDK CLI: write where the CLI would.
        app_kwargs["outdir"] = str(REPO_ROOT / "cdk.out")
    app = App(**app_kwargs)
    config = resolve_config(app.node.try_get_context)
    catalog = load_catalog(config.models_path, stage=config.stage, env=config.catalog_env)
    leaked = sorted({m.api_key_env for m in catalog.models if m.api_key_env in config.catalog_env})
    if leaked:
        # catalog_env lands in plain text in the template and the function configuration.
        raise ValueError(
            f"catalog_env sets backend key variables {leaked}: put keys in the model secrets instead"
        )
    stack = BatchInferenceStack(app, stack_name(config.stage), config=config, catalog=catalog)
    if nag:
        apply_nag(app)
    return app, stack
