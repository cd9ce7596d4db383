"""The polled gauges: CPU utilization and memory from Linux ``/proc``, NVIDIA GPUs through NVML, and Intel NPUs'
use from sysfs.

A thread polls every ``--metrics-interval-ms`` and keeps the latest readings; scrapes read them. GPU families
exist only when ``libnvidia-ml.so.1`` loads and reports at least one device: on a machine without NVIDIA GPUs
(or drivers) they are simply absent, as in a Triton without GPUs. ``edged_npu_utilization{npu="<N>"}`` is edged's
own (Triton has no NPUs), so it is listed with edged's other families from the prometheus-client registry, and
only for the Intel NPUs whose kernel exposes their busy time.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily

from edged.core.devices import intel_npu_activity
from edged.core.metrics_history import DeviceSample, GpuSample, NpuSample
from edged.core.processes import ProcessTreeUsage
from edged.frontends.metrics.exposition import Family

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

_PROC_STAT = Path("/proc/stat")
_PROC_MEMINFO = Path("/proc/meminfo")


@dataclass(slots=True)
class CpuTimes:
    busy: int
    total: int


def read_cpu_times(path: Path = _PROC_STAT) -> CpuTimes | None:
    """The aggregate ``cpu`` line of /proc/stat: busy and total jiffies (idle and iowait are not busy)."""
    try:
        first = path.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return CpuTimes(sum(values) - idle, sum(values))


def read_memory(path: Path = _PROC_MEMINFO) -> tuple[int, int] | None:
    """(total, used) bytes: used is MemTotal - MemAvailable, as Triton reports it."""
    fields: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0]) * 1024
    except OSError:
        return None
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    if total is None or available is None:
        return None
    return total, total - min(available, total)


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


@dataclass(slots=True)
class GpuReading:
    uuid: str
    utilization: float | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    power_usage_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None


class Nvml:
    """The few NVML calls the GPU gauges need, through ctypes: no CUDA or Python bindings required."""

    def __init__(self, lib: ctypes.CDLL, handles: list[tuple[str, ctypes.c_void_p]]) -> None:
        self._lib = lib
        self._handles = handles
        self._energy_start: dict[str, int] = {}

    @classmethod
    def open(cls) -> Nvml | None:
        """NVML with at least one GPU, or None (no library, no driver, no device)."""
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None
        try:
            if lib.nvmlInit_v2() != 0:
                return None
            count = ctypes.c_uint()
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
                lib.nvmlShutdown()
                return None
            handles: list[tuple[str, ctypes.c_void_p]] = []
            for index in range(count.value):
                handle = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                    continue
                uuid = ctypes.create_string_buffer(96)
                if lib.nvmlDeviceGetUUID(handle, uuid, len(uuid)) != 0:
                    continue
                handles.append((uuid.value.decode(), handle))
        except AttributeError:  # an NVML too old for these entry points
            return None
        if not handles:
            lib.nvmlShutdown()
            return None
        return cls(lib, handles)

    def poll(self) -> list[GpuReading]:
        readings: list[GpuReading] = []
        lib = self._lib
        for uuid, handle in self._handles:
            reading = GpuReading(uuid)
            utilization = _Utilization()
            if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(utilization)) == 0:
                reading.utilization = utilization.gpu / 100
            memory = _Memory()
            if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0:
                reading.memory_total, reading.memory_used = memory.total, memory.used
            milliwatts = ctypes.c_uint()
            if lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(milliwatts)) == 0:
                reading.power_usage_w = milliwatts.value / 1000
            if lib.nvmlDeviceGetEnforcedPowerLimit(handle, ctypes.byref(milliwatts)) == 0:
                reading.power_limit_w = milliwatts.value / 1000
            millijoules = ctypes.c_ulonglong()
            if lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(millijoules)) == 0:
                start = self._energy_start.setdefault(uuid, millijoules.value)
                reading.energy_j = (millijoules.value - start) / 1000  # since the daemon started, as Triton's
            readings.append(reading)
        return readings

    def close(self) -> None:
        self._lib.nvmlShutdown()


# The intel_vpu driver asks that its busy time be read no more often than about once a second (each reading takes
# the lock job submission takes); --metrics-interval-ms may be as short as 1 ms, so a reading sooner than this
# after the previous one answers that one again.
NPU_MIN_INTERVAL_S = 0.5


class NpuUse:
    """Each Intel NPU's busy share between two readings, read as CPU utilization is: the growth of the driver's
    cumulative busy time over the growth of a monotonic clock, clamped to [0, 1]. It reads once when it is created,
    so that its first ``read`` has a share already; a busy time that is missing, or that went back (the driver was
    reloaded), makes that reading's share None."""

    def __init__(self, sysfs: Path = Path("/sys"), monotonic: Callable[[], float] = time.monotonic) -> None:
        self._sysfs = sysfs
        self._monotonic = monotonic
        self._busy: dict[int, tuple[float, int]] = {}  # NPU -> (when, busy microseconds) at its last reading
        self._read_at: float | None = None
        self._last: tuple[NpuSample, ...] = ()
        self.read()

    @property
    def present(self) -> bool:
        """Whether the latest reading found an Intel NPU at all."""
        return bool(self._last)

    def read(self) -> tuple[NpuSample, ...]:
        now = self._monotonic()
        if self._read_at is not None and now - self._read_at < NPU_MIN_INTERVAL_S:
            return self._last
        self._read_at = now
        samples: list[NpuSample] = []
        busy: dict[int, tuple[float, int]] = {}
        for activity in intel_npu_activity(self._sysfs):
            npu = activity.npu
            utilization: float | None = None
            if activity.busy_us is not None:
                busy[npu.id] = (now, activity.busy_us)
                before = self._busy.get(npu.id)
                if before is not None and activity.busy_us >= before[1]:
                    share = (activity.busy_us - before[1]) / 1e6 / (now - before[0])
                    utilization = min(1.0, max(0.0, share))
            samples.append(NpuSample(npu.id, npu.name, utilization, activity.frequency_mhz, activity.max_frequency_mhz))
        self._busy = busy
        self._last = tuple(samples)
        return self._last


