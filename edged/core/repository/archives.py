"""Archives that come from the network (model uploads): every member inspected before anything is written, then
extracted with the sizes enforced as the bytes come out.

Accepted: ``.zip`` (stored or deflated members) and ``.tar`` / ``.tar.gz`` (any compression tarfile reads). Refused,
naming the member (class 14 of the security notes): an absolute path, a ``..`` component, a backslash, a NUL or
other control character, a component that could not be a folder name (edged.core.names), symbolic and hard links,
device files, FIFOs and sparse members, encrypted zip members, the same path twice (or a file where a folder is),
more than ``max_members`` members, a path deeper than ``MAX_DEPTH``, and members whose declared sizes add up past
``max_extracted_bytes``. While extracting, a member that yields more bytes than it declared (a lying zip header) or a
corrupt member (bad CRC) fails the extraction; the caller removes what was written.

A tar's member list is only known by reading through the (decompressed) stream, so inspection walks it once and
stops as soon as a limit is passed: a gzip bomb costs at most ``max_extracted_bytes`` of decompression, never disk.
A zip's member count is read from its end record before its central directory is loaded, so a zip of millions of
empty members is refused before they are held in memory.
"""

from __future__ import annotations

import os
import stat
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Literal

from edged.core.confined import PathOutsideRoot, make_dirs
from edged.core.names import model_name_problem, printable
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Iterator

ArchiveKind = Literal["zip", "tar"]

# Deepest member path accepted: a model folder is rarely more than a few levels deep.
MAX_DEPTH = 32
_CHUNK = 1024 * 1024
# Folders made by macOS when it zips a folder; they carry no model files.
_IGNORED_TOP = "__MACOSX"
_IGNORED_NAMES = frozenset({".DS_Store"})


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    max_members: int = 10_000
    max_extracted_bytes: int = 8 * 1024**3


@dataclass(frozen=True, slots=True)
class Member:
    """One member of an archive: its path (normalised, relative), folder or file, and its declared size."""

    path: PurePosixPath
    is_dir: bool
    size: int


class ArchiveRefused(EdgedError):
    """The archive cannot be accepted; ``message`` says which member and why (no path of this machine in it)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARG, message)


def member_path(name: str) -> PurePosixPath | None:
    """The relative path an archive member names, None for the archive's root itself (``./``); ArchiveRefused for a
    name that is unsafe anywhere."""
    if "\0" in name:
        raise _refused(name, "its name contains a NUL character")
    if "\\" in name:
        raise _refused(name, "its name contains a backslash")
    if name.startswith("/"):
        raise _refused(name, "it is an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _refused(name, "its path has a '..' component")
    for part in parts:
        problem = model_name_problem(part)
        if problem is not None:
            raise _refused(name, f"a component of its path cannot be a file name ({problem})")
    if len(parts) > MAX_DEPTH:
        raise _refused(name, f"its path is more than {MAX_DEPTH} folders deep")
    return PurePosixPath(*parts) if parts else None


def inspect(path: Path, kind: ArchiveKind, limits: ArchiveLimits) -> list[Member]:
    """Every member of the archive at ``path``, checked; nothing is written."""
    members = _zip_members(path, limits) if kind == "zip" else _tar_members(path, limits)
    seen: dict[PurePosixPath, bool] = {}
    for member in members:
        if member.path in seen and not (member.is_dir and seen[member.path]):
            raise _refused(str(member.path), "the archive holds this path more than once")
        seen[member.path] = member.is_dir
    for member in members:
        for parent in member.path.parents:
            if seen.get(parent) is False:
                raise _refused(str(member.path), f"'{printable(str(parent))}' is a file in the archive, not a folder")
    return members


def _ignored(path: PurePosixPath) -> bool:
    return path.parts[0] == _IGNORED_TOP or path.name in _IGNORED_NAMES


def _zip_members(path: Path, limits: ArchiveLimits) -> list[Member]:
    count = _zip_entry_count(path)
    if count > limits.max_members:
        raise ArchiveRefused(f"the archive has {count} members, more than the {limits.max_members} accepted")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ArchiveRefused(f"the archive is not a readable zip file: {error}") from None
    if len(infos) > limits.max_members:
        raise ArchiveRefused(f"the archive has {len(infos)} members, more than the {limits.max_members} accepted")
    members: list[Member] = []
    total = 0
    for info in infos:
        name = info.filename
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if kind == stat.S_IFLNK:
            raise _refused(name, "it is a symbolic link")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise _refused(name, "it is a device file, FIFO or socket, not a file or folder")
        if info.flag_bits & 0x1:
            raise _refused(name, "it is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _refused(name, "it is compressed with a method other than deflate")
        relative = member_path(name)
        if relative is None or _ignored(relative):
            continue
        is_dir = info.is_dir() or kind == stat.S_IFDIR
        size = 0 if is_dir else info.file_size
        total = _add_size(total, size, name, limits)
        members.append(Member(relative, is_dir, size))
    return members


def _zip_entry_count(path: Path) -> int:
    """The member count a zip's end of central directory record declares (zip64 included), read without loading the
    directory; 0 when there is no record (zipfile then says why the file is not a zip)."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        tail_size = min(size, 65536 + 22)
        handle.seek(size - tail_size)
        tail = handle.read(tail_size)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + 22 > len(tail):
            return 0
        count: int = struct.unpack_from("<H", tail, at + 10)[0]
        if count != 0xFFFF:
            return count
        # Zip64: the locator just before the record gives the zip64 end record's offset, which holds the count.
        locator = at - 20
        if locator < 0 or tail[locator : locator + 4] != b"PK\x06\x07":
            return count
        (offset,) = struct.unpack_from("<Q", tail, locator + 8)
        if offset > size - 56:
            return count
        handle.seek(offset)
        record = handle.read(56)
        if record[:4] != b"PK\x06\x06":
            return count
        big: int = struct.unpack_from("<Q", record, 32)[0]
        return big


