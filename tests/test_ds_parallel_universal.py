"""`reshard --layout deepspeed-universal` of DeepSpeed pipeline and MoE checkpoints.

The sources are testdata/zero_parallel (real DeepSpeed 0.19.8 engines,
tools/make_zero_parallel_checkpoints.py). A real DeepSpeed engine with
``load_universal`` loads ckptconv's universal checkpoint at another
data-parallel size, and at another pipeline degree
(tests/ds_parallel_universal_load.py, in .venv-deepspeed; these tests fail
without it): every fp32 master, exp_avg, exp_avg_sq and step equals the
source engine's live value (reference_live.pt) bit for bit, and one training
step runs. For the pipeline, ``ds_to_universal.py``'s own output of the same
checkpoint has the same tensors and trains the same step bit for bit; on the
MoE checkpoints the converter fails (asserted, so docs/deepspeed.md stays
true).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from proofs_guard import require_side_env

REPO = Path(__file__).resolve().parent.parent
PARALLEL = REPO / "testdata" / "zero_parallel"
DS_PY = REPO / ".venv-deepspeed" / "bin" / "python"
TAG = "global_step3_universal"
EXPERT = "moe.deepspeed_moe.experts.deepspeed_experts."


@pytest.fixture
def deepspeed_env():
    require_side_env(DS_PY, "the real-engine load tests run DeepSpeed", "scripts/setup-deepspeed")


needs_deepspeed = pytest.mark.usefixtures("deepspeed_env")


def ds_env() -> dict:
    return dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH="")


def write_ucp(run_ckptconv, case: str, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    r = run_ckptconv("reshard", PARALLEL / case, "-o", root / TAG, "--layout", "deepspeed-universal")
    assert r.returncode == 0, r.stderr
    return root / TAG


def engine_load(case: str, root: Path, pp: int, dp: int, out: Path, tp: int | None = None) -> dict:
    """`tp`: the tensor-parallel degree of a pipeline x tensor-parallel case."""
    cmd = [str(DS_PY), str(REPO / "tests" / "ds_parallel_universal_load.py"), case, str(root), TAG, str(pp), str(dp),
           str(out)] + ([str(tp)] if tp else [])
    r = subprocess.run(cmd, env=ds_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return torch.load(out, weights_only=False)


def reference(case: str) -> dict:
    return torch.load(PARALLEL / case / "reference_live.pt", weights_only=False)


def assert_loaded_is_reference(got: dict, ref: dict) -> None:
    """Every trainable parameter's master and AdamW state, bit for bit."""
    loaded = got["loaded"]
    assert sorted(loaded) == sorted(ref["model"])
    for n, want in ref["model"].items():
        assert torch.equal(loaded[n]["fp32"], want), n
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded[n][k], ref["optim"][n][k]), (n, k)
        assert loaded[n]["step"].item() == ref["optim"][n]["step"].item() == 3, n


def assert_one_step_ran(got: dict) -> None:
    assert (got["global_steps"], got["skipped_steps"]) == (4, 0)
    assert all(math.isfinite(x) for x in got["losses"])
    for n, v in got["after"].items():
        assert v["step"].item() == 4, n
    assert any(not torch.equal(v["fp32"], got["loaded"][n]["fp32"]) for n, v in got["after"].items())


# (case, pipeline stages, data-parallel ranks per stage loaded at): PP2 x DP1
# saved, loaded at PP2 x DP2; the bf16 PP2 x DP2 run loaded at PP2 x DP1.
PIPE_LOADS = [("pp2_fp32_ws2", 2, 2), ("pp2_dp2_bf16_ws4", 2, 1)]


@needs_deepspeed
@pytest.mark.parametrize("case,pp,dp", PIPE_LOADS, ids=[f"{c}-to-pp{p}xdp{d}" for c, p, d in PIPE_LOADS])
def test_pipeline_engine_loads_at_new_data_parallel_size(case, pp, dp, tmp_path, run_ckptconv):
    ucp = write_ucp(run_ckptconv, case, tmp_path / "ours")
    # The load reads zero/ and one mp_rank_*_model_states.pt (engine.py globs
    # them with pp placeholder 0); it never reads layer files or `module`.
    assert sorted(p.name for p in ucp.iterdir()) == [
        "mp_rank_00_model_states.pt", "zero", "zero_pp_rank_0_mp_rank_00_model_states.pt"]
    got = engine_load(case, tmp_path / "ours", pp, dp, tmp_path / "ours.pt")
    assert_loaded_is_reference(got, reference(case))
    assert_one_step_ran(got)


