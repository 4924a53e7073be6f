"""consolidate of per-rank FSDP files (ShardedTensor and DTensor values)
against torch's own FULL_STATE_DICT state dicts of the same run."""
import io
import json
import pickletools
import shutil
import struct
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from state_compare import assert_same, cast_floats

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import make_checkpoints  # noqa: E402  (Net, param_groups, batch of the generator)

RANK_DIRS = [REPO / "testdata" / p for p in
             ("fsdp_st/adamw_ws2", "fsdp_st/adamw_ws3", "fsdp_dt/adamw_ws2", "fsdp_dt/adamw_ws3")]
VERL = REPO / "testdata" / "fsdp_dt" / "verl_flat_ws2"
ids = lambda p: f"{p.parent.name}/{p.name}"  # noqa: E731


def full(d):
    return (torch.load(d / "model_full.pt", weights_only=True),
            torch.load(d / "optim_full.pt", weights_only=True))


def consolidate(run_ckptconv, src, out, *args):
    r = run_ckptconv("consolidate", *([str(src)] if src is not None else []), "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    return torch.load(out, weights_only=True)


def rank_files(d, kind):
    return sorted(p for p in d.iterdir() if p.name.startswith(kind) and "rank" in p.name)


def test_manifest_lists_the_rank_fixtures(manifest):
    families = {f["path"]: f for f in manifest["fixtures"]}
    for d in RANK_DIRS + [VERL]:
        rel = str(d.relative_to(REPO / "testdata"))
        assert families[rel]["family"] in ("fsdp_sharded_tensor", "fsdp_dtensor")
        assert len(families[rel]["model_files"]) == families[rel]["world_size"]


@pytest.mark.parametrize("d", RANK_DIRS, ids=ids)
def test_folder_with_model_and_optim_files_gives_both(d, tmp_path, run_ckptconv):
    model, optim = full(d)
    assert_same(consolidate(run_ckptconv, d, tmp_path / "out.pt"), {"model": model, "optim": optim})


@pytest.mark.parametrize("d", RANK_DIRS, ids=ids)
@pytest.mark.parametrize("only", ["model", "optim"])
def test_only_gives_that_state_dict_alone(d, only, tmp_path, run_ckptconv):
    model, optim = full(d)
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt", "--only", only)
    assert_same(got, model if only == "model" else optim)


@pytest.mark.parametrize("d", RANK_DIRS, ids=ids)
def test_glob_and_file_list_select_one_family(d, tmp_path, run_ckptconv):
    model, optim = full(d)
    assert_same(consolidate(run_ckptconv, f"{d}/optim*rank*", tmp_path / "o.pt"), optim)
    files = [str(p) for p in rank_files(d, "model")]
    assert_same(consolidate(run_ckptconv, None, tmp_path / "m.pt", "--files", *files), model)


def test_dtype_cast_keeps_step_counters(tmp_path, run_ckptconv):
    d = RANK_DIRS[1]
    model, optim = full(d)
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt", "--dtype", "bf16", "--optim-dtype", "bf16",
                      "--memory-limit", "64")
    assert_same(got, cast_floats({"model": model, "optim": optim}, torch.bfloat16))


def rekeyed(optim_sd):
    """FQN-keyed optimizer state dict -> the integer ids Optimizer.load_state_dict needs
    (ids follow the order of params in param_groups)."""
    order = [fqn for g in optim_sd["param_groups"] for fqn in g["params"]]
    pid = {fqn: i for i, fqn in enumerate(order)}
    return {"state": {pid[k]: v for k, v in optim_sd["state"].items()},
            "param_groups": [dict(g, params=[pid[f] for f in g["params"]]) for g in optim_sd["param_groups"]]}


def resume_one_step(model_sd, optim_sd):
    model = make_checkpoints.Net()
    model.load_state_dict(model_sd)
    optim = make_checkpoints.param_groups(model, "adamw")
    optim.load_state_dict(rekeyed(optim_sd))
    optim.zero_grad(set_to_none=True)
    model(make_checkpoints.batch(make_checkpoints.STEPS, 0)).backward()
    optim.step()
    return model.state_dict(), optim.state_dict()


