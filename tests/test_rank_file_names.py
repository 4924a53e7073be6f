"""FSDP rank files named without the word "rank" (#30 row 2): real torch
ShardedTensor rank files (testdata/fsdp_st/adamw_ws2, written by torch's
FSDP) copied under the names jobs give them — model_shard_{r}.pt /
optimizer_shard_{r}.pt, shard_{r}.pt, {r}.pt, ckpt-{r:02d}.pt — are a family
because their names differ in exactly one integer that runs over ranks from
0, and consolidate to the very bytes the *rank{r}* originals give. The
ranks their shards' placements carry ("rank:R/cpu") must agree with the
names: files swapped by name are exit 3 naming both."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ST2 = REPO / "testdata" / "fsdp_st" / "adamw_ws2"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _renamed(tmp_path: Path, model: str | None, optim: str | None) -> Path:
    d = tmp_path / "ranks"
    d.mkdir()
    for r in (0, 1):
        if model:
            shutil.copy(ST2 / f"model_rank{r}.pt", d / model.format(r=r))
        if optim:
            shutil.copy(ST2 / f"optim_rank{r}.pt", d / optim.format(r=r))
    return d


def _reference(tmp_path: Path, run_ckptconv, only: list[str]) -> str:
    out = tmp_path / "reference.pt"
    r = run_ckptconv("consolidate", ST2, "-o", out, *only)
    assert r.returncode == 0, r.stderr
    return _sha(out)


@pytest.mark.parametrize("model,optim", [
    ("model_shard_{r}.pt", "optimizer_shard_{r}.pt"),
    ("shard_{r}.pt", None),
    ("{r}.pt", None),
    ("ckpt-{r:02d}.pt", None),
    ("model_{r}.bin", "optim_{r}.bin"),
])
def test_a_numbered_family_consolidates_like_the_rank_named_one(model, optim, tmp_path, run_ckptconv):
    d = _renamed(tmp_path, model, optim)
    want = _reference(tmp_path, run_ckptconv, [] if optim else ["--only", "model"])
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", d, "-o", out)
    assert r.returncode == 0, r.stderr
    assert _sha(out) == want
    # the same files listed one by one
    out2 = tmp_path / "listed.pt"
    r = run_ckptconv("consolidate", "--files", *sorted(d.iterdir()), "-o", out2)
    assert r.returncode == 0, r.stderr
    assert _sha(out2) == want


def test_a_name_that_disagrees_with_the_placement_is_refused_naming_both(tmp_path, run_ckptconv):
    d = tmp_path / "swapped"
    d.mkdir()
    shutil.copy(ST2 / "model_rank0.pt", d / "model_shard_1.pt")
    shutil.copy(ST2 / "model_rank1.pt", d / "model_shard_0.pt")
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert "model_shard_0.pt: holds the shards of rank 1" in r.stderr and "its name says rank 0" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()


def test_numbered_files_that_are_steps_not_ranks_are_no_family(tmp_path, run_ckptconv):
    """step_100.pt, step_200.pt: the integer does not run over ranks from 0."""
    d = tmp_path / "steps"
    d.mkdir()
    shutil.copy(ST2 / "model_full.pt", d / "step_100.pt")
    shutil.copy(ST2 / "model_full.pt", d / "step_200.pt")
    r = run_ckptconv("inspect", d)
    assert r.returncode == 3 and "not a recognised checkpoint" in r.stderr, r.stderr


def test_reshard_keeps_a_numbered_familys_names(tmp_path, run_ckptconv):
    d = _renamed(tmp_path, "ckpt-{r:02d}.pt", None)
    out = tmp_path / "ws3"
    r = run_ckptconv("reshard", d, "-o", out, "--world-size", "3", "--layout", "fsdp-sharded-tensor")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["ckpt-00.pt", "ckpt-01.pt", "ckpt-02.pt"]
    r = run_ckptconv("diff", out, d)
    assert r.returncode == 0, r.stdout + r.stderr
