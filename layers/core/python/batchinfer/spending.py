"""A batch's spending cap (`max_cost_usd`), as arithmetic: the worst case a request's attempt can cost, and
what settling that attempt gives back. Pure: the writes that hold the cap are the ledger's.

How the cap holds. The batch item keeps `committed_usd`: what its settled attempts cost, plus the worst
case of every attempt claimed and not yet settled (and of every attempt whose cost stayed unknown). A
claim adds its requests' worst cases to it in the very update that already advances the lane (or takes a
retry's slot), fenced on `committed_usd <= cap - worst` (a DynamoDB condition cannot add two attributes, so
the claimer computes `cap - worst`; the cap it read is fenced too). Settling an attempt adds
`actual - worst` back in the write that already adds its cost to the batch. Spend never passes what is
committed, and what is committed never passes the cap.

Why the input bound is sound. A request's input tokens are bounded by the length in bytes of its line in
`requests.jsonl` (`{"custom_id": ..., "body": {...}}`, JSON with every non-ASCII character escaped): the
backends' tokenizers are byte-level BPE (or SentencePiece with byte fallback), whose every token stands for
at least one byte of the UTF-8 text, and JSON escaping only lengthens the text; what the chat template adds
(a role marker and an end marker, a handful of tokens per message, and the generation prompt) is paid for
many times over by the JSON each message takes (`{"role":"user","content":""}` alone is 28 bytes) and by the
line's own keys. Images, audio and documents are not text: their tokens have no bound from their size, so
a capped batch refuses them.
"""

from __future__ import annotations

from .catalog import Model
from .domain import storable_number
from .errors import InvalidRequest, clipped

CAP_PARAM = "max_cost_usd"
# Slack for the sums of binary floats: a start's fence keeps this much below the cap.
EPSILON_USD = 1e-9
# The body fields that bound an answer's tokens, per endpoint (embeddings answer no tokens at all).
OUTPUT_LIMITS = {"/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
                 "/v1/messages": ("max_tokens",), "/v1/responses": ("max_output_tokens",)}
NO_OUTPUT = ("/v1/embeddings",)
# Content parts whose tokens do not follow from their bytes.
NOT_TEXT = {"image_url", "image", "input_image", "input_audio", "audio", "document", "input_file", "file"}


def parse_cap(value: object) -> float | None:
    """The `max_cost_usd` of a create or retry body: None when absent, else a positive number the batch item
    can hold (400 naming it if not: a magnitude DynamoDB cannot store, 5e-324 or 1e200, would fail the write)."""
    if value is None:
        return None
    cap = None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        try:
            cap = float(value)
        except OverflowError:  # an integer past a double's range
            cap = None
    if cap is None or not storable_number(cap):
        raise InvalidRequest("max_cost_usd must be a positive number of US dollars from 1e-130 to under 1e+126, "
                             f"not {_shown(value)}.", param=CAP_PARAM)
    return cap


def _shown(value: object) -> str:
    """A refused value as a message quotes it: short, whatever it was."""
    try:
        return clipped(repr(value))
    except ValueError:  # an integer of more digits than Python prints
        return "a number of too many digits"


def _holds_non_text(value: object) -> bool:
    if isinstance(value, dict):
        if value.get("type") in NOT_TEXT:
            return True
        return any(_holds_non_text(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_non_text(v) for v in value)
    return False


def output_limit(model: Model, endpoint: str, body: dict) -> int | None:
    """The output tokens a request may be charged for: its own max_tokens (or max_completion_tokens,
    max_output_tokens), else the model's output limit from the catalog; None when neither says."""
    if endpoint in NO_OUTPUT:
        return 0
    for name in OUTPUT_LIMITS.get(endpoint, ("max_completion_tokens", "max_tokens", "max_output_tokens")):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value if model.max_output_tokens is None else min(value, model.max_output_tokens)
    return model.max_output_tokens


def output_bound(model: Model, endpoint: str, body: dict) -> int | None:
    """The most output tokens the request can be charged for (`output_limit`); None when that is unbounded
    or its input is not text (a capped batch refuses it)."""
    if _holds_non_text(body.get("messages")) or _holds_non_text(body.get("input")):
        return None
    return output_limit(model, endpoint, body)


def worst_usd(model: Model, line_bytes: int, out_bound: int) -> float:
    """The most one attempt of a request can cost: its line's bytes as input tokens (see the module's
    docstring), its output bound as output tokens, at the catalog's prices."""
    return model.cost_usd(line_bytes, out_bound)


def settled_delta(worst: float, ran: bool, cost_usd: float, cost_known: bool) -> float:
    """What settling an attempt adds to `committed_usd`: `actual - worst` for an attempt that ran with a
    known cost; nothing when its cost is unknown (its worst case stays counted); `-worst` when it never ran."""
    if not ran:
        return -worst
    return cost_usd - worst if cost_known else 0.0


def fits(committed: float, cap: float, worst: float) -> bool:
    return committed + worst <= cap - EPSILON_USD


def cap_reached_error(cap: float, spent: float) -> dict:
    """The batch's `error` once its cap stopped it."""
    return {"code": "max_cost_reached",
            "message": f"Stopped at the spending cap: max_cost_usd is {cap:.6g} USD and {spent:.6g} USD was spent; "
                       "the next request's worst case would have passed the cap."}
