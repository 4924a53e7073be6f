"""`reshard --layout deepspeed-universal`: DeepSpeed universal checkpoints (UCP).

Against what real DeepSpeed 0.19.8 writes and loads:

- per file, ckptconv's UCP of each ZeRO fixture (testdata/zero/<case>, real
  engines) against ``ds_to_universal.py``'s output of the same checkpoint
  (testdata/ucp/<case>, tools/make_ucp_checkpoints.py): the same files, every
  tensor equal, except the differences docs/deepspeed.md lists;
- a real DeepSpeed engine with ``load_universal`` loads ckptconv's UCP at
  another world size (tests/ds_universal_load.py, in the DeepSpeed side
  environment .venv-deepspeed that scripts/test makes; these tests fail
  without it): fp32 masters, AdamW moments and
  step bit-equal the source engine's live values (reference_live.pt), and the
  next two steps bit-equal those of an engine that loaded ds_to_universal's
  output at that world size (same machine, same run);
- a ZeRO checkpoint migrated through DCP, and one consolidated to a .pt
  first, give the same UCP tensors as the direct conversion;
- what cannot be written is refused before anything is (exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from proofs_guard import require_side_env

REPO = Path(__file__).resolve().parent.parent
DS_PY = REPO / ".venv-deepspeed" / "bin" / "python"
TAG = "global_step3_universal"
TRAINABLE = ["out_bias", "l1.weight", "l1.bias", "l2.weight", "head.weight"]
CASES = ["z1_fp16_ws2", "z2_bf16_ws2", "z2_2groups_ws2", "z2_fp32_ws3", "z3_bf16_ws2", "z3_fp32_ws2",
         "z3_2groups_ws2"]


@pytest.fixture
def deepspeed_env():
    require_side_env(DS_PY, "the real-engine load tests run DeepSpeed", "scripts/setup-deepspeed")


needs_deepspeed = pytest.mark.usefixtures("deepspeed_env")


def load(p: Path):
    return torch.load(p, map_location="cpu", weights_only=True)


def tensor_of(v):
    return v["param"] if isinstance(v, dict) else v


def write_ucp(run_ckptconv, src: Path, root: Path, *extra) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    out = root / TAG
    r = run_ckptconv("reshard", str(src), "-o", str(out), "--layout", "deepspeed-universal", *extra)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("case", CASES)
def test_files_match_ds_to_universal(case, testdata, tmp_path, run_ckptconv):
    ours = write_ucp(run_ckptconv, testdata / "zero" / case, tmp_path)
    theirs = testdata / "ucp" / case / TAG
    assert (tmp_path / "latest_universal").read_bytes() == TAG.encode()
    stage3 = case.startswith("z3")
    ref = torch.load(testdata / "zero" / case / "reference_live.pt", weights_only=False)
    got = {str(p.relative_to(ours)) for p in ours.rglob("*") if p.is_file()}
    want = {str(p.relative_to(theirs)) for p in theirs.rglob("*") if p.is_file()}
    # Model states: ckptconv writes both names every stage loads from
    # (ZeRO-1/2 read mp_rank_00, ZeRO-3 zero_pp_rank_0), DeepSpeed copies the
    # source's (ZeRO-3: one per source rank).
    states = {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"}
    assert states <= got
    got_zero = {f for f in got if f.startswith("zero/")}
    want_zero = {f for f in want if f.startswith("zero/")}
    if stage3:
        # ds_to_universal's ZeRO-3 path writes trainable params only and no
        # step.pt (the step is in optimizer_state.pt); ckptconv writes the
        # ZeRO-1/2 tree, which both paths load.
        assert want_zero < got_zero
        extra = got_zero - want_zero
        assert extra == {f"zero/{n}/step.pt" for n in TRAINABLE} | {
            "zero/frozen.weight/fp32.pt", "zero/head_tied.weight/fp32.pt", "zero/scale/fp32.pt"}
    else:
        assert got_zero == want_zero
    compared = 0
    for f in sorted(want_zero - {"zero/optimizer_state.pt"}):
        a, b = load(ours / f), load(theirs / f)
        ta, tb = tensor_of(a), tensor_of(b)
        assert ta.dtype == tb.dtype == torch.float32, f
        if not stage3 and f.endswith(("fp32.pt", "exp_avg.pt", "exp_avg_sq.pt")):
            assert list(a) == list(b), f  # {'cat_dim': 0, 'param': ...}, or {'param': ...}
        if f == "zero/head_tied.weight/fp32.pt":
            # DeepSpeed writes the tied alias's low-precision module value cast
            # to fp32; ckptconv the owner's fp32 master. No loader reads it.
            assert torch.equal(ta, tensor_of(load(ours / "zero/head.weight/fp32.pt"))), f
            assert torch.equal(tb, ref["lp"]["head.weight"].float()), f
            continue
        assert torch.equal(ta.reshape(-1), tb.reshape(-1)), f
        compared += 1
    assert compared >= 3 * len(TRAINABLE)
    for n in TRAINABLE:
        assert torch.equal(tensor_of(load(ours / f"zero/{n}/fp32.pt")), ref["model"][n]), n
        assert torch.equal(load(ours / f"zero/{n}/step.pt"), ref["optim"][n]["step"].float()), n
    osd = load(ours / "zero" / "optimizer_state.pt")
    def hyper(g):  # reference_live.pt keeps betas as a list, torch as a tuple
        return {k: list(v) if isinstance(v, tuple) else v for k, v in g.items() if k != "params"}

    assert [hyper(g) for g in osd["param_groups"]] == [hyper(g) for g in ref["param_groups"]]
    assert [g["params"] for g in osd["param_groups"]] == [[i] for i in range(len(ref["param_groups"]))]
    assert osd["optimizer_state_dict"]["param_groups"] == osd["param_groups"]
    assert osd["optimizer_state_dict"]["state"][0]["step"].item() == 3.0
    ms = load(ours / "mp_rank_00_model_states.pt")
    assert ms["dp_world_size"] == int(case[-1]) and ms["mp_world_size"] == 1
    assert (ms["global_steps"], ms["skipped_steps"]) == (3, 0)


def engine_load(load_root: Path, case: str, ws: int, out: Path, tag: str = TAG, native: bool = False) -> dict:
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH="")
    cmd = [str(DS_PY), str(REPO / "tests" / "ds_universal_load.py"), case, str(load_root), tag, str(ws), str(out)]
    if native:
        cmd.append("--native")
    if case.startswith("z3"):
        cmd.append("--fix-z3-step")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return torch.load(out, weights_only=False)


def assert_same_state(a: dict, b: dict, what: str) -> None:
    assert sorted(a) == sorted(b), what
    for n in a:
        for k in ("fp32", "exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a[n][k], b[n][k]), (what, n, k)


def assert_loaded_is_reference(loaded: dict, ref: dict) -> None:
    for n in TRAINABLE:
        assert torch.equal(loaded[n]["fp32"], ref["model"][n]), n
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded[n][k], ref["optim"][n][k]), (n, k)
        assert loaded[n]["step"].item() == ref["optim"][n]["step"].item(), n


# (case, world size loaded at): every stage and dtype, two param groups,
# more and fewer ranks than the source had.
RESUMES = [("z1_fp16_ws2", 3), ("z2_bf16_ws2", 3), ("z2_2groups_ws2", 1), ("z2_fp32_ws3", 2), ("z3_bf16_ws2", 3),
           ("z3_fp32_ws2", 1), ("z3_2groups_ws2", 3)]


@needs_deepspeed
@pytest.mark.parametrize("case,ws", RESUMES, ids=[f"{c}-to-ws{w}" for c, w in RESUMES])
def test_engine_loads_at_new_world_size(case, ws, testdata, tmp_path, run_ckptconv):
    write_ucp(run_ckptconv, testdata / "zero" / case, tmp_path / "ours")
    ours = engine_load(tmp_path / "ours", case, ws, tmp_path / "ours.pt")
    theirs = engine_load(testdata / "ucp" / case, case, ws, tmp_path / "theirs.pt")
    ref = torch.load(testdata / "zero" / case / "reference_live.pt", weights_only=False)
    assert_loaded_is_reference(ours["loaded"], ref)
    assert_same_state(ours["loaded"], theirs["loaded"], "loaded")
    assert_same_state(ours["after"], theirs["after"], "after two steps")
    assert ours["losses"] == theirs["losses"]
    assert (ours["global_steps"], ours["skipped_steps"]) == (5, 0)


# (source case, the engine's case (its ds_config), world size loaded at):
# the other ZeRO fixtures, whose ds_to_universal output is not kept. A
# round_robin_gradients run (z2_rr_ws2) loads into an engine without it:
# DeepSpeed 0.19.8's universal load misplaces values under
# round_robin_gradients even at the same world size, and its converter
# writes wrong values for such a run (docs/deepspeed.md).
MORE = [("z3_subgroups_ws2", "z3_subgroups_ws2", 3), ("bf16opt_ws2", "bf16opt_ws2", 3),
        ("z3_fp16_ws3", "z3_fp16_ws3", 2), ("z2_align_ws2", "z2_align_ws2", 1), ("z1_bf16_ws2", "z1_bf16_ws2", 3),
        ("z2_bf16_ws3", "z2_bf16_ws3", 2), ("z2_rr_ws2", "z2_bf16_ws2", 3),
        # Runs without ZeRO (stage 0): a stage-0 engine cannot load a universal
        # checkpoint (DeepSpeed 0.19.8 reads universal optimizer state only under
        # ZeRO), so a ZeRO engine of the same dtype resumes them at DP3.
        ("z0_fp32_ws2", "z2_fp32_ws3", 3), ("z0_fp16_ws2", "z1_fp16_ws2", 3)]


@needs_deepspeed
@pytest.mark.parametrize("case,engine_case,ws", MORE, ids=[f"{c}-to-ws{w}" for c, _, w in MORE])
def test_engine_loads_every_zero_variant(case, engine_case, ws, testdata, tmp_path, run_ckptconv):
    write_ucp(run_ckptconv, testdata / "zero" / case, tmp_path / "ours")
    got = engine_load(tmp_path / "ours", engine_case, ws, tmp_path / "ours.pt")
    assert_loaded_is_reference(got["loaded"], torch.load(testdata / "zero" / case / "reference_live.pt",
                                                         weights_only=False))
    assert (got["global_steps"], got["skipped_steps"]) == (5, 0)


@needs_deepspeed
def test_engine_resume_at_same_world_size_matches_native_resume(testdata, tmp_path, run_ckptconv):
    # An engine that loads the ZeRO checkpoint itself, in this run, and
    # takes the same two steps.
    case = "z2_bf16_ws2"
    write_ucp(run_ckptconv, testdata / "zero" / case, tmp_path / "ours")
    ours = engine_load(tmp_path / "ours", case, 2, tmp_path / "ours.pt")
    native = engine_load(testdata / "zero" / case, case, 2, tmp_path / "native.pt", tag="global_step3", native=True)
    assert_same_state(ours["loaded"], native["loaded"], "loaded")
    assert_same_state(ours["after"], native["after"], "after two steps")
    assert ours["losses"] == native["losses"]


@needs_deepspeed
def test_engine_restores_scheduler_counters_and_client_state(testdata, tmp_path, run_ckptconv):
    case = "z2_sched_ws2"
    write_ucp(run_ckptconv, testdata / "zero" / case, tmp_path / "ours")
    got = engine_load(tmp_path / "ours", case, 3, tmp_path / "ours.pt")
    assert_loaded_is_reference(got["loaded"], torch.load(testdata / "zero" / case / "reference_live.pt",
                                                         weights_only=False))
    assert got["lr_scheduler"] == {"last_batch_iteration": 4}  # 2 at save, two more steps
    assert (got["global_steps"], got["skipped_steps"]) == (5, 0)
    assert got["global_samples"] == 24 + 2 * 4 * 3  # 24 at save, then 4 per rank per step on 3 ranks
    for k, v in {"epoch": 2, "samples_seen": 96, "note": "resume-here"}.items():
        assert got["client_state"][k] == v, k


@needs_deepspeed
def test_zero_through_dcp_to_universal(testdata, tmp_path, run_ckptconv):
    # A DeepSpeed run migrated to DCP (what an FSDP2 job resumes from) and
    # back: the DCP directory's UCP loads like the direct one.
    case = "z3_bf16_ws2"
    r = run_ckptconv("reshard", str(testdata / "zero" / case), "-o", str(tmp_path / "dcp"), "--world-size", "3",
                     "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    write_ucp(run_ckptconv, tmp_path / "dcp", tmp_path / "via_dcp")
    write_ucp(run_ckptconv, testdata / "zero" / case, tmp_path / "direct")
    via = engine_load(tmp_path / "via_dcp", case, 2, tmp_path / "via.pt")
    direct = engine_load(tmp_path / "direct", case, 2, tmp_path / "direct.pt")
    assert_same_state(via["loaded"], direct["loaded"], "loaded")
    assert_same_state(via["after"], direct["after"], "after two steps")


@needs_deepspeed
def test_fsdp2_job_migrated_to_deepspeed_trains_on_identically(tmp_path, run_ckptconv):
    # An FSDP2 job (tests/fsdp_to_ds.py: fp32, torch AdamW, world size 2)
    # saves a DCP checkpoint after 3 steps and trains 2 more; ckptconv turns
    # the DCP checkpoint into a UCP, and DeepSpeed ZeRO-2 and ZeRO-3 fp32
    # engines with the same hyper-parameters load it at world size 2 and
    # take the same 2 steps on the same batches. The values agree to 1e-6:
    # both average fp32 gradients over 2 ranks, but through other
    # collectives (reduce-scatter, all-reduce) that may round differently on
    # another machine; on the development machine they are bit-equal.
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH="")
    r = subprocess.run([str(DS_PY), str(REPO / "tests" / "fsdp_to_ds.py"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    write_ucp(run_ckptconv, tmp_path / "dcp", tmp_path / "ucp")
    fsdp = torch.load(tmp_path / "fsdp_after.pt", weights_only=False)
    for case in ("z2_fp32_ws3", "z3_fp32_ws2"):  # their ds_config (fp32, stage 2 / 3), loaded at world size 2
        ds = engine_load(tmp_path / "ucp", case, 2, tmp_path / f"{case}.pt")
        for n in TRAINABLE:
            torch.testing.assert_close(ds["after"][n]["fp32"], fsdp["model"][n], rtol=0, atol=1e-6)
            for k in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(ds["after"][n][k], fsdp["optim"][n][k], rtol=0, atol=1e-6)
            assert ds["after"][n]["step"].item() == fsdp["optim"][n]["step"].item() == 5.0
        for got, want in zip(ds["losses"], fsdp["losses"], strict=True):
            assert got == pytest.approx(want, abs=1e-6)


def test_same_tensors_from_dcp_and_consolidated_pt(testdata, tmp_path, run_ckptconv):
    case = "z2_2groups_ws2"
    direct = write_ucp(run_ckptconv, testdata / "zero" / case, tmp_path / "direct")
    r = run_ckptconv("consolidate", str(testdata / "zero" / case), "-o", str(tmp_path / "full.pt"))
    assert r.returncode == 0, r.stderr
    via_pt = write_ucp(run_ckptconv, tmp_path / "full.pt", tmp_path / "via_pt")
    r = run_ckptconv("reshard", str(testdata / "zero" / case), "-o", str(tmp_path / "dcp"), "--world-size", "3",
                     "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    via_dcp = write_ucp(run_ckptconv, tmp_path / "dcp", tmp_path / "via_dcp")
    files = sorted(str(p.relative_to(direct)) for p in (direct / "zero").rglob("*.pt"))
    assert len(files) == 5 * 4 + 3 + 1
    for other in (via_pt, via_dcp):
        assert sorted(str(p.relative_to(other)) for p in (other / "zero").rglob("*.pt")) == files
        for f in files:
            if f == "zero/optimizer_state.pt":  # equal values; the pickle may memoize differently
                a, b = load(other / f), load(direct / f)
                assert a["param_groups"] == b["param_groups"], other
                assert a["optimizer_state_dict"]["state"] == b["optimizer_state_dict"]["state"], other
                continue
            # the per-parameter files hold only copied bytes: byte-identical
            assert (other / f).read_bytes() == (direct / f).read_bytes(), (other, f)


def test_python_int_step_and_refusals(tmp_path, run_ckptconv):
    w = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    sd = {"model": {"w": w, "b": torch.ones(3)},
          "optim": {"state": {"w": {"step": 7, "exp_avg": torch.full((2, 3), 0.5),
                                    "exp_avg_sq": torch.full((2, 3), 0.25)}},
                    "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["w"]}]},
          "epoch": 4}
    torch.save(sd, tmp_path / "full.pt")
    out = write_ucp(run_ckptconv, tmp_path / "full.pt", tmp_path / "ok")
    step = load(out / "zero/w/step.pt")
    assert step.dtype == torch.float32 and step.dim() == 0 and step.item() == 7.0
    fp32 = load(out / "zero/w/fp32.pt")
    assert list(fp32) == ["cat_dim", "param"] and fp32["param"].dtype == torch.float32
    assert torch.equal(fp32["param"], w.float())
    assert torch.equal(load(out / "zero/b/fp32.pt")["param"], torch.ones(3))  # no optimizer state: fp32 only
    osd = load(out / "zero/optimizer_state.pt")
    assert osd["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}]
    ms = load(out / "mp_rank_00_model_states.pt")
    assert ms["epoch"] == 4 and ms["dp_world_size"] == 1 and ms["global_steps"] == 0  # client state at top level

    def refused(src: Path, *extra, why: str) -> None:
        dest = tmp_path / "refused" / TAG
        dest.parent.mkdir(exist_ok=True)
        r = run_ckptconv("reshard", str(src), "-o", str(dest), "--layout", "deepspeed-universal", *extra)
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert why in r.stderr, r.stderr
        assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())

    refused(tmp_path / "full.pt", "--only", "model", why="training state dict with 'model' and 'optim'")
    r = run_ckptconv("reshard", str(tmp_path / "full.pt"), "-o", str(tmp_path / "x"), "--layout", "dcp")
    assert r.returncode == 2 and "--world-size N is required" in r.stderr, r.stderr  # only UCP needs none
    refused(tmp_path / "full.pt", "--dtype", "bf16", why="fp32 masters")
    hostile = {"model": {"../escape": torch.ones(2)},
               "optim": {"state": {"../escape": {"exp_avg": torch.ones(2)}}, "param_groups": [{"params": ["../escape"]}]}}
    torch.save(hostile, tmp_path / "hostile.pt")
    refused(tmp_path / "hostile.pt", why="cannot be a file or folder name")
    by_index = {"model": {"w": torch.ones(2)},
                "optim": {"state": {0: {"exp_avg": torch.ones(2)}}, "param_groups": [{"params": [0]}]}}
    torch.save(by_index, tmp_path / "by_index.pt")
    refused(tmp_path / "by_index.pt", why="keyed by parameter index")
    wrong_shape = {"model": {"w": torch.ones(2)},
                   "optim": {"state": {"w": {"exp_avg": torch.ones(3)}}, "param_groups": [{"params": ["w"]}]}}
    torch.save(wrong_shape, tmp_path / "wrong_shape.pt")
    refused(tmp_path / "wrong_shape.pt", why="has shape (3,), the parameter (2,)")
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())
    shutil.rmtree(tmp_path / "ok")


# ---- reading universal checkpoints ----

@pytest.mark.parametrize("case", CASES)
def test_reads_ds_to_universal_output_equal_to_its_zero_source(case, testdata, run_ckptconv):
    # model (trainable masters, frozen parameters and buffers as saved, tied
    # aliases), optimizer state, param_groups, counters and client state
    r = run_ckptconv("diff", str(testdata / "zero" / case), str(testdata / "ucp" / case))
    assert r.returncode == 0 and r.stdout.strip().endswith("equal"), r.stdout + r.stderr
    r = run_ckptconv("validate", str(testdata / "ucp" / case), "--finite", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["format"] == "deepspeed-universal" and report["status"] == "valid"


@pytest.mark.parametrize("case", CASES + ["z2_sched_ws2"])
def test_reads_own_output_equal_to_its_source(case, testdata, tmp_path, run_ckptconv):
    write_ucp(run_ckptconv, testdata / "zero" / case, tmp_path)
    # Frozen parameters are written as fp32 (fp32.pt, as ds_to_universal
    # does); the source keeps them in their low-precision dtype: equal
    # values, another dtype. Everything else is equal as is.
    r = run_ckptconv("diff", str(testdata / "zero" / case), str(tmp_path), "--ignore-dtype")
    assert r.returncode == 0 and r.stdout.strip().endswith("equal"), r.stdout + r.stderr
    r = run_ckptconv("diff", str(testdata / "zero" / case), str(tmp_path), "--json")
    differ = [t["path"] for t in json.loads(r.stdout)["tensors"] if not t["equal"]]
    assert differ in ([], ["model.frozen.weight"]), differ
    # consolidated, torch reads it; a universal checkpoint resharded to DCP keeps every tensor
    r = run_ckptconv("consolidate", str(tmp_path), "-o", str(tmp_path / "full.pt"))
    assert r.returncode == 0, r.stderr
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    ref = torch.load(testdata / "zero" / case / "reference_live.pt", weights_only=False)
    for n in TRAINABLE:
        assert torch.equal(full["model"][n], ref["model"][n]), n
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(full["optim"]["state"][n][k], ref["optim"][n][k]), (n, k)
    assert full["global_steps"] == 3
    r = run_ckptconv("reshard", str(tmp_path), "-o", str(tmp_path / "dcp"), "--world-size", "2", "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("diff", str(tmp_path / "dcp"), str(tmp_path / "full.pt"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_universal_to_universal_by_default(testdata, tmp_path, run_ckptconv):
    # a universal checkpoint's own layout is the default: rewritten, same files
    r = run_ckptconv("reshard", str(testdata / "ucp" / "z2_2groups_ws2"), "-o", str(tmp_path / TAG))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "latest_universal").read_bytes() == TAG.encode()
    r = run_ckptconv("diff", str(testdata / "ucp" / "z2_2groups_ws2"), str(tmp_path), "--ignore-dtype")
    assert r.returncode == 0, r.stdout + r.stderr


def copy_ucp(testdata: Path, dest: Path, case: str = "z2_bf16_ws2") -> Path:
    shutil.copytree(testdata / "ucp" / case, dest)
    return dest / TAG


def test_damaged_universal_checkpoints_are_refused(testdata, tmp_path, run_ckptconv):
    # truncated: exit 3 naming the file, nothing written
    tag = copy_ucp(testdata, tmp_path / "trunc")
    f = tag / "zero" / "l1.weight" / "exp_avg.pt"
    f.write_bytes(f.read_bytes()[:300])
    r = run_ckptconv("consolidate", str(tmp_path / "trunc"), "-o", str(tmp_path / "out.pt"))
    assert r.returncode == 3 and "l1.weight/exp_avg.pt" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()
    r = run_ckptconv("validate", str(tmp_path / "trunc"))  # a problem found: exit 1, naming the file
    assert r.returncode == 1 and "l1.weight/exp_avg.pt" in r.stdout and "INVALID" in r.stdout, r.stdout
    # a flipped byte in a tensor: the zip CRC catches it
    tag = copy_ucp(testdata, tmp_path / "flip")
    f = tag / "zero" / "l2.weight" / "fp32.pt"
    data = bytearray(f.read_bytes())
    pos = data.index(b"fp32/data/0") + 200
    data[pos] ^= 0xFF
    f.write_bytes(bytes(data))
    r = run_ckptconv("consolidate", str(tmp_path / "flip"), "-o", str(tmp_path / "out.pt"))
    assert r.returncode == 3 and "l2.weight/fp32.pt" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()
    # missing fp32.pt of a trainable parameter
    tag = copy_ucp(testdata, tmp_path / "missing")
    (tag / "zero" / "head.weight" / "fp32.pt").unlink()
    r = run_ckptconv("consolidate", str(tmp_path / "missing"), "-o", str(tmp_path / "out.pt"))
    assert r.returncode == 3 and "zero/head.weight/fp32.pt" in r.stderr, r.stderr
    # a param file's pickle that names os.system is never called
    tag = copy_ucp(testdata, tmp_path / "hostile")
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    buf = tag / "zero" / "l1.bias" / "exp_avg.pt"
    torch.save({"cat_dim": 0, "param": Evil()}, buf, pickle_protocol=2)
    r = run_ckptconv("consolidate", str(tmp_path / "hostile"), "-o", str(tmp_path / "out.pt"))
    assert r.returncode == 3 and "system" in r.stderr and "l1.bias/exp_avg.pt" in r.stderr, r.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out.pt").exists()
    del pickle
    # a symlinked parameter file pointing outside the checkpoint is refused
    tag = copy_ucp(testdata, tmp_path / "link")
    outside = tmp_path / "outside.pt"
    shutil.copy(tag / "zero" / "out_bias" / "fp32.pt", outside)
    (tag / "zero" / "out_bias" / "fp32.pt").unlink()
    (tag / "zero" / "out_bias" / "fp32.pt").symlink_to(outside)
    r = run_ckptconv("consolidate", str(tmp_path / "link"), "-o", str(tmp_path / "out.pt"))
    assert r.returncode == 3 and "out_bias/fp32.pt" in r.stderr, r.stderr
    assert not (tmp_path / "out.pt").exists()


def test_parts_write_the_single_process_files(testdata, tmp_path, ckptconv, run_ckptconv):
    # --part I/N: each worker writes its share of the tensors into shared
    # files; the one completing the set publishes the folder and
    # latest_universal. Same files, byte for byte, as one process writes.
    src = testdata / "zero" / "z3_2groups_ws2"
    single = write_ucp(run_ckptconv, src, tmp_path / "single")
    out = tmp_path / "parted" / TAG
    out.parent.mkdir()

    def part(i: int) -> subprocess.Popen:
        return subprocess.Popen([str(ckptconv), "reshard", str(src), "-o", str(out), "--layout", "deepspeed-universal",
                                 "--part", f"{i}/3"], stderr=subprocess.PIPE, text=True)

    procs = [part(0), part(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert not out.exists() and not (out.parent / "latest_universal").exists()  # part 1 has not run
    # The worker elected to finalize dies: `ckptconv finalize OUT` completes
    # the output from the stored request (which has no --world-size).
    (folder,) = out.parent.glob(TAG + ".parts-*")
    (folder / "finalizing").touch()
    last = part(1)
    assert last.wait(timeout=120) == 0 and "another worker is finalizing" in last.stderr.read()
    assert not out.exists()
    r = run_ckptconv("finalize", str(out))
    assert r.returncode == 0 and "finalized 3 parts" in r.stderr, r.stderr
    files = sorted(str(p.relative_to(single.parent)) for p in single.parent.rglob("*") if p.is_file())
    assert sorted(str(p.relative_to(out.parent)) for p in out.parent.rglob("*") if p.is_file()) == files
    for f in files:
        assert (out.parent / f).read_bytes() == (single.parent / f).read_bytes(), f


@pytest.mark.parametrize("src", ["fsdp_st/adamw_ws2", "fsdp_dt/adamw_ws3", "dcp/fsdp2_adamw_ws2"])
def test_fsdp_sources_to_universal_and_back(src, testdata, tmp_path, run_ckptconv):
    # per-rank ShardedTensor / DTensor files and an FSDP2 DCP directory (real
    # torch jobs): the UCP reads back as the source, plus the two counters a
    # DeepSpeed engine requires (0: the source has none)
    write_ucp(run_ckptconv, testdata / src, tmp_path)
    r = run_ckptconv("diff", str(testdata / src), str(tmp_path), "--json")
    report = json.loads(r.stdout)
    assert [t["path"] for t in report["tensors"] if not t["equal"]] == [], r.stdout
    assert sorted(report["only_in_b"]) == ["global_steps", "skipped_steps"], report["only_in_b"]
    assert report["only_in_a"] == [], report["only_in_a"]
    ms = load(tmp_path / TAG / "mp_rank_00_model_states.pt")
    assert (ms["global_steps"], ms["skipped_steps"], ms["dp_world_size"]) == (0, 0, int(src[-1]))


@pytest.mark.parametrize("cat_dim", [2, 5])
def test_a_cat_dim_past_the_parameters_dimensions_is_refused(cat_dim, testdata, tmp_path, run_ckptconv):
    """ds_to_universal records the dimension a tensor-parallel loader cuts a
    parameter on; one past a 2-D parameter's dimensions (torch.chunk raises
    there) was read with exit 0 and written on into every universal output."""
    src = tmp_path / "ucp"
    shutil.copytree(testdata / "ucp" / "z2_bf16_ws2", src)
    f = src / "global_step3_universal" / "zero" / "l1.weight" / "fp32.pt"
    d = torch.load(f, weights_only=False)
    assert d["param"].dim() == 2
    d["cat_dim"] = cat_dim
    torch.save(d, f)
    with pytest.raises(IndexError):
        d["param"].chunk(2, cat_dim)  # what DeepSpeed's loader does at TP 2
    r = run_ckptconv("reshard", src, "-o", tmp_path / "out", "--world-size", "2", "--layout", "dcp")
    assert r.returncode == 3 and "l1.weight/fp32.pt" in r.stderr and f"cat_dim {cat_dim}" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    r = run_ckptconv("validate", src)
    assert r.returncode == 1 and f"cat_dim {cat_dim}" in r.stdout, r.stdout + r.stderr
