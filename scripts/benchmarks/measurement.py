"""What one measurement is: how the load generator talks to the server (Mode), its figures (Measurement) and a
line of a table (Row)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

# Share of the CPU used by other processes above which the figures are flagged as disturbed.
BUSY_WARNING: Final = 0.15


@dataclass(frozen=True)
class Mode:
    """How perf_analyzer talks to a server."""

    name: str  # as printed in the protocol column
    protocol: str  # "http" or "grpc"
    streaming: bool = False
    shared_memory: bool = False
    tls: bool = False


MODES: Final = (
    Mode("http", "http"),
    Mode("grpc", "grpc"),
    Mode("grpc stream", "grpc", streaming=True),
    Mode("http shm", "http", shared_memory=True),
    Mode("grpc shm", "grpc", shared_memory=True),
)
# --tls: each protocol over plaintext and over TLS, unary calls.
TLS_MODES: Final = (
    Mode("http", "http"),
    Mode("http tls", "http", tls=True),
    Mode("grpc", "grpc"),
    Mode("grpc tls", "grpc", tls=True),
)


def unary_modes(protocols: Sequence[str] | None) -> list[Mode]:
    """Unary calls without shared memory, HTTP unless ``protocols`` says otherwise: for the phases about the
    server (--batching, --python), not about how tensors travel."""
    return [m for m in MODES if m.protocol in (protocols or ("http",)) and not m.streaming and not m.shared_memory]


@dataclass
class Measurement:
    throughput: float | None = None  # inferences per second
    p50_us: float | None = None
    p99_us: float | None = None
    error: str | None = None
    # False when perf_analyzer found no three windows within 10% of each other: then the figures are the
    # mean of its last three windows, and p99 is unknown.
    stable: bool = True
    # The share of all CPUs that other processes used while this was measured (None where unknown).
    others_cpu: float | None = None
    seconds: float | None = None  # how long the measurement took
    # Inferences per model execution on the server during the measurement, from its statistics (--batching).
    batch: float | None = None

    @property
    def disturbed(self) -> bool:
        return self.others_cpu is not None and self.others_cpu > BUSY_WARNING


@dataclass
class Row:
    model: str
    concurrency: int
    protocol: str
    in_process: Measurement = field(default_factory=Measurement)
    edged: Measurement = field(default_factory=Measurement)
    triton: Measurement = field(default_factory=Measurement)


@dataclass
class SharedMemory:
    """Whether perf_analyzer can run with --shared-memory system on this machine; why not when it cannot."""

    unavailable: str | None = None


def percentile_us(latencies_s: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies_s), q) * 1e6)
