#!/usr/bin/env python3
"""The FSDP2 side of tests/test_ds_universal.py's migration test (not a test).

    .venv-deepspeed/bin/python tests/fsdp_to_ds.py OUT_DIR

Two gloo processes on CPU train tools/make_zero_checkpoints.py's Net (the
model the DeepSpeed fixtures train: a frozen parameter, a tied pair, a
buffer) under FSDP2 ``fully_shard`` in fp32 with torch's AdamW and the
DeepSpeed cases' hyper-parameters (lr 1e-2, betas (0.9, 0.99), eps 1e-8,
weight_decay 0.01, one group of the trainable parameters), each rank on the
generator's batch(step, rank), as the DeepSpeed engines do. After three
steps it saves ``{"model", "optim"}`` from ``get_state_dict`` with
``dcp.save`` to OUT_DIR/dcp, then trains two more steps (batch(3, rank),
batch(4, rank)) and rank 0 writes OUT_DIR/fsdp_after.pt: {"model": {fqn:
full fp32 param}, "optim": {fqn: {"exp_avg", "exp_avg_sq", "step"}},
"losses": [[per-rank loss] per step]}.

The test converts OUT_DIR/dcp to a universal checkpoint with ckptconv and
resumes it in a DeepSpeed ZeRO-2 fp32 engine at the same world size
(tests/ds_universal_load.py) on the same two batches.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import make_zero_checkpoints as gen  # noqa: E402

WORLD_SIZE = 2


def full(model, optim):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    # collective; with cpu_offload only rank 0 gets the values
    msd, osd = get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return {}, {}
    return ({n: t.clone() for n, t in msd.items()},
            {n: {k: v.clone() for k, v in s.items()} for n, s in osd["state"].items()})


def worker(rank: int, ws: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(ws))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    try:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        model = gen.fresh_model()
        fully_shard(model, mesh=init_device_mesh("cpu", (ws,)))
        optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, betas=(0.9, 0.99),
                                  eps=1e-8, weight_decay=0.01)
        losses = []

        def step(s: int) -> None:
            optim.zero_grad()
            loss = model(gen.batch(s, rank))
            loss.backward()
            optim.step()
            per_rank = [None] * ws
            dist.all_gather_object(per_rank, float(loss))
            losses.append(per_rank)

        for s in range(3):
            step(s)
        msd, osd = get_state_dict(model, optim)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(Path(out) / "dcp"))
        losses.clear()
        for s in (3, 4):
            step(s)
        m, o = full(model, optim)
        if rank == 0:
            torch.save({"model": m, "optim": o, "losses": losses}, Path(out) / "fsdp_after.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(WORLD_SIZE, gen.free_port(), sys.argv[1]), nprocs=WORLD_SIZE, join=True)
