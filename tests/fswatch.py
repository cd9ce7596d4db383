"""Linux inotify through ctypes, so that a test can act (kill a process) the moment a file appears or is written,
not at the next tick of a polling loop: the phases of a sync run last milliseconds."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

IN_MODIFY: Final = 0x002
IN_CLOSE_WRITE: Final = 0x008
IN_MOVED_TO: Final = 0x080
IN_CREATE: Final = 0x100
_IN_NONBLOCK: Final = 0o4000
_IN_CLOEXEC: Final = 0o2000000
_EVENT: Final = struct.Struct("iIII")


@dataclass(frozen=True)
class Event:
    folder: Path
    mask: int
    name: str

    @property
    def path(self) -> Path:
        return self.folder / self.name


class Watcher:
    """Events in a few folders (not their subfolders), read as they come."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._folders: dict[int, Path] = {}

    def add(self, folder: Path, mask: int) -> None:
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder} failed")
        self._folders[wd] = folder

    def events(self, timeout_s: float) -> list[Event]:
        """The events that arrived, waiting up to ``timeout_s`` for the first."""
        ready, _, _ = select.select([self._fd], [], [], timeout_s)
        if not ready:
            return []
        data = os.read(self._fd, 64 << 10)
        found: list[Event] = []
        offset = 0
        while offset < len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            if wd in self._folders:
                found.append(Event(self._folders[wd], mask, os.fsdecode(raw.rstrip(b"\0"))))
        return found

    def wait_for(self, match: Callable[[Event], bool], deadline_s: float) -> Event | None:
        """The first event ``match`` accepts, or None once ``deadline_s`` (seconds from now) has passed."""
        deadline = time.monotonic() + deadline_s
        while (left := deadline - time.monotonic()) > 0:
            for event in self.events(min(left, 0.1)):
                if match(event):
                    return event
        return None

    def close(self) -> None:
        os.close(self._fd)


class MatchEvent:
    """Accepts events of ``mask`` named ``name`` (when given) or ending in ``suffix``, whose file has reached
    ``min_size`` bytes (when given)."""

    def __init__(self, mask: int, *, name: str = "", suffix: str = "", min_size: int | None = None) -> None:
        self.mask, self.name, self.suffix, self.min_size = mask, name, suffix, min_size

    def __call__(self, event: Event) -> bool:
        if not event.mask & self.mask:
            return False
        if (self.name and event.name != self.name) or not event.name.endswith(self.suffix):
            return False
        if self.min_size is None:
            return True
        try:
            return event.path.stat().st_size >= self.min_size
        except FileNotFoundError:
            return False


@contextlib.contextmanager
def watching() -> Iterator[Watcher]:
    watcher = Watcher()
    try:
        yield watcher
    finally:
        watcher.close()
