"""--part I/N (#20): one consolidate or reshard split across N processes
gives the very bytes a single process writes (sha256; a DCP .metadata's
random save id aside), whether the workers are plain background processes,
torchrun's or mpirun's, or Slurm's (faked here: no Slurm on this machine); a
tensor that spans two workers' shares is written by both, cut at a row; a
part that never finished is named by finalize, nothing appears at OUT, and
rerunning that part alone completes the output identically; a finalizing
step that did not happen is done by `ckptconv finalize OUT`, without SRC."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
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


def _finalizers(results) -> int:
    """How many workers finalized. Only the finalizer's summary has '; finalized N parts';
    a worker that saw another finish says 'another worker finalized OUT'."""
    return sum(bool(re.search(r"; finalized \d+ parts", r.stderr)) for r in results)


def _workers(ckptconv, src, extra, out: Path, n: int, parts=None, env=None,
             command="consolidate") -> list[subprocess.CompletedProcess]:
    """Starts parts (default all of 0..n-1) at once, as a launcher would, and waits."""
    procs = [subprocess.Popen([str(ckptconv), command, str(src), "-o", str(out), "--part", f"{i}/{n}", *extra],
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
    assert _finalizers(results) == 1, [r.stderr for r in results]
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


@pytest.mark.parametrize("extra", [[], ["--max-shard-size", "1000"]], ids=["one-file", "sharded"])
def test_parts_into_a_folder_write_the_single_process_folder(extra, tmp_path, ckptconv):
    """-o DIR/ from a Hugging Face folder: the workers wrote the weights but
    not the folder's side files (config.json, generation_config.json), which
    the one process copies, so the folder did not load with from_pretrained.
    The finalizing worker copies them, config.json naming the weights written."""
    src = tmp_path / "src"
    shutil.copytree(TD / "hf" / "llama_tied", src)
    config = json.loads((src / "config.json").read_text())
    config["transformers_weights"] = "model.safetensors"  # rewritten to the index when sharded, as by one process
    (src / "config.json").write_text(json.dumps(config))
    r = subprocess.run([str(ckptconv), "-q", "consolidate", str(src), "-o", f"{tmp_path / 'one'}/", *extra],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    results = _workers(ckptconv, src, extra, f"{tmp_path / 'many'}/", 2)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert _finalizers(results) == 1
    one = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert "config.json" in one and "generation_config.json" in one
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == one
    for name in one:
        assert _sha(tmp_path / "many" / name) == _sha(tmp_path / "one" / name), name
    weights = json.loads((tmp_path / "many" / "config.json").read_text())["transformers_weights"]
    assert weights == ("model.safetensors.index.json" if extra else "model.safetensors")


def test_finalize_of_a_folder_copies_its_side_files(tmp_path, run_ckptconv):
    """`ckptconv finalize DIR/` after the finalizing worker died: the parts
    are DIR/model.safetensors's, and the stored request names the folder,
    so its side files are copied as the workers' finalizer copies them (the
    request named only the weights file, and finalize left them out)."""
    r = run_ckptconv("consolidate", TD / "hf" / "llama_tied", "-o", f"{tmp_path / 'one'}/")
    assert r.returncode == 0, r.stderr
    out = f"{tmp_path / 'many'}/"
    assert run_ckptconv("consolidate", TD / "hf" / "llama_tied", "-o", out, "--part", "0/2").returncode == 0
    (folder,) = (tmp_path / "many").glob("model.safetensors.parts-*")
    (folder / "finalizing").touch()
    r = run_ckptconv("consolidate", TD / "hf" / "llama_tied", "-o", out, "--part", "1/2")
    assert r.returncode == 0 and "another worker is finalizing" in r.stderr, r.stderr
    r = run_ckptconv("finalize", out)
    assert r.returncode == 0 and "finalized 2 parts" in r.stderr, r.stderr
    one = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert "config.json" in one and sorted(p.name for p in (tmp_path / "many").iterdir()) == one
    for name in one:
        assert _sha(tmp_path / "many" / name) == _sha(tmp_path / "one" / name), name


@pytest.mark.parametrize("extra", [[], ["--max-shard-size", "1000"]], ids=["one-file", "sharded"])
def test_a_finalize_killed_between_the_weights_and_the_side_files_is_finished_by_the_next(extra, tmp_path, ckptconv,
                                                                                        run_ckptconv):
    """The finalizing worker SIGKILLed (CKPTCONV_TEST_STOP_AT) after the
    weights (and index) are renamed into DIR, before config.json and the
    other side files: the parts folder stays, with the record of what was
    published, as the s3:// finalizer keeps its state until the side files
    are up, and `ckptconv finalize DIR/` copies them in. The folder is then
    the one process's, byte for byte (it had no config.json, and finalize
    found no parts to finish)."""
    src = TD / "hf" / "llama_tied"
    r = run_ckptconv("consolidate", src, "-o", f"{tmp_path / 'one'}/", *extra)
    assert r.returncode == 0, r.stderr
    out = f"{tmp_path / 'many'}/"
    assert run_ckptconv("consolidate", src, "-o", out, "--part", "0/2", *extra).returncode == 0
    killed = subprocess.run([str(ckptconv), "consolidate", str(src), "-o", out, "--part", "1/2", *extra],
                            capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, CKPTCONV_TEST_STOP_AT="finalize-published"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = sorted(p.name for p in (tmp_path / "many").iterdir())
    weights = "model.safetensors.index.json" if extra else "model.safetensors"
    assert weights in left and "config.json" not in left and "generation_config.json" not in left, left
    (folder,) = (tmp_path / "many").glob("model.safetensors.parts-*")
    assert json.loads((folder / "published.json").read_text())["files"][-1] == str(tmp_path / "many" / weights)
    r = run_ckptconv("finalize", out)
    assert r.returncode == 0 and "published before" in r.stderr, r.stderr
    one = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert "config.json" in one and sorted(p.name for p in (tmp_path / "many").iterdir()) == one
    for name in one:
        assert _sha(tmp_path / "many" / name) == _sha(tmp_path / "one" / name), name


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
    assert torchrun.exists(), f"no torchrun beside {sys.executable} (torch installs it)"
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
    assert mpirun, "no mpirun (scripts/setup installs openmpi-bin)"
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


def test_part_abort_removes_the_parts_and_writes_nothing(tmp_path, run_ckptconv):
    """Giving a run up: --part abort with the workers' command removes the
    parts folder of that plan; OUT never appears, and a second abort finds
    nothing to remove."""
    src, _ = SOURCES["dcp"]
    out = tmp_path / "a.pt"
    assert run_ckptconv("consolidate", src, "-o", out, "--part", "0/2").returncode == 0
    [parts] = list(tmp_path.glob("a.pt.parts-*"))
    assert (parts / "part-0-of-2.json").is_file()
    r = run_ckptconv("consolidate", src, "-o", out, "--part", "abort")
    assert r.returncode == 0 and f"removed {parts}" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []
    r = run_ckptconv("consolidate", src, "-o", out, "--part", "abort")
    assert r.returncode == 0 and "no parts of this plan to remove" in r.stderr, r.stderr


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


def _one_big_tensor(path: Path, fmt: str) -> Path:
    """A state dict whose bytes are mostly one tensor: every split cuts it."""
    import torch
    g = torch.Generator().manual_seed(20)
    sd = {"big": torch.randn(301, 17, generator=g), "small": torch.arange(5, dtype=torch.int64)}
    if fmt == "pt":
        torch.save(sd, path)
    else:
        from safetensors.torch import save_file
        save_file(sd, str(path))
    return path


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_one_big_tensor_is_split_between_workers_by_rows(fmt, tmp_path, ckptconv, run_ckptconv):
    """Two workers share the 20 KB tensor: each receipt names a row-aligned
    piece of it, and the .pt's CRC-32 of the record is the two pieces'
    joined (Python's zipfile checks it; torch.load does not check CRCs)."""
    src = _one_big_tensor(tmp_path / f"src.{fmt}", fmt)
    want = _single(ckptconv, src, [], tmp_path / f"single.{fmt}")
    out = tmp_path / f"parts.{fmt}"
    r = run_ckptconv("convert", src, "-o", out, "--part", "0/2")
    assert r.returncode == 0, r.stderr
    (receipt,) = tmp_path.glob(f"parts.{fmt}.parts-*/part-0-of-2.json")
    pieces = json.loads(receipt.read_text())["pieces"]
    row = 17 * 4
    (cut,) = [p for p in pieces if p[2] - p[1] != 5 * 8]  # its piece of `big`
    assert 0 < cut[2] - cut[1] < 301 * row and cut[1] % row == 0 and cut[2] % row == 0, pieces
    r = run_ckptconv("convert", src, "-o", out, "--part", "1/2")
    assert r.returncode == 0 and "finalized 2 parts" in r.stderr, r.stderr
    assert _sha(out) == want
    if fmt == "pt":
        import torch
        import zipfile
        with zipfile.ZipFile(out) as z:
            assert z.testzip() is None  # every record's bytes against its CRC-32
        got, ref = torch.load(out, weights_only=True), torch.load(src, weights_only=True)
        assert torch.equal(got["big"], ref["big"]) and torch.equal(got["small"], ref["small"])


def test_a_cut_near_a_tensor_edge_moves_to_the_edge(tmp_path, ckptconv, run_ckptconv):
    """A 40-byte tensor, then four equal ones, over two workers: the halfway
    cut falls 20 bytes into the third. It used to cut that tensor at row 1,
    so each worker read back its piece to sum its CRC-32 (the whole tensor
    read once more); now the cut moves to the tensor's edge and every piece
    in both receipts is a whole tensor."""
    import torch
    g = torch.Generator().manual_seed(21)
    src = tmp_path / "src.pt"
    sd = {"s": torch.arange(10, dtype=torch.float32)}
    sd.update({f"t{i}": torch.randn(200, 32, generator=g) for i in range(4)})
    torch.save(sd, src)
    want = _single(ckptconv, src, [], tmp_path / "single.pt")
    out = tmp_path / "parts.pt"
    for i in (0, 1):
        r = run_ckptconv("convert", src, "-o", out, "--part", f"{i}/2")
        assert r.returncode == 0, r.stderr
        if i == 0:
            (receipt,) = tmp_path.glob("parts.pt.parts-*/part-0-of-2.json")
            pieces = json.loads(receipt.read_text())["pieces"]
            # [unit, begin, end, crc]: whole units start at 0; a tensor is 200*32*4 bytes.
            assert [p[:3] for p in pieces] == [[0, 0, 40], [1, 0, 25600], [2, 0, 25600]], pieces
    assert _sha(out) == want


def _metadata_without_save_id(d: Path) -> bytes:
    """DCP's .metadata names a random save id (a UUID4) and the directory it
    was written to (checkpoint_id: compare outputs whose paths have the
    same length); everything else must match."""
    data = (d / ".metadata").read_bytes()
    for spelling in (str(d).encode(), d.name.encode()):  # as -o gave it: absolute, or relative
        data = data.replace(spelling, b"#" * len(spelling))
    ids = re.findall(rb"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", data)
    assert len(ids) == 1, ids
    return data.replace(ids[0], b"0" * 36)


def _same_directories(a: Path, b: Path):
    names = sorted(p.name for p in a.iterdir())
    assert sorted(p.name for p in b.iterdir()) == names
    for name in names:
        if name == ".metadata":
            assert _metadata_without_save_id(a) == _metadata_without_save_id(b)
        else:
            assert _sha(a / name) == _sha(b / name), name


RESHARDS = {
    "dcp": (TD / "dcp" / "fsdp2_adamw_ws2", ["--world-size", "3"]),
    "sharded-tensor": (TD / "fsdp_st" / "adamw_ws2", ["--world-size", "3"]),
    "dtensor": (TD / "fsdp_dt" / "adamw_ws3", ["--world-size", "2"]),
    "zero-to-dcp": (TD / "zero" / "z2_bf16_ws2", ["--world-size", "3", "--layout", "dcp", "--dtype", "fp32"]),
    "megatron": (TD / "megatron" / "gpt_tp2pp2" / "ckpt", ["--world-size", "3"]),
    "hf": (TD / "dcp" / "fsdp2_adamw_ws2", ["--world-size", "3", "--layout", "hf", "--only", "model"]),
    "fsdp1-flat": (TD / "fsdp1" / "torch2.15" / "orig_adamw_ws3",
                   ["--param-layout", TD / "fsdp1" / "torch2.15" / "orig_adamw_ws3" / "layout.pt", "--world-size", "2",
                    "--layout", "fsdp1-flat"]),
}


# Every layout at N=2,3,7; DCP at every N.
@pytest.mark.parametrize("n,kind", [(n, kind) for n in (1, 2, 3, 4, 7) for kind in sorted(RESHARDS)
                                    if kind == "dcp" or n not in (1, 4)], ids=lambda v: str(v))
def test_reshard_parts_write_the_single_process_files(kind, n, tmp_path, ckptconv, run_ckptconv):
    src, extra = RESHARDS[kind]
    r = run_ckptconv("reshard", src, "-o", tmp_path / "solo", *extra)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "many"
    results = _workers(ckptconv, src, extra, out, n, command="reshard")
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert _finalizers(results) == 1, [r.stderr for r in results]
    _same_directories(tmp_path / "solo", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many", "solo"]  # parts folder gone
    if kind in ("dcp", "zero-to-dcp"):
        from torch.distributed.checkpoint import FileSystemReader
        a, b = FileSystemReader(str(tmp_path / "solo")).read_metadata(), FileSystemReader(str(out)).read_metadata()
        assert a.state_dict_metadata == b.state_dict_metadata and a.storage_data == b.storage_data


def test_a_missing_reshard_part_is_named_and_rerunning_it_completes_the_output(tmp_path, ckptconv, run_ckptconv):
    src, extra = RESHARDS["dcp"]
    assert run_ckptconv("reshard", src, "-o", tmp_path / "solo", *extra).returncode == 0
    out = tmp_path / "many"
    results = _workers(ckptconv, src, extra, out, 3, parts=[0, 2], command="reshard")
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    r = run_ckptconv("reshard", src, "-o", out, *extra, "--part", "finalize")
    assert r.returncode == 3 and "parts 1/3 have no receipt" in r.stderr, r.stderr
    assert not out.exists()
    r = run_ckptconv("reshard", src, "-o", out, *extra, "--part", "1/3")
    assert r.returncode == 0 and "finalized 3 parts" in r.stderr, r.stderr
    _same_directories(tmp_path / "solo", out)


@pytest.mark.parametrize("command", ["consolidate", "reshard"])
def test_finalize_out_completes_what_a_dead_finalizer_left(command, tmp_path, ckptconv, run_ckptconv):
    """The worker elected to finalize died after the election (its token is
    there, nothing is published): the last worker says so, and `ckptconv
    finalize OUT`, run from elsewhere and without SRC, publishes the very
    bytes a single process writes."""
    work = tmp_path / "job"
    work.mkdir()
    if command == "consolidate":
        src, extra, single, out = SOURCES["dcp"][0], [], "single.pt", "out.pt"
    else:
        src, extra = RESHARDS["dcp"]
        single, out = "solo", "many"
    r = run_ckptconv(command, src, "-o", single, *extra, cwd=work)
    assert r.returncode == 0, r.stderr
    single = work / single
    # Relative paths, as a job script would give them.
    r = run_ckptconv(command, src, "-o", out, *extra, "--part", "0/2", cwd=work)
    assert r.returncode == 0, r.stderr
    (folder,) = work.glob(out + ".parts-*")
    (folder / "finalizing").touch()
    r = run_ckptconv(command, src, "-o", out, *extra, "--part", "1/2", cwd=work)
    assert r.returncode == 0 and "another worker is finalizing" in r.stderr and "ckptconv finalize" in r.stderr
    assert not (work / out).exists()
    r = run_ckptconv("finalize", Path("job") / out, cwd=tmp_path)
    assert r.returncode == 0 and "finalized 2 parts" in r.stderr, r.stderr
    if command == "consolidate":
        assert _sha(work / out) == _sha(single)
    else:
        _same_directories(single, work / out)
    assert not folder.exists()


def test_finalize_without_parts_says_what_to_do(tmp_path, run_ckptconv):
    r = run_ckptconv("finalize", tmp_path / "nothing.pt")
    assert r.returncode == 3 and "no parts to finalize" in r.stderr and "--part I/N" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun", "slurm"])
def test_launchers_run_reshard_parts(launcher, tmp_path, ckptconv, run_ckptconv):
    src, extra = RESHARDS["dcp"]
    assert run_ckptconv("reshard", src, "-o", tmp_path / "solo", *extra).returncode == 0
    out = tmp_path / "many"
    command = [str(ckptconv), "reshard", str(src), "-o", str(out), *extra, "--part", "auto"]
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "OMPI_", "PMI_")) and k not in ("RANK", "WORLD_SIZE")}
    if launcher == "torchrun":
        torchrun = Path(sys.executable).parent / "torchrun"
        assert torchrun.exists(), f"no torchrun beside {sys.executable} (torch installs it)"
        r = subprocess.run([str(torchrun), "--nproc-per-node", "3", "--no-python", *command],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "torchrun (RANK/WORLD_SIZE)" in r.stderr, r.stderr
    elif launcher == "mpirun":
        mpirun = shutil.which("mpirun")
        assert mpirun, "no mpirun (scripts/setup installs openmpi-bin)"
        r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", *command],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "Open MPI" in r.stdout + r.stderr, r.stdout + r.stderr
    else:
        procs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                                  env=dict(clean, SLURM_PROCID=str(i), SLURM_NTASKS="2")) for i in range(2)]
        errs = [p.communicate(timeout=120)[1] for p in procs]
        assert all(p.returncode == 0 for p in procs) and all("Slurm" in e for e in errs), errs
    _same_directories(tmp_path / "solo", out)


