"""The real-checkpoint corpus (testdata/) is complete and loads with real torch.

Per-rank ShardedTensor/DTensor files need a live process group of the saving
world size to unpickle in Python, so they are checked as torch.save zips (and
their pickles by opcode), while the FULL_STATE_DICT references beside them
load with weights_only=True. DCP directories are read with torch's own
FileSystemReader, and torch's dcp_to_torch_save must reproduce the committed
reference bit for bit.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from pathlib import Path

import pytest
import torch

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

TRAINABLE = {"emb.weight", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "scale"}


def fixtures(family=None):
    import json
    m = json.loads((Path(__file__).resolve().parent.parent / "testdata" / "manifest.json").read_text())
    return [pytest.param(f, id=f["path"]) for f in m["fixtures"] if family is None or f["family"] == family]


def assert_equal_tree(a, b, where="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            assert_equal_tree(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_tree(x, y, f"{where}.{i}")
    else:
        assert a == b, (where, a, b)


def pickle_globals(data: bytes) -> set[str]:
    """'module name' of every GLOBAL / STACK_GLOBAL in a pickle."""
    out, strings = set(), []
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        if op.name == "GLOBAL":
            out.add(arg)
        elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            out.add(f"{strings[-2]} {strings[-1]}")
    return out


def torch_zip(path: Path) -> tuple[str, zipfile.ZipFile]:
    z = zipfile.ZipFile(path)
    assert z.testzip() is None, path
    names = z.namelist()
    top = names[0].split("/")[0]
    assert all(n.startswith(top + "/") for n in names), path
    for rec in ("data.pkl", "byteorder", "version"):
        assert f"{top}/{rec}" in names, (path, rec)
    assert z.read(f"{top}/byteorder") == b"little"
    for info in z.infolist():
        assert info.compress_type == zipfile.ZIP_STORED
    return top, z


# ---------------------------------------------------------------- manifest


def test_manifest_header(manifest):
    assert manifest["torch_version"].startswith(torch.__version__.split("+")[0])
    families = {f["family"] for f in manifest["fixtures"]}
    assert families == {"dcp", "dcp_rank_metadata", "dcp_zstd", "fsdp_sharded_tensor", "fsdp_dtensor", "pt",
                        "torchtitan"}
    dcp_ws = sorted(f["world_size"] for f in manifest["fixtures"]
                    if f["family"] == "dcp" and f["optimizer"] == "adamw")
    assert dcp_ws == [1, 2, 3, 4]


@pytest.mark.parametrize("fx", fixtures())
def test_fixture_files_exist(fx, testdata):
    p = testdata / fx["path"]
    assert p.exists(), p
    assert fx["files"], fx["path"]
    for f in fx["files"]:
        assert (testdata / f).is_file(), f
    for ref in fx["reference"].values():
        assert (testdata / ref).is_file(), ref
    if p.is_dir():  # the file list is complete
        on_disk = {str(f.relative_to(testdata)) for f in p.rglob("*") if f.is_file()}
        assert on_disk == set(fx["files"])


def test_corpus_is_small(testdata):
    total = sum(f.stat().st_size for f in testdata.rglob("*") if f.is_file())
    # The ecosystem fixtures (titan/, frameworks/, legacy/) hold ~600 KB, the
    # DeepSpeed universal checkpoints (ucp/: 7 cases of ~27 files) ~620 KB, the FSDP1
    # flat-parameter jobs (fsdp1/: 14 cases, torch 2.15 and 2.4, 2-4 ranks, each with
    # its layout and FULL references; 4 of them the weight-decay param groups) ~1.2 MB,
    # the megatron-core jobs (megatron/: 7
    # cases, ~3.3 MB: every stacked layer of every parameter and optimizer state is
    # its own DCP item per TP rank, and .metadata repeats every rank's SavePlan);
    # each DCP item, universal-checkpoint file and rank file is a whole torch.save
    # zip (1.2-1.6 KB even for one float). 9.6 MB since the Megatron-LM legacy
    # jobs (megatron_legacy/: 6 cases, ~1.9 MB: each of 14 rank files ~80 KB,
    # its model, optimizer state, 655 args and RNG states one zip record per
    # tensor; the optimizer references ~60 KB each). 9.7 MB with them; 10.5 MB
    # with the architecture-map jobs (arch/: 7 cases, ~1.4 MB: megatron-core
    # dense and MoE (EP2) and torchtitan checkpoints, each with its
    # framework's logits and an HF config). 11.0 MB with the MoE cases; 12.4 MB
    # with a Megatron-LM job's torch_dist checkpoint (megatron/gpt_tp2pp2_mlm,
    # ~1 MB: TP2 x PP2 with the distributed optimizer, its references) and the
    # DeepSpeed runs without ZeRO (~160 KB); the bound leaves room for one
    # more parallel layout's small fixtures.
    assert total < 13_000_000, total


# ---------------------------------------------------------------- references


def check_model_ref(sd, fx):
    assert {k: list(v.shape) for k, v in sd.items()} == fx["tensors"]
    assert sd["fc2.weight"].shape == (7, 8)
    assert sd["emb.weight"].shape == (10, 4)
    assert all(v.dtype == torch.float32 for v in sd.values())


def check_optim_ref(osd, fx):
    assert list(osd) == ["state", "param_groups"]
    assert set(osd["state"]) == TRAINABLE  # frozen has no optimizer state
    want_keys = {"adamw": {"exp_avg", "exp_avg_sq", "step"}, "sgd": {"momentum_buffer"}}[fx["optimizer"]]
    for fqn, st in osd["state"].items():
        assert set(st) == want_keys, fqn
        if "step" in st:  # AdamW step: 0-dim float32 tensor
            assert st["step"].shape == () and st["step"].dtype == torch.float32
            assert st["step"].item() == fx["steps"]
        if "exp_avg_sq" in st:
            assert (st["exp_avg_sq"] >= 0).all()
            assert not torch.equal(st["exp_avg"], st["exp_avg_sq"])
    lrs = [g["lr"] for g in osd["param_groups"]]
    assert lrs == [g["lr"] for g in fx["param_groups"]]
    assert lrs == ([1e-2, 3e-3] if fx["optimizer"] == "adamw" else [0.1, 0.05])
    params = [g["params"] for g in osd["param_groups"]]
    assert params == [g["params"] for g in fx["param_groups"]]
    assert sorted(p for g in params for p in g) == sorted(TRAINABLE)


@pytest.mark.parametrize("fx", fixtures("dcp"))
def test_dcp_reference(fx, testdata):
    ref = torch.load(testdata / fx["reference"]["dcp_to_torch_save"], weights_only=True)
    assert list(ref) == ["model", "optim"]
    check_model_ref(ref["model"], fx)
    check_optim_ref(ref["optim"], fx)


@pytest.mark.parametrize("fx", fixtures("fsdp_sharded_tensor") + fixtures("fsdp_dtensor"))
def test_rank_family_reference(fx, testdata):
    check_model_ref(torch.load(testdata / fx["reference"]["model_full"], weights_only=True), fx)
    check_optim_ref(torch.load(testdata / fx["reference"]["optim_full"], weights_only=True), fx)


# ---------------------------------------------------------------- DCP


@pytest.mark.parametrize("fx", fixtures("dcp"))
def test_dcp_metadata(fx, testdata):
    d = testdata / fx["path"]
    ws = fx["world_size"]
    assert sorted(p.name for p in d.iterdir()) == [".metadata"] + [f"__{r}_0.distcp" for r in range(ws)]
    md = FileSystemReader(str(d)).read_metadata()
    assert md.version == "1.0.0"
    sdm = md.state_dict_metadata
    w = sdm["model.fc2.weight"]
    assert isinstance(w, TensorStorageMetadata)
    assert tuple(w.size) == (7, 8) and w.properties.dtype == torch.float32
    # FSDP2 chunks: torch.chunk on dim 0, every rank listed (possibly empty)
    rows = -(-7 // ws)
    assert [(tuple(c.offsets), tuple(c.sizes)) for c in w.chunks] == [
        ((min(r * rows, 7), 0), (max(0, min(rows, 7 - r * rows)), 8)) for r in range(ws)]
    for fqn, m in sdm.items():
        if isinstance(m, TensorStorageMetadata):
            covered = sum(torch.Size(c.sizes).numel() for c in m.chunks)
            assert covered == m.size.numel(), fqn
    assert isinstance(sdm["optim.param_groups.0.lr"], BytesStorageMetadata)
    assert isinstance(sdm["optim.param_groups.1.params"], BytesStorageMetadata)
    assert "optim.state.frozen.exp_avg" not in sdm and "model.frozen" in sdm
    if fx["optimizer"] == "adamw":
        step = sdm["optim.state.scale.step"]
        assert tuple(step.size) == () and step.properties.dtype == torch.float32
    assert md.planner_data["optim.param_groups.1.lr"] == ("optim", "param_groups", 1, "lr")
    # every storage item points into a .distcp file of this directory
    for idx, info in md.storage_data.items():
        assert (d / info.relative_path).is_file()
        assert info.offset + info.length <= (d / info.relative_path).stat().st_size


@pytest.mark.parametrize("fx", fixtures("dcp_zstd"))
def test_dcp_zstd_items_are_compressed_and_torch_reads_them(fx, testdata, tmp_path):
    d = testdata / fx["path"]
    md = FileSystemReader(str(d)).read_metadata()
    assert all(info.transform_descriptors == ["stream.zstd/1"] for info in md.storage_data.values())
    out = tmp_path / "out.pt"
    dcp_to_torch_save(d, out)
    assert_equal_tree(torch.load(out, weights_only=True),
                      torch.load(testdata / fx["reference"]["dcp_to_torch_save"], weights_only=True))


@pytest.mark.parametrize("fx", fixtures("dcp_rank_metadata"))
def test_dcp_rank_metadata_layout(fx, testdata):
    d = testdata / fx["path"]
    ws = fx["world_size"]
    names = sorted(p.name for p in d.iterdir())
    assert names == sorted([f"__{r}.metadata" for r in range(ws)] + [f"__{r}_0.distcp" for r in range(ws)])
    chunks = []
    for r in range(ws):
        md = FileSystemReader(str(d)).read_metadata(rank=r)
        chunks += [tuple(c.offsets) for c in md.state_dict_metadata["model.fc2.weight"].chunks]
    # each rank describes its own chunk only; together they cover the rows
    assert sorted(set(chunks)) == sorted({(min(r * -(-7 // ws), 7), 0) for r in range(ws)})
    check_model_ref(torch.load(testdata / fx["reference"]["dcp_to_torch_save"], weights_only=True)["model"], fx)


@pytest.mark.parametrize("fx", fixtures("dcp"))
def test_dcp_to_torch_save_matches_reference(fx, testdata, tmp_path):
    out = tmp_path / "out.pt"
    dcp_to_torch_save(testdata / fx["path"], out)
    got = torch.load(out, weights_only=True)
    want = torch.load(testdata / fx["reference"]["dcp_to_torch_save"], weights_only=True)
    assert_equal_tree(got, want)


@pytest.mark.parametrize("fx", fixtures("dcp"))
def test_dcp_items_are_torch_zips(fx, testdata):
    d = testdata / fx["path"]
    md = FileSystemReader(str(d)).read_metadata()
    for idx, info in list(md.storage_data.items())[:8]:
        blob = (d / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
        z = zipfile.ZipFile(io.BytesIO(blob))
        assert z.testzip() is None
        assert any(n.endswith("/data.pkl") for n in z.namelist())


# ---------------------------------------------------------------- per-rank files


@pytest.mark.parametrize("fx", fixtures("fsdp_sharded_tensor") + fixtures("fsdp_dtensor"))
def test_rank_files_are_torch_saves(fx, testdata):
    ws = fx["world_size"]
    assert len(fx["model_files"]) == ws and len(fx["optim_files"]) == ws
    sharded = {"fsdp_sharded_tensor": "torch.distributed._shard.sharded_tensor.api ShardedTensor",
               "fsdp_dtensor": "torch.distributed.tensor DTensor"}[fx["family"]]
    for f in fx["model_files"] + fx["optim_files"]:
        top, z = torch_zip(testdata / f)
        assert top == Path(f).stem
        g = pickle_globals(z.read(f"{top}/data.pkl"))
        assert "torch._utils _rebuild_tensor_v2" in g
        if f in fx["model_files"] or fx["optim_keys"] == "fqn":
            assert sharded in g and "torch._tensor _rebuild_from_type_v2" in g, f
        else:  # raw optimizer.state_dict() of flat params: plain tensors
            assert sharded not in g, f


@pytest.mark.parametrize("fx", [p for p in fixtures("fsdp_dtensor") if p.values[0]["optim_keys"] == "int"])
def test_raw_flat_optim_has_integer_ids(fx, testdata):
    for f in fx["optim_files"]:
        osd = torch.load(testdata / f, weights_only=True)
        assert sorted(osd["state"]) == list(range(len(osd["state"])))
        assert [g["params"] for g in osd["param_groups"]] == [[0, 1], [2, 3]]
        for st in osd["state"].values():
            assert st["exp_avg"].dim() == 1 and st["step"].shape == ()


# ---------------------------------------------------------------- pt


def test_dtypes_pt(testdata):
    obj = torch.load(testdata / "pt" / "dtypes.pt", weights_only=True)
    t = obj["tensors"]
    for name in ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                 "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "bool", "complex64", "complex128"):
        assert t[name].dtype == getattr(torch, name), name
    assert t["uint64"][2].item() == 2**63 - 1
    assert t["uint32"][2].item() == 4294967295
    assert torch.equal(t["float32"], t["float64"].float())
    tr = obj["transposed"]
    assert tr.shape == (4, 3) and tr.stride() == (1, 4) and torch.equal(tr, t["float32"].t())
    a, b = obj["shared_a"], obj["shared_b"]
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert b.storage_offset() == 5 and a.untyped_storage().nbytes() == 20 * 4
    assert torch.equal(b.flatten(), torch.arange(5, 17, dtype=torch.float32))
    assert obj["scalar0d"].shape == () and obj["scalar0d"].item() == 3.5
    assert obj["empty"].shape == (0, 3)
    n = obj["nested"]
    assert n["list"] == [1, 2.5, "three", None, True, False]
    assert n["tuple"][:2] == (1, ("a", "b")) and n["tuple"][2][0].dtype == torch.int32
    assert n["int"] == -(2**40) and n["none"] is None and n["int_keys"] == {0: "zero", 1: "one"}