@needs_deepspeed
def test_pipeline_without_zero_loads_into_a_zero1_pipeline_engine(tmp_path, run_ckptconv):
    """A PP2 run without ZeRO (stage 0: each stage's optimizer state inside its
    mp_rank_SS_model_states.pt, no optimizer files), resharded to a universal
    checkpoint, loaded by a ZeRO-1 PipelineEngine of the same model at PP2 x
    DP2 (a stage-0 engine cannot load one): every master and moment exact."""
    write_ucp(run_ckptconv, "pp2_z0_fp32_ws2", tmp_path / "ours")
    got = engine_load("pp2_fp32_ws2", tmp_path / "ours", 2, 2, tmp_path / "ours.pt")
    assert_loaded_is_reference(got, reference("pp2_z0_fp32_ws2"))
    assert_one_step_ran(got)


@needs_deepspeed
def test_pipeline_at_new_pipeline_degree_matches_ds_to_universal(tmp_path, run_ckptconv):
    """PP2 saved, loaded as one stage (the layers' names are global, so the
    stages' split plays no part): ckptconv's UCP and ds_to_universal.py's,
    converted here from the same checkpoint, hold the same trainable tensors
    and give the same loaded state and the same next step, bit for bit."""
    case = "pp2_fp32_ws2"
    ours = write_ucp(run_ckptconv, case, tmp_path / "ours")
    theirs = tmp_path / "theirs" / TAG
    r = subprocess.run([str(DS_PY), "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                        str(PARALLEL / case / "global_step3"), "--output_folder", str(theirs),
                        "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"],
                       env=ds_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # DeepSpeed's converter copies both stages' model-states files and writes
    # no zero_pp_rank_0 one; the per-parameter trees are the same.
    assert sorted(p.name for p in theirs.iterdir()) == [
        "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt", "zero"]
    ref = reference(case)
    for n in ref["model"]:
        names = sorted(p.name for p in (theirs / "zero" / n).iterdir())
        assert sorted(p.name for p in (ours / "zero" / n).iterdir()) == names, n
        for f in names:
            a = torch.load(ours / "zero" / n / f, weights_only=True)
            b = torch.load(theirs / "zero" / n / f, weights_only=False)
            a, b = (a["param"], b["param"]) if f != "step.pt" else (a, b)
            assert torch.equal(a, b.detach()), (n, f)
    got = engine_load(case, tmp_path / "ours", 1, 1, tmp_path / "ours.pt")
    want = engine_load(case, tmp_path / "theirs", 1, 1, tmp_path / "theirs.pt")
    assert_loaded_is_reference(got, ref)
    assert_one_step_ran(got)
    for what in ("loaded", "after"):
        for n in ref["model"]:
            for k in ("fp32", "exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(got[what][n][k], want[what][n][k]), (what, n, k)
    assert got["losses"] == want["losses"]


def test_moe_experts_are_stacked_by_local_index(tmp_path, run_ckptconv):
    """4 experts at ep 2: the engine names its experts deepspeed_experts.0
    and .1 on both expert-parallel ranks, so folder i holds global experts i
    and 2 + i stacked, marked for DeepSpeed's expert-parallel slicing; no
    folder is named after experts 2 and 3."""
    case = "moe_z2_bf16_ws4_ep2"
    ucp = write_ucp(run_ckptconv, case, tmp_path / "ours")
    ref = reference(case)
    experts = sorted(p.name for p in (ucp / "zero").iterdir() if p.name.startswith(EXPERT))
    assert experts == [f"{EXPERT}{i}.{k}" for i in (0, 1) for k in ("bias", "weight")]
    for i in (0, 1):
        for k in ("weight", "bias"):
            d = ucp / "zero" / f"{EXPERT}{i}.{k}"
            assert sorted(p.name for p in d.iterdir()) == ["exp_avg.pt", "exp_avg_sq.pt", "fp32.pt", "step.pt"]
            for f, want in (("fp32", lambda g: ref["model"][g]), ("exp_avg", lambda g: ref["optim"][g]["exp_avg"]),
                            ("exp_avg_sq", lambda g: ref["optim"][g]["exp_avg_sq"])):
                got = torch.load(d / f"{f}.pt", weights_only=True)
                assert list(got) == ["cat_dim", "param", "is_expert_param", "ep_num_experts"]
                assert (got["cat_dim"], got["is_expert_param"], got["ep_num_experts"]) == (0, True, 2)
                assert torch.equal(got["param"], torch.stack([want(f"{EXPERT}{e * 2 + i}.{k}") for e in (0, 1)]))
            assert torch.load(d / "step.pt", weights_only=True).item() == 3.0


# (case, world size loaded at), ep 2 kept: ZeRO-1 fp32 at 2 ranks loaded at
# 4 (expert-data-parallel groups of 2), ZeRO-2 bf16 at 4 loaded at 2.
MOE_LOADS = [("moe_z1_fp32_ws2_ep2", 4), ("moe_z2_bf16_ws4_ep2", 2)]


@needs_deepspeed
@pytest.mark.parametrize("case,ws", MOE_LOADS, ids=[f"{c}-to-ws{w}" for c, w in MOE_LOADS])
def test_moe_engine_loads_at_new_data_parallel_size(case, ws, tmp_path, run_ckptconv):
    write_ucp(run_ckptconv, case, tmp_path / "ours")
    got = engine_load(case, tmp_path / "ours", 1, ws, tmp_path / "ours.pt")
    assert_loaded_is_reference(got, reference(case))
    assert_one_step_ran(got)


@needs_deepspeed
def test_ds_to_universal_fails_on_moe(tmp_path):
    """DeepSpeed's own converter concatenates the expert-parallel ranks'
    same-named local experts and fails: there is no DeepSpeed output to
    compare the MoE case with."""
    r = subprocess.run([str(DS_PY), "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                        str(PARALLEL / "moe_z1_fp32_ws2_ep2" / "global_step3"), "--output_folder",
                        str(tmp_path / TAG), "--inject_missing_state", "--num_extract_workers", "1", "--num_merge_workers", "1"],
                       env=ds_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    # Which expert parameter it stops at varies (its worker order); each
    # holds the two ranks' local experts of one name: twice the elements.
    m = re.search(r"RuntimeError: shape '\[([\d, ]+)\]' is invalid for input of size (\d+)", r.stdout + r.stderr)
    assert m, r.stderr[-2000:]
    assert int(m.group(2)) == 2 * math.prod(int(x) for x in m.group(1).split(","))


@pytest.mark.parametrize("case", ["pp2_dp2_bf16_ws4", "moe_z1_fp32_ws2_ep2", "moe_z2_bf16_ws4_ep2",
                                  "tp2_dp2_fp32_ws4_ucinfo"])
def test_universal_checkpoint_reads_back_as_its_source(case, tmp_path, run_ckptconv):
    """ckptconv reads its universal checkpoint as the checkpoint it came from
    (MoE: each global expert from its entry of the stacked local folder):
    masters, optimizer state and param groups equal; frozen parameters and
    buffers come back in fp32 (hence --ignore-dtype)."""
    ucp = write_ucp(run_ckptconv, case, tmp_path / "ours")
    r = run_ckptconv("diff", PARALLEL / case, ucp, "--ignore-dtype")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("equal")


def test_moe_without_a_recorded_expert_parallel_size_is_refused(tmp_path, run_ckptconv):
    """A consolidation of the MoE run does not say at which ep it ran, and
    the expert folders' names depend on the ep of the engine that loads
    them: without --expert-parallel it is exit 3 naming the option, nothing
    written (it used to write global ids with a warning, which an engine at
    ep 2 loads as rank 0's experts on both expert-parallel ranks)."""
    full = tmp_path / "full.pt"
    assert run_ckptconv("consolidate", PARALLEL / "moe_z1_fp32_ws2_ep2", "-o", full).returncode == 0
    r = run_ckptconv("reshard", full, "-o", tmp_path / TAG, "--layout", "deepspeed-universal")
    assert r.returncode == 3, r.stderr
    assert "does not record the expert-parallel size" in r.stderr and "--expert-parallel N" in r.stderr
    assert str(full) in r.stderr
    assert not (tmp_path / TAG).exists() and not (tmp_path / "latest_universal").exists()


def test_moe_expert_parallel_given_for_a_consolidation_writes_what_the_source_would(tmp_path, run_ckptconv):
    """With --expert-parallel 2 the consolidation's universal checkpoint is
    the one the EP2 DeepSpeed checkpoint itself gives, byte for byte."""
    case = "moe_z1_fp32_ws2_ep2"
    direct = write_ucp(run_ckptconv, case, tmp_path / "direct")
    full = tmp_path / "full.pt"
    assert run_ckptconv("consolidate", PARALLEL / case, "-o", full).returncode == 0
    (tmp_path / "given").mkdir()
    given = tmp_path / "given" / TAG
    r = run_ckptconv("reshard", full, "-o", given, "--layout", "deepspeed-universal", "--expert-parallel", "2")
    assert r.returncode == 0, r.stderr
    files = sorted(str(p.relative_to(direct)) for p in (direct / "zero").rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(given)) for p in (given / "zero").rglob("*") if p.is_file())
    assert any(f"{EXPERT}1.weight" in f for f in files) and not any(f"{EXPERT}2." in f for f in files)
    for f in files:
        assert (direct / f).read_bytes() == (given / f).read_bytes(), f


@pytest.mark.parametrize("value,layout,code,said", [
    ("0", "deepspeed-universal", 2, "--expert-parallel must be at least 1"),
    ("3", "deepspeed-universal", 3, "4 experts under 'moe.deepspeed_moe.experts.deepspeed_experts.' do not divide over "
                                    "expert-parallel size 3"),
    ("2", "dcp", 2, "--expert-parallel: only for --layout deepspeed-universal (not dcp)")])
def test_expert_parallel_mistakes_are_named(value, layout, code, said, tmp_path, run_ckptconv):
    out = tmp_path / TAG
    r = run_ckptconv("reshard", PARALLEL / "moe_z1_fp32_ws2_ep2", "-o", out, "--layout", layout, "--world-size", "2",
                     "--expert-parallel", value)
    assert r.returncode == code, r.stderr
    assert said in r.stderr
    assert not out.exists()


@needs_deepspeed
def test_moe_at_another_expert_parallel_size_loads_when_asked(tmp_path, run_ckptconv):
    """The EP2 checkpoint written for ep 1 (--expert-parallel 1: experts by
    global id) loads into an engine at ep_size 1 on 2 ranks with every
    master and moment exact, and trains a step."""
    case = "moe_z1_fp32_ws2_ep2"
    root = tmp_path / "ours"
    root.mkdir()
    r = run_ckptconv("reshard", PARALLEL / case, "-o", root / TAG, "--layout", "deepspeed-universal",
                     "--expert-parallel", "1")
    assert r.returncode == 0, r.stderr
    assert (root / TAG / "zero" / f"{EXPERT}3.weight" / "fp32.pt").exists()
    cmd = [str(DS_PY), str(REPO / "tests" / "ds_parallel_universal_load.py"), case, str(root), TAG, "1", "2",
           str(tmp_path / "ep1.pt"), "1"]
    done = subprocess.run(cmd, env=ds_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    got = torch.load(tmp_path / "ep1.pt", weights_only=False)
    assert_loaded_is_reference(got, reference(case))
    assert_one_step_ran(got)


def test_moe_universal_checkpoint_split_across_processes_is_the_same_bytes(tmp_path, run_ckptconv):
    """--part 0/2 and 1/2 write the stacked expert tensors (chunks of two
    experts in one record) byte for byte as one process does."""
    case = "moe_z2_bf16_ws4_ep2"
    whole = write_ucp(run_ckptconv, case, tmp_path / "whole")
    (tmp_path / "parted").mkdir()
    parted = tmp_path / "parted" / TAG
    for i in (0, 1):
        r = run_ckptconv("reshard", PARALLEL / case, "-o", parted, "--layout", "deepspeed-universal", "--part", f"{i}/2")
        assert r.returncode == 0, r.stderr
    files = sorted(str(p.relative_to(whole)) for p in whole.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(parted)) for p in parted.rglob("*") if p.is_file())
    assert any("deepspeed_experts.1.weight" in f for f in files)
    for f in files:
        assert (whole / f).read_bytes() == (parted / f).read_bytes(), f


def test_a_stacked_expert_file_of_the_wrong_size_is_named(tmp_path, run_ckptconv):
    """A stacked expert file must hold one entry per expert-parallel rank
    (4 experts in param_shapes over 2 local folders: 2); one holding 3 is
    exit 3 naming the file, nothing written."""
    ucp = write_ucp(run_ckptconv, "moe_z1_fp32_ws2_ep2", tmp_path / "ours")
    f = ucp / "zero" / f"{EXPERT}1.weight" / "exp_avg.pt"
    d = torch.load(f, weights_only=True)
    d["param"] = torch.cat([d["param"], d["param"][:1]])
    torch.save(d, f)
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", ucp, "-o", out)
    assert r.returncode == 3, r.stderr
    assert str(f) in r.stderr and "has shape (3, 8, 8), not 2 experts stacked" in r.stderr
    assert not out.exists()


def test_moe_universal_checkpoint_resharded_again_is_stacked_the_same(tmp_path, run_ckptconv):
    """Read back, the stacked folders say the expert-parallel size, so the
    universal checkpoint written from it has the same zero/ tree, byte for byte."""
    first = write_ucp(run_ckptconv, "moe_z1_fp32_ws2_ep2", tmp_path / "first")
    (tmp_path / "again").mkdir()
    again = tmp_path / "again" / TAG
    r = run_ckptconv("reshard", first, "-o", again, "--layout", "deepspeed-universal")
    assert r.returncode == 0, r.stderr
    assert "does not record the expert-parallel size" not in r.stderr
    files = sorted(str(p.relative_to(first)) for p in (first / "zero").rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(again)) for p in (again / "zero").rglob("*") if p.is_file())
    for f in files:
        assert (first / f).read_bytes() == (again / f).read_bytes(), f
    r = run_ckptconv("inspect", first)
    assert "expert 2" in r.stdout


@needs_deepspeed
def test_moe_universal_checkpoint_at_another_ep_size_is_refused_by_deepspeed(tmp_path, run_ckptconv):
    """The stacked files are for the source's ep_size: an engine at ep_size 1
    stops, never loads other experts' values. Which refusal a rank meets
    first depends on which parameter it loads first: DeepSpeed's own check
    (two experts stacked where it wants one) at local experts 0 and 1, or no
    folder at local experts 2 and 3 (there are only the EP2 local names)."""
    write_ucp(run_ckptconv, "moe_z1_fp32_ws2_ep2", tmp_path / "ours")
    cmd = [str(DS_PY), str(REPO / "tests" / "ds_parallel_universal_load.py"), "moe_z1_fp32_ws2_ep2",
           str(tmp_path / "ours"), TAG, "1", "2", str(tmp_path / "ep1.pt"), "1"]
    r = subprocess.run(cmd, env=ds_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    said = r.stdout + r.stderr
    assert ("full param numel 128 != tensor slice numel 64" in said
            or re.search(r"No such file or directory: '[^']*/zero/[^']*deepspeed_experts\.[23]\.", said)), said
    assert not (tmp_path / "ep1.pt").exists()


TP_CASE = "tp2_dp2_fp32_ws4_ucinfo"


def ds_to_universal(case: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(DS_PY), "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                           str(PARALLEL / case / "global_step3"), "--output_folder", str(out),
                           "--num_extract_workers", "1", "--num_merge_workers", "1"],
                          env=ds_env(), capture_output=True, text=True, timeout=600)


def assert_same_files_as_ds_to_universal(written: Path, theirs: Path, ref: dict) -> dict:
    """Every parameter's folder in `written` holds what ds_to_universal.py's
    `theirs` holds: the same files, the same keys (the categories), the same
    tensors bit for bit. The fp32.pt keys by parameter."""
    keys = {}
    for n in ref["model"]:
        names = sorted(p.name for p in (theirs / "zero" / n).iterdir())
        assert sorted(p.name for p in (written / "zero" / n).iterdir()) == names == [
            "exp_avg.pt", "exp_avg_sq.pt", "fp32.pt", "step.pt"], n
        for f in names:
            a = torch.load(written / "zero" / n / f, weights_only=True)
            b = torch.load(theirs / "zero" / n / f, weights_only=False)
            if f == "step.pt":
                assert torch.equal(a, b), n
                continue
            assert list(a) == list(b), (written, n, f, list(a), list(b))
            assert {k: v for k, v in a.items() if k != "param"} == {k: v for k, v in b.items() if k != "param"}
            assert torch.equal(a["param"], b["param"].detach()), (n, f)
        keys[n] = list(torch.load(written / "zero" / n / "fp32.pt", weights_only=True))
    return keys


def ours_and_ds_to_universals(run_ckptconv, case: str, tmp_path: Path):
    """ckptconv's universal checkpoint of `case` (tmp_path/ours) and
    ds_to_universal.py's (tmp_path/theirs), checked to hold the same files;
    with the live reference and the fp32.pt keys by parameter."""
    ours = write_ucp(run_ckptconv, case, tmp_path / "ours")
    theirs = tmp_path / "theirs" / TAG
    r = ds_to_universal(case, theirs)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ref = reference(case)
    return ours, theirs, ref, assert_same_files_as_ds_to_universal(ours, theirs, ref)


@needs_deepspeed
def test_tensor_parallel_universal_checkpoint_is_ds_to_universals_and_loads_at_new_dp_size(tmp_path, run_ckptconv):
    """TP2 x DP2 with Megatron-DeepSpeed's universal_checkpoint_info: every
    per-parameter file ckptconv writes holds what ds_to_universal.py's own
    output of the same checkpoint holds (the same keys: cat_dim 1 for the
    row-parallel weight, none for replicated ones, param_n_sub_params,
    vocab_tensor; the same tensors, bit for bit), and a real TP2 engine
    through an mpu at one data-parallel rank, and a TP1 engine, load it with
    every master and moment exact (the ranks' slices merged back as the
    source's were) and train a step. ds_to_universal's output read back and
    written again keeps every category too (read from its files: without
    them a TP2 loader cuts the row-parallel weight on dim 0, silently)."""
    ours = write_ucp(run_ckptconv, TP_CASE, tmp_path / "ours")
    theirs = tmp_path / "theirs" / TAG
    r = ds_to_universal(TP_CASE, theirs)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    again = tmp_path / "again" / TAG
    r = run_ckptconv("reshard", theirs, "-o", again, "--layout", "deepspeed-universal")
    assert r.returncode == 0, r.stderr
    ref = reference(TP_CASE)
    assert_same_files_as_ds_to_universal(again, theirs, ref)
    keys = assert_same_files_as_ds_to_universal(ours, theirs, ref)
    assert keys["out.weight"] == ["cat_dim", "param"] and keys["norm.weight"] == ["param"]
    assert keys["h_to_4h.weight"] == ["cat_dim", "param_n_sub_params", "param"]
    assert keys["embed.weight"] == ["cat_dim", "vocab_tensor", "param"]
    assert torch.load(ours / "zero" / "out.weight" / "fp32.pt", weights_only=True)["cat_dim"] == 1
    got = engine_load(TP_CASE, tmp_path / "ours", 2, 1, tmp_path / "ours.pt")
    assert_loaded_is_reference(got, ref)
    assert_one_step_ran(got)
    # at a new tensor-parallel degree: one rank holding the whole model
    tp1 = engine_load(TP_CASE, tmp_path / "ours", 1, 1, tmp_path / "tp1.pt")
    assert_loaded_is_reference(tp1, ref)
    assert_one_step_ran(tp1)
    # the same function of the same weights on the same batch: the losses
    # differ only by the order the tensor-parallel partial sums are added in
    assert abs(tp1["losses"][0] - got["losses"][0]) < 1e-5, (tp1["losses"], got["losses"])


@needs_deepspeed
def test_tensor_parallel_degree_1_with_patterns_loads_at_degree_2(tmp_path, run_ckptconv):
    """Megatron-DeepSpeed at TP1 records its universal_checkpoint_info too.
    The universal checkpoint ckptconv writes from it is ds_to_universal.py's
    (the categories: row-parallel cat_dim 1, replicated, two sub-parameters,
    the vocabulary's padding cut), so a TP2 engine loads it with every master
    and moment exact. It used to say cat_dim 0 for all, and a TP2 engine cut
    the row-parallel weights on dim 0: wrong values, no error."""
    case = "tp1_dp2_fp32_ws2_ucinfo"
    ours, _, ref, keys = ours_and_ds_to_universals(run_ckptconv, case, tmp_path)
    assert keys["out.weight"] == ["cat_dim", "param"] and keys["norm.weight"] == ["param"]
    assert torch.load(ours / "zero" / "out.weight" / "fp32.pt", weights_only=True)["cat_dim"] == 1
    assert tuple(torch.load(ours / "zero" / "embed.weight" / "fp32.pt", weights_only=True)["param"].shape)[0] == \
        ref["universal_checkpoint_info"]["original_vocab_size"]
    got = engine_load(case, tmp_path / "ours", 2, 1, tmp_path / "tp2.pt")
    assert_loaded_is_reference(got, ref)
    assert_one_step_ran(got)


PPTP_CASE = "pp2_tp2_dp2_fp32_ws8_ucinfo"


@needs_deepspeed
def test_pipeline_tensor_parallel_universal_checkpoint_is_ds_to_universals_and_loads_at_new_degrees(
        tmp_path, run_ckptconv):
    """PP2 x TP2 x DP2 (Megatron-DeepSpeed's layout, a tied embedding): every
    per-parameter file ckptconv writes holds what ds_to_universal.py's output
    of the same checkpoint holds (keys and tensors, bit for bit; one folder
    for the tied embedding, which both stages' engines load by its name), and
    real PipelineEngines load it with every master and moment exact and
    train a step: at PP2 x TP2 x DP1 (a new data-parallel size) and at PP1 x
    TP1 x DP2 (new pipeline, tensor and data-parallel degrees, the vocabulary
    padded back by the loader). At PP1 x TP1 x DP2 ds_to_universal.py's output
    loads to the same state and trains the same step, bit for bit."""
    ours, theirs, ref, _ = ours_and_ds_to_universals(run_ckptconv, PPTP_CASE, tmp_path)
    assert sorted(p.name for p in (ours / "zero").iterdir()) == sorted(p.name for p in (theirs / "zero").iterdir())
    assert list(torch.load(ours / "zero" / "tied_modules.embed.weight" / "fp32.pt", weights_only=True)) == [
        "cat_dim", "vocab_tensor", "param"]
    for pp, tp, dp in ((2, 2, 1), (1, 1, 2)):
        got = engine_load(PPTP_CASE, tmp_path / "ours", pp, dp, tmp_path / f"ours{pp}{tp}{dp}.pt", tp)
        assert_loaded_is_reference(got, ref)
        assert_one_step_ran(got)
    want = engine_load(PPTP_CASE, tmp_path / "theirs", 1, 2, tmp_path / "theirs112.pt", 1)
    for what in ("loaded", "after"):
        for n in ref["model"]:
            for k in ("fp32", "exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(got[what][n][k], want[what][n][k]), (what, n, k)
    assert got["losses"] == want["losses"]


@needs_deepspeed
def test_pipeline_at_tensor_parallel_degree_1_with_patterns_loads_at_degree_2(tmp_path, run_ckptconv):
    """PP2 x TP1 with the patterns recorded (Megatron-DeepSpeed at TP1): the
    universal checkpoint is ds_to_universal.py's, and a PipelineEngine at a
    new tensor-parallel degree, PP1 x TP2, loads it with every master and
    moment exact and trains a step (written with cat_dim 0 for every
    parameter, as before, TP2 cut the row-parallel weights wrong, silently)."""
    case = "pp2_tp1_dp1_fp32_ws2_ucinfo"
    ours, _, ref, keys = ours_and_ds_to_universals(run_ckptconv, case, tmp_path)
    assert keys["1.out.weight"] == ["cat_dim", "param"] and keys["1.norm.weight"] == ["param"]
    got = engine_load(case, tmp_path / "ours", 1, 1, tmp_path / "pp1tp2.pt", 2)
    assert_loaded_is_reference(got, ref)
    assert_one_step_ran(got)


def test_tensor_parallel_without_patterns_is_not_written_universal(tmp_path, run_ckptconv):
    """Without universal_checkpoint_info a universal checkpoint (each
    parameter whole) would need a guessed concatenation: refused, exit 3,
    nothing written."""
    r = run_ckptconv("reshard", PARALLEL / "tp2_fp32_ws2", "-o", tmp_path / TAG, "--layout", "deepspeed-universal")
    assert r.returncode == 3, r.stderr
    assert "tensor-parallel ranks that the checkpoint does not say how to merge" in r.stderr
    assert not (tmp_path / TAG).exists() and not (tmp_path / "latest_universal").exists()
