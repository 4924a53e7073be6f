"""s3:// outputs (docs/object-storage.md) against moto's S3 server on
loopback: consolidate's .pt and .safetensors files and reshard's DCP folder
written to a bucket are the bytes the same command writes locally (fetched
with boto3), and torch / safetensors / torch's DCP reader load them as the
source's tensors. A file output is a multipart upload that appears only
when complete: a failure injected mid-upload (by a proxy in front of moto)
or Ctrl-C leaves no object and no open upload (SIGKILL: no object, the
open upload left for a lifecycle rule); a failure while publishing a folder
removes the objects already published; throttled and dropped uploads are
retried, and a completion whose answer was lost is told from another
writer's object by its ETag. An existing object is never replaced without
--force. The fixtures (moto, run_s3, the credentials) are
test_object_storage.py's."""

from __future__ import annotations

import http.client
import json
import http.server
import os
import re
import signal
import socket
import subprocess
import threading
from pathlib import Path

import boto3
import pytest
import torch
from safetensors.torch import load_file, save_file

from test_object_storage import (BUCKET, KEY_ID, SECRET, UUID, FaultyProxy, forward, moto, run_s3, s3_env,  # noqa: F401
                                 url)

DCP = "dcp/fsdp2_adamw_ws2"


@pytest.fixture
def s3(moto):
    return boto3.client("s3", endpoint_url=moto, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                        region_name="us-east-1")


def keys_under(s3, prefix: str) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", []))


def open_uploads(s3) -> list[str]:
    return [u["Key"] for u in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])]


