"""The CDK app and the core package derive queue names and the metrics namespace from one module.

The queue test builds only the queues construct (no full synthesis); the namespace test reads the session's
synthesized default stack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
from aws_cdk import App, Duration, Stack
from aws_cdk.assertions import Template
from moto import mock_aws

from batchinfer import catalog as core
from batchinfer.storage import bootstrap
from infra.config import InfraConfig, load_catalog
from infra.functions import SPECS
from infra.queues import ModelQueues
from infra.webhooks import WebhookDelivery
from tests.infra.conftest import Synth

STAGE = "production-eu-1"  # a long stage leaves the least room for the model's part of the name
_LONG = ("Acme/" + "Giant.Model-" * 8)[:89]
TRICKY_IDS = ["Org/Model.V2+x", _LONG + "A", _LONG + "B"]  # the last two: 90 characters, one prefix


def tricky_catalog(tmp_path: Path) -> Path:
    models = [{"id": m, "batch_budget": 2, "backend": {"base_url": "https://x.example/v1"}} for m in TRICKY_IDS]
    path = tmp_path / "models.yaml"
    path.write_text(json.dumps({"models": [*models, {"id": "router", "auto": True}]}))
    return path


def cdk_queue_names(path: Path) -> dict[str, str]:
    stack = Stack(App(), "Names")
    queues = ModelQueues(
        stack,
        "ModelQueues",
        config=InfraConfig(stage=STAGE),
        models=load_catalog(path, stage=STAGE).models,
        worker_timeout=Duration.seconds(180),
    )
    resources = Template.from_stack(stack).to_json()["Resources"]
    return {
        model_id: resources[stack.resolve(entry.queue.node.default_child.logical_id)]["Properties"]["QueueName"]
        for model_id, entry in queues.by_model.items()
    }


def local_queue_names(path: Path) -> dict[str, str]:
    runnable = [m.id for m in core.load_catalog(path, {}).runnable]
    with mock_aws():
        urls = bootstrap.create_queues(boto3.client("sqs", region_name="us-east-1"), STAGE, runnable)
    return {model_id: url.rsplit("/", 1)[1] for model_id, url in urls.items()}


def test_local_bootstrap_and_cdk_name_tricky_queues_identically(tmp_path: Path) -> None:
    path = tricky_catalog(tmp_path)
    cdk, local = cdk_queue_names(path), local_queue_names(path)
    assert cdk == local and set(cdk) == set(TRICKY_IDS)
    assert cdk["Org/Model.V2+x"] == f"{STAGE}-batchinfer-org-model-v2-x"
    assert len(set(cdk.values())) == 3 and all(len(f"{name}-dlq") <= 80 for name in cdk.values())


def test_local_bootstrap_and_cdk_name_the_webhook_queue_identically() -> None:
    stack = Stack(App(), "Webhooks")
    delivery = WebhookDelivery(
        stack, "WebhookDelivery", config=InfraConfig(stage=STAGE), function_timeout=Duration.seconds(30)
    )
    resources = Template.from_stack(stack).to_json()["Resources"]
    cdk = resources[stack.resolve(delivery.queue.node.default_child.logical_id)]["Properties"]["QueueName"]
    with mock_aws():
        local = bootstrap.create_webhook_queue(boto3.client("sqs", region_name="us-east-1"), STAGE).rsplit("/", 1)[1]
    assert cdk == local == f"{STAGE}-batchinfer--webhooks"
    dlq = resources[stack.resolve(delivery.dlq.node.default_child.logical_id)]["Properties"]["QueueName"]
    assert dlq == f"{cdk}-dlq" and len(dlq) <= 80


def test_an_empty_variable_takes_the_default_in_core_and_infra(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(json.dumps({"models": [{"id": "m", "batch_budget": 2, "backend": {"base_url": "${U:-https://d}"}}]}))
    env = {"U": ""}
    assert load_catalog(path, stage="dev", env=env).models[0].base_url == "https://d"
    assert core.load_catalog(path, env).get("m").backend.base_url == "https://d"


def _joined(value: Any) -> str:
    """A CloudFormation string, with Fn::Join's tokens as "X"."""
    if isinstance(value, str):
        return value
    return "".join(p if isinstance(p, str) else "X" for p in value["Fn::Join"][1])


def test_dashboard_alarms_and_functions_use_the_namespace_the_functions_emit(synth: Synth) -> None:
    # The stage's namespace: every function gets it as POWERTOOLS_METRICS_NAMESPACE (that observability
    # honours it: test_production_monitoring.test_observability_emits_in_the_namespace_the_stack_sets).
    emitted = synth.stack.config.metrics_namespace
    assert emitted == "batchinfer/dev"
    application: set[str] = set()
    for alarm in synth.resources("AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        found = [props.get("Namespace")] + [
            m["MetricStat"]["Metric"]["Namespace"] for m in props.get("Metrics", []) if "MetricStat" in m
        ]
        application.update(n for n in found if n and not n.startswith("AWS/"))
    (dashboard,) = synth.resources("AWS::CloudWatch::Dashboard").values()
    body = json.loads(_joined(dashboard["Properties"]["DashboardBody"]))
    on_dashboard = {
        metric[0]
        for widget in body["widgets"]
        for metric in widget.get("properties", {}).get("metrics", [])
        if metric and isinstance(metric[0], str) and not metric[0].startswith("AWS/")
    }
    assert application == {emitted} and on_dashboard == {emitted}
    for spec in SPECS:
        (function,) = [
            f
            for f in synth.resources("AWS::Lambda::Function").values()
            if f["Properties"]["FunctionName"] == f"dev-batchinfer-{spec.name}"
        ]
        assert function["Properties"]["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"] == emitted


def test_local_bootstrap_and_cdk_project_the_indexes_identically(synth: Synth) -> None:
    import boto3
    from moto import mock_aws

    from batchinfer.storage.bootstrap import create_table

    with mock_aws():
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        create_table(ddb, "t")
        local = {
            i["IndexName"]: i["Projection"]
            for i in ddb.describe_table(TableName="t")["Table"]["GlobalSecondaryIndexes"]
        }
    (table,) = synth.resources("AWS::DynamoDB::Table").values()
    deployed = {i["IndexName"]: i["Projection"] for i in table["Properties"]["GlobalSecondaryIndexes"]}
    assert local == deployed
