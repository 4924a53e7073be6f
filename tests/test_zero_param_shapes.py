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
import torch

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


def test_made_up_empty_param_shapes_entries_are_refused_in_bounded_memory(tmp_path, ckptconv):
    """#37 row 7: 27,000 made-up entries of shape [0] (1.0 MB of model
    states) took 445 MB, about 12 KB per entry, each becoming a tensor for the
    master and every optimizer state. param_shapes names the module's own
    parameters: one that is not in module is refused before anything is built
    per parameter, so peak memory stays within the documented pickle-memory
    budget of the file (64 MiB + 128 x its bytes), which the old reader
    exceeded (218 MB)."""
    import subprocess

    def add(shapes):
        for i in range(27_000):
            shapes[0][f"e{i}"] = torch.Size([0])

    src = _mutated(tmp_path, "z2_bf16_ws2", add)
    (states,) = src.glob("*/mp_rank_00_model_states.pt")
    budget_kb = (64 * 2**20 + 128 * states.stat().st_size) / 1024
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", str(ckptconv), "validate", str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "param_shapes names 'e0', which is not in module" in r.stdout, r.stdout
    peak_kb = int(r.stderr.rsplit("maxrss_kb=", 1)[1].split()[0])
    assert peak_kb < budget_kb, (peak_kb, budget_kb)
