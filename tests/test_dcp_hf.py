"""torch's DCP Hugging Face layout (#32): per-rank safetensors files written by
real torch's HuggingFaceStorageWriter from an FSDP2 job (testdata/dcp_hf,
tools/make_dcp_hf_checkpoints.py): save_distributed=True at world size 3, and
with enable_consolidation=True at world size 2 (torch's own consolidation
beside sharded/). What ckptconv reads is compared with what torch's
HuggingFaceStorageReader + dcp.load builds from the same files, and with the
job's full state dict, bit for bit; broken pieces are refused naming the file
and tensor."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

DCP_HF = Path(__file__).resolve().parent.parent / "testdata" / "dcp_hf"
WS3 = DCP_HF / "fsdp2_ws3"
WS2 = DCP_HF / "fsdp2_ws2_consolidated"


def _torch_reads(path: Path, like: dict) -> dict:
    """The state dict torch's own reader builds from `path` (no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    state = {k: torch.empty_like(v) for k, v in like.items()}
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(path)), no_dist=True)
    return state


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("src, ref", [(WS3, "fsdp2_ws3"), (WS2 / "sharded", "fsdp2_ws2_consolidated"),
                                      (WS2, "fsdp2_ws2_consolidated")])
def test_consolidates_to_what_torch_reads(src, ref, tmp_path, run_ckptconv):
    want = torch.load(DCP_HF / f"{ref}.ref.pt", weights_only=True)
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)
    assert _equal(got, want)
    assert _equal(got, _torch_reads(src, want))
    report = json.loads(run_ckptconv("validate", src, "--json").stdout)
    assert report["status"] == "valid", report["problems"]
    if src != WS2:  # the per-rank files; WS2 itself is torch's consolidation, a Hugging Face folder
        assert report["format"] == "dcp-hf" and report["world_size"] == int(ref.split("_ws")[1][0])


def test_the_layout_and_its_consolidation_diff_equal(run_ckptconv):
    r = run_ckptconv("diff", WS2 / "sharded", WS2)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("equal"), r.stdout
    text = run_ckptconv("inspect", WS3).stdout
    assert text.startswith(f"{WS3}: dcp-hf, 7 tensors") and "world_size: 3" in text, text
    assert "emb.weight" in text and "rows r0[0:4] r1[4:8] r2[8:10]" in text


