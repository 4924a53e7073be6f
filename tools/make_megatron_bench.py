#!/usr/bin/env python3
"""The megatron row of scripts/bench (runs in .venv-megatron, see scripts/setup-megatron).

    .venv-megatron/bin/python tools/make_megatron_bench.py make --out DIR --bytes 2e9
        a megatron-core torch_dist checkpoint of about BYTES (model + fp32 Adam
        state, fully_reshardable) saved at TP=2 x PP=2 (4 gloo processes on
        CPU) the way tools/make_megatron_checkpoints.py saves its fixtures
        (DDP + DistributedOptimizer, one optimizer step), from a GPT with
        hidden 1024, ffn 4096 and as many layers as BYTES needs; DIR/bench.json
        records the sizes used
    .venv-megatron/bin/python tools/make_megatron_bench.py consolidate --ckpt DIR --out FILE
        what users do without ckptconv: one process builds the model at
        TP=1 x PP=1, megatron-core's dist_checkpointing.load reads the model
        from DIR and torch.save writes {name: tensor}, named as ckptconv's
        `consolidate --only model` names them
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
import make_megatron_checkpoints as mk  # noqa: E402

TP, PP = 2, 2
VOCAB, SEQ = 1024, 64


def layer_params(h: int, f: int) -> int:
    """One local-spec SwiGLU layer: QKV, proj, fc1 (gate+up), fc2, two layer norms, biases."""
    return (h * 3 * h + 3 * h) + (h * h + h) + (h * 2 * f + 2 * f) + (f * h + h) + 4 * h


def choose(nbytes: float) -> dict:
    # Stored per parameter: the weight, and the optimizer's fp32 param, exp_avg, exp_avg_sq.
    per_param = 4 * 4
    hidden = 1024
    # Small targets (debug runs) get a narrower model rather than fewer than 2 layers per stage.
    while hidden > 128 and nbytes / (per_param * layer_params(hidden, 4 * hidden)) < 2 * PP:
        hidden //= 2
    ffn = 4 * hidden
    layers = max(PP, PP * round(nbytes / (per_param * layer_params(hidden, ffn)) / PP))
    params = layers * layer_params(hidden, ffn) + (VOCAB + SEQ) * hidden + 2 * hidden + VOCAB * hidden
    return {"hidden": hidden, "ffn": ffn, "layers": layers, "heads": hidden // 64, "vocab": VOCAB, "seq": SEQ,
            "tensor_model_parallel_size": TP, "pipeline_model_parallel_size": PP, "world_size": TP * PP,
            "params": params, "target_bytes": nbytes, "distrib_optim_sharding_type": "fully_reshardable"}


def sizes(meta: dict) -> dict:
    """The TransformerConfig fields the bench sets (the rest are the fixtures')."""
    return {"num_layers": meta["layers"], "hidden_size": meta["hidden"], "num_attention_heads": meta["heads"],
            "ffn_hidden_size": meta["ffn"]}


def save_job(rank: int, ws: int, port: int, meta: dict, out: str) -> None:
    mk._init(rank, ws, port)
    from megatron.core import parallel_state as ps
    model, ddp, opt = mk.build(TP, PP, sizes(meta), meta["vocab"], meta["seq"])
    mk.step_and_save(rank, model, ddp, opt, meta["distrib_optim_sharding_type"], out)
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def make(out: Path, nbytes: float) -> None:
    import megatron.core
    meta = choose(nbytes)
    meta.update(megatron_core=megatron.core.__version__, torch=torch.__version__,
                spec="get_gpt_layer_local_spec (SwiGLU)")
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(save_job, args=(meta["world_size"], mk.free_port(), meta, str(out)), nprocs=meta["world_size"],
             join=True)
    # Written last: scripts/bench takes its presence to mean the checkpoint is complete.
    (out / "bench.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"{out}: {size} bytes, {meta['layers']} layers, hidden {meta['hidden']}, {meta['params']} parameters")


def consolidate(ckpt: Path, out: Path) -> None:
    """In this process (world size 1), so the caller's peak RSS is the whole job's."""
    mk._init(0, 1, mk.free_port())
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    meta = json.loads((ckpt / "bench.json").read_text())
    # No random init: load overwrites every parameter (keeps the comparison in megatron's favour).
    _, model = mk.build_model(1, 1, sizes(meta), meta["vocab"], meta["seq"], init=False)
    msd = model.sharded_state_dict()
    keys = {k: sh.key for k, sh in msd.items() if not isinstance(sh, ShardedObject)}
    loaded = dist_checkpointing.load(msd, str(ckpt))
    torch.save({mk.unstacked_name(key, k): loaded[k] for k, key in keys.items()}, out)
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--bytes", type=float, required=True)
    c = sub.add_parser("consolidate")
    c.add_argument("--ckpt", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "make":
        make(args.out, args.bytes)
    else:
        consolidate(args.ckpt, args.out)


if __name__ == "__main__":
    main()
