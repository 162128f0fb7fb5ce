"""Assertions on the synthesized CloudFormation template: the functions (runtime, layers, environment, reserved
concurrency), the HTTP API, a custom catalog bundled with them, and the alarms and dashboard."""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk.assertions import Annotations, Match

from infra.config import load_catalog
from tests.infra.conftest import FUNCTION_NAMES, Synth, env, function_resource, synthesize

REPO = Path(__file__).resolve().parents[2]
CATALOG = load_catalog(REPO / "layers/core/python/batchinfer/models.yaml", stage="dev")


# -- functions, layers, API -------------------------------------------------------------------------------


def test_functions_runtime_layers_tracing_and_logs(synth: Synth) -> None:
    layer_ids = set(synth.resources("AWS::Lambda::LayerVersion"))
    assert len(layer_ids) == 2  # core + deps; no catalog layer with the default catalog
    for name in FUNCTION_NAMES:
        _, function = function_resource(synth, name)
        props = function["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["Architectures"] == ["arm64"]
        assert props["Handler"] == "handler.handler"
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert {layer["Ref"] for layer in props["Layers"]} == layer_ids
        log_group_id = props["LoggingConfig"]["LogGroup"]["Ref"]
        assert synth.resources("AWS::Logs::LogGroup")[log_group_id]["Properties"]["RetentionInDays"] == 30
    assert function_resource(synth, "dispatcher")[1]["Properties"]["Timeout"] == 70
    assert function_resource(synth, "sweeper")[1]["Properties"]["Timeout"] == 70
    assert function_resource(synth, "worker")[1]["Properties"]["Timeout"] == 180
    assert function_resource(synth, "webhooks")[1]["Properties"]["Timeout"] == 30
    assert function_resource(synth, "api")[1]["Properties"]["Timeout"] <= 29


def test_environment_per_function(synth: Synth) -> None:
    common = {
        "STAGE": "dev",
        "LOG_LEVEL": "INFO",
        "POWERTOOLS_METRICS_NAMESPACE": "batchinfer/dev",
        "FILE_BATCHES_ENABLED": "false",
        "MESSAGE_BATCHES_ENABLED": "false",
        "EMBEDDINGS_RESPONSES_BATCHES_ENABLED": "false",
        "BATCH_WEBHOOKS_ENABLED": "false",
        "BATCH_COMPLETION_WINDOW_SECONDS": "86400",
        "BATCH_RETENTION_SECONDS": "604800",
        "TIER_LIMITS": "free=8,pro=16,internal=64",
    }
    wiring = {"WEBHOOK_QUEUE_URL", "WEBHOOK_KEY_ID"}
    own = {
        "api": {"MAX_BODY_BYTES", "MODEL_SECRETS", *wiring},
        "dispatcher": {"MODEL_QUEUES"},
        "worker": {"MODEL_SECRETS", *wiring},
        "sweeper": {"MODEL_QUEUES", *wiring},
        "webhooks": wiring,
    }
    for name in FUNCTION_NAMES:
        variables = env(synth, name)
        assert variables["POWERTOOLS_SERVICE_NAME"] == f"batchinfer-{name}"
        for key, value in common.items():
            assert variables[key] == value, (name, key)
        assert {"TABLE_NAME", "BUCKET_NAME"} <= set(variables)
        assert "MODELS_FILE" not in variables
        assert {"MAX_BODY_BYTES", "MODEL_QUEUES", "MODEL_SECRETS", *wiring} & set(variables) == own[name]
    assert env(synth, "api")["MAX_BODY_BYTES"] == "4194304"


def test_the_api_knows_its_public_url(synth: Synth, edge_synth: Synth) -> None:
    """PUBLIC_BASE_URL (the base of a Message Batch's results_url): the execute-api URL, or the custom domain's."""
    public = env(synth, "api")["PUBLIC_BASE_URL"]
    assert synth.logical_id(synth.stack.api.http_api) in json.dumps(public), public  # resolved at deploy
    assert env(edge_synth, "api")["PUBLIC_BASE_URL"] == "https://batch.example.com"
    assert all("PUBLIC_BASE_URL" not in env(synth, name) for name in FUNCTION_NAMES if name != "api")


def test_handlers_and_core_package_resolve_in_packaged_assets(synth: Synth) -> None:
    for name in FUNCTION_NAMES:
        s3_key = function_resource(synth, name)[1]["Properties"]["Code"]["S3Key"]
        asset_dir = synth.outdir / f"asset.{s3_key.removesuffix('.zip')}"
        handler = asset_dir / "handler.py"
        assert handler.is_file(), f"{name}: handler.py missing from the packaged asset"
        assert "def handler(" in handler.read_text()
    core_id = synth.logical_id(synth.stack.functions.core_layer)
    core_key = synth.resources("AWS::Lambda::LayerVersion")[core_id]["Properties"]["Content"]["S3Key"]
    core_dir = synth.outdir / f"asset.{core_key.removesuffix('.zip')}"
    assert (core_dir / "python/batchinfer/__init__.py").is_file()
    assert (core_dir / "python/batchinfer/models.yaml").is_file()
    assert not list(core_dir.rglob("__pycache__"))


def test_http_api_default_route_stage_and_access_logs(synth: Synth) -> None:
    synth.template.resource_count_is("AWS::ApiGatewayV2::Api", 1)
    synth.template.has_resource_properties("AWS::ApiGatewayV2::Api", {"ProtocolType": "HTTP"})
    synth.template.has_resource_properties("AWS::ApiGatewayV2::Route", {"RouteKey": "$default"})
    synth.template.has_resource_properties(
        "AWS::ApiGatewayV2::Integration",
        {
            "IntegrationType": "AWS_PROXY",
            "PayloadFormatVersion": "2.0",
            "IntegrationUri": {"Fn::GetAtt": [function_resource(synth, "api")[0], "Arn"]},
        },
    )
    synth.template.has_resource_properties(
        "AWS::ApiGatewayV2::Stage",
        {
            "StageName": "$default",
            "AutoDeploy": True,
            "AccessLogSettings": Match.object_like({"Format": Match.any_value()}),
            "DefaultRouteSettings": {"ThrottlingRateLimit": 100, "ThrottlingBurstLimit": 200},
        },
    )


def test_scheduled_functions_reserved_concurrency_and_no_retries(synth: Synth, edge_synth: Synth) -> None:
    for name in ("dispatcher", "sweeper"):
        logical_id, function = function_resource(synth, name)
        assert function["Properties"]["ReservedConcurrentExecutions"] == 2
        synth.template.has_resource_properties(
            "AWS::Lambda::EventInvokeConfig",
            {"FunctionName": {"Ref": logical_id}, "MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60},
        )
        assert "ReservedConcurrentExecutions" not in function_resource(edge_synth, name)[1]["Properties"]


def test_the_worker_has_its_own_concurrency_a_flood_of_api_calls_cannot_take(synth: Synth, edge_synth: Synth) -> None:
    # The default: the queued models' budgets together, what their event sources may run at once.
    worker = function_resource(synth, "worker")[1]["Properties"]
    assert worker["ReservedConcurrentExecutions"] == sum(m.max_concurrency for m in CATALOG.models) > 0
    # A catalog whose budgets add up past what an account has: auto keeps to half a default account.
    assert function_resource(edge_synth, "worker")[1]["Properties"]["ReservedConcurrentExecutions"] == 500
    # The api is unreserved unless a maximum is set (it then takes at most that many at once).
    assert "ReservedConcurrentExecutions" not in function_resource(synth, "api")[1]["Properties"]


def test_reserved_concurrency_from_the_deployment_settings(tmp_path: Path) -> None:
    chosen = synthesize(tmp_path, {"worker_reserved_concurrency": "40",
                                   "api_reserved_concurrency": "300", "tier_requests_per_minute": "free=600"})
    assert function_resource(chosen, "worker")[1]["Properties"]["ReservedConcurrentExecutions"] == 40
    api = function_resource(chosen, "api")[1]["Properties"]
    assert api["ReservedConcurrentExecutions"] == 300
    assert api["Environment"]["Variables"]["TIER_REQUESTS_PER_MINUTE"] == "free=600"
    assert api["Environment"]["Variables"]["MAX_LONG_POLLS_PER_ACCOUNT"] == "20"
    # More than a default account can reserve: the synth says so.
    over = synthesize(tmp_path / "over", {"api_reserved_concurrency": "900"})
    warnings = Annotations.from_stack(over.stack).find_warning("*", Match.string_like_regexp("reserve"))
    assert warnings, "no warning about the reserved concurrency"


# -- custom catalog and settings ------------------------------------------------------------------------


def test_custom_catalog_is_bundled_and_named(edge_synth: Synth) -> None:
    layers = edge_synth.resources("AWS::Lambda::LayerVersion")
    assert len(layers) == 3
    for name in FUNCTION_NAMES:
        variables = env(edge_synth, name)
        assert variables["MODELS_FILE"] == "/opt/batchinfer-catalog/edge-models.yaml"
        assert variables["TINY_URL"] == "https://tiny.example"
        assert variables["FILE_BATCHES_ENABLED"] == "true"
        assert variables["BATCH_WEBHOOKS_ENABLED"] == "true"  # -c batch_webhooks_enabled=true reaches all
        assert len(function_resource(edge_synth, name)[1]["Properties"]["Layers"]) == 3
    catalog_id = edge_synth.logical_id(edge_synth.stack.functions.node.find_child("CatalogLayer"))
    key = layers[catalog_id]["Properties"]["Content"]["S3Key"].removesuffix(".zip")
    assert (edge_synth.outdir / f"asset.{key}" / "batchinfer-catalog" / "edge-models.yaml").is_file()
    # retain_data=false: nothing is kept behind after a stack delete.
    edge_synth.template.has_resource("AWS::DynamoDB::Table", {"DeletionPolicy": "Delete"})
    edge_synth.template.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ops@example.com"}
    )


# -- monitoring ------------------------------------------------------------------------------------------


def test_alarms_and_dashboard(synth: Synth) -> None:
    alarms = {
        a["Properties"]["AlarmName"]: a["Properties"]
        for a in synth.resources("AWS::CloudWatch::Alarm").values()
    }
    topic = synth.logical_id(synth.stack.monitoring.topic)
    for model in CATALOG.models:
        age = alarms[f"dev-batchinfer-{model.slug}-queue-age"]
        assert age["MetricName"] == "ApproximateAgeOfOldestMessage" and age["Threshold"] == 900
        dlq = alarms[f"dev-batchinfer-{model.slug}-dlq-depth"]
        assert dlq["MetricName"] == "ApproximateNumberOfMessagesVisible" and dlq["Threshold"] == 0
        rate = alarms[f"dev-batchinfer-{model.slug}-backend-error-rate"]
        emf = [m["MetricStat"]["Metric"] for m in rate["Metrics"] if "MetricStat" in m]
        assert {m["MetricName"] for m in emf} == {"BackendErrors", "RequestsCompleted"}
        for metric in emf:
            assert metric["Namespace"] == "batchinfer/dev"
            assert {"Name": "model", "Value": model.model_id} in metric["Dimensions"]
            assert {"Name": "service", "Value": "batchinfer-worker"} in metric["Dimensions"]
    for name in FUNCTION_NAMES:
        assert alarms[f"dev-batchinfer-{name}-errors"]["MetricName"] == "Errors"
        assert alarms[f"dev-batchinfer-{name}-throttles"]["MetricName"] == "Throttles"
    assert alarms["dev-batchinfer-api-5xx-rate"]["MetricName"] == "5xx"
    assert alarms["dev-batchinfer-api-latency-p99"]["ExtendedStatistic"] == "p99"
    assert alarms["dev-batchinfer-dispatcher-not-running"]["TreatMissingData"] == "breaching"
    webhook_dlq = alarms["dev-batchinfer-webhooks-dlq-depth"]
    assert webhook_dlq["MetricName"] == "ApproximateNumberOfMessagesVisible" and webhook_dlq["Threshold"] == 0
    assert webhook_dlq["ComparisonOperator"] == "GreaterThanThreshold"
    assert webhook_dlq["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": [synth.logical_id(synth.stack.webhooks.dlq), "QueueName"]}}
    ]
    failed = alarms["dev-batchinfer-webhooks-deliveries-failed"]
    assert (failed["Namespace"], failed["MetricName"]) == ("batchinfer/dev", "WebhookDeliveriesFailed")
    assert (failed["Statistic"], failed["Threshold"], failed["ComparisonOperator"]) == (
        "Sum",
        0,
        "GreaterThanThreshold",
    )
    # The one dimension Powertools adds: the webhooks function's service name.
    assert failed["Dimensions"] == [{"Name": "service", "Value": env(synth, "webhooks")["POWERTOOLS_SERVICE_NAME"]}]
    assert failed["TreatMissingData"] == "notBreaching"
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == [{"Ref": topic}]
    synth.template.has_resource_properties("AWS::CloudWatch::Dashboard", {"DashboardName": "dev-batchinfer"})
    body = json.dumps(
        next(iter(synth.resources("AWS::CloudWatch::Dashboard").values()))["Properties"]["DashboardBody"]
    )
    for needle in (
        "RequestsCompleted",
        "BackendErrors",
        "WebhookAttemptsFailed",
        "WebhookDeliveriesFailed",
        "ApproximateNumberOfMessagesDelayed",
        "ApproximateAgeOfOldestMessage",
        "Throttles",
        "5xx",
        "Latency",
    ):
        assert needle in body
