"""Bedrock's batch inference for the catalog's Bedrock models with a `provider_batch` (docs/provider-batch.md):
the service role Bedrock assumes to run their model invocation jobs, and what the one function that makes the
jobs (the sweeper, which runs `service.offloading.jobs`) may do.

- The service role: assumed by bedrock.amazonaws.com only for this account's model invocation jobs in the
  models' Regions (aws:SourceAccount, aws:SourceArn); it reads the input prefix and writes the output prefix
  of the data bucket (`layout.PROVIDER_JOBS_INPUT_PREFIX` / `PROVIDER_JOBS_OUTPUT_PREFIX`), nothing else of
  it, and invokes exactly the tier models (a profile's foundation models only through that profile, as for
  the functions, infra/bedrock.py).
- The sweeper: iam:PassRole on that role alone, only to Bedrock (iam:PassedToService), and
  bedrock:Create/Get/StopModelInvocationJob on the jobs of the models' Regions (Create also on the models),
  bedrock:ListModelInvocationJobs (no resource-level permissions: `*`). No other function may pass the role.
- Every function that decides whether a part goes to a tier (api: create and estimate; worker and sweeper:
  file batches validated) reads the role's ARN from BEDROCK_BATCH_ROLE_ARN: without it, parts run directly.
"""

from __future__ import annotations

from aws_cdk import Aws, Fn
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from batchinfer.layout import PROVIDER_JOBS_INPUT_PREFIX, PROVIDER_JOBS_OUTPUT_PREFIX
from infra import bedrock
from infra.config import CatalogModel
from infra.nag import acknowledge, nag_ref
from infra.storage import Storage

ROLE_ENV = "BEDROCK_BATCH_ROLE_ARN"
JOB_ACTIONS = ("bedrock:CreateModelInvocationJob", "bedrock:GetModelInvocationJob",
               "bedrock:StopModelInvocationJob")
LIST_ACTION = "bedrock:ListModelInvocationJobs"
LIST_REASON = ("bedrock:ListModelInvocationJobs supports no resource-level permissions (a job is found again by "
               "its name).")


def tier_models(models: list[CatalogModel]) -> list[CatalogModel]:
    """The catalog's Bedrock models whose part of a batch may go to Bedrock's batch inference."""
    return [m for m in models if m.is_bedrock and m.batch_tier and m.bedrock_model_id and m.region]


def job_arn(region: str) -> str:
    """The model invocation jobs of a Region in this account (an infra.bedrock template)."""
    return f"arn:{bedrock.PARTITION}:bedrock:{region}:{bedrock.ACCOUNT}:model-invocation-job/*"


def _arn(template: str) -> str:
    return Fn.sub(template) if "${" in template else template


def _nag_arn(template: str) -> str:
    return template.replace("${", "<").replace("}", ">")


class BedrockBatchJobs(Construct):
    """The service role of the tier models' jobs; `allow_jobs` gives a function what making them needs."""

    def __init__(self, scope: Construct, construct_id: str, *, storage: Storage, models: list[CatalogModel]) -> None:
        super().__init__(scope, construct_id)
        self.models = tier_models(models)
        assert self.models, "no Bedrock model of the catalog has a provider_batch"
        self.regions = sorted({m.region for m in self.models if m.region})
        self.accesses = [bedrock.access(m.model_id, m.bedrock_model_id or "", m.region or "") for m in self.models]
        bucket = storage.bucket
        principal = iam.ServicePrincipal("bedrock.amazonaws.com").with_conditions({
            "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
            "ArnLike": {"aws:SourceArn": [_arn(job_arn(region)) for region in self.regions]},
        })
        self.role = iam.Role(self, "ServiceRole", assumed_by=principal,
                             description="Amazon Bedrock batch inference jobs of batchinfer's tier models")
        owned = {"StringEquals": {"aws:ResourceAccount": Aws.ACCOUNT_ID}}
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{PROVIDER_JOBS_INPUT_PREFIX}*")],
            conditions=owned))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["s3:PutObject"], resources=[bucket.arn_for_objects(f"{PROVIDER_JOBS_OUTPUT_PREFIX}*")],
            conditions=owned))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[bucket.bucket_arn],
            conditions={**owned, "StringLike": {"s3:prefix": [f"{PROVIDER_JOBS_INPUT_PREFIX}*",
                                                              f"{PROVIDER_JOBS_OUTPUT_PREFIX}*"]}}))
        invoked = [_arn(arn) for arn in sorted({a.invoked for a in self.accesses})]
        self.role.add_to_policy(iam.PolicyStatement(actions=[bedrock.INVOKE_ACTION], resources=invoked))
        prefix = nag_ref(bucket)
        for path, what in ((PROVIDER_JOBS_INPUT_PREFIX, "reads"), (PROVIDER_JOBS_OUTPUT_PREFIX, "writes")):
            acknowledge(self.role, f"AwsSolutions-IAM5[Resource::{prefix}/{path}*]",
                        f"Bedrock {what} the objects of its jobs under {path}, named per job at run time.")
        routed = {(a.invoked, a.routed): a for a in self.accesses if a.routed is not None}
        for entry in routed.values():
            assert entry.routed is not None
            self.role.add_to_policy(iam.PolicyStatement(
                actions=[bedrock.INVOKE_ACTION], resources=[_arn(entry.routed)],
                conditions={"StringEquals": {bedrock.PROFILE_CONDITION_KEY: _arn(entry.invoked)}}))
            acknowledge(self.role, f"AwsSolutions-IAM5[Resource::{_nag_arn(entry.routed)}]",
                        f"Model {entry.model_id} is an inference profile: its foundation model in whichever "
                        f"Region the profile routes to, only through that profile.")

    def allow_jobs(self, function: lambda_.Function) -> None:
        """What the function that makes, looks at and stops the jobs needs (the sweeper's alone)."""
        jobs = [_arn(job_arn(region)) for region in self.regions]
        models = [_arn(arn) for arn in sorted({a.invoked for a in self.accesses})]
        function.add_to_role_policy(iam.PolicyStatement(
            actions=["iam:PassRole"], resources=[self.role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "bedrock.amazonaws.com"}}))
        function.add_to_role_policy(iam.PolicyStatement(actions=list(JOB_ACTIONS), resources=jobs))
        function.add_to_role_policy(iam.PolicyStatement(actions=[JOB_ACTIONS[0]], resources=models))
        function.add_to_role_policy(iam.PolicyStatement(actions=[LIST_ACTION], resources=["*"]))
        assert function.role is not None
        for region in self.regions:
            acknowledge(function.role, f"AwsSolutions-IAM5[Resource::{_nag_arn(job_arn(region))}]",
                        "Model invocation jobs are made at run time, one per provider job; scoped to this "
                        "account and the tier models' Regions.")
