"""The Converse translation tables (providers.converse): chat completions and Anthropic Messages to Converse
requests and Converse answers back, embeddings to InvokeModel bodies; every refusal names its parameter."""

from __future__ import annotations

import base64
import json

import pytest

from batchinfer.providers import converse_answers
from batchinfer.providers.bedrock_embeddings import embedding_bodies, to_embeddings, vectors_of
from batchinfer.providers.converse import CHAT_REFUSED, MESSAGES_REFUSED, from_chat, from_messages, refusal
from batchinfer.providers.converse_answers import to_chat_completion, to_message
from batchinfer.translating import Untranslatable

FEATURES = ("images", "top_k", "documents")
PNG_BYTES = b"\x89PNG\r\n\x1a\n0000"
PNG = base64.b64encode(PNG_BYTES).decode()
USER = [{"role": "user", "content": "Hi"}]


def chat(**extra) -> dict:
    return {"model": "m", "messages": USER, **extra}


def params(**extra) -> dict:
    return {"model": "m", "max_tokens": 10, "messages": USER, **extra}


# --- chat completions -> Converse -------------------------------------------------------------------------------

def test_chat_system_turns_sampling_and_stop():
    request = from_chat(chat(messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "system", "content": [{"type": "text", "text": "Kind."}]},
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"}, {"role": "user", "content": "And again"}],
        max_completion_tokens=50, max_tokens=99, temperature=0.5, top_p=0.9, stop="END", user="u-1", n=1,
        stream=False, logprobs=False, parallel_tool_calls=True, response_format={"type": "text"}), FEATURES)
    assert request == {
        "system": [{"text": "Be brief."}, {"text": "Kind."}],
        "messages": [{"role": "user", "content": [{"text": "Hi"}]},
                     {"role": "assistant", "content": [{"text": "Hello"}]},
                     # consecutive turns of one role are one Converse message
                     {"role": "user", "content": [{"text": "Again"}, {"text": "And again"}]}],
        "inferenceConfig": {"maxTokens": 50, "temperature": 0.5, "topP": 0.9, "stopSequences": ["END"]},
        "requestMetadata": {"user": "u-1"}}


def test_chat_tools_calls_results_and_images():
    request = from_chat(chat(
        tools=[{"type": "function", "function": {"name": "f", "description": "", "parameters": {"type": "object"},
                                                 "strict": True}}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        messages=[{"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image_url", "image_url": {
            "url": f"data:image/png;base64,{PNG}", "detail": "auto"}}]},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": 1}'}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "one"},
                  {"role": "user", "content": "Thanks"}]), FEATURES)
    assert request["toolConfig"] == {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object"}},
                                                             "strict": True}}],
                                     "toolChoice": {"tool": {"name": "f"}}}
    assert request["messages"] == [
        {"role": "user", "content": [{"text": "Look"}, {"image": {"format": "png", "source": {"bytes": PNG_BYTES}}}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "c1", "name": "f", "input": {"q": 1}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "c1", "content": [{"text": "one"}]}},
                                     {"text": "Thanks"}]}]
    assert from_chat(chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required"),
                     FEATURES)["toolConfig"]["toolChoice"] == {"any": {}}
    assert "toolConfig" not in from_chat(chat(tool_choice="auto"), FEATURES)


@pytest.mark.parametrize("name", sorted(CHAT_REFUSED))
def test_every_chat_parameter_converse_cannot_carry_is_refused_by_name(name):
    refused_value = {"n": 2, "logprobs": True, "top_logprobs": 2, "logit_bias": {"1": 2}, "seed": 1,
                     "presence_penalty": 0.5, "frequency_penalty": 0.5, "response_format": {"type": "json_object"},
                     "reasoning_effort": "low", "parallel_tool_calls": False,
                     "stream_options": {"include_obfuscation": False}, "store": True, "metadata": {"a": "b"},
                     "service_tier": "flex", "functions": [{"name": "f"}], "function_call": "auto",
                     "audio": {"voice": "x"}, "modalities": ["text", "audio"], "prediction": {"type": "content"},
                     "web_search_options": {}}[name]
    with pytest.raises(Untranslatable, match=rf"^{name}: "):
        from_chat(chat(**{name: refused_value}), FEATURES)
    assert refusal("/v1/chat/completions", chat(**{name: refused_value}), FEATURES).startswith(f"{name}: ")


