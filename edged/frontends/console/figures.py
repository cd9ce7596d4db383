"""The figures the console shows as "now": each model's request rate, latency percentiles and errors over the last
few seconds of the metrics history (edged.core.metrics_history), and the device's; formatted for people."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edged.core.service import InferenceService

# "Now" is the mean of the last points: one second alone jumps with every batch.
WINDOW_S = 5.0


@dataclass(frozen=True, slots=True)
class ModelFigures:
    request_rate: float  # requests per second
    error_rate: float
    p50_ms: float | None  # None: no request in the window
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class GpuFigures:
    uuid: str
    utilization: float | None  # 0..1
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True, slots=True)
class NpuFigures:
    id: int
    name: str
    utilization: float | None  # 0..1; None: the kernel does not expose this NPU's busy time
    frequency_mhz: int | None  # 0 while the NPU is powered down
    max_frequency_mhz: int | None

    @property
    def label(self) -> str:
        """``NPU 0 (Intel NPU (Meteor Lake))``: its number, as instance groups and the Devices card name it."""
        return f"NPU {self.id} ({self.name})" if self.name else f"NPU {self.id}"


@dataclass(frozen=True, slots=True)
class DeviceFigures:
    cpu_utilization: float | None  # 0..1, the host's
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    # Errors a second answered for no served model (an unknown model or version): counted for the device only.
    unknown_model_error_rate: float = 0.0
    # What edged's own processes (the daemon and those it started) use: CPU as a share of all the host's CPUs.
    edged_cpu_utilization: float | None = None
    edged_memory_bytes: int | None = None
    gpus: tuple[GpuFigures, ...] = ()
    npus: tuple[NpuFigures, ...] = ()


NO_TRAFFIC = ModelFigures(0.0, 0.0, None, None)


def model_figures(service: InferenceService, now: float | None = None) -> dict[str, ModelFigures]:
    """Every model with points in the window; a model without any has NO_TRAFFIC."""
    history = _recent(service, now)
    out: dict[str, ModelFigures] = {}
    for name, series in history.get("models", {}).items():
        latency = series["latency_ms"]
        out[name] = ModelFigures(
            request_rate=_mean(series["request_rate"]) or 0.0,
            error_rate=_mean(series["error_rate"]) or 0.0,
            p50_ms=_mean(latency.get("p50", [])),
            p99_ms=_mean(latency.get("p99", [])),
        )
    return out


def device_figures(service: InferenceService, now: float | None = None) -> DeviceFigures:
    """The device over the window: CPU and GPU and NPU use as means, memory and clocks as their newest points."""
    history = _recent(service, now)
    device = history.get("device", {})
    cpu = _mean(device.get("cpu_utilization", []))
    memory = _latest(device.get("memory_used_bytes", []))
    unknown = _mean(history.get("unknown_model_error_rate", [])) or 0.0
    gpus = tuple(
        GpuFigures(uuid, _mean(gpu["utilization"]), _latest(gpu["memory_used_bytes"]), gpu["memory_total_bytes"])
        for uuid, gpu in device.get("gpus", {}).items()
    )
    npus = tuple(
        NpuFigures(
            int(number),
            npu["name"],
            _mean(npu["utilization"]),
            _latest(npu["frequency_mhz"]),
            npu["max_frequency_mhz"],
        )
        for number, npu in device.get("npus", {}).items()
    )
    return DeviceFigures(
        cpu,
        memory,
        device.get("memory_total_bytes"),
        unknown,
        _mean(device.get("edged_cpu_utilization", [])),
        _latest(device.get("edged_memory_used_bytes", [])),
        gpus,
        npus,
    )


def _recent(service: InferenceService, now: float | None) -> dict[str, Any]:
    try:
        return service.metrics_history(None, (now if now is not None else time.time()) - WINDOW_S)
    except Exception:
        return {}


def _latest(values: list[int | None]) -> int | None:
    """Memory is as of the newest point that has it (a mean of a few seconds says nothing more)."""
    present = [v for v in values if v is not None]
    return present[-1] if present else None


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    return sum(present) / len(present) if present else None


def rate(value: float) -> str:
    """``12.3/s``, ``0/s``."""
    if value <= 0:
        return "0/s"
    return f"{value:.1f}/s" if value < 100 else f"{value:.0f}/s"


def milliseconds(value: float | None) -> str:
    if value is None:
        return "\u2013"  # an en dash: no value
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def size(value: int | None) -> str:
    if value is None:
        return "\u2013"  # an en dash: no value
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"


def percent(value: float | None) -> str:
    """A share (0..1) as ``12 %``; an en dash for no value."""
    if value is None or not math.isfinite(value):
        return "\u2013"
    return f"{value * 100:.1f} %" if 0 < value < 0.1 else f"{value * 100:.0f} %"


def celsius(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "\u2013"
    return f"{value:.0f} \u00b0C"


def duration(seconds: float) -> str:
    """``3 d 4 h``, ``2 h 5 min``, ``4 min 10 s``, ``12 s``."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


FILTERS = {
    "rate": rate,
    "ms": milliseconds,
    "size": size,
    "duration": duration,
    "percent": percent,
    "celsius": celsius,
}
