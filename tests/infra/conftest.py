"""Synthesize the stack once per session (synthesis is the slow part) and share the result, and read it: a
function's resource, environment and role statements."""

from __future__ import annotations

import os

# Before the first aws_cdk import: it starts the jsii runtime, which prints Node version banners.
os.environ.setdefault("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1")
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import json  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from aws_cdk import App, Stack  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

from infra.functions import SPECS  # noqa: E402
from infra.stack import BatchInferenceStack, build_app  # noqa: E402


@dataclass
class Synth:
    app: App
    stack: BatchInferenceStack
    template: Template
    template_json: dict[str, Any]
    outdir: Path

    def logical_id(self, construct: Any) -> str:
        cfn = construct if hasattr(construct, "logical_id") else construct.node.default_child
        return Stack.of(cfn).resolve(cfn.logical_id)

    def resources(self, type_name: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.template_json["Resources"].items() if v["Type"] == type_name}


def synthesize(tmp: Path, context: dict[str, Any]) -> Synth:
    # The placeholder deps layer: no network, no 50 MB asset; `make synth` builds the real one.
    app, stack = build_app({"skip_deps_build": True, **context}, outdir=str(tmp), nag=False)
    assembly = app.synth()
    template_json = assembly.get_stack_artifact(stack.artifact_id).template
    return Synth(app, stack, Template.from_json(template_json), template_json, Path(assembly.directory))


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The default deployment (repo catalog, cdk.json defaults)."""
    return synthesize(tmp_path_factory.mktemp("cdk-default"), {})


EDGE_TOPIC_ARN = "arn:aws:sns:eu-west-1:123456789012:team-pager"
EDGE_DOMAIN = "batch.example.com"
EDGE_CERTIFICATE_ARN = "arn:aws:acm:eu-west-1:123456789012:certificate/0b0e2b35-5c3a-4f2c-9d1a-3f0e2b4c5d6e"

EDGE_CATALOG = {
    "models": [
        {
            "id": "Big.Model/v1",
            "batch_budget": 5000,
            "backend": {"kind": "openai", "base_url": "https://a.example/v1", "api_key_secret": "whatever"},
        },
        {
            "id": "tiny",
            "batch_budget": 1,
            # The core catalog knows only "openai" backends so far; anything else fails the synth.
            "backend": {"kind": "openai", "base_url": "${TINY_URL:-http://127.0.0.1:1}"},
        },
        {
            "id": "mid",
            "batch_budget": "${MID_BUDGET:-7}",
            "backend": {"kind": "openai", "base_url": "https://b.example", "api_key_env": "MID_KEY"},
        },
        {"id": "router", "auto": True},
    ]
}


@pytest.fixture(scope="session")
def edge_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """A second deployment: custom catalog with edge cases and non-default settings."""
    root = tmp_path_factory.mktemp("cdk-edge")
    catalog = root / "edge-models.yaml"
    catalog.write_text(json.dumps(EDGE_CATALOG))  # JSON is YAML
    return synthesize(
        root / "out",
        {
            "stage": "qa",
            "models_file": str(catalog),
            "retain_data": "false",
            "scheduled_reserved_concurrency": "none",
            "alarm_email": "ops@example.com",
            # An existing topic instead of the stack's own (the email is subscribed to it as well).
            "alarm_topic_arn": EDGE_TOPIC_ARN,
            "monthly_budget_usd": "250",
            "monthly_budget_scope": "account",
            "domain_name": EDGE_DOMAIN,
            "certificate_arn": EDGE_CERTIFICATE_ARN,
            "catalog_env": json.dumps({"TINY_URL": "https://tiny.example"}),
            "file_batches_enabled": "true",
            "batch_webhooks_enabled": "true",
        },
    )


# -- reading the synthesized template ---------------------------------------------------------------------

FUNCTION_NAMES = [spec.name for spec in SPECS]
INDEXES = ("by_owner", "by_due", "by_active")  # the table's global secondary indexes


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


def joined_json(value: Any) -> dict[str, Any]:
    """Decode a JSON env value that CloudFormation assembles with Fn::Join (tokens become "X")."""
    if isinstance(value, str):
        return json.loads(value)
    return json.loads("".join(p if isinstance(p, str) else "X" for p in value["Fn::Join"][1]))
