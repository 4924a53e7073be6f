"""Writes per-rank HSDP files for tests/test_fsdp_consolidate.py (not a test).

    python tests/hsdp_rank_writer.py OUT_DIR

Four gloo processes on CPU train the corpus Net (tools/make_checkpoints.py)
under FSDP2 fully_shard over a (replicate=2, shard=2) mesh, so every value is
a DTensor with placements (Replicate(), Shard(0)). Each rank saves
model.state_dict() as model_rank{r}.pt and the raw optim.state_dict()
(integer parameter ids, DTensor values) as optim_rank{r}.pt; rank 0 also
saves both with every DTensor made full (full_tensor()) as model_full.pt and
optim_full.pt, the references.
"""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import make_checkpoints as mc  # noqa: E402

WORLD_SIZE = 4


def full(v):
    if isinstance(v, dict):
        return type(v)((k, full(x)) for k, x in v.items())
    if isinstance(v, list):
        return [full(x) for x in v]
    return v.full_tensor() if hasattr(v, "full_tensor") else v


def job(rank: int, ws: int, port: int, out: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, ws // 2), mesh_dim_names=("replicate", "shard"))
    model = mc.fresh_model()
    for m in (model.emb, model.fc1, model.fc2):
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = mc.param_groups(model, "adamw")
    mc.train(model, optim, rank)
    msd, osd = model.state_dict(), optim.state_dict()
    torch.save(msd, f"{out}/model_rank{rank}.pt")
    torch.save(osd, f"{out}/optim_rank{rank}.pt")
    mfull, ofull = full(msd), full(osd)
    if rank == 0:
        torch.save(mfull, f"{out}/model_full.pt")
        torch.save(ofull, f"{out}/optim_full.pt")
    # gloo sometimes aborts in process-group teardown under load ("terminate
    # called without an active exception", SIGABRT) after all the work is
    # done: once every rank has written its files, leave without it.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    mp.spawn(job, args=(WORLD_SIZE, mc.free_port(), sys.argv[1]), nprocs=WORLD_SIZE)
