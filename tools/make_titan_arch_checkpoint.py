#!/usr/bin/env python3
"""Write a real torchtitan Llama 3 checkpoint with torchtitan's own logits,
for the torchtitan-llama3-llama map's proof (tests/test_arch_maps.py,
docs/maps.md).

    .venv-titan/bin/python tools/make_titan_arch_checkpoint.py --out testdata/arch

Needs .venv-titan (scripts/setup-titan: torchtitan 0.3.0) and .venv-hf
(scripts/setup-hf: transformers 5, which writes the config.json). One
process on the CPU builds torchtitan's Llama3Model from its own config
classes (as its llama3 flavors do: 2 layers, dim 32, 4 query heads in 2 kv
groups, ffn 48, vocabulary 60, RoPE theta 10000 without llama3 scaling,
untied lm_head; flex attention, the only causal backend torchtitan 0.3.0
keeps), initialises it with its own init_states, gives the layer norms
distinct values (their init is all ones) and wq, wk, wo ten times their
init (at std 0.02 the attention is near uniform and adds little to the
embedding's residual, so a wrong RoPE pairing barely shows), runs its forward on fixed token
ids (fp32) and saves the model's state dict with dcp.save, as torchtitan's
CheckpointManager saves a model-only step (the model's flattened state dict
at the top level: its CheckpointManager itself needs a whole Trainer).
torchtitan's RoPE rotates interleaved pairs (ComplexRoPE), Hugging Face's
half-split ones: the map permutes wq and wk (permute_rope).

    titan_llama3/ckpt/       what dcp.save wrote
    titan_llama3/logits.json torchtitan's logits on the ids
    titan_llama3/hf_config/  LlamaForCausalLM's config, by transformers
    titan_llama3/case.json   versions and sizes

--model qwen3 writes titan_qwen3/ the same way from torchtitan's Qwen3Model
(dense: 2 layers, dim 32, 4 query heads of head_dim 16 in 2 kv groups, so
q_proj is 64 x 32, not square; ffn 48, vocabulary 60, theta 10000, untied
lm_head), for the torchtitan-qwen3-qwen3 map. Its RoPE is CosSinRoPE, the
half-split pairs Hugging Face uses, and its adapter permutes nothing; its
per-head q_norm and k_norm (RMSNorm over head_dim, before RoPE) get
distinct values, so a map that swaps them misses; lm_head is ten times its
init (Qwen3's std 0.02 gives logits under 0.4).

--model qwen3moe writes titan_qwen3moe/: the same with every layer an MoE
(4 experts of ffn 24 stacked in w1_EFD, w3_EFD, w2_EDF; softmax router, top
2, renormalised: Qwen3-MoE's norm_topk_prob), experts and router ten times
their init, for the torchtitan-qwen3moe-qwen3moe map. Its logits run
torchtitan's grouped expert matmuls in fp32 (fp32_experts: torchtitan
0.3.0 casts them to bf16, always).

Only the model named is written: the other fixtures stay as they are.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_arch_checkpoints import HF_CONFIG, HF_PY, TOKENS  # noqa: E402

DIM, HEADS, KV_HEADS, LAYERS, FFN, VOCAB, THETA, SEQ = 32, 4, 2, 2, 48, 60, 10000, 16
QWEN3_HEAD_DIM = 16  # Qwen3 sets head_dim apart from dim / n_heads
EXPERTS, TOP_K, MOE_FFN = 4, 2, 24


def build():
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.llama3 import (_EMBEDDING_INIT, _NORM_INIT, Llama3Model, _build_llama3_layers,
                                          _output_linear_init)
    cfg = Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_output_linear_init(DIM)),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=LAYERS, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, hidden_dim=FFN,
            rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=SEQ, theta=THETA, scaling=None),
            attn_backend="flex"))
    return cfg.build()


def build_qwen3():
    """torchtitan's dense Qwen3Model at the fixture's size, from its own
    config builders (as its qwen3 flavors do, lm_head untied as from 8b)."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.qwen3 import Qwen3Model
    from torchtitan.models.qwen3 import _EMBEDDING_INIT, _LINEAR_INIT, _build_qwen3_layers, _qwen3_norm
    cfg = Qwen3Model.Config(
        dim=DIM, vocab_size=VOCAB, norm=_qwen3_norm(DIM),
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_LINEAR_INIT),
        layers=_build_qwen3_layers(
            fuse_qkv=True, n_layers=LAYERS, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=QWEN3_HEAD_DIM,
            hidden_dim=FFN, attn_backend="flex",
            rope=CosSinRoPE.Config(dim=QWEN3_HEAD_DIM, max_seq_len=SEQ, theta=float(THETA))))
    return cfg.build()


