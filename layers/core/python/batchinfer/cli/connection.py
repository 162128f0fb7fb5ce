"""Where batchctl's user commands send their calls: the API's base URL and key, from the options, the
environment, or the local stack `make run` describes (.local/stack.json and .local/api-key)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from .api_client import api_root
from .common import LOCAL_STACK_FILE, UsageError


def env_defaults() -> dict[str, str | None]:
    """The user commands' only reading of the environment (the service's own settings are settings.py's):
    BATCH_API_URL and BATCH_API_KEY, the defaults of --base-url and --api-key."""
    return {"base_url": os.environ.get("BATCH_API_URL") or None, "api_key": os.environ.get("BATCH_API_KEY") or None}


def _local_stack(path: Path, required: bool) -> dict:
    if not path.exists():
        if required:
            raise UsageError(f"stack file {path} not found")
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read stack file {path}: {error}") from None
    return data if isinstance(data, dict) else {}


def connection(args: argparse.Namespace) -> tuple[str, str]:
    """(base URL, API key): --base-url / BATCH_API_URL, --api-key / BATCH_API_KEY, else the local stack's
    (.local/stack.json and .local/api-key, written by `make run`). The local key is only ever sent to the
    local stack's URL."""
    stack_path = args.stack_file or LOCAL_STACK_FILE
    stack = _local_stack(stack_path, required=args.stack_file is not None)
    local_url = stack.get("api_url") if isinstance(stack.get("api_url"), str) else None
    base_url = args.base_url or local_url
    if not base_url:
        if stack:
            raise UsageError(f"{stack_path} has no api_url (a local stack started before batchctl knew it): "
                             "restart `make run`, or pass --base-url or set BATCH_API_URL")
        raise UsageError(f"no API URL: pass --base-url or set BATCH_API_URL, or start the local stack with "
                         f"`make run` in this folder ({stack_path} not found)")
    key = args.api_key
    if not key and local_url and api_root(base_url) == api_root(local_url):
        key_file = stack_path.parent / "api-key"
        try:
            key = key_file.read_text().strip() or None
        except OSError:
            key = None
    if not key:
        raise UsageError("no API key: pass --api-key or set BATCH_API_KEY")
    return base_url, key
