"""Assertions on the synthesized CloudFormation template, cdk-nag and cfn-lint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from aws_cdk.assertions import Annotations, Match
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import ManualArgs, lint_file

from batchinfer.catalog import webhook_queue_name
from infra.config import load_catalog
from infra.functions import SPECS
from infra.nag import recording_acknowledgments
from infra.stack import build_app
from tests.infra.conftest import Synth, synthesize

REPO = Path(__file__).resolve().parents[2]
CATALOG = load_catalog(REPO / "layers/core/python/batchinfer/models.yaml", stage="dev")
FUNCTION_NAMES = [spec.name for spec in SPECS]


# -- helpers ----------------------------------------------------------------------------------------------


def function_resource(synth: Synth, name: str) -> tuple[str, dict[str, Any]]:
    for logical_id, resource in synth.resources("AWS::Lambda::Function").items():
        if resource["Properties"]["FunctionName"] == f"{synth.stack.config.stage}-batchinfer-{name}":
            return logical_id, resource
    raise AssertionError(f"no function {name}")


def role_statements(synth: Synth, name: str) -> list[dict[str, Any]]:
    """Every Allow statement of the policies attached to function `name`'s role."""
    _, function = function_resource(synth, name)
    role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
    statements: list[dict[str, Any]] = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    assert synth.resources("AWS::IAM::Role")[role_id]["Properties"].get("ManagedPolicyArns") is None
    return statements


def actions_of(statements: list[dict[str, Any]]) -> set[str]:
    found: set[str] = set()
    for statement in statements:
        action = statement["Action"]
        found.update([action] if isinstance(action, str) else action)
    return found


def resources_for(statements: list[dict[str, Any]], action: str) -> list[Any]:
    found: list[Any] = []
    for statement in statements:
        actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        if action in actions:
            resource = statement["Resource"]
            found.extend(resource if isinstance(resource, list) else [resource])
    return found


def refs(value: Any) -> set[str]:
    """Logical ids referenced anywhere in a template fragment (Ref / Fn::GetAtt)."""
    found: set[str] = set()
    if isinstance(value, dict):
        if "Ref" in value:
            found.add(value["Ref"])
        if "Fn::GetAtt" in value:
            found.add(value["Fn::GetAtt"][0])
        for item in value.values():
            found |= refs(item)
    elif isinstance(value, list):
        for item in value:
            found |= refs(item)
    return found


def env(synth: Synth, name: str) -> dict[str, Any]:
    return function_resource(synth, name)[1]["Properties"]["Environment"]["Variables"]


# -- per-model queues ----------------------------------------------------------------------------------


def test_one_queue_dlq_and_event_source_per_catalog_model(synth: Synth) -> None:
    # An independent read of the catalog: every entry without `auto` has a backend and gets a queue.
    entries = yaml.safe_load(CATALOG.path.read_text())["models"]
    assert [m.model_id for m in CATALOG.models] == [e["id"] for e in entries if not e.get("auto")]
    queues = synth.resources("AWS::SQS::Queue")
    assert len(queues) == 2 * len(CATALOG.models) + 2  # + the webhook delivery queue and its DLQ
    synth.template.resource_count_is("AWS::Lambda::EventSourceMapping", len(CATALOG.models) + 1)
    worker_id, _ = function_resource(synth, "worker")
    for model in CATALOG.models:
        queue_id, dlq_id = (
            synth.logical_id(synth.stack.queues.by_model[model.model_id].queue),
            synth.logical_id(synth.stack.queues.by_model[model.model_id].dlq),
        )
        queue, dlq = queues[queue_id]["Properties"], queues[dlq_id]["Properties"]
        assert queue["QueueName"] == f"dev-batchinfer-{model.slug}"
        assert dlq["QueueName"] == f"dev-batchinfer-{model.slug}-dlq"
        assert queue["RedrivePolicy"] == {
            "deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]},
            "maxReceiveCount": 5,
        }
        assert queue["SqsManagedSseEnabled"] is True and dlq["SqsManagedSseEnabled"] is True
        assert queue["VisibilityTimeout"] >= 6 * 180
        synth.template.has_resource_properties(
            "AWS::Lambda::EventSourceMapping",
            {
                "EventSourceArn": {"Fn::GetAtt": [queue_id, "Arn"]},
                "FunctionName": {"Ref": worker_id},
                "BatchSize": 10,
                "FunctionResponseTypes": ["ReportBatchItemFailures"],
                "ScalingConfig": {"MaximumConcurrency": max(2, min(1000, model.batch_budget))},
            },
        )
    # Every queue refuses plain HTTP.
    for policy in synth.resources("AWS::SQS::QueuePolicy").values():
        statement = policy["Properties"]["PolicyDocument"]["Statement"][0]
        assert statement["Effect"] == "Deny" and statement["Condition"] == {
            "Bool": {"aws:SecureTransport": "false"}
        }


