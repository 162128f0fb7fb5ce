"""The fault suite's `svc`: the shared one (tests/conftest.py), its moto clients made atomic per call and its
clock one the tests move forward."""

from __future__ import annotations

import threading

import pytest

from tests.faults.harness import Clock, Serialized


@pytest.fixture
def svc(svc):
    lock = threading.RLock()
    svc.table.client = Serialized(svc.table.client, lock)
    svc.queues.sqs = Serialized(svc.queues.sqs, lock)
    svc.clock = Clock()
    return svc
