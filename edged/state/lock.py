"""One daemon per state directory: ``edged serve`` holds ``<state_dir>/edged.lock`` for as long as it runs.

Two daemons on one state directory would share one database and one set of snapshots, each showing and changing
the other's models, history, users and tokens. The second one to start is refused before it binds a port or opens
the database, with the directory and the pid of the daemon that holds it.

The lock is ``flock`` on the file, not the file's existence: the kernel releases it when the holder's last
descriptor closes, however the process ended (a crash, SIGKILL, the OOM killer), so a dead daemon never leaves a
stale lock to clear by hand. The pid written into the file is for the message only and never decides anything.
The file itself stays: removing it on exit would let a daemon starting at that moment lock a file that a third one
then no longer finds.

Only ``serve`` takes the lock. The commands that administer the state (``edged token``, ``edged user``) open the
database beside a running daemon on purpose: SQLite's own locking orders their writes. The descriptor is not
inherited by the processes the daemon starts (frontend workers, Python model stubs), which could otherwise hold the
directory after the daemon is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Final

from edged.state.records import StateError

LOCK_NAME: Final = "edged.lock"
# The pid as written: a decimal number and a line feed; what is read back is cut to this many bytes.
_PID_BYTES: Final = 32


class StateDirectoryLock:
    """The held lock on one state directory; ``release`` (or the process ending) gives it up."""

    def __init__(self, state_dir: Path, fd: int) -> None:
        """Use ``StateDirectoryLock.acquire``."""
        self.state_dir = state_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: Path) -> StateDirectoryLock:
        """Locks ``state_dir`` (created if needed, as StateStore.open creates it) for this process, or raises
        StateError naming the directory and, when another process holds it, that process's pid."""
        path = state_dir / LOCK_NAME
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            # O_NOFOLLOW: a link planted in the directory must not make the daemon create or truncate another file.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as error:
            reason = error.strerror or str(error)
            raise StateError(f"state directory {state_dir} cannot be locked ({path}: {reason})") from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder is not None else "pid not known yet"
            raise StateError(
                f"state directory {state_dir} is in use by another edged ({who}): one daemon per state directory; "
                "stop that one, or give this one a --state-dir of its own"
            ) from None
        except OSError as error:
            os.close(fd)
            reason = error.strerror or str(error)
            raise StateError(f"state directory {state_dir} cannot be locked ({path}: {reason})") from error
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as error:
            os.close(fd)
            reason = error.strerror or str(error)
            raise StateError(f"state directory {state_dir} cannot be locked ({path}: {reason})") from error
        return cls(state_dir, fd)

    def release(self) -> None:
        """Gives the lock up (once; later calls do nothing). The pid is cleared first, so that a file left behind
        names no process."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        # The lock is released by the close all the same; a stale pid would only ever be read for a message.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    """The pid the holder wrote, or None when it has not written one yet (or wrote something else)."""
    try:
        text = os.pread(fd, _PID_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
