#!/usr/bin/env python3
"""Write real Hugging Face Accelerate and Lightning FSDP checkpoints for ckptconv.

The on-disk trees under testdata/frameworks/ are written by the frameworks'
own save code, on this CPU-only machine, with world size 2 (ranks started
with torch.multiprocessing; each framework initialises its own gloo process
group from RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT). Nothing in a
checkpoint tree is written by hand.

    scripts/setup-frameworks          # side venv .venv-frameworks (pinned versions)
    .venv-frameworks/bin/python tools/make_framework_checkpoints.py \\
        [--out testdata/frameworks] [--only CASE ...]

Versions (tools/requirements-frameworks.txt): accelerate 1.15.0,
lightning 2.6.6 (lightning.pytorch + lightning.fabric), torch 2.15 of the
project venv (reached through a .pth file), Python 3.11.

Cases (each ``<out>/<case>/``):

- ``accelerate_fsdp1_ws2``: ``Accelerator(cpu=True, fsdp_plugin=
  FullyShardedDataParallelPlugin(fsdp_version=1, state_dict_type=
  "SHARDED_STATE_DICT", auto_wrap_policy=ModuleWrapPolicy({Linear}),
  use_orig_params=True), project_config=ProjectConfiguration(
  automatic_checkpoint_naming=True))``, two ``accelerator.save_state()`` calls
  (after step 2 and step 3) -> ``project/checkpoints/checkpoint_{0,1}/``
  holding ``pytorch_model_fsdp_0/`` (DCP: ``dcp.save({"model":
  model.state_dict()}, storage_writer=FileSystemWriter(dir),
  planner=DefaultSavePlanner())`` under SHARDED_STATE_DICT), ``optimizer_0/``
  (DCP: ``dcp.save({"optimizer": FSDP.optim_state_dict(model, opt)}, ...)``)
  and ``random_states_{0,1}.pkl`` (``torch.save`` per rank).
  Accelerate 1.15 does not do FSDP on CPU: ``AcceleratorState`` turns
  ``distributed_type`` into FSDP only for GPU-like MULTI_* types, so on CPU it
  stays MULTI_CPU and the plugin is silently ignored; and its CPU device is
  ``cpu:0``, which FSDP1 rejects as ``device_id`` ("Inconsistent compute
  device and `device_id` on rank 1: cpu vs cpu:0"). Patches (case.json
  ``patches``), applied right after ``Accelerator(...)``:
  ``accelerator.state.distributed_type`` and
  ``PartialState._shared_state["distributed_type"]`` = FSDP (AcceleratorState
  re-copies PartialState's state when instantiated again, which prepare()
  does), ``accelerator.state.fsdp_plugin = plugin``, and the device set to
  ``torch.device("cpu")``. Everything else (FSDP wrapping in ``prepare``,
  ``save_state``, ``save_fsdp_model``, ``save_fsdp_optimizer``,
  ``save_accelerator_state``) is Accelerate's unmodified code.
  ``sampler.bin`` is NOT written: in 1.15 ``save_accelerator_state`` writes it
  only when ``dataloader.dataset`` is an ``IterableDatasetShard`` whose sampler
  is a ``SeedableRandomSampler``, which a map-style dataset never is.
  Size budget: ``random_states_*.pkl`` are ~14.5 KB each; only
  ``checkpoint_1/random_states_0.pkl`` is kept (case.json ``dropped``).
- ``lightning_fsdp1_ws2``: ``Trainer(accelerator="cpu", devices=2,
  strategy=CPUFSDPStrategy(state_dict_type="sharded"), max_steps=2)`` with
  ``ModelCheckpoint(dirpath=case/checkpoints, every_n_train_steps=2,
  save_top_k=-1)`` -> ``checkpoints/epoch=0-step=2.ckpt/``: a DCP directory
  (``dcp.save({"model": module.state_dict(), "optimizer_0":
  FSDP.optim_state_dict(model, opt)}, checkpoint_id=path)`` under
  SHARDED_STATE_DICT with offload_to_cpu) plus Lightning's ``meta.pt``
  (``torch.save`` of the rest of the checkpoint dict, rank 0; it holds
  absolute paths of this machine in the ModelCheckpoint callback state).
  On CPU: ``CPUFSDPStrategy`` is ``class CPUFSDPStrategy(FSDPStrategy): pass``
  because the accelerator connector raises "requires a GPU accelerator" only
  when ``type(strategy) is FSDPStrategy``; and the model is wrapped manually
  in ``configure_model`` (Lightning's documented manual wrapping:
  ``FSDP(self.net, device_id=torch.device("cpu"), auto_wrap_policy=
  ModuleWrapPolicy({Linear}), use_orig_params=True)``) because Lightning's own
  wrapping passes ``device_id=root_device.index`` = None on CPU and torch
  raises "FSDP needs a non-CPU accelerator device". Saving is Lightning's
  unmodified ``FSDPStrategy.save_checkpoint``.
- ``fabric_fsdp1_ws2`` (only with ``--only``; not committed, size budget):
  ``Fabric(accelerator="cpu", devices=2, strategy=CPUFSDPStrategy(
  state_dict_type="sharded"))``, ``fabric.setup_module(FSDP(TinyNet(),
  device_id=cpu, ...))``, ``fabric.save(path, {"model": model, "optimizer":
  opt, "step": 3, "note": "..."})`` -> ``ckpt/step-3/`` DCP (top keys
  ``model``, ``optimizer``) + ``meta.pt`` = ``{"step": 3, "note": ...}``.

The model is a tiny ``TinyNet`` (fp32): ``fc`` Linear(2,3) -> 3 rows split
2+1; ``scale`` (1,) -> one element, rank 1 holds no chunk; ``frozen`` 2x2
``requires_grad=False`` (in the model state, no optimizer state). AdamW
(lr 1e-2, weight_decay 0.01, betas (0.9, 0.99), foreach=False), one param
group. It is this small (not tools/make_checkpoints.py's Net) because every
DCP item is a whole torch.save zip (1.2-1.6 KB each, even for a float; an
AdamW param group alone is 12 items), and the fixtures must stay small.

References, per checkpoint, in ``<case>/references/<checkpoint name>/``:

- ``model_full.pt``: ``get_model_state_dict(model, options=
  StateDictOptions(full_state_dict=True, cpu_offload=True))`` from the live
  job, at the moment of the save.
- ``optim_full.pt``: ``get_optimizer_state_dict(model, opt, options=
  StateDictOptions(full_state_dict=True, cpu_offload=False))``.
  cpu_offload=False on purpose: FSDP1 on CPU with offload returns exp_avg ==
  exp_avg_sq (see testdata/README.md, "FSDP1 quirk"); the generator asserts
  the two differ.
- ``<dcp dir name>.dcp_to_torch_save.pt``: torch's
  ``format_utils.dcp_to_torch_save(dcp_dir, out)`` of each DCP directory.

Keys are FQNs with the framework's own prefixes: Lightning's are those of the
LightningModule (``model.net.fc.weight`` in the DCP; ``net.fc.weight`` in
``model_full.pt``).

Self-checks (assertions): the expected file names exist (and no others
appear unexpectedly, listed in case.json); each dcp_to_torch_save output
equals the live full state dicts bit for bit (model under the framework's top
key, optimizer state and param_groups under its optimizer key); exp_avg !=
exp_avg_sq; the two saves of a case differ.

CPU only; about 15 s in all on 2 cores. Each DCP ``.metadata`` holds a random
``save_id``, so a rerun changes those bytes (and the absolute paths in Lightning's
meta.pt follow --out).
"""

