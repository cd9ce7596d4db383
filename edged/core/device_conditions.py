"""The device's conditions that the console's Device card shows beside the metrics: free disk space where edged
writes (the state directory, where uploads are unpacked and synced repositories mirrored, and each model
repository) and the temperatures the kernel exposes (edged.core.sensors).

Read on request rather than every second: nothing charts them, and they change slowly. A reading is kept for
``max_age_s``, so that every open console page polling the overview costs one reading between them. Blocking
(statvfs, sysfs): call ``read`` off the event loop.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from edged.core.sensors import SYSFS, Temperature, read_temperatures

# How long one reading is shown again: the overview reloads every few seconds, in every browser that has it open.
MAX_AGE_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class DiskSpace:
    """The file system a folder edged writes to is on. None where it cannot be read (the folder is gone)."""

    role: str  # "state directory", "model repository"
    path: str
    free_bytes: int | None  # what edged's user may still write (statvfs's f_bavail: root's reserve left out)
    total_bytes: int | None


def disk_space(role: str, path: Path) -> DiskSpace:
    try:
        found = os.statvfs(path)
    except OSError:
        return DiskSpace(role, str(path), None, None)
    return DiskSpace(role, str(path), found.f_bavail * found.f_frsize, found.f_blocks * found.f_frsize)


@dataclass(frozen=True, slots=True)
class DeviceConditions:
    disks: tuple[DiskSpace, ...]
    temperatures: tuple[Temperature, ...]  # empty where the kernel exposes none (a container, most VMs)


class DeviceConditionsReader:
    """Reads the conditions of ``state_dir`` (None: edged keeps no state) and of the repositories ``repositories``
    returns (read again each time: a synced repository's mirror is among them from the start)."""

    def __init__(
        self,
        state_dir: Path | None,
        repositories: Callable[[], Sequence[Path]],
        *,
        sysfs: Path = SYSFS,
        max_age_s: float = MAX_AGE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state_dir = state_dir
        self._repositories = repositories
        self._sysfs = sysfs
        self._max_age_s = max_age_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._last: tuple[float, DeviceConditions] | None = None

    def read(self) -> DeviceConditions:
        # One reader at a time: a second page asking meanwhile waits for the reading under way and shows it.
        with self._lock:
            now = self._monotonic()
            if self._last is not None and now - self._last[0] < self._max_age_s:
                return self._last[1]
            disks = [disk_space("state directory", self._state_dir)] if self._state_dir is not None else []
            disks += [disk_space("model repository", path) for path in self._repositories()]
            conditions = DeviceConditions(tuple(disks), tuple(read_temperatures(self._sysfs)))
            self._last = (now, conditions)
            return conditions
