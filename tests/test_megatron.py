"""Megatron-core torch_dist checkpoints (testdata/megatron,
tools/make_megatron_checkpoints.py): GPT models saved by real megatron-core
0.16.1 at TP x PP in {1x1, 2x1, 1x2, 2x2} with a fully_reshardable
DistributedOptimizer, and one at DP=2 with a dp_reshardable one.

References are megatron-core's own reading of the same files:
``dist_checkpointing.load`` into a model built at TP=1 x PP=1 (model_ref.pt)
and the TP=1 parameter-shaped optimizer state it loads (optim_ref.pt). The
stored view is compared with torch's own ``dcp_to_torch_save`` of the
directory."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from proofs_guard import require_side_env
from state_compare import assert_same

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "testdata" / "megatron"
CASES = sorted(p.name for p in ROOT.iterdir() if p.is_dir())
FULLY = [c for c in CASES if json.loads((ROOT / c / "case.json").read_text())["optim_ref"]]
# Megatron-LM's own state beside the model (args, rng_state with numpy's
# RNG state): read as data (test_megatron_lm_state, test_framework_state.py).
MLM = "gpt_tp2pp1_mlm"
STORED = [c for c in CASES if "args" not in json.loads((ROOT / c / "case.json").read_text())["saved"]]


def load(p):
    return torch.load(p, weights_only=True)


class _Stub:
    """Stands in for a megatron class (an enum in Megatron-LM's args) when a
    test reads its own fixture's common.pt without megatron-core installed."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


def load_common(case):
    import pickle
    import types

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            return _Stub if module.startswith("megatron.") else super().find_class(module, name)

    # weights_only=False only for our own fixture, whose args holds an argparse.Namespace.
    return torch.load(ROOT / case / "ckpt" / "common.pt", weights_only=False,
                      pickle_module=types.SimpleNamespace(Unpickler=Unpickler, load=pickle.load, __name__="pickle"))


def consolidate(run_ckptconv, src, out, *args):
    r = run_ckptconv("consolidate", str(src), "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return out


def test_the_cases_cover_the_issue():
    grid = set()
    for c in CASES:
        info = json.loads((ROOT / c / "case.json").read_text())
        assert info["megatron_core"] == "0.16.1"
        grid.add((info["tensor_model_parallel_size"], info["pipeline_model_parallel_size"],
                  info["data_parallel_size"], info["distrib_optim_sharding_type"]))
    assert {(tp, pp) for tp, pp, dp, s in grid if s == "fully_reshardable"} == {(1, 1), (2, 1), (1, 2), (2, 2)}
    assert any(s == "dp_reshardable" and dp == 2 for tp, pp, dp, s in grid)
    moe = json.loads((ROOT / "moe_ep2" / "case.json").read_text())
    assert moe["model_config"]["expert_model_parallel_size"] == 2 and moe["model_config"]["num_moe_experts"] == 4


@pytest.mark.parametrize("case", CASES)
def test_only_model_equals_megatron_load_at_tp1_pp1(case, tmp_path, run_ckptconv):
    got = load(consolidate(run_ckptconv, ROOT / case / "ckpt", tmp_path / "m.pt", "--only", "model"))
    # Same names in the same order (layers unstacked, layer-major), same bits;
    # the local spec's _extra_state objects are None, as the model's.
    assert_same(got, load(ROOT / case / "model_ref.pt"))


@pytest.mark.parametrize("case", FULLY)
def test_only_optim_equals_megatron_load_at_tp1(case, tmp_path, run_ckptconv):
    got = load(consolidate(run_ckptconv, ROOT / case / "ckpt", tmp_path / "o.pt", "--only", "optim"))
    want = load(ROOT / case / "optim_ref.pt")
    assert list(got) == ["state", "param_groups"]
    # megatron-core's load gives the state by parameter index; the names are
    # its own sharded keys, unstacked (see the generator).
    assert_same(got["state"], want, "state", key_order=False)
    common = load_common(case)
    assert_same(got["param_groups"], common["optimizer"]["optimizer"]["param_groups"], "param_groups")
    assert {k for v in got["state"].values() for k in v} == {"param", "exp_avg", "exp_avg_sq"}


@pytest.mark.parametrize("case", [c for c in CASES if c != "gpt_tp1pp1_dp2_dpresh"])
def test_optimizer_masters_are_the_model_weights(case, tmp_path, run_ckptconv):
    # fp32 parameters: after the step megatron copies each fp32 master
    # ("param") into the model, so the two views name the same values. For
    # the MoE case (whose ChainedOptimizer megatron-core cannot load at
    # EP=1, see the generator) this is the check of --only optim.
    src = ROOT / case / "ckpt"
    model = load(consolidate(run_ckptconv, src, tmp_path / "m.pt", "--only", "model"))
    optim = load(consolidate(run_ckptconv, src, tmp_path / "o.pt", "--only", "optim"))
    tensors = {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
    assert list(optim["state"]) and set(optim["state"]) == set(tensors)
    for k, v in tensors.items():
        assert_same(optim["state"][k]["param"], v, k)
    common = load_common(case)["optimizer"]
    chained = [common[i] for i in sorted(common)] if 0 in common else [common]
    assert optim["param_groups"] == [g for c in chained for g in c["optimizer"]["param_groups"]]


def _nested(shape):
    return [None] * shape[0] if len(shape) == 1 else [_nested(shape[1:]) for _ in range(shape[0])]


@pytest.mark.parametrize("case", STORED)
def test_stored_view_equals_dcp_to_torch_save(case, tmp_path, run_ckptconv):
    src = ROOT / case / "ckpt"
    got = load(consolidate(run_ckptconv, src, tmp_path / "all.pt"))
    dcp_to_torch_save(src, tmp_path / "torch.pt")
    theirs = torch.load(tmp_path / "torch.pt", weights_only=False)
    common = torch.load(src / "common.pt", weights_only=True)
    objects = {}
    for key, value in theirs.items():
        if "/shard_" in key:
            # megatron-core saves each object shard as torch.save([obj]).
            name, rest = key.split("/shard_")
            offset, shape = ([int(x) for x in part.split(".")] for part in rest.split("_"))
            grid = objects.setdefault(name, _nested(shape))
            for i in offset[:-1]:
                grid = grid[i]
            grid[offset[-1]] = value[0]
        else:
            assert_same(got[key], value, key)
    for name, values in objects.items():
        assert got[name] == values, name
    for key, value in common.items():
        assert_same(got[key], value, key)
    assert set(got) == {k for k in theirs if "/shard_" not in k} | set(objects) | set(common)


def test_dp_reshardable_optimizer_is_refused_saying_what_is_missing(tmp_path, run_ckptconv):
    src = ROOT / "gpt_tp1pp1_dp2_dpresh" / "ckpt"
    r = run_ckptconv("consolidate", str(src), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3
    assert "dp_reshardable" in r.stderr and "param_index_map" in r.stderr and "fully_reshardable" in r.stderr
    assert not (tmp_path / "o.pt").exists()
    # The buffers themselves are read as stored.
    got = load(consolidate(run_ckptconv, src, tmp_path / "all.pt"))
    buckets = [k for k in got if k.startswith("optimizer.distributed.") and k.endswith(".exp_avg")]
    assert len(buckets) == 1 and got[buckets[0]].shape == (2624,)


@pytest.mark.parametrize("case", ["gpt_tp2pp2", "gpt_tp1pp2"])
def test_export_hf_folder_bf16(case, tmp_path, run_ckptconv):
    from safetensors.torch import load_file
    out = tmp_path / "export"
    r = run_ckptconv("consolidate", str(ROOT / case / "ckpt"), "--only", "model", "--dtype", "bf16",
                     "-o", f"{out}/")
    assert r.returncode == 0, r.stderr
    got = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update(load_file(f))
    ref = {k: v for k, v in load(ROOT / case / "model_ref.pt").items() if isinstance(v, torch.Tensor)}
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert_same(got[k], v.to(torch.bfloat16), k)


@pytest.mark.parametrize("layout,ws", [("dcp", 2), ("dcp", 3), ("fsdp-dtensor", 2), ("fsdp-sharded-tensor", 3)])
def test_migrate_to_fsdp_layouts(layout, ws, tmp_path, run_ckptconv):
    src = ROOT / "gpt_tp2pp2" / "ckpt"
    out = tmp_path / "out"
    r = run_ckptconv("reshard", str(src), "--only", "model", "--layout", layout, "--world-size", str(ws),
                     "-o", str(out))
    assert r.returncode == 0, r.stderr
    ref = load(ROOT / "gpt_tp2pp2" / "model_ref.pt")
    # To DCP, reshard --only keeps the entry's name: {"model": ...}, as an
    # FSDP2 job's DCP save of {"model": model_state_dict} holds it; a rank
    # file holds the module's state dict itself.
    back = load(consolidate(run_ckptconv, out, tmp_path / "back.pt"))
    if layout == "dcp":
        back = back["model"]
    assert_same({k: v for k, v in back.items() if isinstance(v, torch.Tensor)},
                {k: v for k, v in ref.items() if isinstance(v, torch.Tensor)})
    if layout == "dcp":
        # torch's own DCP loader fills a TP=1 state dict of the unstacked
        # names from the files written for `ws` ranks.
        import torch.distributed.checkpoint as dcp
        template = {k: torch.empty_like(v) for k, v in ref.items() if isinstance(v, torch.Tensor)}
        dcp.load({"model": template}, checkpoint_id=str(out), no_dist=True)
        for k, v in template.items():
            assert_same(v, ref[k], k)


def test_validate_clean_and_damaged(tmp_path, run_ckptconv):
    src = ROOT / "gpt_tp2pp2" / "ckpt"
    r = run_ckptconv("validate", str(src))
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "ckpt"
    shutil.copytree(src, bad)
    # The second pipeline stage's files: layer 1 of every stacked tensor,
    # and its shard of every _extra_state object.
    for victim in sorted(bad.glob("__[23]_*.distcp")):
        victim.unlink()
    r = run_ckptconv("validate", str(bad))
    assert r.returncode == 1
    assert "__2_0.distcp: cannot open" in r.stdout and "__3_1.distcp: cannot open" in r.stdout
    assert ("sharded object 'decoder.layers.mlp.linear_fc1._extra_state' of shape (2,): 1 of its 2 shards are "
            "stored and readable; missing: (1,)") in r.stdout
    r = run_ckptconv("consolidate", str(bad), "-o", str(tmp_path / "o.pt"))
    assert r.returncode == 3 and not (tmp_path / "o.pt").exists()


def test_detected_before_plain_dcp(run_ckptconv):
    r = run_ckptconv("inspect", str(ROOT / "gpt_tp1pp2" / "ckpt"))
    assert r.returncode == 0, r.stderr
    assert "megatron-torch-dist" in r.stdout
    assert "decoder.layers.self_attention.linear_qkv.weight" in r.stdout


@pytest.mark.parametrize("text,message", [
    ('{"sharded_backend": "zarr", "sharded_backend_version": 1}', "sharded_backend 'zarr'"),
    ('{"sharded_backend": "torch_dist", "sharded_', "not JSON"),
    ('{"sharded_backend": 7}', "no \\\"sharded_backend\\\" string"),
])
def test_bad_metadata_json_is_refused(text, message, tmp_path, run_ckptconv):
    bad = tmp_path / "ckpt"
    shutil.copytree(ROOT / "gpt_tp1pp1" / "ckpt", bad)
    (bad / "metadata.json").write_text(text)
    r = run_ckptconv("consolidate", str(bad), "-o", str(tmp_path / "o.pt"))
    assert r.returncode == 3, r.stderr
    assert "metadata.json" in r.stderr
    assert not (tmp_path / "o.pt").exists()


def test_hostile_common_pt_is_refused(tmp_path, run_ckptconv):
    bad = tmp_path / "ckpt"
    shutil.copytree(ROOT / "gpt_tp1pp1" / "ckpt", bad)

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    torch.save({"iteration": 1, "args": Evil()}, bad / "common.pt")
    r = run_ckptconv("consolidate", str(bad), "-o", str(tmp_path / "o.pt"))
    assert r.returncode == 3
    assert "common.pt" in r.stderr and "system" in r.stderr and "training job's own state" in r.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "o.pt").exists()
    # --only model never needs the job's objects: skipped with a warning.
    r = run_ckptconv("consolidate", str(bad), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "pwned").exists()


def test_hostile_optimizer_entry_of_common_pt_is_refused_where_it_is_read(tmp_path, run_ckptconv):
    """--only optim reads param_groups from common.pt's 'optimizer': that
    entry naming an unknown global is refused there (not dropped, which
    would read on without it), and skipped by --only model, which does not read it."""
    bad = tmp_path / "ckpt"
    shutil.copytree(ROOT / "gpt_tp1pp1" / "ckpt", bad)
    common = torch.load(bad / "common.pt", weights_only=False)

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    common["optimizer"]["evil"] = Evil()
    torch.save(common, bad / "common.pt")
    r = run_ckptconv("consolidate", str(bad), "-o", str(tmp_path / "o.pt"), "--only", "optim")
    assert r.returncode == 3, r.stderr
    assert "entry 'optimizer' names global" in r.stderr and "system" in r.stderr
    assert "skip it" not in r.stderr  # not offered as skippable: this view needs the entry
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "o.pt").exists()
    r = run_ckptconv("consolidate", str(bad), "-o", str(tmp_path / "m.pt"), "--only", "model")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("src", ["megatron/gpt_tp2pp1/ckpt", "ucp/z2_bf16_ws2"])
def test_json_reports_meet_their_schemas(src, run_ckptconv):
    # The format names of the newer readers are in the schemas' enums.
    import jsonschema
    schemas = REPO / "docs" / "schema"
    r = run_ckptconv("inspect", str(REPO / "testdata" / src), "--json")
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), json.loads((schemas / "inspect.schema.json").read_text()))
    r = run_ckptconv("validate", str(REPO / "testdata" / src), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    jsonschema.validate(json.loads(r.stdout), json.loads((schemas / "validate.schema.json").read_text()))


# ------------------------------------------------------------ reshard --layout megatron

MEGATRON_PY = REPO / ".venv-megatron" / "bin" / "python"


@pytest.fixture
def megatron_env():
    require_side_env(MEGATRON_PY, "loading with megatron-core itself runs", "scripts/setup-megatron")


needs_megatron = pytest.mark.usefixtures("megatron_env")


def to_torch_dist(run_ckptconv, case, ws, out):
    r = run_ckptconv("reshard", str(ROOT / case / "ckpt"), "--world-size", str(ws), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "(megatron)" in r.stderr  # the source's own layout by default
    return out


@pytest.mark.parametrize("case,ws", [("gpt_tp2pp2", 3), ("gpt_tp1pp1", 2), ("gpt_tp2pp1", 1), ("moe_ep2", 3)])
def test_written_torch_dist_holds_what_the_source_holds(case, ws, tmp_path, run_ckptconv):
    src = ROOT / case / "ckpt"
    out = to_torch_dist(run_ckptconv, case, ws, tmp_path / "out")
    # Items as megatron-core names and packs them (objects as KEY/shard_<i>_<n> -> [obj]).
    dcp_to_torch_save(src, tmp_path / "a.pt")
    dcp_to_torch_save(out, tmp_path / "b.pt")
    assert_same(torch.load(tmp_path / "b.pt", weights_only=False), torch.load(tmp_path / "a.pt", weights_only=False),
                key_order=False)
    for f in ("common.pt", "metadata.json"):
        assert (out / f).read_bytes() == (src / f).read_bytes(), f
    assert len(list(out.glob("*.distcp"))) == ws
    # And every view of ckptconv's own reading.
    for only, ref in (("model", "model_ref.pt"), ("optim", "optim_ref.pt")):
        if not (ROOT / case / ref).exists():
            continue  # MoE: no optimizer reference (see the generator)
        got = load(consolidate(run_ckptconv, out, tmp_path / f"{only}.pt", "--only", only))
        want = load(ROOT / case / ref)
        if only == "model":
            assert_same(got, want)
        else:
            assert_same(got["state"], want, "state", key_order=False)


@needs_megatron
@pytest.mark.parametrize("case,ws,tp,pp,dp", [
    ("gpt_tp2pp2", 3, 1, 2, 1),
    ("gpt_tp2pp2", 3, 2, 1, 1),
    ("gpt_tp1pp1", 2, 2, 2, 1),
    ("gpt_tp1pp2", 1, 1, 1, 2),
    ("moe_ep2", 3, 1, 1, 2),
])
def test_megatron_core_loads_the_written_torch_dist(case, ws, tp, pp, dp, tmp_path, run_ckptconv):
    import subprocess
    out = to_torch_dist(run_ckptconv, case, ws, tmp_path / "out")
    report = tmp_path / "load.json"
    r = subprocess.run([str(MEGATRON_PY), str(REPO / "tests" / "megatron_load.py"), str(ROOT / case / "ckpt"),
                        str(out), str(tp), str(pp), str(dp), str(report), str(ROOT / case / "case.json")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(report.read_text())
    # Every rank of a model built at TP x PP x DP loads the same model and
    # optimizer tensors from ckptconv's files as from megatron-core's own.
    assert got["ranks"] == tp * pp * dp and got["tensors"] > 0
    assert got["differ"] == []


@pytest.mark.parametrize("args,message", [
    (["--only", "model"], "read whole"),
])
def test_megatron_layout_refusals(args, message, tmp_path, run_ckptconv):
    # (--part is taken: tests/test_parts.py writes the same files from parts as from one process)
    r = run_ckptconv("reshard", str(ROOT / "gpt_tp1pp1" / "ckpt"), "--layout", "megatron", "--world-size", "2",
                     "-o", str(tmp_path / "out"), *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


def test_megatron_layout_needs_a_torch_dist_source(testdata, tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(testdata / "dcp" / "fsdp2_adamw_ws2"), "--layout", "megatron",
                     "--world-size", "2", "-o", str(tmp_path / "out"))
    assert r.returncode == 2
    assert "torch_dist" in r.stderr


@pytest.mark.parametrize("case,ws", [("gpt_tp2pp2", 2), ("moe_ep2", 3)])
def test_fsdp2_job_resumes_from_the_migration(case, ws, tmp_path, run_ckptconv):
    import subprocess
    import sys
    sys.path.insert(0, str(REPO / "tests"))
    from megatron_fsdp2_resume import build, step
    out = tmp_path / "dcp"
    r = run_ckptconv("reshard", str(ROOT / case / "ckpt"), "--only", "model", "--layout", "dcp",
                     "--world-size", str(ws), "-o", str(out))
    assert r.returncode == 0, r.stderr
    ref_path = ROOT / case / "model_ref.pt"
    r = subprocess.run([sys.executable, str(REPO / "tests" / "megatron_fsdp2_resume.py"), str(out), str(ref_path),
                        str(ws), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = {k: v for k, v in load(ref_path).items() if isinstance(v, torch.Tensor)}
    # (The module's key order is its registration order, not the file's.)
    assert_same(load(tmp_path / "loaded.pt"), ref, key_order=False)
    # The same step in one process, on megatron-core's reading of the source.
    single = build(ref)
    single.load_state_dict(ref)
    step(single)
    assert not torch.equal(single.state_dict()["output_layer.weight"], ref["output_layer.weight"])
    assert_same(load(tmp_path / "stepped.pt"), {k: v.detach() for k, v in single.state_dict().items()},
                key_order=False)


def test_diff_and_parts(tmp_path, run_ckptconv):
    src = ROOT / "gpt_tp2pp2" / "ckpt"
    rewritten = to_torch_dist(run_ckptconv, "gpt_tp2pp2", 3, tmp_path / "ws3")
    r = run_ckptconv("diff", str(src), str(rewritten))
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_ckptconv("diff", str(src), str(ROOT / "gpt_tp1pp2" / "ckpt"))
    assert r.returncode == 1 and "differ" in r.stdout
    # Two processes' parts make the one-process file, byte for byte.
    whole = consolidate(run_ckptconv, src, tmp_path / "whole.pt", "--only", "model")
    for i in range(2):
        r = run_ckptconv("consolidate", str(src), "--only", "model", "-o", str(tmp_path / "parted.pt"),
                         "--part", f"{i}/2")
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "parted.pt").read_bytes() == whole.read_bytes()


def _torch_dist(path, items):
    """A torch_dist directory written by torch's own DCP writer (one process).
    Its default planner stores a non-tensor value as torch.save(value): the
    bytes megatron-core's planner stores for a sharded object, whose value
    it torch.saves as [obj] itself."""
    import torch.distributed.checkpoint as dcp
    dcp.save(dict(items), checkpoint_id=str(path), no_dist=True)
    (path / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
                                        '"common_backend": "torch", "common_backend_version": 1}')
    return path


@pytest.mark.parametrize("items,message", [
    ({"a": torch.ones(2), "a/shard_0_1": [None]}, "is both a stored item and a sharded object's key"),
    ({"x._extra_state/shard_0_2": 5, "x._extra_state/shard_1_2": [None]}, "is not a list of one object"),
    ({"x._extra_state/shard_0_2": [None], "x._extra_state/shard_1_3": [None]}, "has shards of shapes"),
    ({"x._extra_state/shard_0_2": [None]}, "1 of its 2 shards"),
    # A claimed extent of 10^12 costs what is stored, not the extent.
    ({"x._extra_state/shard_0_999999999999": [None]}, "1 of its 999999999999 shards"),
    ({"x._extra_state/shard_0.0_2": [None]}, "2 offsets for a 1-d shape"),
    ({"decoder.layers.w": torch.ones(2, 3), "decoder.layers.v": torch.ones(3, 3)}, "not one stack"),
])
def test_hostile_torch_dist_is_refused(items, message, tmp_path, run_ckptconv):
    src = _torch_dist(tmp_path / "ckpt", items)
    r = run_ckptconv("consolidate", str(src), "--only", "model", "-o", str(tmp_path / "o.pt"), timeout=60)
    assert r.returncode == 3, r.stderr
    assert message in r.stderr and str(src) in r.stderr
    assert not (tmp_path / "o.pt").exists()
    if "stack" not in message:  # the stored items are sound; only unstacking them is not
        r = run_ckptconv("validate", str(src), timeout=60)  # reads past each problem it can
        assert r.returncode in (1, 3) and message in r.stdout + r.stderr


def test_dry_run_lists_the_files_and_writes_nothing(tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(ROOT / "gpt_tp2pp2" / "ckpt"), "--world-size", "2", "-o", str(tmp_path / "out"),
                     "--dry-run")
    assert r.returncode == 0, r.stderr
    for line in ("rank 0: __0_0.distcp", "rank 1: __1_0.distcp", ".metadata:", "common.pt (",
                 "metadata.json ("):
        assert line in r.stdout, line
    assert not (tmp_path / "out").exists()


def test_megatron_lm_state(tmp_path, run_ckptconv):
    # What Megatron-LM's training loop adds: args (an argparse.Namespace
    # holding a megatron enum) in common.pt, and rng_state, a sharded object
    # holding numpy's RNG state. Both are read as data (issue #48 row 1,
    # docs/pickle-globals.md "Framework objects as data";
    # tests/test_framework_state.py checks the values): --only model reads
    # the model alone without a warning, the stored view and reshard carry
    # them, validate passes.
    src = ROOT / MLM / "ckpt"
    r = run_ckptconv("consolidate", str(src), "--only", "model", "-o", str(tmp_path / "m.pt"))
    assert r.returncode == 0, r.stderr
    assert "names global" not in r.stderr and "skipped" not in r.stderr, r.stderr
    assert_same(load(tmp_path / "m.pt"), load(ROOT / MLM / "model_ref.pt"))
    r = run_ckptconv("consolidate", str(src), "-o", str(tmp_path / "all.pt"))
    assert r.returncode == 0, r.stderr
    got = load(tmp_path / "all.pt")
    assert isinstance(got["args"], dict) and got["args"]["attention_backend"] == 5  # AttnBackend.auto
    assert got["rng_state"][0][0][0]["np_rng_state"][0] == "MT19937"
    r = run_ckptconv("reshard", str(src), "--world-size", "2", "-o", str(tmp_path / "ws2"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ws2" / "common.pt").read_bytes() == (src / "common.pt").read_bytes()
    r = run_ckptconv("validate", str(src))
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr


@needs_megatron
@pytest.mark.parametrize("field,value", [("sharded_backend_version", 2), ("common_backend", "zarr"),
                                         ("common_backend_version", "1")])
def test_a_backend_version_megatron_has_no_strategy_for_is_refused(field, value, tmp_path, run_ckptconv):
    """megatron-core loads through the strategy registered for ('torch_dist',
    1) and ('torch', 1): another pair in metadata.json is "Cannot find a
    default strategy" there. ckptconv read it as version 1 and validated it
    VALID; now exit 3 naming the field. 1.0 for 1 is the same key in Python."""
    import subprocess

    ckpt = tmp_path / "ckpt"
    shutil.copytree(ROOT / "gpt_tp1pp1" / "ckpt", ckpt)
    meta = json.loads((ckpt / "metadata.json").read_text())
    verify = ("import sys\nfrom megatron.core.dist_checkpointing.validation import "
              "verify_checkpoint_and_load_strategy as v\n"
              "try:\n    v(sys.argv[1])\nexcept Exception as e:\n    print(e)")
    for v, refused in ((value, True), (1.0 if field != "common_backend" else "torch", False)):
        (ckpt / "metadata.json").write_text(json.dumps({**meta, field: v}))
        said = subprocess.run([str(MEGATRON_PY), "-c", verify, str(ckpt)], capture_output=True, text=True).stdout
        assert ("Cannot find a default strategy" in said) == refused, said
        r = run_ckptconv("validate", ckpt)
        if refused:
            assert r.returncode == 3 and f"metadata.json: {field} {json.dumps(v)}, where megatron-core" in r.stdout, \
                r.stdout + r.stderr
            r = run_ckptconv("consolidate", ckpt, "-o", tmp_path / "o.pt")
            assert r.returncode == 3 and field in r.stderr and not (tmp_path / "o.pt").exists(), r.stderr
        else:
            assert r.returncode == 0, r.stdout + r.stderr
