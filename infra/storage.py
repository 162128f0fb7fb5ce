"""The service's state: one DynamoDB table and one S3 bucket (plus the bucket's access-log bucket)."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_s3 as s3
from constructs import Construct

from batchinfer.layout import (
    BATCHES_PREFIX,
    FILES_PREFIX,
    INDEX_PROJECTIONS,
    INDEXES,
    PROVIDER_JOBS_INPUT_PREFIX,
    TTL_ATTRIBUTE,
)
from infra.config import InfraConfig

# How long an overwritten or deleted object of the data bucket can still be restored.
NONCURRENT_VERSION_DAYS = 1

_TYPES = {"S": dynamodb.AttributeType.STRING, "N": dynamodb.AttributeType.NUMBER}
_PROJECTIONS = {
    "ALL": dynamodb.ProjectionType.ALL,
    "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY,
    "INCLUDE": dynamodb.ProjectionType.INCLUDE,
}

# The indexes the storage modules query (defined once, in batchinfer.layout, for the local stack too).
GLOBAL_INDEXES: dict[str, tuple[tuple[str, dynamodb.AttributeType], tuple[str, dynamodb.AttributeType]]] = {
    name: ((hk, _TYPES[ht]), (rk, _TYPES[rt])) for name, ((hk, ht), (rk, rt)) in INDEXES.items()
}


class Storage(Construct):
    """DynamoDB table (on demand, PITR, TTL) and the data bucket (SSE-S3, TLS only, lifecycle)."""

    def __init__(self, scope: Construct, construct_id: str, *, config: InfraConfig) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY

        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name="pk", type=_TYPES["S"]),
            sort_key=dynamodb.Attribute(name="sk", type=_TYPES["S"]),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=TTL_ATTRIBUTE,
            deletion_protection=config.retain_data,
            removal_policy=removal,
        )
        for index_name, ((pk_name, pk_type), (sk_name, sk_type)) in GLOBAL_INDEXES.items():
            # What the readers use (layout.INDEX_PROJECTIONS, shared with the local stack); ALL for a stage
            # whose table was created with it, since CloudFormation refuses to change a GSI's projection.
            kind, attributes = ("ALL", ()) if config.full_index_projections else INDEX_PROJECTIONS[index_name]
            projection, non_key_attributes = _PROJECTIONS[kind], list(attributes) or None
            self.table.add_global_secondary_index(
                index_name=index_name,
                partition_key=dynamodb.Attribute(name=pk_name, type=pk_type),
                sort_key=dynamodb.Attribute(name=sk_name, type=sk_type),
                projection_type=projection,
                non_key_attributes=non_key_attributes,
            )

        # Access logs of the data bucket (cdk-nag S1). SSE-S3: log delivery cannot write to SSE-KMS buckets.
        self.access_logs_bucket = s3.Bucket(
            self,
            "AccessLogsBucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(90)),
                s3.LifecycleRule(
                    id="abort-multipart", abort_incomplete_multipart_upload_after=Duration.days(1)
                ),
            ],
            removal_policy=removal,
        )
        # Versioned, with noncurrent versions kept one day: an object overwritten or deleted by mistake (a bug
        # in a purge, a bad deploy) can be restored for a day, while a deleted batch's data is gone within
        # about two days (one day + lifecycle lag), not kept. The objects are written once and deleted
        # whole, so the extra storage is one day of what was deleted.
        # SSE-S3, not SSE-KMS: results and files are handed out as presigned URLs, which with SSE-KMS would
        # also need kms:Decrypt on the signing role and cost one KMS request per object; no requirement
        # here asks for customer-managed keys.
        self.bucket = s3.Bucket(
            self,
            "DataBucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,
            server_access_logs_bucket=self.access_logs_bucket,
            server_access_logs_prefix="data-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="abort-multipart", abort_incomplete_multipart_upload_after=Duration.days(1)
                ),
                s3.LifecycleRule(
                    id="expire-noncurrent-versions",
                    noncurrent_version_expiration=Duration.days(NONCURRENT_VERSION_DAYS),
                ),
                # Once its noncurrent versions are gone, a delete marker alone is removed too.
                s3.LifecycleRule(id="remove-expired-delete-markers", expired_object_delete_marker=True),
                # Safety nets only: the sweeper deletes on time, these catch what it missed.
                s3.LifecycleRule(
                    id="expire-batches",
                    prefix=BATCHES_PREFIX,
                    expiration=Duration.days(config.batches_expire_after_days),
                ),
                s3.LifecycleRule(
                    id="expire-files",
                    prefix=FILES_PREFIX,
                    expiration=Duration.days(config.files_expire_after_days),
                ),
                # Bedrock's batch jobs' input and output (provider-jobs/in/, provider-jobs/out/): read once
                # the job has ended, within its batch's window; kept as long as a batch's data at most.
                s3.LifecycleRule(
                    id="expire-provider-jobs",
                    prefix=PROVIDER_JOBS_INPUT_PREFIX.split("/")[0] + "/",
                    expiration=Duration.days(config.batches_expire_after_days),
                ),
            ],
            removal_policy=removal,
        )
