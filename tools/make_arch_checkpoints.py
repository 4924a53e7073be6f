#!/usr/bin/env python3
"""Write real Megatron-core GPT checkpoints configured as Hugging Face
architectures, with megatron's own logits, for the architecture-map proofs
(tests/test_arch_maps.py, docs/maps.md).

    .venv-megatron/bin/python tools/make_arch_checkpoints.py --out testdata/arch [CASE ...]

Needs .venv-megatron (scripts/setup-megatron: megatron-core 0.16.1) and
.venv-hf (scripts/setup-hf: transformers 5, which writes each case's
config.json). Each case is three real megatron-core jobs on this machine's
CPUs (gloo processes, CUDA calls pointed at the CPU as in
tools/make_megatron_checkpoints.py, whose helpers this imports):

1. one process builds the GPT at TP=1 x PP=1 from get_gpt_layer_local_spec
   (RMSNorm, SwiGLU, RoPE, no linear biases; GQA; weights drawn with std 0.1
   so that the logits are of order 1), gives every layer norm
   weight distinct values (their init is all ones, which no map could get
   wrong), and saves it with dist_checkpointing.save;
2. TP x PP (x EP) processes build the model at the case's parallelism, load
   that checkpoint with megatron-core's dist_checkpointing.load and save it
   again: CASE/ckpt is what megatron-core wrote at TP x PP (the MoE cases:
   at expert parallelism 2, each rank holding half the experts);
3. one process builds the model at TP=1 x PP=1, loads CASE/ckpt and runs
   GPTModel.forward on fixed token ids in fp32: CASE/logits.json holds the
   ids and the logits of the real vocabulary (the padded rows are no
   token's).

The vocabulary is padded as Megatron-LM pads it (to a multiple of
make_vocab_size_divisible_by x TP), so the embedding and output layer hold
rows the Hugging Face model has not. CASE/hf_config/ holds the Hugging Face
config (written by transformers' own config class) and a tokenizer file,
which the export must copy. CASE/case.json records versions and sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_megatron_checkpoints import _init, free_port  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HF_PY = REPO / ".venv-hf" / "bin" / "python"

# The shared shape: GQA with 4 query heads in 2 groups, head_dim 8.
BASE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, kv_channels=8,
            ffn_hidden_size=48, layernorm_epsilon=1e-6)
ROTARY_BASE = 10000
VOCAB, DIVISIBLE_BY, SEQ = 60, 8, 16
TOKENS = [[3, 17, 42, 8, 59, 0, 23, 11, 5, 36], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]

MOE = dict(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=24, moe_grouped_gemm=False)

# name -> (tp, pp, extra TransformerConfig, local spec options, Hugging Face architecture, config fields)
CASES = {
    "llama_gqa_tp2pp2": (2, 2, {}, {}, "LlamaForCausalLM", {}),
    "qwen2_tp2pp1": (2, 1, {"add_qkv_bias": True}, {}, "Qwen2ForCausalLM", {}),
    "qwen3_tp1pp2": (1, 2, {"qk_layernorm": True}, {"qk_layernorm": True}, "Qwen3ForCausalLM", {}),
    # share_embeddings_and_output_weights: no output_layer.weight is saved.
    "llama_tied_tp2pp1": (2, 1, {"share_embeddings_and_output_weights": True}, {}, "LlamaForCausalLM",
                          {"tie_word_embeddings": True}),
    # Mixture of experts (SequentialMLP, the local spec's; TEGroupedMLP saves
    # the same keys): 4 experts of ffn 24, top-2, saved at expert parallelism
    # 2 (each of the 2 ranks holds 2 experts). Megatron's default router
    # (top-k of the logits, then softmax over those k) is Mixtral's (softmax,
    # top-k, renormalised) and Qwen3-MoE's with norm_topk_prob; no aux loss
    # at inference, no capacity factor (no token dropped).
    "mixtral_ep2": (1, 1, {**MOE, "expert_model_parallel_size": 2}, {"num_experts": 4},
                    "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                           "intermediate_size": MOE["moe_ffn_hidden_size"]}),
    "qwen3moe_ep2": (1, 1, {**MOE, "expert_model_parallel_size": 2, "qk_layernorm": True},
                     {"num_experts": 4, "qk_layernorm": True}, "Qwen3MoeForCausalLM",
                     {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": MOE["moe_ffn_hidden_size"],
                      "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}),
}
# The GPTModel argument among a case's extra config (the rest is TransformerConfig's).
MODEL_ARGS = ("share_embeddings_and_output_weights",)


def padded_vocab(tp: int) -> int:
    """Megatron-LM's _vocab_size_with_padding."""
    multiple = DIVISIBLE_BY * tp
    return (VOCAB + multiple - 1) // multiple * multiple


def build(tp: int, pp: int, extra: dict, spec_opts: dict, vocab: int):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    ep = extra.get("expert_model_parallel_size", 1)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep)
    model_args = {"share_embeddings_and_output_weights": False, **{k: extra[k] for k in MODEL_ARGS if k in extra}}
    extra = {k: v for k, v in extra.items() if k not in MODEL_ARGS}
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", **spec_opts)
    cfg = TransformerConfig(**BASE, **extra, normalization="RMSNorm", gated_linear_unit=True,
                            activation_func=torch.nn.functional.silu, add_bias_linear=False,
                            use_cpu_initialization=True, tensor_model_parallel_size=tp,
                            pipeline_model_parallel_size=pp, params_dtype=torch.float32,
                            pipeline_dtype=torch.float32, bias_dropout_fusion=False, hidden_dropout=0.0,
                            attention_dropout=0.0, init_method_std=0.1)
    torch.manual_seed(1234)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=vocab, max_sequence_length=SEQ,
                     position_embedding_type="rope", rotary_base=ROTARY_BASE, **model_args,
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())
    return model