from __future__ import annotations

import argparse
import json
import os
import pickletools
import shutil
import socket
import sys
import traceback
import warnings
from pathlib import Path

import torch
import torch.multiprocessing as mp
import torch.nn as nn

SEED = 0
WS = 2
CASES = ("accelerate_fsdp1_ws2", "lightning_fsdp1_ws2")  # the committed ones
ALL_CASES = CASES + ("fabric_fsdp1_ws2",)  # fabric: --only, not committed (size budget)
TRAINABLE = ("fc.weight", "fc.bias", "scale")


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 3)
        self.scale = nn.Parameter(torch.tensor([0.5]))
        self.frozen = nn.Parameter(torch.eye(2) + 0.1 * torch.randn(2, 2), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.frozen
        y = self.fc(torch.tanh(h))
        return y.pow(2).mean() + (y[..., :1] * self.scale).mean()


def fresh_model() -> TinyNet:
    torch.manual_seed(SEED)
    return TinyNet()


def make_adamw(named_params) -> torch.optim.AdamW:
    """One group, params picked by name suffix (works through FSDP/Lightning prefixes)."""
    def pick(names):
        out = []
        for want in names:
            hits = [p for n, p in named_params if n.replace("_fsdp_wrapped_module.", "").endswith(want)]
            assert len(hits) == 1, (want, [n for n, _ in named_params])
            out.append(hits[0])
        return out
    return torch.optim.AdamW(pick(TRAINABLE), lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), foreach=False)


