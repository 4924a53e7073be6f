#!/usr/bin/env python3
"""Loads a DeepSpeed universal checkpoint into a real DeepSpeed engine and trains on.

Run by tests/test_ds_universal.py with the DeepSpeed side environment
(``.venv-deepspeed``, scripts/setup-deepspeed; CPU, gloo), never by the
project venv:

    .venv-deepspeed/bin/python tests/ds_universal_load.py CASE LOAD_DIR TAG WORLD_SIZE OUT.pt [--native] [--fix-z3-step]

CASE is a case of tools/make_zero_checkpoints.py (its model, ds_config, param
groups and batches are imported from there, nothing is copied). WORLD_SIZE
ranks are spawned; each builds the case's engine with
``"checkpoint": {"load_universal": true}`` (``--native``: without it, to load
a ZeRO checkpoint at the world size it was saved at) and calls
``engine.load_checkpoint(LOAD_DIR, tag=TAG, load_optimizer_states=True,
load_lr_scheduler_states=True)``. Rank 0 writes OUT.pt::

    {"loaded": {fqn: {"fp32", "exp_avg", "exp_avg_sq", "step"}},  # right after the load
     "after":  {fqn: {...}},     # after two more steps on batch(3, rank), batch(4, rank)
     "losses": [[per-rank loss] per step],
     "global_steps", "skipped_steps", "global_samples",
     "lr_scheduler": the engine scheduler's state_dict() or None,
     "client_state": what load_checkpoint returned, plain values only}

Values are gathered by tools/make_zero_resume_refs.py's gather_trainable:
ZeRO-1/2 from the live flat partitions (DeepSpeed's safe_get_full_* helpers
are wrong for param groups >= 1 there), ZeRO-3 with
safe_get_full_fp32_param / safe_get_full_optimizer_state.

DeepSpeed 0.19.8's ZeRO-3 universal load gives every sub-group the same step
tensor (stage3.py load_hp_checkpoint_state_from_checkpoint_dir_stage3), so
with two groups each step advances it once per group. Training on from such a
load needs the tensors separated; ``--fix-z3-step`` clones them (what a user
does after load_checkpoint), and the caller passes it for both checkpoints it
compares.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import make_zero_checkpoints as gen  # noqa: E402
from make_zero_resume_refs import gather_trainable  # noqa: E402

STEPS_AFTER = (3, 4)


def job(rank: int, ws: int, name: str, load_dir: str, tag: str, out: str, fix_z3_step: bool, native: bool) -> None:
    c = dict(gen.CASES[name])
    if not native:
        c["extra"] = {**c["extra"], "checkpoint": {"load_universal": True}}
    if c["dtype"] == "fp16":
        gen.fp16_gate_patch()
    engine, group_names = gen.make_engine(c)
    cls = type(engine.optimizer).__name__
    _, client_state = engine.load_checkpoint(load_dir, tag=tag, load_optimizer_states=True,
                                             load_lr_scheduler_states=True)
    if fix_z3_step and c["stage"] == 3:
        base = engine.optimizer.optimizer
        for p in engine.optimizer.fp32_partitioned_groups_flat:
            if "step" in base.state[p]:
                base.state[p]["step"] = base.state[p]["step"].clone()
    loaded = gather_trainable(engine, c, cls, group_names)
    lp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[c["dtype"]]
    losses = []
    for step in STEPS_AFTER:
        loss = engine(gen.batch(step, rank).to(lp_dtype))
        engine.backward(loss)
        engine.step()
        per_rank = [None] * ws
        dist.all_gather_object(per_rank, float(loss))
        losses.append(per_rank)
    after = gather_trainable(engine, c, cls, group_names)
    if rank == 0:
        torch.save({
            "loaded": loaded, "after": after, "losses": losses,
            "global_steps": engine.global_steps, "skipped_steps": engine.skipped_steps,
            "global_samples": engine.global_samples,
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
            "client_state": {k: v for k, v in (client_state or {}).items()
                             if isinstance(v, (int, float, str, bool, list, dict, type(None)))},
        }, out)


def main(argv) -> None:
    flags = {"--fix-z3-step", "--native"}
    name, load_dir, tag, ws, out = [a for a in argv if a not in flags]
    gen.spawn(int(ws), job, name, load_dir, tag, out, "--fix-z3-step" in argv, "--native" in argv)


if __name__ == "__main__":
    main(sys.argv[1:])
