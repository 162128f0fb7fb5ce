"""Chat completions and Anthropic Messages requests to Amazon Bedrock's Converse API. Pure: stdlib only, no I/O
(`providers.bedrock` sends what this builds). Converse's answers go back to a chat completion or a message in
`providers.converse_answers`; embeddings requests go to InvokeModel bodies in `providers.bedrock_embeddings`.

The rule is `messages_to_chat`'s (and the walk over messages is `translating`'s, shared with it): nothing is
ever silently dropped. A parameter Converse cannot carry makes the request fail at intake with a message naming
it first (`tool_choice`, `messages[2].content[0].image_url`), so nobody gets an answer to a question other than
the one they asked. A key whose value is null counts as absent. One walk both checks and builds (`refusal` runs
the builder and keeps only its complaint), so intake and the call can never disagree.

Converse's request takes raw bytes for images and documents (boto3 encodes them for the wire), so a base64
image is decoded here; a URL image is refused (Converse reads only bytes or S3).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Collection
from typing import Any

from ..catalog import CHAT_ENDPOINT, MESSAGES_ENDPOINT
from ..translating import Untranslatable, content_blocks, not_a_parameter, refused_everywhere, turns
from .bedrock_embeddings import EMBEDDINGS_ENDPOINT, embedding_bodies

_TO = "Amazon Bedrock (Converse)"
_NOT_A_PARAMETER = not_a_parameter(_TO)
_IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}
# Converse's requestMetadata: at most 256 characters of these (botocore's service model).
_METADATA_VALUE = re.compile(r"[a-zA-Z0-9\s:_@$#=/+,\-.]{0,256}")
# A Converse document's name: letters, digits, single spaces, hyphens, parentheses, square brackets.
_DOCUMENT_NAME = re.compile(r"(?!.*\s\s)[A-Za-z0-9\-()\[\] ]{1,200}")


def _never(_: Any) -> bool:
    return False


def _falsy(value: Any) -> bool:
    return not value


# Chat-completions parameters Converse has no counterpart for: (when the value asks for nothing, why not).
# A value the test accepts carries no meaning and is let through; any other is refused, naming the parameter.
CHAT_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v == 1, "Converse answers one choice; only n=1 can be asked"),
    "logprobs": (lambda v: v is False, "Converse reports no log probabilities"),
    "top_logprobs": (_never, "Converse reports no log probabilities"),
    "logit_bias": (_falsy, "Converse has no logit bias"),
    "seed": (_never, "Converse takes no sampling seed"),
    "presence_penalty": (lambda v: v == 0, "Converse has no presence penalty"),
    "frequency_penalty": (lambda v: v == 0, "Converse has no frequency penalty"),
    # json_schema is carried for a model with the structured_outputs feature (`_output_config`).
    "response_format": (lambda v: isinstance(v, dict) and v.get("type") == "text",
                        "structured outputs (json_object, or json_schema without the model's structured_outputs "
                        "feature) are not carried to Converse"),
    "reasoning_effort": (_never, "reasoning effort is not carried to Converse"),
    "parallel_tool_calls": (lambda v: v is True, "Converse cannot forbid parallel tool calls"),
    # `stream` itself is the route's business (a batch refuses it; an interactive call streams ConverseStream).
    "stream_options": (lambda v: isinstance(v, dict) and set(v) <= {"include_usage"},
                       "only include_usage can be carried to a Converse stream"),
    "store": (lambda v: v is False, "chat completions are not stored"),
    "metadata": (_never, "stored-completion metadata has no Converse counterpart"),
    "service_tier": (lambda v: v in ("auto", "default"), "the service has one tier"),
    "functions": (_never, "legacy functions are not carried; send tools"),
    "function_call": (_never, "legacy function_call is not carried; send tool_choice"),
    "audio": (_never, "audio output is not carried to Converse"),
    "modalities": (lambda v: v == ["text"], "Converse answers text"),
    "prediction": (_never, "predicted outputs are not carried to Converse"),
    "web_search_options": (_never, "web search is not run by this service"),
}
_CHAT_CARRIED = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                           "top_k", "stop", "tools", "tool_choice", "user", "stream"})

# Messages parameters with no Converse counterpart: (when the value asks for nothing, why not).
MESSAGES_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    # Carried for a model with the thinking feature (`_thinking`).
    "thinking": (lambda v: isinstance(v, dict) and v.get("type") == "disabled",
                 "extended thinking is carried only to a model whose backend declares the thinking feature"),
    "cache_control": (_never, "prompt caching is not carried to Converse by this service"),
    "output_config": (_never, "output configuration (structured outputs, effort) is not carried to Converse"),
    "output_format": (_never, "structured outputs are not carried to Converse"),
    "context_management": (_never, "context management has no Converse counterpart"),
    "inference_geo": (_never, "the region is the catalog's (the model's backend region)"),
    "diagnostics": (_never, "diagnostics have no Converse counterpart"),
    "service_tier": (lambda v: v in ("auto", "standard_only"), "the service has one tier"),
    "speed": (lambda v: v == "standard", "Converse has one speed here"),
    "stream": (lambda v: v is False, "answers from Bedrock models are not streamed by this service"),
    "container": (_never, "code execution containers are not run by this service"),
    "mcp_servers": (_never, "MCP servers are not run by this service"),
}
_MESSAGES_CARRIED = frozenset({"model", "messages", "max_tokens", "system", "metadata", "stop_sequences",
                               "temperature", "top_p", "top_k", "tools", "tool_choice"})



# --- checking ---------------------------------------------------------------------------------------------------

def refusal(endpoint: str, body: dict, features: Collection[str], embedding_format: str | None = None
            ) -> str | None:
    """What in a request of `endpoint` a Bedrock model with these features cannot carry, as a message naming
    the parameter, or None."""
    try:
        if endpoint == CHAT_ENDPOINT:
            from_chat(body, features)
        elif endpoint == MESSAGES_ENDPOINT:
            from_messages(body, features)
        elif endpoint == EMBEDDINGS_ENDPOINT:
            embedding_bodies(body, embedding_format)
        else:
            return f"{endpoint} is not served by Amazon Bedrock models"
    except Untranslatable as problem:
        return str(problem)
    return None


def _refuse_table(body: dict, carried: frozenset[str], table: dict[str, tuple[Callable[[Any], bool], str]],
                  also: Callable[[str, Any], bool] = lambda key, value: False) -> None:
    """Refuse what the table refuses (or any key it does not know), but what `also` says is carried."""
    for key, value in body.items():
        if value is None or key in carried or also(key, value):
            continue
        if key in table:
            harmless, why = table[key]
            if not harmless(value):
                raise Untranslatable(f"{key}: {why}")
            continue
        raise Untranslatable(f"{key}: {_NOT_A_PARAMETER}")


def _inference_config(max_tokens: Any, temperature: Any, top_p: Any, stop: Any) -> dict:
    config: dict[str, Any] = {}
    for name, value in (("maxTokens", max_tokens), ("temperature", temperature), ("topP", top_p)):
        if value is not None:
            config[name] = value
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    return config


def _request_metadata(name: str, key: str, value: Any) -> dict:
    """An end-user id as Converse's requestMetadata (it reaches the invocation logs, as OpenAI's `user` and
    Anthropic's `metadata.user_id` reach theirs)."""
    if not isinstance(value, str) or not _METADATA_VALUE.fullmatch(value):
        raise Untranslatable(f"{name}: Converse request metadata takes at most 256 letters, digits, spaces and "
                             ":_@$#=/+,-. characters")
    return {"requestMetadata": {key: value}}


