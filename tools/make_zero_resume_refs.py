#!/usr/bin/env python3
"""Resume references for the DeepSpeed ZeRO fixtures in testdata/zero/.

For each case written by tools/make_zero_checkpoints.py this starts a fresh
DeepSpeed engine with exactly the generator's model, ds_config, world size and
process setup (it imports ``Net``/``fresh_model``/``batch``/``CASES``/
``ds_config``/``make_engine``/``spawn`` from make_zero_checkpoints.py; nothing
is copied), calls ``engine.load_checkpoint(case_dir,
load_optimizer_states=True, load_lr_scheduler_states=True)``, checks that the
loaded fp32 masters / AdamW moments / step bit-equal ``reference_live.pt``,
trains 2 more steps on the generator's batches ``batch(3, rank)`` and
``batch(4, rank)`` (every rank its own micro-batch, as the generator does) and
writes ``<case>/reference_resume.pt``::

    {"case", "stage", "dtype", "world_size", "optimizer_class",
     "steps": [3, 4],                 # the generator's batch(step, rank) step indices
     "batches": [[x_rank0, x_rank1, ...] per step],  # fp32 [4, 6]; fed as x.to(lp dtype)
     "input_dtype": "float32" | "bfloat16" | "float16",
     "loss_fn": str,                  # Net.forward returns the loss; there is no target
     "losses": [[per-rank loss (float) ...] per step],   # DeepSpeed's, unscaled
     "loss_scale": [loss scale in effect at each step],
     "grad_accum": str,               # how DeepSpeed combined the ranks' gradients
     "param_groups": [...],           # FQN-keyed, as in reference_live.pt
     "model_after": {fqn: fp32 master after the 2 steps, trainable only},
     "optim_after": {fqn: {"exp_avg", "exp_avg_sq", "step"}},
     "lp_after": {fqn: live module weight after the 2 steps, frozen included;
                  head_tied.weight is head.weight and not repeated},
     "plain_torch_check": {...},      # plain_torch_resume() vs the above, see below
     "notes": str}

Values after the steps are gathered like the generator gathers them: ZeRO-1/2
and BF16_Optimizer by all-gathering the live flat fp32 / exp_avg partitions
(``make_zero_checkpoints.live_flat_gather``, right for round_robin and
multi-group cases too), ZeRO-3 by ``deepspeed.utils.safe_get_full_fp32_param`` /
``safe_get_full_optimizer_state``; the lp weights of ZeRO-3 inside
``deepspeed.zero.GatheredParameters``.

Then, in the parent process and without DeepSpeed, ``plain_torch_resume``
replays the 2 steps from reference_live.pt turned into ckptconv's consolidated
format ({"model": {fqn: t}, "optim": {"state": {fqn: {...}}, "param_groups":
[{..., "params": [fqn, ...]}]}}) with a plain ``Net`` and ``torch.optim.AdamW``
and records the max abs differences in ``plain_torch_check``; fp32 cases must
match to 1e-6 (they are asserted), the others are recorded only.

    .venv-deepspeed/bin/python tools/make_zero_resume_refs.py [--out testdata/zero] [--only CASE ...]

Needs the cases already written by make_zero_checkpoints.py (same DeepSpeed
0.19.8 side venv, CPU only, gloo). ``plain_torch_resume`` only needs torch and
can be imported from the project venv (this module imports DeepSpeed only inside
the spawned ranks).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_zero_checkpoints as gen  # noqa: E402 (sets DS_ACCELERATOR=cpu by default; imports torch only)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

RESUME_STEPS = 2
FIRST_STEP = gen.STEPS  # the generator trained on batch(0..2, rank); the resume uses batch(3, rank), batch(4, rank)
LP_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FP32_TOL = 1e-6

LOSS_FN = ("no target: Net.forward(x) returns the loss, "
           "((head(h) + 0.5*head_tied(h) + frozen(h) + out_bias).float() * scale).pow(2).mean() "
           "with h = l2(tanh(l1(x))); x = batch.to(lp dtype)")

GRAD_ACCUM = {
    "zero": ("mean over ranks of each rank's gradient of its own (per-micro-batch mean) loss; gradient_accumulation_steps 1. "
             "DeepSpeed pre-divides each rank's gradient by world_size in the communication dtype "
             "(fp32 / bf16 / fp16 = the lp dtype), then sums over ranks (reduce-scatter / reduce in gloo); "
             "fp16: the loss is multiplied by the dynamic loss scale before backward and the reduced fp32 "
             "gradient multiplied by 1/scale before the step"),
    "BF16_Optimizer": ("mean over ranks of each rank's gradient of its own (per-micro-batch mean) loss; "
                       "the bf16 lp gradients are copied into fp32 accumulation buffers, all-reduced (sum) "
                       "by the engine in the communication dtype (bf16) and multiplied by 1/world_size after "
                       "the sum"),
}


# --------------------------------------------------------------------------
# Plain torch (no DeepSpeed): what the pytest does with ckptconv's output
# --------------------------------------------------------------------------


def rekey_optim(optim: dict, named: dict) -> tuple:
    """FQN-keyed full optimizer state dict -> (param groups of Parameters, torch index-keyed state dict).

    Index i is the position of the FQN in the concatenation of the groups' "params" lists,
    which is how torch.optim numbers params (its state_dict() and load_state_dict())."""
    groups = optim["param_groups"]
    order = [n for g in groups for n in g["params"]]
    assert len(order) == len(set(order)), order
    idx = {n: i for i, n in enumerate(order)}
    param_groups = [{"params": [named[n] for n in g["params"]]} for g in groups]
    sd = {"state": {idx[n]: dict(st) for n, st in optim["state"].items()},
          "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": [idx[n] for n in g["params"]]}
                           for g in groups]}
    return param_groups, sd


def plain_torch_resume(start: dict, batches: list, *, lp_dtype=torch.float32, loss_scale=None,
                       comm_dtype=None, postdivide: bool = False, sum_order=None) -> dict:
    """Replay DeepSpeed's resumed steps with a plain Net and torch.optim.AdamW.

    start: ckptconv's consolidated output, {"model": {fqn: tensor}, "optim": {"state": {fqn: {exp_avg,
    exp_avg_sq, step}}, "param_groups": [{hyperparameters, "params": [fqn, ...]}]}}.
    batches[s][r]: rank r's micro-batch of step s (fp32). fp32 cases: leave the keyword arguments alone.
    sum_order: the order in which the ranks' gradients are added (default 0, 1, ..., ws-1); it only moves
    the result by float rounding.
    Returns {"model": {fqn: fp32 master}, "optim": {fqn: state}, "lp": {fqn: lp weight}}."""
    ws = len(batches[0])
    start = copy.deepcopy(start)  # Optimizer.load_state_dict keeps same-dtype tensors as they are: no aliasing
    comm_dtype = comm_dtype or lp_dtype
    loss_scale = loss_scale or [1.0] * len(batches)
    master = gen.fresh_model()  # the generator's Net(); seed 0 only matters for a missing frozen.weight
    res = master.load_state_dict(start["model"], strict=False)  # copy_ casts a bf16/fp16 frozen weight to fp32
    assert not res.unexpected_keys and set(res.missing_keys) <= {"frozen.weight"}, res
    named = dict(master.named_parameters())  # head_tied.weight is head.weight: not listed twice
    trainable = [n for n, p in named.items() if p.requires_grad]
    pgroups, sd = rekey_optim(start["optim"], named)
    assert sorted(n for g in start["optim"]["param_groups"] for n in g["params"]) == sorted(trainable)
    opt = torch.optim.AdamW(pgroups)  # hyperparameters come from load_state_dict
    opt.load_state_dict(sd)
    if lp_dtype == torch.float32:
        lp_model = master
    else:  # DeepSpeed casts the parameters only; the fp32 buffer `scale` stays fp32
        lp_model = copy.deepcopy(master)
        for p in lp_model.parameters():
            p.data = p.data.to(lp_dtype)
    lp_named = dict(lp_model.named_parameters())
    for s, xs in enumerate(batches):
        assert len(xs) == ws
        grads = []
        for x in xs:  # each rank: forward/backward its own micro-batch
            lp_model.zero_grad(set_to_none=True)
            loss = lp_model(x.to(lp_dtype))
            (loss * loss_scale[s] if loss_scale[s] != 1.0 else loss).backward()
            grads.append({n: lp_named[n].grad.to(comm_dtype) for n in trainable})
        acc = {}
        for k, r in enumerate(sum_order or range(ws)):
            for n in trainable:
                g = grads[r][n] if postdivide else grads[r][n].div(ws)
                acc[n] = g if k == 0 else acc[n] + g
        for n in trainable:
            g = acc[n]
            if postdivide:
                g = g.mul(1.0 / ws)
            g = g.float()
            if loss_scale[s] != 1.0:
                g = g.mul(1.0 / loss_scale[s])
            named[n].grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)
        if lp_model is not master:
            with torch.no_grad():
                for n in lp_named:
                    lp_named[n].copy_(named[n])
    state = opt.state_dict()["state"]
    order = [n for g in start["optim"]["param_groups"] for n in g["params"]]
    return {"model": {n: named[n].detach().clone() for n in trainable},
            "optim": {n: state[i] for i, n in enumerate(order)},
            "lp": {n: p.detach().clone() for n, p in lp_named.items()}}


def start_from_live(live: dict) -> dict:
    """reference_live.pt -> ckptconv's consolidated {"model", "optim"} shape (same values for fp32 cases)."""
    model = {**live["lp"], **live["model"], **live["buffers"]}
    model.update({alias: model[owner] for alias, owner in live["tied"].items()})  # ckptconv lists the alias too
    return {"model": model, "optim": {"state": live["optim"], "param_groups": live["param_groups"]}}


