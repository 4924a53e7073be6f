#!/usr/bin/env python3
"""Write small real checkpoints with OLDER torch versions (testdata/legacy/).

Each case must run under one specific torch, installed in a side virtual
environment outside the repository (never the project's .venv); make them
with ``scripts/setup-legacy-torch`` (default root /work/venvs):

    /work/venvs/torch20/bin/python  tools/make_legacy_checkpoints.py  # torch 2.0.0 cases
    /work/venvs/torch24/bin/python  tools/make_legacy_checkpoints.py  # torch 2.4.1 cases
    /work/venvs/torch113/bin/python tools/make_legacy_checkpoints.py  # torch 1.13.1 cases (Python 3.10)
    /usr/bin/python3 tools/make_legacy_checkpoints.py  # Debian 12's python3-torch: torch 1.13.1, Python 3.11

Without ``--case`` every case of the running torch version is (re)written;
``--out`` defaults to testdata/legacy. ``--list`` prints the cases. Each case
folder is deleted and rewritten: ``ckpt/`` (the checkpoint exactly as torch
wrote it), ``reference.pt`` and ``case.json`` (torch version, writer calls,
world size, files with sizes, provenance of the reference, self-checks).

Cases (world size 2, gloo on 127.0.0.1, CPU only, seed 0, the ``Net`` of
tools/make_checkpoints.py trained 3 real AdamW steps, rank r gets batch seed
1000*step + r):

  torch20_dcp_fsdp1_ws2   torch 2.0.0   DCP dir via ``dist_cp.save_state_dict``
  torch24_dcp_fsdp1_ws2   torch 2.4.1   DCP dir via ``dcp.save``, real FSDP1 on CPU,
                                        SHARDED_STATE_DICT (ShardedTensor values)
  torch113_fsdp1_st_ws2   torch 1.13.1  per-rank ``torch.save`` of FSDP1
                                        SHARDED_STATE_DICT ShardedTensor dicts
  torch113_py311_fsdp1_st_ws2           the same under Debian 12's python3-torch
                                        (torch 1.13.1, Python 3.11: enum
                                        members pickled by name)

FSDP2 (``fully_shard``) of torch 2.4 needs CUDA (it creates CUDA streams in
its lazy init), so 2.4 is covered with FSDP1, which runs on CPU there.
torch 2.0 and 1.13 cannot run FSDP on a CPU (FSDP's compute device is always
``cuda:<current>``; it uses CUDA streams). Those jobs therefore train with
DistributedDataParallel (gloo; gradients averaged across ranks, as FSDP's
reduce-scatter does) and then build the SHARDED_STATE_DICT values exactly as
that version's FSDP SHARDED_STATE_DICT path does: every sharded value comes
from the version's own ``torch.distributed.fsdp._fsdp_extensions._ext_chunk_tensor``
(-> ``_shard_utils._create_chunk_sharded_tensor``, public ShardedTensor API:
``Shard.from_tensor_and_offsets``, ``ShardedTensorMetadata``,
``ShardedTensor._init_from_local_shards_and_global_metadata``) with
``num_devices_per_node=1`` (FSDP passes ``torch.cuda.device_count()``, which is
0 here and would divide by zero), and the dict shapes and key orders of that
version's ``FSDP.state_dict`` / ``FSDP.optim_state_dict`` (2.0,
use_orig_params=True) or ``FSDP.sharded_optim_state_dict`` (1.13, flat
params). Everything after that (``save_state_dict``, ``torch.save``) is the
real writer of that torch.

Self-checks (every case): the reference equals the live FULL state dict bit
for bit. 2.4: the reference is torch 2.4's own ``dcp_to_torch_save`` and must
equal the FULL_STATE_DICT state dicts (``model.state_dict()``,
``FSDP.optim_state_dict``). 2.0 (no ``dcp_to_torch_save``): the
reference is the live full state dict and torch 2.0's own
``load_state_dict(..., no_dist=True)`` into zero-filled full tensors must give
it back bit for bit. 1.13: every rank reloads its own files with torch 1.13
in the live group, rank 0 assembles the shards (each element covered exactly
once) and must get the reference.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import shutil
import sys
from pathlib import Path

import dataclasses


def _tolerate_torch113_dataclass_defaults() -> None:
    """torch 1.13's sharded_tensor/metadata.py gives ShardedTensorMetadata a
    TensorProperties() default, which Python 3.11's dataclasses refuse
    ("mutable default ... for field tensor_properties") where 3.10 took it;
    Debian 12's python3-torch (1.13.1 on 3.11) then cannot import
    torch.distributed._shard. Define such a field as 3.10 did. Definition
    time only: how the files pickle (Python 3.11's Enum by name) is untouched."""
    if sys.version_info < (3, 11):
        return
    original = dataclasses._get_field

    def get_field(cls, name, tp, *rest):
        try:
            return original(cls, name, tp, *rest)
        except ValueError as e:
            default = getattr(cls, name, None)
            if isinstance(default, dataclasses.Field):  # field(default=TensorProperties())
                default = default.default
            if "mutable default" not in str(e) or not dataclasses.is_dataclass(default):
                raise
            kind = type(default)
            kind.__hash__ = object.__hash__
            try:
                return original(cls, name, tp, *rest)
            finally:
                kind.__hash__ = None

    dataclasses._get_field = get_field


_tolerate_torch113_dataclass_defaults()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_checkpoints import GROUP0, GROUP1, STEPS, batch, fresh_model  # noqa: E402
from make_checkpoints import spawn as mc_spawn  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WS = 2
TORCH = torch.__version__.split("+")[0]


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------


def sgd(groups):
    """The corpus SGD (tools/make_checkpoints.py param_groups): two groups, momentum 0.9."""
    return torch.optim.SGD(
        [{"params": groups[0], "lr": 0.1},
         {"params": groups[1], "lr": 0.05}],
        momentum=0.9, foreach=False)


def adamw(groups):
    """The corpus AdamW (tools/make_checkpoints.py param_groups): two groups."""
    return torch.optim.AdamW(
        [{"params": groups[0], "lr": 1e-2, "weight_decay": 0.01},
         {"params": groups[1], "lr": 3e-3, "weight_decay": 0.0}],
        betas=(0.9, 0.99), foreach=False)


def named_groups(model: nn.Module, order=(GROUP0, GROUP1)):
    named = {n.replace("_fsdp_wrapped_module.", ""): p for n, p in model.named_parameters()}
    return [[named[n] for n in g] for g in order]


def train(model, optim, rank):
    for step in range(STEPS):
        optim.zero_grad(set_to_none=True)
        model(batch(step, rank)).backward()
        optim.step()


def _in_dir(rank, ws, cwd, fn, *args):
    """Runs `fn` from `cwd`: checkpoint paths are relative, so no absolute
    path of this machine ends up in .metadata."""
    import warnings
    warnings.filterwarnings("ignore")  # old torch's deprecation notices, per rank
    os.chdir(cwd)
    fn(rank, ws, *args)


def spawn(ws, cwd, fn, *args):
    """make_checkpoints.spawn (gloo on 127.0.0.1, one thread per rank) from `cwd`."""
    mc_spawn(ws, _in_dir, str(cwd), fn, *args)


def assert_same(a, b, where, key_order=True):
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor), (where, type(a))
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
        ua = a.detach().contiguous().reshape(-1)
        ub = b.detach().contiguous().reshape(-1)
        if ua.numel():
            ua, ub = ua.view(torch.uint8), ub.view(torch.uint8)
        assert torch.equal(ua, ub), f"{where}: tensor bytes differ"
    elif isinstance(b, dict):
        assert isinstance(a, dict), (where, type(a))
        if key_order:
            assert list(a) == list(b), (where, list(a), list(b))
        else:
            assert sorted(map(str, a)) == sorted(map(str, b)), (where, list(a), list(b))
        for k in b:
            assert_same(a[k], b[k], f"{where}.{k}", key_order)
    elif isinstance(b, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}.{i}", key_order)
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def clone_tree(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, dict):
        return {k: clone_tree(c) for k, c in v.items()}
    if isinstance(v, list):
        return [clone_tree(c) for c in v]
    if isinstance(v, tuple):
        return tuple(clone_tree(c) for c in v)
    return copy.deepcopy(v)


