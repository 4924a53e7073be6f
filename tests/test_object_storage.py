"""s3:// sources (docs/object-storage.md) against moto's S3 server on
loopback, over real HTTP: every read-side command on an s3:// copy of a
checkpoint gives what it gives on the local copy (byte for byte for
consolidate), validate --manifest across the two copies is 0, and the
failures are clear errors with their exit codes: a missing bucket or key
(3), an endpoint that refuses or never answers (3, within a minute), the
s3:// outputs not written yet (4; the others are
test_object_storage_outputs.py's). Throttling (503 SlowDown) and dropped
connections are retried: a fault-injecting proxy in front of moto proves it.
Credentials appear in no message, log or output."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import boto3
import moto.server as moto_server
import pytest

BUCKET = "ckpts"
SECRET = "s3cr3t-NEVER-PRINTED-4f9a"
KEY_ID = "AKIDTESTNEVERPRINTED"
# One checkpoint of each kind the issue names: DCP, ZeRO (a root with
# `latest`), an HF folder, Megatron torch_dist, a single torch.save file.
# FSDP1 flat-parameter files, read with --param-layout.
FLAT = "fsdp1/torch2.15/flat_adam_ws2"
SOURCES = ["dcp/fsdp2_adamw_ws2", "zero/z1_bf16_ws2", "hf/sharded", "megatron/gpt_tp2pp2/ckpt", "pt/dtypes.pt"]


@pytest.fixture(scope="module")
def moto(testdata: Path):
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                          region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    for src in SOURCES + [FLAT]:
        root = testdata / src
        files = [root] if root.is_file() else [p for p in sorted(root.rglob("*")) if p.is_file()]
        for f in files:
            client.upload_file(str(f), BUCKET, "testdata/" + f.relative_to(testdata).as_posix())
    yield endpoint
    server.stop()


def s3_env(endpoint: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET,
               AWS_SESSION_TOKEN="tok-NEVER-PRINTED", AWS_REGION="us-east-1",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
    return env


@pytest.fixture
def run_s3(ckptconv: Path, moto: str):
    def run(*args, endpoint: str | None = None, timeout: float = 300, env: dict | None = None):
        e = s3_env(endpoint or moto)
        e.update(env or {})
        started = time.monotonic()
        r = subprocess.run([str(ckptconv), *map(str, args)], capture_output=True, text=True, env=e, timeout=timeout)
        r.seconds = time.monotonic() - started
        for secret in (SECRET, "tok-NEVER-PRINTED"):
            assert secret not in r.stdout and secret not in r.stderr, "a credential was printed"
        return r
    return run


def url(src: str) -> str:
    return f"s3://{BUCKET}/testdata/{src}"


@pytest.mark.parametrize("src", SOURCES)
def test_inspect_on_s3_prints_what_it_prints_for_the_local_copy(run_s3, testdata, src):
    remote = run_s3("inspect", url(src))
    local = run_s3("inspect", testdata / src)
    assert remote.returncode == 0, remote.stderr
    assert local.returncode == 0, local.stderr
    assert remote.stdout.replace(url(src), "SRC") == local.stdout.replace(str(testdata / src), "SRC")
    assert "tensors" in remote.stdout


# Every source to .pt, and to .safetensors where its dtypes allow (dtypes.pt holds complex tensors).
CONSOLIDATIONS = [(s, ".pt") for s in SOURCES] + [(s, ".safetensors") for s in SOURCES if not s.endswith(".pt")]


@pytest.mark.parametrize("src,ext", CONSOLIDATIONS)
def test_consolidate_from_s3_writes_the_bytes_of_the_local_run(run_s3, testdata, tmp_path, src, ext):
    remote = run_s3("consolidate", url(src), "-o", tmp_path / f"remote{ext}", "-q")
    local = run_s3("consolidate", testdata / src, "-o", tmp_path / f"local{ext}", "-q")
    assert remote.returncode == 0, remote.stderr
    assert local.returncode == 0, local.stderr
    a, b = (tmp_path / f"remote{ext}").read_bytes(), (tmp_path / f"local{ext}").read_bytes()
    assert len(a) > 100 and a == b


def test_tag_selects_among_prefixes_as_among_folders(run_s3, testdata, tmp_path):
    remote = run_s3("consolidate", url("zero/z1_bf16_ws2"), "--tag", "global_step3", "-o", tmp_path / "r.pt", "-q")
    local = run_s3("consolidate", testdata / "zero/z1_bf16_ws2", "--tag", "global_step3", "-o", tmp_path / "l.pt",
                   "-q")
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    assert (tmp_path / "r.pt").read_bytes() == (tmp_path / "l.pt").read_bytes()
    missing = run_s3("inspect", url("zero/z1_bf16_ws2"), "--tag", "global_step999")
    assert missing.returncode in (2, 3) and "global_step999" in missing.stderr


def test_validate_manifest_across_local_and_s3_copies_is_zero(run_s3, testdata, tmp_path):
    src = "dcp/fsdp2_adamw_ws2"
    wrote = run_s3("validate", testdata / src, "--write-manifest", tmp_path / "m.json")
    assert wrote.returncode == 0, wrote.stderr
    checked = run_s3("validate", url(src), "--manifest", tmp_path / "m.json", "--json")
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    comparison = next(v for v in report.values() if isinstance(v, dict) and "files_compared" in v)
    assert comparison["files_compared"] is True
    assert (comparison["changed"], comparison["missing"], comparison["new"]) == (0, 0, 0)
    # And the other way: a manifest written from the s3:// copy checks the local one.
    wrote = run_s3("validate", url(src), "--write-manifest", tmp_path / "m2.json")
    assert wrote.returncode == 0, wrote.stderr
    assert SECRET not in (tmp_path / "m2.json").read_text()
    assert run_s3("validate", testdata / src, "--manifest", tmp_path / "m2.json").returncode == 0


def test_manifest_and_expected_keys_may_be_s3_objects(run_s3, moto, testdata, tmp_path):
    src = "dcp/fsdp2_adamw_ws2"
    assert run_s3("validate", testdata / src, "--write-manifest", tmp_path / "m.json").returncode == 0
    listed = run_s3("inspect", testdata / src, "--json")
    report = json.loads(listed.stdout)
    keys = [t["path"] for t in report["tensors"] + report["values"]]
    (tmp_path / "keys.txt").write_text("\n".join(keys) + "\n")
    s3 = boto3.client("s3", endpoint_url=moto, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                      region_name="us-east-1")
    s3.upload_file(str(tmp_path / "m.json"), BUCKET, "side/m.json")
    s3.upload_file(str(tmp_path / "keys.txt"), BUCKET, "side/keys.txt")
    r = run_s3("validate", url(src), "--manifest", f"s3://{BUCKET}/side/m.json", "--expect-keys",
               f"s3://{BUCKET}/side/keys.txt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 changed, 0 missing, 0 new" in r.stdout
    (tmp_path / "more.txt").write_text("\n".join(keys + ["model.not_there"]) + "\n")
    s3.upload_file(str(tmp_path / "more.txt"), BUCKET, "side/more.txt")
    r = run_s3("validate", url(src), "--expect-keys", f"s3://{BUCKET}/side/more.txt")
    assert r.returncode == 1 and "model.not_there" in r.stdout + r.stderr


def test_diff_of_an_s3_copy_and_the_local_one_is_equal(run_s3, testdata):
    r = run_s3("diff", url("hf/sharded"), testdata / "hf/sharded")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 differ" in r.stdout


def test_missing_bucket_and_missing_key_exit_3_naming_them(run_s3):
    r = run_s3("inspect", "s3://no-such-bucket/ckpt")
    assert r.returncode == 3
    assert "s3://no-such-bucket" in r.stderr and "bucket does not exist" in r.stderr
    r = run_s3("inspect", f"s3://{BUCKET}/testdata/not/there")
    assert r.returncode == 3
    assert f"s3://{BUCKET}/testdata/not/there" in r.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_connections_are_a_clear_error(run_s3):
    r = run_s3("inspect", url("hf/sharded"), endpoint=f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 3
    assert "Couldn't connect" in r.stderr and "tries" in r.stderr
    assert r.seconds < 60


def test_an_endpoint_that_never_answers_fails_within_a_minute(run_s3):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel accepts; nobody ever answers
    try:
        r = run_s3("inspect", url("hf/sharded"), endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=120)
    finally:
        silent.close()
    assert r.returncode == 3, r.stderr
    assert "tries" in r.stderr
    assert r.seconds < 60


def forward(handler: http.server.BaseHTTPRequestHandler, upstream: str, body: bytes) -> bytes:
    """Sends the handler's request to `upstream` (host:port) and its answer
    back to the client; returns the answer's body."""
    conn = http.client.HTTPConnection(upstream, timeout=30)
    conn.request(handler.command, handler.path, body=body, headers=dict(handler.headers))
    resp = conn.getresponse()
    data = resp.read()
    handler.send_response(resp.status)
    for k, v in resp.getheaders():
        if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
            handler.send_header(k, v)
    # A HEAD's Content-Length is the object's size, sent without the object.
    handler.send_header("Content-Length", resp.getheader("Content-Length", "0") if handler.command == "HEAD"
                        else str(len(data)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(data)
    conn.close()
    return data


class FaultyProxy(http.server.ThreadingHTTPServer):
    """Forwards to moto; answers every third request with 503 SlowDown and
    drops every fifth connection without a response, counting requests."""

    def __init__(self, upstream: str, faults: bool = True):
        self.upstream = upstream.split("//")[1]
        self.inject = faults
        self.got_bytes = 0  # bytes of GET responses passed on
        self.get_sizes: list[int] = []  # each GET response's size, in order
        self.gets_at_once = 0  # GETs being answered now, and the most at any moment
        self.most_gets_at_once = 0
        self.large_gets_at_once = 0  # the same for ranges over 256 KiB (chunks, not the block cache's reads)
        self.most_large_gets_at_once = 0
        self.count = 0
        self.faults = {"slowdown": 0, "dropped": 0}
        self.by_method: dict[str, int] = {}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), ProxyHandler)


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def handle_one(self):
        srv: FaultyProxy = self.server
        with srv.lock:
            srv.count += 1
            n = srv.count
            srv.by_method[self.command] = srv.by_method.get(self.command, 0) + 1
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if srv.inject and n % 5 == 0:
            srv.faults["dropped"] += 1
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if srv.inject and n % 3 == 0:
            srv.faults["slowdown"] += 1
            xml = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(xml)
            return
        ranged = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        large = self.command == "GET" and ranged is not None and int(ranged[2]) - int(ranged[1]) + 1 > 256 << 10
        if self.command == "GET":
            with srv.lock:
                srv.gets_at_once += 1
                srv.most_gets_at_once = max(srv.most_gets_at_once, srv.gets_at_once)
                srv.large_gets_at_once += large
                srv.most_large_gets_at_once = max(srv.most_large_gets_at_once, srv.large_gets_at_once)
        try:
            data = forward(self, srv.upstream, body)
        finally:
            if self.command == "GET":
                with srv.lock:
                    srv.gets_at_once -= 1
                    srv.large_gets_at_once -= large
        if self.command == "GET":
            with srv.lock:
                srv.got_bytes += len(data)
                srv.get_sizes.append(len(data))

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_one


