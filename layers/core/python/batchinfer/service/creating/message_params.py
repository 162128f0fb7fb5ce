"""Whether a Messages API request body may run as written, and on which model: the check every Message
Batch request gets at creation and every interactive Messages call gets before it runs, against the rules of
the `anthropic-version` it was sent with. It reads the catalog and the account's models; it stores nothing.
"""

from __future__ import annotations

from ...catalog import MESSAGES_ENDPOINT
from ...errors import clipped
from ...providers import backend_refusal
from ...request_bodies import got
from ...runtime import Services
from ...translating import refused_everywhere
from ..accounts import may_use_model
from .validation import MAX_PROBLEM_CHARS, non_finite_at, non_finite_fault

# The top-level `params` each `anthropic-version` knows: a request naming anything else errors (nothing is
# dropped). 2023-06-01 keeps the sampling parameters; 2026-10-21 (the 2.x SDKs) has none of them, and
# adds `speed`.
_COMMON_PARAMS = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "tools", "tool_choice", "thinking",
    "service_tier", "stream", "cache_control", "container", "mcp_servers", "output_config", "output_format",
    "context_management", "inference_geo", "diagnostics"})
VERSIONS: dict[str, frozenset[str]] = {
    "2023-06-01": _COMMON_PARAMS | {"temperature", "top_p", "top_k"},
    "2026-10-21": _COMMON_PARAMS | {"speed"},
}
_ROLES = ("user", "assistant")


class ParamsError(Exception):
    """Why one request cannot run: its result, stored with the batch's requests, so its message is clipped
    whatever the request held."""

    def __init__(self, message: str, kind: str = "invalid_request_error", code: str = "invalid_request") -> None:
        message = clipped(message, MAX_PROBLEM_CHARS)
        super().__init__(message)
        self.error = {"code": code, "type": kind, "message": message}


def params_model(svc: Services, account: dict, params: object, version: str) -> str:
    """The catalog id of the model a request's params may run on as written, or ParamsError saying why not."""
    if not isinstance(params, dict):
        raise ParamsError("params: must be an object (a Messages API request body).")
    unknown = sorted(set(params) - VERSIONS[version])
    if unknown:
        raise ParamsError(f"{clipped(unknown[0])}: not a parameter of the Messages API at anthropic-version "
                          f"{version}.")
    at = non_finite_at(params)
    if at is not None:
        raise ParamsError(non_finite_fault(at))
    name = params.get("model")
    if name is None:
        raise ParamsError("model: Field required (a string).")
    if not isinstance(name, str):
        raise ParamsError(f"model: Input should be a valid string{got(name)}.")
    if not name:
        raise ParamsError("model: String should have at least 1 character.")
    max_tokens = params.get("max_tokens")
    if max_tokens is None:
        raise ParamsError("max_tokens: Field required (an integer of at least 1).")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ParamsError(f"max_tokens: Input should be a valid integer{got(max_tokens)}.")
    if max_tokens < 1:
        raise ParamsError(f"max_tokens: Input should be greater than or equal to 1{got(max_tokens)}.")
    _check_messages(params.get("messages"))
    system = params.get("system")
    if system is not None and not isinstance(system, str) and not (
            isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in system)):
        raise ParamsError("system: must be a string or an array of text blocks.")
    if params.get("stream") not in (None, False):
        raise ParamsError("stream: a batched request cannot stream; leave it out.")
    metadata = params.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise ParamsError("metadata: must be an object.")
        extra = sorted(set(metadata) - {"user_id"})
        if extra:
            raise ParamsError(f"metadata.{clipped(extra[0])}: Extra inputs are not permitted.")
    refused = refused_everywhere(params)
    if refused:
        raise ParamsError(refused)
    model = svc.catalog.lookup(name)
    if model is None or not may_use_model(account, model.id):
        raise ParamsError(f"model: {clipped(name)}", kind="not_found_error", code="model_not_found")
    if model.auto:
        raise ParamsError(f"model: '{name}' is an auto model; auto models cannot be used in a batch.",
                       code="model_not_found")
    if not model.serves(MESSAGES_ENDPOINT):
        raise ParamsError(f"model: '{name}' does not serve Messages requests.", code="unsupported_endpoint")
    assert model.backend is not None
    problem = backend_refusal(model, MESSAGES_ENDPOINT, params)  # what a translation to its backend cannot carry
    if problem:
        raise ParamsError(problem)
    return model.id


def _check_messages(messages: object) -> None:
    if messages is None:
        raise ParamsError("messages: Field required (a non-empty array).")
    if not isinstance(messages, list):
        raise ParamsError(f"messages: Input should be a valid list{got(messages)}.")
    if not messages:
        raise ParamsError("messages: List should have at least 1 item.")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise ParamsError(f"messages[{i}].role: must be 'user' or 'assistant'.")
        content = message.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(isinstance(b, dict) and isinstance(b.get("type"), str)
                                                    for b in content):
            raise ParamsError(f"messages[{i}].content: must be a string or an array of content blocks, each with "
                           "a type.")
