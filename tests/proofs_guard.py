"""Every proof runs: under CI a skip is a failure unless it is for a GPU.

A pytest plugin; tests/conftest.py registers it. When ``CKPT_REQUIRE_PROOFS=1``
(scripts/test exports it), or ``CI=true`` and CKPT_REQUIRE_PROOFS is not ``0``, a test skipped for any reason that
does not name a GPU (the one thing a CI machine cannot be given) is reported
as FAILED, with its skip reason: a missing side environment, tool or package
is an error of the machine's setup, not a proof that need not run. A module
skipped as a whole (``pytest.importorskip`` at module level, at collection)
is listed at the end and fails the run, without stopping the others. An
``xfail`` is not a skip and is left as it is. Elsewhere (a developer's own
run) skips stay skips.

A reason is GPU-related when it contains the word "GPU" (any case).
"""

from __future__ import annotations

import os
import re

import pytest

GPU_REASON = re.compile(r"\bgpus?\b", re.I)


def proofs_required() -> bool:
    """CKPT_REQUIRE_PROOFS=1 or 0 decides; unset or empty, CI=true turns it on."""
    if os.environ.get("CKPT_REQUIRE_PROOFS", ""):
        return os.environ["CKPT_REQUIRE_PROOFS"] == "1"
    return os.environ.get("CI", "").lower() == "true"


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _forbidden(report) -> str | None:
    """The reason of a skip this run may not have, else None."""
    if not report.skipped or hasattr(report, "wasxfail") or not proofs_required():
        return None
    reason = _reason(report)
    return None if GPU_REASON.search(reason) else reason


_SKIPPED_MODULES: list[str] = []
MESSAGE = "skipped, but every proof must run here (CKPT_REQUIRE_PROOFS=1 or CI=true; only a skip for a GPU is allowed)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (reason := _forbidden(report)) is not None:
        report.outcome = "failed"
        report.longrepr = f"{MESSAGE}: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if (reason := _forbidden(report)) is not None:
        _SKIPPED_MODULES.append(f"{report.nodeid}: {reason}")


def pytest_terminal_summary(terminalreporter):
    if _SKIPPED_MODULES:
        terminalreporter.section("proofs not run", sep="=", red=True)
        terminalreporter.line(f"{len(_SKIPPED_MODULES)} module(s) {MESSAGE}:")
        for line in _SKIPPED_MODULES:
            terminalreporter.line(f"  {line}")


def pytest_sessionstart(session):
    _SKIPPED_MODULES.clear()


def pytest_sessionfinish(session, exitstatus):
    if _SKIPPED_MODULES and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def require_side_env(python, what: str, script: str) -> None:
    """Fails the test (never skips it) when the side environment whose
    interpreter is `python` is missing: `what` runs in it, `script` makes it."""
    if not python.exists():
        pytest.fail(f"no {python}: {what} in the side environment that {script} makes (scripts/test does)")
