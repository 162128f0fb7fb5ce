"""Prompt cache order: does the service let a backend's prompt cache evaluate each shared prefix once?

8 system prompts of ~500 words, 6 short questions each (48 requests), answers of 4 tokens, on the simulated
backend with a per-slot prompt cache (llama.cpp's server: 4 slots, a request takes the idle slot whose cache
matches it best, slots share nothing) and a time per uncached prompt token (`--token-ms`), the model's batch
budget 4. Two files: grouped (written prompt by prompt) and shuffled. Against a direct asyncio client (httpx,
a semaphore of 4) sending the grouped file in submission order to the same backend, its cache emptied before
each run. Goals: the service's wall <= 0.5 of the direct client's on the grouped file and <= 0.8 on the
shuffled one (both against the direct client on the same file), and on the grouped file the prompt tokens the
backend evaluated (not found cached) <= 0.4 of what the direct client's submission order makes it evaluate.

With `--llama-server PATH` (`make llama-server` builds build/llama-server/bin/llama-server) the backend is
llama.cpp's own server instead, 4 slots, one thread, running a model tests/real_backend/make_model.py makes (in
.venv-real-backend; `--shape`, `medium` unless told): each direct client run on a fresh server, the service's
two files on another (every cache empty at each start); what it evaluated is its /metrics counter
`llamacpp:prompt_tokens_total`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.common import MODEL, backend_at, backend_process, command_line, create, local_stack, median, wait
from bench.throughput import POLL_SECONDS, direct
from local.llama_server import LlamaCppServer, make_model

PROMPTS, QUESTIONS, SLOTS = 8, 6, 4
WORDS = ("the of and to in is was for on that with as by at from it an be this are or which model cache "
         "request answer prompt slot batch token order share first").split()


def system_prompt(p: int, file: str) -> str:
    """Prompt `p` of a file: each file has prompts of its own, so that what a run of one left cached (in the
    backend, or known as answered in a pump still running) does not help the next."""
    rng = random.Random(f"{file}-{p}")
    words = " ".join(f"{rng.choice(WORDS)}{rng.randint(0, 999)}" for _ in range(500))
    return f"You are assistant {p} of the {file} file. {words}"


def requests_of(order: list[tuple[int, int]], file: str, model: str = MODEL) -> list[dict]:
    return [{"custom_id": f"p{p}-q{q}", "body": {
        "model": model, "max_tokens": 4,
        "messages": [{"role": "system", "content": system_prompt(p, file)},
                     {"role": "user", "content": f"Question {q}: what does rule {q} of prompt {p} say?"}]}}
            for p, q in order]


def files() -> dict[str, list[tuple[int, int]]]:
    grouped = [(p, q) for p in range(PROMPTS) for q in range(QUESTIONS)]
    shuffled = grouped[:]
    random.Random(7).shuffle(shuffled)
    return {"grouped": grouped, "shuffled": shuffled}


def evaluated(sim: str) -> int:
    stats = httpx.get(f"{sim}/_sim/stats").json()
    return int(stats["prompt_tokens"]) - int(stats["prompt_tokens_cached"])


def service_runs(latency: float, order_for: str, evaluated_so_far: Callable[[], int], figures: dict,
                 before_each: Callable[[], None] = lambda: None) -> None:
    """Both files through a fresh stack whose catalog points at SIMULATED_BACKEND_URL (the backend), each
    measured by the prompt tokens the backend evaluated so far, read before and after it."""
    with local_stack(latency=latency, budget=SLOTS) as (svc, session, base):
        svc.catalog.get(MODEL).prompt_cache = order_for  # the catalog's setting: `off` is submission order
        for name, order in files().items():
            before_each()
            before = evaluated_so_far()
            started = time.monotonic()
            batch = create(session, base, requests_of(order, name))
            final = wait(session, base, batch["id"], poll=POLL_SECONDS / 5)
            wall = time.monotonic() - started
            if final["status"] != "completed" or final["request_counts"]["completed"] != len(order):
                raise RuntimeError(f"the {name} batch ended {final['status']}: {final['request_counts']}")
            figures[f"service_{name}"] = (wall, evaluated_so_far() - before)
            figures[f"share_{name}"] = final["analytics"]["cached_input_share"]


def one_run(token_ms: float, latency: float, order_for: str = "slot") -> dict:
    """Both files through a fresh stack, and the direct client on each; the backend's cache emptied (a stats
    reset) before each."""
    sim = {"prompt_cache": "slot", "cache_slots": SLOTS, "prompt_token_seconds": token_ms / 1000}
    figures: dict = {}
    with backend_process(latency) as sim_url:
        httpx.put(f"{sim_url}/_sim/config", json=sim).raise_for_status()
        for name, order in files().items():
            httpx.post(f"{sim_url}/_sim/stats/reset")
            bodies = [r["body"] for r in requests_of(order, name)]
            wall = asyncio.run(direct(f"{sim_url}/v1/chat/completions", bodies, SLOTS))
            figures[f"direct_{name}"] = (wall, evaluated(sim_url))
        service_runs(latency, order_for, lambda: evaluated(sim_url), figures,
                     before_each=lambda: httpx.post(f"{sim_url}/_sim/stats/reset").raise_for_status())
    return figures


@contextmanager
def serving(server: LlamaCppServer) -> Iterator[LlamaCppServer]:
    """The server started (every cache empty) while the block runs, the stack's catalog pointing at it."""
    server.start()
    try:
        with backend_at(server.url):
            yield server
    finally:
        server.stop()


