"""The order the suite's files start in on two workers: the longest first, so both finish together."""

from tests.file_order import longest_first, part_rank

FILES = ["tests/browser/test_console.py", "tests/e2e/test_a.py", "tests/e2e/test_b.py", "tests/faults/test_c.py",
         "tests/integration/test_d.py", "tests/unit/test_e.py", "tests/unit/test_f.py"]


def test_without_times_the_slow_parts_go_first_each_in_collection_order():
    shuffled = [FILES[5], FILES[3], FILES[1], FILES[6], FILES[4], FILES[0], FILES[2]]
    assert longest_first(shuffled, {}) == [FILES[0], FILES[1], FILES[2], FILES[3], FILES[4], FILES[5], FILES[6]]


def test_with_the_last_runs_times_the_longest_file_goes_first_whatever_its_part():
    seconds = {FILES[0]: 100.0, FILES[1]: 20.0, FILES[2]: 60.0, FILES[3]: 5.0, FILES[4]: 140.0, FILES[5]: 1.0,
               FILES[6]: 2.0}
    assert longest_first(FILES, seconds) == [FILES[4], FILES[0], FILES[2], FILES[1], FILES[3], FILES[6], FILES[5]]


def test_a_file_without_a_time_is_placed_as_its_parts_files_take_on_average():
    seconds = {FILES[1]: 80.0, FILES[2]: 40.0, FILES[4]: 50.0, FILES[5]: 1.0}
    new_e2e, new_unit = "tests/e2e/test_new.py", "tests/unit/test_new.py"
    order = longest_first([new_unit, *FILES[1:6], new_e2e], seconds)
    assert order.index(new_e2e) == 1 and order.index(new_unit) > order.index(FILES[4])  # e2e: 60 s; unit: 1 s


def test_files_outside_the_known_parts_go_last():
    assert part_rank("tests/e2e/test_a.py") < part_rank("tests/unit/test_e.py") < part_rank("tests/test_top.py")
