"""The metrics history counts every error a client was answered: Triton's failures, the refusals Triton's
statistics leave out (ModelStatistics.refused), and the errors for no served model (UnroutedErrors), device-wide.
Real statistics and history, injected clocks."""

from __future__ import annotations

from edged.core.metrics_history import MetricsHistory
from edged.core.stats import ExecutionTiming, FailureReason, ModelStatistics, UnroutedErrors


class _Clock:
    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 100.0

    def tick(self, seconds: float = 1.0) -> None:
        self.wall += seconds
        self.mono += seconds


def _history(stats: ModelStatistics, unrouted: UnroutedErrors, clock: _Clock) -> MetricsHistory:
    history = MetricsHistory(lambda: [stats], unrouted=unrouted, clock=lambda: clock.wall, monotonic=lambda: clock.mono)
    history.prime()
    return history


def test_refusals_are_requests_and_errors_and_unknown_models_are_the_devices() -> None:
    clock, stats, unrouted = _Clock(), ModelStatistics("add_sub", 1), UnroutedErrors()
    stats.record_refusal()  # before the history started: no burst of its first second
    unrouted.count += 3
    history = _history(stats, unrouted, clock)
    timing = ExecutionTiming(infer_ns=1_000_000)
    stats.record_execution(1, timing)
    stats.record_success(1, 2_000_000, 0, timing)
    stats.record_failure(1_000_000, FailureReason.BACKEND)
    for _ in range(4):
        stats.record_refusal()
    unrouted.count += 2
    clock.tick(2.0)
    history.sample()
    clock.tick()
    history.sample()
    document = history.history()
    series = document["models"]["add_sub"]
    # 6 requests in 2 s: 1 success, 1 failure, 4 refusals; 5 of them errors.
    assert series["request_rate"] == [3.0, 0.0]
    assert series["error_rate"] == [2.5, 0.0]
    assert document["unknown_model_error_rate"] == [1.0, 0.0]
    # A refusal is no successful request: the latency and timing series stay those of the success.
    assert series["compute_ms"] == [1.0, None]


def test_refusals_are_not_in_the_statistics_triton_reports() -> None:
    stats = ModelStatistics("add_sub", 1)
    stats.record_refusal()
    assert stats.refused == 1
    assert (stats.success.count, stats.fail.count, stats.failures, stats.inference_count) == (0, 0, {}, 0)
    assert stats.last_inference == 0  # Triton leaves it for a request refused before the model ran


def test_rejected_and_failed_are_kept_apart_and_add_up_to_the_errors() -> None:
    clock, stats, unrouted = _Clock(), ModelStatistics("add_sub", 1), UnroutedErrors()
    history = _history(stats, unrouted, clock)
    for _ in range(3):
        stats.record_refusal()  # a wrong shape, an unknown input: answered before the model ran
    stats.record_failure(1_000_000, FailureReason.BACKEND)  # the model raised
    stats.record_execution(1, ExecutionTiming(infer_ns=1_000_000))
    stats.record_success(1, 2_000_000, 0, ExecutionTiming(infer_ns=1_000_000))
    stats.record_answered_error()  # the model answered with an error
    clock.tick()
    history.sample()
    clock.tick()
    history.sample()
    series = history.history()["models"]["add_sub"]
    assert series["rejected_rate"] == [3.0, 0.0]
    assert series["failed_rate"] == [2.0, 0.0]
    assert series["error_rate"] == [5.0, 0.0]
