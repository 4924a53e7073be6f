"""Resume check for tests/test_reshard.py (not a test).

    python tests/reshard_resume.py RESHARDED ORIGINAL WORLD_SIZE OUT_DIR

WORLD_SIZE gloo processes on CPU build the corpus Net and AdamW groups
(tools/make_checkpoints.py) under FSDP2 fully_shard on a CPU mesh of that
size, twice: one copy dcp.load()s the directory ckptconv resharded for this
world size, the other the original directory (torch reshards at load time).
Both set their state dicts, then train three steps on the same batches.
Rank 0 writes OUT_DIR/loaded.pt (the full state right after loading the
resharded directory) and OUT_DIR/result.pt (losses and final full states of
both runs). Only the workers import torch (tests/resume_runner.py).
"""
import sys
from pathlib import Path

import resume_runner
from resume_runner import train

mc = resume_runner.corpus


def full_state(model, optim):
    """A copy: at world size 1 the full tensors are the parameters themselves,
    which training would change in place."""
    import copy

    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return copy.deepcopy({"model": get_model_state_dict(model, options=opts),
                          "optim": get_optimizer_state_dict(model, optim, options=opts)})


def load_run(ws: int, checkpoint: str):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict)
    model = mc().fsdp2_wrap(mc().fresh_model(), mc().cpu_mesh(ws))
    optim = mc().param_groups(model, "adamw")
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}
    dcp.load(sd, checkpoint_id=checkpoint)
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, optim, sd["optim"])
    return model, optim


def worker(rank: int, ws: int, resharded: str, original: str, out: str) -> None:
    import torch
    model, optim = load_run(ws, resharded)
    loaded = full_state(model, optim)
    losses = train(model, optim, rank)
    after = full_state(model, optim)
    ref_model, ref_optim = load_run(ws, original)
    ref_losses = train(ref_model, ref_optim, rank)
    ref_after = full_state(ref_model, ref_optim)
    if rank == 0:
        torch.save(loaded, Path(out) / "loaded.pt")
        torch.save({"losses": losses, "after": after, "ref_losses": ref_losses, "ref_after": ref_after},
                   Path(out) / "result.pt")


if __name__ == "__main__":
    resharded, original, ws, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    resume_runner.spawn(ws, worker, resharded, original, out)