def max_abs(a: dict, b: dict) -> float:
    return max(float((a[n].float() - b[n].float()).abs().max()) for n in a)


def plain_check(d: Path) -> dict:
    torch.set_num_threads(1)  # as in the ranks
    ref = torch.load(d / "reference_resume.pt", map_location="cpu", weights_only=False)
    live = torch.load(d / "reference_live.pt", map_location="cpu", weights_only=False)
    lp = LP_DTYPE[ref["dtype"]]
    kw = dict(lp_dtype=lp, loss_scale=ref["loss_scale"])
    if ref["optimizer_class"] == "BF16_Optimizer":
        kw["postdivide"] = True
    got = plain_torch_resume(start_from_live(live), ref["batches"], **kw)
    out = {
        "from": "reference_live.pt as ckptconv-style {model, optim}",
        "emulation": ("fp32: plain Net + AdamW, grad = sum_r(g_r / ws)" if lp == torch.float32 else
                      f"lp {ref['input_dtype']} forward/backward, grads reduced in {ref['input_dtype']} "
                      f"({'sum then *1/ws' if kw.get('postdivide') else 'each /ws then summed in rank order'}), "
                      "fp32 master AdamW step, lp = master.to(lp)"),
        "max_abs_diff_model": max_abs(ref["model_after"], got["model"]),
        "max_abs_diff_exp_avg": max(float((ref["optim_after"][n]["exp_avg"] - got["optim"][n]["exp_avg"]).abs().max())
                                    for n in ref["model_after"]),
        "max_abs_diff_exp_avg_sq": max(float((ref["optim_after"][n]["exp_avg_sq"] - got["optim"][n]["exp_avg_sq"]).abs().max())
                                       for n in ref["model_after"]),
        "max_abs_diff_lp": max_abs(ref["lp_after"], got["lp"]),
        "bit_equal_model": all(torch.equal(ref["model_after"][n], got["model"][n]) for n in ref["model_after"]),
        "step_after": {n: float(got["optim"][n]["step"]) for n in ref["model_after"]},
        # how far the 2 steps moved the masters (scale for the differences above)
        "max_abs_update": max_abs(ref["model_after"], live["model"]),
    }
    # gloo sums a 3-rank reduction as (g1 + g2) + g0 here; that order is bit-equal where the default isn't
    ws = ref["world_size"]
    rot = plain_torch_resume(start_from_live(live), ref["batches"], **kw, sum_order=[*range(1, ws), 0])
    out["sum_order_1_to_ws-1_then_0"] = {
        "max_abs_diff_model": max_abs(ref["model_after"], rot["model"]),
        "bit_equal_model": all(torch.equal(ref["model_after"][n], rot["model"][n]) for n in ref["model_after"])}
    if lp == torch.float32:
        assert out["max_abs_diff_model"] <= FP32_TOL and out["max_abs_diff_lp"] <= FP32_TOL, (d.name, out)
        assert all(v == gen.STEPS + RESUME_STEPS for v in out["step_after"].values()), out["step_after"]
    return out


