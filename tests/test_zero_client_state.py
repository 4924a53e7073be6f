"""DeepSpeed client_state: `engine.save_checkpoint(dir, client_state={...})`
merges the script's own dict into the model-states file, so a ZeRO checkpoint
may hold objects of classes ckptconv's pickle allow-list does not know (here a
types.SimpleNamespace; an argparse.Namespace of the run's arguments, the common
one, is read as its dict: docs/pickle-globals.md). Such an entry is
refused naming the global, unless --only model or --only optim, which never
need it, is given: then it is skipped with a warning naming it. Nothing in it
is ever called, and nothing of it reaches an output.

The files are the committed real DeepSpeed fixtures with one entry added to the
model-states pickle exactly where DeepSpeed puts client_state (a key of the
top-level dict), pickled by CPython's own pickler at torch.save's protocol 2.
"""

from __future__ import annotations

import argparse
import types
import pickle
import pickletools
import shutil
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
ZERO = REPO / "testdata" / "zero"
sys.path.insert(0, str(REPO / "tools"))

import hostile_pickles  # noqa: E402
from pt_files import rewrite_records  # noqa: E402

CASE = "z2_bf16_ws2"


def _ops(obj) -> bytes:
    """`obj` as protocol-2 opcodes that push it: no PROTO header, no STOP, no
    unused memo writes."""
    return pickletools.optimize(pickle.dumps(obj, protocol=2))[2:-1]


def _add_entry(pt: Path, key: str, obj) -> None:
    """Sets root[key] = obj in the torch.save file `pt` (SETITEM on the root
    dict, which is on top of the stack before STOP)."""
    def change(name: str, data: bytes) -> bytes:
        if not name.endswith("/data.pkl"):
            return data
        assert data.endswith(b".")
        return data[:-1] + _ops(key) + _ops(obj) + b"s."
    rewrite_records(pt, change)


def _with_entry(tmp_path: Path, key: str, obj, file: str = "mp_rank_00_model_states.pt") -> Path:
    root = tmp_path / CASE
    shutil.copytree(ZERO / CASE, root)
    _add_entry(root / "global_step3" / file, key, obj)
    return root


def test_an_added_plain_entry_changes_nothing(tmp_path, run_ckptconv):
    """The splice itself is sound: a plain client_state entry reads as before."""
    root = _with_entry(tmp_path, "epoch", {"step": 3, "note": "ok"})
    r = run_ckptconv("consolidate", root, "--only", "model", "-o", tmp_path / "m.pt")
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "m.pt", weights_only=True)
    ref = torch.load(ZERO / CASE / "reference_fp32.pt", weights_only=True)
    assert all(torch.equal(got[k], v) for k, v in ref.items())


def test_an_argparse_namespace_is_read_as_its_dict(tmp_path, run_ckptconv):
    """The common client_state entry (issue #48): the run's args, kept as
    plain data in the output."""
    root = _with_entry(tmp_path, "args", argparse.Namespace(lr=0.1, seed=7))
    r = run_ckptconv("consolidate", root, "-o", tmp_path / "o.pt")
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "o.pt", weights_only=True)
    assert got["client_state"]["args"] == {"lr": 0.1, "seed": 7}


def test_unknown_client_state_object_is_refused_naming_it(tmp_path, run_ckptconv):
    root = _with_entry(tmp_path, "args", types.SimpleNamespace(lr=0.1, seed=7))
    for cmd in (["consolidate", root, "-o", tmp_path / "o.pt"], ["validate", root], ["inspect", root]):
        r = run_ckptconv(*cmd)
        assert r.returncode == 3, (cmd, r.stdout, r.stderr)
        said = r.stdout + r.stderr  # validate reports on stdout
        assert "'args'" in said and "types.SimpleNamespace" in said, said
        assert "--only model" in said
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("only", ["model", "optim"])
def test_only_skips_an_unknown_client_state_object_with_a_warning(only, tmp_path, run_ckptconv):
    root = _with_entry(tmp_path, "args", types.SimpleNamespace(lr=0.1, seed=7))
    out = tmp_path / "o.pt"
    r = run_ckptconv("consolidate", root, "--only", only, "-o", out)
    assert r.returncode == 0, r.stderr
    assert "'args'" in r.stderr and "types.SimpleNamespace" in r.stderr and "skipped" in r.stderr
    got = torch.load(out, weights_only=True)
    if only == "model":
        ref = torch.load(ZERO / CASE / "reference_fp32.pt", weights_only=True)
        assert all(torch.equal(got[k], v) for k, v in ref.items())
    else:
        live = torch.load(ZERO / CASE / "reference_live.pt", weights_only=True)
        assert set(got["state"]) == set(live["optim"])
    r = run_ckptconv("validate", root, "--only", only)
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr


