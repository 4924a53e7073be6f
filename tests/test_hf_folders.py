"""Hugging Face model folders as a source (#32, first part): the folders
huggingface_hub's save_torch_state_dict wrote (what save_pretrained calls),
sharded with an index, a single model.safetensors, and shards whose index was
not copied (testdata/hf, tools/make_hf_checkpoints.py). Every command reads
them; the result is compared with safetensors' own loader and with the state
dict torch saved beside them, bit for bit (bytes are copied). An index that
disagrees with its shards is refused naming the file and tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file  # noqa: E402

HF = Path(__file__).resolve().parent.parent / "testdata" / "hf"
FOLDERS = ["sharded", "single", "shards_no_index"]


def _library_view(folder: Path) -> dict:
    """The folder's weights as safetensors' own loader gives them, every file merged."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        part = load_file(f)
        assert not set(part) & set(out)
        out.update(part)
    return out


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("folder", FOLDERS)
def test_folder_consolidates_to_what_the_libraries_read(folder, tmp_path, run_ckptconv):
    src = HF / folder
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 0, r.stderr
    got = torch.load(out, weights_only=True)
    assert _equal(got, _library_view(src))
    assert _equal(got, torch.load(HF / "reference.pt", weights_only=True))
    r = run_ckptconv("validate", src, "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["status"] == "valid" and report["format"] == "safetensors", r.stdout
    shown = json.loads(run_ckptconv("inspect", src, "--json").stdout)
    assert shown["format"] == "safetensors" and shown["totals"]["tensors"] == len(_library_view(src))
    assert shown["facts"]["hf_folder_files"] == "config.json, generation_config.json, tokenizer_config.json"
    text = run_ckptconv("inspect", src).stdout
    assert "hf_folder_files: config.json, generation_config.json, tokenizer_config.json" in text, text


def test_folders_diff_equal_and_export_back_to_a_folder(tmp_path, run_ckptconv):
    r = run_ckptconv("diff", HF / "sharded", HF / "single")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("equal"), r.stdout
    r = run_ckptconv("diff", HF / "shards_no_index", HF / "reference.pt")
    assert r.returncode == 0, r.stdout
    r = run_ckptconv("convert", HF / "single", "--max-shard-size", "200", "-o", f"{tmp_path}/again/")
    assert r.returncode == 0, r.stderr
    index = json.loads((tmp_path / "again" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert _equal(_library_view(tmp_path / "again"), _library_view(HF / "single"))


def test_folder_reshards_for_a_fine_tune_on_n_ranks(tmp_path, run_ckptconv):
    """The reverse of an export: start from an HF folder, sharded for 3 ranks
    as DCP, which torch's own dcp_to_torch_save reads back whole."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp_path / "dcp"
    r = run_ckptconv("reshard", HF / "sharded", "-o", out, "--world-size", "3", "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    dcp_to_torch_save(out, tmp_path / "back.pt")
    assert _equal(torch.load(tmp_path / "back.pt", weights_only=True), _library_view(HF / "sharded"))


def _broken(tmp_path: Path, change) -> Path:
    d = tmp_path / "sharded"
    shutil.copytree(HF / "sharded", d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    change(d, index)
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def _move(d, index):  # the index names another shard than the one holding fc1.weight
    index["weight_map"]["fc1.weight"] = "model-00001-of-00003.safetensors"


def _unlisted(d, index):  # a shard holds a tensor the index does not list
    del index["weight_map"]["fc2.bias"]


def _missing(d, index):  # a shard the index names is gone
    (d / "model-00003-of-00003.safetensors").unlink()


@pytest.mark.parametrize("change, says, tensor", [
    (_move, "weight_map puts tensor 'fc1.weight' in model-00001-of-00003.safetensors, but "
            "model-00002-of-00003.safetensors holds it", "fc1.weight"),
    (_unlisted, "holds tensor 'fc2.bias', which the index does not list", "fc2.bias"),
    (_missing, "model-00003-of-00003.safetensors", None),
])
def test_index_that_disagrees_with_its_shards_is_refused(change, says, tensor, tmp_path, run_ckptconv):
    src = _broken(tmp_path, change)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 3, r.stderr
    assert says in r.stderr and not out.exists()
    r = run_ckptconv("validate", src, "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["status"] == "problems", r.stdout
    assert any(says in p["message"] for p in report["problems"]), report["problems"]
    if tensor:
        assert any(p["key"] == tensor for p in report["problems"])
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before


def test_a_tensor_in_two_files_without_an_index_is_refused(tmp_path, run_ckptconv):
    d = tmp_path / "dup"
    shutil.copytree(HF / "shards_no_index", d)
    shutil.copy(d / "model-00001-of-00003.safetensors", d / "extra.safetensors")
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")
    assert r.returncode == 3 and "is in two shards" in r.stderr, r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_several_indexes_need_the_one_to_read(tmp_path, run_ckptconv):
    d = tmp_path / "two"
    shutil.copytree(HF / "sharded", d)
    shutil.copy(d / "model.safetensors.index.json", d / "adapter.safetensors.index.json")
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")  # model.safetensors.index.json is the model's
    assert r.returncode == 0, r.stderr
    (d / "model.safetensors.index.json").rename(d / "other.safetensors.index.json")
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "p.pt")
    assert r.returncode == 2 and "holds several safetensors indexes" in r.stderr, r.stderr


LLAMA = HF / "llama_tiny"
HF_PY = Path(__file__).resolve().parent.parent / ".venv-hf" / "bin" / "python"


def test_model_safetensors_is_read_before_an_index_beside_it(tmp_path, run_ckptconv):
    """from_pretrained reads model.safetensors when the folder has one and
    never looks at an index or shards beside it (a stale sharded save):
    ckptconv had read the index's shards instead, other weights with exit 0."""
    import subprocess

    from safetensors.torch import save_file

    d = tmp_path / "both"
    shutil.copytree(LLAMA, d)
    sharded = {}
    for f in sorted(d.glob("model-*.safetensors")):
        sharded.update(load_file(f))
    single = {k: v + 1 for k, v in sharded.items()}  # the same names, other values
    save_file(single, d / "model.safetensors", metadata={"format": "pt"})
    probe = ("import sys, torch, transformers\n"
             "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)\n"
             "torch.save({k: v.contiguous() for k, v in m.state_dict().items()}, sys.argv[2])\n")
    r = subprocess.run([str(HF_PY), "-c", probe, str(d), str(tmp_path / "hf.pt")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from_pretrained = torch.load(tmp_path / "hf.pt", weights_only=True)
    for k, v in single.items():
        assert torch.equal(from_pretrained[k], v.float()), k  # transformers took model.safetensors
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")
    assert r.returncode == 0, r.stderr
    assert "model.safetensors.index.json" in r.stderr, r.stderr  # says what it did not read
    got = torch.load(tmp_path / "o.pt", weights_only=True)
    assert set(got) == set(single)
    for k, v in single.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
