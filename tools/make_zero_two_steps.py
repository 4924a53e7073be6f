#!/usr/bin/env python3
"""Write a DeepSpeed root holding two saves of one run, for tests of which
checkpoint a root and a --tag choose (#47; tests/test_tag_choice.py).

Real DeepSpeed 0.19.8, through the machinery of tools/make_zero_checkpoints.py
(the same model, ds_config of its z2_bf16_ws2 case, gloo on CPU, world size 2):
the engine trains 10 steps and saves (`engine.save_checkpoint(root)`: tag
global_step10), trains 10 more and saves again (global_step20), so `latest`
names global_step20, as a training job leaves its folder. Nothing is written
by hand.

    .venv-deepspeed/bin/python tools/make_zero_two_steps.py [--out testdata/zero]

writes <out>/z2_two_steps_ws2/:

- ``latest``, ``global_step10/``, ``global_step20/``: DeepSpeed's files (the
  zero_to_fp32.py / zero_to_torch.py copies removed, as for every case);
- ``reference_live.pt``: the live engine's values right after step 20's save,
  in the schema of the other cases' reference_live.pt (model, optim,
  param_groups, lp, buffers, tied), so the case is one of tests/test_zero.py's;
- ``reference_live_step10.pt``: the same, right after step 10's save;
- ``reference_fp32.pt``: DeepSpeed's zero_to_fp32 of the root (what `latest`
  names);
- ``case.json``: the case, versions, files and sizes.

Self-checks: `latest` names global_step20; zero_to_fp32 of each tag
(``tag=``) bit-equals that step's live fp32 masters; the two steps' masters
differ in every trainable tensor (so a test can tell which was read).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import make_zero_checkpoints as mz  # noqa: E402

NAME = "z2_two_steps_ws2"
BASE = "z2_bf16_ws2"  # its model and ds_config
SAVES = (10, 20)


def live_values(engine, c, cls, group_names) -> dict:
    """The live engine's values (collectives: every rank calls this)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    named = dict(engine.module.named_parameters())
    model, optim = {}, {}
    for n in mz.TRAINABLE:
        p = named[n]
        model[n] = safe_get_full_fp32_param(p).detach().clone().float()
        optim[n] = {k: safe_get_full_optimizer_state(p, k).detach().clone().float() for k in ("exp_avg", "exp_avg_sq")}
        optim[n]["step"] = mz.step_of(engine, cls, 0, p)
    return {"model": model, "optim": optim, "param_groups": mz.param_groups_of(engine, group_names),
            "lp": {n: p.data.detach().clone() for n, p in named.items()},
            "buffers": {n: b.detach().clone() for n, b in engine.module.named_buffers()},
            "tied": dict(mz.TIED), "global_steps": engine.global_steps}


def job(rank: int, ws: int, out: str) -> None:
    c = mz.CASES[BASE]
    d = Path(out) / NAME
    engine, group_names = mz.make_engine(c)
    cls = type(engine.optimizer).__name__
    assert cls == "DeepSpeedZeroOptimizer", cls
    if rank == 0 and d.exists():
        shutil.rmtree(d)
    dist.barrier()
    refs = {}
    step = 0
    for save in SAVES:
        while step < save:
            loss = engine(mz.batch(step, rank).to(torch.bfloat16))
            engine.backward(loss)
            engine.step()
            step += 1
        assert engine.global_steps == save and engine.skipped_steps == 0
        engine.save_checkpoint(str(d))
        dist.barrier()
        refs[save] = live_values(engine, c, cls, group_names)
    if rank != 0:
        return
    torch.save(refs[20], d / "reference_live.pt")
    torch.save(refs[10], d / "reference_live_step10.pt")


def finish(out: Path) -> dict:
    import deepspeed
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    d = out / NAME
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):
        if (d / script).exists():
            (d / script).unlink()
    assert (d / "latest").read_text() == "global_step20", (d / "latest").read_text()
    refs = {10: torch.load(d / "reference_live_step10.pt", weights_only=True),
            20: torch.load(d / "reference_live.pt", weights_only=True)}
    for save, ref in refs.items():
        sd = get_fp32_state_dict_from_zero_checkpoint(str(d), tag=f"global_step{save}")
        for n in mz.TRAINABLE:
            assert torch.equal(sd[n], ref["model"][n]), (save, n, "zero_to_fp32 != live")
    for n in mz.TRAINABLE:
        assert not torch.equal(refs[10]["model"][n], refs[20]["model"][n]), n
    torch.save(get_fp32_state_dict_from_zero_checkpoint(str(d)), d / "reference_fp32.pt")
    c = mz.CASES[BASE]
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}
    info = {
        "case": NAME,
        "stage": c["stage"],
        "dtype": c["dtype"],
        "world_size": c["world_size"],
        "optimizer_class": "DeepSpeedZeroOptimizer",
        "exercises": "one run saved twice into one root (global_step10, global_step20; `latest` names "
                     "global_step20): which checkpoint a root, --tag NAME and --tag latest read",
        "saves": [f"global_step{s}" for s in SAVES],
        "ds_config": mz.ds_config(c),
        "ds_version": deepspeed.__version__,
        "torch_version": torch.__version__,
        "python_version": sys.version.split()[0],
        "seed": mz.SEED,
        "model": mz.MODEL_DESC,
        "tensors": mz.SHAPES,
        "tied": mz.TIED,
        "files": files,
        "removed": ["zero_to_fp32.py", "zero_to_torch.py"],
        "references": {
            "reference_live.pt": "live engine values after the save of global_step20 (safe_get_full_*)",
            "reference_live_step10.pt": "live engine values after the save of global_step10 (safe_get_full_*)",
            "reference_fp32.pt": "deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(case_dir)",
        },
        "generator": "tools/make_zero_two_steps.py",
    }
    (d / "case.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "testdata" / "zero"))
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t = time.time()
    mz.spawn(mz.CASES[BASE]["world_size"], job, str(out))
    info = finish(out)
    print(f"{NAME}: {sum(info['files'].values())} bytes, {time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main()
