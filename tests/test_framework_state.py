"""Issue #48 rows 1 and 2: what training jobs save beside the model is read
as data (docs/pickle-globals.md, "Framework objects as data").

- Row 1: Megatron-LM's torch_dist checkpoint (testdata/megatron/gpt_tp2pp1_mlm,
  real megatron-core): common.pt's ``args`` (an argparse.Namespace holding
  ``AttnBackend.auto`` and ``torch.float32``) and the ``rng_state`` sharded
  object (numpy's MT19937 state among it). inspect/validate exit 0;
  consolidate writes them as plain data that torch.load(weights_only=True)
  loads, equal to what megatron-core itself reads from the files.
- Row 2: a real ``dcp.save`` with ``np.random.get_state()`` and numpy arrays,
  scalars and a dtype beside the model (testdata/numpy/dcp_np_rng,
  tools/make_numpy_checkpoints.py). Every command reads it; consolidate
  writes what ``a.tolist()`` / ``s.item()`` / ``dtype.str`` give; reshard
  keeps the numpy objects, so ``dcp.load`` hands back the same state.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from proofs_guard import require_side_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from make_numpy_checkpoints import plain  # noqa: E402  (the one definition of what ckptconv writes)

REPO = Path(__file__).resolve().parent.parent
MLM = REPO / "testdata" / "megatron" / "gpt_tp2pp1_mlm"
NP = REPO / "testdata" / "numpy" / "dcp_np_rng"
MEGATRON_PY = REPO / ".venv-megatron" / "bin" / "python"


def dcp_load(path) -> dict:
    """The state as the real library hands it back to the job."""
    state = {"model": torch.nn.Linear(3, 2).state_dict(), "np_rng": None, "np_extra": None}
    dcp.load(state, checkpoint_id=str(path))
    return state



# ---- row 1: Megatron-LM ----

@pytest.mark.parametrize("cmd", ["inspect", "validate"])
def test_megatron_lm_checkpoint_reads(cmd, run_ckptconv):
    r = run_ckptconv(cmd, MLM / "ckpt")
    assert r.returncode == 0, r.stdout + r.stderr
    if cmd == "inspect":
        assert "args.attention_backend" in r.stdout and "= 5" in r.stdout, r.stdout
        assert "np_rng_state.0" in r.stdout and "'MT19937'" in r.stdout
    else:
        assert "VALID" in r.stdout


def _megatron_reads_args() -> dict:
    """vars(args) of common.pt as megatron-core itself loads it (enums as
    .value, dtypes as str)."""
    require_side_env(MEGATRON_PY, "reading common.pt with megatron-core", "scripts/setup-megatron")
    code = (
        "import enum, json, sys, torch\n"
        "import megatron.core.transformer.enums\n"
        "c = torch.load(sys.argv[1], weights_only=False)\n"
        "out = {k: (v.value if isinstance(v, enum.Enum) else str(v) if isinstance(v, torch.dtype) else v)\n"
        "       for k, v in vars(c['args']).items()}\n"
        "print(json.dumps({'args': out, 'iteration': c['iteration'], 'checkpoint_version': c['checkpoint_version'],\n"
        "                  'args_type': type(c['args']).__module__ + '.' + type(c['args']).__name__}))\n")
    r = subprocess.run([str(MEGATRON_PY), "-c", code, str(MLM / "ckpt" / "common.pt")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_megatron_lm_consolidate_carries_the_job_state_as_plain_data(tmp_path, run_ckptconv):
    out = tmp_path / "all.pt"
    r = run_ckptconv("consolidate", MLM / "ckpt", "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)  # no numpy, no argparse, no megatron in it
    ref = _megatron_reads_args()
    assert ref["args_type"] == "argparse.Namespace" and ref["args"]["attention_backend"] == 5
    assert isinstance(got["args"], dict)
    assert {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in got["args"].items()} == ref["args"]
    assert got["args"]["params_dtype"] is torch.float32
    assert got["iteration"] == ref["iteration"] and got["checkpoint_version"] == ref["checkpoint_version"]
    assert got["optimizer"]["optimizer"]["param_groups"][0]["lr"] == 0.01
    # rng_state: each rank's states, numpy's as ('MT19937', key list, pos, has_gauss, cached)
    stored = tmp_path / "stored.pt"
    dcp_to_torch_save(MLM / "ckpt", stored)
    ref_items = torch.load(stored, weights_only=False)
    for tp in range(2):
        want = ref_items[f"rng_state/shard_0.{tp}_1.2"]
        mine = got["rng_state"][0][tp]  # [pp][tp]: the object each rank stored (a list of one item)
        assert plain(mine) == plain(want[0])
        np_state = mine[0]["np_rng_state"]
        assert np_state[0] == "MT19937" and len(np_state[1]) == 624
        assert np_state[1] == want[0][0]["np_rng_state"][1].tolist()


# ---- row 2: numpy state in a DCP checkpoint ----

@pytest.mark.parametrize("cmd", [["inspect"], ["validate"], ["inspect", "--only", "model"]])
def test_numpy_dcp_reads(cmd, run_ckptconv):
    r = run_ckptconv(cmd[0], NP / "ckpt", *cmd[1:])
    assert r.returncode == 0, r.stdout + r.stderr
    if cmd == ["inspect"]:
        assert "'MT19937'" in r.stdout and "('dtype', '<f2')" in r.stdout and "[18446744073709551615, 5]" in r.stdout


def test_numpy_dcp_consolidate_writes_plain_data(tmp_path, run_ckptconv):
    out = tmp_path / "c.pt"
    r = run_ckptconv("consolidate", NP / "ckpt", "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)
    expected = json.loads((NP / "expected.json").read_text())
    extra = dict(got["np_extra"])  # (name, value) pairs
    assert {k: plain(v) for k, v in extra.items()} == expected["np_extra"]
    # the MT19937 state equals what the job saved, read back by the real library
    back = dcp_load(NP / "ckpt")
    assert got["np_rng"][0] == "MT19937" and len(got["np_rng"][1]) == 624
    assert plain(got["np_rng"]) == plain(back["np_rng"])
    assert got["np_rng"][1] == back["np_rng"][1].tolist()
    assert extra["big_u64"] == [2**64 - 1, 5]
    assert extra["fortran_i64"] == [[-2, -1, 0], [1, 2, 3]]
    assert extra["dtype"] == "<f2" and extra["lr"] == 0.5 and extra["done"] is True
    assert torch.equal(got["model"]["weight"], back["model"]["weight"])


@pytest.mark.parametrize("ws", [1, 2])
def test_numpy_dcp_reshard_keeps_numpy_as_stored(ws, tmp_path, run_ckptconv):
    out = tmp_path / f"ws{ws}"
    r = run_ckptconv("reshard", NP / "ckpt", "--world-size", ws, "-o", out)
    assert r.returncode == 0, r.stderr
    orig = dcp_load(NP / "ckpt")
    back = dcp_load(out)
    assert back["np_rng"][0] == "MT19937"
    assert isinstance(back["np_rng"][1], np.ndarray) and back["np_rng"][1].dtype == np.uint32
    assert np.array_equal(back["np_rng"][1], orig["np_rng"][1])
    assert back["np_rng"][2:] == orig["np_rng"][2:]
    rs = np.random.RandomState()
    rs.set_state(back["np_rng"])  # what a job does on resume
    ref = np.random.RandomState()
    ref.set_state(orig["np_rng"])
    assert np.array_equal(rs.rand(4), ref.rand(4))
    assert [k for k, _ in back["np_extra"]] == [k for k, _ in orig["np_extra"]]
    for (k, v), (_, w) in zip(orig["np_extra"], back["np_extra"]):
        assert type(w) is type(v), k
        if isinstance(v, np.ndarray):
            assert w.dtype == v.dtype and w.shape == v.shape and np.array_equal(w, v), k
            assert w.flags.f_contiguous == v.flags.f_contiguous, k
        else:
            assert w == v, k
    for k, v in orig["model"].items():
        assert torch.equal(back["model"][k], v)


# ---- row 4: --allow-global MODULE.NAME ----

class TrainConfig:
    """A training script's own class (registered below as myjob.config.TrainConfig)."""

    def __init__(self, lr, name):
        self.lr, self.name = lr, name


