"""Backend API keys held in Secrets Manager (deployed stacks), cached for the life of the process."""

from __future__ import annotations

from functools import lru_cache

from .aws import client


@lru_cache(maxsize=64)
def secret_value(secret_id: str, endpoint_url: str | None, region: str) -> str:
    return client("secretsmanager", endpoint_url, region).get_secret_value(SecretId=secret_id)["SecretString"]