def test_throttling_and_dropped_connections_are_retried(run_s3, moto, testdata, tmp_path):
    proxy = FaultyProxy(moto)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{proxy.server_address[1]}"
        r = run_s3("consolidate", url("dcp/fsdp2_adamw_ws2"), "-o", tmp_path / "r.safetensors", "-q",
                   endpoint=endpoint)
    finally:
        proxy.shutdown()
    assert r.returncode == 0, r.stderr
    assert proxy.faults["slowdown"] > 0 and proxy.faults["dropped"] > 0
    local = run_s3("consolidate", testdata / "dcp/fsdp2_adamw_ws2", "-o", tmp_path / "l.safetensors", "-q")
    assert local.returncode == 0
    assert (tmp_path / "r.safetensors").read_bytes() == (tmp_path / "l.safetensors").read_bytes()


class ThrottlingHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request with 503 SlowDown, counting them."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def throttle(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.server.lock:
            self.server.count += 1
        xml = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Length", str(len(xml)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    do_GET = do_HEAD = throttle


def test_retries_are_bounded_and_then_a_clear_error(run_s3):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ThrottlingHandler)
    server.count, server.lock = 0, threading.Lock()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = run_s3("inspect", url("hf/sharded"), endpoint=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert r.returncode == 3
    assert "HTTP 503" in r.stderr and "after 5 tries" in r.stderr
    assert server.count == 5  # the first try and four retries, then the error
    assert r.seconds < 60


class CaptureHandler(http.server.BaseHTTPRequestHandler):
    """Records each request and answers as S3 does for a missing bucket."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def capture(self):
        self.server.requests.append((self.command, self.path, dict(self.headers)))
        xml = b"<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>"
        self.send_response(404)
        self.send_header("Content-Length", str(len(xml)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    do_GET = do_HEAD = capture


def test_requests_carry_the_sigv4_signature_botocore_computes(run_s3):
    """moto does not check signatures; AWS does. Each request's Authorization
    header must be the one botocore's S3 signer computes for the same
    request (method, encoded key, sorted query, the headers it signed,
    x-amz-date, the payload hash) with the same credentials."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CaptureHandler)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        r = run_s3("inspect", f"s3://{BUCKET}/dir/a key+x (1)/model.pt", endpoint=endpoint,
                   env={"AWS_REGION": "eu-west-3"})
    finally:
        server.shutdown()
    assert r.returncode == 3 and "bucket does not exist" in r.stderr
    methods = [m for m, _, _ in server.requests]
    assert "HEAD" in methods and "GET" in methods  # the object, then the listing of its prefix
    creds = Credentials(KEY_ID, SECRET, "tok-NEVER-PRINTED")
    for method, path, headers in server.requests:
        auth = headers["Authorization"]
        assert auth.startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")
        assert "/eu-west-3/s3/aws4_request" in auth
        signed = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
        assert "x-amz-security-token" in signed and "x-amz-content-sha256" in signed
        lower = {k.lower(): v for k, v in headers.items()}
        request = AWSRequest(method=method, url=endpoint + path, headers={h: lower[h] for h in signed})
        signer = S3SigV4Auth(creds, "s3", "eu-west-3")
        request.context["timestamp"] = lower["x-amz-date"]
        canonical = signer.canonical_request(request)
        expected = signer.signature(signer.string_to_sign(request, canonical), request)
        assert auth.endswith("Signature=" + expected), (method, path, canonical)