class Payload:
    """What a hostile file would hold: its __reduce__ names os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def _myjob_module():
    import types
    mod = types.ModuleType("myjob.config")
    sys_modules = __import__("sys").modules
    sys_modules.setdefault("myjob", types.ModuleType("myjob"))
    sys_modules["myjob.config"] = mod
    TrainConfig.__module__ = "myjob.config"
    TrainConfig.__qualname__ = "TrainConfig"
    mod.TrainConfig = TrainConfig
    return mod


def test_allow_global_reads_calls_as_opaque_records(tmp_path, run_ckptconv):
    _myjob_module()
    src = tmp_path / "x.pt"
    torch.save({"w": torch.arange(4.0), "cfg": TrainConfig(0.1, "run")}, src)
    r = run_ckptconv("inspect", src)
    assert r.returncode == 3
    assert "myjob.config.TrainConfig" in r.stderr and "--allow-global myjob.config.TrainConfig" in r.stderr
    out = tmp_path / "o.pt"
    r = run_ckptconv("consolidate", src, "--allow-global", "myjob.config.TrainConfig", "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)  # a plain record: nothing to import or call
    assert got["cfg"] == {"__global__": "myjob.config.TrainConfig", "args": (), "state": {"lr": 0.1, "name": "run"}}
    assert torch.equal(got["w"], torch.arange(4.0))
    r = run_ckptconv("validate", src, "--allow-global", "myjob.config.TrainConfig")
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr


def test_allow_global_never_calls_it(tmp_path, run_ckptconv):
    marker = tmp_path / "ran"
    src = tmp_path / "x.pt"
    torch.save({"w": torch.ones(2), "p": Payload(marker)}, src)
    import os
    name = f"{os.system.__module__}.system"  # posix.system
    r = run_ckptconv("consolidate", src, "-o", tmp_path / "a.pt")
    assert r.returncode == 3 and f"--allow-global {name}" in r.stderr, r.stderr
    r = run_ckptconv("consolidate", src, "--allow-global", name, "-o", tmp_path / "b.pt")
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "b.pt", weights_only=True)
    assert got["p"] == {"__global__": name, "args": (f"touch {marker}",)}
    assert not marker.exists()


def test_allow_global_dcp_reshard_keeps_the_object(tmp_path, run_ckptconv):
    _myjob_module()
    src = tmp_path / "ckpt"
    dcp.save({"model": torch.nn.Linear(3, 2).state_dict(), "cfg": TrainConfig(0.5, "job")}, checkpoint_id=str(src))
    out = tmp_path / "ws2"
    r = run_ckptconv("reshard", src, "--world-size", "2", "-o", out)
    assert r.returncode == 3 and "--allow-global myjob.config.TrainConfig" in r.stderr
    r = run_ckptconv("reshard", src, "--world-size", "2", "--allow-global", "myjob.config.TrainConfig", "-o", out)
    assert r.returncode == 0, r.stderr
    back = {"model": torch.nn.Linear(3, 2).state_dict(), "cfg": None}
    dcp.load(back, checkpoint_id=str(out))
    assert isinstance(back["cfg"], TrainConfig) and vars(back["cfg"]) == {"lr": 0.5, "name": "job"}
