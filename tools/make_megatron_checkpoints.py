#!/usr/bin/env python3
"""Write real Megatron-core ``torch_dist`` checkpoints for ckptconv's tests.

    .venv-megatron/bin/python tools/make_megatron_checkpoints.py --out testdata/megatron [CASE ...]

(``scripts/setup-megatron`` makes .venv-megatron: megatron-core 0.16.1 over
the project venv's torch.) Each case is a real megatron-core job on this
machine's CPUs: TP x PP x DP gloo processes build a ``GPTModel`` from
``get_gpt_layer_local_spec()`` (SwiGLU MLP, biases, 2 layers, hidden 8,
2 heads, ffn 12, vocab 16), wrap it in megatron's ``DistributedDataParallel``
and ``DistributedOptimizer`` (Adam), give every parameter a gradient, take one
real optimizer step and save, the way Megatron-LM's training loop does. One
case (``moe_ep2``) is a mixture of experts: 4 SequentialMLP experts per
layer, expert parallelism 2, whose optimizer is a ChainedOptimizer.

    dist_checkpointing.save({"model": model.sharded_state_dict(),
                             "optimizer": optimizer.sharded_state_dict(
                                 model_sd, metadata={"distrib_optim_sharding_type": TYPE}),
                             "iteration": 1}, CASE/ckpt)

``CASE/ckpt`` is then exactly what megatron-core wrote (``.metadata``,
``__<rank>_<n>.distcp``, ``common.pt``, ``metadata.json``). From the same
files, one more process builds the model at TP=1 x PP=1 and reads them back
with megatron-core's own ``dist_checkpointing.load`` (model, and optimizer
where the layout allows it), which gives the references:

    model_ref.pt   {name: tensor or object}: the TP=1/PP=1 model's state after
                   loading, keyed by the stored key with the global layer
                   index put after ``layers.`` (what ckptconv's --only model
                   gives; mcore's fused layer-norm names kept as stored)
    optim_ref.pt   (fully_reshardable) {name: {"exp_avg", "exp_avg_sq",
                   "param"}}: the TP=1 DistributedOptimizer's parameter-shaped
                   state after loading, as its own fully_reshardable save
                   path gives it, keyed like model_ref.pt
    case.json      versions, parallelism, sharding type, what was saved

megatron-core's DistributedOptimizer is written for CUDA: it asks
``Tensor.type()`` for ``torch.cuda.FloatTensor``, allocates with
``device='cuda'`` and creates CUDA streams. Those calls are pointed at the CPU
here (``_run_on_cpu``); the optimizer's own arithmetic, sharding and
checkpoint code run unchanged. ``.metadata`` holds a random save id, so
regenerated files differ in that field only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Cases: name -> (tp, pp, dp, optimizer sharding type or None, extra model config).
CASES = {
    "gpt_tp1pp1": (1, 1, 1, "fully_reshardable", {}),
    "gpt_tp2pp1": (2, 1, 1, "fully_reshardable", {}),
    "gpt_tp1pp2": (1, 2, 1, "fully_reshardable", {}),
    "gpt_tp2pp2": (2, 2, 1, "fully_reshardable", {}),
    "gpt_tp1pp1_dp2_dpresh": (1, 1, 2, "dp_reshardable", {}),
    # MoE: 4 SequentialMLP experts per layer (local spec, no grouped GEMM),
    # expert parallelism 2 over the two data-parallel ranks.
    "moe_ep2": (1, 1, 2, "fully_reshardable", {"num_moe_experts": 4, "moe_router_topk": 2,
                                               "moe_ffn_hidden_size": 12, "expert_model_parallel_size": 2}),
    # What Megatron-LM's training loop adds (megatron/training/checkpointing.py
    # generate_state_dict; Megatron-LM itself is not on PyPI): its args, the
    # checkpoint version, and every rank's RNG states as the sharded object
    # rng_state, numpy's among them.
    "gpt_tp2pp1_mlm": (2, 1, 1, "fully_reshardable", {}),
    # The same, with the args Megatron-LM's own parse_args made: those of
    # the legacy fixture testdata/megatron_legacy/gpt_tp2pp2 (written by
    # Megatron-LM's save_checkpoint), whose model this is (4 layers, 4 heads
    # in 2 query groups), saved at TP 2 x PP 2 as torch_dist with the
    # distributed optimizer: what reshard --layout megatron-legacy needs.
    "gpt_tp2pp2_mlm": (2, 2, 1, "fully_reshardable", {"num_layers": 4, "num_attention_heads": 4,
                                                      "num_query_groups": 2}),
}
MEGATRON_LM_STATE = {"gpt_tp2pp1_mlm", "gpt_tp2pp2_mlm"}
# The Megatron-LM job whose args a case takes (its rank 0 file's Namespace).
MEGATRON_LM_ARGS = {"gpt_tp2pp2_mlm": Path(__file__).resolve().parent.parent / "testdata" / "megatron_legacy" /
                    "gpt_tp2pp2" / "ckpt" / "iter_0000007" / "mp_rank_00_000" / "model_optim_rng.pt"}
NUM_LAYERS, HIDDEN, HEADS, FFN, VOCAB, SEQ = 2, 8, 2, 12, 16, 8


def _run_on_cpu() -> None:
    """Point the CUDA calls megatron-core makes at the CPU (see the docstring)."""
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.empty_cache = lambda: None

    def on_cpu(fn):
        @functools.wraps(fn)
        def wrapped(*a, **k):
            if str(k.get("device", "")).startswith("cuda"):
                k["device"] = "cpu"
            return fn(*a, **k)
        return wrapped

    for name in ("tensor", "zeros", "empty", "ones", "full", "arange", "zeros_like", "empty_like"):
        setattr(torch, name, on_cpu(getattr(torch, name)))
    torch.Tensor.cuda = lambda self, *a, **k: self
    plain_type = torch.Tensor.type

    def cuda_type(self, *a, **k):  # the DistributedOptimizer only accepts torch.cuda.*Tensor
        t = plain_type(self, *a, **k)
        return t.replace("torch.", "torch.cuda.", 1) if not a and not k and isinstance(t, str) else t

    torch.Tensor.type = cuda_type

    class NoStream:
        def __init__(self, *a, **k): pass
        def wait_stream(self, *a): pass
        def __enter__(self): return self
        def __exit__(self, *a): pass

    torch.cuda.Stream = NoStream
    torch.cuda.stream = lambda s: NoStream()
    torch.cuda.default_stream = lambda *a: NoStream()


def build_model(tp: int, pp: int, extra: dict, vocab: int = VOCAB, seq: int = SEQ, init: bool = True,
                spec_args: dict | None = None, model_args: dict | None = None):
    """The GPT at TP x PP (x EP from `extra`), `extra` overriding the
    TransformerConfig defaults (the bench's sizes, the MoE case's experts);
    `spec_args` go to the layer spec and `model_args` to GPTModel (the
    bench's Llama shape: RMSNorm, rotary positions)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    ep = extra.get("expert_model_parallel_size", 1)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep)
    spec = get_gpt_layer_local_spec(num_experts=extra.get("num_moe_experts"), moe_grouped_gemm=False,
                                    **(spec_args or {}))
    config = dict(num_layers=NUM_LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                  gated_linear_unit=True, activation_func=torch.nn.functional.silu, use_cpu_initialization=True,
                  perform_initialization=init, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                  params_dtype=torch.float32, pipeline_dtype=torch.float32)
    cfg = TransformerConfig(**{**config, **extra})
    torch.manual_seed(1234)
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=vocab, max_sequence_length=seq,
                     pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                     **(model_args or {}))
    return cfg, model


def build(tp: int, pp: int, extra: dict, vocab: int = VOCAB, seq: int = SEQ, spec_args: dict | None = None,
          model_args: dict | None = None):
    """build_model wrapped in megatron's DDP and DistributedOptimizer (Adam)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    cfg, model = build_model(tp, pp, extra, vocab, seq, spec_args=spec_args, model_args=model_args)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(use_distributed_optimizer=True), module=model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=True,
                                                 params_dtype=torch.float32), [ddp])
    return model, ddp, opt


def megatron_lm_state(tp: int, pp: int, args_from: Path | None = None) -> dict:
    """The entries Megatron-LM's generate_state_dict adds beside model and
    optimizer: args (an argparse.Namespace, in common.pt), checkpoint_version,
    and rng_state, a ShardedObject of shape (PP, TP) whose value is a list
    holding each rank's {random, numpy, torch, cuda, tracker} RNG states.
    `args_from`: a Megatron-LM legacy rank file whose args (and iteration,
    flops) are taken, set for this save: TP, PP, torch_dist, the
    distributed optimizer the job runs."""
    import argparse
    import random

    import numpy as np
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.transformer.enums import AttnBackend
    args = argparse.Namespace(num_layers=NUM_LAYERS, hidden_size=HIDDEN, tensor_model_parallel_size=tp,
                              pipeline_model_parallel_size=pp, params_dtype=torch.float32,
                              attention_backend=AttnBackend.auto, ckpt_format="torch_dist", iteration=1)
    extra = {}
    if args_from is not None:
        saved = torch.load(args_from, map_location="cpu", weights_only=False)
        args = saved["args"]
        args.tensor_model_parallel_size, args.pipeline_model_parallel_size = tp, pp
        args.transformer_pipeline_model_parallel_size = pp
        args.ckpt_format, args.use_distributed_optimizer = "torch_dist", True
        extra = {"iteration": saved["iteration"], "checkpoint_version": saved["checkpoint_version"],
                 "num_floating_point_operations_so_far": saved["num_floating_point_operations_so_far"]}
    rng = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
           "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": None, "rng_tracker_states": {}}
    rng_state = ShardedObject("rng_state", [rng], (pp, tp),
                              (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()),
                              replica_id=ps.get_data_parallel_rank(with_context_parallel=True))
    return {"args": args, "checkpoint_version": 3.0, "num_floating_point_operations_so_far": 0,
            "rng_state": rng_state, **extra}


def step_and_save(rank: int, model, ddp, opt, stype, out: str, extra_state: dict | None = None) -> None:
    """Gradients that differ per TP x PP position and per DP rank (DDP
    averages the DP ones), one real step (every state tensor holds its own
    values), then dist_checkpointing.save as Megatron-LM saves."""
    from megatron.core import dist_checkpointing
    g = torch.Generator().manual_seed(100 + rank)
    for p in ddp.parameters():
        p.main_grad.copy_(torch.randn(p.shape, generator=g))
    ddp.finish_grad_sync()
    ok, _, _ = opt.step()
    assert ok, "the optimizer step was skipped"
    msd = model.sharded_state_dict()
    state = {"model": msd, "iteration": 1}
    if stype:
        state["optimizer"] = opt.sharded_state_dict(msd, metadata={"distrib_optim_sharding_type": stype})
    state.update(extra_state or {})
    dist_checkpointing.save(state, out)


def _init(rank: int, ws: int, port: int) -> None:
    _run_on_cpu()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ws)


def save_job(rank: int, ws: int, port: int, tp: int, pp: int, stype, extra: dict, out: str, mlm: bool,
             args_from: Path | None = None) -> None:
    _init(rank, ws, port)
    from megatron.core import parallel_state as ps
    model, ddp, opt = build(tp, pp, extra)
    step_and_save(rank, model, ddp, opt, stype, out, megatron_lm_state(tp, pp, args_from) if mlm else None)
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def unstacked_name(stored_key: str, state_key: str) -> str:
    """The stored key with the layer index of the TP=1/PP=1 state dict key
    (``decoder.layers.3.…``) put after ``layers.``, and a SequentialMLP's
    stacked ``experts.experts.`` named as the module's own
    ``experts.local_experts.<e>.`` (at EP=1 the local index is the global one)."""
    parts = state_key.split(".")
    name = stored_key
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            head = ".".join(parts[:i + 1]) + "."
            assert stored_key.startswith(head), (stored_key, state_key)
            name = head + parts[i + 1] + "." + stored_key[len(head):]
            break
    if "local_experts" in parts:
        e = parts[parts.index("local_experts") + 1]
        name = name.replace("experts.experts.", f"experts.local_experts.{e}.", 1)
    return name


def reference_job(rank: int, ws: int, port: int, stype, extra: dict, ckpt: str, out: str) -> None:
    _init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    model, ddp, opt = build(1, 1, {**extra, "expert_model_parallel_size": 1} if extra else extra)
    msd = model.sharded_state_dict()
    request = {"model": msd}
    md = {"distrib_optim_sharding_type": stype} if stype else None
    # MoE: the EP=2 job's optimizer is a ChainedOptimizer of two (dense and
    # expert parameters: keys chained_<i>.optimizer.…), the TP=1/EP=1 one
    # a single optimizer, whose request megatron-core cannot match to those
    # keys (KeyError in _validate_global_shapes): model reference only.
    if stype == "fully_reshardable" and not extra.get("num_moe_experts"):
        # A fresh optimizer holds no state to load into: megatron-core's own
        # helper allocates it (a zero-gradient step), as its fsdp_dtensor
        # load path does.
        for inner in opt.chained_optimizers:
            inner._init_optimizer_states_with_dummy_values()
        request["optimizer"] = opt.sharded_state_dict(msd, is_loading=True, metadata=md)
    # What megatron-core's load fills the request with: the optimizer
    # entries are the TP=1 parameter-shaped tensors, read and resharded by
    # dist_checkpointing.load. (Loading them further into the optimizer,
    # DistributedOptimizer.load_state_dict, fails in 0.16.1 without Apex or
    # Transformer Engine: torch Adam's 'step' state is not in the file, a
    # KeyError in _set_main_param_and_optimizer_states.)
    loaded = dist_checkpointing.load(request, ckpt)
    model.load_state_dict(loaded["model"], strict=False)
    live = model.state_dict()
    ref = {}
    for state_key, sh in msd.items():
        name = unstacked_name(sh.key, state_key)
        ref[name] = sh.data if isinstance(sh, ShardedObject) else live[state_key].detach().clone()
    torch.save(ref, os.path.join(out, "model_ref.pt"))
    if "optimizer" in request:
        oref = {}
        prefix = "optimizer.state."
        for sh, value in _pairs(request["optimizer"], loaded["optimizer"]):
            assert sh.key.startswith(prefix), sh.key
            kind, model_key = sh.key[len(prefix):].split(".", 1)
            oref.setdefault(_unstack_by_offset(model_key, sh), {})[kind] = value.detach().clone()
        torch.save(oref, os.path.join(out, "optim_ref.pt"))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def _pairs(request, loaded):
    """(ShardedTensor, the tensor load put in its place), walking both trees."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    if isinstance(request, ShardedTensor):
        yield request, loaded
    elif isinstance(request, ShardedTensorFactory):
        # SwiGLU's linear_fc1 (gate and up halves): load merged the halves
        # into the parameter-shaped tensor; the halves its build() gives
        # carry the key and the layer offset.
        yield next(_pairs(request.build(), request.build()))[0], loaded
    elif isinstance(request, dict):
        for k, v in request.items():
            yield from _pairs(v, loaded[k])
    elif isinstance(request, (list, tuple)):
        for v, w in zip(request, loaded):
            yield from _pairs(v, w)


def _unstack_by_offset(model_key: str, sh) -> str:
    """unstacked_name by the ShardedTensor's prepended offsets (layer, expert)."""
    n = getattr(sh, "prepend_axis_num", 0)
    if n == 0:
        return model_key
    head = model_key[:model_key.index("layers.") + len("layers.")]
    name = head + str(sh.global_offset[0]) + "." + model_key[len(head):]
    if n == 2:
        name = name.replace("experts.experts.", f"experts.local_experts.{sh.global_offset[1]}.", 1)
    return name


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_case(name: str, out_root: Path) -> None:
    tp, pp, dp, stype, extra = CASES[name]
    case = out_root / name
    if case.exists():
        shutil.rmtree(case)
    ckpt = case / "ckpt"
    ckpt.mkdir(parents=True)
    ws = tp * pp * dp
    mp.spawn(save_job, args=(ws, free_port(), tp, pp, stype, extra, str(ckpt), name in MEGATRON_LM_STATE,
                             MEGATRON_LM_ARGS.get(name)), nprocs=ws, join=True)
    mp.spawn(reference_job, args=(1, free_port(), stype, extra, str(ckpt), str(case)), nprocs=1, join=True)
    import megatron.core
    info = {
        "megatron_core": megatron.core.__version__, "torch": torch.__version__,
        "python": sys.version.split()[0],
        "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "data_parallel_size": dp,
        "world_size": ws, "num_layers": extra.get("num_layers", NUM_LAYERS), "spec": "get_gpt_layer_local_spec (SwiGLU" + (", SequentialMLP experts)" if extra.get("num_moe_experts") else ")"),
        "distrib_optim_sharding_type": stype, "model_config": extra,
        "saved": ["model", "iteration"] + (["optimizer"] if stype else []) +
                 (["args", "checkpoint_version", "num_floating_point_operations_so_far", "rng_state"]
                  if name in MEGATRON_LM_STATE else []),
        "optim_ref": stype == "fully_reshardable" and not extra.get("num_moe_experts"),
    }
    (case / "case.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"{name}: {sum(f.stat().st_size for f in case.rglob('*') if f.is_file())} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/megatron")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    args = ap.parse_args()
    for name in args.cases:
        make_case(name, Path(args.out))


if __name__ == "__main__":
    main()
