"""A ZeRO checkpoint's param_shapes must describe its flat partitions
exactly (#37 row 5): one shape shortened (out_bias [4] while the module and
the partitions hold 5) or one parameter removed used to validate and
consolidate with exit 0, every later parameter and its Adam state shifted by
an element, or the parameter silently taken from the bf16 module copy. Now
validate reports a problem (exit 1) and consolidate refuses (exit 3), each
naming param_shapes. The model-states file is rewritten by real torch.save
(it holds only torch globals), every other file is DeepSpeed's own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
ZERO = REPO / "testdata" / "zero"


def _mutated(tmp_path: Path, case: str, change) -> Path:
    src = tmp_path / case
    shutil.copytree(ZERO / case, src)
    (tag,) = [p for p in src.iterdir() if p.is_dir()]
    for model in sorted(tag.glob("*model_states.pt")):  # ZeRO-3: one per rank, each with param_shapes
        sd = torch.load(model, weights_only=True)
        change(sd["param_shapes"])
        torch.save(sd, model)
    return src


def _shorten(shapes):
    shapes[0]["out_bias"] = torch.Size([4])


def _drop(shapes):
    group = next(g for g in shapes if "l1.bias" in g)
    del group["l1.bias"]


@pytest.mark.parametrize("case", ["z2_bf16_ws2", "z1_fp16_ws2", "z2_align_ws2", "z3_fp32_ws2", "bf16opt_ws2"])
@pytest.mark.parametrize("change", [_shorten, _drop], ids=["shortened", "dropped"])
def test_param_shapes_that_do_not_add_up_are_refused(case, change, tmp_path, run_ckptconv):
    src = _mutated(tmp_path, case, change)
    r = run_ckptconv("validate", src)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "param_shapes" in r.stdout + r.stderr, r.stdout + r.stderr
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    assert "does not describe these partitions" in r.stderr or "param_shapes says" in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.parametrize("case", ["z2_bf16_ws2", "z3_fp32_ws2", "bf16opt_ws2"])
def test_unchanged_param_shapes_still_consolidate(case, tmp_path, run_ckptconv):
    """The rewrite itself changes nothing: the same file saved again reads."""
    src = _mutated(tmp_path, case, lambda shapes: None)
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "full.pt")
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("diff", tmp_path / "full.pt", ZERO / case)
    assert r.returncode == 0, r.stdout + r.stderr
