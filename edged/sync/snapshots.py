"""Local-first snapshots of one remote repository under the state directory.

Layout, per source (``<state dir>/sync/<source id>/``)::

    current -> snapshots/r000002     the snapshot being served (a symbolic link, replaced by rename)
    previous -> snapshots/r000001    the one before it, kept for rollback
    good -> snapshots/r000001        the last known good one: it passed its probation (edged.core.repository.probation)
    snapshots/r00000N/repo/...       a complete Triton repository, read-only files
    snapshots/r00000N/manifest.json  path -> size, remote digest, sha256
    staging/objects/<key>.part       a download in progress (appended to, so it resumes where it stopped)
    staging/objects/<key>            a download complete and verified
    staging/next/                    the snapshot being built
    lock                             held (flock) by the one run allowed at a time

Every step either leaves ``current`` as it was or replaces it whole: a snapshot is built in ``staging/next`` and
renamed into ``snapshots/`` only when complete and flushed, and ``current`` changes by one rename of a new link. A
run killed at any point leaves the old snapshot serving, its downloads resumable, and leftovers that the next run
removes. Every path written is checked to lie inside this folder (edged.core.confined) after the keys were checked
(plan.key_problem).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from edged.core.confined import PathOutsideRoot, inside, make_dirs, remove_tree
from edged.sync.errors import SourceProblem, SyncError
from edged.sync.paths import source_root
from edged.sync.plan import LocalEntry, Plan, RemoteEntry

log = logging.getLogger(__name__)

REPOSITORY_DIR: Final = "repo"
MANIFEST: Final = "manifest.json"
_SNAPSHOT_NAME: Final = re.compile(r"r(\d{6,})")
# Snapshot files are never edited in place: a change is a new file in a new snapshot, and hard links share inodes.
READ_ONLY: Final = 0o444


class _ManifestFile(msgspec.Struct, frozen=True):
    size: int
    digest: str
    sha256: str


class _Manifest(msgspec.Struct, frozen=True):
    source: str
    revision: str
    files: dict[str, _ManifestFile]


@dataclass(frozen=True)
class Snapshot:
    """One complete local copy of a remote revision."""

    path: Path
    source: str
    revision: str
    files: Mapping[str, LocalEntry]

    @property
    def repository(self) -> Path:
        return self.path / REPOSITORY_DIR


def staging_key(entry: RemoteEntry) -> str:
    """A staged download's name: a changed object (other size or digest) never resumes an older one's bytes."""
    return hashlib.sha256(f"{entry.path}\0{entry.size}\0{entry.digest}".encode()).hexdigest()[:32]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Linker:
    """Hard-links files into a snapshot being built, each folder made and checked to lie inside it once: a
    repository of a thousand files in a few folders costs a thousand links, not a thousand walks of the path. Only
    the run holding the lock writes into the snapshot being built, so a folder checked once stays what it was."""

    def __init__(self, repository: Path) -> None:
        self._repository = repository
        self._folders: dict[Path, Path] = {}

    def __call__(self, source: Path, key: str) -> None:
        target = self._repository / key
        folder = self._folders.get(target.parent)
        if folder is None:
            make_dirs(self._repository, target.parent)
            folder = self._folders[target.parent] = inside(self._repository, target).parent
        if target.name in ("", ".", ".."):
            raise PathOutsideRoot(f"{target} is not a file name")
        os.link(source, folder / target.name, follow_symlinks=False)


class SnapshotStore:
    """The snapshots of one source. Only one run at a time may change them (``locked``)."""

    def __init__(self, state_dir: Path, url: str) -> None:
        self.url = url
        self.root = source_root(state_dir, url)
        self.snapshots = self.root / "snapshots"
        self.objects = self.root / "staging" / "objects"
        self.next = self.root / "staging" / "next"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the source's lock; a second run (another process included) fails instead of interleaving."""
        make_dirs(self.root.parent, self.root)
        fd = os.open(inside(self.root, self.root / "lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SyncError(SourceProblem.BUSY, self.url) from None
            yield
        finally:
            os.close(fd)

    # -- reading

    def _linked(self, name: str) -> Snapshot | None:
        link = self.root / name
        try:
            target = os.readlink(link)
        except OSError:
            return None
        match = _SNAPSHOT_NAME.fullmatch(Path(target).name)
        if Path(target).parent != Path("snapshots") or match is None:
            log.error("ignored %s: it points at %s, not at a snapshot", link, target)
            return None
        return self.load(self.snapshots / Path(target).name)

    def current(self) -> Snapshot | None:
        return self._linked("current")

    def previous(self) -> Snapshot | None:
        return self._linked("previous")

    def good(self) -> Snapshot | None:
        return self._linked("good")

    @property
    def serving_path(self) -> Path:
        """The repository the server reads: through the ``current`` link, so that a switch needs no new path."""
        return self.root / "current" / REPOSITORY_DIR

    def load(self, path: Path) -> Snapshot | None:
        try:
            manifest = msgspec.json.decode((path / MANIFEST).read_bytes(), type=_Manifest)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("snapshot %s has no readable manifest: %s", path, exc)
            return None
        files = {key: LocalEntry(key, value.size, value.digest, value.sha256) for key, value in manifest.files.items()}
        return Snapshot(path, manifest.source, manifest.revision, files)

    def intact_files(self, snapshot: Snapshot) -> dict[str, LocalEntry]:
        """The snapshot's files that are still there with their recorded size: only those may be hard-linked into
        the next one; a file lost or truncated on disk is downloaded again."""
        intact: dict[str, LocalEntry] = {}
        for key, entry in snapshot.files.items():
            try:
                info = os.lstat(snapshot.repository / key)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_size == entry.size:
                intact[key] = entry
        return intact

    # -- staging

    def staged(self, entry: RemoteEntry) -> Path:
        return inside(self.root, self.objects / staging_key(entry))

    def partial(self, entry: RemoteEntry) -> Path:
        return inside(self.root, self.objects / f"{staging_key(entry)}.part")

    def staged_bytes(self, entry: RemoteEntry) -> int:
        """How much of ``entry`` earlier runs already downloaded."""
        for path in (self.staged(entry), self.partial(entry)):
            with contextlib.suppress(OSError):
                return min(path.stat().st_size, entry.size)
        return 0

    def prepare(self) -> None:
        """Remove what a run killed mid-way left behind, except its downloads."""
        make_dirs(self.root, self.objects)
        remove_tree(self.root, self.next)
        for leftover in self.root.glob(".*.link"):
            remove_tree(self.root, leftover)

    # -- building and switching

    def build(self, plan: Plan, current: Snapshot | None, sha256: Mapping[str, str]) -> Snapshot:
        """The next snapshot, complete and flushed under ``snapshots/``: kept files hard-linked from ``current``,
        downloaded ones from staging. ``sha256`` holds the digests of the downloaded files."""
        make_dirs(self.root, self.next / REPOSITORY_DIR)
        repository = self.next / REPOSITORY_DIR
        link = _Linker(repository)
        files: dict[str, _ManifestFile] = {}
        for entry in plan.keep:
            assert current is not None, "a plan keeps files only from a current snapshot"
            link(current.repository / entry.path, entry.path)
            files[entry.path] = _ManifestFile(entry.size, entry.digest, current.files[entry.path].sha256)
        for entry in plan.download:
            link(self.staged(entry), entry.path)
            files[entry.path] = _ManifestFile(entry.size, entry.digest, sha256[entry.path])
        return self._seal(_Manifest(self.url, plan.revision, dict(sorted(files.items()))))

    def _seal(self, manifest: _Manifest) -> Snapshot:
        """Write the manifest of ``staging/next``, flush it all, and rename it into ``snapshots/``."""
        make_dirs(self.root, self.next / REPOSITORY_DIR)
        manifest_path = inside(self.root, self.next / MANIFEST)
        with open(manifest_path, "wb") as out:
            out.write(msgspec.json.encode(manifest))
            out.flush()
            os.fsync(out.fileno())
        for folder, _dirs, _files in os.walk(self.next, topdown=False):
            fsync_dir(Path(folder))
        make_dirs(self.root, self.snapshots)
        final = inside(self.root, self.snapshots / self._next_name())
        os.rename(self.next, final)
        fsync_dir(self.snapshots)
        loaded = self.load(final)
        assert loaded is not None, "a snapshot just written has its manifest"
        return loaded

    def _next_name(self) -> str:
        numbers = [int(m[1]) for p in self.snapshots.iterdir() if (m := _SNAPSHOT_NAME.fullmatch(p.name))]
        return f"r{max(numbers, default=0) + 1:06d}"

    def switch(self, snapshot: Snapshot) -> None:
        """Serve ``snapshot``: ``previous`` takes the old ``current``, then ``current`` is replaced in one rename.
        Killed between the two, both name the old snapshot, which is still a complete one."""
        old = self.current()
        if old is not None:
            self._point("previous", old.path)
        self._point("current", snapshot.path)

    def rollback(self) -> Snapshot:
        """Serve the previous snapshot again (the one being left becomes ``previous``)."""
        previous = self.previous()
        if previous is None:
            raise RuntimeError(f"{self.url} has no previous snapshot to roll back to")
        self.switch(previous)
        return previous

    def _point(self, name: str, snapshot: Path) -> None:
        temporary = inside(self.root, self.root / f".{name}.link")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        os.symlink(Path("snapshots") / snapshot.name, temporary)
        os.replace(temporary, inside(self.root, self.root / name))
        fsync_dir(self.root)

    def ensure_current(self) -> Snapshot:
        """The current snapshot; on a device that never synced, an empty one (revision ``""``), so that the server
        starts at once on an empty repository and loads the models when the first sync completes."""
        with self.locked():
            current = self.current()
            if current is not None:
                return current
            self.prepare()
            empty = self.build(Plan((), (), (), ""), None, {})
            self.switch(empty)
            self.mark_good(empty)
            return empty

    def mark_good(self, snapshot: Snapshot) -> None:
        """Record ``snapshot`` as the last known good one: what a failed probation rolls back to."""
        self._point("good", snapshot.path)

    def build_mixed(self, base: Snapshot, donor: Snapshot | None, models: Iterable[str], revision: str) -> Snapshot:
        """A snapshot equal to ``base`` except for the folders of ``models``, which are taken from ``donor`` (or left
        out when ``donor`` has none): the last known good files of the models that failed their probation, beside
        the new files of those that passed. Every file is a hard link; nothing is downloaded."""
        held = set(models)

        def model_of(path: str) -> str:
            return path.partition("/")[0]

        keep = [
            RemoteEntry(key, entry.size, entry.digest) for key, entry in base.files.items() if model_of(key) not in held
        ]
        taken = [
            RemoteEntry(key, entry.size, entry.digest)
            for key, entry in (donor.files.items() if donor is not None else ())
            if model_of(key) in held
        ]
        make_dirs(self.root, self.next / REPOSITORY_DIR)
        link = _Linker(self.next / REPOSITORY_DIR)
        files: dict[str, _ManifestFile] = {}
        for origin, entries in ((base, keep), (donor, taken)):
            assert origin is not None or not entries
            for entry in entries:
                assert origin is not None
                link(origin.repository / entry.path, entry.path)
                files[entry.path] = _ManifestFile(entry.size, entry.digest, origin.files[entry.path].sha256)
        return self._seal(_Manifest(self.url, revision, dict(sorted(files.items()))))

    def collect_garbage(self) -> None:
        """Remove every snapshot but ``current``, ``previous`` and ``good``, and every staged download (they are
        linked into the snapshot that needed them, or belong to a revision that is gone)."""
        keep = {s.path.name for s in (self.current(), self.previous(), self.good()) if s is not None}
        if self.snapshots.is_dir():
            for path in self.snapshots.iterdir():
                if path.name not in keep:
                    remove_tree(self.root, path)
        remove_tree(self.root, self.root / "staging")
