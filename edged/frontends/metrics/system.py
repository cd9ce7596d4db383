"""The polled gauges: CPU utilization and memory from Linux ``/proc``, and NVIDIA GPUs through NVML.

A thread polls every ``--metrics-interval-ms`` and keeps the latest readings; scrapes read them. GPU families
exist only when ``libnvidia-ml.so.1`` loads and reports at least one device: on a machine without NVIDIA GPUs
(or drivers) they are simply absent, as in a Triton without GPUs.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from edged.core.metrics_history import DeviceSample, GpuSample
from edged.core.processes import ProcessTreeUsage
from edged.frontends.metrics.exposition import Family

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
    """CPU and GPU gauges, refreshed by a polling thread every ``interval_ms``."""

    def __init__(self, *, cpu: bool, gpu: bool, interval_ms: int) -> None:
        self._cpu = cpu
        self._interval_s = interval_ms / 1000
        self._nvml = Nvml.open() if gpu else None
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
        if not self._cpu and self._nvml is None:
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
                log.exception("polling the CPU and GPU metrics failed")

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


class DeviceReader:
    """The device as the metrics history samples it every second (edged.core.metrics_history.DeviceReader): CPU
    utilization since the previous reading, memory, and each GPU; and edged's own processes' CPU and memory (read
    with the host's, under the same --allow-cpu-metrics). Its own readings, apart from SystemMetrics',
    whose interval is --metrics-interval-ms and which runs only while the metrics endpoint does. Blocking: called
    from a worker thread, one call at a time."""

    def __init__(self, *, cpu: bool, gpu: bool) -> None:
        self._cpu = cpu
        self._nvml = Nvml.open() if gpu else None
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
            utilization, memory[0] if memory else None, memory[1] if memory else None, gpus, own_cpu, own_memory
        )

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.close()
            self._nvml = None
