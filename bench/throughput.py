"""Throughput against the physical limit: requests/s divided by C/L, and wall time against a direct
asyncio client (httpx, semaphore of C) sending the same requests to the same backend in the same run.
Goals: ratio >= 0.97 at L=2 s, >= 0.85 at L=0.25 s; wall / direct <= 1.03.

`--distribution lognormal --sigma 0.5` (or `long_tail`) spreads the latency around its mean L, per request
(the simulated backend draws it from the body, so the direct client's requests take the same times). Goal
(1,000 requests, C=16, mean L=1 s, sigma 0.5): the backend kept busy (busy time / (C x span))
>= 0.9, and that utilization as a ratio to the direct client's."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

import httpx

from batchinfer.layout import model_budget_key
from bench.calls import recording
from bench.common import MODEL, chat, command_line, create, local_stack, median, wait

# How often the benchmark asks the API whether the batch is done, as a user would; every poll is a few
# DynamoDB calls, and moto serves everyone's calls one at a time, so polling much faster slows the stack.
POLL_SECONDS = 0.5


async def direct(url: str, bodies: list[dict], concurrency: int, timeout: float = 60) -> float:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=concurrency * 2)) as client:
        async def one(body: dict) -> None:
            async with limit:
                (await client.post(url, json=body)).raise_for_status()

        start = time.monotonic()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.monotonic() - start


def refill_gap(timeline: list[list[float]], slots: int) -> float:
    """The median time a freed slot waits for its next call: with `slots` calls at most in flight, the k-th
    call to start (k > slots) took the slot the (k - slots)-th answer freed."""
    starts = sorted(t[0] for t in timeline)
    ends = sorted(t[1] for t in timeline)
    gaps = [max(0.0, starts[k] - ends[k - slots]) for k in range(slots, len(starts))]
    return median(gaps) if gaps else 0.0


def one_run(svc, session, base: str, n: int, budget: int, run: int, model: str = MODEL) -> dict:
    backend = svc.catalog.get(model).backend
    # The simulated backend answers every kind: chat completions, and Bedrock's Converse at its endpoint_url.
    sim_url = (backend.endpoint_url or backend.base_url).removesuffix("/v1")
    reqs = [chat(f"t{run}-{i}", f"throughput probe {run} {i}", model=model) for i in range(n)]
    peak = {"in_flight": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            item = svc.table.get(*model_budget_key(model), consistent=False) or {}
            peak["in_flight"] = max(peak["in_flight"], int(item.get("in_flight", 0)))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    httpx.post(f"{sim_url}/_sim/stats/reset")
    started, started_epoch = time.monotonic(), time.time()
    batch = create(session, base, reqs)
    final = wait(session, base, batch["id"], poll=POLL_SECONDS)
    wall = time.monotonic() - started
    ended_epoch = time.time()
    done.set()
    stats = httpx.get(f"{sim_url}/_sim/stats").json()
    timeline = httpx.get(f"{sim_url}/_sim/timeline").json()["requests"]
    bodies = [dict(r["body"], model=MODEL) for r in reqs]  # the direct client speaks chat completions
    httpx.post(f"{sim_url}/_sim/stats/reset")
    direct_wall = asyncio.run(direct(f"{sim_url}/v1/chat/completions", bodies, budget))
    direct_stats = httpx.get(f"{sim_url}/_sim/stats").json()
    direct_span = direct_stats["last_ended_at"] - direct_stats["first_started_at"]
    # Where the time goes: how full the backend was kept between its first call and its last answer (slots
    # refilled late), and the time before the first call and after the last answer (create, first dispatch,
    # final status and the poll that sees it).
    span = stats["last_ended_at"] - stats["first_started_at"]
    return {"final": final, "wall": wall, "direct": direct_wall, "peak_counter": peak["in_flight"],
            "gap": refill_gap(timeline, budget),
            "peak_backend": stats["max_in_flight"], "occupancy": stats["busy_seconds"] / (budget * span),
            "direct_occupancy": direct_stats["busy_seconds"] / (budget * direct_span),
            "span": span, "before": stats["first_started_at"] - started_epoch,
            "after": ended_epoch - stats["last_ended_at"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--distribution", choices=("fixed", "lognormal", "long_tail"), default="fixed",
                        help="how latency spreads around its mean --latency, per request")
    parser.add_argument("--sigma", type=float, default=0.5, help="lognormal: sigma of the latency's log")
    parser.add_argument("--model", default=MODEL,
                        help="the catalog model the batch runs on (claude-bedrock: the Bedrock kind, via Converse)")
    args = parser.parse_args(argv)
    n, latency, budget = args.requests, args.latency, args.budget
    sim = {"latency_distribution": args.distribution, "latency_sigma": args.sigma}
    runs = []
    for i in range(args.runs):
        # A fresh stack per run: moto answers a GSI query by scanning the whole table, so a table still
        # holding earlier runs' requests slows every later run (DynamoDB's queries cost what they return).
        with local_stack(latency=latency, budget=budget, sim=sim) as (svc, session, base), recording(svc) as rec:
            runs.append(one_run(svc, session, base, n, budget, i, args.model))
            ours = [c for c in rec.calls if c.label not in ("bench", "api", "other")]  # the pipeline's own
            runs[-1]["calls"] = {service: sum(c.service == service for c in ours) / n
                                 for service in ("dynamodb", "sqs", "s3")}
            runs[-1]["calls"]["sqs by the event source mapping"] = sum(
                c.service == "sqs" and c.label == "esm" for c in ours) / n
    limit = budget / latency if latency > 0 else float("inf")  # L=0: the stack's own ceiling, no physical one

    def med(key: str) -> float:
        return median([r[key] for r in runs])

    def each(values: list[float], fmt: str = ".3f") -> str:
        return "[" + ", ".join(format(v, fmt) for v in values) + "]"

    if latency == 0:
        rates = [n / r["wall"] for r in runs]
        print(f"throughput at L=0 (the local stack's own ceiling): {n} requests, C={budget}; {args.runs} runs: "
              f"statuses {sorted({r['final']['status'] for r in runs})}")
        print(f"  achieved {median(rates):.1f} req/s (median) {each(rates, '.1f')} (goal >= 60)")
        calls = {service: median([r["calls"][service] for r in runs]) for service in runs[0]["calls"]}
        print("  AWS calls per request (median) of the dispatcher, workers, sweeper and event source mapping: "
              + ", ".join(f"{s} {v:.2f}" for s, v in calls.items()))
        print(f"  max in flight at the backend {max(r['peak_backend'] for r in runs)} (budget {budget})")
        print(f"  reproduce: {command_line('bench.throughput')}")
        return
    ratios = [n / r["wall"] / limit for r in runs]
    walls = [r["wall"] / r["direct"] for r in runs]
    spread_of = {"fixed": "fixed", "lognormal": f"lognormal, sigma {args.sigma:g}",
                 "long_tail": "long tail: 1 in 10 takes 10x"}[args.distribution]
    print(f"throughput: {n} requests on {args.model}, L={latency}s ({spread_of}), C={budget}; {args.runs} runs: "
          f"statuses {sorted({r['final']['status'] for r in runs})}, completed "
          f"{[r['final']['request_counts']['completed'] for r in runs]}")
    print(f"  achieved {n / med('wall'):.2f} req/s (median); limit C/L = {limit:.2f} req/s; "
          f"ratio median {median(ratios):.3f} {each(ratios)} (goal >= 0.97 at L=2 s, >= 0.85 at L=0.25 s)")
    print(f"  wall {med('wall'):.1f} s vs direct asyncio client {med('direct'):.1f} s: ratio median "
          f"{median(walls):.3f} {each(walls)} (goal <= 1.03)")
    print(f"  max in flight: budget counter {max(r['peak_counter'] for r in runs)}, at the backend "
          f"{max(r['peak_backend'] for r in runs)} (budget {budget})")
    occupancy = med("occupancy")
    print(f"  the backend was kept at {occupancy:.3f} of its budget (median {each([r['occupancy'] for r in runs])}) "
          f"from its first call to its last answer ({med('span'):.1f} s); {med('before'):.1f} s before the first "
          f"call, {med('after'):.1f} s after the last answer; a freed slot waits ~"
          f"{latency * (1 / occupancy - 1) * 1000:.0f} ms to be refilled per {latency:g} s request")
    utilization = [r["occupancy"] / r["direct_occupancy"] for r in runs]
    print(f"  the direct client kept it at {med('direct_occupancy'):.3f} "
          f"{each([r['direct_occupancy'] for r in runs])}: utilization ratio to it {median(utilization):.3f} "
          f"{each(utilization)} (goal with a latency spread: utilization >= 0.9)")
    gaps = [r["gap"] * 1000 for r in runs]
    print(f"  median gap between an answer and the next call on the freed slot: {median(gaps):.1f} ms "
          f"{each(gaps, '.1f')}")
    calls = {service: median([r["calls"][service] for r in runs]) for service in runs[0]["calls"]}
    print("  AWS calls per request (median) of the dispatcher, workers, sweeper and event source mapping: "
          + ", ".join(f"{s} {v:.2f}" for s, v in calls.items()) + " (the create call and the polls not counted)")
    print(f"  reproduce: {command_line('bench.throughput')}")


if __name__ == "__main__":
    main()
