"""ctest runs each Catch2 case as `unit_tests "<name>"` (catch_discover_tests),
so a case whose name starts with '-' is read as an option and fails under
ctest only ('Unrecognised token'), while `build/unit_tests` alone passes it."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_catch2_case_name_starts_with_a_dash():
    bad = []
    for path in sorted(TESTS.rglob("*.cc")):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = re.search(r'\b(?:TEST_CASE|SCENARIO)\(\s*"(-[^"]*)"', line)
            if m:
                bad.append(f"{path.relative_to(TESTS.parent)}:{number}: {m.group(1)}")
    assert not bad, "Catch2 case names starting with '-' (ctest passes them as options):\n" + "\n".join(bad)