def one_llama_run(binary: Path, model: Path, logs: Path, order_for: str = "slot", extra: tuple[str, ...] = ()
                  ) -> dict:
    """The same on llama.cpp's server: the direct client on each file, each on a fresh server, then both files
    through a fresh stack on another fresh server (the two files share no prefix), measured by its counter."""
    server = LlamaCppServer(model, logs / "llama-server.log", MODEL, binary=binary, extra=extra)
    figures: dict = {}
    for name, order in files().items():
        with serving(server):
            bodies = [r["body"] for r in requests_of(order, name)]
            wall = asyncio.run(direct(f"{server.url}/v1/chat/completions", bodies, SLOTS, timeout=600))
            figures[f"direct_{name}"] = (wall, server.prompt_tokens_evaluated())
    with serving(server):
        service_runs(0.0, order_for, server.prompt_tokens_evaluated, figures)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--token-ms", type=float, default=5.0, help="ms per uncached prompt token")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds of an answer's 4 tokens")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-cache", choices=("slot", "shared", "provider", "off"), default="slot",
                        help="the model's catalog prompt_cache in the service (off: submission order, as before)")
    parser.add_argument("--llama-server", type=Path, metavar="PATH",
                        help="run on llama.cpp's llama-server at PATH (build/llama-server/bin/llama-server) instead "
                             "of the simulated backend")
    parser.add_argument("--shape", choices=("medium", "prefix"), default="medium",
                        help="the model llama-server runs (tests/real_backend/make_model.py): medium (about 0.5 ms a "
                             "prompt token on one thread) or prefix (about 0.27 ms: the server's fixed cost per step, "
                             "which each short answer pays, weighs more)")
    parser.add_argument("--llama-server-args", default="", metavar="ARGS",
                        help="more of llama-server's options, e.g. '--cache-ram 0' (no RAM prompt cache: a slot's "
                             "cache is all it reuses)")
    args = parser.parse_args(argv)
    if args.llama_server:
        with tempfile.TemporaryDirectory(prefix="prompt-cache-") as work:
            model = make_model(Path(work) / f"{args.shape}-llama.gguf", shape=args.shape)
            extra = tuple(shlex.split(args.llama_server_args))
            runs = [one_llama_run(args.llama_server, model, Path(work), args.prompt_cache, extra)
                    for _ in range(args.runs)]
        backend = (f"llama.cpp's llama-server, {SLOTS} slots, 1 thread, the `{args.shape}` model"
                   f"{' ' + args.llama_server_args if args.llama_server_args else ''}; evaluated: its /metrics "
                   f"prompt_tokens_total")
    else:
        runs = [one_run(args.token_ms, args.latency, args.prompt_cache) for _ in range(args.runs)]
        backend = f"per-slot cache of {SLOTS} slots, {args.token_ms:g} ms per uncached prompt token"
    print(f"prompt cache: {PROMPTS} system prompts of ~500 words x {QUESTIONS} questions, answers of 4 tokens; "
          f"{backend}, budget {SLOTS}; catalog prompt_cache {args.prompt_cache}; {args.runs} runs")
    for name, goal in (("grouped", 0.5), ("shuffled", 0.8)):
        ratios = [r[f"service_{name}"][0] / r[f"direct_{name}"][0] for r in runs]
        print(f"  {name}: wall {median([r[f'service_{name}'][0] for r in runs]):.1f} s vs direct client in "
              f"submission order {median([r[f'direct_{name}'][0] for r in runs]):.1f} s: ratio median "
              f"{median(ratios):.3f} [{', '.join(f'{x:.3f}' for x in ratios)}] (goal <= {goal}); cached input "
              f"share {median([r[f'share_{name}'] for r in runs]):.3f}")
    tokens = [r["service_grouped"][1] / r["direct_grouped"][1] for r in runs]
    print(f"  grouped: prompt tokens evaluated {median([r['service_grouped'][1] for r in runs]):.0f} vs "
          f"{median([r['direct_grouped'][1] for r in runs]):.0f} in submission order: ratio median "
          f"{median(tokens):.3f} [{', '.join(f'{x:.3f}' for x in tokens)}] (goal <= 0.4); shuffled "
          f"{median([r['service_shuffled'][1] for r in runs]):.0f} vs "
          f"{median([r['direct_shuffled'][1] for r in runs]):.0f}")
    print(f"  reproduce: {command_line('bench.prompt_cache')}")


if __name__ == "__main__":
    main()
