"""Bedrock's batch inference in a deployment: for the catalog's Bedrock models with a `provider_batch`, a service
role only Bedrock may assume (for this account's model invocation jobs), reading only the jobs' input prefix,
writing only their output prefix and invoking only those models; `iam:PassRole` on it and the job calls for the
sweeper alone; its ARN named to the functions that plan batches; cdk-nag and cfn-lint clean. A catalog with no
Bedrock tier gets none of it."""

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
from tests.infra.conftest import FUNCTION_NAMES, Synth, actions_of, env, role_statements, synthesize
from tests.infra.test_bedrock import CATALOG, HAIKU_ARN, PROD, SONNET, SONNET_PROFILE_ARN, write_catalog

TIER = {"price": {"input_per_mtok": 0.0}, "min_requests": 100}
TIER_CATALOG = {"models": [{**m, "provider_batch": TIER} if m.get("backend", {}).get("kind") == "bedrock" else m
                           for m in CATALOG["models"]]}
JOBS = {region: {"Fn::Sub": f"arn:${{AWS::Partition}}:bedrock:{region}:${{AWS::AccountId}}:model-invocation-job/*"}
        for region in ("us-east-1", "us-west-2")}
SONNET_ANY_REGION = {"Fn::Sub": f"arn:${{AWS::Partition}}:bedrock:*::foundation-model/{SONNET}"}
JOB_ACTIONS = {"bedrock:CreateModelInvocationJob", "bedrock:GetModelInvocationJob", "bedrock:StopModelInvocationJob",
               "bedrock:ListModelInvocationJobs"}


@pytest.fixture(scope="module")
def tier_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    root = tmp_path_factory.mktemp("cdk-bedrock-batch")
    catalog = write_catalog(root / "models.yaml", TIER_CATALOG)
    return synthesize(root / "out", {**PROD, "models_file": str(catalog)})


def service_role(synth: Synth) -> tuple[str, dict[str, Any]]:
    [found] = [(lid, r) for lid, r in synth.resources("AWS::IAM::Role").items()
               if "bedrock.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])]
    return found


def statements_of(synth: Synth, role_id: str) -> list[dict[str, Any]]:
    return [s for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def test_the_service_role_is_bedrocks_for_this_accounts_jobs_in_the_models_regions(tier_synth: Synth) -> None:
    _, role = service_role(tier_synth)
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"] == [{
        "Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "bedrock.amazonaws.com"},
        "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}},
                      "ArnLike": {"aws:SourceArn": [JOBS["us-east-1"], JOBS["us-west-2"]]}}}]


def test_the_service_role_reads_the_input_prefix_writes_the_output_prefix_and_invokes_the_tier_models(
        tier_synth: Synth) -> None:
    role_id, _ = service_role(tier_synth)
    statements = statements_of(tier_synth, role_id)
    by_action = {json.dumps(s["Action"]): s for s in statements if s["Action"] != "bedrock:InvokeModel"}
    owned = {"StringEquals": {"aws:ResourceAccount": {"Ref": "AWS::AccountId"}}}
    assert set(by_action) == {'"s3:GetObject"', '"s3:PutObject"', '"s3:ListBucket"'}
    assert by_action['"s3:GetObject"']["Resource"]["Fn::Join"][1][1] == "/provider-jobs/in/*"
    assert by_action['"s3:PutObject"']["Resource"]["Fn::Join"][1][1] == "/provider-jobs/out/*"
    assert by_action['"s3:GetObject"']["Condition"] == by_action['"s3:PutObject"']["Condition"] == owned
    assert by_action['"s3:ListBucket"']["Condition"] == {
        **owned, "StringLike": {"s3:prefix": ["provider-jobs/in/*", "provider-jobs/out/*"]}}
    invoke = [s for s in statements if s["Action"] == "bedrock:InvokeModel"]
    assert [s["Resource"] for s in invoke if "Condition" not in s] == [[HAIKU_ARN, SONNET_PROFILE_ARN]]
    assert [(s["Resource"], s["Condition"]) for s in invoke if "Condition" in s] == [
        (SONNET_ANY_REGION, {"StringEquals": {"bedrock:InferenceProfileArn": SONNET_PROFILE_ARN}})]


