"""The Messages <-> chat-completions translation (batchinfer.messages_to_chat): tables, one row per field."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from batchinfer import messages_to_chat
from batchinfer.messages_to_chat import FEATURES, to_chat, to_message, untranslatable
from batchinfer.translating import refused_everywhere

ALL = FEATURES
HI = [{"role": "user", "content": "hi"}]
CHAT_HI = [{"role": "user", "content": "hi"}]
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0"}
PDF = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0"}
WEATHER = {"name": "weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CHAT_WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                                 "parameters": WEATHER["input_schema"]}}


def params(**extra: Any) -> dict:
    return {"model": "claude-x", "max_tokens": 100, "messages": HI, **extra}


def user(*blocks: Any) -> dict:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: Any) -> dict:
    return {"role": "assistant", "content": list(blocks)}


def text(value: str, **extra: Any) -> dict:
    return {"type": "text", "text": value, **extra}


def tool_use(id_: str = "toolu_1", name: str = "weather", input_: Any = None) -> dict:
    return {"type": "tool_use", "id": id_, "name": name, "input": {"city": "Paris"} if input_ is None else input_}


def tool_result(content: Any = "sunny", id_: str = "toolu_1", **extra: Any) -> dict:
    return {"type": "tool_result", "tool_use_id": id_, "content": content, **extra}


def convo(*messages: dict) -> list[dict]:
    """A conversation ending in a user turn (a final assistant turn is a prefill, refused separately)."""
    return [*messages, {"role": "user", "content": "next"}]


CHAT_CALL = {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
NEXT = {"role": "user", "content": "next"}


# --- request: one row per field, Messages params in -> exact chat body out --------------------------------------

@pytest.mark.parametrize(("extra", "features", "expected"), [
    pytest.param({}, (), {"max_tokens": 100, "messages": CHAT_HI}, id="minimal"),
    pytest.param({"system": "be brief"}, (),
                 {"max_tokens": 100, "messages": [{"role": "system", "content": "be brief"}, *CHAT_HI]},
                 id="system-string"),
    pytest.param({"system": [text("one"), text("two")]}, (),
                 {"max_tokens": 100, "messages": [{"role": "system", "content": "one\n\ntwo"}, *CHAT_HI]},
                 id="system-blocks-joined"),
    pytest.param({"system": ""}, (), {"max_tokens": 100, "messages": CHAT_HI}, id="system-empty-carries-nothing"),
    pytest.param({"system": [text("s", cache_control=None, citations=None)]}, (),
                 {"max_tokens": 100, "messages": [{"role": "system", "content": "s"}, *CHAT_HI]},
                 id="null-fields-count-as-absent"),
    pytest.param({"stop_sequences": ["END", "STOP"]}, (),
                 {"max_tokens": 100, "messages": CHAT_HI, "stop": ["END", "STOP"]}, id="stop_sequences"),
    pytest.param({"stop_sequences": []}, (), {"max_tokens": 100, "messages": CHAT_HI}, id="stop_sequences-empty"),
    pytest.param({"temperature": 0.2}, (), {"max_tokens": 100, "messages": CHAT_HI, "temperature": 0.2},
                 id="temperature"),
    pytest.param({"top_p": 0.9}, (), {"max_tokens": 100, "messages": CHAT_HI, "top_p": 0.9}, id="top_p"),
    pytest.param({"top_k": 40}, ("top_k",), {"max_tokens": 100, "messages": CHAT_HI, "top_k": 40},
                 id="top_k-with-feature"),
    pytest.param({"metadata": {"user_id": "u-1"}}, (), {"max_tokens": 100, "messages": CHAT_HI, "user": "u-1"},
                 id="metadata-user_id"),
    pytest.param({"metadata": {}}, (), {"max_tokens": 100, "messages": CHAT_HI}, id="metadata-empty"),
    pytest.param({"thinking": {"type": "disabled"}}, (), {"max_tokens": 100, "messages": CHAT_HI},
                 id="thinking-disabled"),
    pytest.param({"service_tier": "auto"}, (), {"max_tokens": 100, "messages": CHAT_HI}, id="service_tier-auto"),
    pytest.param({"service_tier": "standard_only"}, (), {"max_tokens": 100, "messages": CHAT_HI},
                 id="service_tier-standard_only"),
    pytest.param({"speed": "standard"}, (), {"max_tokens": 100, "messages": CHAT_HI}, id="speed-standard"),
    pytest.param({"speed": None, "inference_geo": None, "diagnostics": None, "container": None,
                  "mcp_servers": None, "output_config": None, "cache_control": None}, (),
                 {"max_tokens": 100, "messages": CHAT_HI}, id="null-top-level-keys"),
    pytest.param({"stream": False}, (), {"max_tokens": 100, "messages": CHAT_HI}, id="stream-ignored"),
    pytest.param({"tools": [WEATHER]}, (), {"max_tokens": 100, "messages": CHAT_HI, "tools": [CHAT_WEATHER]},
                 id="tools"),
    pytest.param({"tools": [{"type": "custom", "name": "f", "input_schema": {"type": "object"}, "strict": True}]},
                 (), {"max_tokens": 100, "messages": CHAT_HI, "tools": [
                     {"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                       "strict": True}}]},
                 id="tools-custom-strict-no-description"),
    pytest.param({"tools": [WEATHER], "tool_choice": {"type": "auto"}}, (),
                 {"max_tokens": 100, "messages": CHAT_HI, "tools": [CHAT_WEATHER], "tool_choice": "auto"},
                 id="tool_choice-auto"),
    pytest.param({"tools": [WEATHER], "tool_choice": {"type": "any"}}, (),
                 {"max_tokens": 100, "messages": CHAT_HI, "tools": [CHAT_WEATHER], "tool_choice": "required"},
                 id="tool_choice-any"),
    pytest.param({"tools": [WEATHER], "tool_choice": {"type": "none"}}, (),
                 {"max_tokens": 100, "messages": CHAT_HI, "tools": [CHAT_WEATHER], "tool_choice": "none"},
                 id="tool_choice-none"),
    pytest.param({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "weather"}}, (),
                 {"max_tokens": 100, "messages": CHAT_HI, "tools": [CHAT_WEATHER],
                  "tool_choice": {"type": "function", "function": {"name": "weather"}}},
                 id="tool_choice-tool"),
    pytest.param({"tools": [WEATHER], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}, (),
                 {"max_tokens": 100, "messages": CHAT_HI, "tools": [CHAT_WEATHER], "tool_choice": "auto",
                  "parallel_tool_calls": False},
                 id="disable_parallel_tool_use"),
    pytest.param({"tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": False}}, (),
                 {"max_tokens": 100, "messages": CHAT_HI, "tools": [CHAT_WEATHER], "tool_choice": "required"},
                 id="disable_parallel_tool_use-false"),
    pytest.param({"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}, (),
                 {"max_tokens": 100, "messages": CHAT_HI}, id="tool_choice-auto-without-tools-omitted"),
    pytest.param({"tools": [], "tool_choice": {"type": "none"}}, (), {"max_tokens": 100, "messages": CHAT_HI},
                 id="tool_choice-none-with-empty-tools-omitted"),
])
def test_request_fields(extra: dict, features: tuple, expected: dict) -> None:
    p = params(**extra)
    assert refused_everywhere(p) is None
    assert untranslatable(p, features) is None
    assert to_chat(p, features) == expected


@pytest.mark.parametrize(("messages", "features", "expected"), [
    pytest.param([user(text("a"), text("b"))], (), [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], id="user-text-blocks-as-parts"),
    pytest.param(convo({"role": "assistant", "content": "sure"}), (),
                 [{"role": "assistant", "content": "sure"}, NEXT], id="assistant-string"),
    pytest.param(convo(assistant(text("a"), text("b"))), (), [{"role": "assistant", "content": "ab"}, NEXT],
                 id="assistant-text-blocks-one-string"),
    pytest.param([user(text("look"), {"type": "image", "source": PNG})], ("images",),
                 [{"role": "user", "content": [{"type": "text", "text": "look"}, {
                     "type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0"}}]}],
                 id="image-base64"),
    pytest.param([user({"type": "image", "source": {"type": "url", "url": "https://x/a.png"}})], ("images",),
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}],
                 id="image-url"),
    pytest.param([user({"type": "document", "source": PDF, "title": "report.pdf"}, text("sum up"))], ("documents",),
                 [{"role": "user", "content": [
                     {"type": "file", "file": {"filename": "report.pdf",
                                               "file_data": "data:application/pdf;base64,JVBERi0"}},
                     {"type": "text", "text": "sum up"}]}],
                 id="document-pdf-titled"),
    pytest.param([user({"type": "document", "source": PDF, "citations": {"enabled": False}})], ("documents",),
                 [{"role": "user", "content": [{"type": "file", "file": {
                     "filename": "document.pdf", "file_data": "data:application/pdf;base64,JVBERi0"}}]}],
                 id="document-pdf-untitled-citations-off"),
    pytest.param(convo(user(text("weather?")), assistant(text("Let me look. "), tool_use()), user(tool_result())),
                 (), [{"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                      {"role": "assistant", "content": "Let me look. ", "tool_calls": [CHAT_CALL]},
                      {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}, NEXT],
                 id="tool-round-trip"),
    pytest.param(convo(assistant(tool_use(), tool_use("toolu_2", "time", {"tz": "Zürich"}))), (),
                 [{"role": "assistant", "content": None, "tool_calls": [CHAT_CALL, {
                     "id": "toolu_2", "type": "function",
                     "function": {"name": "time", "arguments": '{"tz": "Zürich"}'}}]},
                  NEXT],
                 id="tool_use-only-content-none"),
    pytest.param([user(tool_result("a", "t1"), tool_result([text("b1"), text("b2")], "t2"), text("and?"))], (),
                 [{"role": "tool", "tool_call_id": "t1", "content": "a"},
                  {"role": "tool", "tool_call_id": "t2", "content": "b1\n\nb2"},
                  {"role": "user", "content": [{"type": "text", "text": "and?"}]}],
                 id="tool_results-before-the-rest"),
    pytest.param([user(tool_result(None, is_error=False))], (),
                 [{"role": "tool", "tool_call_id": "toolu_1", "content": ""}], id="tool_result-empty-not-error"),
    pytest.param([user(text("quoted", citations=[]))], (),
                 [{"role": "user", "content": [{"type": "text", "text": "quoted"}]}], id="text-empty-citations"),
])
def test_message_content(messages: list, features: tuple, expected: list) -> None:
    p = params(messages=messages)
    assert untranslatable(p, features) is None
    assert to_chat(p, features) == {"max_tokens": 100, "messages": expected}


# --- refused on every backend ------------------------------------------------------------------------------------

FILE_SOURCE = {"type": "file", "file_id": "file_1"}


@pytest.mark.parametrize(("extra", "message"), [
    ({"tools": [WEATHER, {"type": "web_search_20250305", "name": "web_search"}]},
     "tools[1]: server tools (type 'web_search_20250305') are not run by this service"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]},
     "tools[0]: server tools (type 'bash_20250124') are not run by this service"),
    ({"mcp_servers": [{"type": "url", "url": "https://mcp", "name": "m"}]},
     "mcp_servers: MCP servers are not run by this service"),
    ({"container": "cntr_1"}, "container: code execution containers are not run by this service"),
    ({"messages": [user({"type": "image", "source": FILE_SOURCE})]},
     "messages[0].content[0].source: Files API sources (type 'file') are not supported by this service"),
    ({"messages": [user(text("a"), {"type": "document", "source": FILE_SOURCE})]},
     "messages[0].content[1].source: Files API sources (type 'file') are not supported by this service"),
    ({"messages": [user(tool_result([text("x"), {"type": "image", "source": FILE_SOURCE}]))]},
     "messages[0].content[0].content[1].source: Files API sources (type 'file') are not supported by this service"),
    ({"system": [text("s"), {"type": "document", "source": FILE_SOURCE}]},
     "system[1].source: Files API sources (type 'file') are not supported by this service"),
    ({"messages": [user({"type": "container_upload", "file_id": "f"})]},
     "messages[0].content[0]: server tool blocks (type 'container_upload') are not run by this service"),
    ({"messages": [*HI, assistant({"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}), *HI]},
     "messages[1].content[0]: server tool blocks (type 'server_tool_use') are not run by this service"),
    ({"messages": [*HI, assistant({"type": "mcp_tool_use", "id": "m", "name": "n", "server_name": "s",
                                   "input": {}}), *HI]},
     "messages[1].content[0]: server tool blocks (type 'mcp_tool_use') are not run by this service"),
    ({"messages": [user({"type": "mcp_tool_result", "tool_use_id": "m", "content": "x"})]},
     "messages[0].content[0]: server tool blocks (type 'mcp_tool_result') are not run by this service"),
    ({"messages": [*HI, assistant({"type": "web_search_tool_result", "tool_use_id": "s", "content": []}), *HI]},
     "messages[1].content[0]: server tool blocks (type 'web_search_tool_result') are not run by this service"),
    ({"messages": [*HI, assistant({"type": "code_execution_tool_result", "tool_use_id": "s", "content": {}}), *HI]},
     "messages[1].content[0]: server tool blocks (type 'code_execution_tool_result') are not run by this service"),
])
def test_refused_everywhere(extra: dict, message: str) -> None:
    p = params(**extra)
    assert refused_everywhere(p) == message
    assert untranslatable(p, ALL) == message  # and so the chat route can never carry it
    with pytest.raises(ValueError, match="not (run|supported) by this service"):
        to_chat(p, ALL)


def test_plain_requests_are_not_refused() -> None:
    p = params(tools=[WEATHER, {**WEATHER, "type": "custom"}],
               messages=convo(user(text("a"), {"type": "image", "source": PNG}), assistant(tool_use()),
                              user(tool_result([text("x")]))))
    assert refused_everywhere(p) is None


# --- untranslatable: one row per parameter the chat route cannot carry -----------------------------------------

BACKEND = "this model's backend (an OpenAI-compatible server)"


@pytest.mark.parametrize(("extra", "features", "message"), [
    ({"thinking": {"type": "enabled", "budget_tokens": 2000}}, ALL,
     f"thinking: extended thinking cannot be carried to {BACKEND}"),
    ({"thinking": {"type": "adaptive"}}, ALL, f"thinking: extended thinking cannot be carried to {BACKEND}"),
    ({"top_k": 5}, ("images", "documents"), "top_k: top_k sampling is not accepted by this model's backend"),
    ({"metadata": {"user_id": "u", "session": "s"}}, ALL,
     "metadata.session: not a parameter this service can carry to an OpenAI-compatible backend"),
    ({"output_config": {"effort": "high"}}, ALL,
     f"output_config: output configuration (structured outputs, effort) cannot be carried to {BACKEND}"),
    ({"output_format": {"type": "json_schema", "schema": {}}}, ALL,
     f"output_format: structured outputs cannot be carried to {BACKEND}"),
    ({"cache_control": {"type": "ephemeral"}}, ALL, f"cache_control: prompt caching cannot be carried to {BACKEND}"),
    ({"context_management": {"edits": []}}, ALL,
     f"context_management: context management cannot be carried to {BACKEND}"),
    ({"inference_geo": "us"}, ALL, f"inference_geo: the choice of an inference region cannot be carried to {BACKEND}"),
    ({"diagnostics": {"x": 1}}, ALL, f"diagnostics: diagnostics cannot be carried to {BACKEND}"),
    ({"service_tier": "priority"}, ALL, "service_tier: service tier 'priority' is not offered by this service"),
    ({"speed": "fast"}, ALL, f"speed: speed 'fast' is not offered by {BACKEND}"),
    ({"frobnicate": 1}, ALL, "frobnicate: not a parameter this service can carry to an OpenAI-compatible backend"),
    ({"system": [text("s", cache_control={"type": "ephemeral"})]}, ALL,
     f"system[0].cache_control: prompt caching cannot be carried to {BACKEND}"),
    ({"system": [text("s", citations=[{"type": "char_location"}])]}, ALL,
     f"system[0].citations: citations cannot be carried to {BACKEND}"),
    ({"messages": [user(text("a"), {"type": "image", "source": PNG})]}, ("documents", "top_k"),
     "messages[0].content[1]: image blocks are not accepted by this model's backend"),
    ({"messages": convo(user(text("a")), assistant({"type": "image", "source": PNG}))}, ALL,
     "messages[1].content[0]: image blocks can only be carried in user messages"),
    ({"messages": [user({"type": "image", "source": {"type": "gcs", "uri": "x"}})]}, ALL,
     f"messages[0].content[0].source: image source type 'gcs' cannot be carried to {BACKEND}"),
    ({"messages": [user({"type": "document", "source": PDF})]}, ("images", "top_k"),
     "messages[0].content[0]: document blocks are not accepted by this model's backend"),
    ({"messages": [user({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}})]},
     ALL, f"messages[0].content[0].source: only base64 PDF documents can be carried to {BACKEND} "
          "(not source type 'text', media type 'text/plain')"),
    ({"messages": [user({"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}})]}, ALL,
     f"messages[0].content[0].source: only base64 PDF documents can be carried to {BACKEND} "
     "(not source type 'url', media type None)"),
    ({"messages": [user({"type": "document", "source": {"type": "content", "content": [text("x")]}})]}, ALL,
     f"messages[0].content[0].source: only base64 PDF documents can be carried to {BACKEND} "
     "(not source type 'content', media type None)"),
    ({"messages": [user({"type": "document", "source": PDF, "citations": {"enabled": True}})]}, ALL,
     f"messages[0].content[0].citations: citations cannot be carried to {BACKEND}"),
    ({"messages": [user({"type": "document", "source": PDF, "context": "a report"})]}, ALL,
     f"messages[0].content[0].context: document context cannot be carried to {BACKEND}"),
    ({"messages": [user(tool_result([text("x"), {"type": "image", "source": PNG}]))]}, ALL,
     f"messages[0].content[0].content[1]: image blocks inside a tool_result cannot be carried to {BACKEND} "
     "(OpenAI tool messages carry text only)"),
    ({"messages": [user(tool_result([{"type": "search_result", "source": "s", "title": "t", "content": []}]))]}, ALL,
     f"messages[0].content[0].content[0]: search_result blocks inside a tool_result cannot be carried to {BACKEND} "
     "(OpenAI tool messages carry text only)"),
    ({"messages": [user(tool_result("boom", is_error=True))]}, ALL,
     f"messages[0].content[0].is_error: tool errors cannot be carried to {BACKEND} "
     "(OpenAI tool messages have no error flag)"),
    ({"messages": [user(tool_result("x", cache_control={"type": "ephemeral"}))]}, ALL,
     f"messages[0].content[0].cache_control: prompt caching cannot be carried to {BACKEND}"),
    ({"messages": [user(tool_result([text("x", cache_control={"type": "ephemeral"})]))]}, ALL,
     f"messages[0].content[0].content[0].cache_control: prompt caching cannot be carried to {BACKEND}"),
    ({"messages": convo(user(text("q")), assistant({"type": "thinking", "thinking": "hm", "signature": "s"},
                                                   text("a")))}, ALL,
     f"messages[1].content[0]: thinking blocks cannot be carried to {BACKEND}"),
    ({"messages": convo(user(text("q")), assistant({"type": "redacted_thinking", "data": "x"}))}, ALL,
     f"messages[1].content[0]: thinking blocks cannot be carried to {BACKEND}"),
    ({"messages": [*HI, assistant(text("a")), user(text("b"), text("c", cache_control={"type": "ephemeral"}))]},
     ALL, f"messages[2].content[1].cache_control: prompt caching cannot be carried to {BACKEND}"),
    ({"messages": convo(assistant(tool_use() | {"cache_control": {"type": "ephemeral"}}))}, ALL,
     f"messages[0].content[0].cache_control: prompt caching cannot be carried to {BACKEND}"),
    ({"messages": [user({"type": "image", "source": PNG, "cache_control": {"type": "ephemeral"}})]}, ALL,
     f"messages[0].content[0].cache_control: prompt caching cannot be carried to {BACKEND}"),
    ({"messages": [user(text("a", citations=[{"type": "char_location", "cited_text": "x"}]))]}, ALL,
     f"messages[0].content[0].citations: citations cannot be carried to {BACKEND}"),
    ({"messages": [user({"type": "search_result", "source": "s", "title": "t", "content": [text("x")]})]}, ALL,
     f"messages[0].content[0]: search result blocks cannot be carried to {BACKEND}"),
    ({"messages": [user({"type": "hologram", "data": "x"})]}, ALL,
     f"messages[0].content[0]: 'hologram' blocks cannot be carried to {BACKEND}"),
    ({"messages": [user(text("a", sparkle=True))]}, ALL,
     "messages[0].content[0].sparkle: not a field of a text block this service can carry to an OpenAI-compatible "
     "backend"),
    ({"messages": [user(tool_use())]}, ALL, "messages[0].content[0]: tool_use blocks can only be carried in "
                                            "assistant messages"),
    ({"messages": convo(assistant(tool_result()))}, ALL,
     "messages[0].content[0]: tool_result blocks can only be carried in user messages"),
    ({"messages": [*HI, {"role": "assistant", "content": "The answer is"}]}, ALL,
     f"messages[1]: a final assistant message (prefill) cannot be carried to {BACKEND}"),
    ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, ALL,
     "messages[0].name: not a parameter this service can carry to an OpenAI-compatible backend"),
    ({"messages": [{"role": "system", "content": "x"}]}, ALL,
     "messages[0].role: role 'system' cannot be carried (expected 'user' or 'assistant')"),
    ({"tools": [WEATHER | {"cache_control": {"type": "ephemeral"}}]}, ALL,
     f"tools[0].cache_control: prompt caching cannot be carried to {BACKEND}"),
    ({"tools": [WEATHER | {"input_examples": [{"city": "Paris"}]}]}, ALL,
     "tools[0].input_examples: not a tool field this service can carry to an OpenAI-compatible backend"),
    ({"tools": [WEATHER | {"defer_loading": True}]}, ALL,
     "tools[0].defer_loading: not a tool field this service can carry to an OpenAI-compatible backend"),
    ({"tools": [WEATHER | {"allowed_callers": ["direct"]}]}, ALL,
     "tools[0].allowed_callers: not a tool field this service can carry to an OpenAI-compatible backend"),
    ({"tools": [WEATHER], "tool_choice": {"type": "sometimes"}}, ALL,
     f"tool_choice.type: 'sometimes' cannot be carried to {BACKEND}"),
    ({"tools": [WEATHER], "tool_choice": {"type": "auto", "name": "weather"}}, ALL,
     "tool_choice.name: not a parameter this service can carry to an OpenAI-compatible backend"),
    ({"tool_choice": {"type": "any"}}, ALL, "tool_choice: type 'any' needs tools, and the request has none"),
])
def test_untranslatable(extra: dict, features: tuple, message: str) -> None:
    p = params(**extra)
    assert refused_everywhere(p) is None
    assert untranslatable(p, features) == message
    with pytest.raises(ValueError) as raised:
        to_chat(p, features)
    assert str(raised.value) == message


def test_every_feature_is_needed_by_something() -> None:
    p = params(top_k=3, messages=[user({"type": "image", "source": PNG}, {"type": "document", "source": PDF})])
    assert untranslatable(p, ALL) is None
    for feature in FEATURES:
        assert untranslatable(p, set(FEATURES) - {feature}) is not None


def test_unknown_features_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown backend features"):
        untranslatable(params(), ("image",))
    with pytest.raises(ValueError, match="unknown backend features"):
        to_chat(params(), ("vision",))


def test_to_chat_does_not_touch_its_input() -> None:
    p = params(system=[text("s")], tools=[WEATHER], messages=convo(assistant(tool_use()), user(tool_result())))
    snapshot = repr(p)
    to_chat(p, ALL)
    assert repr(p) == snapshot


# --- answer: chat completion -> Anthropic message ----------------------------------------------------------------

def chat_answer(message: dict | None = None, finish: str | None = "stop", **choice: Any) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "backend-name",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello.", **(message or {})},
                         "finish_reason": finish, **choice}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}


MSG_ID = "msg_" + hashlib.sha256(b"chatcmpl-1").hexdigest()[:24]
HELLO = [{"type": "text", "text": "Hello."}]


def call(id_: str | None = "call_1", name: str = "weather", arguments: Any = '{"city": "Paris"}') -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(("answer", "stops", "expected"), [
    pytest.param(chat_answer(), (), {"content": HELLO, "stop_reason": "end_turn", "stop_sequence": None},
                 id="text-stop"),
    pytest.param(chat_answer(finish="length"), (), {"stop_reason": "max_tokens", "stop_sequence": None},
                 id="length"),
    pytest.param(chat_answer(finish=None), (), {"stop_reason": "end_turn"}, id="finish-none"),
    pytest.param(chat_answer(finish="eos"), (), {"stop_reason": "end_turn"}, id="finish-other"),
    pytest.param(chat_answer(stop_reason="END"), ("END",), {"stop_reason": "stop_sequence", "stop_sequence": "END"},
                 id="vllm-stop_reason-matches"),
    pytest.param(chat_answer(stop_reason="END"), ("OTHER",), {"stop_reason": "end_turn", "stop_sequence": None},
                 id="vllm-stop_reason-not-asked"),
    pytest.param(chat_answer(stop_reason=128001), ("END",), {"stop_reason": "end_turn", "stop_sequence": None},
                 id="vllm-stop-token-id"),
    pytest.param(chat_answer(finish="content_filter"), (), {"stop_reason": "refusal"}, id="content_filter"),
    pytest.param(chat_answer({"content": None, "refusal": "I can't help with that."}), (),
                 {"content": [{"type": "text", "text": "I can't help with that."}], "stop_reason": "refusal"},
                 id="refusal"),
    pytest.param(chat_answer({"content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo."}]}), (),
                 {"content": HELLO}, id="content-parts-joined"),
    pytest.param(chat_answer({"content": ""}), (), {"content": [], "stop_reason": "end_turn"}, id="empty-answer"),
    pytest.param(chat_answer({"content": None, "tool_calls": [call()]}, "tool_calls"), (),
                 {"content": [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}],
                  "stop_reason": "tool_use"},
                 id="tool_calls"),
    pytest.param(chat_answer({"content": "Checking.", "tool_calls": [call(), call("call_2", "time", "{}")]},
                             "tool_calls"), (),
                 {"content": [{"type": "text", "text": "Checking."},
                              {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
                              {"type": "tool_use", "id": "call_2", "name": "time", "input": {}}]},
                 id="text-then-tool_calls"),
    pytest.param(chat_answer({"content": None, "tool_calls": [call()]}, "stop"), (), {"stop_reason": "tool_use"},
                 id="vllm-named-tool_choice-finish-stop"),
    pytest.param(chat_answer({"content": None, "tool_calls": [call(None, arguments="")]}, "tool_calls"), (),
                 {"content": [{"type": "tool_use", "id": "toolu_" + hashlib.sha256(b"chatcmpl-1:0").hexdigest()[:24],
                               "name": "weather", "input": {}}]},
                 id="tool-call-without-id-or-arguments"),
    pytest.param(chat_answer({"content": None, "function_call": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
                             "function_call"), (),
                 {"content": [{"type": "tool_use", "id": "toolu_" + hashlib.sha256(b"chatcmpl-1:0").hexdigest()[:24],
                               "name": "weather", "input": {"city": "Oslo"}}], "stop_reason": "tool_use"},
                 id="legacy-function_call"),
    pytest.param(chat_answer({"reasoning_content": "Let me think"}), (), {"content": HELLO},
                 id="reasoning_content-not-carried"),
    pytest.param({**chat_answer(), "usage": None}, (), {"usage": {"input_tokens": 0, "output_tokens": 0}},
                 id="usage-missing"),
])
def test_answer_fields(answer: dict, stops: tuple, expected: dict) -> None:
    message = to_message(answer, "claude-x", stops)
    assert {k: message[k] for k in expected} == expected


def test_answer_whole_message() -> None:
    assert to_message(chat_answer(), "claude-x") == {
        "id": MSG_ID, "type": "message", "role": "assistant", "model": "claude-x", "content": HELLO,
        "stop_reason": "end_turn", "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 3}}


def test_answer_ids_are_stable_and_differ_by_answer() -> None:
    first = to_message(chat_answer(), "m")["id"]
    assert first == to_message(chat_answer(), "m")["id"]
    assert first != to_message({**chat_answer(), "id": "chatcmpl-2"}, "m")["id"]
    assert len(first) == len("msg_") + 24
    no_id = {k: v for k, v in chat_answer().items() if k != "id"}
    assert to_message(no_id, "m")["id"] == to_message(no_id, "m")["id"]


@pytest.mark.parametrize(("answer", "match"), [
    ({"id": "x", "choices": []}, "has 0 choices; exactly one was expected"),
    ({"id": "x"}, "has no choices; exactly one was expected"),
    ({**chat_answer(), "choices": chat_answer()["choices"] * 2}, "has 2 choices"),
    ({"id": "x", "choices": [{"finish_reason": "stop"}]}, r"choices\[0\].message: the backend's answer has no message"),
    ("not a dict", "not a JSON object"),
    (chat_answer({"tool_calls": [call(arguments="{not json")]}), r"tool_calls\[0\].function.arguments: not JSON"),
    (chat_answer({"tool_calls": [call(arguments="[1, 2]")]}), r"tool_calls\[0\].function.arguments: not a JSON object"),
    (chat_answer({"tool_calls": [{"id": "c", "type": "function", "function": {"arguments": "{}"}}]}),
     r"tool_calls\[0\].function: a tool call without a function name"),
    (chat_answer({"tool_calls": [{"id": "c", "type": "custom", "custom": {"name": "x", "input": "y"}}]}),
     r"tool_calls\[0\]: only function tool calls"),
    (chat_answer({"content": [{"type": "audio", "audio": {}}]}), r"content\[0\]: a 'audio' part cannot be carried"),
    (chat_answer({"content": 42}), "expected a string or a list of parts"),
])
def test_answer_errors(answer: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        to_message(answer, "claude-x")


def test_round_trip_tool_use_id() -> None:
    """A tool_use id the service hands out comes back as the chat tool_call_id, so a follow-up request works."""
    answer = to_message(chat_answer({"content": None, "tool_calls": [call("call_abc")]}, "tool_calls"), "m")
    follow_up = params(tools=[WEATHER], messages=convo(
        user(text("weather?")), {"role": "assistant", "content": answer["content"]},
        user(tool_result("sunny", answer["content"][0]["id"]))))
    body = to_chat(follow_up, ())
    assert body["messages"][1]["tool_calls"][0]["id"] == "call_abc"
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "call_abc", "content": "sunny"}


# --- a streamed answer ------------------------------------------------------------------------------------------

def chunk(delta: dict | None = None, finish: str | None = None, **extra: Any) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": choices}


def streamed(chunks: list[dict], stop_sequences: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    stream = messages_to_chat.MessageStream("claude-x", stop_sequences)
    return [event for c in chunks for event in stream.feed(c)] + stream.end()


def accumulated(events: list[tuple[str, dict]]) -> dict:
    """The message the events build, as the anthropic SDK's stream helper accumulates it."""
    message: dict = {}
    for name, data in events:
        assert name == data["type"]
        if name == "message_start":
            message = data["message"]
        elif name == "content_block_start":
            assert data["index"] == len(message["content"])
            message["content"].append({**data["content_block"], "json": ""})
        elif name == "content_block_delta":
            block, delta = message["content"][data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                block["json"] += delta["partial_json"]
        elif name == "message_delta":
            message.update(data["delta"])
            message["usage"] = data["usage"]
    for block in message["content"]:
        if block["type"] == "tool_use":
            block["input"] = json.loads(block["json"])
        block.pop("json")
    return message


def test_a_streamed_answer_builds_the_message_a_whole_answer_translates_to():
    calls = [{"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
             {"id": "call_b", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}}]
    whole = {"id": "chatcmpl-1", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me look.", "tool_calls": calls}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 12}}
    chunks = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Let"}), chunk({"content": " me look."})]
    for i, call in enumerate(calls):
        chunks.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                             "function": {"name": "weather", "arguments": ""}}]}))
        args = call["function"]["arguments"]
        chunks += [chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
                   for part in (args[:5], args[5:])]
    chunks += [chunk({}, "tool_calls"), {**chunk(), "usage": whole["usage"]}]
    events = streamed(chunks)
    expected = to_message(whole, "claude-x")
    built = accumulated(events)
    assert built["content"] == expected["content"]
    assert built["stop_reason"] == expected["stop_reason"] == "tool_use"
    assert built["usage"] == expected["usage"] and built["id"] == expected["id"]
    assert [n for n, _ in events][-2:] == ["message_delta", "message_stop"]


@pytest.mark.parametrize(("finish", "extra", "stops", "reason", "sequence"), [
    ("stop", {}, (), "end_turn", None),
    ("length", {}, (), "max_tokens", None),
    ("stop", {"stop_reason": "END"}, ("END",), "stop_sequence", "END"),
    ("content_filter", {}, (), "refusal", None),
])
def test_a_streamed_answer_stops_for_the_same_reasons(finish, extra, stops, reason, sequence):
    delta = dict(streamed([chunk({"content": "Hi"}), chunk({}, finish, **extra)], stops))["message_delta"]["delta"]
    assert (delta["stop_reason"], delta["stop_sequence"]) == (reason, sequence)


def test_a_streamed_refusal_is_text_and_stops_as_a_refusal():
    events = streamed([chunk({"refusal": "I can't help with that."}), chunk({}, "stop")])
    built = accumulated(events)
    assert built["content"] == [{"type": "text", "text": "I can't help with that."}]
    assert built["stop_reason"] == "refusal"