@pytest.mark.parametrize(("body", "param"), [
    (chat(unknown_thing=1), "unknown_thing"),
    (chat(top_k=5), "top_k"),  # the model's features leave top_k out (below)
    (chat(tool_choice="none", tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice"),
    (chat(tool_choice="required"), "tool_choice"),
    (chat(tools=[{"type": "custom", "custom": {"name": "f"}}]), "tools[0]"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "extra": 1}}]), "tools[0].function.extra"),
    (chat(user="ü" * 3), "user"),
    (chat(messages=[{"role": "user", "content": "a", "name": "bob"}]), "messages[0].name"),
    (chat(messages=[{"role": "function", "content": "a", "name": "f"}]), "messages[0].name"),
    (chat(messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]), "messages[1]"),
    (chat(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]),
     "messages[0].content[0]"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]),
     "messages[0].content[0].image_url.url"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": f"data:image/png;base64,{PNG}", "detail": "high"}}]}]), "messages[0].content[0].image_url.detail"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": f"data:image/tiff;base64,{PNG}"}}]}]), "messages[0].content[0].image_url"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,not base64!"}}]}]), "messages[0].content[0].image_url"),
    (chat(messages=[{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]),
     "messages[0].tool_calls[0].function.arguments"),
    (chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
])
def test_chat_refusals_name_the_parameter(body, param):
    problem = refusal("/v1/chat/completions", body, ("images",))
    assert problem is not None and problem.startswith(f"{param}: "), problem


def test_images_need_the_feature():
    body = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": f"data:image/png;base64,{PNG}"}}]}])
    assert refusal("/v1/chat/completions", body, ()).startswith("messages[0].content[0].image_url: images are not")
    assert refusal("/v1/chat/completions", body, ("images",)) is None


# --- Anthropic Messages -> Converse -----------------------------------------------------------------------------

def test_messages_system_blocks_tools_results_documents_and_top_k():
    pdf = base64.b64encode(b"%PDF-1.4").decode()
    request = from_messages(params(
        system=[{"type": "text", "text": "Be brief."}], temperature=0.1, top_p=0.8, top_k=5, stop_sequences=["##"],
        metadata={"user_id": "u-1"}, thinking={"type": "disabled"}, service_tier="auto",
        tools=[{"name": "f", "description": "F", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": False},
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "Read"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": PNG}},
            {"type": "document", "title": "Report (2024)", "source": {"type": "base64", "media_type": "application/pdf",
                                                                       "data": pdf}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Calling"},
                                              {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                          "content": [{"type": "text", "text": "broke"}]}]},
            {"role": "assistant", "content": "Prefilled"}]), FEATURES)
    assert request == {
        "system": [{"text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [
                {"text": "Read"}, {"image": {"format": "jpeg", "source": {"bytes": PNG_BYTES}}},
                {"document": {"format": "pdf", "name": "Report (2024)", "source": {"bytes": b"%PDF-1.4"}}}]},
            {"role": "assistant", "content": [{"text": "Calling"},
                                              {"toolUse": {"toolUseId": "t1", "name": "f", "input": {"a": 1}}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "broke"}],
                                                         "status": "error"}}]},
            {"role": "assistant", "content": [{"text": "Prefilled"}]}],  # Converse continues a final assistant turn
        "inferenceConfig": {"maxTokens": 10, "temperature": 0.1, "topP": 0.8, "stopSequences": ["##"]},
        "toolConfig": {"tools": [{"toolSpec": {"name": "f", "description": "F",
                                               "inputSchema": {"json": {"type": "object"}}}}],
                       "toolChoice": {"any": {}}},
        "additionalModelRequestFields": {"top_k": 5},
        "requestMetadata": {"user_id": "u-1"}}