def check_ranks_agree(tree, where):
    """DDP keeps every rank's replica identical; check it bit for bit."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, clone_tree(tree))
    for r, g in enumerate(gathered):
        assert_same(g, gathered[0], f"{where} rank {r}")


def reset_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


# --------------------------------------------------------------------------
# FSDP1 SHARDED_STATE_DICT built with the version's own helper (2.0, 1.13)
# --------------------------------------------------------------------------


def ddp_trained(rank, make_optim):
    """Net trained 3 steps under DDP (gloo); returns (module, optim)."""
    model = fresh_model()
    ddp = nn.parallel.DistributedDataParallel(model)
    optim = make_optim(named_groups(model))
    train(ddp, optim, rank)
    return model, optim


def full_state(model, optim, state_order, group_order, per_param_order):
    """The FULL_STATE_DICT forms FSDP returns: model.state_dict() and an
    FQN-keyed optimizer state dict (param_groups' params as FQNs)."""
    fqn_of = {id(p): n for n, p in model.named_parameters()}
    msd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    by_fqn = {fqn_of[id(p)]: optim.state[p] for g in optim.param_groups for p in g["params"]}
    state = {fqn: {k: by_fqn[fqn][k].detach().clone() for k in per_param_order} for fqn in state_order}
    groups = []
    for g, fqns in zip(optim.state_dict()["param_groups"], group_order):
        g = copy.deepcopy(g)
        g["params"] = list(fqns)
        groups.append(g)
    return msd, {"state": state, "param_groups": groups}


def chunk(t, rank, ws, pg):
    """FSDP's own SHARDED_STATE_DICT chunking helper of this torch version."""
    from torch.distributed.fsdp._fsdp_extensions import _ext_chunk_tensor
    return _ext_chunk_tensor(t, rank, ws, 1, pg)


def sharded_from_full(msd, osd, rank, ws, ignored=(), optim_cpu=False):
    pg = dist.distributed_c10d._get_default_group()
    smsd = {k: (v.clone() if k in ignored else chunk(v.clone(), rank, ws, pg)) for k, v in msd.items()}
    sstate = {}
    for fqn, st in osd["state"].items():
        sstate[fqn] = {}
        for k, v in st.items():
            if torch.is_tensor(v) and v.dim() > 0:
                v = chunk(v.clone(), rank, ws, pg)
                if optim_cpu:
                    v = v.cpu()  # 2.0 _gather_orig_param_state: value = value.cpu()
            else:
                v = v.clone() if torch.is_tensor(v) else v
            sstate[fqn][k] = v
    return smsd, {"state": sstate, "param_groups": copy.deepcopy(osd["param_groups"])}


# --------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------


def job_torch20_dcp(rank, ws, rel):
    """torch 2.0.0: FSDP1 SHARDED_STATE_DICT values, saved as 2.0's docs show:
    ``dist_cp.save_state_dict(state_dict={"model": model.state_dict(),
    "optim": FSDP.optim_state_dict(model, optim)},
    storage_writer=dist_cp.FileSystemWriter(path))``."""
    import torch.distributed.checkpoint as dist_cp
    model, optim = ddp_trained(rank, adamw)
    # FSDP 2.0 use_orig_params=True: optimizer state in sorted FQN order
    # (_map_param_key_to_optim_keys merges and sorts the keys), each entry as
    # _all_gather_optim_state builds it: positive-dim tensors sorted by name,
    # then the 0-dim step.
    fqns = sorted(GROUP0 + GROUP1)
    msd, osd = full_state(model, optim, fqns, (GROUP0, GROUP1), ("exp_avg", "exp_avg_sq", "step"))
    check_ranks_agree((msd, osd), "ddp replicas")
    smsd, sosd = sharded_from_full(msd, osd, rank, ws, optim_cpu=True)
    if rank == 0:
        reset_dir(Path(rel))
    dist.barrier()
    dist_cp.save_state_dict(state_dict={"model": smsd, "optim": sosd},
                            storage_writer=dist_cp.FileSystemWriter(rel))
    dist.barrier()
    if rank == 0:
        ref = {"model": msd, "optim": osd}
        torch.save(ref, "reference.pt")
        # torch 2.0 reads its own checkpoint back (no process group) into
        # zero-filled full tensors: must give the live full state bit for bit.
        template = {"model": {k: torch.zeros_like(v) for k, v in msd.items()},
                    "optim": {"state": {f: {k: torch.zeros_like(v) for k, v in s.items()}
                                        for f, s in osd["state"].items()},
                              "param_groups": None}}
        dist_cp.load_state_dict(state_dict=template, storage_reader=dist_cp.FileSystemReader(rel),
                                no_dist=True)
        assert_same(template, ref, "torch 2.0 load_state_dict(no_dist=True) vs live full")
        assert_same(torch.load("reference.pt", weights_only=True), ref, "reference.pt")


def job_torch24_fsdp1(rank, ws, rel):
    """torch 2.4.1: FSDP1 on CPU (``device_id=cpu``, ModuleWrapPolicy({Embedding,
    Linear}), use_orig_params=True), SGD (lr 0.1, momentum 0.9) with ONE param
    group (DCP 2.4 writes every param_groups value as its own item; AdamW and
    two groups would double the size), ``SHARDED_STATE_DICT``:
    ``dcp.save({"model": model.state_dict(), "optim":
    FSDP.optim_state_dict(model, optim)}, checkpoint_id="ckpt")``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig,
                                        FullyShardedDataParallel as FSDP, StateDictType)
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    model = FSDP(fresh_model(), device_id=torch.device("cpu"),
                 auto_wrap_policy=ModuleWrapPolicy({nn.Embedding, nn.Linear}), use_orig_params=True)
    optim = torch.optim.SGD(named_groups(model, (GROUP0 + GROUP1,))[0], lr=0.1, momentum=0.9, foreach=False)
    train(model, optim, rank)
    if rank == 0:
        reset_dir(Path(rel))
    dist.barrier()
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        dcp.save({"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optim)},
                 checkpoint_id=rel)
    # offload_to_cpu=False for both: with True, torch 2.4.1 FSDP1 on CPU
    # segfaults in the FULL_STATE_DICT param_hook (`.clone()` of the
    # offloaded parameter), and the optimizer has the quirk in testdata/README.md.
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
                              FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)):
        live = {"model": clone_tree(model.state_dict()), "optim": clone_tree(FSDP.optim_state_dict(model, optim))}
    dist.barrier()
    if rank == 0:
        write_dcp_reference(rel, live)


def write_dcp_reference(rel, live):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dcp_to_torch_save(rel, "reference.pt")
    loaded = torch.load("reference.pt", weights_only=True)
    # dcp_to_torch_save follows the checkpoint's key order; the live dicts may differ in order.
    assert_same(loaded, live, "dcp_to_torch_save vs live FULL state dict", key_order=False)


def job_torch113_st(rank, ws, rel):
    """torch 1.13.1: the per-rank files FSDP1 ``SHARDED_STATE_DICT`` gives with
    flat parameters (1.13 has no use_orig_params): ``torch.save(model.state_dict(),
    "model_rank{r}.pt")`` and ``torch.save(FSDP.sharded_optim_state_dict(model,
    optim), "optim_rank{r}.pt")``. ``frozen`` would be outside FSDP (a flat
    parameter needs uniform requires_grad), so it stays a plain tensor. SGD
    with momentum keeps the files small."""
    model, optim = ddp_trained(rank, sgd)
    # 1.13 flat params: units emb, fc1, fc2 and the root (scale); the optimizer
    # sees [emb, fc1] and [root, fc2] flat params, so unflattened FQNs follow
    # that order, and each entry is (sorted tensor states, then step).
    g1 = ("scale", "fc2.weight", "fc2.bias")
    order = GROUP0 + g1
    msd, osd = full_state(model, optim, order, (GROUP0, g1), ("momentum_buffer",))
    check_ranks_agree((msd, osd), "ddp replicas")
    smsd, sosd = sharded_from_full(msd, osd, rank, ws, ignored=("frozen",))
    d = Path(rel)
    if rank == 0:
        reset_dir(d)
    dist.barrier()
    torch.save(smsd, d / f"model_rank{rank}.pt")
    torch.save(sosd, d / f"optim_rank{rank}.pt")
    dist.barrier()
    ref = {"model": msd, "optim": osd}
    if rank == 0:
        torch.save(ref, "reference.pt")
    # Reload with torch 1.13 in the live group, assemble on rank 0.
    got = {"model": torch.load(d / f"model_rank{rank}.pt"), "optim": torch.load(d / f"optim_rank{rank}.pt")}
    pieces = st_pieces(got)
    gathered = [None] * ws
    dist.all_gather_object(gathered, pieces)
    if rank == 0:
        assemble_and_compare(gathered, ref)
        assert_same(torch.load("reference.pt"), ref, "reference.pt")


def st_pieces(obj, prefix=()):
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    if isinstance(obj, ShardedTensor):
        return {prefix: ("shard", tuple(obj.size()),
                         [(tuple(s.metadata.shard_offsets), s.tensor.clone()) for s in obj.local_shards()])}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(st_pieces(v, prefix + (k,)))
        return out
    return {prefix: ("value", obj)}


def assemble_and_compare(per_rank, ref):
    flat = st_pieces(ref)
    assert list(flat) == list(per_rank[0]), (list(flat), list(per_rank[0]))
    for path, (_, want) in flat.items():
        if per_rank[0][path][0] == "value":
            for r, p in enumerate(per_rank):
                assert_same(p[path][1], want, f"{path} rank {r}")
            continue
        got = torch.zeros(per_rank[0][path][1], dtype=want.dtype)
        seen = torch.zeros(per_rank[0][path][1], dtype=torch.int32)
        for p in per_rank:
            for off, t in p[path][2]:
                box = tuple(slice(o, o + n) for o, n in zip(off, t.shape))
                got[box] = t
                seen[box] += 1
        assert bool((seen == 1).all()), (path, "coverage")
        assert_same(got, want, str(path))


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------

CASES = {
    "torch20_dcp_fsdp1_ws2": {
        "torch": "2.0.0", "job": job_torch20_dcp, "family": "dcp",
        "optimizer": "AdamW, groups [emb.weight, fc1.weight, fc1.bias] lr 1e-2 wd 0.01 and "
                     "[fc2.weight, fc2.bias, scale] lr 3e-3 wd 0.0, betas (0.9, 0.99), foreach=False",
        "writer": "torch 2.0.0 DDP training (FSDP needs CUDA in 2.0); SHARDED_STATE_DICT values from "
                  "torch.distributed.fsdp._fsdp_extensions._ext_chunk_tensor (ShardedTensor, "
                  "placements rank:r/cuda:0 then .cpu() for optimizer states as _gather_orig_param_state "
                  "does); torch.distributed.checkpoint.save_state_dict(state_dict={'model': msd, "
                  "'optim': osd}, storage_writer=FileSystemWriter('ckpt'))",
        "reference": "live FULL state dict {'model': model.state_dict(), 'optim': FQN-keyed full optimizer "
                     "state dict}; torch 2.0 has no dcp_to_torch_save. Checked: torch 2.0's own "
                     "load_state_dict(no_dist=True) into zero-filled full tensors equals it bit for bit",
        "exercises": "Metadata without storage_meta/version; TensorProperties from "
                     "torch.distributed._shard.sharded_tensor.metadata; param_groups as one bytes item",
    },
    "torch24_dcp_fsdp1_ws2": {
        "torch": "2.4.1", "job": job_torch24_fsdp1, "family": "dcp",
        "optimizer": "SGD lr 0.1 momentum 0.9 foreach=False, ONE param group (all six trainable params)",
        "writer": "torch 2.4.1 FSDP1 on CPU (device_id=cpu, ModuleWrapPolicy({Embedding, Linear}), "
                  "use_orig_params=True), trained with SGD; under SHARDED_STATE_DICT dcp.save({'model': model.state_dict(), "
                  "'optim': FSDP.optim_state_dict(model, optim)}, checkpoint_id='ckpt')",
        "reference": "torch 2.4.1 dcp_to_torch_save('ckpt', 'reference.pt'); checked equal to the "
                     "FULL_STATE_DICT model.state_dict() and FSDP.optim_state_dict bit for bit",
        "exercises": "Metadata with storage_meta but no version (2.4); ShardedTensor values through DCP; "
                     "param_groups flattened into one bytes item per key",
    },
    "torch113_fsdp1_st_ws2": {
        "torch": "1.13.1", "python": "3.10", "job": job_torch113_st, "family": "fsdp_sharded_tensor",
        "optimizer": "SGD momentum 0.9 foreach=False, groups [emb.weight, fc1.weight, fc1.bias] lr 0.1 "
                     "and [scale, fc2.weight, fc2.bias] lr 0.05 (flat-param order)",
        "writer": "torch 1.13.1 DDP training (FSDP needs CUDA in 1.13); SHARDED_STATE_DICT values from "
                  "torch.distributed.fsdp._fsdp_extensions._ext_chunk_tensor (ShardedTensor, placements "
                  "rank:r/cuda:0); torch.save(model_sd, 'ckpt/model_rank{r}.pt'), "
                  "torch.save(sharded_optim_sd, 'ckpt/optim_rank{r}.pt'); frozen plain (FSDP-ignored)",
        "reference": "live FULL state dict {'model': ..., 'optim': ...}; checked: each rank reloads its "
                     "files with torch 1.13, rank 0 assembles the shards and gets it bit for bit",
        "exercises": "torch 1.13 ShardedTensor pickles; flat-param FQN order; a plain tensor among shards",
    },
}
# The same job under Debian 12's python3-torch (torch 1.13.1 on Python 3.11.2,
# whose Enum pickles a member by name: getattr(MEM_FORMAT_ENCODING,
# 'TORCH_CONTIGUOUS_FORMAT') where 3.10 calls MEM_FORMAT_ENCODING(0)).
CASES["torch113_py311_fsdp1_st_ws2"] = {
    **CASES["torch113_fsdp1_st_ws2"], "python": "3.11",
    "torch": "1.13.0a0",  # what Debian's 1.13.1+dfsg-4 build reports as torch.__version__
    "writer": CASES["torch113_fsdp1_st_ws2"]["writer"] + "; Debian 12's python3-torch 1.13.1 on Python 3.11",
    "exercises": "torch 1.13 ShardedTensor pickles as Python 3.11 writes them: enum members by name "
                 "(builtins.getattr(MEM_FORMAT_ENCODING, 'TORCH_CONTIGUOUS_FORMAT'))",
}
PYTHON = "%d.%d" % sys.version_info[:2]


def runs_here(spec: dict) -> bool:
    """A case is written by its torch under its Python (the default: any)."""
    return spec["torch"] == TORCH and spec.get("python", PYTHON) == PYTHON


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def run_case(name: str, out: Path) -> None:
    spec = CASES[name]
    case_dir = out / name
    reset_dir(case_dir)
    spawn(WS, case_dir, spec["job"], "ckpt")
    files = sorted(p for p in case_dir.rglob("*") if p.is_file())
    info = {
        "case": name,
        "family": spec["family"],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "world_size": WS,
        "backend": "gloo (CPU)",
        "optimizer": spec["optimizer"],
        "steps": STEPS,
        "seed": 0,
        "model": "Net of tools/make_checkpoints.py: emb.weight 10x4, fc1 Linear(4,8), fc2 Linear(8,7), "
                 "scale 2, frozen 4x4 (requires_grad=False, not in the optimizer)",
        "writer": spec["writer"],
        "reference": spec["reference"],
        "exercises": spec["exercises"],
        "checkpoint": "ckpt",
        "files": {str(p.relative_to(case_dir)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
                  for p in files},
    }
    (case_dir / "case.json").write_text(json.dumps(info, indent=1) + "\n")
    total = sum(p.stat().st_size for p in case_dir.rglob("*") if p.is_file())
    print(f"{name}: {len(files) + 1} files, {total} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "testdata" / "legacy")
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for n, s in CASES.items():
            print(f"{n}\ttorch {s['torch']}")
        return
    names = a.case or [n for n, s in CASES.items() if runs_here(s)]
    if not names:
        sys.exit(f"no case is written with torch {torch.__version__}; see --list")
    for n in names:
        if not runs_here(CASES[n]):
            sys.exit(f"{n} needs torch {CASES[n]['torch']} on Python {CASES[n].get('python', 'any')}, this is "
                     f"{torch.__version__} on {PYTHON} (scripts/setup-legacy-torch makes the side environments)")
    a.out.mkdir(parents=True, exist_ok=True)
    for n in names:
        run_case(n, a.out.resolve())


if __name__ == "__main__":
    main()
