"""The guard of tests/proofs_guard.py: with CKPT_REQUIRE_PROOFS=1 (or CI=true)
a skip whose reason does not name a GPU fails the run, a GPU skip and an
xfail do not, and without either variable skips stay skips. Each case runs
pytest in a child process on small test files of its own, with the plugin
registered as tests/conftest.py registers it."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CONFTEST = """
import proofs_guard

def pytest_configure(config):
    config.pluginmanager.register(proofs_guard, "proofs_guard")
"""

CASES = """
import pytest

def test_passes():
    pass

def test_skip_for_a_tool():
    pytest.skip("strace cannot trace here")

def test_skip_for_a_gpu():
    pytest.skip("needs a GPU: no CUDA device")

@pytest.mark.skipif(True, reason="no .venv-deepspeed (scripts/setup-deepspeed)")
def test_skipif_marker():
    pass

@pytest.fixture
def side_env():
    pytest.skip("fixture: no side environment")

def test_skip_in_a_fixture(side_env):
    pass

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_xfail():
    assert False
"""

PASSES = "def test_passes():\n    pass\n"
MODULE_SKIP = """
import pytest
pytest.importorskip("ckptconv_no_such_module")

def test_never_runs():
    pass
"""


def run_pytest(tmp_path: Path, files: dict[str, str], **env) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """Exit status and output, and each test's outcome (passed, failed, skipped, xfailed) from the JUnit XML."""
    for name, text in {"conftest.py": CONFTEST, **files}.items():
        (tmp_path / name).write_text(text)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "CKPT_REQUIRE_PROOFS", "PYTEST_ADDOPTS")}
    clean["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])
    xml = tmp_path / "report.xml"
    r = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        f"--junitxml={xml}", *sorted(files)], cwd=tmp_path, env={**clean, **env},
                       capture_output=True, text=True, timeout=120)
    got = {}
    for case in ET.parse(xml).iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        if not kinds:
            got[case.get("name")] = "passed"
        elif kinds[0] == "skipped":
            got[case.get("name")] = "xfailed" if case.find("skipped").get("type") == "pytest.xfail" else "skipped"
        else:
            got[case.get("name")] = "failed"
    return r, got


@pytest.mark.parametrize("env", [{"CKPT_REQUIRE_PROOFS": "1"}, {"CI": "true"}],
                         ids=["CKPT_REQUIRE_PROOFS=1", "CI=true"])
def test_a_skip_not_for_a_gpu_fails_the_run(env, tmp_path):
    r, got = run_pytest(tmp_path, {"test_cases.py": CASES}, **env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert got == {"test_passes": "passed", "test_skip_for_a_tool": "failed", "test_skip_for_a_gpu": "skipped",
                   "test_skipif_marker": "failed", "test_skip_in_a_fixture": "failed", "test_xfail": "xfailed"}, got
    # Each failure says why, with the skip's own reason.
    for reason in ("strace cannot trace here", "no .venv-deepspeed (scripts/setup-deepspeed)",
                   "fixture: no side environment"):
        assert f"every proof must run here (CKPT_REQUIRE_PROOFS=1 or CI=true; only a skip for a GPU is allowed): " \
               f"{reason}" in r.stdout, (reason, r.stdout)


def test_without_the_variables_skips_stay_skips(tmp_path):
    files = {"test_cases.py": CASES, "test_module.py": MODULE_SKIP}
    r, got = run_pytest(tmp_path, files)
    assert r.returncode == 0, r.stdout + r.stderr
    assert got == {"test_passes": "passed", "test_skip_for_a_tool": "skipped", "test_skip_for_a_gpu": "skipped",
                   "test_skipif_marker": "skipped", "test_skip_in_a_fixture": "skipped", "test_xfail": "xfailed",
                   "test_module": "skipped"}, got  # JUnit names the skipped module as a test case
    assert "proofs not run" not in r.stdout
    r, _ = run_pytest(tmp_path, files, CI="true", CKPT_REQUIRE_PROOFS="0")  # an explicit 0 wins over CI
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_module_skipped_at_collection_fails_the_run_without_stopping_it(tmp_path):
    r, got = run_pytest(tmp_path, {"test_a.py": PASSES, "test_module.py": MODULE_SKIP}, CKPT_REQUIRE_PROOFS="1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert got["test_passes"] == "passed"  # the other module still ran
    assert "proofs not run" in r.stdout and \
        "test_module.py: could not import 'ckptconv_no_such_module'" in r.stdout, r.stdout
    r, _ = run_pytest(tmp_path, {"test_module.py": MODULE_SKIP}, CKPT_REQUIRE_PROOFS="1")  # alone: no tests at all
    assert r.returncode == 1, r.stdout + r.stderr


def test_gpu_skips_alone_pass(tmp_path):
    gpu = ("import pytest\n\n@pytest.mark.parametrize('why', ['needs a GPU (no CUDA device)', 'a gpu is visible'])\n"
           "def test_cuda(why):\n    pytest.skip(why)\n")
    r, got = run_pytest(tmp_path, {"test_gpu.py": gpu}, CKPT_REQUIRE_PROOFS="1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(got.values()) == ["skipped", "skipped"], got
