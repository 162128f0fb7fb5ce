"""The stage's CloudWatch dashboard: what an operator looks at first, with the stage's alarms on top.

Each widget queries the metrics of infra.metrics; infra.monitoring builds the alarms and hands them in.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from batchinfer.catalog import (
    METRIC_BACKEND_ERRORS,
    METRIC_BACKGROUND_ITEM_FAILURES,
    METRIC_CONDITIONAL_CHECK_FAILURES,
    METRIC_REQUESTS_COMPLETED,
    METRIC_TRANSACTION_CONFLICTS,
    METRIC_WEBHOOK_ATTEMPTS_FAILED,
    METRIC_WEBHOOK_DELIVERIES_FAILED,
)
from infra.api import HttpApiFront
from infra.config import InfraConfig
from infra.functions import WORKER, ServiceFunctions
from infra.metrics import (
    ONE_MINUTE,
    QUEUE_AGE_ALARM_SECONDS,
    STORAGE_METRICS_SERVICES,
    SWEEP_LAG_ALARM_SECONDS,
    TABLE_OPERATIONS,
    WORKER_DURATION_ALARM_SHARE,
    api_latency_metric,
    backend_error_rate,
    dynamodb_metric,
    model_metric,
    storage_metric,
    sweep_lag_metric,
    webhooks_metric,
)
from infra.queues import ModelQueue, ModelQueues
from infra.storage import GLOBAL_INDEXES, Storage
from infra.webhooks import WebhookDelivery


def stage_dashboard(
    scope: Construct,
    *,
    prefix: str,
    namespace: str,
    alarms: list[cloudwatch.Alarm],
    config: InfraConfig,
    functions: ServiceFunctions,
    queues: ModelQueues,
    webhooks: WebhookDelivery,
    api: HttpApiFront,
    storage: Storage,
    schedule_group: scheduler.IScheduleGroup,
) -> cloudwatch.Dashboard:
    """The stage dashboard: API, functions, storage, throughput, every model's queues and the webhooks, under
    a status widget of the stage's alarms."""
    dashboard = cloudwatch.Dashboard(
        scope, "Dashboard", dashboard_name=prefix, default_interval=Duration.hours(3)
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
        cloudwatch.AlarmStatusWidget(title="Alarms", alarms=alarms, width=24, height=4)
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
                api_latency_metric(namespace, cloudwatch.Stats.percentile(99), ONE_MINUTE,
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
            [_labelled(sweep_lag_metric(namespace, ONE_MINUTE), "most overdue item (s)")],
            width=8,
            horizontal=[cloudwatch.HorizontalAnnotation(value=SWEEP_LAG_ALARM_SECONDS, label="alarm")],
        ),
    )
    dashboard.add_widgets(
        _graph(
            "Transaction conflicts / min",
            [storage_metric(namespace, METRIC_TRANSACTION_CONFLICTS, s) for s in STORAGE_METRICS_SERVICES],
            width=12,
            stacked=True,
        ),
        _graph(
            "Conditional-check failures / min",
            [
                storage_metric(namespace, METRIC_CONDITIONAL_CHECK_FAILURES, s)
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
                storage_metric(namespace, METRIC_BACKGROUND_ITEM_FAILURES, s)
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
    ns = namespace
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
