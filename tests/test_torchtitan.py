"""torchtitan's checkpoint layout (testdata/titan/, tools/make_checkpoints.py
job_titan): DCP byte items, io.BytesIO values in train_state, flattened
optimizer keys. Every path is compared with what real torch makes of the
same directory (dcp_to_torch_save, dcp.load).

The rule (docs/formats.md, "Byte items"): outputs that torch.load(weights_only=True)
reads hold a BytesIO item as its bytes; DCP outputs keep it a BytesIO, whose
bytes and position are the source's.
"""
import io
import pickle
from pathlib import Path

import pytest
import torch

from state_compare import assert_same

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "testdata" / "titan" / "checkpoint" / "step-3"
REF = REPO / "testdata" / "titan" / "step-3.ref.pt"
BYTES_IO = ("global_avg_losses", "global_max_losses", "log_steps")


def reference():
    """torch's own dcp_to_torch_save output (BytesIO objects: weights_only=False)."""
    return torch.load(REF, weights_only=False)


def as_bytes(v):
    """The weights_only rule applied to torch's reference: a BytesIO is its bytes."""
    if isinstance(v, io.BytesIO):
        return v.getvalue()
    if isinstance(v, dict):
        return {k: as_bytes(c) for k, c in v.items()}
    return v


def run_ok(run_ckptconv, *args):
    r = run_ckptconv(*args)
    assert r.returncode == 0, r.stderr
    return r


def test_consolidate_holds_each_bytesio_as_its_bytes(tmp_path, run_ckptconv):
    out = tmp_path / "full.pt"
    run_ok(run_ckptconv, "consolidate", SRC, "-o", out)
    got = torch.load(out, weights_only=True)
    assert_same(got, as_bytes(reference()))
    ts = got["train_state"]
    assert ts["step"].dtype == torch.int32 and int(ts["step"]) == 3
    losses = torch.load(io.BytesIO(ts["global_avg_losses"]), weights_only=True)
    assert len(losses) == 3 and all(isinstance(x, float) for x in losses)
    assert torch.load(io.BytesIO(ts["log_steps"]), weights_only=True) == [1, 2, 3]
    # The per-rank dataloader blobs stay the bytes pickle.dumps made.
    assert pickle.loads(got["dataloader"]["dp_rank_1"])["rank"] == 1
    assert got["dataloader"]["world_size"] == 2


@pytest.mark.parametrize("n", [1, 3])
def test_reshard_keeps_byte_items_and_bytesio(n, tmp_path, run_ckptconv):
    dst = tmp_path / "out"
    run_ok(run_ckptconv, "reshard", SRC, "-o", dst, "--world-size", str(n))
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(dst, tmp_path / "torch.pt")
    got, ref = torch.load(tmp_path / "torch.pt", weights_only=False), reference()
    for name in BYTES_IO:
        a, b = got["train_state"][name], ref["train_state"][name]
        assert isinstance(a, io.BytesIO), name
        assert (a.getvalue(), a.tell()) == (b.getvalue(), b.tell()), name
    assert_same(as_bytes(got), as_bytes(ref))


def test_dcp_load_restores_the_train_state_as_torchtitan_loads_it(tmp_path, run_ckptconv):
    """dcp.load into the state torchtitan's Stateful objects return, in one
    process: the BytesIO comes back seekable, the losses load from it."""
    import torch.distributed.checkpoint as dcp
    dst = tmp_path / "out"
    run_ok(run_ckptconv, "reshard", SRC, "-o", dst, "--world-size", "3")
    ref = reference()
    state = {
        "model": {k: torch.empty_like(v) for k, v in ref["model"].items()},
        "train_state": {"step": torch.tensor(0, dtype=torch.int32),
                        **{name: io.BytesIO() for name in BYTES_IO}},
        "dataloader": {"dp_rank_0": b"", "world_size": 0},
    }
    dcp.load(state, checkpoint_id=str(dst), no_dist=True)
    assert_same(state["model"], ref["model"])
    assert int(state["train_state"]["step"]) == 3
    losses = state["train_state"]["global_avg_losses"]
    losses.seek(0)
    assert torch.load(losses, weights_only=False) == torch.load(
        io.BytesIO(ref["train_state"]["global_avg_losses"].getvalue()), weights_only=False)
    assert pickle.loads(state["dataloader"]["dp_rank_0"])["rank"] == 0


def test_only_model_safetensors_bf16_has_the_model_keys(tmp_path, run_ckptconv):
    from safetensors.torch import load_file
    out = tmp_path / "model.safetensors"
    run_ok(run_ckptconv, "consolidate", SRC, "--only", "model", "--dtype", "bf16", "-o", out)
    got = load_file(out)
    want = reference()["model"]
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], v.to(torch.bfloat16)), k


def test_only_optim_takes_the_optimizer_entry(tmp_path, run_ckptconv):
    out = tmp_path / "optim.pt"
    run_ok(run_ckptconv, "consolidate", SRC, "--only", "optim", "-o", out)
    assert_same(torch.load(out, weights_only=True), reference()["optimizer"])


def test_validate_diff_and_hdf5(tmp_path, run_ckptconv):
    run_ok(run_ckptconv, "validate", SRC)
    dst = tmp_path / "out"
    run_ok(run_ckptconv, "reshard", SRC, "-o", dst, "--world-size", "3")
    r = run_ok(run_ckptconv, "diff", SRC, dst)
    assert "equal" in r.stdout
    import h5py
    run_ok(run_ckptconv, "consolidate", SRC, "-o", tmp_path / "full.h5")
    with h5py.File(tmp_path / "full.h5", "r") as f:
        assert f["model/emb.weight"].shape == (10, 4)


def test_validate_checks_the_flattened_optimizer(tmp_path, run_ckptconv):
    """torchtitan's optimizer keys are flat (state.<fqn>.<name>,
    param_groups.<fqn>.<key>): a checkpoint whose param_groups lost one
    parameter is a problem naming it."""
    cut = tmp_path / "cut.pt"
    run_ok(run_ckptconv, "consolidate", SRC, "-o", cut, "--keys", r"^(?!optimizer\.param_groups\.scale\.)")
    assert "param_groups.scale.lr" not in torch.load(cut, weights_only=True)["optimizer"]
    r = run_ckptconv("validate", cut)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "'optimizer.state.scale.exp_avg' is for parameter 'scale', which no param_groups entry" in r.stdout
    run_ok(run_ckptconv, "validate", SRC)
