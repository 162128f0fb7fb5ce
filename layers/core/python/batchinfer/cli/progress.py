"""`batchctl wait` (and `submit --wait`): polling a batch until it has ended, with its progress on stderr,
a live bar on a terminal, a line now and then elsewhere."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import IO, Any

from .api_client import ApiClient
from .views import BatchView, fetch

# A short batch is seen ending soon: a look every POLL_START_SECONDS for the first POLL_FAST_FOR_SECONDS,
# then the interval grows to --poll-interval (one GET each: nothing the service notices).
POLL_START_SECONDS = 0.5
POLL_FAST_FOR_SECONDS = 5.0
PLAIN_PROGRESS_SECONDS = 5.0  # not a terminal: a progress line this often (and the last one)
SPEED_WINDOW_SECONDS = 30.0  # requests per second over this much of the recent past


class Interrupted(Exception):
    """Ctrl-C while the batch runs on: the message says how to pick up again."""


class Speed:
    """Requests finished per second over the recent past, and the time left at that pace."""

    def __init__(self, window: float = SPEED_WINDOW_SECONDS) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def observe(self, now: float, done: int, total: int) -> tuple[float | None, float | None]:
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        start, done_then = self.samples[0]
        if now <= start:
            return None, None
        rate = max(done - done_then, 0) / (now - start)
        return rate, (max(total - done, 0) / rate if rate > 0 else None)


def _rate_text(rate: float | None) -> str:
    return "--" if rate is None else f"{rate:.1f}"


def _eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_line(view: BatchView, rate: float | None, eta: float | None) -> str:
    """e.g. `batch_x: 120/1000 completed, 3 failed, 40.0 req/s, ETA 22s [in_progress]`. A Message Batch
    reports its counts only once it has ended."""
    return (f"{view.id}: {view.completed}/{view.total} completed, {view.failed} failed, {_rate_text(rate)} req/s, "
            f"ETA {_eta_text(eta)} [{view.status}]")


class PlainProgress:
    """Not a terminal (a log, a CI job): a line now and then, and one when the batch has ended."""

    def __init__(self, stream: IO[str], every: float = PLAIN_PROGRESS_SECONDS) -> None:
        self.stream, self.every, self.last = stream, every, None

    def update(self, view: BatchView, rate: float | None, eta: float | None) -> None:
        now = time.monotonic()
        if view.ended or self.last is None or now - self.last >= self.every:
            print(progress_line(view, rate, eta), file=self.stream, flush=True)
            self.last = now

    def close(self) -> None:
        pass


class LiveProgress:
    """A terminal: a live bar (rich), redrawn in place. The id goes on a line of its own above it, so the bar's
    row fits in 80 columns: status, bar, completed/total, failed, req/s, ETA."""

    def __init__(self, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.console = Console(file=stream)
        self.progress = Progress(
            TextColumn("{task.fields[status]:<11}"), BarColumn(bar_width=20),
            TextColumn("{task.fields[counts]}"), TextColumn("{task.fields[speed]} req/s"),
            TextColumn("ETA {task.fields[eta]}"), console=self.console, transient=False)
        self.task: Any = None

    def update(self, view: BatchView, rate: float | None, eta: float | None) -> None:
        fields = {"counts": f"{view.completed}/{view.total} completed, {view.failed} failed",
                  "speed": _rate_text(rate), "eta": _eta_text(eta), "status": view.status}
        done = view.completed + view.failed
        if self.task is None:
            self.console.print(f"{view.id} [dim](Ctrl-C stops waiting; the batch runs on)[/dim]", highlight=False)
            self.progress.start()
            self.task = self.progress.add_task(view.id, total=view.total or None, completed=done, **fields)
        else:
            self.progress.update(self.task, total=view.total or None, completed=done, **fields)

    def close(self) -> None:
        self.progress.stop()


def progress_for(stream: IO[str]) -> PlainProgress | LiveProgress:
    if stream.isatty():
        try:
            return LiveProgress(stream)
        except ImportError:  # rich is a dependency of batchctl's venv, not of the service's Lambda layer
            pass
    return PlainProgress(stream)


def wait_for(client: ApiClient, batch_id: str, poll_seconds: float, resume_hint: str) -> BatchView:
    """Poll until the batch has ended, showing progress on stderr. Ctrl-C: Interrupted (it runs on)."""
    view = fetch(client, batch_id)
    display = progress_for(sys.stderr)
    speed = Speed()
    started = time.monotonic()
    delay = min(POLL_START_SECONDS, poll_seconds)
    try:
        while True:
            now = time.monotonic()
            rate, eta = speed.observe(now, view.completed + view.failed, view.total)
            display.update(view, rate, 0.0 if view.ended else eta)
            if view.ended:
                return view
            time.sleep(delay)
            if now - started >= POLL_FAST_FOR_SECONDS:
                delay = min(delay * 1.5, poll_seconds)
            view = fetch(client, batch_id)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: {batch_id} keeps running; resume waiting with `{resume_hint}`") from None
    finally:
        display.close()