def test_a_worker_killed_mid_write_is_named_and_its_rerun_repairs_the_bytes(tmp_path, ckptconv, run_ckptconv):
    """What SIGKILL leaves, made deterministic: part 1's bytes half written
    (garbage in its ranges) and no receipt. Finalize names part 1; rerunning
    it alone rewrites its ranges and the output is the single process's."""
    src, extra = SOURCES["dcp"]
    want = _single(ckptconv, src, extra, tmp_path / "single.pt")
    out = tmp_path / "k.pt"
    assert run_ckptconv("consolidate", src, "-o", out, "--part", "1/3").returncode == 0
    (folder,) = tmp_path.glob("k.pt.parts-*")
    assert json.loads((folder / "part-1-of-3.json").read_text())["pieces"]
    (folder / "part-1-of-3.json").unlink()
    # Scribble over what part 1 wrote (alone so far, its bytes are the non-zero ones).
    data = (folder / "data-0").read_bytes()
    (folder / "data-0").write_bytes(bytes(0xA5 if b else 0 for b in data))
    results = _workers(ckptconv, src, extra, out, 3, parts=[0, 2])
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    r = run_ckptconv("consolidate", src, "-o", out, "--part", "finalize")
    assert r.returncode == 3 and "parts 1/3 have no receipt" in r.stderr, r.stderr
    assert not out.exists()
    r = run_ckptconv("consolidate", src, "-o", out, "--part", "1/3")
    assert r.returncode == 0 and "finalized 3 parts" in r.stderr, r.stderr
    assert _sha(out) == want


def _corpus():
    manifest = json.loads((TD / "manifest.json").read_text())
    paths = [f["path"] for f in manifest["fixtures"]]
    paths += sorted(str(p.relative_to(TD)) for p in (TD / "zero").iterdir() if p.is_dir())
    return paths


@pytest.mark.parametrize("n", [2, 7])
@pytest.mark.parametrize("fixture", _corpus())
def test_parts_over_the_corpus(fixture, n, tmp_path, ckptconv):
    """Every fixture the corpus generator wrote with real torch (and every
    DeepSpeed case): N workers write the single process's .pt."""
    src = TD / fixture
    # veRL's flat-parameter optimizer is refused by design; its model files are read.
    extra = ["--only", "model"] if fixture == "fsdp_dt/verl_flat_ws2" else []
    single = subprocess.run([str(ckptconv), "-q", "consolidate", str(src), "-o", str(tmp_path / "single.pt"), *extra],
                            capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr
    results = _workers(ckptconv, src, extra, tmp_path / "parts.pt", n)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert _sha(tmp_path / "parts.pt") == _sha(tmp_path / "single.pt")
