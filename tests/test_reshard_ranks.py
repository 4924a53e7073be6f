"""reshard of per-rank FSDP files and full state dicts, checked against real
torch: the output consolidates to the same state as the source; every
output file loads with torch.load inside a process group of the new world
size and holds exactly what FSDP1 keeps on that rank under
SHARDED_STATE_DICT (torch.chunk piece of dim 0, placements, process group or
mesh of size N); FSDP1 training resumes from the files at the new world
size exactly as from torch's FULL_STATE_DICT references
(tests/reshard_resume_fsdp1.py); a full .pt scattered to DCP resumes FSDP2
(tests/reshard_resume.py)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from state_compare import assert_same
from test_reshard import consolidated, reshard

REPO = Path(__file__).resolve().parent.parent
TD = REPO / "testdata"
ST = {ws: TD / "fsdp_st" / f"adamw_ws{ws}" for ws in (2, 3)}
DT = {ws: TD / "fsdp_dt" / f"adamw_ws{ws}" for ws in (2, 3)}
SOURCES = [pytest.param(k, ws, d, id=f"{k}_ws{ws}") for k, dirs in (("st", ST), ("dt", DT)) for ws, d in dirs.items()]
WORLD_SIZES = [1, 2, 3, 4, 5, 8]


def names(kind, n):
    if kind == "st":
        return [f"{f}_rank{r}.pt" for f in ("model", "optim") for r in range(n)]
    return [f"{f}_world_size_{n}_rank_{r}.pt" for f in ("model", "optim") for r in range(n)]


class FakeGroup:
    """A process group of size n in which this process is rank r, without the
    other n-1 processes (torch's fake backend): what ShardedTensor and
    DeviceMesh unpickling need to see. The multi-process gloo resume tests
    below load the same files the way a training job does."""

    def __init__(self, rank, n):
        from torch.testing._internal.distributed.fake_pg import FakeStore
        self.args = dict(backend="fake", rank=rank, world_size=n, store=FakeStore())

    def __enter__(self):
        dist.init_process_group(**self.args)

    def __exit__(self, *exc):
        dist.destroy_process_group()


def leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, path + (k,))
    else:
        yield path, obj


def at(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def check_rank_file(loaded, ref, rank, n, kind):
    """Every sharded value holds torch.chunk(ref, n)[rank] (or nothing past
    the last piece), described for world size n; everything else equals the
    reference."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor, Shard

    checked = 0
    for path, value in leaves(loaded):
        expected = at(ref, path)
        if isinstance(value, ShardedTensor):
            assert kind == "st", path
            pieces = expected.chunk(n)
            md = value.metadata()
            assert tuple(md.size) == tuple(expected.shape), path
            assert [str(s.placement) for s in md.shards_metadata] == [f"rank:{r}/cpu" for r in range(len(pieces))], path
            rows = -(-expected.shape[0] // n)
            assert [s.shard_offsets[0] for s in md.shards_metadata] == [rows * r for r in range(len(pieces))], path
            local = value.local_shards()
            if rank < len(pieces):
                assert len(local) == 1 and local[0].metadata.shard_offsets[0] == rows * rank, path
                assert torch.equal(local[0].tensor, pieces[rank]), path
            else:
                assert local == [], path
            checked += 1
        elif isinstance(value, DTensor):
            assert kind == "dt", path
            assert value.device_mesh.size() == n and tuple(value.device_mesh.get_coordinate()) == (rank,), path
            assert value.placements == (Shard(0),) and value.shape == expected.shape, path
            pieces = expected.chunk(n)
            want = pieces[rank] if rank < len(pieces) else expected[expected.shape[0]:]
            assert torch.equal(value.to_local(), want), path
            checked += 1
        else:
            assert_same(value, expected, ".".join(map(str, path)))
    return checked


def assert_same_layout(ours, theirs, path="<root>"):
    """Two rank files hold the same thing the same way: sharded values with
    equal global metadata (shard boxes, placements, process group or mesh
    size and coordinate) and bitwise-equal local pieces, plain values equal."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    assert type(ours) is type(theirs) or (isinstance(ours, dict) and isinstance(theirs, dict)), \
        f"{path}: {type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(theirs, dict):
        assert sorted(map(str, ours)) == sorted(map(str, theirs)), f"{path}: keys {list(ours)} != {list(theirs)}"
        for k in theirs:
            assert_same_layout(ours[k], theirs[k], f"{path}.{k}")
    elif isinstance(theirs, ShardedTensor):
        def shards(st):
            return [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in st.metadata().shards_metadata]
        assert shards(ours) == shards(theirs) and ours.metadata().size == theirs.metadata().size, path
        assert ours.metadata().tensor_properties == theirs.metadata().tensor_properties, path
        mine, other = ours.local_shards(), theirs.local_shards()
        assert [s.metadata.shard_offsets for s in mine] == [s.metadata.shard_offsets for s in other], path
        for a, b in zip(mine, other):
            assert_same(a.tensor, b.tensor, path)
    elif isinstance(theirs, DTensor):
        assert ours.placements == theirs.placements and ours.shape == theirs.shape, path
        assert ours.device_mesh.shape == theirs.device_mesh.shape, path
        assert ours.device_mesh.get_coordinate() == theirs.device_mesh.get_coordinate(), path
        assert ours.device_mesh.mesh.tolist() == theirs.device_mesh.mesh.tolist(), path
        assert ours.device_mesh.mesh_dim_names == theirs.device_mesh.mesh_dim_names, path
        assert ours.device_mesh.device_type == theirs.device_mesh.device_type, path
        assert ours.device_mesh == theirs.device_mesh, path
        assert_same(ours.to_local(), theirs.to_local(), path)
    else:
        assert_same(ours, theirs, path)


def references(src):
    return {"model": torch.load(src / "model_full.pt", weights_only=True),
            "optim": torch.load(src / "optim_full.pt", weights_only=True)}


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("kind,ws,src", SOURCES)
def test_rank_files_round_trip_and_load_at_new_world_size(kind, ws, src, n, tmp_path, run_ckptconv):
    dst = reshard(run_ckptconv, src, tmp_path / "out", n)
    assert sorted(p.name for p in dst.iterdir()) == sorted(names(kind, n))
    assert_same(consolidated(run_ckptconv, dst, tmp_path / "a.pt"), consolidated(run_ckptconv, src, tmp_path / "b.pt"))
    ref = references(src)
    sharded = 0
    for rank in range(n):
        files = names(kind, n)
        with FakeGroup(rank, n):
            for family in ("model", "optim"):
                f = files[rank] if family == "model" else files[n + rank]
                sharded += check_rank_file(torch.load(dst / f, weights_only=False), ref[family], rank, n, kind)
    # Per rank: 7 parameters, exp_avg and exp_avg_sq of the 6 trained ones. At
    # world size 1 FSDP1 runs NO_SHARD and saves plain full tensors instead.
    assert sharded == (n * 19 if n > 1 else 0)


@pytest.mark.parametrize("src,layout", [(ST[2], "fsdp-dtensor"), (DT[3], "fsdp-sharded-tensor"), (ST[2], "dcp"),
                                        (TD / "dcp" / "fsdp2_adamw_ws2", "fsdp-dtensor")],
                         ids=["st-to-dt", "dt-to-st", "st-to-dcp", "dcp-to-dt"])
def test_layout_can_be_changed(src, layout, tmp_path, run_ckptconv):
    dst = reshard(run_ckptconv, src, tmp_path / "out", 3, "--layout", layout)
    if layout == "dcp":
        assert (dst / ".metadata").exists()
    else:
        kind = "st" if layout == "fsdp-sharded-tensor" else "dt"
        own = src in ST.values() or src in DT.values()
        expected = names("st" if src in ST.values() else "dt", 3) if own else names(kind, 3)  # per-rank sources keep their names
        assert sorted(p.name for p in dst.iterdir()) == sorted(expected)
        for rank in range(3):
            with FakeGroup(rank, 3):
                for f in sorted(expected)[rank::3]:
                    torch.load(dst / f, weights_only=False)
    assert_same(consolidated(run_ckptconv, dst, tmp_path / "a.pt"), consolidated(run_ckptconv, src, tmp_path / "b.pt"))


def full_pt_sources(tmp_path, run_ckptconv):
    """Full state dicts as users have them: our consolidate output
    {"model", "optim"}, and torch's FULL_STATE_DICT model and optimizer files."""
    both = tmp_path / "both.pt"
    consolidated(run_ckptconv, ST[3], both)
    return {"both": both, "model": ST[3] / "model_full.pt", "optim": ST[3] / "optim_full.pt"}


@pytest.mark.parametrize("layout", ["fsdp-sharded-tensor", "fsdp-dtensor", "dcp"])
def test_full_state_dict_scatters_to_every_layout(layout, tmp_path, run_ckptconv):
    srcs = full_pt_sources(tmp_path, run_ckptconv)
    ref = references(ST[3])
    for n in (1, 2, 4, 5):
        for which, src in srcs.items():
            dst = reshard(run_ckptconv, src, tmp_path / f"{which}_{n}", n, "--layout", layout)
            back = consolidated(run_ckptconv, dst, tmp_path / f"{which}_{n}.pt")
            want = torch.load(src, weights_only=True)
            assert_same(back, want)
            if layout == "dcp":
                continue
            kind = "st" if layout == "fsdp-sharded-tensor" else "dt"
            files = sorted(p.name for p in dst.iterdir())
            fams = ("model", "optim") if which == "both" else (which,)
            assert files == sorted(x for x in names(kind, n) if x.startswith(fams)), files
            for rank in range(n):
                with FakeGroup(rank, n):
                    for fam in fams:
                        f = [x for x in names(kind, n) if x.startswith(fam)][rank]
                        check_rank_file(torch.load(dst / f, weights_only=False), ref[fam], rank, n, kind)


def test_full_state_dict_to_dcp_matches_what_dcp_save_flattens(tmp_path, run_ckptconv):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    src = full_pt_sources(tmp_path, run_ckptconv)["both"]
    dst = reshard(run_ckptconv, src, tmp_path / "out", 2, "--layout", "dcp")
    md = FileSystemReader(str(dst)).read_metadata()
    flat, mappings = flatten_state_dict(torch.load(src, weights_only=True))
    assert list(md.state_dict_metadata) == list(flat)
    assert md.planner_data == mappings


def test_full_state_dict_needs_layout(tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(ST[2] / "model_full.pt"), "-o", str(tmp_path / "out"), "--world-size", "2")
    assert r.returncode == 2, r.stderr
    assert "choose one with --layout dcp|hf|fsdp-sharded-tensor|fsdp-dtensor" in r.stderr
    assert "model_full.pt" in r.stderr
    assert not list(tmp_path.iterdir())


def test_dry_run_lists_rank_files_with_exact_sizes_and_writes_nothing(tmp_path, run_ckptconv):
    dst = tmp_path / "out"
    r = run_ckptconv("reshard", str(DT[2]), "-o", str(dst), "--world-size", "3", "--dry-run", "-v")
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.iterdir())
    # fc2.weight 7x8: ws2 rows [0:4) [4:7); ws3 rank 1 rows [3:6) comes from both source ranks.
    assert "model.fc2.weight [3:6, 0:8] <- source rank 0 [3:4, 0:8], source rank 1 [4:6, 0:8]" in r.stdout
    # A plain tensor (step) is every rank's copy of source rank 0's.
    assert "optim.state.emb.weight.step [] (replicated) <- source optim_world_size_2_rank_0.pt []" in r.stdout
    assert r.stdout.count("optim.state.emb.weight.step [] (replicated)") == 3
    planned = {}
    for line in re.findall(r"^rank \d+: (.*?), \d+ tensor items", r.stdout, re.M):
        for part in line.split("; "):
            name, size = re.match(r"(\S+), (\d+) bytes", part).groups()
            planned[name] = int(size)
    assert f"total: 6 files, {sum(planned.values())} bytes" in r.stdout
    reshard(run_ckptconv, DT[2], dst, 3)
    assert planned == {p.name: p.stat().st_size for p in dst.iterdir()}


def test_small_memory_limit_and_reruns_give_the_same_bytes(tmp_path, run_ckptconv):
    a = reshard(run_ckptconv, ST[3], tmp_path / "a", 4)
    b = reshard(run_ckptconv, ST[3], tmp_path / "b", 4, "--memory-limit", "1")
    for name in names("st", 4):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_one_process_holds_one_output_file_open_at_a_time(tmp_path, ckptconv, run_ckptconv):
    """128 rank files written under a limit of 64 open descriptors: a layout
    that fills its files in order keeps one open (a universal checkpoint has
    thousands), and the bytes are those of a run without the limit."""
    import resource

    def few_descriptors():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    limited = tmp_path / "limited"
    r = subprocess.run([str(ckptconv), "reshard", str(ST[2]), "-o", str(limited), "--world-size", "64"],
                       capture_output=True, text=True, preexec_fn=few_descriptors, timeout=600)
    assert r.returncode == 0, r.stderr
    free = reshard(run_ckptconv, ST[2], tmp_path / "free", 64)
    assert sorted(p.name for p in limited.iterdir()) == sorted(names("st", 64))
    for name in names("st", 64):
        assert (limited / name).read_bytes() == (free / name).read_bytes(), name


def test_existing_output_is_kept_without_force(tmp_path, run_ckptconv):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep").write_text("precious")
    r = run_ckptconv("reshard", str(ST[2]), "-o", str(dst), "--world-size", "2")
    assert r.returncode == 2 and "--force" in r.stderr
    assert [p.name for p in dst.iterdir()] == ["keep"]
    reshard(run_ckptconv, ST[2], dst, 2, "--force")
    assert sorted(p.name for p in dst.iterdir()) == sorted(names("st", 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_world_size_zero_is_a_usage_error(tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(DT[2]), "-o", str(tmp_path / "out"), "--world-size", "0")
    assert r.returncode == 2 and "--world-size must be at least 1" in r.stderr
    assert not list(tmp_path.iterdir())


def test_source_failing_validation_is_refused_and_nothing_written(tmp_path, run_ckptconv):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ST[3], src)
    (src / "optim_rank2.pt").unlink()
    r = run_ckptconv("reshard", str(src), "-o", str(tmp_path / "out"), "--world-size", "2")
    assert r.returncode == 3, r.stderr
    assert "optim_rank2.pt (rank 2)" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_unwritable_output_fails_with_exit_4_and_leaves_nothing(tmp_path, run_ckptconv):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = run_ckptconv("reshard", str(ST[2]), "-o", str(blocker / "out"), "--world-size", "2")
    assert r.returncode == 4, r.stderr
    assert "is a file, not a directory" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_device_option(tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(ST[2]), "-o", str(tmp_path / "out"), "--world-size", "2", "--device", "tpu")
    assert r.returncode == 2 and "tpu" in r.stderr
    a = reshard(run_ckptconv, ST[2], tmp_path / "a", 3, "--device", "cpu")
    b = reshard(run_ckptconv, ST[2], tmp_path / "b", 3)
    for name in names("st", 3):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_dtype_casts_sharded_values_and_keeps_step(tmp_path, run_ckptconv):
    dst = reshard(run_ckptconv, DT[2], tmp_path / "out", 2, "--dtype", "bf16")
    back = consolidated(run_ckptconv, dst, tmp_path / "a.pt")
    r = run_ckptconv("consolidate", str(DT[2]), "-o", str(tmp_path / "b.pt"), "--dtype", "bf16")
    assert r.returncode == 0, r.stderr
    assert_same(back, torch.load(tmp_path / "b.pt", weights_only=True))
    assert back["model"]["fc1.weight"].dtype == torch.bfloat16
    assert back["optim"]["state"]["fc1.weight"]["step"].dtype == torch.float32


# ---- resume: real FSDP1 (gloo, CPU) loads the files at the new world size ----

def run_resume(n, cases, tmp_path):
    """Runs the FSDP1 resume of every case at world size n; checks that each
    of ckptconv's files equals what FSDP1 itself saved at n."""
    out = tmp_path / "result"
    out.mkdir()
    args = [str(x) for case in cases for x in case]
    r = subprocess.run([sys.executable, str(REPO / "tests" / "reshard_resume_fsdp1.py"), str(n), str(out), *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    for i, (kind, dst, src, model_tmpl, optim_tmpl) in enumerate(cases):
        for rank in range(n):
            with FakeGroup(rank, n):
                for family, tmpl in (("model", model_tmpl), ("optim", optim_tmpl)):
                    ours = torch.load(Path(dst) / tmpl.format(r=rank), weights_only=False)
                    theirs = torch.load(out / f"case{i}_torch_{family}_rank{rank}.pt", weights_only=False)
                    assert_same_layout(ours, theirs, f"{tmpl.format(r=rank)}")
    return [torch.load(out / f"case{i}.pt", weights_only=True) for i in range(len(cases))]


# Every N in 1..4 resumes from files saved at another world size. N=3 takes
# both kinds from ws2: `scale` (2 rows) leaves rank 2 without a shard
# (ShardedTensor) or with an empty local tensor (DTensor). N=2 also resumes
# from a full .pt scattered to DTensor files, and a job whose mesh dimension
# is named "fsdp" (veRL) from files written with --mesh-dim-names fsdp (a
# DTensor on a mesh unequal to the job's cannot be redistributed onto it).
# One process group per N.
RESUME = {1: [("dt", 2)], 2: [("st", 3), ("pt", 3), ("dt-named", 3)], 3: [("st", 2), ("dt", 2)], 4: [("dt", 3)]}


@pytest.mark.parametrize("n", sorted(RESUME))
def test_fsdp1_resumes_from_resharded_rank_files(n, tmp_path, run_ckptconv):
    cases = []
    for kind, ws in RESUME[n]:
        if kind == "pt":  # our consolidate output of DT[ws], scattered without a process group
            src = DT[ws]
            full = tmp_path / "full.pt"
            consolidated(run_ckptconv, src, full)
            dst = reshard(run_ckptconv, full, tmp_path / "pt", n, "--layout", "fsdp-dtensor")
            kind = "dt"
        elif kind == "dt-named":  # a job whose mesh dimension is named "fsdp" (veRL)
            src = DT[ws]
            dst = reshard(run_ckptconv, src, tmp_path / "named", n, "--mesh-dim-names", "fsdp")
        else:
            src = (ST if kind == "st" else DT)[ws]
            dst = reshard(run_ckptconv, src, tmp_path / f"{kind}{ws}", n)
        files = [f.replace("rank0", "rank{r}").replace("rank_0", "rank_{r}") for f in names(kind[:2], n)]
        cases.append((kind, dst, src, files[0], files[n]))
    for (kind, dst, src, *_), result in zip(cases, run_resume(n, cases, tmp_path)):
        ref = references(src)
        assert_same(result["loaded"]["model"], ref["model"], key_order=False)
        assert_same(result["loaded"]["optim"]["state"], ref["optim"]["state"], key_order=False)
        assert [g["params"] for g in result["loaded"]["optim"]["param_groups"]] == \
            [g["params"] for g in ref["optim"]["param_groups"]]
        assert torch.isfinite(result["losses"]).all()
        assert torch.equal(result["losses"], result["ref_losses"]), (kind, dst)
        assert_same(result["after"], result["ref_after"], key_order=False)
        assert not torch.equal(result["after"]["model"]["fc1.weight"], ref["model"]["fc1.weight"])  # it trained


def test_fsdp2_resumes_from_full_state_dict_scattered_to_dcp(tmp_path, run_ckptconv):
    ws2 = TD / "dcp" / "fsdp2_adamw_ws2"
    full = tmp_path / "full.pt"
    consolidated(run_ckptconv, ws2, full)
    dst = reshard(run_ckptconv, full, tmp_path / "out", 2, "--layout", "dcp")
    out = tmp_path / "result"
    out.mkdir()
    r = subprocess.run([sys.executable, str(REPO / "tests" / "reshard_resume.py"), str(dst), str(ws2), "2", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    ref = torch.load(ws2.parent / (ws2.name + ".ref.pt"), weights_only=True)
    loaded = torch.load(out / "loaded.pt", weights_only=True)
    assert_same(loaded["model"], ref["model"], key_order=False)
    assert_same(loaded["optim"]["state"], ref["optim"]["state"], key_order=False)
    result = torch.load(out / "result.pt", weights_only=True)
    assert torch.equal(result["losses"], result["ref_losses"])
    assert_same(result["after"], result["ref_after"], key_order=False)


def test_flat_parameter_optimizer_is_refused_and_only_model_reshards_the_model(tmp_path, run_ckptconv):
    src = TD / "fsdp_dt" / "verl_flat_ws2"  # FSDP1 use_orig_params=False: raw optim.state_dict() of flat parameters
    r = run_ckptconv("reshard", str(src), "-o", str(tmp_path / "out"), "--world-size", "3")
    assert r.returncode == 3, r.stderr
    assert "optim_world_size_2_rank_0.pt" in r.stderr and "--only model" in r.stderr
    assert not list(tmp_path.iterdir())
    dst = reshard(run_ckptconv, src, tmp_path / "out", 3, "--only", "model")
    assert sorted(p.name for p in dst.iterdir()) == [f"model_world_size_3_rank_{r}.pt" for r in range(3)]
    ref = torch.load(src / "model_full.pt", weights_only=True)
    assert_same(consolidated(run_ckptconv, dst, tmp_path / "a.pt"), ref, key_order=False)
    for rank in range(3):
        with FakeGroup(rank, 3):
            loaded = torch.load(dst / f"model_world_size_3_rank_{rank}.pt", weights_only=False)
            # `frozen` was left out of FSDP (ignored_states): a plain tensor, whole on every rank
            assert check_rank_file(loaded, ref, rank, 3, "dt") == len(ref) - 1


@pytest.mark.parametrize("layout", ["dcp", "fsdp-dtensor"])
def test_full_file_that_is_no_state_dict_is_refused(layout, tmp_path, run_ckptconv):
    src = tmp_path / "tensor.pt"
    torch.save(torch.arange(6.0), src)
    r = run_ckptconv("reshard", str(src), "-o", str(tmp_path / "out"), "--world-size", "2", "--layout", layout)
    assert r.returncode == 3, r.stderr
    assert "tensor.pt" in r.stderr and "holds a state dict (a dict); this file holds a tensor" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tensor.pt"]


@pytest.mark.parametrize("layout", ["fsdp-sharded-tensor", "fsdp-dtensor"])
def test_every_dtype_scatters_and_consolidates_back(layout, tmp_path, run_ckptconv):
    src = TD / "pt" / "dtypes.pt"  # every dtype torch.save writes, views, shared storages, nested containers
    for n in (2, 3):
        dst = reshard(run_ckptconv, src, tmp_path / f"out{n}", n, "--layout", layout)
        assert_same(consolidated(run_ckptconv, dst, tmp_path / f"back{n}.pt"), torch.load(src, weights_only=True))


def test_tensors_inside_a_tuple_cannot_go_to_dcp(tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(TD / "pt" / "dtypes.pt"), "-o", str(tmp_path / "out"), "--world-size", "2",
                     "--layout", "dcp")
    assert r.returncode == 3, r.stderr
    assert "dtypes.pt: 'nested.tuple' holds tensors inside a tuple" in r.stderr
    assert not list(tmp_path.iterdir())


def test_only_cuts_a_dcp_source_down_to_one_entry(tmp_path, run_ckptconv):
    src = TD / "dcp" / "fsdp2_adamw_ws2"
    dst = reshard(run_ckptconv, src, tmp_path / "out", 3, "--only", "optim")
    r = run_ckptconv("consolidate", str(src), "-o", str(tmp_path / "b.pt"), "--only", "optim")
    assert r.returncode == 0, r.stderr
    # The resharded directory keeps the entry under its key, as the job that
    # resumes from it saved it; consolidate --only writes the optimizer's own dict.
    resharded = consolidated(run_ckptconv, dst, tmp_path / "a.pt")
    assert list(resharded) == ["optim"]
    assert_same(resharded["optim"], torch.load(tmp_path / "b.pt", weights_only=True))


@pytest.mark.parametrize("layout", ["fsdp-sharded-tensor", "fsdp-dtensor"])
@pytest.mark.parametrize("only", ["model", "optim"])
def test_only_to_rank_files_writes_the_state_dict_itself(layout, only, tmp_path, run_ckptconv):
    # A rank file holds what model.load_state_dict / FSDP.optim_state_dict_to_load
    # take: the entry's own dict, never {"model": ...} (a DCP source's --only
    # entry used to stay under its key here, as it does for DCP outputs).
    src = TD / "dcp" / "fsdp2_adamw_ws2"
    dst = reshard(run_ckptconv, src, tmp_path / "out", 3, "--only", only, "--layout", layout)
    back = consolidated(run_ckptconv, dst, tmp_path / "back.pt")
    r = run_ckptconv("consolidate", str(src), "-o", str(tmp_path / "want.pt"), "--only", only)
    assert r.returncode == 0, r.stderr
    assert_same(back, torch.load(tmp_path / "want.pt", weights_only=True))


def test_glob_and_files_choose_the_families_to_reshard(tmp_path, run_ckptconv):
    both = reshard(run_ckptconv, f"{ST[2]}/*rank*.pt", tmp_path / "both", 3)  # model_full.pt etc. name no rank: skipped
    assert sorted(p.name for p in both.iterdir()) == sorted(names("st", 3))
    model = reshard(run_ckptconv, f"{DT[3]}/model_world*", tmp_path / "model", 2)
    assert sorted(p.name for p in model.iterdir()) == [f"model_world_size_2_rank_{r}.pt" for r in range(2)]
    files = [str(DT[3] / f"optim_world_size_3_rank_{r}.pt") for r in range(3)]
    r = run_ckptconv("reshard", "--files", *files, "-o", str(tmp_path / "optim"), "--world-size", "4")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "optim").iterdir()) == [f"optim_world_size_4_rank_{r}.pt" for r in range(4)]
    back = consolidated(run_ckptconv, tmp_path / "optim", tmp_path / "optim.pt")
    assert_same(back, torch.load(DT[3] / "optim_full.pt", weights_only=True))
    r = run_ckptconv("reshard", "-o", str(tmp_path / "none"), "--world-size", "2")
    assert r.returncode == 2 and "give SRC or --files" in r.stderr


def test_dtensor_mesh_follows_the_source_unless_told(tmp_path, run_ckptconv):
    named = reshard(run_ckptconv, DT[2], tmp_path / "named", 2, "--mesh-dim-names", "fsdp", "--mesh-device", "cuda")
    again = reshard(run_ckptconv, named, tmp_path / "again", 3)  # the source's mesh: cuda, ("fsdp",)
    plain = reshard(run_ckptconv, named, tmp_path / "plain", 3, "--mesh-device", "cpu")
    for d, n, want in ((named, 2, ("cuda", ("fsdp",))), (again, 3, ("cuda", ("fsdp",))), (plain, 3, ("cpu", ("fsdp",)))):
        for rank in range(n):
            with FakeGroup(rank, n):
                sd = torch.load(d / f"model_world_size_{n}_rank_{rank}.pt", weights_only=False)
                mesh = sd["fc1.weight"].device_mesh
                assert (mesh.device_type, mesh.mesh_dim_names) == want, d
    r = run_ckptconv("reshard", str(DT[2]), "-o", str(tmp_path / "bad"), "--world-size", "2", "--mesh-dim-names", "a", "b")
    assert r.returncode == 2 and "one dimension" in r.stderr
