#!/usr/bin/env python3
"""The megatron rows of scripts/bench (runs in .venv-megatron, see scripts/setup-megatron).

    .venv-megatron/bin/python tools/make_megatron_bench.py make --out DIR --bytes 2e9 [--hf-python PY]
        a megatron-core torch_dist checkpoint of about BYTES (model + fp32 Adam
        state, fully_reshardable) saved at TP=2 x PP=2 (4 gloo processes on
        CPU) the way tools/make_megatron_checkpoints.py saves its fixtures
        (DDP + DistributedOptimizer, one optimizer step), from a GPT shaped as
        Llama so that the architecture map megatron-gpt-llama applies
        (get_gpt_layer_local_spec with RMSNorm, SwiGLU, rotary positions,
        grouped-query attention with 2 query heads per group, no linear
        biases) with hidden 1024, ffn 4096 and as many layers as BYTES needs;
        DIR/bench.json records the sizes used. With --hf-python (a Python
        with transformers: .venv-hf, scripts/setup-hf), DIR/hf_config/ is
        the matching LlamaForCausalLM config, written by transformers' own
        LlamaConfig (tools/make_arch_checkpoints.py's HF_CONFIG)
    .venv-megatron/bin/python tools/make_megatron_bench.py consolidate --ckpt DIR --out FILE
        what users do without ckptconv: one process builds the model at
        TP=1 x PP=1, megatron-core's dist_checkpointing.load reads the model
        from DIR and torch.save writes {name: tensor}, named as ckptconv's
        `consolidate --only model` names them
    .venv-megatron/bin/python tools/make_megatron_bench.py export --ckpt DIR --out OUT_DIR
        the Python route to a Hugging Face folder: the same load, the
        Llama mapping written plainly in torch (QKV split per query group,
        fc1 split into gate and up, the names; maps/megatron-gpt-llama.json
        is ckptconv's), and the files save_pretrained writes for a model
        under its 5 GB shard size: one model.safetensors (safetensors'
        save_file, metadata {"format": "pt"}) and config.json. No side
        environment has both megatron-core and transformers, so
        save_pretrained itself is not called: it would build the
        LlamaForCausalLM, take its state dict and call the same save_file.
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
ROTARY_BASE, RMS_EPS = 10000, 1e-5


def layer_params(h: int, f: int) -> int:
    """One Llama-shaped layer: QKV (GQA: 2 query heads per group, so the key
    and value heads are h/2 rows each), proj, fc1 (gate+up), fc2, two RMSNorms."""
    return h * 2 * h + h * h + h * 2 * f + f * h + 2 * h


def choose(nbytes: float) -> dict:
    # Stored per parameter: the weight, and the optimizer's fp32 param, exp_avg, exp_avg_sq.
    per_param = 4 * 4
    hidden = 1024
    # Small targets (debug runs) get a narrower model rather than fewer than 2 layers per stage.
    while hidden > 128 and nbytes / (per_param * layer_params(hidden, 4 * hidden)) < 2 * PP:
        hidden //= 2
    ffn = 4 * hidden
    layers = max(PP, PP * round(nbytes / (per_param * layer_params(hidden, ffn)) / PP))
    params = layers * layer_params(hidden, ffn) + 2 * VOCAB * hidden + hidden
    heads = hidden // 64
    return {"hidden": hidden, "ffn": ffn, "layers": layers, "heads": heads, "query_groups": heads // 2,
            "vocab": VOCAB, "seq": SEQ, "tensor_model_parallel_size": TP, "pipeline_model_parallel_size": PP,
            "world_size": TP * PP, "params": params, "target_bytes": nbytes,
            "distrib_optim_sharding_type": "fully_reshardable"}


def sizes(meta: dict) -> dict:
    """The TransformerConfig fields the bench sets (the rest are the fixtures'):
    the sizes, and Llama's shape."""
    return {"num_layers": meta["layers"], "hidden_size": meta["hidden"], "num_attention_heads": meta["heads"],
            "num_query_groups": meta["query_groups"], "ffn_hidden_size": meta["ffn"],
            "normalization": "RMSNorm", "add_bias_linear": False, "layernorm_epsilon": RMS_EPS}


SPEC_ARGS = {"normalization": "RMSNorm"}
MODEL_ARGS = {"position_embedding_type": "rope", "rotary_base": ROTARY_BASE,
              "share_embeddings_and_output_weights": False}


def hf_fields(meta: dict) -> dict:
    """The LlamaForCausalLM config of the bench's GPT."""
    return dict(vocab_size=meta["vocab"], hidden_size=meta["hidden"], intermediate_size=meta["ffn"],
                num_hidden_layers=meta["layers"], num_attention_heads=meta["heads"],
                num_key_value_heads=meta["query_groups"], head_dim=meta["hidden"] // meta["heads"],
                rms_norm_eps=RMS_EPS, rope_theta=float(ROTARY_BASE), max_position_embeddings=meta["seq"],
                tie_word_embeddings=False, hidden_act="silu")


def save_job(rank: int, ws: int, port: int, meta: dict, out: str) -> None:
    mk._init(rank, ws, port)
    from megatron.core import parallel_state as ps
    model, ddp, opt = mk.build(TP, PP, sizes(meta), meta["vocab"], meta["seq"], SPEC_ARGS, MODEL_ARGS)
    mk.step_and_save(rank, model, ddp, opt, meta["distrib_optim_sharding_type"], out)
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def make(out: Path, nbytes: float, hf_python: str | None) -> None:
    import megatron.core
    meta = choose(nbytes)
    meta.update(megatron_core=megatron.core.__version__, torch=torch.__version__,
                spec="get_gpt_layer_local_spec(normalization='RMSNorm') (Llama: SwiGLU, RoPE, GQA, no biases)")
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(save_job, args=(meta["world_size"], mk.free_port(), meta, str(out)), nprocs=meta["world_size"],
             join=True)
    if hf_python:
        import subprocess
        from make_arch_checkpoints import HF_CONFIG
        meta["transformers"] = subprocess.run(
            [hf_python, "-c", HF_CONFIG, "LlamaForCausalLM", json.dumps(hf_fields(meta)), str(out / "hf_config")],
            check=True, capture_output=True, text=True).stdout.strip()
    # Written last: scripts/bench takes its presence to mean the checkpoint is complete.
    (out / "bench.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"{out}: {size} bytes, {meta['layers']} layers, hidden {meta['hidden']}, {meta['params']} parameters")


def load_tp1(ckpt: Path) -> dict:
    """What a user's script gets from megatron-core: the TP=1 x PP=1 model
    built (no random init: load overwrites every parameter, which keeps the
    comparison in megatron's favour) and filled by dist_checkpointing.load,
    {name: tensor} under the names ckptconv's --only model gives (the layer
    index after `layers.`). In this process (world size 1), so the caller's
    peak RSS is the whole job's."""
    mk._init(0, 1, mk.free_port())
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    meta = json.loads((ckpt / "bench.json").read_text())
    _, model = mk.build_model(1, 1, sizes(meta), meta["vocab"], meta["seq"], init=False, spec_args=SPEC_ARGS,
                              model_args=MODEL_ARGS)
    msd = model.sharded_state_dict()
    keys = {k: sh.key for k, sh in msd.items() if not isinstance(sh, ShardedObject)}
    loaded = dist_checkpointing.load(msd, str(ckpt))
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return {mk.unstacked_name(key, k): loaded[k] for k, key in keys.items()}


def consolidate(ckpt: Path, out: Path) -> None:
    torch.save(load_tp1(ckpt), out)


def to_llama(model: dict, cfg: dict) -> dict:
    """megatron-core's Llama-shaped GPT in LlamaForCausalLM's names, as
    users write it (Megatron-Bridge's and mbridge's Llama mappings do the
    same): linear_qkv's rows are per query group [its query heads; its key;
    its value]; linear_fc1 is [gate; up]; the layer norms are saved under
    the fused linears' names; the vocabulary is cut to the config's."""
    heads, groups, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    out = {"model.embed_tokens.weight": model["embedding.word_embeddings.weight"][:vocab]}
    for i in range(cfg["num_hidden_layers"]):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = model[src + "self_attention.linear_qkv.weight"].view(groups, (heads // groups + 2) * hd, hidden)
        q, k, v = qkv.split([heads // groups * hd, hd, hd], dim=1)
        gate, up = model[src + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out.update({
            dst + "input_layernorm.weight": model[src + "self_attention.linear_qkv.layer_norm_weight"],
            dst + "self_attn.q_proj.weight": q.reshape(heads * hd, hidden),
            dst + "self_attn.k_proj.weight": k.reshape(groups * hd, hidden),
            dst + "self_attn.v_proj.weight": v.reshape(groups * hd, hidden),
            dst + "self_attn.o_proj.weight": model[src + "self_attention.linear_proj.weight"],
            dst + "post_attention_layernorm.weight": model[src + "mlp.linear_fc1.layer_norm_weight"],
            dst + "mlp.gate_proj.weight": gate,
            dst + "mlp.up_proj.weight": up,
            dst + "mlp.down_proj.weight": model[src + "mlp.linear_fc2.weight"],
        })
    out["model.norm.weight"] = model["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = model["output_layer.weight"][:vocab]
    return out


def export(ckpt: Path, out: Path) -> None:
    from safetensors.torch import save_file
    cfg = json.loads((ckpt / "hf_config" / "config.json").read_text())
    hf = to_llama(load_tp1(ckpt), cfg)
    out.mkdir(parents=True)
    # save_pretrained's own call for one shard (its tensors made contiguous first).
    save_file({k: v.contiguous() for k, v in hf.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    for f in (ckpt / "hf_config").iterdir():
        (out / f.name).write_bytes(f.read_bytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--bytes", type=float, required=True)
    m.add_argument("--hf-python", help="a Python with transformers, to write hf_config/")
    for name in ("consolidate", "export"):
        c = sub.add_parser(name)
        c.add_argument("--ckpt", type=Path, required=True)
        c.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "make":
        make(args.out, args.bytes, args.hf_python)
    else:
        {"consolidate": consolidate, "export": export}[args.cmd](args.ckpt, args.out)


if __name__ == "__main__":
    main()