@pytest.mark.parametrize("name", sorted(MESSAGES_REFUSED))
def test_every_messages_parameter_converse_cannot_carry_is_refused_by_name(name):
    refused_value = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "cache_control": {"type": "ephemeral"},
                     "output_config": {"effort": "low"}, "output_format": {"type": "json_schema"},
                     "context_management": {}, "inference_geo": "us", "diagnostics": {}, "service_tier": "priority",
                     "speed": "fast", "stream": True, "container": "c", "mcp_servers": []}[name]
    problem = refusal("/v1/messages", params(**{name: refused_value}), FEATURES)
    assert problem is not None and problem.startswith(f"{name}: "), problem


@pytest.mark.parametrize(("body", "param"), [
    (params(other=1), "other"),
    (params(top_k=3), "top_k"),
    (params(metadata={"session": "x"}), "metadata.session"),
    (params(tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0]"),
    (params(tools=[{"name": "f", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]),
     "tools[0].cache_control"),
    (params(tool_choice={"type": "none"}, tools=[{"name": "f", "input_schema": {}}]), "tool_choice.type"),
    (params(tool_choice={"type": "auto", "disable_parallel_tool_use": True}, tools=[{"name": "f", "input_schema": {}}]),
     "tool_choice.disable_parallel_tool_use"),
    (params(system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]), "system[0].cache_control"),
    (params(messages=[{"role": "user", "content": [{"type": "text", "text": "a", "citations": [{"x": 1}]}]}]),
     "messages[0].content[0].citations"),
    (params(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x"}}]}]),
     "messages[0].content[0].source"),
    (params(messages=[{"role": "user", "content": [{"type": "document", "source": {
        "type": "text", "media_type": "text/plain", "data": "x"}}]}]), "messages[0].content[0].source"),
    (params(messages=[{"role": "user", "content": [{"type": "document", "title": "a  b", "source": {
        "type": "base64", "media_type": "application/pdf", "data": PNG}}]}]), "messages[0].content[0].title"),
    (params(messages=[{"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]}]),
     "messages[0].content[0]"),
    (params(messages=[{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]),
     "messages[0].content[0]"),
    (params(messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "document", "source": {}}]}]}]), "messages[0].content[0].content[0]"),
])
def test_messages_refusals_name_the_parameter(body, param):
    problem = refusal("/v1/messages", body, ("images", "documents"))
    assert problem is not None and problem.startswith(f"{param}: "), problem


def test_documents_need_the_feature():
    body = params(messages=[{"role": "user", "content": [{"type": "document", "source": {
        "type": "base64", "media_type": "application/pdf", "data": PNG}}]}])
    assert refusal("/v1/messages", body, ("images",)).startswith("messages[0].content[0]: document blocks are not")
    assert refusal("/v1/messages", body, ("documents",)) is None


# --- Converse answers -> chat completion / message -------------------------------------------------------------

ANSWER = {"output": {"message": {"role": "assistant", "content": [
    {"text": "Let me look."}, {"toolUse": {"toolUseId": "tooluse_1", "name": "f", "input": {"q": "x"}}}]}},
    "stopReason": "tool_use", "usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15,
                                        "cacheReadInputTokens": 4, "cacheWriteInputTokens": 2},
    "metrics": {"latencyMs": 3}, "ResponseMetadata": {"RequestId": "r-1"}}


