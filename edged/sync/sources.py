"""Remote repositories: Triton's repository URLs, its credentials, and the two operations a sync needs (list the
repository, read one object from an offset).

S3 (and S3-compatible endpoints) go through obstore, GCS through gcloud-aio-storage's JSON API client; both are
async and both are imported only when a source of their kind is opened, so a device that syncs nothing does not load
them. Credentials are found by edged.sync.credentials (Triton's variables and credential file, systemd's credentials)
in a mapping the caller passes (the process environment by default).

The environment also gives the network path: the proxy (edged.sync.proxies); an S3 endpoint from
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` when the URL names none, and a private CA in ``AWS_CA_BUNDLE``; a
GCS emulator or private endpoint from ``STORAGE_EMULATOR_HOST`` (anonymous, unless credentials for the URL are
configured).

obstore reads the process environment's ``AWS_*`` variables as well (and gcloud-aio its Google ones): everything
decided here is passed explicitly so that it wins, and static keys go through a credential provider, which no
variable overrides.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime
import importlib.util
import io
import json
import os
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from edged.sync.credentials import (
    GCSCredentials,
    S3Credentials,
    gcs_credentials,
    s3_credentials,
    with_systemd_credentials,
)
from edged.sync.errors import SourceProblem, SyncError
from edged.sync.plan import RemoteEntry
from edged.sync.proxies import proxy_for

if TYPE_CHECKING:
    import aiohttp
    from gcloud.aio.storage import Storage
    from obstore.store import S3Store

GCS_API_ROOT: Final = "https://storage.googleapis.com"
# As the AWS SDKs and obstore: a bucket elsewhere answers with a redirect that names the wrong region.
DEFAULT_REGION: Final = "us-east-1"
# Read in pieces of this size: what a cut link loses is at most one piece, since each is on disk before the next.
CHUNK_BYTES: Final = 256 << 10
# Seconds; a device on a slow link needs long reads, a dead endpoint must still be noticed.
CONNECT_TIMEOUT_S: Final = 10
READ_TIMEOUT_S: Final = 60
T = TypeVar("T")
# How long one S3 download may last in all: a day, so that only a stall (READ_TIMEOUT_S without data) ends it.
BODY_REQUEST_S: Final = 86400.0
IDLE_CONNECTION_S: Final = 15


@dataclass(frozen=True)
class ClientOptions:
    """How patient a client is: ``connect_timeout_s`` to open a connection, ``read_timeout_s`` for a request that
    is not a download, and, in a download, between two pieces of its body: a stalled link is given up and the
    next run resumes, a slow one that keeps moving is not."""

    connect_timeout_s: float = CONNECT_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S


_MD5_HEX: Final = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class SourceURL:
    """A parsed ``s3://`` or ``gs://`` repository URL."""

    scheme: str
    bucket: str
    prefix: str
    # S3-compatible endpoint given in the URL (``s3://host:port/bucket/prefix``), with its scheme; None for AWS.
    endpoint: str | None = None

    def __str__(self) -> str:
        # Written back in Triton's form: a plain-HTTP endpoint as host:port, an HTTPS one with its scheme.
        where = f"{self.endpoint.removeprefix('http://')}/" if self.endpoint else ""
        return f"{self.scheme}://{where}{self.bucket}/{self.prefix}".rstrip("/")


def parse_repository_url(url: str) -> SourceURL:
    """Triton's forms: ``s3://bucket/prefix``, ``s3://host:port/bucket/prefix``, ``s3://https://host:port/bucket/
    prefix`` and ``gs://bucket/prefix``. Raises SyncError(BAD_URL)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("s3", "gs"):
        raise SyncError(SourceProblem.BAD_URL, f"'{url}' is not an s3:// or gs:// URL")
    endpoint: str | None = None
    if scheme == "s3":
        explicit = re.match(r"(https?)://([^/]+)/(.*)", rest)
        if explicit:
            endpoint, rest = f"{explicit[1]}://{explicit[2]}", explicit[3]
        else:
            first, _, tail = rest.partition("/")
            # Triton reads a first component with a port as an endpoint; bucket names cannot hold a ':'.
            if ":" in first:
                endpoint, rest = f"http://{first}", tail
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not bucket or "//" in prefix:
        raise SyncError(SourceProblem.BAD_URL, f"'{url}' names no bucket, or has an empty folder in its prefix")
    return SourceURL(scheme, bucket, prefix, endpoint)


class RemoteRepository(Protocol):
    """What a sync run needs from a remote repository."""

    @property
    def url(self) -> str: ...

    async def list(self) -> list[RemoteEntry]:
        """Every object under the prefix, keys relative to it (unchecked: plan.check_listing decides)."""

    def read(self, entry: RemoteEntry, start: int) -> AsyncIterator[bytes]:
        """The object's bytes from ``start`` to its end. S3 refuses an object replaced since the listing (a read
        conditional on its ETag); otherwise the check of size and digest after the download catches it."""

    async def write(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key`` (relative to the prefix), replacing what was there: fleet status objects and
        published repositories. Raises SyncError."""

    async def delete(self, key: str) -> None:
        """Remove the object at ``key`` (relative to the prefix): files a published repository no longer has.
        Raises SyncError."""

    async def close(self) -> None: ...


