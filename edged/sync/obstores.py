"""What the repositories read through obstore (S3 in s3.py, Azure Blob Storage in azure.py) share: the HTTP
client's settings (timeouts, proxy, private CA), listing, ranged reads bounded by the time between two pieces of a
body, writes and deletes. Each kind builds its store and tells its store's errors apart."""

from __future__ import annotations

import asyncio
import datetime
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from edged.sync.errors import SourceProblem, SyncError
from edged.sync.proxies import proxy_for
from edged.sync.sources import CHUNK_BYTES, IDLE_CONNECTION_S, ClientOptions, SourceURL

if TYPE_CHECKING:
    from obstore.store import AzureStore, S3Store

    from edged.sync.plan import RemoteEntry

T = TypeVar("T")
CLOSE_GRACE_S: Final = 0.05
# Signs in obstore's text of a link that failed: no connection, or a response that stopped arriving ("body error"
# with "TimedOut": a stalled link mid-download).
TRANSPORT_SIGNS: Final = (
    "error sending request",
    "timed out",
    "TimedOut",
    "body error",
    "Connection refused",
    "connection reset",
)


def client_options(
    options: ClientOptions, endpoint: str, env: Mapping[str, str], ca_variable: str, request_s: float
) -> dict[str, Any]:
    """obstore's HTTP client settings for requests to ``endpoint`` (a URL): timeouts, the proxy the environment
    names for it, and a private CA from the file ``env[ca_variable]``, trusted on top of the system's."""
    client: dict[str, Any] = {
        "allow_http": endpoint.startswith("http://"),
        "connect_timeout": datetime.timedelta(seconds=options.connect_timeout_s),
        "timeout": datetime.timedelta(seconds=request_s),
        # A connection idle longer is not reused: NATs and proxies drop idle ones silently, and a request
        # sent on such a connection waits for the read timeout (aiohttp's default for GCS is the same 15 s).
        "pool_idle_timeout": datetime.timedelta(seconds=IDLE_CONNECTION_S),
    }
    proxy = proxy_for(endpoint, env)
    if proxy:
        client["proxy_url"] = proxy
    if env.get(ca_variable):
        client["root_certificate"] = read_bundle(env[ca_variable], ca_variable)
    return client


def retry_options(options: ClientOptions) -> dict[str, Any]:
    # obstore's own retries are kept short: the sync loop retries whole runs, and a run resumes its downloads.
    return {"max_retries": 2, "retry_timeout": datetime.timedelta(seconds=options.read_timeout_s)}


def refused_settings(exc: Exception, source: SourceURL, kind: str, ca_variable: str) -> SyncError:
    """obstore builds its HTTP client with the store: a certificate or proxy it cannot use fails there, and so
    does a system without CA certificates (a minimal root without ca-certificates), even for an http:// endpoint."""
    text = str(exc).split("\n", 1)[0]
    return SyncError(
        SourceProblem.BAD_URL,
        f"{source}: the {kind} client refused its settings ({text}): check {ca_variable}, the proxy variables"
        " and that the system's CA certificates are installed (ca-certificates)",
    )


def read_bundle(path: str, variable: str) -> str:
    try:
        bundle = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise SyncError(SourceProblem.BAD_URL, f"{variable} {path} cannot be read: {type(exc).__name__}") from None
    if "-----BEGIN CERTIFICATE-----" not in bundle:
        raise SyncError(SourceProblem.BAD_URL, f"{variable} {path} holds no PEM certificate")
    return bundle


def checked_url(value: str, variable: str) -> str:
    """``value`` when it is an http:// or https:// URL: obstore panics on some malformed ones rather than failing."""
    try:
        parts = urllib.parse.urlsplit(value)
    except ValueError:
        parts = urllib.parse.urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SyncError(SourceProblem.BAD_URL, f"{variable} '{value}' is not an http:// or https:// URL")
    return value


class ObstoreRepository:
    """A repository in an obstore store. obstore's timeout bounds a whole request, body included: a slow download
    that keeps moving would be cut at the read timeout and finish only over several runs. So the store's client
    gets a long one, and each request here is bounded by the read timeout itself, a download's body by the time
    between two of its pieces."""

    def __init__(self, source: SourceURL, store: S3Store | AzureStore, options: ClientOptions) -> None:
        self._source = source
        self._store = store
        self._idle_s = options.read_timeout_s

    @property
    def url(self) -> str:
        return str(self._source)

    def _error(self, exc: Exception, where: str) -> SyncError:
        """``exc`` from obstore as the SyncError an operator can act on."""
        raise NotImplementedError

    def _entry(self, meta: Mapping[str, Any]) -> RemoteEntry:
        """A listed object's entry: its digest from what the store reports."""
        raise NotImplementedError

    async def list(self) -> list[RemoteEntry]:
        import obstore

        entries: list[RemoteEntry] = []
        try:
            pages = aiter(obstore.list(self._store, chunk_size=1000))
            while (batch := await self._within(anext(pages, None))) is not None:
                entries.extend(self._entry(meta) for meta in batch)
        except SyncError:
            raise
        except Exception as exc:
            raise self._error(exc, self.url) from exc
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
            raise self._error(exc, f"{self.url}/{entry.path}") from exc

    async def write(self, key: str, data: bytes) -> None:
        import obstore

        try:
            await self._within(obstore.put_async(self._store, key, data))
        except SyncError:
            raise
        except Exception as exc:
            raise self._error(exc, f"{self.url}/{key}") from exc

    async def delete(self, key: str) -> None:
        import obstore

        try:
            await self._within(obstore.delete_async(self._store, key))
        except SyncError:
            raise
        except Exception as exc:
            raise self._error(exc, f"{self.url}/{key}") from exc

    async def close(self) -> None:
        """obstore's client holds no connection that needs closing, but its runtime threads hand each result back an
        instant after the await ends; an interpreter finalizing under one of them aborts the process (a race in
        pyo3-async-runtimes). A process that exits right after closing waits that instant out here."""
        await asyncio.sleep(CLOSE_GRACE_S)