@pytest.mark.parametrize("d", RANK_DIRS, ids=ids)
def test_consolidated_state_resumes_training_in_one_process(d, tmp_path, run_ckptconv):
    got = consolidate(run_ckptconv, d, tmp_path / "out.pt")
    model_after, optim_after = resume_one_step(got["model"], got["optim"])
    assert all(s["step"].item() == make_checkpoints.STEPS + 1 for s in optim_after["state"].values())
    assert all(torch.isfinite(v).all() for v in model_after.values())
    # The same step from torch's own full state dicts gives the same bits.
    ref_model, ref_optim = resume_one_step(*full(d))
    assert_same(model_after, ref_model)
    assert_same(optim_after, ref_optim)


def test_inspect_shows_global_shapes_and_rows_per_rank(run_ckptconv):
    d = REPO / "testdata" / "fsdp_st" / "adamw_ws3"
    r = run_ckptconv("inspect", str(d))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("model.emb.weight "))
    assert "(10, 4)" in line and "rows r0[0:4] r1[4:8] r2[8:10]" in line
    assert "world_size: 3" in r.stdout
    info = json.loads(run_ckptconv("inspect", str(d), "--json").stdout)
    fc2 = next(t for t in info["tensors"] if t["path"] == "optim.state.fc2.weight.exp_avg")
    assert fc2["shape"] == [7, 8]
    assert [(c["rank"], c["offsets"], c["sizes"]) for c in fc2["chunks"]] == \
        [(0, [0, 0], [3, 8]), (1, [3, 0], [3, 8]), (2, [6, 0], [1, 8])]


# ---- HSDP, written at test time (torch on CPU can; ~30 s for 4 processes) ----