def open_repository(
    url: str, env: Mapping[str, str] | None = None, options: ClientOptions | None = None
) -> RemoteRepository:
    """A client for the repository at ``url`` with credentials from ``env`` (the process environment if None)."""
    options = options or ClientOptions()
    source = parse_repository_url(url)
    environ = with_systemd_credentials(os.environ if env is None else env)
    if source.scheme == "s3":
        _require("obstore", url)
        return S3Repository(source, environ, options, s3_credentials(url, environ))
    _require("gcloud.aio.storage", url)
    return GCSRepository(source, environ, options, gcs_credentials(url, environ))


def _require(module: str, url: str) -> None:
    # The clients are an extra: say which one is missing before any run, not as a failure in the middle of one.
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise SyncError(SourceProblem.MISSING_CLIENT, f"{url} needs {module}: install edged[sync]")


def _relative(key: str, prefix: str) -> str | None:
    """``key`` without the repository prefix; None for the prefix's own folder marker."""
    if prefix:
        if not key.startswith(prefix + "/"):
            return None
        key = key[len(prefix) + 1 :]
    return key or None


class S3Repository:
    """An S3 or S3-compatible repository, through obstore."""

    def __init__(
        self, source: SourceURL, env: Mapping[str, str], options: ClientOptions, credentials: S3Credentials
    ) -> None:
        self._source = source
        self._region = credentials.region or DEFAULT_REGION
        self._idle_s = options.read_timeout_s
        # obstore's timeout bounds a whole request, body included: a slow download that keeps moving would be cut
        # at the read timeout and finish only over several runs. So the client's is long, and each request here
        # is bounded by the read timeout itself, a download's body by the time between two of its pieces.
        self._store = self._make_store(source, env, options, credentials, BODY_REQUEST_S)

    @property
    def url(self) -> str:
        return str(self._source)

    @staticmethod
    def _make_store(
        source: SourceURL, env: Mapping[str, str], options: ClientOptions, credentials: S3Credentials, request_s: float
    ) -> S3Store:
        from obstore.store import S3Store

        region = credentials.region or DEFAULT_REGION
        config: dict[str, Any] = {"region": region, "default_region": region}
        provider = None
        if credentials.key_id:
            static = {
                "access_key_id": credentials.key_id,
                "secret_access_key": credentials.secret_key,
                "token": credentials.session_token,
                "expires_at": None,
            }

            def provider() -> dict[str, Any]:
                return static

        else:
            # Temporary credentials: obstore fetches them and refreshes them before they expire.
            for key, variables in _S3_CHAIN.items():
                found = next((name for name in variables if env.get(name)), None)
                if found:
                    config[key] = _checked_url(env[found], found) if key in _S3_URLS else env[found]
        endpoint = source.endpoint
        for variable in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if not endpoint and env.get(variable):
                endpoint = _checked_url(env[variable], variable)
        if endpoint:
            # Both keys: obstore prefers aws_endpoint_url_s3, which the process environment may set otherwise.
            config["endpoint"] = config["aws_endpoint_url_s3"] = endpoint
            # S3-compatible servers (MinIO, Ceph, ...) are addressed by path; few serve virtual-hosted buckets.
            config["virtual_hosted_style_request"] = (
                source.endpoint is None and env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "").lower() == "true"
            )
        client: dict[str, Any] = {
            "allow_http": bool(endpoint and endpoint.startswith("http://")),
            "connect_timeout": datetime.timedelta(seconds=options.connect_timeout_s),
            "timeout": datetime.timedelta(seconds=request_s),
            # A connection idle longer is not reused: NATs and proxies drop idle ones silently, and a request
            # sent on such a connection waits for the read timeout (aiohttp's default for GCS is the same 15 s).
            "pool_idle_timeout": datetime.timedelta(seconds=IDLE_CONNECTION_S),
        }
        proxy = proxy_for(endpoint or f"https://s3.{region}.amazonaws.com", env)
        if proxy:
            client["proxy_url"] = proxy
        if env.get("AWS_CA_BUNDLE"):
            # A private CA (MinIO, Ceph, an STS endpoint inside the network): trusted on top of the system's.
            client["root_certificate"] = _read_bundle(env["AWS_CA_BUNDLE"])
        # obstore's own retries are kept short: the sync loop retries whole runs, and a run resumes its downloads.
        retry: dict[str, Any] = {"max_retries": 2, "retry_timeout": datetime.timedelta(seconds=options.read_timeout_s)}
        try:
            return S3Store(
                source.bucket,
                prefix=source.prefix or None,
                config=config,  # type: ignore[arg-type]
                client_options=client,  # type: ignore[arg-type]
                retry_config=retry,  # type: ignore[arg-type]
                credential_provider=provider,  # type: ignore[arg-type]
            )
        except Exception as exc:
            # obstore builds its HTTP client here: a certificate or proxy it cannot use fails now.
            text = str(exc).split("\n", 1)[0]
            raise SyncError(
                SourceProblem.BAD_URL,
                f"{source}: the S3 client refused its settings ({text}): check AWS_CA_BUNDLE and the proxy variables",
            ) from None

    async def list(self) -> list[RemoteEntry]:
        import obstore

        entries: list[RemoteEntry] = []
        try:
            pages = aiter(obstore.list(self._store, chunk_size=1000))
            while (batch := await self._within(anext(pages, None))) is not None:
                for meta in batch:
                    etag = (meta["e_tag"] or "").strip('"')
                    digest = f"md5:{etag}" if _MD5_HEX.fullmatch(etag) else f"etag:{etag}"
                    entries.append(RemoteEntry(meta["path"], meta["size"], digest, meta["e_tag"]))
        except SyncError:
            raise
        except Exception as exc:
            raise _s3_error(exc, self.url, self._region) from exc
        return entries

    async def _within(self, step: Awaitable[T]) -> T:
        """``step``, or SyncError(UNREACHABLE) when it takes longer than the read timeout (a stalled link)."""
        try:
            return await asyncio.wait_for(step, self._idle_s)
        except TimeoutError:
            raise SyncError(
                SourceProblem.UNREACHABLE, f"{self.url}: no answer for {self._idle_s:g} s (the link stalled)"
            ) from None

    async def read(self, entry: RemoteEntry, start: int) -> AsyncIterator[bytes]:
        import obstore

        options: dict[str, Any] = {}
        if start:
            options["range"] = {"offset": start}
        if entry.version:
            options["if_match"] = entry.version
        try:
            result = await self._within(
                obstore.get_async(self._store, entry.path, options=options)  # type: ignore[arg-type]
            )
            chunks = aiter(result.stream(min_chunk_size=CHUNK_BYTES))
            while (chunk := await self._within(anext(chunks, None))) is not None:
                yield bytes(chunk)
        except SyncError:
            raise
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{entry.path}", self._region) from exc

    async def write(self, key: str, data: bytes) -> None:
        import obstore

        try:
            await self._within(obstore.put_async(self._store, key, data))
        except SyncError:
            raise
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{key}", self._region) from exc

    async def delete(self, key: str) -> None:
        import obstore

        try:
            await self._within(obstore.delete_async(self._store, key))
        except SyncError:
            raise
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{key}") from exc

    async def close(self) -> None:
        """obstore's client holds no connection that needs closing."""