def cpu_fsdp1(module: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FSDP(module, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                use_orig_params=True)


def batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 2, generator=g)


def dataset():
    g = torch.Generator().manual_seed(SEED)
    return torch.utils.data.TensorDataset(torch.randn(32, 2, generator=g))


def save_live_references(case_dir, refs) -> None:
    """references/<checkpoint>/{model,optim}_full.pt: the live full state dicts."""
    for name, (msd, osd) in refs.items():
        d = case_dir / "references" / name
        d.mkdir(parents=True, exist_ok=True)
        torch.save(msd, d / "model_full.pt")
        torch.save(osd, d / "optim_full.pt")


def full_refs(model, optim):
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
    msd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    osd = get_optimizer_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    msd = {k: v.detach().clone() for k, v in msd.items()}
    osd = _clone(osd)
    for fqn, st in osd["state"].items():
        if "exp_avg" in st:
            assert not torch.equal(st["exp_avg"], st["exp_avg_sq"]), f"exp_avg == exp_avg_sq for {fqn}"
    return msd, osd


def _clone(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clone(v) for v in x]
    return x


def _quiet() -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# Accelerate
# --------------------------------------------------------------------------


def accelerate_job(rank: int, case_dir: Path, info: dict) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, ProjectConfiguration
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=1,
        state_dict_type="SHARDED_STATE_DICT",
        auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        use_orig_params=True,
    )
    acc = Accelerator(
        cpu=True, fsdp_plugin=plugin,
        project_config=ProjectConfiguration(project_dir=str(case_dir / "project"),
                                            automatic_checkpoint_naming=True))
    info["distributed_type_before_patch"] = str(acc.state.distributed_type)
    if acc.state.distributed_type != DistributedType.FSDP:
        from accelerate.state import PartialState
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = plugin
        # AcceleratorState copies PartialState's shared state whenever it is instantiated again
        # (prepare() does), so the PartialState copy must say FSDP too.
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        info["patches"] = [
            "accelerator.state.distributed_type = PartialState._shared_state['distributed_type'] = "
            "DistributedType.FSDP (AcceleratorState leaves MULTI_CPU on CPU and ignores fsdp_plugin)",
            "accelerator.state.fsdp_plugin = plugin",
        ]
    info["device_before_patch"] = str(acc.device)
    if acc.device != torch.device("cpu"):
        # MULTI_CPU sets PartialState.device = torch.device("cpu", local_rank % 1) = cpu:0, which
        # prepare_model passes as FSDP(device_id=...); FSDP1 then raises "Inconsistent compute
        # device and `device_id` on rank 1: cpu vs cpu:0" (its CPU compute device has no index).
        from accelerate.state import PartialState
        PartialState().device = torch.device("cpu")
        acc.state.device = torch.device("cpu")
        info.setdefault("patches", []).append(
            "PartialState().device = accelerator.state.device = torch.device('cpu') "
            "(was cpu:0; FSDP1 rejects device_id cpu:0 vs compute device cpu)")
    assert acc.device == torch.device("cpu"), acc.device
    assert acc.num_processes == WS and acc.process_index == rank
    model = acc.prepare(fresh_model())
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    assert isinstance(model, FSDP), type(model)
    optim = make_adamw(list(model.named_parameters()))
    loader = torch.utils.data.DataLoader(dataset(), batch_size=4, shuffle=True)
    optim, loader = acc.prepare(optim, loader)
    refs = {}
    it = iter(loader)
    for step in range(3):
        (x,) = next(it)
        optim.zero_grad(set_to_none=True)
        acc.backward(model(x))
        optim.step()
        if step >= 1:  # save after step 2 and step 3
            assert acc.distributed_type == DistributedType.FSDP, acc.distributed_type
            acc.save_state()
            refs[f"checkpoint_{step - 1}"] = full_refs(model, optim)
    acc.wait_for_everyone()
    if rank == 0:
        save_live_references(case_dir, refs)
        info["calls"] = [
            "Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1, "
            "state_dict_type='SHARDED_STATE_DICT', auto_wrap_policy=ModuleWrapPolicy({Linear}), "
            "use_orig_params=True), project_config=ProjectConfiguration(project_dir=case/project, "
            "automatic_checkpoint_naming=True))",
            "accelerator.prepare(model) -> FSDP(model, device_id=cpu, ...)",
            "accelerator.prepare(optimizer, dataloader)",
            "accelerator.save_state() after optimizer step 2 -> checkpoint_0, after step 3 -> checkpoint_1",
        ]
        info["fsdp_kwargs"] = {k: repr(v) for k, v in {
            "sharding_strategy": model.sharding_strategy,
            "use_orig_params": model._use_orig_params,
            "compute_device": model.compute_device}.items()}
    acc.end_training()


