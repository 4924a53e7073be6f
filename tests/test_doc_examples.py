"""Every command README.md, docs/usage.md and docs/megatron.md show, run as written (#36).

Each `ckptconv ...` line of a shell code block runs in a fresh folder that
holds what its names stand for, made from the fixtures:

- ckpt/step-1000: a DCP checkpoint at world size 8 (the examples expect 8),
  resharded from testdata/dcp/fsdp2_adamw_ws2, which real FSDP2 wrote;
- fsdp_ckpt/: per-rank ShardedTensor files (testdata/fsdp_st/adamw_ws2);
- fsdp1_ckpt/, init_state_dict.pt: FSDP1 LOCAL_STATE_DICT and raw optimizer
  files and their layout (testdata/fsdp1/torch2.15/orig_adamw_ws3);
- verl/global_step_100/actor/: veRL's DTensor files (testdata/fsdp_dt/adamw_ws2);
- outputs/checkpoint/step-100, step-200, run1/step-1000, run2/step-1000:
  copies of the DCP fixture;
- hf-model/: a Hugging Face folder written by huggingface_hub (testdata/hf/sharded);
- iter_0001000/: a megatron-core torch_dist checkpoint (testdata/megatron/gpt_tp2pp2/ckpt);
- mlm-dist/iter_0000007/: a Megatron-LM job's torch_dist checkpoint, its
  args in common.pt (testdata/megatron/gpt_tp2pp2_mlm/ckpt);
- megatron-lm/: a Megatron-LM legacy (ckpt_format=torch) save folder, its
  tracker naming iter_0000007 (testdata/megatron_legacy/gpt_tp2pp2/ckpt);
- mlm-hf/: its model consolidated by ckptconv to a safetensors folder;
- full.pt, full-bf16.safetensors, step-1000.manifest.json: made by ckptconv
  from ckpt/step-1000, unless the command itself writes that name (as for
  hf-model/).

A line fails the test when it exits non-zero, unless its comment says which
exit code to expect ("exit 1: they differ").
Synopsis lines (SRC, OUT, ...) are not commands and are left out; so is
`srun` (no Slurm here: test_parts.py covers --part auto under Slurm's
variables). The Python block of docs/usage.md runs too, with the fixture's
own model class, and its result is checked against the consolidation."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "docs" / "usage.md", REPO / "docs" / "megatron.md"]
TESTDATA = REPO / "testdata"
PLACEHOLDER = re.compile(r"\b(SRC|OUT|DST|CMD)\b|\bA B\b|bash\|zsh")
PRODUCTS = ("full.pt", "full-bf16.safetensors", "step-1000.manifest.json", "hf-model")


def _blocks(path: Path):
    """(language, first line number, lines) of every fenced code block."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start, body = lines[i][3:].strip(), i + 2, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            yield lang, start, body
        i += 1


def _shell_examples() -> list[tuple[str, str, int]]:
    out = []
    for doc in DOCS:
        for lang, start, body in _blocks(doc):
            if lang not in ("", "sh", "bash", "console"):
                continue
            for n, line in enumerate(body):
                comment = re.search(r"\s{2,}#(.*)$", line)
                expect = re.search(r"\bexit (\d)\b", comment.group(1)) if comment else None
                command = re.sub(r"\s{2,}#.*$", "", line).strip()
                if "ckptconv " not in command or command.startswith("#") or PLACEHOLDER.search(command):
                    continue
                if command.startswith(("scripts/", "srun ")):
                    continue
                out.append((f"{doc.relative_to(REPO)}:{start + n}", command, int(expect.group(1)) if expect else 0))
    return out


EXAMPLES = _shell_examples()


def _run(args, cwd=None):
    r = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


