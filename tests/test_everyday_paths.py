"""The everyday paths a new user takes (#36 rows 7-10 and the items after the
table), each run as a user types it: --tag completion, validate's totals
when a rank file is missing, usage errors that name what was typed,
`-o DIR/`, --exclude-frozen, a fast --version, inspect --only/--keys with a
parameter count, diff --summary and a read-only output directory.

Every expected value comes from real torch / safetensors reading the same
fixture in this run, or from the fixture's own metadata."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DCP = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws2"
ZERO = REPO / "testdata" / "zero"


def _folder_of_steps(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    for step in (100, 200):
        shutil.copytree(DCP, root / f"step-{step}")
    return root


def _bash_complete(ckptconv: Path, *words: str) -> list[str]:
    script = subprocess.run([str(ckptconv), "completion", "bash"], capture_output=True, text=True).stdout
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in (str(ckptconv), *words))
    prog = (f"{script}\nCOMP_WORDS=({quoted})\nCOMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n"
            "_ckptconv\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    r = subprocess.run(["bash", "-c", prog], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


# ---- row 7: completion after --tag offers the tags inside SRC ----------------

def test_tag_completion_offers_the_tags_inside_src(tmp_path, ckptconv, run_ckptconv):
    root = _folder_of_steps(tmp_path)
    r = run_ckptconv("inspect", root, "--tags")
    assert r.returncode == 0 and r.stdout.split() == ["latest", "step-100", "step-200"], r.stdout
    assert _bash_complete(ckptconv, "reshard", str(root), "--tag", "") == ["latest", "step-100", "step-200"]
    assert _bash_complete(ckptconv, "validate", str(root), "--tag", "step-2") == ["step-200"]
    # diff: --tag-b completes from B, the second path on the line
    assert _bash_complete(ckptconv, "diff", str(DCP), str(root), "--tag-b", "s") == ["step-100", "step-200"]
    assert _bash_complete(ckptconv, "diff", str(root), str(DCP), "--tag-b", "") == []
    # a DeepSpeed folder: its tags
    assert _bash_complete(ckptconv, "inspect", str(ZERO / "z2_bf16_ws2"), "--tag", "") == ["latest", "global_step3"]
    # a single checkpoint has none
    assert run_ckptconv("inspect", DCP, "--tags").stdout == ""


def test_zsh_completion_has_the_tag_function(run_ckptconv):
    script = run_ckptconv("completion", "zsh").stdout
    assert "_ckptconv_tags() {" in script and "inspect $src --tags" in script
    assert "'--tag[" in script and ":tag:{_ckptconv_tags 1}'" in script and ":tag:{_ckptconv_tags 2}'" in script
    if shutil.which("zsh"):
        r = subprocess.run(["zsh", "-n"], input=script, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


# ---- row 8: validate's totals come from the metadata ---------------------------

def test_validate_with_a_missing_rank_file_counts_from_the_metadata(tmp_path, run_ckptconv):
    ckpt = tmp_path / "step-300"
    shutil.copytree(DCP, ckpt)
    (ckpt / "__1_0.distcp").unlink()
    whole = json.loads(run_ckptconv("validate", DCP, "--json").stdout)["summary"]
    r = run_ckptconv("validate", ckpt)
    assert r.returncode == 1, r.stderr
    first = r.stdout.splitlines()[0]
    assert (f"{whole['files']} files (1 missing), {whole['tensors']} tensors" in first
            and f"{whole['tensors']} not read" in first), first
    summary = json.loads(run_ckptconv("validate", ckpt, "--json").stdout)["summary"]
    assert summary["files"] == whole["files"] == 3 and summary["files_missing"] == 1
    assert summary["tensors"] == whole["tensors"] == 25 and summary["tensor_bytes"] == whole["tensor_bytes"]
    assert summary["tensors_unread"] == 25  # FSDP2 shards every tensor over both ranks
    assert "files_missing" not in whole and "tensors_unread" not in whole


def test_world_size_mismatch_is_its_own_kind(run_ckptconv):
    r = run_ckptconv("validate", DCP, "--expect-world-size", "4")
    assert r.returncode == 1
    assert "problem 1 [WorldSize]: world size is 2, expected 4" in r.stdout, r.stdout
    problems = json.loads(run_ckptconv("validate", DCP, "--expect-world-size", "4", "--json").stdout)["problems"]
    assert [p["kind"] for p in problems] == ["WorldSize"] and problems[0]["code"] == "DataLoss"
    ok = json.loads(run_ckptconv("validate", DCP, "--expect-world-size", "2", "--json").stdout)
    assert ok["problems"] == [] and ok["status"] == "valid"


# ---- row 9: usage errors name what was typed -----------------------------------

@pytest.mark.parametrize("typed, said, hint", [
    (["--only-model"], "consolidate has no option --only-model", "did you mean '--only model' for '--only-model'?"),
    (["--only_optim"], "consolidate has no option --only_optim", "did you mean '--only optim' for '--only_optim'?"),
    (["--output-file", "{t}/a.pt"], "consolidate has no option --output-file",
     "did you mean '--output' for '--output-file'?"),
])
def test_unknown_option_is_named_with_a_suggestion(typed, said, hint, tmp_path, run_ckptconv):
    args = [a.replace("{t}", str(tmp_path)) for a in typed]
    extra = [] if "--output-file" in typed else ["-o", tmp_path / "a.pt"]
    r = run_ckptconv("consolidate", DCP, *args, *extra)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == f"error: {said}", r.stderr
    assert hint in r.stderr and "--output is required" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_arguments_are_echoed_as_typed(tmp_path, run_ckptconv):
    r = run_ckptconv("consolidat", DCP, "-o", tmp_path / "a.pt")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == "error: 'consolidat' is not a ckptconv command", r.stderr
    assert "did you mean 'consolidate'?" in r.stderr
    r = run_ckptconv("inspect", DCP, "extra1", "extra2")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == f"error: inspect takes 1 argument, got 3: {DCP} extra1 extra2", r.stderr


# ---- row 10: -o DIR/ -----------------------------------------------------------

def test_output_directory_writes_what_hugging_face_tools_write(tmp_path, run_ckptconv):
    model_pt = tmp_path / "model.pt"
    assert run_ckptconv("consolidate", DCP, "--only", "model", "-o", model_pt).returncode == 0
    want = torch.load(model_pt, weights_only=True)

    r = run_ckptconv("consolidate", DCP, "--only", "model", "-o", f"{tmp_path}/hf/")  # created
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["model.safetensors"]
    got = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

    # sharded with an index as save_pretrained names them (here a 200-byte limit)
    r = run_ckptconv("consolidate", DCP, "--only", "model", "--max-shard-size", "200", "-o", f"{tmp_path}/sharded/")
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    merged = {}
    for shard in shards:
        part = load_file(tmp_path / "sharded" / shard)
        assert all(index["weight_map"][k] == shard for k in part)
        merged.update(part)
    assert set(merged) == set(want) and all(torch.equal(merged[k], want[k]) for k in want)

    # --format pt: pytorch_model.bin, as zero_to_fp32 and accelerate merge-weights write it
    (tmp_path / "existing").mkdir()
    r = run_ckptconv("consolidate", DCP, "--only", "model", "--format", "pt", "-o", tmp_path / "existing")
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "existing" / "pytorch_model.bin", weights_only=True)
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)

    # more than a model: full.* (a loader given model.* expects weights only)
    full = torch.load(DCP.parent / "fsdp2_adamw_ws2.ref.pt", weights_only=True)
    r = run_ckptconv("consolidate", DCP, "--format", "pt", "-o", f"{tmp_path}/all/")
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "all" / "full.pt", weights_only=True)
    assert set(got) == set(full) and torch.equal(got["model"]["fc1.weight"], full["model"]["fc1.weight"])


def test_output_directory_left_nothing_when_the_job_fails(tmp_path, run_ckptconv):
    r = run_ckptconv("consolidate", tmp_path / "nope", "-o", f"{tmp_path}/new/deeper/")
    assert r.returncode == 3 and not (tmp_path / "new").exists()
    r = run_ckptconv("consolidate", DCP, "--format", "hdf5", "--max-shard-size", "1K", "-o", f"{tmp_path}/h/")
    assert r.returncode == 2 and "--max-shard-size applies to safetensors output only" in r.stderr
    assert list(tmp_path.iterdir()) == []


# ---- --exclude-frozen ----------------------------------------------------------

@pytest.mark.parametrize("case", ["z1_bf16_ws2", "z2_bf16_ws2", "z3_bf16_ws2"])
def test_exclude_frozen_drops_what_deepspeed_did_not_train(case, tmp_path, run_ckptconv):
    live = torch.load(ZERO / case / "reference_live.pt", weights_only=True)
    out = tmp_path / "m.pt"
    r = run_ckptconv("consolidate", ZERO / case, "--only", "model", "--exclude-frozen", "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)
    everything = torch.load(_consolidated(run_ckptconv, ZERO / case, tmp_path), weights_only=True)
    trained = set(live["model"]) | set(live["tied"])
    buffers = set(live["buffers"])
    assert set(got) == trained | buffers and "frozen.weight" in everything and "frozen.weight" not in got
    assert all(torch.equal(got[k], everything[k]) for k in got)


def _consolidated(run_ckptconv, src, tmp_path) -> Path:
    out = tmp_path / "all.pt"
    assert run_ckptconv("consolidate", src, "--only", "model", "-o", out).returncode == 0
    return out


def test_exclude_frozen_is_refused_where_the_source_does_not_record_it(tmp_path, run_ckptconv):
    r = run_ckptconv("consolidate", DCP, "--exclude-frozen", "-o", tmp_path / "a.pt")
    assert r.returncode == 2 and "does not record which parameters were frozen" in r.stderr
    assert list(tmp_path.iterdir()) == []


# ---- --version, log levels, inspect, diff --summary, read-only outputs ---------

def test_version_does_not_load_libtorch(ckptconv):
    assert shutil.which("strace"), "strace not installed (scripts/setup installs it)"
    r = subprocess.run(["strace", "-f", "-e", "trace=openat", str(ckptconv), "--version"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("ckptconv ") and "LibTorch " in r.stdout, r.stdout
    assert "libtorch_cpu.so" not in r.stderr and "libckpt_torch" not in r.stderr
    r = subprocess.run([str(ckptconv), "version"], capture_output=True, text=True)
    assert r.returncode == 0 and "--device auto: " in r.stdout and "CUDA " in r.stdout


def test_backend_is_logged_only_with_verbose(tmp_path, run_ckptconv):
    r = run_ckptconv("consolidate", DCP, "--dtype", "bf16", "-o", tmp_path / "a.pt")
    assert r.returncode == 0 and "backend:" not in r.stderr, r.stderr
    r = run_ckptconv("-v", "consolidate", DCP, "--dtype", "bf16", "-o", tmp_path / "b.pt")
    assert r.returncode == 0 and "backend: cpu" in r.stderr


def test_inspect_selects_and_counts_parameters(run_ckptconv):
    ref = torch.load(DCP.parent / "fsdp2_adamw_ws2.ref.pt", weights_only=True)
    numel = sum(t.numel() for t in ref["model"].values())
    r = run_ckptconv("inspect", DCP)
    assert r.returncode == 0
    assert f"  parameters: {numel:,} in {len(ref['model'])} model tensors" in r.stdout, r.stdout
    r = run_ckptconv("inspect", DCP, "--only", "model", "--keys", r"^fc1\.")
    lines = [ln.split()[0] for ln in r.stdout.splitlines()[1:] if not ln.startswith(" ")]
    assert r.returncode == 0 and lines == ["fc1.weight", "fc1.bias"], r.stdout
    n = ref["model"]["fc1.weight"].numel() + ref["model"]["fc1.bias"].numel()
    assert f"  parameters: {n:,} in 2 model tensors" in r.stdout
    r = run_ckptconv("inspect", DCP, "--only", "optim")
    assert r.returncode == 0 and "parameters:" not in r.stdout and "state.fc1.weight.exp_avg" in r.stdout


def test_diff_summary_gives_counts_and_the_worst_tensors(tmp_path, run_ckptconv):
    out = tmp_path / "bf16.pt"
    # model and optimizer state cast: more than ten tensors differ
    assert run_ckptconv("consolidate", DCP, "--dtype", "bf16", "--optim-dtype", "bf16", "-o", out).returncode == 0
    whole = json.loads(run_ckptconv("diff", DCP, out, "--ignore-dtype", "--json").stdout)
    r = run_ckptconv("diff", DCP, out, "--ignore-dtype", "--summary")
    assert r.returncode == 1
    s = whole["summary"]
    assert (f"tensors: {s['tensors_compared']} compared, {s['tensors_differing']} differ; elements: "
            f"{s['elements_compared']} compared, {s['elements_mismatched']} outside tolerance") in r.stdout, r.stdout
    listed = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("  ! ")]
    worst = sorted((t for t in whole["tensors"] if not t["equal"]), key=lambda t: -t["values"]["max_abs_diff"])
    assert listed == [t["path"] for t in worst[:10]] and len(listed) == 10 < s["tensors_differing"]
    assert r.stdout.rstrip().endswith("differ")


def test_read_only_output_directory_is_named(ckptconv):
    # A directory of its own under the system temp dir: pytest's tmp_path sits
    # in a 0700 folder that another user could not even reach.
    ro = Path(tempfile.mkdtemp(prefix="ckptconv-ro-"))
    ro.chmod(0o555)
    cmd = [str(ckptconv), "consolidate", str(DCP), "-o", str(ro / "a.pt")]
    if os.geteuid() == 0:  # root writes anywhere: run as nobody
        assert shutil.which("setpriv"), "running as root without setpriv (util-linux) to drop to nobody"
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 4, r.stderr
        assert f"this user may not write in {ro}" in r.stderr and "(Permission denied)" in r.stderr, r.stderr
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
        shutil.rmtree(ro)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_diff_of_a_cast_export_advises_the_tolerance_that_answers_it(dtype, tmp_path, run_ckptconv):
    """Row 3: "does my export match?" when the export was cast: the hint names
    --ignore-dtype and the cast's rounding as --rtol, and following it gives
    `equal` (exit 0); the same advice is not given when dtypes agree."""
    out = tmp_path / "model.safetensors"
    assert run_ckptconv("consolidate", DCP, "--only", "model", "--dtype", dtype, "-o", out).returncode == 0
    r = run_ckptconv("diff", DCP, out, "--only", "model")
    assert r.returncode == 1
    hint = [ln for ln in r.stdout.splitlines() if ln.startswith("hint: ")]
    assert len(hint) == 1 and "7 tensors differ in dtype" in hint[0], r.stdout
    rtol = hint[0].split("--rtol ")[1].split()[0]
    assert float(rtol) == {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}[dtype]
    r = run_ckptconv("diff", DCP, out, "--only", "model", "--ignore-dtype", "--rtol", rtol)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("equal"), r.stdout
    same = run_ckptconv("diff", DCP, DCP.parent / "fsdp2_adamw_ws3")
    assert "hint:" not in same.stdout
