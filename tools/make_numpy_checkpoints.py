#!/usr/bin/env python3
"""Write a real DCP checkpoint that saved numpy state beside the model.

    .venv/bin/python tools/make_numpy_checkpoints.py [--out testdata/numpy]

A training loop that keeps numpy's RNG does
``dcp.save({"model": model.state_dict(), "np_rng": np.random.get_state()})``
and ``dcp.load`` hands the tuple back (issue #48 row 2). torch.save pickles
each such bytes item at protocol 2, so it names ``numpy._core.multiarray
._reconstruct``, ``numpy.ndarray``, ``numpy.dtype`` and, for numpy scalars,
``numpy._core.multiarray.scalar`` (numpy >= 2; numpy 1.x writes
``numpy.core.multiarray``).

Case ``dcp_np_rng/`` (one process, no process group; about 10 KB):

- ``model``: ``nn.Linear(3, 2)`` (seed 0);
- ``np_rng``: ``np.random.get_state()`` after ``np.random.seed(1234)`` and
  three draws: ('MT19937', uint32[624], pos, has_gauss, cached_gaussian);
- ``np_extra``: one of each numpy shape the decode table accepts (float32
  2x3, a Fortran-ordered int64 2x3, a big-endian int32, bool, float16,
  uint64 beyond int64, an empty 0x3, a 0-d float64, the scalars float32,
  int64 and bool_, a dtype), as a tuple of (name, value) pairs: one DCP
  item (a dict would be flattened into an item per value, each a whole
  torch.save zip).

``expected.json`` holds what each ``np_extra`` value is as plain data
(``a.tolist()``, ``s.item()``, ``dtype.str``), written from the live objects.

Versions: torch 2.15.0+cu132, numpy 2.4.6, Python 3.11 (the project venv).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

REPO = Path(__file__).resolve().parent.parent


def numpy_extra() -> dict:
    return {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
        "fortran_i64": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3) - 2),
        "be_i32": np.array([1, -2, 70000], dtype=">i4"),
        "flags": np.array([True, False, True]),
        "half": np.array([1.5, -2.0, 65504.0], dtype=np.float16),
        "big_u64": np.array([2**64 - 1, 5], dtype=np.uint64),
        "empty": np.zeros((0, 3), dtype=np.float64),
        "zero_d": np.array(2.25),
        "lr": np.float32(0.5),
        "step": np.int64(7),
        "done": np.bool_(True),
        "dtype": np.dtype("float16"),
    }


def numpy_extra_item() -> tuple:
    return tuple(numpy_extra().items())


def plain(v):
    """numpy values as the plain data ckptconv writes (tolist(), item(),
    dtype.str); tuples as lists; tensors as lists (tests compare with it)."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.dtype):
        return v.str
    if isinstance(v, (tuple, list)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, torch.Tensor):
        return v.tolist()
    return v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "testdata" / "numpy"))
    out = Path(ap.parse_args().out) / "dcp_np_rng"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    np.random.seed(1234)
    np.random.rand(3)
    state = {"model": model.state_dict(), "np_rng": np.random.get_state(), "np_extra": numpy_extra_item()}
    dcp.save(state, checkpoint_id=str(out / "ckpt"))
    expected = {"np_extra": plain(numpy_extra()), "model": {k: v.tolist() for k, v in state["model"].items()}}
    (out / "expected.json").write_text(json.dumps(expected) + "\n")
    # Self-check: dcp.load hands the numpy values back.
    back = {"model": torch.nn.Linear(3, 2).state_dict(), "np_rng": None, "np_extra": None}
    dcp.load(back, checkpoint_id=str(out / "ckpt"))
    assert back["np_rng"][0] == "MT19937" and np.array_equal(back["np_rng"][1], state["np_rng"][1])
    print(out, sum(p.stat().st_size for p in out.rglob("*") if p.is_file()), "bytes")


if __name__ == "__main__":
    main()
