#!/usr/bin/env python3
"""Write FSDP1 flat-parameter checkpoints for ckptconv's tests: the fastest
save an FSDP1 job has, and the one nothing else unflattens.

    python tools/make_fsdp1_checkpoints.py --out testdata/fsdp1 [CASE ...]
    /work/venvs/torch24/bin/python tools/make_fsdp1_checkpoints.py --out testdata/fsdp1

Each case is a real FSDP1 job (``FullyShardedDataParallel`` on CPU, gloo,
world_size processes on this machine) over a model with every shape the
unflattening has to get right:

    scale               3      root parameter, registered before the children
    emb.weight          11x6   nn.Embedding, tied to head.weight (one FlatParameter entry)
    blocks.{0,1}        Block  each its own FSDP unit, nested in the root unit
      .lin1             Inner  Linear 6->9, a unit nested in its Block
      .lin2             Linear 9->6 (with use_orig_params=True, blocks.1.lin2.bias is frozen
                               inside a trainable unit)
      .gain             6
      .running          buffer (3), never flattened
    proj                Frozen Linear 6->6, its own unit, every parameter frozen
    head.weight         tied to emb.weight

trained for 2 steps with an optimizer built from ``model.parameters()`` (the
``*_trainable_*`` cases: only the parameters that require grad, as jobs
with frozen parts do), and
saved per rank the fast way:

    model_rank{r}.pt   model.state_dict() under LOCAL_STATE_DICT: each unit's
                       ``<prefix>_flat_param`` as a 1-D ShardedTensor of the
                       unit's flat parameter (no world-size padding in its
                       global size when use_orig_params=False), buffers plain
    optim_rank{r}.pt   optim.state_dict(): integer ids, each tensor this
                       rank's 1-D slice of a flat parameter (use_orig_params=
                       False: one id per unit, padded slices) or of an
                       original parameter (True: one id per parameter)

and, from the same job, what ckptconv has to produce and what it needs:

    layout.pt          torch.save(model.state_dict()) of the unwrapped model
                       (the parameter names, shapes and order; tied weights
                       share storage), what ``--param-layout`` is given
    model_full.pt      FULL_STATE_DICT (rank 0)
    optim_full.pt      FSDP.optim_state_dict(model, optim) under FULL_STATE_DICT (rank 0)
    case.json          torch version, world size, use_orig_params, optimizer,
                       every unit's flat-parameter fqns and numels as FSDP
                       itself recorded them

    python tools/make_fsdp1_checkpoints.py bench --out DIR --bytes N [--world-size 4]
        One large flat-parameter checkpoint for scripts/bench (about N bytes of
        parameters + Adam exp_avg + exp_avg_sq, fp32, use_orig_params=False):
        a stack of square Linear layers, each its own FSDP unit, one real
        step; DIR/layout.pt is the unwrapped model's state dict.

    python tools/make_fsdp1_checkpoints.py consolidate --ckpt DIR --out FILE
        What a user does without ckptconv, for the bench: world-size
        processes build the model, load the files under LOCAL_STATE_DICT and
        optim.load_state_dict, gather FULL_STATE_DICT and
        FSDP.optim_state_dict and rank 0 torch.saves {"model", "optim"}.

CPU only; needs no GPU. Runs on torch 2.4 and later.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

# The corpus generator's gloo plumbing: world-size processes on this machine.
from make_checkpoints import spawn

STEPS = 2
VOCAB, EMB, HID = 11, 6, 9

# name: (world size, use_orig_params, optimizer, the optimizer's parameters:
# all of model.parameters(), only those that require grad, or those split
# by name into two param groups as most training scripts do: weights with
# weight decay, biases and norm-like vectors without, frozen ones in neither)
CASES = {
    "flat_adam_ws2": (2, False, "adam", "all"),
    "orig_adamw_ws3": (3, True, "adamw", "all"),
    "flat_sgd_ws4": (4, False, "sgd", "all"),
    "orig_adam_ws4": (4, True, "adam", "all"),
    "orig_adamw_trainable_ws2": (2, True, "adamw", "trainable"),
    "flat_adam_trainable_ws3": (3, False, "adam", "trainable"),
    "orig_adamw_wdgroups_ws2": (2, True, "adamw", "wd_groups"),
    "orig_adamw_wdgroups_ws3": (3, True, "adamw", "wd_groups"),
}
DEFAULT_CASES = [c for c in CASES if CASES[c][3] == "all"]


class Inner(nn.Linear):
    """Wrapped as its own unit inside each Block (nested wrapping)."""


class Frozen(nn.Linear):
    """A unit whose parameters are all frozen."""


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin1 = Inner(EMB, HID)
        self.lin2 = nn.Linear(HID, EMB)
        self.gain = nn.Parameter(torch.ones(EMB) + 0.1 * torch.randn(EMB))
        self.register_buffer("running", torch.arange(3, dtype=torch.float32))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.gain * self.lin2(torch.tanh(self.lin1(h)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.0, -0.5, 0.25]))
        self.emb = nn.Embedding(VOCAB, EMB)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.proj = Frozen(EMB, EMB)
        self.proj.requires_grad_(False)
        self.head = nn.Linear(EMB, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        for b in self.blocks:
            h = h + b(h)
        h = self.proj(h)
        logits = self.head(h)
        return (logits.logsumexp(-1) - logits[..., 0]).mean() + (h[..., :3] * self.scale).mean()


def fresh_model(use_orig_params: bool) -> Net:
    torch.manual_seed(0)
    model = Net()
    if use_orig_params:  # frozen and trainable parameters mixed in one unit
        model.blocks[1].lin2.bias.requires_grad_(False)
    return model


def no_decay(name: str) -> bool:
    """A bias or a vector of gains: what a training script leaves out of
    weight decay (a name rule, as HF's get_parameter_names-based split is)."""
    return name.endswith(".bias") or name.endswith("gain") or name == "scale"


def make_optim(model: nn.Module, kind: str, which: str = "all") -> torch.optim.Optimizer:
    if which == "wd_groups":
        named = [(n.replace("_fsdp_wrapped_module.", ""), p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if not no_decay(n)], "weight_decay": 0.05},
                  {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=1e-2, foreach=False)
    params = [p for p in model.parameters() if which == "all" or p.requires_grad]
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-2, betas=(0.9, 0.99), foreach=False)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.05, foreach=False)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)


def batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (4, 5), generator=g)


def wrap(model: nn.Module, use_orig_params: bool) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy
    policy = functools.partial(lambda_auto_wrap_policy,
                               lambda_fn=lambda m: isinstance(m, (Block, Inner, Frozen)))
    return FSDP(model, device_id=torch.device("cpu"), auto_wrap_policy=policy, use_orig_params=use_orig_params)


def units(model: nn.Module) -> list[dict]:
    """Every FSDP unit's flat parameter as FSDP recorded it (for case.json)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    out = []
    for name, m in model.named_modules():
        if not isinstance(m, FSDP) or m._handle is None:
            continue
        fp = m._handle.flat_param
        out.append({
            "module": name.replace("_fsdp_wrapped_module.", "").replace("._fsdp_wrapped_module", ""),
            "fqns": list(fp._fqns),
            "numels": [int(n) for n in fp._numels_with_padding],
            "is_padding": [bool(p) for p in fp._is_padding_mask],
            "unpadded_unsharded_numel": int(fp._unpadded_unsharded_size.numel()),
            "shard_numel": int(fp.numel()),
        })
    return out


def full_state(model: nn.Module, optim: torch.optim.Optimizer) -> tuple[dict, dict]:
    """FULL_STATE_DICT model.state_dict() and FSDP.optim_state_dict on every
    rank, offload_to_cpu=False, cloned inside the context (the values are
    views of the unsharded flat parameters): with offload_to_cpu=True torch
    2.4.1 FSDP1 on CPU fails in the FULL_STATE_DICT hook, and the optimizer
    returns views of one reused all-gather buffer, so exp_avg and exp_avg_sq
    of a parameter would come out equal."""
    from torch.distributed.fsdp import (FullOptimStateDictConfig, FullStateDictConfig,
                                        FullyShardedDataParallel as FSDP, StateDictType)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
                              FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False)):
        msd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        osd = FSDP.optim_state_dict(model, optim)
        osd["state"] = {k: {n: v.clone() if torch.is_tensor(v) else v for n, v in st.items()}
                        for k, st in osd["state"].items()}
    return msd, osd


def job(rank: int, ws: int, out: Path, case: str) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    _, orig, opt, which = CASES[case]
    d = out / case
    if rank == 0:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        torch.save(fresh_model(orig).state_dict(), d / "layout.pt")
    model = wrap(fresh_model(orig), orig)
    optim = make_optim(model, opt, which)
    for step in range(STEPS):
        optim.zero_grad(set_to_none=True)
        model(batch(step, rank)).backward()
        optim.step()
    dist.barrier()
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        torch.save(model.state_dict(), d / f"model_rank{rank}.pt")
    torch.save(optim.state_dict(), d / f"optim_rank{rank}.pt")
    full_model, full_optim = full_state(model, optim)
    if rank == 0:
        torch.save(full_model, d / "model_full.pt")
        torch.save(full_optim, d / "optim_full.pt")
        facts = {"torch": torch.__version__, "python": sys.version.split()[0], "world_size": ws,
                 "use_orig_params": orig, "optimizer": opt, "optimizer_params": which, "steps": STEPS,
                 "units": units(model)}
        (d / "case.json").write_text(json.dumps(facts, indent=1) + "\n")
    dist.barrier()


class BenchNet(nn.Module):
    """Square Linear layers, each wrapped as its own unit (bench)."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.pow(2).mean()


