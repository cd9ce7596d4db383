"""One sync run: list, plan, download, verify, build, switch."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from edged.sync.download import Fetched, fetch
from edged.sync.errors import SourceProblem, SyncError
from edged.sync.plan import ListingRefused, Plan, RemoteEntry, changed_models, check_listing, plan_delta
from edged.sync.snapshots import SnapshotStore
from edged.sync.transfer import Progress, Throttle

if TYPE_CHECKING:
    from edged.sync.sources import RemoteRepository

log = logging.getLogger(__name__)

# The folder of a remote repository that holds edged's own objects (signed metadata, device status): never part of
# the repository that is served. A leading dot keeps Triton from reading it as a model folder.
METADATA_DIR: Final = ".edged"
# Downloads in flight at once: a few hide each request's round trip and the store's time to first byte (which
# dominate a repository of many small files) without splitting a device's link into many slow streams.
DOWNLOAD_CONCURRENCY: Final = 8


@dataclass(frozen=True)
class Listing:
    """What a source says the next revision is: its files (keys relative to the repository), and, for a signed
    source, the revision its metadata names (None: the revision is named after the listing's content)."""

    entries: list[RemoteEntry]
    revision: str | None = None
    signed: bool = False


class Verifier(Protocol):
    """Where the files of the next revision come from: a signed source's verified metadata. A sync without one
    trusts the object store's own listing (Triton's behaviour)."""

    async def listing(self, source: RemoteRepository) -> Listing:
        """The files to serve, with the digests (``sha256:<hex>``) and sizes they must have; raises SyncError."""
        ...


async def unsigned_listing(source: RemoteRepository) -> Listing:
    """The object store's listing, without edged's own folder."""
    return Listing([entry for entry in await source.list() if not _is_metadata(entry.path)])


def _is_metadata(path: str) -> bool:
    return path == METADATA_DIR or path.startswith(f"{METADATA_DIR}/")


async def _fetch_all(
    source: RemoteRepository,
    store: SnapshotStore,
    entries: Sequence[RemoteEntry],
    throttle: Throttle | None,
    progress: Progress,
) -> dict[str, Fetched]:
    """Fetch ``entries``, DOWNLOAD_CONCURRENCY at a time. The first failure stops the others; what they had staged
    stays in their partial files for the next run to resume."""
    fetched: dict[str, Fetched] = {}
    queue = iter(entries)

    async def worker() -> None:
        # Workers share one iterator: each takes the next entry as it finishes one, so a large file never holds
        # up the small ones behind it.
        for entry in queue:
            fetched[entry.path] = await fetch(source, store, entry, throttle, progress)
            progress.files_done += 1

    workers = [asyncio.create_task(worker()) for _ in range(min(DOWNLOAD_CONCURRENCY, len(entries)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return fetched


@dataclass(frozen=True)
class RunOptions:
    """How a run behaves: ``max_rate`` caps the download in bytes a second (None: no cap); a revision in
    ``held_back`` (one that failed its probation) is not downloaded again, the run reports it held back instead;
    ``reserve_bytes`` must stay free on the disk after the download; ``progress`` is updated as bytes arrive."""

    max_rate: int | None = None
    held_back: frozenset[str] = frozenset()
    reserve_bytes: int = 64 << 20
    progress: Progress | None = None
    # Checks the changed models of a built snapshot before the switch (the repository, their names) and returns
    # the ones that cannot be served, with why: they keep the files they had, the others switch.
    validate: Callable[[Path, frozenset[str]], Mapping[str, str]] | None = None


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
    signed: bool = False
    # The remote's revision when it was held back (it failed its probation before); nothing changed locally.
    held_back: str | None = None
    # The remote's revision (``revision`` is the local snapshot's, which differs when models were refused).
    remote_revision: str = ""
    # Changed models the validation refused before the switch, with why: they kept their files.
    refused: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.revision != self.previous_revision


async def sync_once(
    source: RemoteRepository,
    state_dir: Path,
    verifier: Verifier | None = None,
    options: RunOptions | None = None,
) -> SyncResult:
    """Bring the local snapshot of ``source`` to the remote's content, or raise SyncError with the snapshot that was
    serving still serving. Downloads left unfinished by a failed or killed run resume on the next one. With a
    ``verifier`` the files and their digests come from its verified metadata, not from the store's listing."""
    options = options or RunOptions()
    began = time.monotonic()
    store = SnapshotStore(state_dir, source.url)
    with store.locked():
        store.prepare()
        try:
            found = await verifier.listing(source) if verifier is not None else await unsigned_listing(source)
            listing = check_listing(found.entries)
        except ListingRefused as exc:
            raise SyncError(SourceProblem.REFUSED, f"{source.url}: {exc}") from exc
        current = store.current()
        intact = store.intact_files(current) if current is not None else {}
        plan = plan_delta(listing, intact)
        if found.revision is not None:
            plan = dataclasses.replace(plan, revision=found.revision)
        if current is not None and (not plan.changed or plan.revision in options.held_back):
            # A run killed after its switch left the garbage collection undone.
            await asyncio.to_thread(store.collect_garbage)
            held = plan.revision if plan.changed else None
            return SyncResult(
                source.url,
                current.revision,
                current.revision,
                current.repository,
                (),
                (),
                (),
                0,
                0.0,
                found.signed,
                held,
                plan.revision,
            )
        _check_space(store, plan, options.reserve_bytes)
        log.info(
            "syncing %s to revision %s: %d files to download (%d bytes), %d unchanged, %d removed",
            source.url,
            plan.revision,
            len(plan.download),
            plan.download_bytes,
            len(plan.keep),
            len(plan.remove),
        )
        throttle = Throttle(options.max_rate) if options.max_rate else None
        progress = options.progress or Progress()
        progress.total_bytes, progress.files_total = plan.download_bytes, len(plan.download)
        progress.add(sum(store.staged_bytes(entry) for entry in plan.download))
        fetched = await _fetch_all(source, store, plan.download, throttle, progress)
        sha256 = {path: done.sha256 for path, done in fetched.items()}
        transferred = sum(done.transferred for done in fetched.values())
        # Disk work (thousands of links, fsyncs, removing an old snapshot) runs in a worker thread: the daemon's
        # event loop serves requests meanwhile.
        snapshot = await asyncio.to_thread(store.build, plan, current, sha256)
        refused: Mapping[str, str] = {}
        if options.validate is not None:
            changed = frozenset(changed_models((*sha256, *plan.remove)))
            refused = await asyncio.to_thread(options.validate, snapshot.repository, changed)
            if refused:
                # The refused models keep what serves now; the snapshot with their new files is never served.
                log.error(
                    "revision %s of %s: %s",
                    plan.revision,
                    source.url,
                    "; ".join(f"model '{name}' is refused: {why}" for name, why in sorted(refused.items())),
                )
                snapshot = await asyncio.to_thread(
                    store.build_mixed, snapshot, current, refused, f"{plan.revision}~partial"
                )
        store.switch(snapshot)
        await asyncio.to_thread(store.collect_garbage)
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
            signed=found.signed,
            remote_revision=plan.revision,
            refused=refused,
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


def _check_space(store: SnapshotStore, plan: Plan, reserve: int) -> None:
    """Refuse a run the disk cannot hold before it downloads anything: a full disk mid-way would leave the state
    database and the logs without room, and the run could not finish anyway."""
    needed = sum(entry.size - store.staged_bytes(entry) for entry in plan.download)
    free = shutil.disk_usage(store.root).free
    if needed + reserve > free:
        raise SyncError(
            SourceProblem.NO_SPACE,
            f"{store.url}: the new revision needs {needed} bytes and {reserve} must stay free, "
            f"but {free} bytes are free under {store.root}",
        )
