"""Keys that are fetched, not written down: a role assumed with a source
profile's keys (STS AssumeRole, served by the test), a profile's
credential_process, a web identity token exchanged with STS (EKS IRSA,
moto's STS), the ECS/EKS container endpoint and the EC2 instance metadata
service (IMDSv2).

The S3 requests go to a server that records them (answering as S3 does for
a missing bucket); each must carry the fetched keys: the Authorization
header's Credential, the x-amz-security-token, and the signature botocore's
signer computes with those keys. The container and instance-metadata
endpoints are served by the test; botocore's own providers read the same
endpoints and must get the same keys, so the protocol is the one AWS's
SDKs speak."""
from __future__ import annotations

import datetime
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import moto.server as moto_server
import pytest

BUCKET = "ckpts"
KEYS = {
    "imds": ("ASIAIMDSNEVERPRINTED", "imds-s3cr3t-NEVER-PRINTED", "imds-tok-NEVER-PRINTED"),
    "container": ("ASIACONTNEVERPRINTED", "cont-s3cr3t-NEVER-PRINTED", "cont-tok-NEVER-PRINTED"),
    "process": ("ASIAPROCNEVERPRINTED", "proc-s3cr3t-NEVER-PRINTED", "proc-tok-NEVER-PRINTED"),
    "base": ("AKIABASENEVERPRINTED", "base-s3cr3t-NEVER-PRINTED", ""),
    "sso": ("ASIASSOXNEVERPRINTED", "sso-s3cr3t-NEVER-PRINTED", "sso-tok-NEVER-PRINTED"),
    # what STS gives for each role (the key is the role's, so a request says which it was signed with)
    "arn:aws:iam::123456789012:role/hop": ("ASIAHOPXNEVERPRINTED", "hop-s3cr3t-NEVER-PRINTED", "hop-tok-NEVER-PRINTED"),
    "arn:aws:iam::123456789012:role/ml": ("ASIAROLENEVERPRINTED", "role-s3cr3t-NEVER-PRINTED", "role-tok-NEVER-PRINTED"),
}
IMDS_TOKEN = "imds-session-7"
SSO_TOKEN = "sso-bearer-NEVER-PRINTED"
# What the test's SSO-OIDC CreateToken gives for the refresh token `aws sso login` cached.
SSO_REFRESH = "sso-refresh-NEVER-PRINTED"
SSO_REFRESHED = {"accessToken": "sso-bearer-2-NEVER-PRINTED", "tokenType": "Bearer", "expiresIn": 28800,
                 "refreshToken": "sso-refresh-2-NEVER-PRINTED"}
SSO_CLIENT = {"clientId": "client-77", "clientSecret": "client-s3cr3t-NEVER-PRINTED"}
CONTAINER_AUTH = "Bearer pod-identity-42"


