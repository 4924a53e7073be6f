"""`ckptconv diff A B`: checkpoints against their own consolidations and
against copies changed by real torch (torch.load, modify, torch.save), across
.pt / .h5 / .safetensors / DCP / per-rank files; --json checked against
docs/schema/diff.schema.json."""
import json
from pathlib import Path

import jsonschema
import pytest
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parent.parent
TD = REPO / "testdata"
DCP = TD / "dcp" / "fsdp2_adamw_ws2"
REF = TD / "dcp" / "fsdp2_adamw_ws2.ref.pt"  # torch's dcp_to_torch_save of DCP
SCHEMA = json.loads((REPO / "docs" / "schema" / "diff.schema.json").read_text())
DCP_FIXTURES = sorted(p.parent for p in (TD / "dcp").glob("*/.metadata")) + \
    sorted(p.parent for p in (TD / "dcp").glob("*/__0.metadata"))


def diff_json(run_ckptconv, a, b, *args):
    r = run_ckptconv("diff", a, b, "--json", *args)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["equal"] == (r.returncode == 0)
    return r.returncode, doc


def tensor_entry(doc, path):
    (t,) = [t for t in doc["tensors"] if t["path"] == path]
    return t


def save_changed(tmp_path, name, change):
    """REF as torch loads it, changed by `change(state)`, saved by torch."""
    state = torch.load(REF, weights_only=True)
    change(state)
    out = tmp_path / name
    torch.save(state, out)
    return out


@pytest.mark.parametrize("src", DCP_FIXTURES, ids=lambda p: p.name)
def test_dcp_directory_equals_torchs_consolidation(run_ckptconv, src):
    ref = src.parent / (src.name + ".ref.pt")
    code, doc = diff_json(run_ckptconv, src, ref)
    assert code == 0, doc
    s = doc["summary"]
    assert s["tensors_compared"] == len([1 for t in doc["tensors"]]) > 0
    assert s["values_compared"] > 0
    assert s["elements_mismatched"] == 0 and not doc["only_in_a"] and not doc["only_in_b"]
    assert all(t["values"]["max_abs_diff"] == 0 for t in doc["tensors"])
    table = run_ckptconv("diff", src, ref)
    assert table.returncode == 0 and table.stdout.rstrip().endswith("equal")


