"""The service against a real OpenAI-compatible server: llama-cpp-python's, running a tiny model made here, and
llama.cpp's own llama-server for the prompt cache order (test_llama_server_prompt_cache.py).

Opt-in: `make test-real-backend` sets REAL_BACKEND_TESTS=1 (and builds .venv-real-backend and llama-server
first). Without it, nothing here is collected, so `make test` and a plain `pytest` never start a model server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

if os.environ.get("REAL_BACKEND_TESTS") != "1":
    collect_ignore_glob = ["test_*.py"]

from local.llama_server import make_model  # noqa: E402
from tests.e2e.conftest import local_stack  # noqa: E402
from tests.real_backend.backends import (  # noqa: E402
    ALIAS,
    BUILD_HINT,
    REAL_PYTHON,
    LlamaServer,
    RecordingProxy,
)

# Prices of the catalog's models (USD per million tokens): unround, so a cost computed from other numbers
# than the server's usage would not match by chance.
CHAT_PRICE = {"input_per_mtok": 0.37, "output_per_mtok": 1.21}
EMBED_PRICE = {"input_per_mtok": 0.013, "output_per_mtok": 0.0}
BUDGET = 4  # each model's batch budget: requests in flight at once


@pytest.fixture(scope="session")
def model_file(tmp_path_factory) -> Path:
    if not os.access(REAL_PYTHON, os.X_OK):
        pytest.fail(f"{REAL_PYTHON} does not exist: {BUILD_HINT}", pytrace=False)
    return make_model(tmp_path_factory.mktemp("model") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def chat_server(model_file, tmp_path_factory) -> Iterator[LlamaServer]:
    server = LlamaServer(model_file, tmp_path_factory.mktemp("logs") / "chat-server.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def embed_server(model_file, tmp_path_factory) -> Iterator[LlamaServer]:
    """A second instance made for embeddings (llama.cpp computes embeddings only in a context made for them)."""
    server = LlamaServer(model_file, tmp_path_factory.mktemp("logs") / "embed-server.log", embedding=True).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def proxy(chat_server, embed_server) -> Iterator[RecordingProxy]:
    recording = RecordingProxy({"chat": chat_server.url, "embed": embed_server.url}).start()
    yield recording
    recording.stop()


def catalog_text(proxy_url: str, chat_url: str) -> str:
    """Three models on the real server: chat and embeddings through the recording proxy, and chat straight to
    the server (the outage test kills and starts that one)."""
    def model(model_id: str, base_url: str, endpoint: str, price: dict) -> dict:
        return {"id": model_id, "backend": {"kind": "openai", "base_url": f"{base_url}/v1", "model": ALIAS},
                "batch_budget": BUDGET, "batch_floor": 1, "price": price, "endpoints": [endpoint]}

    return yaml.safe_dump({"models": [
        model("tiny-chat", f"{proxy_url}/chat", "/v1/chat/completions", CHAT_PRICE),
        model("tiny-embed", f"{proxy_url}/embed", "/v1/embeddings", EMBED_PRICE),
        model("tiny-chat-direct", chat_url, "/v1/chat/completions", CHAT_PRICE)]}, sort_keys=False)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, proxy, chat_server) -> Iterator[dict]:
    """The local stack (as `make run` starts it) with a catalog whose models run on the real server; a module's
    own, so that it is gone before another module's stack starts."""
    catalog = tmp_path_factory.mktemp("catalog") / "models.yaml"
    catalog.write_text(catalog_text(proxy.url, chat_server.url))
    with local_stack(tmp_path_factory, models_file=str(catalog), file_batches_enabled=True,
                     message_batches_enabled=True, embeddings_responses_batches_enabled=True) as running:
        yield running
