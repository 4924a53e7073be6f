"""Manifests follow tensors, not files (#48 row 3): `validate --only model
--write-manifest` records the model's tensors named as model.state_dict()
names them, with their dtype, shape and a checksum of their logical bytes,
so the same tensors verify in any layout an export or a reshard gives them,
and a changed value, dtype or a missing tensor is named. Sources are real
torch (DCP) and megatron-core (torch_dist) checkpoints from testdata/."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

TD = Path(__file__).resolve().parent.parent / "testdata"
DCP = TD / "dcp" / "fsdp2_adamw_ws2"
MEGATRON = TD / "megatron" / "gpt_tp2pp2" / "ckpt"


def ok(r):
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.mark.parametrize("src", [DCP, MEGATRON], ids=["dcp", "megatron"])
def test_a_model_manifest_verifies_every_layout_of_the_same_tensors(src, tmp_path, run_ckptconv):
    m = tmp_path / "m.json"
    ok(run_ckptconv("validate", src, "--only", "model", "--write-manifest", m))
    recorded = json.loads(m.read_text())
    keys = [t["key"] for t in recorded["tensors"]]
    exported = tmp_path / "model.safetensors"
    ok(run_ckptconv("consolidate", src, "--only", "model", "-o", exported))
    # --only is honoured: the model's tensors alone, under the names an export has
    assert sorted(keys) == sorted(load_file(exported))
    assert not any(k.startswith(("model.", "optim")) for k in keys)
    outputs = [exported]
    ok(run_ckptconv("consolidate", src, "--only", "model", "-o", f"{tmp_path}/sharded/", "--max-shard-size", "100B"))
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) >= 5
    outputs.append(tmp_path / "sharded")
    ok(run_ckptconv("consolidate", src, "--only", "model", "-o", tmp_path / "model.pt"))
    outputs.append(tmp_path / "model.pt")
    if src == DCP:  # a resharded layout of the same tensors
        ok(run_ckptconv("reshard", src, "--only", "model", "--world-size", "3", "--layout", "hf", "-o", tmp_path / "hf3"))
        outputs.append(tmp_path / "hf3")
    for out in outputs:
        r = ok(run_ckptconv("validate", out, "--manifest", m))
        assert "0 changed, 0 missing, 0 new" in r.stdout + r.stderr, (out, r.stdout + r.stderr)
    # the whole checkpoint, --only model, verifies too
    ok(run_ckptconv("validate", src, "--only", "model", "--manifest", m))


def test_a_changed_value_and_a_missing_tensor_are_named(tmp_path, run_ckptconv):
    m = tmp_path / "m.json"
    ok(run_ckptconv("validate", DCP, "--only", "model", "--write-manifest", m))
    exported = tmp_path / "model.safetensors"
    ok(run_ckptconv("consolidate", DCP, "--only", "model", "-o", exported))
    tensors = load_file(exported)
    tensors["fc1.weight"] = tensors["fc1.weight"].clone()
    tensors["fc1.weight"].view(-1)[3] += 1
    del tensors["fc2.bias"]
    save_file(tensors, tmp_path / "changed.safetensors")
    r = run_ckptconv("validate", tmp_path / "changed.safetensors", "--manifest", m)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "tensor 'fc1.weight'" in out and "tensor 'fc2.bias'" in out, out
    assert "1 changed, 1 missing, 0 new" in out, out
    # a cast is a change of dtype, named
    ok(run_ckptconv("consolidate", DCP, "--only", "model", "--dtype", "bf16", "-o", tmp_path / "bf16.pt"))
    r = run_ckptconv("validate", tmp_path / "bf16.pt", "--manifest", m)
    assert r.returncode == 1 and "was float32" in r.stdout + r.stderr and "now bfloat16" in r.stdout + r.stderr


def test_a_whole_checkpoint_manifest_names_the_optimizer_a_model_export_lacks(tmp_path, run_ckptconv):
    m = tmp_path / "all.json"
    ok(run_ckptconv("validate", DCP, "--write-manifest", m))
    keys = [t["key"] for t in json.loads(m.read_text())["tensors"]]
    assert any(k.startswith("optim.") for k in keys) and any(k.startswith("model.") for k in keys)
    ok(run_ckptconv("consolidate", DCP, "-o", tmp_path / "all.pt"))
    ok(run_ckptconv("validate", tmp_path / "all.pt", "--manifest", m))
    r = run_ckptconv("validate", tmp_path / "all.pt", "--only", "model", "--manifest", m)
    assert r.returncode == 1 and "'optim." in r.stdout + r.stderr
