"""A short in-memory history of what each model and the device did, one point a second, for the console's live
charts: no Prometheus server is needed on the device to see the last minutes (``/metrics`` stays the way for
fleets).

Each ``sample`` reads every READY version's cumulative ModelStatistics, subtracts the previous reading and keeps,
per model (its versions summed): request and error rates (the errors apart as rejected and failed, see below),
mean queue and compute time, p50/p90/p99 of the end-to-end
latency (from the statistics' latency buckets), the mean batch size and executions by batch size; the rate of
errors answered for no served model (UnroutedErrors); and the device's CPU use, memory, GPUs and NPUs, as a reader
the daemon gives it sees them. Errors are every error a client was answered: Triton's failures and the refusals it
does not count (ModelStatistics.refused: a missing input, a full queue ...), which count as requests too, and the
successes whose client got an error (ModelStatistics.answered_errors: an error the model answered with). They are
kept as two series that add up to the error rate, as an operator acts on them differently: ``rejected`` are the
refusals, answered before the model ran (a bad shape, datatype or unknown input, an undecodable body: the client's
to fix; or one refused at the door, as by a full queue); ``failed`` are Triton's failures and the answered errors,
requests a scheduler took that ended in an error (the model or its backend failed while running it, it timed out in
the queue or was cancelled, it answered with an error). Points
live in fixed-size arrays (a ring of ``capacity`` points), so memory is bounded whatever the traffic. A version
whose statistics are new (it was (re)loaded) or whose counters went down counts from zero: a reload never makes a
negative rate.

The device's points hold what edged's own processes (the daemon and those it started) used of its CPU and memory
beside the host's figures, so that the one can be told from the other.

Sampled and read on the event loop only, like the statistics themselves; the clocks are injected for the tests.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edged.core.stats import LATENCY_BUCKETS, ModelStatistics, UnroutedErrors, latency_bucket_bounds

# One point a second, ten minutes of them.
SAMPLE_INTERVAL_S = 1.0
HISTORY_POINTS = 600
# Upper bounds of the batch-size buckets (a power of two each: 1, 2, 3-4, 5-8, ...); the last also takes larger.
BATCH_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))
# Executions per bucket and point are kept in 16 bits: more than this many a second is shown as this many.
_MAX_EXECUTIONS = 65535
_NAN = math.nan
# The per-model series kept as 32-bit floats (plenty for a chart, half the memory of doubles).
# The error rate is not kept: it is rejected_rate + failed_rate, added when read.
_MODEL_SERIES = (
    "request_rate",
    "rejected_rate",
    "failed_rate",
    "queue_ms",
    "compute_ms",
    "p50",
    "p90",
    "p99",
    "batch_size_mean",
)


@dataclass(frozen=True, slots=True)
class GpuSample:
    uuid: str
    utilization: float | None = None  # 0.0 - 1.0
    memory_total: int | None = None  # bytes
    memory_used: int | None = None


@dataclass(frozen=True, slots=True)
class NpuSample:
    """One Intel NPU (edged.core.devices.intel_npu_activity): the share of the time since the previous reading its
    driver counted it busy, and its clock (0 while it is powered down). ``utilization`` is None where the kernel
    does not expose the NPU's busy time."""

    id: int
    name: str = ""
    utilization: float | None = None  # 0.0 - 1.0
    frequency_mhz: int | None = None
    max_frequency_mhz: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """What the device looked like at one point: CPU utilization since the previous reading (0.0 - 1.0), memory in
    bytes, each GPU and each Intel NPU; and what edged's own processes used of them (edged.core.processes: CPU as
    a share of all the host's CPUs, memory as their RSS summed). None where it is not known (or not read, as
    --allow-cpu-metrics=false asks)."""

    cpu_utilization: float | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    gpus: tuple[GpuSample, ...] = ()
    edged_cpu_utilization: float | None = None
    edged_memory_used: int | None = None
    npus: tuple[NpuSample, ...] = ()


# Reads the device once; blocking (files, NVML), so it is called outside the event loop.
DeviceReader = Callable[[], DeviceSample]


