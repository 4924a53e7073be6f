"""Every dtype a safetensors file can hold (#32): a file written by
safetensors' own save_file with one tensor of each (F64 ... F8_E5M2, I8 ...
I64, U8 ... U64, BOOL) is read by every command, copied bit for bit into
.pt and .safetensors, and --dtype casts its floating tensors (to bf16, fp16,
fp32 and to float8 e4m3fn / e5m2) as torch's Tensor.to does (computed here, in the same run), leaving integer
and bool tensors as they are, as model.to(dtype) does."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file  # noqa: E402

FLOATS = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _tensors() -> dict:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(5, 3, generator=g, dtype=torch.float64) * 40
    base[4] = torch.tensor([1e5, -1e5, 1e-9], dtype=torch.float64)  # past float16's and float8's ranges, and tiny
    out = {name: base.to(getattr(torch, name)) for name in FLOATS}
    for name in INTS:  # each type's extremes
        dtype = getattr(torch, name)
        info = torch.iinfo(dtype)
        out[name] = torch.tensor([info.min, info.max, 0, 1, info.max // 3], dtype=dtype)
    out["bool"] = torch.tensor([[True, False], [False, True]])
    out["empty_f8"] = torch.empty(0, 4, dtype=torch.float8_e4m3fn)
    return out


def _bits(t):
    """Compares bytes: torch.equal has no kernel for every dtype here."""
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    path = tmp_path_factory.mktemp("dtypes") / "every.safetensors"
    save_file(_tensors(), str(path))
    return path


def _copies_bit_for_bit(src, want: dict, tmp_path, run_ckptconv) -> None:
    """consolidate of `src` to .pt and to .safetensors holds `want`, dtypes and bits, and diff says equal."""
    for out in (tmp_path / "all.pt", tmp_path / "all.safetensors"):
        r = run_ckptconv("consolidate", src, "-o", out)
        assert r.returncode == 0, r.stderr
        got = torch.load(out, weights_only=True) if out.suffix == ".pt" else load_file(out)
        assert set(got) == set(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            assert torch.equal(_bits(got[k]), _bits(want[k])), k
        assert run_ckptconv("diff", src, out).returncode == 0


def test_every_dtype_is_copied_bit_for_bit(every_dtype, tmp_path, run_ckptconv):
    _copies_bit_for_bit(every_dtype, load_file(every_dtype), tmp_path, run_ckptconv)
    report = json.loads(run_ckptconv("validate", every_dtype, "--json").stdout)
    assert report["status"] == "valid", report
    text = run_ckptconv("inspect", every_dtype).stdout
    for name in FLOATS + INTS + ["bool"]:
        assert f" {name} " in text, name


TARGETS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
           "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_dtype_casts_floating_tensors_as_torch_does(target, suffix, every_dtype, tmp_path, run_ckptconv):
    """To float8 too: values past its range (±1e5 here) come out as Tensor.to makes them."""
    dtype = TARGETS[target]
    want = load_file(every_dtype)
    out = tmp_path / f"cast{suffix}"
    r = run_ckptconv("consolidate", every_dtype, "--dtype", target, "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True) if suffix == ".pt" else load_file(out)
    for k, t in want.items():
        expect = t.to(dtype) if t.is_floating_point() else t
        assert got[k].dtype == expect.dtype, k
        assert torch.equal(_bits(got[k]), _bits(expect)), k


def test_float8_fnuz_and_e8m0_are_read_and_written_as_save_file_writes_them(tmp_path, run_ckptconv):
    """F8_E4M3FNUZ and F8_E5M2FNUZ (safetensors 0.8 reads and writes them) were
    'unknown dtype': refused on reading, not writable. Now copied bit for bit,
    and a safetensors output of them is save_file's byte for byte (its layout
    orders the data by dtype, then name)."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 3, generator=g) * 3
    want = {f"w_{name}": base.to(getattr(torch, name))
            for name in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float8_e4m3fn", "float8_e5m2")}
    want["i16"] = torch.arange(6, dtype=torch.int16)
    src = tmp_path / "f8.safetensors"
    save_file(want, str(src))
    _copies_bit_for_bit(src, want, tmp_path, run_ckptconv)
    # From the .pt (no safetensors metadata to carry) the layout is save_file's of the same dict.
    r = run_ckptconv("consolidate", tmp_path / "all.pt", "-o", tmp_path / "again.safetensors")
    assert r.returncode == 0, r.stderr
    save_file(torch.load(tmp_path / "all.pt", weights_only=True), str(tmp_path / "ref.safetensors"))

    def layout(p):
        b = p.read_bytes()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        h.pop("__metadata__", None)
        return {k: (v["dtype"], v["data_offsets"]) for k, v in h.items()}, b[8 + n:]
    assert layout(tmp_path / "again.safetensors") == layout(tmp_path / "ref.safetensors")
    assert run_ckptconv("validate", src).returncode == 0
