"""Assertions on the synthesized CloudFormation template: each function's IAM permissions, scoped to the table,
bucket, queues and secrets it uses and exactly the DynamoDB calls its code makes; cdk-nag and cfn-lint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Annotations, Match
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import ManualArgs, lint_file

from infra.nag import recording_acknowledgments
from infra.stack import build_app
from tests.infra.conftest import (
    FUNCTION_NAMES,
    Synth,
    actions_of,
    function_resource,
    refs,
    resources_for,
    role_statements,
)

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