@dataclass(slots=True)
class _Reading:
    """One version's cumulative counters as the previous sample saw them."""

    stats: ModelStatistics
    requests: int = 0
    rejected: int = 0
    failures: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_count: int = 0
    compute_ns: int = 0
    executions: dict[int, int] = field(default_factory=dict)
    latency: list[int] | None = None

    @classmethod
    def of(cls, stats: ModelStatistics) -> _Reading:
        return cls(
            stats,
            stats.success.count + stats.fail.count + stats.refused,
            stats.refused,
            stats.fail.count + stats.answered_errors,
            stats.queue.count,
            stats.queue.ns,
            stats.compute_infer.count,
            stats.compute_input.ns + stats.compute_infer.ns + stats.compute_output.ns,
            {size: batch.compute_infer.count for size, batch in stats.batch_stats.items()},
            list(stats.latency),
        )


_ZERO = _Reading(ModelStatistics("", 0), latency=None)


@dataclass(slots=True)
class _Interval:
    """What a model's versions did between two samples."""

    requests: int = 0
    rejected: int = 0
    failures: int = 0
    queue_count: int = 0
    queue_ns: int = 0
    compute_count: int = 0
    compute_ns: int = 0
    executions: dict[int, int] = field(default_factory=dict)
    latency: list[int] = field(default_factory=lambda: [0] * LATENCY_BUCKETS)

    def add(self, now: _Reading, before: _Reading) -> None:
        self.requests += now.requests - before.requests
        self.rejected += now.rejected - before.rejected
        self.failures += now.failures - before.failures
        self.queue_count += now.queue_count - before.queue_count
        self.queue_ns += now.queue_ns - before.queue_ns
        self.compute_count += now.compute_count - before.compute_count
        self.compute_ns += now.compute_ns - before.compute_ns
        for size, count in now.executions.items():
            self.executions[size] = self.executions.get(size, 0) + count - before.executions.get(size, 0)
        if now.latency is not None and now.requests != before.requests:
            previous = before.latency
            for index, count in enumerate(now.latency):
                if count:
                    self.latency[index] += count - (previous[index] if previous is not None else 0)


def _went_back(now: _Reading, before: _Reading) -> bool:
    """Counters only grow while the statistics live: lower ones are a new record under the same object."""
    return (
        now.requests < before.requests
        or now.rejected < before.rejected
        or now.failures < before.failures
        or now.queue_count < before.queue_count
        or now.compute_count < before.compute_count
        or any(count < before.executions.get(size, 0) for size, count in now.executions.items())
    )


def percentile(latency: list[int], q: float) -> float:
    """The q-quantile (0 < q <= 1) of an interval's latency buckets in milliseconds, interpolated linearly within
    the bucket that holds the nearest rank; NaN for no request."""
    total = sum(latency)
    if total == 0:
        return _NAN
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, count in enumerate(latency):
        if count and seen + count >= rank:
            lower, upper = latency_bucket_bounds(index)
            if index == LATENCY_BUCKETS - 1:
                return lower / 1000  # open-ended: at least this long
            return (lower + (upper - lower) * (rank - seen) / count) / 1000
        seen += count
    return _NAN  # not reached: the ranks add up to total


def _batch_bucket(size: int) -> int:
    for index, bound in enumerate(BATCH_BUCKETS):
        if size <= bound:
            return index
    return len(BATCH_BUCKETS) - 1


class _ModelSeries:
    """One model's points, in the history's ring."""

    __slots__ = ("batches", "last_seen", "series")

    def __init__(self, capacity: int) -> None:
        self.series = {name: array("f", [_NAN]) * capacity for name in _MODEL_SERIES}
        # Executions by batch-size bucket: bucket-major, ``capacity`` points each.
        self.batches = array("H", [0]) * (capacity * len(BATCH_BUCKETS))
        self.last_seen = -1

    def clear(self, slot: int, capacity: int) -> None:
        for values in self.series.values():
            values[slot] = _NAN
        for bucket in range(len(BATCH_BUCKETS)):
            self.batches[bucket * capacity + slot] = 0

    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for a in self.series.values()) + self.batches.itemsize * len(self.batches)


class _GpuSeries:
    __slots__ = ("memory_total", "memory_used", "utilization")

    def __init__(self, capacity: int) -> None:
        self.utilization = array("f", [_NAN]) * capacity
        self.memory_used = array("d", [_NAN]) * capacity
        self.memory_total: int | None = None