# --------------------------------------------------------------------------
# Lightning (Trainer) and Fabric
# --------------------------------------------------------------------------


def lightning_job(rank: int, case_dir: Path, info: dict) -> None:
    import lightning.pytorch as pl
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import FSDPStrategy

    refs = {}

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = fresh_model()

        def configure_model(self):
            # Lightning's documented manual wrapping: FSDPStrategy._setup_model sees FSDP
            # submodules and does not wrap again. Needed on CPU because its own wrapping passes
            # device_id=root_device.index (None on CPU), and torch FSDP1 then raises "FSDP needs a
            # non-CPU accelerator device"; device_id=torch.device("cpu") works.
            if not isinstance(self.net, FSDP):
                self.net = cpu_fsdp1(self.net)

        def training_step(self, b, i):
            (x,) = b
            return self.net(x)

        def configure_optimizers(self):
            return make_adamw(list(self.named_parameters()))

        def on_save_checkpoint(self, checkpoint):
            # every rank runs this inside Trainer.save_checkpoint, before the write
            refs[f"epoch={self.current_epoch}-step={self.global_step}.ckpt"] = full_refs(
                self.trainer.strategy.model, self.trainer.optimizers[0])

    class CPUFSDPStrategy(FSDPStrategy):
        """No-op subclass: the connector refuses FSDP on CPU only when ``type(strategy) is FSDPStrategy``."""

    ckdir = case_dir / "checkpoints"
    trainer = pl.Trainer(
        accelerator="cpu", devices=WS, num_nodes=1,
        strategy=CPUFSDPStrategy(state_dict_type="sharded"),
        max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=str(ckdir), every_n_train_steps=2, save_top_k=-1)],
        default_root_dir=str(case_dir), deterministic=True)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=4, shuffle=False)
    module = Module()
    trainer.fit(module, loader)
    if rank == 0:
        save_live_references(case_dir, refs)
        m = module.net  # the FSDP root (manual wrapping); trainer.strategy.model is the LightningModule
        info["calls"] = [
            "Trainer(accelerator='cpu', devices=2, strategy=FSDPStrategy(state_dict_type='sharded', "
            "auto_wrap_policy={Linear}, use_orig_params=True), max_steps=4, "
            "callbacks=[ModelCheckpoint(dirpath=case/checkpoints, every_n_train_steps=2, save_top_k=-1)])",
            "LightningModule: self.net = TinyNet(); configure_model(): self.net = FSDP(self.net, device_id=cpu, "
            "auto_wrap_policy=ModuleWrapPolicy({Linear}), use_orig_params=True)",
            "trainer.fit(module, DataLoader(batch_size=4)) -> ModelCheckpoint saves after step 2",
        ]
        info["fsdp_kwargs"] = {k: repr(v) for k, v in {
            "sharding_strategy": m.sharding_strategy, "use_orig_params": m._use_orig_params,
            "compute_device": m.compute_device}.items()}
        info["patches"] = [
            "strategy is `class CPUFSDPStrategy(FSDPStrategy): pass` (no override): the connector raises "
            "'requires a GPU accelerator' only when type(strategy) is FSDPStrategy with accelerator != cuda"]