def test_one_element_perturbed_by_1e_3(run_ckptconv, tmp_path):
    def bump(state):
        state["model"]["fc1.weight"][2, 3] += 1e-3
    changed = save_changed(tmp_path, "bumped.pt", bump)
    orig = torch.load(REF, weights_only=True)["model"]["fc1.weight"]
    new = torch.load(changed, weights_only=True)["model"]["fc1.weight"]
    expected_abs = (new.double() - orig.double()).abs().max().item()
    expected_rel = ((new.double() - orig.double()).abs() / new.double().abs()).max().item()

    code, doc = diff_json(run_ckptconv, DCP, changed)
    assert code == 1
    t = tensor_entry(doc, "model.fc1.weight")
    assert not t["equal"]
    v = t["values"]
    assert v["elements"] == 32 and v["mismatched"] == 1 and v["nonfinite_mismatched"] == 0
    assert v["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    assert v["max_abs_diff"] == expected_abs
    assert v["max_rel_diff"] == pytest.approx(expected_rel)
    assert v["first_mismatch"]["index"] == [2, 3] == v["max_abs_diff_at"]["index"]
    assert v["first_mismatch"]["a"] == orig[2, 3].item() and v["first_mismatch"]["b"] == new[2, 3].item()
    assert doc["summary"]["tensors_differing"] == 1 and doc["summary"]["elements_mismatched"] == 1
    assert all(x["equal"] for x in doc["tensors"] if x["path"] != "model.fc1.weight")

    table = run_ckptconv("diff", DCP, changed)
    assert table.returncode == 1
    assert "model.fc1.weight" in table.stdout and "1 of 32 elements outside tolerance" in table.stdout
    assert table.stdout.rstrip().endswith("differ")

    assert run_ckptconv("diff", DCP, changed, "--atol", "1e-2").returncode == 0
    assert run_ckptconv("diff", DCP, changed, "--rtol", "1e-1").returncode == 0
    assert run_ckptconv("diff", DCP, changed, "--atol", "1e-4").returncode == 1
    # Selection as consolidate applies it: without fc1 nothing differs.
    assert run_ckptconv("diff", DCP, changed, "--keys", "fc2|emb").returncode == 0
    assert run_ckptconv("diff", DCP, changed, "--only", "optim").returncode == 0
    # One row at a time gives the same report.
    _, small = diff_json(run_ckptconv, DCP, changed, "--memory-limit", "1", "--threads", "2")
    assert small["tensors"] == doc["tensors"]


def test_across_pt_h5_safetensors_and_dcp(run_ckptconv, tmp_path):
    outputs = {}
    for ext in ("h5", "safetensors", "pt"):
        out = tmp_path / f"full.{ext}"
        r = run_ckptconv("consolidate", DCP, "-o", out)
        assert r.returncode == 0, r.stderr
        outputs[ext] = out
    for a, b in [(DCP, outputs["h5"]), (REF, outputs["h5"]), (outputs["safetensors"], REF),
                 (outputs["h5"], outputs["safetensors"]), (DCP, outputs["pt"])]:
        code, doc = diff_json(run_ckptconv, a, b)
        assert code == 0, (a, b, doc["values"], doc["only_in_a"], doc["only_in_b"])
        assert doc["summary"]["tensors_compared"] == 25


@pytest.mark.parametrize("family", ["fsdp_dt", "fsdp_st"])
def test_per_rank_files_against_the_full_state_dict(run_ckptconv, tmp_path, family):
    """Per-rank files read as {"model": ..., "optim": ...}; torch's
    FULL_STATE_DICT references nested the same way are equal to them."""
    src = TD / family / "adamw_ws2"
    full = tmp_path / "full.pt"
    torch.save({"model": torch.load(src / "model_full.pt", weights_only=True),
                "optim": torch.load(src / "optim_full.pt", weights_only=True)}, full)
    code, doc = diff_json(run_ckptconv, src, full)
    assert code == 0, (doc["values"], doc["only_in_a"], doc["only_in_b"])
    assert doc["a"]["format"] == "fsdp-ranks" and doc["b"]["format"] == "pt"
    assert doc["summary"]["tensors_compared"] > 0


def test_safetensors_written_by_the_safetensors_library(run_ckptconv, tmp_path):
    model = torch.load(TD / "fsdp_dt" / "adamw_ws2" / "model_full.pt", weights_only=True)
    out = tmp_path / "hf.safetensors"
    save_file({k: v.contiguous() for k, v in model.items()}, str(out))
    code, doc = diff_json(run_ckptconv, TD / "fsdp_dt" / "adamw_ws2" / "model_full.pt", out)
    assert code == 0, doc


def test_missing_key(run_ckptconv, tmp_path):
    changed = save_changed(tmp_path, "missing.pt", lambda s: s["model"].pop("fc2.bias"))
    code, doc = diff_json(run_ckptconv, DCP, changed)
    assert code == 1
    assert doc["only_in_a"] == ["model.fc2.bias"] and doc["only_in_b"] == []
    assert all(t["equal"] for t in doc["tensors"])
    code, doc = diff_json(run_ckptconv, changed, DCP)
    assert doc["only_in_b"] == ["model.fc2.bias"]
    table = run_ckptconv("diff", DCP, changed)
    assert "only in A (1):\n  model.fc2.bias" in table.stdout


def test_shape_mismatch(run_ckptconv, tmp_path):
    def transpose(state):
        state["model"]["fc2.weight"] = state["model"]["fc2.weight"].t().contiguous()
    changed = save_changed(tmp_path, "shape.pt", transpose)
    code, doc = diff_json(run_ckptconv, DCP, changed)
    assert code == 1
    t = tensor_entry(doc, "model.fc2.weight")
    assert t["shape_differs"] and t["shape"] == {"a": [7, 8], "b": [8, 7]} and t["values"] is None
    assert "shape (7, 8) vs (8, 7)" in run_ckptconv("diff", DCP, changed).stdout


def test_dtype_mismatch_is_a_difference_unless_ignored(run_ckptconv, tmp_path):
    def to_bf16(state):
        state["model"]["fc1.weight"] = state["model"]["fc1.weight"].bfloat16()
    changed = save_changed(tmp_path, "bf16.pt", to_bf16)
    orig = torch.load(REF, weights_only=True)["model"]["fc1.weight"]
    rounding = (orig.bfloat16().double() - orig.double()).abs()
    code, doc = diff_json(run_ckptconv, DCP, changed)
    assert code == 1
    t = tensor_entry(doc, "model.fc1.weight")
    assert t["dtype_differs"] and t["dtype"] == {"a": "float32", "b": "bfloat16"}
    assert t["values"]["max_abs_diff"] == rounding.max().item()
    assert t["values"]["mismatched"] == int((rounding > 0).sum())
    # Values within tolerance but the dtype differs: still a difference...
    assert run_ckptconv("diff", DCP, changed, "--atol", "1e-2").returncode == 1
    # ...unless dtype differences are ignored.
    code, doc = diff_json(run_ckptconv, DCP, changed, "--atol", "1e-2", "--ignore-dtype")
    assert code == 0 and tensor_entry(doc, "model.fc1.weight")["dtype_differs"]


def test_non_tensor_value_difference(run_ckptconv, tmp_path):
    def lr(state):
        state["optim"]["param_groups"][0]["lr"] = 0.5
    changed = save_changed(tmp_path, "lr.pt", lr)
    old_lr = torch.load(REF, weights_only=True)["optim"]["param_groups"][0]["lr"]
    code, doc = diff_json(run_ckptconv, DCP, changed)
    assert code == 1
    assert doc["values"] == [{"path": "optim.param_groups.0.lr", "a": old_lr, "b": 0.5}]
    assert doc["summary"]["tensors_differing"] == 0
    assert f"optim.param_groups.0.lr  {old_lr} vs 0.5" in run_ckptconv("diff", DCP, changed).stdout


def test_tensor_against_a_value(run_ckptconv, tmp_path):
    changed = save_changed(tmp_path, "kind.pt", lambda s: s["model"].__setitem__("scale", 1.5))
    code, doc = diff_json(run_ckptconv, DCP, changed)
    assert code == 1
    assert doc["values"] == [{"path": "model.scale", "a": {"__tensor__": {"dtype": "float32", "shape": [2]}}, "b": 1.5}]


def test_nan_matches_nan_and_inf_only_the_same_inf(run_ckptconv, tmp_path):
    base = torch.tensor([float("nan"), float("inf"), 1.0, 2.0])
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"x": base}, a)
    torch.save({"x": torch.tensor([float("nan"), float("-inf"), float("nan"), 2.0])}, b)
    code, doc = diff_json(run_ckptconv, a, b, "--atol", "1e9")
    v = tensor_entry(doc, "x")["values"]
    assert code == 1 and v["mismatched"] == 2 and v["nonfinite_mismatched"] == 2
    assert v["first_mismatch"] == {"index": [1], "a": "inf", "b": "-inf"}
    assert diff_json(run_ckptconv, a, a)[0] == 0


