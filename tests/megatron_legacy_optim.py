"""Loads the model and the optimizer ckptconv wrote with
``reshard LEGACY --layout megatron-legacy --tp TP --pp PP`` into megatron-core
0.16.1's own model and plain optimizer at that TP x PP, as Megatron-LM's
``load_checkpoint`` does for a ckpt_format=torch file, and takes a training
step (run by tests/test_megatron_legacy.py in the side environment
.venv-megatron).

    .venv-megatron/bin/python tests/megatron_legacy_optim.py OURS TP PP CASE OUT.json [DP]

CASE is a fixture folder of testdata/megatron_legacy (its case.json says
the dtype; model_ref.pt and optim_ref.pt are megatron-core's own TP=1/PP=1
reading of the source job's model and optimizer), or a torch_dist one of
testdata/megatron with Megatron-LM's args (then megatron-core reads the
source itself for the references, in this run: see references()).

Where OURS's args say use_distributed_optimizer (distrib_optim.pt beside
each rank file), the job is TP x PP x DP gloo processes (DP default 1) with
megatron's DistributedOptimizer, and each rank then also calls
``optimizer.load_parameter_state(<its rank folder>/distrib_optim.pt)``, as
``load_checkpoint`` does for ckpt_format=torch (DP rank 0 reads the file
and scatters each DP rank's shard); the TP=1/PP=1 process that reads back
what was loaded builds the same optimizer, so the fp32 masters compared are
the optimizer's own. Otherwise:

Every rank builds the fixture's GPT at TP x PP (megatron_legacy_load.build;
under bf16 wrapped in Float16Module as Megatron-LM's get_model does), in
megatron's DistributedDataParallel, with the optimizer
``get_megatron_optimizer`` makes (FP32Optimizer, or
Float16OptimizerWithFloat16Params under bf16), and does what
``load_checkpoint`` does with the rank's file: ``ddp.load_state_dict(
state["model"], strict=True)``, then ``optimizer.load_state_dict(
state["optimizer"])``. What it loaded is saved with megatron-core's own
``dist_checkpointing.save`` (model and the optimizer's sharded state), and
one TP=1/PP=1 process reads that back: every fp32 master and Adam moment
per parameter name must be optim_ref.pt's, and the model model_ref.pt's,
bit for bit (TP and PP pieces joined by megatron-core, not by us).

At PP 1 each rank then takes one training step with the loaded optimizer
(forward with labels, backward, the DDP gradient sync, ``optimizer.step()``:
Adam with megatron's gradient clipping, forward again) and saves the
stepped model the same way. The TP=1/PP=1 process takes the same step from
the source job's own state: model_ref.pt's weights, and optim_ref.pt's state
put into its optimizer by parameter name. Writes {"ranks", "problems",
"model_differ", "optim_differ", "optim_compared", "losses", "ref_losses",
"stepped_max_diff", "stepped_equal", "distributed"} (losses and stepped values
null at PP > 1)."""
import contextlib
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_megatron_checkpoints as mk  # noqa: E402
import make_megatron_legacy_checkpoints as legacy  # noqa: E402
import megatron_legacy_load as mll  # noqa: E402

# The sharding of the optimizer's sharded state the fixtures' references were made with.
REF_SHARDING = legacy.REF_SHARDING


