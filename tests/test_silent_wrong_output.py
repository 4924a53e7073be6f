"""Never a silently dropped tensor or a silently changed one (#47 rows 7-9):
an index that lists nothing, two keys one output would store under one
name, and --dtype reaching an optimizer's state. Each case is a file the
real library writes (safetensors, torch.save, torch's DCP), read back by
the real library where ckptconv writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

REPO = Path(__file__).resolve().parent.parent
DCP = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2"


# ---- row 7: an index that lists no tensor -------------------------------------

def test_an_empty_weight_map_beside_a_real_shard_is_an_error(tmp_path, run_ckptconv):
    src = tmp_path / "hf"
    src.mkdir()
    save_file({"w": torch.ones(3)}, src / "model-00001-of-00001.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    for target in (src, src / "model.safetensors.index.json"):
        r = run_ckptconv("validate", target)  # a problem validate reports (exit 1), never VALID
        assert r.returncode == 1, r.stdout + r.stderr
        assert "weight_map lists no tensor" in r.stdout and "INVALID" in r.stdout
        r = run_ckptconv("consolidate", target, "-o", tmp_path / "o.pt")
        assert r.returncode == 3 and "weight_map lists no tensor" in r.stderr, r.stderr
        assert not (tmp_path / "o.pt").exists()


# ---- row 8: two keys that one name would merge --------------------------------

@pytest.fixture
def colliding(tmp_path: Path) -> Path:
    src = tmp_path / "c.pt"
    torch.save({"model": {7: torch.ones(2), "7": torch.zeros(2)},
                "optim": {"state": {}, "param_groups": [{"lr": 0.1, "params": []}]}}, src)
    return src


@pytest.mark.parametrize("args,output", [
    (["reshard", "{src}", "-o", "{out}", "--world-size", "2", "--layout", "dcp"], "a DCP checkpoint"),
    (["reshard", "{src}", "-o", "{out}", "--world-size", "2", "--layout", "hf", "--only", "model"],
     "a DCP Hugging Face checkpoint"),
    (["reshard", "{src}", "-o", "{out}/t_universal", "--layout", "deepspeed-universal"], "a universal checkpoint"),
    (["consolidate", "{src}", "-o", "{out}.safetensors"], "safetensors"),
    (["consolidate", "{src}", "-o", "{out}.h5"], "an HDF5 file"),
])
def test_every_writer_that_names_entries_by_path_refuses_a_collision(args, output, colliding, tmp_path,
                                                                     run_ckptconv):
    out = tmp_path / "out"
    if "universal" in " ".join(args):
        out.mkdir()
    r = run_ckptconv(*[a.replace("{src}", str(colliding)).replace("{out}", str(out)) for a in args])
    assert r.returncode == 3, r.stderr
    assert "two entries are both named" in r.stderr and "dict[int]" in r.stderr and "dict[str]" in r.stderr
    assert output in r.stderr, r.stderr
    leftovers = [p for p in tmp_path.iterdir() if p.name != "c.pt" and not (p == out and not any(out.iterdir()))]
    assert leftovers == [], leftovers


def test_writers_that_keep_the_tree_keep_both_keys(colliding, tmp_path, run_ckptconv):
    r = run_ckptconv("consolidate", colliding, "-o", tmp_path / "o.pt")
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "o.pt", weights_only=True)["model"]
    assert torch.equal(got[7], torch.ones(2)) and torch.equal(got["7"], torch.zeros(2))


# ---- row 9: --dtype casts the model, not the optimizer's state -----------------

def test_reshard_dtype_keeps_the_optimizer_state_unless_asked(tmp_path, run_ckptconv):
    ref = tmp_path / "ref.pt"
    dcp_to_torch_save(DCP, ref)
    before = torch.load(ref, weights_only=False)
    out = tmp_path / "bf16"
    r = run_ckptconv("reshard", DCP, "-o", out, "--world-size", "2", "--layout", "dcp", "--dtype", "bf16")
    assert r.returncode == 0, r.stderr
    assert "optimizer state keep their dtypes (--optim-dtype casts them)" in r.stderr, r.stderr
    dcp_to_torch_save(out, tmp_path / "bf16.pt")
    after = torch.load(tmp_path / "bf16.pt", weights_only=False)
    floats = 0
    for name, t in before["model"].items():
        if t.is_floating_point():
            assert after["model"][name].dtype == torch.bfloat16, name
            floats += 1
    assert floats > 0
    states = 0
    for pname, st in before["optim"]["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                got = after["optim"]["state"][pname][k]
                assert got.dtype == v.dtype and torch.equal(got, v), (pname, k)  # bit for bit
                states += 1
    assert states > 0
    # --optim-dtype asks for it; step counters stay as they are.
    out2 = tmp_path / "both"
    r = run_ckptconv("reshard", DCP, "-o", out2, "--world-size", "2", "--layout", "dcp", "--dtype", "bf16",
                     "--optim-dtype", "bf16")
    assert r.returncode == 0, r.stderr
    dcp_to_torch_save(out2, tmp_path / "both.pt")
    both = torch.load(tmp_path / "both.pt", weights_only=False)
    for pname, st in before["optim"]["state"].items():
        assert both["optim"]["state"][pname]["exp_avg"].dtype == torch.bfloat16
        assert both["optim"]["state"][pname]["step"].dtype == st["step"].dtype


def test_consolidate_only_optim_with_dtype_says_nothing_was_cast(tmp_path, run_ckptconv):
    r = run_ckptconv("consolidate", DCP, "--only", "optim", "--dtype", "fp16", "-o", tmp_path / "o.pt")
    assert r.returncode == 0, r.stderr
    assert "0 model tensors cast" in r.stderr
    got = torch.load(tmp_path / "o.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for st in got["state"].values() for k, v in st.items()
               if torch.is_tensor(v) and k != "step")


@pytest.mark.parametrize("layout", ["tutorial", "lightning"])
def test_dtype_keeps_an_optimizer_state_dict_under_any_key(tmp_path, run_ckptconv, layout):
    """torch.save of optimizer.state_dict() under the key PyTorch's tutorial
    uses ('optimizer_state_dict') or in Lightning's full checkpoint
    ('optimizer_states': [...]) is an optimizer's state as much as one under
    'optim': --dtype had cast its moments to bf16 with exit 0."""
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for _ in range(3):
        m(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    if layout == "tutorial":
        saved = {"epoch": 3, "model_state_dict": m.state_dict(), "optimizer_state_dict": opt.state_dict()}
    else:
        saved = {"global_step": 3, "state_dict": m.state_dict(), "optimizer_states": [opt.state_dict()]}
    src = tmp_path / "ckpt.pt"
    torch.save(saved, src)
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "o.pt", "--dtype", "bf16")
    assert r.returncode == 0, r.stderr
    assert "4 tensors of optimizer state keep their dtypes" in r.stderr, r.stderr
    got = torch.load(tmp_path / "o.pt", weights_only=True)
    model_key, optim = ("model_state_dict", lambda d: d["optimizer_state_dict"]) if layout == "tutorial" else (
        "state_dict", lambda d: d["optimizer_states"][0])
    assert all(v.dtype == torch.bfloat16 for v in got[model_key].values())
    states = 0
    for pid, st in optim(saved)["state"].items():
        for k, v in st.items():
            assert optim(got)["state"][pid][k].dtype == v.dtype and torch.equal(optim(got)["state"][pid][k], v), k
            states += 1
    assert states == 6