def every_bit_pattern():
    """Every value of every 1- and 2-byte float dtype, and a spread of the
    wider and integer ones, each with its float64 (or complex128) value as
    torch computes it."""
    low = {}
    for dt in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz,
               torch.float8_e8m0fnu):
        low[str(dt)] = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(dt)
    for dt in (torch.float16, torch.bfloat16):
        low[str(dt)] = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dt)
    g = torch.Generator().manual_seed(0)
    low["torch.float32"] = torch.randn(1000, generator=g) * 1e30
    low["torch.complex64"] = torch.randn(100, dtype=torch.complex64, generator=g)
    low["torch.complex32"] = torch.randn(100, dtype=torch.complex64, generator=g).to(torch.complex32)
    for dt in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32):
        info = torch.iinfo(dt)
        low[str(dt)] = torch.linspace(info.min, info.max, 257, dtype=torch.float64).to(torch.int64).to(dt)
    low["torch.bool"] = torch.tensor([True, False, True])
    wide = {k: (v.to(torch.complex128) if v.is_complex() else v.to(torch.float64)) for k, v in low.items()}
    return low, wide


def test_every_dtype_decodes_as_torch_converts_it(run_ckptconv, tmp_path):
    low, wide = every_bit_pattern()
    a, b = tmp_path / "low.pt", tmp_path / "wide.pt"
    torch.save(low, a)
    torch.save(wide, b)
    code, doc = diff_json(run_ckptconv, a, b, "--ignore-dtype")
    bad = [(t["path"], t["values"]) for t in doc["tensors"] if not t["equal"]]
    assert code == 0 and not bad, bad
    assert doc["summary"]["elements_compared"] == sum(v.numel() for v in low.values())
    # A change smaller than float16's ulp is seen: its 1.0 (bits 0x3C00) against 1 + 2^-12 in float64.
    wide["torch.float16"][0x3C00 + 32768] = 1.0 + 2.0 ** -12
    torch.save(wide, b)
    code, doc = diff_json(run_ckptconv, a, b, "--ignore-dtype")
    v = tensor_entry(doc, "torch.float16")["values"]
    assert code == 1 and v["mismatched"] == 1 and v["max_abs_diff"] == 2.0 ** -12


