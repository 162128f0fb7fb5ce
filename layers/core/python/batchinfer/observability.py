"""Powertools Logger, Metrics (EMF) and Tracer shared by every handler."""

from __future__ import annotations

import warnings

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import EphemeralMetrics

from .settings import get_settings

logger = Logger()
# The stack's POWERTOOLS_METRICS_NAMESPACE (per stage: its dashboard and alarms read the same), else the
# default; passed explicitly, since an explicit namespace is what Powertools prefers over the environment.
# Its only dimension is `service` (POWERTOOLS_SERVICE_NAME): the alarms read its metrics (the storage layer's
# TransactionConflicts, ...) per function, so no handler may add a dimension to it.
metrics = Metrics(namespace=get_settings().powertools_metrics_namespace)
tracer = Tracer()
# An invocation whose storage calls all went through has nothing for `metrics`: expected, not worth a warning.
warnings.filterwarnings("ignore", message="No application metrics to publish")


def metrics_with(**dimensions: str) -> EphemeralMetrics:
    """A metric set of its own, in `metrics`' namespace and service, with these dimensions besides `service`
    (the worker's `model`). Every Metrics instance shares one dimension set per process: a dimension added to
    `metrics` would reach every metric the invocation emits, and the per-function alarms would miss them.
    Flush it before the invocation ends."""
    own = EphemeralMetrics(namespace=metrics.namespace, service=metrics.service)
    for name, value in dimensions.items():
        own.add_dimension(name=name, value=value)
    return own
