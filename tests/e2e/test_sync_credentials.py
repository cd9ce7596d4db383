"""Credentials, proxies and failures of the sync clients against real endpoints: moto's S3 server with its IAM
checks on (a wrong key is refused as AWS refuses it), the GCS emulator, an HTTP proxy that records what passes
through it (also serving TLS behind a private CA), and small HTTP endpoints that hand out credentials as EKS, EC2's
instance metadata and Google's token endpoint do."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import http.server
import itertools
import json
import os
import select
import socket
import ssl
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import boto3
import pytest
from objectstores import BIN, FaultProxy, _wait_listening, free_port, gcs_emulator, gcs_upload, moto_server, tree

from edged.sync import ClientOptions, SourceProblem, SyncError, SyncResult, open_repository, sync_once

if TYPE_CHECKING:
    from edged.sync.sources import RemoteRepository

FILES: Final = {"add_sub/config.pbtxt": b'name: "add_sub"\n', "add_sub/1/model.bin": bytes(range(256)) * 64}
# Short patience, so that each failure below is told within seconds.
QUICK: Final = ClientOptions(connect_timeout_s=2, read_timeout_s=5)
GCS_BUCKET: Final = "models"
ALLOW_ALL: Final = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
_names = itertools.count()


# --- endpoints ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuthMoto:
    """moto's S3 with IAM checks on, an IAM user allowed everything, and its key."""

    port: int
    key_id: str
    secret: str

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=f"http://{self.endpoint}",
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
            region_name="us-east-1",
        )

    def role_credentials(self) -> dict[str, Any]:
        """Temporary credentials of a role allowed everything, from moto's STS."""
        iam = self.client("iam")
        name = f"edged-role-{next(_names)}"
        trust = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
        }
        role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]
        iam.put_role_policy(RoleName=name, PolicyName="all", PolicyDocument=json.dumps(ALLOW_ALL))
        issued: dict[str, Any] = self.client("sts").assume_role(RoleArn=role["Arn"], RoleSessionName="edged")
        return issued["Credentials"]  # type: ignore[no-any-return]

    def bucket_with_repository(self) -> str:
        name = f"creds-{next(_names)}"
        s3 = self.client("s3")
        s3.create_bucket(Bucket=name)
        for key, data in FILES.items():
            s3.put_object(Bucket=name, Key=f"repo/{key}", Body=data)
        return name


