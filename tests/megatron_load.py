"""Loads two torch_dist checkpoints with real megatron-core into a model built
at TP x PP x DP and compares what each rank got (run by tests/test_megatron.py
in the side environment .venv-megatron, which scripts/test makes).

    .venv-megatron/bin/python tests/megatron_load.py ORIGINAL OURS TP PP DP OUT.json [CASE.json]

Every rank builds the GPT of tools/make_megatron_checkpoints.py (with the
case's model_config: MoE experts and expert parallelism) at that
parallelism and runs ``dist_checkpointing.load`` of its model's sharded state
dict, and of the fully_reshardable optimizer's (is_loading=True), from
ORIGINAL (what megatron-core saved) and from OURS (what ckptconv wrote);
every loaded tensor must be bit-equal and every other loaded value
(common.pt's, the objects') equal. Rank 0 writes
{"ranks": N, "tensors": compared, "differ": [...]} to OUT.json."""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import make_megatron_checkpoints as mk  # noqa: E402


def flat(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from flat(v, f"{path}.{k}" if path else str(k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from flat(v, f"{path}.{i}")
    else:
        yield path, tree  # a tensor, or a plain value (iteration, _extra_state, param_groups entries)


def job(rank, ws, port, tp, pp, original, ours, out, extra):
    mk._init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    model, ddp, opt = mk.build(tp, pp, extra)
    for inner in opt.chained_optimizers:
        inner._init_optimizer_states_with_dummy_values()
    md = {"distrib_optim_sharding_type": "fully_reshardable"}

    def request():
        msd = model.sharded_state_dict()
        return {"model": msd, "optimizer": opt.sharded_state_dict(msd, is_loading=True, metadata=md)}

    a = dict(flat(dist_checkpointing.load(request(), original)))
    b = dict(flat(dist_checkpointing.load(request(), ours)))
    def same(x, y):
        if not isinstance(x, torch.Tensor):
            return type(x) is type(y) and x == y
        return (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
                and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)))

    differ = sorted(k for k in a if k not in b or not same(a[k], b[k]))
    differ += sorted(set(b) - set(a))
    results = [None] * ws
    dist.all_gather_object(results, {"tensors": len(a), "differ": differ})
    if rank == 0:
        Path(out).write_text(json.dumps({"ranks": ws, "tensors": sum(r["tensors"] for r in results),
                                         "differ": [d for r in results for d in r["differ"]]}))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    original, ours, tp, pp, dp, out = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6]
    extra = json.loads(Path(sys.argv[7]).read_text())["model_config"] if len(sys.argv) > 7 else {}
    ws = tp * pp * dp
    mp.spawn(job, args=(ws, mk.free_port(), tp, pp, original, ours, out, extra), nprocs=ws, join=True)