def test_a_converse_answer_as_a_chat_completion():
    completion = to_chat_completion(ANSWER, "claude", "r-1", 1700000000)
    assert completion["object"] == "chat.completion" and completion["model"] == "claude"
    assert completion["created"] == 1700000000 and completion["id"].startswith("chatcmpl-")
    [choice] = completion["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": "Let me look.", "refusal": None, "tool_calls": [
        {"id": "tooluse_1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"q": "x"})}}]}
    assert completion["usage"] == {"prompt_tokens": 16, "completion_tokens": 5, "total_tokens": 21,
                                   "prompt_tokens_details": {"cached_tokens": 4}}


def test_a_converse_answer_as_a_message():
    message = to_message(ANSWER, "claude", "r-1")
    assert message["type"] == "message" and message["id"].startswith("msg_") and message["stop_reason"] == "tool_use"
    assert message["content"] == [{"type": "text", "text": "Let me look."},
                                  {"type": "tool_use", "id": "tooluse_1", "name": "f", "input": {"q": "x"}}]
    assert message["usage"] == {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 4,
                                "cache_creation_input_tokens": 2}


@pytest.mark.parametrize(("stop", "finish", "reason"), [
    ("end_turn", "stop", "end_turn"), ("stop_sequence", "stop", "stop_sequence"),
    ("max_tokens", "length", "max_tokens"),
    ("tool_use", "tool_calls", "tool_use"), ("guardrail_intervened", "content_filter", "refusal"),
    ("content_filtered", "content_filter", "refusal"),
    ("model_context_window_exceeded", "length", "model_context_window_exceeded"),
])
def test_every_stop_reason_maps_both_ways(stop, finish, reason):
    answer = {"output": {"message": {"role": "assistant", "content": [{"text": "x"}]}}, "stopReason": stop}
    assert to_chat_completion(answer, "m", "r", 0)["choices"][0]["finish_reason"] == finish
    message = to_message(answer, "m", "r", ("##",))
    assert message["stop_reason"] == reason
    assert message["stop_sequence"] == ("##" if stop == "stop_sequence" else None)


def test_an_answer_that_cannot_be_shown_is_an_error():
    odd = {"output": {"message": {"role": "assistant", "content": [{"video": {}}]}}, "stopReason": "end_turn"}
    with pytest.raises(ValueError, match=r"content\[0\]"):
        to_chat_completion(odd, "m", "r", 0)
    with pytest.raises(ValueError, match="no message"):
        to_message({"output": {}}, "m", "r")


# --- embeddings -----------------------------------------------------------------------------------------------

def test_embedding_bodies_per_format_and_the_list_back():
    assert embedding_bodies({"model": "m", "input": ["a", "b"], "dimensions": 256}, "titan") == [
        {"inputText": "a", "dimensions": 256}, {"inputText": "b", "dimensions": 256}]
    assert embedding_bodies({"model": "m", "input": "a", "user": "u"}, "cohere") == [
        {"texts": ["a"], "input_type": "search_document", "embedding_types": ["float"]}]
    assert vectors_of({"embedding": [0.5]}, "titan") == [[0.5]]
    assert vectors_of({"embeddings": {"float": [[1.0], [2.0]]}}, "cohere") == [[1.0], [2.0]]
    assert vectors_of({"embeddings": [[1.0]]}, "cohere") == [[1.0]]
    listed = to_embeddings([[0.5, 1.0]], "m", 3, "base64")
    assert base64.b64decode(listed["data"][0]["embedding"]) == b"\x00\x00\x00?\x00\x00\x80?"
    assert listed["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


@pytest.mark.parametrize(("body", "embedding_format", "param"), [
    ({"model": "m", "input": [[1, 2]]}, "titan", "input"),
    ({"model": "m", "input": "a", "dimensions": 256}, "cohere", "dimensions"),
    ({"model": "m", "input": "a", "extra": 1}, "titan", "extra"),
    ({"model": "m", "input": "a"}, None, "model"),
])
def test_embedding_refusals_name_the_parameter(body, embedding_format, param):
    assert refusal("/v1/embeddings", body, (), embedding_format).startswith(f"{param}: ")


def test_responses_are_not_served():
    assert "not served" in refusal("/v1/responses", {"model": "m", "input": "x"}, ())


def test_the_stop_and_finish_tables_cover_every_converse_stop_reason():
    import botocore.loaders

    model = botocore.loaders.Loader().load_service_model("bedrock-runtime", "service-2")
    reasons = set(model["shapes"]["StopReason"]["enum"]) - {"malformed_model_output", "malformed_tool_use"}
    assert reasons <= set(converse_answers.FINISH_REASONS) and reasons <= set(converse_answers.STOP_REASONS)


def test_converse_stream_events_as_chat_chunks():
    stream = converse_answers.StreamedChat("claude", "r-1", 7)
    chunks = [c for event in (
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "Hi"}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"contentBlockStart": {"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t1", "name": "f"}}}},
        {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"q":'}}}},
        {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": ' 1}'}}}},
        {"messageStop": {"stopReason": "tool_use"}},
        {"metadata": {"usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}, "metrics": {}}})
        for c in stream.feed(event)]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hi"},
                      {"tool_calls": [{"index": 0, "id": "t1", "type": "function",
                                       "function": {"name": "f", "arguments": ""}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]},
                      {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}, {}]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                                                                   "total_tokens": 7}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["created"] for c in chunks} == {7}


def test_a_json_schema_response_format_is_carried_where_the_model_takes_it():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = chat(response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                                                         "strict": True}})
    request = from_chat(body, ("structured_outputs",))
    assert request["outputConfig"] == {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": {
        "schema": json.dumps(schema), "name": "answer"}}}}
    assert refusal("/v1/chat/completions", body, ("images",)).startswith("response_format: ")
    refused = chat(response_format={"type": "json_object"})
    assert refusal("/v1/chat/completions", refused, ("structured_outputs",)).startswith("response_format: ")
    missing = chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert refusal("/v1/chat/completions", missing, ("structured_outputs",)).startswith(
        "response_format.json_schema.schema: ")


