#!/usr/bin/env python3
"""Loads a universal checkpoint into a real DeepSpeed pipeline or MoE engine and trains one step.

Run by tests/test_ds_parallel_universal.py with the DeepSpeed side environment
(``.venv-deepspeed``; CPU, gloo), never by the project venv:

    .venv-deepspeed/bin/python tests/ds_parallel_universal_load.py CASE LOAD_DIR TAG PP DP OUT.pt [EP|TP]

(for a tensor-parallel case, PP is the tensor-parallel degree of the mpu loaded at;
for a pipeline x tensor-parallel case, the last argument is the tensor-parallel
degree, and PP x TP x DP ranks are spawned)

CASE is a case of tools/make_zero_parallel_checkpoints.py: its model
(``layer_specs()`` as a ``PipelineModule`` of PP stages, or ``MoENet`` at the
case's expert-parallel size, or EP), ds_config (with DP data-parallel ranks per
stage), optimizer groups and batches are imported from there, nothing is
copied. PP x DP ranks are spawned (MoE: PP is 1 and DP is the world size);
each builds the engine with ``"checkpoint": {"load_universal": true}`` and
calls ``engine.load_checkpoint(LOAD_DIR, tag=TAG)``. Rank 0 writes OUT.pt::

    {"loaded": {name: {"fp32", "exp_avg", "exp_avg_sq", "step"}},  # right after the load
     "after":  {name: {...}},   # after one more training step
     "losses": [per-rank loss of that step],
     "global_steps", "skipped_steps"}

Names are the ones reference_live.pt uses (pipeline: the PipelineModule's
``"<global layer>.<param>"``; MoE: experts by their global index). Values are
the live flat fp32 partitions and their AdamW state, all-gathered over each
optimizer group's own data-parallel group (the expert-data-parallel group for
expert groups) and cut at each parameter's offset, as the generator takes
its references.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import make_zero_parallel_checkpoints as gen  # noqa: E402
from make_zero_checkpoints import spawn  # noqa: E402


def gather_groups(engine, rename) -> dict:
    """{name: {fp32, exp_avg, exp_avg_sq, step}} of this rank's parameters, whole."""
    opt = engine.optimizer
    fqn_of = {id(p): rename(n) for n, p in engine.module.named_parameters()}
    got = {}
    for i, (lp_flat, part, ps) in enumerate(zip(opt.bit16_groups_flat, opt.single_partition_of_fp32_groups,
                                                opt.bit16_groups)):
        grp = opt.real_dp_process_group[i]
        st = opt.optimizer.state[part]
        full = {"fp32": gen._gather(part, grp), "exp_avg": gen._gather(st["exp_avg"], grp),
                "exp_avg_sq": gen._gather(st["exp_avg_sq"], grp)}
        for p in ps:
            off = p.data.storage_offset() - lp_flat.storage_offset()
            v = {k: f.narrow(0, off, p.numel()).view(p.shape).clone() for k, f in full.items()}
            v["step"] = st["step"].clone()
            got[fqn_of[id(p)]] = v
    return got


def merged(ws: int, mine: dict) -> dict:
    every = [None] * ws
    dist.all_gather_object(every, mine)
    out = {}
    for e in every:
        out.update(e)
    return out


def save_result(rank: int, ws: int, engine, loss, loaded: dict, after: dict, out: str) -> None:
    """What the test reads (rank 0 writes it): the state loaded, the state
    after one step, every rank's loss and the engine's step counters."""
    losses = [None] * ws
    dist.all_gather_object(losses, float(loss))
    if rank == 0:
        torch.save({"loaded": loaded, "after": after, "losses": losses, "global_steps": engine.global_steps,
                    "skipped_steps": engine.skipped_steps}, out)


def pipe_job(rank: int, ws: int, name: str, load_dir: str, tag: str, pp: int, dp: int, out: str, ep=None) -> None:
    import deepspeed
    from deepspeed.pipe import PipelineModule
    c = dict(gen.CASES[name], pp=pp, dp=dp)
    lp_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[c["dtype"]]
    torch.manual_seed(gen.SEED + 1)  # other initial values than the source's: the load must replace them
    net = PipelineModule(layers=gen.layer_specs(), num_stages=pp, loss_fn=gen.loss_fn,
                         partition_method="parameters", base_seed=gen.SEED + 1)
    cfg = dict(gen.ds_config(c), checkpoint={"load_universal": True})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
                                           config=cfg)
    engine.load_checkpoint(load_dir, tag=tag)
    loaded = merged(ws, gather_groups(engine, lambda n: n))
    loss = engine.train_batch(data_iter=gen.data_iter(engine.grid.get_data_parallel_rank(), lp_dtype))
    save_result(rank, ws, engine, loss, loaded, merged(ws, gather_groups(engine, lambda n: n)), out)


