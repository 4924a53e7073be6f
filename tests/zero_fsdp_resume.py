"""Resume check for tests/test_zero_resume.py (not a test).

    python tests/zero_fsdp_resume.py MIGRATED FULL WORLD_SIZE OUT_DIR BATCHES [MODE]

A DeepSpeed run migrated to FSDP: WORLD_SIZE gloo processes on CPU build the
ZeRO fixtures' model (tools/make_zero_checkpoints.py), with AdamW groups as
the consolidation lists them, twice: one copy loads MIGRATED, the other the
full state dict FULL (ckptconv consolidate ZERO). Both train two steps on
the batches of BATCHES (a reference_resume.pt). Rank 0 writes
OUT_DIR/result.pt (the states right after loading, losses and final full
states of both runs). MODE:
  fsdp2 (default)  fully_shard on a CPU mesh; MIGRATED is a DCP directory
                   (reshard --layout dcp), read with dcp.load.
  fsdp1-st         FSDP1 (use_orig_params=True, no mesh); MIGRATED holds the
                   per-rank files of reshard --layout fsdp-sharded-tensor,
                   read under SHARDED_STATE_DICT as a training job does.
  fsdp1-dt         the same with a CPU device mesh (--layout fsdp-dtensor).
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


def build(ws: int, full_optim: dict, mode: str):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard
    model = zero_model().fresh_model()
    if mode == "fsdp2":
        fully_shard(model, mesh=init_device_mesh("cpu", (ws,)))
    else:
        mesh = init_device_mesh("cpu", (ws,)) if mode == "fsdp1-dt" else None
        model = FSDP(model, device_id=torch.device("cpu"), device_mesh=mesh, use_orig_params=True)
    named = {n.replace("_fsdp_wrapped_module.", ""): p for n, p in model.named_parameters()}
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


def full_state(model, optim, mode: str):
    import copy
    if mode != "fsdp2":
        from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=True),
                                  FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True)):
            return copy.deepcopy({"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optim)})
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return copy.deepcopy({"model": get_model_state_dict(model, options=opts),
                          "optim": get_optimizer_state_dict(model, optim, options=opts)})


def load_migrated(model, optim, migrated: str, mode: str, rank: int, ws: int) -> None:
    import torch
    if mode == "fsdp2":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict)
        sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}
        dcp.load(sd, checkpoint_id=migrated)
        set_model_state_dict(model, sd["model"])
        set_optimizer_state_dict(model, optim, sd["optim"])
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType
    import re

    def rank_file(kind: str) -> Path:  # model_rank0.pt, model_world_size_2_rank_0.pt, ...
        return next(p for p in Path(migrated).glob(f"{kind}*.pt") if re.search(rf"rank_?{rank}\.pt$", p.name))

    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        model.load_state_dict(torch.load(rank_file("model"), weights_only=False))
        osd = torch.load(rank_file("optim"), weights_only=False)
        optim.load_state_dict(FSDP.optim_state_dict_to_load(model, optim, osd))


def load_full(model, optim, full: dict, mode: str) -> None:
    if mode == "fsdp2":
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, set_model_state_dict, set_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, full["model"], options=opts)
        set_optimizer_state_dict(model, optim, full["optim"], options=opts)
        return
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                              FullOptimStateDictConfig(rank0_only=False)):
        model.load_state_dict(full["model"])
        optim.load_state_dict(FSDP.optim_state_dict_to_load(model, optim, full["optim"]))


def worker(rank: int, ws: int, migrated: str, full_path: str, batches_path: str, out: str, mode: str) -> None:
    import torch
    torch.set_num_threads(1)
    full = torch.load(full_path, weights_only=True)
    batches = torch.load(batches_path, weights_only=True)["batches"]

    model, optim = build(ws, full["optim"], mode)
    load_migrated(model, optim, migrated, mode, rank, ws)
    loaded = full_state(model, optim, mode)
    losses = train(model, optim, rank, batches)
    after = full_state(model, optim, mode)

    ref_model, ref_optim = build(ws, full["optim"], mode)
    load_full(ref_model, ref_optim, full, mode)
    ref_loaded = full_state(ref_model, ref_optim, mode)
    ref_losses = train(ref_model, ref_optim, rank, batches)
    ref_after = full_state(ref_model, ref_optim, mode)
    if rank == 0:
        torch.save({"loaded": loaded, "ref_loaded": ref_loaded, "losses": losses, "ref_losses": ref_losses,
                    "after": after, "ref_after": ref_after}, Path(out) / "result.pt")
    if mode != "fsdp2":
        # FSDP1 under gloo at 3 ranks sometimes aborts in process-group
        # teardown ("terminate called without an active exception") after
        # all the work is done; every rank has finished here.
        import os

        import torch.distributed as dist
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    migrated, full, ws, out, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    mode = sys.argv[6] if len(sys.argv) > 6 else "fsdp2"
    resume_runner.spawn(ws, worker, migrated, full, batches, out, mode)
