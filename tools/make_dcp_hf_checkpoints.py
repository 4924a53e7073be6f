"""torch's DCP Hugging Face layout for testdata/dcp_hf, written by real torch.

`dcp.save(state_dict, storage_writer=HuggingFaceStorageWriter(path,
save_distributed=True))` from an FSDP2 job (the test model of
make_checkpoints.py, trained two steps) writes one safetensors file per rank,
``shard-0000{r+1}-model-00001-of-00001.safetensors``, each holding that rank's
pieces; their ``__metadata__`` has ``DCP_SHARDING_INFO`` (per tensor its
``saved_offsets`` in the global tensor) and ``DCP_VERSION``, and no file
records a global shape: torch's HuggingFaceStorageReader takes each
dimension's largest offset + size. There is no ``.metadata``.

- ``fsdp2_ws3/``: save_distributed=True at world size 3 (``scale`` has 2
  elements: one rank holds an empty piece);
- ``fsdp2_ws2_consolidated/``: save_distributed=True, enable_consolidation=True
  at world size 2: the per-rank files under ``sharded/`` and torch's own
  consolidation beside them (``model-00001-of-00001.safetensors`` and
  ``model.safetensors.index.json``);
- ``<case>.ref.pt``: the model's full state dict (get_model_state_dict,
  full_state_dict=True) on rank 0, the reference.

Only torch is needed (the project venv):
    .venv/bin/python tools/make_dcp_hf_checkpoints.py --out testdata/dcp_hf
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_checkpoints import cpu_mesh, fresh_model, fsdp2_wrap, param_groups, reset_dir, spawn, train  # noqa: E402

CASES = {"fsdp2_ws3": (3, False), "fsdp2_ws2_consolidated": (2, True)}


def job(rank: int, ws: int, out: str, name: str) -> None:
    consolidate = CASES[name][1]
    d = Path(out) / name
    if rank == 0:
        reset_dir(d)
    torch.distributed.barrier()
    model = fsdp2_wrap(fresh_model(), cpu_mesh(ws))
    optim = param_groups(model, "adamw")
    train(model, optim, rank)
    sd = get_model_state_dict(model)
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(str(d), save_distributed=True,
                                                         enable_consolidation=consolidate))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, Path(out) / f"{name}.ref.pt")
        files = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
        (Path(out) / f"{name}.json").write_text(json.dumps({
            "generator": "tools/make_dcp_hf_checkpoints.py", "torch": torch.__version__, "world_size": ws,
            "save_distributed": True, "enable_consolidation": consolidate, "files": files,
            "tensors": {k: list(v.shape) for k, v in full.items()}}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for name, (ws, _) in CASES.items():
        spawn(ws, job, str(out), name)
        print("wrote", out / name)


if __name__ == "__main__":
    main()
