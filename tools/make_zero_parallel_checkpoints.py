#!/usr/bin/env python3
"""Write real DeepSpeed pipeline-parallel and MoE checkpoints for ckptconv's tests.

The data-parallel ZeRO cases are tools/make_zero_checkpoints.py's; this adds the
layouts DeepSpeed writes beyond data parallelism, starting with pipeline
parallelism (``deepspeed.pipe.PipelineModule``). Every file is written by real
DeepSpeed 0.19.8 (``engine.save_checkpoint``) on CPU: the ranks are spawned with
torch.multiprocessing in a gloo group, trained for 3 steps (``train_batch``)
with torch's AdamW and saved. Nothing is written by hand.

    .venv-deepspeed/bin/python tools/make_zero_parallel_checkpoints.py [--out testdata/zero_parallel] [--only CASE ...]

Each case folder ``<out>/<case>/`` holds the DeepSpeed checkpoint (``latest``,
``global_step3/``; the recovery scripts DeepSpeed copies in are deleted) and:

- ``reference_live.pt``: gathered from the live engines after step 3, keyed by
  the names PipelineModule's own ``state_dict()`` gives (``"<global layer
  index>.<param>"``, the names ``load_state_dir`` maps the layer files back to):
  ``{"model": {name: fp32 master}, "optim": {name: {exp_avg, exp_avg_sq, step}},
  "lp": {name: live low-precision value}, "stage_of": {name: pipeline stage},
  "module_state": {name: the stage modules' live state_dict() entry, frozen
  parameters and buffers included}}``.
  Masters and moments come from ``deepspeed.utils.safe_get_full_fp32_param`` /
  ``safe_get_full_optimizer_state`` on the stage that owns the parameter,
  checked against the live flat partitions all-gathered over the stage's
  data-parallel group.
  MoE cases (``moe_*``, a ``deepspeed.moe.layer.MoE`` of 4 experts over 2
  expert-parallel ranks) key the same entries by the names DeepSpeed gives
  the expert files (global expert index = expert-parallel rank x local
  experts + local index) in the module's order; their values are the live
  flat partitions all-gathered over each group's own data-parallel group
  (``safe_get_full_optimizer_state`` raises for the expert group), the
  masters checked against ``safe_get_full_fp32_param``.
- ``reference_model.pt`` (tp2_dp2_fp32_ws4_ucinfo: its merged ``model``): ``module_state`` with the trainable entries replaced
  by their fp32 masters, flat ``{name: tensor}`` (what ``consolidate --only
  model`` gives).
- ``tp2_fp32_ws2`` (tensor parallelism through an ``mpu``, no
  universal_checkpoint_info) keeps only each tensor-parallel rank's own
  masters, ``{"tp_ranks": [{name: fp32}, ...]}``: ckptconv reads each rank as
  its own part.
- ``tp2_dp2_fp32_ws4_ucinfo`` (TP2 x DP2, a Megatron-style block saved with
  Megatron-DeepSpeed's universal_checkpoint_info): ``{"tp_ranks": [{name:
  {fp32, exp_avg, exp_avg_sq, step}}], "model": {name: merged fp32}, "optim":
  {name: merged state}, "universal_checkpoint_info": ...}``, the merge written
  here in torch (``merge_tp``) as ds_to_universal.py's merge_tp_slices does it.
- ``case.json``: the case, topology, ds_config, versions, files and sizes.

Self-checks: the file names per stage (MoE: per expert) (``layer_LL-model_TT-model_states.pt``,
``mp_rank_SS_model_states.pt``, ``[bf16_]zero_pp_rank_D_mp_rank_SS_optim_states.pt``)
and that the layer files hold the live lp values.

CPU only; about 20-40 s per case on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_zero_checkpoints import all_gather_cat, plain, spawn  # noqa: E402

SEED = 0
STEPS = 3
MICRO_BATCH = 2
TAG = f"global_step{STEPS}"


def square(x: torch.Tensor) -> torch.Tensor:
    """A layer without parameters: it has no layer file, and its index is skipped."""
    return x * x


class Head(nn.Module):
    """A layer with a trainable projection, a frozen one and a persistent buffer:
    its layer file holds all three, param_shapes only the trainable one."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(11, 5)
        self.gate = nn.Linear(5, 5, bias=False)
        self.gate.weight.requires_grad_(False)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 5), persistent=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return (h + self.gate(h)) * self.scale.to(h.dtype)


def layer_specs():
    """Six layers, split by parameter count over the stages. Index 2 holds no
    parameters (a plain function), so the layer files are numbered 00 01 03 04 05;
    row counts 7, 11 and 5 do not divide by the data-parallel sizes. Layer 4 has a
    frozen parameter and a buffer."""
    from deepspeed.pipe import LayerSpec
    return [
        LayerSpec(nn.Linear, 6, 7),
        LayerSpec(nn.Linear, 7, 11, bias=False),
        square,
        LayerSpec(nn.LayerNorm, 11),
        LayerSpec(Head),
        LayerSpec(nn.Linear, 5, 3, bias=False),
    ]


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out.float() - target.float()).pow(2).mean()