def joined_json(value: Any) -> dict[str, Any]:
    """Decode a JSON env value that CloudFormation assembles with Fn::Join (tokens become "X")."""
    if isinstance(value, str):
        return json.loads(value)
    return json.loads("".join(p if isinstance(p, str) else "X" for p in value["Fn::Join"][1]))


def test_queue_env_and_secrets_follow_catalog(synth: Synth) -> None:
    ids = {m.model_id for m in CATALOG.models}
    assert set(joined_json(env(synth, "dispatcher")["MODEL_QUEUES"])) == ids
    assert set(joined_json(env(synth, "sweeper")["MODEL_QUEUES"])) == ids
    with_keys = {m.model_id for m in CATALOG.models if m.needs_secret}
    assert set(joined_json(env(synth, "worker")["MODEL_SECRETS"])) == with_keys
    assert env(synth, "api")["MODEL_SECRETS"] == env(synth, "worker")["MODEL_SECRETS"]  # interactive requests
    names = {s["Properties"]["Name"] for s in synth.resources("AWS::SecretsManager::Secret").values()}
    assert names == {f"dev/batchinfer/models/{model_id}" for model_id in with_keys}
    # Each starts as the placeholder the worker recognises and never sends (a model's requests fail as
    # unavailable until the operator puts its key).
    from batchinfer.catalog import SECRET_PLACEHOLDER

    assert with_keys and all(s["Properties"]["SecretString"] == SECRET_PLACEHOLDER
                             for s in synth.resources("AWS::SecretsManager::Secret").values())


def test_edge_catalog_caps_concurrency_and_skips_auto(edge_synth: Synth) -> None:
    ts = edge_synth.template
    ts.resource_count_is("AWS::Lambda::EventSourceMapping", 3 + 1)  # + the webhooks function's
    for concurrency in (1000, 2, 7):
        ts.has_resource_properties(
            "AWS::Lambda::EventSourceMapping", {"ScalingConfig": {"MaximumConcurrency": concurrency}}
        )
    ts.has_resource_properties("AWS::SQS::Queue", {"QueueName": "qa-batchinfer-big-model-v1"})
    names = [q["Properties"]["QueueName"] for q in edge_synth.resources("AWS::SQS::Queue").values()]
    assert not any("router" in n for n in names)
    # Only models naming a key get a secret: Big.Model/v1 (api_key_secret) and mid (api_key_env).
    secrets = sorted(
        s["Properties"]["Name"] for s in edge_synth.resources("AWS::SecretsManager::Secret").values()
    )
    assert secrets == ["qa/batchinfer/models/Big.Model/v1", "qa/batchinfer/models/mid"]


# -- webhook delivery ------------------------------------------------------------------------------------


