"""The interactive endpoints on the local stack with the official SDKs at every major the e2e tests cover
(`openai` 3.x/2.x/1.x, `anthropic` 2.x/1.x), each in its own interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SDK_MAJORS
from tests.e2e.conftest import SdkRuns, local_stack

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).with_name("sdk_scripts") / "interactive_calls.py"
DUPLICATE_KEYS = Path(__file__).with_name("sdk_scripts") / "duplicate_keys.py"
MODEL = "glm-5.3-flash"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory, interactive_streaming_enabled=True) as running:
        yield running


@pytest.fixture(scope="module")
def runs(stack, sdk_python, tmp_path_factory):
    """Both scripts under every SDK major at once, each run under a new key of a pro account."""
    started = {script: SdkRuns(stack, sdk_python, script, SDK_MAJORS, tmp_path_factory.mktemp("sdk"), 120,
                               tier="pro", batch_access=None)
               for script in (SCRIPT, DUPLICATE_KEYS)}
    yield started
    for each in started.values():
        each.close()


@pytest.mark.parametrize("major", SDK_MAJORS)
def test_interactive_calls_with_the_official_sdks(runs, major):
    out = runs[SCRIPT].result(major)
    assert out["chat"]["object"] == "chat.completion" and out["chat"]["content"] and out["chat"]["model"] == MODEL
    assert all(n > 0 for n in out["chat"]["usage"])
    assert len(out["embeddings"]) == 2 and out["embeddings"][0] > 0
    assert out["responses"]["object"] == "response" and out["responses"]["text"]
    assert out["models"] == [MODEL, "qwen3.6-35b", "claude-bedrock", "auto", "auto-pro"]
    assert out["model"] == "qwen3.6-35b"
    assert out["auto"] == "qwen3.6-35b"
    status, param, message = out["refused"]
    assert status == 400 and param == "temperature" and "hot" in message
    assert out["not_found"] == [404, "model_not_found"]
    # stream: true arrives a word per chunk, adding up to the same answer, with the usage asked for
    streamed = out["chat_stream"]
    assert streamed["deltas"] > 3 and streamed["text"] == out["chat"]["content"]
    assert streamed["finish"] in ("stop", "length") and streamed["usage"] == out["chat"]["usage"]
    assert out["chat_stream_no_usage"] == []  # not asked for: not sent, though the service asks the backend
    assert out["responses_stream"] == [400, "stream"]
    if major != "openai1":  # that interpreter has only openai
        assert out["message"]["type"] == "message" and out["message"]["role"] == "assistant"
        assert out["message"]["text"] and out["message"]["stop_reason"] in ("end_turn", "max_tokens")
        assert out["message_not_found"] == [404, "NotFoundError"]
        streamed = out["message_stream"]
        assert streamed["pieces"] > 3 and streamed["text"] == streamed["final"] == out["message"]["text"]
        assert streamed["stop_reason"] == out["message"]["stop_reason"]
        assert streamed["usage"][0] > 0 and streamed["usage"][1] == out["message"]["output_tokens"]
        assert out["message_stream_tool"] == ["tool_use", "tool_use", "lookup", {"query": "Simulated"}]


@pytest.mark.parametrize("major", SDK_MAJORS)
def test_a_body_naming_a_key_twice_is_a_400_each_sdk_reads(runs, major):
    """A key named twice (sent by rewriting the bytes the SDK sends, and by plain httpx) is refused before any
    model runs, with an error each SDK raises as its BadRequestError, naming the key."""
    out = runs[DUPLICATE_KEYS].result(major)
    status, body = out["raw"]
    assert status == 400 and body["error"]["code"] == "duplicate_key" and body["error"]["param"] == "model", body
    status, code, param, message = out["openai"]
    assert (status, code, param) == (400, "duplicate_key", "model"), out["openai"]
    assert "model: the key 'model' is given more than once" in message, message  # "Error code: 400 - {...}"
    if major != "openai1":  # that interpreter has only openai
        status, name, kind, message = out["anthropic"]
        assert (status, name, kind) == (400, "BadRequestError", "invalid_request_error"), out["anthropic"]
        assert message.startswith("model: the key 'model' is given more than once"), message
