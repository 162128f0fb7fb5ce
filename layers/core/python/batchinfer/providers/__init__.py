"""Model backends, by the catalog's backend `kind`: each kind is one module with
`async call(model, endpoint, body, api_key, timeout) -> Attempt`. Adding a kind (e.g. `anthropic`) is a
new module and a line here; the worker does not change. The only code that talks HTTP to backends."""

from __future__ import annotations

from types import ModuleType

from ..catalog import Model
from ..domain import Attempt
from . import openai_compat

# Modules, not functions: a call looks the function up when it is made (tests can wrap it in place).
PROVIDERS: dict[str, ModuleType] = {"openai": openai_compat}


async def call_backend(model: Model, endpoint: str, body: dict, api_key: str | None, timeout: float) -> Attempt:
    """One attempt of one request on the model's backend."""
    assert model.backend is not None
    provider = PROVIDERS.get(model.backend.kind)
    if provider is None:  # the catalog only admits known kinds; a new kind must be registered above
        raise LookupError(f"no provider for backend kind {model.backend.kind!r}")
    return await provider.call(model, endpoint, body, api_key, timeout)