def fabric_job(rank: int, case_dir: Path, info: dict) -> None:
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import FSDPStrategy

    class CPUFSDPStrategy(FSDPStrategy):
        """No-op subclass: the connector refuses FSDP on CPU only when ``type(strategy) is FSDPStrategy``."""

    fabric = Fabric(accelerator="cpu", devices=WS, num_nodes=1,
                    strategy=CPUFSDPStrategy(state_dict_type="sharded"))
    fabric.launch()
    # manual wrapping (see lightning_job): Fabric's own wrapping passes device_id=None on CPU
    model = fabric.setup_module(cpu_fsdp1(fresh_model()))
    optim = fabric.setup_optimizers(make_adamw(list(model.named_parameters())))
    for step in range(3):
        optim.zero_grad(set_to_none=True)
        fabric.backward(model(batch(step, rank)))
        optim.step()
    path = case_dir / "ckpt" / "step-3"
    fabric.save(path, {"model": model, "optimizer": optim, "step": 3, "note": "fabric sharded save"})
    msd, osd = full_refs(model._forward_module, optim.optimizer)
    fabric.barrier()
    if rank == 0:
        d = case_dir / "references" / "step-3"
        d.mkdir(parents=True, exist_ok=True)
        torch.save(msd, d / "model_full.pt")
        torch.save(osd, d / "optim_full.pt")
        info["calls"] = [
            "Fabric(accelerator='cpu', devices=2, strategy=FSDPStrategy(state_dict_type='sharded', "
            "auto_wrap_policy={Linear}, use_orig_params=True)); fabric.launch()",
            "fabric.setup_module(TinyNet()); fabric.setup_optimizers(AdamW(...)); 3 steps",
            "fabric.save(case/ckpt/step-3, {'model': model, 'optimizer': optimizer, 'step': 3, "
            "'note': 'fabric sharded save'})",
        ]
        info["patches"] = [
            "strategy is `class CPUFSDPStrategy(FSDPStrategy): pass` (no override): the connector raises "
            "'requires a GPU accelerator' only when type(strategy) is FSDPStrategy with accelerator != cuda"]


JOBS = {"accelerate_fsdp1_ws2": accelerate_job, "lightning_fsdp1_ws2": lightning_job,
        "fabric_fsdp1_ws2": fabric_job}