def _top_k(value: Any, features: Collection[str]) -> dict:
    if value is None:
        return {}
    if "top_k" not in features:
        raise Untranslatable("top_k: top_k sampling is not accepted by this model's backend")
    return {"additionalModelRequestFields": {"top_k": value}}


def _image_bytes(media_type: Any, data: Any, path: str, features: Collection[str]) -> dict:
    if "images" not in features:
        raise Untranslatable(f"{path}: images are not accepted by this model's backend")
    image_format = _IMAGE_FORMATS.get(media_type) if isinstance(media_type, str) else None
    if image_format is None:
        raise Untranslatable(f"{path}: image type {media_type!r} cannot be carried to {_TO} "
                             f"(png, jpeg, gif or webp)")
    return {"image": {"format": image_format, "source": {"bytes": _decoded(data, path)}}}


def _decoded(data: Any, path: str) -> bytes:
    try:
        return base64.b64decode(data if isinstance(data, str) else "", validate=True)
    except (binascii.Error, ValueError):
        raise Untranslatable(f"{path}: the data is not valid base64") from None


def _merged(messages: list[dict]) -> list[dict]:
    """Consecutive messages of one role as one message: Converse wants the roles to alternate."""
    out: list[dict] = []
    for message in messages:
        if out and out[-1]["role"] == message["role"]:
            out[-1]["content"].extend(message["content"])
        else:
            out.append(message)
    return out


