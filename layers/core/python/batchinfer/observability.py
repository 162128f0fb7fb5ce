"""Powertools Logger, Metrics (EMF) and Tracer shared by every handler."""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger()
metrics = Metrics(namespace="BatchInference")
tracer = Tracer()
