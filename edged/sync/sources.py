"""Remote repositories: Triton's repository URLs, its credentials, and the two operations a sync needs (list the
repository, read one object from an offset).

S3 (and S3-compatible endpoints) go through obstore, GCS through gcloud-aio-storage's JSON API client; both are
async and both are imported only when a source of their kind is opened, so a device that syncs nothing does not load
them. Credentials are read from the environment the way Triton reads them, from a mapping the caller passes (the
process environment by default) so that nothing here depends on who else set what.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import importlib.util
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from edged.sync.errors import SourceProblem, SyncError
from edged.sync.plan import RemoteEntry

if TYPE_CHECKING:
    from gcloud.aio.storage import Storage
    from obstore.store import S3Store

# Read in pieces of this size: what a cut link loses is at most one piece, since each is on disk before the next.
CHUNK_BYTES: Final = 256 << 10
# Seconds; a device on a slow link needs long reads, a dead endpoint must still be noticed.
CONNECT_TIMEOUT_S: Final = 10
READ_TIMEOUT_S: Final = 60


@dataclass(frozen=True)
class ClientOptions:
    """How patient a client is: ``connect_timeout_s`` to open a connection, ``read_timeout_s`` for one request
    (S3) or between two reads of a body (GCS), so that a stalled link is given up and the next run resumes."""

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
    environ = os.environ if env is None else env
    if source.scheme == "s3":
        _require("obstore", url)
        return S3Repository(source, environ, options)
    _require("gcloud.aio.storage", url)
    return GCSRepository(source, environ, options)


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

    def __init__(self, source: SourceURL, env: Mapping[str, str], options: ClientOptions) -> None:
        self._source = source
        self._store = self._make_store(source, env, options)

    @property
    def url(self) -> str:
        return str(self._source)

    @staticmethod
    def _make_store(source: SourceURL, env: Mapping[str, str], options: ClientOptions) -> S3Store:
        from obstore.store import S3Store

        config: dict[str, Any] = {
            "region": env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1",
        }
        for variable, key in (
            ("AWS_ACCESS_KEY_ID", "access_key_id"),
            ("AWS_SECRET_ACCESS_KEY", "secret_access_key"),
            ("AWS_SESSION_TOKEN", "session_token"),
        ):
            if env.get(variable):
                config[key] = env[variable]
        if source.endpoint:
            # S3-compatible servers (MinIO, Ceph, ...) are addressed by path; few serve virtual-hosted buckets.
            config["endpoint"] = source.endpoint
            config["virtual_hosted_style_request"] = False
        client: dict[str, Any] = {
            "allow_http": bool(source.endpoint and source.endpoint.startswith("http://")),
            "connect_timeout": datetime.timedelta(seconds=options.connect_timeout_s),
            "timeout": datetime.timedelta(seconds=options.read_timeout_s),
        }
        proxy = env.get("HTTPS_PROXY") or env.get("https_proxy")
        if proxy:
            client["proxy_url"] = proxy
        # obstore's own retries are kept short: the sync loop retries whole runs, and a run resumes its downloads.
        retry: dict[str, Any] = {"max_retries": 2, "retry_timeout": datetime.timedelta(seconds=options.read_timeout_s)}
        return S3Store(
            source.bucket,
            prefix=source.prefix or None,
            config=config,  # type: ignore[arg-type]
            client_options=client,  # type: ignore[arg-type]
            retry_config=retry,  # type: ignore[arg-type]
        )

    async def list(self) -> list[RemoteEntry]:
        import obstore

        entries: list[RemoteEntry] = []
        try:
            async for batch in obstore.list(self._store, chunk_size=1000):
                for meta in batch:
                    etag = (meta["e_tag"] or "").strip('"')
                    digest = f"md5:{etag}" if _MD5_HEX.fullmatch(etag) else f"etag:{etag}"
                    entries.append(RemoteEntry(meta["path"], meta["size"], digest, meta["e_tag"]))
        except Exception as exc:
            raise _s3_error(exc, self.url) from exc
        return entries

    async def read(self, entry: RemoteEntry, start: int) -> AsyncIterator[bytes]:
        import obstore

        options: dict[str, Any] = {}
        if start:
            options["range"] = {"offset": start}
        if entry.version:
            options["if_match"] = entry.version
        try:
            result = await obstore.get_async(self._store, entry.path, options=options)  # type: ignore[arg-type]
            async for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                yield bytes(chunk)
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{entry.path}") from exc

    async def write(self, key: str, data: bytes) -> None:
        import obstore

        try:
            await obstore.put_async(self._store, key, data)
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{key}") from exc

    async def delete(self, key: str) -> None:
        import obstore

        try:
            await obstore.delete_async(self._store, key)
        except Exception as exc:
            raise _s3_error(exc, f"{self.url}/{key}") from exc

    async def close(self) -> None:
        """obstore's client holds no connection that needs closing."""


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