CASES = {
    "pp2_fp32_ws2": dict(kind="pipe", pp=2, dp=1, dtype="fp32", stage=1,
                         exercises="pipeline 2 stages x 1 data-parallel rank, fp32, ZeRO-1"),
    "pp2_dp2_bf16_ws4": dict(kind="pipe", pp=2, dp=2, dtype="bf16", stage=1,
                             exercises="pipeline 2 stages x 2 data-parallel ranks, bf16, ZeRO-1: "
                                       "bf16_ optim prefix, each stage's masters split over its dp group"),
    "pp2_z0_fp32_ws2": dict(kind="pipe", pp=2, dp=1, dtype="fp32", stage=0,
                            exercises="pipeline 2 stages x 1 data-parallel rank, fp32, without ZeRO (stage 0): "
                                      "each stage's torch AdamW state_dict under `optimizer` in its "
                                      "mp_rank_SS_model_states.pt, no optimizer files"),
    "moe_z2_bf16_ws4_ep2": dict(kind="moe", pp=1, dp=4, ep=2, dtype="bf16", stage=2,
                                exercises="MoE, 4 experts over 2 expert-parallel ranks, 4 data-parallel ranks, bf16, "
                                          "ZeRO-2: expert groups partitioned over expert-data-parallel groups of 2"),
    "tp2_fp32_ws2": dict(kind="tp", pp=1, dp=1, tp=2, dtype="fp32", stage=1,
                         exercises="tensor parallelism through an mpu (Megatron's interface), 2 ranks, ZeRO-1: "
                                   "mp_rank_01 files; what ckptconv refuses"),
    "tp2_dp2_fp32_ws4_ucinfo": dict(kind="tpu", pp=1, dp=2, tp=2, dtype="fp32", stage=1,
                                    exercises="tensor parallelism 2 x data parallelism 2 through an mpu, ZeRO-1, "
                                              "the model recording Megatron-DeepSpeed's universal_checkpoint_info "
                                              "patterns (vocabulary, TP-replicated, to-average, row-parallel, two "
                                              "sub-parameters, default column-parallel)"),
    "tp1_dp2_fp32_ws2_ucinfo": dict(kind="tpu", pp=1, dp=2, tp=1, dtype="fp32", stage=1,
                                    exercises="the same block at tensor-parallel degree 1 (one mp_rank_00), 2 "
                                              "data-parallel ranks: universal_checkpoint_info recorded without a "
                                              "second tensor-parallel rank, as Megatron-DeepSpeed saves at TP 1"),
    "moe_z1_fp32_ws2_ep2": dict(kind="moe", pp=1, dp=2, ep=2, dtype="fp32", stage=1,
                                exercises="MoE, 4 experts over 2 expert-parallel ranks, fp32, ZeRO-1: each expert "
                                          "group held whole by one rank"),
    "pp2_tp2_dp2_fp32_ws8_ucinfo": dict(kind="pptp", pp=2, dp=2, tp=2, dtype="fp32", stage=1,
                                    exercises="pipeline 2 stages x tensor parallelism 2 x data parallelism 2 (PipeModelDataParallelTopology, "
                                              "the Megatron-DeepSpeed / BLOOM layout), ZeRO-1: layer_LL-model_TT files, "
                                              "mp_rank = stage x 2 + tp rank, a vocabulary-parallel embedding tied "
                                              "(TiedLayerSpec) between the first and last stage, Megatron-DeepSpeed's "
                                              "universal_checkpoint_info patterns"),
    "pp2_tp1_dp1_fp32_ws2_ucinfo": dict(kind="pptp", pp=2, dp=1, tp=1, dtype="fp32", stage=1,
                                        exercises="the same model at tensor parallelism 1 (2 stages, 1 data-parallel "
                                                  "rank): universal_checkpoint_info recorded without a second "
                                                  "tensor-parallel rank, as Megatron-DeepSpeed saves at TP 1"),
}


class MoENet(nn.Module):
    """A dense layer, a DeepSpeed MoE layer of 4 Linear(8, 8) experts (top-1
    gate, no token dropping limit below the batch), a dense head."""

    def __init__(self, ep: int) -> None:
        super().__init__()
        from deepspeed.moe.layer import MoE
        self.inp = nn.Linear(6, 8)
        self.moe = MoE(hidden_size=8, expert=nn.Linear(8, 8), num_experts=4, ep_size=ep, k=1, min_capacity=0)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _, _ = self.moe(torch.tanh(self.inp(x)))
        return self.out(h).float().pow(2).mean()


def ds_config(c) -> dict:
    gas = 1 if c["kind"] in ("moe", "tp", "tpu") else 2
    if c["kind"] == "pptp":
        gas = 2
    cfg = {
        "train_batch_size": MICRO_BATCH * gas * c["dp"],
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "steps_per_print": 1000000,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1e-2, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01,
                                 "torch_adam": True}},
        "zero_optimization": {"stage": c["stage"]},
    }
    if c["dtype"] == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def data_iter(rank_in_dp: int, dtype):
    step = 0
    while True:
        g = torch.Generator().manual_seed(1000 * step + rank_in_dp)
        yield torch.randn(MICRO_BATCH, 6, generator=g).to(dtype), torch.randn(MICRO_BATCH, 3, generator=g)
        step += 1


class TensorParallelMpu:
    """Megatron's mpu interface: tensor-parallel groups of `tp` consecutive
    ranks (rank = dp_rank * tp + tp_rank, Megatron's order) and data-parallel
    groups of the ranks with one tp_rank; what deepspeed.initialize(mpu=...)
    reads to name mp_rank_TT files and to partition ZeRO over the dp group.
    tp None: one tensor-parallel group of every rank."""

    def __init__(self, tp: int | None = None) -> None:
        ws = dist.get_world_size()
        self.tp_size = tp or ws
        self.dp_size = ws // self.tp_size
        rank = dist.get_rank()
        self.tp_rank, self.dp_rank = rank % self.tp_size, rank // self.tp_size
        # every rank creates every group, in one order (torch.distributed's rule)
        tps = [dist.new_group([d * self.tp_size + t for t in range(self.tp_size)]) for d in range(self.dp_size)]
        dps = [dist.new_group([d * self.tp_size + t for d in range(self.dp_size)]) for t in range(self.tp_size)]
        self.tp, self.dp = tps[self.dp_rank], dps[self.tp_rank]

    def get_model_parallel_rank(self):
        return self.tp_rank

    def get_model_parallel_world_size(self):
        return self.tp_size

    def get_model_parallel_group(self):
        return self.tp

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self):
        return self.dp_rank

    def get_data_parallel_world_size(self):
        return self.dp_size

    def get_data_parallel_group(self):
        return self.dp


