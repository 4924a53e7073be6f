"""Shared pytest fixtures for ckptconv's integration tests.

    repo          Path of the repository root.
    manifest      testdata/manifest.json, parsed (written by
                  tools/make_checkpoints.py; lists every real-torch fixture).
    testdata      Path of testdata/.
    ckptconv      Path of the built binary: $CKPTCONV if set, else
                  build/ckptconv. Tests that use it fail (saying how to
                  build it) when it does not exist.
    run_ckptconv  run_ckptconv(*args, input=None, cwd=None) ->
                  subprocess.CompletedProcess with text stdout/stderr; never
                  raises on a non-zero exit code (tests assert returncode).

Inputs untouched: every file under testdata/ is hashed when the session
starts and again when it ends; any file changed, removed or added fails the
run, naming it (no command may write into or beside the checkpoints it reads).

Every proof runs: with CKPT_REQUIRE_PROOFS=1 (scripts/test) or CI=true, a
skip whose reason does not name a GPU is a failure (tests/proofs_guard.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

import proofs_guard

REPO = Path(__file__).resolve().parent.parent
_TESTDATA_DIGESTS: dict[str, str] = {}


def _testdata_digests() -> dict[str, str]:
    root = REPO / "testdata"
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def pytest_configure(config):
    config.pluginmanager.register(proofs_guard, "proofs_guard")


def pytest_sessionstart(session):
    _TESTDATA_DIGESTS.update(_testdata_digests())


def pytest_sessionfinish(session, exitstatus):
    after = _testdata_digests()
    changed = sorted(k for k in _TESTDATA_DIGESTS.keys() | after.keys() if _TESTDATA_DIGESTS.get(k) != after.get(k))
    if changed:
        print(f"\ninputs untouched: FAILED, {len(changed)} file(s) under testdata/ changed, removed or added during "
              f"the tests: {', '.join(changed[:20])}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def testdata(repo: Path) -> Path:
    return repo / "testdata"


@pytest.fixture(scope="session")
def manifest(testdata: Path) -> dict:
    path = testdata / "manifest.json"
    if not path.exists():
        pytest.fail(f"{path} missing: run `python tools/make_checkpoints.py --out testdata`")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def ckptconv(repo: Path) -> Path:
    path = Path(os.environ.get("CKPTCONV", repo / "build" / "ckptconv"))
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"ckptconv binary not found at {path} (build it with scripts/build or set $CKPTCONV)")
    return path


@pytest.fixture
def run_ckptconv(ckptconv: Path):
    def run(*args, input: str | None = None, cwd: str | os.PathLike | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(ckptconv), *map(str, args)], input=input, cwd=cwd,
                              capture_output=True, text=True, check=False, timeout=timeout)
    return run
