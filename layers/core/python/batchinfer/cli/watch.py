"""`batchctl watch ID`: a batch's results printed as they finish, one JSON line each on stdout, with its
progress on stderr (a live bar on a terminal, a line now and then elsewhere). It reads the service's
results in finished order (an extension: `order=finished`), long polling from the last page's cursor, so
each result is printed once however the batch's requests finish, and stops once the batch has ended."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from typing import IO

from .api_client import ApiClient
from .progress import Interrupted, Speed, progress_for
from .views import OPENAI_FINAL, BatchView, batch_path, fetch, is_message_batch

WAIT_SECONDS = 20  # each call holds an empty page this long at most: within the API's 30 s
PAGE = 100
STATUS_EVERY_SECONDS = 2.0  # the batch's own counts, for the bar, at most this often


def _ended(batch_status: str) -> bool:
    return batch_status in OPENAI_FINAL or batch_status == "ended"


def watch(client: ApiClient, batch_id: str, after: str | None = None, out: IO[str] | None = None) -> BatchView:
    """Print every result from the cursor `after` (the start when None) as it finishes, until the batch
    has ended and nothing more is there. Ctrl-C: Interrupted, naming the cursor to go on from."""
    out = out or sys.stdout  # taken before the live bar starts: never through its redirect, which wraps lines
    path = batch_path(batch_id) + "/results"
    message_batch = is_message_batch(batch_id)
    view = fetch(client, batch_id)
    display = progress_for(sys.stderr)
    speed = Speed()
    printed = {"ok": 0, "not_ok": 0}
    looked = time.monotonic()
    cursor = after
    try:
        while True:
            page = client.get(path, order="finished", limit=PAGE, wait=WAIT_SECONDS, **({"after": cursor} if cursor
                                                                                         else {}))
            for line in page["data"]:
                print(json.dumps(line), file=out, flush=True)
                ok = (line.get("result") or {}).get("type") == "succeeded" if message_batch \
                    else line.get("status") == "completed"
                printed["ok" if ok else "not_ok"] += 1
            cursor = page["last_id"]
            ended = _ended(page["batch_status"]) and not page["has_more"]
            if ended or time.monotonic() - looked >= STATUS_EVERY_SECONDS:
                view, looked = fetch(client, batch_id), time.monotonic()
            shown = view
            if message_batch and not view.ended:  # its counts say nothing until it ends: what was printed does
                shown = replace(view, completed=printed["ok"], failed=printed["not_ok"])
            rate, eta = speed.observe(time.monotonic(), shown.completed + shown.failed, shown.total)
            display.update(shown, rate, 0.0 if ended else eta)
            if ended:
                return view
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: {batch_id} keeps running; go on with `batchctl watch {batch_id} "
                          f"--after {cursor}`" if cursor else f"interrupted: {batch_id} keeps running") from None
    finally:
        display.close()