def test_webhook_key_queue_and_dlq(synth: Synth, edge_synth: Synth) -> None:
    delivery = synth.stack.webhooks
    key_id = synth.logical_id(delivery.key)
    queue_id, dlq_id = synth.logical_id(delivery.queue), synth.logical_id(delivery.dlq)
    (key,) = synth.resources("AWS::KMS::Key").values()
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == "Retain"  # retain_data: the sealed secrets' key stays with the table
    (alias,) = synth.resources("AWS::KMS::Alias").values()
    assert alias["Properties"] == {
        "AliasName": "alias/dev-batchinfer-webhooks",
        "TargetKeyId": {"Fn::GetAtt": [key_id, "Arn"]},
    }
    queues = synth.resources("AWS::SQS::Queue")
    queue, dlq = queues[queue_id]["Properties"], queues[dlq_id]["Properties"]
    assert queue["QueueName"] == webhook_queue_name("dev") == "dev-batchinfer--webhooks"
    assert dlq["QueueName"] == "dev-batchinfer--webhooks-dlq"
    assert queue["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]}, "maxReceiveCount": 5}
    assert queue["SqsManagedSseEnabled"] is True and dlq["SqsManagedSseEnabled"] is True
    assert queue["VisibilityTimeout"] >= 6 * function_resource(synth, "webhooks")[1]["Properties"]["Timeout"]
    assert "DelaySeconds" not in queue  # retries set their own delay per message
    for logical_id in (queue_id, dlq_id):
        synth.template.has_resource_properties(
            "AWS::SQS::QueuePolicy",
            {
                "Queues": [{"Ref": logical_id}],
                "PolicyDocument": {
                    "Statement": Match.array_with(
                        [
                            Match.object_like(
                                {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
                            )
                        ]
                    )
                },
            },
        )
    # retain_data=false: the key (and the queues) go with the stack; the names follow the stage.
    edge_synth.template.has_resource("AWS::KMS::Key", {"DeletionPolicy": "Delete"})
    edge_synth.template.has_resource_properties("AWS::KMS::Alias", {"AliasName": "alias/qa-batchinfer-webhooks"})
    edge_synth.template.has_resource(
        "AWS::SQS::Queue", {"DeletionPolicy": "Delete", "Properties": {"QueueName": "qa-batchinfer--webhooks"}}
    )


def test_webhooks_function_consumes_the_delivery_queue(synth: Synth) -> None:
    webhooks_id, function = function_resource(synth, "webhooks")
    props = function["Properties"]
    assert props["Timeout"] == 30 and props["MemorySize"] == 256
    assert props["Description"]
    assert "ReservedConcurrentExecutions" not in props
    queue_id = synth.logical_id(synth.stack.webhooks.queue)
    mappings = [
        {k: v for k, v in m["Properties"].items() if k != "Tags"}
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": webhooks_id}
    ]
    assert mappings == [
        {
            "EventSourceArn": {"Fn::GetAtt": [queue_id, "Arn"]},
            "FunctionName": {"Ref": webhooks_id},
            "BatchSize": 10,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
            "ScalingConfig": {"MaximumConcurrency": 10},
        }
    ]
    # The worker's mappings are all on model queues, the webhooks function's only on the delivery queue.
    worker_id, _ = function_resource(synth, "worker")
    model_queues = {synth.logical_id(q) for q in synth.stack.queues.queues}
    for mapping in synth.resources("AWS::Lambda::EventSourceMapping").values():
        if mapping["Properties"]["FunctionName"] == {"Ref": worker_id}:
            assert mapping["Properties"]["EventSourceArn"]["Fn::GetAtt"][0] in model_queues


def test_webhook_wiring_env(synth: Synth) -> None:
    queue_url = {"Ref": synth.logical_id(synth.stack.webhooks.queue)}
    key_arn = {"Fn::GetAtt": [synth.logical_id(synth.stack.webhooks.key), "Arn"]}
    for name in ("api", "worker", "sweeper", "webhooks"):
        variables = env(synth, name)
        assert variables["WEBHOOK_QUEUE_URL"] == queue_url, name
        assert variables["WEBHOOK_KEY_ID"] == key_arn, name  # the ARN its KMS grant names
    assert not {"WEBHOOK_QUEUE_URL", "WEBHOOK_KEY_ID"} & set(env(synth, "dispatcher"))
    # Off in a deployment unless the operator turns it on; every function reads the same switch.
    for name in FUNCTION_NAMES:
        assert env(synth, name)["BATCH_WEBHOOKS_ENABLED"] == "false", name


# -- schedules -----------------------------------------------------------------------------------------


def test_dispatcher_and_sweeper_run_every_minute(synth: Synth) -> None:
    schedules = synth.resources("AWS::Scheduler::Schedule")
    assert len(schedules) == 2
    targets = set()
    for schedule in schedules.values():
        props = schedule["Properties"]
        assert props["ScheduleExpression"] == "rate(1 minute)"
        assert props["State"] == "ENABLED"
        assert props["Target"]["RetryPolicy"] == {"MaximumEventAgeInSeconds": 60, "MaximumRetryAttempts": 0}
        targets.add(props["Target"]["Arn"]["Fn::GetAtt"][0])
    assert targets == {function_resource(synth, "dispatcher")[0], function_resource(synth, "sweeper")[0]}


# -- storage -------------------------------------------------------------------------------------------


def test_table_keys_indexes_ttl_and_pitr(synth: Synth) -> None:
    synth.template.resource_count_is("AWS::DynamoDB::Table", 1)
    synth.template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "DeletionPolicy": "Retain",
            "Properties": {
                "BillingMode": "PAY_PER_REQUEST",
                "KeySchema": [
                    {"AttributeName": "pk", "KeyType": "HASH"},
                    {"AttributeName": "sk", "KeyType": "RANGE"},
                ],
                "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                "TimeToLiveSpecification": {"AttributeName": "ttl", "Enabled": True},
                "DeletionProtectionEnabled": True,
                "StreamSpecification": Match.absent(),
            },
        },
    )
    table = next(iter(synth.resources("AWS::DynamoDB::Table").values()))["Properties"]
    attributes = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
    assert attributes == {
        "pk": "S",
        "sk": "S",
        "owner_pk": "S",
        "owner_sk": "S",
        "due_pk": "S",
        "due_at": "N",
        "active_pk": "S",
        "active_sk": "S",
    }
    indexes = {i["IndexName"]: i for i in table["GlobalSecondaryIndexes"]}
    expected = {
        "by_owner": ("owner_pk", "owner_sk"),
        "by_due": ("due_pk", "due_at"),
        "by_active": ("active_pk", "active_sk"),
    }
    assert set(indexes) == set(expected)
    for name, (pk, sk) in expected.items():
        assert indexes[name]["KeySchema"] == [
            {"AttributeName": pk, "KeyType": "HASH"},
            {"AttributeName": sk, "KeyType": "RANGE"},
        ]
    # by_owner feeds the lists (whole items); the by_due readers use only keys and re-read the item; the
    # sweeper takes only the id from by_active. Fewer projected attributes: smaller, fewer index writes.
    assert indexes["by_owner"]["Projection"] == {"ProjectionType": "ALL"}
    assert indexes["by_due"]["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert indexes["by_active"]["Projection"] == {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["id"]}


def test_data_bucket_encryption_public_access_tls_and_lifecycle(synth: Synth) -> None:
    bucket_id = synth.logical_id(synth.stack.storage.bucket)
    bucket = synth.resources("AWS::S3::Bucket")[bucket_id]["Properties"]
    assert bucket["BucketEncryption"] == {
        "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
    }
    assert bucket["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert "LoggingConfiguration" in bucket
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    assert rules["abort-multipart"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    # window 1 d + retention 7 d + 1 d safety margin; files 30 d + retention 7 d.
    assert rules["expire-batches"] == {
        "Id": "expire-batches",
        "Prefix": "batches/",
        "ExpirationInDays": 9,
        "Status": "Enabled",
    }
    assert rules["expire-files"] == {
        "Id": "expire-files",
        "Prefix": "files/",
        "ExpirationInDays": 37,
        "Status": "Enabled",
    }
    synth.template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "Bucket": {"Ref": bucket_id},
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
                        )
                    ]
                )
            },
        },
    )


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