def _tool_spec(name: Any, description: Any, schema: Any, strict: Any, path: str) -> dict:
    if not isinstance(name, str) or not name:
        raise Untranslatable(f"{path}.name: a tool needs a name")
    spec: dict[str, Any] = {"name": name, "inputSchema": {"json": schema if isinstance(schema, dict)
                                                          else {"type": "object", "properties": {}}}}
    if description:  # Converse refuses an empty description
        spec["description"] = description
    if strict is not None:
        spec["strict"] = strict
    return {"toolSpec": spec}


def _tool_config(tools: list[dict], choice: dict | None, path: str) -> dict:
    if not tools:
        if choice is not None:
            raise Untranslatable(f"{path}: a tool choice needs tools, and the request has none")
        return {}
    config: dict[str, Any] = {"tools": tools}
    if choice is not None:
        config["toolChoice"] = choice
    return {"toolConfig": config}


# --- request: chat completion -> Converse ---------------------------------------------------------------------

def from_chat(body: dict, features: Collection[str]) -> dict:
    """The Converse request (without modelId) for a chat-completions body; raises Untranslatable."""
    if not isinstance(body, dict):
        raise Untranslatable("body: expected a JSON object")
    schema_carried = "structured_outputs" in features
    _refuse_table(body, _CHAT_CARRIED, CHAT_REFUSED, lambda key, value: schema_carried and key == "response_format"
                  and isinstance(value, dict) and value.get("type") == "json_schema")
    system, messages = _chat_messages(body.get("messages"), features)
    request: dict[str, Any] = {"messages": messages}
    if system:
        request["system"] = system
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    config = _inference_config(max_tokens, body.get("temperature"), body.get("top_p"), body.get("stop"))
    if config:
        request["inferenceConfig"] = config
    tools = [_chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(body.get("tools") or [])]
    request.update(_tool_config(tools, _chat_tool_choice(body.get("tool_choice"), bool(tools)), "tool_choice"))
    request.update(_top_k(body.get("top_k"), features))
    request.update(_output_config(body.get("response_format"), features))
    if body.get("user") is not None:
        request.update(_request_metadata("user", "user", body["user"]))
    return request


