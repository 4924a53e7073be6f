"""A DeepSpeed run resumed from ckptconv's consolidation, without DeepSpeed:
the consolidated {"model", "optim"} is loaded into the plain torch model and
torch.optim.AdamW (FQN -> index rekeying), two more steps run on the batches
the DeepSpeed engine trained on after loading the same checkpoint, and the
weights and optimizer state must equal the engine's (reference_resume.pt,
written by tools/make_zero_resume_refs.py with real DeepSpeed 0.19.8)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

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


@pytest.mark.parametrize("case", CASES)
def test_plain_torch_resumes_like_the_deepspeed_engine(case, tmp_path, run_ckptconv, resume):
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", ZERO / case, "-o", out)
    assert r.returncode == 0, r.stderr
    start = torch.load(out, weights_only=True)
    ref = torch.load(ZERO / case / "reference_resume.pt", weights_only=True)
    torch.set_num_threads(1)  # as each DeepSpeed rank ran
    kw = dict(lp_dtype=resume.LP_DTYPE[ref["dtype"]], loss_scale=ref["loss_scale"])
    if ref["optimizer_class"] == "BF16_Optimizer":
        kw["postdivide"] = True
    got = resume.plain_torch_resume(start, ref["batches"], **kw)
    ws = ref["world_size"]
    # Two ranks add their gradients in one order only: bit for bit. Three
    # ranks in fp32 round within 3e-8; gloo's low-precision three-way sum
    # could not be reproduced exactly (bf16 4e-5, fp16 4e-6 measured).
    fp32 = kw["lp_dtype"] == torch.float32
    atol = 0.0 if ws == 2 else 1e-6 if fp32 else 1e-4
    for name, want in ref["model_after"].items():
        have = got["model"][name]
        assert have.dtype == want.dtype and have.shape == want.shape, name
        diff = float((have - want).abs().max())
        assert diff <= atol, f"{name}: max |diff| {diff} > {atol}"
        for key in ("exp_avg", "exp_avg_sq"):
            d = float((got["optim"][name][key] - ref["optim_after"][name][key]).abs().max())
            assert d <= max(atol, 0.0), f"{name}.{key}: {d}"
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
