"""Architecture maps (#51): a Megatron-core GPT exported as a Hugging Face
model that transformers loads and runs as megatron-core ran it.

The sources are real megatron-core 0.16.1 torch_dist checkpoints configured
as Llama (GQA: 4 query heads in 2 groups, TP=2 x PP=2), Qwen2 (q/k/v
biases, TP=2) and Qwen3 (per-head q/k RMSNorm, PP=2), each with megatron's
own logits of its forward on fixed token ids and the Hugging Face config
transformers wrote (testdata/arch/, tools/make_arch_checkpoints.py).
`consolidate --only model --config-from` applies the built-in map, and
transformers 5's from_pretrained in .venv-hf (scripts/setup-hf) loads the
export, every weight from the folder, and gives the same logits
(tests/hf_arch_logits.py). The mixtures of experts (Mixtral; Qwen3-MoE,
with q/k norms) saved at expert parallelism 2 do too, their experts stacked
into transformers 5's fused 3-D tensors or, by the per-expert maps, under
each expert's own names. So does torchtitan 0.3.0's Llama3Model saved
with dcp.save, through `--map torchtitan-llama3-llama` (q/k permuted from
interleaved to half-split rotary pairs), and its dense Qwen3Model through
`--map torchtitan-qwen3-qwen3` (half-split already: nothing permuted), and
its Qwen3-MoE through `--map torchtitan-qwen3moe-qwen3moe` (each expert
unstacked from torchtitan's 3-D tensors).

Tolerance 1e-4 (max abs, fp32, logits of order 1): the bytes are copied, so
the two models hold equal weights; only the two frameworks' arithmetic
differs (fused vs separate q/k/v matmuls, summation order, RoPE's cos/sin
computed each its own way), a few float32 ulps per op over 2 layers (measured
5e-7 on these fixtures, 1.1e-6 and 1.7e-6 on torchtitan's Qwen3 and
Qwen3-MoE). A map that is plausible but wrong (q/k/v contiguous instead of
per query group, gate and up swapped) moves the logits by far more than
that and must fail."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parent.parent
ARCH = REPO / "testdata" / "arch"
HF_PY = REPO / ".venv-hf" / "bin" / "python"
LLAMA_MAP = REPO / "maps" / "megatron-gpt-llama.json"
TOLERANCE = 1e-4

CASES = {  # case -> (architecture, the built-in map the config selects)
    "llama_gqa_tp2pp2": ("LlamaForCausalLM", "megatron-gpt-llama"),
    "qwen2_tp2pp1": ("Qwen2ForCausalLM", "megatron-gpt-qwen2"),
    "qwen3_tp1pp2": ("Qwen3ForCausalLM", "megatron-gpt-qwen3"),
    "llama_tied_tp2pp1": ("LlamaForCausalLM", "megatron-gpt-llama"),  # share_embeddings_and_output_weights
    # Mixtures of experts saved at expert parallelism 2: experts stacked into transformers 5's fused tensors.
    "mixtral_ep2": ("MixtralForCausalLM", "megatron-gpt-mixtral"),
    "qwen3moe_ep2": ("Qwen3MoeForCausalLM", "megatron-gpt-qwen3moe"),
}


def _logits_diff(export: Path, case: str) -> dict:
    assert HF_PY.exists(), f"no {HF_PY}: scripts/setup-hf makes it (scripts/test does)"
    r = subprocess.run([str(HF_PY), str(REPO / "tests" / "hf_arch_logits.py"), str(export),
                        str(ARCH / case / "logits.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _export(run_ckptconv, case: str, out: Path, *extra: str, config: Path | None = None):
    return run_ckptconv("consolidate", str(ARCH / case / "ckpt"), "--only", "model", "--config-from",
                        str(config or ARCH / case / "hf_config"), "-o", f"{out}/", *extra)


@pytest.mark.parametrize("case", list(CASES))
def test_export_gives_megatrons_logits(case, tmp_path, run_ckptconv):
    arch, map_name = CASES[case]
    out = tmp_path / "export"
    r = _export(run_ckptconv, case, out)
    assert r.returncode == 0, r.stderr
    assert f"map {map_name} (built in)" in r.stderr and arch in r.stderr
    # The folder: weights, the config (its dtype the one written) and the tokenizer file copied.
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"
    weights = load_file(out / "model.safetensors")
    cfg = json.loads((ARCH / case / "hf_config" / "config.json").read_text())
    assert weights["model.embed_tokens.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])  # unpadded
    if cfg["tie_word_embeddings"]:
        assert "lm_head.weight" not in weights  # transformers ties it to the embedding
    else:
        assert weights["lm_head.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    got = _logits_diff(out, case)
    assert got["architecture"] == arch
    assert got["max_abs_logit"] > 0.5  # logits of order 1: the tolerance is small beside them
    assert got["max_abs_diff"] <= TOLERANCE, got


def _wrong_map(tmp_path: Path, name: str, change) -> Path:
    spec = json.loads(LLAMA_MAP.read_text())
    for rule in spec["rules"]:
        change(rule)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def _contiguous_qkv(rule):
    """q, k, v as three contiguous blocks: the layout of a fused QKV that is not per query group."""
    if "split" in rule and rule["split"].get("groups") == "num_key_value_heads":
        rule["split"] = {"sections": ["num_attention_heads * head_dim", "num_key_value_heads * head_dim",
                                      "num_key_value_heads * head_dim"]}


def _swapped_gate_up(rule):
    if rule["from"] == "decoder.layers.{L}.mlp.linear_fc1.weight":
        rule["to"] = rule["to"][::-1]


@pytest.mark.parametrize("wrong", [_contiguous_qkv, _swapped_gate_up], ids=["contiguous_qkv", "swapped_gate_up"])
def test_plausible_wrong_maps_fail_the_logits_proof(wrong, tmp_path, run_ckptconv):
    case = "llama_gqa_tp2pp2"
    path = _wrong_map(tmp_path, wrong.__name__, wrong)
    out = tmp_path / "export"
    r = _export(run_ckptconv, case, out, "--map", str(path))
    assert r.returncode == 0, r.stderr  # the shapes fit: only the logits tell
    got = _logits_diff(out, case)
    assert got["max_abs_diff"] > 1000 * TOLERANCE, got


def test_a_users_map_file_is_applied(tmp_path, run_ckptconv):
    """--map FILE: the built-in Llama map copied as a user's file, one target renamed."""
    spec = json.loads(LLAMA_MAP.read_text())
    spec["rules"][-2]["to"] = "final_norm.weight"
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "export"
    r = _export(run_ckptconv, "llama_gqa_tp2pp2", out, "--map", str(path))
    assert r.returncode == 0, r.stderr
    names = set(load_file(out / "model.safetensors"))
    assert "final_norm.weight" in names and "model.norm.weight" not in names
    assert "model.layers.1.self_attn.k_proj.weight" in names


