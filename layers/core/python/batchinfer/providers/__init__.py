"""Model backends, by the catalog's backend `kind`: each kind is one module with
`async call(model, endpoint, body, api_key, timeout, version) -> Attempt`. Adding a kind is a new module
and a line here; the worker does not change. The only code that talks HTTP to backends.

An Anthropic Messages request for a model on an `openai` backend is translated to a chat completion and
its answer back to a message (`messages_to_chat`); intake already refused what the translation cannot carry.
Interactive `stream: true` answers are relayed by `streaming.open_stream`. A `bedrock` model (Amazon Bedrock,
through boto3's Converse, ConverseStream and InvokeModel) translates both APIs itself (`converse`).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from ..catalog import CHAT_ENDPOINT, MESSAGES_ENDPOINT, Model
from ..domain import Attempt
from ..messages_to_chat import to_chat, to_message, untranslatable
from . import anthropic, bedrock, converse, openai_compat
from .streaming import open_stream

__all__ = ["PROVIDERS", "Provider", "as_asked", "as_sent", "backend_refusal", "call_backend", "open_stream", "register",
           "translates", "unregister"]


class Provider(Protocol):
    """What a backend kind offers: a module with this coroutine (each kind here), or any object with it."""

    async def call(self, model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float,
                   version: str | None = None) -> Attempt: ...


# Modules, not functions: a call looks the function up when it is made (tests can wrap it in place).
PROVIDERS: dict[str, Provider] = {"openai": openai_compat, "anthropic": anthropic, "bedrock": bedrock}


def backend_refusal(model: Model, endpoint: str, body: dict) -> str | None:
    """What in a request its model's backend cannot carry, as a message naming the parameter, or None. Intake
    asks it of every request (batch lines, Message Batch entries, interactive calls), so what a backend cannot
    carry fails there, never silently on the way."""
    backend = model.backend
    if backend is None:
        return None
    if backend.kind == "bedrock":
        return converse.refusal(endpoint, body, backend.features, backend.embedding_format)
    if backend.kind == "openai" and endpoint == MESSAGES_ENDPOINT:
        return untranslatable(body, backend.features)
    return None


def register(kind: str, provider: Provider) -> Provider | None:
    """Make `provider` answer every call to a model whose backend is of `kind`, from the next call on;
    returns the provider it replaces (None if the kind was new), for the caller to put back.

    The catalog file admits only the kinds it knows (`catalog.Backend.kind`): a kind registered here serves
    models built in code, such as the tests' deterministic fake backend (tests/fake_provider.py), which runs
    batches through the real dispatcher and worker with no HTTP server."""
    previous = PROVIDERS.get(kind)
    PROVIDERS[kind] = provider
    return previous


def unregister(kind: str) -> Provider | None:
    """Forget the kind's provider (calls to its models raise LookupError again); returns it, if any."""
    return PROVIDERS.pop(kind, None)


async def call_backend(model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float,
                       version: str | None = None) -> Attempt:
    """One attempt of one request on the model's backend. `version`: a Messages request's
    `anthropic-version`."""
    assert model.backend is not None
    provider = PROVIDERS.get(model.backend.kind)
    if provider is None:  # the catalog only admits known kinds; a new kind must be registered above (or `register`)
        raise LookupError(f"no provider for backend kind {model.backend.kind!r}")
    if endpoint == MESSAGES_ENDPOINT and model.backend.kind == "openai":
        return await _translated(provider, model, body, api_key, timeout)
    return await provider.call(model, endpoint, body, api_key, timeout, version=version)


async def _translated(provider: Provider, model: Model, params: dict, api_key: str | None,
                      timeout: float) -> Attempt:
    try:
        endpoint, chat = as_sent(model, MESSAGES_ENDPOINT, params)
    except ValueError as error:  # intake checks the same rules; a catalog change since may still get here
        return Attempt(status_code=400, message=str(error))
    return as_asked(model, MESSAGES_ENDPOINT, params, await provider.call(model, endpoint, chat, api_key, timeout))


def translates(model: Model, endpoint: str) -> bool:
    """Whether requests of `endpoint` are sent to the model's backend as another endpoint's (a Messages request
    to an `openai` backend, as a chat completion)."""
    return endpoint == MESSAGES_ENDPOINT and model.backend is not None and model.backend.kind == "openai"


def as_sent(model: Model, endpoint: str, body: dict) -> tuple[str, dict]:
    """(the endpoint, the body) a request is sent to its backend as, without the model's name: a direct call
    and a provider batch tier's job alike. Raises ValueError for a request its translation cannot carry."""
    if translates(model, endpoint):
        return CHAT_ENDPOINT, to_chat(body, model.backend.features if model.backend else ())
    return endpoint, body


def as_asked(model: Model, endpoint: str, params: dict, attempt: Attempt) -> Attempt:
    """A backend's answer to a request sent translated, in the shape it was asked in (a chat completion back to
    a message, named as the caller named the model); any other answer as it is."""
    if not translates(model, endpoint) or not attempt.ok or attempt.body is None:
        return attempt
    try:
        message = to_message(attempt.body, str(params.get("model")), params.get("stop_sequences") or ())
    except ValueError as error:  # the backend ran it (its cost counts) but its answer cannot be shown
        return dataclasses.replace(attempt, status_code=502, body=None,
                                   message=f"The backend's answer could not be translated to a message: {error}")
    return dataclasses.replace(attempt, body=message)
