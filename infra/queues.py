"""Per-model SQS queues (with dead-letter queues) and backend key secrets, generated from the catalog."""

from __future__ import annotations

import json
from dataclasses import dataclass

from aws_cdk import Duration, RemovalPolicy, SecretValue
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from batchinfer.catalog import SECRET_PLACEHOLDER
from infra.config import CatalogModel, InfraConfig
from infra.nag import acknowledge

# A message that fails this many receives is parked in the DLQ; the sweeper's lease recovery still sees
# the request in DynamoDB, so nothing is lost by parking it.
MAX_RECEIVE_COUNT = 5


@dataclass(frozen=True)
class ModelQueue:
    model: CatalogModel
    queue: sqs.Queue
    dlq: sqs.Queue


class ModelQueues(Construct):
    """One queue + DLQ per non-auto model: `<stage>-batchinfer-<slug>` and `...-dlq`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: InfraConfig,
        models: tuple[CatalogModel, ...],
        worker_timeout: Duration,
    ) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY
        # AWS's guidance for SQS event sources: visibility timeout at least 6x the function timeout, so
        # a message is not redelivered while the throttled/retried invocation still holds it.
        visibility = Duration.seconds(6 * worker_timeout.to_seconds())
        self.by_model: dict[str, ModelQueue] = {}
        for model in models:
            group = Construct(self, model.slug)
            dlq = sqs.Queue(
                group,
                "Dlq",
                queue_name=model.dlq_name(config.stage),
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
                retention_period=Duration.days(14),
                removal_policy=removal,
            )
            queue = sqs.Queue(
                group,
                "Queue",
                queue_name=model.queue_name(config.stage),
                encryption=sqs.QueueEncryption.SQS_MANAGED,
                enforce_ssl=True,
                visibility_timeout=visibility,
                retention_period=Duration.days(4),
                dead_letter_queue=sqs.DeadLetterQueue(queue=dlq, max_receive_count=MAX_RECEIVE_COUNT),
                removal_policy=removal,
            )
            self.by_model[model.model_id] = ModelQueue(model=model, queue=queue, dlq=dlq)

    @property
    def queues(self) -> list[sqs.Queue]:
        return [entry.queue for entry in self.by_model.values()]

    def queue_urls_json(self) -> str:
        """MODEL_QUEUES: {model_id: queue_url} (URLs are tokens, resolved by CloudFormation)."""
        return json.dumps({model_id: entry.queue.queue_url for model_id, entry in self.by_model.items()})


class ModelSecrets(Construct):
    """A Secrets Manager secret per model whose catalog entry names a backend key.

    The secret starts with a random placeholder (CloudFormation never holds the real key); the operator
    puts the real key with `aws secretsmanager put-secret-value`, and later deploys leave it alone.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, config: InfraConfig, models: tuple[CatalogModel, ...]
    ) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if config.retain_data else RemovalPolicy.DESTROY
        self.by_model: dict[str, secretsmanager.Secret] = {}
        for model in models:
            if not model.needs_secret:
                continue
            secret = secretsmanager.Secret(
                self,
                model.slug,
                secret_name=model.secret_name(config.stage),
                description=f"Backend API key for model {model.model_id} (replace the placeholder)",
                # A placeholder the worker recognises (and never sends as a key): the model's requests fail
                # as unavailable until the operator puts the real key.
                secret_string_value=SecretValue.unsafe_plain_text(SECRET_PLACEHOLDER),
                removal_policy=removal,
            )
            acknowledge(
                secret,
                "AwsSolutions-SMG4",
                "Backend API keys are issued by the model provider; they are rotated there and put here by "
                "the operator, so a Secrets Manager rotation Lambda has nothing to rotate.",
            )
            self.by_model[model.model_id] = secret

    @property
    def secrets(self) -> list[secretsmanager.Secret]:
        return list(self.by_model.values())

    def secret_arns_json(self) -> str:
        """MODEL_SECRETS: {model_id: secret_arn}."""
        return json.dumps({model_id: secret.secret_arn for model_id, secret in self.by_model.items()})
