"""Results as they finish and filtered results (extensions) on the local stack with the official SDKs at every
major the e2e tests cover (`openai` 3.x/2.x/1.x, `anthropic` 2.x/1.x), each in its own interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SDK_MAJORS
from tests.e2e.conftest import SdkRuns, local_stack

pytestmark = pytest.mark.e2e
SCRIPT = Path(__file__).with_name("sdk_scripts") / "results_feed.py"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(tmp_path_factory, max_attempts=1, message_batches_enabled=True) as running:
        yield running


@pytest.fixture(scope="module")
def runs(stack, sdk_python, tmp_path_factory):
    """The script under every SDK major at once, each as its own user."""
    started = SdkRuns(stack, sdk_python, SCRIPT, SDK_MAJORS, tmp_path_factory.mktemp("sdk"))
    yield started
    started.close()


@pytest.mark.parametrize("major", SDK_MAJORS)
def test_results_as_they_finish_with_the_official_sdks(runs, major):
    out = runs.result(major)

    feed = out["openai_feed"]
    assert feed["custom_ids"] == sorted([f"r{i}" for i in range(5)] + ["bad"])  # each once
    assert feed["pages"] >= 3  # two a page: paged by the cursor
    assert feed["failed"] == [["bad"], False]  # only failed ones, and has_more exact
    assert feed["one"] == [["r3", "completed"]]
    assert feed["bad_status"] == [400, "status"] and feed["bad_wait"] == [400, "wait"]

    if major != "openai1":  # that interpreter has only openai
        messages = out["message_feed"]
        assert messages["lines"] == [["m0", "succeeded"], ["m1", "succeeded"], ["m2", "succeeded"]]
        assert messages["sdk_results"] == [["m0", "succeeded"], ["m1", "succeeded"], ["m2", "succeeded"]]
