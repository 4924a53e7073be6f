"""inspect and convert of torch.save files: our reader and writer against real torch."""
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from state_compare import assert_same

REPO = Path(__file__).resolve().parent.parent
# Megatron-LM's common.pt holds its args (an argparse.Namespace), which
# torch.load(weights_only=True) refuses, so it has no reference here:
# tests/test_framework_state.py compares it with megatron-core's reading.
PT_FILES = sorted(p for p in (REPO / "testdata").rglob("*") if p.suffix in (".pt", ".bin") and p.is_file()
                  and not (p.name == "common.pt" and p.parent.parent.name.endswith("_mlm")))


def loads_weights_only(p):
    """The state dict, or None for per-rank sharded files: ShardedTensor ones
    need a process group to load in Python, and a DTensor one holds only its
    rank's piece (they are consolidated as a family, not converted alone)."""
    try:
        sd = torch.load(p, weights_only=True)
    except Exception:
        return None
    from torch.distributed.tensor import DTensor

    def has_dtensor(v):
        if isinstance(v, DTensor):
            return True
        if isinstance(v, dict):
            return any(has_dtensor(c) for c in v.values())
        if isinstance(v, (list, tuple)):
            return any(has_dtensor(c) for c in v)
        return False

    return None if has_dtensor(sd) else sd


def one_rank_of_a_family(p: Path) -> bool:
    """A DeepSpeed tag's files, or one of several per-rank files: convert and
    consolidate refuse them alone (exit 2, tests/test_edges.py); they are
    read through their directories."""
    if p.parent.name.startswith("global_step"):
        return True
    import re
    m = re.match(r"(.*?)(\d+)(\.pt|\.bin)$", p.name)
    return bool(m and "rank" in p.name and len(list(p.parent.glob(m[1] + "*" + m[3]))) > 1)


PLAIN_PT = [p for p in PT_FILES if not one_rank_of_a_family(p) and loads_weights_only(p) is not None]


def test_corpus_has_plain_pt_files():
    assert len(PLAIN_PT) >= 5
    assert any(p.name == "dtypes.pt" for p in PLAIN_PT)


@pytest.mark.parametrize("p", PT_FILES, ids=lambda p: str(p.relative_to(REPO / "testdata")))
def test_every_pt_fixture_inspects(p, run_ckptconv):
    r = run_ckptconv("inspect", str(p), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["schema_version"] == info["schema"] == 1 and info["format"] == "pt"
    # a tensor referenced from two places is listed twice but counted once
    assert info["totals"]["tensors"] <= len(info["tensors"])
    # A universal checkpoint's zero/optimizer_state.pt is DeepSpeed's global
    # optimizer state (at ZeRO-1/2 plain values only), a Megatron-core
    # checkpoint's common.pt (beside its metadata.json, wherever the fixture
    # lives: megatron/, arch/) its unsharded state (iteration, param_groups). Every other
    # file holds tensors.
    # A DeepSpeed pipeline stage's mp_rank_NN_model_states.pt stores
    # module=None: its layer_LL-model_states.pt files hold the weights.
    pipeline_stage = p.name.startswith("mp_rank_") and p.name.endswith("_model_states.pt") and \
        any(p.parent.glob("layer_*-model_states.pt"))
    no_tensors = (p.name == "optimizer_state.pt" and p.parent.parent.name.endswith("_universal")) or \
        (p.name == "common.pt" and (p.parent / "metadata.json").is_file()) or pipeline_stage
    if not no_tensors:
        assert info["totals"]["tensors"] > 0


@pytest.mark.parametrize("p", PLAIN_PT, ids=lambda p: str(p.relative_to(REPO / "testdata")))
def test_convert_round_trips_through_torch_load(p, tmp_path, run_ckptconv):
    out = tmp_path / "out.pt"
    r = run_ckptconv("convert", str(p), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert_same(torch.load(out, weights_only=True), torch.load(p, weights_only=True))


def test_convert_keeps_shared_storage_and_drops_unused_bytes(tmp_path, run_ckptconv):
    base = torch.arange(1000, dtype=torch.float32)
    sd = {"view": base[10:20], "t": torch.arange(6.0).reshape(2, 3).t(), "same": base[10:20]}
    src = tmp_path / "views.pt"
    torch.save(sd, src)
    out = tmp_path / "out.pt"
    assert run_ckptconv("convert", str(src), "-o", str(out)).returncode == 0
    got = torch.load(out, weights_only=True)
    assert_same(got, {k: v.contiguous() for k, v in sd.items()})
    assert got["t"].is_contiguous()
    assert out.stat().st_size < src.stat().st_size  # the 990 unused floats are gone


def test_inspect_json_schema(tmp_path, run_ckptconv):
    src = tmp_path / "s.pt"
    torch.save({"w": torch.zeros(3, 4, dtype=torch.bfloat16), "lr": 0.5, "names": ["a", "b"]}, src)
    info = json.loads(run_ckptconv("inspect", str(src), "--json").stdout)
    assert info["tensors"] == [{"path": "w", "dtype": "bfloat16", "shape": [3, 4], "bytes": 24, "stored_as": "tensor",
                                "chunks": [{"offsets": [0, 0], "sizes": [3, 4], "file": str(src), "rank": -1}]}]
    assert info["values"] == [{"path": "lr", "value": 0.5}, {"path": "names", "value": ["a", "b"]}]
    assert info["totals"] == {"tensors": 1, "bytes": 24}


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/ckptconv-pwned",))


def test_pickle_naming_os_system_is_refused(tmp_path, run_ckptconv):
    src = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(2), "x": Evil()}, src)
    out = tmp_path / "out.pt"
    r = run_ckptconv("convert", str(src), "-o", str(out))
    assert r.returncode == 3
    assert "os.system" in r.stderr or "posix.system" in r.stderr
    assert str(src) in r.stderr
    assert not out.exists()


