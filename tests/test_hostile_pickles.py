"""Hostile pickles through every subcommand: a checkpoint whose pickle reaches
a callable (tools/hostile_pickles.py) is refused with exit 3, names the call
or global, writes nothing, and the payload never runs. The files are written
by real torch (torch.save of objects whose __reduce__ asks for the call,
dcp.save of such an object as a bytes item, a DCP .metadata carrying one),
and a control test proves the payload is live: torch.load with
weights_only=False runs it.
"""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import hostile_pickles  # noqa: E402
from pt_files import pt_with_data_pkl  # noqa: E402

import torch
import torch.distributed.checkpoint as dcp

OBJECT_ATTACKS = sorted(hostile_pickles.OBJECT_ATTACKS)
# Opcode-level attacks that fit a torch.save data.pkl (a dict at the root is
# not required: the reader refuses before it looks at the structure).
OPCODE_ATTACKS = sorted(hostile_pickles.opcode_attacks("/unused"))


def _write_pt(path: Path, marker: Path, attack: str) -> None:
    torch.save({"w": torch.arange(4.0), "x": hostile_pickles.OBJECT_ATTACKS[attack](str(marker))}, path)


def _write_dcp_bytes_item(path: Path, marker: Path, attack: str) -> None:
    state = {"model": {"w": torch.arange(4.0)},
             "extra": hostile_pickles.OBJECT_ATTACKS[attack](str(marker))}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)


def _write_dcp_metadata(path: Path, marker: Path, attack: str) -> None:
    dcp.save({"model": {"w": torch.arange(4.0)}}, checkpoint_id=str(path), no_dist=True)
    md_path = path / ".metadata"
    with open(md_path, "rb") as f:
        md = pickle.load(f)
    md.planner_data["model.w"] = hostile_pickles.OBJECT_ATTACKS[attack](str(marker))
    md_path.write_bytes(pickle.dumps(md))


def _commands(src: Path, out: Path):
    yield "inspect", ["inspect", src], None
    yield "inspect --json", ["inspect", src, "--json"], None
    yield "validate", ["validate", src], None
    yield "validate --json", ["validate", src, "--json"], None
    yield "consolidate .pt", ["consolidate", src, "-o", out / "full.pt"], out / "full.pt"
    yield "consolidate .safetensors", ["consolidate", src, "-o", out / "full.safetensors"], out / "full.safetensors"
    yield "consolidate .h5", ["consolidate", src, "-o", out / "full.h5"], out / "full.h5"
    yield "convert", ["convert", src, "-o", out / "conv.pt"], out / "conv.pt"
    yield "reshard dcp", ["reshard", src, "-o", out / "resharded", "--world-size", "2", "--layout", "dcp"], out / "resharded"
    yield "diff", ["diff", src, src], None