def test_int64_beyond_2_pow_53_compares_exactly(run_ckptconv, tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"n": torch.tensor([2 ** 60, 7])}, a)
    torch.save({"n": torch.tensor([2 ** 60 + 1, 7])}, b)
    code, doc = diff_json(run_ckptconv, a, b)
    assert code == 1 and tensor_entry(doc, "n")["values"]["mismatched"] == 1


def test_bad_inputs_and_usage(run_ckptconv, tmp_path):
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(REF.read_bytes()[:-100])
    r = run_ckptconv("diff", DCP, truncated)
    assert r.returncode == 3 and "truncated.pt" in r.stderr and r.stdout == ""
    r = run_ckptconv("diff", DCP, tmp_path / "absent.pt")
    assert r.returncode == 3 and "absent.pt" in r.stderr
    assert run_ckptconv("diff", DCP).returncode == 2
    r = run_ckptconv("diff", DCP, REF, "--atol", "-1")
    assert r.returncode == 2 and "--atol" in r.stderr
    r = run_ckptconv("diff", DCP, REF, "--keys", "no_such_key")
    assert r.returncode == 2
    assert REF.read_bytes() == truncated.read_bytes() + REF.read_bytes()[-100:]  # inputs untouched


def test_selection_that_matches_nothing_on_one_side_is_a_usage_error(run_ckptconv, tmp_path):
    """#36 row 3: never a silent comparison of nothing (it had been exit 1
    with everything 'only in A'): exit 2 naming the side."""
    model_only = tmp_path / "model.pt"
    torch.save({"model": torch.load(REF, weights_only=True)["model"]}, model_only)
    r = run_ckptconv("diff", DCP, model_only, "--only", "optim")
    assert r.returncode == 2 and "B" in r.stderr and "optim" in r.stderr, r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_an_export_made_with_only_model_compares_against_the_sources_model(fmt, run_ckptconv, tmp_path):
    """#36 row 3: `diff ckpt/step-200 hf/model.safetensors.index.json --only
    model` after exporting with --only model compared 0 tensors and said
    "differ": the export holds the model's state dict at its top level, so it
    is compared whole against A's model, and said so."""
    out = tmp_path / f"model.{fmt}"
    extra = ["--max-shard-size", "200"] if fmt == "safetensors" else []
    assert run_ckptconv("consolidate", DCP, "--only", "model", "-o", out, *extra).returncode == 0
    b = tmp_path / "model.safetensors.index.json" if fmt == "safetensors" else out
    assert b.exists()
    r = run_ckptconv("diff", DCP, b, "--only", "model")
    assert r.returncode == 0 and "equal" in r.stdout, r.stdout + r.stderr
    assert "compared whole, as an export made with --only model" in r.stderr, r.stderr
    code, doc = diff_json(run_ckptconv, DCP, b, "--only", "model")
    assert code == 0 and doc["summary"]["tensors_compared"] > 0


def test_values_compare_numbers_by_value_and_tuples_apart_from_lists(run_ckptconv, tmp_path):
    a, b, c = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    torch.save({"step": 1, "betas": (0.9, 0.99)}, a)
    torch.save({"step": 1.0, "betas": (0.9, 0.99)}, b)
    torch.save({"step": 1, "betas": [0.9, 0.99]}, c)
    assert diff_json(run_ckptconv, a, b)[0] == 0
    code, doc = diff_json(run_ckptconv, a, c)
    assert code == 1 and doc["values"] == [{"path": "betas", "a": {"__tuple__": [0.9, 0.99]}, "b": [0.9, 0.99]}]


