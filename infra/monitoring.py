"""CloudWatch dashboard, alarms and the cost guard (AWS Budgets) for one stage.

Application metrics come from Powertools Metrics (EMF log lines) in the stage's namespace,
`config.metrics_namespace` (`batchinfer/<stage>`), which every function receives as
POWERTOOLS_METRICS_NAMESPACE: two stages in one account never feed each other's alarms. Powertools
always adds the `service` dimension, so a metric the worker emits with `model` is identified by
{service: batchinfer-worker, model: <id>}; the queries here use exactly that pair. Only the worker's per-model
metrics (RequestsCompleted, BackendErrors) carry `model`, in an EMF blob of their own; everything else a
function emits, the storage layer's counts included, is {service: batchinfer-<fn>}
(batchinfer.observability.metrics_with).
"""

from __future__ import annotations

import re

from aws_cdk import Aws, Duration
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
    METRIC_API_LATENCY,
    METRIC_BACKEND_ERRORS,
    METRIC_BACKGROUND_ITEM_FAILURES,
    METRIC_CONDITIONAL_CHECK_FAILURES,
    METRIC_REQUESTS_COMPLETED,
    METRIC_SWEEP_LAG,
    METRIC_TRANSACTION_CONFLICTS,
    METRIC_WEBHOOK_ATTEMPTS_FAILED,
    METRIC_WEBHOOK_DELIVERIES_FAILED,
    WORKER_METRICS_SERVICE,
    function_service_name,
)
from infra.api import HttpApiFront
from infra.config import InfraConfig
from infra.functions import SPECS, WORKER, ServiceFunctions
from infra.queues import MAX_RECEIVE_COUNT, ModelQueue, ModelQueues
from infra.storage import GLOBAL_INDEXES, Storage
from infra.webhooks import WebhookDelivery

# EMF metrics the worker emits per model (see the contract in docs/operations.md).
BACKEND_METRICS_SERVICE = WORKER_METRICS_SERVICE
# EMF metrics the webhooks function emits (attempts without a 2xx, events given up on).
WEBHOOKS_METRICS_SERVICE = function_service_name("webhooks")

# EMF metrics the api function emits (ApiLatency, per request but long polls).
API_METRICS_SERVICE = function_service_name("api")

# EMF metrics the sweeper emits (SweepLagSeconds, once per run).
SWEEPER_METRICS_SERVICE = function_service_name("sweeper")

# EMF metrics the storage layer emits from every function ({service: batchinfer-<fn>}): transactions
# DynamoDB cancelled for a conflict (METRIC_TRANSACTION_CONFLICTS, retried), and conditional writes that lost
# (METRIC_CONDITIONAL_CHECK_FAILURES, an answer, often expected).
STORAGE_METRICS_SERVICES = tuple(function_service_name(spec.name) for spec in SPECS)
# Per 5 minutes over all functions, for 15 minutes: starting points, to tune once a baseline is known
# (leases and claims lose conditions by design; a storm of them means contention or a loop).
TRANSACTION_CONFLICTS_ALARM = 50
CONDITIONAL_CHECK_FAILURES_ALARM = 500
# Items of a background loop (a batch's sweep step, a lease's recovery, a webhook relay or delivery, a model's
# claim) that raised, over every function: any in 2 of 3 five-minute periods. A broken item raises at every
# run (the sweeper runs every minute), so it alarms within 10 minutes; a one-off does not page.
BACKGROUND_ITEM_FAILURES_ALARM = 0
# The worker's p99 duration past this share of its timeout: the next slow backend makes it time out.
WORKER_DURATION_ALARM_SHARE = 0.8
# The sweeper runs every minute, so what it finds due is normally at most about a minute late; 10 minutes late
# in every 5 minutes for 15 minutes means it has fallen behind (or stopped finishing its runs).
SWEEP_LAG_ALARM_SECONDS = 10 * 60
# The operations the storage layer calls (batchinfer.storage.dynamo.Table): SystemErrors is per operation.
TABLE_OPERATIONS = (
    dynamodb.Operation.GET_ITEM,
    dynamodb.Operation.BATCH_GET_ITEM,
    dynamodb.Operation.PUT_ITEM,
    dynamodb.Operation.UPDATE_ITEM,
    dynamodb.Operation.DELETE_ITEM,
    dynamodb.Operation.QUERY,
    dynamodb.Operation.BATCH_WRITE_ITEM,
    dynamodb.Operation.TRANSACT_WRITE_ITEMS,
)
# Budget notifications: actual spend past 80% of the month's budget, forecast past 100%.
BUDGET_ACTUAL_PERCENT = 80
BUDGET_FORECAST_PERCENT = 100
# The cost allocation tag a stage's resources carry (stack.py) and the stage-scoped budget filters on.
COST_TAG = "batchinfer-stage"

