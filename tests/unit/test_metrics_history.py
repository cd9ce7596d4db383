"""The metrics history in-process: real ModelStatistics fed as the schedulers feed them, injected clocks."""

from __future__ import annotations

import json
import math
import random
import time
from typing import Any

import pytest

from edged.core.metrics_history import (
    BATCH_BUCKETS,
    DeviceSample,
    GpuSample,
    MetricsHistory,
    percentile,
)
from edged.core.stats import LATENCY_BUCKETS, ExecutionTiming, FailureReason, ModelStatistics, latency_bucket_bounds
from edged.frontends.metrics.system import DeviceReader


class Clock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.wall = start
        self.mono = 100.0

    def tick(self, seconds: float = 1.0) -> None:
        self.wall += seconds
        self.mono += seconds


class Models:
    """What the repository manager would list: the READY versions' statistics."""

    def __init__(self, *stats: ModelStatistics) -> None:
        self.ready = list(stats)

    def __call__(self) -> list[ModelStatistics]:
        return list(self.ready)


def _history(models: Models, clock: Clock, capacity: int = 600) -> MetricsHistory:
    history = MetricsHistory(models, capacity=capacity, clock=lambda: clock.wall, monotonic=lambda: clock.mono)
    history.prime()
    return history


def _succeed(stats: ModelStatistics, count: int, ms: float = 2.0, queue_ms: float = 0.5, batch: int = 1) -> None:
    timing = ExecutionTiming(input_ns=100_000, infer_ns=1_000_000, output_ns=100_000)
    for _ in range(count):
        stats.record_execution(batch, timing)
        stats.record_success(batch, int(ms * 1e6), int(queue_ms * 1e6), timing)


def _model(history: MetricsHistory, name: str, since: float | None = None) -> dict[str, Any]:
    models: dict[str, Any] = history.history(name, since)["models"]
    return dict(models[name])


def test_rates_and_means_come_from_the_counters_of_each_interval() -> None:
    clock, stats = Clock(), ModelStatistics("add_sub", 1)
    history = _history(Models(stats), clock)
    _succeed(stats, 30)
    stats.record_failure(1_000_000, FailureReason.BACKEND)
    clock.tick(2.0)  # a late sample: rates are per second of the real interval
    history.sample()
    _succeed(stats, 5, queue_ms=1.5)
    clock.tick()
    history.sample()
    clock.tick()
    history.sample()
    series = _model(history, "add_sub")
    assert series["request_rate"] == [15.5, 5.0, 0.0]
    assert series["error_rate"] == [0.5, 0.0, 0.0]
    assert series["queue_ms"] == [0.5, 1.5, None]
    assert series["compute_ms"] == [1.2, 1.2, None]
    assert series["batch_size_mean"] == [1.0, 1.0, None]
    assert series["batch_executions"][0] == [30, 5, 0]


def test_versions_of_a_model_are_summed_and_idle_models_show_zero() -> None:
    clock = Clock()
    one, two, idle = ModelStatistics("m", 1), ModelStatistics("m", 2), ModelStatistics("idle", 1)
    history = _history(Models(one, two, idle), clock)
    _succeed(one, 3)
    _succeed(two, 4)
    clock.tick()
    history.sample()
    assert _model(history, "m")["request_rate"] == [7.0]
    quiet = _model(history, "idle")
    assert quiet["request_rate"] == [0.0]
    assert quiet["latency_ms"] == {"p50": [None], "p90": [None], "p99": [None]}


def test_what_was_counted_before_the_history_started_is_no_burst() -> None:
    clock, stats = Clock(), ModelStatistics("m", 1)
    _succeed(stats, 1000)
    history = _history(Models(stats), clock)
    _succeed(stats, 2)
    clock.tick()
    history.sample()
    assert _model(history, "m")["request_rate"] == [2.0]


