"""Remote repositories: Triton's repository URLs, its credentials, and the two operations a sync needs (list the
repository, read one object from an offset).

S3 (and S3-compatible endpoints) and Azure Blob Storage go through obstore, GCS through gcloud-aio-storage's JSON
API client; all are async and each is imported only when a source of its kind is opened, so a device that syncs
nothing does not load them. Credentials are found by edged.sync.credentials (Triton's variables and credential
file, systemd's credentials) in a mapping the caller passes (the process environment by default).

The environment also gives the network path: the proxy (edged.sync.proxies); an S3 endpoint from
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` when the URL names none, and a private CA in ``AWS_CA_BUNDLE``; a
GCS emulator or private endpoint from ``STORAGE_EMULATOR_HOST`` (anonymous, unless credentials for the URL are
configured); an Azure endpoint from ``AZURE_STORAGE_ENDPOINT`` or ``AZURE_ENDPOINT``, or Azurite's from
``AZURE_STORAGE_USE_EMULATOR``, and a private CA in ``REQUESTS_CA_BUNDLE``.

obstore reads the process environment's ``AWS_*`` and ``AZURE_*`` variables as well (and gcloud-aio its Google
ones): everything decided here is passed explicitly so that it wins, and static keys go through a credential
provider, which no variable overrides.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from edged.sync.credentials import (
    azure_credentials,
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
    """A parsed ``s3://``, ``gs://`` or ``as://`` repository URL (for Azure, ``bucket`` is the container)."""

    scheme: str
    bucket: str
    prefix: str
    # S3-compatible endpoint given in the URL (``s3://host:port/bucket/prefix``), with its scheme; None for AWS.
    endpoint: str | None = None
    # The Azure storage account the URL names (``as://account/container/prefix``); None for the others.
    account: str | None = None

    def __str__(self) -> str:
        # Written back in Triton's form: a plain-HTTP endpoint as host:port, an HTTPS one with its scheme.
        where = f"{self.endpoint.removeprefix('http://')}/" if self.endpoint else ""
        if self.account:
            where = f"{self.account}/"
        return f"{self.scheme}://{where}{self.bucket}/{self.prefix}".rstrip("/")


def parse_repository_url(url: str) -> SourceURL:
    """Triton's forms: ``s3://bucket/prefix``, ``s3://host:port/bucket/prefix``, ``s3://https://host:port/bucket/
    prefix``, ``gs://bucket/prefix`` and ``as://account/container/prefix`` (the account also as
    ``account.blob.core.windows.net``). Raises SyncError(BAD_URL)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("s3", "gs", "as"):
        raise SyncError(SourceProblem.BAD_URL, f"'{url}' is not an s3://, gs:// or as:// URL")
    if scheme == "as":
        return _parse_azure_url(url, rest)
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


def _parse_azure_url(url: str, rest: str) -> SourceURL:
    # Triton's pattern is as://([^/]+)/([^/?]+)(?:/([^?]*))?(\?.*)? and it drops the query; here a query is refused,
    # since what it would say (a SAS token, say) would be silently ignored.
    account, _, path = rest.partition("/")
    account = account.removesuffix(".blob.core.windows.net")
    container, _, prefix = path.partition("/")
    prefix = prefix.strip("/")
    if "?" in rest:
        raise SyncError(SourceProblem.BAD_URL, f"'{url}': an as:// URL takes no query (credentials go elsewhere)")
    # Azure's own rules for account names (3-24 lower-case letters and digits) and containers (3-63 of those and
    # single dashes, starting and ending with a letter or digit), so that a typo fails here and not as a DNS error.
    if not re.fullmatch(r"[a-z0-9]{3,24}", account):
        raise SyncError(SourceProblem.BAD_URL, f"'{url}' names no Azure storage account (as://account/container)")
    if not re.fullmatch(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]", container) or "//" in prefix:
        raise SyncError(
            SourceProblem.BAD_URL, f"'{url}' names no valid container, or has an empty folder in its prefix"
        )
    return SourceURL("as", container, prefix, account=account)


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
    if source.scheme == "as":
        _require("obstore", url)
        from edged.sync.azure import AzureRepository

        return AzureRepository(source, environ, options, azure_credentials(url, environ))
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