@pytest.fixture(scope="module")
def hsdp_dir(tmp_path_factory):
    """(Replicate, Shard(0)) DTensor rank files: model.state_dict() and the raw
    optim.state_dict() (integer ids, DTensor values) of FSDP2 on a 2x2 mesh."""
    import subprocess

    out = tmp_path_factory.mktemp("hsdp")
    r = subprocess.run([sys.executable, str(REPO / "tests" / "hsdp_rank_writer.py"), str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_hsdp_reads_the_first_replica_group(hsdp_dir, tmp_path, run_ckptconv):
    model, optim = full(hsdp_dir)
    got = consolidate(run_ckptconv, hsdp_dir, tmp_path / "out.pt")
    assert_same(got, {"model": model, "optim": optim})
    r = run_ckptconv("inspect", str(hsdp_dir))
    assert "replica_chunks_dropped: 14 (model), 24 (optim)" in r.stdout
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("model.emb.weight "))
    assert "(Replicate, Shard(0))" in line and "rows r0[0:5] r1[5:10]" in line


def test_raw_fsdp2_optimizer_state_keeps_integer_ids(hsdp_dir, tmp_path, run_ckptconv):
    _, optim = full(hsdp_dir)
    got = consolidate(run_ckptconv, hsdp_dir, tmp_path / "out.pt", "--only", "optim")
    assert list(got["state"]) == [0, 1, 2, 3, 4, 5]
    assert_same(got, optim)


# ---- veRL FSDP1 flat parameters ---------------------------------------------

def test_verl_flat_optimizer_is_refused_with_an_explanation(tmp_path, run_ckptconv):
    out = tmp_path / "out.pt"
    for args in ([str(VERL)], [str(VERL), "--only", "optim"]):
        r = run_ckptconv("consolidate", *args, "-o", str(out))
        assert r.returncode == 3, r.stderr
        assert "optim_world_size_2_rank_0.pt" in r.stderr
        assert "flat parameter" in r.stderr and "not stored in these files" in r.stderr
        assert "--only model" in r.stderr
        assert not out.exists()


@pytest.mark.parametrize("how", ["only", "glob"])
def test_verl_model_files_consolidate(how, tmp_path, run_ckptconv):
    model, _ = full(VERL)
    src, extra = (VERL, ["--only", "model"]) if how == "only" else (f"{VERL}/model_*", [])
    assert_same(consolidate(run_ckptconv, src, tmp_path / "out.pt", *extra), model)


# ---- broken rank families: a clear error naming the file, exit 3, no output --

def copy_of(name, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(REPO / "testdata" / name, dst)
    return dst


def patch_data_pkl(path, patch):
    """Rewrites data.pkl inside a torch.save zip with patch(bytes) -> bytes."""
    with zipfile.ZipFile(path) as z:
        records = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            z.writestr(name, patch(data) if name.endswith("/data.pkl") else data)
    path.write_bytes(buf.getvalue())


def shift_first_shard_offset(pkl):
    """The first ShardMetadata's shard_offsets [1] (model 'scale' on rank 1) becomes [0]."""
    ops = list(pickletools.genops(pkl))
    at = next(i for i, (op, arg, _) in enumerate(ops) if arg == "shard_offsets")
    op, arg, pos = next(o for o in ops[at:] if o[0].name == "BININT1")
    assert arg == 1
    return pkl[:pos + 1] + bytes([0]) + pkl[pos + 2:]


def break_missing_rank(d):
    (d / "model_rank2.pt").unlink()
    return "model_rank2.pt"


def break_other_world_size(d):
    shutil.copy(REPO / "testdata" / "fsdp_st" / "adamw_ws3" / "optim_rank2.pt", d / "optim_rank2.pt")
    return "optim_rank2.pt"


def break_replaced_by_other_world_size(d):
    shutil.copy(REPO / "testdata" / "fsdp_st" / "adamw_ws3" / "model_rank1.pt", d / "model_rank1.pt")
    return "model_rank1.pt"


def break_verl_other_world_size(d):
    shutil.copy(REPO / "testdata" / "fsdp_dt" / "adamw_ws3" / "model_world_size_3_rank_2.pt", d)
    return "model_world_size_3_rank_2.pt"


def break_truncated(d):
    f = d / "optim_rank1.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "optim_rank1.pt"


def break_copied_over_other_rank(d):
    shutil.copy(d / "model_rank0.pt", d / "model_rank1.pt")
    return "model_rank1.pt"


def break_duplicate_copy(d):
    shutil.copy(d / "optim_rank1.pt", d / "optim_rank1 (copy).pt")
    return "optim_rank1 (copy).pt"


def break_overlap(d):
    patch_data_pkl(d / "model_rank1.pt", shift_first_shard_offset)
    return "model_rank1.pt"


def break_param_groups(d):
    """A rank that saved other hyperparameters: its first 0.01 (group 0's lr) becomes 0.02."""
    needle = b"G" + struct.pack(">d", 0.01)
    patch_data_pkl(d / "optim_rank1.pt", lambda pkl: pkl.replace(needle, b"G" + struct.pack(">d", 0.02), 1))
    return "optim_rank1.pt"


BROKEN = {
    "missing_rank": ("fsdp_st/adamw_ws3", break_missing_rank, "missing rank file"),
    "other_world_size_added": ("fsdp_st/adamw_ws2", break_other_world_size, "different world sizes"),
    "other_world_size_replacing": ("fsdp_st/adamw_ws2", break_replaced_by_other_world_size, "different world sizes"),
    "verl_other_world_size": ("fsdp_dt/adamw_ws2", break_verl_other_world_size, "different world sizes"),
    "truncated": ("fsdp_st/adamw_ws2", break_truncated, ""),
    "rank0_copied_over_rank1": ("fsdp_st/adamw_ws2", break_copied_over_other_rank, "its name says rank 1"),
    "two_files_claim_rank": ("fsdp_st/adamw_ws2", break_duplicate_copy, "two files claim rank 1"),
    "overlapping_shards": ("fsdp_st/adamw_ws2", break_overlap, "overlaps"),
    "param_groups_differ": ("fsdp_st/adamw_ws2", break_param_groups, "param_groups.0.lr' differs between ranks"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_family_is_refused(case, tmp_path, run_ckptconv):
    name, breaker, words = BROKEN[case]
    d = copy_of(name, tmp_path)
    culprit = breaker(d)
    out = tmp_path / "out.pt"
    r = run_ckptconv("consolidate", str(d), "-o", str(out))
    assert r.returncode == 3, r.stderr
    assert culprit in r.stderr
    assert words in r.stderr
    assert not out.exists()
    assert not list(tmp_path.glob("out.pt*"))