class TpShard(nn.Module):
    """One rank's shards of a column-parallel Linear(6, 8) (`col`: 4 of its 8
    output rows) and of the row-parallel Linear(8, 3) after it (`out`: 4 of
    its 8 input columns); the shards differ per rank (seeded by rank)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        torch.manual_seed(SEED + rank)
        self.col = nn.Linear(6, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.col(x))).pow(2).mean()


def tp_job(rank: int, ws: int, out: str, name: str) -> None:
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param
    c = CASES[name]
    d = Path(out) / name
    net = TpShard(rank)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config(c),
                                           mpu=TensorParallelMpu())
    for step in range(STEPS):
        loss = engine(torch.randn(MICRO_BATCH, 6, generator=torch.Generator().manual_seed(1000 * step)))
        engine.backward(loss)
        engine.step()
    if rank == 0 and d.exists():
        shutil.rmtree(d)
    dist.barrier()
    engine.save_checkpoint(str(d))
    dist.barrier()
    # each tensor-parallel rank's own masters (dp 1: the partition is the whole)
    mine = {n: safe_get_full_fp32_param(p).detach().clone() for n, p in engine.module.named_parameters()}
    every = [None] * ws
    dist.all_gather_object(every, mine)
    if rank != 0:
        return
    torch.save({"tp_ranks": every}, d / "reference_live.pt")
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    info = {"case": name, "kind": "tp", "world_size": ws, "tensor_parallel": c["tp"], "dtype": c["dtype"],
            "zero_stage": c["stage"], "exercises": c["exercises"], "ds_config": ds_config(c),
            "ds_version": deepspeed.__version__, "torch_version": torch.__version__, "seed": SEED,
            "steps": STEPS, "tag": TAG, "files": files, "removed": ["zero_to_fp32.py", "zero_to_torch.py"],
            "patches": ["deepspeed.comm.torch.build_shm_op -> None (optional shared-memory allreduce op)"],
            "generator": "tools/make_zero_parallel_checkpoints.py"}
    (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")



# Megatron-DeepSpeed's pattern keys (deepspeed/checkpoint/constants.py), by value
UCI_VERSION = "universal_checkpoint_version"
VOCAB_PATTERNS = "vocabulary_parameter_patterns"
TP_REPLICATED = "tp_replicated_parameter_patterns"
TO_AVERAGE = "parameter_to_average_patterns"
ROW_PARALLEL = "parameter_with_row_parallelism_patterns"
TWO_SUB_PARAMS = "parameter_with_2_sub_params_cat_dim_0"
VOCAB, PADDED_VOCAB, HIDDEN, FFN, PROJ, OUT = 10, 12, 6, 6, 4, 4


def universal_checkpoint_info() -> dict:
    """What Megatron-DeepSpeed's save_checkpoint puts in client_state under
    UNIVERSAL_CHECKPOINT_INFO (megatron/checkpointing.py _universal_checkpoint_info
    and GPTModel.universal_checkpoint_info): the vocabulary sizes and, per
    category, the patterns (re.match) of the parameters ds_to_universal merges
    that way; any other parameter is concatenated on dim 0."""
    return {UCI_VERSION: 0.2, "original_vocab_size": VOCAB, "padded_vocab_size": PADDED_VOCAB,
            VOCAB_PATTERNS: [r"embed\.weight"],
            TP_REPLICATED: [r"norm\.weight", r"out\.bias"],
            TO_AVERAGE: [r"norm\.bias"],
            ROW_PARALLEL: [r"out\.weight", r"out2\.weight"],
            TWO_SUB_PARAMS: [r"h_to_4h\.weight"]}


class _ReduceFromTp(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _CopyToTp(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


def full_tp_weights() -> dict:
    """The unsplit model, seeded: every tensor-parallel rank cuts its shards from it."""
    g = torch.Generator().manual_seed(SEED)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.5  # noqa: E731
    return {"embed.weight": r(PADDED_VOCAB, HIDDEN), "norm.weight": 1 + 0.1 * r(HIDDEN), "norm.bias": 0.1 * r(HIDDEN),
            "gate": r(FFN, HIDDEN), "up": r(FFN, HIDDEN), "proj.weight": r(PROJ, HIDDEN), "proj.bias": r(PROJ),
            "out.weight": r(OUT, FFN), "out.bias": r(OUT), "out2.weight": r(OUT, PROJ)}


class MegatronTpBlock(nn.Module):
    """One tensor-parallel rank of a Megatron-style block: a vocabulary-parallel
    embedding (rows of the padded vocabulary), a replicated LayerNorm, a
    column-parallel SwiGLU h_to_4h (this rank's gate rows, then its up rows: two
    sub-parameters), a column-parallel proj, and row-parallel out (of the
    SwiGLU, with a replicated bias) and out2 (of proj), each holding this
    rank's input columns. The collectives are Megatron's, so the replicated
    parameters get the same gradients on every tensor-parallel rank, and the
    model at any degree computes the same function of the merged weights."""

    def __init__(self, mpu: "TensorParallelMpu") -> None:
        super().__init__()
        self.mpu = mpu
        t, n = mpu.tp_rank, mpu.tp_size
        w = full_tp_weights()
        rows = lambda x, k: x.chunk(n, dim=0)[k]  # noqa: E731
        self.embed = nn.Embedding(PADDED_VOCAB // n, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.h_to_4h = nn.Linear(HIDDEN, 2 * FFN // n, bias=False)
        self.proj = nn.Linear(HIDDEN, PROJ // n)
        self.out = nn.Linear(FFN // n, OUT)
        self.out2 = nn.Linear(PROJ // n, OUT, bias=False)
        with torch.no_grad():
            self.embed.weight.copy_(rows(w["embed.weight"], t))
            self.norm.weight.copy_(w["norm.weight"])
            self.norm.bias.copy_(w["norm.bias"])
            self.h_to_4h.weight.copy_(torch.cat([rows(w["gate"], t), rows(w["up"], t)]))
            self.proj.weight.copy_(rows(w["proj.weight"], t))
            self.proj.bias.copy_(rows(w["proj.bias"], t))
            self.out.weight.copy_(w["out.weight"].chunk(n, dim=1)[t])
            self.out.bias.copy_(w["out.bias"])
            self.out2.weight.copy_(w["out2.weight"].chunk(n, dim=1)[t])
        # how Megatron-DeepSpeed records it: save_checkpoint's client_state (see tpu_job)

    def forward(self, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        group, rows = self.mpu.tp, self.embed.weight.shape[0]
        lo = self.mpu.tp_rank * rows
        mine = (tokens >= lo) & (tokens < lo + rows)
        e = self.embed((tokens - lo) * mine) * mine.unsqueeze(-1)
        x = _CopyToTp.apply(self.norm(_ReduceFromTp.apply(e, group)), group)
        gate, up = self.h_to_4h(x).chunk(2, dim=-1)
        partial = (nn.functional.linear(nn.functional.silu(gate) * up, self.out.weight)
                   + nn.functional.linear(torch.tanh(self.proj(x)), self.out2.weight))
        y = _ReduceFromTp.apply(partial, group) + self.out.bias
        return (y - target).pow(2).mean()


def tpu_batch(step: int, dp_rank: int):
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    return torch.randint(0, VOCAB, (MICRO_BATCH * 2,), generator=g), torch.randn(MICRO_BATCH * 2, OUT, generator=g)


def merge_tp(name: str, slices: list, info: dict) -> torch.Tensor:
    """The tensor-parallel slices of one parameter (or of one of its Adam
    moments) as ds_to_universal.py's merge_tp_slices merges them, written
    here independently of both ckptconv and DeepSpeed: replicated and
    averaged ones must be equal (one copy), two sub-parameters cat per half on
    dim 0, row-parallel cat on dim 1, the rest on dim 0; the vocabulary's
    padding rows cut off."""
    import re
    hit = lambda key: any(re.match(p, name) for p in info.get(key, []))  # noqa: E731
    if hit(TP_REPLICATED) or hit(TO_AVERAGE):
        assert all(torch.equal(s, slices[0]) for s in slices[1:]), (name, "replicas differ")
        out = slices[0]
    elif hit(TWO_SUB_PARAMS):
        halves = [s.chunk(2, dim=0) for s in slices]
        out = torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    else:
        out = torch.cat(slices, dim=1 if hit(ROW_PARALLEL) else 0)
    if hit(VOCAB_PATTERNS):
        out = out[:info["original_vocab_size"]]
    return out.clone()


def gather_tp_rank(engine) -> dict:
    """This rank's parameters, whole over its data-parallel group: the live
    flat fp32 partition and AdamW state all-gathered over the dp group and cut
    at each parameter's offset, checked against safe_get_full_fp32_param and
    safe_get_full_optimizer_state."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    opt = engine.optimizer
    fqn_of = {id(p): n for n, p in engine.module.named_parameters()}
    got = {}
    for i, (lp_flat, part, ps) in enumerate(zip(opt.bit16_groups_flat, opt.single_partition_of_fp32_groups,
                                                opt.bit16_groups)):
        grp = opt.real_dp_process_group[i]
        st = opt.optimizer.state[part]
        full = {"fp32": _gather(part, grp), "exp_avg": _gather(st["exp_avg"], grp),
                "exp_avg_sq": _gather(st["exp_avg_sq"], grp)}
        for p in ps:
            off = p.data.storage_offset() - lp_flat.storage_offset()
            v = {k: f.narrow(0, off, p.numel()).view(p.shape).clone() for k, f in full.items()}
            v["step"] = st["step"].clone()
            got[fqn_of[id(p)]] = v
    for n, p in engine.module.named_parameters():
        assert torch.equal(safe_get_full_fp32_param(p).detach().view(p.shape), got[n]["fp32"]), n
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(safe_get_full_optimizer_state(p, k).detach().view(p.shape), got[n][k]), (n, k)
    return got