@pytest.fixture(scope="module")
def moto() -> Iterator[AuthMoto]:
    port = free_port()
    # The first three requests (the IAM user, its key and its policy) are let through; every later one is checked.
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    process = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port, process, "moto_server")
        iam = boto3.client(
            "iam",
            endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
            region_name="us-east-1",
        )
        iam.create_user(UserName="edged")
        key = iam.create_access_key(UserName="edged")["AccessKey"]
        iam.put_user_policy(UserName="edged", PolicyName="all", PolicyDocument=json.dumps(ALLOW_ALL))
        yield AuthMoto(port, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def gcs() -> Iterator[int]:
    """The GCS emulator, holding the repository under repo/."""
    with gcs_emulator(GCS_BUCKET) as port:
        for key, data in FILES.items():
            gcs_upload(port, GCS_BUCKET, f"repo/{key}", data)
        yield port


@dataclass
class RecordingProxy:
    """An HTTP proxy: absolute-URI requests are forwarded (one connection per request), CONNECT is tunnelled;
    ``requests`` records each request line with its headers. With ``upstream`` it is a reverse proxy to that
    URL as well, and ``gate`` may answer a request itself from its headers (names in lower case): (status, body),
    or None to let it through."""

    port: int = field(default_factory=free_port)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    upstream: str | None = None
    gate: Callable[[dict[str, str]], tuple[int, bytes] | None] | None = None
    # Served over TLS with this context (as a reverse proxy: an endpoint behind a private CA).
    tls: ssl.SSLContext | None = None
    # A POST's query moved into a form body: the same AWS query-protocol request, in the form moto recognizes
    # (it takes a bare POST with its query in the URL for S3).
    query_to_form: bool = False

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lines(self) -> list[str]:
        return [line for line, _ in self.requests]

    @contextlib.contextmanager
    def running(self) -> Iterator[RecordingProxy]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_CONNECT(self) -> None:
                proxy.requests.append((self.requestline, dict(self.headers)))
                host, _, port = self.path.rpartition(":")
                try:
                    upstream = socket.create_connection((host, int(port)), 5)
                except OSError:
                    self.send_error(502)
                    return
                self.send_response(200, "Connection established")
                self.end_headers()
                sockets = [self.connection, upstream]
                with upstream:
                    while True:
                        ready, _, _ = select.select(sockets, [], [], 5)
                        if not ready:
                            return
                        for sock in ready:
                            data = sock.recv(65536)
                            if not data:
                                return
                            (upstream if sock is self.connection else self.connection).sendall(data)

            def forward(self) -> None:
                proxy.requests.append((self.requestline, dict(self.headers)))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                answer = proxy.gate({k.lower(): v for k, v in self.headers.items()}) if proxy.gate else None
                if answer is not None:
                    self.send_response(answer[0])
                    self.send_header("Content-Length", str(len(answer[1])))
                    self.end_headers()
                    self.wfile.write(answer[1])
                    return
                dropped = ("proxy-connection", "connection", "content-length")  # urllib sets the length it sends
                headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
                path = self.path
                if proxy.query_to_form and self.command == "POST" and not body and "?" in path:
                    path, query = path.split("?", 1)
                    body = query.encode()
                    headers["Content-Type"] = "application/x-www-form-urlencoded"
                target = path if "://" in path else f"{proxy.upstream}{path}"
                request = urllib.request.Request(target, data=body, method=self.command, headers=headers)
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                try:
                    response = opener.open(request, timeout=10)
                except urllib.error.HTTPError as error:
                    response = error
                except OSError:
                    self.send_error(502)
                    return
                with response:
                    data = response.read()
                    self.send_response(response.status)
                    for name, value in response.headers.items():
                        if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    # One request per connection: clients must cope with a proxy that closes after each answer.
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(data)
                self.close_connection = True

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            server.shutdown()
            server.server_close()


@contextlib.contextmanager
def json_endpoint(
    answer: Callable[[str, bytes], dict[str, Any]], status: int = 200
) -> Iterator[tuple[str, list[bytes]]]:
    """A small HTTP endpoint answering every request with ``status`` and ``answer(path, body)`` as JSON; yields its
    URL and the bodies it was sent."""
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def reply(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            bodies.append(body)
            data = json.dumps(answer(self.path, body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = reply

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def sync(url: str, env: dict[str, str], state: Path, options: ClientOptions = QUICK) -> SyncResult:
    async def run() -> SyncResult:
        source = open_repository(url, env, options)
        try:
            return await sync_once(source, state)
        finally:
            await source.close()

    return asyncio.run(run())


def s3_url(endpoint: str, bucket: str) -> str:
    return f"s3://{endpoint}/{bucket}/repo"


def keys(moto: AuthMoto) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": moto.key_id, "AWS_SECRET_ACCESS_KEY": moto.secret}


def refused(url: str, env: dict[str, str], state: Path) -> SyncError:
    with pytest.raises(SyncError) as failure:
        sync(url, env, state)
    return failure.value


# --- TRITON_CLOUD_CREDENTIAL_PATH and systemd credentials ----------------------------------------------------


def test_credential_file_longest_prefix_wins_over_the_variables(moto: AuthMoto, tmp_path: Path) -> None:
    bucket, other = moto.bucket_with_repository(), moto.bucket_with_repository()
    wrong = {"key_id": "AKIAWRONGWRONGWRONG1", "secret_key": "wrong-secret", "region": "us-east-1"}
    right = {"key_id": moto.key_id, "secret_key": moto.secret}
    path = tmp_path / "cloud_credential.json"
    path.write_text(
        json.dumps({"s3": {"": wrong, f"s3://{moto.endpoint}": wrong, f"s3://{moto.endpoint}/{bucket}": right}})
    )
    # The variables name a wrong key: Triton reads the file alone once TRITON_CLOUD_CREDENTIAL_PATH is set.
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(path), "AWS_ACCESS_KEY_ID": "AKIAENV", "AWS_SECRET_ACCESS_KEY": "x"}

    result = sync(s3_url(moto.endpoint, bucket), env, tmp_path / "state")
    assert tree(result.repository) == FILES

    denied = refused(s3_url(moto.endpoint, other), env, tmp_path / "other")
    assert denied.problem is SourceProblem.DENIED, denied
    assert "wrong-secret" not in str(denied)


def test_credential_file_without_a_matching_entry_is_refused(moto: AuthMoto, tmp_path: Path) -> None:
    path = tmp_path / "cloud_credential.json"
    path.write_text(json.dumps({"s3": {"s3://elsewhere": {"key_id": moto.key_id, "secret_key": moto.secret}}}))
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)} | keys(moto)
    failure = refused(s3_url(moto.endpoint, moto.bucket_with_repository()), env, tmp_path / "state")
    assert failure.problem is SourceProblem.CREDENTIALS and str(path) in str(failure), failure


def test_systemd_credentials_replace_the_variables(moto: AuthMoto, tmp_path: Path) -> None:
    folder = tmp_path / "credentials"
    folder.mkdir()
    # As an operator writes them, with echo's newline.
    (folder / "aws-access-key-id").write_text(moto.key_id + "\n")
    (folder / "aws-secret-access-key").write_text(moto.secret + "\n")
    env = {
        "CREDENTIALS_DIRECTORY": str(folder),
        "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG1",
        "AWS_SECRET_ACCESS_KEY": "wrong",
        # Another key's token must not be sent with the credential's key.
        "AWS_SESSION_TOKEN": "someone-elses-token",
    }
    result = sync(s3_url(moto.endpoint, moto.bucket_with_repository()), env, tmp_path / "state")
    assert tree(result.repository) == FILES


def test_systemd_credential_file_of_triton_format(moto: AuthMoto, tmp_path: Path) -> None:
    folder = tmp_path / "credentials"
    folder.mkdir()
    entry = {"key_id": moto.key_id, "secret_key": moto.secret}
    (folder / "triton-cloud-credentials.json").write_text(json.dumps({"s3": {"": entry}}))
    env = {"CREDENTIALS_DIRECTORY": str(folder)}
    result = sync(s3_url(moto.endpoint, moto.bucket_with_repository()), env, tmp_path / "state")
    assert tree(result.repository) == FILES


# --- temporary credentials -----------------------------------------------------------------------------------


@pytest.mark.parametrize("lifetime_s", [60, 3600], ids=["expiring", "lasting"])
def test_container_credentials_are_refreshed_before_they_expire(
    moto: AuthMoto, tmp_path: Path, lifetime_s: int
) -> None:
    def credentials(path: str, body: bytes) -> dict[str, Any]:
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=lifetime_s)
        return {
            "AccessKeyId": issued["AccessKeyId"],
            "SecretAccessKey": issued["SecretAccessKey"],
            "Token": issued["SessionToken"],
            "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    # Temporary credentials moto's STS issued, as the real endpoint hands out.
    issued = moto.role_credentials()
    bucket = moto.bucket_with_repository()
    token = tmp_path / "eks-pod-identity-token"
    token.write_text("pod-identity-token")
    with json_endpoint(credentials) as (url, fetched):
        # EKS Pod Identity's form: a full URI and the file of the token that authorizes the request.
        env = {
            "AWS_CONTAINER_CREDENTIALS_FULL_URI": f"{url}/v1/credentials",
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token),
        }

        async def two_runs() -> None:
            source = open_repository(s3_url(moto.endpoint, bucket), env, QUICK)
            try:
                await sync_once(source, tmp_path / "state")
                await asyncio.sleep(0.3)
                await sync_once(source, tmp_path / "state")
            finally:
                await source.close()

        asyncio.run(two_runs())
    # Credentials that expire within minutes are fetched again before a request; lasting ones are kept.
    assert (len(fetched) > 1) == (lifetime_s < 300), fetched


