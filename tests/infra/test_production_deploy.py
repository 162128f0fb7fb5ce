"""A production-ready deployment, infrastructure parts: a deploy that fails loudly, functions on arm64, the cost
guard, the data bucket's versions and the optional custom domain. Assertions on the synthesized template (see
conftest for the two deployments)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Annotations, Match

from infra.config import LAMBDA_EVENT_BODY_LIMIT_BYTES, LAMBDA_PAYLOAD_LIMIT_BYTES, InfraConfig
from infra.stack import DeploymentConfigError, build_app
from tests.infra.conftest import (
    EDGE_CERTIFICATE_ARN,
    EDGE_DOMAIN,
    EDGE_TOPIC_ARN,
    FUNCTION_NAMES,
    INDEXES,
    Synth,
    env,
    function_resource,
)


def write_catalog(tmp_path: Path, base_url: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(
        json.dumps({"models": [{"id": "m", "batch_budget": 2, "backend": {"kind": "openai", "base_url": base_url}}]})
    )
    return path


# -- a deploy that fails loudly -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base_url",
    [
        "http://127.0.0.1:8001/v1",
        "http://localhost:8001/v1",
        "http://[::1]:8001",
        "https://10.1.2.3/v1",
        "https://192.168.0.10",
        "http://169.254.169.254",
        "http://simulator.localhost:9000",
    ],
)
def test_non_dev_stage_refuses_a_loopback_or_private_backend(tmp_path: Path, base_url: str) -> None:
    catalog = write_catalog(tmp_path, base_url)
    with pytest.raises(DeploymentConfigError) as raised:
        build_app(
            {"skip_deps_build": True, "stage": "prod", "models_file": str(catalog), "alarm_email": "ops@example.com"},
            outdir=str(tmp_path / "out"),
            nag=False,
        )
    message = str(raised.value)
    assert "stage 'prod' cannot be deployed" in message
    assert f"model m: backend {base_url} is unreachable from Lambda" in message
    assert "outside any VPC" in message and "catalog_env" in message


def test_the_default_catalog_s_loopback_simulator_fails_a_prod_synth(tmp_path: Path) -> None:
    # What `make synth -c stage=prod` does from a fresh clone: the shipped catalog points at 127.0.0.1.
    with pytest.raises(DeploymentConfigError, match=r"is unreachable from Lambda \(127\.0\.0\.1 is a loopback"):
        build_app(
            {"skip_deps_build": True, "stage": "prod", "alarm_email": "ops@example.com"},
            outdir=str(tmp_path),
            nag=False,
        )


def test_non_dev_stage_requires_an_alarm_subscription(tmp_path: Path) -> None:
    catalog = write_catalog(tmp_path, "https://backend.example/v1")
    with pytest.raises(DeploymentConfigError, match="no alarm subscription.*alarm_email.*alarm_topic_arn"):
        build_app(
            {"skip_deps_build": True, "stage": "prod", "models_file": str(catalog)},
            outdir=str(tmp_path / "a"),
            nag=False,
        )
    # Either subscription will do (and a public backend passes).
    for subscription in ({"alarm_email": "ops@example.com"}, {"alarm_topic_arn": EDGE_TOPIC_ARN}):
        build_app(
            {"skip_deps_build": True, "stage": "prod", "models_file": str(catalog), **subscription},
            outdir=str(tmp_path / "b"),
            nag=False,
        )


def test_dev_only_warns(synth: Synth) -> None:
    # The default deployment: dev, the shipped catalog (loopback simulator), no alarm subscription.
    warnings = [str(w.entry.data) for w in Annotations.from_stack(synth.stack).find_warning("*", Match.any_value())]
    assert any(w.startswith("model ") and "is unreachable from Lambda (127.0.0.1 is a loopback" in w for w in warnings)
    assert any(w.startswith("no alarm subscription") for w in warnings)


def test_public_hosts_are_not_mistaken_for_local_ones() -> None:
    from infra.config import unreachable_host_reason

    for host in ("api.openai.com", "a.example", "8.8.8.8", "2606:4700:4700::1111", "localhost.example.com", None):
        assert unreachable_host_reason(host) is None, host
    for host in ("0.0.0.0", "100.64.0.1", "fd00::1", "LOCALHOST", "printer.local", "host.docker.internal"):
        assert unreachable_host_reason(host), host


def test_create_body_limit_fits_a_lambda_event_after_api_gateway_encoding(synth: Synth) -> None:
    # A binary body arrives base64-encoded (4/3) in the event, next to headers and context: 4 MiB is what fits
    # Lambda's 6 MB request payload.
    assert LAMBDA_EVENT_BODY_LIMIT_BYTES * 4 / 3 < LAMBDA_PAYLOAD_LIMIT_BYTES * 0.9
    assert InfraConfig().max_body_bytes <= LAMBDA_EVENT_BODY_LIMIT_BYTES
    assert int(env(synth, "api")["MAX_BODY_BYTES"]) <= LAMBDA_EVENT_BODY_LIMIT_BYTES
    with pytest.raises(ValueError):
        InfraConfig(max_body_bytes=LAMBDA_EVENT_BODY_LIMIT_BYTES + 1)


@pytest.mark.parametrize(
    "settings",
    [
        {"domain_name": "api.example.com"},  # no certificate
        {"certificate_arn": EDGE_CERTIFICATE_ARN},  # no domain
        {"domain_name": "https://api.example.com/", "certificate_arn": EDGE_CERTIFICATE_ARN},
        {"alarm_topic_arn": "team-pager"},
        {"certificate_arn": "arn:aws:iam::123456789012:server-certificate/x", "domain_name": "a.example.com"},
        {"monthly_budget_usd": 0},
        {"monthly_budget_scope": "region"},
    ],
)
def test_bad_production_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        InfraConfig(**settings)


def test_full_index_projections_keep_a_pre_existing_table_deployable(tmp_path: Path) -> None:
    # CloudFormation refuses to change an existing GSI's projection: such a stage keeps ALL on every index.
    _, stack = build_app({"skip_deps_build": True, "full_index_projections": "true"}, outdir=str(tmp_path), nag=False)
    table = stack.storage.table.node.default_child
    indexes = stack.resolve(table.global_secondary_indexes)
    assert {i["indexName"]: i["projection"] for i in indexes} == {name: {"projectionType": "ALL"} for name in INDEXES}


# -- architecture ----------------------------------------------------------------------------------------


def test_functions_and_layers_run_on_arm64(synth: Synth) -> None:
    for name in FUNCTION_NAMES:
        assert function_resource(synth, name)[1]["Properties"]["Architectures"] == ["arm64"], name
    for layer in synth.resources("AWS::Lambda::LayerVersion").values():
        assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]


# -- cost guard ----------------------------------------------------------------------------------------------


def test_monthly_budget_notifies_the_alarm_topic(synth: Synth, edge_synth: Synth) -> None:
    (budget,) = synth.resources("AWS::Budgets::Budget").values()
    props = budget["Properties"]
    assert props["Budget"] == {
        "BudgetName": "dev-batchinfer-monthly",
        "BudgetType": "COST",
        "TimeUnit": "MONTHLY",
        "BudgetLimit": {"Amount": 100, "Unit": "USD"},
        # Stage scope: the cost allocation tag every resource of the stack carries.
        "CostFilters": {"TagKeyValue": ["user:batchinfer-stage$dev"]},
    }
    topic = {"Ref": synth.logical_id(synth.stack.monitoring.topic)}
    kinds = set()
    for notification in props["NotificationsWithSubscribers"]:
        kinds.add((notification["Notification"]["NotificationType"], notification["Notification"]["Threshold"]))
        assert notification["Subscribers"] == [{"Address": topic, "SubscriptionType": "SNS"}]
    assert kinds == {("ACTUAL", 80), ("FORECASTED", 100)}
    # The stack's own topic lets AWS Budgets publish (from this account only).
    synth.template.has_resource_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Action": "sns:Publish",
                                "Effect": "Allow",
                                "Principal": {"Service": "budgets.amazonaws.com"},
                                "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}},
                            }
                        )
                    ]
                )
            }
        },
    )
    function_tags = function_resource(synth, "api")[1]["Properties"]["Tags"]
    assert {"Key": "batchinfer-stage", "Value": "dev"} in function_tags
    # Edge: an account-wide budget of 250 USD, to the imported topic and the email.
    (edge,) = edge_synth.resources("AWS::Budgets::Budget").values()
    assert edge["Properties"]["Budget"]["BudgetLimit"] == {"Amount": 250, "Unit": "USD"}
    assert "CostFilters" not in edge["Properties"]["Budget"]
    for notification in edge["Properties"]["NotificationsWithSubscribers"]:
        assert notification["Subscribers"] == [
            {"Address": EDGE_TOPIC_ARN, "SubscriptionType": "SNS"},
            {"Address": "ops@example.com", "SubscriptionType": "EMAIL"},
        ]


def test_budget_can_be_turned_off() -> None:
    assert InfraConfig(monthly_budget_usd="none").monthly_budget_usd is None


# -- data bucket ---------------------------------------------------------------------------------------------


def test_data_bucket_keeps_noncurrent_versions_one_day(synth: Synth) -> None:
    bucket = synth.resources("AWS::S3::Bucket")[synth.logical_id(synth.stack.storage.bucket)]["Properties"]
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-noncurrent-versions"] == {
        "Id": "expire-noncurrent-versions",
        "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
        "Status": "Enabled",
    }
    assert rules["remove-expired-delete-markers"] == {
        "Id": "remove-expired-delete-markers",
        "ExpiredObjectDeleteMarker": True,
        "Status": "Enabled",
    }
    assert rules["abort-multipart"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}


# -- custom domain -------------------------------------------------------------------------------------------


def test_custom_domain_maps_the_api_and_becomes_the_base_url(edge_synth: Synth) -> None:
    ((domain_id, domain),) = edge_synth.resources("AWS::ApiGatewayV2::DomainName").items()
    assert {k: v for k, v in domain["Properties"].items() if k != "Tags"} == {
        "DomainName": EDGE_DOMAIN,
        "DomainNameConfigurations": [
            {"CertificateArn": EDGE_CERTIFICATE_ARN, "EndpointType": "REGIONAL", "SecurityPolicy": "TLS_1_2"}
        ],
    }
    (mapping,) = edge_synth.resources("AWS::ApiGatewayV2::ApiMapping").values()
    assert mapping["Properties"]["DomainName"] == {"Ref": domain_id}
    assert mapping["Properties"]["ApiId"] == {"Ref": edge_synth.logical_id(edge_synth.stack.api.http_api)}
    assert mapping["Properties"]["Stage"] == "$default"
    assert "ApiMappingKey" not in mapping["Properties"]  # the domain's root is the API's root
    edge_synth.template.has_output("ApiUrl", {"Value": f"https://{EDGE_DOMAIN}"})
    edge_synth.template.has_output("DomainTarget", {"Value": {"Fn::GetAtt": [domain_id, "RegionalDomainName"]}})


def test_no_custom_domain_unless_configured(synth: Synth) -> None:
    synth.template.resource_count_is("AWS::ApiGatewayV2::DomainName", 0)
    synth.template.resource_count_is("AWS::ApiGatewayV2::ApiMapping", 0)
    outputs = synth.template_json["Outputs"]
    assert "DomainTarget" not in outputs
    assert outputs["ApiUrl"]["Value"] == {"Fn::GetAtt": [synth.logical_id(synth.stack.api.http_api), "ApiEndpoint"]}
