"""DeepSpeed checkpoints beyond data parallelism (testdata/zero_parallel,
written by real DeepSpeed 0.19.8 through tools/make_zero_parallel_checkpoints.py):
pipeline-parallel runs (deepspeed.pipe.PipelineModule) at 2 stages x 1 and
2 x 2 data-parallel ranks, and MoE runs (deepspeed.moe.layer.MoE, 4 experts
over 2 expert-parallel ranks) at ZeRO-1 and ZeRO-2. Consolidations are
checked against the live engines' fp32 masters, AdamW state and module
state (reference_live.pt); missing and truncated files against the
documented exit codes."""

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
PARALLEL = REPO / "testdata" / "zero_parallel"
DS_PY = REPO / ".venv-deepspeed" / "bin" / "python"
CASES = sorted(p.name for p in PARALLEL.iterdir() if (p / "latest").exists())
PPTP_CASE = "pp2_tp2_dp2_fp32_ws8_ucinfo"
PPTP1_CASE = "pp2_tp1_dp1_fp32_ws2_ucinfo"  # the same model at TP1, its patterns recorded
PIPE_CASES = [c for c in CASES if c.startswith("pp") and c not in (PPTP_CASE, PPTP1_CASE)]
MOE_CASES = [c for c in CASES if c.startswith("moe")]
TAG = "global_step3"
TP_CASE = "tp2_dp2_fp32_ws4_ucinfo"
TP1_CASE = "tp1_dp2_fp32_ws2_ucinfo"  # the same block at TP1: one mp_rank_00, the patterns recorded


def _equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def assert_is_live_masters_and_adam(full: dict, live: dict) -> None:
    """A consolidation's model and AdamW state against reference_live.pt's
    merged values, bit for bit."""
    for name, want in live["model"].items():
        assert _equal(full["model"][name], want), name
    for name, state in live["optim"].items():
        got = full["optim"]["state"][name]
        assert list(got) == ["step", "exp_avg", "exp_avg_sq"], name
        for key, want in state.items():
            assert _equal(got[key], want), (name, key)


def _copy(case: str, tmp_path: Path) -> Path:
    dst = tmp_path / case
    shutil.copytree(PARALLEL / case, dst)
    return dst


def test_the_fixtures_are_pipeline_and_moe_runs():
    assert PIPE_CASES == ["pp2_dp2_bf16_ws4", "pp2_fp32_ws2", "pp2_z0_fp32_ws2"]  # the last without ZeRO
    assert MOE_CASES == ["moe_z1_fp32_ws2_ep2", "moe_z2_bf16_ws4_ep2"]
    for case in MOE_CASES:
        names = sorted(p.name for p in (PARALLEL / case / TAG).iterdir())
        assert [n for n in names if "expert" in n] == [
            f"layer_0_expert_{e}_mp_rank_00_model_states.pt" for e in range(4)]
    assert set(CASES) == set(PIPE_CASES) | set(MOE_CASES) | {"tp2_fp32_ws2", TP_CASE, TP1_CASE, PPTP_CASE,
                                                                   PPTP1_CASE}
    for case in PIPE_CASES:
        info = json.loads((PARALLEL / case / "case.json").read_text())
        assert info["pipeline_stages"] == 2 and info["ds_version"] == "0.19.8"
        names = sorted(p.name for p in (PARALLEL / case / TAG).iterdir())
        assert [n for n in names if n.startswith("layer_")] == [
            f"layer_{i:02d}-model_states.pt" for i in (0, 1, 3, 4, 5)]


@pytest.mark.parametrize("case", PIPE_CASES)
def test_pipeline_consolidates_to_the_live_engines(case, tmp_path, run_ckptconv):
    """Every stage's fp32 masters and AdamW state (step, exp_avg, exp_avg_sq),
    bit for bit, under the PipelineModule's own state_dict() names ("LL.k",
    LL the global layer index); frozen parameters and buffers as the layer
    files hold them; one param group listing every stage's parameters."""
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", PARALLEL / case, "-o", out)
    assert r.returncode == 0, r.stderr
    full = torch.load(out, weights_only=True)
    live = torch.load(PARALLEL / case / "reference_live.pt", weights_only=True)
    assert set(full) == {"model", "optim", "global_steps", "global_samples", "skipped_steps"}
    assert full["global_steps"] == 3
    # the names and order of the stages' module state dicts, stage after stage
    assert list(full["model"]) == list(live["module_state"])
    assert {n.split(".")[0] for n in full["model"]} == {"0", "1", "3", "4", "5"}
    assert set(live["stage_of"].values()) == {0, 1}
    for name, want in live["model"].items():
        assert _equal(full["model"][name], want), name
    for name, want in live["module_state"].items():
        if name not in live["model"]:  # 4.gate.weight (frozen), 4.scale (buffer)
            assert _equal(full["model"][name], want), name
    assert set(full["optim"]["state"]) == set(live["optim"])
    for name, state in live["optim"].items():
        got = full["optim"]["state"][name]
        assert list(got) == ["step", "exp_avg", "exp_avg_sq"], name
        for key, want in state.items():
            assert _equal(got[key], want), (name, key)
    (group,) = full["optim"]["param_groups"]
    assert group["params"] == list(live["model"])
    assert group["lr"] == 0.01 and group["weight_decay"] == 0.01


