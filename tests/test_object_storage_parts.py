"""--part I/N with an s3:// OUT (docs/object-storage.md, "--part over a
bucket") against moto's S3 server on loopback: N workers, run at once or
one after another in any order, send their parts to one shared multipart
upload per file, and the object the finalizer completes is byte for byte
the one-process local file. No object is visible before the last part is
in: a worker killed mid-upload leaves none, finalizing then refuses (exit
3) naming the part to rerun, and after the rerun finalizes, or after
`--part abort`, no multipart upload is left open and the shared state
prefix is gone. The fixtures (moto, run_s3, the proxy) are
test_object_storage.py's and test_object_storage_outputs.py's."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_object_storage import BUCKET, moto, run_s3, s3_env  # noqa: F401
from test_object_storage_outputs import (RuleProxy, dcp_tensors, fetch, keys_under, open_uploads, s3,  # noqa: F401
                                         serving)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """About 38 MiB of float32 in seven tensors of unequal sizes, written by
    the safetensors library: five parts of 8 MiB (the last short), so two
    and four workers each own parts, and most tensors span a boundary
    between two workers' parts (their rows shared, their CRC-32s joined by
    the finalizer)."""
    torch.manual_seed(1)
    shapes = {"embed.weight": (2000, 1500), "l0.w": (1000, 1000), "l0.b": (1000,), "l1.w": (3000, 1024),
              "l1.scale": (7,), "l2.w": (1500, 1200), "head.weight": (999, 1001)}
    path = tmp_path_factory.mktemp("wide") / "wide.safetensors"
    save_file({k: torch.randn(*s) for k, s in shapes.items()}, str(path))
    return path


def workers(ckptconv: Path, src: Path, out: str, n: int, endpoint: str, order=None, extra=()) -> list:
    """Runs --part i/n for every i: at once (order None), or one after the
    other in `order`. The completed processes, by part."""
    def cmd(i):
        return [str(ckptconv), "consolidate", str(src), "-o", out, "--part", f"{i}/{n}", *extra]
    if order is None:
        procs = [subprocess.Popen(cmd(i), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=s3_env(endpoint)) for i in range(n)]
        done = []
        for p in procs:
            out_, err = p.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out_, err))
        return done
    by_part = {}
    for i in order:
        by_part[i] = subprocess.run(cmd(i), capture_output=True, text=True, env=s3_env(endpoint), timeout=300)
    return [by_part[i] for i in range(n)]


def local_bytes(run_s3, src: Path, tmp_path: Path, ext: str) -> bytes:
    local = run_s3("consolidate", src, "-o", tmp_path / f"local{ext}", "-q")
    assert local.returncode == 0, local.stderr
    return (tmp_path / f"local{ext}").read_bytes()


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("ext", [".pt", ".safetensors"])
def test_parted_workers_upload_the_one_process_bytes(ckptconv, run_s3, s3, moto, wide, tmp_path, ext, n):
    key = f"parted/{ext[1:]}-{n}/out{ext}"
    done = workers(ckptconv, wide, f"s3://{BUCKET}/{key}", n, moto)
    for i, r in enumerate(done):
        assert r.returncode == 0, f"part {i}: {r.stderr}"
    assert sum(f"finalized {n} parts" in r.stderr + r.stdout for r in done) == 1
    want = local_bytes(run_s3, wide, tmp_path, ext)
    got = fetch(s3, key)
    assert len(want) > 32 << 20 and got == want
    # One multipart object of parts of 8 MiB (the last short), the shared state removed.
    assert s3.head_object(Bucket=BUCKET, Key=key)["ETag"].endswith(f'-{-(-len(want) // (8 << 20))}"')
    assert keys_under(s3, f"parted/{ext[1:]}-{n}/") == [key]
    assert open_uploads(s3) == []
    if ext == ".pt":
        (tmp_path / "got.pt").write_bytes(got)
        with zipfile.ZipFile(tmp_path / "got.pt") as z:  # reading a member checks its CRC-32
            for name in z.namelist():
                z.read(name)
        loaded = torch.load(tmp_path / "got.pt", weights_only=True)
        for name, t in load_file(str(wide)).items():
            assert torch.equal(loaded[name], t), name


def test_workers_run_one_after_another_in_reverse_give_the_same_bytes(ckptconv, run_s3, s3, moto, wide, tmp_path):
    key = "reversed/out.pt"
    done = workers(ckptconv, wide, f"s3://{BUCKET}/{key}", 3, moto, order=[2, 1, 0])
    assert [r.returncode for r in done] == [0, 0, 0], [r.stderr for r in done]
    assert "finalized 3 parts" in done[0].stderr + done[0].stdout  # the last to run completes the set
    assert fetch(s3, key) == local_bytes(run_s3, wide, tmp_path, ".pt")
    assert keys_under(s3, "reversed/") == [key]
    assert open_uploads(s3) == []


def holds_a_part(method: str, path: str) -> str | None:
    """Holds worker 1's first part on the wire: an UploadPart or a stash."""
    return "hold" if method == "PUT" and ("partNumber=" in path or "/stash-" in path) else None


