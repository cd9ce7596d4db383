"""Signed repositories: the files of a revision come from The Update Framework's metadata, verified by python-tuf's
ngclient against a root of trust installed on the device.

The bucket stays a plain Triton repository: the model files sit at their usual keys (the target paths), and the
metadata sits beside them in ``<prefix>/.edged/metadata/`` (``N.root.json``, ``timestamp.json``,
``N.snapshot.json``, ``N.targets.json``: consistent snapshots for metadata). ngclient does the whole client workflow
(root rotation, rollback, freeze, mix-and-match and endless-data checks); it reads the bucket through the same
``RemoteRepository`` as the files, from a worker thread, since ngclient is synchronous and the clients are async.
The files themselves are downloaded by the sync run, which checks each against the sha256 and length signed here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edged.sync.errors import INSTALL_HINT, SourceProblem, SyncError
from edged.sync.plan import RemoteEntry
from edged.sync.runner import METADATA_DIR, Listing

if TYPE_CHECKING:
    from tuf.api.metadata import Targets

    from edged.sync.sources import RemoteRepository

log = logging.getLogger(__name__)

# Where the metadata lives, relative to the repository prefix; shared with edged.sync.publish.
METADATA_PREFIX: Final = f"{METADATA_DIR}/metadata"
# Seconds one read of a metadata object may take as a whole, so that a stalled link cannot hold the thread forever.
METADATA_READ_TIMEOUT_S: Final = 120.0


def _import_tuf() -> None:
    # python-tuf is part of the sync extra; say so before any run rather than fail inside one.
    try:
        import tuf.ngclient  # noqa: F401
    except ImportError as exc:
        raise SyncError(SourceProblem.MISSING_CLIENT, f"signed sources need python-tuf: {INSTALL_HINT}") from exc


class TufVerifier:
    """A Verifier for signed sources. ``trusted_root`` is the root metadata installed on the device (the root of
    trust); ``metadata_dir`` is the device's cache of verified metadata for this source, which keeps the versions it
    has seen (the defence against rollback) and the roots it has rotated through."""

    def __init__(self, trusted_root: Path, metadata_dir: Path) -> None:
        _import_tuf()
        self.trusted_root = trusted_root
        self.metadata_dir = metadata_dir

    async def listing(self, source: RemoteRepository) -> Listing:
        try:
            bootstrap = self.trusted_root.read_bytes()
        except OSError as exc:
            raise SyncError(
                SourceProblem.UNTRUSTED, f"{source.url}: the trusted root {self.trusted_root} cannot be read: {exc}"
            ) from exc
        self.metadata_dir.mkdir(parents=True, exist_ok=True)
        fetcher = _RepositoryFetcher(source, asyncio.get_running_loop())
        targets = await asyncio.to_thread(self._refresh, source, fetcher, bootstrap)
        entries: list[RemoteEntry] = []
        for path, target in sorted(targets.targets.items()):
            sha256 = target.hashes.get("sha256")
            if sha256 is None:
                raise SyncError(SourceProblem.UNTRUSTED, f"{source.url}: target '{path}' is signed without a sha256")
            entries.append(RemoteEntry(path, target.length, f"sha256:{sha256}", None))
        return Listing(entries, f"v{targets.version}", signed=True)

    def _refresh(self, source: RemoteRepository, fetcher: _RepositoryFetcher, bootstrap: bytes) -> Targets:
        """ngclient's refresh (in a worker thread), then the top-level targets it verified, read from its cache."""
        from tuf.api import exceptions
        from tuf.api.metadata import Metadata, Targets
        from tuf.ngclient import Updater

        try:
            # The installed root is the anchor on every run; the cache's root_history carries the rotations since.
            updater = Updater(
                str(self.metadata_dir), f"{METADATA_PREFIX}/", fetcher=fetcher.fetcher, bootstrap=bootstrap
            )
            try:
                updater.refresh()
            finally:
                fetcher.close()
            verified = Metadata[Targets].from_file(str(self.metadata_dir / "targets.json"))
        except SyncError:
            raise
        except (exceptions.RepositoryError, exceptions.DownloadError) as exc:
            why = _explain(exc, fetcher, self.metadata_dir)
            raise SyncError(SourceProblem.UNTRUSTED, f"{source.url}: {why}") from exc
        except (OSError, ValueError) as exc:
            raise SyncError(SourceProblem.UNTRUSTED, f"{source.url}: the trusted metadata is unusable: {exc}") from exc
        if verified.signed.delegations is not None:
            # edged publish never delegates; a delegated role's targets would be missing from the listing.
            raise SyncError(SourceProblem.UNTRUSTED, f"{source.url}: delegated targets are not supported")
        return verified.signed