def test_help_documents_exit_codes(run_ckptconv):
    top = run_ckptconv("--help")
    assert top.returncode == 0 and "Exit codes: 0 success" in top.stdout and "diff found differences" in top.stdout
    sub = run_ckptconv("diff", "--help")
    assert sub.returncode == 0 and "Exit codes: 0 equal; 1 different; 2 usage error; 3" in sub.stdout
    assert "atol + rtol * |b|" in sub.stdout


@pytest.mark.parametrize("a, b", [
    ({"a.b": 1}, {"a": {"b": 1}}),
    ({"a": [1]}, {"a": {"0": 1}}),
    ({"a": {"0": 1}}, {"a": {0: 1}}),
], ids=["dotted_key_vs_nested", "list_vs_str_keys", "str_vs_int_keys"])
def test_structure_is_compared_not_dotted_strings(a, b, tmp_path, run_ckptconv):
    """#18 row 7: these pairs have the same dotted paths and used to be
    "equal"; they are different state dicts (torch's load_state_dict and
    optimizer state lookups would not accept one for the other)."""
    import json
    t = torch.arange(4.0)

    def with_tensor(d):
        return {k: with_tensor(v) if isinstance(v, dict) else ([t] if isinstance(v, list) else t)
                for k, v in d.items()}
    pa, pb = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(with_tensor(a), pa)
    torch.save(with_tensor(b), pb)
    r = run_ckptconv("diff", pa, pb)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "structure: 1 path(s) reached through other containers or key types" in r.stdout
    r = run_ckptconv("diff", pa, pb, "--json")
    j = json.loads(r.stdout)
    assert not j["equal"] and j["summary"]["structure_differing"] == 1 and j["structure"][0]["a"] != j["structure"][0]["b"]
    assert run_ckptconv("diff", pa, pa).returncode == 0


