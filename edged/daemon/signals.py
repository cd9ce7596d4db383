"""The signals the daemon answers, as systemd and a terminal send them.

- SIGTERM (``systemctl stop``, ``kill``) or SIGINT (Ctrl-C): ``stop`` is set; the daemon stops accepting, lets the
  requests in flight finish, finalizes the models and exits 0. A second SIGTERM or SIGINT while that runs exits at
  once with status 1 (``FORCED_EXIT_STATUS``), without draining or finalizing.
- SIGHUP (``systemctl reload``): the reload runs, once the daemon is ready and no other reload runs; one asked for
  before then (or during one) runs as soon as it may. Ignored while stopping.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from types import FrameType

log = logging.getLogger("edged")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # SIGTERM is what systemctl stop sends; SIGINT is Ctrl-C
# The exit status when a second stop signal cuts the drain short: a failure, as the models were not finalized.
FORCED_EXIT_STATUS = 1


class Signals:
    """Installed on the running loop by ``install``, before anything slow: SIGHUP's default action would end the
    daemon. ``reload`` is what SIGHUP runs."""

    def __init__(self, reload: Callable[[], Coroutine[None, None, None]]) -> None:
        self.stop = asyncio.Event()
        self._reload = reload
        self._loop = asyncio.get_running_loop()
        self._ready = False
        self._wanted = False
        self._running: asyncio.Task[None] | None = None

    def install(self) -> None:
        for stop_signal in STOP_SIGNALS:
            self._loop.add_signal_handler(stop_signal, self._on_stop, stop_signal)
        self._loop.add_signal_handler(signal.SIGHUP, self._on_reload)

    def ready(self) -> None:
        """The daemon serves: reloads run from now on, starting with one asked for meanwhile."""
        self._ready = True
        if self._wanted:
            self._start_reload()

    @property
    def reloading(self) -> bool:
        return self._running is not None and not self._running.done()

    async def close(self) -> None:
        """Cancel a reload still running (the daemon is stopping) and wait for it to end."""
        if self._running is not None:
            self._running.cancel()
            await asyncio.gather(self._running, return_exceptions=True)

    def _on_stop(self, signum: signal.Signals) -> None:
        log.info("%s received: stopping (send it again to exit at once)", signum.name)
        self.stop.set()
        # A plain handler from here on: it runs even while the loop waits on a model's finalize.
        for stop_signal in STOP_SIGNALS:
            self._loop.remove_signal_handler(stop_signal)
            signal.signal(stop_signal, _force_exit)

    def _on_reload(self) -> None:
        if self.stop.is_set():
            log.info("SIGHUP received while stopping: ignored")
            return
        if not self._ready or self.reloading:
            log.info("SIGHUP received: reloading once %s", "started" if not self._ready else "this reload is done")
            self._wanted = True
            return
        self._start_reload()

    def _start_reload(self) -> None:
        self._wanted = False
        self._running = self._loop.create_task(self._reload())
        self._running.add_done_callback(self._reload_done)

    def _reload_done(self, _: asyncio.Task[None]) -> None:
        if self._wanted and not self.stop.is_set():
            self._start_reload()


def _force_exit(signum: int, frame: FrameType | None) -> None:
    del frame
    log.error("%s received again: exiting at once, without draining", signal.Signals(signum).name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(FORCED_EXIT_STATUS)