def test_inspect_shows_the_parallel_degrees(run_ckptconv):
    case = PARALLEL / "pp2_dp2_bf16_ws4"
    r = run_ckptconv("inspect", case)
    assert r.returncode == 0, r.stderr
    assert "  parallelism: data 2, pipeline 2, tensor 1, expert 1\n" in r.stdout
    r = run_ckptconv("inspect", case, "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["parallelism"] == {"data": 2, "pipeline": 2, "tensor": 1, "expert": 1}
    r = run_ckptconv("inspect", PARALLEL / "pp2_fp32_ws2")
    assert "  parallelism: data 1, pipeline 2, tensor 1, expert 1\n" in r.stdout


def test_validate_accepts_every_stage_and_counts_the_world_size(run_ckptconv):
    r = run_ckptconv("validate", PARALLEL / "pp2_dp2_bf16_ws4", "--expect-world-size", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_ckptconv("validate", PARALLEL / "pp2_dp2_bf16_ws4", "--expect-world-size", "2")
    assert r.returncode == 1, r.stdout + r.stderr


def assert_missing_files_named(case, missing, named, tmp_path, run_ckptconv):
    """The case with `missing` files removed: consolidate is exit 3 naming
    what is missing and writes nothing; validate fails naming it."""
    src = _copy(case, tmp_path)
    for name in missing:
        (src / TAG / name).unlink()
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    assert named in r.stderr
    assert not out.exists() and not list(tmp_path.glob("out.pt*"))
    r = run_ckptconv("validate", src)
    assert r.returncode == 1, r.stdout + r.stderr
    assert named in r.stdout + r.stderr


@pytest.mark.parametrize("missing, named", [
    ("layer_04-model_states.pt", "the layer file layer_04-model_states.pt of pipeline stage 1 is missing"),
    ("layer_00-model_states.pt", "the layer file layer_00-model_states.pt of pipeline stage 0 is missing"),
    ("bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt", "pipeline stage 1 (mp_rank_01) has 1 optimizer files, stage 0 2"),
    ("bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt",
     "the optimizer file of rank 0 of 2 is missing (*zero_pp_rank_0_mp_rank_01_optim_states.pt)"),
    ("mp_rank_01_model_states.pt", "no mp_rank_01_model_states.pt"),
])
def test_a_missing_file_is_exit_3_naming_it_and_writes_nothing(missing, named, tmp_path, run_ckptconv):
    assert_missing_files_named("pp2_dp2_bf16_ws4", [missing], named, tmp_path, run_ckptconv)


def test_a_whole_missing_stage_is_named_from_pp_degree(tmp_path, run_ckptconv):
    """Every file of the last stage gone: stage 0's model states still say
    pp_degree 2, so the checkpoint is not read as a one-stage pipeline."""
    src = _copy("pp2_fp32_ws2", tmp_path)
    for p in (src / TAG).glob("*mp_rank_01*"):
        p.unlink()
    for layer in ("03", "04", "05"):
        (src / TAG / f"layer_{layer}-model_states.pt").unlink()
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert "pp_degree 2 but the files of 1 pipeline stage(s) are here (mp_rank_01_model_states.pt missing)" in r.stderr


def test_a_truncated_layer_file_is_exit_3_naming_it(tmp_path, run_ckptconv):
    src = _copy("pp2_fp32_ws2", tmp_path)
    layer = src / TAG / "layer_03-model_states.pt"
    layer.write_bytes(layer.read_bytes()[:700])
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    assert "layer_03-model_states.pt" in r.stderr
    assert not out.exists()
    r = run_ckptconv("validate", src)
    assert r.returncode == 1 and "layer_03-model_states.pt" in r.stdout + r.stderr


def test_a_layer_file_of_the_wrong_shape_is_named(tmp_path, run_ckptconv):
    """A layer file from another model: its tensor's shape is not the one
    param_shapes gives the parameter."""
    src = _copy("pp2_fp32_ws2", tmp_path)
    shutil.copy(src / TAG / "layer_00-model_states.pt", src / TAG / "layer_01-model_states.pt")
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert "layer_01-model_states.pt" in r.stderr or "'1.bias'" in r.stderr


def test_layer_files_with_and_without_a_tensor_axis_are_refused_precisely(tmp_path, run_ckptconv):
    src = _copy("pp2_fp32_ws2", tmp_path)
    (src / TAG / "layer_00-model_states.pt").rename(src / TAG / "layer_00-model_01-model_states.pt")
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert ("layer files with a tensor-parallel rank (layer_00-model_01-model_states.pt) beside layer files "
            "without (layer_01-model_states.pt): files of two runs mixed") in r.stderr


@pytest.mark.parametrize("layout", ["dcp", "fsdp-dtensor"])
def test_a_pipeline_run_reshards_to_fsdp(layout, tmp_path, run_ckptconv):
    """The stages' state, resharded for 3 FSDP ranks and consolidated back,
    is the same state: nothing of a stage is lost on the way."""
    case = PARALLEL / "pp2_dp2_bf16_ws4"
    dst = tmp_path / "resharded"
    r = run_ckptconv("reshard", case, "-o", dst, "--world-size", "3", "--layout", layout)
    assert r.returncode == 0, r.stderr
    # per-rank FSDP files hold a model and an optimizer only (docs/deepspeed.md)
    only = ["--only", "model"] if layout == "fsdp-dtensor" else []
    r = run_ckptconv("diff", case, dst, *only)
    assert r.returncode == 0, r.stdout + r.stderr
    if only:
        r = run_ckptconv("diff", case, dst, "--only", "optim")
        assert r.returncode == 0, r.stdout + r.stderr


EXPERT = "moe.deepspeed_moe.experts.deepspeed_experts.{}.{}"


@pytest.mark.parametrize("case", MOE_CASES)
def test_moe_consolidates_to_the_live_engines(case, tmp_path, run_ckptconv):
    """Every expert by its global index (expert-parallel rank x local
    experts + local index, as DeepSpeed names the expert files), placed in
    the module where the MoE layer has it; the masters and AdamW state of
    dense and expert parameters bit for bit, though each expert group is
    partitioned over its own expert-data-parallel ranks."""
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", PARALLEL / case, "-o", out)
    assert r.returncode == 0, r.stderr
    full = torch.load(out, weights_only=True)
    live = torch.load(PARALLEL / case / "reference_live.pt", weights_only=True)
    experts = [EXPERT.format(e, k) for e in range(4) for k in ("weight", "bias")]
    assert list(full["model"]) == ["inp.weight", "inp.bias", "moe.deepspeed_moe.gate.wg.weight", *experts,
                                   "out.weight", "out.bias"]
    assert list(full["model"]) == list(live["module_state"])
    assert set(live["model"]) == set(full["model"])
    for name, want in live["model"].items():
        assert _equal(full["model"][name], want), name
    for name, state in live["optim"].items():
        got = full["optim"]["state"][name]
        for key, want in state.items():
            assert _equal(got[key], want), (name, key)
    dense, moe = full["optim"]["param_groups"]
    assert dense["name"] == "dense" and moe["name"] == "ep_size_2" and moe["moe"] is True
    assert moe["params"] == experts
    assert dense["params"] == [n for n in full["model"] if ".deepspeed_experts." not in n]


def test_inspect_shows_the_expert_degree(run_ckptconv):
    r = run_ckptconv("inspect", PARALLEL / "moe_z2_bf16_ws4_ep2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["parallelism"] == {"data": 4, "pipeline": 1, "tensor": 1, "expert": 2}
    r = run_ckptconv("validate", PARALLEL / "moe_z2_bf16_ws4_ep2", "--expect-world-size", "4")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_missing_expert_file_is_exit_3_naming_it(tmp_path, run_ckptconv):
    src = _copy("moe_z2_bf16_ws4_ep2", tmp_path)
    (src / TAG / "layer_0_expert_2_mp_rank_00_model_states.pt").unlink()
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    named = "the expert file layer_0_expert_2_mp_rank_00_model_states.pt (expert 2 of 4 of MoE layer 0) is missing"
    assert named in r.stderr
    assert not out.exists() and not list(tmp_path.glob("out.pt*"))
    r = run_ckptconv("validate", src)
    assert r.returncode == 1 and named in r.stdout + r.stderr


def test_no_expert_files_at_all_is_exit_3(tmp_path, run_ckptconv):
    src = _copy("moe_z1_fp32_ws2_ep2", tmp_path)
    for p in (src / TAG).glob("layer_*_expert_*"):
        p.unlink()
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert "the optimizer files hold MoE expert groups but no layer_L_expert_E_mp_rank_00_model_states.pt" in r.stderr


def test_a_truncated_expert_file_is_exit_3_naming_it(tmp_path, run_ckptconv):
    src = _copy("moe_z2_bf16_ws4_ep2", tmp_path)
    f = src / TAG / "layer_0_expert_3_mp_rank_00_model_states.pt"
    f.write_bytes(f.read_bytes()[:600])
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    assert "layer_0_expert_3_mp_rank_00_model_states.pt" in r.stderr
    assert not out.exists()


def test_an_expert_file_of_another_layout_is_refused_naming_it(tmp_path, run_ckptconv):
    """DeepSpeed before 0.5 named expert files expert_E_mp_rank_TT (no layer)."""
    src = _copy("moe_z1_fp32_ws2_ep2", tmp_path)
    (src / TAG / "layer_0_expert_1_mp_rank_00_model_states.pt").rename(src / TAG / "expert_1_mp_rank_00_model_states.pt")
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "out.pt")
    assert r.returncode == 3, r.stderr
    assert "expert_1_mp_rank_00_model_states.pt: a MoE file of a layout ckptconv does not read" in r.stderr


def test_a_moe_run_reshards_to_dcp(tmp_path, run_ckptconv):
    case = PARALLEL / "moe_z2_bf16_ws4_ep2"
    dst = tmp_path / "resharded"
    r = run_ckptconv("reshard", case, "-o", dst, "--world-size", "3", "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("diff", case, dst)
    assert r.returncode == 0, r.stdout + r.stderr


def test_tensor_parallel_ranks_without_patterns_are_each_their_own_part(tmp_path, run_ckptconv):
    """Real DeepSpeed with an mpu of 2 tensor-parallel ranks and no
    universal_checkpoint_info: each mp rank holds its own slice of the split
    tensors under the same names and shapes, and nothing says along which
    dimension, so each rank is consolidated as its own part (mp_rank_00,
    mp_rank_01), with a warning, never concatenated on a guessed dimension."""
    case = PARALLEL / "tp2_fp32_ws2"
    ms = torch.load(case / TAG / "mp_rank_01_model_states.pt", weights_only=False)
    assert ms["checkpoint_parallel_dimensions"] == {"pp_degree": 1, "tp_degree": 2}
    assert "universal_checkpoint_info" not in ms
    ranks = torch.load(case / "reference_live.pt", weights_only=True)["tp_ranks"]
    assert not torch.equal(ranks[0]["col.weight"], ranks[1]["col.weight"])
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", case, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "read each as its own part" in r.stderr and "does not guess" in r.stderr
    full = torch.load(out, weights_only=True)
    assert [k for k in full if k.startswith("mp_rank")] == ["mp_rank_00", "mp_rank_01"]
    for t, want in enumerate(ranks):
        part = full[f"mp_rank_{t:02d}"]
        assert list(part["model"]) == list(want)
        for name, value in want.items():
            assert _equal(part["model"][name], value), (t, name)
        assert set(part["optim"]["state"]) == set(want)
    r = run_ckptconv("inspect", case)
    assert r.returncode == 0, r.stderr
    assert "  parallelism: data 1, pipeline 1, tensor 2, expert 1\n" in r.stdout
    assert "  tensor_parallel: 2 ranks, each its own part (no universal_checkpoint_info)\n" in r.stdout
    r = run_ckptconv("validate", case, "--expect-world-size", "2")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("case,tp,dp", [(TP_CASE, 2, 2), (TP1_CASE, 1, 2)])
def test_tensor_parallel_with_patterns_consolidates_to_the_live_engines(case, tp, dp, tmp_path, run_ckptconv):
    """TP2 x DP2 through an mpu, the model recording Megatron-DeepSpeed's
    universal_checkpoint_info: the tensor-parallel slices merged as the
    patterns say (replicated and averaged: one copy; row-parallel: dim 1; two
    sub-parameters: per half on dim 0; default: dim 0; the vocabulary's
    padding rows cut), equal bit for bit to the live engines' fp32 masters and
    AdamW state merged the same way by the generator's own code. At TP1 the
    one rank's values, the vocabulary's padding cut as at TP2."""
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", PARALLEL / case, "-o", out)
    assert r.returncode == 0, r.stderr
    full = torch.load(out, weights_only=True)
    live = torch.load(PARALLEL / case / "reference_live.pt", weights_only=True)
    assert list(full["model"]) == list(live["model"]) == [
        "embed.weight", "norm.weight", "norm.bias", "h_to_4h.weight", "proj.weight", "proj.bias", "out.weight",
        "out.bias", "out2.weight"]
    shapes = {n: tuple(t.shape) for n, t in full["model"].items()}
    assert shapes == {"embed.weight": (10, 6), "norm.weight": (6,), "norm.bias": (6,), "h_to_4h.weight": (12, 6),
                      "proj.weight": (4, 6), "proj.bias": (4,), "out.weight": (4, 6), "out.bias": (4,),
                      "out2.weight": (4, 4)}
    assert_is_live_masters_and_adam(full, live)
    # the per-rank slices differ where they are split, so the merge is not trivially rank 0's
    ranks = live["tp_ranks"]
    assert len(ranks) == tp
    assert tp == 1 or not torch.equal(ranks[0]["out.weight"]["fp32"], ranks[1]["out.weight"]["fp32"])
    (group,) = full["optim"]["param_groups"]
    assert group["params"] == list(live["model"])
    r = run_ckptconv("inspect", PARALLEL / case, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["parallelism"] == {"data": dp, "pipeline": 1, "tensor": tp, "expert": 1}
    r = run_ckptconv("inspect", PARALLEL / case)
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("model.")}
    ranks = f"{tp} tensor-parallel rank{'s' if tp > 1 else ''}"
    assert f"concatenated on dim 1 over {ranks}" in lines["model.out.weight"] or tp == 1
    assert f"replicated over {ranks} (averaged)" in lines["model.norm.bias"]
    assert f"2 sub-parameters joined per half over {ranks}" in lines["model.h_to_4h.weight"]
    assert "vocabulary padding cut" in lines["model.embed.weight"]
    r = run_ckptconv("validate", PARALLEL / case, "--expect-world-size", str(tp * dp))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("missing, named", [
    (["zero_pp_rank_1_mp_rank_01_optim_states.pt"], "tensor-parallel rank 1 has 1 optimizer files, rank 0 2"),
    (["zero_pp_rank_0_mp_rank_01_optim_states.pt"],
     "the optimizer file of rank 0 of 2 is missing (*zero_pp_rank_0_mp_rank_01_optim_states.pt)"),
    (["mp_rank_01_model_states.pt"], "no mp_rank_01_model_states.pt"),
    (["mp_rank_01_model_states.pt", "zero_pp_rank_0_mp_rank_01_optim_states.pt",
      "zero_pp_rank_1_mp_rank_01_optim_states.pt"],
     "tp_degree 2 but the files of 1 tensor-parallel rank(s) are here (mp_rank_01_model_states.pt missing)"),
])
def test_a_missing_tensor_parallel_file_is_exit_3_naming_it(missing, named, tmp_path, run_ckptconv):
    assert_missing_files_named(TP_CASE, missing, named, tmp_path, run_ckptconv)


@pytest.mark.parametrize("case", [TP_CASE, PPTP_CASE])
def test_a_merged_tensor_parallel_run_reshards_to_dcp(case, tmp_path, run_ckptconv):
    """The merged state, resharded for 3 FSDP ranks, reads back as the same
    state; chunks name the ranks in Megatron's order (d x 2 + t)."""
    dst = tmp_path / "resharded"
    r = run_ckptconv("reshard", PARALLEL / case, "-o", dst, "--world-size", "3", "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("diff", PARALLEL / case, dst)
    assert r.returncode == 0, r.stdout + r.stderr


def _with_info(src: Path, change) -> None:
    """Rewrites the universal_checkpoint_info of every mp rank's model states."""
    for f in (src / TAG).glob("mp_rank_*_model_states.pt"):
        ms = torch.load(f, weights_only=False)
        change(ms["universal_checkpoint_info"])
        torch.save(ms, f)


@pytest.mark.parametrize("change, named", [
    # proj.weight is split: called replicated, its slices differ
    (lambda i: i["tp_replicated_parameter_patterns"].append(r"proj\.weight"),
     "'model.proj.weight' (tp_replicated_parameter_patterns) differs between tensor-parallel ranks 0 and 1"),
    (lambda i: i["parameter_to_average_patterns"].append(r"proj\.bias"),
     "'model.proj.bias' (parameter_to_average_patterns) differs between tensor-parallel ranks 0 and 1"),
    (lambda i: i.update(parameter_with_sub_params=[{"patterns": ["x"], "shape": [3, -1], "partition_dim": 0}]),
     "has 'parameter_with_sub_params'"),
    (lambda i: i["parameter_with_row_parallelism_patterns"].append(r"out\."),
     "patterns 'out\\.weight' and 'out\\.' both match 'out.weight'"),
])
def test_patterns_that_do_not_fit_the_slices_are_exit_3(change, named, tmp_path, run_ckptconv):
    src = _copy(TP_CASE, tmp_path)
    _with_info(src, change)
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    assert named in r.stderr
    assert not out.exists()


def test_a_root_of_pipeline_tags_lists_every_stage_in_the_world_size(tmp_path, run_ckptconv):
    """inspect ROOT counts the ranks of every stage: 2 stages x 2 ranks is 4;
    a tag missing one stage's optimizer file is listed as incomplete."""
    root = _copy("pp2_dp2_bf16_ws4", tmp_path)
    shutil.copytree(root / TAG, root / "global_step6")
    (root / "global_step6" / "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt").unlink()
    r = run_ckptconv("inspect", root)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert "world size 4" in lines[TAG] and "complete" in lines[TAG]
    assert "world size ?" in lines["global_step6"] and "INCOMPLETE (a rank's files are missing)" in lines["global_step6"]


# ---- pipeline x tensor parallelism (PipeModelDataParallelTopology), tied layers ----


@pytest.mark.parametrize("name,tp,dp", [(PPTP_CASE, 2, 2), (PPTP1_CASE, 1, 1)])
def test_pipeline_with_a_tensor_axis_consolidates_to_the_live_engines(name, tp, dp, run_ckptconv, tmp_path):
    """PP2 x TP2 x DP2, Megatron-DeepSpeed's layout: each tensor-parallel
    rank's stages joined (layers under their global index), the tied
    embedding (tied_modules.embed.weight, on both stages) once, the
    tensor-parallel ranks merged by universal_checkpoint_info: equal bit for
    bit to the live engines' fp32 masters and AdamW state merged the same way
    by the generator's own code. At TP1 the one rank's, the patterns applied
    all the same (the vocabulary's padding cut)."""
    case = PARALLEL / name
    names = sorted(p.name for p in (case / TAG).iterdir())
    assert [n for n in names if n.startswith("layer_")] == [
        f"layer_{i:02d}-model_{t:02d}-model_states.pt" for i in range(4) for t in range(tp)]
    assert [n for n in names if n.startswith("mp_rank")] == [
        f"mp_rank_{m:02d}_model_states.pt" for m in range(2 * tp)]
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", case, "-o", out)
    assert r.returncode == 0, r.stderr
    full = torch.load(out, weights_only=True)
    live = torch.load(case / "reference_live.pt", weights_only=True)
    assert list(full["model"]) == list(live["model"]) == [
        "tied_modules.embed.weight", *[f"{i}.{k}" for i in (1, 2) for k in (
            "norm.weight", "norm.bias", "h_to_4h.weight", "out.weight", "out.bias")], "3.weight", "3.bias"]
    assert live["stages"]["tied_modules.embed.weight"] == [0, 1]
    assert tuple(full["model"]["tied_modules.embed.weight"].shape) == (10, 6)  # padding rows cut
    assert tuple(full["model"]["1.h_to_4h.weight"].shape) == (12, 6)
    assert_is_live_masters_and_adam(full, live)
    ranks = live["tp_ranks"]
    assert len(ranks) == tp
    assert tp == 1 or not torch.equal(ranks[0]["2.out.weight"]["fp32"], ranks[1]["2.out.weight"]["fp32"])
    (group,) = full["optim"]["param_groups"]
    assert group["params"] == list(live["model"])
    assert full["global_steps"] == 3
    r = run_ckptconv("inspect", case)
    assert r.returncode == 0, r.stderr
    assert f"  parallelism: data {dp}, pipeline 2, tensor {tp}, expert 1\n" in r.stdout
    assert ("  tensor_parallel: 2 ranks merged as universal_checkpoint_info says\n" if tp == 2 else
            "  tensor_parallel: 1, universal_checkpoint_info applied (its vocabulary padding cut)\n") in r.stdout
    r = run_ckptconv("validate", case, "--expect-world-size", str(2 * tp * dp))
    assert r.returncode == 0, r.stdout + r.stderr


def test_pipeline_with_a_tensor_axis_without_patterns_is_each_tp_rank_its_own_part(tmp_path, run_ckptconv):
    """Without universal_checkpoint_info each tensor-parallel rank's stages
    are one part (tp_rank_00, tp_rank_01: a part spans the mp ranks of its
    stages), the rank's own slices, with the warning; never concatenated."""
    src = _copy(PPTP_CASE, tmp_path)
    for f in (src / TAG).glob("mp_rank_*_model_states.pt"):
        ms = torch.load(f, weights_only=False)
        del ms["universal_checkpoint_info"]
        torch.save(ms, f)
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "read each as its own part (tp_rank_00, tp_rank_01" in r.stderr and "does not guess" in r.stderr
    full = torch.load(out, weights_only=True)
    assert [k for k in full if k.startswith("tp_rank")] == ["tp_rank_00", "tp_rank_01"]
    for t, want in enumerate(torch.load(src / "reference_live.pt", weights_only=True)["tp_ranks"]):
        part = full[f"tp_rank_{t:02d}"]
        assert list(part["model"]) == list(want)
        for name, v in want.items():
            assert _equal(part["model"][name], v["fp32"]), (t, name)
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert _equal(part["optim"]["state"][name][key], v[key]), (t, name, key)
    r = run_ckptconv("inspect", src)
    assert "  tensor_parallel: 2 ranks, each its own part (no universal_checkpoint_info)\n" in r.stdout
    r = run_ckptconv("reshard", src, "-o", src / "ucp", "--layout", "deepspeed-universal")
    assert r.returncode == 3 and "does not say how to merge" in r.stderr, r.stderr
    assert not (src / "ucp").exists() and not (src / "latest_universal").exists()


@pytest.mark.parametrize("missing, named", [
    (["layer_02-model_01-model_states.pt"], "the layer file layer_02-model_01-model_states.pt of pipeline stage 0 is missing"),
    (["layer_00-model_01-model_states.pt"],
     "pipeline stage 0 trains the tied module 'embed' (tied_modules.embed.*) but no layer file holds its entries"),
    (["zero_pp_rank_1_mp_rank_03_optim_states.pt"], "pipeline stage 1 (mp_rank_03) has 1 optimizer files, stage 0 2"),
    (["mp_rank_03_model_states.pt"], "no mp_rank_03_model_states.pt"),
    ([f"layer_{i:02d}-model_01-model_states.pt" for i in range(4)],
     "tp_degree 2 but the layer files of 1 tensor-parallel rank(s) are here"),
])
def test_a_missing_pipeline_tensor_parallel_file_is_exit_3_naming_it(missing, named, tmp_path, run_ckptconv):
    assert_missing_files_named(PPTP_CASE, missing, named, tmp_path, run_ckptconv)


def test_tied_copies_that_differ_are_exit_3_naming_both_stages_files(tmp_path, run_ckptconv):
    """Each stage keeps its own master of the tied embedding; DeepSpeed keeps
    them equal. One changed (in the last stage's optimizer file, rewritten
    by torch in the DeepSpeed environment, which its pickles need) is exit 3
    naming both stages' files, nothing written."""
    require_side_env(DS_PY, "rewriting a DeepSpeed optimizer file needs DeepSpeed's classes", "scripts/setup-deepspeed")
    src = _copy(PPTP_CASE, tmp_path)
    f = src / TAG / "zero_pp_rank_0_mp_rank_02_optim_states.pt"
    # tied_modules.embed.weight is first in stage 1's param_shapes: element 0 of dp rank 0's partition
    code = ("import sys, torch; f = sys.argv[1]; sd = torch.load(f, weights_only=False); "
            "sd['optimizer_state_dict']['single_partition_of_fp32_groups'][0].data[0] += 1; torch.save(sd, f)")
    r = subprocess.run([str(DS_PY), "-c", code, str(f)], env=dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=""),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    assert ("tied parameter 'tied_modules.embed.weight' differs between pipeline stage 0 "
            "(*_mp_rank_00_optim_states.pt) and stage 1 (*_mp_rank_02_optim_states.pt)") in r.stderr
    assert not out.exists()


def test_a_module_tied_between_stages_without_zero_is_exit_3(tmp_path, run_ckptconv):
    """Without ZeRO nothing names a TiedLayerSpec module's positions; each stage
    using it holds one, with the same optimizer state (DeepSpeed keeps the
    copies in step). Stage 1 given such a copy of stage 0's 0.weight position
    (registered first, as tied modules are): refused, never placed on
    another layer's parameter."""
    src = _copy("pp2_z0_fp32_ws2", tmp_path)
    tag = src / TAG
    s0 = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
    f1 = tag / "mp_rank_01_model_states.pt"
    s1 = torch.load(f1, weights_only=False)
    assert s0["optimizer"]["state"][0]["exp_avg"].shape == (7, 6)
    s1["optimizer"]["state"][5] = {k: v.clone() for k, v in s0["optimizer"]["state"][0].items()}
    s1["optimizer"]["param_groups"][0]["params"] = [5, 0, 1, 2, 3, 4]
    torch.save(s1, f1)
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert "mp_rank_01_model_states.pt: optimizer position 5 holds the same optimizer state as " \
           "mp_rank_00_model_states.pt's position 0: a module tied between pipeline stages" in r.stderr
    assert not (tmp_path / "o.pt").exists()


def _stage0_with_a_tensor_axis(tmp_path: Path) -> Path:
    """pp2_z0_fp32_ws2's files as a PP2 x TP2 run without ZeRO would name
    them (PipelineModule.ckpt_layer_path adds `-model_TT`; mp rank = stage x
    tp + tp rank): each layer file under both tensor-parallel ranks' names."""
    src = _copy("pp2_z0_fp32_ws2", tmp_path)
    tag = src / TAG
    for layer in sorted(tag.glob("layer_*-model_states.pt")):
        stem = layer.name[: -len("-model_states.pt")]
        for tp in (0, 1):
            shutil.copy(layer, tag / f"{stem}-model_{tp:02d}-model_states.pt")
        layer.unlink()
    for stage in (1, 0):  # stage s's file is mp ranks 2s and 2s + 1 (mp_rank_00 stays)
        for tp in (1, 0):
            if 2 * stage + tp != stage:
                shutil.copy(tag / f"mp_rank_{stage:02d}_model_states.pt",
                            tag / f"mp_rank_{2 * stage + tp:02d}_model_states.pt")
    return src


def test_tensor_parallelism_without_zero_is_exit_3_naming_the_file(tmp_path, run_ckptconv):
    """Stage 0 with a tensor axis, in a pipeline (layer_LL-model_TT files) or
    an mpu without layer files (mp_rank_01 beside mp_rank_00): not supported,
    said so naming a tensor-parallel rank's file, where it was refused as a
    ZeRO save missing mp_rank_01's optimizer files."""
    src = _stage0_with_a_tensor_axis(tmp_path)
    assert len(list((src / TAG).glob("mp_rank_*_model_states.pt"))) == 4
    out = tmp_path / "o.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    assert "layer_00-model_01-model_states.pt: tensor parallelism at stage 0 (without ZeRO) is not supported" in r.stderr
    assert not out.exists()
    dp = tmp_path / "dp"
    shutil.copytree(REPO / "testdata" / "zero" / "z0_fp32_ws2", dp)
    shutil.copy(dp / TAG / "mp_rank_00_model_states.pt", dp / TAG / "mp_rank_01_model_states.pt")
    r = run_ckptconv("consolidate", dp, "-o", out)
    assert r.returncode == 3, r.stderr
    assert f"{dp / TAG / 'mp_rank_01_model_states.pt'}: tensor parallelism at stage 0 (without ZeRO) is not " \
           "supported" in r.stderr
    assert "optim_states" not in r.stderr
    assert not out.exists()


def test_a_tensor_parallel_zero_save_without_optimizer_files_is_not_called_stage_0(tmp_path, run_ckptconv):
    """The names of stage 0 with a tensor axis are those of a ZeRO
    tensor-parallel save whose optimizer files are all missing: mp_rank_00's
    `optimizer` (None) tells, as for a data-parallel one. One mp rank's
    optimizer files missing beside another's is named either way round."""
    src = _copy(TP_CASE, tmp_path)
    for f in (src / TAG).glob("*optim_states.pt"):
        f.unlink()
    r = run_ckptconv("inspect", src)
    assert r.returncode == 3, r.stderr
    assert "no *_mp_rank_00_optim_states.pt files (a ZeRO checkpoint has one per rank) and no optimizer state " \
           "in mp_rank_00_model_states.pt" in r.stderr
    for gone, kept in (("01", "00"), ("00", "01")):
        src = tmp_path / f"pp_{gone}"
        shutil.copytree(PARALLEL / "pp2_dp2_bf16_ws4", src)
        for f in (src / TAG).glob(f"*mp_rank_{gone}_optim_states.pt"):
            f.unlink()
        r = run_ckptconv("inspect", src)
        assert r.returncode == 3, r.stderr
        assert f"no *_mp_rank_{gone}_optim_states.pt files, where mp_rank_{kept} has them" in r.stderr