def expiry(minutes: float) -> str:
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=minutes)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def creds_json(kind: str, minutes: float) -> bytes:
    key, secret, token = KEYS[kind]
    return json.dumps({"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": key, "SecretAccessKey": secret,
                       "Token": token, "Expiration": expiry(minutes)}).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_one(self):
        srv = self.server
        role_path = "/latest/meta-data/iam/security-credentials/"
        if self.path == "/latest/api/token" and self.command == "PUT":
            srv.fetches["imds-token"] += 1
            ok = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            return self.answer(200 if ok else 400, IMDS_TOKEN.encode())
        if self.path.startswith(role_path):
            if self.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
                return self.answer(401, b"")
            if self.path == role_path:
                return self.answer(200, b"ml-role")
            srv.fetches["imds"] += 1
            return self.answer(200, creds_json("imds", srv.minutes))
        if self.path == "/container-creds":
            if self.headers.get("Authorization") != CONTAINER_AUTH:
                return self.answer(403, b"")
            srv.fetches["container"] += 1
            return self.answer(200, creds_json("container", srv.minutes))
        if self.command == "POST" and self.path == "/":
            return self.assume_role()
        if self.path.startswith("/federation/credentials?"):
            return self.sso_role_credentials()
        if self.command == "POST" and self.path == "/token":
            return self.sso_oidc_create_token()
        srv.requests.append((self.command, self.path, dict(self.headers)))
        self.answer(404, b"<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message>"
                         b"</Error>")

    def assume_role(self):
        """STS AssumeRole as AWS answers it, after checking that the request
        is signed (botocore's SigV4 for service sts) with the keys of the
        role's source: the base profile's, or the role it is chained from."""
        from urllib.parse import parse_qs

        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        srv = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        lower = {k.lower(): v for k, v in self.headers.items()}
        auth = lower.get("authorization", "")
        key = auth.split("Credential=")[1].split("/")[0] if "Credential=" in auth else ""
        signer_keys = next((v for v in KEYS.values() if v[0] == key), None)
        ok = signer_keys is not None and auth.split("Credential=")[1].split("/")[3] == "sts"
        if ok:
            signed = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
            request = AWSRequest(method="POST", url=srv.endpoint + "/", data=body,
                                 headers={h: lower[h] for h in signed})
            request.context["timestamp"] = lower["x-amz-date"]
            signer = SigV4Auth(Credentials(*signer_keys), "sts", "eu-west-3")
            expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
            ok = auth.endswith("Signature=" + expected) and lower.get("x-amz-security-token", "") == signer_keys[2]
        srv.sts.append((form, key, ok))
        if not ok or form.get("Action") != "AssumeRole" or form.get("RoleArn") not in KEYS:
            return self.answer(403, b"<ErrorResponse><Error><Code>SignatureDoesNotMatch</Code><Message>The request "
                                    b"signature we calculated does not match</Message></Error></ErrorResponse>")
        k, secret, token = KEYS[form["RoleArn"]]
        self.answer(200, (f"<AssumeRoleResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><AssumeRoleResult>"
                          f"<Credentials><AccessKeyId>{k}</AccessKeyId><SecretAccessKey>{secret}</SecretAccessKey>"
                          f"<SessionToken>{token}</SessionToken><Expiration>{expiry(srv.minutes)}</Expiration>"
                          f"</Credentials></AssumeRoleResult></AssumeRoleResponse>").encode())

    def sso_role_credentials(self):
        """The SSO portal's GetRoleCredentials: the bearer token from `aws
        sso login`'s cache, the account and role in the query."""
        from urllib.parse import parse_qs, urlsplit

        srv = self.server
        query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
        srv.sso.append(query)
        srv.bearers.append(self.headers.get("x-amz-sso_bearer_token"))
        if self.headers.get("x-amz-sso_bearer_token") not in (SSO_TOKEN, SSO_REFRESHED["accessToken"]):
            return self.answer(401, b'{"message":"Session token not found or invalid"}')
        if query != {"account_id": "123456789012", "role_name": "Trainer"}:
            return self.answer(403, b'{"message":"No access"}')
        key, secret, token = KEYS["sso"]
        ms = int((datetime.datetime.now(datetime.timezone.utc).timestamp() + srv.minutes * 60) * 1000)
        self.answer(200, json.dumps({"roleCredentials": {"accessKeyId": key, "secretAccessKey": secret,
                                                         "sessionToken": token, "expiration": ms}}).encode())

    def sso_oidc_create_token(self):
        """SSO-OIDC's CreateToken (a JSON body, unsigned), as AWS answers a
        refresh_token grant; an unknown refresh token is invalid_grant."""
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        srv.oidc.append(body)
        ok = body.get("refreshToken") == SSO_REFRESH and body.get("grantType") == "refresh_token" and \
            {k: body.get(k) for k in SSO_CLIENT} == SSO_CLIENT and not srv.oidc_refuses
        if not ok:
            self.send_response(400)
            body = b'{"error":"invalid_grant","error_description":"Invalid refresh token provided"}'
            self.send_header("x-amzn-ErrorType", "InvalidGrantException")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return self.wfile.write(body)
        self.answer(200, json.dumps(srv.oidc_answer).encode())

    do_GET = do_HEAD = do_PUT = do_POST = handle_one


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.requests = []
    srv.fetches = {"imds-token": 0, "imds": 0, "container": 0}
    srv.sts = []
    srv.sso = []
    srv.bearers = []
    srv.oidc = []
    srv.oidc_refuses = False
    srv.oidc_answer = SSO_REFRESHED
    srv.minutes = 360
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.endpoint = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()


