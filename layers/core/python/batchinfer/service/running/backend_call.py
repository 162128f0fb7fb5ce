"""One execution path: how a request runs on its model's backend and what it costs, the same for an
interactive call (`running.interactive`) and a batch request (`running.run_request`). Only what surrounds
it differs: pacing, retries and where the outcome is kept."""

from __future__ import annotations

import logging

from ...catalog import Model
from ...domain import Attempt, Relay
from ...providers import call_backend, open_stream
from ...runtime import Services
from ...storage.secrets import secret_value

log = logging.getLogger(__name__)


def backend_key(svc: Services, model: Model) -> str | None:
    """The model's backend key: its Secrets Manager secret (deployed) or its environment variable."""
    backend = model.backend
    if backend is None or backend.kind == "bedrock":  # Bedrock calls are signed with the function's role
        return None
    secret = svc.settings.model_secrets.get(model.id) or backend.api_key_secret
    if secret:
        return secret_value(secret, svc.settings.aws_endpoint_url, svc.settings.aws_region)
    return svc.env.get(backend.api_key_env) if backend.api_key_env else None


async def attempt(model: Model, endpoint: str, body: dict, key: str | None, timeout: float,
                  version: str | None = None) -> Attempt:
    """One attempt on the backend (routing and translation by the provider). Never raises: a bug or an odd
    answer becomes an attempt whose outcome is unknown, so nothing is stranded and its cost is not guessed."""
    try:
        return await call_backend(model, endpoint, body, key, timeout, version=version)
    except Exception as error:
        log.exception("backend call failed")
        return Attempt(status_code=None, cost_known=False, message=f"The call failed: {type(error).__name__}")


async def stream(model: Model, endpoint: str, body: dict, key: str | None, timeout: float,
                 version: str | None = None) -> Relay | Attempt:
    """One streamed attempt (interactive `stream: true` only): the relay once the backend started streaming,
    or the attempt it gave. Never raises, as `attempt` does not."""
    try:
        return await open_stream(model, endpoint, body, key, timeout, version=version)
    except Exception as error:
        log.exception("backend stream failed to start")
        return Attempt(status_code=None, cost_known=False, message=f"The call failed: {type(error).__name__}")


def cost_of(model: Model, attempt: Attempt) -> float:
    """What an attempt costs at the catalog's price; an attempt whose outcome was lost costs nothing known
    (it counts in `cost_unknown_attempts` instead)."""
    return (model.cost_usd(attempt.input_tokens, attempt.output_tokens, attempt.cached_tokens)
            if attempt.cost_known else 0.0)


def cache_saving_of(model: Model, attempt: Attempt) -> float:
    """What an attempt's cached input saved at the catalog's cached input price (0 without one)."""
    return model.cache_saving_usd(attempt.input_tokens, attempt.cached_tokens) if attempt.cost_known else 0.0
