"""EventBridge Scheduler ticks for the dispatcher and the sweeper.

Scheduler rather than Step Functions: each tick is one invocation that loops inside itself (~55 s for
the dispatcher), so there is no multi-step workflow to orchestrate; a state machine would only add a
Wait/loop whose state transitions cost money every second, and a second place for the loop logic.
Concurrency safety lives in DynamoDB (leases, conditional writes), not in the trigger, so an overlapping
or missed tick is harmless.
"""

from __future__ import annotations

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as targets
from constructs import Construct

from infra.config import InfraConfig
from infra.nag import acknowledge, nag_ref

TICK = Duration.minutes(1)


class Schedules(Construct):
    """One `rate(1 minute)` schedule per scheduled function, in the stage's own schedule group (so that the
    Scheduler's metrics, per group, are the stage's alone: monitoring alarms on them)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: InfraConfig,
        dispatcher: lambda_.IFunction,
        sweeper: lambda_.IFunction,
    ) -> None:
        super().__init__(scope, construct_id)
        self.group = scheduler.ScheduleGroup(
            self,
            "Group",
            schedule_group_name=f"{config.stage}-batchinfer",
            # Holds only the two schedules, which the stack recreates: nothing to keep.
            removal_policy=RemovalPolicy.DESTROY,
        )
        # One role for both targets, so its acknowledgment sits next to it rather than on CDK's singleton.
        self.role = iam.Role(
            self,
            "InvokeRole",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}
            ),
            description=f"batchinfer {config.stage}: EventBridge Scheduler invokes dispatcher and sweeper",
        )
        self.dispatcher = self._every_minute("Dispatcher", config, dispatcher, "dispatch due batch requests")
        self.sweeper = self._every_minute(
            "Sweeper", config, sweeper, "expire, finalize, retain, recover leases"
        )
        for function in (dispatcher, sweeper):
            acknowledge(
                self.role,
                f"AwsSolutions-IAM5[Resource::{nag_ref(function)}:*]",
                "grantInvoke also covers the function's versions and aliases (ARN:*); one function only.",
            )

    def _every_minute(
        self, construct_id: str, config: InfraConfig, function: lambda_.IFunction, what: str
    ) -> scheduler.Schedule:
        return scheduler.Schedule(
            self,
            construct_id,
            schedule=scheduler.ScheduleExpression.rate(TICK),
            description=f"batchinfer {config.stage}: {what}",
            schedule_group=self.group,
            # A late tick is useless: the next one is a minute away. No retries, drop after a minute.
            target=targets.LambdaInvoke(
                function, role=self.role, retry_attempts=0, max_event_age=Duration.minutes(1)
            ),
        )