def bare_env(endpoint: str, tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_REGION="eu-west-3", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_SERVICE_ENDPOINT="http://127.0.0.1:9")
    env.update(extra)
    return env


def run(ckptconv, env, *args):
    r = subprocess.run([str(ckptconv), *map(str, args)], capture_output=True, text=True, env=env, timeout=120)
    for kind in KEYS.values():
        for secret in kind[1:]:
            assert not secret or secret not in r.stdout + r.stderr, "a credential was printed"
    return r


def assert_signed_with(srv, key: str, secret: str | None, token: str):
    """Every S3 request carries `key`'s Credential and `token`; with the
    secret known, its signature is the one botocore computes."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    assert srv.requests, "no S3 request was sent"
    for method, path, headers in srv.requests:
        auth = headers.get("Authorization", "")
        assert auth.startswith(f"AWS4-HMAC-SHA256 Credential={key}/"), (method, path, auth[:60])
        lower = {k.lower(): v for k, v in headers.items()}
        assert lower["x-amz-security-token"] == token
        if secret is None:
            continue
        signed = auth.split("SignedHeaders=")[1].split(",")[0].split(";")
        request = AWSRequest(method=method, url=srv.endpoint + path, headers={h: lower[h] for h in signed})
        signer = S3SigV4Auth(Credentials(key, secret, token), "s3", "eu-west-3")
        request.context["timestamp"] = lower["x-amz-date"]
        expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
        assert auth.endswith("Signature=" + expected)


def test_instance_metadata_keys_sign_requests_as_botocore_reads_them(ckptconv, server, tmp_path):
    from botocore.utils import InstanceMetadataFetcher

    got = InstanceMetadataFetcher(timeout=2, num_attempts=1, base_url=server.endpoint).retrieve_iam_role_credentials()
    assert (got["access_key"], got["secret_key"], got["token"]) == KEYS["imds"]
    server.fetches["imds"] = 0
    env = bare_env(server.endpoint, tmp_path, AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert_signed_with(server, *KEYS["imds"])
    assert server.fetches["imds"] == 1  # six hours left: fetched once for every request


def test_keys_about_to_expire_are_fetched_again(ckptconv, server, tmp_path):
    """Keys within five minutes of their expiry are fetched again before the
    next request: a run longer than their lifetime keeps signing."""
    server.minutes = 2
    env = bare_env(server.endpoint, tmp_path, AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
    run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert len(server.requests) >= 2
    assert server.fetches["imds"] == len(server.requests)
    assert_signed_with(server, *KEYS["imds"])


def test_container_endpoint_keys_sign_requests_as_botocore_reads_them(ckptconv, server, tmp_path):
    from botocore.credentials import ContainerProvider

    token_file = tmp_path / "token"
    token_file.write_text(CONTAINER_AUTH)
    container_env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": server.endpoint + "/container-creds",
                     "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token_file)}
    got = ContainerProvider(environ=container_env).load().get_frozen_credentials()
    assert (got.access_key, got.secret_key, got.token) == KEYS["container"]
    # The container endpoint comes before the instance metadata service.
    env = bare_env(server.endpoint, tmp_path, AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint, **container_env)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert_signed_with(server, *KEYS["container"])
    assert server.fetches["imds-token"] == 0


def write_process_profile(tmp_path: Path, exit_code: int = 0) -> Path:
    script = tmp_path / "creds helper.py"
    key, secret, token = KEYS["process"]
    script.write_text(
        "import json, sys\n"
        f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        f"print(json.dumps({{'Version': 1, 'AccessKeyId': {key!r}, 'SecretAccessKey': {secret!r},"
        f" 'SessionToken': {token!r}, 'Expiration': {expiry(60)!r}}}))\n"
        f"sys.exit({exit_code})\n")
    config = tmp_path / "config"
    config.write_text(f"[profile ml]\nregion = eu-west-3\n"
                      f"credential_process = {sys.executable} '{script}' \"two words\" plain\\ escaped\n")
    return config


def test_credential_process_runs_without_a_shell_as_botocore_splits_it(ckptconv, server, tmp_path):
    import shlex

    config = write_process_profile(tmp_path)
    line = config.read_text().split("credential_process = ")[1].strip()
    env = bare_env(server.endpoint, tmp_path, AWS_CONFIG_FILE=str(config), AWS_PROFILE="ml",
                   AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert json.loads((tmp_path / "argv.json").read_text()) == shlex.split(line)[2:] == ["two words", "plain escaped"]
    assert_signed_with(server, *KEYS["process"])
    assert server.fetches["imds-token"] == 0  # the profile's process comes first


def test_a_failing_credential_process_is_an_error_naming_the_profile(ckptconv, server, tmp_path):
    config = write_process_profile(tmp_path, exit_code=2)
    env = bare_env(server.endpoint, tmp_path, AWS_CONFIG_FILE=str(config), AWS_PROFILE="ml")
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3, r.stderr
    assert "the credential_process of profile 'ml'" in r.stderr and "exit 2" in r.stderr
    assert server.requests == []  # nothing sent unsigned instead


def test_web_identity_keys_come_from_sts(ckptconv, server, tmp_path):
    """EKS IRSA: AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, exchanged with
    STS's AssumeRoleWithWebIdentity (moto's STS) for temporary keys."""
    sts = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    sts.start()
    try:
        host, port = sts.get_host_and_port()
        token = tmp_path / "token"
        token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
        env = bare_env(server.endpoint, tmp_path, AWS_WEB_IDENTITY_TOKEN_FILE=str(token),
                       AWS_ROLE_ARN="arn:aws:iam::123456789012:role/ml", AWS_ENDPOINT_URL_STS=f"http://{host}:{port}",
                       AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
        r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    finally:
        sts.stop()
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    auth = server.requests[0][2]["Authorization"]
    key = auth.split("Credential=")[1].split("/")[0]
    token_sent = {k.lower(): v for k, v in server.requests[0][2].items()}["x-amz-security-token"]
    assert key.startswith("ASIA") and len(token_sent) > 20
    assert_signed_with(server, key, None, token_sent)
    assert server.fetches["imds-token"] == 0


def test_no_keys_anywhere_sends_unsigned_requests(ckptconv, server, tmp_path):
    env = bare_env(server.endpoint, tmp_path, AWS_EC2_METADATA_DISABLED="true",
                   AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert server.fetches["imds-token"] == 0
    assert server.requests and all("Authorization" not in h for _, _, h in server.requests)
    # Not on EC2 (no service at the address): unsigned too, at once.
    env = bare_env(server.endpoint, tmp_path)
    server.requests.clear()
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert server.requests and all("Authorization" not in h for _, _, h in server.requests)


def write_role_profiles(tmp_path: Path, ml: str, extra: str = "") -> tuple[Path, Path]:
    config, credentials = tmp_path / "config", tmp_path / "credentials"
    config.write_text(f"[profile ml]\nregion = eu-west-3\n{ml}\n"
                      "[profile hop]\nrole_arn = arn:aws:iam::123456789012:role/hop\nsource_profile = base\n" + extra)
    key, secret, _ = KEYS["base"]
    credentials.write_text(f"[base]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
    return config, credentials


def test_a_role_assumed_with_a_source_profile_signs_as_botocore_assumes_it(ckptconv, server, tmp_path):
    """role_arn with source_profile: STS AssumeRole signed with the source
    profile's keys (checked by the server as botocore's signer computes it),
    with the profile's session name, external id and duration; the S3
    requests are signed with the role's keys. botocore's own provider, given
    the same files and the same STS, sends the same form and gets the same keys."""
    import botocore.session

    config, credentials = write_role_profiles(
        tmp_path, "role_arn = arn:aws:iam::123456789012:role/ml\nsource_profile = base\n"
                  "role_session_name = job-7\nexternal_id = ext-42\nduration_seconds = 900")
    env = bare_env(server.endpoint, tmp_path, AWS_CONFIG_FILE=str(config), AWS_SHARED_CREDENTIALS_FILE=str(credentials),
                   AWS_PROFILE="ml", AWS_ENDPOINT_URL_STS=server.endpoint,
                   AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert_signed_with(server, *KEYS["arn:aws:iam::123456789012:role/ml"])
    assert len(server.sts) == 1 and server.sts[0][1:] == (KEYS["base"][0], True), server.sts
    ours = server.sts[0][0]
    assert ours == {"Action": "AssumeRole", "Version": "2011-06-15", "RoleArn": "arn:aws:iam::123456789012:role/ml",
                    "RoleSessionName": "job-7", "ExternalId": "ext-42", "DurationSeconds": "900"}
    assert server.fetches["imds-token"] == 0

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        got = botocore.session.Session().get_credentials().get_frozen_credentials()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert (got.access_key, got.secret_key, got.token) == KEYS["arn:aws:iam::123456789012:role/ml"]
    assert server.sts[-1][1:] == (KEYS["base"][0], True) and server.sts[-1][0] == ours


def test_a_chain_of_roles_signs_each_step_with_the_previous_role(ckptconv, server, tmp_path):
    """ml's source_profile is hop, itself a role assumed with base's keys:
    the second AssumeRole is signed with hop's temporary keys and token."""
    config, credentials = write_role_profiles(
        tmp_path, "role_arn = arn:aws:iam::123456789012:role/ml\nsource_profile = hop")
    env = bare_env(server.endpoint, tmp_path, AWS_CONFIG_FILE=str(config), AWS_SHARED_CREDENTIALS_FILE=str(credentials),
                   AWS_PROFILE="ml", AWS_ENDPOINT_URL_STS=server.endpoint)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert [(f["RoleArn"], key, ok) for f, key, ok in server.sts] == [
        ("arn:aws:iam::123456789012:role/hop", KEYS["base"][0], True),
        ("arn:aws:iam::123456789012:role/ml", KEYS["arn:aws:iam::123456789012:role/hop"][0], True)]
    assert_signed_with(server, *KEYS["arn:aws:iam::123456789012:role/ml"])


