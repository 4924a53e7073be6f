"""Which checkpoint a root and --tag read (#47 rows 1 and 2: "never the wrong
checkpoint").

The fixture is one DeepSpeed run saved twice into one root by the engine
itself (testdata/zero/z2_two_steps_ws2, tools/make_zero_two_steps.py:
global_step10 and global_step20, `latest` naming global_step20), with the
live engine's values at each save. Into a copy of it ckptconv writes a
universal checkpoint of step 10 by the documented recipe, which adds
`latest_universal` naming global_step10_universal beside `latest`. Before
#47, from then on every read of the root, whatever --tag said, read the
universal tag (step 10's values, exit 0), and `--tag latest` on a DeepSpeed
root was "no tag directory 'latest'". The rule (docs/deepspeed.md, SRC): no
--tag reads what `latest` names; --tag NAME reads NAME, ZeRO or universal;
--tag latest what `latest` names; --tag latest_universal what that file
names. The first line on stderr names the folder read.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parent.parent / "testdata" / "zero" / "z2_two_steps_ws2"
TRAINABLE = ["out_bias", "l1.weight", "l1.bias", "l2.weight", "head.weight"]
STEPS = {10: "reference_live_step10.pt", 20: "reference_live.pt"}


def _run(ckptconv: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(ckptconv), *map(str, args)], capture_output=True, text=True, check=False, timeout=600)


@pytest.fixture(scope="module")
def root(tmp_path_factory, ckptconv) -> Path:
    """The two-step root with a universal tag of step 10 written into it, as docs/deepspeed.md says to."""
    root = tmp_path_factory.mktemp("tags") / "ds"
    shutil.copytree(FIXTURE, root)
    r = _run(ckptconv, "reshard", root, "--tag", "global_step10", "-o", root / "global_step10_universal",
             "--layout", "deepspeed-universal")
    assert r.returncode == 0, r.stderr
    assert (root / "latest").read_text() == "global_step20"
    assert (root / "latest_universal").read_text() == "global_step10_universal"
    return root


def _step_of(full: dict) -> int:
    """The save whose live values `full` (a consolidation) holds, bit for bit; fails when it is neither."""
    found = []
    for step, name in STEPS.items():
        ref = torch.load(FIXTURE / name, weights_only=True)
        same = all(torch.equal(full["model"][n], ref["model"][n]) for n in TRAINABLE) and all(
            torch.equal(full["optim"]["state"][n][k], ref["optim"][n][k])
            for n in TRAINABLE for k in ("exp_avg", "exp_avg_sq", "step"))
        if same:
            found.append(step)
    assert len(found) == 1, found
    assert full["global_steps"] == found[0]
    return found[0]


def _consolidate(ckptconv, src, tmp_path, *tag) -> tuple[int, str]:
    out = tmp_path / "full.pt"
    r = _run(ckptconv, "consolidate", src, *tag, "-o", out, "--force")
    assert r.returncode == 0, r.stderr
    return _step_of(torch.load(out, weights_only=True)), r.stderr.splitlines()[0]


@pytest.mark.parametrize("tag, folder, kind, step", [
    ([], "global_step20", "deepspeed-zero", 20),
    (["--tag", "global_step20"], "global_step20", "deepspeed-zero", 20),
    (["--tag", "global_step10"], "global_step10", "deepspeed-zero", 10),
    (["--tag", "global_step10_universal"], "global_step10_universal", "deepspeed-universal", 10),
    (["--tag", "latest"], "global_step20", "deepspeed-zero", 20),
    (["--tag", "latest_universal"], "global_step10_universal", "deepspeed-universal", 10),
], ids=["no-tag", "step20", "step10", "step10-universal", "latest", "latest_universal"])
def test_the_tag_named_is_the_tag_read(tag, folder, kind, step, root, tmp_path, ckptconv):
    """Each choice reads exactly that save's values, and the first line on
    stderr names the folder and why."""
    got, first = _consolidate(ckptconv, root, tmp_path, *tag)
    assert got == step
    assert first.startswith(f"info: reading {root / folder} ({kind}, "), first
    if tag:
        assert f"--tag {tag[1]}" in first, first
    else:  # no --tag: `latest` chose, and the other pointer is named
        assert "the tag `latest` names" in first and "--tag latest_universal" in first, first


def test_a_tag_that_is_not_there_is_refused(root, tmp_path, ckptconv):
    """Not the universal tag instead (before: exit 0, step 10)."""
    r = _run(ckptconv, "consolidate", root, "--tag", "global_step30", "-o", tmp_path / "x.pt")
    assert r.returncode == 3, r.stderr
    assert "no tag directory 'global_step30'" in r.stderr and "global_step10_universal" in r.stderr, r.stderr
    assert not (tmp_path / "x.pt").exists()


def test_diff_reads_each_side_s_tag(root, ckptconv):
    r = _run(ckptconv, "diff", root, root, "--tag", "global_step20", "--tag-b", "global_step10_universal")
    assert r.returncode == 1, r.stdout + r.stderr
    r = _run(ckptconv, "diff", root, root, "--tag", "global_step10", "--tag-b", "latest_universal", "--ignore-dtype")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("with_universal", [False, True], ids=["deepspeed-root", "with-universal-tag"])
def test_validate_tag_latest_reads_what_latest_names(with_universal, root, tmp_path, ckptconv):
    """#47 row 2: a CI gate `validate ROOT --tag latest` failed a good
    DeepSpeed root (exit 1, "no tag directory 'latest'")."""
    src = root if with_universal else FIXTURE
    r = _run(ckptconv, "validate", src, "--tag", "latest", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["checkpoint"] == str(src / "global_step20") and report["format"] == "deepspeed-zero", report
    assert r.stderr.splitlines()[0].startswith(f"info: reading {src / 'global_step20'} (deepspeed-zero, --tag latest")


def test_consolidate_tag_latest_on_a_deepspeed_root(tmp_path, ckptconv):
    """#47 row 2: exit 3 before, on the root as DeepSpeed left it."""
    got, first = _consolidate(ckptconv, FIXTURE, tmp_path, "--tag", "latest")
    assert got == 20 and first.startswith(f"info: reading {FIXTURE / 'global_step20'} (deepspeed-zero, "), first


