#!/usr/bin/env python3
"""An FSDP2 job resumes from ckptconv's DCP reshard of a Hugging Face folder
whose embeddings are tied (run by tests/test_hf_silent_drops.py in the side
environment .venv-hf that scripts/setup-hf makes; the project venv has no
transformers):

    .venv-hf/bin/python tests/hf_tied_fsdp2_load.py FOLDER DCP_DIR STORE_FILE

The job is what a fine-tune does at world size 1 (gloo, CPU): the model built
from FOLDER's config.json, fully_shard on each layer and on the whole, then
dcp.load(get_model_state_dict(model), checkpoint_id=DCP_DIR). Every entry of
the state dict (lm_head.weight included) must then equal what
from_pretrained(FOLDER) loads, and lm_head.weight the embedding. Prints "ok"
and exits 0, else fails naming what differs (dcp.load itself raises "Missing
key in checkpoint state_dict" for a key the checkpoint lacks)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import transformers
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.fsdp import fully_shard


def main(folder: str, checkpoint: str, store: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
    try:
        want = transformers.AutoModelForCausalLM.from_pretrained(folder).state_dict()
        torch.manual_seed(123)  # other values than the checkpoint's
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        state = get_model_state_dict(model)
        assert "lm_head.weight" in state, sorted(state)
        dcp.load(state, checkpoint_id=checkpoint)
        got = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in get_model_state_dict(model).items()}
        assert set(got) == set(want), sorted(set(got) ^ set(want))
        for k in want:
            assert torch.equal(got[k], want[k]), k
        assert torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"])
        print("ok", transformers.__version__, torch.__version__)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
