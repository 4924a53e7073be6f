"""The way back (#51, docs/maps.md): a Hugging Face folder rewritten as the
training framework's checkpoint by the same architecture map read
backwards, megatron-core's torch_dist with `reshard --layout megatron`,
torchtitan's DCP with `reshard --layout dcp --map torchtitan-llama3-llama`.

The Hugging Face folder is one transformers itself saved: the forward
export of each real megatron-core fixture (testdata/arch/, proven by
tests/test_arch_maps.py), loaded by transformers 5's from_pretrained and
written again with save_pretrained (tests/hf_arch_logits.py, .venv-hf).
From it the way back must give:
- megatron's stored tensors bit for bit (ckptconv's `--only model --map none`
  reading of the original and of ours), except the padded vocabulary rows,
  which the folder does not hold and which are zeros;
- megatron-core (.venv-megatron) loading it into a GPTModel at TP=2 x PP=2
  and TP=1, TP=2 at PP=1 exactly what it loads from its own files (padding
  rows excepted), and its forward at PP=1 reproducing the committed logits
  (fp32, <= 1e-4: the tensors are the same bytes, so at TP=1 the logits
  are megatron's own forward again, measured 0.0; at TP=2 the split
  matmuls sum in another order, measured 4.8e-7);
- torchtitan's stored tensors bit for bit (torch's dcp_to_torch_save of the
  committed fixture and of ours), q and k permuted back to interleaved
  rotary pairs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from proofs_guard import require_side_env
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

REPO = Path(__file__).resolve().parent.parent
ARCH = REPO / "testdata" / "arch"
HF_PY = REPO / ".venv-hf" / "bin" / "python"
MEGATRON_PY = REPO / ".venv-megatron" / "bin" / "python"
TITAN_PY = REPO / ".venv-titan" / "bin" / "python"
TITAN_MAP = REPO / "maps" / "torchtitan-llama3-llama.json"
TITAN_MAPS = {"llama3": "torchtitan-llama3-llama", "qwen3": "torchtitan-qwen3-qwen3",
              "qwen3moe": "torchtitan-qwen3moe-qwen3moe"}
TOLERANCE = 1e-4
# The fixtures' vocabulary (60) padded as megatron pads it at TP=2:
# make_vocab_size_divisible_by 8 x TP 2.
MULTIPLE = "16"
PADDED = ("embedding.word_embeddings.weight", "output_layer.weight")
CASES = ["llama_gqa_tp2pp2", "qwen2_tp2pp1", "qwen3_tp1pp2", "llama_tied_tp2pp1"]


def _hf_folder(run_ckptconv, case: str, tmp_path: Path, map_name: str | None = None) -> Path:
    """The case exported (the forward map: the architecture's, or `map_name`),
    then loaded and saved again by transformers (which saves a mixture of
    experts in the layout it loaded: fused, or one tensor per expert)."""
    require_side_env(HF_PY, "transformers writes the Hugging Face folder", "scripts/setup-hf")
    export, saved = tmp_path / "export", tmp_path / "hf"
    r = run_ckptconv("consolidate", str(ARCH / case / "ckpt"), "--only", "model", "--config-from",
                     str(ARCH / case / "hf_config"), "-o", f"{export}/", *(["--map", map_name] if map_name else []))
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(HF_PY), str(REPO / "tests" / "hf_arch_logits.py"), str(export),
                        str(ARCH / case / "logits.json"), str(saved)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["max_abs_diff"] <= TOLERANCE
    return saved


def _back(run_ckptconv, hf: Path, out: Path, *extra: str):
    return run_ckptconv("reshard", str(hf), "--layout", "megatron", "--world-size", "3", "--padded-vocab-multiple",
                        MULTIPLE, "-o", str(out), *extra)


def _model(run_ckptconv, ckpt: Path, out: Path) -> dict:
    r = run_ckptconv("consolidate", str(ckpt), "--only", "model", "--map", "none", "-o", str(out))
    assert r.returncode == 0, r.stderr
    return load_file(out)


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory, ckptconv):
    """Each case's Hugging Face folder, made once for the module (lazily: a
    test asks for its case, or for (case, map) exported by that map)."""
    def run(*args):
        return subprocess.run([str(ckptconv), *map(str, args)], capture_output=True, text=True, timeout=600)

    class Folders(dict):
        def __missing__(self, key):
            case, map_name = key if isinstance(key, tuple) else (key, None)
            self[key] = _hf_folder(run, case, tmp_path_factory.mktemp(case), map_name)
            return self[key]

    return Folders()


def _assert_megatrons_tensors(run_ckptconv, case: str, out: Path, tmp_path: Path) -> None:
    """`out` holds what megatron-core stored for `case`, bit for bit, under
    the same stored keys (its experts and layers stacked as megatron-core
    stacks them, its sharded objects split as it splits them), padding rows
    excepted, which are zeros."""
    from torch.distributed.checkpoint import FileSystemReader
    assert (out / "metadata.json").read_text() == (ARCH / case / "ckpt" / "metadata.json").read_text()
    assert torch.load(out / "common.pt", weights_only=True) == {}
    stored = FileSystemReader(str(ARCH / case / "ckpt")).read_metadata().state_dict_metadata
    ours = FileSystemReader(str(out)).read_metadata().state_dict_metadata
    assert sorted(ours) == sorted(stored)
    for key, meta in stored.items():
        assert getattr(ours[key], "size", None) == getattr(meta, "size", None), key
    want = _model(run_ckptconv, ARCH / case / "ckpt", tmp_path / "want.safetensors")
    got = _model(run_ckptconv, out, tmp_path / "got.safetensors")
    assert sorted(got) == sorted(want)
    vocab = json.loads((ARCH / case / "case.json").read_text())["vocab_size"]
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        if name in PADDED:  # the rows no token reaches: not in the folder, zeros
            assert g[vocab:].count_nonzero() == 0, name
            g, w = g[:vocab], w[:vocab]
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), name


def _megatron_load(case: str, out: Path, tp: int, pp: int, ep: int, tmp_path: Path) -> dict:
    """megatron-core's dist_checkpointing.load of `out` into the case's
    GPTModel at TP x PP x EP (tests/megatron_arch_back.py)."""
    require_side_env(MEGATRON_PY, "loading with megatron-core itself runs", "scripts/setup-megatron")
    report = tmp_path / "load.json"
    r = subprocess.run([str(MEGATRON_PY), str(REPO / "tests" / "megatron_arch_back.py"), str(ARCH / case / "ckpt"),
                        str(out), str(ARCH / case), str(tp), str(pp), str(ep), str(report)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["ranks"] == tp * pp * ep and got["tensors"] > 0
    assert got["differ"] == [] and got["padded_nonzero"] == [], got
    return got


@pytest.mark.parametrize("case", CASES)
def test_the_way_back_gives_megatrons_stored_tensors(case, hf_folders, tmp_path, run_ckptconv):
    out = tmp_path / "back"
    r = _back(run_ckptconv, hf_folders[case], out)
    assert r.returncode == 0, r.stderr
    assert "map megatron-gpt-" in r.stderr and "the way back" in r.stderr  # chosen by the config's architectures
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp",
                                                     "common.pt", "metadata.json"]
    _assert_megatrons_tensors(run_ckptconv, case, out, tmp_path)


@pytest.mark.parametrize("case,tp,pp", [
    ("llama_gqa_tp2pp2", 2, 2), ("llama_gqa_tp2pp2", 1, 1), ("llama_gqa_tp2pp2", 2, 1),
    ("qwen2_tp2pp1", 1, 1), ("qwen3_tp1pp2", 1, 1), ("llama_tied_tp2pp1", 2, 1),
])
def test_megatron_core_loads_the_way_back_and_gives_the_logits(case, tp, pp, hf_folders, tmp_path, run_ckptconv):
    out = tmp_path / "back"
    assert _back(run_ckptconv, hf_folders[case], out).returncode == 0
    got = _megatron_load(case, out, tp, pp, 1, tmp_path)
    if pp == 1:
        assert got["max_abs_diff"] <= TOLERANCE, got


# The mixtures of experts (megatron-core's SequentialMLP, 4 experts saved at
# expert parallelism 2): the folder transformers saves of the default export
# (transformers 5's fused 3-D gate_up_proj and down_proj: it saves the layout
# it loaded) and of the per-expert one (the names of the models' published
# checkpoints), each with the map the way back chooses with no --map: by the
# config's architecture and the names the folder holds.
MOE_FOLDERS = {
    "mixtral-fused": (("mixtral_ep2", None), "megatron-gpt-mixtral"),
    "mixtral-per-expert": (("mixtral_ep2", "megatron-gpt-mixtral-per-expert"), "megatron-gpt-mixtral-per-expert"),
    "qwen3moe-fused": (("qwen3moe_ep2", None), "megatron-gpt-qwen3moe"),
    "qwen3moe-per-expert": (("qwen3moe_ep2", "megatron-gpt-qwen3moe-per-expert"), "megatron-gpt-qwen3moe-per-expert"),
}


@pytest.mark.parametrize("folder", MOE_FOLDERS)
def test_the_moe_way_back_gives_megatrons_stored_tensors(folder, hf_folders, tmp_path, run_ckptconv):
    """Every expert at its global index of megatron-core's
    `mlp.experts.experts.*` (layers x experts), the router, q/k norms:
    megatron's stored tensors bit for bit."""
    key, chosen = MOE_FOLDERS[folder]
    out = tmp_path / "back"
    r = _back(run_ckptconv, hf_folders[key], out)
    assert r.returncode == 0, r.stderr
    assert f"map {chosen} (built in), the way back" in r.stderr, r.stderr
    _assert_megatrons_tensors(run_ckptconv, key[0], out, tmp_path)


