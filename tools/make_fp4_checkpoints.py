#!/usr/bin/env python3
"""Write FP4 checkpoints with the real libraries: torch.save, safetensors'
save_file and torch's dcp.save.

    .venv/bin/python tools/make_fp4_checkpoints.py [--out testdata/fp4]

An NVFP4 / MXFP4 quantized model keeps its weights as
``torch.float4_e2m1fn_x2`` (torch >= 2.8): one element is a byte holding two
e2m1 values, the first in the low nibble (as
``torch.testing._internal.common_quantized.pack_uint4`` packs them), beside
their scales (float8_e8m0fnu per 32 values for MXFP4, float8_e4m3fn per 16
plus a float32 global scale for NVFP4) and ordinary float32 tensors.

Files (about 10 KB in all):

- ``model.pt``: ``torch.save(STATE)``;
- ``model.safetensors``: ``save_file(STATE)`` (F4's header shape counts
  values: the last dimension doubled);
- ``dcp/``: ``dcp.save(STATE)`` in one process, no process group;
- ``one_byte_apart.pt``: STATE with one byte of ``mx.weight`` changed
  (row 1, byte 5: its high nibble's mantissa bit, so the values differ), for diff;
- ``expected.json``: per tensor its dtype, torch shape and bytes (hex), and
  the decoded values of ``known.weight`` (packed from known floats with
  torch's own e2m1 helpers).

Versions: torch 2.15.0+cu132, safetensors 0.8 (the project venv).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parent.parent
FP4 = torch.float4_e2m1fn_x2


def torch_e2m1_helpers() -> dict:
    """torch's own e2m1 rounding and nibble packing, lifted from
    torch/testing/_internal/common_quantized.py (importing that module needs
    torch's test harness, expecttest, which the venv lacks)."""
    import ast
    import torch.testing as tt

    path = Path(tt.__file__).parent / "_internal" / "common_quantized.py"
    tree = ast.parse(path.read_text())
    want = {"_n_ones", "EBITS_F32", "F32_EXP_BIAS", "_f32_to_floatx_unpacked", "_floatx_unpacked_to_f32",
            "down_size", "pack_uint4"}

    def names(node):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return {node.name}
        if isinstance(node, ast.Assign):
            return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        return set()

    body = [n for n in tree.body if names(n) & want]
    ns = {"torch": torch, "Tensor": torch.Tensor}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), ns)
    return ns

# Every e2m1 value, in nibble order 0..15: +0 0.5 1 1.5 2 3 4 6, -0 ... -6.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def random_fp4(g: torch.Generator, *shape: int) -> torch.Tensor:
    """Random packed bytes (every nibble pattern is a value) viewed as fp4_x2."""
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(FP4)


def known_fp4() -> tuple[torch.Tensor, list[float]]:
    """Values packed by torch's own e2m1 rounding and nibble packing."""
    h = torch_e2m1_helpers()
    values = torch.tensor([E2M1, E2M1[::-1]], dtype=torch.float32)  # 2 x 16 values -> 2 x 8 bytes
    unpacked = h["_f32_to_floatx_unpacked"](values, ebits=2, mbits=1)
    assert torch.equal(h["_floatx_unpacked_to_f32"](unpacked, 2, 1), values)
    packed = h["pack_uint4"](unpacked).view(FP4)
    return packed, values.flatten().tolist()


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    known, _ = known_fp4()
    return {
        # MXFP4: 32 values (16 bytes) a row share one e8m0 scale.
        "mx.weight": random_fp4(g, 4, 16),
        "mx.weight_scale": torch.tensor([[120], [126], [127], [130]], dtype=torch.uint8).view(torch.float8_e8m0fnu),
        # NVFP4: 16 values (8 bytes) a block, an e4m3 scale each, a float32 global scale.
        "nv.weight": random_fp4(g, 3, 8),
        "nv.weight_scale": (torch.rand(3, 1, generator=g) * 4).to(torch.float8_e4m3fn),
        "nv.weight_scale_2": torch.tensor(0.0625),
        "known.weight": known,
        "vec": random_fp4(g, 5),  # 1-D: 5 bytes, F4 shape [10]
        "norm.weight": torch.randn(16, generator=g),
        "bias": torch.randn(4, generator=g),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "testdata" / "fp4")
    out = ap.parse_args().out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    sd = state()
    torch.save(sd, out / "model.pt")
    save_file(sd, str(out / "model.safetensors"))
    dcp.save(sd, checkpoint_id=str(out / "dcp"), no_dist=True)
    apart = {k: v.clone() for k, v in sd.items()}
    b = apart["mx.weight"].view(torch.uint8)
    b[1, 5] ^= 0x10  # the high nibble's mantissa bit: E2M1[n] != E2M1[n ^ 1] for every n
    torch.save(apart, out / "one_byte_apart.pt")

    # Self-checks: each library reads back what it wrote, byte for byte.
    back = torch.load(out / "model.pt", weights_only=True)
    loaded = {k: torch.empty_like(v) for k, v in sd.items()}
    dcp.load(loaded, checkpoint_id=str(out / "dcp"), no_dist=True)
    for k, v in sd.items():
        for other in (back[k], loaded[k]):
            assert other.dtype == v.dtype and other.shape == v.shape, k
            assert torch.equal(other.reshape(-1).view(torch.uint8), v.reshape(-1).view(torch.uint8)), k

    _, values = known_fp4()
    high = int(sd["mx.weight"].view(torch.uint8)[1, 5]) >> 4
    expected = {
        "tensors": {
            k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape),
                "hex": v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex()}
            for k, v in sd.items()
        },
        "known.weight values": values,
        # value 11 of row 1 is byte 5's high nibble
        "one_byte_apart": {"tensor": "mx.weight", "value_index": [1, 11], "a": E2M1[high], "b": E2M1[high ^ 1]},
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
