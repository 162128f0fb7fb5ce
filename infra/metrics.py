"""The stage's CloudWatch metrics, as the dashboard and the alarms (infra.monitoring) query them.

Application metrics are EMF lines in the stage's namespace (`batchinfer/<stage>`); Powertools always adds the
`service` dimension, and only the worker's per-model metrics also carry `model` (see infra.monitoring).
"""

from __future__ import annotations

import re

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb

from batchinfer.catalog import (
    METRIC_API_LATENCY,
    METRIC_BACKEND_ERRORS,
    METRIC_REQUESTS_COMPLETED,
    METRIC_SWEEP_LAG,
    WORKER_METRICS_SERVICE,
    function_service_name,
)
from infra.functions import SPECS

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

# Alarm thresholds (infra.monitoring alarms on them; the dashboard draws some as lines).
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
QUEUE_AGE_ALARM_SECONDS = 15 * 60
BACKEND_ERROR_RATE_ALARM_PERCENT = 10
API_5XX_RATE_ALARM = 0.05
API_LATENCY_P99_ALARM = Duration.seconds(10)

FIVE_MINUTES = Duration.minutes(5)
ONE_MINUTE = Duration.minutes(1)


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