def _entry(rank: int, port: int, case: str, case_dir: str, info_path: str) -> None:
    _quiet()
    import logging
    logging.disable(logging.WARNING)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank),
                      NODE_RANK="0", WORLD_SIZE=str(WS), OMP_NUM_THREADS="1")
    if case.startswith("accelerate"):
        os.environ.update(RANK=str(rank), LOCAL_WORLD_SIZE=str(WS))
    torch.set_num_threads(1)
    info: dict = {}
    JOBS[case](rank, Path(case_dir), info)
    if rank == 0:
        Path(info_path).write_text(json.dumps(info))


# --------------------------------------------------------------------------
# Checks and case.json (main process)
# --------------------------------------------------------------------------


def assert_same(a, b, where="") -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), (where, type(a), type(b))
        assert a.dtype == b.dtype and a.shape == b.shape, (where, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(map(str, a)), sorted(map(str, b)))
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), (where, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def pickle_globals(data: bytes) -> list[str]:
    out, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "SHORT_BINSTRING", "BINSTRING"):
            strings.append(arg)
        elif op.name == "GLOBAL":
            out.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            out.add(f"{strings[-2]}.{strings[-1]}")
    return sorted(out)


def torch_save_globals(path: Path) -> list[str]:
    import zipfile
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return pickle_globals(z.read(name))


def dcp_summary(d: Path) -> dict:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = FileSystemReader(str(d)).read_metadata()
    keys = {}
    for k, v in sorted(md.state_dict_metadata.items()):
        if isinstance(v, TensorStorageMetadata):
            keys[k] = (f"{str(v.properties.dtype).replace('torch.', '')}{list(v.size)} chunks "
                       + " ".join(f"{list(c.offsets)}+{list(c.sizes)}" for c in v.chunks))
        else:
            keys[k] = "bytes"
    top = sorted({k.split(".", 1)[0] for k in keys})
    return {"top_level": top, "keys": keys}


def check_dcp(dcp_dir: Path, ref_dir: Path, model_key: str, optim_key: str | None) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = ref_dir / f"{dcp_dir.name}.dcp_to_torch_save.pt"
    dcp_to_torch_save(str(dcp_dir), str(out))
    got = torch.load(out, weights_only=False)
    msd = torch.load(ref_dir / "model_full.pt", weights_only=True)
    osd = torch.load(ref_dir / "optim_full.pt", weights_only=True)
    checked = []
    if model_key in got:
        assert_same(got[model_key], msd, model_key)
        checked.append(f"{model_key} == model_full.pt")
    if optim_key is not None and optim_key in got:
        assert_same(got[optim_key]["state"], osd["state"], optim_key + ".state")
        assert_same(got[optim_key]["param_groups"], osd["param_groups"], optim_key + ".param_groups")
        checked.append(f"{optim_key} == optim_full.pt")
    assert checked, (dcp_dir, list(got))
    return {"dcp_to_torch_save": out.name, "top_level_keys": sorted(got), "checked": checked}