QUEUE_AGE_ALARM_SECONDS = 15 * 60
BACKEND_ERROR_RATE_ALARM_PERCENT = 10
API_5XX_RATE_ALARM = 0.05
API_LATENCY_P99_ALARM = Duration.seconds(10)

FIVE_MINUTES = Duration.minutes(5)
ONE_MINUTE = Duration.minutes(1)
GT = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
LT = cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD
NOT_BREACHING = cloudwatch.TreatMissingData.NOT_BREACHING


def model_metric(
    namespace: str, model_id: str, metric_name: str, period: Duration = ONE_MINUTE
) -> cloudwatch.Metric:
    """An EMF metric the worker emits for one model (Sum per period)."""
    return cloudwatch.Metric(
        namespace=namespace,
        metric_name=metric_name,
        dimensions_map={"service": BACKEND_METRICS_SERVICE, "model": model_id},
        statistic=cloudwatch.Stats.SUM,
        period=period,
        label=f"{model_id} {metric_name}",
    )


def function_metric(namespace: str, metric_name: str, service: str, period: Duration = ONE_MINUTE,
                    statistic: str = cloudwatch.Stats.SUM, label: str | None = None) -> cloudwatch.Metric:
    """An EMF metric one function emits under its own `service` dimension (Sum per period unless told)."""
    return cloudwatch.Metric(namespace=namespace, metric_name=metric_name, dimensions_map={"service": service},
                             statistic=statistic, period=period, label=label)


def webhooks_metric(namespace: str, metric_name: str, period: Duration = ONE_MINUTE) -> cloudwatch.Metric:
    """An EMF metric the webhooks function emits (Sum per period)."""
    return function_metric(namespace, metric_name, WEBHOOKS_METRICS_SERVICE, period)


def api_latency_metric(namespace: str, statistic: str, period: Duration = FIVE_MINUTES,
                       label: str | None = None) -> cloudwatch.Metric:
    """The api function's own latency per request (ms), long polls (results pages held with `wait`) left out."""
    return function_metric(namespace, METRIC_API_LATENCY, API_METRICS_SERVICE, period, statistic, label)


def sweep_lag_metric(namespace: str, period: Duration = FIVE_MINUTES) -> cloudwatch.Metric:
    """How late the sweeper found its most overdue item (Maximum of its runs per period)."""
    return function_metric(namespace, METRIC_SWEEP_LAG, SWEEPER_METRICS_SERVICE, period, cloudwatch.Stats.MAXIMUM)


def storage_metric(
    namespace: str, metric_name: str, service: str, period: Duration = ONE_MINUTE
) -> cloudwatch.Metric:
    """An EMF metric the storage layer emits in one function (Sum per period)."""
    return function_metric(namespace, metric_name, service, period, label=service.removeprefix("batchinfer-"))


def storage_total(namespace: str, metric_name: str, period: Duration = FIVE_MINUTES) -> cloudwatch.MathExpression:
    """An EMF metric every function may emit under its own `service` (the storage layer's counts, the
    background loops' BackgroundItemFailures), summed over every function; no data counts as 0."""
    using = {
        f"m_{service.removeprefix('batchinfer-')}": storage_metric(namespace, metric_name, service, period)
        for service in STORAGE_METRICS_SERVICES
    }
    return cloudwatch.MathExpression(
        expression=" + ".join(f"FILL({key}, 0)" for key in using),
        using_metrics=using,
        period=period,
        label=f"{metric_name} (all functions)",
    )