# GPU families: (name, help, type, GpuReading field), in Triton's order.
_GPU_FAMILIES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", "memory_total"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", "memory_used"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge", "power_usage_w"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", "power_limit_w"),
    (
        "nv_energy_consumption",
        "GPU energy consumption in joules since the Triton Server started",
        "counter",
        "energy_j",
    ),
)


class SystemMetrics:
    """CPU, GPU and Intel NPU gauges, refreshed by a polling thread every ``interval_ms``. The NPU gauge goes to
    ``registry`` (edged's own families), when one is given; ``sysfs`` and ``monotonic`` are where and by which
    clock NPUs are read."""

    def __init__(
        self,
        *,
        cpu: bool,
        gpu: bool,
        interval_ms: int,
        registry: CollectorRegistry | None = None,
        sysfs: Path = Path("/sys"),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cpu = cpu
        self._interval_s = interval_ms / 1000
        self._nvml = Nvml.open() if gpu else None
        self._npu_use = NpuUse(sysfs, monotonic)
        self._npus: tuple[NpuSample, ...] = ()
        if registry is not None:
            registry.register(_NpuGauges(self))
        self._cpu_times: CpuTimes | None = None
        self._cpu_utilization = 0.0
        self._memory: tuple[int, int] | None = None
        self._gpus: list[GpuReading] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def gpu_count(self) -> int:
        return len(self._nvml._handles) if self._nvml is not None else 0

    def start(self) -> None:
        """Take the first readings now (so that the first scrape has them), then poll in the background."""
        if not self._cpu and self._nvml is None and not self._npu_use.present:
            return
        self.poll()
        self._thread = threading.Thread(target=self._run, name="edged-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.close()
            self._nvml = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.poll()
            except Exception:  # a failing reading must not end the polling for good
                log.exception("polling the CPU, GPU and NPU metrics failed")

    def poll(self) -> None:
        if self._cpu:
            times = read_cpu_times()
            memory = read_memory()
            with self._lock:
                previous, self._cpu_times = self._cpu_times, times
                if previous is not None and times is not None and times.total > previous.total:
                    self._cpu_utilization = (times.busy - previous.busy) / (times.total - previous.total)
                self._memory = memory
        if self._nvml is not None:
            gpus = self._nvml.poll()
            with self._lock:
                self._gpus = gpus
        npus = self._npu_use.read()
        with self._lock:
            self._npus = npus

    def npus(self) -> tuple[NpuSample, ...]:
        """The Intel NPUs as the latest poll read them."""
        with self._lock:
            return self._npus

    def collect(self) -> list[Family]:
        """GPU families, then CPU ones, as Triton lists them."""
        families: list[Family] = []
        with self._lock:
            for name, text, kind, attribute in _GPU_FAMILIES if self._gpus else ():
                family = Family(name, text, "counter" if kind == "counter" else "gauge")
                for gpu in self._gpus:
                    value = getattr(gpu, attribute)
                    if value is not None:
                        family.add((("gpu_uuid", gpu.uuid),), value)
                if family.samples:
                    families.append(family)
            if self._cpu:
                utilization = Family("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge")
                utilization.add((), self._cpu_utilization)
                families.append(utilization)
                if self._memory is not None:
                    total = Family("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge")
                    used = Family("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge")
                    total.add((), self._memory[0])
                    used.add((), self._memory[1])
                    families += [total, used]
        return families


class _NpuGauges:
    """``edged_npu_utilization``: a prometheus-client collector of SystemMetrics' latest NPU readings. Like the GPU
    families, absent when no NPU's use is known."""

    def __init__(self, system: SystemMetrics) -> None:
        self._system = system

    def collect(self) -> Iterator[GaugeMetricFamily]:
        known = [(npu.id, share) for npu in self._system.npus() if (share := npu.utilization) is not None]
        if not known:
            return
        family = GaugeMetricFamily(
            "edged_npu_utilization",
            "Intel NPU utilization rate [0.0 - 1.0]: the share of the time its driver counted it busy",
            labels=["npu"],
        )
        for npu_id, share in known:
            family.add_metric([str(npu_id)], share)
        yield family


class DeviceReader:
    """The device as the metrics history samples it every second (edged.core.metrics_history.DeviceReader): CPU
    utilization since the previous reading, memory, each GPU, and each Intel NPU's busy share since the previous
    reading (NpuUse; read whatever the flags say, as no option covers NPUs); and edged's own processes' CPU and
    memory (read with the host's, under the same --allow-cpu-metrics). Its own readings, apart from
    SystemMetrics', whose interval is --metrics-interval-ms and which runs only while the metrics endpoint does.
    ``sysfs`` and ``monotonic`` are where and by which clock NPUs are read. Blocking: called from a worker
    thread, one call at a time."""

    def __init__(
        self,
        *,
        cpu: bool,
        gpu: bool,
        sysfs: Path = Path("/sys"),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cpu = cpu
        self._nvml = Nvml.open() if gpu else None
        self._npu_use = NpuUse(sysfs, monotonic)  # its first reading is the baseline of the first point
        self._cpu_times = read_cpu_times() if cpu else None
        self._own = ProcessTreeUsage() if cpu else None
        if self._own is not None:
            self._own.read()  # the baseline: the first point has edged's CPU since now

    def read(self) -> DeviceSample:
        utilization: float | None = None
        memory: tuple[int, int] | None = None
        own_cpu: float | None = None
        own_memory: int | None = None
        if self._cpu:
            times = read_cpu_times()
            previous, self._cpu_times = self._cpu_times, times
            if previous is not None and times is not None and times.total > previous.total:
                utilization = (times.busy - previous.busy) / (times.total - previous.total)
            memory = read_memory()
        if self._own is not None:
            own = self._own.read()
            own_cpu, own_memory = own.cpu_utilization, own.rss_bytes
        gpus = tuple(
            GpuSample(gpu.uuid, gpu.utilization, gpu.memory_total, gpu.memory_used)
            for gpu in (self._nvml.poll() if self._nvml is not None else ())
        )
        return DeviceSample(
            utilization,
            memory[0] if memory else None,
            memory[1] if memory else None,
            gpus,
            own_cpu,
            own_memory,
            self._npu_use.read(),
        )

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.close()
            self._nvml = None
