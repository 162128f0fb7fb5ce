"""Shared fixtures: moto for AWS, the simulated backend on 127.0.0.1, services wired to both."""

from __future__ import annotations

import os

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
from batchinfer.storage.aws import client  # noqa: E402
from local.servers import UvicornThread, free_port  # noqa: E402
from local.simulated_backend import create_app as create_sim  # noqa: E402
from tests.helpers import make_services  # noqa: E402


@pytest.fixture(scope="session")
def sim():
    """The simulated model backend, shared by the session; each test resets it."""
    server = UvicornThread(create_sim(), free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def sim_control(sim):
    control = httpx.Client(base_url=sim.url, timeout=10)
    control.put("/_sim/config", json={"latency_seconds": 0, "rate_429": 0, "rate_500": 0, "rate_timeout": 0,
                                      "timeout_sleep_seconds": 30, "seed": 0})
    control.post("/_sim/stats/reset")
    yield control
    control.close()


@pytest.fixture
def svc(sim, sim_control):
    """Services on a fresh in-process moto, with the default catalog pointed at the simulated backend."""
    client.cache_clear()
    with mock_aws():
        services = make_services(sim.url)
        use_services(services)
        yield services
        use_services(None)
    client.cache_clear()