def build(tp, pp, bf16, distopt=False):
    """The model, its DDP wrapper and megatron-core's plain optimizer (or
    its DistributedOptimizer: `distopt`)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module
    from megatron.core import parallel_state as ps
    ps.destroy_model_parallel()  # build_model initializes it (again, for a second model in one process)
    extra = dict(mll.EXTRA)
    if bf16:
        extra.update(bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    # init=True: megatron-core 0.16 marks the tensor-parallel parameters
    # (`tensor_model_parallel`, which the gradient norm for clipping reads)
    # only while initializing them on the CPU; the load overwrites the values.
    cfg, model = mk.build_model(tp, pp, extra, vocab=legacy.VOCAB, seq=legacy.SEQ, init=True)
    wrapped = Float16Module(cfg, model) if bf16 else model
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(use_distributed_optimizer=distopt,
                                                                     grad_reduce_in_fp32=bf16), module=wrapped)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, use_distributed_optimizer=distopt,
                                                 params_dtype=torch.bfloat16 if bf16 else torch.float32, bf16=bf16),
                                 [ddp])
    return model, ddp, opt


def batch():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, legacy.VOCAB, (2, legacy.SEQ), generator=g)
    labels = torch.randint(0, legacy.VOCAB, (2, legacy.SEQ), generator=g)
    positions = torch.arange(legacy.SEQ).unsqueeze(0).expand(2, legacy.SEQ)
    return tokens, positions, labels


def adam_step(ddp, opt):
    """One training step as Megatron-LM's train_step takes it at PP 1:
    forward and backward through the DDP module (gradients into its
    main_grad buffers), finish_grad_sync, optimizer.step(); the per-token
    losses before and after. Dropout is off (eval mode): the CUDA RNG
    tracker, which this CPU run has no states for, draws nothing."""
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    ddp.eval()
    tokens, positions, labels = batch()
    ddp.zero_grad_buffer()
    opt.zero_grad()
    first = ddp(tokens, positions, None, labels=labels)
    first.float().mean().backward()
    ddp.finish_grad_sync()
    ok, grad_norm, _ = opt.step()
    assert ok, "the optimizer step was skipped"
    with torch.no_grad():
        second = ddp(tokens, positions, None, labels=labels)
    return [first.detach().float().flatten().tolist(), second.float().flatten().tolist()]


def written_distributed(ours):
    """Whether OURS was written for the distributed optimizer (its args)."""
    rank_file = next(Path(ours).glob("iter_*/mp_rank_*/model_optim_rng.pt"))
    return bool(torch.load(rank_file, map_location="cpu", weights_only=False)["args"].use_distributed_optimizer)


def load_parameter_state(opt, path):
    """optimizer.load_parameter_state(path), around two things of megatron-
    core 0.16.1 on this CPU run (torch's Adam: no Apex, no Transformer
    Engine): its load_state_dict puts torch Adam's `step` into each state,
    which _set_main_param_and_optimizer_states then copies like a tensor of
    distrib_optim.pt (KeyError 'step'; TE's FusedAdam, a GPU job's, keeps no
    step there): the steps are set aside for the call and put back. And an
    fp32 model's master is a view of its weight (a leaf that requires
    grad), which it copies into in place: under no_grad. The steps go back
    one tensor per parameter: that load_state_dict gives every state the
    same step tensor, which torch's Adam then advances once per parameter
    in one step (its own load_state_dict keeps one per parameter)."""
    with_steps_aside(opt, lambda: opt.load_parameter_state(str(path)))


def with_steps_aside(opt, call):
    """call() with load_parameter_state's workarounds (above)."""
    inner = opt.chained_optimizers if hasattr(opt, "chained_optimizers") else [opt]
    steps = [{p: st.pop("step") for p, st in o.optimizer.state.items() if "step" in st} for o in inner]
    with torch.no_grad():
        call()
    for o, kept in zip(inner, steps):
        for p, step in kept.items():
            o.optimizer.state[p]["step"] = step.clone()


def load_ours(rank, ws, port, ours, tp, pp, bf16, distopt, loaded_dir, stepped_dir, out):
    mk._init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    model, ddp, opt = build(tp, pp, bf16, distopt)
    tracker = (Path(ours) / "latest_checkpointed_iteration.txt").read_text().strip()
    t, p = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
    rank_folder = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
    rank_dir = Path(ours) / f"iter_{int(tracker):07d}" / rank_folder
    state = torch.load(rank_dir / "model_optim_rng.pt", map_location="cpu", weights_only=False)
    problems = [f"args.{k} {getattr(state['args'], k)}" for k, want in
                (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                 ("use_distributed_optimizer", distopt)) if getattr(state["args"], k) != want]
    # megatron/training/checkpointing.py load_checkpoint (core_v0.16.1): the
    # model through the DDP wrapper, strict; then the optimizer, and under
    # the distributed optimizer its parameter state from distrib_optim.pt.
    ddp.load_state_dict(state["model"], strict=True)
    opt.load_state_dict(state["optimizer"])
    if distopt:
        load_parameter_state(opt, rank_dir / "distrib_optim.pt")
    msd = model.sharded_state_dict()
    dist_checkpointing.save({"model": msd, "optimizer": opt.sharded_state_dict(msd, metadata=REF_SHARDING)},
                            loaded_dir)
    losses = None
    if pp == 1:  # a pipeline needs megatron's schedules: not run here
        losses = adam_step(ddp, opt)
        dist_checkpointing.save(model.sharded_state_dict(), stepped_dir)
    results = [None] * ws
    dist.all_gather_object(results, problems)
    if rank == 0:
        Path(out).write_text(json.dumps({"problems": [x for r in results for x in r], "losses": losses}))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def same(x, y):
    if not isinstance(x, torch.Tensor):
        return type(x) is type(y) and x == y
    return (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
            and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)))


