"""CloudWatch dashboard and alarms for one stage.

Application metrics come from Powertools Metrics (EMF log lines) in `batchinfer.catalog.METRICS_NAMESPACE`, the
constant `batchinfer.observability` emits with, so the dashboard cannot drift from the functions. Powertools
always adds the `service` dimension, so a metric the worker emits with `model` is identified by
{service: batchinfer-worker, model: <id>}; the queries here use exactly that pair. The webhooks function's
metrics carry no dimension of their own: {service: batchinfer-webhooks}.
"""

from __future__ import annotations

import re

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from batchinfer.catalog import (
    METRIC_BACKEND_ERRORS,
    METRIC_REQUESTS_COMPLETED,
    METRIC_WEBHOOK_ATTEMPTS_FAILED,
    METRIC_WEBHOOK_DELIVERIES_FAILED,
    METRICS_NAMESPACE,
    WORKER_METRICS_SERVICE,
    function_service_name,
)
from infra.api import HttpApiFront
from infra.config import InfraConfig
from infra.functions import ServiceFunctions
from infra.queues import MAX_RECEIVE_COUNT, ModelQueue, ModelQueues
from infra.webhooks import WebhookDelivery

# EMF metrics the worker emits per model (see the contract in docs/operations.md).
BACKEND_METRICS_SERVICE = WORKER_METRICS_SERVICE
# EMF metrics the webhooks function emits (attempts without a 2xx, events given up on).
WEBHOOKS_METRICS_SERVICE = function_service_name("webhooks")

QUEUE_AGE_ALARM_SECONDS = 15 * 60
BACKEND_ERROR_RATE_ALARM_PERCENT = 10
API_5XX_RATE_ALARM = 0.05
API_LATENCY_P99_ALARM = Duration.seconds(10)

FIVE_MINUTES = Duration.minutes(5)
ONE_MINUTE = Duration.minutes(1)
GT = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
LT = cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD
NOT_BREACHING = cloudwatch.TreatMissingData.NOT_BREACHING


def model_metric(model_id: str, metric_name: str, period: Duration = ONE_MINUTE) -> cloudwatch.Metric:
    """An EMF metric the worker emits for one model (Sum per period)."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=metric_name,
        dimensions_map={"service": BACKEND_METRICS_SERVICE, "model": model_id},
        statistic=cloudwatch.Stats.SUM,
        period=period,
        label=f"{model_id} {metric_name}",
    )


def webhooks_metric(metric_name: str, period: Duration = ONE_MINUTE) -> cloudwatch.Metric:
    """An EMF metric the webhooks function emits (Sum per period)."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=metric_name,
        dimensions_map={"service": WEBHOOKS_METRICS_SERVICE},
        statistic=cloudwatch.Stats.SUM,
        period=period,
    )


def backend_error_rate(model_id: str, period: Duration = FIVE_MINUTES) -> cloudwatch.MathExpression:
    """Upstream error rate in percent: BackendErrors / (BackendErrors + RequestsCompleted)."""
    # Metric ids must be unique within one graph that shows several models.
    key = re.sub(r"[^a-z0-9_]", "_", model_id.lower())
    errors, completed = f"errors_{key}", f"completed_{key}"
    return cloudwatch.MathExpression(
        expression=f"IF(({errors} + {completed}) > 0, 100 * {errors} / ({errors} + {completed}), 0)",
        using_metrics={
            errors: model_metric(model_id, METRIC_BACKEND_ERRORS, period),
            completed: model_metric(model_id, METRIC_REQUESTS_COMPLETED, period),
        },
        period=period,
        label=f"{model_id} backend error %",
    )


class Monitoring(Construct):
    """Alarm topic, alarms and the stage dashboard."""

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
    ) -> None:
        super().__init__(scope, construct_id)
        self._prefix = f"{config.stage}-batchinfer"
        self.alarms: list[cloudwatch.Alarm] = []

        # No SSE on the topic: CloudWatch alarms cannot publish to one encrypted with the AWS-managed SNS key,
        # and alarm messages carry alarm state only, never customer data.
        self.topic = sns.Topic(
            self, "AlarmTopic", display_name=f"batchinfer {config.stage} alarms", enforce_ssl=True
        )
        if config.alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(config.alarm_email))
        self._action = cw_actions.SnsAction(self.topic)

        self._queue_alarms(queues)
        self._webhook_alarms(webhooks)
        self._function_alarms(functions)
        self._api_alarms(api)
        self.dashboard = self._dashboard(config, functions, queues, webhooks, api)

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
                metric=backend_error_rate(model_id),
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
            metric=webhooks_metric(METRIC_WEBHOOK_DELIVERIES_FAILED, FIVE_MINUTES),
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
            metric=api.http_api.metric_latency(
                period=FIVE_MINUTES, statistic=cloudwatch.Stats.percentile(99)
            ),
            threshold=API_LATENCY_P99_ALARM.to_milliseconds(),
            evaluation_periods=3,
            description="API: p99 latency above 10 s for 15 min (the integration timeout is 30 s).",
        )

    # -- dashboard ------------------------------------------------------------------------------------

    def _dashboard(
        self,
        config: InfraConfig,
        functions: ServiceFunctions,
        queues: ModelQueues,
        webhooks: WebhookDelivery,
        api: HttpApiFront,
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
        model_ids = list(queues.by_model)
        dashboard.add_widgets(
            _graph(
                "Batch requests completed / min",
                [model_metric(m, METRIC_REQUESTS_COMPLETED) for m in model_ids],
                width=8,
                stacked=True,
            ),
            _graph(
                "Backend errors / min", [model_metric(m, METRIC_BACKEND_ERRORS) for m in model_ids], width=8
            ),
            _graph("Backend error rate (%)", [backend_error_rate(m) for m in model_ids], width=8),
        )
        for entry in queues.by_model.values():
            dashboard.add_widgets(*_queue_widgets(entry))
        dashboard.add_widgets(*_webhook_widgets(webhooks))
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
            horizontal=cloudwatch.HorizontalAnnotation(value=QUEUE_AGE_ALARM_SECONDS, label="alarm"),
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


def _webhook_widgets(webhooks: WebhookDelivery) -> list[cloudwatch.IWidget]:
    queue, dlq = webhooks.queue, webhooks.dlq
    return [
        _graph(
            "Webhooks: attempts / deliveries failed",
            [webhooks_metric(METRIC_WEBHOOK_ATTEMPTS_FAILED), webhooks_metric(METRIC_WEBHOOK_DELIVERIES_FAILED)],
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
    horizontal: cloudwatch.HorizontalAnnotation | None = None,
) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(
        title=title,
        left=metrics,
        width=width,
        height=6,
        stacked=stacked,
        left_annotations=[horizontal] if horizontal else None,
    )