def _assert_refused_everywhere(run_ckptconv, src: Path, tmp_path: Path, marker: Path, expect: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name, args, output in _commands(src, out):
        if name == "convert" and src.is_dir():
            continue  # convert takes single files; consolidate covers directories
        r = run_ckptconv(*args)
        assert r.returncode == 3, f"{name}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert expect in r.stderr + r.stdout, f"{name}: the refusal does not name {expect!r}:\n{r.stderr}"
        if output is not None:
            assert not output.exists(), f"{name}: wrote {output}"
        assert not marker.exists(), f"{name}: the payload ran"
    assert list(out.iterdir()) == [], f"left behind: {list(out.iterdir())}"


# What each attack's refusal names: the call, or the global the allow-list lacks.
EXPECT = {
    "getattr_chain": "builtins.getattr(builtins.getattr, '__self__')",
    "direct_eval": "builtins.eval",
    "attrgetter": "operator.attrgetter",
    "partial": "functools.partial",
    "copyreg": "copyreg._reconstructor",
    "defaultdict": "collections.defaultdict",
}


@pytest.mark.parametrize("attack", OBJECT_ATTACKS)
def test_pt_attack_refused_by_every_subcommand(attack, tmp_path, run_ckptconv):
    marker = tmp_path / "pwned"
    src = tmp_path / "hostile.pt"
    _write_pt(src, marker, attack)
    _assert_refused_everywhere(run_ckptconv, src, tmp_path, marker, EXPECT[attack])


@pytest.mark.parametrize("attack", OPCODE_ATTACKS)
def test_pt_opcode_attack_refused(attack, tmp_path, run_ckptconv):
    marker = tmp_path / "pwned"
    src = tmp_path / "hostile.pt"
    pt_with_data_pkl(src, hostile_pickles.opcode_attacks(str(marker))[attack])
    for args in (["validate", src], ["consolidate", src, "-o", tmp_path / "o.pt"], ["inspect", src]):
        r = run_ckptconv(*args)
        assert r.returncode == 3, f"{args[0]}: exit {r.returncode}\n{r.stderr}"
        text = r.stdout + r.stderr  # validate reports on stdout, the others on stderr
        assert "refusing" in text or "not one a checkpoint needs" in text, text
    assert not (tmp_path / "o.pt").exists()
    assert not marker.exists()


DCP_CASES = [("bytes_item", "getattr_chain"), ("bytes_item", "partial"),
             ("metadata", "getattr_chain"), ("metadata", "direct_eval")]


@pytest.mark.parametrize("where,attack", DCP_CASES)
def test_dcp_attack_refused_by_every_subcommand(where, attack, tmp_path, run_ckptconv):
    """In a bytes item (a torch.save pickle inside a .distcp) or in .metadata."""
    marker = tmp_path / "pwned"
    src = tmp_path / "hostile_dcp"
    write = _write_dcp_bytes_item if where == "bytes_item" else _write_dcp_metadata
    write(src, marker, attack)
    _assert_refused_everywhere(run_ckptconv, src, tmp_path, marker, EXPECT[attack])


def test_getattr_chain_is_live_in_torch(tmp_path):
    """Control: the fixtures above really carry a working payload. torch's own
    weights_only=False loaders run it (in a child process, on a marker file)."""
    marker = tmp_path / "pwned"
    pt = tmp_path / "hostile.pt"
    _write_pt(pt, marker, "getattr_chain")
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(pt)!r}, weights_only=False)"], check=True)
    assert marker.exists()
    marker.unlink()
    d = tmp_path / "hostile_dcp"
    _write_dcp_bytes_item(d, marker, "getattr_chain")
    code = ("import torch, torch.distributed.checkpoint as dcp\n"
            "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\n"
            f"dcp_to_torch_save({str(d)!r}, {str(tmp_path / 'ref.pt')!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert marker.exists()


def test_plain_data_values_still_pass(tmp_path, run_ckptconv):
    """The policy is not a blanket refusal: a state dict with the value kinds
    real checkpoints hold (OrderedDict with _metadata, tuples, bytes, sets,
    torch.Size, torch.device, dtypes, Parameters) converts, and torch reads
    the output with weights_only=True."""
    model = torch.nn.Linear(3, 2)
    sd = model.state_dict()  # an OrderedDict with _metadata
    state = {"model": sd, "p": torch.nn.Parameter(torch.ones(2)), "betas": (0.9, 0.999), "b": b"\x00\xff",
             "s": {1, 2}, "size": torch.Size([2, 3]), "dev": torch.device("cpu"), "dt": torch.float16}
    src = tmp_path / "plain.pt"
    torch.save(state, src)
    r = run_ckptconv("validate", src)
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "out.pt")
    assert r.returncode == 0, r.stderr
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert out["betas"] == (0.9, 0.999) and out["b"] == b"\x00\xff" and out["s"] == {1, 2}
    assert out["size"] == torch.Size([2, 3]) and out["dev"] == torch.device("cpu") and out["dt"] == torch.float16
    assert torch.equal(out["model"]["weight"], sd["weight"])
