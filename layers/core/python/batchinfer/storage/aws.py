"""AWS clients, built once per process from settings (the moto server locally, AWS when deployed)."""

from __future__ import annotations

from functools import lru_cache

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from ..settings import Settings

LOCAL_CREDENTIALS = ("local", "local")  # access key id, secret: the moto server (and the simulator) take any


def session(endpoint_url: str | None) -> boto3.session.Session:
    """A session for AWS (no endpoint URL: the usual credential chain) or for a local endpoint (the moto
    server, or the simulated backend standing in for Bedrock): there, credentials configured on this machine are
    used if there are any and dummy ones otherwise, so a fresh machine needs no AWS setup; the EC2 and ECS
    metadata services are never asked."""
    if endpoint_url is None:
        return boto3.session.Session()
    core = botocore.session.get_session()
    chain = core.get_component("credential_provider")
    for provider in ("iam-role", "container-role"):
        chain.remove(provider)
    if core.get_credentials() is None:
        core.set_credentials(*LOCAL_CREDENTIALS)
    return boto3.session.Session(botocore_session=core)


@lru_cache(maxsize=8)
def client(service: str, endpoint_url: str | None, region: str):
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=64,
                    signature_version="s3v4" if service == "s3" else None)  # SigV4 presigned URLs
    return session(endpoint_url).client(service, endpoint_url=endpoint_url, region_name=region, config=config)


def clients_for(settings: Settings) -> tuple:
    """DynamoDB, S3 and SQS clients for these settings."""
    return tuple(client(s, settings.aws_endpoint_url, settings.aws_region) for s in ("dynamodb", "s3", "sqs"))


AWS_ERRORS = (BotoCoreError, ClientError)  # what a call to AWS (or moto) may raise


def describe_aws_error(error: BotoCoreError | ClientError, settings: Settings | None) -> str:
    """One line about an error from botocore, saying what to do about it where that is clear."""
    if isinstance(error, EndpointConnectionError) and settings and settings.aws_endpoint_url:
        return f"the local stack at {settings.aws_endpoint_url} is not reachable: start it with `make run`"
    if isinstance(error, EndpointConnectionError):
        return f"cannot reach AWS: {error}"
    if isinstance(error, NoCredentialsError):
        return ("no AWS credentials found: configure them (aws configure, AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY) to reach the deployed stack")
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        text = f"AWS error on {error.operation_name}: {info.get('Code', 'unknown')}: {info.get('Message', '')}"
        if info.get("Code") == "ResourceNotFoundException" and settings:
            text += f" (table {settings.table_name} in {settings.aws_region}: are TABLE_NAME and AWS_REGION right?)"
        return text
    return f"AWS: {error}"  # e.g. a profile that does not exist, partial credentials
