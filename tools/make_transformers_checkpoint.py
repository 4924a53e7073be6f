"""A Hugging Face model folder written by transformers itself, for testdata/hf.

``llama_tiny/``: a LlamaForCausalLM of a tiny config (seeded), saved with
``save_pretrained(max_shard_size="2KB")``: ``model-0000k-of-0000N.safetensors``,
``model.safetensors.index.json``, ``config.json`` and
``generation_config.json`` exactly as transformers writes them;
``llama_tiny.ref.pt``: the weights save_pretrained wrote (load_file of every
shard, merged), the reference; ``llama_tiny.json``: versions and files.

transformers is a generator dependency only (scripts/setup-hf installs it into
the side venv .venv-hf, which sees .venv's torch and safetensors):
    .venv-hf/bin/python tools/make_transformers_checkpoint.py --out testdata/hf
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import safetensors
import torch
import transformers
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = dict(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    d = out / "llama_tiny"
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG))
    model.save_pretrained(d, max_shard_size="2KB")
    files = sorted(p.name for p in d.iterdir())
    weights = {}
    for f in sorted(d.glob("*.safetensors")):
        weights.update(load_file(f))
    torch.save(weights, out / "llama_tiny.ref.pt")
    assert "model.safetensors.index.json" in files and "config.json" in files, files
    (out / "llama_tiny.json").write_text(json.dumps({
        "generator": "tools/make_transformers_checkpoint.py", "transformers": transformers.__version__,
        "safetensors": safetensors.__version__, "torch": torch.__version__, "config": CONFIG, "files": files,
        "tensors": {k: list(v.shape) for k, v in weights.items()}}, indent=1) + "\n")
    print("wrote", d, files)


if __name__ == "__main__":
    main()
