"""An FSDP2 job at a new world size resumes from a Megatron run
(tests/test_megatron.py): `ckptconv reshard MEGATRON --only model --layout
dcp --world-size N` wrote DCP; N gloo processes build a torch module whose
parameters carry the unstacked names, shard it with fully_shard, load the
files with dcp.load + set_model_state_dict, and take one SGD step. Rank 0 saves the full state right after
loading and after the step.

    python tests/megatron_fsdp2_resume.py DCP_DIR MODEL_REF.pt WS OUT_DIR

The test compares both with model_ref.pt (megatron-core's own reading) and
with the same step taken in one process on model_ref.pt's values."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resume_runner import spawn  # noqa: E402


def build(ref):
    """A module tree with one parameter per tensor of `ref`, at its dotted name."""
    import torch
    import torch.nn as nn

    root = nn.Module()
    for name, value in ref.items():
        if not isinstance(value, torch.Tensor):
            continue  # _extra_state: None for the local spec
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, nn.Parameter(torch.zeros_like(value)))
    return root


def step(model):
    """One SGD step with gradient p * 2^(i % 3) set directly, elementwise on
    each rank's shard (no module forward: this job has no GPT code). The
    gradient and lr * gradient are powers of two times p, so exact, and the
    update rounds once: the same bits with or without a fused multiply-add,
    in a vectorised loop or its tail, on any CPU, sharded or not."""
    import torch
    optim = torch.optim.SGD(model.parameters(), lr=0.25)
    for i, p in enumerate(model.parameters()):
        p.grad = p.detach() * (2.0 ** (i % 3))
    optim.step()


def job(rank, ws, dcp_dir, ref_path, out):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         set_model_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    ref = torch.load(ref_path, weights_only=True)
    model = build(ref)
    fully_shard(model, mesh=init_device_mesh("cpu", (ws,)))
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=dcp_dir)
    set_model_state_dict(model, state["model"])
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    loaded = get_model_state_dict(model, options=full)
    step(model)
    stepped = get_model_state_dict(model, options=full)
    if rank == 0:
        torch.save(loaded, Path(out) / "loaded.pt")
        torch.save(stepped, Path(out) / "stepped.pt")


if __name__ == "__main__":
    dcp_dir, ref_path, ws, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    spawn(ws, job, dcp_dir, ref_path, out)
