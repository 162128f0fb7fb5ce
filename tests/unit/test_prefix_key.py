"""A request's prefix key: requests a prompt cache would share a prefix between get the same key, others not."""

from batchinfer.layout import IndexEntry
from batchinfer.service.creating.prefix_key import PREFIX_BOUND, prefix_key

CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"


def chat(system: str | None, question: str, **extra: object) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"model": "m", "messages": messages, **extra}


def test_same_system_prompt_same_key_whatever_the_question() -> None:
    a, b = prefix_key(CHAT, chat("You are a tax lawyer.", "q1")), prefix_key(CHAT, chat("You are a tax lawyer.", "q2"))
    assert a is not None and a == b
    assert len(a) <= 12  # a few bytes in the index entry and the group item


def test_another_system_prompt_or_other_tools_another_key() -> None:
    base = prefix_key(CHAT, chat("You are a tax lawyer.", "q"))
    assert prefix_key(CHAT, chat("You are a chemist.", "q")) != base
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert prefix_key(CHAT, chat("You are a tax lawyer.", "q", tools=tools)) != base


def test_a_lone_question_shares_nothing() -> None:
    assert prefix_key(CHAT, chat(None, "just a question")) is None
    assert prefix_key("/v1/embeddings", {"model": "m", "input": "text"}) is None


def test_few_shot_turns_count_the_last_message_does_not() -> None:
    shots = [{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]
    one = {"model": "m", "messages": [*shots, {"role": "user", "content": "3+3"}]}
    two = {"model": "m", "messages": [*shots, {"role": "user", "content": "5+5"}]}
    assert prefix_key(CHAT, one) == prefix_key(CHAT, two) is not None


def test_only_the_bound_counts() -> None:
    long = "x" * PREFIX_BOUND
    assert prefix_key(CHAT, chat(long + "tail one", "q")) == prefix_key(CHAT, chat(long + "tail two", "q"))


def test_messages_up_to_the_last_cache_control_breakpoint() -> None:
    document = {"role": "user", "content": [{"type": "text", "text": "the document",
                                             "cache_control": {"type": "ephemeral"}},
                                            {"type": "text", "text": "question one"}]}
    other = {"role": "user", "content": [{"type": "text", "text": "the document",
                                          "cache_control": {"type": "ephemeral"}},
                                         {"type": "text", "text": "question two"}]}
    body = {"model": "m", "max_tokens": 5, "system": "sys", "messages": [document]}
    # The block with the breakpoint is part of what is cached, so the message holding it counts whole.
    assert prefix_key(MESSAGES, body) != prefix_key(MESSAGES, {**body, "messages": [other]})
    cached_system = [{"type": "text", "text": "long instructions", "cache_control": {"type": "ephemeral"}}]
    one = {"model": "m", "max_tokens": 5, "system": cached_system, "messages": [{"role": "user", "content": "a"}]}
    two = {**one, "messages": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"},
                               {"role": "user", "content": "d"}]}
    assert prefix_key(MESSAGES, one) == prefix_key(MESSAGES, two) is not None


def test_messages_without_a_breakpoint_share_their_system_prompt() -> None:
    one = {"model": "m", "max_tokens": 5, "system": "sys", "messages": [{"role": "user", "content": "a"}]}
    two = {**one, "messages": [{"role": "user", "content": "b"}]}
    assert prefix_key(MESSAGES, one) == prefix_key(MESSAGES, two) is not None
    assert prefix_key(MESSAGES, {**one, "system": "other"}) != prefix_key(MESSAGES, one)


def test_responses_instructions() -> None:
    one = {"model": "m", "instructions": "be brief", "input": "a"}
    assert prefix_key(RESPONSES, one) == prefix_key(RESPONSES, {**one, "input": "b"}) is not None
    assert prefix_key(RESPONSES, {"model": "m", "input": "a"}) is None


def test_index_entries_stored_before_keys_read_without_one() -> None:
    assert IndexEntry.read(["c", "m", 0, 10, None]).prefix is None
    assert IndexEntry.read(["c", "m", 0, 10, None, "abc"]).prefix == "abc"
