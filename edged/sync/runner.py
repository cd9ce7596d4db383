"""One sync run: list, plan, download, verify, build, switch."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edged.sync.download import fetch
from edged.sync.errors import SourceProblem, SyncError
from edged.sync.plan import ListingRefused, check_listing, plan_delta
from edged.sync.snapshots import SnapshotStore

if TYPE_CHECKING:
    from edged.sync.sources import RemoteRepository

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncResult:
    """What a run did. ``repository`` is the local path to serve (the current snapshot's repository)."""

    source: str
    revision: str
    previous_revision: str | None
    repository: Path
    downloaded: tuple[str, ...]
    linked: tuple[str, ...]
    removed: tuple[str, ...]
    bytes_transferred: int
    seconds: float

    @property
    def changed(self) -> bool:
        return self.revision != self.previous_revision


async def sync_once(source: RemoteRepository, state_dir: Path) -> SyncResult:
    """Bring the local snapshot of ``source`` to the remote's content, or raise SyncError with the snapshot that was
    serving still serving. Downloads left unfinished by a failed or killed run resume on the next one."""
    began = time.monotonic()
    store = SnapshotStore(state_dir, source.url)
    with store.locked():
        store.prepare()
        try:
            listing = check_listing(await source.list())
        except ListingRefused as exc:
            raise SyncError(SourceProblem.REFUSED, f"{source.url}: {exc}") from exc
        current = store.current()
        intact = store.intact_files(current) if current is not None else {}
        plan = plan_delta(listing, intact)
        if current is not None and not plan.changed:
            # A run killed after its switch left the garbage collection undone.
            store.collect_garbage()
            return SyncResult(source.url, current.revision, current.revision, current.repository, (), (), (), 0, 0.0)
        log.info(
            "syncing %s to revision %s: %d files to download (%d bytes), %d unchanged, %d removed",
            source.url,
            plan.revision,
            len(plan.download),
            plan.download_bytes,
            len(plan.keep),
            len(plan.remove),
        )
        sha256: dict[str, str] = {}
        transferred = 0
        for entry in plan.download:
            fetched = await fetch(source, store, entry)
            sha256[entry.path] = fetched.sha256
            transferred += fetched.transferred
        snapshot = store.build(plan, current, sha256)
        store.switch(snapshot)
        store.collect_garbage()
        result = SyncResult(
            source=source.url,
            revision=snapshot.revision,
            previous_revision=current.revision if current is not None else None,
            repository=snapshot.repository,
            downloaded=tuple(entry.path for entry in plan.download),
            linked=tuple(entry.path for entry in plan.keep),
            removed=plan.remove,
            bytes_transferred=transferred,
            seconds=time.monotonic() - began,
        )
        log.info(
            "synced %s: revision %s serving (%d files downloaded, %d bytes, %.1f s)",
            source.url,
            result.revision,
            len(result.downloaded),
            transferred,
            result.seconds,
        )
        return result
