#!/usr/bin/env python3
"""transformers' from_pretrained loads ckptconv's Hugging Face folder export
equal to the original (run by tests/test_hf_export.py in the side environment
.venv-hf that scripts/setup-hf makes; the project venv has no transformers):

    .venv-hf/bin/python tests/hf_from_pretrained.py ORIGINAL EXPORT

The original is loaded as bf16, the export as it is (it must come out bf16 by
itself, from its config.json); their state dicts must be equal tensor for
tensor and the logits of one forward pass bit-equal. Prints "ok" and exits 0,
else fails with an AssertionError naming what differs."""

from __future__ import annotations

import sys

import torch
import transformers


def main(original: str, export: str) -> None:
    want = transformers.AutoModelForCausalLM.from_pretrained(original, dtype=torch.bfloat16)
    got = transformers.AutoModelForCausalLM.from_pretrained(export)
    assert got.dtype == torch.bfloat16, got.dtype
    a, b = got.state_dict(), want.state_dict()
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        assert torch.equal(got(ids).logits, want(ids).logits), "logits differ"
    print("ok", transformers.__version__)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