def test_a_reloaded_version_never_makes_a_negative_rate() -> None:
    clock, old = Clock(), ModelStatistics("m", 1)
    models = Models(old)
    history = _history(models, clock)
    _succeed(old, 50, batch=4)
    clock.tick()
    history.sample()
    # Reloaded: new statistics for the same version, counting from zero.
    new = ModelStatistics("m", 1)
    models.ready = [new]
    _succeed(new, 3, batch=2)
    clock.tick()
    history.sample()
    # The same object with lower counters (as if reset in place) counts from zero too.
    for duration in (new.success, new.queue, new.compute_infer):
        duration.count = duration.ns = 0
    new.batch_stats.clear()
    new.latency = [0] * LATENCY_BUCKETS
    _succeed(new, 1, batch=2)
    clock.tick()
    history.sample()
    series = _model(history, "m")
    assert series["request_rate"] == [50.0, 3.0, 1.0]
    assert series["batch_size_mean"] == [4.0, 2.0, 2.0]
    assert series["batch_executions"][BATCH_BUCKETS.index(4)] == [50, 0, 0]
    assert series["batch_executions"][BATCH_BUCKETS.index(2)] == [0, 3, 1]
    assert all(value is None or value >= 0 for key in ("request_rate", "queue_ms") for value in series[key])


def test_a_model_not_ready_leaves_a_gap_then_goes_when_its_points_are_gone() -> None:
    clock, stats = Clock(), ModelStatistics("m", 1)
    models = Models(stats)
    history = _history(models, clock, capacity=3)
    clock.tick()
    history.sample()
    models.ready = []
    for _ in range(2):
        clock.tick()
        history.sample()
    assert _model(history, "m")["request_rate"] == [0.0, None, None]
    clock.tick()
    history.sample()
    assert history.models() == []
    assert history.history()["models"] == {}


def test_the_ring_keeps_the_newest_points_and_its_memory_is_fixed() -> None:
    clock, stats = Clock(), ModelStatistics("m", 1)
    history = _history(Models(stats), clock, capacity=5)
    size = None
    for n in range(12):
        _succeed(stats, n)
        clock.tick()
        history.sample()
        size = size or history.nbytes()
        assert history.nbytes() == size
    document = history.history()
    assert len(document["time"]) == 5
    assert document["time"] == [clock.wall - 4 + i for i in range(5)]
    assert document["models"]["m"]["request_rate"] == [7.0, 8.0, 9.0, 10.0, 11.0]


def test_percentiles_of_a_known_set_of_latencies() -> None:
    clock, stats = Clock(), ModelStatistics("m", 1)
    history = _history(Models(stats), clock)
    rng = random.Random(18)
    latencies_ms = sorted(rng.lognormvariate(1.0, 0.8) for _ in range(2000))
    timing = ExecutionTiming()
    for ms in latencies_ms:
        stats.record_success(1, int(ms * 1e6), 0, timing)
    clock.tick()
    history.sample()
    percentiles = _model(history, "m")["latency_ms"]
    for label, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99)):
        exact = latencies_ms[math.ceil(q * len(latencies_ms)) - 1]
        (estimate,) = percentiles[label]
        # Within the width of its bucket: an eighth of an octave.
        assert abs(estimate - exact) <= exact / 8, (label, estimate, exact)


def test_percentiles_interpolate_within_the_bucket() -> None:
    latency = [0] * LATENCY_BUCKETS
    latency[5] = 10  # ten requests of 5 µs
    latency[40] = 10
    lower, upper = latency_bucket_bounds(40)
    assert percentile(latency, 0.5) == 0.006  # the last of the first ten: the top of [5, 6) µs
    assert percentile(latency, 1.0) == upper / 1000
    assert lower / 1000 < percentile(latency, 0.75) < upper / 1000
    assert math.isnan(percentile([0] * LATENCY_BUCKETS, 0.5))
    # Anything past the last bucket reports its lower bound: at least that long.
    stats = ModelStatistics("m", 1)
    stats.record_success(1, 10**15, 0, ExecutionTiming())
    stats.record_success(1, -5, 0, ExecutionTiming())
    assert stats.latency[-1] == 1 and stats.latency[0] == 1


