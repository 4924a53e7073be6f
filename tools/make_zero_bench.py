#!/usr/bin/env python3
"""Write the DeepSpeed ZeRO-2 and ZeRO-3 checkpoints that scripts/bench's zero
row consolidates: bf16, world size 4, each about BYTES on disk, written by real
DeepSpeed (``engine.save_checkpoint``) after 1 training step, with the rank
plumbing of tools/make_zero_checkpoints.py (torch.multiprocessing + gloo on
CPU, DS_ACCELERATOR=cpu, the shm comm op stubbed, torch's AdamW).

    .venv-deepspeed/bin/python tools/make_zero_bench.py [--bytes 2e9] [--out-root bench-out] [--stages 2 3]

Writes ``<out-root>/zero<stage>_ws4_<BYTES>/`` (``latest``, ``global_step1/``,
and ``bench.json``, the marker written last that says what is there); a folder
whose bench.json is present is reused as is.

The model is a stack of LAYERS Linear(d, d) layers (with bias), d chosen so
that the checkpoint is about BYTES:

- ZeRO-2: the bf16 weights (mp_rank_00_model_states.pt) + the fp32 master +
  exp_avg + exp_avg_sq partitions: 2 + 4 + 4 + 4 = 14 bytes per parameter;
- ZeRO-3: the model-state files hold no weights (the params are partitioned:
  empty tensors), so 12 bytes per parameter.

The reduce/allgather buckets are made smaller than DeepSpeed's defaults
(5e8 elements) to keep the 4 ranks' memory down; that changes no file.

    .venv-deepspeed/bin/python tools/make_zero_bench.py --pipeline [--bytes 2e9] [--out-root bench-out]

writes instead ``<out-root>/pipe_pp2_bf16_<BYTES>/``, the pipeline row's
checkpoint: a ``deepspeed.pipe.PipelineModule`` of PIPE_LAYERS
Linear(d, d) layers (with bias) in 2 stages x 1 data-parallel rank, bf16,
ZeRO-1 (DeepSpeed's BF16_Optimizer), saved after 1 ``train_batch`` with the
ds_config of tools/make_zero_parallel_checkpoints.py's pipeline fixtures:
``layer_LL-model_states.pt`` (bf16 weights), ``mp_rank_0S_model_states.pt``
and ``bf16_zero_pp_rank_0_mp_rank_0S_optim_states.pt`` (fp32 master,
exp_avg, exp_avg_sq: 2 + 12 = 14 bytes per parameter).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_zero_checkpoints as mzc  # noqa: E402 (sets DS_ACCELERATOR=cpu, imports torch)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

WORLD_SIZE = 4
LAYERS = 4
STEPS = 1
MICRO_BATCH = 4
BUCKET = 50_000_000  # elements
BYTES_PER_PARAM = {2: 14, 3: 12}


class BenchNet(nn.Module):
    def __init__(self, d: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.float().pow(2).mean()


def width_for(nbytes: float, bytes_per_param: int, layers: int = LAYERS) -> int:
    params = nbytes / bytes_per_param
    # layers * (d*d + d) = params
    return int((-1 + math.sqrt(1 + 4 * params / layers)) / 2)


def config(stage: int) -> dict:
    c = mzc.case(stage, "bf16", WORLD_SIZE, exercises="bench",
                 zero_extra={"reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET}
                 if stage < 3 else
                 {"reduce_bucket_size": BUCKET, "stage3_prefetch_bucket_size": BUCKET})
    return mzc.ds_config(c)


def job(rank: int, ws: int, out: str, stage: int, d: int, layers: int) -> None:
    import deepspeed
    torch.manual_seed(mzc.SEED)
    model = BenchNet(d, layers)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                           config=config(stage))
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        loss = engine(torch.randn(MICRO_BATCH, d, generator=g).to(torch.bfloat16))
        engine.backward(loss)
        engine.step()
    assert engine.global_steps == STEPS and engine.skipped_steps == 0, (engine.global_steps, engine.skipped_steps)
    dist.barrier()
    engine.save_checkpoint(out)
    dist.barrier()


PIPE_LAYERS, PIPE_STAGES = 8, 2
PIPE_CASE = dict(kind="pipe", pp=PIPE_STAGES, dp=1, dtype="bf16", stage=1)
PIPE_BYTES_PER_PARAM = 2 + 12  # the bf16 weight in a layer file; fp32 master, exp_avg, exp_avg_sq


def pipe_job(rank: int, ws: int, out: str, d: int) -> None:
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule
    import make_zero_parallel_checkpoints as mzp
    torch.manual_seed(mzc.SEED)
    net = PipelineModule(layers=[LayerSpec(nn.Linear, d, d) for _ in range(PIPE_LAYERS)], num_stages=PIPE_STAGES,
                         loss_fn=mzp.loss_fn, partition_method="parameters", base_seed=mzc.SEED)
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=list(net.parameters()),
                                           config=mzp.ds_config(PIPE_CASE))
    g = torch.Generator().manual_seed(1000)

    def batches():
        while True:
            yield (torch.randn(mzp.MICRO_BATCH, d, generator=g).to(torch.bfloat16),
                   torch.randn(mzp.MICRO_BATCH, d, generator=g))

    engine.train_batch(data_iter=batches())
    assert engine.global_steps == STEPS, engine.global_steps
    dist.barrier()
    engine.save_checkpoint(out)
    dist.barrier()


def reuse_or_clear(d: Path, marker: Path) -> bool:
    """True when `d` holds a finished checkpoint (its marker written last);
    else `d` is made empty for a new one."""
    if marker.is_file():
        print(f"make_zero_bench: reusing {d}", flush=True)
        return True
    if d.exists():
        import shutil
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return False


def make_pipe(root: Path, bytes_arg: str) -> Path:
    d = root / f"pipe_pp{PIPE_STAGES}_bf16_{bytes_arg}"
    marker = d / "bench.json"
    if reuse_or_clear(d, marker):
        return d
    width = width_for(float(bytes_arg), PIPE_BYTES_PER_PARAM, PIPE_LAYERS)
    params = PIPE_LAYERS * (width * width + width)
    print(f"make_zero_bench: pipeline {PIPE_STAGES} stages x 1, bf16 ZeRO-1: {PIPE_LAYERS} x Linear({width}, {width}),"
          f" {params / 1e6:.1f}M params -> {d}", flush=True)
    t = time.time()
    mzc.spawn(PIPE_STAGES, pipe_job, str(d), width)
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):
        (d / script).unlink(missing_ok=True)
    tag = (d / "latest").read_text().strip()
    assert tag == f"global_step{STEPS}", tag
    expected = sorted([f"layer_{i:02d}-model_states.pt" for i in range(PIPE_LAYERS)] +
                      [f"mp_rank_{s:02d}_model_states.pt" for s in range(PIPE_STAGES)] +
                      [f"bf16_zero_pp_rank_0_mp_rank_{s:02d}_optim_states.pt" for s in range(PIPE_STAGES)])
    got = sorted(p.name for p in (d / tag).iterdir())
    assert got == expected, (got, expected)
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    import deepspeed
    import make_zero_parallel_checkpoints as mzp
    info = {"stage": 1, "dtype": "bf16", "world_size": PIPE_STAGES, "pipeline_stages": PIPE_STAGES,
            "data_parallel": 1, "steps": STEPS, "bytes_arg": bytes_arg,
            "model": f"PipelineModule of {PIPE_LAYERS} x Linear({width}, {width}) with bias, {PIPE_STAGES} stages",
            "params": params, "ds_config": mzp.ds_config(PIPE_CASE), "ds_version": deepspeed.__version__,
            "torch_version": torch.__version__, "files": files, "total_bytes": sum(files.values()),
            "seconds": round(time.time() - t, 1), "generator": "tools/make_zero_bench.py --pipeline"}
    marker.write_text(json.dumps(info, indent=1) + "\n")
    print(f"make_zero_bench: {d}: {info['total_bytes'] / 1e9:.2f} GB in {len(files)} files, "
          f"{info['seconds']}s", flush=True)
    return d


def make(root: Path, bytes_arg: str, stage: int) -> Path:
    d = root / f"zero{stage}_ws{WORLD_SIZE}_{bytes_arg}"
    marker = d / "bench.json"
    if reuse_or_clear(d, marker):
        return d
    width = width_for(float(bytes_arg), BYTES_PER_PARAM[stage])
    params = LAYERS * (width * width + width)
    print(f"make_zero_bench: ZeRO-{stage} bf16 ws {WORLD_SIZE}: {LAYERS} x Linear({width}, {width}), "
          f"{params / 1e6:.1f}M params -> {d}", flush=True)
    t = time.time()
    mzc.spawn(WORLD_SIZE, job, str(d), stage, width, LAYERS)
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):
        (d / script).unlink(missing_ok=True)
    tag = (d / "latest").read_text().strip()
    assert tag == f"global_step{STEPS}", tag
    c = mzc.case(stage, "bf16", WORLD_SIZE, exercises="bench")
    got = sorted(p.name for p in (d / tag).iterdir())
    assert got == mzc.expected_files(c), (got, mzc.expected_files(c))
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    import deepspeed
    info = {"stage": stage, "dtype": "bf16", "world_size": WORLD_SIZE, "steps": STEPS, "bytes_arg": bytes_arg,
            "model": f"{LAYERS} x Linear({width}, {width}) with bias", "params": params,
            "ds_config": config(stage), "ds_version": deepspeed.__version__, "torch_version": torch.__version__,
            "files": files, "total_bytes": sum(files.values()), "seconds": round(time.time() - t, 1),
            "generator": "tools/make_zero_bench.py"}
    marker.write_text(json.dumps(info, indent=1) + "\n")
    print(f"make_zero_bench: {d}: {info['total_bytes'] / 1e9:.2f} GB in {len(files)} files, "
          f"{info['seconds']}s", flush=True)
    return d


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", default="2e9", help="about this many bytes per checkpoint (default 2e9)")
    ap.add_argument("--out-root", default=str(Path(__file__).resolve().parent.parent / "bench-out"))
    ap.add_argument("--stages", nargs="*", type=int, default=[2, 3], choices=[2, 3])
    ap.add_argument("--pipeline", action="store_true", help="the pipeline row's checkpoint instead")
    args = ap.parse_args(argv)
    root = Path(args.out_root)
    if args.pipeline:
        make_pipe(root, args.bytes)
        return
    for stage in args.stages:
        make(root, args.bytes, stage)


if __name__ == "__main__":
    main()
