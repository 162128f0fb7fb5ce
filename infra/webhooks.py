"""Completion-webhook delivery: the queue (with its DLQ) the webhooks function consumes, and the KMS key
the accounts' signing secrets are sealed with.

The api, worker and sweeper send a message per batch ending; the webhooks function makes one attempt per
message and schedules the next one by sending a delayed message back to the same queue (SQS delays are at
most 15 min; a longer wait comes back early and waits again). A message that keeps failing its bookkeeping
is parked in the DLQ; the event stays pending in DynamoDB, so the sweeper's relay sends it again.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from batchinfer.catalog import webhook_queue_name
from infra.config import InfraConfig
from infra.queues import MAX_RECEIVE_COUNT


def webhook_dlq_name(stage: str) -> str:
    return webhook_queue_name(stage) + "-dlq"


def webhook_key_alias(stage: str) -> str:
    return f"alias/{stage}-batchinfer-webhooks"


class WebhookDelivery(Construct):
    """`<stage>-batchinfer--webhooks` (+ `-dlq`) and the signing secrets' key `alias/<stage>-batchinfer-webhooks`."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: InfraConfig, function_timeout: Duration
    ) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY

        # The signing secrets live sealed in the table: the key goes (or stays) with the data.
        self.key = kms.Key(
            self,
            "SecretsKey",
            description=f"batchinfer {config.stage}: seals the accounts' webhook signing secrets",
            enable_key_rotation=True,
            removal_policy=removal,
        )
        # For people and the CLI. The functions get the key's ARN, the resource their grants name, so
        # repointing the alias cannot make them seal with a key they may not open with. The alias itself
        # is not retained: a retained one would block re-creating the stack.
        self.alias = kms.Alias(
            self, "SecretsKeyAlias", alias_name=webhook_key_alias(config.stage), target_key=self.key
        )

        self.dlq = sqs.Queue(
            self,
            "Dlq",
            queue_name=webhook_dlq_name(config.stage),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
            removal_policy=removal,
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            queue_name=webhook_queue_name(config.stage),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            # As for the model queues: at least 6x the consuming function's timeout.
            visibility_timeout=Duration.seconds(6 * function_timeout.to_seconds()),
            retention_period=Duration.days(4),
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dlq, max_receive_count=MAX_RECEIVE_COUNT),
            removal_policy=removal,
        )
