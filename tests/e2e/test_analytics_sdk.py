"""A batch's analytics (an extension) on the local stack, read with the official SDKs at every major the e2e
tests cover (`openai` 3.x/2.x/1.x, `anthropic` 2.x/1.x), each in its own interpreter: a file batch with a
rejected request and one that fails once, retried in place; a Message Batch with a rejected request."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from tests.conftest import SDK_MAJORS
from tests.e2e.conftest import SdkRuns, local_stack

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).with_name("sdk_scripts") / "batch_analytics.py"
KEYS = {"started_at", "last_finished_at", "running_seconds", "requests_per_minute", "output_tokens_per_second",
        "p50_ms", "p95_ms", "max_ms", "attempts", "retries", "errors_by_code", "cached_input_share", "cache_saved_usd"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # One attempt per request: a backend error fails it at once, so a retry in place has something to run again.
    with local_stack(tmp_path_factory, max_attempts=1, file_batches_enabled=True,
                     message_batches_enabled=True) as running:
        yield running


@pytest.fixture(scope="module")
def runs(stack, sdk_python, tmp_path_factory):
    """The script under every SDK major at once, each as its own user."""
    started = SdkRuns(stack, sdk_python, SCRIPT, SDK_MAJORS, tmp_path_factory.mktemp("sdk"))
    yield started
    started.close()


@pytest.mark.parametrize("major", SDK_MAJORS)
def test_analytics_read_with_the_official_sdks(runs, major):
    out = runs.result(major)

    file = out["file"]
    assert set(file["created"]) == KEYS and file["created"]["attempts"] == 0 and file["created"]["p50_ms"] is None
    first = file["first"]
    assert (first["attempts"], first["retries"]) == (3, 0)
    assert first["errors_by_code"] == {"invalid_request": 1, "upstream_error": 1}
    assert first["started_at"] == file["in_progress_at"] and isinstance(first["last_finished_at"], int)
    assert first["p50_ms"] <= first["p95_ms"] <= first["max_ms"]
    assert first["requests_per_minute"] == round(3 * 60 / first["running_seconds"], 2)
    again = file["again"]  # the retry in place ran the flaky request again, and it passed
    assert (again["attempts"], again["retries"]) == (4, 1)
    assert again["errors_by_code"] == first["errors_by_code"]
    assert first["last_finished_at"] <= again["last_finished_at"] <= file["completed_at"]

    if major != "openai1":  # that interpreter has only openai
        ended = out["message_batch"]["ended"]
        assert set(ended) == KEYS
        assert (ended["attempts"], ended["retries"], ended["errors_by_code"]) == (2, 0, {"invalid_request": 1})
        started = dt.datetime.fromisoformat(ended["started_at"].replace("Z", "+00:00"))
        assert started <= dt.datetime.fromisoformat(out["message_batch"]["ended_at"])
        assert ended["last_finished_at"].endswith("Z")