def test_an_hdf5_object_is_refused_by_name_as_libhdf5_needs_a_local_file(run_s3, moto, testdata, tmp_path):
    made = run_s3("consolidate", testdata / "hf/sharded", "-o", tmp_path / "model.h5", "-q")
    assert made.returncode == 0, made.stderr
    boto3.client("s3", endpoint_url=moto, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                 region_name="us-east-1").upload_file(str(tmp_path / "model.h5"), BUCKET, "h5/model.h5")
    r = run_s3("inspect", f"s3://{BUCKET}/h5/model.h5")
    assert r.returncode == 3
    assert f"s3://{BUCKET}/h5/model.h5" in r.stderr and "needs a local file" in r.stderr


def test_config_from_an_s3_folder_copies_what_the_local_folder_gives(run_s3, testdata, tmp_path):
    remote = run_s3("consolidate", url("dcp/fsdp2_adamw_ws2"), "--config-from", url("hf/sharded"),
                    "-o", f"{tmp_path}/r/", "--format", "safetensors", "-q")
    local = run_s3("consolidate", testdata / "dcp/fsdp2_adamw_ws2", "--config-from", testdata / "hf/sharded",
                   "-o", f"{tmp_path}/l/", "--format", "safetensors", "-q")
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    names = sorted(p.name for p in (tmp_path / "l").iterdir())
    assert "config.json" in names and "tokenizer_config.json" in names
    assert names == sorted(p.name for p in (tmp_path / "r").iterdir())
    for n in names:
        assert (tmp_path / "r" / n).read_bytes() == (tmp_path / "l" / n).read_bytes(), n


