"""Checkpoints written by OLDER torch versions (testdata/legacy/, made by
tools/make_legacy_checkpoints.py in side environments: torch 2.0.0, 2.4.1 and
1.13.1) consolidate equal to that torch's own reference, validate, and
reshard into a DCP directory that current torch reads back equal.

Per case, testdata/legacy/<case>/ holds ``ckpt/`` (the checkpoint as the old
torch wrote it), ``reference.pt`` and ``case.json``. The reference is the old
torch's ``dcp_to_torch_save`` output (2.4) or, where that version has none
(2.0, 1.13), the live FULL state dict saved beside the checkpoint; its key
order is then the generator's, so only there keys are compared unordered.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from state_compare import assert_same, select

REPO = Path(__file__).resolve().parent.parent
LEGACY = REPO / "testdata" / "legacy"
CASES = sorted(p.parent for p in LEGACY.glob("*/case.json"))
ids = lambda p: p.name  # noqa: E731


def info(case: Path) -> dict:
    return json.loads((case / "case.json").read_text())


def reference(case: Path):
    return torch.load(case / "reference.pt", weights_only=True)


def key_order(case: Path) -> bool:
    """torch's dcp_to_torch_save fixes the key order; a live reference does not."""
    return "dcp_to_torch_save" in info(case)["reference"].split(";")[0]


def consolidate(run_ckptconv, src, out, *args):
    r = run_ckptconv("consolidate", str(src), "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return torch.load(out, weights_only=True)


def test_corpus_has_the_legacy_cases():
    names = {c.name for c in CASES}
    assert {"torch20_dcp_fsdp1_ws2", "torch24_dcp_fsdp1_ws2", "torch113_fsdp1_st_ws2"} <= names
    versions = {info(c)["torch"].split("+")[0] for c in CASES}
    assert {"2.0.0", "2.4.1", "1.13.1"} <= versions


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_case_json_lists_exactly_the_files(case):
    want = info(case)["files"]
    have = {str(p.relative_to(case)) for p in case.rglob("*") if p.is_file() and p.name != "case.json"}
    assert have == set(want)
    for rel, meta in want.items():
        data = (case / rel).read_bytes()
        assert len(data) == meta["bytes"] and hashlib.sha256(data).hexdigest() == meta["sha256"], rel


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_legacy_metadata_has_the_old_field_set(case):
    """What makes these legacy: 2.0 .metadata has no storage_meta and no
    version, 2.4 has storage_meta but no version, 1.13 is per-rank files."""
    meta = case / "ckpt" / ".metadata"
    v = info(case)["torch"]
    if v.startswith("1.13"):
        assert not meta.exists()
        return
    raw = meta.read_bytes()
    assert b"version" not in raw
    assert (b"storage_meta" in raw) == v.startswith("2.4")
    # 2.0 keeps TensorProperties in the ShardedTensor module
    assert (b"torch.distributed._shard.sharded_tensor.metadata" in raw) == v.startswith("2.0")


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_consolidate_equals_reference(case, tmp_path, run_ckptconv):
    got = consolidate(run_ckptconv, case / "ckpt", tmp_path / "out.pt")
    assert_same(got, reference(case), key_order=key_order(case))


@pytest.mark.parametrize("case", CASES, ids=ids)
@pytest.mark.parametrize("only", ["model", "optim"])
def test_only(case, only, tmp_path, run_ckptconv):
    got = consolidate(run_ckptconv, case / "ckpt", tmp_path / "out.pt", "--only", only)
    assert_same(got, select(reference(case), only=only), key_order=key_order(case))


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_validate(case, run_ckptconv):
    r = run_ckptconv("validate", str(case / "ckpt"), "--expect-world-size", "2")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_reshard_to_ws3_is_read_by_current_torch(case, tmp_path, run_ckptconv):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dst = tmp_path / "ws3"
    r = run_ckptconv("reshard", str(case / "ckpt"), "-o", str(dst), "--world-size", "3", "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in dst.glob("*.distcp")) == [f"__{i}_0.distcp" for i in range(3)]
    dcp_to_torch_save(dst, tmp_path / "torch.pt")
    assert_same(torch.load(tmp_path / "torch.pt", weights_only=True), reference(case), key_order=key_order(case))
    assert_same(consolidate(run_ckptconv, dst, tmp_path / "back.pt"), reference(case), key_order=key_order(case))


@pytest.mark.parametrize("case", [c for c in CASES if info(c)["family"] == "dcp"], ids=ids)
def test_current_torch_reads_the_old_dcp_dir_too(case, tmp_path):
    """torch's own backward compatibility, as a cross-check of the reference."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(case / "ckpt", tmp_path / "torch.pt")
    assert_same(torch.load(tmp_path / "torch.pt", weights_only=True), reference(case), key_order=key_order(case))


def test_torch113_under_python311_pickles_enum_members_by_name_and_reads(tmp_path, run_ckptconv):
    """#30 row 1: Debian 12's python3-torch (1.13.1 on Python 3.11) pickles
    TensorProperties' memory format as getattr(MEM_FORMAT_ENCODING,
    'TORCH_CONTIGUOUS_FORMAT'), which the call-shape policy had refused (exit
    3). The fixture really holds that call, and it consolidates equal to the
    live full state dict torch 1.13 saved beside it."""
    import pickletools
    import zipfile
    case = LEGACY / "torch113_py311_fsdp1_st_ws2"
    with zipfile.ZipFile(case / "ckpt" / "model_rank0.pt") as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
    at = ops.index(("GLOBAL", "torch.distributed._shard.sharded_tensor.metadata MEM_FORMAT_ENCODING"))
    assert ("GLOBAL", "__builtin__ getattr") in ops[at - 3:at]
    assert ops[at + 2] == ("BINUNICODE", "TORCH_CONTIGUOUS_FORMAT") and ops[at + 4][0] == "TUPLE2"
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", case / "ckpt", "-o", out)
    assert r.returncode == 0, r.stderr
    assert_same(torch.load(out, weights_only=True), reference(case), key_order=False)
