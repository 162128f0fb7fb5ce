"""Run the benchmarks in sequence (`make bench`): `python -m bench [--quick] [names...]`.

Names, one per benchmark described in docs/benchmarks.md: throughput ingest export cost fairness priority cap yield
file spread lanes short estimate retry cache provider_batch (all sixteen by default: ~155 min on 2 cores). `--quick`
runs small sizes (~14 minutes in all); each benchmark's own flags are shown by `python -m bench.<module> --help`.
Each prints its ratios against its goal and the command that reproduces it; a summary of every goal line comes at
the end.
docs/benchmarks.md has the current figures and what bounds each one.
"""

from __future__ import annotations

import argparse
import importlib
import io
import re
import sys
import time
from contextlib import redirect_stdout

# name: (module, quick arguments)
BENCHMARKS = {
    "throughput": ("bench.throughput", ["--requests", "200", "--runs", "1"]),
    "ingest": ("bench.ingest", ["--requests", "10000", "--runs", "2"]),
    "export": ("bench.export", ["--requests", "2000", "--runs", "2"]),
    "cost": ("bench.cost", ["--requests", "96", "--runs", "1"]),
    "fairness": ("bench.fairness", ["--scale", "0.2", "--runs", "1"]),
    # a high batch after a large normal one of the same account; a small batch after a large one, one priority
    "priority": ("bench.priority", ["--scale", "0.4", "--runs", "1"]),
    "cap": ("bench.spending_cap", ["--runs", "1"]),
    "yield": ("bench.interactive_yield", ["--cycles", "3"]),
    "file": ("bench.file_batch", ["--requests", "5000", "--runs", "1"]),
    # latency spread over requests; many small batches from many accounts (with the hot-item report)
    "spread": ("bench.throughput", ["--requests", "300", "--runs", "1"]),
    "lanes": ("bench.hot_items", ["--batches", "40", "--accounts", "20"]),
    # short calls (embeddings, small models) at one slot and at four, against a direct client
    "short": ("bench.short_calls", ["--requests", "300", "--runs", "1"]),
    # an estimate's end against the real end: 200 and 2,000 requests, alone and behind another account's batch
    "estimate": ("bench.estimate", ["--sizes", "200", "--ahead", "400", "--runs", "1"]),
    # a retry in place of a batch whose every request failed once, against its first run
    "retry": ("bench.retry_run", ["--requests", "100", "--runs", "1"]),
    # 8 system prompts x 6 questions on a per-slot prompt cache: grouped and shuffled files, against a direct client
    "cache": ("bench.prompt_cache", ["--runs", "1"]),
    # a provider batch tier: cost per million requests against direct, collecting a large output, the guard's margin
    "provider_batch": ("bench.provider_batch", ["--requests", "200", "--runs", "1", "--lines", "5000"]),
}
# Arguments a benchmark always gets (before the quick ones): what makes it the benchmark it is.
ALWAYS = {"spread": ["--latency", "1", "--distribution", "lognormal", "--sigma", "0.5"]}


class Tee(io.StringIO):
    def write(self, text: str) -> int:
        sys.__stdout__.write(text)
        sys.__stdout__.flush()
        return super().write(text)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="name", help="benchmarks to run: " + ", ".join(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="small sizes")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    verdicts, failed = [], []
    for name in args.names or list(BENCHMARKS):
        module, quick = BENCHMARKS[name]
        sys.argv = [module, *ALWAYS.get(name, []), *(quick if args.quick else [])]
        started = time.monotonic()
        out = Tee()
        try:
            with redirect_stdout(out):
                importlib.import_module(module).main()
        except Exception as error:  # one benchmark failing does not stop the others
            print(f"{name}: FAILED: {type(error).__name__}: {error}")
            failed.append(name)
            continue
        goals = [line.strip() for line in out.getvalue().splitlines() if re.search(r"goal", line)]
        verdicts.append((name, time.monotonic() - started, goals))
        print()
    print("summary" + (" (--quick: small sizes)" if args.quick else ""))
    for name, seconds, goals in verdicts:
        print(f"  {name} ({seconds:.0f} s)")
        for goal in goals:
            print(f"    {goal}")
    for name in failed:
        print(f"  {name}: FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
