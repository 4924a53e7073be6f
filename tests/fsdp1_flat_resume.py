"""Resume check for tests/test_fsdp1_flat.py (not a test).

    python tests/fsdp1_flat_resume.py N OUT CASE_DIR WRITTEN_DIR

N gloo processes on CPU build the model of tools/make_fsdp1_checkpoints.py
under FSDP1 as CASE_DIR's job did (its case.json: use_orig_params,
optimizer), twice:

  - one loads the files ckptconv wrote for world size N (WRITTEN_DIR's
    model_rank{r}.pt and optim_rank{r}.pt) the way the fast save is loaded:
    model.load_state_dict under LOCAL_STATE_DICT, optim.load_state_dict of
    the raw optimizer state;
  - the other loads torch's FULL references of the source job
    (CASE_DIR/model_full.pt, optim_full.pt) under FULL_STATE_DICT with
    FSDP.optim_state_dict_to_load.

Both train two more steps on the same batches. Rank 0 writes OUT, a
torch.save of {"loaded": the full state right after loading the written
files, "losses": (written, reference), "final": (written, reference) full
states after training}.

Only the N workers import torch (tests/resume_runner.py).
"""
import json
import sys
from pathlib import Path

import resume_runner

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def generator():
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    import make_fsdp1_checkpoints
    return make_fsdp1_checkpoints


def full_state(model, optim):
    msd, osd = generator().full_state(model, optim)
    return {"model": msd, "optim": osd}


def train(model, optim, rank):
    import torch
    g = generator()
    losses = []
    for step in range(2):
        optim.zero_grad(set_to_none=True)
        loss = model(g.batch(100 + step, rank))
        loss.backward()
        optim.step()
        losses.append(loss.detach().clone())
    return torch.stack(losses)


def worker(rank, ws, out, case_dir, written_dir):
    import torch
    from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig,
                                        FullyShardedDataParallel as FSDP, StateDictType)
    g = generator()
    case = json.loads((Path(case_dir) / "case.json").read_text())
    orig, opt, which = case["use_orig_params"], case["optimizer"], case.get("optimizer_params", "all")

    written = g.wrap(g.fresh_model(orig), orig)
    written_optim = g.make_optim(written, opt, which)
    with FSDP.state_dict_type(written, StateDictType.LOCAL_STATE_DICT):
        # With use_orig_params=True torch's own LOCAL_STATE_DICT does not load
        # strictly (its `_flat_param` keys are "unexpected": the module
        # registers the original parameters); strict=False loads it through
        # the parameters' views of the shard, which the files also hold.
        result = written.load_state_dict(torch.load(Path(written_dir) / f"model_rank{rank}.pt", weights_only=False),
                                         strict=not orig)
        assert not result.missing_keys, result.missing_keys
        assert all(k.endswith("_flat_param") for k in result.unexpected_keys), result.unexpected_keys
    written_optim.load_state_dict(torch.load(Path(written_dir) / f"optim_rank{rank}.pt", weights_only=False))
    loaded = full_state(written, written_optim)

    ref = g.wrap(g.fresh_model(orig), orig)
    ref_optim = g.make_optim(ref, opt, which)
    full_model = torch.load(Path(case_dir) / "model_full.pt", weights_only=True)
    full_optim = torch.load(Path(case_dir) / "optim_full.pt", weights_only=True)
    with FSDP.state_dict_type(ref, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
                              FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)):
        ref.load_state_dict(full_model)
        ref_optim.load_state_dict(FSDP.optim_state_dict_to_load(ref, ref_optim, full_optim))

    losses = (train(written, written_optim, rank), train(ref, ref_optim, rank))
    final = (full_state(written, written_optim), full_state(ref, ref_optim))
    if rank == 0:
        torch.save({"loaded": loaded, "losses": losses, "final": final}, out)


if __name__ == "__main__":
    n, out, case_dir, written_dir = sys.argv[1:5]
    resume_runner.spawn(int(n), worker, out, case_dir, written_dir)