# What obstore uses when no static key is given, by its config key: temporary credentials from web identity (EKS,
# GitHub OIDC, ...), from ECS and EKS container endpoints or from EC2 instance metadata, tried in this order, or
# unsigned requests to a public bucket (AWS_SKIP_SIGNATURE).
# The AWS SDKs' names come first where obstore reads another one.
_S3_CHAIN: Final = {
    "web_identity_token_file": ("AWS_WEB_IDENTITY_TOKEN_FILE",),
    "role_arn": ("AWS_ROLE_ARN",),
    "role_session_name": ("AWS_ROLE_SESSION_NAME",),
    "aws_endpoint_url_sts": ("AWS_ENDPOINT_URL_STS", "AWS_STS_ENDPOINT"),
    "container_credentials_relative_uri": ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",),
    "container_credentials_full_uri": ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),
    "container_authorization_token_file": ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",),
    "metadata_endpoint": ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_METADATA_ENDPOINT"),
    "imdsv1_fallback": ("AWS_IMDSV1_FALLBACK",),
    "skip_signature": ("AWS_SKIP_SIGNATURE",),
}


def _read_bundle(path: str) -> str:
    try:
        bundle = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise SyncError(SourceProblem.BAD_URL, f"AWS_CA_BUNDLE {path} cannot be read: {type(exc).__name__}") from None
    if "-----BEGIN CERTIFICATE-----" not in bundle:
        raise SyncError(SourceProblem.BAD_URL, f"AWS_CA_BUNDLE {path} holds no PEM certificate")
    return bundle


