"""Batch API protocols, by name: each protocol is one package (`openai`, `anthropic`) whose `PROTOCOL`
describes it (`base.Protocol`): its batch ids, its place in an account's list, how its results and
refusals look, the webhook event its endings announce, what its requests add to a backend call. Adding a
protocol is a new package and a line here; the shared code (intake, results, webhooks, the worker) does
not change: it asks this registry, by a batch item's `api` or by a batch id, and never names a protocol.

The descriptions are pure and sit low (layout asks for an id's listing prefix); each protocol's operations
(create, read, cancel, ...) are in `operations/<name>`, above the service they use.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import anthropic, openai
from .base import Protocol

__all__ = ["DEFAULT", "EVENT_TYPES", "PROTOCOLS", "Protocol", "named", "of_batch", "of_batch_id"]

PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (openai.PROTOCOL, anthropic.PROTOCOL)}
# The protocol of a batch item without `api`, of an id of no registered kind, and of a path no route claims.
DEFAULT: Protocol = openai.PROTOCOL
# Every webhook event type an ending may announce, each once, in registry order.
EVENT_TYPES: tuple[str, ...] = tuple(dict.fromkeys(e for p in PROTOCOLS.values() for e in p.ending_events.values()))


def named(name: str) -> Protocol:
    protocol = PROTOCOLS.get(name)
    if protocol is None:  # a new protocol must be registered above
        raise LookupError(f"no protocol named {name!r}")
    return protocol


def of_batch(batch: Mapping) -> Protocol:
    """The protocol a stored batch belongs to, by its `api` (none: the default protocol's)."""
    api = batch.get("api")
    return DEFAULT if api is None else named(api)


def of_batch_id(batch_id: str) -> Protocol:
    """The protocol whose batch ids start as this one does (none: the default protocol)."""
    return next((p for p in PROTOCOLS.values() if p is not DEFAULT and batch_id.startswith(p.batch_ids.prefix)),
                DEFAULT)
