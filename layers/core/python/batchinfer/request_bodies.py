"""What each endpoint accepts in a request body: the types and ranges of its known parameters, the way an
OpenAI-compatible server checks them (`"temperature": "hot"` is a 400, not something to run). Unknown
parameters pass through to the backend, as they would if sent to it directly.

pydantic models in strict mode (no "0.5" read as 0.5, no 1 read as true; an integer is still a number),
rather than hand-written checks; not the `openai` package's TypedDicts, because the service must not depend
at run time on a client SDK's release cadence, and those types say nothing of ranges.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from .catalog import CHAT_ENDPOINT as CHAT

EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"

Number = StrictFloat  # strict: an integer is a number, a string or a boolean is not
Temperature = Annotated[Number, Field(ge=0, le=2)]
Probability = Annotated[Number, Field(ge=0, le=1)]
Penalty = Annotated[Number, Field(ge=-2, le=2)]
PositiveInt = Annotated[StrictInt, Field(ge=1)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: StrictStr = Field(min_length=1)
    user: StrictStr | None = None
    metadata: dict[StrictStr, StrictStr] | None = None


class _ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[dict[str, Any]] | None = None
    name: StrictStr | None = None


class ChatCompletionBody(_Body):
    messages: list[_ChatMessage] = Field(min_length=1)
    temperature: Temperature | None = None
    top_p: Probability | None = None
    n: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=4)] | None = None
    seed: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    logit_bias: dict[StrictStr, Annotated[Number, Field(ge=-100, le=100)]] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    stream: StrictBool | None = None
    reasoning_effort: StrictStr | None = None


class EmbeddingBody(_Body):
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: PositiveInt | None = None


class ResponseBody(_Body):
    input: StrictStr | list[dict[str, Any]]
    instructions: StrictStr | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    max_output_tokens: PositiveInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: StrictBool | None = None
    stream: StrictBool | None = None
    background: StrictBool | None = None


BODIES: dict[str, type[_Body]] = {CHAT: ChatCompletionBody, EMBEDDINGS: EmbeddingBody, RESPONSES: ResponseBody}


_BRANCH_TYPES = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "union"})
_BRANCH_PREFIXES = ("constrained-", "function-", "literal", "lax-", "strict-", "json-or-python")


def _where(loc: tuple) -> str:
    out = "body"
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _BRANCH_TYPES or "[" in str(part) or str(part).startswith(_BRANCH_PREFIXES):
            continue  # pydantic's names for the branch of a union it tried, not a place in the body
        else:
            out += f".{part}"
    return out


def got(value: object) -> str:
    """What a message says of the value it refuses: ` (got 'x')` for a short scalar, else nothing."""
    return f" (got {value!r})" if isinstance(value, str | int | float | bool) and len(repr(value)) <= 60 else ""


def body_problem(endpoint: str, body: dict) -> str | None:
    """What is wrong with a body's known parameters for its endpoint, naming the parameter; None if nothing."""
    model = BODIES.get(endpoint)
    if model is None:
        return None
    try:
        model.model_validate(body)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        message = first["msg"][0].lower() + first["msg"][1:]
        return f"{_where(first['loc'])}: {message}{got(first.get('input'))}"
    return None
