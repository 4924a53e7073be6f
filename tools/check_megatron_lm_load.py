#!/usr/bin/env python3
"""Loads a Megatron-LM legacy checkpoint with Megatron-LM's own
``load_checkpoint`` at TP x PP, as a job resuming with ``--load CKPT
--no-load-optim --no-load-rng`` does, and checks the model it got against
MODEL_REF. A check run by hand: Megatron-LM's training code is not on PyPI,
so the test suite (tests/test_megatron_legacy.py, tests/megatron_legacy_load.py)
proves the same outputs with megatron-core's load_state_dict instead, which is
the call load_checkpoint makes. With a ``core_v0.16.1`` tree of Megatron-LM
on PYTHONPATH (tools/make_megatron_legacy_checkpoints.py's docstring):

    PYTHONPATH=/tmp/mlm .venv-megatron/bin/python tools/check_megatron_lm_load.py CKPT TP PP MODEL_REF [torch|torch_dist|torch-optim|finetune [tied]]

(torch_dist: CKPT holds a torch_dist iteration folder and its tracker, the
job runs with --ckpt-format torch_dist; torch-optim: a legacy CKPT with its
optimizer (reshard --layout megatron-legacy), loaded without
--no-load-optim, and what the optimizer got compared with the optim_ref.pt
beside MODEL_REF as tests/megatron_legacy_optim.py compares it (an fp32
job's; where CKPT's args say use_distributed_optimizer the job runs with
--use-distributed-optimizer, and load_checkpoint also calls
load_parameter_state on distrib_optim.pt, with the driver's two
workarounds for megatron-core 0.16.1's torch-Adam path); finetune: a legacy
CKPT without optimizer or RNG state (reshard HF --layout megatron-legacy
--args-from), loaded as a job with --finetune loads it (iteration 0, no
optimizer, no RNG), and at PP 1 the job then takes FINETUNE_STEPS (3) Adam
steps with its own fresh optimizer (forward and backward through its DDP
model, finish_grad_sync, optimizer.step()) and prints the per-token losses
of each: run it on two outputs holding the same weights (from the Hugging
Face folder and from the legacy source) to compare them; tied: the job of
gpt_pp2_dp2_tied, tied embeddings and a vocabulary of 17.)

Every rank builds the fixture's job the way make_megatron_legacy_checkpoints.py
does (Megatron-LM's parse_args, the GPT in megatron's DDP, Adam) at TP x PP,
calls ``load_checkpoint(ddp_models, optimizer, None, strict=True)``, and saves
what it loaded with megatron-core's ``dist_checkpointing.save``; one
TP=1/PP=1 process loads that and compares it with MODEL_REF bit for bit.
Prints the iteration load_checkpoint returned and the names that differ."""
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import make_megatron_checkpoints as mk  # noqa: E402
import make_megatron_legacy_checkpoints as legacy  # noqa: E402
import megatron_legacy_load as check  # noqa: E402
import megatron_legacy_optim as check_optim  # noqa: E402


FINETUNE_STEPS = 3