def test_legacy_format_is_refused_clearly(tmp_path, run_ckptconv):
    src = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(2)}, src, _use_new_zipfile_serialization=False)
    r = run_ckptconv("inspect", str(src))
    assert r.returncode == 3
    assert "legacy torch.save format" in r.stderr


@pytest.mark.parametrize("cut", [0, 1, 30, 100, 500, -200, -22, -1])
def test_truncated_file_is_refused(cut, tmp_path, run_ckptconv):
    src = tmp_path / "full.pt"
    torch.save({"w": torch.arange(100.0)}, src)
    data = src.read_bytes()
    bad = tmp_path / "cut.pt"
    bad.write_bytes(data[:cut] if cut >= 0 else data[:len(data) + cut])
    out = tmp_path / "out.pt"
    r = run_ckptconv("convert", str(bad), "-o", str(out))
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "cut.pt" in r.stderr
    assert not out.exists()


def _pt_with_storage_numel(path, numel, stored_floats, offset=0, size=(2,), stride=(1,), names=("w",)):
    """A torch.save zip whose one FloatStorage says it holds `numel` floats
    while its record holds `stored_floats`: a tensor `w` (or one per name)
    viewing it (by default the first two)."""
    import collections
    import io
    import struct
    import zipfile

    class Storage:
        pass

    class Tensor:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, (Storage(), offset, size, stride, False, collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", numel) if isinstance(obj, Storage) else None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump({name: Tensor() for name in names})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", struct.pack(f"<{stored_floats}f", *range(stored_floats)))
        z.writestr("archive/version", "3\n")