# -- IAM -----------------------------------------------------------------------------------------------


def test_iam_is_scoped_to_table_bucket_queues_and_secrets(synth: Synth) -> None:
    stack = synth.stack
    table = synth.logical_id(stack.storage.table)
    bucket = synth.logical_id(stack.storage.bucket)
    queues = {synth.logical_id(q) for q in stack.queues.queues}
    webhook_queue = synth.logical_id(stack.webhooks.queue)
    key = synth.logical_id(stack.webhooks.key)
    dlqs = {synth.logical_id(e.dlq) for e in stack.queues.by_model.values()} | {
        synth.logical_id(stack.webhooks.dlq)
    }
    secrets = {synth.logical_id(s) for s in stack.secrets.secrets}
    statements = {name: role_statements(synth, name) for name in FUNCTION_NAMES}
    assert set(statements) == {"api", "dispatcher", "worker", "sweeper", "webhooks"}

    for name, granted in statements.items():
        for statement in granted:
            assert statement["Effect"] == "Allow"
            if statement["Resource"] == "*":  # only X-Ray, which has no resource-level permissions (and the
                # listing of Bedrock's batch jobs, for the sweeper that makes them: infra/bedrock_batch.py)
                unscoped = {"xray:PutTraceSegments", "xray:PutTelemetryRecords"} | (
                    {"bedrock:ListModelInvocationJobs"} if name == "sweeper" else set())
                assert actions_of([statement]) <= unscoped, name
        if name != "webhooks":
            assert refs(resources_for(granted, "dynamodb:PutItem")) == {table}, name
            assert refs(resources_for(granted, "s3:GetObject")) == {bucket}, name
            assert refs(resources_for(granted, "s3:ListBucket")) == {bucket}, name
        assert not refs(granted) & dlqs, f"{name} must not touch the DLQs"

    api, dispatcher, worker, sweeper, webhooks = (statements[n] for n in FUNCTION_NAMES)
    assert refs(resources_for(api, "sqs:SendMessage")) == {webhook_queue}
    assert refs(resources_for(api, "secretsmanager:GetSecretValue")) == secrets  # interactive requests
    assert refs(resources_for(dispatcher, "sqs:SendMessage")) == queues
    assert "s3:PutObject" not in actions_of(dispatcher)
    assert not any(a.startswith("secretsmanager:") for a in actions_of(dispatcher))
    assert refs(resources_for(worker, "sqs:ReceiveMessage")) == queues
    assert refs(resources_for(worker, "sqs:SendMessage")) == {webhook_queue}  # announces endings only
    assert "s3:DeleteObject" not in actions_of(worker)
    assert refs(resources_for(worker, "secretsmanager:GetSecretValue")) == secrets
    assert refs(resources_for(sweeper, "sqs:SendMessage")) == queues | {webhook_queue}
    assert refs(resources_for(sweeper, "s3:DeleteObject")) == {bucket}
    assert not any(a.startswith("secretsmanager:") for a in actions_of(sweeper))
    # webhooks: the table, its queue (consume, send retries back) and opening secrets; no objects, no keys.
    assert refs(resources_for(webhooks, "sqs:ReceiveMessage")) == {webhook_queue}
    assert refs(resources_for(webhooks, "sqs:DeleteMessage")) == {webhook_queue}
    assert refs(resources_for(webhooks, "sqs:SendMessage")) == {webhook_queue}
    assert not any(a.startswith(("s3:", "secretsmanager:")) for a in actions_of(webhooks))
    own_logs = function_resource(synth, "webhooks")[1]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
    assert refs(webhooks) == {table, webhook_queue, key, own_logs}

    # KMS: exactly kms:Encrypt on the key for the api, exactly kms:Decrypt for the webhooks function.
    kms = {name: {a for a in actions_of(granted) if a.startswith("kms:")} for name, granted in statements.items()}
    assert kms == {"api": {"kms:Encrypt"}, "dispatcher": set(), "worker": set(), "sweeper": set(),
                   "webhooks": {"kms:Decrypt"}}
    assert refs(resources_for(api, "kms:Encrypt")) == {key}
    assert refs(resources_for(webhooks, "kms:Decrypt")) == {key}
    # Only the dispatcher never sends to the delivery queue; nobody but the webhooks function consumes it.
    for name, granted in statements.items():
        assert (webhook_queue in refs(resources_for(granted, "sqs:SendMessage"))) == (name != "dispatcher"), name
        assert (webhook_queue in refs(resources_for(granted, "sqs:ReceiveMessage"))) == (name == "webhooks"), name


