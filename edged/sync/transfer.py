"""How fast a sync run may download and how far along it is: a bandwidth cap shared by every download of a run,
and the progress (bytes, rate, time left) that the log and the status API report."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Final

log = logging.getLogger(__name__)

# How often a long download says how far it got, in seconds.
PROGRESS_LOG_S: Final = 10.0


class Throttle:
    """A token bucket of ``rate`` bytes a second, with one second's worth of burst: a download waits before it
    writes more than its share, so the link keeps room for the device's own traffic."""

    def __init__(self, rate: int) -> None:
        if rate <= 0:
            raise ValueError("a bandwidth cap must be a positive number of bytes a second")
        self.rate = rate
        self._tokens = float(rate)
        self._stamp = time.monotonic()

    async def take(self, count: int) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.rate), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= count
        if self._tokens < 0:
            # In debt: wait until the bucket would have refilled what was taken beyond it.
            await asyncio.sleep(-self._tokens / self.rate)


@dataclass
class Progress:
    """A run's download progress. ``total_bytes`` is what the plan downloads (resumed bytes already counted done)."""

    total_bytes: int = 0
    done_bytes: int = 0
    files_total: int = 0
    files_done: int = 0
    started: float = field(default_factory=time.monotonic)
    _logged: float = field(default_factory=time.monotonic)

    def add(self, count: int) -> None:
        self.done_bytes += count
        now = time.monotonic()
        if now - self._logged >= PROGRESS_LOG_S:
            self._logged = now
            log.info("%s", self.describe())

    @property
    def rate(self) -> float:
        """Bytes a second since the run began downloading."""
        elapsed = time.monotonic() - self.started
        return self.done_bytes / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        return (self.total_bytes - self.done_bytes) / rate if rate > 0 else None

    def describe(self) -> str:
        eta = self.eta_s
        return (
            f"downloaded {self.done_bytes} of {self.total_bytes} bytes ({self.files_done}/{self.files_total} files), "
            f"{self.rate / 1e6:.2f} MB/s" + (f", about {eta:.0f} s left" if eta is not None else "")
        )

    def as_json(self) -> dict[str, float | int | None]:
        return {
            "total_bytes": self.total_bytes,
            "done_bytes": self.done_bytes,
            "files_total": self.files_total,
            "files_done": self.files_done,
            "bytes_per_second": round(self.rate, 1),
            "eta_s": round(eta, 1) if (eta := self.eta_s) is not None else None,
        }