def is_torch_dist(case):
    """CASE is a torch_dist fixture (testdata/megatron) rather than a legacy one."""
    return (Path(case) / "ckpt" / "metadata.json").exists()


def source_step(case):
    """The step the distributed optimizer keeps in its param groups (its
    optim_ref.pt has no common step), from the source's first rank file
    (a torch_dist source's common.pt)."""
    if is_torch_dist(case):
        common = torch.load(Path(case) / "ckpt" / "common.pt", weights_only=False)
        return torch.tensor(float(common["optimizer"]["optimizer"]["param_groups"][0]["step"]))
    rank_file = next((Path(case) / "ckpt").glob("iter_*/mp_rank_*/model_optim_rng.pt"))
    groups = torch.load(rank_file, weights_only=False)["optimizer"]["optimizer"]["param_groups"]
    return torch.tensor(float(groups[0]["step"]))


def put_reference_state(model, opt, ref, case):
    """optim_ref.pt's state (the source job's, per parameter name) into
    this TP=1 optimizer: each Adam state under the parameter torch's Adam
    steps (the weight itself, or under bf16 its fp32 master, whose value
    is set too), with the common step."""
    names = {id(p): n for n, p in model.named_parameters()}
    inner = opt.chained_optimizers[0] if hasattr(opt, "chained_optimizers") else opt
    step = ref["common_step"] if "common_step" in ref else source_step(case)
    if hasattr(inner, "fp32_from_float16_groups"):
        pairs = [(names[id(p16)], master) for g16, g32 in zip(inner.float16_groups, inner.fp32_from_float16_groups)
                 for p16, master in zip(g16, g32)]
    else:
        pairs = [(names[id(p)], p) for g in inner.optimizer.param_groups for p in g["params"]]
    for name, param in pairs:
        if "fp32_param" in ref[name]:
            param.data.copy_(ref[name]["fp32_param"])
        inner.optimizer.state[param] = {"step": step.clone(), "exp_avg": ref[name]["exp_avg"].clone(),
                                        "exp_avg_sq": ref[name]["exp_avg_sq"].clone()}
    return len(pairs)


def references(case, bf16):
    """The source job's model and optimizer per parameter name at TP=1/PP=1:
    a legacy fixture's model_ref.pt and optim_ref.pt; of a torch_dist
    fixture (a Megatron-LM job's, with the distributed optimizer),
    megatron-core's own dist_checkpointing.load of it into a TP=1/PP=1 model
    and DistributedOptimizer in this run, named as optim_reference names
    them (the module's names: model_ref.pt there keeps the stored ones)."""
    if not is_torch_dist(case):
        return (torch.load(Path(case) / "model_ref.pt", weights_only=False),
                torch.load(Path(case) / "optim_ref.pt", weights_only=False))
    from megatron.core import dist_checkpointing
    model, ddp, opt = build(1, 1, bf16, distopt=True)
    for inner in opt.chained_optimizers:
        inner._init_optimizer_states_with_dummy_values()
    msd = model.sharded_state_dict()
    request = {"model": msd, "optimizer": opt.sharded_state_dict(msd, is_loading=True, metadata=REF_SHARDING)}
    loaded = dist_checkpointing.load(request, Path(case) / "ckpt")
    model.load_state_dict(loaded["model"], strict=False)
    want_model = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                  for k, v in model.state_dict_for_save_checkpoint().items()}
    return want_model, legacy.optim_reference(model, msd, request["optimizer"], loaded["optimizer"])


