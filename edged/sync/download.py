"""Downloads into staging that resume where they stopped and are verified before anything uses them."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edged.sync.errors import SourceProblem, SyncError
from edged.sync.snapshots import READ_ONLY, SnapshotStore

if TYPE_CHECKING:
    from edged.sync.plan import RemoteEntry
    from edged.sync.sources import RemoteRepository
    from edged.sync.transfer import Progress, Throttle

log = logging.getLogger(__name__)

_HASH_BLOCK: Final = 1 << 20


@dataclass(frozen=True)
class Fetched:
    """A staged, verified download: its sha256 and how many bytes this run moved for it."""

    sha256: str
    transferred: int
    resumed_from: int


class _Digests:
    """The sha256 and MD5 of a file, computed as its bytes arrive, so that it is never read again to be checked."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.size = 0

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        self.md5.update(data)
        self.size += len(data)

    def read(self, path: Path, limit: int | None = None) -> None:
        """Take the first ``limit`` bytes of ``path`` (all of it when None): what an earlier run downloaded."""
        with open(path, "rb") as data:
            while (limit is None or self.size < limit) and (
                block := data.read(_HASH_BLOCK if limit is None else min(_HASH_BLOCK, limit - self.size))
            ):
                self.update(block)

    def check(self, entry: RemoteEntry) -> str:
        """The sha256, once the size and (when known) MD5 or signed sha256 match the listing."""
        if self.size != entry.size:
            raise SyncError(
                SourceProblem.VERIFY_FAILED, f"{entry.path}: got {self.size} bytes, the listing says {entry.size}"
            )
        kind, _, expected = entry.digest.partition(":")
        if kind == "md5" and self.md5.hexdigest() != expected:
            got = self.md5.hexdigest()
            raise SyncError(SourceProblem.VERIFY_FAILED, f"{entry.path}: MD5 {got}, the listing says {expected}")
        if kind == "sha256" and self.sha256.hexdigest() != expected:
            got = self.sha256.hexdigest()
            raise SyncError(
                SourceProblem.VERIFY_FAILED,
                f"{entry.path}: sha256 {got}, the signed metadata says {expected} (tampered or corrupted)",
            )
        return self.sha256.hexdigest()


async def fetch(
    source: RemoteRepository,
    store: SnapshotStore,
    entry: RemoteEntry,
    throttle: Throttle | None = None,
    progress: Progress | None = None,
) -> Fetched:
    """Stage ``entry``: append to what an earlier run left (a Range read from there), then check size and, where
    known, MD5 (from the store) or sha256 (from signed metadata). A file that fails the check is dropped, so the
    next run fetches it whole. The event loop only moves bytes: reading a file back and flushing it to the disk
    happen in worker threads, so that the requests the daemon serves meanwhile are not held up."""
    digests = _Digests()
    done = store.staged(entry)
    if done.exists():
        await asyncio.to_thread(digests.read, done)
        return Fetched(digests.check(entry), 0, entry.size)
    partial = store.partial(entry)
    start = partial.stat().st_size if partial.exists() else 0
    if start > entry.size:
        # More bytes than the object has: not a prefix of it, whatever it is.
        start = 0
    transferred = 0
    if start:
        # A run killed between making a verified download read-only and renaming it left it so; without this, every
        # later run would fail on opening it (root alone writes to a read-only file).
        os.chmod(partial, 0o600)
        await asyncio.to_thread(digests.read, partial, start)
    with open(partial, "r+b" if start else "wb") as out:
        out.truncate(start)
        out.seek(start)
        if start < entry.size:
            if start:
                log.info("resuming %s at byte %d of %d", entry.path, start, entry.size)
            async for chunk in source.read(entry, start):
                if start + transferred + len(chunk) > entry.size:
                    raise SyncError(SourceProblem.VERIFY_FAILED, f"{entry.path} is longer than its {entry.size} bytes")
                out.write(chunk)
                digests.update(chunk)
                transferred += len(chunk)
                if progress is not None:
                    progress.add(len(chunk))
                if throttle is not None:
                    await throttle.take(len(chunk))
        out.flush()
        await asyncio.to_thread(os.fsync, out.fileno())
    try:
        sha256 = digests.check(entry)
    except SyncError:
        partial.unlink()
        raise
    os.chmod(partial, READ_ONLY)
    os.rename(partial, done)
    return Fetched(sha256, transferred, start)
