"""--part I/N (#20): one consolidate split across N processes gives the very
bytes a single process writes (sha256), whether the workers are plain
background processes, torchrun's or mpirun's, or Slurm's (faked here: no
Slurm on this machine); a part that never finished is named by finalize,
nothing appears at OUT, and rerunning that part alone completes the output
identically."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TD = REPO / "testdata"

SOURCES = {
    "dcp": (TD / "dcp" / "fsdp2_adamw_ws2", []),
    "ranks": (TD / "fsdp_st" / "adamw_ws2", []),
    "zero": (TD / "zero" / "z2_bf16_ws2", []),
    "pt-bf16": (TD / "pt" / "dtypes.pt", ["--dtype", "bf16"]),
}


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _single(ckptconv, src, extra, out: Path) -> str:
    r = subprocess.run([str(ckptconv), "-q", "consolidate", str(src), "-o", str(out), *extra],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return _sha(out)


def _workers(ckptconv, src, extra, out: Path, n: int, parts=None, env=None) -> list[subprocess.CompletedProcess]:
    """Starts parts (default all of 0..n-1) at once, as a launcher would, and waits."""
    procs = [subprocess.Popen([str(ckptconv), "consolidate", str(src), "-o", str(out), "--part", f"{i}/{n}", *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in (range(n) if parts is None else parts)]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return results


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_parts_write_the_single_process_bytes(n, fmt, tmp_path, ckptconv):
    src, extra = SOURCES["dcp"]
    want = _single(ckptconv, src, extra, tmp_path / f"single.{fmt}")
    out = tmp_path / f"parts.{fmt}"
    results = _workers(ckptconv, src, extra, out, n)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert sum("finalized" in r.stderr for r in results) == 1  # exactly one worker finalized
    assert _sha(out) == want
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"single.{fmt}", out.name])  # parts folder gone


@pytest.mark.parametrize("family", ["ranks", "zero", "pt-bf16"])
def test_parts_of_every_source_family(family, tmp_path, ckptconv):
    src, extra = SOURCES[family]
    want = _single(ckptconv, src, extra, tmp_path / "single.pt")
    out = tmp_path / "parts.pt"
    results = _workers(ckptconv, src, extra, out, 3)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert _sha(out) == want


@pytest.mark.parametrize("n", [2, 3])
def test_parts_of_a_sharded_safetensors_output(n, tmp_path, ckptconv):
    """--max-shard-size: every shard and the index, each byte for byte."""
    src, _ = SOURCES["dcp"]
    extra = ["--max-shard-size", "600"]
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    r = subprocess.run([str(ckptconv), "-q", "consolidate", str(src), "-o", str(tmp_path / "one" / "model.safetensors"),
                        *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    results = _workers(ckptconv, src, extra, tmp_path / "many" / "model.safetensors", n)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    one = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert len(one) > 2 and "model.safetensors.index.json" in one
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == one
    for name in one:
        assert _sha(tmp_path / "many" / name) == _sha(tmp_path / "one" / name), name


def test_torchrun_launches_the_parts(tmp_path, ckptconv):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("no torchrun beside this Python")
    src, extra = SOURCES["dcp"]
    want = _single(ckptconv, src, extra, tmp_path / "single.pt")
    out = tmp_path / "tr.pt"
    r = subprocess.run([str(torchrun), "--nproc-per-node", "3", "--no-python", str(ckptconv), "consolidate", str(src),
                        "-o", str(out), "--part", "auto"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "torchrun (RANK/WORLD_SIZE)" in r.stderr
    assert _sha(out) == want


def test_mpirun_launches_the_parts(tmp_path, ckptconv):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("no mpirun (scripts/setup installs openmpi-bin)")
    src, extra = SOURCES["dcp"]
    want = _single(ckptconv, src, extra, tmp_path / "single.safetensors")
    out = tmp_path / "mpi.safetensors"
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", str(ckptconv), "consolidate",
                        str(src), "-o", str(out), "--part", "auto"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Open MPI (OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)" in r.stdout + r.stderr
    assert _sha(out) == want


def test_part_auto_reads_slurm(tmp_path, ckptconv):
    src, extra = SOURCES["dcp"]
    want = _single(ckptconv, src, extra, tmp_path / "single.pt")
    out = tmp_path / "slurm.pt"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_")) and k not in ("RANK", "WORLD_SIZE")}
    procs = [subprocess.Popen([str(ckptconv), "consolidate", str(src), "-o", str(out), "--part", "auto"],
                              stderr=subprocess.PIPE, text=True,
                              env=dict(clean, SLURM_PROCID=str(i), SLURM_NTASKS="2")) for i in range(2)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    assert all("Slurm (SLURM_PROCID/SLURM_NTASKS)" in e for e in errs)
    assert _sha(out) == want


def test_a_missing_part_is_named_and_rerunning_it_completes_the_output(tmp_path, ckptconv, run_ckptconv):
    """A worker that died (here: never ran) leaves no receipt: finalize is
    exit 3 naming it, with nothing at OUT; that part alone, rerun, finalizes
    the same bytes."""
    src, extra = SOURCES["dcp"]
    want = _single(ckptconv, src, extra, tmp_path / "single.pt")
    out = tmp_path / "k.pt"
    results = _workers(ckptconv, src, extra, out, 4, parts=[0, 1, 3])
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert not out.exists()
    r = run_ckptconv("consolidate", src, "-o", out, "--part", "finalize")
    assert r.returncode == 3 and "parts 2/4 have no receipt" in r.stderr and "rerun them" in r.stderr, r.stderr
    assert not out.exists()
    r = run_ckptconv("consolidate", src, "-o", out, "--part", "2/4")
    assert r.returncode == 0 and "finalized 4 parts" in r.stderr, r.stderr
    assert _sha(out) == want
    assert not list(tmp_path.glob("k.pt.parts-*"))


def test_receipts_of_another_split_are_refused(tmp_path, run_ckptconv):
    src, _ = SOURCES["dcp"]
    out = tmp_path / "o.pt"
    assert run_ckptconv("consolidate", src, "-o", out, "--part", "0/2").returncode == 0
    assert run_ckptconv("consolidate", src, "-o", out, "--part", "1/3").returncode == 0
    r = run_ckptconv("consolidate", src, "-o", out, "--part", "finalize")
    assert r.returncode == 3 and "split" in r.stderr and "rerun every part" in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.parametrize("args, says", [
    (["--part", "3/3"], "is not one of 0..2"),
    (["--part", "1-of-2"], "--part must be I/N"),
    (["--part", "auto"], "no launcher's environment"),
])
def test_part_usage_errors(args, says, tmp_path, ckptconv):
    src, _ = SOURCES["dcp"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_")) and k not in ("RANK", "WORLD_SIZE")}
    out = tmp_path / "o.pt"
    r = subprocess.run([str(ckptconv), "consolidate", str(src), "-o", str(out), *args], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_hdf5_output_refuses_parts(tmp_path, run_ckptconv):
    src, _ = SOURCES["dcp"]
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "o.h5", "--part", "0/2")
    assert r.returncode == 2 and "MPI-IO" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []
