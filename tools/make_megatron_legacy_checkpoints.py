#!/usr/bin/env python3
"""Write real Megatron-LM legacy (``ckpt_format=torch``) checkpoints for ckptconv's tests.

Megatron-LM's training code (``megatron/training``) is not on PyPI; put a tree
of it at the tag that matches the installed megatron-core on PYTHONPATH:

    mkdir -p /tmp/mlm
    git -C /work/.mirror/NVIDIA+Megatron-LM/repo archive core_v0.16.1 \\
        megatron/training megatron/legacy megatron/rl megatron/post_training | tar -x -C /tmp/mlm
    PYTHONPATH=/tmp/mlm .venv-megatron/bin/python tools/make_megatron_legacy_checkpoints.py \\
        --out testdata/megatron_legacy [CASE ...]

(any clone of NVIDIA/Megatron-LM checked out at ``core_v0.16.1`` does; the
``megatron/training`` package imports ``megatron/rl`` and
``megatron/post_training`` at import time.)

Each case is a real Megatron-LM job on this machine's CPUs: TP x PP x DP gloo
processes parse Megatron-LM's own command line (``megatron.training.arguments.
parse_args``, installed with ``global_vars.set_args``), build the model the way
``pretrain_gpt.py`` does (``core_transformer_config_from_args`` and a
``GPTModel`` from ``get_gpt_layer_local_spec``: SwiGLU, biases, grouped-query
attention with 2 query groups for 4 heads, untied output layer (tied in one case),
learned absolute positions, 4 layers, hidden 8, ffn 12,
vocab 16), wrap it in megatron's ``DistributedDataParallel`` with Adam
(plain, or megatron's DistributedOptimizer where the case says), take one
real step (gradients: ``set_gradients``)
and call Megatron-LM's ``megatron.training.checkpointing.save_checkpoint``
with ``ckpt_format='torch'``. ``CASE/ckpt`` is then exactly what it wrote:

    latest_checkpointed_iteration.txt            "7"
    iter_0000007/mp_rank_{tp:02d}_{pp:03d}/model_optim_rng.pt

Beside it, from the same job, the reference: every rank also saves its model
with megatron-core's ``dist_checkpointing.save`` (into a temporary folder),
and one more process builds the model at TP=1 x PP=1 and loads that with
``dist_checkpointing.load``; its ``state_dict_for_save_checkpoint()`` (what a
TP=1/PP=1 legacy save holds under ``model``, layers under their global
index) is

    model_ref.pt    {name: tensor or object}
    optim_ref.pt    {name: {"exp_avg", "exp_avg_sq"[, "param" | "fp32_param"]}[, "common_step": step]}
    case.json       versions, parallelism, model sizes, iteration

The optimizer reference is megatron-core's own TP=1 view of the optimizer:
each rank also saves ``optimizer.sharded_state_dict(...)`` (the
``fully_reshardable`` layout for the DistributedOptimizer, the plain
optimizer's own sharded state otherwise: parameter-shaped state tensors keyed
by the model's sharded keys, which carry the TP layout) beside the model, and
the TP=1/PP=1 process loads it with ``dist_checkpointing.load`` into a
fresh optimizer's request; each state is named by the model parameter whose
ShardedTensor has its key and layer offset (the module's own names, as in
model_ref.pt). This path, not Megatron-LM's ``load_checkpoint``, because a
legacy checkpoint loads only at the TP x PP that saved it. The
DistributedOptimizer's states include its fp32 master ``param``, the
mixed-precision optimizer's its ``fp32_param``; the plain fp32 optimizer has
none (the model weight is its master); the plain ones have one common step.

``save_checkpoint``'s ``rng_state`` holds Python's ``random`` state, which the
job does not seed, so a rerun writes different bytes there and only there
(the model, optimizer and ``distrib_optim.pt`` tensors are the same bit for
bit): ``optim_ref.pt`` was added to the committed cases by a rerun checked
that way, leaving their rank files as first written.

CUDA calls pointed at the CPU: those of tools/make_megatron_checkpoints.py
(``_run_on_cpu``: ``torch.cuda.synchronize``/``current_device``/
``empty_cache``, ``device='cuda'`` allocations, ``Tensor.cuda``,
``Tensor.type``, CUDA streams), plus ``torch.cuda.get_rng_state``, which
``save_checkpoint``'s ``get_rng_state`` calls: it returns the CPU generator's
state here. ``args.use_dist_ckpt`` (set by Megatron-LM's ``validate_args``
from ``--ckpt-format``) is set to False, and
``args.virtual_pipeline_model_parallel_size`` to the case's virtual stages,
as ``validate_args`` would, without running the rest of ``validate_args``
(it wants a GPU job's environment).

Cases: ``gpt_tp2pp2`` (TP=2 x PP=2, iteration 7), ``gpt_pp2_vpp2``
(PP=2 with 2 virtual stages per pipeline rank: ``model0``/``model1`` in each
file, one layer each; iteration 3), ``gpt_tp2_dp2_distopt`` (TP=2 x DP=2
with ``--use-distributed-optimizer``: ``distrib_optim.pt`` beside each rank
file, written by the DistributedOptimizer's ``save_parameter_state``;
iteration 5), ``gpt_tp2_bf16`` (TP=2 with ``--bf16``: the chunks wrapped
in ``Float16Module`` as ``get_model`` does, megatron's mixed-precision
optimizer saving ``fp32_from_fp16_params``, gradients accumulated in fp32;
iteration 9), ``gpt_pp2_dp2_buckets`` (PP=2 x DP=2, distributed
optimizer, ``--overlap-grad-reduce --ddp-bucket-size 500``: the first
stage's grad buffer in several buckets; iteration 11; model_ref.pt only, see
OPTIM_REF_BROKEN) and ``gpt_pp2_dp2_tied`` (PP=2 x DP=2, distributed
optimizer, Megatron-LM's default tied embeddings, vocabulary 17: the shared
embedding's own bucket; iteration 13; model_ref.pt only). The DDP config is
built as ``get_model`` builds it from args.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_megatron_checkpoints import _run_on_cpu, free_port  # noqa: E402

# Cases: name -> (tp, pp, virtual stages per pipeline rank or None, dp, distributed optimizer,
# iteration or "release"[, "bf16" | "buckets"]).
CASES = {
    "gpt_tp2pp2": (2, 2, None, 1, False, 7),
    "gpt_pp2_vpp2": (1, 2, 2, 1, False, 3),
    "gpt_tp2_dp2_distopt": (2, 1, None, 2, True, 5),
    "gpt_tp2_bf16": (2, 1, None, 1, False, 9, "bf16"),
    "gpt_pp2_dp2_buckets": (1, 2, None, 2, True, 11, "buckets"),
    "gpt_pp2_dp2_tied": (1, 2, None, 2, True, 13, "tied"),
}
# "buckets": --overlap-grad-reduce with buckets of this many elements, so the
# first stage's grad buffer is cut into several (the other stage's is not:
# DistributedDataParallel buckets only pipeline rank 0's first chunk).
BUCKET_SIZE = 500
REF_SHARDING = {"distrib_optim_sharding_type": "fully_reshardable"}
# No optim_ref.pt for the bucketed case: megatron-core 0.16.1's
# fully_reshardable save slices the gathered buffers (bucket-end padding
# dropped) by the padded buffer's indices, so past the first of several
# buckets it reads other parameters' state (its own warning "param range
# exceeds unpadded buffer ... can lead to data corruption", its issue #504),
# and its fully_sharded_model_space save refuses itself ("ShardedTensor.
# flattened_range is not supported"). The test checks that case's fp32
# masters against model_ref.pt instead.
OPTIM_REF_BROKEN = {"buckets", "tied"}  # tied at PP > 1: the shared embedding's own bucket
NUM_LAYERS, HIDDEN, HEADS, GROUPS, FFN, VOCAB, SEQ = 4, 8, 4, 2, 12, 16, 8


def vocab_size(tied: bool) -> int:
    """17 rows for the tied case: an embedding of 17 x 8 = 136 elements, not a
    multiple of 64, so the bucket the distributed optimizer gives the shared
    copy on the last stage moves the parameters after it off the 64-element
    grid (at 16 rows nothing would show the rule)."""
    return VOCAB + 1 if tied else VOCAB


def megatron_args(tp: int, pp: int, save: str, vpp: int | None = None, dp: int = 1, distopt: bool = False,
                  bf16: bool = False, buckets: bool = False, tied: bool = False):
    """Megatron-LM's own args for this model, parsed from its command line."""
    from megatron.training.arguments import parse_args
    argv = ["--num-layers", str(NUM_LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", str(HEADS),
            "--group-query-attention", "--num-query-groups", str(GROUPS), "--ffn-hidden-size", str(FFN),
            "--swiglu", "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--micro-batch-size", "1",
            "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--vocab-size", str(vocab_size(tied)), "--make-vocab-size-divisible-by", "1", "--use-cpu-initialization",
            "--optimizer", "adam", "--lr", "1e-2", "--ckpt-format", "torch", "--save", save,
            "--transformer-impl", "local",
            # The fused kernels need Transformer Engine or Apex (CUDA).
            "--no-rope-fusion", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
            "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm"]
    if not tied:
        argv += ["--untie-embeddings-and-output-weights"]
    if vpp:
        argv += ["--num-virtual-stages-per-pipeline-rank", str(vpp)]
    if distopt:
        argv += ["--use-distributed-optimizer"]
    if bf16:
        argv += ["--bf16"]
    if buckets:
        argv += ["--overlap-grad-reduce", "--ddp-bucket-size", str(BUCKET_SIZE)]
    saved = sys.argv
    sys.argv = ["pretrain_gpt.py"] + argv
    try:
        args = parse_args()
    finally:
        sys.argv = saved
    args.use_dist_ckpt = False  # validate_args: ckpt_format == 'torch'
    args.virtual_pipeline_model_parallel_size = vpp  # validate_args: from --num-virtual-stages-per-pipeline-rank
    args.world_size = tp * pp * dp
    args.data_parallel_size = dp
    args.padded_vocab_size = vocab_size(tied)
    args.params_dtype = torch.bfloat16 if bf16 else torch.float32
    if bf16:  # validate_args: bf16 accumulates and all-reduces gradients in fp32
        args.accumulate_allreduce_grads_in_fp32 = True
    return args


def build(args, tp: int, pp: int, vpp: int | None = None):
    """The GPT as pretrain_gpt.py builds it (local spec), one module per
    virtual pipeline stage as training.get_model makes them, each in
    megatron's DDP, with the plain optimizer over all of them."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.training.arguments import core_transformer_config_from_args
    from megatron.training.global_vars import set_args

    set_args(args)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 virtual_pipeline_model_parallel_size=vpp)
    config = core_transformer_config_from_args(args)
    torch.manual_seed(1234)
    models = []
    for v in range(vpp or 1):
        first = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v) if vpp else ps.is_pipeline_first_stage()
        last = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v) if vpp else ps.is_pipeline_last_stage()
        models.append(GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=args.padded_vocab_size,
                               max_sequence_length=SEQ, pre_process=first, post_process=last,
                               share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                               vp_stage=v if vpp else None))
    distopt = args.use_distributed_optimizer
    # get_model: a bf16 job's chunks are wrapped in Float16Module, which casts
    # every parameter (layer norms included) to bf16 and delegates the state
    # dicts to the model.
    from megatron.core.transformer.module import Float16Module
    wrapped = [Float16Module(config, m) for m in models] if args.bf16 else models
    # get_model's DDP config: the bucket size from args, its default when
    # none is given, none without overlap_grad_reduce; bucketing disabled for
    # chunks after the first.
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=distopt,
                                               grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32,
                                               overlap_grad_reduce=args.overlap_grad_reduce,
                                               bucket_size=args.ddp_bucket_size)
    if ddp_config.bucket_size is None:
        ddp_config.bucket_size = max(40000000, 1000000 * ps.get_data_parallel_world_size(with_context_parallel=True))
    if not ddp_config.overlap_grad_reduce:
        ddp_config.bucket_size = None
    ddps = [DistributedDataParallel(config, ddp_config, module=m,
                                    disable_bucketing=i > 0 or args.overlap_param_gather_with_optimizer_step)
            for i, m in enumerate(wrapped)]
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=distopt,
                                                 params_dtype=args.params_dtype, bf16=args.bf16), ddps)
    return models, ddps, opt


def set_gradients(model, salt: int = 0) -> None:
    """A gradient per parameter that differs per pipeline stage and, for
    tensor-parallel parameters (megatron marks them `tensor_model_parallel`),
    per TP rank; the parameters every TP rank holds whole (layer norms,
    row-parallel biases, position embeddings) get the same gradient on every
    TP rank, as a real backward pass gives them, so they stay equal."""
    import zlib
    from megatron.core import parallel_state as ps
    tp_rank, pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    for name, p in model.named_parameters():  # the same Parameters the DDP wrapper gives main_grad buffers
        split = getattr(p, "tensor_model_parallel", False)
        seed = zlib.crc32(name.encode()) + 1000 * pp_rank + 10000 * salt + (100 * (tp_rank + 1) if split else 0)
        p.main_grad.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))


def _init(rank: int, ws: int, port: int) -> None:
    _run_on_cpu()
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ws)


def save_job(rank: int, ws: int, port: int, tp: int, pp: int, vpp, dp: int, distopt: bool, iteration, out: str,
             dist_tmp: str, bf16: bool = False, buckets: bool = False, tied: bool = False) -> None:
    _init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.training.checkpointing import save_checkpoint
    args = megatron_args(tp, pp, out, vpp, dp, distopt, bf16, buckets, tied)
    models, ddps, opt = build(args, tp, pp, vpp)
    for v, model in enumerate(models):
        set_gradients(model, salt=v)
    for ddp in ddps:
        ddp.finish_grad_sync()
    ok, _, _ = opt.step()
    assert ok, "the optimizer step was skipped"
    release = iteration == "release"
    args.iteration = 0 if release else iteration
    save_checkpoint(args.iteration, ddps, opt, None, 0, release=release)
    # The same weights, and the optimizer's state per parameter, through
    # megatron-core's resharding save (keys are global, whichever stage holds
    # them; the optimizer's are its own model-space ones, built from the
    # live optimizer objects): the reference job reads them at TP=1/PP=1.
    msd = {f"chunk{v}": m.sharded_state_dict() for v, m in enumerate(models)}
    state = {"model": msd}
    if not (buckets or tied):  # see OPTIM_REF_BROKEN
        state["optimizer"] = opt.sharded_state_dict(msd, metadata=REF_SHARDING)
    dist_checkpointing.save(state, dist_tmp)
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def reference_job(rank: int, ws: int, port: int, dist_tmp: str, out: str, distopt: bool, bf16: bool = False,
                  with_optim: bool = True, tied: bool = False) -> None:
    _init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    args = megatron_args(1, 1, dist_tmp, distopt=distopt, bf16=bf16, tied=tied)
    (model,), _, opt = build(args, 1, 1)
    msd = model.sharded_state_dict()
    if distopt:
        # A fresh DistributedOptimizer holds no state to load into:
        # megatron-core's own helper allocates it (a zero-gradient step).
        for inner in opt.chained_optimizers:
            inner._init_optimizer_states_with_dummy_values()
    request = {"model": msd}
    if with_optim:
        request["optimizer"] = opt.sharded_state_dict(msd, is_loading=True, metadata=REF_SHARDING)
    loaded = dist_checkpointing.load(request, dist_tmp)
    model.load_state_dict(loaded["model"], strict=False)
    ref = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v)
           for k, v in model.state_dict_for_save_checkpoint().items()}
    torch.save(ref, os.path.join(out, "model_ref.pt"))
    if with_optim:
        torch.save(optim_reference(model, msd, request["optimizer"], loaded["optimizer"]),
                   os.path.join(out, "optim_ref.pt"))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def optim_reference(model, msd, request, loaded) -> dict:
    """{parameter name: {state: tensor}}: what megatron-core's
    dist_checkpointing.load gives the TP=1/PP=1 optimizer's request, each
    entry (key ``optimizer.state.<state>.<model key>``) named by the model
    parameter whose ShardedTensor has that key and layer offset (names as in
    model_ref.pt: the module's own, ``named_parameters``). The
    DistributedOptimizer's states are exp_avg, exp_avg_sq and its fp32 master
    ``param``; the plain fp32 optimizer's exp_avg and exp_avg_sq (its master
    is the model weight), and its common step under ``common_step``."""
    from make_megatron_checkpoints import _pairs
    names = {id(p): n for n, p in model.named_parameters()}
    by_key = {}
    for state_key, value in msd.items():
        sh = next(_pairs(value, value), (None,))[0]  # None: a ShardedObject (_extra_state)
        # The ShardedTensor holds the Parameter itself, except the output
        # layer's (a separate tensor object), which is under its own name.
        name = names.get(id(getattr(value, "data", None)))
        if name is None and state_key in names.values():
            name = state_key
        if sh is not None and name is not None:
            by_key[(sh.key, tuple(sh.global_offset[:sh.prepend_axis_num]))] = name
    ref = {}
    prefix = "optimizer.state."
    for sh, value in _pairs(request, loaded):
        assert sh.key.startswith(prefix), sh.key
        kind, model_key = sh.key[len(prefix):].split(".", 1)
        name = by_key[(model_key, tuple(sh.global_offset[:sh.prepend_axis_num]))]
        ref.setdefault(name, {})[kind] = value.detach().clone()
    ref = {n: ref[n] for n in names.values() if n in ref}  # the model's parameter order
    step = _find(loaded, "common_step")
    if step is not None:
        ref["common_step"] = step
    return ref


def _find(tree, key):
    """The value under `key` anywhere in a nested dict, or None."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            found = v if k == key else _find(v, key)
            if found is not None:
                return found
    return None


def make_case(name: str, out_root: Path) -> None:
    tp, pp, vpp, dp, distopt, iteration, *flags = CASES[name]
    bf16, buckets, tied = "bf16" in flags, "buckets" in flags, "tied" in flags
    case = out_root / name
    if case.exists():
        shutil.rmtree(case)
    ckpt = case / "ckpt"
    ckpt.mkdir(parents=True)
    ws = tp * pp * dp
    with tempfile.TemporaryDirectory() as dist_tmp:
        mp.spawn(save_job, args=(ws, free_port(), tp, pp, vpp, dp, distopt, iteration, str(ckpt), dist_tmp, bf16, buckets,
                                 tied),
                 nprocs=ws, join=True)
        mp.spawn(reference_job, args=(1, free_port(), dist_tmp, str(case), distopt, bf16,
                                      not OPTIM_REF_BROKEN & set(flags), tied), nprocs=1, join=True)
    import megatron.core
    info = {
        "megatron_core": megatron.core.__version__, "megatron_lm": "core_v0.16.1", "torch": torch.__version__,
        "python": sys.version.split()[0], "ckpt_format": "torch",
        "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "data_parallel_size": dp,
        "virtual_pipeline_model_parallel_size": vpp,
        "iteration": iteration, "num_layers": NUM_LAYERS, "hidden_size": HIDDEN, "num_attention_heads": HEADS,
        "num_query_groups": GROUPS, "ffn_hidden_size": FFN, "vocab_size": vocab_size(tied),
        "spec": "get_gpt_layer_local_spec (SwiGLU, GQA)", "optimizer": "adam, " + ("distributed (distrib_optim.pt)" if distopt else "plain (not distributed)"),
    }
    if buckets:
        info["ddp"] = f"overlap_grad_reduce, ddp_bucket_size {BUCKET_SIZE}"
    if tied:
        info["embeddings"] = "tied (share_embeddings_and_output_weights)"
    if bf16:
        info["params_dtype"] = "bfloat16"
        info["optimizer"] += ", mixed precision (fp32_from_fp16_params)"
    (case / "case.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"{name}: {sum(f.stat().st_size for f in case.rglob('*') if f.is_file())} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/megatron_legacy")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    args = ap.parse_args()
    for name in args.cases:
        make_case(name, Path(args.out))


if __name__ == "__main__":
    main()