@pytest.mark.parametrize("folder,tp,ep", [
    ("mixtral-fused", 1, 1), ("mixtral-fused", 1, 2), ("mixtral-per-expert", 2, 1), ("qwen3moe-per-expert", 1, 2),
])
def test_megatron_core_loads_the_moe_way_back_and_gives_the_logits(folder, tp, ep, hf_folders, tmp_path,
                                                                    run_ckptconv):
    """megatron-core loads the way back into a GPTModel with MoE at expert
    parallelism 1 and 2 (each rank its experts, at their global indices) and
    TP=2, exactly what it loads from its own files, and its forward gives
    the committed logits (measured 0.0 at TP=1, the same bytes through the
    same arithmetic; 4.8e-7 at TP=2)."""
    key, _ = MOE_FOLDERS[folder]
    out = tmp_path / "back"
    assert _back(run_ckptconv, hf_folders[key], out).returncode == 0
    got = _megatron_load(key[0], out, tp, 1, ep, tmp_path)
    assert got["max_abs_diff"] <= TOLERANCE, got


def _wrong_map(tmp_path: Path, name: str, change) -> Path:
    spec = json.loads((REPO / "maps" / f"{name}.json").read_text())
    for rule in spec["rules"]:
        change(rule)
    spec.pop("back_architectures", None)
    path = tmp_path / f"wrong-{name}.json"
    path.write_text(json.dumps(spec))
    return path


