"""What is on disk for a model: fingerprints that tell when a folder changed (and stopped changing), checksums for
the state database, and private copies of a model with the files a load request overrides.

A fingerprint is cheap (names, sizes and modification times, no reading): poll mode takes one per model folder on
every poll. A checksum reads every byte, so it is only taken when a version is loaded.

Override files come from the network, so every name is checked before anything is written: relative, no ``..``,
no NUL, no backslash, no component that is (or becomes) a symbolic link, and the sizes add up within limits.
Files are created with ``O_NOFOLLOW | O_EXCL`` inside a directory this process has just made.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edged.core.confined import PathOutsideRoot, make_dirs, remove_tree
from edged.core.names import MAX_NAME_BYTES, printable
from edged.core.repository.scan import is_version_name
from edged.errors import EdgedError, ErrorCode

# Largest single override file, and all of a request's files together: far above a model an appliance loads over
# the API, far below what would exhaust its disk.
MAX_OVERRIDE_FILE_BYTES = 2 * 1024**3
MAX_OVERRIDE_TOTAL_BYTES = 4 * 1024**3
_CHUNK = 1024 * 1024

# (relative path, size, modification time in ns) of each file, sorted.
Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class FolderPrint:
    """A model folder's fingerprint: its own files (config, labels, ...) and each version folder's."""

    model: Fingerprint
    versions: dict[int, Fingerprint]
    # The newest modification time of anything in it (ns since the epoch): a folder still being written has a
    # recent one.
    newest_ns: int

    def key(self) -> tuple[Fingerprint, tuple[tuple[int, Fingerprint], ...]]:
        return self.model, tuple(sorted(self.versions.items()))


def fingerprint(model_dir: Path) -> FolderPrint | None:
    """None when the folder is gone (or unreadable) by the time it is read."""
    model: list[tuple[str, int, int]] = []
    versions: dict[int, list[tuple[str, int, int]]] = {}
    newest = 0
    try:
        top = os.stat(model_dir)
    except OSError:
        return None
    newest = top.st_mtime_ns
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        relative_root = os.path.relpath(root, model_dir)
        parts = [] if relative_root == "." else relative_root.split(os.sep)
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue  # removed meanwhile: the next poll sees the folder as it is then
            newest = max(newest, info.st_mtime_ns)
            if name in dirs:
                continue
            relative = "/".join([*parts, name])
            item = (relative, info.st_size, info.st_mtime_ns)
            if parts and is_version_name(parts[0]):
                versions.setdefault(int(parts[0]), []).append(item)
            else:
                model.append(item)
        for name in dirs:
            if not parts and is_version_name(name):
                versions.setdefault(int(name), [])
    return FolderPrint(tuple(sorted(model)), {v: tuple(sorted(items)) for v, items in versions.items()}, newest)


def is_settled(folder: FolderPrint, settle_s: float) -> bool:
    """Nothing in the folder changed in the last ``settle_s`` seconds."""
    return time.time_ns() - folder.newest_ns >= settle_s * 1e9


def checksum(directory: Path) -> tuple[str, int]:
    """SHA-256 over every file's relative path and contents (in path order), and their total size."""
    digest = hashlib.sha256()
    total = 0
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            relative = path.relative_to(directory).as_posix()
            digest.update(relative.encode() + b"\0")
            try:
                with path.open("rb") as handle:
                    while chunk := handle.read(_CHUNK):
                        digest.update(chunk)
                        total += len(chunk)
            except OSError:
                continue
    return digest.hexdigest(), total


def override_path(key: str) -> PurePosixPath:
    """The relative path a ``file:<path>`` override names, or INVALID_ARG saying why it is refused."""
    if "\0" in key:
        raise _refused(key, "it contains a NUL character")
    if "\\" in key:
        raise _refused(key, "it contains a backslash")
    if not key:
        raise _refused(key, "it is empty")
    path = PurePosixPath(key)
    if path.is_absolute():
        raise _refused(key, "it is an absolute path")
    if any(part in ("..", ".") for part in key.split("/")) or any(not part for part in key.split("/")):
        raise _refused(key, "it is not a plain relative path ('..', '.' and empty components are refused)")
    if path.parts == ("config.pbtxt",):
        raise _refused(key, "the model's config is given as the 'config' parameter")
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in path.parts):
        # A name no file system here can hold: Triton fails the same load when it writes the file (INTERNAL).
        raise UnwritableOverride(
            f"override file 'file:{printable(key)}' cannot be written: a part of its path is longer than "
            f"{MAX_NAME_BYTES} bytes"
        )
    return path


