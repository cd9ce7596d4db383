"""What the daemon tells its service manager: sd_notify(3) messages to systemd, through systemd-python.

Under ``Type=notify`` systemd hands the daemon a datagram socket in ``NOTIFY_SOCKET`` and waits for messages on it:

- ``READY=1`` once the models are loaded and every endpoint listens (``systemctl start`` returns then);
- ``STATUS=...``, the one line ``systemctl status`` shows;
- ``WATCHDOG=1`` every half of ``WATCHDOG_USEC`` (``WatchdogSec=``): sent by a task on the event loop, so a loop
  that is blocked stops the heartbeat and systemd restarts the daemon, which is the point of the watchdog;
- ``RELOADING=1`` with ``MONOTONIC_USEC=`` (which ``Type=notify-reload`` requires) before a reload, and
  ``READY=1`` after it;
- ``STOPPING=1`` as the shutdown begins.

Without ``NOTIFY_SOCKET`` (a shell, a container, most tests) every method does nothing. Children (Python-backend
stubs) inherit the variable; systemd ignores what they might send, since the unit accepts messages from the main
process only (``NotifyAccess=main``).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

_sd_daemon: Any
try:
    # systemd-python ships no type information, and a checkout's systemd/ folder (the unit files) would shadow it
    # for mypy: imported by name, it is simply untyped.
    _sd_daemon = importlib.import_module("systemd.daemon")
except ImportError:  # systemd-python is only installed on Linux
    _sd_daemon = None

log = logging.getLogger(__name__)


def watchdog_interval(environ: Mapping[str, str]) -> float | None:
    """Seconds between heartbeats (half the watchdog timeout), or None when systemd watches no heartbeat of this
    process: no ``WATCHDOG_USEC``, or a ``WATCHDOG_PID`` that names another process (as sd_watchdog_enabled(3))."""
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    pid = environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 2 / 1_000_000


class ServiceNotifier:
    """sd_notify for the daemon's life cycle; a no-op unless systemd (or a test) set ``NOTIFY_SOCKET``."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.enabled = bool(env.get("NOTIFY_SOCKET")) and _sd_daemon is not None
        self.interval = watchdog_interval(env) if self.enabled else None
        self._status: str | None = None
        self._failed = False

    def ready(self, status: str | None = None) -> None:
        """Started, or done reloading."""
        if status is not None:
            self._status = status
            self._send(f"READY=1\nSTATUS={status}")
        else:
            self._send("READY=1")

    def status(self, text: str) -> None:
        """The line ``systemctl status`` shows; sent only when it changed."""
        if text != self._status:
            self._status = text
            self._send(f"STATUS={text}")

    def reloading(self) -> None:
        # systemd >= 253 uses MONOTONIC_USEC to tell this reload from an older one; earlier versions ignore it.
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self._status = "reloading"
        self._send(f"RELOADING=1\nMONOTONIC_USEC={now_usec}\nSTATUS=reloading")

    def stopping(self, status: str = "stopping") -> None:
        self._status = status
        self._send(f"STOPPING=1\nSTATUS={status}")

    def heartbeat(self) -> None:
        self._send("WATCHDOG=1")

    def start_watchdog(self) -> asyncio.Task[None] | None:
        """Start the heartbeat task on the running loop, when systemd watches one; cancel it to stop."""
        if self.interval is None:
            return None
        return asyncio.get_running_loop().create_task(self._feed_watchdog(self.interval), name="edged-watchdog")

    async def _feed_watchdog(self, interval: float) -> None:
        # Deliberately a plain task and not a thread: the heartbeat proves that the loop still turns.
        while True:
            self.heartbeat()
            await asyncio.sleep(interval)

    def _send(self, message: str) -> None:
        if not self.enabled or _sd_daemon is None:
            return
        try:
            _sd_daemon.notify(message)
        except OSError as exc:
            # systemd restarting, or the socket gone: the daemon keeps serving; say so once, not every heartbeat.
            if not self._failed:
                self._failed = True
                log.warning("could not notify the service manager: %s", exc)