def test_reshards_to_dcp_that_torch_loads(tmp_path, run_ckptconv):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp_path / "ws2"
    r = run_ckptconv("reshard", WS3, "-o", out, "--world-size", "2", "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    assert (out / ".metadata").is_file()
    dcp_to_torch_save(out, tmp_path / "back.pt")
    assert _equal(torch.load(tmp_path / "back.pt", weights_only=True),
                  torch.load(DCP_HF / "fsdp2_ws3.ref.pt", weights_only=True))


def _rewrite_metadata(path: Path, change) -> None:
    """Rewrites a safetensors file's __metadata__ (the data bytes unchanged)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    change(header["__metadata__"])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "ws3"
    shutil.copytree(WS3, d)
    return d


def test_a_missing_rank_file_leaves_gaps_that_are_refused(tmp_path, run_ckptconv):
    d = _copy(tmp_path)
    (d / "shard-00002-model-00001-of-00001.safetensors").unlink()
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")
    assert r.returncode == 3 and "has chunks covering 1 of its 2 elements (a gap)" in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()
    r = run_ckptconv("validate", d)
    assert r.returncode == 1, r.stdout


@pytest.mark.parametrize("change, says", [
    (lambda m: m.pop("DCP_SHARDING_INFO"), "no DCP_SHARDING_INFO in its __metadata__"),
    (lambda m: m.update(DCP_SHARDING_INFO=json.dumps({**json.loads(m["DCP_SHARDING_INFO"]),
                                                       "fc1.weight": {"saved_offsets": [0]}})),
     "tensor 'fc1.weight' has no saved_offsets of rank 2"),
])
def test_broken_sharding_info_is_refused_naming_file_and_tensor(change, says, tmp_path, run_ckptconv):
    d = _copy(tmp_path)
    victim = d / "shard-00003-model-00001-of-00001.safetensors"
    _rewrite_metadata(victim, change)
    before = victim.read_bytes()
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert says in r.stderr and victim.name in r.stderr, r.stderr
    report = json.loads(run_ckptconv("validate", d, "--json").stdout)
    assert report["exit_code"] == 1 and any(says in p["message"] for p in report["problems"]), report
    assert victim.read_bytes() == before and not (tmp_path / "o.pt").exists()


def test_overlapping_pieces_are_refused(tmp_path, run_ckptconv):
    d = _copy(tmp_path)
    def overlap(m):  # rank 1's fc2.weight rows said to start where rank 0's do
        info = json.loads(m["DCP_SHARDING_INFO"])
        info["fc2.weight"]["saved_offsets"] = [0, 0]
        m["DCP_SHARDING_INFO"] = json.dumps(info)
    _rewrite_metadata(d / "shard-00002-model-00001-of-00001.safetensors", overlap)
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")
    assert r.returncode == 3 and "fc2.weight" in r.stderr, r.stderr
    assert run_ckptconv("validate", d).returncode == 1


# --- writing the layout: reshard --layout hf ------------------------------

def _header(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n])


def _pieces(folder: Path) -> dict:
    """{file: {"meta": parsed __metadata__, tensor: (dtype, shape, data bytes)}} of every .safetensors."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        raw = f.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        meta = header.pop("__metadata__")
        meta["DCP_SHARDING_INFO"] = json.loads(meta["DCP_SHARDING_INFO"])
        entry = {"meta": meta}
        for name, h in header.items():
            b, e = h["data_offsets"]
            entry[name] = (h["dtype"], h["shape"], raw[8 + n + b:8 + n + e])
        out[f.name] = entry
    return out


@pytest.mark.parametrize("src, ref, n", [(WS3, "fsdp2_ws3", 2), (WS3, "fsdp2_ws3", 1), (WS2, "fsdp2_ws2_consolidated", 5)])
def test_reshards_to_the_hf_layout_that_torch_reads_and_consolidates(src, ref, n, tmp_path, run_ckptconv):
    from safetensors.torch import load_file
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files
    want = torch.load(DCP_HF / f"{ref}.ref.pt", weights_only=True)
    out = tmp_path / "hf"
    r = run_ckptconv("reshard", src, "-o", out, "--world-size", n, "--layout", "hf")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"shard-{i + 1:05d}-model-00001-of-00001.safetensors" for i in range(n)]
    for name in names:  # FSDP2's dim-0 boxes: rank r holds rows [r*c, (r+1)*c) of each tensor
        meta = _header(out / name)["__metadata__"]
        assert meta["DCP_VERSION"] == "1.0" and meta["format"] == "pt"
        rank = int(name[6:11]) - 1
        for fqn, info in json.loads(meta["DCP_SHARDING_INFO"]).items():
            rows = -(-want[fqn].shape[0] // n)
            assert info["saved_offsets"][0] == min(rank * rows, want[fqn].shape[0]), (name, fqn)
    assert _equal(_torch_reads(out, want), want)
    cons = tmp_path / "consolidated"
    cons.mkdir()
    consolidate_safetensors_files(input_dir=str(out), output_dir=str(cons), fqn_to_index_mapping=dict.fromkeys(want, 1))
    assert _equal(load_file(cons / "model-00001-of-00001.safetensors"), want)
    assert run_ckptconv("diff", out, src).returncode == 0


@pytest.mark.parametrize("src, n", [(WS3, 2), (WS2, 4)])
def test_fsdp2_resumes_from_the_hf_layout_and_torch_writes_the_same_files(src, n, tmp_path, run_ckptconv):
    import subprocess
    import sys
    out = tmp_path / "hf"
    assert run_ckptconv("reshard", src, "-o", out, "--world-size", n, "--layout", "hf").returncode == 0
    result_dir = tmp_path / "result"
    result_dir.mkdir()
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "hf_resume.py"), str(out), str(src), str(n),
                        str(result_dir)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    result = torch.load(result_dir / "result.pt", weights_only=True)
    ref = "fsdp2_ws3" if src == WS3 else "fsdp2_ws2_consolidated"
    assert _equal(result["loaded"], torch.load(DCP_HF / f"{ref}.ref.pt", weights_only=True))
    assert torch.isfinite(result["losses"]).all() and torch.equal(result["losses"], result["ref_losses"])
    assert _equal(result["after"], result["ref_after"])
    # torch's own writer, given the same values at the same world size, writes
    # the same files: names, tensors, bytes and sharding info.
    assert _pieces(out) == _pieces(result_dir / "torch_written")


def test_the_hf_layout_refuses_what_it_cannot_hold(tmp_path, run_ckptconv):
    """Optimizer state and other values have no place in it: a usage error naming the key."""
    full = tmp_path / "full.pt"
    torch.save({"model": {"w": torch.ones(4, 2)}, "step": 3}, full)
    out = tmp_path / "hf"
    r = run_ckptconv("reshard", full, "-o", out, "--world-size", 2, "--layout", "hf")
    assert r.returncode == 2 and "'step' is not a tensor" in r.stderr, r.stderr
    assert "holds more than a model: add --only model" in r.stderr, r.stderr
    assert not out.exists() and not list(tmp_path.glob("hf.tmp-*"))
    r = run_ckptconv("reshard", full, "-o", out, "--world-size", 2, "--layout", "hf", "--only", "model")
    assert r.returncode == 0, r.stderr
    assert _equal(_torch_reads(out, {"w": torch.ones(4, 2)}), {"w": torch.ones(4, 2)})
    r = run_ckptconv("reshard", WS3, "-o", out, "--world-size", 2, "--layout", "hf")
    assert r.returncode == 2 and "exists" in r.stderr  # never half-overwritten: --force replaces it whole
    r = run_ckptconv("reshard", WS3, "-o", out, "--world-size", 2, "--layout", "hf", "--force")
    assert r.returncode == 0 and sorted(p.name for p in out.iterdir())[0].startswith("shard-00001"), r.stderr