@pytest.mark.parametrize("ml,extra,says", [
    ("role_arn = arn:aws:iam::123456789012:role/ml\nsource_profile = loop", 
     "[profile loop]\nrole_arn = arn:aws:iam::123456789012:role/hop\nsource_profile = ml\n", "loops back to 'ml'"),
    ("role_arn = arn:aws:iam::123456789012:role/ml\nsource_profile = base\ncredential_source = Environment", "",
     "both source_profile and credential_source"),
    ("role_arn = arn:aws:iam::123456789012:role/ml", "", "neither source_profile nor credential_source"),
    ("role_arn = arn:aws:iam::123456789012:role/ml\nsource_profile = nobody", "", "'nobody' of profile 'ml' does not exist"),
    ("role_arn = arn:aws:iam::123456789012:role/ml\nsource_profile = base\nmfa_serial = arn:aws:iam::1:mfa/me", "",
     "MFA"),
    ("role_arn = arn:aws:iam::123456789012:role/ml\ncredential_source = Ec2Metadata", "",
     "not one of Environment, Ec2InstanceMetadata, EcsContainer"),
])
def test_a_role_profile_that_cannot_be_assumed_is_a_usage_error_and_nothing_is_sent(ckptconv, server, tmp_path, ml,
                                                                                     extra, says):
    config, credentials = write_role_profiles(tmp_path, ml, extra)
    env = bare_env(server.endpoint, tmp_path, AWS_CONFIG_FILE=str(config), AWS_SHARED_CREDENTIALS_FILE=str(credentials),
                   AWS_PROFILE="ml", AWS_ENDPOINT_URL_STS=server.endpoint,
                   AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert server.requests == [] and server.sts == [] and server.fetches["imds-token"] == 0


def test_a_profile_named_but_missing_is_a_usage_error(ckptconv, server, tmp_path):
    config, credentials = write_role_profiles(tmp_path, "")
    env = bare_env(server.endpoint, tmp_path, AWS_CONFIG_FILE=str(config), AWS_SHARED_CREDENTIALS_FILE=str(credentials),
                   AWS_PROFILE="mll", AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 2 and "'mll'" in r.stderr, r.stderr
    assert server.requests == [] and server.fetches["imds-token"] == 0


def write_sso_profile(tmp_path: Path, legacy: bool, token_minutes: float = 480, profile_extra: str = "",
                      token_extra: dict | None = None) -> dict:
    """A profile as `aws configure sso` writes it and the token `aws sso
    login` caches (~/.aws/sso/cache/<sha1 of the session name, or of the
    start URL in the legacy form>.json)."""
    import hashlib

    start = "https://d-123.awsapps.com/start"
    config = tmp_path / "config"
    if legacy:
        config.write_text(f"[profile ml]\nsso_start_url = {start}\nsso_region = eu-west-1\n"
                          f"sso_account_id = 123456789012\nsso_role_name = Trainer\nregion = eu-west-3\n{profile_extra}")
    else:
        config.write_text("[profile ml]\nsso_session = corp\nsso_account_id = 123456789012\nsso_role_name = Trainer\n"
                          f"region = eu-west-3\n{profile_extra}\n[sso-session corp]\nsso_start_url = {start}\n"
                          "sso_region = eu-west-1\nsso_registration_scopes = sso:account:access\n")
    cache = tmp_path / "home" / ".aws" / "sso" / "cache"
    cache.mkdir(parents=True)
    name = start if legacy else "corp"
    (cache / (hashlib.sha1(name.encode()).hexdigest() + ".json")).write_text(json.dumps(
        {"startUrl": start, "region": "eu-west-1", "accessToken": SSO_TOKEN, "expiresAt": expiry(token_minutes),
         **(token_extra or {})}))
    return {"AWS_CONFIG_FILE": str(config), "AWS_PROFILE": "ml", "HOME": str(tmp_path / "home")}


def botocore_keys(env: dict) -> tuple:
    """The keys botocore's own credential chain finds with `env`, in a
    process of its own: botocore fixes the SSO token cache's folder from
    HOME when it is imported."""
    got = subprocess.run([sys.executable, "-c", "import botocore.session, json; c = botocore.session.Session()"
                          ".get_credentials().get_frozen_credentials(); print(json.dumps(list(c)))"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    return tuple(json.loads(got.stdout)[:3])  # (key, secret, token, account id)


@pytest.mark.parametrize("legacy", [False, True], ids=["sso-session", "legacy"])
def test_sso_keys_come_from_the_portal_with_the_cached_token_as_botocore_gets_them(ckptconv, server, tmp_path, legacy):
    env = bare_env(server.endpoint, tmp_path, AWS_ENDPOINT_URL_SSO=server.endpoint,
                   AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint, **write_sso_profile(tmp_path, legacy))
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert SSO_TOKEN not in r.stderr
    assert_signed_with(server, *KEYS["sso"])
    assert server.sso == [{"account_id": "123456789012", "role_name": "Trainer"}]
    assert server.fetches["imds-token"] == 0

    assert botocore_keys(env) == KEYS["sso"]
    assert len(server.sso) == 2 and server.sso[1] == server.sso[0]


def test_an_expired_sso_token_says_to_log_in_and_sends_nothing(ckptconv, server, tmp_path):
    env = bare_env(server.endpoint, tmp_path, AWS_ENDPOINT_URL_SSO=server.endpoint,
                   **write_sso_profile(tmp_path, legacy=False, token_minutes=-5))
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "aws sso login --sso-session corp" in r.stderr and "expired" in r.stderr, r.stderr
    assert server.requests == [] and server.sso == []
    assert server.oidc == []  # no refresh token cached: nothing to refresh with


def test_an_sso_profile_contradicting_its_session_is_a_usage_error(ckptconv, server, tmp_path):
    env = bare_env(server.endpoint, tmp_path, AWS_ENDPOINT_URL_SSO=server.endpoint,
                   **write_sso_profile(tmp_path, legacy=False, profile_extra="sso_region = us-east-2"))
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 2 and "sso_region is 'us-east-2' in the profile and 'eu-west-1'" in r.stderr, r.stderr
    assert server.requests == [] and server.sso == []


def refreshable(registration_minutes: float = 60 * 24 * 80) -> dict:
    """What `aws sso login` caches beside the token to refresh it with: the
    client registration and the refresh token."""
    return {"refreshToken": SSO_REFRESH, **SSO_CLIENT, "registrationExpiresAt": expiry(registration_minutes)}


def sso_cache_file(home: Path) -> Path:
    (only,) = (home / ".aws" / "sso" / "cache").iterdir()
    return only


def sso_env(server, tmp_path: Path, **profile) -> dict:
    return bare_env(server.endpoint, tmp_path, AWS_ENDPOINT_URL_SSO=server.endpoint,
                    AWS_ENDPOINT_URL_SSO_OIDC=server.endpoint, AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint,
                    **write_sso_profile(tmp_path, **profile))


def test_an_sso_token_about_to_expire_is_refreshed_as_botocore_refreshes_it(ckptconv, server, tmp_path):
    """12 minutes left (botocore refreshes within 15): ckptconv and
    botocore's own SSOTokenProvider, each given the same cache file, send the
    same CreateToken, leave the same cache file (keys, values, their order,
    the time format) and ask the portal with the new token."""
    import re
    import shutil

    env = sso_env(server, tmp_path, legacy=False, token_minutes=12, token_extra=refreshable())
    home = Path(env["HOME"])
    botocore_home = tmp_path / "botocore-home"
    shutil.copytree(home, botocore_home)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert_signed_with(server, *KEYS["sso"])
    assert botocore_keys({**env, "HOME": str(botocore_home)}) == KEYS["sso"]

    assert server.oidc[0] == {"grantType": "refresh_token", "refreshToken": SSO_REFRESH, **SSO_CLIENT}
    assert len(server.oidc) == 2 and server.oidc[1] == server.oidc[0]
    assert server.bearers == [SSO_REFRESHED["accessToken"]] * 2  # GetRoleCredentials got the new token

    ours, theirs = sso_cache_file(home), sso_cache_file(botocore_home)
    assert ours.name == theirs.name and (ours.stat().st_mode & 0o777) == (theirs.stat().st_mode & 0o777) == 0o600
    times = []
    for text in (ours.read_text(), theirs.read_text()):
        doc = json.loads(text)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["expiresAt"]), doc["expiresAt"]
        times.append(doc["expiresAt"])
        assert {k: v for k, v in doc.items() if k != "expiresAt"} == {
            "startUrl": "https://d-123.awsapps.com/start", "region": "eu-west-1",
            "accessToken": SSO_REFRESHED["accessToken"], **SSO_CLIENT,
            "registrationExpiresAt": json.loads(sso_cache_file(tmp_path / "home").read_text())["registrationExpiresAt"],
            "refreshToken": SSO_REFRESHED["refreshToken"]}
    # Byte for byte (json.dumps' layout, the keys' order) but for the time each wrote.
    assert ours.read_text().replace(times[0], "T") == theirs.read_text().replace(times[1], "T")
    parsed = [datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ") for t in times]
    assert abs((parsed[0] - parsed[1]).total_seconds()) < 60
    in_8h = datetime.datetime.utcnow() + datetime.timedelta(seconds=SSO_REFRESHED["expiresIn"])
    assert abs((parsed[0] - in_8h).total_seconds()) < 120
    assert [p.name for p in ours.parent.iterdir()] == [ours.name]  # no temporary file left behind


@pytest.mark.parametrize("profile", [
    {"legacy": True, "token_minutes": 12, "token_extra": refreshable()},  # the legacy form has no refresh
    {"legacy": False, "token_minutes": 20, "token_extra": refreshable()},  # outside botocore's 15 minutes
    {"legacy": False, "token_minutes": 12},  # nothing to refresh with
], ids=["legacy", "20-minutes-left", "no-refresh-token"])
def test_an_sso_token_is_not_refreshed_where_botocore_does_not_refresh_it(ckptconv, server, tmp_path, profile):
    env = sso_env(server, tmp_path, **profile)
    before = sso_cache_file(Path(env["HOME"])).read_text()
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert_signed_with(server, *KEYS["sso"])
    assert botocore_keys(env) == KEYS["sso"]
    assert server.oidc == [] and server.bearers == [SSO_TOKEN] * 2
    assert sso_cache_file(Path(env["HOME"])).read_text() == before


def test_a_refused_refresh_of_a_valid_sso_token_goes_on_with_it_as_botocore_does(ckptconv, server, tmp_path):
    server.oidc_refuses = True
    env = sso_env(server, tmp_path, legacy=False, token_minutes=12, token_extra=refreshable())
    before = sso_cache_file(Path(env["HOME"])).read_text()
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert "refresh" in r.stderr and "HTTP 400" in r.stderr, r.stderr  # a warning, then on with the old token
    assert_signed_with(server, *KEYS["sso"])
    assert botocore_keys(env) == KEYS["sso"]
    assert len(server.oidc) == 2 and server.bearers == [SSO_TOKEN] * 2
    assert sso_cache_file(Path(env["HOME"])).read_text() == before


@pytest.mark.parametrize("answer", [{"accessToken": "x"}, {**SSO_REFRESHED, "expiresIn": 10 ** 15}, None],
                         ids=["no-expiresIn", "expiresIn-past-ten-years", "unreachable"])
def test_a_refresh_that_gives_no_usable_token_goes_on_with_the_valid_one(ckptconv, server, tmp_path, answer):
    """AWS_ENDPOINT_URL_SSO_OIDC is where CreateToken goes (a closed port
    here: botocore stops on an unreachable endpoint, ckptconv warns as for a
    refusal); an answer without a usable expiresIn is a failed refresh."""
    env = sso_env(server, tmp_path, legacy=False, token_minutes=12, token_extra=refreshable())
    if answer is None:
        env["AWS_ENDPOINT_URL_SSO_OIDC"] = "http://127.0.0.1:9"
    before = sso_cache_file(Path(env["HOME"])).read_text()
    server.oidc_answer = answer
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert ("http://127.0.0.1:9" if answer is None else "expiresIn") in r.stderr, r.stderr
    assert len(server.oidc) == (0 if answer is None else 1) and server.bearers == [SSO_TOKEN]
    assert sso_cache_file(Path(env["HOME"])).read_text() == before


@pytest.mark.parametrize("refuses,registration_minutes,asks", [(True, 600, 1), (False, -1, 0)],
                         ids=["refused", "registration-expired"])
def test_an_expired_sso_token_that_cannot_be_refreshed_says_to_log_in(ckptconv, server, tmp_path, refuses,
                                                                       registration_minutes, asks):
    server.oidc_refuses = refuses
    env = sso_env(server, tmp_path, legacy=False, token_minutes=-5, token_extra=refreshable(registration_minutes))
    before = sso_cache_file(Path(env["HOME"])).read_text()
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "aws sso login --sso-session corp" in r.stderr and "expired" in r.stderr, r.stderr
    assert len(server.oidc) == asks and server.sso == [] and server.requests == []
    assert sso_cache_file(Path(env["HOME"])).read_text() == before


def test_an_expired_sso_token_is_refreshed(ckptconv, server, tmp_path):
    env = sso_env(server, tmp_path, legacy=False, token_minutes=-30, token_extra=refreshable())
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert_signed_with(server, *KEYS["sso"])
    assert len(server.oidc) == 1 and server.bearers == [SSO_REFRESHED["accessToken"]]
    assert json.loads(sso_cache_file(Path(env["HOME"])).read_text())["accessToken"] == SSO_REFRESHED["accessToken"]


@pytest.mark.parametrize("config,credentials", [
    ("[profile foo]\n# nothing yet\n[profile other]\nregion = eu-west-1\n", ""),
    ("", "[foo]\n"),
], ids=["config", "credentials"])
def test_an_empty_profile_exists_and_falls_through_to_the_instance_role_as_botocore(ckptconv, server, tmp_path,
                                                                                      config, credentials):
    """botocore takes a present section as the profile (no ProfileNotFound)
    and, finding nothing in it, goes on to the machine's sources."""
    (tmp_path / "config").write_text(config)
    (tmp_path / "credentials").write_text(credentials)
    env = bare_env(server.endpoint, tmp_path, AWS_CONFIG_FILE=str(tmp_path / "config"),
                   AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "credentials"), AWS_PROFILE="foo",
                   AWS_EC2_METADATA_SERVICE_ENDPOINT=server.endpoint)
    r = run(ckptconv, env, "inspect", f"s3://{BUCKET}/dir/model.pt")
    assert r.returncode == 3 and "bucket does not exist" in r.stderr, r.stderr
    assert_signed_with(server, *KEYS["imds"])
    assert botocore_keys(env) == KEYS["imds"]
