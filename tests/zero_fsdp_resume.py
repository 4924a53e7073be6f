"""Resume check for tests/test_zero_resume.py (not a test).

    python tests/zero_fsdp_resume.py MIGRATED FULL WORLD_SIZE OUT_DIR

A DeepSpeed run migrated to FSDP2: WORLD_SIZE gloo processes on CPU build
the ZeRO fixtures' model (tools/make_zero_checkpoints.py) under FSDP2
fully_shard on a CPU mesh, with AdamW groups as the consolidation lists
them, twice: one copy dcp.load()s MIGRATED (ckptconv reshard ZERO --layout
dcp --world-size N), the other sets the full state dict FULL (ckptconv
consolidate ZERO). Both train two steps on the same batches. Rank 0 writes
OUT_DIR/result.pt (losses and final full states of both runs).
"""
import sys
from pathlib import Path

import resume_runner

TOOLS = str(Path(__file__).resolve().parent.parent / "tools")


def zero_model():
    if TOOLS not in sys.path:
        sys.path.insert(0, TOOLS)
    import make_zero_checkpoints
    return make_zero_checkpoints


def build(ws: int, full_optim: dict):
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    model = zero_model().fresh_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (ws,)))
    named = dict(model.named_parameters())
    groups = []
    for g in full_optim["param_groups"]:
        hp = {k: v for k, v in g.items() if k != "params"}
        groups.append({"params": [named[n] for n in g["params"]], **hp})
    return model, torch.optim.AdamW(groups)


def train(model, optim, rank: int, batches):
    import torch
    losses = []
    for step in batches:
        optim.zero_grad(set_to_none=True)
        loss = model(step[rank % len(step)])
        loss.backward()
        optim.step()
        losses.append(loss.detach().clone())
    return torch.stack(losses)


def full_state(model, optim):
    import copy
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return copy.deepcopy({"model": get_model_state_dict(model, options=opts),
                          "optim": get_optimizer_state_dict(model, optim, options=opts)})


def worker(rank: int, ws: int, migrated: str, full_path: str, batches_path: str, out: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
        set_optimizer_state_dict)
    torch.set_num_threads(1)
    full = torch.load(full_path, weights_only=True)
    batches = torch.load(batches_path, weights_only=True)["batches"]

    model, optim = build(ws, full["optim"])
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}
    dcp.load(sd, checkpoint_id=migrated)
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, optim, sd["optim"])
    loaded = full_state(model, optim)
    losses = train(model, optim, rank, batches)
    after = full_state(model, optim)

    ref_model, ref_optim = build(ws, full["optim"])
    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(ref_model, full["model"], options=opts)
    set_optimizer_state_dict(ref_model, ref_optim, full["optim"], options=opts)
    ref_loaded = full_state(ref_model, ref_optim)
    ref_losses = train(ref_model, ref_optim, rank, batches)
    ref_after = full_state(ref_model, ref_optim)
    if rank == 0:
        torch.save({"loaded": loaded, "ref_loaded": ref_loaded, "losses": losses, "ref_losses": ref_losses,
                    "after": after, "ref_after": ref_after}, Path(out) / "result.pt")


if __name__ == "__main__":
    migrated, full, ws, out, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    resume_runner.spawn(ws, worker, migrated, full, batches, out)
