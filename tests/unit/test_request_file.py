"""How requests' bodies are read back from the batch's file (a direct run's group, a provider job's page):
neighbours together, in a few ranged reads, each body still its own and in the order asked for."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

from batchinfer.layout import requests_object
from batchinfer.service.running.request_file import bodies, read_runs

KIB = 1024


def test_no_spans_read_nothing():
    assert read_runs([]) == []


def test_neighbours_are_read_together_whatever_order_they_come_in():
    assert read_runs([(200, 50), (0, 100), (100, 100)]) == [(0, 250)]


def test_a_gap_up_to_the_limit_is_read_through_one_past_it_is_not():
    assert read_runs([(0, 10), (10 + 64 * KIB, 10)]) == [(0, 20 + 64 * KIB)]
    assert read_runs([(0, 10), (11 + 64 * KIB, 10)]) == [(0, 10), (11 + 64 * KIB, 21 + 64 * KIB)]


def test_a_run_stops_before_it_passes_its_most():
    spans = [(at * 1000, 1000) for at in range(10)]
    assert read_runs(spans, gap=0, most=4000) == [(0, 4000), (4000, 8000), (8000, 10000)]


def test_a_span_larger_than_most_is_read_alone_and_one_inside_it_joins_it():
    assert read_runs([(100, 10), (0, 5000), (6000, 10)], gap=10_000, most=1000) == [(0, 5000), (6000, 6010)]
    assert read_runs([(0, 10), (0, 5000)], gap=0, most=1000) == [(0, 5000)]


def test_every_span_lies_whole_in_the_last_run_starting_at_or_before_it():
    rng = random.Random(7)
    for _ in range(300):
        spans = [(rng.randrange(0, 20_000), rng.randrange(1, 3000)) for _ in range(rng.randrange(1, 30))]
        runs = read_runs(spans, gap=rng.choice([0, 100, 2000]), most=rng.choice([500, 4000, 50_000]))
        assert all(a[0] < b[0] for a, b in zip(runs, runs[1:], strict=False)), runs
        for offset, length in spans:
            start, end = [run for run in runs if run[0] <= offset][-1]
            assert start <= offset and offset + length <= end, (offset, length, runs)


def test_lines_of_a_file_are_each_read_once():
    rng = random.Random(11)
    spans, at = [], 0
    for n in range(500):
        at += 70 * KIB if n % 100 == 99 else rng.choice([0, 10, 30 * KIB])  # lines the job did not take between
        length = rng.randrange(100, 100 * KIB)
        spans.append((at, length))
        at += length
    runs = read_runs(rng.sample(spans, len(spans)))
    assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:], strict=False))
    assert all(end - start <= 4 * KIB * KIB for start, end in runs)
    assert sum(end - start for start, end in runs) < at  # the large gaps are not read
    assert len(runs) <= 20  # where a run of 500 reads took 500


class CountingBlobs:
    def __init__(self, data: bytes) -> None:
        self.data, self.reads = data, []

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        self.reads.append((key, offset, length))
        return self.data[offset:offset + length]


def test_bodies_come_in_the_order_asked_for_from_few_reads():
    lines, reqs, at = [], [], 0
    for index in range(200):
        line = json.dumps({"custom_id": f"c-{index}", "body": {"n": index, "pad": "x" * (index % 7)}}).encode()
        reqs.append({"batch_id": "batch_1", "index": index, "offset": at, "length": len(line)})
        lines.append(line + b"\n")
        at += len(line) + 1
    blobs = CountingBlobs(b"".join(lines))
    svc = SimpleNamespace(blobs=blobs)
    asked = reqs[150:] + reqs[:40:3] + [reqs[7]]

    read = bodies(svc, "batch_1", [(r["offset"], r["length"]) for r in asked])
    assert [body["n"] for body in read] == [req["index"] for req in asked]
    assert [key for key, _, _ in blobs.reads] == [requests_object("batch_1")]  # one read for all of them
    assert bodies(svc, "batch_1", []) == []
