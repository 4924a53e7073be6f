#!/usr/bin/env python3
"""Write real DeepSpeed ZeRO checkpoints (stages 1/2/3) for ckptconv's tests.

Every checkpoint here is written by real DeepSpeed (``engine.save_checkpoint``)
on this CPU-only machine: world_size processes are spawned with
torch.multiprocessing, joined in a gloo process group
(``deepspeed.init_distributed(dist_backend="gloo")``, DS_ACCELERATOR=cpu),
trained for 3 steps with torch's AdamW (``"torch_adam": true``, so no C++ op is
built) and saved. Nothing is written by hand.

    .venv-deepspeed/bin/python tools/make_zero_checkpoints.py [--out testdata/zero] [--only CASE ...]

Each case folder ``<out>/<case>/`` holds the DeepSpeed checkpoint (``latest``
and ``global_step3/``; the ``zero_to_fp32.py`` / ``zero_to_torch.py`` recovery
scripts DeepSpeed copies in are deleted: they are DeepSpeed source, not data),
plus:

- ``reference_fp32.pt``: DeepSpeed's own
  ``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``
  output, ``torch.save``'d as is. Absent where zero_to_fp32 refuses the case
  (BF16_Optimizer); ``case.json`` records the error.
- ``reference_live.pt``: gathered from the live engine after step 3, keyed by
  FQN: ``{"model": {fqn: fp32 master}, "optim": {fqn: {exp_avg, exp_avg_sq,
  step}}, "param_groups": [{hyperparameters..., "params": [fqn...]}],
  "lp": {fqn: live low-precision param, frozen included}, "buffers": {...},
  "tied": {alias: owner}}``. Trainable values come from
  ``deepspeed.utils.safe_get_full_fp32_param`` /
  ``safe_get_full_optimizer_state`` where those are right; where DeepSpeed's
  helper raises or returns a wrong value (round_robin_gradients; groups >= 1 in
  ZeRO-1/2) the value is the live flat gather instead: the live fp32 /
  exp_avg partitions all-gathered over ranks and cut at the live lp param's
  offset in DeepSpeed's lp flat buffer. ``case.json`` says which, per tensor.
- ``case.json``: the case (stage, dtype, world size, options, ds_config,
  versions, optimizer class, files and sizes, reference provenance). A case
  saved with ``client_state`` (z2_sched_ws2, which also has a DeepSpeed lr
  scheduler) adds ``training_state``: what the live engine held at save time
  (``engine.lr_scheduler.state_dict()``, global_steps, global_samples,
  skipped_steps) and the client_state dict passed to ``save_checkpoint``.

Self-checks (assertions): file names and prefixes per stage/dtype; the
``latest`` tag; each trainable tensor of zero_to_fp32 bit-equals the live fp32
master; the live lp weights equal the fp32 master cast to lp; the per-param
fp32/exp_avg/exp_avg_sq/step rebuilt from the checkpoint files alone (param_shapes +
param_alignment_paddings, or ceil(numel/ws) in stage 3) bit-equal the live
values; zero_to_fp32's frozen/tied handling.

Side environment (DeepSpeed must not go into the project venv; it reuses the
project venv's torch through a .pth file): ``scripts/setup-deepspeed`` makes
``.venv-deepspeed`` (DeepSpeed 0.19.8 from its source package, DS_BUILD_OPS=0,
the pure-Python requirements of tools/requirements-deepspeed.txt).

(``wheel`` is in those requirements: with --no-build-isolation, DeepSpeed's
setup.py fails with "invalid command 'bdist_wheel'" without it.)

CPU only; needs no GPU. About 15-30 s per case on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

SEED = 0
STEPS = 3
MICRO_BATCH = 4
TAG = f"global_step{STEPS}"

# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------


class Net(nn.Module):
    """The model of docs/deepspeed.md.

    out_bias          5      Parameter registered first (flat offset 0)
    l1.weight  7x6, l1.bias 7
    l2.weight 11x7           (no bias, as in docs/deepspeed.md)
    frozen.weight 5x11       requires_grad=False
    head.weight   5x11
    head_tied.weight         the same Parameter as head.weight
    scale         5          persistent fp32 buffer
    Row counts 7, 11 and 5 are not divisible by 2 or 3 on purpose.
    """

    def __init__(self) -> None:
        super().__init__()
        self.out_bias = nn.Parameter(torch.linspace(-0.2, 0.2, 5))
        self.l1 = nn.Linear(6, 7)
        self.l2 = nn.Linear(7, 11, bias=False)
        self.frozen = nn.Linear(11, 5, bias=False)
        self.frozen.weight.requires_grad_(False)
        self.head = nn.Linear(11, 5, bias=False)
        self.head_tied = nn.Linear(11, 5, bias=False)
        self.head_tied.weight = self.head.weight
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 5), persistent=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l2(torch.tanh(self.l1(x)))
        y = self.head(h) + 0.5 * self.head_tied(h) + self.frozen(h) + self.out_bias
        y = y.float() * self.scale
        return y.pow(2).mean()


TRAINABLE = ["out_bias", "l1.weight", "l1.bias", "l2.weight", "head.weight"]
SHAPES = {"out_bias": [5], "l1.weight": [7, 6], "l1.bias": [7], "l2.weight": [11, 7],
          "frozen.weight": [5, 11], "head.weight": [5, 11], "head_tied.weight": [5, 11], "scale": [5]}
TIED = {"head_tied.weight": "head.weight"}
MODEL_DESC = ("Net: out_bias 5, l1.weight 7x6, l1.bias 7, l2.weight 11x7 (no bias), frozen.weight 5x11 "
              "(requires_grad=False), head.weight 5x11, head_tied.weight = head.weight (tied), "
              "buffer scale 5 (fp32, persistent)")
GROUPS2 = [  # two param groups: matrices, then 1-D params
    {"names": ["l1.weight", "l2.weight", "head.weight"], "lr": 1e-2, "weight_decay": 0.01},
    {"names": ["out_bias", "l1.bias"], "lr": 3e-3, "weight_decay": 0.0},
]


def fresh_model() -> Net:
    torch.manual_seed(SEED)
    return Net()


def batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(MICRO_BATCH, 6, generator=g)


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------

def case(stage, dtype, ws, **kw):
    return dict(stage=stage, dtype=dtype, world_size=ws, zero_extra=kw.pop("zero_extra", {}),
                extra=kw.pop("extra", {}), groups2=kw.pop("groups2", False), exercises=kw.pop("exercises"),
                client_state=kw.pop("client_state", None))


CASES = {
    "z1_bf16_ws2": case(1, "bf16", 2, exercises="ZeRO-1 bf16: bf16_ optim prefix, frozen_param_* None, "
                                                 "zero_to_fp32 output without the frozen param"),
    "z2_bf16_ws2": case(2, "bf16", 2, exercises="ZeRO-2 bf16: frozen fragments, tied alias, padded exp_avg"),
    "z3_bf16_ws2": case(3, "bf16", 2, exercises="ZeRO-3 bf16: per-rank model states, empty module params, "
                                                 "fp32_flat_groups with ceil(numel/ws) per param"),
    "z1_fp16_ws2": case(1, "fp16", 2, extra={"fp16": {"enabled": True, "initial_scale_power": 8}},
                        exercises="ZeRO-1 fp16: DynamicLossScaler (pickles torch.float16), no prefix"),
    "z2_fp32_ws3": case(2, "fp32", 3, exercises="ZeRO-2 fp32 at ws 3: LossScaler, odd partitioning"),
    "z3_fp16_ws3": case(3, "fp16", 3, extra={"fp16": {"enabled": True, "initial_scale_power": 8}},
                        exercises="ZeRO-3 fp16 at ws 3: last-rank zero padding per param"),
    "z3_fp32_ws2": case(3, "fp32", 2, exercises="ZeRO-3 fp32"),
    "z2_bf16_ws3": case(2, "bf16", 3, exercises="ZeRO-2 bf16 at ws 3"),
    "bf16opt_ws2": case(1, "bf16", 2, extra={"data_types": {"grad_accum_dtype": "fp32"}},
                        exercises="BF16_Optimizer (bf16 + grad_accum_dtype fp32 + stage 1): no zero_stage, "
                                  "fp32 partition keeps its padding; zero_to_fp32 refuses it"),
    "z2_rr_ws2": case(2, "bf16", 2, zero_extra={"round_robin_gradients": True},
                      exercises="round_robin_gradients: flat buffer and param_shapes in round-robin order, "
                                "param_slice_mappings in original order"),
    "z2_align_ws2": case(2, "bf16", 2, zero_extra={"parameter_alignment": True},
                         exercises="parameter_alignment: non-zero param_alignment_paddings"),
    "z2_2groups_ws2": case(2, "bf16", 2, groups2=True,
                           exercises="two param groups (lr/weight_decay differ): one flat partition and "
                                     "one AdamW state per group"),
    "z3_2groups_ws2": case(3, "bf16", 2, groups2=True, exercises="ZeRO-3 with two param groups"),
    "z3_subgroups_ws2": case(3, "bf16", 2, groups2=True, zero_extra={"sub_group_size": 60},
                             exercises="ZeRO-3 sub-groups (sub_group_size 60 elements, as a model of "
                                       "billions of parameters gets at the default 1e9): several flat "
                                       "partitions and AdamW states per param group"),
    "z2_sched_ws2": case(2, "bf16", 2,
                         extra={"scheduler": {"type": "WarmupLR",
                                              "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                         "warmup_num_steps": 10}}},
                         client_state={"epoch": 2, "samples_seen": 96, "note": "resume-here"},
                         exercises="ZeRO-2 bf16 with a DeepSpeed lr scheduler (WarmupLR) and "
                                   "save_checkpoint(client_state=...): lr_scheduler state_dict and the "
                                   "client_state keys at the model-states file's top level; case.json's "
                                   "training_state is what the live engine held at save time"),
}


def ds_config(c) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000000,
        "wall_clock_breakdown": False,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1e-2, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01,
                                 "torch_adam": True}},
        "zero_optimization": {"stage": c["stage"], **c["zero_extra"]},
    }
    if c["dtype"] == "bf16":
        cfg["bf16"] = {"enabled": True}
    cfg.update(json.loads(json.dumps(c["extra"])))
    return cfg


def expected_optimizer_class(name: str, c) -> str:
    if name == "bf16opt_ws2":
        return "BF16_Optimizer"
    return "DeepSpeedZeroOptimizer_Stage3" if c["stage"] == 3 else "DeepSpeedZeroOptimizer"


def expected_files(c) -> list:
    ws, pfx = c["world_size"], ("bf16_" if c["dtype"] == "bf16" else "")
    optim = [f"{pfx}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ws)]
    if c["stage"] == 3:
        model = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(ws)]
    else:
        model = ["mp_rank_00_model_states.pt"]
    return sorted(model + optim)


# --------------------------------------------------------------------------
# Distributed plumbing
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet() -> None:
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


def _entry(rank: int, ws: int, port: int, fn, args) -> None:
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ws), LOCAL_SIZE=str(ws))
    _quiet()
    torch.set_num_threads(1)
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401 (the package's `torch` attribute is torch itself)
    from deepspeed.utils import logger
    logger.setLevel("ERROR")
    # The optional shared-memory allreduce op is JIT-compiled (~80 s of g++)
    # on first use; gloo does everything needed here without it.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    try:
        fn(rank, ws, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Done and written: leave without the interpreter's teardown. A spawned
    # ZeRO-3 rank now and then died there with "terminate called without an
    # active exception" (a native thread still joinable when its owner was
    # destroyed at exit), failing a run whose work had all succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(ws: int, fn, *args) -> None:
    mp.spawn(_entry, args=(ws, free_port(), fn, args), nprocs=ws, join=True)


def all_gather_cat(t: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.detach().contiguous())
    return torch.cat(parts)


# --------------------------------------------------------------------------
# The job (runs in every rank)
# --------------------------------------------------------------------------


def make_engine(c):
    import deepspeed
    model = fresh_model()
    named = dict(model.named_parameters())
    if c["groups2"]:
        params = [{"params": [named[n] for n in g["names"]], "lr": g["lr"], "weight_decay": g["weight_decay"]}
                  for g in GROUPS2]
        group_names = [g["names"] for g in GROUPS2]
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        group_names = [[n for n, p in named.items() if p.requires_grad]]
    engine, optim, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config(c))
    return engine, group_names


def flat_layout(opt, cls: str):
    """[(lp flat buffer, live fp32 partition, lp params in flat order)] per group, ZeRO-1/2 and BF16_Optimizer."""
    if cls == "BF16_Optimizer":
        return list(zip(opt.bf16_groups_flat, opt.fp32_groups_flat_partition, opt.bf16_groups))
    return list(zip(opt.bit16_groups_flat, opt.single_partition_of_fp32_groups, opt.bit16_groups))


def live_flat_gather(engine, cls: str, fqn_of):
    """Per-param fp32 / exp_avg / exp_avg_sq from the live flat partitions.

    The live partitions (padded, P = flat numel / ws each) are all-gathered and
    concatenated in rank order, which gives the lp flat buffer's layout; each
    lp param is a view into that buffer, so its storage offset says where it is.
    """
    opt = engine.optimizer
    base = opt.optimizer
    out = {}
    for lp_flat, part, params in flat_layout(opt, cls):
        full = {"fp32": all_gather_cat(part)}
        st = base.state[part]
        for k in ("exp_avg", "exp_avg_sq"):
            full[k] = all_gather_cat(st[k])
        assert full["fp32"].numel() == lp_flat.numel(), (full["fp32"].numel(), lp_flat.numel())
        for p in params:
            assert p.data.untyped_storage().data_ptr() == lp_flat.untyped_storage().data_ptr()
            off = p.data.storage_offset() - lp_flat.storage_offset()
            out[fqn_of[id(p)]] = {k: v.narrow(0, off, p.numel()).view(p.shape).clone() for k, v in full.items()}
            out[fqn_of[id(p)]]["step"] = st["step"].clone()
    return out


def _safe_get_would_raise(p, key: str):
    m = getattr(p, "_hp_mapping", None)
    if m is None or key == "fp32":
        return None
    if m.optim_fragment is None:
        return "_hp_mapping.optim_fragment is None (optimizer state not lazily initialised for this group)"
    if key not in m.optim_fragment:
        return f"ValueError: {key} not found in optimizer state fragment"
    return None


def param_groups_of(engine, group_names) -> list:
    """The live optimizer's param groups as the reference records them: its
    hyper-parameters (tuples as lists) and each group's parameter names."""
    groups = []
    for gi, g in enumerate(engine.optimizer.optimizer.param_groups[:len(group_names)]):
        h = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
        h["params"] = list(group_names[gi])
        groups.append(h)
    return groups


