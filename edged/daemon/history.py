"""The part that samples the metrics history (edged.core.metrics_history) once a second, for the console's charts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from edged.core.metrics_history import SAMPLE_INTERVAL_S

if TYPE_CHECKING:
    from edged.core.metrics_history import MetricsHistory
    from edged.frontends.metrics.system import DeviceReader

log = logging.getLogger("edged")


class MetricsHistoryPart:
    """A task on the event loop (where the statistics are written) takes a point every SAMPLE_INTERVAL_S; the
    device is read in a worker thread (files, NVML). Stopping wakes it: it ends within one device reading."""

    name = "metrics history"

    def __init__(self, history: MetricsHistory, device: DeviceReader) -> None:
        self._history = history
        self._device = device
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._history.prime()
        self._task = asyncio.create_task(self._run(), name="edged-metrics-history")

    def stopping(self) -> None:
        self._stop.set()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self._device.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + SAMPLE_INTERVAL_S
        while not self._stop.is_set():
            # On a steady beat of whole intervals from the start; a late loop skips the beats it missed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, due - loop.time()))
            if self._stop.is_set():
                return
            due += SAMPLE_INTERVAL_S
            if due < loop.time():
                due = loop.time() + SAMPLE_INTERVAL_S
            try:
                device = await asyncio.to_thread(self._device.read)
                self._history.sample(device)
            except Exception:  # a failing reading must not end the history for good
                log.exception("sampling the metrics history failed")
