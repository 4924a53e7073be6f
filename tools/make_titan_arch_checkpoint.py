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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/arch")
    args = ap.parse_args()
    case = Path(args.out) / "titan_llama3"
    if case.exists():
        shutil.rmtree(case)
    case.mkdir(parents=True)
    torch.manual_seed(1234)
    model = build()
    model.init_states()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("qkv_linear.wqkv.weight"):  # fused [wq; wk; wv], split by state_dict()
                p[:(HEADS + KV_HEADS) * (DIM // HEADS)].mul_(10)
            elif name.endswith("attention.wo.weight"):
                p.mul_(10)
    model.eval()
    ids = torch.tensor(TOKENS)
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        logits = model(ids, positions=pos, attention_masks=model.get_attention_masks(pos))
    assert logits.shape == (len(TOKENS), ids.shape[1], VOCAB), logits.shape
    (case / "logits.json").write_text(json.dumps({"input_ids": TOKENS, "logits": logits.tolist()}) + "\n")
    dcp.save(model.state_dict(), checkpoint_id=str(case / "ckpt"))
    fields = dict(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS,
                  rms_norm_eps=1e-5, rope_theta=float(THETA), max_position_embeddings=SEQ,
                  tie_word_embeddings=False, hidden_act="silu")
    hf = case / "hf_config"
    version = subprocess.run([str(HF_PY), "-c", HF_CONFIG, "LlamaForCausalLM", json.dumps(fields), str(hf)],
                             check=True, capture_output=True, text=True).stdout.strip()
    from importlib.metadata import version as dist_version
    info = {"torchtitan": dist_version("torchtitan"), "torch": torch.__version__, "transformers": version,
            "model": "torchtitan.models.llama3.Llama3Model", "dim": DIM, "n_heads": HEADS, "n_kv_heads": KV_HEADS,
            "n_layers": LAYERS, "ffn": FFN, "vocab_size": VOCAB, "rope": "ComplexRoPE theta 10000, no scaling",
            "saved": "dcp.save(model.state_dict())"}
    (case / "case.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"titan_llama3: {sum(f.stat().st_size for f in case.rglob('*') if f.is_file())} bytes")


if __name__ == "__main__":
    main()