def test_inspect_lists_zero_and_universal_tags(root, ckptconv):
    r = _run(ckptconv, "inspect", root)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert "a folder of 3 checkpoints" in r.stdout.splitlines()[0], r.stdout
    assert "deepspeed-zero  world size 2" in lines["global_step10"] and "complete" in lines["global_step10"]
    assert lines["global_step20"].endswith("complete  <- latest"), r.stdout
    universal = lines["global_step10_universal"]
    assert "deepspeed-universal  world size any" in universal and "INCOMPLETE" not in universal, r.stdout
    assert universal.endswith("complete  <- latest_universal"), r.stdout
    listed = json.loads(_run(ckptconv, "inspect", root, "--json").stdout)["checkpoints"]
    assert [(c["name"], c["format"], c["complete"], c["latest"], c["latest_universal"]) for c in listed] == [
        ("global_step10", "deepspeed-zero", True, False, False),
        ("global_step10_universal", "deepspeed-universal", True, False, True),
        ("global_step20", "deepspeed-zero", True, True, False)]
    r = _run(ckptconv, "inspect", root, "--tags")
    assert r.stdout.split() == ["latest", "latest_universal", "global_step10", "global_step10_universal",
                                "global_step20"], r.stdout


def test_a_universal_root_without_latest_reads_latest_universal(root, tmp_path, ckptconv):
    """A root holding only what ds_to_universal-style conversion leaves
    (latest_universal and its tag): read through latest_universal, said so."""
    ucp = tmp_path / "ucp"
    ucp.mkdir()
    shutil.copytree(root / "global_step10_universal", ucp / "global_step10_universal")
    shutil.copy(root / "latest_universal", ucp)
    got, first = _consolidate(ckptconv, ucp, tmp_path)
    assert got == 10
    assert first == (f"info: reading {ucp / 'global_step10_universal'} (deepspeed-universal, the tag "
                     "`latest_universal` names (there is no `latest`))"), first


def test_tag_on_one_checkpoint_file_is_a_usage_error(tmp_path, ckptconv):
    """--tag that would name nothing read was ignored (exit 0)."""
    r = _run(ckptconv, "consolidate", FIXTURE / "reference_fp32.pt", "--tag", "global_step10", "-o", tmp_path / "x.pt")
    assert r.returncode == 2 and "drop --tag" in r.stderr, r.stderr
    assert not (tmp_path / "x.pt").exists()


def test_tag_with_files_is_a_usage_error(tmp_path, ckptconv):
    """--files names what is read; a --tag beside it was ignored (exit 0)."""
    ranks = FIXTURE.parent.parent / "fsdp_st" / "adamw_ws2"
    r = _run(ckptconv, "consolidate", "--files", ranks / "model_rank0.pt", ranks / "model_rank1.pt",
             "--tag", "latest", "-o", tmp_path / "x.pt")
    assert r.returncode == 2 and "drop --tag" in r.stderr, r.stderr
    assert not (tmp_path / "x.pt").exists()


def test_a_run_folder_above_a_root_names_the_root(tmp_path, run_ckptconv):
    """A folder one level above the checkpoint (a run folder holding a
    Megatron-LM root as ckpt/, beside a log): the refusal names the subfolder
    to pass instead. A subfolder reached through a link is not named (the
    hint reads nothing outside the folder)."""
    legacy = FIXTURE.parent.parent / "megatron_legacy" / "gpt_tp2pp2" / "ckpt"
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(legacy, run / "ckpt")
    (run / "train.log").write_text("iteration 2\n")
    r = run_ckptconv("inspect", run)
    assert r.returncode == 3, r.stderr
    assert f"its subfolder {run / 'ckpt'} holds one: pass it instead" in r.stderr, r.stderr
    r = run_ckptconv("inspect", run / "ckpt")
    assert r.returncode == 0, r.stderr
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "ckpt").symlink_to(run / "ckpt")
    r = run_ckptconv("inspect", linked)
    assert r.returncode == 3 and "subfolder" not in r.stderr, r.stderr
