"""The interactive endpoints batches mirror: `/v1/chat/completions`, `/v1/embeddings`, `/v1/responses`,
Anthropic's `/v1/messages`, and `/v1/models`. A request is checked by the same code a batch request is
(`request_bodies`, the Message Batch parameter checks), runs through the same function (`backend_call`), and is
charged to the same daily quota at the same price. While it runs it holds an interactive lease on its model,
which shrinks that model's batch budget (down to its floor) so batch work makes way.

`stream: true` on chat completions and messages is relayed as server-sent events where the route can carry
them (`INTERACTIVE_STREAMING_ENABLED`, on in the local stack); the lease is held and the cost charged when
the stream ends. On API Gateway + Lambda an answer is buffered whole, so there the switch is off and
`stream: true` is refused with a 400 that says so, rather than buffered silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio

from ...catalog import MESSAGES_ENDPOINT, Model
from ...domain import Attempt, Relay, new_token, next_utc_midnight
from ...errors import ApiError, GatewayTimeout, InvalidRequest, NotFound, RateLimited, ServiceUnavailable, quoted
from ...providers import backend_refusal
from ...records import InteractiveLease, Usage
from ...request_bodies import CHAT, EMBEDDINGS, RESPONSES, body_problem
from ...runtime import Services
from ...scheduling.capacity import interactive_shard
from ...storage.dynamo import ConditionFailed
from ...storage.secrets import BackendKeyNotSet
from ..accounts import Principal, may_use_model, quota_used_up
from ..creating.message_params import ParamsError, params_model
from ..creating.validation import non_finite_at, non_finite_fault
from . import backend_call

OPENAI_ENDPOINTS = (CHAT, EMBEDDINGS, RESPONSES)
NO_STREAM = ("stream: streaming answers are not served here: behind API Gateway and Lambda an answer is sent "
             "whole, so a stream would arrive all at once. Send stream false (or leave it out).")
STREAMED_ENDPOINTS = (CHAT, MESSAGES_ENDPOINT)
LEASE_GRACE_SECONDS = 60  # beyond the backend timeout: a request whose lease is older than this died
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    status: int
    body: dict
    model: Model
    cost_usd: float


@dataclass(frozen=True)
class Streamed:
    """A streamed answer: server-sent events, charged when they end."""
    events: AsyncIterator[bytes]
    model: Model


# --- Routing -----------------------------------------------------------------------------------------------

def route(svc: Services, account: dict, name: object, endpoint: str) -> Model:
    """The model a request naming `name` runs on: the model itself, or for an auto model the catalog's rule
    (`Catalog.route`)."""
    model = svc.catalog.lookup(name) if isinstance(name, str) and name else None
    if model is None or not may_use_model(account, model.id):
        raise NotFound(f"The model {quoted(name)} does not exist or you do not have access to it.",
                       code="model_not_found", param="model")
    if model.auto:
        chosen = svc.catalog.route(model, endpoint, lambda m: may_use_model(account, m.id))
        if chosen is None:
            raise InvalidRequest(f"The auto model '{name}' has no model for {endpoint} that this key may use.",
                                 code="unsupported_endpoint", param="model")
        return chosen
    if not model.serves(endpoint):
        raise InvalidRequest(f"The model '{name}' does not serve {endpoint}.", code="unsupported_endpoint",
                             param="model")
    return model


def _check_quota(svc: Services, account: dict) -> None:
    if quota_used_up(svc, account):
        now = svc.now()
        raise RateLimited("Your daily quota is used up; it renews at 00:00 UTC.", code="quota_exceeded",
                          retry_after=max(1, next_utc_midnight(now) - now))


# --- Running -----------------------------------------------------------------------------------------------

async def _begin(svc: Services, principal: Principal, model: Model) -> tuple[str | None, tuple[str, int]]:
    """The backend key and a new interactive lease (in one transaction with the budget's count): its id and
    the budget shard it is counted on."""
    try:
        key = await asyncio.to_thread(backend_call.backend_key, svc, model)
    except BackendKeyNotSet:
        raise ServiceUnavailable(f"The model '{model.id}' is not available: its backend API key has not been set.",
                                 code="service_unavailable") from None
    lease = (new_token(), interactive_shard(svc, model))
    now = svc.now()
    timeout = int(svc.settings.backend_timeout_seconds)
    await asyncio.to_thread(svc.table.transact, InteractiveLease.begin(
        svc.table, model.id, lease[0], principal.account_id, now, now + timeout + LEASE_GRACE_SECONDS, svc.now_ms(),
        shard=lease[1]))
    return key, lease


async def _run(svc: Services, principal: Principal, model: Model, endpoint: str, body: dict,
               version: str | None = None) -> tuple[Attempt, float]:
    """One attempt under an interactive lease, charged to the account's day. The lease goes in one
    transaction with the budget's count; its end, the count and the cost in another."""
    key, lease = await _begin(svc, principal, model)
    attempt: Attempt | None = None
    try:
        attempt = await backend_call.attempt(model, endpoint, body, key, svc.settings.backend_timeout_seconds, version)
    finally:
        cost = await asyncio.to_thread(_end, svc, principal, model, lease, attempt)
    return attempt, cost


async def _stream(svc: Services, principal: Principal, model: Model, endpoint: str, body: dict,
                  version: str | None = None) -> AsyncIterator[bytes]:
    """A streamed attempt under an interactive lease: its events once the backend started streaming (an
    answer that did not start is refused as `_run`'s is). The lease ends and the cost is charged when the
    events end, or stop because the caller went away (then the cost is unknown)."""
    key, lease = await _begin(svc, principal, model)
    opened: Relay | Attempt | None = None
    try:
        opened = await backend_call.stream(model, endpoint, body, key, svc.settings.backend_timeout_seconds, version)
    finally:
        if not isinstance(opened, Relay):
            await asyncio.to_thread(_end, svc, principal, model, lease, opened)
    if isinstance(opened, Attempt):
        raise _refusal(opened)
    return _relayed(svc, principal, model, lease, opened)


async def _relayed(svc: Services, principal: Principal, model: Model, lease: tuple[str, int],
                   relay: Relay) -> AsyncIterator[bytes]:
    try:
        async for chunk in relay.chunks:
            yield chunk
    finally:
        with anyio.CancelScope(shield=True):  # the caller may have gone: the lease must still end, once
            await relay.close()
            await anyio.to_thread.run_sync(_end, svc, principal, model, lease, relay.outcome())


def _end(svc: Services, principal: Principal, model: Model, lease: tuple[str, int],
         attempt: Attempt | None) -> float:
    """End the lease and charge the attempt (None: it was cut off after it may have been sent, so its cost is
    unknown); the cost charged."""
    cost = backend_call.cost_of(model, attempt) if attempt else 0.0
    unknown = 0 if attempt is not None and attempt.cost_known else 1
    estimated = 1 if attempt is not None and attempt.usage_estimated else 0
    if estimated:
        log.warning("model %s: the backend reported no usage for a streamed answer; charged an estimate of %d input "
                    "and %d output tokens (usage_estimated_attempts)", model.id, attempt.input_tokens,
                    attempt.output_tokens)
    charge = ([Usage.add_cost(svc.table, principal.account_id, cost, svc.now(), unknown, estimated)]
              if cost or unknown or estimated else [])
    try:
        svc.table.transact(InteractiveLease.end(svc.table, model.id, lease[0], svc.now_ms(), shard=lease[1]) + charge)
    except ConditionFailed:  # the sweeper took the lease off already (it ran past its time): still charge it
        if charge:
            svc.table.transact(charge)
    return cost


def _refusal(attempt: Attempt) -> ApiError:
    """What the caller is told when the backend gave no success: its own status and message where it
    answered (a 5xx as 502, it is not this service's fault), 503 when no connection to it could be made, 504
    when it did not answer in time."""
    if attempt.status_code is None and not attempt.sent:
        return ServiceUnavailable(attempt.message or "Could not connect to the backend.", code="service_unavailable")
    if attempt.status_code is None:
        return GatewayTimeout(attempt.message or "The backend did not answer in time.", code="timeout")
    status = attempt.status_code
    if status == 429:
        return RateLimited(attempt.message or "The backend is busy.", code="rate_limited",
                           retry_after=max(1, round(attempt.retry_after or 1)))
    if status >= 500 or status < 400:
        return ApiError(503 if status == 503 else 502, attempt.message or f"The backend answered HTTP {status}.",
                        code="upstream_error")
    return ApiError(status, attempt.message or f"The backend answered HTTP {status}.")


def _check_stream(svc: Services, endpoint: str) -> None:
    if not svc.settings.interactive_streaming_enabled:
        raise InvalidRequest(NO_STREAM, code="stream_unsupported", param="stream")
    if endpoint not in STREAMED_ENDPOINTS:
        raise InvalidRequest(f"stream: {endpoint} answers are not streamed here (chat completions and messages "
                             "are); send stream false (or leave it out).", code="stream_unsupported", param="stream")


async def serve_openai(svc: Services, principal: Principal, endpoint: str, payload: object) -> Served | Streamed:
    """A chat completion, embedding or (stateless) response, checked as a batch request's body is."""
    if not isinstance(payload, dict):
        raise InvalidRequest("The body must be a JSON object.")
    streams = payload.get("stream") is True
    if streams:
        _check_stream(svc, endpoint)
    at = non_finite_at(payload)
    if at is not None:
        raise InvalidRequest(non_finite_fault(at), param=at or None)
    if endpoint == RESPONSES and payload.get("store") is True:
        raise InvalidRequest("store: responses are not stored here; send store false (or leave it out).",
                             param="store")
    problem = body_problem(endpoint, payload)
    if problem:
        raise InvalidRequest(problem, param=problem.split(":", 1)[0].removeprefix("body.") or None)
    model = route(svc, principal.account, payload.get("model"), endpoint)
    refused = backend_refusal(model, endpoint, payload)  # what the model's backend cannot carry
    if refused:
        raise InvalidRequest(refused, param=refused.split(":", 1)[0] or None)
    _check_quota(svc, principal.account)
    if streams:
        return Streamed(await _stream(svc, principal, model, endpoint, payload), model)
    attempt, cost = await _run(svc, principal, model, endpoint, payload)
    if not attempt.ok or attempt.body is None:
        raise _refusal(attempt)
    return Served(status=attempt.status_code or 200, body=attempt.body, model=model, cost_usd=cost)


async def serve_messages(svc: Services, principal: Principal, payload: object, version: str) -> Served | Streamed:
    """An Anthropic Messages request, checked as a Message Batch's request is (but for `stream`), translated
    for `openai` backends by the same code."""
    streams = False
    if isinstance(payload, dict) and "stream" in payload:
        if payload["stream"] is not None and not isinstance(payload["stream"], bool):
            raise InvalidRequest("stream: expected a boolean.", param="stream")
        streams = payload["stream"] is True
        if streams:
            _check_stream(svc, MESSAGES_ENDPOINT)
        payload = {k: v for k, v in payload.items() if k != "stream"}
    if isinstance(payload, dict):
        named = svc.catalog.lookup(payload.get("model")) if isinstance(payload.get("model"), str) else None
        if named is not None and named.auto and may_use_model(principal.account, named.id):
            payload = {**payload, "model": route(svc, principal.account, named.id, MESSAGES_ENDPOINT).id}
    try:
        model = svc.catalog.get(params_model(svc, principal.account, payload, version))
    except ParamsError as refused:
        status = 404 if refused.error["type"] == "not_found_error" else 400
        raise ApiError(status, refused.error["message"], code=refused.error["code"]) from None
    _check_quota(svc, principal.account)
    assert isinstance(payload, dict)
    if streams:
        return Streamed(await _stream(svc, principal, model, MESSAGES_ENDPOINT, payload, version), model)
    attempt, cost = await _run(svc, principal, model, MESSAGES_ENDPOINT, payload, version)
    if not attempt.ok or attempt.body is None:
        raise _refusal(attempt)
    return Served(status=200, body=attempt.body, model=model, cost_usd=cost)


# --- Models ------------------------------------------------------------------------------------------------

def model_object(model: Model) -> dict:
    return {"id": model.id, "object": "model", "created": 0, "owned_by": "batchinfer"}


def models_page(svc: Services, principal: Principal) -> dict:
    """The models the key may use (auto ones included: they route interactive requests), OpenAI's list."""
    usable = [m for m in svc.catalog.models if (m.auto or m.backend is not None)
              and may_use_model(principal.account, m.id)]
    return {"object": "list", "data": [model_object(m) for m in usable]}


def one_model(svc: Services, principal: Principal, model_id: str) -> dict:
    model = svc.catalog.lookup(model_id)
    if model is None or model.id != model_id or not may_use_model(principal.account, model.id) or (
            not model.auto and model.backend is None):
        raise NotFound(f"The model {quoted(model_id)} does not exist or you do not have access to it.",
                       code="model_not_found", param="model")
    return model_object(model)
