"""The cost benchmark's recorder (bench/calls.py) on moto: every DynamoDB call it sees is priced, the reads a
projection narrows included (DynamoDB charges the whole items read, whatever comes back)."""

from __future__ import annotations

from batchinfer.records import Feed
from bench.calls import Recorder


def test_the_finished_order_logs_head_read_is_counted_as_one_strongly_consistent_unit(svc):
    recorder = Recorder()
    recorder.install(svc.table.client)
    try:
        svc.table.transact([Feed.append(svc.table, "batch_1", 1, [[0, "abc"], [3, "def"]], None)])
        assert Feed.head(svc.table, "batch_1") == 1
    finally:
        recorder.uninstall(svc.table.client)
    _, head = recorder.calls
    assert (head.service, head.operation, head.rru) == ("dynamodb", "Query", 1)
