"""CloudWatch dashboard, alarms and the cost guard (AWS Budgets) for one stage.

Application metrics come from Powertools Metrics (EMF log lines) in the stage's namespace,
`config.metrics_namespace` (`batchinfer/<stage>`), which every function receives as
POWERTOOLS_METRICS_NAMESPACE: two stages in one account never feed each other's alarms. Powertools
always adds the `service` dimension, so a metric the worker emits with `model` is identified by
{service: batchinfer-worker, model: <id>}; the queries here use exactly that pair. Only the worker's per-model
metrics (RequestsCompleted, BackendErrors) carry `model`, in an EMF blob of their own; everything else a
function emits, the storage layer's counts included, is {service: batchinfer-<fn>}
(batchinfer.observability.metrics_with).

The metrics themselves are built in infra.metrics, the dashboard in infra.dashboard.
"""

from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_budgets as budgets
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from batchinfer.catalog import (
    METRIC_BACKGROUND_ITEM_FAILURES,
    METRIC_CONDITIONAL_CHECK_FAILURES,
    METRIC_TRANSACTION_CONFLICTS,
    METRIC_WEBHOOK_DELIVERIES_FAILED,
)
from infra.api import HttpApiFront
from infra.config import InfraConfig
from infra.dashboard import stage_dashboard
from infra.functions import WORKER, ServiceFunctions
from infra.metrics import (
    API_5XX_RATE_ALARM,
    API_LATENCY_P99_ALARM,
    BACKEND_ERROR_RATE_ALARM_PERCENT,
    BACKGROUND_ITEM_FAILURES_ALARM,
    CONDITIONAL_CHECK_FAILURES_ALARM,
    FIVE_MINUTES,
    QUEUE_AGE_ALARM_SECONDS,
    SWEEP_LAG_ALARM_SECONDS,
    TABLE_OPERATIONS,
    TRANSACTION_CONFLICTS_ALARM,
    WORKER_DURATION_ALARM_SHARE,
    api_latency_metric,
    backend_error_rate,
    storage_total,
    sweep_lag_metric,
    throttle_events,
    webhooks_metric,
)
from infra.queues import MAX_RECEIVE_COUNT, ModelQueues
from infra.storage import GLOBAL_INDEXES, Storage
from infra.webhooks import WebhookDelivery

# Budget notifications: actual spend past 80% of the month's budget, forecast past 100%.
BUDGET_ACTUAL_PERCENT = 80
BUDGET_FORECAST_PERCENT = 100
# The cost allocation tag a stage's resources carry (stack.py) and the stage-scoped budget filters on.
COST_TAG = "batchinfer-stage"


GT = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
LT = cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD
NOT_BREACHING = cloudwatch.TreatMissingData.NOT_BREACHING


