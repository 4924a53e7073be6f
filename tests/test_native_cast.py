"""--dtype casts are native (core/float_cast.cc) and bit for bit what torch's
`Tensor.to(dtype)` gives on the CPU, for every pair --dtype uses: from
float64, float32, bfloat16 or float16 to float32, bfloat16 or float16.

Inputs: every 16-bit pattern of bfloat16 and float16; for float32, every
exponent with mantissas at and around both targets' rounding points, NaNs of
every payload class and sign, and 2^22 random patterns; for float64, values
near the 16-bit types' halfway points (where rounding through float32 first,
as torch does, differs from rounding once), NaN payloads and random
patterns. Lengths are not multiples of the vector width, so ckptconv's scalar tails
run too. The casts run with ckptconv's LibTorch plugin unreachable
(CKPT_TORCH_PLUGIN names a file that does not exist), which a cast through
LibTorch would fail on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
import numpy as np

SOURCES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TARGETS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _float32_patterns() -> np.ndarray:
    special = []
    for sign in (0, 0x80000000):
        for e in range(256):
            for m in (0, 1, 0x0FFF, 0x1000, 0x1001, 0x3000, 0x7FFF, 0x8000, 0x8001, 0x18000, 0x7FFFFF,
                      0x7FF000, 0x7FE000, 0x400000, 0x400001, 0x200000, 0x000100):
                special.append(sign | (e << 23) | m)  # e = 255: Inf and NaNs, quiet and signalling
    rng = np.random.default_rng(2026)
    random = rng.integers(0, 1 << 32, size=(1 << 22) + 5, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.array(special, dtype=np.uint32), random])


def _float64_patterns() -> np.ndarray:
    rng = np.random.default_rng(7)
    # float32 values, then perturbed below float32's precision: rounding to
    # 16 bits through float32 and rounding once disagree on many of these.
    f32 = rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f32 = f32[np.isfinite(f32)].astype(np.float64)
    noise = rng.integers(-(1 << 28), 1 << 28, size=f32.size, dtype=np.int64)
    near = (f32.view(np.int64) + noise).view(np.float64)
    halfway = []
    for e in range(-30, 20):  # 1.x * 2^e just above bfloat16's and half's halfway points
        for frac in (2.0 ** -8, 2.0 ** -11, 3 * 2.0 ** -8, 3 * 2.0 ** -11):
            for eps in (0.0, 2.0 ** -40, -(2.0 ** -40), 2.0 ** -30):
                halfway += [(1 + frac + eps) * 2.0 ** e, -(1 + frac + eps) * 2.0 ** e]
    nans = np.array([0x7FF0000000000001, 0x7FF8000000000000, 0xFFF8000000000123, 0x7FF4000000000000,
                     0xFFFFFFFFFFFFFFFF, 0x7FF0000020000000], dtype=np.uint64).view(np.float64)
    random = rng.integers(0, 1 << 64, size=1 << 16, dtype=np.uint64).view(np.float64)
    return np.concatenate([near, np.array(halfway), nans, random,
                           np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 65519.99, 3.4e38, 1e-300])])


def _source_tensors(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    if dtype in (torch.bfloat16, torch.float16):
        every = torch.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(np.int16)).view(dtype).clone()
    elif dtype == torch.float32:
        every = torch.from_numpy(_float32_patterns().view(np.int32)).view(torch.float32).clone()
    else:
        every = torch.from_numpy(_float64_patterns()).clone()
    # The same values again at a length that leaves a scalar tail, and as a
    # 2-D tensor assembled in row blocks.
    rows = every.numel() // 1000
    return {"every": every, "tail": every[:1001].clone(), "matrix": every[: rows * 1000].reshape(rows, 1000).clone()}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("casts")
    out = {}
    for name, dtype in SOURCES.items():
        out[name] = d / f"{name}.pt"
        torch.save(_source_tensors(dtype), out[name])
    return out


def _vectorised_cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What LibTorch's vectorised CPU kernel gives for every element of t.
    torch runs the tail of each block (and of each thread's share) through a
    scalar kernel, which writes other bits for NaN (float64 -> bfloat16:
    0x7FC0 instead of 0xFFFF; float16 -> float32: 0x7FFFFFFF instead of the
    quiet NaN with its payload), so its result for a NaN depends on where
    the element falls and on the thread count. On one thread and a length
    that is a multiple of every vector width, every element takes the
    vectorised kernel; ckptconv does what it does, everywhere."""
    flat = t.flatten()
    padded = torch.cat([flat, flat.new_zeros(-flat.numel() % 256)])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return padded.to(dtype)[: flat.numel()].reshape(t.shape)
    finally:
        torch.set_num_threads(threads)


def _first_mismatch(ours: torch.Tensor, theirs: torch.Tensor, src: torch.Tensor) -> str:
    bits = BITS[theirs.dtype]
    a, b = ours.view(bits).flatten(), theirs.view(bits).flatten()
    i = int((a != b).nonzero()[0])
    s = src.flatten().view(BITS[src.dtype])[i]
    mask = (1 << 8 * src.element_size()) - 1
    return (f"{int((a != b).sum())} elements differ; first at {i}: input 0x{int(s) & mask:x}, "
            f"torch 0x{int(b[i]) & 0xFFFFFFFF:x}, ckptconv 0x{int(a[i]) & 0xFFFFFFFF:x}")


@pytest.mark.parametrize("source,target", [(s, t) for s in SOURCES for t in TARGETS if SOURCES[s] != TARGETS[t]],
                         ids=lambda name: name)  # a dtype to itself is no cast
def test_cast_equals_torch_bit_for_bit(source, target, sources, tmp_path, ckptconv):
    out = tmp_path / "out.pt"
    env = dict(os.environ, CKPT_TORCH_PLUGIN=str(tmp_path / "no-plugin-here.so"))
    res = subprocess.run([str(ckptconv), "consolidate", str(sources[source]), "-o", str(out), "--dtype", target],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    ours = torch.load(out, weights_only=True)
    src = torch.load(sources[source], weights_only=True)
    for key, tensor in src.items():
        expected = _vectorised_cast(tensor, TARGETS[target])
        got = ours[key]
        assert got.dtype == expected.dtype and got.shape == expected.shape, key
        assert torch.equal(got.view(BITS[got.dtype]), expected.view(BITS[expected.dtype])), \
            f"{source} -> {target}, '{key}': {_first_mismatch(got, expected, tensor)}"


def test_without_libtorch_a_float8_cast_fails_cleanly(tmp_path, ckptconv):
    """The control for the test above: with LibTorch unreachable, the one
    kind of cast that still needs it (from float8) is refused as an
    installation problem, so the native casts really ran without it."""
    src = tmp_path / "f8.pt"
    torch.save({"w": torch.arange(16, dtype=torch.float32).to(torch.float8_e4m3fn)}, src)
    env = dict(os.environ, CKPT_TORCH_PLUGIN=str(tmp_path / "no-plugin-here.so"))
    res = subprocess.run([str(ckptconv), "consolidate", str(src), "-o", str(tmp_path / "o.pt"), "--dtype", "bf16"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 5, res.stderr
    assert "LibTorch" in res.stderr
    assert not (tmp_path / "o.pt").exists()
