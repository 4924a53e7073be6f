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

import json
import shutil
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_object_storage import BUCKET, moto, run_s3, s3_env  # noqa: F401
from test_object_storage_outputs import (RuleProxy, completions_and_puts, dcp_tensors, fetch, keys_under,  # noqa: F401
                                         open_uploads, s3, serving)


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


def stop_a_held_worker(ckptconv, src, out, moto, how="sigkill"):
    """Worker 1 of 2 writing SRC to OUT, stopped while its first part is held
    on the wire: SIGKILL, or SIGINT with the held answer then released (the
    interrupted worker gives up at once). Returns its exit code."""
    proxy = serving(RuleProxy(moto, holds_a_part))
    try:
        p = subprocess.Popen([str(ckptconv), "consolidate", str(src), "-o", out, "--part", "1/2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=s3_env(proxy.endpoint))
        assert proxy.held.wait(60), "worker 1 never sent a part"
        p.send_signal(signal.SIGKILL if how.startswith("sigkill") else signal.SIGINT)
        if how.startswith("sigint"):
            time.sleep(1)
            proxy.release.set()
        p.communicate(timeout=60)
    finally:
        proxy.release.set()
        proxy.shutdown()
    return p.returncode


@pytest.mark.parametrize("then", ["finalize", "abort"])
def test_a_worker_killed_mid_upload_leaves_no_object(ckptconv, run_s3, s3, moto, wide, tmp_path, then):
    key = f"killed-{then}/out.pt"
    out = f"s3://{BUCKET}/{key}"
    assert stop_a_held_worker(ckptconv, wide, out, moto) < 0
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


@pytest.fixture(scope="module")
def wide_folder(wide, testdata, tmp_path_factory) -> Path:
    """A Hugging Face folder around `wide`'s weights: its side files
    (config.json naming its weights file, generation and tokenizer configs)
    go into the output folder beside the weights, config.json last."""
    folder = tmp_path_factory.mktemp("wide-hf") / "src"
    folder.mkdir()
    shutil.copy(wide, folder / "model.safetensors")
    for name in ("generation_config.json", "tokenizer_config.json"):
        shutil.copy(testdata / "hf/sharded" / name, folder / name)
    (folder / "config.json").write_text(json.dumps({"model_type": "wide-test", "torch_dtype": "float32",
                                                    "transformers_weights": "model.safetensors"}))
    return folder


def folder_objects(s3, prefix: str) -> dict[str, bytes]:
    """Every object under `prefix`/, by its name below it."""
    return {k[len(prefix) + 1:]: fetch(s3, k) for k in keys_under(s3, prefix + "/")}


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


HF_CASES = {"one-file": [], "sharded-bf16": ["--max-shard-size", "10M", "--dtype", "bf16"]}


@pytest.mark.parametrize("case", HF_CASES)
def test_parted_workers_into_an_s3_hf_folder_give_the_one_process_objects(ckptconv, run_s3, s3, moto, wide_folder,
                                                                         tmp_path, case):
    """Each worker uploads its parts of each weights file; the finalizer
    completes them, puts the index, then the side files, config.json (its
    dtype and transformers_weights edited as the local folder's) last, and
    removes the shared state: every object is the one process's s3 output
    and the local --part folder's, byte for byte."""
    extra = HF_CASES[case]
    one = run_s3("consolidate", wide_folder, "-o", f"s3://{BUCKET}/hf-one-{case}/", "-q", *extra)
    assert one.returncode == 0, one.stderr
    proxy = serving(RuleProxy(moto, lambda method, path: None))
    try:
        done = workers(ckptconv, wide_folder, f"s3://{BUCKET}/hf-parted-{case}/", 2, proxy.endpoint, extra=extra)
    finally:
        proxy.shutdown()
    for i, r in enumerate(done):
        assert r.returncode == 0, f"part {i}: {r.stderr}"
    assert sum("finalized 2 parts" in r.stderr + r.stdout for r in done) == 1
    local = [subprocess.run([str(ckptconv), "consolidate", str(wide_folder), "-o", f"{tmp_path / 'local'}/", "--part",
                             f"{i}/2", *extra], capture_output=True, text=True, timeout=300) for i in range(2)]
    assert [r.returncode for r in local] == [0, 0], [r.stderr for r in local]
    want = folder_files(tmp_path / "local")
    names = {"model.safetensors", "config.json", "generation_config.json", "tokenizer_config.json"}
    if case == "one-file":
        assert set(want) == names
    else:
        assert "model.safetensors.index.json" in want and len(want) == 3 + 1 + 2  # two shards of two parts
    got = folder_objects(s3, f"hf-parted-{case}")
    assert sorted(got) == sorted(want)  # the state prefix is gone
    assert got == want and folder_objects(s3, f"hf-one-{case}") == want
    config = json.loads(want["config.json"])
    assert config["transformers_weights"] == ("model.safetensors" if case == "one-file"
                                              else "model.safetensors.index.json")
    assert config["torch_dtype"] == ("float32" if case == "one-file" else "bfloat16")
    assert open_uploads(s3) == []
    # Visible last: the weights' completions, then the index, then the side files, config.json the very last.
    shown = [line.split("?")[0].split(f"/hf-parted-{case}/")[1] for line in completions_and_puts(proxy.log)
             if f"/hf-parted-{case}/" in line and ".parts-" not in line]
    assert shown[-1] == "config.json" and set(shown) == set(want) and len(shown) == len(want)
    assert shown.index("generation_config.json") > max(shown.index(n) for n in want if "model" in n)


@pytest.mark.parametrize("how", ["sigkill-finalize", "sigint-abort"])
def test_a_worker_stopped_mid_upload_into_an_s3_hf_folder_leaves_nothing_visible(ckptconv, run_s3, s3, moto,
                                                                                  wide_folder, how):
    """Killed (SIGKILL) or interrupted (Ctrl-C) while its part is on the
    wire: no object of the folder appears, only the shared state; then the
    rerun part finalizes the whole folder, or `--part abort` leaves no
    object and no open upload."""
    prefix = f"hf-{how}"
    out = f"s3://{BUCKET}/{prefix}/"
    assert stop_a_held_worker(ckptconv, wide_folder, out, moto, how) != 0
    first = run_s3("consolidate", wide_folder, "-o", out, "--part", "0/2")
    assert first.returncode == 0, first.stderr
    assert "1 of 2 parts done" in first.stderr + first.stdout
    state = keys_under(s3, prefix + "/")
    assert state and all(k.startswith(f"{prefix}/model.safetensors.parts-") for k in state)  # nothing visible
    refused = run_s3("finalize", out + "model.safetensors")
    assert refused.returncode == 3, refused.stderr
    assert "parts 1/2 have no receipt" in refused.stderr
    if how.endswith("finalize"):
        rerun = run_s3("consolidate", wide_folder, "-o", out, "--part", "1/2", "-q")
        assert rerun.returncode == 0, rerun.stderr
        one = run_s3("consolidate", wide_folder, "-o", f"s3://{BUCKET}/{prefix}-one/", "-q")
        assert one.returncode == 0, one.stderr
        assert folder_objects(s3, prefix) == folder_objects(s3, f"{prefix}-one")
        assert "config.json" in folder_objects(s3, prefix)
    else:
        aborted = run_s3("consolidate", wide_folder, "-o", out, "--part", "abort")
        assert aborted.returncode == 0, aborted.stderr
        assert keys_under(s3, prefix + "/") == []
    assert open_uploads(s3) == []


def test_finalize_of_an_s3_hf_folder_publishes_its_side_files(ckptconv, run_s3, s3, wide_folder, tmp_path):
    """`ckptconv finalize DIR/` (the finalizer died; DIR/model.safetensors,
    the file the workers name, does too): the stored request names the
    folder, so the side files are put as the workers' finalizer puts them;
    a worker that would write beside another output is refused, as one
    process is."""
    prefix = "hf-finalize"
    out = f"s3://{BUCKET}/{prefix}/"
    assert run_s3("consolidate", wide_folder, "-o", out, "--part", "0/2").returncode == 0
    (state,) = {k.rsplit("/", 1)[0] for k in keys_under(s3, prefix + "/")}
    s3.put_object(Bucket=BUCKET, Key=f"{state}/finalizing", Body=b"{}")  # a finalizer that died
    second = run_s3("consolidate", wide_folder, "-o", out, "--part", "1/2")
    assert second.returncode == 0, second.stderr
    assert "another worker is finalizing" in second.stderr + second.stdout
    assert all(k.startswith(state + "/") for k in keys_under(s3, prefix + "/"))
    r = run_s3("finalize", out)  # the folder the workers were given: its weights file's parts are found in it
    assert r.returncode == 0, r.stderr
    one = run_s3("consolidate", wide_folder, "-o", f"{tmp_path / 'one'}/", "-q")
    assert one.returncode == 0, one.stderr
    assert folder_objects(s3, prefix) == folder_files(tmp_path / "one")
    assert open_uploads(s3) == []
    s3.put_object(Bucket=BUCKET, Key="hf-taken/model.safetensors", Body=b"someone else's")
    refused = run_s3("consolidate", wide_folder, "-o", f"s3://{BUCKET}/hf-taken/", "--part", "0/2")
    assert refused.returncode == 2 and "hf-taken/model.safetensors: output exists" in refused.stderr
    assert keys_under(s3, "hf-taken/") == ["hf-taken/model.safetensors"] and open_uploads(s3) == []


def test_a_failed_side_file_removes_the_parted_folders_weights(run_s3, s3, moto, wide_folder):
    """The finalizer's PUT of config.json fails (retries spent): the
    weights it had completed are deleted again, so nothing of the folder is
    visible and no upload stays open; `--part abort` then removes the
    state."""
    prefix = "hf-parted-failed"
    out = f"s3://{BUCKET}/{prefix}/"
    proxy = serving(RuleProxy(moto, lambda method, path: "fail" if path.endswith("/config.json") else None))
    try:
        done = [run_s3("consolidate", wide_folder, "-o", out, "--part", f"{i}/2", "--max-shard-size", "20M",
                       endpoint=proxy.endpoint, env={"CKPTCONV_S3_MAX_ATTEMPTS": "1"}) for i in range(2)]
    finally:
        proxy.shutdown()
    assert done[0].returncode == 0, done[0].stderr
    assert done[1].returncode == 4, done[1].stderr
    assert "config.json: writing failed: HTTP 500 InternalError" in done[1].stderr
    assert any(line.startswith("POST") and "uploadId=" in line for line in proxy.log)  # the weights were completed
    left = keys_under(s3, prefix + "/")
    assert left and all(k.startswith(f"{prefix}/model.safetensors.parts-") for k in left), left
    assert open_uploads(s3) == []
    aborted = run_s3("consolidate", wide_folder, "-o", out, "--part", "abort", "--max-shard-size", "20M")
    assert aborted.returncode == 0, aborted.stderr
    assert keys_under(s3, prefix + "/") == []


def test_parted_workers_write_a_universal_checkpoint_on_s3_as_one_process(ckptconv, run_s3, s3, moto, testdata,
                                                                          tmp_path):
    """Two workers share the tag's files; the finalizer completes them and
    puts latest_universal last: the objects are the local tag's bytes."""
    prefix = "ds-parted"
    cmd = [str(ckptconv), "reshard", str(testdata / "zero/z1_bf16_ws2"), "-o", f"s3://{BUCKET}/{prefix}/s2_universal",
           "--layout", "deepspeed-universal", "-q", "--part"]
    procs = [subprocess.Popen([*cmd, f"{i}/2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=s3_env(moto)) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    local = run_s3("reshard", testdata / "zero/z1_bf16_ws2", "-o", tmp_path / "ds" / "s2_universal", "--layout",
                   "deepspeed-universal", "-q")
    assert local.returncode == 0, local.stderr
    want = sorted(p.relative_to(tmp_path / "ds").as_posix() for p in (tmp_path / "ds").rglob("*") if p.is_file())
    assert "latest_universal" in want and len(want) > 5
    assert keys_under(s3, prefix + "/") == [f"{prefix}/{n}" for n in want]
    for n in want:
        assert fetch(s3, f"{prefix}/{n}") == (tmp_path / "ds" / n).read_bytes(), n
    assert open_uploads(s3) == []