@pytest.mark.parametrize("then", ["finalize", "abort"])
def test_a_worker_killed_mid_upload_leaves_no_object(ckptconv, run_s3, s3, moto, wide, tmp_path, then):
    key = f"killed-{then}/out.pt"
    out = f"s3://{BUCKET}/{key}"
    proxy = serving(RuleProxy(moto, holds_a_part))
    try:
        p = subprocess.Popen([str(ckptconv), "consolidate", str(wide), "-o", out, "--part", "1/2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=s3_env(proxy.endpoint))
        assert proxy.held.wait(60), "worker 1 never sent a part"
        p.kill()
        p.communicate(timeout=60)
    finally:
        proxy.release.set()
        proxy.shutdown()
    assert p.returncode < 0
    first = run_s3("consolidate", wide, "-o", out, "--part", "0/2")
    assert first.returncode == 0, first.stderr
    assert "1 of 2 parts done" in first.stderr + first.stdout
    assert key not in keys_under(s3, f"killed-{then}/")  # nothing visible
    assert [u for u in open_uploads(s3) if u == key] == [key]
    refused = run_s3("consolidate", wide, "-o", out, "--part", "finalize")
    assert refused.returncode == 3, refused.stderr
    assert f"{out}: parts 1/2 have no receipt" in refused.stderr
    assert key not in keys_under(s3, f"killed-{then}/")
    # `ckptconv finalize OUT` finds the state prefix beside an s3:// OUT and reruns the stored request.
    refused = run_s3("finalize", out)
    assert refused.returncode == 3, refused.stderr
    assert f"{out}: parts 1/2 have no receipt" in refused.stderr
    if then == "finalize":
        rerun = run_s3("consolidate", wide, "-o", out, "--part", "1/2", "-q")
        assert rerun.returncode == 0, rerun.stderr
        assert fetch(s3, key) == local_bytes(run_s3, wide, tmp_path, ".pt")
        assert keys_under(s3, f"killed-{then}/") == [key]
    else:
        aborted = run_s3("consolidate", wide, "-o", out, "--part", "abort")
        assert aborted.returncode == 0, aborted.stderr
        assert "aborted 1 upload" in aborted.stderr + aborted.stdout
        assert keys_under(s3, f"killed-{then}/") == []
    assert open_uploads(s3) == []


def test_an_existing_object_is_refused_by_every_worker_before_any_upload(ckptconv, run_s3, s3, moto, wide):
    key = "exists-parted/out.safetensors"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"an older output")
    r = run_s3("consolidate", wide, "-o", f"s3://{BUCKET}/{key}", "--part", "0/2")
    assert r.returncode == 2, r.stderr
    assert f"s3://{BUCKET}/{key}: output exists" in r.stderr
    assert keys_under(s3, "exists-parted/") == [key]
    assert open_uploads(s3) == []


def same_dcp_folder(s3, prefix: str, local: Path, tmp: Path) -> None:
    """The objects under `prefix` are the local folder's files (.metadata
    records the output path and a random save id: it is loaded instead),
    and torch's DCP reader loads them as the local folder's tensors."""
    want = sorted(p.name for p in local.iterdir())
    assert ".metadata" in want and keys_under(s3, prefix + "/") == [f"{prefix}/{n}" for n in want]
    got = tmp / "got"
    got.mkdir()
    for n in want:
        (got / n).write_bytes(fetch(s3, f"{prefix}/{n}"))
        if n != ".metadata":
            assert (got / n).read_bytes() == (local / n).read_bytes(), n
    loaded, source = dcp_tensors(got, tmp), dcp_tensors(local, tmp)
    assert sorted(loaded) == sorted(source) and len(source) >= 7
    for name, t in source.items():
        assert torch.equal(loaded[name], t), name


@pytest.mark.parametrize("n", [2, 3])
def test_reshard_parted_to_s3_is_the_local_dcp_folder(ckptconv, run_s3, s3, moto, wide, tmp_path, n):
    """DCP fills its ranks' files together; every rank file's parts are
    shared out by bytes, each DCP item's zip metadata patched by the
    finalizer, .metadata put last."""
    prefix = f"reshard-parted-{n}/ws4"
    cmd = [str(ckptconv), "reshard", str(wide), "-o", f"s3://{BUCKET}/{prefix}", "--world-size", "4", "--layout",
           "dcp", "--part"]
    procs = [subprocess.Popen([*cmd, f"{i}/{n}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=s3_env(moto)) for i in range(n)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    local = run_s3("reshard", wide, "-o", tmp_path / "ws4", "--world-size", "4", "--layout", "dcp", "-q")
    assert local.returncode == 0, local.stderr
    same_dcp_folder(s3, prefix, tmp_path / "ws4", tmp_path)
    assert open_uploads(s3) == [] and keys_under(s3, prefix + ".parts") == []


def test_a_dcp_output_within_the_memory_limit_is_written_in_groups_of_ranks(run_s3, s3, moto, wide, tmp_path):
    """Four rank files of about 9.5 MiB hold a part buffer of 8 MiB each
    while DCP fills them together; under --memory-limit 34M (half of it
    for part buffers, the other half for the copy's slabs) they are
    written two at a time (the writer run twice, the other ranks' tensors
    skipped), and the objects are the one-pass local folder's."""
    r = run_s3("reshard", wide, "-o", f"s3://{BUCKET}/grouped/ws4", "--world-size", "4", "--layout", "dcp",
               "--memory-limit", "34M", "-q")
    assert r.returncode == 0, r.stderr
    local = run_s3("reshard", wide, "-o", tmp_path / "ws4", "--world-size", "4", "--layout", "dcp", "-q")
    assert local.returncode == 0, local.stderr
    same_dcp_folder(s3, "grouped/ws4", tmp_path / "ws4", tmp_path)
    assert open_uploads(s3) == []