def test_a_wrong_moe_inverse_misses_megatrons_tensors(hf_folders, tmp_path, run_ckptconv):
    """The proof above can fail: experts taken in reverse order from the
    fused tensors, or the per-expert gate and up swapped, load as well and
    give tensors that are not megatron's."""
    def reverse(rule):
        if "stack" in rule:
            rule["stack"] = "num_local_experts - 1 - E"

    def swap(rule):
        if "experts.{E}.w1.weight" in str(rule["to"]):
            rule["to"] = rule["to"][::-1]

    want = _model(run_ckptconv, ARCH / "mixtral_ep2" / "ckpt", tmp_path / "want.safetensors")
    for key, wrong in ((("mixtral_ep2", None), _wrong_map(tmp_path, "megatron-gpt-mixtral", reverse)),
                       (("mixtral_ep2", "megatron-gpt-mixtral-per-expert"),
                        _wrong_map(tmp_path, "megatron-gpt-mixtral-per-expert", swap))):
        out = tmp_path / wrong.stem
        r = _back(run_ckptconv, hf_folders[key], out, "--map", str(wrong))
        assert r.returncode == 0, r.stderr
        got = _model(run_ckptconv, out, tmp_path / f"{wrong.stem}.safetensors")
        differ = sorted(k for k, w in want.items() if k not in PADDED and not torch.equal(got[k], w))
        assert differ and all(".experts.local_experts." in k and "linear_fc" in k for k in differ), differ