def file_list(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def finish_accelerate(case_dir: Path, info: dict) -> None:
    root = case_dir / "project" / "checkpoints"
    names = sorted(p.name for p in root.iterdir())
    assert names == ["checkpoint_0", "checkpoint_1"], names
    info["checkpoints"] = {}
    for n in names:
        c = root / n
        files = sorted(p.name for p in c.iterdir())
        assert files == ["optimizer_0", "pytorch_model_fsdp_0", "random_states_0.pkl", "random_states_1.pkl"], files
        ref = case_dir / "references" / n
        entry = {
            "pytorch_model_fsdp_0": {**dcp_summary(c / "pytorch_model_fsdp_0"),
                                     **check_dcp(c / "pytorch_model_fsdp_0", ref, "model", None)},
            "optimizer_0": {**dcp_summary(c / "optimizer_0"),
                            **check_dcp(c / "optimizer_0", ref, "model", "optimizer")},
            "random_states_globals": torch_save_globals(c / "random_states_0.pkl"),
            "random_states_keys": sorted(torch.load(c / "random_states_0.pkl", weights_only=False)),
        }
        info["checkpoints"][n] = entry
    # Size budget: random_states_{0,1}.pkl are ~14.5 KB each (python random + numpy MT + torch
    # CPU RNG state); keep one, checkpoint_1/random_states_0.pkl, to show the name and pickle.
    info["dropped"] = []
    for p in (root / "checkpoint_0/random_states_0.pkl", root / "checkpoint_0/random_states_1.pkl",
              root / "checkpoint_1/random_states_1.pkl"):
        info["dropped"].append(f"{p.relative_to(case_dir)} ({p.stat().st_size} bytes)")
        p.unlink()
    a = torch.load(case_dir / "references/checkpoint_0/model_full.pt", weights_only=True)
    b = torch.load(case_dir / "references/checkpoint_1/model_full.pt", weights_only=True)
    assert not torch.equal(a["fc.weight"], b["fc.weight"])


def finish_lightning(case_dir: Path, info: dict, sub: str, optim_key: str) -> None:
    root = case_dir / sub
    names = sorted(p.name for p in root.iterdir())
    info["checkpoints"] = {}
    for n in names:
        c = root / n
        files = sorted(p.name for p in c.iterdir())
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"], files
        ref = case_dir / "references" / n
        got = check_dcp(c, ref, "model", optim_key)
        meta = torch.load(c / "meta.pt", weights_only=False)
        info["checkpoints"][n] = {**dcp_summary(c), **got,
                                  "meta_pt_globals": torch_save_globals(c / "meta.pt"),
                                  "meta_pt_keys": sorted(meta),
                                  "meta_pt_weights_only_loads": _weights_only_ok(c / "meta.pt")}
    return names


def _weights_only_ok(p: Path) -> str:
    try:
        torch.load(p, weights_only=True)
        return "yes"
    except Exception as e:  # noqa: BLE001
        return f"no: {str(e).splitlines()[0][:200]}"


def run_case(case: str, out: Path) -> None:
    import tempfile
    case_dir = out / case
    if case_dir.exists():
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as td:
        info_path = Path(td) / "info.json"
        mp.spawn(_entry, args=(free_port(), case, str(case_dir), str(info_path)), nprocs=WS, join=True)
        info = json.loads(info_path.read_text())
    import accelerate
    import lightning
    info = {"case": case, "world_size": WS, "backend": "gloo", "device": "cpu",
            "versions": {"torch": torch.__version__, "accelerate": accelerate.__version__,
                         "lightning": lightning.__version__, "python": sys.version.split()[0]},
            "model": "TinyNet: fc.weight 3x2, fc.bias 3, scale 1, frozen 2x2 (no grad)",
            "optimizer": "AdamW([fc.weight, fc.bias, scale], lr=1e-2, weight_decay=0.01, betas=(0.9, 0.99), "
                         "foreach=False)",
            **info}
    if case.startswith("accelerate"):
        finish_accelerate(case_dir, info)
    elif case.startswith("lightning"):
        names = finish_lightning(case_dir, info, "checkpoints", "optimizer_0")
        assert names == ["epoch=0-step=2.ckpt"], names
    else:
        names = finish_lightning(case_dir, info, "ckpt", "optimizer")
        assert names == ["step-3"], names
    info["files"] = file_list(case_dir)
    info["total_bytes"] = sum(info["files"].values())
    (case_dir / "case.json").write_text(json.dumps(info, indent=1, sort_keys=False) + "\n")
    print(f"{case}: {len(info['files'])} files, {info['total_bytes']} bytes")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="testdata/frameworks")
    ap.add_argument("--only", nargs="*", choices=ALL_CASES)
    args = ap.parse_args()
    _quiet()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for case in args.only or CASES:
        try:
            run_case(case, out)
        except Exception:
            traceback.print_exc()
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
