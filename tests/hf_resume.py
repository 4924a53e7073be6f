"""Resume check for tests/test_dcp_hf.py's --layout hf rows (not a test).

    python tests/hf_resume.py RESHARDED ORIGINAL WORLD_SIZE OUT_DIR

WORLD_SIZE gloo processes on CPU build the corpus model under FSDP2 at that
world size, as tools/make_dcp_hf_checkpoints.py's job did, twice: one copy
loads RESHARDED (what `ckptconv reshard --layout hf` wrote for this world
size) with torch's HuggingFaceStorageReader + dcp.load, the other ORIGINAL
(torch reshards at load time). Each then trains three steps with a fresh
AdamW on the same batches. The first copy, right after loading, is also
saved by torch's own HuggingFaceStorageWriter(save_distributed=True) into
OUT_DIR/torch_written, the files torch writes at this world size for these
values. Rank 0 writes OUT_DIR/result.pt: the full model state right after
loading, the losses and the final full states of both runs.
"""
import sys
from pathlib import Path

import resume_runner
from resume_runner import train

mc = resume_runner.corpus


def full_model(model):
    import copy

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return copy.deepcopy(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))


def load_run(ws: int, checkpoint: str):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    model = mc().fsdp2_wrap(mc().fresh_model(), mc().cpu_mesh(ws))
    sd = get_model_state_dict(model)
    dcp.load(sd, storage_reader=HuggingFaceStorageReader(checkpoint))
    set_model_state_dict(model, sd)
    return model, mc().param_groups(model, "adamw")


def worker(rank: int, ws: int, resharded: str, original: str, out: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    model, optim = load_run(ws, resharded)
    loaded = full_model(model)
    dcp.save(get_model_state_dict(model),
             storage_writer=HuggingFaceStorageWriter(str(Path(out) / "torch_written"), save_distributed=True))
    losses = train(model, optim, rank)
    after = full_model(model)
    ref_model, ref_optim = load_run(ws, original)
    ref_losses = train(ref_model, ref_optim, rank)
    ref_after = full_model(ref_model)
    if rank == 0:
        torch.save({"loaded": loaded, "losses": losses, "after": after, "ref_losses": ref_losses,
                    "ref_after": ref_after}, Path(out) / "result.pt")


if __name__ == "__main__":
    resharded, original, ws, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    resume_runner.spawn(ws, worker, resharded, original, out)
