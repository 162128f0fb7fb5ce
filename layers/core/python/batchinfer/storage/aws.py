"""AWS clients, built once per process from settings (the moto server locally, AWS when deployed)."""

from __future__ import annotations

from functools import lru_cache

import boto3
from botocore.config import Config

from ..settings import Settings


@lru_cache(maxsize=8)
def client(service: str, endpoint_url: str | None, region: str):
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=64,
                    signature_version="s3v4" if service == "s3" else None)  # SigV4 presigned URLs
    return boto3.session.Session().client(service, endpoint_url=endpoint_url, region_name=region, config=config)


def clients_for(settings: Settings) -> tuple:
    """DynamoDB, S3 and SQS clients for these settings."""
    return tuple(client(s, settings.aws_endpoint_url, settings.aws_region) for s in ("dynamodb", "s3", "sqs"))
