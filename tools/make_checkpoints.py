#!/usr/bin/env python3
"""Write real sharded PyTorch checkpoints for ckptconv's tests and benchmarks.

Every checkpoint here is written by real torch.distributed code: world_size
processes are spawned with torch.multiprocessing on this machine, joined in a
gloo process group (MASTER_ADDR=127.0.0.1, a free port), wrapped with FSDP
(FSDP1 ``FullyShardedDataParallel`` on CPU, or FSDP2 ``fully_shard`` on a CPU
DeviceMesh), trained for a few real optimizer steps, and saved with the public
APIs training jobs use (``dcp.save``, ``torch.save`` of sharded state dicts).

    python tools/make_checkpoints.py [corpus] --out testdata
        Regenerate the small test corpus (deterministic, seeded; every fixture
        folder is deleted and rewritten) plus testdata/manifest.json.

    python tools/make_checkpoints.py bench --out DIR --bytes N --world-size 4 \
        [--layout dcp|fsdp-st|fsdp-dt]
        Write one large checkpoint of about N bytes (parameters + AdamW
        exp_avg + exp_avg_sq, fp32) for benchmarks. The model is built on the
        meta device and materialised shard by shard, filled with seeded randn,
        and AdamW takes one real step on seeded randn gradients (no forward or
        backward pass), so peak RAM stays near N plus one layer per rank.

CPU only; needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

SEED = 0
STEPS = 3
VOCAB, EMB = 10, 4


# --------------------------------------------------------------------------
# The corpus model
# --------------------------------------------------------------------------


class Net(nn.Module):
    """Tiny model with every shape the sharding code has to get right.

    emb.weight   10x4  nn.Embedding
    fc1.weight    8x4, fc1.bias 8
    fc2.weight    7x8  (7 rows: not divisible by 2, 3 or 4), fc2.bias 7
    scale         2    (fewer elements than ranks at world size 3 and 4)
    frozen        4x4  requires_grad=False, never given to the optimizer
    """

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB)
        self.fc1 = nn.Linear(EMB, 8)
        self.fc2 = nn.Linear(8, 7)
        self.scale = nn.Parameter(torch.tensor([1.0, -0.5]))
        self.frozen = nn.Parameter(torch.eye(EMB) + 0.1 * torch.randn(EMB, EMB), requires_grad=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx) @ self.frozen
        h = torch.tanh(self.fc1(h))
        y = self.fc2(h)
        return y.pow(2).mean() + (y[..., :2] * self.scale).mean()


GROUP0 = ("emb.weight", "fc1.weight", "fc1.bias")
GROUP1 = ("fc2.weight", "fc2.bias", "scale")


def clean_name(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "")


def param_groups(model: nn.Module, kind: str):
    """Two groups with different lr (and weight decay); frozen excluded.

    Parameters are picked by (FSDP-prefix-free) name, so this works on the
    plain, FSDP2 and FSDP1 use_orig_params=True models. For FSDP1 flat
    parameters (``_flat_param`` of each wrapped unit) the unit's prefix
    decides: emb/fc1 units -> group 0, fc2 and the root unit -> group 1.
    """
    named = {clean_name(n): p for n, p in model.named_parameters() if p.requires_grad}
    if all(n in named for n in GROUP0 + GROUP1):
        g0 = [named[n] for n in GROUP0]
        g1 = [named[n] for n in GROUP1]
    else:
        g0 = [p for n, p in named.items() if n.startswith(("emb.", "fc1."))]
        g1 = [p for n, p in named.items() if not n.startswith(("emb.", "fc1."))]
    if kind == "adamw":
        return torch.optim.AdamW(
            [{"params": g0, "lr": 1e-2, "weight_decay": 0.01},
             {"params": g1, "lr": 3e-3, "weight_decay": 0.0}],
            betas=(0.9, 0.99), foreach=False)
    if kind == "sgd":
        return torch.optim.SGD(
            [{"params": g0, "lr": 0.1},
             {"params": g1, "lr": 0.05}],
            momentum=0.9, foreach=False)
    raise ValueError(kind)


def batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (4, 3), generator=g)


def train(model: nn.Module, optim: torch.optim.Optimizer, rank: int) -> None:
    for step in range(STEPS):
        optim.zero_grad(set_to_none=True)
        model(batch(step, rank)).backward()
        optim.step()


def fresh_model() -> Net:
    torch.manual_seed(SEED)
    return Net()


# --------------------------------------------------------------------------
# Distributed plumbing
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiet() -> None:
    # FSDP1/ShardedTensor deprecation notices, repeated by every rank.
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*_get_pg_default_device.*")
    warnings.filterwarnings("ignore", message="Multiple backends are registered.*")


def _entry(rank: int, ws: int, port: int, fn, args) -> None:
    _quiet()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    try:
        fn(rank, ws, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(ws: int, fn, *args) -> None:
    mp.spawn(_entry, args=(ws, free_port(), fn, args), nprocs=ws, join=True)


def cpu_mesh(ws: int):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (ws,))


def reset_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


# --------------------------------------------------------------------------
# Corpus jobs (run inside each rank)
# --------------------------------------------------------------------------


def fsdp2_wrap(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    for sub in (model.emb, model.fc1, model.fc2):
        fully_shard(sub, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp1_wrap(model: nn.Module, mesh=None, use_orig_params=True) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    # Flat parameters must have uniform requires_grad, so with
    # use_orig_params=False the frozen parameter is left out of FSDP
    # (ignored_states): it stays a plain, replicated tensor on every rank.
    ignored = None if use_orig_params else [model.frozen]
    return FSDP(model, device_id=torch.device("cpu"), device_mesh=mesh,
                auto_wrap_policy=ModuleWrapPolicy({nn.Embedding, nn.Linear}),
                use_orig_params=use_orig_params, ignored_states=ignored)


def job_dcp(rank: int, ws: int, out: Path, rel: str, optim_kind: str, rank_meta_rel: str | None = None) -> None:
    """FSDP2 + dcp.save of get_model_state_dict/get_optimizer_state_dict.

    With rank_meta_rel, the same state is also saved there with
    use_collectives=False: no global .metadata, one __<rank>.metadata per rank
    (torch's dcp_to_torch_save cannot read that layout; its reference is the
    one written for `rel`, the same state)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    model = fsdp2_wrap(fresh_model(), cpu_mesh(ws))
    optim = param_groups(model, optim_kind)
    train(model, optim, rank)
    d = out / rel
    if rank == 0:
        reset_dir(d)
    dist.barrier()
    # checkpoint_id is relative to `out` (the cwd) so no absolute path of
    # this machine ends up in .metadata.
    dcp.save({"model": get_model_state_dict(model),
              "optim": get_optimizer_state_dict(model, optim)},
             checkpoint_id=rel)
    if rank_meta_rel:
        if rank == 0:
            reset_dir(out / rank_meta_rel)
        dist.barrier()
        dcp.save({"model": get_model_state_dict(model),
                  "optim": get_optimizer_state_dict(model, optim)},
                 checkpoint_id=rank_meta_rel, use_collectives=False)
    # A live full state dict to check torch's own dcp_to_torch_save against.
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=full)
    osd = get_optimizer_state_dict(model, optim, options=full)
    dist.barrier()
    if rank == 0:
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        ref = out / (rel + ".ref.pt")
        dcp_to_torch_save(rel, ref)
        loaded = torch.load(ref, weights_only=True)
        assert_same(loaded, {"model": msd, "optim": osd}, rel)
        if rank_meta_rel:
            shutil.copy(ref, out / (rank_meta_rel + ".ref.pt"))


