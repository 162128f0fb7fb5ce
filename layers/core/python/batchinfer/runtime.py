"""Wires settings, catalog and storage together once per process; handlers and tests receive it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from .addresses import Resolver, system_resolver
from .catalog import Catalog, load_catalog
from .settings import Settings, environment, get_settings
from .storage.aws import clients_for
from .storage.blobs import Blobs
from .storage.dynamo import Table
from .storage.queues import Queues
from .storage.secret_box import SecretBox


@dataclass
class Services:
    settings: Settings
    catalog: Catalog
    table: Table
    blobs: Blobs
    queues: Queues
    secret_box: SecretBox | None = None  # webhook signing secrets (KMS)
    env: dict[str, str] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    resolve: Resolver = system_resolver  # webhook hosts (tests stub it)
    # What a process remembers between invocations (a warm Lambda keeps it): when periodic steps last ran.
    last_ran: dict[str, int] = field(default_factory=dict)
    # Items whose background step raised in this process's last look at them (batch ids, lease keys, ...): the
    # next walk takes them last, so one broken item never stands in front of every other at every run.
    failed_last: set[str] = field(default_factory=set)

    def now(self) -> int:
        return int(self.clock())

    def now_ms(self) -> int:
        return int(self.clock() * 1000)


def build_services(settings: Settings, env: dict[str, str] | None = None) -> Services:
    env = environment() if env is None else env
    ddb, s3, sqs = clients_for(settings)
    return Services(settings=settings, catalog=load_catalog(settings.models_file, env),
                    table=Table(ddb, settings.table_name), blobs=Blobs(s3, settings.bucket_name),
                    queues=Queues(sqs, settings.model_queues, settings.webhook_queue_url),
                    secret_box=SecretBox(settings.aws_endpoint_url, settings.aws_region, settings.webhook_key_id),
                    env=env)


_injected: Services | None = None


def use_services(svc: Services | None) -> None:
    """Inject the services handlers use (the local stack and tests); None goes back to the default."""
    global _injected
    _injected = svc


def services() -> Services:
    """The process-wide services: injected ones, or built once from the environment (a Lambda's cold start)."""
    return _injected or _default_services()


@lru_cache(maxsize=1)
def _default_services() -> Services:
    return build_services(get_settings())