def test_structured_outputs_is_a_bedrock_feature_only():
    from batchinfer.catalog import Backend

    assert "structured_outputs" in Backend(kind="bedrock", model_id="m", region="us-east-1",
                                           features=["structured_outputs"]).features
    with pytest.raises(ValueError, match="structured_outputs"):
        Backend(kind="openai", base_url="http://x/v1", features=["structured_outputs"])


def test_thinking_goes_through_for_a_model_with_the_feature_and_comes_back_as_thinking_blocks():
    thinking = {"type": "enabled", "budget_tokens": 2048}
    body = params(thinking=thinking, top_k=4, messages=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s1"},
                                          {"type": "redacted_thinking", "data": PNG},
                                          {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}])
    request = from_messages({**body, "tools": [{"name": "f", "input_schema": {}}]}, ("thinking", "top_k"))
    assert request["additionalModelRequestFields"] == {"top_k": 4, "thinking": thinking}
    assert request["messages"][1]["content"][:2] == [
        {"reasoningContent": {"reasoningText": {"text": "hm", "signature": "s1"}}},
        {"reasoningContent": {"redactedContent": PNG_BYTES}}]
    assert refusal("/v1/messages", params(thinking=thinking), ()).startswith("thinking: ")
    answer = {"output": {"message": {"role": "assistant", "content": [
        {"reasoningContent": {"reasoningText": {"text": "so", "signature": "s2"}}},
        {"reasoningContent": {"redactedContent": PNG_BYTES}}, {"text": "Yes"}]}}, "stopReason": "end_turn"}
    assert to_message(answer, "m", "r")["content"] == [{"type": "thinking", "thinking": "so", "signature": "s2"},
                                                       {"type": "redacted_thinking", "data": PNG},
                                                       {"type": "text", "text": "Yes"}]
    assert to_chat_completion(answer, "m", "r", 0)["choices"][0]["message"]["content"] == "Yes"
