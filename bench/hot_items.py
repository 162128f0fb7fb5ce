"""The many-lanes workload with the hot-item report (bench/hot_report.py): `python -m bench.hot_items`.

The same as `python -m bench.many_lanes --hot`, with the same flags: which DynamoDB items and index partitions
the run wrote most, per request, and what that becomes at the target load (docs/scale.md).
"""

from __future__ import annotations

import sys

from bench import many_lanes


def main(argv: list[str] | None = None) -> dict:
    return many_lanes.main(["--hot", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    main()