@pytest.mark.parametrize("numel", [2, 8])
def test_a_storage_whose_record_is_not_its_size_is_refused(numel, tmp_path, run_ckptconv):
    """torch.load refuses a storage whose record holds other than the bytes
    its persistent id names ("record size (16 bytes) does not match expected
    size"); it had converted with exit 0 whenever the tensor fit the record."""
    src = tmp_path / "bad.pt"
    _pt_with_storage_numel(src, numel, 4)
    with pytest.raises(RuntimeError, match="record size"):
        torch.load(src, weights_only=True)
    for cmd in (["convert", src, "-o", tmp_path / "out.pt"], ["inspect", src]):
        r = run_ckptconv(*cmd)
        assert r.returncode == 3, (cmd, r.stderr)
        assert "bad.pt" in r.stderr and "'w'" in r.stderr and "16 bytes" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()
    r = run_ckptconv("validate", src)
    assert r.returncode == 1 and "INVALID" in r.stdout and "holds 16 bytes" in r.stdout, r.stdout + r.stderr
    good = tmp_path / "good.pt"
    _pt_with_storage_numel(good, 4, 4)  # the same file with the storage's true size reads as torch reads it
    assert torch.equal(torch.load(good, weights_only=True)["w"], torch.tensor([0.0, 1.0]))
    r = run_ckptconv("convert", good, "-o", tmp_path / "good_out.pt")
    assert r.returncode == 0, r.stderr
    assert torch.equal(torch.load(tmp_path / "good_out.pt", weights_only=True)["w"], torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("offset,stride", [(2**62, 1), (0, 2**62)])
def test_a_view_past_2_pow_64_bytes_names_its_file_and_tensor(offset, stride, tmp_path, run_ckptconv):
    """A storage offset or stride whose bytes overflow 64 bits (torch:
    "Storage size calculation overflowed") was a bare "size overflows 64
    bits", naming neither the file nor the tensor."""
    src = tmp_path / "ovf.pt"
    _pt_with_storage_numel(src, 4, 4, offset=offset, stride=(stride,))
    with pytest.raises(RuntimeError, match="overflow"):
        torch.load(src, weights_only=True)
    r = run_ckptconv("convert", src, "-o", tmp_path / "out.pt")
    assert r.returncode == 3 and "ovf.pt" in r.stderr and "'w'" in r.stderr and "2^64" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()
    r = run_ckptconv("validate", src)
    assert r.returncode == 1 and "'w'" in r.stdout and "2^64" in r.stdout, r.stdout + r.stderr


def _run_with_small_files(ckptconv, *args):
    """ckptconv under a 16 MiB file-size limit: a regression that starts
    writing an exabyte output is stopped (SIGXFSZ) instead of filling the disk."""
    import resource
    import subprocess

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))

    return subprocess.run([str(ckptconv), *map(str, args)], capture_output=True, text=True, preexec_fn=small_files,
                          timeout=120)


@pytest.mark.parametrize("size,says", [((2**62, 3), "more than 2^63 - 1 elements"),
                                       ((2**62, 4), "more than 2^63 - 1 elements"),
                                       ((2**61, 3), "whose bytes overflow 64 bits"),
                                       ((-1, 2), "a negative dimension")])
def test_a_shape_past_64_bits_names_its_file_and_tensor(size, says, tmp_path, ckptconv):
    """A stride-0 view whose shape holds more elements than torch's int64
    (torch: "numel: integer multiplication overflow") or whose bytes pass
    2^64: (2^62, 3) float32 has 3 * 2^64 bytes, which wrapped to 0, so
    validate said VALID and convert passed the free-space check and wrote
    until the disk was full; (2^62, 4) and a negative dimension were a bare
    "element count overflows 64 bits" naming neither file nor tensor."""
    src = tmp_path / "huge.pt"
    _pt_with_storage_numel(src, 4, 4, size=size, stride=(0, 1))
    if size[0] != 2**61:  # the one torch.load reads (as a view; its nbytes wraps too)
        with pytest.raises(RuntimeError):
            torch.load(src, weights_only=True)
    named = f"tensor 'w' of shape ({size[0]}, {size[1]}) has"
    for cmd in (["convert", src, "-o", tmp_path / "out.pt"], ["inspect", src], ["inspect", src, "--json"],
                ["diff", src, src]):
        r = _run_with_small_files(ckptconv, *cmd)
        assert r.returncode == 3, (cmd, r.stderr)
        assert "huge.pt" in r.stderr and named in r.stderr and says in r.stderr, (cmd, r.stderr)
    assert not (tmp_path / "out.pt").exists()
    r = _run_with_small_files(ckptconv, "validate", src)
    assert r.returncode == 1 and named in r.stdout and says in r.stdout and "huge.pt" in r.stdout, r.stdout + r.stderr