def merged_reference(every: list, info: dict) -> dict:
    """{"model": {name: merged fp32}, "optim": {name: {step, exp_avg, exp_avg_sq}}}
    from each tensor-parallel rank's whole values (every[t])."""
    ref = {"model": {}, "optim": {}}
    for n in every[0]:
        ref["model"][n] = merge_tp(n, [e[n]["fp32"] for e in every], info)
        ref["optim"][n] = {"step": every[0][n]["step"],
                           **{k: merge_tp(n, [e[n][k] for e in every], info) for k in ("exp_avg", "exp_avg_sq")}}
        assert all(torch.equal(e[n]["step"], every[0][n]["step"]) for e in every), n
    return ref


def tpu_job(rank: int, ws: int, out: str, name: str) -> None:
    import deepspeed
    c = CASES[name]
    d = Path(out) / name
    mpu = TensorParallelMpu(c["tp"])
    net = MegatronTpBlock(mpu)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=ds_config(c), mpu=mpu)
    for step in range(STEPS):
        loss = engine(*tpu_batch(step, mpu.dp_rank))
        engine.backward(loss)
        engine.step()
    if rank == 0 and d.exists():
        shutil.rmtree(d)
    dist.barrier()
    info = universal_checkpoint_info()
    engine.save_checkpoint(str(d), client_state={"universal_checkpoint_info": info})
    dist.barrier()
    mine = gather_tp_rank(engine)
    every = [None] * ws
    dist.all_gather_object(every, {"tp_rank": mpu.tp_rank, "dp_rank": mpu.dp_rank, "values": mine})
    if rank != 0:
        return
    tp_ranks = [next(e["values"] for e in every if e["tp_rank"] == t and e["dp_rank"] == 0) for t in range(c["tp"])]
    ref = merged_reference(tp_ranks, info)
    ref["tp_ranks"] = tp_ranks
    ref["universal_checkpoint_info"] = info
    torch.save(ref, d / "reference_live.pt")
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    meta = {"case": name, "kind": "tpu", "world_size": ws, "tensor_parallel": c["tp"], "data_parallel": c["dp"],
            "dtype": c["dtype"], "zero_stage": c["stage"], "exercises": c["exercises"], "ds_config": ds_config(c),
            "universal_checkpoint_info": info, "ds_version": deepspeed.__version__,
            "torch_version": torch.__version__, "seed": SEED, "steps": STEPS, "tag": TAG,
            "names": {n: plain(list(t.shape)) for n, t in ref["model"].items()}, "files": files,
            "removed": ["zero_to_fp32.py", "zero_to_torch.py"],
            "patches": ["deepspeed.comm.torch.build_shm_op -> None (optional shared-memory allreduce op)"],
            "generator": "tools/make_zero_parallel_checkpoints.py"}
    (d / "case.json").write_text(json.dumps(meta, indent=1) + "\n")


# ---- pipeline x tensor parallelism (Megatron-DeepSpeed's GPTModelPipe layout, in small) ----

PIPELINE_REPLICATED = "pipeline_replicated_parameter_patterns"