def table_resource(resource: Any, table: str) -> str:
    """'table' for the table's ARN, 'index/<name>' for one of its GSIs; anything else fails."""
    if resource == {"Fn::GetAtt": [table, "Arn"]}:
        return "table"
    parts = resource["Fn::Join"][1]
    assert parts[0] == {"Fn::GetAtt": [table, "Arn"]} and len(parts) == 2, resource
    assert parts[1].startswith("/index/") and "*" not in parts[1], resource
    return parts[1].removeprefix("/")


def dynamodb_grants(statements: list[dict[str, Any]], table: str) -> dict[str, set[str]]:
    """{dynamodb action: {'table', 'index/<name>', ...}} of one role's statements."""
    found: dict[str, set[str]] = {}
    for statement in statements:
        actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        for action in actions:
            if action.startswith("dynamodb:"):
                found.setdefault(action, set()).update(table_resource(r, table) for r in resources)
    return found


# What each function's code calls (batchinfer.storage.dynamo.Table methods; transactions are authorized per
# item as Put/Update/Delete/ConditionCheck): read from the code, written out here independently of infra.
_ITEMS = {"GetItem", "PutItem", "UpdateItem", "DeleteItem", "ConditionCheckItem", "Query"}
EXPECTED_TABLE_ACTIONS = {
    "api": _ITEMS | {"BatchWriteItem"},  # delete purges (delete_many)
    "dispatcher": _ITEMS,
    "worker": _ITEMS | {"BatchGetItem"},  # key, account and usage in one round trip
    "sweeper": _ITEMS | {"BatchGetItem", "BatchWriteItem"},  # lease recovery reads, retention purges
    "webhooks": {"GetItem", "UpdateItem"},  # the event and the webhook; attempts recorded
}
EXPECTED_INDEXES = {
    "api": {"by_owner"},  # lists of batches and files, upload quota
    "dispatcher": {"by_due"},  # retries due
    "worker": {"by_due"},  # the dispatcher's claims, pulled by the worker itself
    "sweeper": {"by_due", "by_active"},  # leases, purges, webhook relays; unfinished batches
    "webhooks": set(),
}
FORBIDDEN_DYNAMODB = {
    "dynamodb:Scan",
    "dynamodb:DescribeStream",
    "dynamodb:GetRecords",
    "dynamodb:GetShardIterator",
    "dynamodb:ListStreams",
    "dynamodb:DescribeTable",
    "dynamodb:*",
}


