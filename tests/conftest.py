"""Shared fixtures: moto for AWS, the simulated backend on 127.0.0.1, services wired to both."""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")

from moto import mock_aws  # noqa: E402

from local.moto_patches import apply as patch_moto  # noqa: E402

patch_moto()

from batchinfer.runtime import use_services  # noqa: E402
from local.servers import UvicornThread, free_port  # noqa: E402
from local.simulated_backend import create_app as create_sim  # noqa: E402
from tests import file_order  # noqa: E402
from tests.helpers import make_services  # noqa: E402
from tests.webhook_receiver import receiver  # noqa: E402,F401  (a fixture: the webhook tests' receiver)


def pytest_configure(config):
    # pytest-xdist's `--dist loadfile` hands the files out in collection order only without its own reordering
    # (by test count); the order is set below, the longest files first (tests/file_order.py).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if not hasattr(config, "workerinput"):  # the run's own process, not an xdist worker: it keeps the times
        config.pluginmanager.register(file_order.FileTimes(config), "file-times")


def pytest_collection_modifyitems(config, items):
    file_order.reorder(items, file_order.last_times(config))


class _Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "passed_over", True):  # a record raised again is not hidden: its handler fails it
            self.records.append(record)


@pytest.fixture(autouse=True)
def background_failures_surface(request):
    """A background loop passes over an item that raised (logged by `batchinfer.background`) and goes on, as it
    must deployed; here a test fails on such a failure unless it injects one on purpose (marked
    `background_failures`), so the bulkheads hide no bug from the suites."""
    collected = _Collected()
    background = logging.getLogger("batchinfer.background")
    background.addHandler(collected)
    yield
    background.removeHandler(collected)
    if collected.records and request.node.get_closest_marker("background_failures") is None:
        pytest.fail("a background loop passed over an item that raised:\n"
                    + "\n".join(r.getMessage() for r in collected.records), pytrace=False)


@pytest.fixture(scope="session")
def sim():
    """The simulated model backend, shared by the session; each test resets it."""
    server = UvicornThread(create_sim(), free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def sim_control(sim):
    # A connection of its own for each control call: the simulator (uvicorn) closes a connection idle for 5 s, and a
    # call sent on it just as it closes fails with "Server disconnected" (seen after a long pump between two calls).
    control = httpx.Client(base_url=sim.url, timeout=10, limits=httpx.Limits(max_keepalive_connections=0))
    # Every setting back to its default: a test's latency distribution must not reach the next test.
    control.put("/_sim/config", json={"latency_seconds": 0, "latency_distribution": "fixed", "latency_sigma": 0.5,
                                      "rate_429": 0, "rate_500": 0, "rate_timeout": 0,
                                      "timeout_sleep_seconds": 30, "seed": 0, "answer_extra_json": "",
                                      "stream_usage": True, "prompt_cache": "off", "cache_slots": 4,
                                      "prompt_token_seconds": 0})
    control.post("/_sim/stats/reset")
    yield control
    control.close()


@pytest.fixture
def svc(sim, sim_control):
    """Services on a fresh in-process moto, with the default catalog pointed at the simulated backend.

    The boto3 clients are made once per process and kept (`storage.aws.client`'s cache): moto answers a client
    made before its mock started as well, and each test's moto starts empty. Making them anew for every test
    cost 0.6 s of CPU a test (botocore reads its service models and endpoint rules again)."""
    with mock_aws():
        services = make_services(sim.url)
        use_services(services)
        yield services
        use_services(None)


# The official SDKs at each major the e2e tests cover: "newest" is this interpreter (.venv, requirements-dev.txt);
# "previous" is .venv-sdk-previous, which holds only the SDKs at their previous major
# (requirements-sdk-previous.txt) and is built by `make test`.
ROOT = Path(__file__).resolve().parents[1]
SDK_MAJORS = ("newest", "previous", "openai1")  # openai1: openai 1.x alone, which many batch scripts still use
SDK_PINS = {"newest": ROOT / "requirements-dev.txt", "previous": ROOT / "requirements-sdk-previous.txt",
            "openai1": ROOT / "requirements-sdk-openai1.txt"}
SDKS = ("openai", "anthropic")
SDK_BUILD_HINT = "run `make test` (it builds .venv-sdk-* from requirements-sdk-*.txt)"


def pinned(major: str) -> dict[str, str]:
    """The SDK versions a major's requirements file pins, e.g. {"openai": "3.57.0", "anthropic": "2.14.0"}."""
    text = SDK_PINS[major].read_text()
    return {sdk: m[1] for sdk in SDKS if (m := re.search(rf"^{sdk}==(\S+)", text, re.M))}


@functools.cache
def _sdk_versions(python: str, sdks: tuple[str, ...] = SDKS) -> dict[str, str] | str:
    """The SDK versions an interpreter imports, or its error output when it cannot import them."""
    code = "import " + ", ".join(sdks) + "; print(" + ", ".join(f"{sdk}.__version__" for sdk in sdks) + ")"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    if out.returncode != 0:
        return out.stderr.strip()
    return dict(zip(sdks, out.stdout.split(), strict=True))


@pytest.fixture(scope="session")
def sdk_interpreters() -> dict[str, str]:
    """The interpreter of each SDK major."""
    return {"newest": sys.executable, "previous": str(ROOT / ".venv-sdk-previous" / "bin" / "python"),
            "openai1": str(ROOT / ".venv-sdk-openai1" / "bin" / "python")}


@pytest.fixture(scope="session")
def sdk_python(sdk_interpreters):
    """sdk_python(major) is the interpreter of that SDK major, once it is checked to import exactly the pinned
    SDKs, "previous" one major below "newest". A missing or stale venv fails the test that calls it (no skip)."""

    def interpreter(major: str) -> str:
        python = sdk_interpreters[major]
        if not os.access(python, os.X_OK):
            pytest.fail(f"{python} does not exist: {SDK_BUILD_HINT}", pytrace=False)
        pins = pinned(major)
        versions = _sdk_versions(python, tuple(pins))
        if versions != pins:
            pytest.fail(f"{python} has {versions!r}, {SDK_PINS[major].name} pins {pins!r}: {SDK_BUILD_HINT}",
                        pytrace=False)
        if major == "previous":
            newest = pinned("newest")
            for sdk in SDKS:
                below = int(newest[sdk].split(".")[0]) - 1
                assert versions[sdk].split(".")[0] == str(below), (
                    f"{SDK_PINS[major].name}: {sdk} {versions[sdk]} is not the previous major ({below}.x) of "
                    f"{sdk} {newest[sdk]}")
        return python

    return interpreter