class Monitoring(Construct):
    """Alarm topic (own or imported), alarms, the stage dashboard and the monthly cost budget."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: InfraConfig,
        functions: ServiceFunctions,
        queues: ModelQueues,
        webhooks: WebhookDelivery,
        api: HttpApiFront,
        storage: Storage,
        schedule_group: scheduler.IScheduleGroup,
    ) -> None:
        super().__init__(scope, construct_id)
        self._prefix = f"{config.stage}-batchinfer"
        self._namespace = config.metrics_namespace
        self.alarms: list[cloudwatch.Alarm] = []

        self.topic: sns.ITopic
        if config.alarm_topic_arn:
            # An existing topic (e.g. the team's paging topic); its policy must let CloudWatch and, for the
            # budget, budgets.amazonaws.com publish (docs/operations.md).
            self.topic = sns.Topic.from_topic_arn(self, "AlarmTopic", config.alarm_topic_arn)
        else:
            # No SSE on the topic: CloudWatch alarms cannot publish to one encrypted with the AWS-managed SNS
            # key, and alarm messages carry alarm state only, never customer data.
            topic = sns.Topic(
                self, "AlarmTopic", display_name=f"batchinfer {config.stage} alarms", enforce_ssl=True
            )
            # The budget notifies through the same topic.
            topic.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="BudgetsPublish",
                    actions=["sns:Publish"],
                    principals=[iam.ServicePrincipal("budgets.amazonaws.com")],
                    resources=[topic.topic_arn],
                    conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}},
                )
            )
            self.topic = topic
        if config.alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(config.alarm_email))
        self._action = cw_actions.SnsAction(self.topic)

        self._queue_alarms(queues)
        self._webhook_alarms(webhooks)
        self._function_alarms(functions)
        self._api_alarms(api)
        self._table_alarms(storage.table)
        self._schedule_alarms(schedule_group)
        self.dashboard = stage_dashboard(
            self,
            prefix=self._prefix,
            namespace=self._namespace,
            alarms=self.alarms,
            config=config,
            functions=functions,
            queues=queues,
            webhooks=webhooks,
            api=api,
            storage=storage,
            schedule_group=schedule_group,
        )
        self.budget = self._budget(config) if config.monthly_budget_usd else None

    # -- alarms ---------------------------------------------------------------------------------------

    def _alarm(
        self,
        construct_id: str,
        *,
        metric: cloudwatch.IMetric,
        threshold: float,
        description: str,
        comparison: cloudwatch.ComparisonOperator = GT,
        evaluation_periods: int = 1,
        datapoints_to_alarm: int | None = None,
        treat_missing_data: cloudwatch.TreatMissingData = NOT_BREACHING,
    ) -> cloudwatch.Alarm:
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            alarm_name=f"{self._prefix}-{construct_id}",
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints_to_alarm,
            treat_missing_data=treat_missing_data,
        )
        alarm.add_alarm_action(self._action)
        alarm.add_ok_action(self._action)
        self.alarms.append(alarm)
        return alarm

    def _queue_alarms(self, queues: ModelQueues) -> None:
        for model_id, entry in queues.by_model.items():
            slug = entry.model.slug
            self._alarm(
                f"{slug}-queue-age",
                metric=entry.queue.metric_approximate_age_of_oldest_message(
                    period=FIVE_MINUTES, statistic=cloudwatch.Stats.MAXIMUM
                ),
                threshold=QUEUE_AGE_ALARM_SECONDS,
                description=f"{model_id}: a dispatched request has waited over 15 min for a worker.",
            )
            self._alarm(
                f"{slug}-dlq-depth",
                metric=entry.dlq.metric_approximate_number_of_messages_visible(
                    period=FIVE_MINUTES, statistic=cloudwatch.Stats.MAXIMUM
                ),
                threshold=0,
                description=f"{model_id}: messages failed {MAX_RECEIVE_COUNT} receives and sit in the DLQ.",
            )
            self._alarm(
                f"{slug}-backend-error-rate",
                metric=backend_error_rate(self._namespace, model_id),
                threshold=BACKEND_ERROR_RATE_ALARM_PERCENT,
                evaluation_periods=3,
                description=f"{model_id}: over {BACKEND_ERROR_RATE_ALARM_PERCENT}% of backend calls failed "
                "for 15 min.",
            )

    def _webhook_alarms(self, webhooks: WebhookDelivery) -> None:
        self._alarm(
            "webhooks-dlq-depth",
            metric=webhooks.dlq.metric_approximate_number_of_messages_visible(
                period=FIVE_MINUTES, statistic=cloudwatch.Stats.MAXIMUM
            ),
            threshold=0,
            description=f"Webhook deliveries failed {MAX_RECEIVE_COUNT} receives and sit in the DLQ (the "
            "sweeper re-sends their events, but the webhooks function keeps failing on them).",
        )
        self._alarm(
            "webhooks-deliveries-failed",
            metric=webhooks_metric(self._namespace, METRIC_WEBHOOK_DELIVERIES_FAILED, FIVE_MINUTES),
            threshold=0,
            description="Webhook events were given up on: every attempt failed, the receiver was not told.",
        )

    def _function_alarms(self, functions: ServiceFunctions) -> None:
        for name, function in functions.functions.items():
            self._alarm(
                f"{name}-errors",
                metric=function.metric_errors(period=FIVE_MINUTES, statistic=cloudwatch.Stats.SUM),
                threshold=0,
                description=f"{name}: invocations failed (crash, timeout); failed SQS records alone are not.",
            )
            self._alarm(
                f"{name}-throttles",
                metric=function.metric_throttles(period=FIVE_MINUTES, statistic=cloudwatch.Stats.SUM),
                threshold=0,
                description=f"{name}: invocations were throttled (account or reserved concurrency).",
            )
        for name in ("dispatcher", "sweeper"):
            self._alarm(
                f"{name}-not-running",
                metric=functions.functions[name].metric_invocations(
                    period=FIVE_MINUTES, statistic=cloudwatch.Stats.SUM
                ),
                threshold=1,
                comparison=LT,
                evaluation_periods=2,
                treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
                description=f"{name}: no invocation for 10 min; its schedule is not firing.",
            )
        self._alarm(
            "sweeper-lag",
            metric=sweep_lag_metric(self._namespace),
            threshold=SWEEP_LAG_ALARM_SECONDS,
            evaluation_periods=3,
            # Every run that gets going emits it (0 when nothing is overdue): none for 5 min means the runs do
            # not get that far (failing, timing out, not invoked), which is falling behind too.
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
            description=f"sweeper: its runs found work over {SWEEP_LAG_ALARM_SECONDS // 60} min overdue (expired "
            "leases, webhook relays, batches to expire), or emitted no lag, for 15 min: requests are not "
            "recovered, webhooks not re-sent, batches not ended.",
        )
        timeout_ms = WORKER.timeout.to_milliseconds()
        self._alarm(
            "worker-duration-p99",
            metric=functions.worker.metric_duration(
                period=FIVE_MINUTES, statistic=cloudwatch.Stats.percentile(99)
            ),
            threshold=WORKER_DURATION_ALARM_SHARE * timeout_ms,
            evaluation_periods=3,
            description=f"worker: p99 duration above {WORKER_DURATION_ALARM_SHARE:.0%} of its "
            f"{timeout_ms // 1000} s timeout for 15 min; slow backends are about to time invocations out.",
        )
        self._alarm(
            "background-item-failures",
            metric=storage_total(self._namespace, METRIC_BACKGROUND_ITEM_FAILURES),
            threshold=BACKGROUND_ITEM_FAILURES_ALARM,
            evaluation_periods=3,
            datapoints_to_alarm=2,
            description="An item of a background loop raised in 2 of 15 min (logged with the item's id and step: "
            "search the functions' logs for 'batchinfer.background'). The loops passed over it and went on; a "
            "batch whose sweep keeps raising ends failed with internal_error (docs/operations.md).",
        )
        for alarm_id, metric_name, threshold, what in (
            (
                "transaction-conflicts",
                METRIC_TRANSACTION_CONFLICTS,
                TRANSACTION_CONFLICTS_ALARM,
                "DynamoDB transactions were cancelled for conflicts (retried; hot items)",
            ),
            (
                "condition-failures",
                METRIC_CONDITIONAL_CHECK_FAILURES,
                CONDITIONAL_CHECK_FAILURES_ALARM,
                "conditional writes lost (leases, claims: contention or a retry loop)",
            ),
        ):
            self._alarm(
                alarm_id,
                metric=storage_total(self._namespace, metric_name),
                threshold=threshold,
                evaluation_periods=3,
                description=f"Over {threshold} per 5 min for 15 min: {what}.",
            )

    def _table_alarms(self, table: dynamodb.ITable) -> None:
        self._alarm(
            "table-throttles",
            metric=throttle_events(table),
            threshold=0,
            evaluation_periods=3,
            datapoints_to_alarm=2,
            description="DynamoDB throttled reads or writes of the table in 2 of 15 min (retried by the "
            "storage layer; sustained, work slows down). On demand: a hot partition or the table's limits.",
        )
        for index in GLOBAL_INDEXES:
            self._alarm(
                f"gsi-{index.replace('_', '-')}-throttles",
                metric=throttle_events(table, index),
                threshold=0,
                evaluation_periods=3,
                datapoints_to_alarm=2,
                description=f"DynamoDB throttled the GSI {index} in 2 of 15 min; a throttled GSI also holds "
                "back writes to the table.",
            )
        self._alarm(
            "table-system-errors",
            metric=table.metric_system_errors_for_operations(
                operations=list(TABLE_OPERATIONS), period=FIVE_MINUTES
            ),
            threshold=0,
            evaluation_periods=3,
            datapoints_to_alarm=2,
            description="DynamoDB answered requests with internal errors (HTTP 500) in 2 of 15 min: an AWS "
            "side problem; check the AWS Health Dashboard.",
        )

    def _schedule_alarms(self, group: scheduler.IScheduleGroup) -> None:
        self._alarm(
            "schedules-dropped",
            metric=group.metric_dropped(period=FIVE_MINUTES),
            threshold=0,
            description="EventBridge Scheduler dropped ticks of the dispatcher or sweeper (no retries: a tick "
            "it could not deliver within a minute is gone).",
        )
        self._alarm(
            "schedules-target-errors",
            metric=group.metric_target_errors(period=FIVE_MINUTES),
            threshold=0,
            evaluation_periods=2,
            description="EventBridge Scheduler could not invoke the dispatcher or sweeper for 10 min (role, "
            "function missing, throttled).",
        )

    def _api_alarms(self, api: HttpApiFront) -> None:
        self._alarm(
            "api-5xx-rate",
            # Average of the 0/1 `5xx` metric per request is the 5xx rate.
            metric=api.http_api.metric_server_error(period=FIVE_MINUTES, statistic=cloudwatch.Stats.AVERAGE),
            threshold=API_5XX_RATE_ALARM,
            evaluation_periods=3,
            description="API: over 5% of requests answered 5xx for 15 min.",
        )
        self._alarm(
            "api-latency-p99",
            # The app's own timing, not API Gateway's Latency: a long poll is held up to 25 s by design, and
            # counted it would set this off on a healthy service whose clients follow their batches.
            metric=api_latency_metric(self._namespace, cloudwatch.Stats.percentile(99)),
            threshold=API_LATENCY_P99_ALARM.to_milliseconds(),
            evaluation_periods=3,
            description="API: p99 latency of requests other than long polls above 10 s for 15 min (the "
            "integration timeout is 30 s).",
        )

    # -- cost ----------------------------------------------------------------------------------------

    def _budget(self, config: InfraConfig) -> budgets.CfnBudget:
        """A monthly cost budget: notify at 80% of actual spend and at 100% forecast."""
        assert config.monthly_budget_usd is not None
        subscribers = [budgets.CfnBudget.SubscriberProperty(address=self.topic.topic_arn, subscription_type="SNS")]
        if config.alarm_email:
            subscribers.append(
                budgets.CfnBudget.SubscriberProperty(address=config.alarm_email, subscription_type="EMAIL")
            )
        notifications = [
            budgets.CfnBudget.NotificationWithSubscribersProperty(
                notification=budgets.CfnBudget.NotificationProperty(
                    comparison_operator="GREATER_THAN",
                    notification_type=kind,
                    threshold=percent,
                    threshold_type="PERCENTAGE",
                ),
                subscribers=subscribers,
            )
            for kind, percent in (("ACTUAL", BUDGET_ACTUAL_PERCENT), ("FORECASTED", BUDGET_FORECAST_PERCENT))
        ]
        cost_filters = (
            {"TagKeyValue": [f"user:{COST_TAG}${config.stage}"]} if config.monthly_budget_scope == "stage" else None
        )
        return budgets.CfnBudget(
            self,
            "MonthlyBudget",
            budget=budgets.CfnBudget.BudgetDataProperty(
                budget_name=f"{self._prefix}-monthly",
                budget_type="COST",
                time_unit="MONTHLY",
                budget_limit=budgets.CfnBudget.SpendProperty(amount=config.monthly_budget_usd, unit="USD"),
                cost_filters=cost_filters,
            ),
            notifications_with_subscribers=notifications,
        )

    # -- dashboard ------------------------------------------------------------------------------------