def compare(rank, ws, port, case, bf16, distopt, loaded_dir, stepped_dir, stepped, out):
    mk._init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    model, ddp, opt = build(1, 1, bf16, distopt)
    if distopt:
        # A fresh DistributedOptimizer holds no state to load into:
        # megatron-core's own helper allocates it (a zero-gradient step).
        for inner in opt.chained_optimizers:
            inner._init_optimizer_states_with_dummy_values()
    msd = model.sharded_state_dict()
    request = {"model": msd, "optimizer": opt.sharded_state_dict(msd, is_loading=True, metadata=REF_SHARDING)}
    loaded = dist_checkpointing.load(request, loaded_dir)
    model.load_state_dict(loaded["model"], strict=False)
    got_model = model.state_dict_for_save_checkpoint()
    got_optim = legacy.optim_reference(model, msd, request["optimizer"], loaded["optimizer"])
    want_model, want_optim = references(case, bf16)
    report = {"model_differ": sorted(k for k in set(want_model) | set(got_model)
                                     if k not in got_model or k not in want_model
                                     or not same(got_model[k], want_model[k])),
              "optim_differ": [], "optim_compared": 0}
    for name, states in want_optim.items():
        if name == "common_step":
            continue
        for kind, want in states.items():
            report["optim_compared"] += 1
            # The distributed optimizer's fp32 master of an fp32 model is a
            # view of the weight, which FP32Optimizer keeps as its master;
            # a DistributedOptimizer's own master where it was loaded into one.
            got = got_optim.get(name, {}).get(kind)
            if kind == "fp32_param" and got is None:  # the DistributedOptimizer's name for the same master
                got = got_optim.get(name, {}).get("param")
            if kind == "param" and got is None:
                got = got_model.get(name)
            if not same(got, want):
                report["optim_differ"].append(f"{name} {kind}")
    # (common_step: the plain optimizer's, where the distributed one's reference has none)
    report["optim_differ"] += sorted(set(got_optim) - set(want_optim) - {"common_step"})
    if stepped:
        # The same step from the source job's own state at TP=1/PP=1.
        model, ddp, opt = build(1, 1, bf16)
        model.load_state_dict(want_model, strict=True)
        report["ref_params"] = put_reference_state(model, opt, want_optim, case)
        report["ref_losses"] = adam_step(ddp, opt)
        ref_stepped = {k: v.detach().clone() for k, v in model.state_dict_for_save_checkpoint().items()
                       if isinstance(v, torch.Tensor)}
        other, _, _ = build(1, 1, bf16)
        other.load_state_dict(dist_checkpointing.load(other.sharded_state_dict(), stepped_dir), strict=False)
        ours = other.state_dict_for_save_checkpoint()
        report["stepped_equal"] = all(same(ours[k], v) for k, v in ref_stepped.items())
        report["stepped_max_diff"] = max((ours[k].float() - v.float()).abs().max().item() for k, v in ref_stepped.items())
        diffs = {k: (ours[k].float() - v.float()).abs().max().item() for k, v in ref_stepped.items()}
        report["stepped_worst"] = sorted(diffs.items(), key=lambda kv: -kv[1])[:6]
        report["stepped_moved"] = max((v.float() - want_model[k].float()).abs().max().item()
                                      for k, v in ref_stepped.items())
    Path(out).write_text(json.dumps(report))
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    ours, tp, pp, case, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    dp = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    bf16 = json.loads((Path(case) / "case.json").read_text()).get("params_dtype") == "bfloat16"
    distopt = written_distributed(ours)
    with tempfile.TemporaryDirectory() as tmp:
        loaded_dir, stepped_dir = Path(tmp) / "loaded", Path(tmp) / "stepped"
        loaded_dir.mkdir()
        stepped_dir.mkdir()
        ranks_out, compared = Path(tmp) / "ranks.json", Path(tmp) / "compared.json"
        ws = tp * pp * dp
        mp.spawn(load_ours, args=(ws, mk.free_port(), ours, tp, pp, bf16, distopt, str(loaded_dir),
                                  str(stepped_dir), str(ranks_out)), nprocs=ws, join=True)
        mp.spawn(compare, args=(1, mk.free_port(), case, bf16, distopt, str(loaded_dir), str(stepped_dir), pp == 1,
                                str(compared)), nprocs=1, join=True)
        report = json.loads(compared.read_text())
        report.update(json.loads(ranks_out.read_text()))
        report["ranks"] = ws
        report["distributed"] = distopt
        Path(out).write_text(json.dumps(report))