def test_table_access_is_exactly_what_each_function_calls(synth: Synth) -> None:
    table = synth.logical_id(synth.stack.storage.table)
    for name in FUNCTION_NAMES:
        grants = dynamodb_grants(role_statements(synth, name), table)
        on_table = {a.removeprefix("dynamodb:") for a, where in grants.items() if "table" in where}
        assert on_table == EXPECTED_TABLE_ACTIONS[name], name
        indexes = {w.removeprefix("index/") for where in grants.values() for w in where if w != "table"}
        assert indexes == EXPECTED_INDEXES[name], name
        # Only Query reaches an index.
        assert all(where == {"table"} for a, where in grants.items() if a != "dynamodb:Query"), name


def test_no_role_may_scan_or_read_streams(synth: Synth, edge_synth: Synth) -> None:
    for built in (synth, edge_synth):
        for policy in built.resources("AWS::IAM::Policy").values():
            actions = actions_of(policy["Properties"]["PolicyDocument"]["Statement"])
            assert not actions & FORBIDDEN_DYNAMODB, policy
            assert not any(a.startswith("dynamodb:") and "Stream" in a for a in actions), policy
            # Exact S3 object actions, no grant groups (no object lock, tagging or ACL actions).
            assert not {a for a in actions if a.startswith("s3:")} - {
                "s3:GetObject",
                "s3:PutObject",
                "s3:AbortMultipartUpload",
                "s3:DeleteObject",
                "s3:ListBucket",
            }, policy


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


# -- checks: cdk-nag, annotations, cfn-lint -----------------------------------------------------------------


@pytest.mark.parametrize("which", ["synth", "edge_synth"])
def test_cdk_nag_has_no_unacknowledged_findings(which: str, request: pytest.FixtureRequest) -> None:
    built: Synth = request.getfixturevalue(which)
    report = AwsSolutionsChecks().validate_scope(built.stack)
    findings = [
        f"{v.rule_name} ({v.severity}) {[r.construct_path for r in v.violating_resources]}: {v.description}"
        for v in report.violations
    ]
    assert findings == []
    # Nothing else from CDK either (deprecations, misconfigurations); our own warnings are named.
    annotations = Annotations.from_stack(built.stack)
    assert annotations.find_error("*", Match.any_value()) == []
    unexpected = [
        w
        for w in annotations.find_warning("*", Match.any_value())
        if not str(w.entry.data).startswith(
            ("The deps layer is an empty placeholder", "model ", "no alarm subscription")
        )
    ]
    assert unexpected == []


def test_every_acknowledgment_matches_a_real_finding(tmp_path: Path) -> None:
    """Build without applying acknowledgments: each one must cover a finding that then appears."""
    with recording_acknowledgments() as recorded:
        _, stack = build_app({"skip_deps_build": True}, outdir=str(tmp_path), nag=False)
    violations = AwsSolutionsChecks().validate_scope(stack).violations
    found = {(r.construct_path, v.rule_name) for v in violations for r in v.violating_resources}
    stale = [
        (path, rule)
        for path, rule in recorded
        if not any(rule == rule_name and (p == path or p.startswith(path + "/")) for p, rule_name in found)
    ]
    assert recorded and stale == []


def test_cfn_lint_finds_no_problems(synth: Synth, edge_synth: Synth, tmp_path: Path) -> None:
    problems = []
    for name, built in (("default", synth), ("edge", edge_synth)):
        path = tmp_path / f"{name}.template.json"
        path.write_text(json.dumps(built.template_json, indent=1))
        # W3005: CDK adds DependsOn on a role that a GetAtt already implies; harmless and not ours to change.
        config = ManualArgs(ignore_checks=["W3005"], regions=["us-east-1", "eu-west-1"])
        problems += [
            f"{name}: {m.rule.id} {m.message} (line {m.linenumber})" for m in lint_file(path, config)
        ]
    errors = [p for p in problems if p.split(": ", 1)[1].startswith("E")]
    assert errors == []
    assert problems == []  # warnings too: keep the template clean rather than let them pile up