def dynamodb_metric(
    table: dynamodb.ITable, metric_name: str, index: str | None = None, period: Duration = ONE_MINUTE
) -> cloudwatch.Metric:
    """An AWS/DynamoDB metric of the table, or of one of its GSIs (Sum per period)."""
    dimensions = {"TableName": table.table_name}
    if index:
        dimensions["GlobalSecondaryIndexName"] = index
    return cloudwatch.Metric(
        namespace="AWS/DynamoDB",
        metric_name=metric_name,
        dimensions_map=dimensions,
        statistic=cloudwatch.Stats.SUM,
        period=period,
        label=f"{index or 'table'} {metric_name}",
    )


def throttle_events(
    table: dynamodb.ITable, index: str | None = None, period: Duration = FIVE_MINUTES
) -> cloudwatch.MathExpression:
    """Read + write throttle events of the table or of one GSI (a throttled GSI also holds back the table's
    writes)."""
    return cloudwatch.MathExpression(
        expression="FILL(r, 0) + FILL(w, 0)",
        using_metrics={
            "r": dynamodb_metric(table, "ReadThrottleEvents", index, period),
            "w": dynamodb_metric(table, "WriteThrottleEvents", index, period),
        },
        period=period,
        label=f"{index or 'table'} throttle events",
    )


