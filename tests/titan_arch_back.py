"""torchtitan's reading of the way back (run by tests/test_arch_maps_back.py in
the side environment .venv-titan, which scripts/setup-titan makes):

    .venv-titan/bin/python tests/titan_arch_back.py CKPT LOGITS_JSON [MODEL]

Builds torchtitan 0.3.0's model MODEL (llama3, the default, or qwen3) as
tools/make_titan_arch_checkpoint.py does, fills its state dict from CKPT with torch's dcp.load (every key the
model has must be there: the default planner refuses a missing one, and
one the model lacks fails load_state_dict), loads it into the model
(strict) and runs its forward on the ids of LOGITS_JSON in fp32. Prints one
JSON line: the keys loaded and the max abs difference from the committed
logits (torchtitan's own forward of the original checkpoint)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from make_titan_arch_checkpoint import MODELS  # noqa: E402


def main(ckpt: str, reference: str, name: str = "llama3") -> None:
    ref = json.loads(Path(reference).read_text())
    model = MODELS[name][0]()
    sd = {k: torch.full_like(v, float("nan")) for k, v in model.state_dict().items()}  # nothing left unloaded
    dcp.load(sd, checkpoint_id=ckpt)
    model.load_state_dict(sd, strict=True)
    model.eval()
    ids = torch.tensor(ref["input_ids"])
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        got = model(ids, positions=pos, attention_masks=model.get_attention_masks(pos))
    want = torch.tensor(ref["logits"], dtype=torch.float32)
    assert got.shape == want.shape, (got.shape, want.shape)
    print(json.dumps({"keys": len(sd), "max_abs_diff": (got - want).abs().max().item(),
                      "max_abs_logit": want.abs().max().item()}))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:])
