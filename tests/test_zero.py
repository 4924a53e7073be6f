"""DeepSpeed ZeRO checkpoints (testdata/zero, written by real DeepSpeed
0.19.8 through tools/make_zero_checkpoints.py): consolidate, --only model,
every output format, reshard, diff, inspect, validate and bad input, against
the live engine's fp32 masters and optimizer state (reference_live.pt) and
DeepSpeed's own zero_to_fp32 output (reference_fp32.pt)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

ZERO = Path(__file__).resolve().parent.parent / "testdata" / "zero"
CASES = sorted(p.name for p in ZERO.iterdir() if (p / "latest").exists())


def _equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("case", CASES)
def test_consolidate_equals_the_live_engine(case, tmp_path, run_ckptconv):
    """Trainable weights are the engine's fp32 masters, the AdamW state
    (step, exp_avg, exp_avg_sq) is the engine's, per parameter by FQN, and
    param_groups hold the hyper-parameters and FQNs in module order, bit for
    bit: stages 1-3, bf16/fp16/fp32, world sizes 2 and 3, BF16_Optimizer,
    round-robin gradients, alignment padding, two param groups."""
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", ZERO / case, "-o", out)
    assert r.returncode == 0, r.stderr
    full = torch.load(out, weights_only=True)
    live = torch.load(ZERO / case / "reference_live.pt", weights_only=True)
    # A case saved with a scheduler and client_state (case.json training_state) also has them.
    saved_with = json.loads((ZERO / case / "case.json").read_text()).get("training_state")
    assert set(full) == {"model", "optim", "global_steps", "global_samples", "skipped_steps"} | (
        {"lr_scheduler", "client_state"} if saved_with else set())
    for name, want in live["model"].items():
        assert _equal(full["model"][name], want), name
    assert set(full["optim"]["state"]) == set(live["optim"])
    for name, state in live["optim"].items():
        got = full["optim"]["state"][name]
        assert list(got) == ["step", "exp_avg", "exp_avg_sq"], name  # torch AdamW's own order
        for key, want in state.items():
            assert _equal(got[key], want), (name, key)
    groups = [{**g, "betas": list(g["betas"])} for g in full["optim"]["param_groups"]]
    assert groups == live["param_groups"]


@pytest.mark.parametrize("case", [c for c in CASES if (ZERO / c / "reference_fp32.pt").exists()])
def test_only_model_is_zero_to_fp32_bit_for_bit(case, tmp_path, run_ckptconv):
    """--only model writes what zero_to_fp32 writes on every key it writes
    (frozen parameters in their saved dtype, buffers, tied aliases), plus the
    frozen parameters zero_to_fp32 omits at ZeRO-1 (taken from `module`)."""
    out = tmp_path / "model.pt"
    r = run_ckptconv("consolidate", ZERO / case, "--only", "model", "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)
    ref = torch.load(ZERO / case / "reference_fp32.pt", weights_only=True)
    for name, want in ref.items():
        assert _equal(got[name], want), name
    extra = set(got) - set(ref)
    assert extra == ({"frozen.weight"} if case.startswith("z1_") else set())
    # the tied alias is one tensor with its owner, as in the module
    assert got["head_tied.weight"].data_ptr() == got["head.weight"].data_ptr()


@pytest.mark.parametrize("fmt", ["safetensors", "h5"])
def test_every_output_format(fmt, tmp_path, run_ckptconv):
    case = ZERO / "z3_bf16_ws2"
    ref = torch.load(case / "reference_live.pt", weights_only=True)["model"]
    out = tmp_path / f"model.{fmt}"
    r = run_ckptconv("consolidate", case, "-o", out)
    assert r.returncode == 0, r.stderr
    if fmt == "safetensors":
        from safetensors.torch import load_file
        got = load_file(out)
        names = {k.removeprefix("model."): v for k, v in got.items() if k.startswith("model.")}
        # safetensors holds a tensor once: the tied alias is the owner's entry
        names.setdefault("head_tied.weight", names["head.weight"])
    else:
        import h5py
        with h5py.File(out, "r") as f:
            names = {k: torch.from_numpy(f["model"][k][()]) for k in ref if k in f["model"]}
    for name, want in ref.items():
        assert torch.equal(names[name], want), name


def test_bf16_dtype_cast_and_keys(tmp_path, run_ckptconv):
    case = ZERO / "z2_fp32_ws3"
    out = tmp_path / "w.pt"
    r = run_ckptconv("consolidate", case, "--only", "model", "--keys", r"^l1\.", "--dtype", "bf16", "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)
    ref = torch.load(case / "reference_live.pt", weights_only=True)["model"]
    assert sorted(got) == ["l1.bias", "l1.weight"]
    for k in got:
        assert torch.equal(got[k], ref[k].to(torch.bfloat16))


@pytest.mark.parametrize("layout", ["dcp", "fsdp-dtensor"])
def test_reshard_to_fsdp_layouts_round_trips(layout, tmp_path, run_ckptconv):
    """A ZeRO run migrated to FSDP layouts at another world size holds the
    same values (diff against the ZeRO source is equal)."""
    case = ZERO / "z3_fp16_ws3"
    dst = tmp_path / "dst"
    r = run_ckptconv("reshard", case, "-o", dst, "--world-size", "2", "--layout", layout)
    assert r.returncode == 0, r.stderr
    keys = []
    if layout != "dcp":  # per-rank files hold a model and an optimizer state dict: the run's counters are left out, said so
        assert "not written: global_steps global_samples skipped_steps" in r.stderr, r.stderr
        keys = ["--keys", r"^(model|optim)(\.|$)"]
    r = run_ckptconv("diff", case, dst, *keys)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 differ" in r.stdout


def test_inspect_and_validate_name_the_source(run_ckptconv):
    r = run_ckptconv("inspect", ZERO / "z3_bf16_ws2")
    assert r.returncode == 0, r.stderr
    assert "deepspeed-zero" in r.stdout and "zero_stage: 3" in r.stdout
    r = run_ckptconv("validate", ZERO / "z2_bf16_ws3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "world size 3" in r.stdout and "VALID" in r.stdout


def _copy(case: str, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / case
    shutil.copytree(ZERO / case, root)
    return root, root / "global_step3"


def test_missing_rank_file_is_named(tmp_path, run_ckptconv):
    root, tag = _copy("z2_bf16_ws3", tmp_path)
    (tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    r = run_ckptconv("consolidate", root, "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert "rank 1 of 3 is missing" in r.stderr and "zero_pp_rank_1" in r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_truncated_partition_is_named_and_nothing_written(tmp_path, run_ckptconv):
    root, tag = _copy("z3_bf16_ws2", tmp_path)
    victim = tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    r = run_ckptconv("consolidate", root, "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert victim.name in r.stderr
    assert not (tmp_path / "o.pt").exists()
    r = run_ckptconv("validate", root)
    assert r.returncode in (1, 3) and victim.name in r.stdout + r.stderr


def test_files_of_two_world_sizes_are_refused(tmp_path, run_ckptconv):
    root, tag = _copy("z2_bf16_ws2", tmp_path)
    other = ZERO / "z2_bf16_ws3" / "global_step3" / "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"
    shutil.copy(other, tag)
    r = run_ckptconv("consolidate", root, "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert "partition_count 2 but 3 optimizer files" in r.stderr


def test_files_of_two_tags_are_refused(tmp_path, run_ckptconv):
    """Rank 1's optimizer file as a later tag would have it: the same shapes,
    AdamW's step 5 instead of 3 (the 4-byte fp32 record data/0, rewritten
    with its CRC, as torch.save would write it)."""
    import struct

    from pt_files import replace_record
    root, tag = _copy("z2_bf16_ws2", tmp_path)
    victim = tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    replace_record(victim, "data/0", struct.pack("<f", 5.0))
    r = run_ckptconv("consolidate", root, "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert victim.name in r.stderr and "'step' of group 0 differs from rank 0's" in r.stderr
    assert not (tmp_path / "o.pt").exists()
    r = run_ckptconv("validate", root)
    assert r.returncode == 1 and "two tags" in r.stdout, r.stdout + r.stderr


def test_a_tensor_parallel_rank_without_optimizer_files_is_exit_3(tmp_path, run_ckptconv):
    """An mp_rank_01 model-states file reads as a second tensor-parallel rank
    (docs/deepspeed.md), whose optimizer files must be there."""
    root, tag = _copy("z2_bf16_ws2", tmp_path)
    shutil.copy(tag / "mp_rank_00_model_states.pt", tag / "mp_rank_01_model_states.pt")
    r = run_ckptconv("inspect", root)
    assert r.returncode == 3, r.stderr
    assert "no *_mp_rank_01_optim_states.pt files" in r.stderr


def test_tag_directory_latest_and_tag_option(tmp_path, run_ckptconv):
    """SRC may be the root (the tag `latest` names, or --tag's) or the tag directory."""
    a = run_ckptconv("inspect", ZERO / "z1_bf16_ws2")
    b = run_ckptconv("inspect", ZERO / "z1_bf16_ws2" / "global_step3")
    assert a.returncode == b.returncode == 0
    assert a.stdout.splitlines()[1:] == b.stdout.splitlines()[1:]
    root, tag = _copy("z1_bf16_ws2", tmp_path)
    shutil.copytree(tag, root / "global_step9")
    (root / "global_step9" / "mp_rank_00_model_states.pt").unlink()
    assert run_ckptconv("inspect", root).returncode == 0
    r = run_ckptconv("inspect", root, "--tag", "global_step9")
    assert r.returncode == 3 and "global_step9" in r.stderr, r.stderr
    r = run_ckptconv("inspect", root, "--tag", "global_step7")
    assert r.returncode == 3 and "no tag directory 'global_step7'" in r.stderr, r.stderr


def test_inspect_of_a_deepspeed_folder_lists_every_tag(tmp_path, run_ckptconv):
    """#30 row 6: global_step2, global_step3 (named by `latest`) and a
    half-written global_step4 (its optimizer files never written): inspect
    lists all three as other folders are listed, which is complete, and which
    one `latest` names; reading the folder still reads what `latest` names."""
    tag = ZERO / "z2_bf16_ws2" / "global_step3"
    root = tmp_path / "ds"
    root.mkdir()
    for step in (2, 3, 4):
        shutil.copytree(tag, root / f"global_step{step}")
    for f in (root / "global_step4").glob("*optim_states.pt"):
        f.unlink()
    (root / "latest").write_text("global_step3")
    r = run_ckptconv("inspect", root)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "a folder of 3 checkpoints" in lines[0], r.stdout
    assert "global_step2" in lines[1] and "complete" in lines[1] and "world size 2" in lines[1], r.stdout
    assert "global_step3" in lines[2] and lines[2].endswith("<- latest"), r.stdout
    assert "global_step4" in lines[3] and "INCOMPLETE" in lines[3], r.stdout
    listed = json.loads(run_ckptconv("inspect", root, "--json").stdout)["checkpoints"]
    assert [(c["name"], c["complete"], c["latest"], c["world_size"]) for c in listed] == [
        ("global_step2", True, False, 2), ("global_step3", True, True, 2), ("global_step4", False, False, None)]
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", root, "-o", out)
    assert r.returncode == 0, r.stderr
    assert run_ckptconv("diff", out, ZERO / "z2_bf16_ws2").returncode == 0


def test_a_folder_of_stage0_tags_lists_them_complete_by_what_their_model_file_says(tmp_path, run_ckptconv):
    """A tag without ZeRO has the file names of a ZeRO save that died before
    its optimizer files (mp_rank_SS_model_states.pt alone): the listing reads
    mp_rank_00's `optimizer` entry to tell them apart. Stage-0 fp32, fp16 and
    a pipeline's tags are complete; a ZeRO-2 tag whose optimizer files are
    gone (`optimizer` None in the same-named file) stays incomplete, and
    --tag latest with no `latest` file reads the highest complete one."""
    root = tmp_path / "ds"
    root.mkdir()
    parallel = ZERO.parent / "zero_parallel"
    for step, src in ((1, ZERO / "z0_fp32_ws2"), (2, ZERO / "z0_fp16_ws2"), (3, parallel / "pp2_z0_fp32_ws2"),
                      (4, ZERO / "z2_bf16_ws2")):
        shutil.copytree(src / "global_step3", root / f"global_step{step}")
    for f in (root / "global_step4").glob("*optim_states.pt"):
        f.unlink()
    assert sorted(p.name for p in (root / "global_step4").iterdir()) == ["mp_rank_00_model_states.pt"]
    assert torch.load(root / "global_step4" / "mp_rank_00_model_states.pt", weights_only=False)["optimizer"] is None
    listed = json.loads(run_ckptconv("inspect", root, "--json").stdout)["checkpoints"]
    assert [(c["name"], c["complete"], c["world_size"]) for c in listed] == [
        ("global_step1", True, 2), ("global_step2", True, 2), ("global_step3", True, 2),
        ("global_step4", False, None)]
    r = run_ckptconv("inspect", root)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "global_step3" in lines[3] and "world size 2" in lines[3] and lines[3].endswith("complete"), r.stdout
    assert "global_step4" in lines[4] and "INCOMPLETE (a rank's files are missing)" in lines[4], r.stdout
    r = run_ckptconv("validate", root, "--tag", "latest")
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr
    assert f"reading {root / 'global_step3'} " in r.stderr, r.stderr
    r = run_ckptconv("validate", root / "global_step1")
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr
    r = run_ckptconv("validate", root / "global_step4")
    assert r.returncode == 1 and "no optimizer state in mp_rank_00_model_states.pt" in r.stdout, r.stdout + r.stderr


def test_stage0_inspect_and_validate_say_what_it_is(run_ckptconv):
    """Without ZeRO (z0_*: tools/make_zero0_checkpoints.py) the optimizer state
    is in mp_rank_00_model_states.pt: inspect names the stage and the fp16
    wrapper and how its positions were mapped to parameters."""
    r = run_ckptconv("inspect", ZERO / "z0_fp16_ws2")
    assert r.returncode == 0, r.stderr
    assert "zero_stage: 0 (no ZeRO: optimizer state in mp_rank_00_model_states.pt)" in r.stdout
    assert "optimizer: FP16_UnfusedOptimizer (fp32 masters in fp32_groups, loss scale 256)" in r.stdout
    assert "5 mapped to module parameters by masters equal to the module's fp16 values" in r.stdout
    r = run_ckptconv("inspect", ZERO / "z0_fp32_ws2")
    assert r.returncode == 0, r.stderr
    assert "a torch optimizer's state_dict; fp32 masters are the module's weights" in r.stdout
    assert "6 mapped to module parameters by position order = module order" in r.stdout
    r = run_ckptconv("validate", ZERO / "z0_fp32_ws2")
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr


def test_stage0_exclude_frozen_where_the_files_say_what_was_frozen(tmp_path, run_ckptconv):
    """FP16_UnfusedOptimizer holds the trainable parameters only: the one it
    does not hold was frozen. A torch optimizer (fp32) held frozen.weight too,
    without state, so those files do not say: --exclude-frozen is refused."""
    out = tmp_path / "m.pt"
    r = run_ckptconv("consolidate", ZERO / "z0_fp16_ws2", "--only", "model", "--exclude-frozen", "-o", out)
    assert r.returncode == 0, r.stderr
    live = torch.load(ZERO / "z0_fp16_ws2" / "reference_live.pt", weights_only=True)
    assert set(torch.load(out, weights_only=True)) == set(live["model"]) | set(live["tied"]) | set(live["buffers"])
    r = run_ckptconv("consolidate", ZERO / "z0_fp32_ws2", "--only", "model", "--exclude-frozen", "-o", out)
    assert r.returncode == 2 and "does not record which parameters were frozen" in r.stderr, r.stderr


def test_stage0_positions_the_files_do_not_determine_are_exit_3(tmp_path, run_ckptconv):
    """fp32 at stage 0: nothing names the optimizer's positions. Without the
    frozen parameter's position, head.weight's could be frozen.weight's (both
    5x11, in module order either way): refused, never guessed."""
    root, tag = _copy("z0_fp32_ws2", tmp_path)
    f = tag / "mp_rank_00_model_states.pt"
    ms = torch.load(f, weights_only=False)
    assert ms["optimizer"]["param_groups"][0]["params"] == [0, 1, 2, 3, 4, 5] and 4 not in ms["optimizer"]["state"]
    ms["optimizer"]["param_groups"][0]["params"] = [0, 1, 2, 3, 5]
    torch.save(ms, f)
    r = run_ckptconv("consolidate", root, "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert "the optimizer holds 5 parameters, the module 6; more than one way" in r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_a_zero_checkpoint_without_its_optimizer_files_is_exit_3(tmp_path, run_ckptconv):
    root, tag = _copy("z2_fp32_ws3", tmp_path)
    for p in tag.glob("*_optim_states.pt"):
        p.unlink()
    r = run_ckptconv("consolidate", root, "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert "no *_mp_rank_00_optim_states.pt files" in r.stderr
    assert "no optimizer state in mp_rank_00_model_states.pt" in r.stderr
    assert not (tmp_path / "o.pt").exists()