def backend_error_rate(
    namespace: str, model_id: str, period: Duration = FIVE_MINUTES
) -> cloudwatch.MathExpression:
    """Upstream error rate in percent: BackendErrors / (BackendErrors + RequestsCompleted)."""
    # Metric ids must be unique within one graph that shows several models.
    key = re.sub(r"[^a-z0-9_]", "_", model_id.lower())
    errors, completed = f"errors_{key}", f"completed_{key}"
    return cloudwatch.MathExpression(
        expression=f"IF(({errors} + {completed}) > 0, 100 * {errors} / ({errors} + {completed}), 0)",
        using_metrics={
            errors: model_metric(namespace, model_id, METRIC_BACKEND_ERRORS, period),
            completed: model_metric(namespace, model_id, METRIC_REQUESTS_COMPLETED, period),
        },
        period=period,
        label=f"{model_id} backend error %",
    )


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
        self.dashboard = self._dashboard(config, functions, queues, webhooks, api, storage, schedule_group)
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

    def _dashboard(
        self,
        config: InfraConfig,
        functions: ServiceFunctions,
        queues: ModelQueues,
        webhooks: WebhookDelivery,
        api: HttpApiFront,
        storage: Storage,
        schedule_group: scheduler.IScheduleGroup,
    ) -> cloudwatch.Dashboard:
        dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=self._prefix, default_interval=Duration.hours(3)
        )
        http = api.http_api
        fns = functions.functions
        dashboard.add_widgets(
            cloudwatch.TextWidget(
                markdown=f"# batchinfer `{config.stage}`\nAPI, functions, throughput and per-model queues. "
                "Alarms go to the stage's SNS alarm topic.",
                width=24,
                height=2,
            )
        )
        dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=self.alarms, width=24, height=4)
        )
        dashboard.add_widgets(
            _graph("API requests", [http.metric_count(period=ONE_MINUTE, statistic=cloudwatch.Stats.SUM)]),
            _graph(
                "API 4xx / 5xx",
                [
                    http.metric_client_error(period=ONE_MINUTE, statistic=cloudwatch.Stats.SUM),
                    http.metric_server_error(period=ONE_MINUTE, statistic=cloudwatch.Stats.SUM),
                ],
            ),
            _graph(
                "API latency (ms)",
                [
                    http.metric_latency(period=ONE_MINUTE, statistic=cloudwatch.Stats.percentile(50)),
                    http.metric_latency(period=ONE_MINUTE, statistic=cloudwatch.Stats.percentile(99)),
                    http.metric_integration_latency(
                        period=ONE_MINUTE, statistic=cloudwatch.Stats.percentile(99)
                    ),
                    api_latency_metric(self._namespace, cloudwatch.Stats.percentile(99), ONE_MINUTE,
                                       label="api function p99, long polls left out"),
                ],
            ),
        )
        dashboard.add_widgets(
            _graph(
                "Function errors", [_labelled(f.metric_errors(period=ONE_MINUTE), n) for n, f in fns.items()]
            ),
            _graph(
                "Function throttles",
                [_labelled(f.metric_throttles(period=ONE_MINUTE), n) for n, f in fns.items()],
            ),
            _graph(
                "Function duration p99 (ms)",
                [
                    _labelled(
                        f.metric_duration(period=ONE_MINUTE, statistic=cloudwatch.Stats.percentile(99)), n
                    )
                    for n, f in fns.items()
                ],
            ),
            _graph(
                "Worker concurrency",
                [
                    cloudwatch.Metric(
                        namespace="AWS/Lambda",
                        metric_name="ConcurrentExecutions",
                        dimensions_map={"FunctionName": functions.worker.function_name},
                        statistic=cloudwatch.Stats.MAXIMUM,
                        period=ONE_MINUTE,
                        label="worker",
                    )
                ],
            ),
        )
        timeout_ms = WORKER.timeout.to_milliseconds()
        dashboard.add_widgets(
            _graph(
                "Worker duration vs timeout (ms)",
                [
                    functions.worker.metric_duration(period=ONE_MINUTE, statistic=cloudwatch.Stats.percentile(99)),
                    functions.worker.metric_duration(period=ONE_MINUTE, statistic=cloudwatch.Stats.MAXIMUM),
                ],
                width=8,
                horizontal=[
                    cloudwatch.HorizontalAnnotation(value=WORKER_DURATION_ALARM_SHARE * timeout_ms, label="alarm"),
                    cloudwatch.HorizontalAnnotation(value=timeout_ms, label="timeout"),
                ],
            ),
            _graph(
                "Scheduler ticks",
                [
                    schedule_group.metric_attempts(period=ONE_MINUTE, label="attempts"),
                    schedule_group.metric_dropped(period=ONE_MINUTE, label="dropped"),
                    schedule_group.metric_target_errors(period=ONE_MINUTE, label="target errors"),
                ],
                width=8,
            ),
            _graph(
                "Sweeper lag: most overdue item (s)",
                [_labelled(sweep_lag_metric(self._namespace, ONE_MINUTE), "most overdue item (s)")],
                width=8,
                horizontal=[cloudwatch.HorizontalAnnotation(value=SWEEP_LAG_ALARM_SECONDS, label="alarm")],
            ),
        )
        dashboard.add_widgets(
            _graph(
                "Transaction conflicts / min",
                [storage_metric(self._namespace, METRIC_TRANSACTION_CONFLICTS, s) for s in STORAGE_METRICS_SERVICES],
                width=12,
                stacked=True,
            ),
            _graph(
                "Conditional-check failures / min",
                [
                    storage_metric(self._namespace, METRIC_CONDITIONAL_CHECK_FAILURES, s)
                    for s in STORAGE_METRICS_SERVICES
                ],
                width=12,
                stacked=True,
            ),
        )
        dashboard.add_widgets(
            _graph(
                "Background items that raised / min (passed over)",
                [
                    storage_metric(self._namespace, METRIC_BACKGROUND_ITEM_FAILURES, s)
                    for s in STORAGE_METRICS_SERVICES
                ],
                width=24,
                stacked=True,
            ),
        )
        table = storage.table
        dashboard.add_widgets(
            _graph(
                "DynamoDB throttle events (table, GSIs)",
                [
                    dynamodb_metric(table, name, index)
                    for index in (None, *GLOBAL_INDEXES)
                    for name in ("ReadThrottleEvents", "WriteThrottleEvents")
                ],
                width=12,
            ),
            _graph(
                "DynamoDB system errors",
                [table.metric_system_errors_for_operations(operations=list(TABLE_OPERATIONS), period=ONE_MINUTE)],
                width=6,
            ),
            _graph(
                "DynamoDB consumed capacity",
                [
                    table.metric_consumed_read_capacity_units(period=ONE_MINUTE, statistic=cloudwatch.Stats.SUM),
                    table.metric_consumed_write_capacity_units(period=ONE_MINUTE, statistic=cloudwatch.Stats.SUM),
                ],
                width=6,
            ),
        )
        ns = self._namespace
        model_ids = list(queues.by_model)
        dashboard.add_widgets(
            _graph(
                "Batch requests completed / min",
                [model_metric(ns, m, METRIC_REQUESTS_COMPLETED) for m in model_ids],
                width=8,
                stacked=True,
            ),
            _graph(
                "Backend errors / min", [model_metric(ns, m, METRIC_BACKEND_ERRORS) for m in model_ids], width=8
            ),
            _graph("Backend error rate (%)", [backend_error_rate(ns, m) for m in model_ids], width=8),
        )
        for entry in queues.by_model.values():
            dashboard.add_widgets(*_queue_widgets(entry))
        dashboard.add_widgets(*_webhook_widgets(ns, webhooks))
        return dashboard


