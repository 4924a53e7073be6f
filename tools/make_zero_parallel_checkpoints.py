#!/usr/bin/env python3
"""Write real DeepSpeed pipeline-parallel checkpoints for ckptconv's tests.

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
- ``case.json``: the case, topology, ds_config, versions, files and sizes.

Self-checks: the file names per stage (``layer_LL-model_TT-model_states.pt``,
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
    "pp2_fp32_ws2": dict(pp=2, dp=1, dtype="fp32", stage=1,
                         exercises="pipeline 2 stages x 1 data-parallel rank, fp32, ZeRO-1"),
    "pp2_dp2_bf16_ws4": dict(pp=2, dp=2, dtype="bf16", stage=1,
                             exercises="pipeline 2 stages x 2 data-parallel ranks, bf16, ZeRO-1: "
                                       "bf16_ optim prefix, each stage's masters split over its dp group"),
}


def ds_config(c) -> dict:
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
        v = {"fp32": safe_get_full_fp32_param(p).detach().clone().float().view(p.shape),
             "exp_avg": safe_get_full_optimizer_state(p, "exp_avg").detach().clone().view(p.shape),
             "exp_avg_sq": safe_get_full_optimizer_state(p, "exp_avg_sq").detach().clone().view(p.shape),
             "lp": p.data.detach().clone()}
        assert torch.equal(v["lp"], v["fp32"].to(lp_dtype)), (name, n, "lp != fp32 master")
        mine[n] = v
    # the live flat partitions, all-gathered over the stage's dp group and cut at each
    # lp param's offset in the lp flat buffer, must say the same (a second, independent read)
    groups = (list(zip(opt.bf16_groups_flat, opt.fp32_groups_flat_partition, opt.bf16_groups))
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
    """The names DeepSpeed gave the files, and the layer files against the live lp values."""
    c = CASES[name]
    tagdir = d / TAG
    pfx = "bf16_" if c["dtype"] == "bf16" else ""
    ref = torch.load(d / "reference_live.pt", weights_only=True)
    layers = sorted({int(n.split(".")[0]) for n in ref["module_state"]})
    # no tensor axis in the topology: get_rank_repr is empty, so no "-model_TT" part
    want = sorted([f"layer_{i:02d}-model_states.pt" for i in layers]
                  + [f"mp_rank_{s:02d}_model_states.pt" for s in range(c["pp"])]
                  + [f"{pfx}zero_pp_rank_{r}_mp_rank_{s:02d}_optim_states.pt"
                     for s in range(c["pp"]) for r in range(c["dp"])])
    got = sorted(p.name for p in tagdir.iterdir())
    assert got == want, (name, got, want)
    for i in layers:
        sd = torch.load(tagdir / f"layer_{i:02d}-model_states.pt", weights_only=True)
        for k, v in sd.items():
            assert torch.equal(v, ref["module_state"][f"{i}.{k}"]), (name, i, k)
    for n, v in ref["lp"].items():
        assert torch.equal(v, ref["module_state"][n]), (name, n)


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
        spawn(c["pp"] * c["dp"], job, str(out), name)
        d = out / name
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):
            if (d / script).exists():
                (d / script).unlink()
        check_files(name, d)
        info = json.loads((d / "case.json").read_text())
        info["files"] = {k: v for k, v in info["files"].items() if k not in info["removed"]}
        (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")
        print(f"{name}: {info['optimizer_class']} {sum(info['files'].values())} bytes, {time.time() - t:.1f}s",
              flush=True)


if __name__ == "__main__":
    main()
