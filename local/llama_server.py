"""llama.cpp's own OpenAI-compatible server, `llama-server`, on 127.0.0.1: the backend whose prompt cache the
service's order is for (a cache per slot; a request takes the idle slot whose cached prompt shares the most of
it, and its evaluation starts where they part).

`make llama-server` builds it (CPU only) from the llama.cpp that the pinned llama-cpp-python sdist vendors, into
build/llama-server/bin; the models it runs are made by tests/real_backend/make_model.py in .venv-real-backend.
Used by the real-backend tests (tests/real_backend) and `bench/prompt_cache.py --llama-server`.

What it evaluated is read from its Prometheus counters (`--metrics`): `llamacpp:prompt_tokens_total` counts the
prompt tokens it processed, those it found in a slot's cache (or its RAM prompt cache) left out, and
`llamacpp:prompt_tokens_cached_total` the ones it reused. Each answer also carries `timings.prompt_n` (and
`timings.cache_n`), the same counts for that request.
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
from pathlib import Path

from local.servers import LoggedServer

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = ROOT / "build" / "llama-server" / "bin" / "llama-server"
REAL_PYTHON = ROOT / ".venv-real-backend" / "bin" / "python"
BUILD_HINT = "run `make llama-server` (it builds llama.cpp's server from requirements-real-backend.txt's sdist)"
SLOTS = 4  # --parallel: the slots, each with a prompt cache of its own
SLOT_CONTEXT = 3072  # tokens of context per slot: a 500-word system prompt of the tiny vocabulary and more


def real_env() -> dict[str, str]:
    """The environment of a process in the real-backend venv: nothing of the service's PYTHONPATH."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def make_model(out: Path, shape: str = "tiny") -> Path:
    """A GGUF model made by tests/real_backend/make_model.py in the real-backend venv (`shape`: its size)."""
    if not os.access(REAL_PYTHON, os.X_OK):
        raise RuntimeError(f"{REAL_PYTHON} does not exist: run `make real-backend`")
    subprocess.run([str(REAL_PYTHON), "-m", "tests.real_backend.make_model", str(out), "--shape", shape],
                   cwd=ROOT, env=real_env(), check=True, capture_output=True, text=True, timeout=300)
    return out


class LlamaCppServer(LoggedServer):
    """`llama-server` with `slots` slots (continuous batching, one thread), the model known as `alias`;
    started, stopped and started again on the same port (each start: every cache empty)."""

    def __init__(self, model: Path, log: Path, alias: str, slots: int = SLOTS, port: int | None = None,
                 binary: Path = LLAMA_SERVER, extra: tuple[str, ...] = ()) -> None:
        super().__init__(log, port)
        self.model, self.alias, self.slots, self.binary, self.extra = model, alias, slots, binary, extra

    def command(self) -> list[str]:
        return [str(self.binary), "--model", str(self.model), "--alias", self.alias, "--host", "127.0.0.1",
                "--port", str(self.port), "--parallel", str(self.slots), "--cont-batching",
                "--ctx-size", str(self.slots * SLOT_CONTEXT), "--threads", "1", "--threads-batch", "1",
                "--metrics", "--no-webui", *self.extra]

    def start(self, timeout: float = 120) -> LlamaCppServer:
        if not os.access(self.binary, os.X_OK):
            raise RuntimeError(f"{self.binary} does not exist: {BUILD_HINT}")
        # /health answers 503 while the model loads, 200 once the slots take requests.
        self.launch(self.command(), "/health", "llama-server", timeout, ROOT)
        return self

    def restart(self) -> LlamaCppServer:
        """The same server on the same port with every cache empty."""
        self.stop()
        return self.start()

    def metrics(self) -> dict[str, float]:
        """Its Prometheus counters and gauges, by name (`llamacpp:prompt_tokens_total`, ...)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        found = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                found[name] = float(value)
        return found

    def prompt_tokens_evaluated(self) -> int:
        """The prompt tokens it evaluated since it started (those found cached left out)."""
        return int(self.metrics()["llamacpp:prompt_tokens_total"])