def step_of(engine, cls: str, group_idx: int, param):
    opt = engine.optimizer
    base = opt.optimizer
    if cls == "DeepSpeedZeroOptimizer_Stage3":
        # Stage 3 swaps each sub-group's flat fp32 partition into the base
        # optimizer's param_groups only while it steps; the state stays keyed
        # by it. A param group has several sub-groups when it holds more than
        # sub_group_size elements: the param's own sub-group says its step.
        subs = [i for i, g in opt.sub_group_to_group_id.items()
                if g == group_idx and any(q is param for q in opt.fp16_groups[i])]
        assert len(subs) == 1, subs
        return base.state[opt.fp32_partitioned_groups_flat[subs[0]]]["step"].clone()
    return base.state[base.param_groups[group_idx]["params"][0]]["step"].clone()


FP16_PATCH = ("DeepSpeed's CPU accelerator refuses fp16 unless torch.ops.mkldnn._is_mkldnn_fp16_supported() "
              "(CPU ISA with AVX512-FP16/AMX-FP16); this machine has neither, so CPU_Accelerator.is_fp16_supported "
              "is forced to True for the fp16 cases. Only that capability gate is bypassed; fp16 math runs in "
              "plain torch and every file is written by DeepSpeed itself.")


def fp16_gate_patch() -> None:
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    if not acc.is_fp16_supported():
        type(acc).is_fp16_supported = lambda self: True