class PipeTp:
    """This rank's tensor-parallel rank, degree and group in a
    PipeModelDataParallelTopology (axes pipe, data, model: rank = (s x dp + d)
    x tp + t), made before the PipelineModule so its layers can use it (the
    module builds its own grid, with the same ranks, inside its constructor)."""

    def __init__(self, pp: int, dp: int, tp: int) -> None:
        rank = dist.get_rank()
        self.tp_size, self.tp_rank = tp, rank % tp
        groups = [dist.new_group([(s * dp + d) * tp + t for t in range(tp)]) for s in range(pp) for d in range(dp)]
        self.tp = groups[rank // tp]


PIPE_TP: PipeTp | None = None  # set in each rank before the layers are built


class _GatherFromTp(torch.autograd.Function):
    """Megatron's gather_from_tensor_model_parallel_region on the last dim:
    all-gather forward, this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(PIPE_TP.tp_size)]
        dist.all_gather(parts, x.contiguous(), group=PIPE_TP.tp)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, g):
        return g.chunk(PIPE_TP.tp_size, dim=-1)[PIPE_TP.tp_rank].contiguous()


def full_pptp_weights() -> dict:
    """The unsplit model, seeded: every (stage, tensor-parallel rank) cuts its shards from it."""
    g = torch.Generator().manual_seed(SEED)
    r = lambda *shape: torch.randn(*shape, generator=g) * 0.5  # noqa: E731
    w = {"embed": r(PADDED_VOCAB, HIDDEN)}
    for layer in (1, 2):
        w.update({f"{layer}.norm.weight": 1 + 0.1 * r(HIDDEN), f"{layer}.norm.bias": 0.1 * r(HIDDEN),
                  f"{layer}.gate": r(FFN, HIDDEN), f"{layer}.up": r(FFN, HIDDEN), f"{layer}.out.weight": r(HIDDEN, FFN),
                  f"{layer}.out.bias": r(HIDDEN)})
    return w


class VocabEmbed(nn.Module):
    """A vocabulary-parallel embedding (this rank's rows of the padded
    vocabulary), tied between the first stage (lookup) and the last (the
    output projection, `lm_head`)."""

    def __init__(self) -> None:
        super().__init__()
        n, t = PIPE_TP.tp_size, PIPE_TP.tp_rank
        self.weight = nn.Parameter(full_pptp_weights()["embed"].chunk(n, dim=0)[t].clone())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = self.weight.shape[0]
        lo = PIPE_TP.tp_rank * rows
        mine = (tokens >= lo) & (tokens < lo + rows)
        e = nn.functional.embedding((tokens - lo) * mine, self.weight) * mine.unsqueeze(-1)
        return _ReduceFromTp.apply(e, PIPE_TP.tp)


def lm_head(embed: VocabEmbed, h: torch.Tensor) -> torch.Tensor:
    """The tied embedding as the output layer: this rank's vocabulary columns, gathered."""
    return _GatherFromTp.apply(nn.functional.linear(_CopyToTp.apply(h, PIPE_TP.tp), embed.weight))


class TpBlock(nn.Module):
    """A Megatron-style residual MLP block at one tensor-parallel rank: a
    replicated LayerNorm (its bias averaged), a column-parallel SwiGLU h_to_4h
    (this rank's gate rows, then its up rows: two sub-parameters) and a
    row-parallel out with a replicated bias."""

    def __init__(self, layer: int) -> None:
        super().__init__()
        n, t = PIPE_TP.tp_size, PIPE_TP.tp_rank
        w = full_pptp_weights()
        self.norm = nn.LayerNorm(HIDDEN)
        self.h_to_4h = nn.Linear(HIDDEN, 2 * FFN // n, bias=False)
        self.out = nn.Linear(FFN // n, HIDDEN)
        with torch.no_grad():
            self.norm.weight.copy_(w[f"{layer}.norm.weight"])
            self.norm.bias.copy_(w[f"{layer}.norm.bias"])
            self.h_to_4h.weight.copy_(torch.cat([w[f"{layer}.gate"].chunk(n)[t], w[f"{layer}.up"].chunk(n)[t]]))
            self.out.weight.copy_(w[f"{layer}.out.weight"].chunk(n, dim=1)[t])
            self.out.bias.copy_(w[f"{layer}.out.bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _CopyToTp.apply(self.norm(x), PIPE_TP.tp)
        gate, up = self.h_to_4h(y).chunk(2, dim=-1)
        partial = nn.functional.linear(nn.functional.silu(gate) * up, self.out.weight)
        return x + _ReduceFromTp.apply(partial, PIPE_TP.tp) + self.out.bias


def pptp_layer_specs():
    """GPTModelPipe's shape: the embedding (tied), two blocks, a final
    LayerNorm (replicated), the tied embedding as the head. Uniform partition
    puts layers 0-2 on stage 0 and 3-4 on stage 1. ds_to_universal.py's
    DeepSpeedCheckpoint takes the layer files between the first and the last
    as transformer layers, at least one per stage (else it divides by zero)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec
    return [TiedLayerSpec("embed", VocabEmbed), LayerSpec(TpBlock, 1), LayerSpec(TpBlock, 2),
            LayerSpec(nn.LayerNorm, HIDDEN), TiedLayerSpec("embed", VocabEmbed, forward_fn=lm_head)]


def pptp_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits[:, :VOCAB].float(), target)


def pptp_info() -> dict:
    """Megatron-DeepSpeed's universal_checkpoint_info for these names
    (GPTModelPipe records the same categories: the tied word embedding as a
    vocabulary and pipeline-replicated parameter)."""
    return {UCI_VERSION: 0.2, "original_vocab_size": VOCAB, "padded_vocab_size": PADDED_VOCAB,
            VOCAB_PATTERNS: [r"tied_modules\.embed\.weight"],
            PIPELINE_REPLICATED: [r"tied_modules\.embed\.weight"],
            TP_REPLICATED: [r"\d+\.norm\.weight", r"\d+\.out\.bias", r"\d+\.weight", r"\d+\.bias"],
            TO_AVERAGE: [r"\d+\.norm\.bias"],
            ROW_PARALLEL: [r"\d+\.out\.weight"],
            TWO_SUB_PARAMS: [r"\d+\.h_to_4h\.weight"]}


def pptp_data(dp_rank: int):
    step = 0
    while True:
        g = torch.Generator().manual_seed(1000 * step + dp_rank)
        yield torch.randint(0, VOCAB, (MICRO_BATCH,), generator=g), torch.randint(0, VOCAB, (MICRO_BATCH,), generator=g)
        step += 1


def build_pptp_engine(pp: int, dp: int, tp: int, config: dict):
    """A PipelineEngine of the pptp model at PP x DP x TP (used by the
    universal-checkpoint loading test too)."""
    global PIPE_TP
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    PIPE_TP = PipeTp(pp, dp, tp)
    net = PipelineModule(layers=pptp_layer_specs(), topology=PipeModelDataParallelTopology(num_pp=pp, num_mp=tp,
                                                                                           num_dp=dp),
                         loss_fn=pptp_loss, partition_method="uniform")
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=[p for p in net.parameters()],
                                           config=config)
    return engine


def pptp_reference(every: list, pp: int, tp: int, info: dict) -> dict:
    """merged_reference of a pipeline at `tp` tensor-parallel ranks: per
    tensor-parallel rank, its stages' values (every[i]: one rank's
    {"stage", "tp_rank", "dp_rank", "mp_rank", "values", "order"}) in stage
    order, the tied embedding once (the stages' copies must be equal: its
    gradient is all-reduced over the tied stages), then merged over the
    tensor-parallel ranks; "tp_ranks" the per-rank values."""
    tp_ranks = []
    for t in range(tp):
        vals = {}
        for s in range(pp):
            e = next(e for e in every if e["stage"] == s and e["tp_rank"] == t and e["dp_rank"] == 0)
            assert e["mp_rank"] == s * tp + t, e["mp_rank"]
            for n in e["order"]:
                v = e["values"][n]
                if n in vals:
                    assert all(torch.equal(vals[n][k], v[k]) for k in v), (n, "tied copies differ")
                    continue
                vals[n] = v
        tp_ranks.append(vals)
    ref = merged_reference(tp_ranks, info)
    ref["tp_ranks"] = tp_ranks
    return ref


def pptp_rank_values(engine) -> dict:
    """What pptp_reference takes from each rank of a pptp engine."""
    grid = engine.grid
    mine = gather_tp_rank(engine)
    for n, p in engine.module.named_parameters():
        mine[n]["lp"] = p.data.detach().clone()
    return {"stage": grid.get_stage_id(), "tp_rank": grid.get_slice_parallel_rank(),
            "dp_rank": grid.get_data_parallel_rank(), "mp_rank": grid.get_model_parallel_rank(), "values": mine,
            "order": list(mine)}


def pptp_job(rank: int, ws: int, out: str, name: str) -> None:
    import deepspeed
    c = CASES[name]
    d = Path(out) / name
    engine = build_pptp_engine(c["pp"], c["dp"], c["tp"], ds_config(c))
    grid = engine.grid
    it = pptp_data(grid.get_data_parallel_rank())
    for _ in range(STEPS):
        engine.train_batch(data_iter=it)
    assert engine.global_steps == STEPS
    if rank == 0 and d.exists():
        shutil.rmtree(d)
    dist.barrier()
    info = pptp_info()
    engine.save_checkpoint(str(d), client_state={"universal_checkpoint_info": info})
    dist.barrier()
    every = [None] * ws
    dist.all_gather_object(every, pptp_rank_values(engine))
    if rank != 0:
        return
    ref = pptp_reference(every, c["pp"], c["tp"], info)
    tp_ranks = ref["tp_ranks"]
    ref["universal_checkpoint_info"] = info
    ref["stages"] = {n: sorted({e["stage"] for e in every if n in e["values"]}) for n in tp_ranks[0]}
    torch.save(ref, d / "reference_live.pt")
    tagdir = d / TAG
    # the head (layer 4) is the tied module called through forward_fn, a
    # functools.partial with no state_dict: PipelineModule.save_state_dict
    # writes no file for it, so the last stage has no copy of the embedding
    # but its optimizer's (as in Megatron-DeepSpeed's GPTModelPipe)
    want = sorted([f"layer_{i:02d}-model_{t:02d}-model_states.pt" for i in range(4) for t in range(c["tp"])]
                  + [f"mp_rank_{m:02d}_model_states.pt" for m in range(c["pp"] * c["tp"])]
                  + [f"zero_pp_rank_{r}_mp_rank_{m:02d}_optim_states.pt" for m in range(c["pp"] * c["tp"])
                     for r in range(c["dp"])])
    got = sorted(p.name for p in tagdir.iterdir())
    assert got == want, (got, want)
    for t in range(c["tp"]):  # layer 0's file holds the tied embedding's live lp value
        sd = torch.load(tagdir / f"layer_00-model_{t:02d}-model_states.pt", weights_only=True)
        assert list(sd) == ["weight"] and torch.equal(sd["weight"], tp_ranks[t]["tied_modules.embed.weight"]["lp"])
        for i in (1, 2, 3):
            sd = torch.load(tagdir / f"layer_{i:02d}-model_{t:02d}-model_states.pt", weights_only=True)
            for k, v in sd.items():
                assert torch.equal(v, tp_ranks[t][f"{i}.{k}"]["lp"]), (i, k)
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    meta = {"case": name, "kind": "pptp", "world_size": ws, "pipeline_stages": c["pp"], "tensor_parallel": c["tp"],
            "data_parallel": c["dp"], "dtype": c["dtype"], "zero_stage": c["stage"], "exercises": c["exercises"],
            "ds_config": ds_config(c), "universal_checkpoint_info": info, "ds_version": deepspeed.__version__,
            "torch_version": torch.__version__, "seed": SEED, "steps": STEPS, "tag": TAG,
            "names": {n: plain(list(t.shape)) for n, t in ref["model"].items()}, "stages": ref["stages"],
            "files": files, "removed": ["zero_to_fp32.py", "zero_to_torch.py"],
            "patches": ["deepspeed.comm.torch.build_shm_op -> None (optional shared-memory allreduce op)"],
            "generator": "tools/make_zero_parallel_checkpoints.py"}
    (d / "case.json").write_text(json.dumps(meta, indent=1) + "\n")


def global_expert_name(name: str, expp_rank: int, num_local: int) -> str:
    """The name DeepSpeed's _save_moe_checkpoint gives a local expert's entry:
    the local expert id replaced by expp_rank * num_local_experts + local id."""
    import re
    m = re.search(r"\.deepspeed_experts\.(\d+)\.", name)
    if not m:
        return name
    g = expp_rank * num_local + int(m.group(1))
    return name[:m.start(1)] + str(g) + name[m.end(1):]


def moe_job(rank: int, ws: int, out: str, name: str) -> None:
    import deepspeed
    from deepspeed.moe.layer import MoE
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from deepspeed.utils import groups, safe_get_full_fp32_param
    c = CASES[name]
    d = Path(out) / name
    lp_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[c["dtype"]]
    torch.manual_seed(SEED)
    net = MoENet(c["ep"])
    params = split_params_into_different_moe_groups_for_optimizer({"params": list(net.parameters()), "name": "dense"})
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=params, config=ds_config(c))
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        loss = engine(torch.randn(MICRO_BATCH * 2, 6, generator=g).to(lp_dtype))
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == STEPS
    if rank == 0 and d.exists():
        shutil.rmtree(d)
    dist.barrier()
    engine.save_checkpoint(str(d))
    dist.barrier()

    opt = engine.optimizer
    cls = type(opt).__name__
    moe = [m for m in engine.module.modules() if isinstance(m, MoE)]
    assert len(moe) == 1
    group_name, num_local = moe[0].expert_group_name, moe[0].num_local_experts
    expp_rank = groups._get_expert_parallel_rank(group_name)
    edp_rank = groups._get_expert_data_parallel_rank(group_name)
    to_global = {n: global_expert_name(n, expp_rank, num_local) for n, _ in engine.module.named_parameters()}
    # The values: the live flat partitions, all-gathered over each group's own
    # data-parallel group (the expert-data-parallel group for expert groups)
    # and cut at each lp param's offset in the lp flat buffer. DeepSpeed's
    # safe_get_full_optimizer_state raises for groups >= 1 at ZeRO-1/2 (its
    # optimizer fragments are set up after stepping group 0 only), so it is
    # not used; safe_get_full_fp32_param is, as a cross-check of the masters.
    mine = {}
    fqn_of = {id(p): to_global[n] for n, p in engine.module.named_parameters()}
    for i, (lp_flat, part, ps) in enumerate(zip(opt.bit16_groups_flat, opt.single_partition_of_fp32_groups,
                                                opt.bit16_groups)):
        grp = opt.real_dp_process_group[i]
        st = opt.optimizer.state[part]
        full = {"fp32": _gather(part, grp), "exp_avg": _gather(st["exp_avg"], grp),
                "exp_avg_sq": _gather(st["exp_avg_sq"], grp)}
        for p in ps:
            off = p.data.storage_offset() - lp_flat.storage_offset()
            n = fqn_of[id(p)]
            mine[n] = {k: f.narrow(0, off, p.numel()).view(p.shape).clone() for k, f in full.items()}
            mine[n]["step"] = st["step"].clone()
            mine[n]["lp"] = p.data.detach().clone()
            assert torch.equal(mine[n]["lp"], mine[n]["fp32"].to(lp_dtype)), (name, n, "lp != fp32 master")
    for n, p in engine.module.named_parameters():
        assert torch.equal(safe_get_full_fp32_param(p).detach().float().view(p.shape), mine[to_global[n]]["fp32"])
    state = {global_expert_name(k, expp_rank, num_local): v.detach().clone()
             for k, v in engine.module.state_dict().items()}
    every = [None] * ws
    dist.all_gather_object(every, {"rank": rank, "expp_rank": expp_rank, "edp_rank": edp_rank, "cls": cls,
                                   "values": mine, "state": state, "group_name": group_name})
    if rank != 0:
        return
    ref = {"model": {}, "optim": {}, "lp": {}, "module_state": {}, "expert_ranks": {}}
    for e in every:
        if e["edp_rank"] != 0:
            continue  # the expert-data-parallel replicas hold the same values
        for n, v in e["values"].items():
            if n in ref["model"]:
                assert torch.equal(ref["model"][n], v["fp32"]), (name, n, "differs between ranks")
                continue
            ref["model"][n] = v["fp32"]
            ref["optim"][n] = {"exp_avg": v["exp_avg"], "exp_avg_sq": v["exp_avg_sq"], "step": v["step"]}
            ref["lp"][n] = v["lp"]
        for k, v in e["state"].items():
            ref["module_state"].setdefault(k, v)
        ref["expert_ranks"][e["expp_rank"]] = e["rank"]
    # the module's order with every global expert in place of the local ones
    order = []
    for e in sorted(every, key=lambda e: e["expp_rank"]):
        if e["edp_rank"] == 0:
            order += [k for k in e["state"] if k not in order]
    dense = [k for k in every[0]["state"] if ".deepspeed_experts." not in k]
    experts = [k for k in order if ".deepspeed_experts." in k]
    first = next(i for i, k in enumerate(dense) if k.startswith("moe.deepspeed_moe.gate")) + 1
    names = dense[:first] + experts + dense[first:]
    ref["module_state"] = {k: ref["module_state"][k] for k in names}
    torch.save(ref, d / "reference_live.pt")
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    info = {
        "case": name, "kind": "moe", "world_size": ws, "expert_parallel": c["ep"], "num_experts": 4,
        "dtype": c["dtype"], "zero_stage": c["stage"], "optimizer_class": sorted({e["cls"] for e in every}),
        "expert_group": every[0]["group_name"],
        "ranks": [{k: e[k] for k in ("rank", "expp_rank", "edp_rank")} for e in every],
        "exercises": c["exercises"], "ds_config": ds_config(c), "ds_version": deepspeed.__version__,
        "torch_version": torch.__version__, "seed": SEED, "steps": STEPS, "tag": TAG,
        "names": {n: plain(list(t.shape)) for n, t in ref["model"].items()},
        "files": files, "removed": ["zero_to_fp32.py", "zero_to_torch.py"],
        "patches": ["deepspeed.comm.torch.build_shm_op -> None (optional shared-memory allreduce op)"],
        "generator": "tools/make_zero_parallel_checkpoints.py",
    }
    (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")


def job(rank: int, ws: int, out: str, name: str) -> None:
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    c = CASES[name]
    d = Path(out) / name
    lp_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[c["dtype"]]
    torch.manual_seed(SEED)
    net = PipelineModule(layers=layer_specs(), num_stages=c["pp"], loss_fn=loss_fn,
                         partition_method="parameters", base_seed=SEED)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
                                           config=ds_config(c))
    grid = engine.grid
    it = data_iter(grid.get_data_parallel_rank(), lp_dtype)
    for _ in range(STEPS):
        engine.train_batch(data_iter=it)
    assert engine.global_steps == STEPS, engine.global_steps

    if rank == 0 and d.exists():
        shutil.rmtree(d)
    dist.barrier()
    engine.save_checkpoint(str(d))
    dist.barrier()

    # ---- live values: each stage's params, gathered inside its dp group ----
    opt = engine.optimizer
    cls = type(opt).__name__
    dp_group = grid.get_data_parallel_group()
    stage = grid.get_stage_id()
    mine = {}
    for n, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        if c["stage"] == 0:  # no ZeRO, fp32: the parameter is the master, the torch optimizer holds its state
            st = opt.state[p]
            mine[n] = {"fp32": p.detach().clone(), "exp_avg": st["exp_avg"].clone(),
                       "exp_avg_sq": st["exp_avg_sq"].clone(), "lp": p.data.detach().clone(),
                       "step": st["step"].clone()}
            continue
        v = {"fp32": safe_get_full_fp32_param(p).detach().clone().float().view(p.shape),
             "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").detach().clone().view(p.shape),
             "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").detach().clone().view(p.shape),
             "lp": p.data.detach().clone()}
        assert torch.equal(v["lp"], v["fp32"].to(lp_dtype)), (name, n, "lp != fp32 master")
        mine[n] = v
    # the live flat partitions, all-gathered over the stage's dp group and cut at each
    # lp param's offset in the lp flat buffer, must say the same (a second, independent read)
    groups = ([] if c["stage"] == 0 else
              list(zip(opt.bf16_groups_flat, opt.fp32_groups_flat_partition, opt.bf16_groups))
              if cls == "BF16_Optimizer" else
              list(zip(opt.bit16_groups_flat, opt.single_partition_of_fp32_groups, opt.bit16_groups)))
    fqn_of = {id(p): n for n, p in engine.module.named_parameters()}
    # everything the stage's module holds (frozen parameters and buffers too), as live
    state = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    for lp_flat, part, params in groups:
        st = opt.optimizer.state[part]
        full = {"fp32": _gather(part, dp_group), "exp_avg": _gather(st["exp_avg"], dp_group),
                "exp_avg_sq": _gather(st["exp_avg_sq"], dp_group)}
        for p in params:
            off = p.data.storage_offset() - lp_flat.storage_offset()
            n = fqn_of[id(p)]
            for k, f in full.items():
                assert torch.equal(f.narrow(0, off, p.numel()).view(p.shape), mine[n][k]), (name, n, k)
            mine[n]["step"] = st["step"].clone()
    every = [None] * ws
    dist.all_gather_object(every, {"stage": stage, "dp_rank": grid.get_data_parallel_rank(), "cls": cls,
                                   "values": mine, "state": state})
    if rank != 0:
        return
    ref = {"model": {}, "optim": {}, "lp": {}, "stage_of": {}, "module_state": {}}
    for e in every:
        if e["dp_rank"] != 0:
            continue
        ref["module_state"].update(e["state"])
        for n, v in e["values"].items():
            ref["model"][n] = v["fp32"]
            ref["optim"][n] = {"exp_avg": v["exp_avg"], "exp_avg_sq": v["exp_avg_sq"], "step": v["step"]}
            ref["lp"][n] = v["lp"]
            ref["stage_of"][n] = e["stage"]
    torch.save(ref, d / "reference_live.pt")
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    info = {
        "case": name, "pipeline_stages": c["pp"], "data_parallel": c["dp"], "world_size": ws,
        "dtype": c["dtype"], "zero_stage": c["stage"], "optimizer_class": sorted({e["cls"] for e in every}),
        "exercises": c["exercises"], "ds_config": ds_config(c), "ds_version": deepspeed.__version__,
        "torch_version": torch.__version__, "seed": SEED, "steps": STEPS, "tag": TAG,
        "names": {n: plain(list(t.shape)) for n, t in ref["model"].items()},
        "stage_of": ref["stage_of"], "files": files, "removed": ["zero_to_fp32.py", "zero_to_torch.py"],
        "patches": ["deepspeed.comm.torch.build_shm_op -> None (optional shared-memory allreduce op)"],
        "generator": "tools/make_zero_parallel_checkpoints.py",
    }
    (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")


def _gather(t: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.detach().contiguous(), group=group)
    return torch.cat(parts)


def check_files(name: str, d: Path) -> None:
    """The names DeepSpeed gave the files, and the layer/expert files against the live lp values."""
    c = CASES[name]
    tagdir = d / TAG
    pfx = "bf16_" if c["dtype"] == "bf16" else ""
    ref = torch.load(d / "reference_live.pt", weights_only=True)
    if c["kind"] == "moe":
        want = sorted([f"layer_0_expert_{e}_mp_rank_00_model_states.pt" for e in range(4)]
                      + ["mp_rank_00_model_states.pt"]
                      + [f"{pfx}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(c["dp"])])
        got = sorted(p.name for p in tagdir.iterdir())
        assert got == want, (name, got, want)
        for e in range(4):
            sd = torch.load(tagdir / f"layer_0_expert_{e}_mp_rank_00_model_states.pt", weights_only=True)
            assert sorted(sd) == [f"moe.deepspeed_moe.experts.deepspeed_experts.{e}.{k}" for k in ("bias", "weight")]
            for k, v in sd.items():
                assert torch.equal(v, ref["module_state"][k]), (name, k)
        return
    layers = sorted({int(n.split(".")[0]) for n in ref["module_state"]})
    # no tensor axis in the topology: get_rank_repr is empty, so no "-model_TT" part
    want = sorted([f"layer_{i:02d}-model_states.pt" for i in layers]
                  + [f"mp_rank_{s:02d}_model_states.pt" for s in range(c["pp"])]
                  + [f"{pfx}zero_pp_rank_{r}_mp_rank_{s:02d}_optim_states.pt"
                     for s in range(c["pp"]) for r in range(c["dp"]) if c["stage"] > 0])
    got = sorted(p.name for p in tagdir.iterdir())
    assert got == want, (name, got, want)
    for i in layers:
        sd = torch.load(tagdir / f"layer_{i:02d}-model_states.pt", weights_only=True)
        for k, v in sd.items():
            assert torch.equal(v, ref["module_state"][f"{i}.{k}"]), (name, i, k)
    for n, v in ref["lp"].items():
        assert torch.equal(v, ref["module_state"][n]), (name, n)


def write_model_reference(d: Path) -> None:
    """reference_model.pt: the whole model as the live engines held it, flat
    {name: tensor} in module order (trainable parameters as their fp32
    masters, frozen parameters and buffers as the modules held them): what
    `consolidate --only model` must give, for the reader conformance tests."""
    ref = torch.load(d / "reference_live.pt", weights_only=True)
    torch.save({n: ref["model"].get(n, v) for n, v in ref["module_state"].items()}, d / "reference_model.pt")


def write_tp_model_reference(d: Path) -> None:
    """reference_model.pt of a merged tensor-parallel case: the merged fp32
    masters, flat {name: tensor} in module order (every entry is trainable)."""
    ref = torch.load(d / "reference_live.pt", weights_only=True)
    torch.save(dict(ref["model"]), d / "reference_model.pt")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "testdata" / "zero_parallel"))
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="regenerate only these cases")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only or CASES:
        t = time.time()
        c = CASES[name]
        jobs = {"pipe": job, "moe": moe_job, "tp": tp_job, "tpu": tpu_job, "pptp": pptp_job}
        spawn(c["pp"] * c["dp"] * c.get("tp", 1), jobs[c["kind"]], str(out), name)
        d = out / name
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):
            if (d / script).exists():
                (d / script).unlink()
        if c["kind"] not in ("tp", "tpu", "pptp"):  # no layer or expert files (pptp: checked in its job)
            check_files(name, d)
            write_model_reference(d)
        if c["kind"] in ("tpu", "pptp"):
            write_tp_model_reference(d)
        info = json.loads((d / "case.json").read_text())
        info["files"] = {k: v for k, v in info["files"].items() if k not in info["removed"]}
        (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")
        print(f"{name}: {info.get('optimizer_class', '')} {sum(info['files'].values())} bytes, {time.time() - t:.1f}s",
              flush=True)


if __name__ == "__main__":
    main()