def job(rank, ws, port, ckpt, tp, pp, resaved, out, ckpt_format, tied, distopt=False, buckets=False):
    legacy._init(rank, ws, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    from megatron.training.checkpointing import load_checkpoint
    args = legacy.megatron_args(tp, pp, resaved, tied=tied, distopt=distopt, buckets=buckets)
    args.load = ckpt
    if ckpt_format == "torch_dist":  # validate_args: --ckpt-format torch_dist
        args.ckpt_format, args.use_dist_ckpt = "torch_dist", True
    args.no_load_optim = ckpt_format != "torch-optim"
    args.no_load_rng = True
    args.finetune = ckpt_format == "finetune"
    models, ddps, opt = legacy.build(args, tp, pp)
    # validate_args' and set_global_variables' part that load_checkpoint reads
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    args.global_batch_size = args.micro_batch_size
    init_num_microbatches_calculator(rank, None, args.global_batch_size, args.micro_batch_size, 1)
    if distopt:  # tests/megatron_legacy_optim.py's load_parameter_state says why
        real = opt.load_parameter_state
        opt.load_parameter_state = lambda *a, **k: check_optim.with_steps_aside(opt, lambda: real(*a, **k))
    iteration, _ = load_checkpoint(ddps, opt, None, strict=True)
    msd = models[0].sharded_state_dict()
    if ckpt_format == "torch-optim":
        dist_checkpointing.save({"model": msd, "optimizer": opt.sharded_state_dict(msd, metadata=legacy.REF_SHARDING)},
                                resaved)
    else:
        dist_checkpointing.save(msd, resaved)
    losses = None
    if ckpt_format == "finetune" and pp == 1:  # after the save: the steps move the weights
        losses = [check_optim.adam_step(ddps[0], opt) for _ in range(FINETUNE_STEPS)]
    if rank == 0:
        Path(out).write_text(json.dumps({"iteration": iteration, "losses": losses}))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def compare_tied(rank, port, resaved, model_ref, out):
    """The tied job at TP=1/PP=1 loads the re-save; its state is compared with MODEL_REF bit for bit."""
    legacy._init(rank, 1, port)
    from megatron.core import dist_checkpointing, parallel_state as ps
    args = legacy.megatron_args(1, 1, resaved, tied=True)
    (model,), _, _ = legacy.build(args, 1, 1)
    model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), resaved), strict=False)
    got, want = model.state_dict_for_save_checkpoint(), torch.load(model_ref, weights_only=False)
    differ = sorted(k for k in want if not (isinstance(want[k], torch.Tensor) and torch.equal(got[k], want[k]))
                    and not (want[k] is None and got.get(k, 0) is None))
    Path(out).write_text(json.dumps({"tensors": sum(isinstance(v, torch.Tensor) for v in want.values()),
                                     "differ": differ + sorted(set(got) - set(want))}))
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    ckpt, tp, pp, model_ref = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ckpt_format = sys.argv[5] if len(sys.argv) > 5 else "torch"
    tied = len(sys.argv) > 6 and sys.argv[6] == "tied"
    distopt = ckpt_format == "torch-optim" and check_optim.written_distributed(ckpt)
    # The job runs with the bucketed case's --overlap-grad-reduce --ddp-bucket-size where CKPT's args have them
    # (distrib_optim.pt is laid out by them).
    saved_args = torch.load(next(Path(ckpt).glob("iter_*/mp_rank_*/model_optim_rng.pt")), weights_only=False)["args"]
    buckets = bool(getattr(saved_args, "overlap_grad_reduce", False))
    with tempfile.TemporaryDirectory() as tmp:
        resaved, loaded, compared = Path(tmp) / "resaved", Path(tmp) / "loaded.json", Path(tmp) / "compared.json"
        resaved.mkdir()
        mp.spawn(job, args=(tp * pp, mk.free_port(), ckpt, tp, pp, str(resaved), str(loaded), ckpt_format, tied, distopt,
                                   buckets),
                 nprocs=tp * pp,
                 join=True)
        if ckpt_format == "torch-optim":
            mp.spawn(check_optim.compare, args=(1, mk.free_port(), str(Path(model_ref).parent), False, distopt, str(resaved),
                                                None, False, str(compared)), nprocs=1, join=True)
        elif tied:  # tests/megatron_legacy_load.py's TP=1/PP=1 model is the untied one: compare the tied job's own
            assert tp * pp == 1, "the tied job is compared at TP 1 x PP 1 only"
            mp.spawn(compare_tied, args=(mk.free_port(), str(resaved), model_ref, str(compared)), nprocs=1, join=True)
        else:
            mp.spawn(check.compare, args=(1, mk.free_port(), str(resaved), model_ref, str(compared)), nprocs=1,
                     join=True)
        report = {**json.loads(loaded.read_text()), **json.loads(compared.read_text()), "tp": tp, "pp": pp, "format": ckpt_format}
        print(json.dumps(report))