def plain(v):
    """`v` as JSON values (tensors and tuples become lists); refuses anything else."""
    if isinstance(v, torch.Tensor):
        v = v.tolist()
    if isinstance(v, dict):
        assert all(isinstance(k, str) for k in v), v
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    assert v is None or isinstance(v, (bool, int, float, str)), (type(v), v)
    return v


def job(rank: int, ws: int, out: str, name: str) -> None:
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    c = CASES[name]
    d = Path(out) / name
    if c["dtype"] == "fp16":
        fp16_gate_patch()
    engine, group_names = make_engine(c)
    cls = type(engine.optimizer).__name__
    assert cls == expected_optimizer_class(name, c), (name, cls)
    lp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[c["dtype"]]
    for step in range(STEPS):
        loss = engine(batch(step, rank).to(lp_dtype))
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == STEPS and engine.skipped_steps == 0, (engine.global_steps, engine.skipped_steps)

    training_state = None
    if c["client_state"] is not None:
        # what DeepSpeed itself holds at save time, from the live engine
        training_state = {
            "lr_scheduler": plain(engine.lr_scheduler.state_dict()) if engine.lr_scheduler is not None else None,
            "lr_scheduler_class": type(engine.lr_scheduler).__name__ if engine.lr_scheduler is not None else None,
            "global_steps": plain(engine.global_steps),
            "global_samples": plain(engine.global_samples),
            "skipped_steps": plain(engine.skipped_steps),
            "client_state": plain(c["client_state"]),
        }

    if rank == 0 and d.exists():
        shutil.rmtree(d)
    dist.barrier()
    if c["client_state"] is not None:
        engine.save_checkpoint(str(d), client_state=dict(c["client_state"]))
    else:
        engine.save_checkpoint(str(d))
    dist.barrier()

    module = engine.module
    named = dict(module.named_parameters())
    fqn_of = {id(p): n for n, p in named.items()}
    trainable = [n for n, p in named.items() if p.requires_grad]
    assert trainable == TRAINABLE, trainable
    group_of = {n: gi for gi, names in enumerate(group_names) for n in names}

    # ---- live values (collectives: every rank, same order) ----
    live_flat = live_flat_gather(engine, cls, fqn_of) if c["stage"] < 3 else {}
    model_ref, optim_ref, source, notes = {}, {}, {}, []
    for n in trainable:
        p = named[n]
        vals = {}
        for k in ("fp32", "exp_avg", "exp_avg_sq"):
            # ZeRO-1/2 helpers all-reduce; if one rank would raise before the
            # collective the others hang, so every rank checks first.
            bad = _safe_get_would_raise(p, k) if c["stage"] < 3 else None
            bad_all = [None] * ws
            dist.all_gather_object(bad_all, bad)
            bad_ranks = [f"rank {r}: {b}" for r, b in enumerate(bad_all) if b]
            try:
                if bad_ranks:
                    raise RuntimeError("would raise on " + "; ".join(bad_ranks))
                v = safe_get_full_fp32_param(p) if k == "fp32" else safe_get_full_optimizer_state(p, k)
                v = None if v is None else v.detach().clone().float().view(p.ds_shape if hasattr(p, "ds_shape") else p.shape)
                err = None if v is not None else "returned None"
            except Exception as e:  # noqa: BLE001 -- recorded, then the live flat gather is used
                v, err = None, f"{type(e).__name__}: {e}".splitlines()[0][:200]
            lf = live_flat.get(n, {}).get(k)
            if v is not None and (lf is None or torch.equal(v, lf)):
                vals[k], source[f"{n}:{k}"] = v, ("safe_get_full_fp32_param" if k == "fp32"
                                                  else "safe_get_full_optimizer_state")
            elif lf is not None:
                vals[k], source[f"{n}:{k}"] = lf, "live_flat_gather"
                why = err or "differs from the live flat partitions"
                notes.append(f"{n}:{k}: DeepSpeed's safe_get {why}")
            else:
                raise AssertionError(f"{name}: no live value for {n}:{k} ({err})")
        model_ref[n] = vals["fp32"]
        optim_ref[n] = {"exp_avg": vals["exp_avg"], "exp_avg_sq": vals["exp_avg_sq"],
                        "step": step_of(engine, cls, group_of[n], p)}
    # live lp weights (ZeRO-3 params are partitioned: gather them)
    params = list(named.values())
    if c["stage"] == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            lp = {n: p.data.detach().clone() for n, p in named.items()}
    else:
        lp = {n: p.data.detach().clone() for n, p in named.items()}
    for n in trainable:
        assert lp[n].dtype == lp_dtype and torch.equal(lp[n], model_ref[n].to(lp_dtype)), (name, n, "lp != fp32 master")
    pgroups = param_groups_of(engine, group_names)
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    if rank != 0:
        return

    ref_live = {"model": model_ref, "optim": optim_ref, "param_groups": pgroups, "lp": lp,
                "buffers": buffers, "tied": dict(TIED)}
    torch.save(ref_live, d / "reference_live.pt")
    info = finish_case(name, c, d, ws, cls, ref_live, source, notes, training_state)
    (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")


# --------------------------------------------------------------------------
# Checks against the files (rank 0)
# --------------------------------------------------------------------------


def _mkldnn_fp16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # noqa: BLE001
        return False


def load(p: Path):
    return torch.load(p, map_location="cpu", weights_only=False)


def derive_from_files(c, tagdir: Path, cls: str):
    """Rebuild per-param fp32 / exp_avg / exp_avg_sq / step from the files alone,
    the way docs/deepspeed.md describes (param_shapes + paddings)."""
    ws, stage = c["world_size"], c["stage"]
    pfx = "bf16_" if c["dtype"] == "bf16" else ""
    optims = [load(tagdir / f"{pfx}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
              for r in range(ws)]
    mfile = tagdir / ("zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt")
    ms = load(mfile)
    out = {}
    if stage == 3:
        fp32 = [torch.cat([o["fp32_flat_groups"][i] for i in range(len(o["fp32_flat_groups"]))]) for o in optims]
        states = [o["optimizer_state_dict"]["state"] for o in optims]
        ngroups = len(optims[0]["fp32_flat_groups"])
        flats = {k: [torch.cat([s[i][k] for i in range(ngroups)]) for s in states] for k in ("exp_avg", "exp_avg_sq")}
        flats["fp32"] = fp32
        offset = 0
        # group index of each param, for `step`
        for gi, shapes in enumerate(ms["param_shapes"]):
            for n, shape in shapes.items():
                numel = math.prod(shape)
                part = math.ceil(numel / ws)
                vals = {k: torch.cat([f[r].narrow(0, offset, part) for r in range(ws)])[:numel].view(shape)
                        for k, f in flats.items()}
                vals["step"] = states[0][gi]["step"]
                out[n] = vals
                offset += part
        assert offset == fp32[0].numel(), (offset, fp32[0].numel())
        return out
    for gi, shapes in enumerate(ms["param_shapes"]):
        if cls == "BF16_Optimizer":
            assert "zero_stage" not in optims[0] and "param_alignment_paddings" not in optims[0]
            pads = [0] * len(shapes)
        else:
            pads = optims[0]["param_alignment_paddings"][gi]
        fp32 = torch.cat([o["single_partition_of_fp32_groups"][gi] for o in optims])
        st = [o["base_optimizer_state"]["state"][gi] for o in optims]
        flats = {"fp32": fp32, "exp_avg": torch.cat([s["exp_avg"] for s in st]),
                 "exp_avg_sq": torch.cat([s["exp_avg_sq"] for s in st])}
        # Section 2: ZeRO-1/2 saves the fp32 partition without its padding, exp_avg keeps it;
        # BF16_Optimizer keeps the padding in both.
        for r, o in enumerate(optims):
            gp = o["group_paddings"][gi]
            n_fp32 = o["single_partition_of_fp32_groups"][gi].numel()
            n_avg = st[r]["exp_avg"].numel()
            assert n_fp32 == (n_avg if cls == "BF16_Optimizer" else n_avg - gp), (r, gi, n_fp32, n_avg, gp)
        offset = 0
        for j, (n, shape) in enumerate(shapes.items()):
            numel = math.prod(shape)
            out[n] = {k: v.narrow(0, offset, numel).view(shape) for k, v in flats.items()}
            out[n]["step"] = st[0]["step"]
            offset += numel + pads[j]
    return out


def zero3_padding_is_zero(c, tagdir: Path) -> dict:
    ws = c["world_size"]
    pfx = "bf16_" if c["dtype"] == "bf16" else ""
    res = {"fp32_flat_groups": True, "exp_avg": True, "exp_avg_sq": True, "frozen_param_fragments": True}
    for r in range(ws):
        ms = load(tagdir / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        o = load(tagdir / f"{pfx}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
        st = o["optimizer_state_dict"]["state"]
        flats = {"fp32_flat_groups": torch.cat(list(o["fp32_flat_groups"])),
                 "exp_avg": torch.cat([st[i]["exp_avg"] for i in sorted(st)]),
                 "exp_avg_sq": torch.cat([st[i]["exp_avg_sq"] for i in sorted(st)])}
        off = 0
        for shapes in ms["param_shapes"]:
            for shape in shapes.values():
                numel = math.prod(shape)
                part = math.ceil(numel / ws)
                real = max(0, min(part, numel - r * part))
                for k, f in flats.items():
                    res[k] &= bool((f[off + real:off + part] == 0).all())
                off += part
        for n, frag in ms["frozen_param_fragments"].items():
            numel = math.prod(ms["frozen_param_shapes"][n])
            part = math.ceil(numel / ws)
            real = max(0, min(part, numel - r * part))
            res["frozen_param_fragments"] &= bool((frag[real:] == 0).all())
    return res


def finish_case(name, c, d: Path, ws, cls, ref_live, source, notes, training_state=None):
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    fp16_patched = not _mkldnn_fp16()
    stage = c["stage"]
    lp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[c["dtype"]]
    # ---- layout (docs/deepspeed.md, SRC) ----
    assert (d / "latest").read_text() == TAG, (d / "latest").read_text()
    top = sorted(p.name for p in d.iterdir())
    assert {"zero_to_fp32.py", "latest", TAG} <= set(top), top
    tagdir = d / TAG
    got = sorted(p.name for p in tagdir.iterdir())
    assert got == expected_files(c), (name, got, expected_files(c))

    # ---- model-state facts (section 2) ----
    mfiles = sorted(tagdir.glob("*_model_states.pt"))
    for mf in mfiles:
        ms = load(mf)
        client = c["client_state"] or {}
        assert len(ms) == 18 + len(client), (mf.name, sorted(ms))
        assert ms["ds_version"] == deepspeed.__version__ and ms["global_steps"] == STEPS
        if training_state is None:
            assert ms["lr_scheduler"] is None, (mf.name, ms["lr_scheduler"])
        else:
            # the file holds what the live engine held (client_state keys at the top level)
            assert ms["lr_scheduler"] is not None and plain(ms["lr_scheduler"]) == training_state["lr_scheduler"]
            for k in ("global_steps", "global_samples", "skipped_steps"):
                assert ms[k] == training_state[k], (mf.name, k, ms[k], training_state[k])
            for k, v in client.items():
                assert ms[k] == v, (mf.name, k, ms[k], v)
        assert ms["buffer_names"] == ["scale"] and ms["module"]["scale"].dtype == torch.float32
        if stage == 1:
            assert ms["frozen_param_shapes"] is None and ms["frozen_param_fragments"] is None
        else:
            assert list(ms["frozen_param_shapes"]) == ["frozen.weight"]
        is_rank0 = mf.name.startswith(("mp_rank_00", "zero_pp_rank_0_"))
        assert ms["shared_params"] == (TIED if is_rank0 else {}), (mf.name, ms["shared_params"])
        names = [n for g in ms["param_shapes"] for n in g]
        assert sorted(names) == sorted(TRAINABLE), names
        if stage == 3:
            assert all(ms["module"][n].numel() == 0 for n in SHAPES if n != "scale")

    # ---- zero_to_fp32 (section 4) ----
    z2f = {"status": None}
    derived = derive_from_files(c, tagdir, cls)
    try:
        sd = get_fp32_state_dict_from_zero_checkpoint(str(d))
    except Exception as e:  # noqa: BLE001 -- recorded (BF16_Optimizer is refused)
        assert cls == "BF16_Optimizer", (name, traceback.format_exc())
        msg = f"{type(e).__name__}: {e}".strip().replace(str(d), "<case_dir>")
        z2f = {"status": "refused", "error": msg}
    else:
        assert cls != "BF16_Optimizer", "zero_to_fp32 accepted a BF16_Optimizer checkpoint"
        torch.save(sd, d / "reference_fp32.pt")
        z2f = {"status": "ok", "file": "reference_fp32.pt",
               "call": "deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(case_dir)"}
        for n in TRAINABLE:
            t = sd[n]
            assert t.dtype == torch.float32 and torch.equal(t, ref_live["model"][n]), (name, n, "zero_to_fp32 != live")
        assert sd["head_tied.weight"] is sd["head.weight"]
        assert sd["scale"].dtype == torch.float32 and torch.equal(sd["scale"], ref_live["buffers"]["scale"])
        if stage == 1:
            assert "frozen.weight" not in sd, sorted(sd)
        else:
            assert sd["frozen.weight"].dtype == lp_dtype and torch.equal(sd["frozen.weight"], ref_live["lp"]["frozen.weight"])
    # ---- the files alone, per docs/deepspeed.md, against the live values ----
    for n in TRAINABLE:
        want = {"fp32": ref_live["model"][n], **ref_live["optim"][n]}
        for k, v in want.items():
            got_v = derived[n][k]
            assert got_v.dtype == v.dtype and torch.equal(got_v, v), (name, n, k, "files != live")

    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    padding = zero3_padding_is_zero(c, tagdir) if stage == 3 else None
    return {
        "case": name,
        "stage": stage,
        "dtype": c["dtype"],
        "world_size": ws,
        "optimizer_class": cls,
        "options": {**c["zero_extra"], **({"data_types": c["extra"]["data_types"]} if "data_types" in c["extra"] else {}),
                    **({"param_groups": 2} if c["groups2"] else {}),
                    **({"scheduler": c["extra"]["scheduler"]["type"]} if "scheduler" in c["extra"] else {}),
                    **({"client_state": sorted(c["client_state"])} if c["client_state"] is not None else {})},
        "exercises": c["exercises"],
        "ds_config": ds_config(c),
        "ds_version": deepspeed.__version__,
        "torch_version": torch.__version__,
        "python_version": sys.version.split()[0],
        "seed": SEED,
        "steps": STEPS,
        "tag": TAG,
        "model": MODEL_DESC,
        "tensors": SHAPES,
        "tied": TIED,
        "param_groups": [{k: g[k] for k in ("lr", "weight_decay", "params")} for g in ref_live["param_groups"]],
        **({"training_state": training_state} if training_state is not None else {}),
        "files": files,
        # ZeRO-3 pads each param to ceil(numel/ws) per rank; are the padding
        # elements zero on disk in this run? (They are not guaranteed to be.)
        "zero3_padding_all_zero": padding,
        "removed": ["zero_to_fp32.py", "zero_to_torch.py"],
        "patches": ["deepspeed.comm.torch.build_shm_op -> None (optional shared-memory allreduce op, "
                    "not JIT-compiled; gloo does the collectives)"]
                   + ([FP16_PATCH] if c["dtype"] == "fp16" and fp16_patched else []),
        "references": {
            "reference_fp32.pt": z2f,
            "reference_live.pt": {
                "live": "gathered in the engine after the last step (every value is live, none from the files)",
                "sources": source,
                "notes": notes,
            },
        },
        "generator": "tools/make_zero_checkpoints.py",
    }


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "testdata" / "zero"))
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="regenerate only these cases")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for name in args.only or CASES:
        t = time.time()
        spawn(CASES[name]["world_size"], job, str(out), name)
        d = out / name
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):
            if (d / script).exists():
                (d / script).unlink()
        info = json.loads((d / "case.json").read_text())
        info["files"] = {k: v for k, v in info["files"].items() if k not in info["removed"]}
        (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")
        print(f"{name}: {info['optimizer_class']} {sum(info['files'].values())} bytes, "
              f"zero_to_fp32 {info['references']['reference_fp32.pt']['status']}, "
              f"{len(info['references']['reference_live.pt']['notes'])} notes, {time.time() - t:.1f}s", flush=True)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"zero: {total} bytes in {out}, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
