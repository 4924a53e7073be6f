#!/usr/bin/env python3
"""Write real DeepSpeed checkpoints WITHOUT ZeRO (``zero_optimization.stage: 0``).

At stage 0 DeepSpeed 0.19.8 writes no ``*_optim_states.pt``: data-parallel
rank 0 saves ``mp_rank_00_model_states.pt`` whose ``optimizer`` entry is the
engine optimizer's own ``state_dict()`` (engine._common_checkpoint_state):

- fp32: the client/basic torch optimizer's state dict (``state`` keyed by
  position, ``param_groups`` listing positions); the masters are ``module``.
- fp16: ``FP16_UnfusedOptimizer.state_dict()`` (torch AdamW is not a fused
  optimizer): loss-scaler fields, ``optimizer_state_dict`` (the torch one)
  and ``fp32_groups`` (the fp32 master of every position).

``param_shapes`` and ``shared_params`` are None at stage 0: nothing names
the optimizer's positions. DeepSpeed's own resume maps them by position onto
the engine's param groups, so these runs pass ``model.parameters()`` (every
parameter, the frozen one too, in module order: the DeepSpeed tutorials' call)
as the engine's ``model_parameters``.

Same model, steps, data and plumbing as tools/make_zero_checkpoints.py
(imported from it). Each case folder holds ``latest``, ``global_step3/``,
``reference_live.pt`` (gathered from the live engine after step 3:
``{"model": {fqn: fp32 master}, "optim": {fqn: {exp_avg, exp_avg_sq, step}},
"param_groups", "lp", "buffers", "tied"}``) and ``case.json``.

    .venv-deepspeed/bin/python tools/make_zero0_checkpoints.py [--out testdata/zero] [--only CASE ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_zero_checkpoints as mz  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

CASES = {
    "z0_fp32_ws2": dict(dtype="fp32", world_size=2, extra={},
                        exercises="no ZeRO, fp32: the torch AdamW state_dict inside the model-states file, "
                                  "masters = module"),
    "z0_fp16_ws2": dict(dtype="fp16", world_size=2, extra={"fp16": {"enabled": True, "initial_scale_power": 8}},
                        exercises="no ZeRO, fp16: FP16_UnfusedOptimizer state_dict (loss scaler, fp32_groups, "
                                  "optimizer_state_dict) inside the model-states file"),
}


def ds_config(c) -> dict:
    cfg = mz.ds_config(dict(stage=0, dtype=c["dtype"], zero_extra={}, extra={}))
    cfg.update(json.loads(json.dumps(c["extra"])))
    return cfg


def job(rank: int, ws: int, out: str, name: str) -> None:
    import deepspeed
    c = CASES[name]
    d = Path(out) / name
    if c["dtype"] == "fp16":
        mz.fp16_gate_patch()
    model = mz.fresh_model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(c))
    cls = type(engine.optimizer).__name__
    assert cls == {"fp32": "AdamW", "fp16": "FP16_UnfusedOptimizer"}[c["dtype"]], cls
    lp_dtype = {"fp16": torch.float16, "fp32": torch.float32}[c["dtype"]]
    for step in range(mz.STEPS):
        loss = engine(mz.batch(step, rank).to(lp_dtype))
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == mz.STEPS and engine.skipped_steps == 0

    if rank == 0 and d.exists():
        shutil.rmtree(d)
    dist.barrier()
    engine.save_checkpoint(str(d))
    dist.barrier()

    named = dict(engine.module.named_parameters())
    torch_opt = engine.optimizer.optimizer if c["dtype"] == "fp16" else engine.optimizer
    positions = [p for g in torch_opt.param_groups for p in g["params"]]
    # fp16: the wrapper's fp32 copy of each position; fp32: the param itself
    masters = ([q for g in engine.optimizer.fp32_groups for q in g] if c["dtype"] == "fp16" else positions)
    # FP16_UnfusedOptimizer keeps only the trainable parameters of each group
    held = [n for n, p in named.items() if p.requires_grad or c["dtype"] == "fp32"]
    assert len(positions) == len(held) == len(masters), (len(positions), len(held))
    model_ref, optim_ref = {}, {}
    for n, m in zip(held, masters):
        if not named[n].requires_grad:
            continue
        st = torch_opt.state[m]
        model_ref[n] = m.detach().clone().float()
        optim_ref[n] = {"exp_avg": st["exp_avg"].clone(), "exp_avg_sq": st["exp_avg_sq"].clone(),
                        "step": st["step"].clone()}
    assert list(model_ref) == mz.TRAINABLE, list(model_ref)
    # every data-parallel rank holds the same state: rank 0's is everyone's
    for n in mz.TRAINABLE:
        for t in (model_ref[n], optim_ref[n]["exp_avg"], optim_ref[n]["exp_avg_sq"]):
            other = t.clone()
            dist.broadcast(other, 0)
            assert torch.equal(other, t), (name, n, "ranks differ")
    lp = {n: p.data.detach().clone() for n, p in named.items()}
    for n in mz.TRAINABLE:
        assert lp[n].dtype == lp_dtype and torch.equal(lp[n], model_ref[n].to(lp_dtype)), (name, n)
    h = {k: (list(v) if isinstance(v, tuple) else v) for k, v in torch_opt.param_groups[0].items() if k != "params"}
    h["params"] = list(held)  # every position the optimizer holds (fp32: frozen.weight too)
    buffers = {n: b.detach().clone() for n, b in engine.module.named_buffers()}
    if rank != 0:
        return
    ref_live = {"model": model_ref, "optim": optim_ref, "param_groups": [h], "lp": lp, "buffers": buffers,
                "tied": dict(mz.TIED)}
    torch.save(ref_live, d / "reference_live.pt")
    (d / "case.json").write_text(json.dumps(finish_case(name, c, d, cls, ref_live), indent=1) + "\n")


def finish_case(name, c, d: Path, cls, ref_live) -> dict:
    """What the files hold, checked against the live values (rank 0)."""
    import deepspeed
    tagdir = d / mz.TAG
    got = sorted(p.name for p in tagdir.iterdir())
    assert got == ["mp_rank_00_model_states.pt"], got
    ms = mz.load(tagdir / "mp_rank_00_model_states.pt")
    assert ms["param_shapes"] is None and ms["shared_params"] is None and ms["frozen_param_shapes"] is None
    assert ms["ds_version"] == deepspeed.__version__ and ms["dp_world_size"] == c["world_size"]
    opt = ms["optimizer"]
    torch_sd = opt["optimizer_state_dict"] if c["dtype"] == "fp16" else opt
    names = [n for n in ms["module"] if n not in ("scale", "head_tied.weight")]
    if c["dtype"] == "fp16":  # the wrapper holds the trainable parameters only
        names = [n for n in names if n in mz.TRAINABLE]
    assert torch_sd["param_groups"][0]["params"] == list(range(len(names))), torch_sd["param_groups"]
    # position i is the i-th parameter the optimizer holds: the files checked against the live values
    for i, n in enumerate(names):
        if n not in mz.TRAINABLE:
            assert i not in torch_sd["state"], (name, i, "frozen parameter has optimizer state")
            continue
        st = torch_sd["state"][i]
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(st[k], ref_live["optim"][n][k]), (name, n, k)
        master = opt["fp32_groups"][0][i] if c["dtype"] == "fp16" else ms["module"][n]
        assert master.dtype == torch.float32 and torch.equal(master, ref_live["model"][n]), (name, n)
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    return {
        "case": name, "stage": 0, "dtype": c["dtype"], "world_size": c["world_size"], "optimizer_class": cls,
        "exercises": c["exercises"], "ds_config": ds_config(c), "ds_version": deepspeed.__version__,
        "torch_version": torch.__version__, "seed": mz.SEED, "steps": mz.STEPS, "tag": mz.TAG,
        "model": mz.MODEL_DESC, "model_parameters": "model.parameters() (frozen.weight included, module order)",
        "tensors": mz.SHAPES, "tied": mz.TIED,
        "optimizer_keys": sorted(k for k in opt if k != "state"),
        "files": files, "removed": ["zero_to_fp32.py"],
        "patches": ["deepspeed.comm.torch.build_shm_op -> None"]
                   + ([mz.FP16_PATCH] if c["dtype"] == "fp16" and not mz._mkldnn_fp16() else []),
        "references": {"reference_live.pt": "gathered in the engine after the last step"},
        "generator": "tools/make_zero0_checkpoints.py",
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "testdata" / "zero"))
    ap.add_argument("--only", nargs="*", choices=sorted(CASES))
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only or CASES:
        t = time.time()
        mz.spawn(CASES[name]["world_size"], job, str(out), name)
        d = out / name
        for script in ("zero_to_fp32.py", "zero_to_torch.py"):
            if (d / script).exists():
                (d / script).unlink()
        info = json.loads((d / "case.json").read_text())
        info["files"] = {k: v for k, v in info["files"].items() if k not in ("zero_to_fp32.py", "zero_to_torch.py")}
        (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")
        print(f"{name}: {info['optimizer_class']} {sum(info['files'].values())} bytes, {time.time() - t:.1f}s",
              flush=True)


if __name__ == "__main__":
    main()