def build_qwen3moe():
    """torchtitan's Qwen3Model with every layer an MoE (Qwen3-MoE: softmax
    router, top 2 of 4 experts renormalised, no shared experts), from its
    own MoE layer builder; the standard (all-to-all free) token dispatcher."""
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.qwen3 import Qwen3Model
    from torchtitan.models.qwen3 import _EMBEDDING_INIT, _LINEAR_INIT, _build_qwen3_moe_layers, _qwen3_norm
    cfg = Qwen3Model.Config(
        dim=DIM, vocab_size=VOCAB, norm=_qwen3_norm(DIM),
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=_EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_LINEAR_INIT),
        layers=_build_qwen3_moe_layers(
            fuse_qkv=True, n_layers=LAYERS, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=QWEN3_HEAD_DIM,
            moe_hidden_dim=MOE_FFN, num_experts=EXPERTS, top_k=TOP_K, attn_backend="flex",
            moe_comm_backend="standard",
            rope=CosSinRoPE.Config(dim=QWEN3_HEAD_DIM, max_seq_len=SEQ, theta=float(THETA))))
    return cfg.build()


def fp32_experts(model) -> None:
    """torchtitan 0.3.0's GroupedExperts.forward casts the tokens and the
    expert weights to bf16 for torch._grouped_mm, always: against an fp32
    transformers model that is bf16's rounding (about 4e-3 relative) on the
    experts' output, no test of a map at 1e-4. This runs the same three
    grouped matmuls, on the same offsets, in fp32 (torch._grouped_mm takes
    fp32 on the CPU); the router, the token dispatch and the combine stay
    torchtitan's own. case.json records how far torchtitan's bf16 forward
    is from it."""
    import types

    import torch.nn.functional as F
    from torchtitan.models.common.moe import GroupedExperts

    def forward(self, x_RD, num_tokens_per_expert_E):
        offs = torch.cumsum(num_tokens_per_expert_E, dim=0, dtype=torch.int32)

        def mm(a, w):
            return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)

        return mm(F.silu(mm(x_RD, self.w1_EFD)) * mm(x_RD, self.w3_EFD), self.w2_EDF)

    for m in model.modules():
        if isinstance(m, GroupedExperts):
            m.forward = types.MethodType(forward, m)


