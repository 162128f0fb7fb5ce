"""The order in which the suite's test files start, so that the workers finish together.

`make test` runs on pytest-xdist workers with `--dist loadfile`: each file runs whole on one worker, and
the files are handed out in collection order, the next one to whichever worker runs out first. A long file
handed out last keeps one worker busy while the other has nothing left; so the long files go first and the
many short ones (tests/unit) last, where they fill the gaps. (pytest-xdist's own default, files with the most
tests first, does the opposite here: an end-to-end file has few tests and takes minutes, and ran last.)

The order comes from the seconds each file took in the last run, kept in pytest's cache
(`.pytest_cache`, key `tests/seconds_per_file`); a file the cache does not know (a fresh clone, a new file)
is placed by its folder, the slow parts first. Within a file the tests keep their order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import pytest

CACHE_KEY = "tests/seconds_per_file"
# The parts by how long their files take, the longest first: what a fresh clone goes by.
PARTS_LONGEST_FIRST = ("browser", "e2e", "infra", "faults", "integration", "real_backend", "unit")


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def part_rank(path: str) -> int:
    """The place of a test file's part (tests/<part>/...) in PARTS_LONGEST_FIRST; unknown parts go last."""
    parts = path.split("/")
    part = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return PARTS_LONGEST_FIRST.index(part) if part in PARTS_LONGEST_FIRST else len(PARTS_LONGEST_FIRST)


def longest_first(files: Iterable[str], seconds: dict[str, float]) -> list[str]:
    """The files in the order they should start: by the seconds they last took, the longest first (a file
    without a time as its part's files take on average); without any times, by part. Files of equal standing
    keep their collection order."""
    files = list(files)
    known = [f for f in files if f in seconds]
    unknown = [f for f in files if f not in seconds]
    if not known:
        return sorted(files, key=part_rank)  # stable: collection order within a part
    # With times for some files only, the unknown ones go where their part's known files are on average.
    by_part: dict[int, list[float]] = defaultdict(list)
    for f in known:
        by_part[part_rank(f)].append(seconds[f])
    typical = {rank: sum(times) / len(times) for rank, times in by_part.items()}
    overall = sum(seconds[f] for f in known) / len(known)
    estimate = {f: seconds[f] for f in known}
    for f in unknown:  # with no file of its part known, as a file takes on average
        estimate[f] = typical.get(part_rank(f), overall)
    return sorted(files, key=lambda f: -estimate[f])


def reorder(items: list, seconds: dict[str, float]) -> None:
    """Reorder collected test items in place: their files longest first, each file's tests in their order."""
    order = {f: i for i, f in enumerate(longest_first(dict.fromkeys(file_of(i.nodeid) for i in items), seconds))}
    items.sort(key=lambda item: order[file_of(item.nodeid)])


def last_times(config: pytest.Config) -> dict[str, float]:
    """The seconds per file of the last whole run, from pytest's cache ({} without one)."""
    cache = getattr(config, "cache", None)
    return cache.get(CACHE_KEY, {}) if cache is not None else {}


def whole_suite(config: pytest.Config) -> bool:
    """Whether this run is the whole suite (no paths, no -k or -m, no last-failed first): only its file times
    are kept, since a file run in part would seem short."""
    option = config.option
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS and not option.keyword
            and not option.markexpr and not getattr(option, "lf", False) and not getattr(option, "deselect", None))


class FileTimes:
    """A plugin in the run's own process: adds up the seconds each file's tests took (setup, call and teardown,
    as the reports come in from the workers) and, after a whole run that passed, keeps them in the cache."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is not None and exitstatus == pytest.ExitCode.OK and self.seconds and whole_suite(self.config):
            cache.set(CACHE_KEY, {f: round(s, 1) for f, s in sorted(self.seconds.items())})