def _s3_error(exc: Exception, where: str) -> SyncError:
    from obstore import exceptions

    full = str(exc)
    text = full.split("\n", 1)[0]
    code = re.search(r"<Code>(\w+)</Code>", full)
    status = re.search(r"status code: (\d{3})", full)
    if isinstance(exc, exceptions.InvalidPathError):
        problem = SourceProblem.REFUSED
    elif code and code[1] in _S3_CODES:
        problem = _S3_CODES[code[1]]
        text = f"{code[1]}: {text}"
    elif isinstance(exc, (exceptions.NotFoundError, FileNotFoundError)):
        problem = SourceProblem.NOT_FOUND
    elif isinstance(exc, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError, PermissionError)):
        problem = SourceProblem.DENIED
    elif isinstance(exc, exceptions.PreconditionError):
        problem = SourceProblem.CHANGED
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
    return SyncError(problem, f"{where}: {text}")


class GCSRepository:
    """A GCS repository, through the JSON API (which the GCS emulators speak too)."""

    def __init__(self, source: SourceURL, env: Mapping[str, str], options: ClientOptions) -> None:
        self._source = source
        # gcloud-aio takes whole seconds.
        self._timeout = max(1, round(options.read_timeout_s))
        emulator = env.get("STORAGE_EMULATOR_HOST")
        if emulator and "://" not in emulator:
            emulator = f"http://{emulator}"
        self._api_root = emulator or None
        self._service_file = env.get("GOOGLE_APPLICATION_CREDENTIALS") or None
        self._storage: Storage | None = None

    @property
    def url(self) -> str:
        return str(self._source)

    def _client(self) -> Storage:
        # Built on first use: the client opens an aiohttp session, which belongs to the running event loop.
        if self._storage is None:
            from gcloud.aio.storage import Storage

            self._storage = Storage(
                service_file=self._service_file, api_root=self._api_root, api_is_dev=bool(self._api_root)
            )
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
            raise _gcs_error(exc, self.url) from exc

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
            raise _gcs_error(exc, f"{self.url}/{entry.path}") from exc

    async def write(self, key: str, data: bytes) -> None:
        name = f"{self._source.prefix}/{key}" if self._source.prefix else key
        try:
            # Bytes to edged, whatever the name: a type guessed from ".json" also breaks the GCS emulator's upload.
            await self._client().upload(
                self._source.bucket, name, data, content_type="application/octet-stream", timeout=self._timeout
            )
        except Exception as exc:
            raise _gcs_error(exc, f"{self.url}/{key}") from exc

    async def delete(self, key: str) -> None:
        name = f"{self._source.prefix}/{key}" if self._source.prefix else key
        try:
            await self._client().delete(self._source.bucket, name, timeout=self._timeout)
        except Exception as exc:
            raise _gcs_error(exc, f"{self.url}/{key}") from exc

    async def close(self) -> None:
        if self._storage is not None:
            await self._storage.close()
            self._storage = None


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


def _gcs_error(exc: Exception, where: str) -> SyncError:
    import aiohttp

    if isinstance(exc, aiohttp.ClientResponseError):
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