class UnwritableOverride(EdgedError):
    """An override file that is allowed but cannot be written (a name too long, the disk full)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INTERNAL, message)


def check_override_sizes(files: dict[str, bytes]) -> None:
    total = 0
    for key, content in files.items():
        size = len(content)
        if size > MAX_OVERRIDE_FILE_BYTES:
            raise _refused(key, f"it is larger than {MAX_OVERRIDE_FILE_BYTES} bytes")
        # Python integers do not overflow; the check is still made before adding, as a C reader would.
        if total > MAX_OVERRIDE_TOTAL_BYTES - size:
            raise EdgedError(
                ErrorCode.INVALID_ARG, f"the override files together are larger than {MAX_OVERRIDE_TOTAL_BYTES} bytes"
            )
        total += size


def make_private_copy(
    name: str, destination: Path, source: Path | None, config_text: str | None, files: dict[str, bytes]
) -> None:
    """A folder for model ``name`` at ``destination`` (which must not exist; its parent must): ``source``'s files
    when there is one (hard links where the file system allows, copies otherwise; symbolic links are not carried
    over), then ``config_text`` as its config.pbtxt and each override file. Removes what it made when anything
    fails. A file that is allowed but cannot be written fails the load as Triton's does when it cannot write the
    files it was given: INTERNAL, 'failed to poll from model repository'."""
    try:
        _make_private_copy(destination, source, config_text, files)
    except UnwritableOverride as error:
        raise EdgedError(
            ErrorCode.INTERNAL, f"failed to load '{name}', failed to poll from model repository: {error.message}"
        ) from None


def _make_private_copy(destination: Path, source: Path | None, config: str | None, files: dict[str, bytes]) -> None:
    paths = {key: override_path(key) for key in files}
    check_override_sizes(files)
    destination.mkdir(mode=0o700)
    try:
        if source is not None:
            _link_tree(source, destination)
        if config is not None:
            _write_new(destination, PurePosixPath("config.pbtxt"), config.encode(), replace=True)
        for key, content in files.items():
            try:
                _write_new(destination, paths[key], content, replace=True)
            except OSError as error:
                # The reason only: the path is inside the state directory, which a client never sees.
                raise UnwritableOverride(
                    f"override file 'file:{printable(key)}' cannot be written: {error.strerror or error}"
                ) from None
    except BaseException:
        remove_tree(destination.parent, destination)
        raise


def _link_tree(source: Path, destination: Path) -> None:
    for root, dirs, files in os.walk(source):
        relative = Path(root).relative_to(source)
        target_root = destination / relative
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                (target_root / name).mkdir(mode=0o700)
        dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(root, name))]
        for name in files:
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            try:
                os.link(path, target_root / name)
            except OSError:
                shutil.copy2(path, target_root / name)


def _write_new(root: Path, relative: PurePosixPath, content: bytes, *, replace: bool) -> None:
    """Write ``root/relative``, never through a symbolic link and never outside ``root``."""
    directory = root.joinpath(*relative.parts[:-1])
    try:
        make_dirs(root, directory)  # every folder on the way made or found inside root, none a link
    except PathOutsideRoot:  # its message names the state directory, which a client never sees
        raise _refused(str(relative), "a part of its path is not a folder") from None
    target = directory / relative.parts[-1]
    if replace:
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(info.st_mode):
                raise _refused(str(relative), "a folder of that name exists")
            # Replaced, never written through: the old file may be a hard link into the repository.
            os.unlink(target)
    resolved = os.path.realpath(target.parent)
    if os.path.commonpath([resolved, os.path.realpath(root)]) != os.path.realpath(root):
        raise _refused(str(relative), "it leads outside the model folder")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
        handle.flush()
        # The load is acknowledged once the copy serves, and a restart loads the copy again: on disk by then.
        os.fsync(handle.fileno())
    sync_directory(directory)


def sync_directory(path: Path) -> None:
    """fsync a directory, so that the entries made in it survive a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _refused(key: str, why: str) -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, f"override file 'file:{printable(key)}' is refused: {why}")
