"""Downloads into staging that resume where they stopped and are verified before anything uses them."""

from __future__ import annotations

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


async def fetch(
    source: RemoteRepository,
    store: SnapshotStore,
    entry: RemoteEntry,
    throttle: Throttle | None = None,
    progress: Progress | None = None,
) -> Fetched:
    """Stage ``entry``: append to what an earlier run left (a Range read from there), then check size and, where
    known, MD5 (from the store) or sha256 (from signed metadata). A file that fails the check is dropped, so the
    next run fetches it whole."""
    done = store.staged(entry)
    if done.exists():
        return Fetched(_verify(done, entry), 0, entry.size)
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
                transferred += len(chunk)
                if progress is not None:
                    progress.add(len(chunk))
                if throttle is not None:
                    await throttle.take(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    try:
        sha256 = _verify(partial, entry)
    except SyncError:
        partial.unlink()
        raise
    os.chmod(partial, READ_ONLY)
    os.rename(partial, done)
    return Fetched(sha256, transferred, start)


def _verify(path: Path, entry: RemoteEntry) -> str:
    """The file's sha256, once its size and (when known) MD5 or signed sha256 match the listing."""
    size = path.stat().st_size
    if size != entry.size:
        raise SyncError(SourceProblem.VERIFY_FAILED, f"{entry.path}: got {size} bytes, the listing says {entry.size}")
    sha256 = hashlib.sha256()
    md5 = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as data:
        while block := data.read(_HASH_BLOCK):
            sha256.update(block)
            md5.update(block)
    kind, _, expected = entry.digest.partition(":")
    if kind == "md5" and md5.hexdigest() != expected:
        got = md5.hexdigest()
        raise SyncError(SourceProblem.VERIFY_FAILED, f"{entry.path}: MD5 {got}, the listing says {expected}")
    if kind == "sha256" and sha256.hexdigest() != expected:
        got = sha256.hexdigest()
        raise SyncError(
            SourceProblem.VERIFY_FAILED,
            f"{entry.path}: sha256 {got}, the signed metadata says {expected} (tampered or corrupted)",
        )
    return sha256.hexdigest()
