"""`cmake --install BUILD --prefix P` gives a relocatable ckptconv: P/bin/ckptconv
finds its LibTorch plugins in P/lib/ckptconv and LibTorch at run time
(CKPTCONV_LIBTORCH, the active Python environment's torch, then the build's),
so the prefix can be moved; a missing plugin is an installation problem
(exit 5) that names the paths searched and the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

TORCH_DIR = Path(torch.__file__).resolve().parent


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CKPTCONV_LIBTORCH", "VIRTUAL_ENV", "CONDA_PREFIX", "CKPT_TORCH_PLUGIN",
                        "CKPT_TORCH_CUDA_PLUGIN")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def moved_prefix(ckptconv, tmp_path_factory) -> Path:
    assert shutil.which("cmake"), "cmake not found (scripts/setup installs it)"
    root = tmp_path_factory.mktemp("install")
    r = subprocess.run(["cmake", "--install", str(ckptconv.parent), "--prefix", str(root / "p1")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    (root / "p1").rename(root / "p2")
    return root / "p2"


def _run(binary: Path, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                          env=env or _clean_env(), timeout=300)


def test_install_layout(moved_prefix):
    assert (moved_prefix / "bin" / "ckptconv").is_file()
    assert (moved_prefix / "lib" / "ckptconv" / "libckpt_torch.so").is_file()
    assert (moved_prefix / "share" / "bash-completion" / "completions" / "ckptconv").is_file()
    assert (moved_prefix / "share" / "zsh" / "site-functions" / "_ckptconv").is_file()
    assert (moved_prefix / "share" / "man" / "man1" / "ckptconv.1").is_file()


def test_moved_prefix_runs_a_cast_through_libtorch(moved_prefix, tmp_path, testdata):
    """float8 -> bfloat16 is the one kind of cast ckptconv leaves to LibTorch
    (the others are native), so this run loads LibTorch from the moved prefix."""
    src = testdata / "pt" / "dtypes.pt"
    out = tmp_path / "bf16.pt"
    r = _run(moved_prefix / "bin" / "ckptconv", "consolidate", src, "--dtype", "bf16", "-o", out)
    assert r.returncode == 0, r.stderr
    got = _flat_dict(torch.load(out, weights_only=True))
    want = torch.load(src, weights_only=True)

    def flat(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            elif isinstance(v, torch.Tensor):
                yield f"{prefix}{k}", v
    casts = 0
    for name, t in flat(want):
        expect = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert torch.equal(got[name], expect), name
        casts += t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    assert casts == 2


def _flat_dict(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_version_says_where_libtorch_was_found(moved_prefix):
    binary = moved_prefix / "bin" / "ckptconv"
    r = _run(binary, "--version")
    assert r.returncode == 0 and f"{TORCH_DIR / 'lib'}, found by the build's own LibTorch" in r.stdout, r.stdout
    r = _run(binary, "--version", env=_clean_env(CKPTCONV_LIBTORCH=str(TORCH_DIR)))
    assert "found by CKPTCONV_LIBTORCH" in r.stdout, r.stdout
    venv = TORCH_DIR.parents[3]  # <prefix>/lib/python3.X/site-packages/torch
    r = _run(binary, "--version", env=_clean_env(VIRTUAL_ENV=str(venv)))
    assert "found by the active Python environment ($VIRTUAL_ENV)" in r.stdout, r.stdout


def test_libtorch_of_another_version_is_skipped(moved_prefix, tmp_path):
    fake = tmp_path / "torch"
    (fake / "lib").mkdir(parents=True)
    (fake / "lib" / "libtorch_cpu.so").write_bytes(b"")
    (fake / "version.py").write_text("__version__ = '1.13.0'\n")
    r = _run(moved_prefix / "bin" / "ckptconv", "--version", env=_clean_env(CKPTCONV_LIBTORCH=str(fake)))
    assert r.returncode == 0 and "found by the build's own LibTorch" in r.stdout, r.stdout


def test_binary_without_its_plugin_is_an_installation_problem(ckptconv, tmp_path, testdata):
    lone = tmp_path / "bin" / "ckptconv"
    lone.parent.mkdir()
    shutil.copy(ckptconv, lone)
    out = tmp_path / "o.pt"
    r = _run(lone, "consolidate", testdata / "pt" / "dtypes.pt", "--dtype", "bf16", "-o", out)  # float8: LibTorch
    assert r.returncode == 5, r.stderr
    assert "installation problem: the LibTorch plugin libckpt_torch.so is missing" in r.stderr
    assert f"{lone.parent}/../lib/ckptconv/libckpt_torch.so" in r.stderr and "cmake --install" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [lone.parent]
    # what needs no LibTorch still works, native casts included
    r = _run(lone, "consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "-o", out)
    assert r.returncode == 0, r.stderr
    r = _run(lone, "consolidate", testdata / "dcp" / "fsdp2_adamw_ws2", "--dtype", "bf16", "-o", tmp_path / "b.pt")
    assert r.returncode == 0, r.stderr