def test_map_none_keeps_megatrons_names(tmp_path, run_ckptconv):
    out = tmp_path / "export"
    r = _export(run_ckptconv, "llama_gqa_tp2pp2", out, "--map", "none")
    assert r.returncode == 0, r.stderr
    assert "map " not in r.stderr
    weights = load_file(out / "model.safetensors")
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in weights
    assert weights["embedding.word_embeddings.weight"].shape[0] == 64  # megatron's padded vocabulary


def assert_config_mismatch_named(case, field, value, names, tmp_path, run_ckptconv):
    """The case's config with `field` set to `value`: the export is exit 3
    naming the tensor and the config field, and writes nothing."""
    config = tmp_path / "config"
    shutil.copytree(ARCH / case / "hf_config", config)
    cfg = json.loads((config / "config.json").read_text())
    cfg[field] = value
    (config / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "export"
    r = _export(run_ckptconv, case, out, config=config)
    assert r.returncode == 3, r.stderr
    for n in names + ["config.json"]:
        assert n in r.stderr, (n, r.stderr)
    assert not out.exists() and list(tmp_path.iterdir()) == [config]


@pytest.mark.parametrize("field,value,names", [
    ("hidden_size", 16, ["model.embed_tokens.weight", "hidden_size = 16"]),
    ("num_key_value_heads", 1, ["decoder.layers.0.self_attention.linear_qkv.weight", "num_key_value_heads"]),
    ("intermediate_size", 40, ["decoder.layers.0.mlp.linear_fc1.weight", "intermediate_size"]),
    ("vocab_size", 70, ["embedding.word_embeddings.weight", "vocab_size = 70"]),
])
def test_a_shape_the_config_does_not_give_is_exit_3_and_writes_nothing(field, value, names, tmp_path, run_ckptconv):
    assert_config_mismatch_named("llama_gqa_tp2pp2", field, value, names, tmp_path, run_ckptconv)


def test_bad_map_requests_are_usage_errors(tmp_path, run_ckptconv):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rules": [{"from": "a", "to": "b"}]}')
    out = tmp_path / "export"
    r = _export(run_ckptconv, "llama_gqa_tp2pp2", out, "--map", str(bad))
    assert r.returncode == 2 and "bad.json" in r.stderr and "shape" in r.stderr, r.stderr
    bad.write_text("{")
    r = _export(run_ckptconv, "llama_gqa_tp2pp2", out, "--map", str(bad))
    assert r.returncode == 2 and "bad.json" in r.stderr, r.stderr
    r = _export(run_ckptconv, "llama_gqa_tp2pp2", out, "--map", "no-such-map")
    assert r.returncode == 2 and "megatron-gpt-llama" in r.stderr, r.stderr
    r = run_ckptconv("consolidate", str(ARCH / "llama_gqa_tp2pp2" / "ckpt"), "--only", "model", "--map",
                     "megatron-gpt-llama", "-o", f"{out}/")
    assert r.returncode == 2 and "--config-from" in r.stderr, r.stderr
    dcp = REPO / "testdata" / "dcp" / "fsdp2_adamw_ws1"
    r = run_ckptconv("consolidate", str(dcp), "--only", "model", "--map", "megatron-gpt-llama", "--config-from",
                     str(ARCH / "llama_gqa_tp2pp2" / "hf_config"), "-o", f"{out}/")
    assert r.returncode == 2 and "a map for megatron-torch-dist sources" in r.stderr, r.stderr
    assert not out.exists()


def test_a_config_with_no_built_in_map_keeps_the_names_with_a_warning(tmp_path, run_ckptconv):
    config = tmp_path / "config"
    shutil.copytree(ARCH / "llama_gqa_tp2pp2" / "hf_config", config)
    cfg = json.loads((config / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (config / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "export"
    r = _export(run_ckptconv, "llama_gqa_tp2pp2", out, config=config)
    assert r.returncode == 0, r.stderr
    assert "no built-in map" in r.stderr and "GPTNeoXForCausalLM" in r.stderr
    assert "decoder.final_layernorm.weight" in load_file(out / "model.safetensors")


def test_a_map_streams_within_the_memory_limit(tmp_path, run_ckptconv):
    """The split and unpadded tensors are gathered from strided pieces of the
    TP chunks in slabs of --memory-limit: with 1 KiB (a few rows at a time)
    the export is the same bytes as with the default 256 MiB."""
    whole, slabs = tmp_path / "whole", tmp_path / "slabs"
    assert _export(run_ckptconv, "llama_gqa_tp2pp2", whole).returncode == 0
    r = _export(run_ckptconv, "llama_gqa_tp2pp2", slabs, "--memory-limit", "1K")
    assert r.returncode == 0, r.stderr
    assert (whole / "model.safetensors").read_bytes() == (slabs / "model.safetensors").read_bytes()


@pytest.mark.parametrize("case,tie,message", [
    ("llama_gqa_tp2pp2", True, "'output_layer.weight' has no place in the model"),
    ("llama_tied_tp2pp1", False, "'output_layer.weight' is missing"),
])
def test_the_output_layer_must_agree_with_tie_word_embeddings(case, tie, message, tmp_path, run_ckptconv):
    """An untied model under a tying config would load with the embedding as
    its output layer; a tied one under an untying config with a fresh one."""
    config = tmp_path / "config"
    shutil.copytree(ARCH / case / "hf_config", config)
    cfg = json.loads((config / "config.json").read_text())
    cfg["tie_word_embeddings"] = tie
    (config / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "export"
    r = _export(run_ckptconv, case, out, config=config)
    assert r.returncode == 3 and message in r.stderr, r.stderr
    assert not out.exists()


def test_dry_run_lists_the_mapped_tensors_and_writes_nothing(tmp_path, run_ckptconv):
    out = tmp_path / "export"
    r = _export(run_ckptconv, "llama_gqa_tp2pp2", out, "--dry-run", "-v")
    assert r.returncode == 0, r.stderr
    assert "21 tensors" in r.stdout and "model.layers.1.self_attn.v_proj.weight" in r.stdout
    assert "lm_head.weight  float32 (60, 32)" in r.stdout  # unpadded from megatron's 64 rows
    assert not out.exists()


TITAN_MAP = REPO / "maps" / "torchtitan-llama3-llama.json"


def _titan_export(run_ckptconv, out: Path, map_arg: str, name: str = "titan_llama3"):
    case = ARCH / name
    return run_ckptconv("consolidate", str(case / "ckpt"), "--map", map_arg, "--config-from", str(case / "hf_config"),
                        "-o", f"{out}/")


def test_torchtitan_llama3_export_gives_torchtitans_logits(tmp_path, run_ckptconv):
    """torchtitan 0.3.0's Llama3Model (ComplexRoPE: interleaved rotary pairs)
    saved with dcp.save; the map permutes wq and wk to Hugging Face's
    half-split pairs, as torchtitan's own state-dict adapter does."""
    out = tmp_path / "export"
    r = _titan_export(run_ckptconv, out, "torchtitan-llama3-llama")
    assert r.returncode == 0, r.stderr
    got = _logits_diff(out, "titan_llama3")
    assert got["architecture"] == "LlamaForCausalLM" and got["max_abs_logit"] > 0.5
    assert got["max_abs_diff"] <= TOLERANCE, got
    # Without the permutation the same weights load and run, and miss.
    spec = json.loads(TITAN_MAP.read_text())
    for rule in spec["rules"]:
        rule.pop("permute_rope", None)
    unpermuted = tmp_path / "unpermuted.json"
    unpermuted.write_text(json.dumps(spec))
    wrong = tmp_path / "wrong"
    assert _titan_export(run_ckptconv, wrong, str(unpermuted)).returncode == 0
    assert _logits_diff(wrong, "titan_llama3")["max_abs_diff"] > 1000 * TOLERANCE


def _map_variant(tmp_path: Path, map_name: str, name: str, change) -> str:
    """The built-in map with change(rule) applied to every rule, written as a file map."""
    spec = json.loads((REPO / "maps" / f"{map_name}.json").read_text())
    for rule in spec["rules"]:
        change(rule)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return str(path)


def _swapper(a: str, b: str):
    """A change that gives the rule writing ...a.weight the target ...b.weight, and b's a."""
    def change(rule: dict) -> None:
        for x, y in ((a, b), (b, a)):
            if rule["to"].endswith(f".{x}.weight"):
                rule["to"] = rule["to"].replace(x, y)
                return
    return change


_swap_qk_norms = _swapper("q_norm", "k_norm")


def _permute_qk(rule: dict) -> None:
    if rule["to"].endswith(("q_proj.weight", "k_proj.weight")):
        rule["permute_rope"] = "head_dim"


def test_torchtitan_qwen3_export_gives_torchtitans_logits(tmp_path, run_ckptconv):
    """torchtitan 0.3.0's dense Qwen3Model (CosSinRoPE: half-split rotary
    pairs, as Hugging Face's; head_dim 16 apart from dim / n_heads; per-head
    q_norm and k_norm) saved with dcp.save; the map renames only, as
    torchtitan's own Qwen3StateDictAdapter.to_hf does."""
    out = tmp_path / "export"
    r = _titan_export(run_ckptconv, out, "torchtitan-qwen3-qwen3", "titan_qwen3")
    assert r.returncode == 0, r.stderr
    got = _logits_diff(out, "titan_qwen3")
    assert got["architecture"] == "Qwen3ForCausalLM" and got["max_abs_logit"] > 0.5
    assert got["max_abs_diff"] <= TOLERANCE, got


@pytest.mark.parametrize("name,change", [("norms_swapped", _swap_qk_norms), ("permuted_as_llama", _permute_qk)])
def test_a_wrong_torchtitan_qwen3_map_misses(name, change, tmp_path, run_ckptconv):
    """q_norm and k_norm swapped (both [head_dim], so the export loads), or
    q and k permuted as the Llama 3 map does (Qwen3's pairs are half-split
    already): the weights load and run, and the logits miss."""
    wrong = tmp_path / "wrong"
    variant = _map_variant(tmp_path, "torchtitan-qwen3-qwen3", name, change)
    r = _titan_export(run_ckptconv, wrong, variant, "titan_qwen3")
    assert r.returncode == 0, r.stderr
    assert _logits_diff(wrong, "titan_qwen3")["max_abs_diff"] > 1000 * TOLERANCE


def test_torchtitan_qwen3moe_export_gives_torchtitans_logits(tmp_path, run_ckptconv):
    """torchtitan 0.3.0's Qwen3Model with every layer an MoE (4 experts in
    3-D w1_EFD, w3_EFD, w2_EDF; softmax router, top 2, renormalised): the map
    unstacks each expert under Qwen3-MoE's per-expert names, as torchtitan's
    own adapter splits them, and transformers 5 fuses them as it loads. The
    reference runs torchtitan's grouped expert matmuls in fp32 (its own cast
    them to bf16, 2e-2 off: tools/make_titan_arch_checkpoint.py)."""
    out = tmp_path / "export"
    r = _titan_export(run_ckptconv, out, "torchtitan-qwen3moe-qwen3moe", "titan_qwen3moe")
    assert r.returncode == 0, r.stderr
    got = _logits_diff(out, "titan_qwen3moe")
    assert got["architecture"] == "Qwen3MoeForCausalLM" and got["max_abs_logit"] > 0.5
    assert got["max_abs_diff"] <= TOLERANCE, got
    # Expert x's tensors are index x of torchtitan's stacked ones, the router's rows as they are.
    weights = load_file(out / "model.safetensors")
    plain = tmp_path / "plain"
    assert _titan_export(run_ckptconv, plain, "none", "titan_qwen3moe").returncode == 0
    source = load_file(plain / "model.safetensors")
    experts = json.loads((ARCH / "titan_qwen3moe" / "hf_config" / "config.json").read_text())["num_local_experts"]
    assert experts == 4 and "layers.0.moe.expert_bias_E" in source  # zero here; Qwen3-MoE has no such term
    for layer in range(2):
        stacked = f"layers.{layer}.moe.routed_experts.inner_experts"
        for x in range(experts):
            mine = f"model.layers.{layer}.mlp.experts.{x}"
            assert weights[f"{mine}.gate_proj.weight"].equal(source[f"{stacked}.w1_EFD"][x])
            assert weights[f"{mine}.up_proj.weight"].equal(source[f"{stacked}.w3_EFD"][x])
            assert weights[f"{mine}.down_proj.weight"].equal(source[f"{stacked}.w2_EDF"][x])
        assert weights[f"model.layers.{layer}.mlp.gate.weight"].equal(source[f"layers.{layer}.moe.router.gate.weight"])
    assert not any("expert_bias" in k for k in weights)


def test_a_nonzero_expert_bias_the_map_drops_is_a_warning(tmp_path, run_ckptconv):
    """expert_bias_E has no place in Qwen3-MoE: left out silently while it is
    zero (the fixture), with a warning naming it once training moved it (the
    same checkpoint re-saved by torch's dcp.save with one layer's bias set)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp_path / "export"
    r = _titan_export(run_ckptconv, out, "torchtitan-qwen3moe-qwen3moe", "titan_qwen3moe")
    assert r.returncode == 0 and "not zero" not in r.stderr, r.stderr
    whole = tmp_path / "whole.pt"
    dcp_to_torch_save(str(ARCH / "titan_qwen3moe" / "ckpt"), str(whole))
    state = torch.load(whole, weights_only=True)
    assert not state["layers.1.moe.expert_bias_E"].any()
    state["layers.1.moe.expert_bias_E"] = torch.tensor([0.0, 0.5, -0.25, 0.0])
    trained = tmp_path / "trained" / "ckpt"
    dcp.save(state, checkpoint_id=str(trained))
    r = run_ckptconv("consolidate", str(trained), "--map", "torchtitan-qwen3moe-qwen3moe", "--config-from",
                     str(ARCH / "titan_qwen3moe" / "hf_config"), "-o", f"{tmp_path / 'export2'}/")
    assert r.returncode == 0, r.stderr
    assert "1 of 2 tensors it leaves out are not zero (first: layers.1.moe.expert_bias_E)" in r.stderr, r.stderr
    assert "Qwen3MoeForCausalLM has no place for it" in r.stderr


@pytest.mark.parametrize("name,change", [("gate_up_swapped", _swapper("gate_proj", "up_proj")),
                                         ("norms_swapped", _swap_qk_norms)])
def test_a_wrong_torchtitan_qwen3moe_map_misses(name, change, tmp_path, run_ckptconv):
    """Each expert's w1 and w3 swapped (gate as up), or q_norm and k_norm
    swapped: the export loads and runs, and the logits miss."""
    wrong = tmp_path / "wrong"
    variant = _map_variant(tmp_path, "torchtitan-qwen3moe-qwen3moe", name, change)
    assert _titan_export(run_ckptconv, wrong, variant, "titan_qwen3moe").returncode == 0
    assert _logits_diff(wrong, "titan_qwen3moe")["max_abs_diff"] > 1000 * TOLERANCE


def test_a_dcp_export_gets_no_map_unless_asked(tmp_path, run_ckptconv):
    """torchtitan's map lists no architecture: a DCP checkpoint exported with
    a Llama config keeps its names, with no note and no warning."""
    case = ARCH / "titan_llama3"
    out = tmp_path / "export"
    r = run_ckptconv("consolidate", str(REPO / "testdata" / "dcp" / "fsdp2_adamw_ws1"), "--only", "model",
                     "--config-from", str(case / "hf_config"), "-o", f"{out}/")
    assert r.returncode == 0, r.stderr
    assert "map" not in r.stderr.replace(str(out), "").replace("--map", ""), r.stderr
    assert "fc1.weight" in load_file(out / "model.safetensors")


MIXTRAL_MAP = REPO / "maps" / "megatron-gpt-mixtral.json"
PER_EXPERT_MAP = REPO / "maps" / "megatron-gpt-mixtral-per-expert.json"


def test_moe_experts_are_stacked_into_transformers_fused_tensors(tmp_path, run_ckptconv):
    """Each layer's 4 experts (2 per expert-parallel rank) in one gate_up_proj
    [experts, 2 x intermediate, hidden] and one down_proj, expert e's bytes
    at index e: megatron's fc1 of expert e is its [gate; up], as
    transformers chunks gate_up_proj[e]."""
    out = tmp_path / "export"
    assert _export(run_ckptconv, "mixtral_ep2", out).returncode == 0
    weights = load_file(out / "model.safetensors")
    plain = tmp_path / "plain"
    assert _export(run_ckptconv, "mixtral_ep2", plain, "--map", "none").returncode == 0
    source = load_file(plain / "model.safetensors")
    cfg = json.loads((ARCH / "mixtral_ep2" / "hf_config" / "config.json").read_text())
    e, i, h = cfg["num_local_experts"], cfg["intermediate_size"], cfg["hidden_size"]
    for layer in range(cfg["num_hidden_layers"]):
        gate_up = weights[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
        down = weights[f"model.layers.{layer}.mlp.experts.down_proj"]
        assert gate_up.shape == (e, 2 * i, h) and down.shape == (e, h, i)
        for x in range(e):
            experts = f"decoder.layers.{layer}.mlp.experts.local_experts.{x}"
            assert gate_up[x].equal(source[f"{experts}.linear_fc1.weight"])
            assert down[x].equal(source[f"{experts}.linear_fc2.weight"])
        assert weights[f"model.layers.{layer}.mlp.gate.weight"].equal(source[f"decoder.layers.{layer}.mlp.router.weight"])


@pytest.mark.parametrize("case,map_name,names", [
    ("mixtral_ep2", "megatron-gpt-mixtral-per-expert",
     ["model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.3.w1.weight",
      "model.layers.1.block_sparse_moe.experts.3.w3.weight", "model.layers.1.block_sparse_moe.experts.3.w2.weight"]),
    ("qwen3moe_ep2", "megatron-gpt-qwen3moe-per-expert",
     ["model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.3.gate_proj.weight",
      "model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.1.mlp.experts.3.down_proj.weight"]),
])
def test_per_expert_names_give_the_same_logits(case, map_name, names, tmp_path, run_ckptconv):
    """--map ...-per-expert: the model's own per-expert names (what vLLM and
    transformers 4 read), which transformers 5 fuses as it loads them."""
    out = tmp_path / "export"
    r = _export(run_ckptconv, case, out, "--map", map_name)
    assert r.returncode == 0, r.stderr
    weights = load_file(out / "model.safetensors")
    assert set(names) <= set(weights)
    assert not any("gate_up_proj" in n for n in weights)
    got = _logits_diff(out, case)
    assert got["max_abs_diff"] <= TOLERANCE, got


def _reversed_experts(spec):
    for rule in spec["rules"]:
        if "stack" in rule:
            rule["stack"] = "num_local_experts - 1 - E"


def _swapped_per_expert_gate_up(spec):
    for rule in spec["rules"]:
        if rule["from"] == "decoder.layers.{L}.mlp.experts.local_experts.{E}.linear_fc1.weight":
            rule["to"] = rule["to"][::-1]


@pytest.mark.parametrize("base,wrong", [(MIXTRAL_MAP, _reversed_experts), (PER_EXPERT_MAP, _swapped_per_expert_gate_up)],
                         ids=["experts_reversed", "per_expert_gate_up_swapped"])
def test_plausible_wrong_moe_maps_fail_the_logits_proof(base, wrong, tmp_path, run_ckptconv):
    spec = json.loads(base.read_text())
    wrong(spec)
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "export"
    r = _export(run_ckptconv, "mixtral_ep2", out, "--map", str(path))
    assert r.returncode == 0, r.stderr  # the shapes fit: only the logits tell
    assert _logits_diff(out, "mixtral_ep2")["max_abs_diff"] > 1000 * TOLERANCE


def test_a_fused_gate_up_in_the_other_order_fails_the_logits_proof(tmp_path, run_ckptconv):
    """transformers chunks gate_up_proj[e] into (gate, up): the export with
    each expert's halves swapped ([up; gate], the order some other fused
    layouts use) loads and misses. No map operation reorders a slice, so the
    halves are swapped in the written file."""
    import torch
    from safetensors.torch import save_file
    out = tmp_path / "export"
    assert _export(run_ckptconv, "mixtral_ep2", out).returncode == 0
    weights = load_file(out / "model.safetensors")
    for name, t in weights.items():
        if name.endswith("gate_up_proj"):
            gate, up = t.chunk(2, dim=1)
            weights[name] = torch.cat([up, gate], dim=1).contiguous()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    assert _logits_diff(out, "mixtral_ep2")["max_abs_diff"] > 1000 * TOLERANCE


def test_a_moe_map_streams_within_the_memory_limit(tmp_path, run_ckptconv):
    """The stacked experts are gathered from the two expert-parallel ranks'
    pieces in slabs of --memory-limit: 1 KiB gives the same bytes."""
    whole, slabs = tmp_path / "whole", tmp_path / "slabs"
    assert _export(run_ckptconv, "mixtral_ep2", whole).returncode == 0
    r = _export(run_ckptconv, "mixtral_ep2", slabs, "--memory-limit", "1K")
    assert r.returncode == 0, r.stderr
    assert (whole / "model.safetensors").read_bytes() == (slabs / "model.safetensors").read_bytes()


@pytest.mark.parametrize("field,value,names", [
    ("num_local_experts", 8, ["decoder.layers.0.mlp.router.weight", "num_local_experts = 8"]),
    ("intermediate_size", 12, ["decoder.layers.0.mlp.experts.local_experts.", "intermediate_size = "]),
])
def test_an_expert_shape_the_config_does_not_give_is_exit_3(field, value, names, tmp_path, run_ckptconv):
    assert_config_mismatch_named("mixtral_ep2", field, value, names, tmp_path, run_ckptconv)


def test_a_tie_rule_writes_the_output_layer_from_the_embedding(tmp_path, run_ckptconv):
    """A megatron model trained with share_embeddings_and_output_weights has
    no output layer; a map with a `tie` rule also writes the embedding as
    lm_head.weight, for a reader that does not tie by itself. Proven by
    loading the export with tie_word_embeddings turned off: transformers then
    takes lm_head from the file, and the logits are megatron's."""
    case = "llama_tied_tp2pp1"
    spec = json.loads(LLAMA_MAP.read_text())
    spec["rules"].append({"from": "embedding.word_embeddings.weight", "to": "lm_head.weight", "tie": True,
                          "unpad": "vocab_size", "shape": ["vocab_size", "hidden_size"],
                          "unless": "1 - tie_word_embeddings"})
    path = tmp_path / "tied.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "export"
    r = _export(run_ckptconv, case, out, "--map", str(path))
    assert r.returncode == 0, r.stderr
    weights = load_file(out / "model.safetensors")
    assert weights["lm_head.weight"].shape == (60, 32)
    assert weights["lm_head.weight"].equal(weights["model.embed_tokens.weight"])
    cfg = json.loads((out / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(cfg))
    got = _logits_diff(out, case)
    assert got["max_abs_diff"] <= TOLERANCE, got
    # Under an untying config the tie is off and the missing output layer is exit 3, as without it.
    config = tmp_path / "config"
    shutil.copytree(ARCH / case / "hf_config", config)
    (config / "config.json").write_text(json.dumps({**json.loads((config / "config.json").read_text()),
                                                    "tie_word_embeddings": False}))
    r = _export(run_ckptconv, case, tmp_path / "untied", "--map", str(path), config=config)
    assert r.returncode == 3 and "'output_layer.weight' is missing" in r.stderr, r.stderr


def test_an_export_over_part_workers_is_the_one_process_folder(tmp_path, run_ckptconv, ckptconv):
    """--config-from with --part was refused (the config was copied by the one
    process only); the finalizing worker now copies it: two workers write the
    one process's export file for file, mapped and sharded."""
    import hashlib

    case = "llama_gqa_tp2pp2"
    extra = ["--max-shard-size", "20000"]
    assert _export(run_ckptconv, case, tmp_path / "one", *extra).returncode == 0
    cmd = [str(ckptconv), "consolidate", str(ARCH / case / "ckpt"), "--only", "model", "--config-from",
           str(ARCH / case / "hf_config"), "-o", f"{tmp_path / 'many'}/", *extra]
    procs = [subprocess.Popen([*cmd, "--part", f"{i}/2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    one = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert "config.json" in one and "model.safetensors.index.json" in one
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == one
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    for name in one:
        assert sha(tmp_path / "many" / name) == sha(tmp_path / "one" / name), name
