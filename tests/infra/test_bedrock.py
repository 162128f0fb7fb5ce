"""Bedrock models in a deployment: exactly their models and inference profiles in the calling functions'
roles, no secret, cdk-nag and cfn-lint clean, and a synth that fails loudly on a region or endpoint that
cannot work. A production stage (prod) with a catalog of a foundation model, a cross-Region inference
profile and an OpenAI-compatible model."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Annotations, Match
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import ManualArgs, lint_file

from infra import bedrock
from infra.config import load_catalog
from infra.nag import recording_acknowledgments
from infra.stack import DeploymentConfigError, build_app
from tests.infra.conftest import (
    EDGE_CATALOG,
    FUNCTION_NAMES,
    Synth,
    actions_of,
    env,
    function_resource,
    joined_json,
    role_statements,
    synthesize,
)

HAIKU = "anthropic.claude-3-5-haiku-20241022-v1:0"
SONNET_PROFILE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
SONNET = "anthropic.claude-sonnet-4-5-20250929-v1:0"
CATALOG = {
    "models": [
        {"id": "haiku", "batch_budget": 4, "backend": {"kind": "bedrock", "model_id": HAIKU, "region": "us-east-1"}},
        {
            "id": "sonnet",
            "batch_budget": 8,
            "backend": {"kind": "bedrock", "model_id": SONNET_PROFILE, "region": "us-west-2"},
        },
        {
            "id": "glm",
            "batch_budget": 4,
            "backend": {"kind": "openai", "base_url": "https://glm.example/v1", "api_key_env": "GLM_KEY"},
        },
        {"id": "router", "auto": True},
    ]
}
PROD = {"stage": "prod", "alarm_email": "ops@example.com"}

HAIKU_ARN = {"Fn::Sub": f"arn:${{AWS::Partition}}:bedrock:us-east-1::foundation-model/{HAIKU}"}
SONNET_PROFILE_ARN = {
    "Fn::Sub": f"arn:${{AWS::Partition}}:bedrock:us-west-2:${{AWS::AccountId}}:inference-profile/{SONNET_PROFILE}"
}
# The Regions a US profile routes to are AWS's to change: the model in any Region, through this profile only.
SONNET_ANY_REGION = {"Fn::Sub": f"arn:${{AWS::Partition}}:bedrock:*::foundation-model/{SONNET}"}


def write_catalog(path: Path, catalog: dict[str, Any]) -> Path:
    path.write_text(json.dumps(catalog))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def bedrock_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    root = tmp_path_factory.mktemp("cdk-bedrock")
    catalog = write_catalog(root / "bedrock-models.yaml", CATALOG)
    return synthesize(root / "out", {**PROD, "models_file": str(catalog)})


def bedrock_statements(synth: Synth, name: str) -> list[dict[str, Any]]:
    return [s for s in role_statements(synth, name) if any(a.startswith("bedrock:") for a in actions_of([s]))]


# -- IAM --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["api", "worker"])
def test_calling_functions_may_invoke_exactly_the_catalog_s_bedrock_models(bedrock_synth: Synth, name: str) -> None:
    # The api relays interactive streams (ConverseStream) too; the worker only invokes.
    action: str | list[str] = (["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"] if name == "api"
                               else "bedrock:InvokeModel")
    role_id = function_resource(bedrock_synth, name)[1]["Properties"]["Role"]["Fn::GetAtt"][0]
    bedrock_synth.template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "Roles": [{"Ref": role_id}],
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        # The foundation model in its Region, and the inference profile, as the calls name them.
                        {
                            "Action": action,
                            "Effect": "Allow",
                            "Resource": [HAIKU_ARN, SONNET_PROFILE_ARN],
                        },
                        # The profile's model wherever it routes, only for calls made through that profile.
                        {
                            "Action": action,
                            "Effect": "Allow",
                            "Resource": SONNET_ANY_REGION,
                            "Condition": {"StringEquals": {"bedrock:InferenceProfileArn": SONNET_PROFILE_ARN}},
                        },
                    ]
                )
            },
        },
    )
    # Nothing more: no other Bedrock statement, action or resource (no bedrock:*).
    statements = bedrock_statements(bedrock_synth, name)
    assert len(statements) == 2, statements
    assert actions_of(statements) == set([action] if isinstance(action, str) else action)


def test_functions_that_call_no_backend_get_no_bedrock_access(bedrock_synth: Synth, edge_synth: Synth) -> None:
    for name in FUNCTION_NAMES:
        if name not in ("api", "worker"):
            assert bedrock_statements(bedrock_synth, name) == [], name
    # A catalog without Bedrock models grants nothing of Bedrock at all.
    assert not any(m["backend"].get("kind") == "bedrock" for m in EDGE_CATALOG["models"] if "backend" in m)
    for policy in edge_synth.resources("AWS::IAM::Policy").values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert not any(a.startswith("bedrock:") for a in actions_of(statements))


def test_the_streaming_action_comes_only_with_the_streaming_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the api function relays interactive streams (ConverseStream); the worker never streams.
    assert bedrock.actions() == ["bedrock:InvokeModel"]
    assert bedrock.actions(streams=True) == ["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]
    monkeypatch.setattr(bedrock, "BEDROCK_STREAMING", False)
    assert bedrock.actions(streams=True) == ["bedrock:InvokeModel"]


@pytest.mark.parametrize(
    ("model_id", "region", "invoked", "routed"),
    [
        (HAIKU, "eu-west-1", f"arn:${{AWS::Partition}}:bedrock:eu-west-1::foundation-model/{HAIKU}", None),
        (
            f"eu.{HAIKU}",
            "eu-central-1",
            f"arn:${{AWS::Partition}}:bedrock:eu-central-1:${{AWS::AccountId}}:inference-profile/eu.{HAIKU}",
            f"arn:${{AWS::Partition}}:bedrock:*::foundation-model/{HAIKU}",
        ),
        (
            f"apac.{HAIKU}",
            "ap-northeast-1",
            f"arn:${{AWS::Partition}}:bedrock:ap-northeast-1:${{AWS::AccountId}}:inference-profile/apac.{HAIKU}",
            f"arn:${{AWS::Partition}}:bedrock:*::foundation-model/{HAIKU}",
        ),
        (
            # A global profile's model ARN has an empty Region, which the `*` matches too.
            f"global.{SONNET}",
            "us-east-1",
            f"arn:${{AWS::Partition}}:bedrock:us-east-1:${{AWS::AccountId}}:inference-profile/global.{SONNET}",
            f"arn:${{AWS::Partition}}:bedrock:*::foundation-model/{SONNET}",
        ),
        # ARNs are used as they are; a profile's foundation model comes from its id.
        (
            f"arn:aws:bedrock:us-east-1::foundation-model/{HAIKU}",
            "us-east-1",
            f"arn:aws:bedrock:us-east-1::foundation-model/{HAIKU}",
            None,
        ),
        (
            f"arn:aws-us-gov:bedrock:us-gov-west-1:123456789012:inference-profile/us-gov.{HAIKU}",
            "us-gov-west-1",
            f"arn:aws-us-gov:bedrock:us-gov-west-1:123456789012:inference-profile/us-gov.{HAIKU}",
            f"arn:aws-us-gov:bedrock:*::foundation-model/{HAIKU}",
        ),
        (
            # An application profile's id says nothing of its model: every model, only through this profile.
            "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",
            "us-east-1",
            "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",
            "arn:aws:bedrock:*::foundation-model/*",
        ),
    ],
)
def test_arns_follow_from_model_id_and_region(model_id: str, region: str, invoked: str, routed: str | None) -> None:
    assert bedrock.model_problem(model_id, region) is None
    assert bedrock.access("m", model_id, region) == bedrock.BedrockAccess("m", invoked, routed)


# -- no secret ----------------------------------------------------------------------------------------------


def test_bedrock_models_get_no_secret(bedrock_synth: Synth) -> None:
    names = {s["Properties"]["Name"] for s in bedrock_synth.resources("AWS::SecretsManager::Secret").values()}
    assert names == {"prod/batchinfer/models/glm"}  # the OpenAI-compatible model's key only
    assert set(joined_json(env(bedrock_synth, "worker")["MODEL_SECRETS"])) == {"glm"}
    outputs = bedrock_synth.template_json["Outputs"]
    assert json.loads(outputs["ModelSecretNames"]["Value"]) == {"glm": "prod/batchinfer/models/glm"}
    # Every catalog model still has its queue.
    queues = {q["Properties"]["QueueName"] for q in bedrock_synth.resources("AWS::SQS::Queue").values()}
    assert {"prod-batchinfer-haiku", "prod-batchinfer-sonnet", "prod-batchinfer-glm"} <= queues


# -- cdk-nag and cfn-lint -------------------------------------------------------------------------------------


def test_cdk_nag_passes(bedrock_synth: Synth) -> None:
    report = AwsSolutionsChecks().validate_scope(bedrock_synth.stack)
    assert [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations] == []
    annotations = Annotations.from_stack(bedrock_synth.stack)
    assert annotations.find_error("*", Match.any_value()) == []
    warnings = [str(w.entry.data) for w in annotations.find_warning("*", Match.any_value())]
    assert all(w.startswith("The deps layer is an empty placeholder") for w in warnings), warnings


PROFILE_ARN = f"arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.{HAIKU}"
APP_PROFILE_ARN = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6"


def test_each_region_wildcard_is_acknowledged_per_role_and_matches_a_real_finding(tmp_path: Path) -> None:
    """Built without applying acknowledgments: the Bedrock findings are exactly the acknowledged ones (so the
    stack is nag-clean), for profiles named by id and by ARN."""
    arns = [
        {"id": f"by-arn-{n}", "batch_budget": 2, "backend": {"kind": "bedrock", "model_id": arn, "region": region}}
        for n, (arn, region) in enumerate([(PROFILE_ARN, "eu-west-1"), (APP_PROFILE_ARN, "us-east-1")])
    ]
    catalog = write_catalog(tmp_path / "models.yaml", {"models": [*CATALOG["models"], *arns]})
    with recording_acknowledgments() as recorded:
        _, stack = build_app(
            {"skip_deps_build": True, **PROD, "models_file": str(catalog)}, outdir=str(tmp_path / "out"), nag=False
        )
    findings = {
        (r.construct_path.removesuffix("/DefaultPolicy/Resource"), v.rule_name)
        for v in AwsSolutionsChecks().validate_scope(stack).violations
        for r in v.violating_resources
        if "bedrock" in v.rule_name
    }
    expected = {
        f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:bedrock:*::foundation-model/{SONNET}]",
        f"AwsSolutions-IAM5[Resource::arn:aws:bedrock:*::foundation-model/{HAIKU}]",
        "AwsSolutions-IAM5[Resource::arn:aws:bedrock:*::foundation-model/*]",
    }
    roles = ("batchinfer-prod/Functions/Api/Role", "batchinfer-prod/Functions/Worker/Role")
    assert findings == {(role, rule) for role in roles for rule in expected}
    assert {(path, rule) for path, rule in recorded if "bedrock" in rule} == findings


def test_cfn_lint_passes(bedrock_synth: Synth, tmp_path: Path) -> None:
    path = tmp_path / "bedrock.template.json"
    path.write_text(json.dumps(bedrock_synth.template_json, indent=1))
    config = ManualArgs(ignore_checks=["W3005"], regions=["us-east-1", "us-west-2"])
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in lint_file(path, config)] == []


# -- a synth that fails loudly --------------------------------------------------------------------------------


def bedrock_catalog(tmp_path: Path, **backend: str) -> Path:
    entry = {"id": "claude", "batch_budget": 2, "backend": {"kind": "bedrock", **backend}}
    return write_catalog(tmp_path / "models.yaml", {"models": [entry]})


def build(tmp_path: Path, catalog: Path, **context: str) -> None:
    build_app(
        {"skip_deps_build": True, **PROD, "models_file": str(catalog), **context},
        outdir=str(tmp_path / "out"),
        nag=False,
    )


def test_a_bedrock_model_without_region_fails_the_synth_naming_model_and_field(tmp_path: Path) -> None:
    catalog = bedrock_catalog(tmp_path, model_id=HAIKU)
    with pytest.raises(ValueError, match=r"models\.yaml: model 'claude': backend: a bedrock backend needs region$"):
        build(tmp_path, catalog)


@pytest.mark.parametrize("region", ["us-east", "US-EAST-1", "useast1", "us_east_1", "*", "us-east-1 "])
def test_a_region_that_is_no_aws_region_name_fails_the_synth(tmp_path: Path, region: str) -> None:
    catalog = bedrock_catalog(tmp_path, model_id=HAIKU, region=region)
    expected = re.escape(f"model 'claude': backend.region {region!r} is not an AWS Region name")
    with pytest.raises(ValueError, match=expected):
        build(tmp_path, catalog)


@pytest.mark.parametrize(
    "model_id",
    [
        "anthropic.*",
        "*",
        "arn:aws:bedrock:*::foundation-model/" + HAIKU,
        "arn:aws:bedrock:us-east-1::foundation-model/*",
        "arn:aws:s3:::bucket/key",
        "anthropic claude",
    ],
)
def test_a_model_id_that_would_widen_the_grant_fails_the_synth(tmp_path: Path, model_id: str) -> None:
    catalog = bedrock_catalog(tmp_path, model_id=model_id, region="us-east-1")
    with pytest.raises(ValueError, match=r"model 'claude': backend\.model_id .* (is not a Bedrock|no wildcard)"):
        load_catalog(catalog, stage="prod")


@pytest.mark.parametrize(
    "endpoint_url", ["http://localhost:8200", "http://127.0.0.1:8200", "https://10.0.0.5", "http://bedrock.internal"]
)
def test_a_local_endpoint_url_fails_a_deployed_stage(tmp_path: Path, endpoint_url: str) -> None:
    catalog = bedrock_catalog(tmp_path, model_id=HAIKU, region="us-east-1", endpoint_url=endpoint_url)
    with pytest.raises(DeploymentConfigError) as raised:
        build(tmp_path, catalog)
    message = str(raised.value)
    assert "stage 'prod' cannot be deployed" in message
    assert f"model claude: Bedrock endpoint_url {endpoint_url} is unreachable from Lambda" in message
    assert "Drop endpoint_url to call the Bedrock endpoint of region us-east-1" in message


def test_dev_only_warns_of_a_local_endpoint_url_and_a_public_one_passes(tmp_path: Path) -> None:
    local = bedrock_catalog(tmp_path, model_id=HAIKU, region="us-east-1", endpoint_url="http://127.0.0.1:8200")
    _, stack = build_app(
        {"skip_deps_build": True, "stage": "dev", "models_file": str(local)}, outdir=str(tmp_path / "dev"), nag=False
    )
    warnings = [str(w.entry.data) for w in Annotations.from_stack(stack).find_warning("*", Match.any_value())]
    assert any("Bedrock endpoint_url http://127.0.0.1:8200 is unreachable from Lambda" in w for w in warnings)
    # No endpoint_url (the region's own) or a public one: a production stage synthesizes.
    build(tmp_path, bedrock_catalog(tmp_path, model_id=HAIKU, region="us-east-1"))
    public = bedrock_catalog(
        tmp_path, model_id=HAIKU, region="us-east-1", endpoint_url="https://bedrock-runtime.us-east-1.amazonaws.com"
    )
    build(tmp_path, public)


def test_the_catalog_as_the_stack_sees_a_bedrock_model(tmp_path: Path) -> None:
    catalog = bedrock_catalog(
        tmp_path, model_id="${CLAUDE_ID:-" + HAIKU + "}", region="${CLAUDE_REGION:-us-east-1}",
        endpoint_url="http://127.0.0.1:8200",
    )
    (model,) = load_catalog(catalog, stage="prod", env={"CLAUDE_REGION": "eu-west-3"}).models
    assert (model.kind, model.bedrock_model_id, model.region) == ("bedrock", HAIKU, "eu-west-3")
    assert not model.needs_secret and model.base_url is None
    assert model.local_backend == "127.0.0.1 is a loopback address"  # judged on endpoint_url
    (plain,) = load_catalog(bedrock_catalog(tmp_path, model_id=HAIKU, region="us-east-1"), stage="prod").models
    assert plain.endpoint_url is None and plain.local_backend is None  # the region's own endpoint
