"""What a sync run has to do, decided from two listings: pure functions, no I/O.

A remote key becomes a local path only through ``key_problem``: every component must be a name a folder entry can
have (the same rule as a model name, edged.core.names), so that no key can reach outside the snapshot, whatever the
object store allows. Change is decided by digest and size, never by timestamp: an object store's modification times
move on copies and re-uploads of identical bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from edged.core.names import model_name_problem, printable

# Linux's PATH_MAX, and a depth no Triton repository comes near (model/version/file plus a few folders).
MAX_KEY_BYTES: Final = 4096
MAX_KEY_DEPTH: Final = 32


@dataclass(frozen=True)
class RemoteEntry:
    """One object of a remote repository, its key relative to the repository's prefix."""

    path: str
    size: int
    # "md5:<hex>" when the store reports the content's MD5 (S3 single-part ETag, GCS md5Hash), so the download can
    # be verified; otherwise "etag:<etag>", which still tells a change apart but proves nothing about the bytes;
    # "sha256:<hex>" for a signed source, from its verified targets metadata.
    digest: str
    # What a conditional read sends so that an object replaced between listing and download is noticed (S3: the
    # ETag, GCS: the generation); None when the store has none.
    version: str | None = None


@dataclass(frozen=True)
class LocalEntry:
    """One file of a local snapshot, as its manifest records it."""

    path: str
    size: int
    digest: str
    sha256: str


@dataclass(frozen=True)
class Plan:
    """The delta between a remote listing and the current snapshot."""

    download: tuple[RemoteEntry, ...]
    keep: tuple[RemoteEntry, ...]
    remove: tuple[str, ...]
    revision: str

    @property
    def changed(self) -> bool:
        return bool(self.download or self.remove)

    @property
    def download_bytes(self) -> int:
        return sum(entry.size for entry in self.download)


class ListingRefused(ValueError):
    """A remote listing cannot become a snapshot (a key that would escape it, a file that is also a folder)."""


def key_problem(key: str) -> str | None:
    """Why a remote key cannot be a path inside a snapshot, or None when it can."""
    if not key:
        return "it is empty"
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid Unicode"
    if size > MAX_KEY_BYTES:
        return f"it is {size} bytes long, more than {MAX_KEY_BYTES}"
    if key.startswith("/"):
        return "it is an absolute path"
    parts = key.split("/")
    if len(parts) > MAX_KEY_DEPTH:
        return f"it is {len(parts)} folders deep, more than {MAX_KEY_DEPTH}"
    for part in parts:
        problem = model_name_problem(part)
        if problem is not None:
            return f"its component '{printable(part)}' is refused: {problem}"
    return None


def check_listing(entries: Iterable[RemoteEntry]) -> list[RemoteEntry]:
    """The listing as a snapshot can hold it, sorted by path: folder markers (empty objects whose key is a folder of
    other keys, as consoles create them) are dropped; any key that ``key_problem`` refuses, a duplicate, or a file
    that is also a folder refuses the whole listing, so that a repository is taken complete or not at all."""
    by_path: dict[str, RemoteEntry] = {}
    for entry in entries:
        problem = key_problem(entry.path)
        if problem is not None:
            raise ListingRefused(f"remote key '{printable(entry.path)}' is refused: {problem}")
        if entry.size < 0:
            raise ListingRefused(f"remote key '{printable(entry.path)}' has a negative size")
        if entry.path in by_path:
            raise ListingRefused(f"remote key '{printable(entry.path)}' is listed twice")
        by_path[entry.path] = entry
    folders = {"/".join(path.split("/")[:depth]) for path in by_path for depth in range(1, path.count("/") + 1)}
    kept: list[RemoteEntry] = []
    for path, entry in sorted(by_path.items()):
        if path in folders:
            if entry.size != 0:
                raise ListingRefused(f"remote key '{printable(path)}' is both a file and a folder")
            continue
        kept.append(entry)
    return kept


def revision_of(entries: Iterable[RemoteEntry]) -> str:
    """A name for the content of a listing: equal listings (path, size, digest) give equal revisions."""
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.path):
        digest.update(f"{entry.path}\0{entry.size}\0{entry.digest}\n".encode())
    return digest.hexdigest()[:16]


def plan_delta(remote: Sequence[RemoteEntry], current: Mapping[str, LocalEntry]) -> Plan:
    """What to download (new or changed by digest or size), what to hard-link from ``current``, what goes away.
    A file whose recorded sha256 is the signed one is kept whatever digest the store gave it before, so that
    signing a source (or re-signing it) downloads nothing again. ``remote`` must have passed ``check_listing``."""
    download: list[RemoteEntry] = []
    keep: list[RemoteEntry] = []
    for entry in remote:
        local = current.get(entry.path)
        if local is not None and local.size == entry.size and _same_content(local, entry):
            keep.append(entry)
        else:
            download.append(entry)
    listed = {entry.path for entry in remote}
    remove = tuple(sorted(path for path in current if path not in listed))
    return Plan(tuple(download), tuple(keep), remove, revision_of(remote))


def _same_content(local: LocalEntry, remote: RemoteEntry) -> bool:
    return remote.digest in (local.digest, f"sha256:{local.sha256}")


def changed_models(paths: Iterable[str]) -> set[str]:
    """The model folders a set of changed repository paths belongs to."""
    return {path.partition("/")[0] for path in paths if path}
