"""Hugging Face model folders for testdata/hf, written by the real libraries.

Each folder is what `save_pretrained` leaves: the weights as safetensors plus
the JSON files a model folder carries (config.json, generation_config.json,
tokenizer_config.json; small stand-ins, their content is not read as
tensors). The weights are the model state dict of testdata/dcp/fsdp2_adamw_ws2
(its dcp_to_torch_save reference), so every case has a reference torch wrote.

- ``sharded``: huggingface_hub.save_torch_state_dict with max_shard_size 300
  bytes -- ``model-0000k-of-0000N.safetensors`` and
  ``model.safetensors.index.json`` exactly as transformers' save_pretrained
  writes them (it calls the same function);
- ``single``: one ``model.safetensors`` (save_torch_state_dict below the shard
  size: no index);
- ``shards_no_index``: the sharded folder with its index removed, as users
  find folders copied without it;
- ``reference.pt``: the state dict itself (torch.save), the reference.

huggingface_hub is a generator dependency only: scripts/setup-hf makes the
side venv .venv-hf it runs in (it sees .venv's torch and safetensors).

    .venv-hf/bin/python tools/make_hf_checkpoints.py --out testdata/hf
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import huggingface_hub
import safetensors
import torch
from huggingface_hub import save_torch_state_dict

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2.ref.pt"

CONFIG = {"architectures": ["Net"], "model_type": "ckptconv-test", "hidden_size": 4, "vocab_size": 10,
          "torch_dtype": "float32"}
GENERATION = {"max_new_tokens": 8}
TOKENIZER = {"model_max_length": 16, "tokenizer_class": "PreTrainedTokenizerFast"}


def side_files(d: Path) -> None:
    (d / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (d / "generation_config.json").write_text(json.dumps(GENERATION, indent=2) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps(TOKENIZER, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    state = torch.load(SOURCE, weights_only=True)["model"]
    state = {k: v.contiguous() for k, v in state.items()}
    for name in ("sharded", "single", "shards_no_index"):
        shutil.rmtree(out / name, ignore_errors=True)
    (out / "sharded").mkdir(parents=True)
    (out / "single").mkdir()
    save_torch_state_dict(state, out / "sharded", max_shard_size=300)
    side_files(out / "sharded")
    save_torch_state_dict(state, out / "single")
    side_files(out / "single")
    shutil.copytree(out / "sharded", out / "shards_no_index")
    (out / "shards_no_index" / "model.safetensors.index.json").unlink()
    torch.save(state, out / "reference.pt")
    # what the library wrote, checked here
    index = json.loads((out / "sharded" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0].startswith("model-00001-of-"), shards
    assert sorted(p.name for p in (out / "single").iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer_config.json"]
    (out / "case.json").write_text(json.dumps({
        "generator": "tools/make_hf_checkpoints.py",
        "huggingface_hub": huggingface_hub.__version__, "safetensors": safetensors.__version__,
        "torch": torch.__version__, "source": str(SOURCE.relative_to(REPO)),
        "sharded_files": shards, "tensors": {k: list(v.shape) for k, v in state.items()},
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