def _tar_members(path: Path, limits: ArchiveLimits) -> list[Member]:
    members: list[Member] = []
    total = 0
    count = 0
    try:
        with tarfile.open(path, mode="r|*") as archive:
            for info in archive:
                count += 1
                if count > limits.max_members:
                    raise ArchiveRefused(f"the archive has more than the {limits.max_members} members accepted")
                name = info.name
                if info.issym():
                    raise _refused(name, "it is a symbolic link")
                if info.islnk():
                    raise _refused(name, "it is a hard link")
                if info.isdev() or info.isfifo():
                    raise _refused(name, "it is a device file or FIFO, not a file or folder")
                if info.issparse():
                    raise _refused(name, "it is a sparse file")
                if not (info.isreg() or info.isdir()):
                    raise _refused(name, "it is neither a file nor a folder")
                relative = member_path(name)
                if relative is None or _ignored(relative):
                    continue
                size = 0 if info.isdir() else info.size
                total = _add_size(total, size, name, limits)
                members.append(Member(relative, info.isdir(), size))
    except (tarfile.TarError, OSError, EOFError, ValueError) as error:
        raise ArchiveRefused(f"the archive is not a readable tar file: {error}") from None
    return members


def _add_size(total: int, size: int, name: str, limits: ArchiveLimits) -> int:
    if size < 0 or total > limits.max_extracted_bytes - size:
        raise ArchiveRefused(
            f"the archive's members add up to more than {limits.max_extracted_bytes} bytes once extracted "
            f"(at member '{printable(name)}', which declares {size} bytes)"
        )
    return total + size


# --- extraction -------------------------------------------------------------------------------------------------


def extract(
    path: Path,
    kind: ArchiveKind,
    destinations: dict[PurePosixPath, PurePosixPath],
    folders: list[PurePosixPath],
    root: Path,
    limits: ArchiveLimits,
) -> int:
    """Write the files named in ``destinations`` (member path -> path under ``root``) into ``root``, which must
    exist and be empty, and make ``folders`` (paths under ``root``, so that empty ones are kept); files not named are
    skipped. Returns the bytes written.
    Every file is created new (O_EXCL | O_NOFOLLOW) inside folders made here; a member that yields more than it
    declared, or the total passing the limit, raises ArchiveRefused."""
    written = 0
    for relative, declared, stream in _files(path, kind, destinations):
        target = destinations[relative]
        directory = root.joinpath(*target.parts[:-1])
        try:
            make_dirs(root, directory)
        except PathOutsideRoot:
            raise _refused(str(relative), "a part of its path is not a folder") from None
        fd = os.open(
            root.joinpath(*target.parts), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        with os.fdopen(fd, "wb") as handle:
            written += _copy(stream, handle, relative, declared, limits.max_extracted_bytes - written)
            handle.flush()
            os.fsync(handle.fileno())
    for folder in folders:
        try:
            make_dirs(root, root.joinpath(*folder.parts))
        except PathOutsideRoot:
            raise _refused(str(folder), "a part of its path is not a folder") from None
    return written


def _copy(stream: IO[bytes], handle: IO[bytes], relative: PurePosixPath, declared: int, room: int) -> int:
    """One member's bytes into ``handle``: no more than it declared, nor than ``room`` is left of the limit."""
    size = 0
    try:
        while chunk := stream.read(_CHUNK):
            size += len(chunk)
            if size > declared:
                raise _refused(str(relative), f"it holds more than the {declared} bytes it declares")
            if size > room:
                raise ArchiveRefused("the archive holds more bytes than the limit once extracted")
            handle.write(chunk)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as error:
        raise _refused(str(relative), f"it is corrupt ({error})") from None
    except OSError as error:
        raise EdgedError(ErrorCode.INTERNAL, f"the upload could not be written: {error.strerror or error}") from None
    return size


def _files(
    path: Path, kind: ArchiveKind, destinations: dict[PurePosixPath, PurePosixPath]
) -> Iterator[tuple[PurePosixPath, int, IO[bytes]]]:
    """(member path, declared size, a stream of its bytes) for each regular file named in ``destinations``."""
    if kind == "zip":
        try:
            with zipfile.ZipFile(path) as zipped:
                for entry in zipped.infolist():
                    relative = member_path(entry.filename)
                    if relative is None or relative not in destinations or entry.is_dir():
                        continue
                    with zipped.open(entry) as stream:
                        yield relative, entry.file_size, stream
        except zipfile.BadZipFile as error:
            raise ArchiveRefused(f"the archive is corrupt: {error}") from None
        return
    try:
        with tarfile.open(path, mode="r|*") as archive:
            for info in archive:
                relative = member_path(info.name)
                if relative is None or relative not in destinations or not info.isreg():
                    continue
                member = archive.extractfile(info)
                if member is None:
                    continue
                yield relative, info.size, member
    except (tarfile.TarError, EOFError) as error:
        raise ArchiveRefused(f"the archive is corrupt: {error}") from None


def _refused(name: str, why: str) -> ArchiveRefused:
    return ArchiveRefused(f"archive member '{printable(name)}' is refused: {why}")