def _queue_widgets(entry: ModelQueue) -> list[cloudwatch.IWidget]:
    model_id, queue, dlq = entry.model.model_id, entry.queue, entry.dlq
    return [
        _graph(
            f"{model_id}: queue depth",
            [
                queue.metric_approximate_number_of_messages_visible(period=ONE_MINUTE, label="waiting"),
                queue.metric_approximate_number_of_messages_not_visible(period=ONE_MINUTE, label="in flight"),
            ],
            width=8,
        ),
        _graph(
            f"{model_id}: oldest message age (s)",
            [
                queue.metric_approximate_age_of_oldest_message(
                    period=ONE_MINUTE, statistic=cloudwatch.Stats.MAXIMUM
                )
            ],
            width=8,
            horizontal=[cloudwatch.HorizontalAnnotation(value=QUEUE_AGE_ALARM_SECONDS, label="alarm")],
        ),
        _graph(
            f"{model_id}: DLQ depth",
            [
                dlq.metric_approximate_number_of_messages_visible(
                    period=ONE_MINUTE, statistic=cloudwatch.Stats.MAXIMUM
                )
            ],
            width=8,
        ),
    ]


def _webhook_widgets(namespace: str, webhooks: WebhookDelivery) -> list[cloudwatch.IWidget]:
    queue, dlq = webhooks.queue, webhooks.dlq
    return [
        _graph(
            "Webhooks: attempts / deliveries failed",
            [
                webhooks_metric(namespace, METRIC_WEBHOOK_ATTEMPTS_FAILED),
                webhooks_metric(namespace, METRIC_WEBHOOK_DELIVERIES_FAILED),
            ],
            width=8,
        ),
        _graph(
            "Webhooks: delivery queue depth",
            [
                queue.metric_approximate_number_of_messages_visible(period=ONE_MINUTE, label="due"),
                # Retries wait as delayed messages.
                queue.metric_approximate_number_of_messages_delayed(period=ONE_MINUTE, label="retries waiting"),
                queue.metric_approximate_number_of_messages_not_visible(period=ONE_MINUTE, label="in flight"),
            ],
            width=8,
        ),
        _graph(
            "Webhooks: DLQ depth",
            [
                dlq.metric_approximate_number_of_messages_visible(
                    period=ONE_MINUTE, statistic=cloudwatch.Stats.MAXIMUM
                )
            ],
            width=8,
        ),
    ]


def _labelled(metric: cloudwatch.Metric, label: str) -> cloudwatch.Metric:
    return metric.with_(label=label, statistic=metric.statistic)


def _graph(
    title: str,
    metrics: list[cloudwatch.IMetric],
    *,
    width: int = 6,
    stacked: bool = False,
    horizontal: list[cloudwatch.HorizontalAnnotation] | None = None,
) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(
        title=title,
        left=metrics,
        width=width,
        height=6,
        stacked=stacked,
        left_annotations=horizontal or None,
    )