def _refused(run_ckptconv, hf: Path, tmp_path: Path, change, names, config_change=None):
    """`hf` changed by `change` (its weights) and `config_change`: exit 3
    naming each of `names`, nothing written."""
    from safetensors.torch import save_file
    bad = tmp_path / "bad"
    bad.mkdir(exist_ok=True)
    config = json.loads((hf / "config.json").read_text())
    if config_change:
        config_change(config)
    (bad / "config.json").write_text(json.dumps(config))
    weights = dict(load_file(hf / "model.safetensors"))
    change(weights)
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "back"
    r = _back(run_ckptconv, bad, out)
    assert r.returncode == 3, r.stderr
    for n in names:
        assert n in r.stderr, (n, r.stderr)
    assert not out.exists()


def test_a_moe_folder_that_disagrees_with_its_config_is_refused(hf_folders, tmp_path, run_ckptconv):
    fused = hf_folders[("mixtral_ep2", None)]
    per_expert = hf_folders[("mixtral_ep2", "megatron-gpt-mixtral-per-expert")]
    # The config counts 5 experts, the router and the fused tensors hold 4.
    _refused(run_ckptconv, fused, tmp_path, lambda w: None, ["model.layers.0.mlp.gate.weight", "num_local_experts = 5"],
             lambda c: c.__setitem__("num_local_experts", 5))
    # A fused tensor of 3 experts where the config counts 4.
    _refused(run_ckptconv, fused, tmp_path,
             lambda w: w.__setitem__("model.layers.1.mlp.experts.gate_up_proj",
                                     w["model.layers.1.mlp.experts.gate_up_proj"][:3].clone()),
             ["model.layers.1.mlp.experts.gate_up_proj", "(3, 48, 32)", "num_local_experts = 4"])
    # An expert missing from a per-expert folder.
    _refused(run_ckptconv, per_expert, tmp_path,
             lambda w: w.pop("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
             ["model.layers.1.block_sparse_moe.experts.2.w3.weight", "missing", "E = 2 of num_local_experts = 4"])
    # An expert more than the config counts.
    def fifth(w):
        for p in ("w1", "w2", "w3"):
            w[f"model.layers.0.block_sparse_moe.experts.4.{p}.weight"] = \
                w[f"model.layers.0.block_sparse_moe.experts.0.{p}.weight"].clone()
    _refused(run_ckptconv, per_expert, tmp_path, fifth,
             ["model.layers.0.block_sparse_moe.experts.4.w", "E = 4, past num_local_experts = 4"])


def test_the_way_back_streams_within_the_memory_limit(hf_folders, tmp_path, run_ckptconv):
    """The concatenated and padded tensors are gathered in slabs of
    --memory-limit: with 1 KiB the files are the same tensors as with the default."""
    hf = hf_folders["llama_gqa_tp2pp2"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert _back(run_ckptconv, hf, a).returncode == 0
    r = _back(run_ckptconv, hf, b, "--memory-limit", "1K")
    assert r.returncode == 0, r.stderr
    for f in ("__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "common.pt", "metadata.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_the_way_back_in_parts_writes_the_single_process_files(hf_folders, tmp_path, run_ckptconv):
    """--part I/N: each worker writes its share, the last one finalizes by
    rerunning the kept request (its --map, --config-from and
    --padded-vocab-multiple with it): the files of one process."""
    from torch.distributed.checkpoint import FileSystemReader
    hf = hf_folders["llama_gqa_tp2pp2"]
    solo, many = tmp_path / "solo", tmp_path / "many"
    assert _back(run_ckptconv, hf, solo).returncode == 0
    for i in range(2):
        r = _back(run_ckptconv, hf, many, "--part", f"{i}/2")
        assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in solo.iterdir())
    assert sorted(p.name for p in many.iterdir()) == names
    for name in names:
        if name != ".metadata":
            assert (solo / name).read_bytes() == (many / name).read_bytes(), name
    a, b = FileSystemReader(str(solo)).read_metadata(), FileSystemReader(str(many)).read_metadata()
    assert a.state_dict_metadata == b.state_dict_metadata and a.storage_data == b.storage_data


def test_the_way_back_is_model_only(hf_folders, tmp_path, run_ckptconv):
    """An optimizer does not travel back: --only optim is a usage error, and
    a tensor the map has no place for (here an optimizer state beside the
    model's) is exit 3 naming it. Nothing is written either way."""
    hf = hf_folders["llama_gqa_tp2pp2"]
    out = tmp_path / "back"
    r = _back(run_ckptconv, hf, out, "--only", "optim")
    assert r.returncode == 2 and "model only" in r.stderr, r.stderr
    assert not out.exists()
    extra = tmp_path / "extra"
    extra.mkdir()
    for f in hf.iterdir():
        (extra / f.name).write_bytes(f.read_bytes())
    from safetensors.torch import save_file
    weights = load_file(hf / "model.safetensors")
    weights["optimizer.state.exp_avg.model.norm.weight"] = torch.zeros(32)
    save_file(weights, extra / "model.safetensors", metadata={"format": "pt"})
    r = _back(run_ckptconv, extra, out)
    assert r.returncode == 3, r.stderr
    assert "optimizer.state.exp_avg.model.norm.weight" in r.stderr and "optimizer" in r.stderr
    assert not out.exists()


def test_a_missing_or_misshapen_tensor_is_refused(hf_folders, tmp_path, run_ckptconv):
    hf = hf_folders["llama_gqa_tp2pp2"]
    weights = load_file(hf / "model.safetensors")
    from safetensors.torch import save_file
    for change, code, names in (
        (lambda w: w.pop("model.layers.1.self_attn.k_proj.weight"), 3,
         ["model.layers.1.self_attn.k_proj.weight", "missing"]),
        (lambda w: w.__setitem__("model.layers.0.mlp.up_proj.weight", torch.zeros(40, 32)), 3,
         ["model.layers.0.mlp.up_proj.weight", "intermediate_size"]),
    ):
        bad = tmp_path / "bad"
        bad.mkdir(exist_ok=True)
        (bad / "config.json").write_bytes((hf / "config.json").read_bytes())
        w = dict(weights)
        change(w)
        save_file(w, bad / "model.safetensors", metadata={"format": "pt"})
        out = tmp_path / "back"
        r = _back(run_ckptconv, bad, out)
        assert r.returncode == code, r.stderr
        for n in names:
            assert n in r.stderr, (n, r.stderr)
        assert not out.exists()


def test_a_tied_folders_lm_head_is_dropped_only_when_it_is_the_embedding(hf_folders, tmp_path, run_ckptconv):
    """A tying config's folder that lists lm_head.weight anyway (as
    model.state_dict() does): equal to the embedding, it is the tie and is
    left out (the way back's tensors are the folder's without it); different,
    the model was trained untied under a config that ties, and dropping it
    would lose the output layer: exit 3 naming it, nothing written."""
    hf = hf_folders["llama_tied_tp2pp1"]
    assert json.loads((hf / "config.json").read_text())["tie_word_embeddings"] is True
    weights = load_file(hf / "model.safetensors")
    assert "lm_head.weight" not in weights
    from safetensors.torch import save_file
    plain = tmp_path / "plain"
    r = _back(run_ckptconv, hf, plain)
    assert r.returncode == 0, r.stderr
    for name, lm_head in (("copy", weights["model.embed_tokens.weight"].clone()),
                          ("untied", weights["model.embed_tokens.weight"] * 0.5)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_bytes((hf / "config.json").read_bytes())
        save_file({**weights, "lm_head.weight": lm_head}, folder / "model.safetensors", metadata={"format": "pt"})
        out = tmp_path / f"{name}-back"
        r = _back(run_ckptconv, folder, out)
        if name == "copy":
            assert r.returncode == 0, r.stderr
            assert "'lm_head.weight' left out" in r.stderr
            want = _model(run_ckptconv, plain, tmp_path / "want.safetensors")
            got = _model(run_ckptconv, out, tmp_path / "got.safetensors")
            assert sorted(got) == sorted(want)
            assert all(torch.equal(got[k].view(torch.uint8), want[k].view(torch.uint8)) for k in want)
        else:
            assert r.returncode == 3, r.stderr
            assert "'lm_head.weight' equals no other tensor" in r.stderr and "tie_word_embeddings" in r.stderr
            assert not out.exists()


def _titan_back(run_ckptconv, tmp_path: Path, map_arg: str, name: str, model: str = "llama3") -> Path:
    """The torchtitan fixture titan_<model> exported to a Hugging Face folder
    with its built-in map, and back with `map_arg`."""
    case = ARCH / f"titan_{model}"
    export, out = tmp_path / "export", tmp_path / name
    if not export.exists():
        r = run_ckptconv("consolidate", str(case / "ckpt"), "--map", TITAN_MAPS[model], "--config-from",
                         str(case / "hf_config"), "-o", f"{export}/")
        assert r.returncode == 0, r.stderr
    r = run_ckptconv("reshard", str(export), "--layout", "dcp", "--map", map_arg, "--world-size", "2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    return out


def _titan_logits(ckpt: Path, model: str = "llama3") -> dict:
    require_side_env(TITAN_PY, "torchtitan loads the way back", "scripts/setup-titan")
    r = subprocess.run([str(TITAN_PY), str(REPO / "tests" / "titan_arch_back.py"), str(ckpt),
                        str(ARCH / f"titan_{model}" / "logits.json"), model], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_torchtitan_loads_the_way_back_and_gives_its_logits(tmp_path, run_ckptconv):
    """torchtitan 0.3.0's Llama3Model fills every key of its state dict from
    the way back (dcp.load, then a strict load_state_dict) and its forward
    gives the committed logits (measured 0.0: the same bytes). With q and k
    left half-split (the map without permute_rope) it loads as well, and misses."""
    got = _titan_logits(_titan_back(run_ckptconv, tmp_path, "torchtitan-llama3-llama", "back"))
    assert got["keys"] == 21 and got["max_abs_logit"] > 0.5
    assert got["max_abs_diff"] <= TOLERANCE, got
    spec = json.loads(TITAN_MAP.read_text())
    for rule in spec["rules"]:
        rule.pop("permute_rope", None)
    unpermuted = tmp_path / "unpermuted.json"
    unpermuted.write_text(json.dumps(spec))
    wrong = _titan_logits(_titan_back(run_ckptconv, tmp_path, str(unpermuted), "wrong"))
    assert wrong["max_abs_diff"] > 1000 * TOLERANCE, wrong


def test_torchtitan_the_way_back_gives_torchtitans_stored_tensors(tmp_path, run_ckptconv):
    """HF -> torchtitan DCP: every tensor the committed torchtitan 0.3.0
    checkpoint stores, bit for bit, under torchtitan's names (wq and wk
    permuted back from half-split to interleaved rotary pairs), read by
    torch's own dcp_to_torch_save."""
    case = ARCH / "titan_llama3"
    out = _titan_back(run_ckptconv, tmp_path, "torchtitan-llama3-llama", "back")
    dcp_to_torch_save(case / "ckpt", tmp_path / "want.pt")
    dcp_to_torch_save(out, tmp_path / "got.pt")
    want = torch.load(tmp_path / "want.pt", weights_only=True)
    got = torch.load(tmp_path / "got.pt", weights_only=True)
    want = {k: v for k, v in want.items() if not k.endswith("freqs_cis")}  # a buffer the map skips
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(got[k].view(torch.uint8), w.view(torch.uint8)), k
    # Without the inverse permutation q and k would come back scrambled.
    assert any("wq" in k for k in want)


def test_torchtitan_qwen3_loads_the_way_back_and_gives_its_logits(tmp_path, run_ckptconv):
    """torchtitan 0.3.0's dense Qwen3Model fills every key of its state dict
    (q_norm and k_norm included) from the way back of its export, and its
    forward gives the committed logits."""
    got = _titan_logits(_titan_back(run_ckptconv, tmp_path, "torchtitan-qwen3-qwen3", "back", "qwen3"), "qwen3")
    assert got["keys"] == 25 and got["max_abs_logit"] > 0.5
    assert got["max_abs_diff"] <= TOLERANCE, got


@pytest.mark.parametrize("model", ["qwen3", "qwen3moe"])
def test_torchtitan_qwen3_the_way_back_gives_torchtitans_stored_tensors(model, tmp_path, run_ckptconv):
    """HF -> torchtitan DCP for Qwen3 and Qwen3-MoE: every tensor the
    committed checkpoint stores, bit for bit, under torchtitan's names, read
    by torch's own dcp_to_torch_save. For the MoE, each layer's per-expert
    tensors stacked back into torchtitan's 3-D w1_EFD, w3_EFD, w2_EDF (the
    inverse of the map's unstack); expert_bias_E, which the map skips (as
    torchtitan's own adapter does), is the one tensor not written."""
    case = ARCH / f"titan_{model}"
    out = _titan_back(run_ckptconv, tmp_path, TITAN_MAPS[model], "back", model)
    dcp_to_torch_save(case / "ckpt", tmp_path / "want.pt")
    dcp_to_torch_save(out, tmp_path / "got.pt")
    want = torch.load(tmp_path / "want.pt", weights_only=True)
    got = torch.load(tmp_path / "got.pt", weights_only=True)
    skipped = sorted(k for k in want if k.endswith("expert_bias_E"))
    assert skipped == ([f"layers.{n}.moe.expert_bias_E" for n in range(2)] if model == "qwen3moe" else [])
    want = {k: v for k, v in want.items() if k not in skipped}
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        assert torch.equal(got[k].view(torch.uint8), w.view(torch.uint8)), k
    if model == "qwen3moe":
        assert got["layers.1.moe.routed_experts.inner_experts.w2_EDF"].shape == (4, 32, 24)


@pytest.mark.parametrize("args,message", [
    (["--layout", "megatron", "--map", "torchtitan-llama3-llama"], "a map for dcp checkpoints"),
    (["--layout", "hf", "--map", "megatron-gpt-llama"], "the way back writes --layout megatron, megatron-legacy or dcp"),
    (["--layout", "dcp", "--map", "megatron-gpt-llama"], "a map for megatron-torch-dist checkpoints"),
])
def test_a_map_for_another_layout_is_a_usage_error(args, message, hf_folders, tmp_path, run_ckptconv):
    out = tmp_path / "back"
    r = run_ckptconv("reshard", str(hf_folders["llama_gqa_tp2pp2"]), "--world-size", "2", "-o", str(out), *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not out.exists()