def job_fsdp1(rank: int, ws: int, out: Path, rel: str, kind: str) -> None:
    """FSDP1 on CPU: per-rank torch.save of SHARDED_STATE_DICT state dicts.

    kind "st": ShardedTensor values (no device_mesh), files {model,optim}_rank{r}.pt
    kind "dt": DTensor values (device_mesh given), veRL names
    kind "flat": veRL with use_orig_params=False and the raw
                 optimizer.state_dict() (integer ids, flat 1-D shards)
    All write {model,optim}_full.pt (FULL_STATE_DICT, rank 0) as reference;
    "flat" only model_full.pt and optim_full.pt from FSDP.optim_state_dict.
    """
    from torch.distributed.fsdp import (FullOptimStateDictConfig,
                                        FullStateDictConfig,
                                        FullyShardedDataParallel as FSDP,
                                        StateDictType)
    mesh = cpu_mesh(ws) if kind in ("dt", "flat") else None
    model = fsdp1_wrap(fresh_model(), mesh, use_orig_params=(kind != "flat"))
    optim = param_groups(model, "adamw")
    train(model, optim, rank)
    d = out / rel
    if rank == 0:
        reset_dir(d)
    dist.barrier()
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        msd = model.state_dict()
        osd = optim.state_dict() if kind == "flat" else FSDP.optim_state_dict(model, optim)
    if kind == "st":
        mname, oname = f"model_rank{rank}.pt", f"optim_rank{rank}.pt"
    else:
        mname = f"model_world_size_{ws}_rank_{rank}.pt"
        oname = f"optim_world_size_{ws}_rank_{rank}.pt"
    torch.save(msd, d / mname)
    torch.save(osd, d / oname)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True),
                              # offload_to_cpu=False on purpose: with True, FSDP1 on
                              # CPU returns views of one reused all-gather buffer
                              # (`.cpu()` is a no-op, the `.clone()` is skipped), so
                              # exp_avg and exp_avg_sq of a parameter come out equal.
                              FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True)):
        fmsd = model.state_dict()
        fosd = FSDP.optim_state_dict(model, optim)
    if rank == 0:
        torch.save(fmsd, d / "model_full.pt")
        torch.save(fosd, d / "optim_full.pt")
    dist.barrier()
    # Self-check: every rank reloads its own files (ShardedTensor/DTensor need
    # the live process group), rank 0 assembles the shards and compares them
    # bit for bit with the FULL_STATE_DICT references.
    check = [mname] if kind == "flat" else [mname, oname]
    for fname, ref in zip(check, ("model_full.pt", "optim_full.pt")):
        pieces = shard_pieces(torch.load(d / fname, weights_only=False))
        gathered = [None] * ws if rank == 0 else None
        dist.gather_object(pieces, gathered, dst=0)
        if rank == 0:
            assemble_and_compare(gathered, torch.load(d / ref, weights_only=True), f"{rel}/{fname}")