# --------------------------------------------------------------------------
# DeepSpeed side (runs in every rank)
# --------------------------------------------------------------------------


def gather_trainable(engine, c, cls: str, group_names) -> dict:
    """{fqn: {"fp32", "exp_avg", "exp_avg_sq", "step"}} from the live engine (collective: every rank)."""
    module = engine.module
    named = dict(module.named_parameters())
    if c["stage"] < 3:
        return gen.live_flat_gather(engine, cls, {id(p): n for n, p in named.items()})
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    group_of = {n: gi for gi, names in enumerate(group_names) for n in names}
    out = {}
    for n in gen.TRAINABLE:
        p = named[n]
        v = {"fp32": safe_get_full_fp32_param(p)}
        for k in ("exp_avg", "exp_avg_sq"):
            v[k] = safe_get_full_optimizer_state(p, k)
        out[n] = {k: t.detach().clone().float().view(p.ds_shape) for k, t in v.items()}
        out[n]["step"] = gen.step_of(engine, cls, group_of[n], p)
    return out


def gather_lp(engine, c) -> dict:
    import deepspeed
    named = dict(engine.module.named_parameters())
    if c["stage"] == 3:
        with deepspeed.zero.GatheredParameters(list(named.values()), modifier_rank=None):
            return {n: p.data.detach().clone() for n, p in named.items()}
    return {n: p.data.detach().clone() for n, p in named.items()}


