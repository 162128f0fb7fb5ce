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
from infra.monitoring import Monitoring
from infra.nag import apply_nag
from infra.queues import ModelQueues, ModelSecrets
from infra.schedules import Schedules
from infra.storage import Storage
from infra.webhooks import WebhookDelivery


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

        for model in catalog.models:
            if model.backend_is_loopback:
                Annotations.of(self).add_warning_v2(
                    f"batchinfer:loopback-backend:{model.slug}",
                    f"model {model.model_id}: backend {model.base_url} is a loopback address, unreachable "
                    "from Lambda; set catalog_env (e.g. SIMULATED_BACKEND_URL) or point models_file at a "
                    "catalog with real backends.",
                )

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
        )

        CfnOutput(
            self, "ApiUrl", value=self.api.url, description="Base URL for the SDKs (add /v1 for OpenAI)"
        )
        CfnOutput(self, "TableName", value=self.storage.table.table_name)
        CfnOutput(self, "BucketName", value=self.storage.bucket.bucket_name)
        CfnOutput(self, "AlarmTopicArn", value=self.monitoring.topic.topic_arn)
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