def _explain(exc: Exception, fetcher: _RepositoryFetcher, metadata_dir: Path) -> str:
    """What TUF refused, in an operator's words (ngclient's messages name the check, not the attack)."""
    from tuf.api import exceptions

    text = str(exc) or type(exc).__name__
    if isinstance(exc, exceptions.DownloadHTTPError) and exc.status_code == 404:
        missing = fetcher.missing[-1] if fetcher.missing else "metadata"
        if missing.endswith("timestamp.json"):
            return (
                f"no signed metadata ({missing} is missing) but a trusted root is configured for this source; "
                "publish it with `edged publish`, or sync it as an unsigned source"
            )
        return f"signed metadata incomplete: {missing} is missing"
    if isinstance(exc, exceptions.DownloadLengthMismatchError):
        return f"endless data: {fetcher.last or 'a metadata file'} is longer than allowed ({text})"
    if isinstance(exc, exceptions.DownloadError):
        return f"metadata download failed: {text}"
    if isinstance(exc, exceptions.UnsignedMetadataError):
        return f"signed by a key the root does not trust, or not by enough of them ({text})"
    if isinstance(exc, exceptions.ExpiredMetadataError):
        when = _expiry(text, fetcher, metadata_dir)
        return f"expired metadata (a freeze attack, or a repository not re-signed in time): {when}"
    if isinstance(exc, exceptions.BadVersionNumberError):
        if "must be >=" in text:
            return f"rollback: the metadata is older than the version this device trusts ({text})"
        return f"mix and match: snapshot and targets versions do not match ({text})"
    if isinstance(exc, exceptions.LengthOrHashMismatchError):
        return f"metadata does not match the length or hash its parent names ({text})"
    return f"refused ({type(exc).__name__}: {text})"


def _expiry(text: str, fetcher: _RepositoryFetcher, metadata_dir: Path) -> str:
    """ngclient's message with the date the refused metadata expired, read from what was downloaded last (or, for
    a root, from the cache, where ngclient keeps the root it trusts)."""
    from tuf.api.metadata import Metadata

    role = text.split(".json", 1)[0].rsplit(maxsplit=1)[-1] if ".json" in text else None
    if role is None and text.startswith("New "):
        role = text.split()[1]
    data = fetcher.fetched.get(role) if role else None
    try:
        if data is None and role == "root":
            data = (metadata_dir / "root.json").read_bytes()
        if data is None:
            return text
        expires = Metadata.from_bytes(data).signed.expires
    except Exception:  # an unreadable file was already refused as such; the message just lacks the date
        return text
    return f"{role} expired on {expires.isoformat(timespec='seconds')}"


class _RepositoryFetcher:
    """ngclient's FetcherInterface over a RemoteRepository: called from the worker thread, it runs each read on the
    event loop and hands the chunks over one at a time, so that ngclient's length limit stops an endless object
    after one chunk too many. A missing object is HTTP 404 to ngclient, which ends root rotation."""

    def __init__(self, source: RemoteRepository, loop: asyncio.AbstractEventLoop) -> None:
        from tuf.ngclient.fetcher import FetcherInterface

        self._source = source
        self._loop = loop
        # Keyed by role ("timestamp", "snapshot", ...): the bytes read last, for the date of an expiry.
        self.fetched: dict[str, bytes] = {}
        self.missing: list[str] = []
        self.last: str | None = None
        # ngclient drops a read it stopped (an endless file) without closing it: closed in ``close``.
        self.opened: list[Generator[bytes]] = []
        outer = self

        class Fetcher(FetcherInterface):
            def _fetch(self, url: str) -> Iterator[bytes]:
                chunks = outer.chunks(url)
                outer.opened.append(chunks)
                return chunks

        self.fetcher = Fetcher()

    def close(self) -> None:
        """End every read ngclient left open, while the event loop still runs (from the worker thread)."""
        for chunks in self.opened:
            chunks.close()
        self.opened.clear()

    def chunks(self, key: str) -> Generator[bytes]:
        from tuf.api import exceptions

        self.last = f"{self._source.url}/{key}"
        role = key.rsplit("/", 1)[-1].removesuffix(".json").rsplit(".", 1)[-1]
        stream: AsyncIterator[bytes] = self._source.read(RemoteEntry(key, 0, "", None), 0)
        kept = bytearray()
        try:
            while True:
                future = asyncio.run_coroutine_threadsafe(_next(stream), self._loop)
                try:
                    chunk = future.result(METADATA_READ_TIMEOUT_S)
                except TimeoutError as exc:
                    future.cancel()
                    raise SyncError(SourceProblem.UNREACHABLE, f"{self.last}: no answer") from exc
                except SyncError as exc:
                    # A missing bucket is no missing file: it stays NOT_FOUND (S3 names it; GCS answers 404 alike).
                    if exc.problem is SourceProblem.NOT_FOUND and not kept and "NoSuchBucket" not in str(exc):
                        self.missing.append(f"{self._source.url}/{key}")
                        raise exceptions.DownloadHTTPError(str(exc), 404) from exc
                    raise
                if chunk is None:
                    break
                kept += chunk
                yield chunk
        finally:
            # Not waited for: this may run on the event loop's own thread, should a dropped read be collected there.
            if not self._loop.is_closed():
                asyncio.run_coroutine_threadsafe(_close(stream), self._loop)
        self.fetched[role] = bytes(kept)


async def _next(stream: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


async def _close(stream: AsyncIterator[bytes]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()