def moe_job(rank: int, ws: int, name: str, load_dir: str, tag: str, pp: int, dp: int, out: str, ep=None) -> None:
    import deepspeed
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from deepspeed.utils import groups
    c = dict(gen.CASES[name], dp=dp)
    c["ep"] = ep or c["ep"]
    lp_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[c["dtype"]]
    torch.manual_seed(gen.SEED + 1)
    net = gen.MoENet(c["ep"])
    params = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters()), "name": "dense"})
    cfg = dict(gen.ds_config(c), checkpoint={"load_universal": True})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=params, config=cfg)
    engine.load_checkpoint(load_dir, tag=tag)
    moe = [m for m in engine.module.modules() if isinstance(m, MoE)][0]
    expp_rank = groups._get_expert_parallel_rank(moe.expert_group_name)
    rename = lambda n: gen.global_expert_name(n, expp_rank, moe.num_local_experts)  # noqa: E731
    loaded = merged(ws, gather_groups(engine, rename))
    g = torch.Generator().manual_seed(1000 * gen.STEPS + rank)
    loss = engine(torch.randn(gen.MICRO_BATCH * 2, 6, generator=g).to(lp_dtype))
    engine.backward(loss)
    engine.step()
    save_result(rank, ws, engine, loss, loaded, merged(ws, gather_groups(engine, rename)), out)


def tpu_job(rank: int, ws: int, name: str, load_dir: str, tag: str, tp: int, dp: int, out: str, ep=None) -> None:
    """The Megatron-style tensor-parallel block at TP x DP through an mpu. Values
    are each tensor-parallel rank's whole (dp-gathered) ones merged as the
    generator merges the source's (gen.merged_reference), so they compare with
    reference_live.pt's merged values whatever the degree loaded at."""
    import deepspeed
    c = dict(gen.CASES[name], tp=tp, dp=dp)
    mpu = gen.TensorParallelMpu(tp)
    net = gen.MegatronTpBlock(mpu)
    cfg = dict(gen.ds_config(c), checkpoint={"load_universal": True})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg, mpu=mpu)
    engine.load_checkpoint(load_dir, tag=tag)
    info = gen.universal_checkpoint_info()

    def merged_now() -> dict:
        every = [None] * ws
        dist.all_gather_object(every, (mpu.tp_rank, mpu.dp_rank, gen.gather_tp_rank(engine)))
        ranks = [next(v for t, d, v in every if t == k and d == 0) for k in range(tp)]
        ref = gen.merged_reference(ranks, info)
        return {n: {"fp32": ref["model"][n], **ref["optim"][n]} for n in ref["model"]}

    loaded = merged_now()
    loss = engine(*gen.tpu_batch(gen.STEPS, mpu.dp_rank))
    engine.backward(loss)
    engine.step()
    save_result(rank, ws, engine, loss, loaded, merged_now(), out)


def pptp_job(rank: int, ws: int, name: str, load_dir: str, tag: str, pp: int, dp: int, out: str, tp=None) -> None:
    """The pipeline x tensor-parallel model (gen.build_pptp_engine) at PP x TP x
    DP. Values are merged as the generator merges the source's
    (gen.pptp_reference: stages joined, the tied embedding once, tensor-parallel
    ranks merged by the patterns), so they compare with reference_live.pt's
    whatever the degrees loaded at."""
    c = gen.CASES[name]
    cfg = dict(gen.ds_config(dict(c, dp=dp)), checkpoint={"load_universal": True})
    engine = gen.build_pptp_engine(pp, dp, tp, cfg)
    engine.load_checkpoint(load_dir, tag=tag)
    info = gen.pptp_info()

    def merged_now() -> dict:
        every = [None] * ws
        dist.all_gather_object(every, gen.pptp_rank_values(engine))
        ref = gen.pptp_reference(every, pp, tp, info)
        return {n: {"fp32": ref["model"][n], **ref["optim"][n]} for n in ref["model"]}

    loaded = merged_now()
    loss = engine.train_batch(data_iter=gen.pptp_data(engine.grid.get_data_parallel_rank()))
    save_result(rank, ws, engine, loss, loaded, merged_now(), out)


def main(argv) -> None:
    name, load_dir, tag, pp, dp, out, *extra = argv
    pp, dp = int(pp), int(dp)
    kind = gen.CASES[name]["kind"]
    job = {"pipe": pipe_job, "moe": moe_job, "tpu": tpu_job, "pptp": pptp_job}[kind]
    ranks = pp * dp * (int(extra[0]) if kind == "pptp" else 1)
    spawn(ranks, job, name, load_dir, tag, pp, dp, out, int(extra[0]) if extra else None)


if __name__ == "__main__":
    main(sys.argv[1:])
