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

import importlib.util
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from edged.sync.credentials import (
    gcs_credentials,
    s3_credentials,
    with_systemd_credentials,
)
from edged.sync.errors import INSTALL_HINT, SourceProblem, SyncError

if TYPE_CHECKING:
    from edged.sync.plan import RemoteEntry

GCS_API_ROOT: Final = "https://storage.googleapis.com"
# As the AWS SDKs and obstore: a bucket elsewhere answers with a redirect that names the wrong region.
DEFAULT_REGION: Final = "us-east-1"
# Read in pieces of this size: what a cut link loses is at most one piece, since each is on disk before the next.
CHUNK_BYTES: Final = 256 << 10
# Seconds; a device on a slow link needs long reads, a dead endpoint must still be noticed.
CONNECT_TIMEOUT_S: Final = 10
READ_TIMEOUT_S: Final = 60
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
        from edged.sync.s3 import S3Repository

        return S3Repository(source, environ, options, s3_credentials(url, environ))
    _require("gcloud.aio.storage", url)
    from edged.sync.gcs import GCSRepository

    return GCSRepository(source, environ, options, gcs_credentials(url, environ))


def _require(module: str, url: str) -> None:
    # The clients are an extra: say which one is missing before any run, not as a failure in the middle of one.
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise SyncError(SourceProblem.MISSING_CLIENT, f"{url} needs {module}: {INSTALL_HINT}")


def relative_key(key: str, prefix: str) -> str | None:
    """``key`` without the repository prefix; None for the prefix's own folder marker."""
    if prefix:
        if not key.startswith(prefix + "/"):
            return None
        key = key[len(prefix) + 1 :]
    return key or None