def bench_model(meta: dict) -> nn.Module:
    torch.manual_seed(0)
    return BenchNet(meta["layers"], meta["width"])


def bench_wrap(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FSDP(model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                use_orig_params=False)


def bench_job(rank: int, ws: int, out: Path, meta: dict) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    if rank == 0:
        torch.save(bench_model(meta).state_dict(), out / "layout.pt")
        (out / "bench.json").write_text(json.dumps(meta) + "\n")
    model = bench_wrap(bench_model(meta))
    optim = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(rank)
    model(torch.randn(2, meta["width"], generator=g)).backward()
    optim.step()
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        torch.save(model.state_dict(), out / f"model_rank{rank}.pt")
    torch.save(optim.state_dict(), out / f"optim_rank{rank}.pt")
    dist.barrier()


def torch_consolidate_job(rank: int, ws: int, ckpt: Path, out: Path) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
    meta = json.loads((ckpt / "bench.json").read_text())
    model = bench_wrap(bench_model(meta))
    optim = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        model.load_state_dict(torch.load(ckpt / f"model_rank{rank}.pt", weights_only=False))
    optim.load_state_dict(torch.load(ckpt / f"optim_rank{rank}.pt", weights_only=False))
    msd, osd = full_state(model, optim)
    if rank == 0:
        torch.save({"model": msd, "optim": osd}, out)
    dist.barrier()


def main() -> None:
    if sys.argv[1:2] == ["bench"]:
        ap = argparse.ArgumentParser(description="one large FSDP1 flat-parameter checkpoint")
        ap.add_argument("--out", type=Path, required=True)
        ap.add_argument("--bytes", type=float, required=True)
        ap.add_argument("--world-size", type=int, default=4)
        args = ap.parse_args(sys.argv[2:])
        width = 2048  # 16 MB of fp32 per layer; parameters, exp_avg and exp_avg_sq: 3x
        meta = {"layers": max(1, round(args.bytes / 3 / (4 * (width * width + width)))), "width": width,
                "world_size": args.world_size}
        args.out.mkdir(parents=True, exist_ok=True)
        spawn(args.world_size, bench_job, args.out, meta)
        return
    if sys.argv[1:2] == ["consolidate"]:
        ap = argparse.ArgumentParser(description="torch's own consolidation of a bench checkpoint")
        ap.add_argument("--ckpt", type=Path, required=True)
        ap.add_argument("--out", type=Path, required=True)
        args = ap.parse_args(sys.argv[2:])
        ws = json.loads((args.ckpt / "bench.json").read_text())["world_size"]
        spawn(ws, torch_consolidate_job, args.ckpt, args.out)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("cases", nargs="*", default=DEFAULT_CASES + [c for c in CASES if c not in DEFAULT_CASES])
    args = ap.parse_args()
    for case in args.cases:
        ws = CASES[case][0]
        spawn(ws, job, args.out, case)
        print(f"{args.out / case}: FSDP1 ws{ws}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
