"""Hugging Face folders that lost tensors silently (#47 rows 3-6), on folders
the real libraries wrote (testdata/hf, tools/make_hf_edge_checkpoints.py):

- tied embeddings: save_pretrained stores model.embed_tokens.weight only,
  model.state_dict() holds lm_head.weight too. A DCP reshard must hold every
  key the model's state dict has (torch's own dcp.save of that state dict
  stores lm_head.weight), so that an FSDP2 job's
  dcp.load(get_model_state_dict(model)) finds it; per-rank files and .pt as
  well, while a folder export stores it once, as save_pretrained does;
- a PEFT adapter beside the model is no part of the model: read alone when
  named, listed by inspect;
- pytorch_model.bin folders (shards + index) read like safetensors ones;
- a ckptconv.tree that names only part of the files read is refused
  (exit 3), never followed to drop the other files' tensors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parent.parent
HF = REPO / "testdata" / "hf"
HF_PY = REPO / ".venv-hf" / "bin" / "python"
TIED = HF / "llama_tied"
TIED_BIN = HF / "llama_tied_bin"
PEFT = HF / "peft_lora"


def _ref() -> dict:
    """torch.save(model.state_dict()) of the tied model: every key, lm_head sharing the embedding."""
    return torch.load(HF / "llama_tied.ref.pt", weights_only=True)


def _equal(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _bin_shards(folder: Path) -> dict:
    out = {}
    for f in sorted(folder.glob("*.bin")):
        part = torch.load(f, weights_only=True)
        assert not set(part) & set(out), f
        out.update(part)
    return out


# ---------------------------------------------------------------- tied embeddings


def test_tied_embeddings_reshard_to_dcp_holds_what_the_models_state_dict_has(tmp_path, run_ckptconv):
    stored = load_file(TIED / "model.safetensors")
    assert "lm_head.weight" not in stored  # what save_pretrained wrote
    out = tmp_path / "dcp"
    r = run_ckptconv("reshard", TIED, "-o", out, "--world-size", "2", "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    # the model's own state dict, as a job holds it (lm_head sharing the embedding), other values in it
    want = _ref()
    state = _ref()
    for v in state.values():
        v.zero_()
    dcp.load(state, checkpoint_id=str(out))  # raises "Missing key in checkpoint state_dict" for a key it lacks
    assert _equal(state, want)
    assert torch.equal(state["lm_head.weight"], stored["model.embed_tokens.weight"])
    assert "config.json: tie_word_embeddings true: lm_head.weight is model.embed_tokens.weight" in r.stderr, r.stderr
    # torch's own dcp.save of that state dict stores the same keys, shapes and dtypes
    torch_dir = tmp_path / "torch"
    dcp.save(_ref(), checkpoint_id=str(torch_dir))
    ours = dcp.FileSystemReader(str(out)).read_metadata().state_dict_metadata
    theirs = dcp.FileSystemReader(str(torch_dir)).read_metadata().state_dict_metadata
    assert set(ours) == set(theirs) == set(want)
    for k, md in theirs.items():
        assert (ours[k].size, ours[k].properties.dtype) == (md.size, md.properties.dtype), k


def test_tied_embeddings_fsdp2_job_resumes_from_the_reshard(tmp_path, run_ckptconv):
    """The FSDP2 job of the issue, in .venv-hf (transformers): tests/hf_tied_fsdp2_load.py."""
    assert HF_PY.exists(), f"no {HF_PY}: scripts/setup-hf makes it (scripts/test does)"
    out = tmp_path / "dcp"
    assert run_ckptconv("reshard", TIED, "-o", out, "--world-size", "2", "--layout", "dcp").returncode == 0
    r = subprocess.run([str(HF_PY), str(REPO / "tests" / "hf_tied_fsdp2_load.py"), str(TIED), str(out),
                        str(tmp_path / "store")], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr


def test_tied_embeddings_in_rank_files_and_pt_but_stored_once_in_an_export(tmp_path, run_ckptconv):
    want = _ref()
    # per-rank files: at world size 1 FSDP1's files hold plain tensors, every key of the model
    r = run_ckptconv("reshard", TIED, "-o", tmp_path / "ranks", "--world-size", "1", "--layout",
                     "fsdp-sharded-tensor")
    assert r.returncode == 0, r.stderr
    assert _equal(torch.load(tmp_path / "ranks" / "model_rank0.pt", weights_only=True), want)
    # a .pt is torch.save(model.state_dict()): both keys, one storage
    assert run_ckptconv("consolidate", TIED, "-o", tmp_path / "full.pt").returncode == 0
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    assert _equal(full, want)
    assert full["lm_head.weight"].untyped_storage().data_ptr() == \
        full["model.embed_tokens.weight"].untyped_storage().data_ptr()
    # a folder export is what save_pretrained writes: the tied weight stored once
    assert run_ckptconv("consolidate", TIED, "-o", f"{tmp_path}/export/").returncode == 0
    assert _equal(load_file(tmp_path / "export" / "model.safetensors"), load_file(TIED / "model.safetensors"))
    assert (tmp_path / "export" / "config.json").read_bytes() == (TIED / "config.json").read_bytes()
    # ... and reads back with every key
    r = run_ckptconv("diff", tmp_path / "export", HF / "llama_tied.ref.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    shown = json.loads(run_ckptconv("inspect", TIED, "--json").stdout)
    assert shown["facts"]["hf_tied_weights"] == "lm_head.weight = model.embed_tokens.weight"


def test_a_tie_that_cannot_be_established_is_said_naming_config_json(tmp_path, run_ckptconv):
    d = tmp_path / "net"
    shutil.copytree(HF / "single", d)  # a state dict without any pair ckptconv knows (emb.weight, fc1, fc2)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    r = run_ckptconv("reshard", d, "-o", tmp_path / "dcp", "--world-size", "2", "--layout", "dcp")
    assert r.returncode == 0, r.stderr
    assert f"{d}/config.json: tie_word_embeddings is true, but no tied pair ckptconv knows fits" in r.stderr, \
        r.stderr
    # a config.json that is not JSON is a damaged folder, refused naming it
    # (reading on would drop the tied key with exit 0), as from_pretrained does
    (d / "config.json").write_text("{not json")
    r = run_ckptconv("inspect", d)
    assert r.returncode == 3 and f"{d}/config.json: not readable as JSON" in r.stderr, r.stderr
    (d / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    r = run_ckptconv("inspect", d)
    assert r.returncode == 0 and "config.json" not in r.stderr, r.stderr


# ---------------------------------------------------------------- PEFT adapters


def test_a_peft_adapter_is_not_mixed_into_the_model(tmp_path, run_ckptconv):
    model, adapter = load_file(PEFT / "model.safetensors"), load_file(PEFT / "adapter_model.safetensors")
    assert run_ckptconv("consolidate", PEFT, "-o", tmp_path / "model.pt").returncode == 0
    assert _equal(torch.load(tmp_path / "model.pt", weights_only=True), model)
    shown = json.loads(run_ckptconv("inspect", PEFT, "--json").stdout)
    assert shown["totals"]["tensors"] == len(model)
    assert shown["facts"]["hf_adapter"].startswith("adapter_model.safetensors: a PEFT adapter"), shown["facts"]
    assert "adapter_model.safetensors" in run_ckptconv("inspect", PEFT).stdout
    r = run_ckptconv("validate", PEFT, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["summary"]["tensors"] == len(model), r.stdout
    # named, the adapter is read on its own
    assert run_ckptconv("consolidate", PEFT / "adapter_model.safetensors", "-o", tmp_path / "lora.pt").returncode == 0
    assert _equal(torch.load(tmp_path / "lora.pt", weights_only=True), adapter)
    # an export of the model carries neither the adapter nor its config (from_pretrained would look for it)
    assert run_ckptconv("consolidate", PEFT, "-o", f"{tmp_path}/export/").returncode == 0
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors"]
    # a folder holding only the adapter is no model: the message names the file to pass
    only = tmp_path / "only"
    only.mkdir()
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copy(PEFT / f, only / f)
    r = run_ckptconv("consolidate", only, "-o", tmp_path / "o.pt")
    assert r.returncode == 2 and f"{only}/adapter_model.safetensors" in r.stderr, r.stderr


# ---------------------------------------------------------------- pytorch_model.bin folders


def test_a_bin_folder_reads_like_the_safetensors_folder(tmp_path, run_ckptconv):
    want = _bin_shards(TIED_BIN)
    index = json.loads((TIED_BIN / "pytorch_model.bin.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and set(index["weight_map"]) == set(want)
    assert run_ckptconv("consolidate", TIED_BIN, "-o", tmp_path / "full.pt").returncode == 0
    assert _equal(torch.load(tmp_path / "full.pt", weights_only=True), want)
    shown = json.loads(run_ckptconv("inspect", TIED_BIN, "--json").stdout)
    assert shown["format"] == "pt" and shown["facts"]["hf_folder_files"] == "config.json", shown["facts"]
    r = run_ckptconv("validate", TIED_BIN, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["format"] == "pt", r.stdout
    r = run_ckptconv("diff", TIED_BIN, TIED)  # the same model as .bin and as safetensors
    assert r.returncode == 0, r.stdout + r.stderr
    # what ckptconv itself writes with --format pt reads back as a folder
    assert run_ckptconv("consolidate", TIED, "--format", "pt", "-o", f"{tmp_path}/pt/").returncode == 0
    assert sorted(p.name for p in (tmp_path / "pt").iterdir()) == [
        "config.json", "generation_config.json", "pytorch_model.bin"]
    assert run_ckptconv("consolidate", tmp_path / "pt", "-o", tmp_path / "again.pt").returncode == 0
    assert _equal(torch.load(tmp_path / "again.pt", weights_only=True), _ref())


def test_a_bin_index_that_disagrees_with_its_shards_is_refused(tmp_path, run_ckptconv):
    d = tmp_path / "bin"
    shutil.copytree(TIED_BIN, d)
    index = json.loads((d / "pytorch_model.bin.index.json").read_text())
    del index["weight_map"]["model.norm.weight"]
    (d / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")
    assert r.returncode == 3 and "holds tensor 'model.norm.weight', which the index does not list" in r.stderr, \
        r.stderr
    r = run_ckptconv("validate", d, "--json")
    assert r.returncode == 1 and any(p["key"] == "model.norm.weight" for p in json.loads(r.stdout)["problems"])


# ---------------------------------------------------------------- ckptconv.tree


def _tree_and_other(tmp_path: Path, run_ckptconv) -> Path:
    """Two shards without index: the first written by ckptconv (its header
    carries the ckptconv.tree of its own tensors), the second by safetensors."""
    d = tmp_path / "mixed"
    d.mkdir()
    src = HF / "single"
    r = run_ckptconv("consolidate", src, "--keys", r"^(emb|fc1)\.", "-o", d / "model-00001-of-00002.safetensors")
    assert r.returncode == 0, r.stderr
    rest = {k: v for k, v in load_file(src / "model.safetensors").items() if not k.startswith(("emb.", "fc1."))}
    assert rest
    save_file(rest, d / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    return d


def test_a_tree_naming_part_of_the_files_is_refused(tmp_path, run_ckptconv):
    d = _tree_and_other(tmp_path, run_ckptconv)
    says = "ckptconv.tree (the state dict ckptconv wrote) does not name tensor"
    for args in (["inspect", d], ["validate", d], ["consolidate", d, "-o", tmp_path / "o.pt"]):
        r = run_ckptconv(*args)
        assert r.returncode == 3 and says in r.stdout + r.stderr, (args, r.stdout, r.stderr)
    assert not (tmp_path / "o.pt").exists()


def test_a_tree_naming_every_tensor_is_followed_and_a_missing_shard_is_said(tmp_path, run_ckptconv):
    d = tmp_path / "ours"
    assert run_ckptconv("consolidate", HF / "single", "--max-shard-size", "200", "-o", f"{d}/").returncode == 0
    (d / "model.safetensors.index.json").unlink()  # shards copied without their index
    shards = sorted(d.glob("model-*.safetensors"))
    assert len(shards) > 2
    r = run_ckptconv("diff", d, HF / "reference.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    shards[-1].unlink()
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "o.pt")
    assert r.returncode == 3 and f"{shards[-1]}: no such shard" in r.stderr, r.stderr
    r = run_ckptconv("validate", d)
    assert r.returncode == 1 and "a file of the checkpoint is missing" in r.stdout + r.stderr, r.stdout
    assert f"{shards[-1]}: no such shard" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "folder,shard_name",
    [("shards_no_index", f"model-{i:05d}-of-00003.safetensors") for i in (1, 2, 3)]
    + [("llama_tied_bin", "pytorch_model-00002-of-00003.bin")],
)
def test_numbered_shards_without_an_index_are_all_there_or_refused(tmp_path, run_ckptconv, folder, shard_name):
    """save_pretrained's shards (no ckptconv.tree) copied without their index
    and one of them: read merged, the rest was a smaller model with exit 0.
    The names say how many shards there are."""
    d = tmp_path / "shards"
    shutil.copytree(HF / folder, d)
    for index in d.glob("*.index.json"):
        index.unlink()
    r = run_ckptconv("validate", d)
    assert r.returncode == 0, r.stdout + r.stderr  # all the shards: the model
    shard = d / shard_name
    shard.unlink()
    says = f"{shard}: no such shard: the folder has no index, and its shards' names say there are 3"
    for args, code in ((["consolidate", d, "-o", tmp_path / "o.pt"], 3), (["inspect", d], 3), (["validate", d], 1)):
        r = run_ckptconv(*args)
        assert r.returncode == code and says in r.stdout + r.stderr, (args, r.returncode, r.stdout, r.stderr)
    assert not (tmp_path / "o.pt").exists()
    assert sorted(p.name for p in d.iterdir()) == sorted(
        p.name for p in (HF / folder).iterdir() if p.name != shard.name and not p.name.endswith(".index.json")
    )


# ---------------------------------------------------------------- config.json's transformers_weights


def _from_pretrained(folder: Path, out: Path) -> subprocess.CompletedProcess:
    assert HF_PY.exists(), f"no {HF_PY}: scripts/setup-hf makes it (scripts/test does)"
    return subprocess.run([str(HF_PY), str(REPO / "tests" / "hf_state_dict.py"), str(folder), str(out)],
                          capture_output=True, text=True, timeout=600)


def _folder_naming(tmp_path: Path, name) -> Path:
    """llama_tied with a second weights file beside model.safetensors (every
    tensor + 1, as a repository holding its own consolidated.safetensors
    beside transformers' file), config.json's transformers_weights naming `name`."""
    d = tmp_path / "named"
    shutil.copytree(TIED, d)
    stored = load_file(TIED / "model.safetensors")
    save_file({k: v + 1 for k, v in stored.items()}, d / "consolidated.safetensors", metadata={"format": "pt"})
    config = json.loads((d / "config.json").read_text())
    config["transformers_weights"] = name
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d


def test_transformers_weights_names_the_file_from_pretrained_reads(tmp_path, run_ckptconv):
    """config.json's transformers_weights makes from_pretrained read that file
    and not model.safetensors; ckptconv read model.safetensors: other weights,
    exit 0."""
    d = _folder_naming(tmp_path, "consolidated.safetensors")
    r = _from_pretrained(d, tmp_path / "hf.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    want = torch.load(tmp_path / "hf.pt", weights_only=True)
    stored = load_file(TIED / "model.safetensors")
    assert torch.equal(want["model.embed_tokens.weight"], stored["model.embed_tokens.weight"] + 1)  # the named file
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "ours.pt")
    assert r.returncode == 0, r.stderr
    assert "consolidated.safetensors is the model" in r.stderr and "model.safetensors" in r.stderr, r.stderr
    got = torch.load(tmp_path / "ours.pt", weights_only=True)
    assert _equal(got, want)
    # An export names the file it writes (the source's name is not in it), and loads the same.
    r = run_ckptconv("consolidate", d, "-o", f"{tmp_path / 'export'}/")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "export" / "config.json").read_text())["transformers_weights"] == "model.safetensors"
    r = _from_pretrained(tmp_path / "export", tmp_path / "hf_export.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _equal(torch.load(tmp_path / "hf_export.pt", weights_only=True), want)


def test_transformers_weights_naming_an_index_reads_its_shards(tmp_path, run_ckptconv):
    d = _folder_naming(tmp_path, "alt.safetensors.index.json")
    (d / "consolidated.safetensors").unlink()
    stored = load_file(TIED / "model.safetensors")
    names = sorted(stored)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        shard = f"alt-{i + 1:05d}-of-00002.safetensors"
        save_file({k: stored[k] * 2 for k in part}, d / shard, metadata={"format": "pt"})
        weight_map.update({k: shard for k in part})
    (d / "alt.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    r = _from_pretrained(d, tmp_path / "hf.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    want = torch.load(tmp_path / "hf.pt", weights_only=True)
    assert torch.equal(want["model.norm.weight"], stored["model.norm.weight"] * 2)
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "ours.pt")
    assert r.returncode == 0, r.stderr
    assert _equal(torch.load(tmp_path / "ours.pt", weights_only=True), want)


@pytest.mark.parametrize(
    "name,says",
    [
        ("../model.safetensors", "not a file inside the model folder"),
        ("/etc/passwd.safetensors", "not a file inside the model folder"),
        ("weights.bin", "neither a .safetensors file nor a .safetensors.index.json"),
        ("gone.safetensors", "which is not in the folder"),
    ],
)
def test_transformers_weights_that_from_pretrained_refuses_is_refused(tmp_path, run_ckptconv, name, says):
    d = _folder_naming(tmp_path, name)
    (tmp_path / "model.safetensors").write_bytes((TIED / "model.safetensors").read_bytes())  # what ../ would reach
    r = _from_pretrained(d, tmp_path / "hf.pt")
    assert r.returncode == 3 and "refused" in r.stdout, r.stdout + r.stderr
    unsafe = "inside" in says  # validate: UNSAFE is exit 3, any other problem 1
    for args, code in (
        (["consolidate", d, "-o", tmp_path / "o.pt"], 3),
        (["inspect", d], 3),
        (["validate", d], 3 if unsafe else 1),
    ):
        r = run_ckptconv(*args)
        said = r.stdout + r.stderr
        assert r.returncode == code and says in said and "config.json" in said, (args, r.returncode, said)
    assert not (tmp_path / "o.pt").exists()


def test_bin_weights_beside_stray_safetensors_are_what_from_pretrained_reads(tmp_path, run_ckptconv):
    """Without model.safetensors or an index, from_pretrained reads
    pytorch_model.bin (here its index and shards), whatever .safetensors lie
    beside it; ckptconv read the .safetensors: other weights, exit 0."""
    d = tmp_path / "bin_and_stray"
    shutil.copytree(TIED_BIN, d)
    stray = {k: v + 1 for k, v in _bin_shards(TIED_BIN).items()}
    save_file(stray, d / "consolidated.safetensors", metadata={"format": "pt"})
    r = _from_pretrained(d, tmp_path / "hf.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    want = torch.load(tmp_path / "hf.pt", weights_only=True)
    assert torch.equal(want["model.norm.weight"], _bin_shards(TIED_BIN)["model.norm.weight"])  # the .bin weights
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "ours.pt")
    assert r.returncode == 0, r.stderr
    assert "not read beside them: consolidated.safetensors" in r.stderr, r.stderr
    assert _equal(torch.load(tmp_path / "ours.pt", weights_only=True), want)


def test_model_safetensors_beside_pytorch_model_bin_is_what_from_pretrained_reads(tmp_path, run_ckptconv):
    """from_pretrained tries model.safetensors first, then its index, then
    pytorch_model.bin: with model.safetensors and pytorch_model.bin shards
    side by side it reads the .safetensors. ckptconv read the .bin files
    (other weights, exit 0) and said model.safetensors was not read."""
    d = tmp_path / "both"
    shutil.copytree(TIED_BIN, d)
    other = {k: v + 1 for k, v in _bin_shards(TIED_BIN).items()}
    save_file(other, d / "model.safetensors", metadata={"format": "pt"})
    r = _from_pretrained(d, tmp_path / "hf.pt")
    assert r.returncode == 0, r.stdout + r.stderr
    want = torch.load(tmp_path / "hf.pt", weights_only=True)
    assert torch.equal(want["model.norm.weight"], other["model.norm.weight"])  # the .safetensors weights
    r = run_ckptconv("consolidate", d, "-o", tmp_path / "ours.pt")
    assert r.returncode == 0, r.stderr
    assert "model.safetensors is the model" in r.stderr and "pytorch_model" in r.stderr, r.stderr
    assert _equal(torch.load(tmp_path / "ours.pt", weights_only=True), want)
    shown = run_ckptconv("inspect", d, "--json")
    assert shown.returncode == 0 and "pytorch_model" in json.loads(shown.stdout)["facts"]["hf_folder_files"]
