"""Assertions on the synthesized CloudFormation template: a queue and dead-letter queue per catalog model, the
webhook deliveries' key, queue and function, the schedules, the table and the data bucket."""

from __future__ import annotations

from pathlib import Path

import yaml
from aws_cdk.assertions import Match

from batchinfer.catalog import webhook_queue_name
from infra.config import load_catalog
from tests.infra.conftest import FUNCTION_NAMES, Synth, env, function_resource, joined_json

REPO = Path(__file__).resolve().parents[2]
CATALOG = load_catalog(REPO / "layers/core/python/batchinfer/models.yaml", stage="dev")


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
