"""Resume check for tests/test_reshard_ranks.py (not a test).

    python tests/reshard_resume_fsdp1.py N OUT_DIR (KIND RESHARDED REFERENCE MODEL_TMPL OPTIM_TMPL)...

N gloo processes on CPU build the corpus Net and AdamW groups
(tools/make_checkpoints.py) under FSDP1 (use_orig_params=True; KIND "dt"
with a CPU device mesh, so state dicts hold DTensors; "st" without, so they
hold ShardedTensors), once per case and twice each:

  - one copy loads the per-rank files ckptconv wrote for this world size
    (MODEL_TMPL / OPTIM_TMPL with {r} = this rank) the way a training job
    does: model.load_state_dict under SHARDED_STATE_DICT and
    optim.load_state_dict(FSDP.optim_state_dict_to_load(...));
  - the other loads torch's FULL_STATE_DICT references
    (REFERENCE/model_full.pt, optim_full.pt) under FULL_STATE_DICT.

Both train three steps on the same batches. Rank 0 writes OUT_DIR/case<i>.pt:
the full state right after loading the resharded files ("loaded"), and the
losses and final full states of both runs. Before training, every rank of
the reference run also saves what FSDP1 itself writes at this world size
under SHARDED_STATE_DICT, OUT_DIR/case<i>_torch_{model,optim}_rank<r>.pt,
for the test to compare with ckptconv's files.

Only the N workers import torch (tests/resume_runner.py).
"""
import copy
import sys
from pathlib import Path

import resume_runner
from resume_runner import train



def fsdp():
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    return FSDP


mc = resume_runner.corpus


def build(kind: str, ws: int):
    mesh = None
    if kind == "dt":
        mesh = mc().cpu_mesh(ws)
    elif kind == "dt-named":  # as veRL makes it: one dimension named "fsdp"
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("fsdp",))
    model = mc().fsdp1_wrap(mc().fresh_model(), mesh)
    return model, mc().param_groups(model, "adamw")


def full_state(model, optim):
    """On rank 0, a copy (at world size 1 the full tensors are the parameters
    themselves, which training would change in place)."""
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    FSDP = fsdp()
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True),
                              # offload_to_cpu=False: see tools/make_checkpoints.py job_fsdp1
                              FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True)):
        state = {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optim)}
    return copy.deepcopy(state)


def load_resharded(kind, ws, rank, model_file, optim_file):
    import torch
    from torch.distributed.fsdp import StateDictType
    FSDP = fsdp()
    model, optim = build(kind, ws)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        model.load_state_dict(torch.load(model_file, weights_only=False))
        osd = torch.load(optim_file, weights_only=False)
        optim.load_state_dict(FSDP.optim_state_dict_to_load(model, optim, osd))
    return model, optim


def load_reference(kind, ws, reference):
    import torch
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    FSDP = fsdp()
    model, optim = build(kind, ws)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(rank0_only=False), FullOptimStateDictConfig(rank0_only=False)):
        model.load_state_dict(torch.load(Path(reference) / "model_full.pt", weights_only=True))
        osd = torch.load(Path(reference) / "optim_full.pt", weights_only=True)
        optim.load_state_dict(FSDP.optim_state_dict_to_load(model, optim, osd))
    return model, optim


def save_sharded(model, optim, out: Path, case: int, rank: int) -> None:
    import torch
    from torch.distributed.fsdp import StateDictType
    FSDP = fsdp()
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        torch.save(model.state_dict(), out / f"case{case}_torch_model_rank{rank}.pt")
        torch.save(FSDP.optim_state_dict(model, optim), out / f"case{case}_torch_optim_rank{rank}.pt")


def worker(rank: int, ws: int, out: str, cases) -> None:
    import torch
    import torch.distributed as dist
    for i, (kind, resharded, reference, model_tmpl, optim_tmpl) in enumerate(cases):
        model, optim = load_resharded(kind, ws, rank, Path(resharded) / model_tmpl.format(r=rank),
                                      Path(resharded) / optim_tmpl.format(r=rank))
        loaded = full_state(model, optim)
        losses = train(model, optim, rank)
        after = full_state(model, optim)
        ref_model, ref_optim = load_reference(kind, ws, reference)
        save_sharded(ref_model, ref_optim, Path(out), i, rank)
        ref_losses = train(ref_model, ref_optim, rank)
        ref_after = full_state(ref_model, ref_optim)
        # Every rank's losses: each trains on its own batch.
        gathered = [None] * ws if rank == 0 else None
        dist.gather_object((losses, ref_losses), gathered, dst=0)
        if rank == 0:
            torch.save({"loaded": loaded, "after": after, "ref_after": ref_after,
                        "losses": torch.stack([g[0] for g in gathered]),
                        "ref_losses": torch.stack([g[1] for g in gathered])},
                       Path(out) / f"case{i}.pt")
    # FSDP1 under gloo sometimes aborts in process-group teardown under load
    # ("terminate called without an active exception") after all the work is
    # done; once every rank is here, leave without it (as zero_fsdp_resume.py).
    import os
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    ws, out, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    if len(rest) % 5:
        sys.exit(__doc__)
    cases = [tuple(rest[i:i + 5]) for i in range(0, len(rest), 5)]
    resume_runner.spawn(ws, worker, out, cases)