class _NpuSeries:
    __slots__ = ("frequency_mhz", "max_frequency_mhz", "name", "utilization")

    def __init__(self, capacity: int, name: str) -> None:
        self.utilization = array("f", [_NAN]) * capacity
        self.frequency_mhz = array("f", [_NAN]) * capacity
        self.name = name
        self.max_frequency_mhz: int | None = None


class MetricsHistory:
    """The last ``capacity`` points of every model and of the device, one taken by each ``sample``."""

    def __init__(
        self,
        statistics: Callable[[], list[ModelStatistics]],
        *,
        unrouted: UnroutedErrors | None = None,
        capacity: int = HISTORY_POINTS,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``statistics``: every READY version's (ModelRepositoryManager.statistics of every model); ``unrouted``:
        the errors answered for no served model (InferenceService.unrouted)."""
        if capacity < 1:
            raise ValueError("a metrics history holds at least one point")
        self.capacity = capacity
        self._statistics = statistics
        self._clock = clock
        self._monotonic = monotonic
        self._times = array("d", [_NAN]) * capacity
        # Points taken so far (point n lives in slot n % capacity); the points before ``_first`` are not shown
        # (the wall clock went back past them).
        self._count = 0
        self._first = 0
        self._models: dict[str, _ModelSeries] = {}
        self._cpu = array("f", [_NAN]) * capacity
        self._memory_used = array("d", [_NAN]) * capacity
        self._memory_total: int | None = None
        self._edged_cpu = array("f", [_NAN]) * capacity
        self._edged_memory = array("d", [_NAN]) * capacity
        self._gpus: dict[str, _GpuSeries] = {}
        self._npus: dict[int, _NpuSeries] = {}
        self._readings: dict[tuple[str, int], _Reading] = {}
        self._last_tick: float | None = None
        self._unrouted = unrouted if unrouted is not None else UnroutedErrors()
        self._unrouted_seen = self._unrouted.count
        self._unrouted_rate = array("f", [_NAN]) * capacity

    def prime(self) -> None:
        """Take the counters as they are now as the baseline, without a point: what was counted before the
        history started is no burst of its first second."""
        self._readings = {(s.name, s.version): _Reading.of(s) for s in self._statistics()}
        self._unrouted_seen = self._unrouted.count
        self._last_tick = self._monotonic()

    def sample(self, device: DeviceSample | None = None) -> None:
        """Take one point: each model's interval since the previous sample, and the device as ``device`` says."""
        tick = self._monotonic()
        now = round(self._clock(), 3)  # milliseconds: a `since` read back from the JSON is exactly this value
        if self._count > self._first and now <= self._times[(self._count - 1) % self.capacity]:
            # The wall clock went back (an NTP step on a device without a clock of its own): points before it
            # would no longer be in order of time, and `since` could not page through them.
            self._first = self._count
        elapsed = tick - self._last_tick if self._last_tick is not None else SAMPLE_INTERVAL_S
        self._last_tick = tick
        slot = self._count % self.capacity
        self._times[slot] = now
        interval = elapsed if elapsed > 0 else SAMPLE_INTERVAL_S
        self._sample_models(slot, interval)
        unrouted = self._unrouted.count
        self._unrouted_rate[slot] = (unrouted - self._unrouted_seen) / interval
        self._unrouted_seen = unrouted
        self._sample_device(slot, device or DeviceSample())
        self._count += 1

    def _sample_models(self, slot: int, elapsed: float) -> None:
        intervals: dict[str, _Interval] = {}
        readings: dict[tuple[str, int], _Reading] = {}
        for stats in self._statistics():
            key = (stats.name, stats.version)
            reading = readings[key] = _Reading.of(stats)
            before = self._readings.get(key)
            if before is None or before.stats is not stats or _went_back(reading, before):
                before = _ZERO  # loaded (or reloaded) since the previous sample: everything it counted is new
            interval = intervals.get(stats.name)
            if interval is None:
                interval = intervals[stats.name] = _Interval()
            interval.add(reading, before)
        self._readings = readings

        capacity = self.capacity
        for name, interval in intervals.items():
            series = self._models.get(name)
            if series is None:
                series = self._models[name] = _ModelSeries(capacity)
            series.last_seen = self._count
            values = series.series
            values["request_rate"][slot] = interval.requests / elapsed
            values["rejected_rate"][slot] = interval.rejected / elapsed
            values["failed_rate"][slot] = interval.failures / elapsed
            values["queue_ms"][slot] = interval.queue_ns / interval.queue_count / 1e6 if interval.queue_count else _NAN
            values["compute_ms"][slot] = (
                interval.compute_ns / interval.compute_count / 1e6 if interval.compute_count else _NAN
            )
            for label, q in PERCENTILES:
                values[label][slot] = percentile(interval.latency, q)
            executions = sum(interval.executions.values())
            items = sum(size * count for size, count in interval.executions.items())
            values["batch_size_mean"][slot] = items / executions if executions else _NAN
            by_bucket = [0] * len(BATCH_BUCKETS)
            for size, count in interval.executions.items():
                by_bucket[_batch_bucket(size)] += count
            for bucket, count in enumerate(by_bucket):
                series.batches[bucket * capacity + slot] = min(count, _MAX_EXECUTIONS)
        for name, series in list(self._models.items()):
            if name in intervals:
                continue
            if series.last_seen <= self._count - capacity:
                del self._models[name]  # not served for the whole history: nothing of it left to show
            else:
                series.clear(slot, capacity)  # not READY now: a gap in its charts

    def _sample_device(self, slot: int, device: DeviceSample) -> None:
        self._cpu[slot] = device.cpu_utilization if device.cpu_utilization is not None else _NAN
        self._memory_used[slot] = device.memory_used if device.memory_used is not None else _NAN
        if device.memory_total is not None:
            self._memory_total = device.memory_total
        self._edged_cpu[slot] = device.edged_cpu_utilization if device.edged_cpu_utilization is not None else _NAN
        self._edged_memory[slot] = device.edged_memory_used if device.edged_memory_used is not None else _NAN
        seen = set()
        for gpu in device.gpus:
            seen.add(gpu.uuid)
            series = self._gpus.get(gpu.uuid)
            if series is None:
                series = self._gpus[gpu.uuid] = _GpuSeries(self.capacity)
            series.utilization[slot] = gpu.utilization if gpu.utilization is not None else _NAN
            series.memory_used[slot] = gpu.memory_used if gpu.memory_used is not None else _NAN
            if gpu.memory_total is not None:
                series.memory_total = gpu.memory_total
        for uuid, series in self._gpus.items():
            if uuid not in seen:
                series.utilization[slot] = _NAN
                series.memory_used[slot] = _NAN
        self._sample_npus(slot, device.npus)

    def _sample_npus(self, slot: int, npus: tuple[NpuSample, ...]) -> None:
        seen = set()
        for npu in npus:
            seen.add(npu.id)
            series = self._npus.get(npu.id)
            if series is None:
                series = self._npus[npu.id] = _NpuSeries(self.capacity, npu.name)
            series.utilization[slot] = npu.utilization if npu.utilization is not None else _NAN
            series.frequency_mhz[slot] = npu.frequency_mhz if npu.frequency_mhz is not None else _NAN
            if npu.max_frequency_mhz is not None:
                series.max_frequency_mhz = npu.max_frequency_mhz
        for npu_id, series in self._npus.items():
            if npu_id not in seen:
                series.utilization[slot] = _NAN
                series.frequency_mhz[slot] = _NAN

    # --- reading ------------------------------------------------------------------------------------------

    def models(self) -> list[str]:
        """The models with points in the history."""
        return sorted(self._models)

    def nbytes(self) -> int:
        """The bytes of the arrays that hold the points (the bound on what the history keeps)."""
        own = (self._times, self._cpu, self._memory_used, self._unrouted_rate, self._edged_cpu, self._edged_memory)
        total = sum(a.itemsize * len(a) for a in own)
        total += sum(series.nbytes() for series in self._models.values())
        total += sum(8 * self.capacity * 2 for _ in self._gpus)
        total += sum(4 * self.capacity * 2 for _ in self._npus)
        return total

    def history(self, model: str | None = None, since: float | None = None) -> dict[str, Any]:
        """The points after ``since`` (the ``time`` of the last point a poll received; all of them when None, or
        when ``since`` is later than the newest point, as after the wall clock went back), of one model or of
        every model (``model`` None), JSON-ready: series are lists aligned with ``time``, null where there is no
        value (no request in that second, or the model was not READY). ``unknown_model_error_rate``, device-wide,
        is in every reply. The device's ``npus`` are keyed by the NPU's number, as a string (JSON's keys are),
        their ``utilization`` null where the kernel does not expose it."""
        oldest = max(self._first, self._count - self.capacity)
        points = range(oldest, self._count)
        if since is not None and points and since <= self._times[(self._count - 1) % self.capacity]:
            # Points are in order of time: step back from the newest to the first one after `since`.
            start = self._count
            while start > oldest and self._times[(start - 1) % self.capacity] > since:
                start -= 1
            points = range(start, self._count)
        # The points' slots as at most two runs of the ring (it wraps once), read as slices.
        first, count = points.start % self.capacity, len(points)
        runs = [(first, min(first + count, self.capacity))]
        if first + count > self.capacity:
            runs.append((0, first + count - self.capacity))
        slots = _Slots(runs)
        names = [model] if model is not None else sorted(self._models)
        models: dict[str, Any] = {}
        for name in names:
            series = self._models.get(name)
            if series is None:
                continue
            values = series.series
            batches = series.batches
            rejected = _floats(values["rejected_rate"], slots)
            failed = _floats(values["failed_rate"], slots)
            models[name] = {
                "request_rate": _floats(values["request_rate"], slots),
                # The total the API answered before the two were kept apart, for the clients that read it.
                "error_rate": [
                    None if r is None or f is None else round(r + f, 4) for r, f in zip(rejected, failed, strict=True)
                ],
                "rejected_rate": rejected,
                "failed_rate": failed,
                "queue_ms": _floats(values["queue_ms"], slots),
                "compute_ms": _floats(values["compute_ms"], slots),
                "latency_ms": {label: _floats(values[label], slots) for label, _ in PERCENTILES},
                "batch_size_mean": _floats(values["batch_size_mean"], slots),
                "batch_executions": [
                    slots.shifted(batches, bucket * self.capacity) for bucket in range(len(BATCH_BUCKETS))
                ],
            }
        return {
            "interval_s": SAMPLE_INTERVAL_S,
            "capacity": self.capacity,
            "time": slots.of(self._times),
            "last": self._times[(self._count - 1) % self.capacity] if self._count > self._first else None,
            "batch_size_buckets": list(BATCH_BUCKETS),
            "unknown_model_error_rate": _floats(self._unrouted_rate, slots),
            "device": {
                "cpu_utilization": _floats(self._cpu, slots),
                "memory_used_bytes": _ints(self._memory_used, slots),
                "memory_total_bytes": self._memory_total,
                "edged_cpu_utilization": _floats(self._edged_cpu, slots),
                "edged_memory_used_bytes": _ints(self._edged_memory, slots),
                "gpus": {
                    uuid: {
                        "utilization": _floats(gpu.utilization, slots),
                        "memory_used_bytes": _ints(gpu.memory_used, slots),
                        "memory_total_bytes": gpu.memory_total,
                    }
                    for uuid, gpu in sorted(self._gpus.items())
                },
                "npus": {
                    str(npu_id): {
                        "name": npu.name,
                        "utilization": _floats(npu.utilization, slots),
                        "frequency_mhz": _ints(npu.frequency_mhz, slots),
                        "max_frequency_mhz": npu.max_frequency_mhz,
                    }
                    for npu_id, npu in sorted(self._npus.items())
                },
            },
            "models": models,
        }


class _Slots:
    """Which slots of the ring a reply holds: runs of [start, end), oldest first."""

    __slots__ = ("runs",)

    def __init__(self, runs: list[tuple[int, int]]) -> None:
        self.runs = runs

    def of(self, values: array[Any]) -> list[Any]:
        out: list[Any] = []
        for start, end in self.runs:
            out += values[start:end].tolist()
        return out

    def shifted(self, values: array[Any], offset: int) -> list[Any]:
        out: list[Any] = []
        for start, end in self.runs:
            out += values[offset + start : offset + end].tolist()
        return out


def _floats(values: array[float], slots: _Slots) -> list[float | None]:
    # Four decimals: enough for a chart, and no float32 noise (0.1 kept as 0.10000000149) in the JSON.
    return [None if math.isnan(v) else round(v, 4) for v in slots.of(values)]


def _ints(values: array[float], slots: _Slots) -> list[int | None]:
    return [None if math.isnan(v) else int(v) for v in slots.of(values)]
