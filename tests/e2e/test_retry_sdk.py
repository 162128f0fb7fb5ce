"""Retry in place (an extension) on the local stack with the official SDKs at every major the e2e tests cover
(`openai` 3.x/2.x/1.x, `anthropic` 2.x/1.x), each in its own interpreter: an inline batch, a file batch and a
Message Batch, each with a request that fails once and passes when retried."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SDK_MAJORS
from tests.e2e.conftest import SdkRuns, local_stack

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).with_name("sdk_scripts") / "retry_in_place.py"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # One attempt per request: a backend error fails it at once, so a retry has something to run again.
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
def test_retry_in_place_with_the_official_sdks(runs, major):
    out = runs.result(major)

    inline = out["inline"]
    assert inline["first"] == ["completed", 2, 1, 1]
    # The answer: in progress again, its ending cleared, counted once retried, the failed request out of failed.
    assert inline["retried"] == ["in_progress", None, 1, 2, 1, 0]
    assert inline["again"] == ["completed", 1, 2, 2, 0]
    assert inline["replayed"] == ["completed", 1]  # the same Idempotency-Key retries nothing more
    assert inline["statuses"] == ["completed", "completed"]
    assert inline["nothing_left"] == [400, "nothing_to_retry"]
    assert inline["unknown"] == [404, "batch_not_found"]

    file = out["file"]
    assert file["first"] == ["completed", 2, 1, 1, True, True]
    assert file["retried"] == ["in_progress", None, None]
    assert [f[0] for f in file["old_files"]] == [404, 404]  # the old result files are gone
    assert file["again"] == ["completed", 2, 2, 0, None, True]
    assert file["output"] == ["a", "flaky"]

    if major != "openai1":  # that interpreter has only openai
        batch = out["message_batch"]
        assert batch["first"] == [0, 1, 1, 0, 0]
        assert batch["retried"] == ["in_progress", None, None, 1]
        assert batch["again"] == ["ended", 0, 2, 0, 0, 0, True]
        assert batch["results"] == [["ok", "succeeded"], ["flaky", "succeeded"]]
        assert batch["nothing_left"] == [400, "BadRequestError"]