@pytest.fixture(scope="module")
def sources(tmp_path_factory, ckptconv) -> Path:
    root = tmp_path_factory.mktemp("doc-sources")
    dcp = TESTDATA / "dcp" / "fsdp2_adamw_ws2"
    (root / "ckpt").mkdir()
    _run([ckptconv, "reshard", dcp, "-o", root / "ckpt" / "step-1000", "--world-size", "8", "--layout", "dcp"])
    (root / "fsdp_ckpt").mkdir()
    for f in (TESTDATA / "fsdp_st" / "adamw_ws2").glob("*rank*.pt"):
        shutil.copy(f, root / "fsdp_ckpt")
    fsdp1 = TESTDATA / "fsdp1" / "torch2.15" / "orig_adamw_ws3"
    (root / "fsdp1_ckpt").mkdir()
    for f in fsdp1.glob("*rank*.pt"):
        shutil.copy(f, root / "fsdp1_ckpt")
    shutil.copy(fsdp1 / "layout.pt", root / "init_state_dict.pt")
    actor = root / "verl" / "global_step_100" / "actor"
    actor.mkdir(parents=True)
    for f in (TESTDATA / "fsdp_dt" / "adamw_ws2").glob("*_world_size_*"):
        shutil.copy(f, actor)
    for step in ("outputs/checkpoint/step-100", "outputs/checkpoint/step-200", "run1/step-1000", "run2/step-1000"):
        shutil.copytree(dcp, root / step)
    shutil.copytree(TESTDATA / "hf" / "sharded", root / "hf-model")
    shutil.copytree(TESTDATA / "megatron" / "gpt_tp2pp2" / "ckpt", root / "iter_0001000")
    shutil.copytree(TESTDATA / "megatron" / "gpt_tp2pp2_mlm" / "ckpt", root / "mlm-dist" / "iter_0000007")
    shutil.copytree(TESTDATA / "megatron_legacy" / "gpt_tp2pp2" / "ckpt", root / "megatron-lm")
    _run([ckptconv, "consolidate", root / "megatron-lm", "--only", "model", "-o", f"{root / 'mlm-hf'}/"])
    products = tmp_path_factory.mktemp("doc-products")
    ckpt = root / "ckpt" / "step-1000"
    _run([ckptconv, "consolidate", ckpt, "-o", products / "full.pt"])
    _run([ckptconv, "consolidate", ckpt, "--dtype", "bf16", "-o", products / "full-bf16.safetensors"])
    _run([ckptconv, "validate", ckpt, "--write-manifest", products / "step-1000.manifest.json"])
    for p in PRODUCTS[:3]:
        shutil.copy(products / p, root / p)
    return root


def _sandbox(sources: Path, tmp_path: Path, command: str) -> Path:
    """A copy of `sources` without the products `command` writes itself."""
    box = tmp_path / "box"
    shutil.copytree(sources, box)
    for p in PRODUCTS:
        if re.search(rf"(-o|--output|--write-manifest)\s+{re.escape(p)}\b", command):
            shutil.rmtree(box / p) if (box / p).is_dir() else (box / p).unlink()
    return box


def test_the_docs_show_commands(ckptconv):
    assert len(EXAMPLES) >= 30, EXAMPLES
    shown = " ".join(c for _, c, _ in EXAMPLES)
    for command in ("inspect", "consolidate", "reshard", "validate", "diff", "--part", "--version"):
        assert f" {command}" in shown, command


@pytest.mark.parametrize("where, command, expect", EXAMPLES, ids=[w for w, _, _ in EXAMPLES])
def test_every_documented_command_runs(where, command, expect, sources, tmp_path, ckptconv):
    if "jq " in command and not shutil.which("jq"):
        pytest.fail("jq is missing: scripts/setup installs it")
    if command.startswith("mpirun") and not shutil.which("mpirun"):
        pytest.fail("mpirun is missing: scripts/setup installs openmpi-bin")
    box = _sandbox(sources, tmp_path, command)
    env = dict(os.environ)
    env["PATH"] = f"{ckptconv.parent}:{Path(sys.executable).parent}:{env['PATH']}"
    # Open MPI refuses root and more ranks than cores unless told; torchrun
    # and mpirun need no other change to the line as written.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "PMI_")) and k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=box, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == expect, f"{where}: {command}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    written = re.search(r"(?:-o|--output)\s+(\S+)", command)
    if written and "--dry-run" not in command:
        assert (box / written.group(1)).exists(), f"{where}: {written.group(1)} not written"


def _python_examples() -> list[tuple[str, str]]:
    return [(f"docs/usage.md:{start}", "\n".join(body))
            for lang, start, body in _blocks(REPO / "docs" / "usage.md") if lang == "python"]


@pytest.mark.parametrize("where, code", _python_examples(), ids=[w for w, _ in _python_examples()])
def test_documented_python_loads_the_optimizer_state(where, code, sources, tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "tools"))
    try:
        from make_checkpoints import Net
    finally:
        sys.path.remove(str(REPO / "tools"))
    shutil.copy(sources / "full.pt", tmp_path / "full.pt")
    monkeypatch.chdir(tmp_path)
    scope = {"build_model": Net}
    exec(compile(code, where, "exec"), scope)  # noqa: S102 -- the documented snippet, as a user runs it
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    opt, model = scope["opt"], scope["model"]
    name_of = {id(p): n for n, p in model.named_parameters()}
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in full["optim"]["param_groups"]]
    loaded = 0
    for p, state in opt.state.items():
        want = full["optim"]["state"][name_of[id(p)]]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[key], want[key]), (name_of[id(p)], key)
        loaded += 1
    assert loaded == len(full["optim"]["state"]) > 0
