#!/usr/bin/env python3
"""The megatron-legacy row of scripts/bench (runs in .venv-megatron, see scripts/setup-megatron).

    .venv-megatron/bin/python tools/make_megatron_legacy_bench.py make --out DIR --bytes 2e9
        a Megatron-LM legacy (ckpt_format=torch) checkpoint of about BYTES at
        TP=2 x PP=2: DIR/latest_checkpointed_iteration.txt and
        DIR/iter_0000007/mp_rank_{tp:02d}_{pp:03d}/model_optim_rng.pt, each
        rank file holding what the committed fixture
        testdata/megatron_legacy/gpt_tp2pp2 (written by Megatron-LM's own
        save_checkpoint) holds at the same rank, in its order: `args` (the
        fixture's argparse.Namespace, as Megatron-LM's parse_args made it,
        with the bench's sizes put in), `checkpoint_version`, `iteration`,
        `model`, `optimizer`, `rng_state` (the fixture's) and
        `num_floating_point_operations_so_far`. `model` and `optimizer` are
        what save_checkpoint takes them from: the rank's
        state_dict_for_save_checkpoint() and the plain Adam optimizer's
        state_dict() (megatron-core's FP32Optimizer), after one optimizer
        step, from 4 gloo processes on the CPU building the fixture's GPT
        (get_gpt_layer_local_spec: SwiGLU, biases, grouped-query attention
        with 2 query heads per group, learned absolute positions, untied)
        at hidden 1024, ffn 4096 and as many layers as BYTES needs.
        Megatron-LM's save_checkpoint itself is not run: Megatron-LM is not on
        PyPI and the bench has no tree of it (the fixtures' generator,
        tools/make_megatron_legacy_checkpoints.py, needs one); its rank file
        is a torch.save of that dict, which this writes. DIR/bench.json
        records the sizes.
    .venv-megatron/bin/python tools/make_megatron_legacy_bench.py consolidate --ckpt DIR --out FILE
        what users write without ckptconv (Megatron-LM's tools/checkpoint/
        convert.py, loader legacy -> saver, needs that same tree, so it cannot
        run in the bench): per pipeline stage, torch.load every tensor-parallel
        rank's file, merge each parameter by Megatron's layout (column-parallel
        on dim 0, SwiGLU's fc1 as [gate_0..; up_0..], row-parallel weights on
        dim 1, the rest whole), renumber the layers after the earlier stages',
        and torch.save {name: tensor}, named as ckptconv's
        `consolidate --only model` names them
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_megatron_checkpoints as mk  # noqa: E402
import make_megatron_legacy_checkpoints as legacy  # noqa: E402

TP, PP = 2, 2
VOCAB, SEQ = 1024, 64
TEMPLATE = Path(__file__).resolve().parent.parent / "testdata" / "megatron_legacy" / "gpt_tp2pp2" / "ckpt"


def layer_params(h: int, f: int) -> int:
    """One layer of the fixture's shape: QKV with biases (2 query heads per
    group: the key and value heads are h/2 rows each), proj, SwiGLU fc1
    (gate+up) and fc2 with biases, two LayerNorms (weight and bias)."""
    return (2 * h * h + 2 * h) + (h * h + h) + (2 * f * h + 2 * f) + (f * h + h) + 4 * h


def choose(nbytes: float) -> dict:
    per_param = 3 * 4  # fp32: the weight (its own master) and Adam's exp_avg, exp_avg_sq
    hidden = 1024
    while hidden > 128 and nbytes / (per_param * layer_params(hidden, 4 * hidden)) < 2 * PP:
        hidden //= 2
    ffn, heads = 4 * hidden, hidden // 64
    layers = max(PP, PP * round(nbytes / (per_param * layer_params(hidden, ffn)) / PP))
    params = layers * layer_params(hidden, ffn) + (2 * VOCAB + SEQ) * hidden + 2 * hidden
    return {"hidden": hidden, "ffn": ffn, "layers": layers, "heads": heads, "query_groups": heads // 2,
            "vocab": VOCAB, "seq": SEQ, "tensor_model_parallel_size": TP, "pipeline_model_parallel_size": PP,
            "params": params, "target_bytes": nbytes}


def bench_args(template, meta: dict):
    """The fixture's Megatron-LM args with the bench's sizes (the fields
    parse_args and validate_args derive from them included)."""
    args = copy.copy(template)
    args.num_layers = meta["layers"]
    args.hidden_size = meta["hidden"]
    args.ffn_hidden_size = meta["ffn"]
    args.num_attention_heads = meta["heads"]
    args.num_query_groups = meta["query_groups"]
    args.vocab_size = args.padded_vocab_size = meta["vocab"]
    args.seq_length = args.max_position_embeddings = meta["seq"]
    return args


def transformer_config(meta: dict) -> dict:
    """The TransformerConfig fields core_transformer_config_from_args gives
    the fixture's args at the bench's sizes (fp32, SwiGLU, GQA)."""
    return {"num_layers": meta["layers"], "hidden_size": meta["hidden"], "num_attention_heads": meta["heads"],
            "num_query_groups": meta["query_groups"], "ffn_hidden_size": meta["ffn"]}


def save_job(rank: int, ws: int, port: int, meta: dict, out: str) -> None:
    legacy._init(rank, ws, port)
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    cfg, model = mk.build_model(TP, PP, transformer_config(meta), meta["vocab"], meta["seq"])
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(use_distributed_optimizer=False), module=model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=False,
                                                 params_dtype=torch.float32), [ddp])
    legacy.set_gradients(model)
    ddp.finish_grad_sync()
    ok, _, _ = opt.step()
    assert ok, "the optimizer step was skipped"
    tp, pp = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    rank_dir = f"mp_rank_{tp:02d}_{pp:03d}"
    template = torch.load(TEMPLATE / f"iter_{meta['iteration']:07d}" / rank_dir / "model_optim_rng.pt",
                          map_location="cpu", weights_only=False)
    fresh = {"args": bench_args(template["args"], meta), "model": model.state_dict_for_save_checkpoint(),
             "optimizer": opt.state_dict()}
    state = {k: fresh.get(k, v) for k, v in template.items()}  # the fixture's keys, in its order
    target = Path(out) / f"iter_{meta['iteration']:07d}" / rank_dir
    target.mkdir(parents=True, exist_ok=True)
    torch.save(state, target / "model_optim_rng.pt")
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def make(out: Path, nbytes: float) -> None:
    import megatron.core
    meta = choose(nbytes)
    meta["iteration"] = int((TEMPLATE / "latest_checkpointed_iteration.txt").read_text())
    meta.update(megatron_core=megatron.core.__version__, torch=torch.__version__,
                spec="get_gpt_layer_local_spec() (SwiGLU, biases, GQA, learned positions, untied)",
                template=str(TEMPLATE.relative_to(TEMPLATE.parents[2])))
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(save_job, args=(TP * PP, mk.free_port(), meta, str(out)), nprocs=TP * PP, join=True)
    (out / "latest_checkpointed_iteration.txt").write_text(str(meta["iteration"]))
    # Written last: scripts/bench takes its presence to mean the checkpoint is complete.
    (out / "bench.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("model_optim_rng.pt"))
    print(f"{out}: {size} bytes, {meta['layers']} layers, hidden {meta['hidden']}, {meta['params']} parameters")


LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
COLUMN = ("word_embeddings", "linear_qkv", "output_layer")  # split on dim 0
ROW = ("linear_proj", "linear_fc2")  # weights split on dim 1, biases whole


def merge(name: str, pieces: list, swiglu: bool):
    """One parameter of a TP=1 model from its tensor-parallel pieces."""
    module = name.rsplit(".", 2)[-2]
    if not isinstance(pieces[0], torch.Tensor) or len(pieces) == 1:
        return pieces[0]
    if module == "linear_fc1" and swiglu:  # each rank holds [gate_r; up_r]
        halves = [p.chunk(2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    if module in COLUMN or module == "linear_fc1":
        return torch.cat(pieces, dim=0)
    if module in ROW and name.endswith(".weight"):
        return torch.cat(pieces, dim=1)
    return pieces[0]  # layer norms, position embeddings, row-parallel biases: whole on every rank


def consolidate(ckpt: Path, out: Path) -> None:
    iteration = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    folder = ckpt / f"iter_{iteration:07d}"
    merged, first_layer = {}, 0
    stage = 0
    while True:
        paths = [folder / f"mp_rank_{tp:02d}_{stage:03d}" / "model_optim_rng.pt" for tp in range(16)]
        paths = [p for p in paths if p.is_file()]
        if not paths:
            break
        ranks = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
        swiglu = ranks[0]["args"].swiglu
        layers = set()
        for name in ranks[0]["model"]:
            m = LAYER.match(name)
            if m:
                layers.add(int(m.group(1)))
                name_out = f"decoder.layers.{int(m.group(1)) + first_layer}.{name[m.end():]}"
            else:
                name_out = name
            merged[name_out] = merge(name, [r["model"][name] for r in ranks], swiglu)
        first_layer += len(layers)
        del ranks
        stage += 1
    torch.save(merged, out)


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
