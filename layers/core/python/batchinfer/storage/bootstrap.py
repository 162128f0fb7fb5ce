"""Creates the table, bucket and queues for the local stack and tests (CDK does it on AWS)."""

from __future__ import annotations

from botocore.exceptions import ClientError

# The catalog module names queues for the CDK stack too: the local stack must create the very same names.
from ..catalog import queue_name, queue_slugs, webhook_queue_name
from ..layout import INDEX_PROJECTIONS
from ..layout import INDEXES as GSIS


def _projection(index: str) -> dict:
    """An index's Projection as layout.INDEX_PROJECTIONS has it (the CDK stack reads the same)."""
    kind, attributes = INDEX_PROJECTIONS[index]
    return {"ProjectionType": kind, **({"NonKeyAttributes": list(attributes)} if attributes else {})}


def create_table(ddb, name: str) -> None:
    attrs = {"pk": "S", "sk": "S"}
    for (hk, ht), (rk, rt) in GSIS.values():
        attrs[hk], attrs[rk] = ht, rt
    try:
        ddb.create_table(
            TableName=name, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": k, "AttributeType": t} for k, t in attrs.items()],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            GlobalSecondaryIndexes=[
                {"IndexName": n, "Projection": _projection(n),
                 "KeySchema": [{"AttributeName": h[0], "KeyType": "HASH"}, {"AttributeName": r[0], "KeyType": "RANGE"}]}
                for n, (h, r) in GSIS.items()
            ],
        )
    except ClientError as error:
        if error.response["Error"]["Code"] != "ResourceInUseException":
            raise


def create_bucket(s3, name: str) -> None:
    try:
        s3.create_bucket(Bucket=name)
    except ClientError as error:
        if error.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


def create_queues(sqs, stage: str, model_ids: list[str], visibility_seconds: int = 600) -> dict[str, str]:
    queue_slugs(stage, model_ids)  # refuses two models on one queue name, as the CDK app does
    urls = {}
    for model_id in model_ids:
        answer = sqs.create_queue(QueueName=queue_name(stage, model_id),
                                  Attributes={"VisibilityTimeout": str(visibility_seconds)})
        urls[model_id] = answer["QueueUrl"]
    return urls


def create_webhook_queue(sqs, stage: str) -> str:
    """The queue webhook deliveries are sent from (retries come back to it with a delay)."""
    return sqs.create_queue(QueueName=webhook_queue_name(stage), Attributes={"VisibilityTimeout": "60"})["QueueUrl"]


def create_webhook_key(kms, alias: str) -> str:
    """The key webhook signing secrets are encrypted with, created once under `alias` (CDK makes the
    deployed one)."""
    for entry in kms.list_aliases().get("Aliases", []):
        if entry["AliasName"] == alias and entry.get("TargetKeyId"):
            return alias
    key_id = kms.create_key(Description="webhook signing secrets")["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName=alias, TargetKeyId=key_id)
    return alias