# model -> (builder, head_dim, Hugging Face architecture, extra HF fields, case.json notes)
MODELS = {
    "llama3": (build, DIM // HEADS, "LlamaForCausalLM", dict(rms_norm_eps=1e-5),
               {"model": "torchtitan.models.llama3.Llama3Model", "rope": "ComplexRoPE theta 10000, no scaling"}),
    "qwen3": (build_qwen3, QWEN3_HEAD_DIM, "Qwen3ForCausalLM", dict(rms_norm_eps=1e-6),
              {"model": "torchtitan.models.qwen3.Qwen3Model (dense)", "head_dim": QWEN3_HEAD_DIM,
               "rope": "CosSinRoPE theta 10000 (half-split pairs)", "qk_norm": "RMSNorm over head_dim, eps 1e-6"}),
    "qwen3moe": (build_qwen3moe, QWEN3_HEAD_DIM, "Qwen3MoeForCausalLM",
                 dict(rms_norm_eps=1e-6, num_experts=EXPERTS, num_experts_per_tok=TOP_K, moe_intermediate_size=MOE_FFN,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
                 {"model": "torchtitan.models.qwen3.Qwen3Model (MoE)", "head_dim": QWEN3_HEAD_DIM,
                  "experts": EXPERTS, "top_k": TOP_K, "moe_hidden_dim": MOE_FFN,
                  "router": "softmax, top 2, route_norm (norm_topk_prob)",
                  "rope": "CosSinRoPE theta 10000 (half-split pairs)", "qk_norm": "RMSNorm over head_dim, eps 1e-6"}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/arch")
    ap.add_argument("--model", choices=sorted(MODELS), default="llama3")
    args = ap.parse_args()
    builder, head_dim, arch, hf_extra, notes = MODELS[args.model]
    name = f"titan_{args.model}"
    case = Path(args.out) / name
    if case.exists():
        shutil.rmtree(case)
    case.mkdir(parents=True)
    torch.manual_seed(1234)
    model = builder()
    model.init_states()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:  # q_norm and k_norm too: each its own values
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif pname.endswith("qkv_linear.wqkv.weight"):  # fused [wq; wk; wv], split by state_dict()
                p[:(HEADS + KV_HEADS) * head_dim].mul_(10)
            elif pname.endswith("attention.wo.weight"):
                p.mul_(10)
            elif pname == "lm_head.weight" and args.model.startswith("qwen3"):
                # Qwen3's std 0.02 head (llama3's is dim ** -0.5) gives logits
                # under 0.4: at 10x they are of order 1, where a wrong map shows.
                p.mul_(10)
            elif ".moe." in pname and not pname.endswith("expert_bias_E"):
                # At std 0.02 the experts add ~3e-4 to the residual and the
                # router is near uniform (top 2 picked by hair's breadths):
                # at 10x each expert counts and each token's choice is clear.
                p.mul_(10)
    model.eval()
    ids = torch.tensor(TOKENS)
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    def forward():
        with torch.no_grad():
            return model(ids, positions=pos, attention_masks=model.get_attention_masks(pos))

    logits = forward()
    notes = dict(notes)
    if args.model == "qwen3moe":
        titans_own = logits
        fp32_experts(model)
        logits = forward()
        notes["logits"] = ("torchtitan's forward with its grouped expert matmuls in fp32 (its own casts them to "
                           f"bf16: {(titans_own - logits).abs().max().item():.1e} max abs from these)")
    assert logits.shape == (len(TOKENS), ids.shape[1], VOCAB), logits.shape
    (case / "logits.json").write_text(json.dumps({"input_ids": TOKENS, "logits": logits.tolist()}) + "\n")
    dcp.save(model.state_dict(), checkpoint_id=str(case / "ckpt"))
    fields = dict(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=head_dim,
                  rope_theta=float(THETA), max_position_embeddings=SEQ, tie_word_embeddings=False,
                  hidden_act="silu", **hf_extra)
    hf = case / "hf_config"
    version = subprocess.run([str(HF_PY), "-c", HF_CONFIG, arch, json.dumps(fields), str(hf)],
                             check=True, capture_output=True, text=True).stdout.strip()
    from importlib.metadata import version as dist_version
    info = {"torchtitan": dist_version("torchtitan"), "torch": torch.__version__, "transformers": version,
            "model": notes["model"], "dim": DIM, "n_heads": HEADS, "n_kv_heads": KV_HEADS, "n_layers": LAYERS, "ffn": FFN,
            "vocab_size": VOCAB, **notes, "saved": "dcp.save(model.state_dict())"}
    (case / "case.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"{name}: {sum(f.stat().st_size for f in case.rglob('*') if f.is_file())} bytes")


if __name__ == "__main__":
    main()