def test_unknown_global_in_an_entry_the_reader_uses_is_refused_even_with_only(tmp_path, run_ckptconv):
    root = _with_entry(tmp_path, "optimizer_state_dict", types.SimpleNamespace(lr=0.1),
                       file="bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")
    r = run_ckptconv("consolidate", root, "--only", "model", "-o", tmp_path / "o.pt")
    assert r.returncode == 3, r.stderr
    assert "optimizer_state_dict" in r.stderr and "types.SimpleNamespace" in r.stderr
    assert "rank_1" in r.stderr
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("attack", sorted(hostile_pickles.OBJECT_ATTACKS))
def test_hostile_client_state_never_runs_and_never_reaches_an_output(attack, tmp_path, run_ckptconv):
    """Without --only: exit 3. With --only model: a call shape the allow-list
    refuses (the getattr chain) is still exit 3; an unknown global (eval,
    functools.partial) is skipped with a warning naming it. Either way the
    payload never runs and the output holds none of it."""
    marker = tmp_path / "ran"
    root = _with_entry(tmp_path, "client", hostile_pickles.OBJECT_ATTACKS[attack](str(marker)))
    r = run_ckptconv("consolidate", root, "-o", tmp_path / "a.pt")
    assert r.returncode == 3, r.stderr
    assert not (tmp_path / "a.pt").exists()
    out = tmp_path / "b.pt"
    r = run_ckptconv("consolidate", root, "--only", "model", "-o", out)
    assert r.returncode in (0, 3), r.stderr
    if r.returncode == 0:
        assert "'client'" in r.stderr and "skipped" in r.stderr
        assert b"open(" not in out.read_bytes()
        torch.load(out, weights_only=True)
    else:
        assert not out.exists()
    assert not marker.exists()


def test_scheduler_client_state_and_counters_are_kept_under_deepspeeds_names(tmp_path, run_ckptconv):
    """#30 row 4: a job migrated off DeepSpeed resumes its schedule from the
    consolidation: lr_scheduler (the scheduler's state_dict), client_state
    (what the script passed to save_checkpoint, merged by DeepSpeed into the
    file's top level) and global_steps/global_samples/skipped_steps are
    kept; --only drops them. (Spliced where DeepSpeed puts them; the real
    engine's own save is the z2_sched fixture's test.)"""
    sched = {"base_lrs": [0.01, 0.003], "last_epoch": 3, "step_size": 2, "gamma": 0.5, "_step_count": 4,
             "_last_lr": [0.005, 0.0015]}
    root = _with_entry(tmp_path, "lr_scheduler", sched)
    _add_entry(root / "global_step3" / "mp_rank_00_model_states.pt", "epoch", 1)
    _add_entry(root / "global_step3" / "mp_rank_00_model_states.pt", "history", [1.0, 0.75])
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", root, "-o", out)
    assert r.returncode == 0, r.stderr
    full = torch.load(out, weights_only=True)
    assert list(full) == ["model", "optim", "lr_scheduler", "global_steps", "global_samples", "skipped_steps",
                          "client_state"]
    assert full["lr_scheduler"] == sched
    assert full["client_state"] == {"epoch": 1, "history": [1.0, 0.75]}
    assert (full["global_steps"], full["global_samples"], full["skipped_steps"]) == (3, 24, 0)
    model_only = tmp_path / "model.pt"
    assert run_ckptconv("consolidate", root, "--only", "model", "-o", model_only).returncode == 0
    assert "lr_scheduler" not in torch.load(model_only, weights_only=True)


def test_real_deepspeed_scheduler_and_client_state_are_kept(tmp_path, run_ckptconv):
    """#30 row 4 on a checkpoint real DeepSpeed wrote (z2_sched_ws2: ZeRO-2
    bf16, ws 2, a WarmupLR scheduler from ds_config and
    save_checkpoint(client_state={...})): consolidate keeps the scheduler's
    state_dict, the counters and the client_state keys exactly as the live
    engine held them at save time (case.json's training_state, recorded by
    tools/make_zero_checkpoints.py); --only model drops them."""
    import json

    case = ZERO / "z2_sched_ws2"
    recorded = json.loads((case / "case.json").read_text())["training_state"]
    client = {"epoch": 2, "samples_seen": 96, "note": "resume-here"}
    assert recorded["client_state"] == client
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", case, "-o", out)
    assert r.returncode == 0, r.stderr
    full = torch.load(out, weights_only=True)
    assert {"model", "optim"} <= set(full), sorted(full)
    assert full["model"] and full["optim"]["state"], sorted(full)
    sched = full["lr_scheduler"]
    assert sched == recorded["lr_scheduler"]
    for k, want in recorded["lr_scheduler"].items():  # same values and types: the tool copies them
        assert type(sched[k]) is type(want) and sched[k] == want, (k, sched[k], want)
    assert full["global_steps"] == 3 == recorded["global_steps"]
    assert full["global_samples"] == recorded["global_samples"]
    assert full["skipped_steps"] == recorded["skipped_steps"]
    assert full["client_state"] == client
    model_only = tmp_path / "model.pt"
    r = run_ckptconv("consolidate", case, "--only", "model", "-o", model_only)
    assert r.returncode == 0, r.stderr
    got = torch.load(model_only, weights_only=True)
    dropped = {"lr_scheduler", "client_state", "global_steps", "global_samples", "skipped_steps", "optim",
               "model", *client}
    assert not dropped & set(got), sorted(dropped & set(got))
    assert "head.weight" in got
    r = run_ckptconv("validate", case)
    assert r.returncode == 0, r.stdout + r.stderr
