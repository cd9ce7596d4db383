"""The daemon as an ordered list of parts: each starts after the ones before it, and they stop in reverse.

A part is anything with ``start`` and ``stop`` (and optionally ``stopping``). Stopping runs in two passes: first
every started part is told to stop taking work (``stopping``, which must not block: an endpoint stops accepting),
then each is stopped in reverse order (``stop``, which may wait: an endpoint drains). So endpoints drain at the same
time, and the models they call are stopped only once every endpoint is done with them.
"""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger("edged")


class Part(Protocol):
    """One part of the daemon. ``name`` is what the log calls it."""

    name: str

    async def start(self) -> None:
        """Start; raise StartupError (edged.daemon.endpoints) with one line when the daemon cannot run."""
        ...

    def stopping(self) -> None:
        """Stop taking new work, without waiting (the first pass of the stop)."""
        ...

    async def stop(self) -> None:
        """Finish and release everything (the second pass); never raises for a part that failed to start."""
        ...


class Parts:
    """The parts started so far, to be stopped in reverse."""

    def __init__(self) -> None:
        self._started: list[Part] = []

    async def start(self, part: Part) -> None:
        log.debug("starting %s", part.name)
        self._started.append(part)  # stopped as well when its start fails half way
        await part.start()
        log.debug("%s ready", part.name)

    async def stop(self) -> None:
        for part in reversed(self._started):
            part.stopping()
        for part in reversed(self._started):
            try:
                await part.stop()
            except Exception:
                log.exception("stopping %s failed", part.name)
        self._started.clear()