@contextlib.contextmanager
def instance_metadata(credentials: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """EC2's instance metadata service as IMDSv2 serves a role's credentials: a session token first, then the
    role's name, then its credentials for requests that carry the token. Yields its URL and the paths asked."""
    asked: list[str] = []
    session = "imds-session-token"
    role = "edged-role"

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def reply(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            asked.append(f"PUT {self.path}")
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            if self.path == "/latest/api/token" and ttl:
                self.reply(200, session)
            else:
                self.reply(400, "")

        def do_GET(self) -> None:
            asked.append(f"GET {self.path}")
            if self.headers.get("X-aws-ec2-metadata-token") != session:
                self.reply(401, "")
            elif self.path == "/latest/meta-data/iam/security-credentials/":
                self.reply(200, role)
            elif self.path == f"/latest/meta-data/iam/security-credentials/{role}":
                expires = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
                answer = {
                    "Code": "Success",
                    "Type": "AWS-HMAC",
                    "AccessKeyId": credentials["AccessKeyId"],
                    "SecretAccessKey": credentials["SecretAccessKey"],
                    "Token": credentials["SessionToken"],
                    "Expiration": expires,
                }
                self.reply(200, json.dumps(answer))
            else:
                self.reply(404, "")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def test_instance_metadata_credentials(moto: AuthMoto, tmp_path: Path) -> None:
    bucket = moto.bucket_with_repository()
    with instance_metadata(moto.role_credentials()) as (url, asked):
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": url}
        result = sync(s3_url(moto.endpoint, bucket), env, tmp_path / "state")
    assert tree(result.repository) == FILES
    assert "PUT /latest/api/token" in asked and "GET /latest/meta-data/iam/security-credentials/edged-role" in asked


def test_no_credentials_at_all_is_told(moto: AuthMoto, tmp_path: Path) -> None:
    """Nothing configured: the client asks the instance metadata service, which a device does not have."""
    closed = f"http://127.0.0.1:{free_port()}"
    failure = refused(
        s3_url(moto.endpoint, moto.bucket_with_repository()),
        {"AWS_EC2_METADATA_SERVICE_ENDPOINT": closed},
        tmp_path / "state",
    )
    assert failure.problem is SourceProblem.CREDENTIALS and "AWS_ACCESS_KEY_ID" in str(failure), failure


def private_ca(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """A CA of the test's own, in a PEM file, and a server context for 127.0.0.1 with a certificate it signed."""
    import trustme

    ca = trustme.CA()
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return bundle, context


def test_web_identity_token_is_exchanged_for_credentials_that_sign(tmp_path: Path) -> None:
    """AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN: the client trades the token at STS (HTTPS only, here behind
    a private CA given in AWS_CA_BUNDLE) and signs with what it got. moto's STS answers only with IAM checks off."""
    token = tmp_path / "web-identity-token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.edged-device.signature")
    bundle, context = private_ca(tmp_path)
    with moto_server() as port:
        bucket = f"webid-{next(_names)}"
        s3 = boto3.client(
            "s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="a", aws_secret_access_key="b",
            region_name="us-east-1",
        )  # fmt: skip
        s3.create_bucket(Bucket=bucket)
        for key, data in FILES.items():
            s3.put_object(Bucket=bucket, Key=f"repo/{key}", Body=data)
        sts = RecordingProxy(upstream=f"http://127.0.0.1:{port}", tls=context, query_to_form=True)
        with sts.running(), RecordingProxy().running() as proxy:
            env = {
                "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
                "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/edged-sync",
                "AWS_ROLE_SESSION_NAME": "edged-device",
                "AWS_ENDPOINT_URL_STS": f"https://127.0.0.1:{sts.port}",
                "AWS_CA_BUNDLE": str(bundle),
                # Only to see how S3 requests are signed: STS is https://, so HTTP_PROXY leaves it alone.
                "HTTP_PROXY": proxy.url(),
            }
            result = sync(s3_url(f"127.0.0.1:{port}", bucket), env, tmp_path / "state")
    assert tree(result.repository) == FILES
    exchanges = [
        urllib.parse.parse_qs(urllib.parse.urlsplit(line.split()[1]).query)
        for line in sts.lines()
        if "Action=AssumeRoleWithWebIdentity" in line
    ]
    assert len(exchanges) == 1 and exchanges[0]["WebIdentityToken"] == [token.read_text()], sts.lines()
    signed = [headers for line, headers in proxy.requests if line.startswith(f"GET http://127.0.0.1:{port}/")]
    assert signed and all(
        "Credential=ASIA" in headers.get("authorization", "") and headers.get("x-amz-security-token")
        for headers in signed
    ), signed


# --- errors an operator can act on ---------------------------------------------------------------------------


def test_s3_failures_are_told_apart(moto: AuthMoto, tmp_path: Path) -> None:
    bucket = moto.bucket_with_repository()
    closed = free_port()
    unknown_key = {"AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG1", "AWS_SECRET_ACCESS_KEY": "s3cr3t-wrong"}
    wrong_secret = {"AWS_ACCESS_KEY_ID": moto.key_id, "AWS_SECRET_ACCESS_KEY": "s3cr3t-wrong"}
    cases = [
        (s3_url(moto.endpoint, bucket), unknown_key, SourceProblem.DENIED, bucket),
        (s3_url(moto.endpoint, bucket), wrong_secret, SourceProblem.DENIED, bucket),
        (s3_url(moto.endpoint, "no-such-bucket"), keys(moto), SourceProblem.NOT_FOUND, "no-such-bucket"),
        (s3_url(f"127.0.0.1:{closed}", bucket), keys(moto), SourceProblem.UNREACHABLE, f"127.0.0.1:{closed}"),
    ]  # fmt: skip
    for number, (url, env, problem, named) in enumerate(cases):
        failure = refused(url, env, tmp_path / f"state-{number}")
        assert failure.problem is problem, failure
        assert named in str(failure), failure
        assert env["AWS_SECRET_ACCESS_KEY"] not in str(failure) and moto.secret not in str(failure)


def test_gcs_failures_are_told_apart(gcs: int, tmp_path: Path) -> None:
    closed = free_port()
    missing = refused("gs://no-such-bucket/repo", {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{gcs}"}, tmp_path / "a")
    assert missing.problem is SourceProblem.NOT_FOUND and "no-such-bucket" in str(missing), missing
    dead = refused(f"gs://{GCS_BUCKET}/repo", {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{closed}"}, tmp_path / "b")
    assert dead.problem is SourceProblem.UNREACHABLE and GCS_BUCKET in str(dead), dead


@pytest.mark.parametrize("answer", ["redirect", "malformed-authorization"])
def test_s3_wrong_region_is_told_apart(moto: AuthMoto, tmp_path: Path, answer: str) -> None:
    """moto serves every region alike; in front of it, S3's two answers to a request signed for another region
    than the bucket's (a 301 from a regional endpoint, a 400 from the bucket's own)."""
    bucket = moto.bucket_with_repository()

    def in_eu_west_3(headers: dict[str, str]) -> tuple[int, bytes] | None:
        if "/eu-west-3/s3/" in headers.get("authorization", ""):
            return None
        if answer == "redirect":
            code, said = (
                "PermanentRedirect",
                "The bucket you are attempting to access must be addressed using the specified endpoint.",
            )
            return 301, f"<Error><Code>{code}</Code><Message>{said}</Message></Error>".encode()
        said = "The authorization header is malformed; the region 'us-east-1' is wrong; expecting 'eu-west-3'"
        return 400, f"<Error><Code>AuthorizationHeaderMalformed</Code><Message>{said}</Message></Error>".encode()

    with RecordingProxy(upstream=f"http://{moto.endpoint}", gate=in_eu_west_3).running() as regional:
        url = s3_url(f"127.0.0.1:{regional.port}", bucket)
        failure = refused(url, keys(moto), tmp_path / "state")
        assert failure.problem is SourceProblem.WRONG_REGION, failure
        assert "AWS_DEFAULT_REGION" in str(failure) and bucket in str(failure)
        result = sync(url, keys(moto) | {"AWS_DEFAULT_REGION": "eu-west-3"}, tmp_path / "state")
        assert tree(result.repository) == FILES


# --- proxies ---------------------------------------------------------------------------------------------------


def test_s3_goes_through_the_proxy_the_environment_names(moto: AuthMoto, tmp_path: Path) -> None:
    bucket = moto.bucket_with_repository()
    url = s3_url(moto.endpoint, bucket)
    with RecordingProxy().running() as proxy:
        result = sync(url, keys(moto) | {"HTTP_PROXY": proxy.url()}, tmp_path / "state")
        assert tree(result.repository) == FILES
        # Plain HTTP through an HTTP proxy: absolute-URI requests, one per file and the listing at least.
        through = [line for line in proxy.lines() if line.startswith(f"GET http://{moto.endpoint}/{bucket}")]
        assert len(through) >= 1 + len(FILES), proxy.lines()

        proxy.requests.clear()
        sync(url, keys(moto) | {"HTTP_PROXY": proxy.url(), "NO_PROXY": "localhost,127.0.0.0/8"}, tmp_path / "b")
        assert proxy.requests == []

        # An https:// endpoint takes HTTPS_PROXY, through a CONNECT tunnel (moto speaks no TLS: the run fails after).
        https = f"s3://https://{moto.endpoint}/{bucket}/repo"
        refused(https, keys(moto) | {"HTTPS_PROXY": proxy.url(), "HTTP_PROXY": "http://127.0.0.1:9"}, tmp_path / "c")
        assert any(line.startswith(f"CONNECT {moto.endpoint}") for line in proxy.lines()), proxy.lines()


def test_gcs_goes_through_the_proxy_the_environment_names(gcs: int, tmp_path: Path) -> None:
    port = gcs
    with RecordingProxy().running() as proxy:
        emulator = f"127.0.0.1:{port}"
        env = {"STORAGE_EMULATOR_HOST": emulator, "HTTP_PROXY": proxy.url()}
        result = sync(f"gs://{GCS_BUCKET}/repo", env, tmp_path / "state")
        assert tree(result.repository) == FILES
        through = [line for line in proxy.lines() if line.startswith(f"GET http://{emulator}/")]
        assert len(through) >= 1 + len(FILES), proxy.lines()

        proxy.requests.clear()
        sync(f"gs://{GCS_BUCKET}/repo", env | {"NO_PROXY": "127.0.0.1"}, tmp_path / "b")
        assert proxy.requests == []

        https = {"STORAGE_EMULATOR_HOST": f"https://{emulator}", "HTTPS_PROXY": proxy.url()}
        refused(f"gs://{GCS_BUCKET}/repo", https, tmp_path / "c")
        assert any(line.startswith(f"CONNECT {emulator}") for line in proxy.lines()), proxy.lines()


# --- connections the store or a proxy dropped ------------------------------------------------------------------


def two_runs_across_a_drop(url: str, env: dict[str, str], via: FaultProxy, state: Path) -> None:
    """One client, two runs; between them every connection it holds is cut, as an idle timeout does."""

    async def run() -> None:
        source: RemoteRepository = open_repository(url, env, QUICK)
        try:
            first = await sync_once(source, state / "first")
            via.set_budget(0)
            via.set_budget(None)
            second = await sync_once(source, state / "second")
        finally:
            await source.close()
        assert tree(first.repository) == tree(second.repository) == FILES

    asyncio.run(run())


def test_s3_client_survives_dropped_idle_connections(moto: AuthMoto, tmp_path: Path) -> None:
    bucket = moto.bucket_with_repository()
    with FaultProxy(moto.port).running() as via:
        two_runs_across_a_drop(s3_url(via.url(), bucket), keys(moto), via, tmp_path)


def test_gcs_client_survives_dropped_idle_connections(gcs: int, tmp_path: Path) -> None:
    with FaultProxy(gcs).running() as via:
        two_runs_across_a_drop(f"gs://{GCS_BUCKET}/repo", {"STORAGE_EMULATOR_HOST": via.url()}, via, tmp_path)


# --- Google credentials ----------------------------------------------------------------------------------------


def service_account(token_uri: str) -> tuple[dict[str, str], Any]:
    """A service-account key as Google issues it, with its token endpoint at ``token_uri``; and its public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "edged-test",
        "private_key_id": "key-1",
        "private_key": pem,
        "client_email": "sync@edged-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    return info, key.public_key()


@dataclass
class TokenEndpoint:
    """Google's OAuth token endpoint as a service account meets it: a signed JWT in, an access token out."""

    lifetime_s: int = 3600
    status: int = 200
    issued: list[str] = field(default_factory=list)

    def answer(self, path: str, body: bytes) -> dict[str, Any]:
        if self.status != 200:
            return {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        self.issued.append(f"ya29.token-{len(self.issued)}")
        return {"access_token": self.issued[-1], "expires_in": self.lifetime_s, "token_type": "Bearer"}


def assertion_signer_ok(body: bytes, public_key: Any, token_uri: str) -> bool:
    import jwt

    form = urllib.parse.parse_qs(body.decode())
    claims = jwt.decode(form["assertion"][0], public_key, algorithms=["RS256"], audience=token_uri)
    return bool(claims["iss"] == "sync@edged-test.iam.gserviceaccount.com")


@pytest.mark.parametrize("given", ["path", "content", "credential-file-path", "credential-file-object", "systemd"])
def test_gcs_service_account_signs_requests_to_a_private_endpoint(gcs: int, tmp_path: Path, given: str) -> None:
    endpoint = TokenEndpoint()
    port = gcs
    with json_endpoint(endpoint.answer) as (token_url, bodies), RecordingProxy().running() as proxy:
        info, public_key = service_account(f"{token_url}/token")
        path = tmp_path / "service-account.json"
        path.write_text(json.dumps(info))
        credentials: dict[str, str] = {
            "path": {"GOOGLE_APPLICATION_CREDENTIALS": str(path)},
            "content": {"GOOGLE_APPLICATION_CREDENTIALS": json.dumps(info)},
        }.get(given, {})
        if given.startswith("credential-file"):
            entry: Any = str(path) if given == "credential-file-path" else info
            triton = tmp_path / "cloud_credential.json"
            triton.write_text(json.dumps({"gs": {"gs://other": "/nowhere.json", f"gs://{GCS_BUCKET}": entry}}))
            credentials = {"TRITON_CLOUD_CREDENTIAL_PATH": str(triton)}
        if given == "systemd":
            (tmp_path / "credentials").mkdir()
            (tmp_path / "credentials" / "gcs-service-account.json").write_text(json.dumps(info))
            credentials = {"CREDENTIALS_DIRECTORY": str(tmp_path / "credentials")}
        # A private endpoint named through STORAGE_EMULATOR_HOST; the proxy shows what each request carries.
        env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}", "HTTP_PROXY": proxy.url()} | credentials
        result = sync(f"gs://{GCS_BUCKET}/repo", env, tmp_path / "state")

    assert tree(result.repository) == FILES
    assert len(bodies) == 1 and assertion_signer_ok(bodies[0], public_key, f"{token_url}/token")
    storage = [headers for line, headers in proxy.requests if f"127.0.0.1:{port}/" in line]
    assert storage and all(headers.get("Authorization") == "Bearer ya29.token-0" for headers in storage), storage


def test_gcs_token_is_refreshed_before_it_expires(gcs: int, tmp_path: Path) -> None:
    endpoint = TokenEndpoint(lifetime_s=1)
    port = gcs
    with json_endpoint(endpoint.answer) as (token_url, _):
        info, _ = service_account(f"{token_url}/token")
        env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}", "GOOGLE_APPLICATION_CREDENTIALS": json.dumps(info)}

        async def two_runs() -> None:
            source = open_repository(f"gs://{GCS_BUCKET}/repo", env, QUICK)
            try:
                await sync_once(source, tmp_path / "state")
                # Past the lifetime by more than a second: gcloud-aio counts expiry in whole seconds.
                await asyncio.sleep(2.1)
                await sync_once(source, tmp_path / "state")
            finally:
                await source.close()

        asyncio.run(two_runs())
    assert len(endpoint.issued) >= 2, endpoint.issued


def test_gcs_refused_credential_is_denied(gcs: int, tmp_path: Path) -> None:
    endpoint = TokenEndpoint(status=400)
    port = gcs
    with json_endpoint(endpoint.answer, status=400) as (token_url, _):
        info, _ = service_account(f"{token_url}/token")
        env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}", "GOOGLE_APPLICATION_CREDENTIALS": json.dumps(info)}
        failure = refused(f"gs://{GCS_BUCKET}/repo", env, tmp_path / "state")
    assert failure.problem is SourceProblem.DENIED and f"{token_url}/token" in str(failure), failure
    assert "PRIVATE KEY" not in str(failure)


# --- timeouts ----------------------------------------------------------------------------------------------------


def stalled_run_ends(url: str, env: dict[str, str], via: FaultProxy, state: Path) -> SyncError:
    """A link that stops moving mid-body: the run must end with the read timeout it was given, not hang."""
    via.set_budget(len(FILES["add_sub/1/model.bin"]) // 2, stall=True)

    async def run() -> None:
        source = open_repository(url, env, ClientOptions(connect_timeout_s=1, read_timeout_s=1))
        try:
            # Far above the read timeout: reaching it means the client waited for the stalled link.
            await asyncio.wait_for(sync_once(source, state), 30)
        finally:
            await source.close()

    with pytest.raises(SyncError) as failure:
        asyncio.run(run())
    via.set_budget(None)  # lifts the stall, so that the proxy's stalled connections end before it stops
    return failure.value


def test_s3_stalled_link_is_given_up_after_the_read_timeout(moto: AuthMoto, tmp_path: Path) -> None:
    bucket = moto.bucket_with_repository()
    with FaultProxy(moto.port).running() as via:
        failure = stalled_run_ends(s3_url(via.url(), bucket), keys(moto), via, tmp_path / "state")
    assert failure.problem is SourceProblem.UNREACHABLE, failure


def test_gcs_stalled_link_is_given_up_after_the_read_timeout(gcs: int, tmp_path: Path) -> None:
    with FaultProxy(gcs).running() as via:
        failure = stalled_run_ends(f"gs://{GCS_BUCKET}/repo", {"STORAGE_EMULATOR_HOST": via.url()}, via, tmp_path)
    assert failure.problem is SourceProblem.UNREACHABLE, failure
