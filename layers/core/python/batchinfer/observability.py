"""Powertools Logger, Metrics (EMF) and Tracer shared by every handler."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

from .settings import get_settings

logger = Logger()
# The stack's POWERTOOLS_METRICS_NAMESPACE (per stage: its dashboard and alarms read the same), else the
# default; passed explicitly, since an explicit namespace is what Powertools prefers over the environment.
metrics = Metrics(namespace=get_settings().powertools_metrics_namespace)
tracer = Tracer()
