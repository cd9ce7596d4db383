"""File operations confined to the directory they belong to.

Every directory the daemon creates or removes from a name it was given (a model's private copies under
``<state dir>/models``) goes through here: the path is resolved at the moment of the operation and must lie strictly
inside its root, and removal never follows a symbolic link out of it (a link is removed as a link; shutil.rmtree
walks by file descriptor on Linux and does not follow the links it meets). A path outside its root is a bug in the
caller, not a client error, so it raises ``PathOutsideRoot`` (a ValueError) after logging what was refused.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

log = logging.getLogger(__name__)


class PathOutsideRoot(ValueError):
    """A file operation was asked for outside the directory it belongs to; nothing was done."""


def inside(root: Path, path: Path) -> Path:
    """``path`` with its parent resolved, once checked to lie strictly inside ``root`` (resolved too). The last
    component is not resolved, so that a symbolic link there is seen (and handled) as a link."""
    real_root = os.path.realpath(root)
    candidate = os.path.join(os.path.realpath(path.parent), path.name)
    outside = os.path.commonpath([real_root, candidate]) != real_root or candidate == real_root
    if path.name in ("", ".", "..") or outside:
        log.error("refused a file operation on %s: it is not inside %s", path, root)
        raise PathOutsideRoot(f"{path} is not inside {root}")
    return Path(candidate)


def make_dirs(root: Path, path: Path) -> None:
    """Create ``path`` and any missing parents below ``root`` (which must exist or be creatable), owner-only."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    relative = Path(os.path.relpath(path, root))
    current = root
    for part in relative.parts:
        current = inside(root, current / part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            current.mkdir(mode=0o700)
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise PathOutsideRoot(f"{current} exists and is not a folder")


def remove_tree(root: Path, path: Path) -> None:
    """Remove ``path`` (a folder with everything in it, a file, or a symbolic link as a link) if it exists; errors
    after the check are logged, not raised (what remains is removed on the next settle)."""
    target = inside(root, path)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(target)
        else:
            os.unlink(target)
    except OSError as exc:
        log.warning("could not remove %s: %s", target, exc.strerror or exc)