def test_only_the_sweeper_may_pass_the_role_and_make_look_at_and_stop_jobs(tier_synth: Synth) -> None:
    role_id, _ = service_role(tier_synth)
    for name in FUNCTION_NAMES:
        statements = role_statements(tier_synth, name)
        jobs = actions_of(statements) & JOB_ACTIONS
        passes = [s for s in statements if s["Action"] == "iam:PassRole"]
        if name != "sweeper":
            assert (jobs, passes) == (set(), []), name
            continue
        assert jobs == JOB_ACTIONS
        assert passes == [{"Action": "iam:PassRole", "Effect": "Allow", "Resource": {"Fn::GetAtt": [role_id, "Arn"]},
                           "Condition": {"StringEquals": {"iam:PassedToService": "bedrock.amazonaws.com"}}}]
        scoped = [s for s in statements if isinstance(s["Action"], list)
                  and "bedrock:GetModelInvocationJob" in s["Action"]]
        assert [s["Resource"] for s in scoped] == [[JOBS["us-east-1"], JOBS["us-west-2"]]]
        creates = [s["Resource"] for s in statements if s["Action"] == "bedrock:CreateModelInvocationJob"]
        assert creates == [[HAIKU_ARN, SONNET_PROFILE_ARN]]
        listed = [s for s in statements if "bedrock:ListModelInvocationJobs" in actions_of([s])]
        assert [s["Resource"] for s in listed] == ["*"]


def test_the_functions_that_plan_batches_are_told_the_roles_arn(tier_synth: Synth) -> None:
    role_id, _ = service_role(tier_synth)
    told = {name for name in FUNCTION_NAMES if "BEDROCK_BATCH_ROLE_ARN" in env(tier_synth, name)}
    assert told == {"api", "worker", "sweeper"}
    assert env(tier_synth, "sweeper")["BEDROCK_BATCH_ROLE_ARN"] == {"Fn::GetAtt": [role_id, "Arn"]}


def test_the_jobs_objects_expire_as_a_batchs_data_does(tier_synth: Synth) -> None:
    [bucket] = [r for lid, r in tier_synth.resources("AWS::S3::Bucket").items() if "DataBucket" in lid]
    rules = {r["Id"]: r for r in bucket["Properties"]["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-provider-jobs"]["Prefix"] == "provider-jobs/"
    assert rules["expire-provider-jobs"]["ExpirationInDays"] == rules["expire-batches"]["ExpirationInDays"]


def test_a_catalog_without_a_bedrock_tier_gets_no_role_and_no_job_calls(tmp_path: Path) -> None:
    synth = synthesize(tmp_path / "out", {**PROD, "models_file": str(write_catalog(tmp_path / "m.yaml", CATALOG))})
    assert not [r for r in synth.resources("AWS::IAM::Role").values()
                if "bedrock.amazonaws.com" in json.dumps(r["Properties"]["AssumeRolePolicyDocument"])]
    for name in FUNCTION_NAMES:
        statements = role_statements(synth, name)
        assert not actions_of(statements) & (JOB_ACTIONS | {"iam:PassRole"}), name
        assert "BEDROCK_BATCH_ROLE_ARN" not in env(synth, name)


def test_cdk_nag_passes_and_each_acknowledgment_matches_a_real_finding(tier_synth: Synth, tmp_path: Path) -> None:
    report = AwsSolutionsChecks().validate_scope(tier_synth.stack)
    assert [(v.rule_name, [r.construct_path for r in v.violating_resources]) for v in report.violations] == []
    annotations = Annotations.from_stack(tier_synth.stack)
    assert annotations.find_error("*", Match.any_value()) == []
    catalog = write_catalog(tmp_path / "models.yaml", TIER_CATALOG)
    with recording_acknowledgments() as recorded:
        _, stack = build_app({"skip_deps_build": True, **PROD, "models_file": str(catalog)},
                             outdir=str(tmp_path / "out"), nag=False)
    findings = {(r.construct_path.removesuffix("/DefaultPolicy/Resource"), v.rule_name)
                for v in AwsSolutionsChecks().validate_scope(stack).violations for r in v.violating_resources
                if "BedrockBatch" in r.construct_path or "model-invocation-job" in v.rule_name}
    ours = {(path, rule) for path, rule in recorded
            if "BedrockBatch" in path or "model-invocation-job" in rule or "provider-jobs" in rule}
    # The service role: the in and out prefixes, Sonnet's foundation model through its profile; the sweeper: the
    # jobs of the 2 Regions.
    assert ours == findings and len(ours) == 5
    assert sum(SONNET in rule for _, rule in ours) == 1


def test_cfn_lint_passes(tier_synth: Synth, tmp_path: Path) -> None:
    path = tmp_path / "bedrock-batch.template.json"
    path.write_text(json.dumps(tier_synth.template_json, indent=1))
    config = ManualArgs(ignore_checks=["W3005"], regions=["us-east-1", "us-west-2"])
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in lint_file(path, config)] == []
