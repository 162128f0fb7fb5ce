"""`batchctl estimate FILE`: what a batch of FILE would hold, cost and take, asked of the service
(`POST /v1/batches/estimate`, an extension) without creating anything."""

from __future__ import annotations

import argparse
import datetime as dt
import json

from .api_client import ApiClient
from .submission import extensions, read_requests


def estimate_body(args: argparse.Namespace) -> bytes:
    """FILE as the inline create body submit would send (the same requests, spending cap, priority and
    execution)."""
    body: dict = {"requests": read_requests(args.file, args.model, args.endpoint), **extensions(args)}
    return json.dumps(body, separators=(",", ":")).encode()


def describe_estimate(estimate: dict) -> str:
    """The estimate for people: totals, then a line per model, then when it would end."""
    cost = estimate["cost_usd"]
    high = "no bound (a request without max_tokens on a model without an output limit)" if cost["max"] is None \
        else f"${cost['max']:.6f}"
    lines = [f"{estimate['request_count']} requests, {estimate['input_tokens']} input tokens "
             f"({estimate['tokenizer']}), at most {estimate['max_output_tokens']} output tokens; "
             f"cost ${cost['min']:.6f} to {high}"]
    for m in estimate["models"]:
        latency = f"{m['mean_latency_seconds']} s" if m["mean_latency_seconds"] is not None else "not measured yet"
        ahead = f"{m['queue_ahead']}+" if m["queue_ahead"] else "none"  # a lower bound (1, 2, 5, 10, 20, ...)
        tier = m.get("provider_batch_request_count") or 0
        on_tier = f" ({tier} on its provider's batch tier)" if tier else ""
        lines.append(f"  {m['model']}: {m['request_count']} requests{on_tier}, {ahead} queued ahead, "
                     f"{m['batch_cap_now']}/{m['batch_budget']} slots, calls {latency}, "
                     f"~{m['estimated_seconds']} s")
    ends = estimate["estimated_completion_at"]
    when = "never at the capacity there is now" if ends is None else \
        dt.datetime.fromtimestamp(ends, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    verdict = "within" if estimate["fits_window"] else "NOT within"
    lines.append(f"would end {when}: {verdict} its {estimate['completion_window_seconds']} s window")
    for rejected in estimate.get("rejected") or []:
        lines.append(f"  would error at once: {rejected['custom_id']}: {rejected['error'].get('message')}")
    return "\n".join(lines)


def cmd_estimate(client: ApiClient, args: argparse.Namespace) -> int:
    estimate = client.request("POST", "/v1/batches/estimate", content=estimate_body(args)).data
    print(json.dumps(estimate, indent=2) if args.json else describe_estimate(estimate), flush=True)
    return 0