def test_buckets_tile_the_microseconds() -> None:
    previous_upper = 0
    for index in range(LATENCY_BUCKETS):
        lower, upper = latency_bucket_bounds(index)
        assert lower == previous_upper and upper > lower
        assert (upper - lower) * 8 <= max(lower, 8)
        previous_upper = upper
        for us in (lower, upper - 1):
            stats = ModelStatistics("m", 1)
            stats.record_success(1, us * 1000 + 999, 0, ExecutionTiming())
            assert stats.latency[index] == 1, (index, us)


def test_since_returns_only_the_newer_points() -> None:
    clock, stats = Clock(1_800_000_000.0004), ModelStatistics("m", 1)
    history = _history(Models(stats), clock)
    for _ in range(4):
        clock.tick()
        history.sample()
    # As a client does: read the JSON, send back the newest `time` it holds.
    document = json.loads(json.dumps(history.history()))
    assert len(document["time"]) == 4 and document["last"] == document["time"][-1]
    assert history.history(since=document["last"])["time"] == []
    assert history.history(since=document["last"])["models"]["m"]["request_rate"] == []
    clock.tick()
    history.sample()
    newer = history.history("m", since=document["last"])
    assert len(newer["time"]) == 1 and newer["time"][0] > document["last"]
    assert len(newer["models"]["m"]["request_rate"]) == 1
    assert history.history(since=document["time"][1])["time"] == document["time"][2:] + newer["time"]
    # Older than everything: all of it; later than the newest point (the clock went back): all of it too.
    assert len(history.history(since=0.0)["time"]) == 5
    assert len(history.history(since=clock.wall + 3600)["time"]) == 5
    assert history.history("unknown")["models"] == {}


def test_a_clock_that_goes_back_starts_the_points_again() -> None:
    clock, stats = Clock(), ModelStatistics("m", 1)
    history = _history(Models(stats), clock)
    for _ in range(3):
        clock.tick()
        history.sample()
    clock.wall -= 3600
    clock.tick()
    history.sample()
    document = history.history()
    assert document["time"] == [clock.wall]
    assert document["models"]["m"]["request_rate"] == [0.0]


def test_device_readings_and_gpus() -> None:
    clock = Clock()
    history = _history(Models(), clock)
    gpu = GpuSample("GPU-1", utilization=0.5, memory_total=8 << 30, memory_used=1 << 30)
    history.sample(DeviceSample(0.25, 16 << 30, 4 << 30, (gpu,)))
    clock.tick()
    history.sample(DeviceSample(None, None, None, ()))
    device = history.history()["device"]
    assert device["cpu_utilization"] == [0.25, None]
    assert device["memory_used_bytes"] == [4 << 30, None]
    assert device["memory_total_bytes"] == 16 << 30
    assert device["gpus"] == {
        "GPU-1": {"utilization": [0.5, None], "memory_used_bytes": [1 << 30, None], "memory_total_bytes": 8 << 30}
    }


def test_memory_for_twenty_busy_models_is_bounded() -> None:
    clock = Clock()
    stats = [ModelStatistics(f"model_{n}", 1) for n in range(20)]
    history = _history(Models(*stats), clock)
    for _ in range(700):
        for model in stats:
            _succeed(model, 2, batch=8)
        clock.tick()
        history.sample()
    # The points: 9 float32 series (the errors as rejected and failed) and 8 uint16 batch buckets per model and
    # point, plus time, device and the float32 rate of errors for no served model.
    assert history.nbytes() == 20 * 600 * (9 * 4 + 8 * 2) + 600 * (8 + 4 + 8 + 4 + 4 + 8)


def test_capacity_must_hold_a_point() -> None:
    with pytest.raises(ValueError, match="at least one point"):
        MetricsHistory(list, capacity=0)


def test_the_device_reader_reads_this_machine() -> None:
    reader = DeviceReader(cpu=True, gpu=False)
    try:
        sum(range(200_000))  # some CPU time between the readings
        time.sleep(0.05)
        sample = reader.read()
    finally:
        reader.close()
    assert sample.cpu_utilization is not None and 0.0 <= sample.cpu_utilization <= 1.0
    assert sample.memory_total is not None and sample.memory_used is not None
    assert 0 < sample.memory_used <= sample.memory_total
    assert sample.gpus == ()
    quiet = DeviceReader(cpu=False, gpu=False)
    assert quiet.read() == DeviceSample()
