"""consolidate -o DIR/ as a Hugging Face folder export (#32, write side): the
folder holds the shards (--max-shard-size, default Hugging Face's 5 GB), the
index and the source's config.json, generation_config.json and tokenizer
files, and it appears whole or not at all: a new folder is renamed into
place, an existing one is replaced (--force) by one exchange, keeping its
other files, and a failed job leaves it as it was.

The source is a folder transformers' save_pretrained wrote
(testdata/hf/llama_tiny, tools/make_transformers_checkpoint.py).
transformers' from_pretrained, in the side environment .venv-hf
(scripts/setup-hf, which scripts/test runs), loads the export and its logits
equal the original's (tests/hf_from_pretrained.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HF = REPO / "testdata" / "hf"
HF_PY = REPO / ".venv-hf" / "bin" / "python"
LLAMA = HF / "llama_tiny"
SIDE = ["config.json", "generation_config.json"]


def _weights(folder: Path) -> dict:
    """Every shard's tensors, merged, after checking the index names each exactly where it is."""
    out, where = {}, {}
    for f in sorted(folder.glob("*.safetensors")):
        part = load_file(f)
        assert not set(part) & set(out), f
        out.update(part)
        where.update(dict.fromkeys(part, f.name))
    index = folder / "model.safetensors.index.json"
    if index.exists():
        meta = json.loads(index.read_text())
        assert meta["weight_map"] == where
        assert meta["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in out.values())
    return out


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("shard", [None, "3000"])
def test_export_is_a_complete_hugging_face_folder(shard, tmp_path, run_ckptconv):
    out = tmp_path / "new" / "export"
    args = ["--max-shard-size", shard] if shard else []
    r = run_ckptconv("consolidate", LLAMA, "-o", f"{out}/", *args)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    for side in SIDE:  # carried byte for byte
        assert (out / side).read_bytes() == (LLAMA / side).read_bytes()
    if shard:
        assert "model.safetensors.index.json" in names and "model-00001-of-00003.safetensors" in names, names
    else:
        assert names == sorted(SIDE + ["model.safetensors"])
    assert _equal(_weights(out), torch.load(HF / "llama_tiny.ref.pt", weights_only=True))
    assert not list(out.parent.glob("*.tmp-*"))


def test_from_pretrained_loads_the_export(tmp_path, run_ckptconv):
    """transformers runs in the side environment .venv-hf (scripts/setup-hf,
    which scripts/test runs): tests/hf_from_pretrained.py."""
    assert HF_PY.exists(), f"no {HF_PY}: scripts/setup-hf makes it (scripts/test does)"
    out = tmp_path / "export"
    assert run_ckptconv("consolidate", LLAMA, "--dtype", "bf16", "-o", f"{out}/").returncode == 0
    r = subprocess.run([str(HF_PY), str(REPO / "tests" / "hf_from_pretrained.py"), str(LLAMA), str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr


def test_force_replaces_an_existing_folder_in_one_exchange(tmp_path, run_ckptconv):
    out = tmp_path / "export"
    assert run_ckptconv("consolidate", LLAMA, "-o", f"{out}/", "--max-shard-size", "2000").returncode == 0
    (out / "README.md").write_text("my notes\n")
    (out / "extra").mkdir()
    (out / "extra" / "kept.txt").write_text("kept\n")
    before = _snapshot(out)
    r = run_ckptconv("consolidate", LLAMA, "-o", f"{out}/")
    assert r.returncode == 2 and "output exists (use --force" in r.stderr, r.stderr
    assert _snapshot(out) == before
    r = run_ckptconv("consolidate", LLAMA, "-o", f"{out}/", "--force")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(SIDE + ["README.md", "extra", "model.safetensors"]), names  # old shards and index gone
    assert (out / "README.md").read_text() == "my notes\n" and (out / "extra" / "kept.txt").read_text() == "kept\n"
    assert _equal(_weights(out), torch.load(HF / "llama_tiny.ref.pt", weights_only=True))
    assert not list(tmp_path.glob("*.tmp-*"))


def test_a_failed_export_leaves_the_folder_as_it_was(tmp_path, run_ckptconv):
    out = tmp_path / "export"
    assert run_ckptconv("consolidate", LLAMA, "-o", f"{out}/", "--max-shard-size", "2000").returncode == 0
    before = _snapshot(out)
    r = run_ckptconv("consolidate", LLAMA, "-o", f"{out}/", "--force", "--max-output-size", "1K")
    assert r.returncode == 4, r.stderr
    assert _snapshot(out) == before and not list(tmp_path.glob("*.tmp-*"))
    fresh = tmp_path / "a" / "b" / "export"
    r = run_ckptconv("consolidate", LLAMA, "-o", f"{fresh}/", "--max-output-size", "1K")
    assert r.returncode == 4 and not (tmp_path / "a").exists(), r.stderr  # no folder, no parent left behind


def test_into_an_existing_folder_without_the_model_adds_the_files(tmp_path, run_ckptconv):
    """A folder of other things (a run's outputs) is written into, never swapped:
    its files stay, a config.json it already has is kept."""
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "config.json").write_text("{}\n")
    (out / "train.log").write_text("log\n")
    r = run_ckptconv("consolidate", LLAMA, "-o", f"{out}/")
    assert r.returncode == 0, r.stderr
    assert (out / "config.json").read_text() == "{}\n" and (out / "train.log").read_text() == "log\n"
    assert (out / "generation_config.json").read_bytes() == (LLAMA / "generation_config.json").read_bytes()
    assert "kept as it is" in r.stderr
    assert _equal(_weights(out), torch.load(HF / "llama_tiny.ref.pt", weights_only=True))


def test_a_cast_export_records_its_dtype_in_config_json(tmp_path, run_ckptconv):
    """save_pretrained records the dtype it saved; from_pretrained's default ("auto") loads it."""
    out = tmp_path / "export"
    assert run_ckptconv("consolidate", LLAMA, "--dtype", "bf16", "-o", f"{out}/").returncode == 0
    config, original = (json.loads((d / "config.json").read_text()) for d in (out, LLAMA))
    assert config.pop("dtype") == "bfloat16" and original.pop("dtype") == "float32"
    assert config == original
    assert (out / "generation_config.json").read_bytes() == (LLAMA / "generation_config.json").read_bytes()
    assert {t.dtype for t in _weights(out).values()} == {torch.bfloat16}


def test_config_from_makes_a_training_checkpoints_export_loadable(tmp_path, run_ckptconv):
    """#48 row 7: a training checkpoint (here a DCP of the model, as a job
    saves it: no config, no tokenizer) exported with -o DIR/ had nothing
    from_pretrained needs; --config-from copies the HF folder's config and
    tokenizer files in, config.json's dtype set to the dtype written, and
    from_pretrained loads it equal to the original."""
    assert HF_PY.exists(), f"no {HF_PY}: scripts/setup-hf makes it (scripts/test does)"
    cfg = tmp_path / "hf-config"
    cfg.mkdir()
    for name in SIDE:
        (cfg / name).write_bytes((LLAMA / name).read_bytes())
    (cfg / "tokenizer_config.json").write_text('{"model_max_length": 8}\n')
    (cfg / "stray.safetensors").write_bytes(b"not copied: weights are never side files")
    dcp = tmp_path / "step-100"
    assert run_ckptconv("reshard", LLAMA, "--layout", "dcp", "--world-size", "2", "-o", dcp).returncode == 0
    bare = tmp_path / "bare"
    assert run_ckptconv("consolidate", dcp, "--dtype", "bf16", "-o", f"{bare}/").returncode == 0
    assert not (bare / "config.json").exists()  # what a user got before
    out = tmp_path / "export"
    r = run_ckptconv("consolidate", dcp, "--dtype", "bf16", "--config-from", cfg, "-o", f"{out}/")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(SIDE + ["model.safetensors", "tokenizer_config.json"])
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert (out / "tokenizer_config.json").read_bytes() == (cfg / "tokenizer_config.json").read_bytes()
    r = subprocess.run([str(HF_PY), str(REPO / "tests" / "hf_from_pretrained.py"), str(LLAMA), str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr
    # without a cast the config says what was written (float32 here)
    (cfg / "config.json").write_text(json.dumps({**json.loads((LLAMA / "config.json").read_text()),
                                                 "dtype": "bfloat16"}))
    out32 = tmp_path / "export32"
    assert run_ckptconv("consolidate", dcp, "--config-from", cfg, "-o", f"{out32}/").returncode == 0
    assert json.loads((out32 / "config.json").read_text())["dtype"] == "float32"
    # usage errors: a file output, --part, a folder that is not there
    r = run_ckptconv("consolidate", dcp, "--config-from", cfg, "-o", tmp_path / "x.safetensors")
    assert r.returncode == 2 and "end -o with '/'" in r.stderr, r.stderr
    r = run_ckptconv("consolidate", dcp, "--config-from", tmp_path / "nope", "-o", f"{tmp_path}/y/")
    assert r.returncode == 2 and "not a directory" in r.stderr and not (tmp_path / "y").exists(), r.stderr