def _finish() -> None:
    from megatron.core import parallel_state as ps
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def first_job(rank, ws, port, extra, spec_opts, vocab, out):
    """Step 1: the TP=1 x PP=1 model, layer norms perturbed, saved."""
    _init(rank, ws, port)
    from megatron.core import dist_checkpointing
    model = build(1, 1, extra, spec_opts, vocab)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    dist_checkpointing.save({"model": model.sharded_state_dict()}, out)
    _finish()


def reshard_job(rank, ws, port, tp, pp, extra, spec_opts, vocab, src, out):
    """Step 2: loaded at TP x PP by megatron-core and saved again."""
    _init(rank, ws, port)
    from megatron.core import dist_checkpointing
    model = build(tp, pp, extra, spec_opts, vocab)
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, src)
    model.load_state_dict(loaded["model"])
    dist_checkpointing.save({"model": model.sharded_state_dict()}, out)
    _finish()


def logits_job(rank, ws, port, extra, spec_opts, vocab, ckpt, out):
    """Step 3: megatron's own forward of the saved checkpoint, fp32."""
    _init(rank, ws, port)
    # The attention forks the CUDA RNG tracker for its dropout (0 here, and
    # eval): no CUDA RNG exists on the CPU, so the fork changes nothing.
    import contextlib
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker
    CudaRNGStatesTracker.fork = lambda self, *a, **k: contextlib.nullcontext()
    # megatron-core 0.16.1 imports te_general_gemm in a try block that fails
    # without Transformer Engine and then tests it for None, undefined: None
    # is what it means there, and the router's own torch.mm path runs.
    from megatron.core.transformer.moe import moe_utils
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    from megatron.core import dist_checkpointing
    model = build(1, 1, extra, spec_opts, vocab)
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, ckpt)
    model.load_state_dict(loaded["model"])
    model.eval()
    ids = torch.tensor(TOKENS)
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        logits = model(ids, pos, attention_mask=None)
    assert logits.shape == (len(TOKENS), ids.shape[1], vocab), logits.shape
    Path(out).write_text(json.dumps({"input_ids": TOKENS, "logits": logits[..., :VOCAB].tolist()}) + "\n")
    _finish()


HF_CONFIG = r"""
import json, sys
import transformers
arch, fields, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
cls(architectures=[arch], dtype="float32", **fields).save_pretrained(out)
print(transformers.__version__)
"""


def hf_fields(extra: dict, more: dict) -> dict:
    """The Hugging Face config of the megatron model."""
    fields = dict(vocab_size=VOCAB, hidden_size=BASE["hidden_size"], intermediate_size=BASE["ffn_hidden_size"],
                  num_hidden_layers=BASE["num_layers"], num_attention_heads=BASE["num_attention_heads"],
                  num_key_value_heads=BASE["num_query_groups"], head_dim=BASE["kv_channels"],
                  rms_norm_eps=BASE["layernorm_epsilon"], rope_theta=float(ROTARY_BASE),
                  max_position_embeddings=SEQ, tie_word_embeddings=False, hidden_act="silu")
    return {**fields, **more}


def make_case(name: str, root: Path) -> None:
    tp, pp, extra, spec_opts, arch, more = CASES[name]
    case = root / name
    if case.exists():
        shutil.rmtree(case)
    case.mkdir(parents=True)
    vocab = padded_vocab(tp)
    # Expert parallelism only where the case saves (its data-parallel ranks
    # hold the experts); the first and the logits jobs are one process.
    ep = extra.get("expert_model_parallel_size", 1)
    one = {k: v for k, v in extra.items() if k != "expert_model_parallel_size"}
    tmp = case / "tp1pp1"
    tmp.mkdir()
    mp.spawn(first_job, args=(1, free_port(), one, spec_opts, vocab, str(tmp)), nprocs=1, join=True)
    ckpt = case / "ckpt"
    ckpt.mkdir()
    mp.spawn(reshard_job, args=(tp * pp * ep, free_port(), tp, pp, extra, spec_opts, vocab, str(tmp), str(ckpt)),
             nprocs=tp * pp * ep, join=True)
    shutil.rmtree(tmp)
    mp.spawn(logits_job, args=(1, free_port(), one, spec_opts, vocab, str(ckpt), str(case / "logits.json")),
             nprocs=1, join=True)
    hf = case / "hf_config"
    version = subprocess.run([str(HF_PY), "-c", HF_CONFIG, arch, json.dumps(hf_fields(extra, more)), str(hf)],
                             check=True, capture_output=True, text=True).stdout.strip()
    # A tokenizer file the export copies beside the weights (its content is no concern of the map).
    (hf / "tokenizer_config.json").write_text(json.dumps({"model_max_length": SEQ}) + "\n")
    import megatron.core
    info = {"megatron_core": megatron.core.__version__, "torch": torch.__version__, "transformers": version,
            "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "expert_model_parallel_size": ep,
            "spec": "get_gpt_layer_local_spec(normalization='RMSNorm'" +
                    "".join(f", {k}={v}" for k, v in spec_opts.items()) + ")",
            "model_config": {**BASE, **extra, "rotary_base": ROTARY_BASE}, "vocab_size": VOCAB, "padded_vocab_size": vocab,
            "architecture": arch}
    (case / "case.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"{name}: {sum(f.stat().st_size for f in case.rglob('*') if f.is_file())} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/arch")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    args = ap.parse_args()
    for name in args.cases:
        make_case(name, Path(args.out))


if __name__ == "__main__":
    main()