def test_tensors_whose_bytes_sum_past_2_pow_64_are_refused_before_writing(tmp_path, ckptconv):
    """Two stride-0 views of 2^63 bytes each: their sum wrapped to 0, so the
    free-space check passed and convert and reshard started writing 16 EiB
    (stopped here by a 16 MiB file-size limit, as the disk would have been)."""
    src = tmp_path / "two.pt"
    _pt_with_storage_numel(src, 4, 4, size=(2**61, 1), stride=(0, 1), names=("a", "b"))
    assert torch.load(src, weights_only=True)["a"].shape == (2**61, 1)  # torch reads both views
    for cmd, out in ((["convert", src, "-o"], tmp_path / "out.safetensors"),
                     (["reshard", src, "--world-size", "2", "--layout", "dcp", "-o"], tmp_path / "out_dcp")):
        r = _run_with_small_files(ckptconv, *cmd, out)
        assert r.returncode == 4 and "the output needs 16384.0 PiB" in r.stderr, (cmd, r.returncode, r.stderr)
        assert not out.exists() and not list(tmp_path.glob("out*.tmp-*")), list(tmp_path.iterdir())


def test_accelerate_parts_whose_bytes_sum_past_2_pow_64_are_refused_before_writing(tmp_path, ckptconv):
    """reshard --layout accelerate sums its two parts (model, optimizer) apart
    from the per-tensor sum: two DCP directories of one 2^63-byte stride-0
    item each summed to 0 and passed the free-space check."""
    import io
    import warnings

    import torch.distributed.checkpoint as dcp

    def big_dcp(d, key):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({key: torch.zeros(1, 1)}, checkpoint_id=str(d), no_dist=True)
        md = pickle.loads((d / ".metadata").read_bytes())
        md.state_dict_metadata[key].size = torch.Size([2**61, 1])
        md.state_dict_metadata[key].chunks[0].sizes = torch.Size([2**61, 1])
        info = next(v for k, v in md.storage_data.items() if k.fqn == key)
        buf = io.BytesIO()
        torch.save(torch.zeros(1).expand(2**61, 1), buf)  # the small storage, viewed with stride 0
        item = d / info.relative_path
        info.offset, info.length = item.stat().st_size, len(buf.getvalue())
        with open(item, "ab") as f:
            f.write(buf.getvalue())
        (d / ".metadata").write_bytes(pickle.dumps(md))

    src = tmp_path / "acc"
    big_dcp(src / "pytorch_model_fsdp_0", "w")
    big_dcp(src / "optimizer_0", "state.w.exp_avg")
    out = tmp_path / "out"
    r = _run_with_small_files(ckptconv, "reshard", src, "-o", out, "--layout", "accelerate", "--world-size", "1")
    assert r.returncode == 4 and "the output needs 16384.0 PiB" in r.stderr, (r.returncode, r.stderr)
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*")), list(tmp_path.iterdir())


@pytest.mark.parametrize("view", [(2, (3,), (1,)), (0, (2,), (4,)), (1, (2, 2), (2, 1))])
def test_a_view_past_its_storage_is_refused_by_every_command(view, tmp_path, run_ckptconv):
    """A view (offset, sizes, strides) that reaches past its storage's 4
    floats: torch.load refuses it; inspect listed it with exit 0."""
    src = tmp_path / "bad.pt"
    _pt_with_storage_numel(src, 4, 4, *view)
    with pytest.raises(RuntimeError):
        torch.load(src, weights_only=True)
    says = "tensor 'w' chunk 0"
    for cmd in (["convert", src, "-o", tmp_path / "out.pt"], ["inspect", src], ["inspect", src, "--json"]):
        r = run_ckptconv(*cmd)
        assert r.returncode == 3, (cmd, r.stderr)
        assert "bad.pt" in r.stderr and says in r.stderr and "storage bytes" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()
    r = run_ckptconv("validate", src)
    assert r.returncode == 1 and says in r.stdout and "needs" in r.stdout, r.stdout + r.stderr
    good = tmp_path / "good.pt"  # the largest view that fits reads as torch reads it
    _pt_with_storage_numel(good, 4, 4, 1, (3,), (1,))
    assert torch.equal(torch.load(good, weights_only=True)["w"], torch.tensor([1.0, 2.0, 3.0]))
    r = run_ckptconv("inspect", good)
    assert r.returncode == 0, r.stderr