def fetch(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """20 MiB of float32 in a safetensors file written by the safetensors
    library: its outputs take three parts of 8 MiB (the last short)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    save_file({"a.weight": torch.randn(1024, 3072), "b.weight": torch.randn(1024, 2048)}, str(path))
    return path


@pytest.mark.parametrize("ext", [".pt", ".safetensors"])
def test_consolidate_to_s3_uploads_the_bytes_of_the_local_run(run_s3, s3, testdata, tmp_path, ext):
    key = f"consolidated/{ext[1:]}/full{ext}"
    remote = run_s3("consolidate", testdata / DCP, "-o", f"s3://{BUCKET}/{key}", "-q")
    local = run_s3("consolidate", testdata / DCP, "-o", tmp_path / f"full{ext}", "-q")
    assert remote.returncode == 0, remote.stderr
    assert local.returncode == 0, local.stderr
    want = (tmp_path / f"full{ext}").read_bytes()
    assert len(want) > 1000 and fetch(s3, key) == want
    assert open_uploads(s3) == []


@pytest.mark.parametrize("ext", [".pt", ".safetensors"])
def test_a_file_of_several_parts_loads_as_the_source(run_s3, s3, big, tmp_path, ext):
    key = f"big/out{ext}"
    r = run_s3("consolidate", big, "-o", f"s3://{BUCKET}/{key}", "-q")
    assert r.returncode == 0, r.stderr
    local = run_s3("consolidate", big, "-o", tmp_path / f"local{ext}", "-q")
    assert local.returncode == 0, local.stderr
    # A multipart object's ETag ends in "-<parts>": 20 MiB and a header in parts of 8 MiB.
    assert s3.head_object(Bucket=BUCKET, Key=key)["ETag"].endswith('-3"')
    got = tmp_path / f"got{ext}"
    got.write_bytes(fetch(s3, key))
    assert got.read_bytes() == (tmp_path / f"local{ext}").read_bytes()
    loaded = torch.load(got, weights_only=True) if ext == ".pt" else load_file(str(got))
    source = load_file(str(big))
    assert sorted(loaded) == sorted(source)
    for name, t in source.items():
        assert torch.equal(loaded[name], t), name


def completions_and_puts(log: list[str]) -> list[str]:
    """The requests that make an object visible: CompleteMultipartUpload and PutObject."""
    return [line for line in log if line.startswith(("POST", "PUT")) and "uploads=" not in line
            and "partNumber" not in line]


def test_sharded_safetensors_publish_the_index_after_the_shards(run_s3, s3, moto, big, tmp_path):
    # 12 MiB and 8 MiB tensors: one shard each.
    proxy = serving(RuleProxy(moto, lambda method, path: None))
    try:
        remote = run_s3("consolidate", big, "-o", f"s3://{BUCKET}/shards/m.safetensors", "--max-shard-size", "13M",
                        "-q", endpoint=proxy.endpoint)
    finally:
        proxy.shutdown()
    local = run_s3("consolidate", big, "-o", tmp_path / "m.safetensors", "--max-shard-size", "13M", "-q")
    assert remote.returncode == 0, remote.stderr
    assert local.returncode == 0, local.stderr
    want = sorted(p.name for p in tmp_path.iterdir())
    assert len(want) > 2 and "m.safetensors.index.json" in want
    assert keys_under(s3, "shards/") == [f"shards/{n}" for n in want]
    for n in want:
        assert fetch(s3, f"shards/{n}") == (tmp_path / n).read_bytes(), n
    published = completions_and_puts(proxy.log)
    assert len(published) == 3 and published[-1].startswith("PUT /ckpts/shards/m.safetensors.index.json")


def test_throttled_and_dropped_uploads_are_retried(run_s3, s3, moto, big, tmp_path):
    proxy = FaultyProxy(moto)  # every third request 503 SlowDown, every fifth connection dropped
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        r = run_s3("consolidate", big, "-o", f"s3://{BUCKET}/retried/out.pt", "-q",
                   endpoint=f"http://127.0.0.1:{proxy.server_address[1]}")
    finally:
        proxy.shutdown()
    assert r.returncode == 0, r.stderr
    assert proxy.faults["slowdown"] > 0 and proxy.faults["dropped"] > 0 and proxy.by_method.get("PUT", 0) > 3
    local = run_s3("consolidate", big, "-o", tmp_path / "out.pt", "-q")
    assert local.returncode == 0
    assert fetch(s3, "retried/out.pt") == (tmp_path / "out.pt").read_bytes()
    assert open_uploads(s3) == []


def test_an_existing_object_is_refused_without_force_and_replaced_with_it(run_s3, s3, testdata, tmp_path):
    key = "exists/full.pt"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"an older output")
    r = run_s3("consolidate", testdata / DCP, "-o", f"s3://{BUCKET}/{key}")
    assert r.returncode == 2
    assert f"s3://{BUCKET}/{key}: output exists (use --force to overwrite)" in r.stderr
    assert fetch(s3, key) == b"an older output"
    assert open_uploads(s3) == []
    r = run_s3("consolidate", testdata / DCP, "-o", f"s3://{BUCKET}/{key}", "--force", "-q")
    assert r.returncode == 0, r.stderr
    local = run_s3("consolidate", testdata / DCP, "-o", tmp_path / "full.pt", "-q")
    assert local.returncode == 0
    assert fetch(s3, key) == (tmp_path / "full.pt").read_bytes()


def test_an_output_onto_its_own_s3_input_is_refused_even_with_force(run_s3, s3):
    before = fetch(s3, "testdata/pt/dtypes.pt")
    r = run_s3("convert", url("pt/dtypes.pt"), "-o", url("pt/dtypes.pt"), "--force")
    assert r.returncode == 2, r.stderr
    assert "the output would be the input" in r.stderr
    assert fetch(s3, "testdata/pt/dtypes.pt") == before and open_uploads(s3) == []


class RuleProxy(http.server.ThreadingHTTPServer):
    """Forwards to moto, recording "METHOD /path?query" in order; `rule`
    may answer a request itself instead: "fail" (500 InternalError), "412"
    (PreconditionFailed), "drop" (the connection closed unanswered),
    "forward_drop" (forwarded, the answer dropped) or
    "hold" (no answer until `release` is set; `held` says one arrived)."""

    def __init__(self, upstream: str, rule):
        self.upstream = upstream.split("//")[1]
        self.rule = rule
        self.log: list[str] = []
        self.lock = threading.Lock()
        self.held = threading.Event()
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), RuleHandler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class RuleHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_one(self):
        srv: RuleProxy = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        line = f"{self.command} {self.path}"
        with srv.lock:
            srv.log.append(line)
        action = srv.rule(self.command, self.path)
        if action == "hold":
            srv.held.set()
            srv.release.wait(60)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action == "drop":  # never reaches the service
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action == "forward_drop":  # the service acts on it; its answer is lost
            conn = http.client.HTTPConnection(srv.upstream, timeout=30)
            conn.request(self.command, self.path, body=body, headers=dict(self.headers))
            conn.getresponse().read()
            conn.close()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action == "412":
            xml = b"<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you " \
                  b"specified did not hold</Message></Error>"
            self.send_response(412)
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)
            return
        if action == "fail":
            xml = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
            self.send_response(500)
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)
            return
        forward(self, srv.upstream, body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_one


def serving(proxy: RuleProxy) -> RuleProxy:
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return proxy


def part_number(path: str) -> int | None:
    m = re.search(r"[?&]partNumber=(\d+)", path)
    return int(m.group(1)) if m else None


def test_a_failed_part_upload_leaves_no_object_and_no_open_upload(run_s3, s3, moto, big):
    proxy = serving(RuleProxy(moto, lambda method, path: "fail" if part_number(path) == 2 else None))
    try:
        r = run_s3("consolidate", big, "-o", f"s3://{BUCKET}/failed/out.safetensors", endpoint=proxy.endpoint,
                   env={"CKPTCONV_S3_MAX_ATTEMPTS": "2"})
    finally:
        proxy.shutdown()
    assert r.returncode == 4, r.stderr
    assert f"s3://{BUCKET}/failed/out.safetensors: uploading part 2 failed: HTTP 500 InternalError" in r.stderr
    assert any(line.startswith("PUT /ckpts/failed/out.safetensors?partNumber=1") for line in proxy.log)
    assert any(line.startswith("DELETE /ckpts/failed/out.safetensors?uploadId=") for line in proxy.log)  # the abort
    assert keys_under(s3, "failed/") == []
    assert open_uploads(s3) == []


def test_a_completion_whose_answer_was_lost_is_recognised_on_the_retry(run_s3, s3, moto, big, tmp_path):
    """The first CompleteMultipartUpload reaches the service and its answer
    is lost; the retry finds the object there and gets 412 (If-None-Match:
    *), as AWS answers. The object's ETag is the one this upload's parts
    make, so the run succeeds instead of calling its own output someone
    else's."""
    completions = []

    def rule(method, path):
        if method == "POST" and "uploadId=" in path:
            completions.append(path)
            return "forward_drop" if len(completions) == 1 else "412"
        return None
    proxy = serving(RuleProxy(moto, rule))
    try:
        r = run_s3("consolidate", big, "-o", f"s3://{BUCKET}/lost-answer/out.pt", endpoint=proxy.endpoint)
    finally:
        proxy.shutdown()
    assert r.returncode == 0, r.stderr
    assert len(completions) == 2
    local = run_s3("consolidate", big, "-o", tmp_path / "out.pt", "-q")
    assert fetch(s3, "lost-answer/out.pt") == (tmp_path / "out.pt").read_bytes()


def test_an_object_another_writer_completed_meanwhile_is_not_taken_for_ours(run_s3, s3, moto, big):
    """The first completion is dropped unsent; before the retry another
    writer puts an object at the key. The retry's 412 is then a real
    conflict (the ETag is not this upload's): "output exists", exit 2, the
    other writer's object untouched and this upload aborted."""
    completions = []

    def rule(method, path):
        if method == "POST" and "uploadId=" in path:
            completions.append(path)
            if len(completions) == 1:
                return "drop"
            s3.put_object(Bucket=BUCKET, Key="raced/out.pt", Body=b"the other writer's")
            return "412"
        return None
    proxy = serving(RuleProxy(moto, rule))
    try:
        r = run_s3("consolidate", big, "-o", f"s3://{BUCKET}/raced/out.pt", endpoint=proxy.endpoint)
    finally:
        proxy.shutdown()
    assert r.returncode == 2, r.stderr
    assert f"s3://{BUCKET}/raced/out.pt: output exists" in r.stderr
    assert fetch(s3, "raced/out.pt") == b"the other writer's"
    assert open_uploads(s3) == []


def test_ctrl_c_mid_upload_aborts_it(ckptconv, s3, moto, big):
    proxy = serving(RuleProxy(moto, lambda method, path: "hold" if part_number(path) == 2 else None))
    try:
        p = subprocess.Popen([str(ckptconv), "consolidate", str(big), "-o", f"s3://{BUCKET}/interrupted/out.pt"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=s3_env(proxy.endpoint))
        assert proxy.held.wait(60), "part 2 never came"
        p.send_signal(signal.SIGINT)  # while part 2 is on the wire
        _, err = p.communicate(timeout=60)
    finally:
        proxy.release.set()
        proxy.shutdown()
    assert p.returncode == 130, err
    assert "SIGINT" in err
    assert any(line.startswith("DELETE /ckpts/interrupted/out.pt?uploadId=") for line in proxy.log)
    assert keys_under(s3, "interrupted/") == []
    assert open_uploads(s3) == []


def test_sigkill_mid_upload_leaves_no_object_only_an_open_upload(ckptconv, s3, moto, big):
    """SIGKILL cannot be caught: the upload stays open (invisible; a bucket
    lifecycle rule or `aws s3api abort-multipart-upload` removes it, as
    docs/object-storage.md says), and no object appears."""
    proxy = serving(RuleProxy(moto, lambda method, path: "hold" if part_number(path) == 2 else None))
    try:
        p = subprocess.Popen([str(ckptconv), "consolidate", str(big), "-o", f"s3://{BUCKET}/killed/out.pt"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=s3_env(proxy.endpoint))
        assert proxy.held.wait(60), "part 2 never came"
        p.kill()
        p.communicate(timeout=60)
    finally:
        proxy.release.set()
        proxy.shutdown()
    assert p.returncode == -signal.SIGKILL
    assert keys_under(s3, "killed/") == []
    uploads = s3.list_multipart_uploads(Bucket=BUCKET, Prefix="killed/").get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["killed/out.pt"]
    for u in uploads:
        s3.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
    assert open_uploads(s3) == []


def dcp_tensors(folder: Path, tmp: Path) -> dict:
    """What torch's own DCP reader loads from `folder` (dcp_to_torch_save), flattened to name -> tensor."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp / f"{folder.name}.pt"
    dcp_to_torch_save(str(folder), str(out))
    flat = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif isinstance(v, torch.Tensor):
            flat[prefix] = v
    walk("", torch.load(out, weights_only=False))
    return flat


def test_reshard_to_s3_writes_the_local_folder_metadata_last(run_s3, s3, moto, testdata, tmp_path):
    proxy = serving(RuleProxy(moto, lambda method, path: None))
    try:
        remote = run_s3("reshard", testdata / DCP, "-o", f"s3://{BUCKET}/resharded/ws4", "--world-size", "4", "-q",
                        endpoint=proxy.endpoint)
    finally:
        proxy.shutdown()
    assert remote.returncode == 0, remote.stderr
    local = run_s3("reshard", testdata / DCP, "-o", tmp_path / "ws4", "--world-size", "4", "-q")
    assert local.returncode == 0, local.stderr
    want = sorted(p.name for p in (tmp_path / "ws4").iterdir())
    assert ".metadata" in want and len(want) == 5
    assert keys_under(s3, "resharded/ws4/") == [f"resharded/ws4/{n}" for n in want]
    got = tmp_path / "got"
    got.mkdir()
    for n in want:
        (got / n).write_bytes(fetch(s3, f"resharded/ws4/{n}"))
        # .metadata records the output path (checkpoint_id) and a random save_id.
        norm = [UUID.sub(b"UUID", x.replace(str(tmp_path / "ws4").encode(), b"DST")
                         .replace(f"s3://{BUCKET}/resharded/ws4".encode(), b"DST"))
                for x in ((got / n).read_bytes(), (tmp_path / "ws4" / n).read_bytes())]
        if n != ".metadata":
            assert norm[0] == norm[1], n
    # Every rank file completed before .metadata was put: a reader never sees a marker without its data.
    writes = completions_and_puts(proxy.log)
    assert len(writes) == 5 and writes[-1].startswith("PUT /ckpts/resharded/ws4/.metadata")
    loaded, source = dcp_tensors(got, tmp_path), dcp_tensors(testdata / DCP, tmp_path)
    assert sorted(loaded) == sorted(source) and len(source) > 5
    for name, t in source.items():
        assert torch.equal(loaded[name], t), name
    assert open_uploads(s3) == []


@pytest.mark.parametrize("src,args", [
    (DCP, ["--layout", "hf", "--world-size", "2", "--only", "model"]),
    (DCP, ["--layout", "fsdp-sharded-tensor", "--world-size", "2"]),
    ("megatron/gpt_tp2pp2/ckpt", ["--layout", "megatron", "--world-size", "2"]),
])
def test_other_reshard_layouts_on_s3_are_the_local_folder(run_s3, s3, testdata, tmp_path, src, args):
    prefix = f"layouts/{args[1]}"
    remote = run_s3("reshard", testdata / src, "-o", f"s3://{BUCKET}/{prefix}", *args, "-q")
    local = run_s3("reshard", testdata / src, "-o", tmp_path / "out", *args, "-q")
    assert remote.returncode == 0, remote.stderr
    assert local.returncode == 0, local.stderr
    want = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert len(want) >= 2 and keys_under(s3, prefix + "/") == [f"{prefix}/{n}" for n in want]
    for n in want:
        if n != ".metadata":  # the output path and a random save id
            assert fetch(s3, f"{prefix}/{n}") == (tmp_path / "out" / n).read_bytes(), n


ACC = "frameworks/accelerate_fsdp1_ws2/project/checkpoints/checkpoint_1"
ACC_PARTS = ("pytorch_model_fsdp_0", "optimizer_0")


def test_an_accelerate_folder_on_s3_is_the_local_folder_markers_last(run_s3, s3, moto, testdata, tmp_path):
    """reshard --layout accelerate (the default for an Accelerate source):
    both DCP folders' rank files and the copied random_states_0.pkl are the
    local run's bytes (test_frameworks.py reads the local one with torch's
    DCP reader), both .metadata objects come after every other object, and
    torch's DCP reader loads each folder fetched back as the reference."""
    proxy = serving(RuleProxy(moto, lambda method, path: None))
    try:
        remote = run_s3("reshard", testdata / ACC, "-o", f"s3://{BUCKET}/acc/checkpoint_1", "--world-size", "2", "-q",
                        endpoint=proxy.endpoint)
    finally:
        proxy.shutdown()
    assert remote.returncode == 0, remote.stderr
    local = run_s3("reshard", testdata / ACC, "-o", tmp_path / "local", "--world-size", "2", "-q")
    assert local.returncode == 0, local.stderr
    want = files_under(tmp_path / "local")
    assert want == ["optimizer_0/.metadata", "optimizer_0/__0_0.distcp", "optimizer_0/__1_0.distcp",
                    "pytorch_model_fsdp_0/.metadata", "pytorch_model_fsdp_0/__0_0.distcp",
                    "pytorch_model_fsdp_0/__1_0.distcp", "random_states_0.pkl"]
    assert keys_under(s3, "acc/") == [f"acc/checkpoint_1/{n}" for n in want]
    got = tmp_path / "got"
    for n in want:
        (got / n).parent.mkdir(parents=True, exist_ok=True)
        (got / n).write_bytes(fetch(s3, f"acc/checkpoint_1/{n}"))
        if not n.endswith(".metadata"):  # .metadata records the output path and a random save id
            assert (got / n).read_bytes() == (tmp_path / "local" / n).read_bytes(), n
    writes = completions_and_puts(proxy.log)
    assert len(writes) == 7 and all(".metadata" in w for w in writes[-2:]), writes
    for part in ACC_PARTS:
        loaded, source = dcp_tensors(got / part, tmp_path), dcp_tensors(testdata / ACC / part, tmp_path)
        assert sorted(loaded) == sorted(source) and source
        for name, t in source.items():
            assert torch.equal(loaded[name], t), name
    assert open_uploads(s3) == []


def test_accelerate_part_workers_on_s3_upload_the_one_process_objects(run_s3, s3, testdata, tmp_path):
    """Two --part workers of --layout accelerate over a bucket: the objects
    are the local one-process folder's (the .metadata aside), and nothing of
    the shared state or an upload is left."""
    out = f"s3://{BUCKET}/accparts/ckpt"
    for i in range(2):
        r = run_s3("reshard", testdata / ACC, "-o", out, "--world-size", "3", "--part", f"{i}/2", "-q")
        assert r.returncode == 0, f"part {i}: {r.stderr}"
    local = run_s3("reshard", testdata / ACC, "-o", tmp_path / "local", "--world-size", "3", "-q")
    assert local.returncode == 0, local.stderr
    want = files_under(tmp_path / "local")
    assert len(want) == 9 and keys_under(s3, "accparts/") == [f"accparts/ckpt/{n}" for n in want]
    for n in want:
        if not n.endswith(".metadata"):
            assert fetch(s3, f"accparts/ckpt/{n}") == (tmp_path / "local" / n).read_bytes(), n
    assert open_uploads(s3) == []


def test_a_large_accelerate_file_is_streamed_up_in_parts(run_s3, s3, testdata, tmp_path):
    """A copied file larger than a part (an EMA model registered for
    checkpointing, here 20 MiB) goes up as a multipart upload streamed from
    the file, not held whole: the object equals it, beside the rest of the
    folder; it was exit 4 above 256 MiB before."""
    import shutil
    src = tmp_path / "checkpoint_1"
    shutil.copytree(testdata / ACC, src)
    big = os.urandom(20 << 20)
    (src / "custom_checkpoint_0.pkl").write_bytes(big)
    r = run_s3("reshard", src, "-o", f"s3://{BUCKET}/accbig/ckpt", "--world-size", "2", "-q")
    assert r.returncode == 0, r.stderr
    assert fetch(s3, "accbig/ckpt/custom_checkpoint_0.pkl") == big
    # A multipart object's ETag ends in its number of parts: 8 MiB parts.
    assert s3.head_object(Bucket=BUCKET, Key="accbig/ckpt/custom_checkpoint_0.pkl")["ETag"].endswith('-3"')
    local = run_s3("reshard", src, "-o", tmp_path / "local", "--world-size", "2", "-q")
    assert local.returncode == 0, local.stderr
    want = files_under(tmp_path / "local")
    assert keys_under(s3, "accbig/") == [f"accbig/ckpt/{n}" for n in want]
    assert open_uploads(s3) == []


def test_a_failed_accelerate_marker_removes_everything_published(run_s3, s3, moto, testdata):
    proxy = serving(RuleProxy(moto, lambda method, path: "fail" if path.endswith("optimizer_0/.metadata") else None))
    try:
        r = run_s3("reshard", testdata / ACC, "-o", f"s3://{BUCKET}/accfail/ckpt", "--world-size", "2",
                   endpoint=proxy.endpoint, env={"CKPTCONV_S3_MAX_ATTEMPTS": "1"})
    finally:
        proxy.shutdown()
    assert r.returncode == 4, r.stderr
    assert "optimizer_0/.metadata: writing failed: HTTP 500 InternalError" in r.stderr
    # Four rank files, random_states_0.pkl and the model's .metadata were visible, and are deleted again.
    assert sum(line.startswith("DELETE /ckpts/accfail/ckpt/") for line in proxy.log) == 6
    assert keys_under(s3, "accfail/") == [] and open_uploads(s3) == []


ZERO = "zero/z1_bf16_ws2"
UNIVERSAL = ["--layout", "deepspeed-universal", "-q"]


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_a_universal_checkpoint_on_s3_is_the_local_one_latest_last(run_s3, s3, moto, testdata, tmp_path):
    """tests/test_ds_universal.py loads the local tag with a DeepSpeed engine:
    the objects being its bytes is the proof that the engine loads them."""
    proxy = serving(RuleProxy(moto, lambda method, path: None))
    try:
        remote = run_s3("reshard", testdata / ZERO, "-o", f"s3://{BUCKET}/ds/step2_universal", *UNIVERSAL,
                        endpoint=proxy.endpoint)
    finally:
        proxy.shutdown()
    assert remote.returncode == 0, remote.stderr
    local = run_s3("reshard", testdata / ZERO, "-o", tmp_path / "ds" / "step2_universal", *UNIVERSAL)
    assert local.returncode == 0, local.stderr
    want = files_under(tmp_path / "ds")
    assert "latest_universal" in want and sum(n.endswith("/fp32.pt") for n in want) >= 2
    assert keys_under(s3, "ds/") == [f"ds/{n}" for n in want]
    for n in want:
        assert fetch(s3, f"ds/{n}") == (tmp_path / "ds" / n).read_bytes(), n
    assert fetch(s3, "ds/latest_universal") == b"step2_universal"
    # Every file of the tag completed before the pointer was put: a loader that follows it finds the tag whole.
    writes = completions_and_puts(proxy.log)
    assert len(writes) == len(want) and writes[-1].startswith("PUT /ckpts/ds/latest_universal")
    assert open_uploads(s3) == []


def test_a_universal_checkpoint_on_s3_keeps_latest_and_output_rules(run_s3, s3, testdata):
    s3.put_object(Bucket=BUCKET, Key="dsk/latest_universal", Body=b"step1_universal")
    dst = f"s3://{BUCKET}/dsk/step2_universal"
    r = run_s3("reshard", testdata / ZERO, "-o", dst, "--layout", "deepspeed-universal")
    assert r.returncode == 0, r.stderr
    assert "kept s3://ckpts/dsk/latest_universal as it is" in r.stderr
    assert fetch(s3, "dsk/latest_universal") == b"step1_universal"  # names another checkpoint: kept
    tag = keys_under(s3, "dsk/step2_universal/")
    assert len(tag) >= 4
    r = run_s3("reshard", testdata / ZERO, "-o", dst, *UNIVERSAL, "--update-latest")
    assert r.returncode == 2 and f"{dst}: output exists" in r.stderr
    assert fetch(s3, "dsk/latest_universal") == b"step1_universal"
    r = run_s3("reshard", testdata / ZERO, "-o", dst, *UNIVERSAL, "--update-latest", "--force")
    assert r.returncode == 0, r.stderr
    assert fetch(s3, "dsk/latest_universal") == b"step2_universal"
    assert keys_under(s3, "dsk/step2_universal/") == tag
    assert open_uploads(s3) == []


def test_a_failed_latest_universal_removes_the_published_tag(run_s3, s3, moto, testdata):
    def fails_the_pointer(method, path):
        return "fail" if method == "PUT" and path.endswith("/latest_universal") else None
    proxy = serving(RuleProxy(moto, fails_the_pointer))
    try:
        r = run_s3("reshard", testdata / ZERO, "-o", f"s3://{BUCKET}/dsf/step2_universal", *UNIVERSAL,
                   endpoint=proxy.endpoint, env={"CKPTCONV_S3_MAX_ATTEMPTS": "1"})
    finally:
        proxy.shutdown()
    assert r.returncode == 4, r.stderr
    assert "latest_universal: writing failed: HTTP 500 InternalError" in r.stderr
    assert sum(line.startswith("DELETE /ckpts/dsf/step2_universal/") for line in proxy.log) >= 4
    assert keys_under(s3, "dsf/") == []
    assert open_uploads(s3) == []


def test_a_failed_marker_removes_the_published_rank_files(run_s3, s3, moto, testdata):
    proxy = serving(RuleProxy(moto, lambda method, path: "fail" if path.endswith("/.metadata") else None))
    try:
        r = run_s3("reshard", testdata / DCP, "-o", f"s3://{BUCKET}/unpublished/ws2", "--world-size", "2",
                   endpoint=proxy.endpoint, env={"CKPTCONV_S3_MAX_ATTEMPTS": "1"})
    finally:
        proxy.shutdown()
    assert r.returncode == 4, r.stderr
    assert ".metadata: writing failed: HTTP 500 InternalError" in r.stderr
    # The rank files were completed (visible) before the marker failed, and deleted again.
    assert sum(line.startswith("DELETE /ckpts/unpublished/ws2/__") for line in proxy.log) == 2
    assert keys_under(s3, "unpublished/") == []
    assert open_uploads(s3) == []


def test_reshard_with_force_replaces_the_folder_and_its_stale_rank_files(run_s3, s3, testdata):
    dst = f"s3://{BUCKET}/replaced/ckpt"
    assert run_s3("reshard", testdata / DCP, "-o", dst, "--world-size", "4", "-q").returncode == 0
    r = run_s3("reshard", testdata / DCP, "-o", dst, "--world-size", "2", "-q")
    assert r.returncode == 2 and "output exists" in r.stderr
    r = run_s3("reshard", testdata / DCP, "-o", dst, "--world-size", "2", "-q", "--force")
    assert r.returncode == 0, r.stderr
    # World size 4's __2_0 and __3_0 are gone: DCP's reader would not read them, but a copy would carry them.
    assert keys_under(s3, "replaced/") == ["replaced/ckpt/.metadata", "replaced/ckpt/__0_0.distcp",
                                           "replaced/ckpt/__1_0.distcp"]
    again = run_s3("validate", dst, "--expect-world-size", "2")
    assert again.returncode == 0, again.stdout + again.stderr


def test_an_hf_folder_on_s3_is_the_local_folder_config_last(run_s3, s3, moto, testdata, tmp_path):
    proxy = serving(RuleProxy(moto, lambda method, path: None))
    try:
        remote = run_s3("consolidate", testdata / "hf/sharded", "-o", f"s3://{BUCKET}/hf-out/", "--dtype", "bf16", "-q",
                        endpoint=proxy.endpoint)
    finally:
        proxy.shutdown()
    local = run_s3("consolidate", testdata / "hf/sharded", "-o", f"{tmp_path}/hf-out/", "--dtype", "bf16", "-q")
    assert remote.returncode == 0, remote.stderr
    assert local.returncode == 0, local.stderr
    want = sorted(p.name for p in (tmp_path / "hf-out").iterdir())
    assert "config.json" in want and "model.safetensors" in want
    assert keys_under(s3, "hf-out/") == [f"hf-out/{n}" for n in want]
    for n in want:  # config.json says bfloat16, as the local one does
        assert fetch(s3, f"hf-out/{n}") == (tmp_path / "hf-out" / n).read_bytes(), n
    assert completions_and_puts(proxy.log)[-1].startswith("PUT /ckpts/hf-out/config.json")
    # Again over it: the model there is replaced only with --force, and then as the local folder is.
    again = run_s3("consolidate", testdata / "hf/sharded", "-o", f"s3://{BUCKET}/hf-out/")
    assert again.returncode == 2 and "hf-out/model.safetensors: output exists" in again.stderr
    for where in (f"s3://{BUCKET}/hf-out/", f"{tmp_path}/hf-out/"):
        again = run_s3("consolidate", testdata / "hf/sharded", "-o", where, "--force", "--max-shard-size", "300", "-q")
        assert again.returncode == 0, again.stderr
    want = sorted(p.name for p in (tmp_path / "hf-out").iterdir())
    assert "model.safetensors.index.json" in want and "model.safetensors" not in want
    assert keys_under(s3, "hf-out/") == [f"hf-out/{n}" for n in want]  # the one file before is deleted
    for n in want:  # config.json the source's again (float32), as the local folder rebuilt
        assert fetch(s3, f"hf-out/{n}") == (tmp_path / "hf-out" / n).read_bytes(), n


def test_an_hf_folder_into_a_prefix_with_objects_adds_to_it_as_to_a_local_folder(run_s3, s3, testdata, tmp_path):
    """-o s3://B/DIR/ where DIR holds a tokenizer and a config.json of its
    own: the weights go in, the objects there are kept, the kept config.json
    is edited to say the dtype written; the same as into a local folder
    holding those files."""
    local = tmp_path / "mine"
    local.mkdir()
    config = json.dumps({"model_type": "llama", "torch_dtype": "float32", "note": "mine"}).encode()
    for name, body in (("tokenizer.json", b'{"mine": true}'), ("config.json", config)):
        (local / name).write_bytes(body)
        s3.put_object(Bucket=BUCKET, Key=f"mine/{name}", Body=body)
    for where in (f"s3://{BUCKET}/mine/", f"{local}/"):
        r = run_s3("consolidate", testdata / "hf/sharded", "-o", where, "--dtype", "bf16", "-q")
        assert r.returncode == 0, r.stderr
    want = sorted(p.name for p in local.iterdir())
    assert "model.safetensors" in want and "generation_config.json" in want
    assert keys_under(s3, "mine/") == [f"mine/{n}" for n in want]
    for n in want:
        assert fetch(s3, f"mine/{n}") == (local / n).read_bytes(), n
    assert fetch(s3, "mine/tokenizer.json") == b'{"mine": true}'
    assert json.loads(fetch(s3, "mine/config.json")) == {"model_type": "llama", "torch_dtype": "bfloat16", "note": "mine"}


def test_a_failed_config_removes_the_hf_folders_weights(run_s3, s3, moto, testdata):
    proxy = serving(RuleProxy(moto, lambda method, path: "fail" if path.endswith("/config.json") else None))
    try:
        r = run_s3("consolidate", testdata / "hf/sharded", "-o", f"s3://{BUCKET}/hf-failed/", endpoint=proxy.endpoint,
                   env={"CKPTCONV_S3_MAX_ATTEMPTS": "1"})
    finally:
        proxy.shutdown()
    assert r.returncode == 4, r.stderr
    assert "config.json: writing failed: HTTP 500 InternalError" in r.stderr
    assert keys_under(s3, "hf-failed/") == [] and open_uploads(s3) == []


def test_write_manifest_to_s3_is_the_manifest_validate_checks_against(run_s3, s3, testdata, tmp_path):
    r = run_s3("validate", testdata / DCP, "--write-manifest", f"s3://{BUCKET}/manifests/m.json")
    assert r.returncode == 0, r.stderr
    local = run_s3("validate", testdata / DCP, "--write-manifest", tmp_path / "m.json")
    assert local.returncode == 0, local.stderr
    assert fetch(s3, "manifests/m.json") == (tmp_path / "m.json").read_bytes()
    r = run_s3("validate", url(DCP), "--manifest", f"s3://{BUCKET}/manifests/m.json")
    assert r.returncode == 0, r.stdout + r.stderr
    again = run_s3("validate", testdata / DCP, "--write-manifest", f"s3://{BUCKET}/manifests/m.json")
    assert again.returncode == 2 and "output exists" in again.stderr


def test_hdf5_to_s3_is_the_local_file_spooled_and_removed(run_s3, s3, testdata, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    r = run_s3("consolidate", testdata / DCP, "-o", f"s3://{BUCKET}/h5/full.h5", "-q", env={"TMPDIR": str(spool)})
    assert r.returncode == 0, r.stderr
    local = run_s3("consolidate", testdata / DCP, "-o", tmp_path / "full.h5", "-q")
    assert local.returncode == 0, local.stderr
    got = tmp_path / "got.h5"
    got.write_bytes(fetch(s3, "h5/full.h5"))
    assert got.read_bytes() == (tmp_path / "full.h5").read_bytes()
    import h5py
    with h5py.File(got, "r") as f:
        assert f.attrs["ckptconv.source_format"] == "dcp"
        names = []
        f.visit(names.append)
        datasets = [n for n in names if isinstance(f[n], h5py.Dataset)]
        assert len(datasets) > 5
        with h5py.File(tmp_path / "full.h5", "r") as want:
            for n in datasets:
                assert (f[n][()] == want[n][()]).all(), n
    assert list(spool.iterdir()) == []  # the spool went with the upload
    r = run_s3("consolidate", testdata / DCP, "-o", f"s3://{BUCKET}/h5/full.h5", "-q", env={"TMPDIR": str(spool)})
    assert r.returncode == 2 and f"s3://{BUCKET}/h5/full.h5: output exists" in r.stderr
    assert open_uploads(s3) == []


def test_an_hdf5_folder_on_s3_is_the_local_folder(run_s3, s3, testdata, tmp_path):
    r = run_s3("consolidate", testdata / "hf/sharded", "-o", f"s3://{BUCKET}/h5-folder/", "--format", "hdf5", "-q")
    assert r.returncode == 0, r.stderr
    local = run_s3("consolidate", testdata / "hf/sharded", "-o", f"{tmp_path / 'out'}/", "--format", "hdf5", "-q")
    assert local.returncode == 0, local.stderr
    want = files_under(tmp_path / "out")
    assert "model.h5" in want and "config.json" in want
    assert keys_under(s3, "h5-folder/") == [f"h5-folder/{n}" for n in want]
    for n in want:
        assert fetch(s3, f"h5-folder/{n}") == (tmp_path / "out" / n).read_bytes(), n


def test_a_failed_hdf5_upload_leaves_no_object_no_upload_and_no_spool(run_s3, s3, moto, big, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    proxy = serving(RuleProxy(moto, lambda method, path: "fail" if part_number(path) == 2 else None))
    try:
        r = run_s3("consolidate", big, "-o", f"s3://{BUCKET}/h5-failed/out.h5", endpoint=proxy.endpoint,
                   env={"CKPTCONV_S3_MAX_ATTEMPTS": "1", "TMPDIR": str(spool)})
    finally:
        proxy.shutdown()
    assert r.returncode == 4, r.stderr
    assert "uploading part 2 failed: HTTP 500 InternalError" in r.stderr
    assert any(line.startswith("DELETE /ckpts/h5-failed/out.h5?uploadId=") for line in proxy.log)
    assert keys_under(s3, "h5-failed/") == [] and open_uploads(s3) == []
    assert list(spool.iterdir()) == []


def test_ctrl_c_mid_hdf5_upload_aborts_it_and_removes_the_spool(ckptconv, s3, moto, big, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    proxy = serving(RuleProxy(moto, lambda method, path: "hold" if part_number(path) == 2 else None))
    try:
        p = subprocess.Popen([str(ckptconv), "consolidate", str(big), "-o", f"s3://{BUCKET}/h5-int/out.h5"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**s3_env(proxy.endpoint), "TMPDIR": str(spool)})
        assert proxy.held.wait(60), "part 2 never came"
        assert len(list(spool.iterdir())) == 1  # the spooled file, being uploaded
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        proxy.release.set()
        proxy.shutdown()
    assert p.returncode == 130, err
    assert any(line.startswith("DELETE /ckpts/h5-int/out.h5?uploadId=") for line in proxy.log)
    assert keys_under(s3, "h5-int/") == [] and open_uploads(s3) == []
    assert list(spool.iterdir()) == []


def test_parts_of_a_file_go_up_side_by_side_and_complete_in_order(run_s3, s3, moto, big, tmp_path):
    """Part 1 is held on the wire until part 3 arrives: one part at a time,
    part 3 would come only after part 1's answer (the hold gives up after
    30 s, and says part 3 had not come); side by side it comes meanwhile,
    and the completion lists them 1, 2, 3."""
    last_came = threading.Event()
    came_while_held = []

    def rule(method, path):
        if part_number(path) == 3:
            last_came.set()
        elif part_number(path) == 1:
            came_while_held.append(last_came.wait(30))
        return None
    proxy = serving(RuleProxy(moto, rule))
    try:
        r = run_s3("consolidate", big, "-o", f"s3://{BUCKET}/side-by-side/out.safetensors", "-q",
                   endpoint=proxy.endpoint)
    finally:
        proxy.shutdown()
    assert r.returncode == 0, r.stderr
    assert came_while_held == [True]
    parts = [part_number(line) for line in proxy.log if part_number(line)]
    assert sorted(parts) == [1, 2, 3]
    assert completions_and_puts(proxy.log)[-1].startswith("POST /ckpts/side-by-side/out.safetensors?uploadId=")
    local = run_s3("consolidate", big, "-o", tmp_path / "local.safetensors", "-q")
    assert local.returncode == 0, local.stderr
    assert fetch(s3, "side-by-side/out.safetensors") == (tmp_path / "local.safetensors").read_bytes()
    assert s3.head_object(Bucket=BUCKET, Key="side-by-side/out.safetensors")["ETag"].endswith('-3"')
    assert open_uploads(s3) == []