# These are URLs: obstore panics on some malformed ones rather than failing, so they are checked first.
_S3_URLS: Final = frozenset({"aws_endpoint_url_sts", "container_credentials_full_uri", "metadata_endpoint"})


def _checked_url(value: str, variable: str) -> str:
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        parts = urllib.parse.urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SyncError(SourceProblem.BAD_URL, f"{variable} '{value}' is not an http:// or https:// URL")
    return value


# S3's error codes (the <Code> of its XML error body) by what an operator has to fix.
_S3_CODES: Final = {
    "NoSuchBucket": SourceProblem.NOT_FOUND,
    "NoSuchKey": SourceProblem.NOT_FOUND,
    "AccessDenied": SourceProblem.DENIED,
    "InvalidAccessKeyId": SourceProblem.DENIED,
    "SignatureDoesNotMatch": SourceProblem.DENIED,
    "ExpiredToken": SourceProblem.DENIED,
    "InvalidToken": SourceProblem.DENIED,
    "PermanentRedirect": SourceProblem.WRONG_REGION,
    "AuthorizationHeaderMalformed": SourceProblem.WRONG_REGION,
    "IllegalLocationConstraintException": SourceProblem.WRONG_REGION,
    "PreconditionFailed": SourceProblem.CHANGED,
}
_S3_STATUS: Final = {
    401: SourceProblem.DENIED,
    403: SourceProblem.DENIED,
    404: SourceProblem.NOT_FOUND,
    301: SourceProblem.WRONG_REGION,
    412: SourceProblem.CHANGED,
}


def _s3_error(exc: Exception, where: str, region: str = DEFAULT_REGION) -> SyncError:
    from obstore import exceptions

    full = str(exc)
    # obstore's first line, without the XML body it appends (read apart below) and without its "Generic S3 error".
    text = full.split("\n", 1)[0].split(": <?xml", 1)[0].removeprefix("Generic S3 error: ")
    code = re.search(r"<Code>(\w+)</Code>", full)
    said = re.search(r"<Message>([^<]*)</Message>", full)
    status = re.search(r"status code: (\d{3})", full)
    if isinstance(exc, exceptions.InvalidPathError):
        problem = SourceProblem.REFUSED
    elif code and code[1] in _S3_CODES:
        problem = _S3_CODES[code[1]]
        text = f"{code[1]}: {said[1] if said else text}"
    elif isinstance(exc, (exceptions.NotFoundError, FileNotFoundError)):
        problem = SourceProblem.NOT_FOUND
    elif isinstance(exc, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError, PermissionError)):
        problem = SourceProblem.DENIED
    elif isinstance(exc, exceptions.PreconditionError):
        problem = SourceProblem.CHANGED
    elif any(sign in full for sign in ("/latest/api/token", "/latest/meta-data/")):
        # No key was configured, so the client asked the EC2 instance metadata service, which is not there.
        problem = SourceProblem.CREDENTIALS
        text = (
            "no credentials: none configured (AWS_ACCESS_KEY_ID, TRITON_CLOUD_CREDENTIAL_PATH, systemd credentials,"
            f" web identity, container) and the instance metadata service failed: {text}"
        )
    elif "incorrectly configured region" in full:
        # S3's answer to a request sent to another region than the bucket's: a 301 without a Location.
        problem = SourceProblem.WRONG_REGION
    elif status and int(status[1]) in _S3_STATUS:
        problem = _S3_STATUS[int(status[1])]
    elif isinstance(exc, (ConnectionError, TimeoutError)) or any(
        # "body error" with "TimedOut": a response body that stopped arriving (a stalled link mid-download).
        sign in full
        for sign in (
            "error sending request",
            "timed out",
            "TimedOut",
            "body error",
            "Connection refused",
            "connection reset",
        )
    ):
        problem = SourceProblem.UNREACHABLE
    else:
        problem = SourceProblem.OTHER
    if problem is SourceProblem.WRONG_REGION:
        text += (
            f' (edged asked in region {region}: set AWS_DEFAULT_REGION, or the entry\'s "region" in'
            " TRITON_CLOUD_CREDENTIAL_PATH, to the bucket's)"
        )
    return SyncError(problem, f"{where}: {text}")


