"""Backend API keys held in Secrets Manager (deployed stacks), cached for a while in the process."""

from __future__ import annotations

import time

from ..catalog import SECRET_PLACEHOLDER
from .aws import client

KEY_CACHE_SECONDS = 300.0  # a key the operator rotates is picked up within this long
# The placeholder is read again sooner: once the operator puts the real key, the model runs within this long.
PLACEHOLDER_CACHE_SECONDS = 30.0

_cache: dict[tuple[str, str | None, str], tuple[float, str]] = {}


class BackendKeyNotSet(Exception):
    """The model's secret still holds the deploy's placeholder: the operator has not put its key yet."""


def secret_value(secret_id: str, endpoint_url: str | None, region: str) -> str:
    """The secret's value. Raises BackendKeyNotSet for the placeholder, so that it is never sent as a key."""
    key = (secret_id, endpoint_url, region)
    cached = _cache.get(key)
    if cached is None or cached[0] <= time.monotonic():
        value = client("secretsmanager", endpoint_url, region).get_secret_value(SecretId=secret_id)["SecretString"]
        ttl = PLACEHOLDER_CACHE_SECONDS if is_placeholder(value) else KEY_CACHE_SECONDS
        cached = _cache[key] = (time.monotonic() + ttl, value)
    if is_placeholder(cached[1]):
        raise BackendKeyNotSet(secret_id)
    return cached[1]


def is_placeholder(value: str | None) -> bool:
    return value is not None and value.strip() == SECRET_PLACEHOLDER


def forget_keys() -> None:
    """Drop the cached keys (tests; a process that must see a changed key at once)."""
    _cache.clear()
