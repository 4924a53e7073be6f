#!/usr/bin/env python3
"""The logits transformers gives for an architecture-map export (run by
tests/test_arch_maps.py in the side environment .venv-hf that scripts/setup-hf
makes; the project venv has no transformers):

    .venv-hf/bin/python tests/hf_arch_logits.py EXPORT LOGITS_JSON [SAVE_DIR]

EXPORT is loaded with AutoModelForCausalLM.from_pretrained in fp32, every
weight from the folder (a weight left to initialisation fails); the token ids
of LOGITS_JSON (megatron-core's own forward, tools/make_arch_checkpoints.py)
go through it. Prints one JSON line: the architecture loaded, transformers'
version and the max abs difference from the megatron logits. With SAVE_DIR,
the model loaded is saved there with save_pretrained: a Hugging Face folder
transformers itself wrote, where the way back starts
(tests/test_arch_maps_back.py)."""

from __future__ import annotations

import json
import sys

import torch
import transformers


def main(export: str, reference: str, save: str | None = None) -> None:
    ref = json.loads(open(reference).read())
    model, info = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32,
                                                                     output_loading_info=True)
    missing = [k for k in info["missing_keys"] if k != "lm_head.weight" or not model.config.tie_word_embeddings]
    assert not missing and not info["unexpected_keys"] and not info["mismatched_keys"], info
    model.eval()
    ids = torch.tensor(ref["input_ids"])
    with torch.no_grad():
        got = model(ids).logits
    want = torch.tensor(ref["logits"], dtype=torch.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    if save:
        model.save_pretrained(save)
    print(json.dumps({"architecture": type(model).__name__, "transformers": transformers.__version__,
                      "max_abs_diff": (got - want).abs().max().item(), "max_abs_logit": want.abs().max().item()}))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