def test_flat_keyed_safetensors_compares_by_path(tmp_path, run_ckptconv, testdata):
    """A safetensors file without ckptconv's tree metadata names tensors by
    flat keys: its nesting is unknown, so it equals a nested source with the
    same paths (a Hugging Face export against its DCP source)."""
    from safetensors.torch import save_file
    src = testdata / "dcp" / "fsdp2_adamw_ws2"
    full = tmp_path / "full.pt"
    assert run_ckptconv("consolidate", src, "--only", "model", "-o", full).returncode == 0
    flat = tmp_path / "flat.safetensors"
    def flatten(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flatten(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v.contiguous()
    save_file(dict(flatten(torch.load(full, weights_only=True))), str(flat))
    r = run_ckptconv("diff", full, flat)
    assert r.returncode == 0, r.stdout + r.stderr


CONSOLIDATED_SOURCES = [
    TD / "dcp" / "fsdp2_adamw_ws2", TD / "fsdp_st" / "adamw_ws3", TD / "fsdp_dt" / "adamw_ws2",
    TD / "zero" / "z2_bf16_ws2", TD / "zero" / "z3_fp32_ws2", TD / "titan" / "checkpoint" / "step-3",
    TD / "frameworks" / "accelerate_fsdp1_ws2" / "project" / "checkpoints" / "checkpoint_1",
    TD / "frameworks" / "lightning_fsdp1_ws2" / "checkpoints" / "epoch=0-step=2.ckpt",
    TD / "legacy" / "torch113_fsdp1_st_ws2" / "ckpt",
]


@pytest.mark.parametrize("src", CONSOLIDATED_SOURCES, ids=lambda p: str(p.relative_to(TD)))
def test_a_consolidation_equals_its_source(src, tmp_path, run_ckptconv):
    """#30 row 3: consolidate SRC -o OUT, then diff SRC OUT is 0 for every
    source family; torchtitan's train_state BytesIO items, which consolidate
    writes as their bytes, are equal with a note, and differ under --strict."""
    out = tmp_path / "full.pt"
    r = run_ckptconv("consolidate", src, "-o", out)
    assert r.returncode == 0, r.stderr
    r = run_ckptconv("diff", src, out)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_ckptconv("diff", src, out, "--json")
    noted = json.loads(r.stdout)["summary"]["bytes_io_as_bytes"]
    if "titan" in str(src):
        assert noted == 3  # train_state's global_avg_losses, global_max_losses, log_steps
        r = run_ckptconv("diff", src, out)
        assert "3 BytesIO value(s) equal to the bytes on the other side" in r.stdout, r.stdout
        r = run_ckptconv("diff", src, out, "--strict")
        assert r.returncode == 1 and "train_state.log_steps" in r.stdout, r.stdout
    else:
        assert noted == 0


def test_diff_takes_a_tag_for_each_side(tmp_path, run_ckptconv):
    """#36 row 5: `diff ckpt ckpt/step-200` said "choose one with --tag", an
    option diff did not have. --tag chooses A's checkpoint, --tag-b B's, and
    the message names the option of the side that needs one."""
    import shutil
    root = tmp_path / "ckpt"
    root.mkdir()
    for step in (100, 200):
        shutil.copytree(DCP, root / f"step-{step}")
    # a folder of steps without a tag is read at its latest complete step, said in a note (#48 row 6)
    r = run_ckptconv("diff", root, root / "step-200")
    assert r.returncode == 0 and f"reading {root}/step-200" in r.stderr and "no --tag" in r.stderr, r.stderr
    r = run_ckptconv("diff", root / "step-100", root)
    assert r.returncode == 0 and f"reading {root}/step-200" in r.stderr, r.stdout + r.stderr
    # an incomplete folder of steps: the message names the side's option
    for step in (100, 200):
        (root / f"step-{step}" / ".metadata").unlink()
    r = run_ckptconv("diff", DCP, root)
    assert r.returncode == 2 and "B: " in r.stderr and "--tag-b NAME" in r.stderr, r.stderr
    r = run_ckptconv("diff", root, DCP)
    assert r.returncode == 2 and "A: " in r.stderr and "--tag NAME" in r.stderr, r.stderr
    for step in (100, 200):
        shutil.copy(DCP / ".metadata", root / f"step-{step}" / ".metadata")
    r = run_ckptconv("diff", root, root / "step-200", "--tag", "latest")
    assert r.returncode == 0 and "equal" in r.stdout, r.stdout + r.stderr
    r = run_ckptconv("diff", root, root, "--tag", "step-100", "--tag-b", "step-200")
    assert r.returncode == 0, r.stdout + r.stderr


def test_stride_zero_views_are_compared_once_per_repeated_value(run_ckptconv, tmp_path):
    """diff walked every logical element of two expanded tensors (two 2 KB
    files viewing 3 values as 2^40 x 3: hours). A dimension both sides view
    with stride 0 is compared once and its counts scaled; the report equals
    the one of the same tensors materialized small, counts times 2^40 / 4,
    samples at the same (first) element."""
    a_row = torch.tensor([[1.0, 2.0, float("nan"), 4.0]])
    b_row = torch.tensor([[1.0, 2.5, float("inf"), 3.0]])
    col_a, col_b = torch.tensor([[0.0], [1.0]]), torch.tensor([[0.0], [1.5]])
    big, small = tmp_path / "big", tmp_path / "small"
    for d, n in ((big, 2**40), (small, 4)):
        d.mkdir()
        torch.save({"w": a_row.expand(n, 4), "c": col_a.expand(2, n)}, d / "a.pt")
        torch.save({"w": b_row.expand(n, 4), "c": col_b.expand(2, n)}, d / "b.pt")
        if d is small:  # materialized: no stride 0 left, every element walked
            for side in ("a", "b"):
                sd = torch.load(d / f"{side}.pt", weights_only=True)
                torch.save({k: v.contiguous() for k, v in sd.items()}, d / f"{side}.pt")
    assert (big / "a.pt").stat().st_size < 4096
    docs = {d: diff_json(run_ckptconv, d / "a.pt", d / "b.pt")[1] for d in (big, small)}
    for path in ("w", "c"):
        got, want = tensor_entry(docs[big], path)["values"], tensor_entry(docs[small], path)["values"]
        scale = 2**40 // 4
        for k in ("elements", "mismatched", "nonfinite_mismatched"):
            assert got[k] == want[k] * scale, (path, k, got[k], want[k])
        assert got["max_abs_diff"] == want["max_abs_diff"] and got["max_rel_diff"] == want["max_rel_diff"]
        for k in ("first_mismatch", "max_abs_diff_at"):
            assert got[k]["a"] == want[k]["a"] and got[k]["b"] == want[k]["b"], (path, k)
            assert got[k]["index"] == want[k]["index"], (path, k, got[k], want[k])