def test_param_layout_from_s3_unflattens_as_the_local_file_does(run_s3, testdata, tmp_path):
    remote = run_s3("consolidate", url(FLAT), "--param-layout", url(FLAT) + "/layout.pt", "-o", tmp_path / "r.pt", "-q")
    local = run_s3("consolidate", testdata / FLAT, "--param-layout", testdata / FLAT / "layout.pt",
                   "-o", tmp_path / "l.pt", "-q")
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    assert (tmp_path / "r.pt").read_bytes() == (tmp_path / "l.pt").read_bytes()


def test_ctrl_c_stops_a_request_to_a_silent_endpoint_at_once(ckptconv, moto):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        p = subprocess.Popen([str(ckptconv), "inspect", url("hf/sharded")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=s3_env(f"http://127.0.0.1:{silent.getsockname()[1]}"))
        time.sleep(1.5)  # inside the first request, which waits for an answer that never comes
        p.send_signal(2)
        started = time.monotonic()
        _, err = p.communicate(timeout=30)
        stopped = time.monotonic() - started
    finally:
        silent.close()
    assert p.returncode == 130, err
    assert stopped < 3, f"took {stopped:.1f} s to stop"
    assert "SIGINT" in err


def test_part_workers_reading_s3_write_the_one_process_bytes(run_s3, testdata, tmp_path):
    for i in range(3):
        r = run_s3("consolidate", url("dcp/fsdp2_adamw_ws2"), "-o", tmp_path / "parted.safetensors", "--part",
                   f"{i}/3", "-q")
        assert r.returncode == 0, r.stderr
    whole = run_s3("consolidate", testdata / "dcp/fsdp2_adamw_ws2", "-o", tmp_path / "whole.safetensors", "-q")
    assert whole.returncode == 0
    assert (tmp_path / "parted.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()


class DenyingHandler(http.server.BaseHTTPRequestHandler):
    """Answers as S3 does to keys it does not accept."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def deny(self):
        xml = (b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message>"
               b"<AWSAccessKeyId>" + KEY_ID.encode() + b"</AWSAccessKeyId></Error>")
        self.send_response(403)
        self.send_header("Content-Length", str(len(xml)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    do_GET = do_HEAD = deny


def test_access_denied_is_exit_3_saying_where_to_look(run_s3):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), DenyingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = run_s3("inspect", url("hf/sharded") + "/", endpoint=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert r.returncode == 3
    assert "access denied" in r.stderr and "AWS_ACCESS_KEY_ID, AWS_PROFILE" in r.stderr
    assert KEY_ID not in r.stderr  # S3 echoes the key id; the message leaves it out


def test_listings_past_one_page_are_followed(run_s3, moto, testdata):
    """ListObjectsV2 answers 1,000 keys a page: with 1,000 other objects
    sorted before them, a DCP checkpoint's .distcp files are on page two."""
    s3 = boto3.client("s3", endpoint_url=moto, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                      region_name="us-east-1")
    src = testdata / "dcp/fsdp2_adamw_ws2"
    for f in sorted(src.iterdir()):
        s3.upload_file(str(f), BUCKET, f"paged/{f.name}")
    for i in range(1000):
        s3.put_object(Bucket=BUCKET, Key=f"paged/0{i:04d}.txt", Body=b"")
    page = s3.list_objects_v2(Bucket=BUCKET, Prefix="paged/", Delimiter="/")
    assert page["IsTruncated"] and not any(o["Key"].endswith(".distcp") for o in page["Contents"])
    remote = run_s3("inspect", f"s3://{BUCKET}/paged")
    local = run_s3("inspect", src)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.replace(f"s3://{BUCKET}/paged", "SRC") == local.stdout.replace(str(src), "SRC")


UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def test_reshard_from_s3_writes_the_folder_of_the_local_run(run_s3, testdata, tmp_path):
    # One output path for both runs, one after the other: DCP's .metadata
    # records it (StorageMeta.checkpoint_id), and a random save_id as torch does.
    out = tmp_path / "ckpt"
    remote = run_s3("reshard", url("dcp/fsdp2_adamw_ws2"), "-o", out, "--world-size", "4", "-q")
    assert remote.returncode == 0, remote.stderr
    got = {p.name: p.read_bytes() for p in out.iterdir()}
    shutil.rmtree(out)
    local = run_s3("reshard", testdata / "dcp/fsdp2_adamw_ws2", "-o", out, "--world-size", "4", "-q")
    assert local.returncode == 0, local.stderr
    want = {p.name: p.read_bytes() for p in out.iterdir()}
    assert ".metadata" in want and len(want) >= 5 and sorted(got) == sorted(want)
    assert len(UUID.findall(want[".metadata"])) == 1  # the save_id, the one byte string that may differ
    for name in want:
        assert UUID.sub(b"UUID", got[name]) == UUID.sub(b"UUID", want[name]), name


def test_a_checked_copy_reads_each_source_byte_once(run_s3, moto, tmp_path):
    """consolidate checks every source record's CRC-32 (unless --no-verify).
    From a local file the kernel copies the bytes and a check reads them from
    the page cache; from an object store both would be GETs, so the copy
    sums the CRC-32 as it reads: the bytes fetched are the object's size plus
    the headers' blocks (they were twice it). A corrupt record is still exit 3."""
    import torch
    g = torch.Generator().manual_seed(53)
    src = tmp_path / "four.pt"
    torch.save({f"w{i}": torch.randn(512, 1024, generator=g) for i in range(4)}, src)  # 8 MiB of records
    client = boto3.client("s3", endpoint_url=moto, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                          region_name="us-east-1")
    client.upload_file(str(src), BUCKET, "reads/four.pt")
    proxy = FaultyProxy(moto, faults=False)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{proxy.server_address[1]}"
        r = run_s3("consolidate", f"s3://{BUCKET}/reads/four.pt", "-o", tmp_path / "r.safetensors", "-q",
                   endpoint=endpoint)
        assert r.returncode == 0, r.stderr
        fetched = proxy.got_bytes
        raw = bytearray(src.read_bytes())
        at = raw.find(torch.randn(512, 1024, generator=torch.Generator().manual_seed(53)).numpy().tobytes()[:64])
        assert at > 0
        raw[at + 4096] ^= 0x40  # one bit of w0's record
        client.put_object(Bucket=BUCKET, Key="reads/bad.pt", Body=bytes(raw))
        bad = run_s3("consolidate", f"s3://{BUCKET}/reads/bad.pt", "-o", tmp_path / "b.safetensors", "-q",
                     endpoint=endpoint)
    finally:
        proxy.shutdown()
    size = src.stat().st_size
    # Beyond the records: the zip's headers and directory, read through the
    # 256 KiB block cache (about 1.5 MiB here, whatever the tensors' size).
    assert size <= fetched <= size + (2 << 20), (fetched, size)
    local = run_s3("consolidate", src, "-o", tmp_path / "l.safetensors", "-q")
    assert local.returncode == 0
    assert (tmp_path / "r.safetensors").read_bytes() == (tmp_path / "l.safetensors").read_bytes()
    assert bad.returncode == 3 and "fails its CRC-32" in bad.stderr and "'w0'" in bad.stderr, bad.stderr
    assert not (tmp_path / "b.safetensors").exists()


def test_a_sequential_read_goes_ahead_in_chunks_with_a_bounded_number_in_flight(run_s3, moto, tmp_path):
    """A copy reads a tensor's bytes in 4 MiB steps; from an object store
    each step was a GET, waited for. An object read front to back now gets
    GETs of 8 MiB (the default --memory-limit's read-ahead: 256M / 4 / 8)
    fetched ahead of the reader, two per object at most, and bytes it
    skips are not fetched: 32 MiB of records cost the first 4 MiB step and
    then 8 MiB chunks, and each byte once. A smaller --memory-limit gives
    smaller chunks. A stream holds two chunks ahead only while they are at
    most an eighth of its object (#56: the read-ahead scales with the
    checkpoint): this 32 MiB object gets one 8 MiB chunk ahead at 256M (one
    large GET at a time), two 2 MiB chunks at 64M. The output is the local
    run's."""
    import torch
    g = torch.Generator().manual_seed(5301)
    src = tmp_path / "big.pt"
    torch.save({f"w{i}": torch.randn(2048, 1024, generator=g) for i in range(4)}, src)  # 4 records of 8 MiB
    client = boto3.client("s3", endpoint_url=moto, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                          region_name="us-east-1")
    client.upload_file(str(src), BUCKET, "reads/big.pt")
    local = run_s3("consolidate", src, "-o", tmp_path / "l.safetensors", "-q")
    assert local.returncode == 0, local.stderr
    size = src.stat().st_size
    for limit, chunk, ahead in (("256M", 8 << 20, 1), ("64M", 2 << 20, 2)):
        proxy = FaultyProxy(moto, faults=False)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            r = run_s3("consolidate", f"s3://{BUCKET}/reads/big.pt", "-o", tmp_path / f"r{limit}.safetensors", "-q",
                       "--force", "--memory-limit", limit, endpoint=f"http://127.0.0.1:{proxy.server_address[1]}")
        finally:
            proxy.shutdown()
        assert r.returncode == 0, r.stderr
        assert (tmp_path / f"r{limit}.safetensors").read_bytes() == (tmp_path / "l.safetensors").read_bytes()
        data_gets = [n for n in proxy.get_sizes if n > 256 << 10]  # the block cache's GETs are 256 KiB
        assert max(data_gets[1:]) == chunk, (limit, proxy.get_sizes)  # after the first step: chunks
        assert len(data_gets) <= 2 + (32 << 20) // chunk, (limit, proxy.get_sizes)
        assert proxy.most_gets_at_once <= ahead + 1, (limit, proxy.most_gets_at_once)  # chunks ahead, a block read
        # chunks ahead, and the reader's own first step (4 MiB, larger than a 2 MiB chunk) when it is still in
        # flight as they start (under load it is: 3 of 4 runs at 64M here)
        assert proxy.most_large_gets_at_once <= ahead + 1, (limit, proxy.most_large_gets_at_once)
        assert size <= proxy.got_bytes <= size + (2 << 20), (proxy.got_bytes, size)


def test_read_ahead_is_part_of_the_memory_limit(ckptconv, moto, tmp_path):
    """An s3:// source's read-ahead (a quarter of --memory-limit) is taken
    out of the budget the copy's slabs share, not added to it (before, slabs
    had the whole limit and the read-ahead came on top: up to 1.25 times
    it): with a cast gathering slabs from four objects, the peak RSS above
    the same process reading only the structure (inspect: code, libraries,
    the range cache) stays within the limit. Two threads gather the halves
    of each slab, each through its own stream; the chunks one stream
    fetched and the other read are dropped when the copy releases the
    slab's rows, so the budget is not held by stale chunks and the reads
    stay in chunks (they fell back to a 256 KiB GET each, up to 300 here)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    src = tmp_path / "four"
    sd = {f"w{i}": torch.arange(32 << 18, dtype=torch.float32).reshape(-1, 1024) + i for i in range(4)}  # 4 x 32 MiB
    # Four files, as four ranks' would be: a stream (and its chunks ahead) per file.
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(src), thread_count=4), no_dist=True)
    client = boto3.client("s3", endpoint_url=moto, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                          region_name="us-east-1")
    for f in sorted(src.iterdir()):
        client.upload_file(str(f), BUCKET, f"budget/{f.name}")

    def peak_mb(*args, endpoint=moto) -> float:
        r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", str(ckptconv), *map(str, args)],
                           capture_output=True, text=True, env=s3_env(endpoint), timeout=600)
        assert r.returncode == 0, r.stderr
        return int(r.stderr.rsplit("maxrss_kb=", 1)[1].split()[0]) / 1024

    structure = peak_mb("inspect", f"s3://{BUCKET}/budget")
    out = tmp_path / "bf16.safetensors"
    limit = 64
    proxy = FaultyProxy(moto, faults=False)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        copy = peak_mb("consolidate", f"s3://{BUCKET}/budget", "-o", out, "--dtype", "bf16", "--memory-limit",
                       f"{limit}M", "-q", endpoint=f"http://127.0.0.1:{proxy.server_address[1]}")
    finally:
        proxy.shutdown()
    got = load_file(out)
    assert all(torch.equal(got[k], v.bfloat16()) for k, v in sd.items())
    assert copy - structure <= limit, (copy, structure)
    # 128 MiB in 2 MiB chunks (64M / 4 / 8) is 64 GETs; the small ones are the
    # metadata, each item's two header ranges and each stream's first read.
    small = [n for n in proxy.get_sizes if n <= 256 << 10]
    assert len(small) <= 48, proxy.get_sizes