class GCSRepository:
    """A GCS repository, through the JSON API (which the GCS emulators speak too)."""

    def __init__(
        self, source: SourceURL, env: Mapping[str, str], options: ClientOptions, credentials: GCSCredentials
    ) -> None:
        self._source = source
        self._options = options
        emulator = env.get("STORAGE_EMULATOR_HOST")
        if emulator and "://" not in emulator:
            emulator = f"http://{emulator}"
        # Always explicit: gcloud-aio would read STORAGE_EMULATOR_HOST from the process environment otherwise.
        self._api_root = emulator or GCS_API_ROOT
        self._credentials = credentials
        # An emulator takes anonymous requests; a private endpoint named the same way wants tokens.
        self._anonymous = bool(emulator) and not (credentials.service_file or credentials.service_info)
        self._proxy = proxy_for(self._api_root, env)
        self._storage: Storage | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return str(self._source)

    @property
    def _timeout(self) -> Any:
        """Per request: connecting, and each read of the body, so that a stalled link ends the request."""
        import aiohttp

        return aiohttp.ClientTimeout(
            total=None,
            connect=self._options.connect_timeout_s,
            sock_connect=self._options.connect_timeout_s,
            sock_read=self._options.read_timeout_s,
        )

    def _client(self) -> Storage:
        # Built on first use: the client opens an aiohttp session, which belongs to the running event loop.
        if self._storage is None:
            import aiohttp
            from gcloud.aio.storage import Storage

            # Token requests share the session, and so its proxy.
            session: Any = aiohttp.ClientSession(proxy=self._proxy, timeout=self._timeout)
            self._session = session
            info = self._credentials.service_info
            service: Any = io.StringIO(json.dumps(info)) if info else self._credentials.service_file
            try:
                token = None if self._anonymous else _one_attempt_token(service, session)
                self._storage = Storage(
                    service_file=service,
                    token=token,
                    session=session,
                    api_root=self._api_root,
                    api_is_dev=self._anonymous,
                )
            except Exception as exc:
                # The key in the credentials is read here; its text never goes into the message.
                raise SyncError(
                    SourceProblem.CREDENTIALS, f"{self.url}: the Google credential is unusable ({type(exc).__name__})"
                ) from None
        return self._storage

    async def list(self) -> list[RemoteEntry]:
        prefix = f"{self._source.prefix}/" if self._source.prefix else ""
        params = {"prefix": prefix, "fields": "items(name,size,md5Hash,etag,generation),nextPageToken"}
        entries: list[RemoteEntry] = []
        try:
            while True:
                page = await self._client().list_objects(self._source.bucket, params=params, timeout=self._timeout)
                for item in page.get("items", []):
                    entry = _gcs_entry(item, self._source.prefix)
                    if entry is not None:
                        entries.append(entry)
                token = page.get("nextPageToken")
                if not token:
                    return entries
                params["pageToken"] = token
        except Exception as exc:
            raise _gcs_error(exc, self.url, self._api_root) from exc

    async def read(self, entry: RemoteEntry, start: int) -> AsyncIterator[bytes]:
        name = f"{self._source.prefix}/{entry.path}" if self._source.prefix else entry.path
        headers = {"Range": f"bytes={start}-"} if start else {}
        try:
            stream = await self._client().download_stream(
                self._source.bucket, name, headers=headers, timeout=self._timeout
            )
            while chunk := await stream.read(CHUNK_BYTES):
                yield chunk
        except Exception as exc:
            raise _gcs_error(exc, f"{self.url}/{entry.path}", self._api_root) from exc

    async def write(self, key: str, data: bytes) -> None:
        name = f"{self._source.prefix}/{key}" if self._source.prefix else key
        try:
            # Bytes to edged, whatever the name: a type guessed from ".json" also breaks the GCS emulator's upload.
            await self._client().upload(
                self._source.bucket, name, data, content_type="application/octet-stream", timeout=self._timeout
            )
        except Exception as exc:
            raise _gcs_error(exc, f"{self.url}/{key}", self._api_root) from exc

    async def delete(self, key: str) -> None:
        name = f"{self._source.prefix}/{key}" if self._source.prefix else key
        try:
            await self._client().delete(self._source.bucket, name, timeout=self._timeout)
        except Exception as exc:
            raise _gcs_error(exc, f"{self.url}/{key}", self._api_root) from exc

    async def close(self) -> None:
        # A token refresh gcloud-aio started ahead of expiry must not outlive the client (nor its failure go
        # unread).
        acquiring = getattr(self._storage.token, "acquiring", None) if self._storage else None
        if isinstance(acquiring, asyncio.Task):
            acquiring.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await acquiring
        # The session is edged's: gcloud-aio leaves a session it was given open.
        if self._session is not None:
            await self._session.close()
        self._storage = self._session = None