def shard_pieces(obj, prefix=()):
    """{path: ("shard", global_shape, [(offsets, local tensor)]) | ("value", v)}."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    out = {}
    if isinstance(obj, ShardedTensor):
        out[prefix] = ("shard", tuple(obj.size()),
                       [(tuple(sh.metadata.shard_offsets), sh.tensor.clone()) for sh in obj.local_shards()])
    elif isinstance(obj, DTensor):
        _, off = compute_local_shape_and_global_offset(obj.shape, obj.device_mesh, obj.placements)
        out[prefix] = ("shard", tuple(obj.shape), [(tuple(off), obj.to_local().clone())])
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(shard_pieces(v, prefix + (k,)))
    elif isinstance(obj, list) and obj and isinstance(obj[0], dict):
        for i, v in enumerate(obj):
            out.update(shard_pieces(v, prefix + (i,)))
    else:
        out[prefix] = ("value", obj)
    return out


def assemble_and_compare(per_rank, ref, where: str) -> None:
    flat_ref = shard_pieces(ref)
    assert set(flat_ref) == set(per_rank[0]), (where, set(flat_ref) ^ set(per_rank[0]))
    for path, (_, want) in flat_ref.items():
        kind = per_rank[0][path][0]
        if kind == "value":
            for r, pieces in enumerate(per_rank):
                assert_same(pieces[path][1], want, f"{where}:{path} rank {r}")
            continue
        shape = per_rank[0][path][1]
        got = torch.zeros(shape, dtype=want.dtype)
        seen = torch.zeros(shape, dtype=torch.int32)
        for pieces in per_rank:
            for off, t in pieces[path][2]:
                box = tuple(slice(o, o + n) for o, n in zip(off, t.shape))
                got[box] = t
                seen[box] += 1
        assert bool((seen == 1).all()), (where, path, "coverage")
        if not torch.equal(got, want):
            raise AssertionError(f"{where}:{path} differs: got {got} want {want}")


def assert_same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(map(str, a)), sorted(map(str, b)))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}.{i}")
    else:
        assert a == b, (where, a, b)


def job_titan(rank: int, ws: int, out: Path, rel: str) -> None:
    """torchtitan's checkpoint layout, made with the torch calls torchtitan's
    CheckpointManager makes (torchtitan itself needs CUDA): a training output
    folder with one DCP directory per save, ``<rel>/step-<N>/``, each saving
    ``{"model", "optimizer", "lr_scheduler", "dataloader", "train_state"}``
    with ``dcp.save(states, checkpoint_id=...)``:

    - model: FSDP2 ``get_model_state_dict`` (ModelWrapper);
    - optimizer: ``get_optimizer_state_dict(..., flatten_optimizer_state_dict=True)``
      (OptimizersContainer): keys ``state.<fqn>.<name>`` and ``param_groups.<fqn>.<key>``;
    - lr_scheduler: a LambdaLR's ``state_dict()`` (LRSchedulersContainer);
    - dataloader: ``{"dp_rank_<r>": pickle.dumps(loader state), "world_size": ws}``
      (ParallelAwareDataloader): one bytes item per rank;
    - train_state: ``{"step": int32 0-dim tensor, "global_avg_losses",
      "global_max_losses", "log_steps": io.BytesIO holding torch.save of a list}``.

    Saves once, at step 3 (each save is ~210 KB: every flattened
    param_groups value is its own torch.save'd item); tests make roots with
    several saves from copies. Reference: torch's
    ``dcp_to_torch_save``, beside ``rel`` (``step-<N>.ref.pt``; its BytesIO values are pickled
    ``_io.BytesIO`` objects, which ``torch.load(weights_only=True)`` refuses).
    """
    import io
    import pickle
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    model = fsdp2_wrap(fresh_model(), cpu_mesh(ws))
    optim = param_groups(model, "adamw")
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_lambda=lambda s: min(1.0, (s + 1) / 10))
    losses, max_losses, log_steps = [], [], []
    for step in range(STEPS):
        optim.zero_grad(set_to_none=True)
        loss = model(batch(step, rank))
        loss.backward()
        optim.step()
        sched.step()
        # As torchtitan logs them: reduced over ranks, so every rank saves
        # the same lists (DCP writes a replicated item from one rank only).
        avg, top = loss.detach().clone(), loss.detach().clone()
        dist.all_reduce(avg)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        losses.append(round(float(avg) / ws, 4))
        max_losses.append(round(float(top), 4))
        log_steps.append(step + 1)
        if step + 1 < STEPS:
            continue

        def saved(values):
            buf = io.BytesIO()
            torch.save(values, buf)
            return buf

        loader_state = {"_num_yielded": step + 1, "_sampler_iter_yielded": step + 1,
                        "_iterator_finished": False, "_snapshot_step": step + 1, "rank": rank}
        states = {
            "model": get_model_state_dict(model),
            "optimizer": get_optimizer_state_dict(
                model, optim, options=StateDictOptions(flatten_optimizer_state_dict=True)),
            "lr_scheduler": sched.state_dict(),
            "dataloader": {f"dp_rank_{rank}": pickle.dumps(loader_state), "world_size": ws},
            "train_state": {"step": torch.tensor(step + 1, dtype=torch.int32),
                            "global_avg_losses": saved(losses), "global_max_losses": saved(max_losses),
                            "log_steps": saved(log_steps)},
        }
        cid = f"{rel}/step-{step + 1}"
        ref_path = out / Path(rel).parent / f"step-{step + 1}.ref.pt"
        if rank == 0:
            reset_dir(out / cid)
        dist.barrier()
        dcp.save(states, checkpoint_id=cid)
        dist.barrier()
        if rank == 0:
            dcp_to_torch_save(cid, ref_path)
            ref = torch.load(ref_path, weights_only=False)
            assert isinstance(ref["train_state"]["global_avg_losses"], io.BytesIO)
            assert torch.load(io.BytesIO(ref["train_state"]["global_avg_losses"].getvalue())) == losses
            assert ref["dataloader"]["dp_rank_1"] != ref["dataloader"]["dp_rank_0"]
            full = StateDictOptions(full_state_dict=True, cpu_offload=True)
            assert_same(ref["model"], get_model_state_dict(model, options=full), cid)
        else:
            get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        dist.barrier()


def corpus_worker(rank: int, ws: int, out: str, jobs) -> None:
    out = Path(out)
    for job in jobs:
        name, *args = job
        {"dcp": job_dcp, "fsdp1": job_fsdp1, "titan": job_titan}[name](rank, ws, out, *args)
        dist.barrier()


# --------------------------------------------------------------------------
# Plain torch.save file with every dtype
# --------------------------------------------------------------------------


def write_zstd_dcp(out: Path, rel: str) -> None:
    """A single-process DCP save whose items are zstd-compressed, and torch's
    dcp_to_torch_save of it (needs the `zstandard` package)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    g = torch.Generator().manual_seed(SEED)
    model = {"w": torch.randn(7, 8, generator=g), "b": torch.randn(7, generator=g).bfloat16()}
    optim = {"state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.randn(7, 8, generator=g)}},
             "param_groups": [{"lr": 0.01, "betas": (0.9, 0.99), "params": ["w"]}]}
    reset_dir(out / rel)
    dcp.save({"model": model, "optim": optim}, no_dist=True,
             storage_writer=FileSystemWriter(str(out / rel), _extensions=[ZStandard()]))
    dcp_to_torch_save(out / rel, out / (rel + ".ref.pt"))


def write_dtypes(path: Path) -> None:
    g = torch.Generator().manual_seed(SEED)
    base = torch.randn(3, 4, generator=g, dtype=torch.float64)
    ints = torch.tensor([[0, 1, -2], [3, -4, 5]])
    t = {
        "float64": base.clone(),
        "float32": base.float(),
        "float16": base.half(),
        "bfloat16": base.bfloat16(),
        "float8_e4m3fn": base.to(torch.float8_e4m3fn),
        "float8_e5m2": base.to(torch.float8_e5m2),
        "int8": ints.to(torch.int8),
        "int16": ints.to(torch.int16) * 1000,
        "int32": ints.to(torch.int32) * 100000,
        "int64": ints * (1 << 40),
        "uint8": torch.tensor([0, 1, 255], dtype=torch.uint8),
        "uint16": torch.tensor([0, 1, 65535], dtype=torch.uint16),
        "uint32": torch.tensor([0, 1, 4294967295], dtype=torch.uint32),
        "uint64": torch.tensor([0, 1, 2**63 - 1], dtype=torch.uint64),
        "bool": torch.tensor([True, False, True]),
        "complex64": torch.complex(base.float(), -base.float()),
        "complex128": torch.complex(base, -base),
    }
    storage = torch.arange(20, dtype=torch.float32)
    obj = {
        "tensors": t,
        # stride (1, 4): the whole 3x4 storage is written, read as 4x3
        "transposed": t["float32"].t(),
        # two views of one 20-element storage; the second starts at offset 5
        "shared_a": storage[:10].view(2, 5),
        "shared_b": storage[5:17].view(3, 4),
        "scalar0d": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
        "nested": {
            "list": [1, 2.5, "three", None, True, False],
            "tuple": (1, ("a", "b"), [torch.tensor([7, 8], dtype=torch.int32)]),
            "str": "ckptconv",
            "float": 0.1,
            "int": -(2**40),
            "none": None,
            "bool": True,
            "empty_dict": {},
            "int_keys": {0: "zero", 1: "one"},
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    back = torch.load(path, weights_only=True)
    assert back["shared_b"].storage_offset() == 5
    assert back["shared_a"].untyped_storage().data_ptr() == back["shared_b"].untyped_storage().data_ptr()


# --------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------

MODEL_DESC = ("Net: emb.weight 10x4, fc1.weight 8x4, fc1.bias 8, fc2.weight 7x8, fc2.bias 7, "
              "scale 2, frozen 4x4 (requires_grad=False, not in the optimizer)")
TENSOR_SHAPES = {"emb.weight": [10, 4], "fc1.weight": [8, 4], "fc1.bias": [8],
                 "fc2.weight": [7, 8], "fc2.bias": [7], "scale": [2], "frozen": [4, 4]}
TRAINABLE = ["emb.weight", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "scale"]


DCP_EXERCISES = {
    1: "single rank: one chunk per tensor",
    2: "fc2 7 rows -> chunks 4+3; two files",
    3: "emb 10 rows -> 4+4+2, scale 2 -> 1+1+0 (an empty chunk)",
    4: "fc2 7 rows -> 2+2+2+1, scale -> 1+1+0+0, frozen 4x4 -> 1 row each",
}


def corpus_plan():
    """(world_size, jobs, manifest entries) per spawn."""
    plan = []
    for ws in (1, 2, 3, 4):
        jobs, entries = [], []
        rel = f"dcp/fsdp2_adamw_ws{ws}"
        rank_meta = f"dcp/fsdp2_adamw_ws{ws}_rankmeta" if ws == 3 else None
        jobs.append(("dcp", rel, "adamw", rank_meta))
        entries.append(dict(path=rel, family="dcp", world_size=ws, optimizer="adamw",
                            exercises=DCP_EXERCISES[ws],
                            writer="FSDP2 fully_shard + dcp.save(get_model_state_dict, get_optimizer_state_dict)",
                            reference={"dcp_to_torch_save": rel + ".ref.pt"}))
        if rank_meta:
            entries.append(dict(path=rank_meta, family="dcp_rank_metadata", world_size=ws, optimizer="adamw",
                                exercises="per-rank __<rank>.metadata files and no global .metadata "
                                          "(dcp.save use_collectives=False); same state as " + rel,
                                writer="FSDP2 fully_shard + dcp.save(..., use_collectives=False)",
                                reference={"dcp_to_torch_save": rank_meta + ".ref.pt"}))
        if ws == 2:
            rel = "dcp/fsdp2_sgd_ws2"
            jobs.append(("dcp", rel, "sgd"))
            entries.append(dict(path=rel, family="dcp", world_size=ws, optimizer="sgd",
                                exercises="SGD momentum_buffer only (no step tensor); different param_group keys",
                                writer="FSDP2 fully_shard + dcp.save(get_model_state_dict, get_optimizer_state_dict)",
                                reference={"dcp_to_torch_save": rel + ".ref.pt"}))
        if ws in (2, 3):
            rel = f"fsdp_st/adamw_ws{ws}"
            jobs.append(("fsdp1", rel, "st"))
            entries.append(dict(
                path=rel, family="fsdp_sharded_tensor", world_size=ws, optimizer="adamw",
                exercises="ShardedTensor values (ChunkShardingSpec dim 0, torch.chunk rows); FQN-keyed optimizer state",
                writer="FSDP1 (CPU, use_orig_params=True) SHARDED_STATE_DICT: model.state_dict(), FSDP.optim_state_dict",
                optim_keys="fqn",
                model_files=[f"{rel}/model_rank{r}.pt" for r in range(ws)],
                optim_files=[f"{rel}/optim_rank{r}.pt" for r in range(ws)],
                reference={"model_full": rel + "/model_full.pt", "optim_full": rel + "/optim_full.pt"}))
            rel = f"fsdp_dt/adamw_ws{ws}"
            jobs.append(("fsdp1", rel, "dt"))
            entries.append(dict(
                path=rel, family="fsdp_dtensor", world_size=ws, optimizer="adamw",
                exercises="DTensor values (Shard(0) on a 1-D CPU mesh), veRL file names; FQN-keyed optimizer state",
                writer="FSDP1 (CPU, device_mesh, use_orig_params=True) SHARDED_STATE_DICT: model.state_dict(), FSDP.optim_state_dict",
                optim_keys="fqn",
                model_files=[f"{rel}/model_world_size_{ws}_rank_{r}.pt" for r in range(ws)],
                optim_files=[f"{rel}/optim_world_size_{ws}_rank_{r}.pt" for r in range(ws)],
                reference={"model_full": rel + "/model_full.pt", "optim_full": rel + "/optim_full.pt"}))
        if ws == 2:
            rel = "titan/checkpoint"
            jobs.append(("titan", rel))
            entries.append(dict(
                path=rel, family="torchtitan", world_size=ws, optimizer="adamw",
                exercises=("a training output folder holding a DCP save (step-3) in torchtitan's layout: "
                           "flattened optimizer keys, lr_scheduler and dataloader byte items, an int32 step "
                           "tensor and io.BytesIO items in train_state"),
                writer=("FSDP2 fully_shard + dcp.save({model, optimizer (flatten_optimizer_state_dict=True), "
                        "lr_scheduler, dataloader, train_state}) as torchtitan's CheckpointManager"),
                reference={"dcp_to_torch_save": "titan/step-3.ref.pt"}))
            rel = "fsdp_dt/verl_flat_ws2"
            jobs.append(("fsdp1", rel, "flat"))
            entries.append(dict(
                path=rel, family="fsdp_dtensor", world_size=ws, optimizer="adamw",
                exercises=("veRL's exact save: DTensor model files, but optimizer files are the raw "
                           "optimizer.state_dict() of FlatParameters (integer ids, padded 1-D shards): "
                           "model consolidates, optimizer must be refused with an explanation; "
                           "frozen is an FSDP-ignored plain tensor"),
                writer="FSDP1 (CPU, device_mesh, use_orig_params=False) SHARDED_STATE_DICT: model.state_dict(), raw optimizer.state_dict() (as veRL saves it)",
                optim_keys="int",
                optim_consolidatable=False,
                model_files=[f"{rel}/model_world_size_{ws}_rank_{r}.pt" for r in range(ws)],
                optim_files=[f"{rel}/optim_world_size_{ws}_rank_{r}.pt" for r in range(ws)],
                reference={"model_full": rel + "/model_full.pt", "optim_full": rel + "/optim_full.pt"}))
        plan.append((ws, jobs, entries))
    return plan


def list_files(out: Path, rel: str):
    p = out / rel
    if p.is_dir():
        return sorted(str(f.relative_to(out)) for f in p.rglob("*") if f.is_file())
    return [rel]


def cmd_corpus(args) -> None:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    os.chdir(out)  # DCP checkpoint ids are relative to the corpus root
    fixtures = []
    selected = lambda path: not args.only or any(path.startswith(o) for o in args.only)  # noqa: E731
    for ws, jobs, entries in corpus_plan():
        jobs = [j for j in jobs if selected(j[1])]
        entries = [e for e in entries if selected(e["path"])]
        if not jobs:
            continue
        for e in entries:  # delete and rewrite each fixture
            for p in [out / e["path"], *(out / r for r in e["reference"].values())]:
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
        t = time.time()
        spawn(ws, corpus_worker, str(out), jobs)
        print(f"world size {ws}: {[j[1] for j in jobs]} in {time.time() - t:.1f}s", flush=True)
        fixtures += entries
    if selected("pt/dtypes.pt"):
        write_dtypes(out / "pt" / "dtypes.pt")
        fixtures.append(dict(path="pt/dtypes.pt", family="pt", world_size=1, optimizer=None,
                             exercises=("every dtype torch.save writes (v2 and v3 rebuilds), transposed view, "
                                        "two views of one storage with offset, 0-dim, empty, nested containers"),
                             writer="torch.save", reference={}))
    if selected("dcp/zstd_ws1"):
        write_zstd_dcp(out, "dcp/zstd_ws1")
        fixtures.append(dict(path="dcp/zstd_ws1", family="dcp_zstd", world_size=1, optimizer="adamw",
                             exercises="items compressed with the stream.zstd/1 transform (FileSystemWriter _extensions=[ZStandard()])",
                             writer="dcp.save(no_dist=True, storage_writer=FileSystemWriter(_extensions=[ZStandard()]))",
                             reference={"dcp_to_torch_save": "dcp/zstd_ws1.ref.pt"}))
    for e in fixtures:
        e["files"] = list_files(out, e["path"])
        if e["family"] == "torchtitan":
            e["model"] = MODEL_DESC
            e["tensors"] = TENSOR_SHAPES
            e["steps"] = STEPS
        elif e["family"] not in ("pt", "dcp_zstd"):
            e["model"] = MODEL_DESC
            e["tensors"] = TENSOR_SHAPES
            ref = e["reference"]
            optim = (torch.load(out / ref["dcp_to_torch_save"], weights_only=True)["optim"]
                     if "dcp_to_torch_save" in ref else torch.load(out / ref["optim_full"], weights_only=True))
            # Recorded from torch's own reference output, not hand-written.
            e["param_groups"] = [{k: g[k] for k in ("lr", "weight_decay", "momentum", "params") if k in g}
                                 for g in optim["param_groups"]]
            e["optim_state"] = {fqn: sorted(st) for fqn, st in optim["state"].items()}
            e["steps"] = STEPS
    if args.only:  # keep the other fixtures' entries, in their order
        old = json.loads((out / "manifest.json").read_text())["fixtures"]
        new = {e["path"]: e for e in fixtures}
        fixtures = [new.pop(e["path"], e) for e in old] + list(new.values())
    manifest = {
        "torch_version": torch.__version__,
        "python_version": sys.version.split()[0],
        "generator": "tools/make_checkpoints.py corpus",
        "seed": SEED,
        "fixtures": fixtures,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"corpus: {len(fixtures)} fixtures, {total} bytes, {time.time() - t0:.1f}s")


# --------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------


def bench_dims(nbytes: int, layers: int):
    # params + exp_avg + exp_avg_sq, fp32: 12 bytes per parameter element;
    # each layer is d x d weight plus d bias.
    per_layer = nbytes / 12 / layers
    d = int(math.isqrt(int(per_layer)))
    return max(d, 8)


class BenchNet(nn.Module):
    def __init__(self, d: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))


def _bench_fill(model: nn.Module, optim, rank: int) -> None:
    """Seeded randn into the local shards, then one AdamW step on randn grads."""
    g = torch.Generator().manual_seed(SEED + 7919 * rank)
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.numel():
                local.copy_(torch.randn(local.shape, generator=g) * 0.02)
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        grad = torch.randn(local.shape, generator=g) * 1e-3
        if hasattr(p, "to_local"):
            from torch.distributed.tensor import DTensor
            grad = DTensor.from_local(grad, p.device_mesh, p.placements,
                                      shape=p.shape, stride=p.stride(), run_check=False)
        p.grad = grad
    optim.step()
    optim.zero_grad(set_to_none=True)


def bench_worker(rank: int, ws: int, out: str, layout: str, d: int, layers: int) -> None:
    out = Path(out)
    with torch.device("meta"):
        model = BenchNet(d, layers)
    if layout == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        from torch.distributed.fsdp import fully_shard
        mesh = cpu_mesh(ws)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        _bench_fill(model, optim, rank)
        dcp.save({"model": get_model_state_dict(model),
                  "optim": get_optimizer_state_dict(model, optim)},
                 checkpoint_id=str(out))
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    mesh = cpu_mesh(ws) if layout == "fsdp-dt" else None
    model = FSDP(model, device_id=torch.device("cpu"), device_mesh=mesh,
                 auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), use_orig_params=True,
                 param_init_fn=lambda m: m.to_empty(device=torch.device("cpu"), recurse=False))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    _bench_fill(model, optim, rank)
    if layout == "fsdp-st":
        names = (f"model_rank{rank}.pt", f"optim_rank{rank}.pt")
    else:
        names = (f"model_world_size_{ws}_rank_{rank}.pt", f"optim_world_size_{ws}_rank_{rank}.pt")
    # One state dict alive at a time keeps the peak lower.
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        msd = model.state_dict()
        torch.save(msd, out / names[0])
        del msd
        osd = FSDP.optim_state_dict(model, optim)
        torch.save(osd, out / names[1])


def cmd_bench(args) -> None:
    out = Path(args.out).resolve()
    d = bench_dims(args.bytes, args.layers)
    reset_dir(out)
    t0 = time.time()
    spawn(args.world_size, bench_worker, str(out), args.layout, d, args.layers)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"bench: {args.layout} ws={args.world_size} {args.layers} x Linear({d}, {d}) "
          f"-> {out} {total} bytes in {time.time() - t0:.1f}s")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("corpus", help="regenerate the test corpus (default)")
    c.add_argument("--out", default="testdata")
    c.add_argument("--only", nargs="+", metavar="PATH",
                   help="rewrite only the fixtures whose path starts with one of these (e.g. titan/); "
                        "the other manifest entries are kept")
    b = sub.add_parser("bench", help="one large checkpoint for benchmarks")
    b.add_argument("--out", required=True)
    b.add_argument("--bytes", type=float, required=True, help="approximate total size, e.g. 2e9")
    b.add_argument("--world-size", type=int, default=4)
    b.add_argument("--layers", type=int, default=8,
                   help="Linear layers (more layers: smaller per-unit gathers in FSDP1)")
    b.add_argument("--layout", choices=("dcp", "fsdp-st", "fsdp-dt"), default="dcp")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("corpus", "bench", "-h", "--help"):
        argv = ["corpus"] + argv
    args = ap.parse_args(argv)
    if args.cmd == "bench":
        args.bytes = int(args.bytes)
        cmd_bench(args)
    else:
        cmd_corpus(args)


if __name__ == "__main__":
    main()
