"""Hugging Face folders that used to lose tensors silently (#47), for testdata/hf,
written by the real libraries:

- ``llama_tied/``: ``save_pretrained`` of a seeded tiny ``LlamaForCausalLM``
  with ``tie_word_embeddings=True``: ``model.safetensors`` holds
  ``model.embed_tokens.weight`` and no ``lm_head.weight`` (save_pretrained
  stores a tied weight once), ``config.json``, ``generation_config.json``;
- ``llama_tied.ref.pt``: ``torch.save(model.state_dict())`` of that model:
  every key the model has, ``lm_head.weight`` sharing the embedding's storage
  (torch.save keeps the sharing), the state dict a job's ``dcp.load`` fills;
- ``llama_tied_bin/``: the same state dict as ``pytorch_model-0000k-of-0000N.bin``
  shards + ``pytorch_model.bin.index.json``, written by huggingface_hub's
  ``save_torch_state_dict(..., safe_serialization=False)`` (transformers 5
  writes safetensors only; this is the layout transformers 4's
  ``save_pretrained(safe_serialization=False)`` wrote and from_pretrained
  still reads, checked here), with the model's ``config.json``;
- ``peft_lora/``: ``save_pretrained`` of another seeded tiny Llama (untied)
  and, into the same folder, peft's ``save_pretrained`` of a LoRA adapter on
  it (``adapter_model.safetensors``, ``adapter_config.json``, ``README.md``);
- ``edge.json``: versions, configs, files, the state dict keys and shapes.

transformers, peft and huggingface_hub are generator dependencies only
(scripts/setup-hf installs them into the side venv .venv-hf, which sees .venv's
torch and safetensors):

    .venv-hf/bin/python tools/make_hf_edge_checkpoints.py --out testdata/hf
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import huggingface_hub
import peft
import safetensors
import torch
import transformers
from huggingface_hub import save_torch_state_dict
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = dict(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=16)
LORA = dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
BIN_SHARD = 1200  # bytes: three .bin shards


def files_of(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def equal_state(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    for name in ("llama_tied", "llama_tied_bin", "peft_lora"):
        shutil.rmtree(out / name, ignore_errors=True)

    # Tied embeddings: save_pretrained leaves lm_head.weight out.
    torch.manual_seed(0)
    tied = LlamaForCausalLM(LlamaConfig(**CONFIG, tie_word_embeddings=True)).eval()
    state = tied.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    tied.save_pretrained(out / "llama_tied")
    stored = load_file(out / "llama_tied" / "model.safetensors")
    assert "lm_head.weight" not in stored and set(stored) == set(state) - {"lm_head.weight"}, sorted(stored)
    torch.save(state, out / "llama_tied.ref.pt")

    # The same weights as pytorch_model.bin shards and their index.
    d = out / "llama_tied_bin"
    d.mkdir()
    save_torch_state_dict(state, d, safe_serialization=False, max_shard_size=BIN_SHARD)
    tied.config.save_pretrained(d)
    index = json.loads((d / "pytorch_model.bin.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"pytorch_model-00001-of-{len(shards):05d}.bin", shards
    merged = {}
    for s in shards:
        merged.update(torch.load(d / s, weights_only=True))
    assert equal_state(merged, state)
    again = LlamaForCausalLM.from_pretrained(d).eval()  # transformers reads the folder
    assert equal_state(again.state_dict(), state)

    # A LoRA adapter saved beside its base model.
    torch.manual_seed(1)
    base = LlamaForCausalLM(LlamaConfig(**CONFIG, tie_word_embeddings=False)).eval()
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    p = out / "peft_lora"
    base.save_pretrained(p)
    torch.manual_seed(2)
    get_peft_model(base, LoraConfig(**LORA)).save_pretrained(p)
    adapter = load_file(p / "adapter_model.safetensors")
    assert adapter and all(".lora_" in k for k in adapter), sorted(adapter)
    assert set(load_file(p / "model.safetensors")) == set(base_state)
    fresh = LlamaForCausalLM(LlamaConfig(**CONFIG, tie_word_embeddings=False))
    loaded = PeftModel.from_pretrained(fresh, p)  # peft reads it back
    assert any(".lora_A." in k for k in loaded.state_dict())

    (out / "edge.json").write_text(json.dumps({
        "generator": "tools/make_hf_edge_checkpoints.py", "transformers": transformers.__version__,
        "peft": peft.__version__, "huggingface_hub": huggingface_hub.__version__,
        "safetensors": safetensors.__version__, "torch": torch.__version__, "config": CONFIG, "lora": LORA,
        "files": {n: files_of(out / n) for n in ("llama_tied", "llama_tied_bin", "peft_lora")},
        "llama_tied_state_dict": {k: list(v.shape) for k, v in state.items()},
        "peft_lora_adapter": {k: list(v.shape) for k, v in adapter.items()},
    }, indent=1) + "\n")
    print("wrote", {n: files_of(out / n) for n in ("llama_tied", "llama_tied_bin", "peft_lora")})


if __name__ == "__main__":
    main()
