"""A model's part of a batch on its provider's batch tier (docs/provider-batch.md), three measurements on the
simulated backend's OpenAI Batches API (`glm-5.3-flash`, whose tier the default catalog prices at half; the
cost runs also on its Bedrock batch inference, `--model claude-bedrock`, whose tier is priced at half too):

1. cost: the same requests once with `execution: direct` and once with `provider_batch`, on the local stack:
   cost per million requests each way from the batch objects' `cost_usd`, their ratio (tier / direct; goal
   <= 0.55: the tier's price is half the model's), `saved_usd` == direct cost - tier cost, and each wall.
2. collect: the runner's collecting steps over a provider output of `--lines` lines (a page of RESULT_PAGE
   lines a step from a byte cursor, each answer landed through the ledger). The runner is driven directly, in
   this process, against the moto server and the simulated backend in processes of their own, so that this
   process's memory is the runner's alone (an in-process moto would hold every landed result in the same heap).
   Goals: memory (tracemalloc's peak over the first pages, peak RSS growth over all) <= 16 MB: a page and its
   byte range of the file, not the file; and <= 72 s per 1,000 lines: a 50,000-line output lands within half the
   default guard_seconds (7,200 s). One step a look, so that the bench sees each state.
3. guard: a job that never finishes (the simulator's `never_finish`), in a batch whose window is
   `--window` seconds and whose tier's `guard_seconds` is `--guard`: when the guard cancelled the job, when the
   batch completed (its last request run directly), and the margin left before `expires_at` (goal > 0),
   printed as margin / guard_seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import tracemalloc
from contextlib import nullcontext

import requests

from batchinfer.layout import batch_key
from batchinfer.operations.openai import batches
from batchinfer.records.provider_jobs import ProviderJob
from batchinfer.runtime import build_services, use_services
from batchinfer.service import accounts
from batchinfer.service.offloading import jobs
from batchinfer.settings import Settings
from batchinfer.storage import bootstrap
from batchinfer.storage.aws import clients_for
from bench.common import FINAL, MODEL, backend_process, command_line, local_stack, median, wait
from bench.ingest import reset_peak, rss_mb, spread
from local.run import LOCAL_BEDROCK_BATCH_ROLE
from local.servers import MotoServer, free_port

COST_GOAL = 0.55  # tier / direct cost per request: the catalog's tier price is half the model's
MEMORY_GOAL_MB = 16.0  # tracemalloc peak while collecting: a page (and its byte range), never the whole file
# A 50,000-line output lands within half the default guard (7,200 s): at most 3,600 s, 72 s per 1,000 lines.
SECONDS_PER_1000_GOAL = 72.0
TRACED_PAGES = 10  # tracemalloc slows the process: it watches the first pages only (peak RSS watches them all)


def chat_requests(n: int, tag: str, model: str = MODEL) -> list[dict]:
    """The same questions for every run (the simulator's answers, and so their usage, follow the text);
    only the custom_ids carry the run's tag."""
    return [{"custom_id": f"{tag}-{i}", "body": {"model": model, "max_tokens": 16, "messages": [
        {"role": "user", "content": f"Tier benchmark question {i}: what is {i} plus {i}?"}]}} for i in range(n)]


def per_million(cost_usd: float, n: int) -> float:
    return cost_usd / n * 1e6


def margin_ratio(expires_at: float, finished_at: float, guard_seconds: float) -> float:
    """What was left of the window when the batch's last request finished, in units of the guard."""
    return (expires_at - finished_at) / guard_seconds if guard_seconds > 0 else math.inf


def sim_of(svc, model: str = MODEL) -> str:
    backend = svc.catalog.get(model).backend  # a Bedrock model's: where its control plane answers
    return (backend.endpoint_url or backend.base_url).rstrip("/").removesuffix("/v1")


def run_batch(session: requests.Session, base: str, body: dict) -> tuple[dict, float]:
    started = time.monotonic()
    answer = session.post(f"{base}/batches", json=body, timeout=120)
    answer.raise_for_status()
    batch = wait(session, base, answer.json()["id"], poll=0.1)
    return batch, time.monotonic() - started


# --- 1. cost per million requests --------------------------------------------------------------------------

def cost_runs(n: int, runs: int, latency: float, budget: int, model: str = MODEL) -> dict:
    direct_pm, tier_pm, ratios, direct_s, tier_s, checks = [], [], [], [], [], []
    # Bedrock's jobs read and write the stack's bucket: its model runs on the stack's own simulator, the one
    # wired to the moto server's S3 (in the stack's process, so its walls are not the OpenAI runs').
    on_bedrock = model != MODEL
    with (nullcontext() if on_bedrock else backend_process(latency)), \
            local_stack(latency=latency if on_bedrock else 0.0, budget=budget,
                        bedrock_batch_role_arn=LOCAL_BEDROCK_BATCH_ROLE) as (svc, session, base):
        sim = sim_of(svc, model)
        requests.post(f"{sim}/_sim/batches/reset", timeout=10).raise_for_status()
        for run in range(runs):
            direct, d_s = run_batch(session, base, {"requests": chat_requests(n, f"d{run}", model),
                                                    "execution": "direct"})
            tier, t_s = run_batch(session, base, {"requests": chat_requests(n, f"t{run}", model),
                                                  "execution": "provider_batch"})
            for batch in (direct, tier):
                assert batch["status"] == "completed" and batch["request_counts"]["completed"] == n, batch
            assert direct["usage"] == tier["usage"], (direct["usage"], tier["usage"])
            assert direct["saved_usd"] == 0 and tier["saved_usd"] > 0, (direct["saved_usd"], tier["saved_usd"])
            direct_pm.append(per_million(direct["cost_usd"], n))
            tier_pm.append(per_million(tier["cost_usd"], n))
            ratios.append(tier["cost_usd"] / direct["cost_usd"])
            checks.append(abs(tier["saved_usd"] - (direct["cost_usd"] - tier["cost_usd"])))
            direct_s.append(d_s)
            tier_s.append(t_s)
        made = requests.get(f"{sim}/_sim/batches", timeout=10).json()
        jobs_made = made["bedrock_jobs"]["jobs"] if on_bedrock else made["jobs"]
    assert jobs_made == runs, f"{jobs_made} provider jobs for {runs} tier runs"
    ratio = median(ratios)
    print(f"cost: {n} chat requests on {model}, C={budget}, L={latency}s, once direct and once on its tier; "
          f"{runs} runs")
    print(f"  per million requests: direct ${median(direct_pm):.2f} {spread(direct_pm)}, tier ${median(tier_pm):.2f} "
          f"{spread(tier_pm)}")
    print(f"  saved_usd against direct cost - tier cost: worst difference ${max(checks):.2e} "
          f"({'equal to rounding' if max(checks) < 1e-9 else 'NOT EQUAL'})")
    print(f"  wall: direct median {median(direct_s):.1f} s {spread(direct_s, '{:.1f}')}, tier median "
          f"{median(tier_s):.1f} s {spread(tier_s, '{:.1f}')} (a poll_seconds of 1, the simulator's turnaround 0)")
    print(f"  cost ratio (tier / direct): median {ratio:.3f} {spread(ratios, '{:.3f}')}; goal <= {COST_GOAL}: "
          f"{'met' if ratio <= COST_GOAL and max(checks) < 1e-9 else 'NOT MET'}")
    return {"cost_ratio": ratio}


# --- 2. collecting a large output --------------------------------------------------------------------------

def runner_services(moto_url: str, sim_url: str):
    """Services on the moto server, the default catalog pointed at the simulator; no dispatcher, sweeper or
    workers run: the bench drives the job's steps itself."""
    settings = Settings(table_name="benchtier", bucket_name="benchtier", stage="benchtier", aws_endpoint_url=moto_url)
    ddb, s3, _sqs = clients_for(settings)
    bootstrap.create_table(ddb, settings.table_name)
    bootstrap.create_bucket(s3, settings.bucket_name)
    svc = build_services(settings, {**os.environ, "SIMULATED_BACKEND_URL": sim_url})
    use_services(svc)
    return svc


def steps_until(svc, job: dict, states: tuple[str, ...], timeout: float = 3600) -> dict:
    """Look at the job (one step a look: jobs.STEPS_PER_LOOK is 1 here) until it is in one of `states`."""
    deadline = time.monotonic() + timeout
    while (job := ProviderJob.get(svc.table, job["pk"], job["sk"]))["state"] not in states:
        if time.monotonic() > deadline:
            raise TimeoutError(f"provider job still {job['state']}")
        if int(job.get("due_at", 0)) > svc.now():
            time.sleep(0.2)  # its next look (poll_seconds 1)
            continue
        if job["state"] == "done":
            raise RuntimeError(f"provider job done before it was {' or '.join(states)}")
        jobs.look(svc, job["pk"], job["sk"])
    return job


def file_bytes(sim_url: str, file_id: str) -> int:
    answer = requests.get(f"{sim_url}/v1/files/{file_id}/content", headers={"Range": "bytes=0-0"}, timeout=30)
    return int(answer.headers["content-range"].rsplit("/", 1)[1])


def collect_run(lines: int) -> dict:
    moto, steps_per_look = MotoServer(free_port()).start(), jobs.STEPS_PER_LOOK
    try:
        with backend_process(0.0) as sim_url:
            svc = runner_services(moto.url, sim_url)
            account = accounts.create_account(svc, tier="internal", batch_access=True, daily_quota_usd=1e6)
            who = accounts.authenticate(svc, accounts.create_key(svc, account["id"]))
            jobs.STEPS_PER_LOOK = 1  # a step a look: the bench sees each state, and times the collecting steps
            started = time.monotonic()
            body = {"requests": chat_requests(lines, "c"), "execution": "provider_batch"}
            created, _ = batches.create_batch(svc, who, json.dumps(body).encode(), None)
            (job,) = ProviderJob.of_batch(svc.table, created["id"])
            job = steps_until(svc, job, ("collecting",))
            ready_s = time.monotonic() - started
            size = file_bytes(sim_url, job["output_file"])
            pages, traced_peak, untraced_s, untraced_lines = 0, 0.0, 0.0, 0
            reset_peak()
            before = rss_mb()
            tracemalloc.start()
            started = time.monotonic()
            while job["state"] == "collecting":
                page_started = time.monotonic()
                jobs.look(svc, job["pk"], job["sk"])
                job = ProviderJob.get(svc.table, job["pk"], job["sk"])
                pages += 1
                if pages == TRACED_PAGES:
                    traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
                    tracemalloc.stop()
                elif pages > TRACED_PAGES:
                    untraced_s += time.monotonic() - page_started
                    untraced_lines += jobs.RESULT_PAGE
            collect_s = time.monotonic() - started
            if tracemalloc.is_tracing():
                traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
                tracemalloc.stop()
            growth = rss_mb("VmHWM") - before
            steps_until(svc, job, ("done",))
            batch = svc.table.get(*batch_key(created["id"])) or {}
    finally:
        jobs.STEPS_PER_LOOK = steps_per_look  # the guard run's sweeper looks as it always does
        moto.stop()
    landed = int(batch.get("completed", 0))
    assert landed == lines, f"{landed} of {lines} answers landed"
    # Time per 1,000 lines over the pages tracemalloc did not watch (it slows allocation); all of them if
    # there were no others.
    per_1000 = untraced_s / untraced_lines * 1000 if untraced_lines else collect_s / lines * 1000
    print(f"collect: a provider output of {lines} lines ({size / 2**20:.1f} MB), the runner driven in this process "
          f"(moto server and simulator in processes of their own); filled, submitted and ended in {ready_s:.0f} s")
    print(f"  collecting: {collect_s:.1f} s in {pages} steps of {jobs.RESULT_PAGE} lines (tracemalloc on over the "
          f"first {TRACED_PAGES}); {per_1000:.2f} s per 1,000 lines over the others; goal <= "
          f"{SECONDS_PER_1000_GOAL:.0f}: ratio {per_1000 / SECONDS_PER_1000_GOAL:.2f} "
          f"({'met' if per_1000 <= SECONDS_PER_1000_GOAL else 'NOT MET'})")
    worst = max(traced_peak, growth)
    print(f"  memory: tracemalloc peak over the first {TRACED_PAGES} steps {traced_peak:.1f} MB, peak RSS growth over "
          f"all of them {growth:.1f} MB, against a file of {size / 2**20:.1f} MB; goal <= {MEMORY_GOAL_MB:.0f} MB: "
          f"ratio {worst / MEMORY_GOAL_MB:.2f} ({'met' if worst <= MEMORY_GOAL_MB else 'NOT MET'})")
    return {"collect_s_per_1000": per_1000, "collect_peak_mb": traced_peak}


# --- 3. the guard's margin ---------------------------------------------------------------------------------

def guard_run(n: int, window: int, guard: float, answered: int, latency: float, budget: int) -> dict:
    with backend_process(latency), local_stack(budget=budget, batch_completion_window_seconds=window) as (
            svc, session, base):
        svc.catalog.get(MODEL).provider_batch.guard_seconds = guard
        sim = sim_of(svc)
        requests.post(f"{sim}/_sim/batches/reset", timeout=10).raise_for_status()
        requests.put(f"{sim}/_sim/batches/config", json={"never_finish": True, "answered_before_cancel": answered},
                     timeout=10).raise_for_status()
        answer = session.post(f"{base}/batches", json={"requests": chat_requests(n, "g"),
                                                       "execution": "provider_batch"}, timeout=120)
        answer.raise_for_status()
        batch_id, created_at, expires_at = answer.json()["id"], answer.json()["created_at"], answer.json()["expires_at"]
        cancelled_at = None
        while True:
            batch = session.get(f"{base}/batches/{batch_id}", timeout=30).json()
            now = time.time()
            if cancelled_at is None and requests.get(f"{sim}/_sim/batches", timeout=10).json()["cancels"]:
                cancelled_at = now
            if batch["status"] in FINAL:
                break
            if now > expires_at + 30:
                raise TimeoutError(batch_id)
            time.sleep(0.1)
        finished_at = now
        stats = requests.get(f"{sim}/_sim/stats", timeout=10).json()
    assert cancelled_at is not None, "the guard never cancelled the provider's job"
    assert batch["status"] == "completed" and batch["request_counts"]["completed"] == n, batch
    direct_calls = stats["by_path"].get("/v1/chat/completions", 0)
    margin = expires_at - finished_at
    ratio = margin_ratio(expires_at, finished_at, guard)
    print(f"guard: {n} requests on a job that never finishes ({answered} answered before its cancel), window "
          f"{window} s, guard_seconds {guard:g}, C={budget}, L={latency}s")
    print(f"  created at 0 s, expires at {expires_at - created_at} s; the guard cancelled the job at "
          f"{cancelled_at - created_at:.1f} s ({expires_at - cancelled_at:.1f} s before expires_at, seen at 0.1 s "
          f"polls); {direct_calls} requests ran directly; the batch completed at {finished_at - created_at:.1f} s")
    print(f"  margin left before expires_at: {margin:.1f} s; margin / guard_seconds {ratio:.2f}; goal > 0: "
          f"{'met' if margin > 0 else 'NOT MET'}")
    return {"guard_margin_s": margin, "guard_margin_ratio": ratio}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("cost", "collect", "guard"), action="append",
                        help="one measurement (repeatable); all three by default")
    parser.add_argument("--requests", type=int, default=400, help="requests of the cost runs")
    parser.add_argument("--runs", type=int, default=3, help="cost runs (each: direct, then tier)")
    parser.add_argument("--model", default=MODEL, choices=(MODEL, "claude-bedrock"),
                        help="the cost runs' model: its tier is OpenAI's Batches API or Bedrock's batch inference")
    parser.add_argument("--lines", type=int, default=50_000, help="lines of the collected provider output")
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--guard-requests", type=int, default=200)
    parser.add_argument("--window", type=int, default=40, help="the guard run's completion window, seconds")
    parser.add_argument("--guard", type=float, default=15.0, help="the tier's guard_seconds in the guard run")
    parser.add_argument("--answered", type=int, default=50, help="lines the never-finishing job answers")
    args = parser.parse_args(argv)
    only = args.only or ["cost", "collect", "guard"]
    out: dict = {}
    if "cost" in only:
        out.update(cost_runs(args.requests, args.runs, args.latency, args.budget, args.model))
    if "collect" in only:
        out.update(collect_run(args.lines))
    if "guard" in only:
        out.update(guard_run(args.guard_requests, args.window, args.guard, args.answered, args.latency,
                             args.budget))
    print(f"  reproduce: {command_line('bench.provider_batch')}")
    return out


if __name__ == "__main__":
    main()