def _one_attempt_token(service: Any, session: Any) -> Any:
    """gcloud-aio's token, asked for once per need: gcloud-aio tries five times over up to a minute, and a refused
    credential must be told at once (the sync loop retries whole runs)."""
    from gcloud.aio.auth import Token
    from gcloud.aio.storage.storage import SCOPES

    class OneAttemptToken(Token):
        async def acquire_access_token(self, timeout: int = 10) -> None:  # type: ignore[override]
            # tenacity's stop condition, asked after each attempt: stop after the first.
            once = Token.acquire_access_token.retry_with(stop=lambda _: True)
            await once(self, timeout)

    return OneAttemptToken(service_file=service, session=session, scopes=SCOPES)


def _gcs_entry(item: Mapping[str, Any], prefix: str) -> RemoteEntry | None:
    name = str(item.get("name", ""))
    size = int(item.get("size", 0))
    if name.endswith("/") and size == 0:
        return None  # a folder marker
    path = _relative(name, prefix)
    if path is None:
        return None
    md5 = item.get("md5Hash")
    if md5:
        try:
            digest = "md5:" + base64.b64decode(str(md5), validate=True).hex()
        except (binascii.Error, ValueError):
            digest = f"etag:{item.get('etag', '')}"
    else:
        # Composite objects have no MD5; their generation still names their content.
        digest = f"generation:{item.get('generation', '')}"
    generation = item.get("generation")
    return RemoteEntry(path, size, digest, str(generation) if generation else None)


def _gcs_error(exc: Exception, where: str, api_root: str) -> SyncError:
    import aiohttp

    if isinstance(exc, SyncError):
        return exc
    if isinstance(exc, aiohttp.ClientResponseError):
        asked = exc.request_info.real_url
        if not str(asked).startswith(api_root) and exc.status in (400, 401, 403):
            # The token endpoint (or the metadata server) refused the credential: Google answers an unknown or
            # revoked key with 400 invalid_grant.
            endpoint = asked.with_query(None).with_fragment(None)
            return SyncError(
                SourceProblem.DENIED, f"{where}: {endpoint} refused the credential: HTTP {exc.status} {exc.message}"
            )
        problem = {
            401: SourceProblem.DENIED,
            403: SourceProblem.DENIED,
            404: SourceProblem.NOT_FOUND,
            412: SourceProblem.CHANGED,
        }.get(exc.status, SourceProblem.OTHER)
        return SyncError(problem, f"{where}: HTTP {exc.status} {exc.message}")
    # A payload cut short is a link that went down mid-transfer, as much as a refused connection is.
    lost = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, aiohttp.ServerTimeoutError)
    if isinstance(exc, (*lost, TimeoutError, ConnectionError)):
        return SyncError(SourceProblem.UNREACHABLE, f"{where}: {exc}")
    return SyncError(SourceProblem.OTHER, f"{where}: {type(exc).__name__}: {exc}")
