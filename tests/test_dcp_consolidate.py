"""consolidate of DCP directories against torch's own dcp_to_torch_save."""
import re
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from state_compare import assert_same, cast_floats, select

REPO = Path(__file__).resolve().parent.parent
# Directories with a global .metadata, and one saved with per-rank __<rank>.metadata only.
DCP_DIRS = sorted({p.parent for p in (REPO / "testdata" / "dcp").glob("*/.metadata")} |
                  {p.parent for p in (REPO / "testdata" / "dcp").glob("*/__0.metadata")})
# AdamW at a world size that does not divide the rows: the richest sample.
RICH = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws3"


def reference(d):
    return torch.load(d.parent / (d.name + ".ref.pt"), weights_only=True)


def key_order_known(d):
    """torch's reference fixes the key order of a directory with a global
    .metadata. Per-rank metadata cannot be read by torch at all; its reference
    is the same state saved with a global .metadata, where torch's planner
    moved the replicated `step` after exp_avg/exp_avg_sq, while the saved
    state dict (and so ckptconv, following planner_data) has it first."""
    return (d / ".metadata").exists()


def consolidate(run_ckptconv, src, out, *args):
    r = run_ckptconv("consolidate", str(src), "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return torch.load(out, weights_only=True)


def test_corpus_has_dcp_fixtures():
    assert len(DCP_DIRS) >= 6
    assert any(not (d / ".metadata").exists() for d in DCP_DIRS)


@pytest.mark.parametrize("d", DCP_DIRS, ids=lambda p: p.name)
def test_consolidate_equals_dcp_to_torch_save(d, tmp_path, run_ckptconv):
    assert_same(consolidate(run_ckptconv, d, tmp_path / "out.pt"), reference(d), key_order=key_order_known(d))


@pytest.mark.parametrize("d", DCP_DIRS, ids=lambda p: p.name)
@pytest.mark.parametrize("only", ["model", "optim"])
def test_only(d, only, tmp_path, run_ckptconv):
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt", "--only", only)
    assert_same(got, select(reference(d), only=only), key_order=key_order_known(d))


@pytest.mark.parametrize("keys", [r"exp_avg$", r"^model\.", r"param_groups"])
def test_keys(keys, tmp_path, run_ckptconv):
    d = RICH
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt", "--keys", keys)
    assert_same(got, select(reference(d), keys=keys))


@pytest.mark.parametrize("name,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)])
def test_dtype(name, dtype, tmp_path, run_ckptconv):
    d = RICH
    ref = reference(d)
    assert set(ref) == {"model", "optim"}
    # --dtype casts the model; the optimizer's state keeps its dtypes unless --optim-dtype
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt", "--dtype", name, "--memory-limit", "64")
    assert_same(got, {"model": cast_floats(ref["model"], dtype), "optim": ref["optim"]})
    got = consolidate(run_ckptconv, d, tmp_path / "both.pt", "--dtype", name, "--optim-dtype", name,
                      "--memory-limit", "64")
    assert_same(got, cast_floats(ref, dtype))


def test_small_memory_limit_gives_same_bytes(tmp_path, run_ckptconv):
    d = RICH
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt", "--memory-limit", "1")
    assert_same(got, reference(d))


def test_no_fsync_gives_the_same_file(tmp_path, run_ckptconv):
    d = RICH
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    assert run_ckptconv("consolidate", str(d), "-o", str(a)).returncode == 0
    assert run_ckptconv("consolidate", str(d), "-o", str(b), "--no-fsync").returncode == 0
    assert a.read_bytes() == b.read_bytes()  # deterministic output, durability aside


def test_dry_run_writes_nothing_and_lists_chunks(tmp_path, run_ckptconv):
    d = RICH
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", str(d), "-o", str(out), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert not out.exists()
    # a summary by default: counts, the largest tensors, the totals
    assert "tensors from" in r.stdout and "largest:" in r.stdout and "total:" in r.stdout
    assert "rank 1" not in r.stdout and "(-v lists every tensor" in r.stdout
    # every chunk with -v, in the slice notation reshard's plan uses
    r = run_ckptconv("-v", "consolidate", str(d), "-o", str(out), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "model." in r.stdout and "<- rank 1 " in r.stdout and "total:" in r.stdout
    assert re.search(r"^      \[\d+:\d+(, \d+:\d+)*\] <- rank \d ", r.stdout, re.M), r.stdout
    assert not out.exists()


def test_existing_output_is_kept_without_force(tmp_path, run_ckptconv):
    d = RICH
    out = tmp_path / "out.pt"
    out.write_bytes(b"precious")
    r = run_ckptconv("consolidate", str(d), "-o", str(out))
    assert r.returncode == 2
    assert out.read_bytes() == b"precious"
    assert "--force" in r.stderr
    assert run_ckptconv("consolidate", str(d), "-o", str(out), "--force").returncode == 0
    assert_same(torch.load(out, weights_only=True), reference(d))


def test_inspect_lists_global_shapes(run_ckptconv):
    import json

    d = RICH
    r = run_ckptconv("inspect", str(d), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    ref = reference(d)
    shapes = {t["path"]: t["shape"] for t in info["tensors"]}
    for k, v in ref["model"].items():
        assert shapes[f"model.{k}"] == list(v.shape)
    assert info["totals"]["tensors"] == len(info["tensors"])


# ---- corrupt directories: a clear error, exit code 3, no output -------------

def broken_copy(tmp_path):
    src = RICH
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def load_metadata(d):
    with open(d / ".metadata", "rb") as f:
        return pickle.load(f)


def save_metadata(d, md):
    with open(d / ".metadata", "wb") as f:
        pickle.dump(md, f)


def first_tensor_key(md):
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return next(k for k, v in md.state_dict_metadata.items()
                if isinstance(v, TensorStorageMetadata) and len(v.chunks) > 1 and len(v.size) == 2)


def break_missing_file(d):
    next(d.glob("__1_*.distcp")).unlink()
    return "__1_0.distcp"


def break_truncated_file(d):
    f = next(d.glob("__1_*.distcp"))
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "__1_0.distcp"


def break_metadata_past_end(d):
    md = load_metadata(d)
    idx, info = next(iter(md.storage_data.items()))
    info.length = info.length + 10_000_000
    save_metadata(d, md)
    return info.relative_path


def break_overlap(d):
    md = load_metadata(d)
    key = first_tensor_key(md)
    chunks = md.state_dict_metadata[key].chunks
    second = chunks[1]
    old_offsets = second.offsets
    new_offsets = torch.Size([old_offsets[0] - 1] + list(old_offsets[1:]))
    second.offsets = new_offsets
    import dataclasses

    for idx in list(md.storage_data):
        if idx.fqn == key and idx.offset == old_offsets:
            info = md.storage_data.pop(idx)
            md.storage_data[dataclasses.replace(idx, offset=new_offsets)] = info
    save_metadata(d, md)
    return "overlaps"


def break_gap(d):
    md = load_metadata(d)
    key = first_tensor_key(md)
    md.state_dict_metadata[key].chunks.pop(0)
    save_metadata(d, md)
    return "gap"


def break_relative_path(d):
    md = load_metadata(d)
    info = next(iter(md.storage_data.values()))
    info.relative_path = "../" + info.relative_path
    save_metadata(d, md)
    return "escapes"


def break_unsafe_global(d):
    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("echo pwned",))

    with open(d / ".metadata", "wb") as f:
        pickle.dump({"state_dict_metadata": Evil()}, f)
    return "system"


CORRUPTIONS = [break_missing_file, break_truncated_file, break_metadata_past_end, break_overlap, break_gap,
               break_relative_path, break_unsafe_global]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_corrupt_directory_is_refused(corrupt, tmp_path, run_ckptconv):
    d = broken_copy(tmp_path)
    expected_words = corrupt(d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", str(d), "-o", str(out))
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert expected_words in r.stderr, r.stderr
    assert not out.exists()
    assert list(tmp_path.glob("out.pt*")) == [], "a temporary file was left behind"
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before, "input was modified"


def test_an_empty_key_reads_as_torch_joins_it(tmp_path, run_ckptconv):
    """dcp.save names {"model": {"": t}} 'model.' (".".join of its path, the
    empty component included) and dcp_to_torch_save reads it back; ckptconv
    joined the path skipping the empty component ('model') and refused
    torch's own checkpoint: "the planner_data path of 'model.' names 'model',
    another key"."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    d = tmp_path / "ck"
    sd = {"model": {"": torch.arange(2.0), "a": torch.arange(3.0), "0": {"": torch.ones(1)}}, "": 7}
    dcp.save(sd, checkpoint_id=str(d), no_dist=True)
    assert set(pickle.loads((d / ".metadata").read_bytes()).state_dict_metadata) >= {"model.", "model.0.", ""}
    dcp_to_torch_save(str(d), str(tmp_path / "torch.pt"))
    expected = torch.load(tmp_path / "torch.pt", weights_only=True)
    assert_same(consolidate(run_ckptconv, d, tmp_path / "ours.pt"), expected)
    r = run_ckptconv("validate", d)
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr


def test_an_empty_key_is_named_as_torch_names_it_in_outputs(tmp_path, run_ckptconv):
    """An output naming tensors by their dotted path (safetensors, a DCP
    written by reshard) called {"model": {"": t}} 'model', where dcp.save and
    torch's DCP-HF writer say 'model.' (".".join of the keys): a diff of a .pt
    against its own export said "differ"."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    sd = {"model": {"": torch.arange(2.0), "a": torch.arange(3.0), "0": {"": torch.ones(1)}}}
    dcp.save(sd, checkpoint_id=str(tmp_path / "torch_dcp"), no_dist=True)
    meta = pickle.loads((tmp_path / "torch_dcp" / ".metadata").read_bytes()).state_dict_metadata
    torch_names = {k for k, v in meta.items() if isinstance(v, TensorStorageMetadata)}
    assert torch_names == {"model.", "model.a", "model.0."}
    src = tmp_path / "sd.pt"
    torch.save(sd, src)
    r = run_ckptconv("convert", src, "-o", tmp_path / "o.safetensors")
    assert r.returncode == 0, r.stderr
    out = load_file(tmp_path / "o.safetensors")
    assert set(out) == torch_names and torch.equal(out["model."], torch.arange(2.0))
    r = run_ckptconv("reshard", src, "--layout", "dcp", "--world-size", "1", "-o", tmp_path / "ours_dcp")
    assert r.returncode == 0, r.stderr
    ours = pickle.loads((tmp_path / "ours_dcp" / ".metadata").read_bytes()).state_dict_metadata
    assert {k for k, v in ours.items() if isinstance(v, TensorStorageMetadata)} == torch_names
    r = run_ckptconv("diff", src, tmp_path / "o.safetensors")
    assert r.returncode == 0 and "equal" in r.stdout, r.stdout + r.stderr
