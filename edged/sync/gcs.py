"""GCS repositories through gcloud-aio-storage's JSON API client (which the GCS emulators speak too): listing,
ranged reads, writes and deletes, and GCS's errors told apart."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import io
import json
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from edged.sync.errors import SourceProblem, SyncError
from edged.sync.plan import RemoteEntry
from edged.sync.proxies import proxy_for
from edged.sync.sources import (
    CHUNK_BYTES,
    GCS_API_ROOT,
    ClientOptions,
    SourceURL,
    relative_key,
)

if TYPE_CHECKING:
    import aiohttp
    from gcloud.aio.storage import Storage

    from edged.sync.credentials import GCSCredentials


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
    path = relative_key(name, prefix)
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