def _output_config(response_format: Any, features: Collection[str]) -> dict:
    """A json_schema response_format as Converse's outputConfig, for a model that takes it (else refused)."""
    if not (isinstance(response_format, dict) and response_format.get("type") == "json_schema"
            and "structured_outputs" in features):
        return {}
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise Untranslatable("response_format.json_schema.schema: a JSON schema object is needed")
    for key, value in spec.items():
        if key not in ("name", "schema", "strict", "description") and value is not None:
            raise Untranslatable(f"response_format.json_schema.{key}: {_NOT_A_PARAMETER}")
    definition = {"schema": json.dumps(spec["schema"])}  # Converse takes the schema as JSON text
    definition.update({k: spec[k] for k in ("name", "description") if spec.get(k)})
    # strict or not, Converse holds the answer to the schema: stricter than asked, never looser.
    return {"outputConfig": {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": definition}}}}


def _chat_messages(messages: Any, features: Collection[str]) -> tuple[list[dict], list[dict]]:
    if not isinstance(messages, list) or not messages:
        raise Untranslatable("messages: expected a non-empty list of messages")
    system: list[dict] = []
    out: list[dict] = []
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(message, dict):
            raise Untranslatable(f"{path}: expected an object with a role")
        role = message.get("role")
        allowed = {"role", "content", *({"assistant": ["tool_calls"], "tool": ["tool_call_id"]}.get(role, []))}
        for key, value in message.items():
            if key not in allowed and value is not None:
                raise Untranslatable(f"{path}.{key}: {_NOT_A_PARAMETER}")
        content = message.get("content")
        if role in ("system", "developer"):
            if out:  # Converse's system prompt comes before the conversation; moving it would change the question
                raise Untranslatable(f"{path}: a {role} message after the conversation began cannot be carried to "
                                     f"{_TO} (its system prompt comes first)")
            system += [{"text": t} for t in _chat_texts(content, f"{path}.content") if t]
        elif role == "user":
            out.append({"role": "user", "content": _chat_user(content, f"{path}.content", features)})
        elif role == "assistant":
            out.append({"role": "assistant", "content": _chat_assistant(message, path)})
        elif role == "tool":
            result = {"toolUseId": message.get("tool_call_id"),
                      "content": [{"text": t} for t in _chat_texts(content, f"{path}.content")] or [{"text": ""}]}
            if not isinstance(result["toolUseId"], str):
                raise Untranslatable(f"{path}.tool_call_id: a tool message needs the id of the call it answers")
            out.append({"role": "user", "content": [{"toolResult": result}]})
        else:
            raise Untranslatable(f"{path}.role: role {role!r} cannot be carried to {_TO}")
    merged = _merged(out)
    for message in merged:  # tool results lead a user turn, as Converse (and Claude) want them
        message["content"].sort(key=lambda block: "toolResult" not in block)
    return system, merged


def _chat_texts(content: Any, path: str) -> list[str]:
    if content is None or isinstance(content, str):
        return [content] if content else []
    if not isinstance(content, list):
        raise Untranslatable(f"{path}: expected a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise Untranslatable(f"{path}[{j}]: a {kind!r} part cannot be carried here (text only)")
        texts.append(part["text"])
    return texts


def _chat_user(content: Any, path: str, features: Collection[str]) -> list[dict]:
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, list):
        raise Untranslatable(f"{path}: expected a string or a list of parts")
    blocks = []
    for j, part in enumerate(content):
        where = f"{path}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            blocks.append({"text": part["text"]})
        elif kind == "image_url":
            blocks.append(_chat_image(part.get("image_url"), f"{where}.image_url", features))
        else:
            raise Untranslatable(f"{where}: a {kind!r} part cannot be carried to {_TO}")
    return blocks


def _chat_image(image: Any, path: str, features: Collection[str]) -> dict:
    if not isinstance(image, dict):
        raise Untranslatable(f"{path}: expected an object with a url")
    if image.get("detail") not in (None, "auto"):
        raise Untranslatable(f"{path}.detail: image detail cannot be carried to {_TO}")
    url = image.get("url")
    match = re.fullmatch(r"data:([\w.+-]+/[\w.+-]+);base64,(.*)", url, re.DOTALL) if isinstance(url, str) else None
    if match is None:
        raise Untranslatable(f"{path}.url: only base64 data URLs can be carried to {_TO} (it reads no web URLs)")
    return _image_bytes(match.group(1), match.group(2), path, features)


def _chat_assistant(message: dict, path: str) -> list[dict]:
    blocks = [{"text": t} for t in _chat_texts(message.get("content"), f"{path}.content") if t]
    for k, call in enumerate(message.get("tool_calls") or []):
        where = f"{path}.tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise Untranslatable(f"{where}: only function tool calls can be carried to {_TO}")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            raise Untranslatable(f"{where}.function.arguments: not JSON") from None
        if not isinstance(arguments, dict):
            raise Untranslatable(f"{where}.function.arguments: not a JSON object")
        if not isinstance(call.get("id"), str) or not isinstance(function.get("name"), str):
            raise Untranslatable(f"{where}: a tool call needs an id and a function name")
        blocks.append({"toolUse": {"toolUseId": call["id"], "name": function["name"], "input": arguments}})
    return blocks


def _chat_tool(tool: Any, path: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise Untranslatable(f"{path}: only function tools can be carried to {_TO} (not {kind!r})")
    function = tool["function"]
    for key, value in function.items():
        if key not in ("name", "description", "parameters", "strict") and value is not None:
            raise Untranslatable(f"{path}.function.{key}: {_NOT_A_PARAMETER}")
    return _tool_spec(function.get("name"), function.get("description"), function.get("parameters"),
                      function.get("strict"), f"{path}.function")


def _chat_tool_choice(choice: Any, has_tools: bool) -> dict | None:
    if choice is None or (choice == "auto" and not has_tools):
        return None
    if choice == "auto":
        return {"auto": {}}
    if choice == "required":
        return {"any": {}}
    if choice == "none":
        raise Untranslatable(f"tool_choice: 'none' cannot be carried to {_TO} (Converse has no choice that "
                             "forbids tools); leave the tools out instead")
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        return {"tool": {"name": choice["function"].get("name")}}
    raise Untranslatable(f"tool_choice: {choice!r} cannot be carried to {_TO}")


# --- request: Anthropic Messages -> Converse --------------------------------------------------------------------

def from_messages(params: dict, features: Collection[str]) -> dict:
    """The Converse request (without modelId) for Messages params; raises Untranslatable."""
    if not isinstance(params, dict):
        raise Untranslatable("params: expected a JSON object")
    if (refused := refused_everywhere(params)) is not None:
        raise Untranslatable(refused)
    thinks = "thinking" in features
    _refuse_table(params, _MESSAGES_CARRIED, MESSAGES_REFUSED, lambda key, value: thinks and key == "thinking")
    request: dict[str, Any] = {"messages": _messages(params.get("messages"), features)}
    system = _system(params.get("system"))
    if system:
        request["system"] = system
    config = _inference_config(params.get("max_tokens"), params.get("temperature"), params.get("top_p"),
                               params.get("stop_sequences"))
    if config:
        request["inferenceConfig"] = config
    tools = [_message_tool(tool, f"tools[{i}]") for i, tool in enumerate(params.get("tools") or [])]
    request.update(_tool_config(tools, _message_tool_choice(params.get("tool_choice"), bool(tools)), "tool_choice"))
    request.update(_top_k(params.get("top_k"), features))
    thinking = params.get("thinking")
    if thinks and isinstance(thinking, dict) and thinking.get("type") != "disabled":
        # As Anthropic's API takes it: Bedrock hands additionalModelRequestFields to the model as they are.
        request.setdefault("additionalModelRequestFields", {})["thinking"] = thinking
    metadata = params.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise Untranslatable("metadata: expected an object")
        for key, value in metadata.items():
            if key != "user_id" and value is not None:
                raise Untranslatable(f"metadata.{key}: {_NOT_A_PARAMETER}")
        if metadata.get("user_id") is not None:
            request.update(_request_metadata("metadata.user_id", "user_id", metadata["user_id"]))
    return request


def _system(system: Any) -> list[dict]:
    if system is None or isinstance(system, str):
        return [{"text": system}] if system else []
    if not isinstance(system, list):
        raise Untranslatable("system: expected a string or a list of text blocks")
    out = []
    for k, block in enumerate(system):
        path = f"system[{k}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise Untranslatable(f"{path}: only text blocks can be carried in a system prompt")
        text = _text(block, path)
        if text:
            out.append({"text": text})
    return out


def _check_block(block: dict, path: str, fields: set[str]) -> None:
    if block.get("cache_control") is not None:
        raise Untranslatable(f"{path}.cache_control: prompt caching is not carried to Converse by this service")
    for key, value in block.items():
        if key not in fields | {"type", "cache_control"} and value is not None:
            raise Untranslatable(f"{path}.{key}: not a field of a {block['type']} block this service can carry "
                                 f"to {_TO}")


def _text(block: dict, path: str) -> str:
    _check_block(block, path, {"text", "citations"})
    if block.get("citations"):
        raise Untranslatable(f"{path}.citations: citations are not carried to Converse by this service")
    if not isinstance(block.get("text"), str):
        raise Untranslatable(f"{path}.text: expected a string")
    return block["text"]


def _messages(messages: Any, features: Collection[str]) -> list[dict]:
    out = []
    for _, path, role, content in turns(messages, _TO, non_empty=True):
        if isinstance(content, str):
            out.append({"role": role, "content": [{"text": content}]})
            continue
        if not isinstance(content, list):
            raise Untranslatable(f"{path}.content: expected a string or a list of content blocks")
        blocks = [_block(block, block_path, role, features)
                  for block_path, block in content_blocks(content, f"{path}.content")]
        out.append({"role": role, "content": blocks})
    return _merged(out)


def _block(block: dict, path: str, role: str, features: Collection[str]) -> dict:
    kind = block["type"]
    if kind == "text":
        return {"text": _text(block, path)}
    if kind == "image" and role == "user":
        _check_block(block, path, {"source"})
        source = block.get("source") if isinstance(block.get("source"), dict) else {}
        if source.get("type") != "base64":
            raise Untranslatable(f"{path}.source: image source type {source.get('type')!r} cannot be carried to "
                                 f"{_TO} (base64 only)")
        return _image_bytes(source.get("media_type"), source.get("data"), path, features)
    if kind == "document" and role == "user":
        return _document(block, path, features)
    if kind == "tool_use" and role == "assistant":
        _check_block(block, path, {"id", "name", "input"})
        if not isinstance(block.get("input"), dict) or not isinstance(block.get("id"), str):
            raise Untranslatable(f"{path}: a tool_use block needs an id and an object input")
        return {"toolUse": {"toolUseId": block["id"], "name": block.get("name"), "input": block["input"]}}
    if kind == "tool_result" and role == "user":
        return _tool_result(block, path, features)
    if kind in ("thinking", "redacted_thinking") and role == "assistant" and "thinking" in features:
        if kind == "thinking":
            _check_block(block, path, {"thinking", "signature"})
            return {"reasoningContent": {"reasoningText": {"text": block.get("thinking") or "",
                                                           "signature": block.get("signature") or ""}}}
        _check_block(block, path, {"data"})
        return {"reasoningContent": {"redactedContent": _decoded(block.get("data"), f"{path}.data")}}
    if kind in ("thinking", "redacted_thinking"):
        raise Untranslatable(f"{path}: thinking blocks are carried only to a model whose backend declares the "
                             "thinking feature")
    raise Untranslatable(f"{path}: {kind!r} blocks cannot be carried to {_TO} in {role} messages")


def _document(block: dict, path: str, features: Collection[str]) -> dict:
    if "documents" not in features:
        raise Untranslatable(f"{path}: document blocks are not accepted by this model's backend")
    _check_block(block, path, {"source", "title", "citations", "context"})
    if block.get("citations") not in (None, {"enabled": False}):
        raise Untranslatable(f"{path}.citations: citations are not carried to Converse by this service")
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") != "base64" or source.get("media_type") != "application/pdf":
        raise Untranslatable(f"{path}.source: only base64 PDF documents can be carried to {_TO}")
    title = block.get("title") or "document"
    if not _DOCUMENT_NAME.fullmatch(title):
        raise Untranslatable(f"{path}.title: a Converse document name holds only letters, digits, single spaces, "
                             "hyphens, parentheses and square brackets")
    document: dict[str, Any] = {"format": "pdf", "name": title, "source": {"bytes": _decoded(source.get("data"),
                                                                                               f"{path}.source.data")}}
    if block.get("context") is not None:
        document["context"] = block["context"]
    return {"document": document}


def _tool_result(block: dict, path: str, features: Collection[str]) -> dict:
    _check_block(block, path, {"tool_use_id", "content", "is_error"})
    content = block.get("content")
    if content is None or isinstance(content, str):
        blocks = [{"text": content or ""}]
    elif isinstance(content, list):
        blocks = []
        for k, inner in enumerate(content):
            where = f"{path}.content[{k}]"
            if isinstance(inner, dict) and inner.get("type") in ("text", "image"):
                blocks.append(_block(inner, where, "user", features))
            else:
                kind = inner.get("type") if isinstance(inner, dict) else None
                raise Untranslatable(f"{where}: {kind!r} blocks inside a tool_result cannot be carried to {_TO}")
    else:
        raise Untranslatable(f"{path}.content: expected a string or a list of content blocks")
    result: dict[str, Any] = {"toolUseId": block.get("tool_use_id"), "content": blocks}
    if block.get("is_error"):
        result["status"] = "error"
    return {"toolResult": result}


def _message_tool(tool: Any, path: str) -> dict:
    if not isinstance(tool, dict):
        raise Untranslatable(f"{path}: expected an object")
    if tool.get("cache_control") is not None:
        raise Untranslatable(f"{path}.cache_control: prompt caching is not carried to Converse by this service")
    for key, value in tool.items():
        if key not in ("type", "name", "description", "input_schema", "strict", "cache_control") and value is not None:
            raise Untranslatable(f"{path}.{key}: not a tool field this service can carry to {_TO}")
    return _tool_spec(tool.get("name"), tool.get("description"), tool.get("input_schema"), tool.get("strict"), path)


def _message_tool_choice(choice: Any, has_tools: bool) -> dict | None:
    if choice is None:
        return None
    if not isinstance(choice, dict):
        raise Untranslatable("tool_choice: expected an object")
    kind = choice.get("type")
    if choice.get("disable_parallel_tool_use"):
        raise Untranslatable("tool_choice.disable_parallel_tool_use: Converse cannot forbid parallel tool use")
    for key, value in choice.items():
        if key not in ("type", "name", "disable_parallel_tool_use") and value is not None:
            raise Untranslatable(f"tool_choice.{key}: {_NOT_A_PARAMETER}")
    if kind == "auto":
        return {"auto": {}} if has_tools else None
    if kind == "any":
        return {"any": {}}
    if kind == "tool":
        return {"tool": {"name": choice.get("name")}}
    if kind == "none":
        raise Untranslatable(f"tool_choice.type: 'none' cannot be carried to {_TO} (Converse has no choice that "
                             "forbids tools); leave the tools out instead")
    raise Untranslatable(f"tool_choice.type: {kind!r} cannot be carried to {_TO}")