def job(rank: int, ws: int, out: str, name: str) -> None:
    c = gen.CASES[name]
    d = Path(out) / name
    if c["dtype"] == "fp16":
        gen.fp16_gate_patch()
    lp_dtype = LP_DTYPE[c["dtype"]]
    engine, group_names = gen.make_engine(c)
    cls = type(engine.optimizer).__name__
    assert cls == gen.expected_optimizer_class(name, c), (name, cls)
    path, _ = engine.load_checkpoint(str(d), load_optimizer_states=True, load_lr_scheduler_states=True)
    assert path is not None, f"{name}: load_checkpoint found nothing in {d}"
    assert engine.global_steps == gen.STEPS, engine.global_steps

    # the loaded state is the saved one, bit for bit
    live = torch.load(d / "reference_live.pt", map_location="cpu", weights_only=False)
    loaded = gather_trainable(engine, c, cls, group_names)
    for n in gen.TRAINABLE:
        assert torch.equal(loaded[n]["fp32"], live["model"][n]), (name, n, "loaded fp32 != reference_live")
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(loaded[n][k], live["optim"][n][k]), (name, n, k, "loaded != reference_live")
    lp0 = gather_lp(engine, c)
    for n, t in live["lp"].items():
        assert torch.equal(lp0[n], t), (name, n, "loaded lp != reference_live")

    batches, losses, scales = [], [], []
    for s in range(RESUME_STEPS):
        step = FIRST_STEP + s
        scales.append(float(getattr(engine.optimizer, "loss_scale", 1.0)))
        x = gen.batch(step, rank)
        loss = engine(x.to(lp_dtype))
        engine.backward(loss)
        engine.step()
        per_rank = [torch.zeros(()) for _ in range(ws)]
        dist.all_gather(per_rank, loss.detach().float().reshape(()))
        losses.append([float(v) for v in per_rank])
        batches.append([gen.batch(step, r) for r in range(ws)])
        assert torch.equal(batches[-1][rank], x)
    assert engine.global_steps == gen.STEPS + RESUME_STEPS and engine.skipped_steps == 0, \
        (engine.global_steps, engine.skipped_steps)

    after = gather_trainable(engine, c, cls, group_names)
    lp_after = gather_lp(engine, c)
    for n in gen.TRAINABLE:
        assert torch.equal(lp_after[n], after[n]["fp32"].to(lp_dtype)), (name, n, "lp != fp32 master")
    if rank != 0:
        return
    ref = {
        "case": name,
        "stage": c["stage"],
        "dtype": c["dtype"],
        "world_size": ws,
        "optimizer_class": cls,
        "resumed_from": str(path).replace(str(d), "<case_dir>"),
        "steps": [FIRST_STEP + s for s in range(RESUME_STEPS)],
        "batches": batches,
        "input_dtype": str(lp_dtype).removeprefix("torch."),
        "loss_fn": LOSS_FN,
        "losses": losses,
        "loss_scale": scales,
        "grad_accum": GRAD_ACCUM["BF16_Optimizer" if cls == "BF16_Optimizer" else "zero"],
        "param_groups": live["param_groups"],
        "model_after": {n: after[n]["fp32"] for n in gen.TRAINABLE},
        "optim_after": {n: {"exp_avg": after[n]["exp_avg"], "exp_avg_sq": after[n]["exp_avg_sq"],
                            "step": after[n]["step"]} for n in gen.TRAINABLE},
        "lp_after": lp_after,
        "notes": notes(c, cls),
    }
    torch.save(ref, d / "reference_resume.pt")


