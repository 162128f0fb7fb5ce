"""Powertools Logger, Metrics (EMF) and Tracer shared by every handler."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

from .catalog import METRICS_NAMESPACE

logger = Logger()
# The CDK dashboard and alarms read this namespace (infra/monitoring.py imports the same constant).
metrics = Metrics(namespace=METRICS_NAMESPACE)
tracer = Tracer()
