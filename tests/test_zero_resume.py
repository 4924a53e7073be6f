"""A DeepSpeed run resumed from ckptconv's consolidation, without DeepSpeed:
the consolidated {"model", "optim"} is loaded into the plain torch model and
torch.optim.AdamW (FQN -> index rekeying) and two more steps run on the
batches the DeepSpeed engine trained on after loading the same checkpoint.

Bit for bit, the result must equal the same two steps run in this process
from the engine's own state at load time (reference_live.pt, gathered from
the live engine by tools/make_zero_checkpoints.py): both sides are computed
here, on this CPU, so equal inputs give equal bits whatever the CPU.
Against DeepSpeed's recorded steps (reference_resume.pt, real DeepSpeed
0.19.8 on the generator's CPU) only within a tolerance: torch's CPU kernels
differ by instruction set (an AVX-512 machine moved out_bias by 3.7e-9)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
ZERO = REPO / "testdata" / "zero"
CASES = sorted(p.name for p in ZERO.iterdir() if (p / "reference_resume.pt").exists())


@pytest.fixture(scope="module")
def resume():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import make_zero_resume_refs
    finally:
        sys.path.pop(0)
    return make_zero_resume_refs


# Tolerance against the recorded trajectory. Another CPU's kernels (GEMM
# blocking, vectorised reductions) round each gradient element differently:
# a relative change of a few ulp of the dtype the gradient is computed in,
# eps = 2^-23 (fp32), 2^-7 (bf16), 2^-10 (fp16); gloo's three-way
# low-precision sum adds the same order. AdamW's update lr * m/(sqrt(v)+eps)
# scales with the gradient's relative error, so two steps at lr <= 1e-2 move
# a weight by at most 2 * 1e-2 * 4 * eps: fp32 ~1e-8, bf16 ~6e-4, fp16
# ~8e-5; a weight |w| <= 4 rounds its sum to 2 more ulp of fp32 (~1e-6).
# Measured: 3.7e-9 (fp32, AVX-512 vs the generator), bf16 4e-5, fp16 4e-6
# (three ranks). The bound, not the measurement, is the tolerance.
ATOL = {torch.float32: 2e-6, torch.bfloat16: 1e-3, torch.float16: 2e-4}


def _max_diff(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


@pytest.mark.parametrize("case", CASES)
def test_plain_torch_resumes_like_the_deepspeed_engine(case, tmp_path, run_ckptconv, resume):
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", ZERO / case, "-o", out)
    assert r.returncode == 0, r.stderr
    start = torch.load(out, weights_only=True)
    ref = torch.load(ZERO / case / "reference_resume.pt", weights_only=True)
    live = torch.load(ZERO / case / "reference_live.pt", weights_only=True)
    torch.set_num_threads(1)  # as each DeepSpeed rank ran
    kw = dict(lp_dtype=resume.LP_DTYPE[ref["dtype"]], loss_scale=ref["loss_scale"])
    if ref["optimizer_class"] == "BF16_Optimizer":
        kw["postdivide"] = True
    got = resume.plain_torch_resume(start, ref["batches"], **kw)
    # The same steps from the engine's own state, in this process: bit for bit.
    engine = resume.plain_torch_resume(resume.start_from_live(live), ref["batches"], **kw)
    _same(got["model"], engine["model"])
    _same(got["optim"], engine["optim"])
    # DeepSpeed's own steps, recorded on another CPU: within the bound above.
    atol = ATOL[kw["lp_dtype"]]
    for name, want in ref["model_after"].items():
        have = got["model"][name]
        assert have.dtype == want.dtype and have.shape == want.shape, name
        diff = _max_diff(have, want)
        assert diff <= atol, f"{name}: max |diff| {diff} > {atol}"
        for key in ("exp_avg", "exp_avg_sq"):
            d = _max_diff(got["optim"][name][key], ref["optim_after"][name][key])
            assert d <= atol, f"{name}.{key}: {d} > {atol}"
        assert float(got["optim"][name]["step"]) == float(ref["optim_after"][name]["step"])


def _same(a, b, path=""):
    """Bitwise on tensors; sequences compared as lists (torch's full-state
    loader turns the betas tuple into a list)."""
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}.{i}")
    elif torch.is_tensor(a):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    else:
        assert a == b, path


MIGRATIONS = {"fsdp2": "dcp", "fsdp1-st": "fsdp-sharded-tensor", "fsdp1-dt": "fsdp-dtensor"}


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("case,mode", [("z2_fp32_ws3", "fsdp2"), ("z3_bf16_ws2", "fsdp2"),
                                       ("z2_fp32_ws3", "fsdp1-st"), ("z3_bf16_ws2", "fsdp1-dt")])
def test_fsdp_resumes_from_the_migration(case, mode, n, tmp_path, run_ckptconv):
    """reshard ZERO --world-size N --layout dcp (FSDP2) or per-rank files
    (FSDP1): an FSDP job at N that loads it trains exactly like one that
    loaded the consolidated full state dict (the frozen bf16 weight is cast
    to the model's fp32 by both)."""
    import subprocess
    src = ZERO / case
    migrated, full, out = tmp_path / "migrated", tmp_path / "full.pt", tmp_path / "out"
    out.mkdir()
    r = run_ckptconv("reshard", src, "-o", migrated, "--world-size", str(n), "--layout", MIGRATIONS[mode])
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("consolidate", src, "-o", full)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, str(REPO / "tests" / "zero_fsdp_resume.py"), str(migrated), str(full), str(n),
                        str(out), str(src / "reference_resume.pt"), mode], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    res = torch.load(out / "result.pt", weights_only=True)
    _same(res["loaded"], res["ref_loaded"])
    assert torch.isfinite(res["losses"]).all()
    assert torch.equal(res["losses"], res["ref_losses"])
    _same(res["after"], res["ref_after"])
    # and what was loaded is the consolidation's values
    consolidated = torch.load(full, weights_only=True)
    for name, t in res["loaded"]["model"].items():
        assert torch.equal(t, consolidated["model"][name].to(t.dtype)), name