def notes(c, cls: str) -> str:
    lp = c["dtype"]
    common = (
        "DeepSpeed 0.19.8 engine built exactly as tools/make_zero_checkpoints.py builds it (make_engine, same "
        "ds_config and world size, gloo on CPU), engine.load_checkpoint(case_dir, load_optimizer_states=True, "
        "load_lr_scheduler_states=True) (no lr scheduler is configured), loaded state checked bit-equal to "
        "reference_live.pt, then 2 steps: rank r runs loss = engine(batches[s][r].to(lp)); engine.backward(loss); "
        "engine.step(). Optimizer: torch.optim.AdamW (torch_adam, foreach=None -> single-tensor on CPU), "
        "no gradient clipping (gradient_clipping 0), no lr scheduler, gradient_accumulation_steps 1. "
        "Plain-torch reproduction (see plain_torch_resume in tools/make_zero_resume_refs.py): build "
        "make_zero_checkpoints.fresh_model() (torch.manual_seed(0); Net()), load_state_dict(ckptconv 'model', "
        "strict=False; head_tied.weight is head.weight, frozen.weight may be absent for stage 1 and then keeps its "
        "seed-0 init, which is what DeepSpeed has), make torch.optim.AdamW over named params in the order of "
        "optim['param_groups'][g]['params'] and load_state_dict({'state': {i: state[fqn]}, 'param_groups': "
        "[{hyperparameters..., 'params': [i...]}]}) with i = index of fqn in the concatenation of the groups' "
        "params lists. Each step s: for r in range(world_size): zero grads, loss = model(batches[s][r]), "
        "loss.backward(), keep g_r; then p.grad = sum_r (g_r / world_size) (rank order, i.e. the mean over ranks "
        "of each rank's gradient of its own per-micro-batch mean loss. One backward over the concatenated "
        "batch is the same gradient mathematically (equal micro-batch sizes) but rounds differently); "
        "optimizer.step(). Summing in the order g_1, ..., g_{ws-1}, g_0 reproduces the fp32 cases bit for bit "
        "(gloo's order here); rank order 0..ws-1 is within 3e-8. "
        "Weight decay: AdamW's decoupled decay (lr*wd*p) on every param of a group with weight_decay > 0, biases "
        "and out_bias included in the 1-group cases (the 2-group cases have wd 0 for the 1-D group); the tied "
        "head.weight is one parameter (its gradient is the sum of both uses, autograd does it) decayed once; "
        "frozen.weight has no grad, is in no group, never decayed. The AdamW step counter continues from 3 "
        "(state 'step' tensors) to 5. ")
    if lp == "fp32":
        return common + ("fp32 case: LossScaler with scale 1 (a no-op), the plain replay matches model_after to "
                         "float rounding; compare with torch.allclose(atol=1e-6, rtol=0) (see plain_torch_check).")
    tail = (f"{lp} case: DeepSpeed runs forward/backward with the {lp} lp weights (parameters cast, the fp32 "
            f"buffer 'scale' kept fp32, input cast to {lp}), so the per-rank gradients are {lp}; they are "
            f"reduced in {lp} (communication_data_type defaults to the lp dtype) and turned into fp32 "
            "gradients of the fp32 masters; the AdamW step runs on the fp32 masters and the lp weights are "
            f"then master.to({lp}). A plain replay must do the same (model copy with {lp} params for "
            "forward/backward, fp32 master params in the optimizer); plain_torch_check records how close that "
            "emulation gets (reduction rounding inside gloo is not reproduced exactly at world size 3). ")
    if lp == "fp16":
        tail += ("fp16: dynamic loss scaling, the loss is multiplied by loss_scale[s] before backward and the fp32 "
                 "gradient by 1/loss_scale[s] before the step; no step overflowed (skipped_steps 0). ")
    if cls == "BF16_Optimizer":
        tail += ("BF16_Optimizer: grads accumulate in fp32 buffers (grad_accum_dtype fp32) and the engine "
                 "all-reduces them (sum, then *1/world_size). ")
    return common + tail


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "testdata" / "zero"))
    ap.add_argument("--only", nargs="*", choices=sorted(gen.CASES), help="only these cases")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    for name in args.only or gen.CASES:
        t = time.time()
        d = out / name
        assert (d / "latest").exists() and (d / "reference_live.pt").exists(), \
            f"{d}: run tools/make_zero_checkpoints.py first"
        gen.spawn(gen.CASES[name]["world_size"], job, str(out), name)
        check = plain_check(d)
        ref = torch.load(d / "reference_resume.pt", map_location="cpu", weights_only=False)
        ref["plain_torch_check"] = check
        torch.save(ref, d / "reference_resume.pt")
        size = (d / "reference_resume.pt").stat().st_size
        print(f"{name}: {ref['optimizer_class']} {size} bytes, plain torch vs DeepSpeed max|d| model "
              f"{check['max_abs_diff_model']:.3g} lp {check['max_abs_diff_lp']:.3g} exp_avg "
              f"{check['max_abs_diff_exp_avg']:.3g} exp_avg_sq {check['max_abs_diff_exp_avg_sq']:.3g} "
              f"(bit-equal {check['bit_equal_model']}; sum order 1..ws-1,0: "
              f"{check['sum_order_1_to_ws-1_then_0']['max_abs_diff_model']:.3g}; update {check['max_abs_update']:.3g}), "
              f"{time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main()
