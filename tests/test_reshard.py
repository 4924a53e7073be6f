"""reshard of DCP directories, checked against real torch: the resharded
directory consolidates to the same state, torch's own dcp_to_torch_save and
FileSystemReader read it, and FSDP2 training resumes from it at the new
world size exactly as from the original directory."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from state_compare import assert_same

REPO = Path(__file__).resolve().parent.parent
DCP = REPO / "testdata" / "dcp"
GLOBAL_DIRS = sorted(p.parent for p in DCP.glob("*/.metadata"))
RANK_META_DIRS = sorted(p.parent for p in DCP.glob("*/__0.metadata") if not (p.parent / ".metadata").exists())
WORLD_SIZES = [1, 2, 3, 4, 5, 8]
WS2 = DCP / "fsdp2_adamw_ws2"


def reference(d):
    return torch.load(d.parent / (d.name + ".ref.pt"), weights_only=True)


def reshard(run_ckptconv, src, dst, n, *args):
    r = run_ckptconv("reshard", str(src), "-o", str(dst), "--world-size", str(n), *args)
    assert r.returncode == 0, r.stderr
    return dst


def consolidated(run_ckptconv, src, out):
    r = run_ckptconv("consolidate", str(src), "-o", str(out))
    assert r.returncode == 0, r.stderr
    return torch.load(out, weights_only=True)


def fsdp2_rows(d0, n):
    """Non-empty (offset, rows) per rank, as torch.chunk splits dim 0."""
    return [(int(sum(len(c) for c in torch.arange(d0).chunk(n)[:r])), len(c))
            for r, c in enumerate(torch.arange(d0).chunk(n))]


def test_corpus_has_global_and_rank_metadata_dirs():
    assert len(GLOBAL_DIRS) >= 6 and RANK_META_DIRS


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("d", GLOBAL_DIRS + RANK_META_DIRS, ids=lambda p: p.name)
def test_reshard_then_consolidate_equals_source(d, n, tmp_path, run_ckptconv):
    dst = reshard(run_ckptconv, d, tmp_path / "out", n)
    assert_same(consolidated(run_ckptconv, dst, tmp_path / "a.pt"), consolidated(run_ckptconv, d, tmp_path / "b.pt"))


@pytest.mark.parametrize("n", WORLD_SIZES)
@pytest.mark.parametrize("d", GLOBAL_DIRS, ids=lambda p: p.name)
def test_torch_reads_resharded_dir(d, n, tmp_path, run_ckptconv):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    dst = reshard(run_ckptconv, d, tmp_path / "out", n)
    dcp_to_torch_save(dst, tmp_path / "torch.pt")
    assert_same(torch.load(tmp_path / "torch.pt", weights_only=True), reference(d))

    files = sorted(p.name for p in dst.glob("*.distcp"))
    assert files == sorted(f"__{r}_0.distcp" for r in range(n))
    assert sorted(p.name for p in dst.iterdir()) == sorted(files + [".metadata"])
    md = FileSystemReader(str(dst)).read_metadata()
    assert md.version == "1.0.0"
    assert md.storage_meta.checkpoint_id == str(dst)
    src_md = FileSystemReader(str(d)).read_metadata()
    assert list(md.state_dict_metadata) == list(src_md.state_dict_metadata)
    assert md.planner_data == src_md.planner_data
    for fqn, item in md.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            info = md.storage_data[next(i for i in md.storage_data if i.fqn == fqn)]
            assert info.relative_path == "__0_0.distcp", fqn
            continue
        assert item.size == src_md.state_dict_metadata[fqn].size
        assert item.properties.dtype == src_md.state_dict_metadata[fqn].properties.dtype
        chunks = [(tuple(c.offsets), tuple(c.sizes)) for c in item.chunks]
        if len(item.size) == 0:
            assert chunks == [((), ())], fqn
            continue
        rows = [(c[0][0], c[1][0]) for c in chunks if c[1][0] > 0]
        assert rows == fsdp2_rows(item.size[0], n), fqn
        assert all(c[1][1:] == tuple(item.size[1:]) for c in chunks), fqn
        # rank r's rows live in rank r's file
        for c in item.chunks:
            if c.sizes[0] == 0:
                continue
            idx = next(i for i in md.storage_data if i.fqn == fqn and tuple(i.offset) == tuple(c.offsets))
            rank = c.offsets[0] // -(-item.size[0] // n)
            assert md.storage_data[idx].relative_path == f"__{rank}_0.distcp", fqn


@pytest.mark.parametrize("n", [1, 3, 4])
def test_fsdp2_resumes_from_resharded_dir(n, tmp_path, run_ckptconv):
    dst = reshard(run_ckptconv, WS2, tmp_path / "out", n)
    out = tmp_path / "result"
    out.mkdir()
    r = subprocess.run([sys.executable, str(REPO / "tests" / "reshard_resume.py"), str(dst), str(WS2), str(n), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    ref = reference(WS2)
    loaded = torch.load(out / "loaded.pt", weights_only=True)
    assert_same(loaded["model"], ref["model"], key_order=False)
    assert_same(loaded["optim"]["state"], ref["optim"]["state"], key_order=False)
    assert [g["params"] for g in loaded["optim"]["param_groups"]] == [g["params"] for g in ref["optim"]["param_groups"]]
    assert [g["lr"] for g in loaded["optim"]["param_groups"]] == [g["lr"] for g in ref["optim"]["param_groups"]]
    result = torch.load(out / "result.pt", weights_only=True)
    assert torch.isfinite(result["losses"]).all()
    assert torch.equal(result["losses"], result["ref_losses"])
    assert_same(result["after"], result["ref_after"], key_order=False)


def test_dry_run_lists_sources_per_rank_and_exact_sizes_and_writes_nothing(tmp_path, run_ckptconv):
    import re

    dst = tmp_path / "out"
    r = run_ckptconv("reshard", str(WS2), "-o", str(dst), "--world-size", "3", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "<-" not in r.stdout and "(-v lists every tensor item" in r.stdout  # a summary by default
    r = run_ckptconv("reshard", str(WS2), "-o", str(dst), "--world-size", "3", "--dry-run", "-v")
    assert r.returncode == 0, r.stderr
    assert not dst.exists() and not list(tmp_path.iterdir())
    # fc2.weight 7x8: ws2 rows [0:4) [4:7); ws3 rank 1 rows [3:6) comes from both source ranks.
    assert "model.fc2.weight [3:6, 0:8] <- source rank 0 [3:4, 0:8], source rank 1 [4:6, 0:8]" in r.stdout
    assert "optim.state.emb.weight.step [] (replicated) <- source rank 1 []" in r.stdout
    assert "total: 3 files and .metadata" in r.stdout
    planned = {f"__{m[0]}_0.distcp": int(m[1]) for m in re.findall(r"^rank (\d+): __\d+_0\.distcp, (\d+) bytes", r.stdout, re.M)}
    planned[".metadata"] = int(re.search(r"^\.metadata: (\d+) bytes", r.stdout, re.M)[1])
    reshard(run_ckptconv, WS2, dst, 3)
    assert planned == {p.name: p.stat().st_size for p in dst.iterdir()}


def test_existing_output_is_kept_without_force(tmp_path, run_ckptconv):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep").write_text("precious")
    r = run_ckptconv("reshard", str(WS2), "-o", str(dst), "--world-size", "2")
    assert r.returncode == 2
    assert "--force" in r.stderr
    assert [p.name for p in dst.iterdir()] == ["keep"] and (dst / "keep").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    reshard(run_ckptconv, WS2, dst, 2, "--force")
    assert not (dst / "keep").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old output and the temporary are gone
    assert_same(consolidated(run_ckptconv, dst, tmp_path / "a.pt"), reference(WS2))


@pytest.mark.parametrize("n", ["0", "-1"])
def test_world_size_below_one_is_a_usage_error(n, tmp_path, run_ckptconv):
    r = run_ckptconv("reshard", str(WS2), "-o", str(tmp_path / "out"), "--world-size", n)
    assert r.returncode == 2
    assert "--world-size must be at least 1" in r.stderr
    assert not list(tmp_path.iterdir())


def test_small_memory_limit_gives_the_same_directory_content(tmp_path, run_ckptconv):
    d = DCP / "fsdp2_adamw_ws3"
    a = reshard(run_ckptconv, d, tmp_path / "a", 4)
    b = reshard(run_ckptconv, d, tmp_path / "b", 4, "--memory-limit", "1")
    for r in range(4):
        assert (a / f"__{r}_0.distcp").read_bytes() == (b / f"__{r}_0.distcp").read_bytes()


def test_source_failing_validation_is_refused_and_nothing_written(tmp_path, run_ckptconv):
    import pickle
    import shutil

    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    src = tmp_path / "src"
    shutil.copytree(DCP / "fsdp2_adamw_ws3", src)
    with open(src / ".metadata", "rb") as f:
        md = pickle.load(f)
    key = next(k for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata) and len(v.size) == 2)
    md.state_dict_metadata[key].chunks.pop(0)
    with open(src / ".metadata", "wb") as f:
        pickle.dump(md, f)
    r = run_ckptconv("reshard", str(src), "-o", str(tmp_path / "out"), "--world-size", "2")
    assert r.returncode == 3, r.stderr
    assert key in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_output_under_a_file_fails_with_exit_4_and_leaves_nothing(tmp_path, run_ckptconv):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = run_ckptconv("reshard", str(WS2), "-o", str(blocker / "out"), "--world-size", "2")
    assert r.returncode == 4, r.stderr
    assert "file is a file, not a directory" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_unwritable_parent_fails_and_leaves_nothing(ckptconv):
    # A directory of its own under the system temp dir: pytest's tmp_path sits
    # in a 0700 folder that another user could not even reach.
    parent = Path(tempfile.mkdtemp(prefix="ckptconv-ro-"))
    parent.chmod(0o555)
    cmd = [str(ckptconv), "reshard", str(WS2), "-o", str(parent / "out"), "--world-size", "2"]
    if os.geteuid() == 0:  # root writes anywhere: run as nobody
        assert shutil.which("setpriv"), "running as root without setpriv (util-linux) to drop to nobody"
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 4, r.stderr
        assert "this user may not write in" in r.stderr and str(parent) in r.stderr
        assert not list(parent.iterdir())
    finally:
        parent.chmod(0o755)
        shutil.rmtree(parent)


def test_reshard_reads_the_checkpoint_tag_names_in_a_folder(tmp_path, run_ckptconv):
    """The README's own form (#36 row 1): `reshard ckpt --tag step-200 -o ... --world-size 2`
    on a folder of two DCP checkpoints was exit 2 ("choose one with --tag"):
    the job detected the source without the tag."""
    root = tmp_path / "ckpt"
    root.mkdir()
    for step in (100, 200):
        shutil.copytree(DCP / "fsdp2_adamw_ws2", root / f"step-{step}")
    out = tmp_path / "ckpt-ws2"
    r = run_ckptconv("reshard", root, "--tag", "step-200", "-o", out, "--world-size", "2")
    assert r.returncode == 0, r.stderr
    assert "reading " in r.stderr and "step-200" in r.stderr
    assert run_ckptconv("diff", out, root / "step-200").returncode == 0
