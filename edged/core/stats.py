"""Per model-version statistics, as Triton's statistics extension reports them.

This is the one record of what each model did: the statistics endpoints (HTTP and gRPC) read it, and the
Prometheus metrics will be derived from it, so the two can never disagree.

Semantics (Triton's): ``success``/``fail`` count requests and their end-to-end nanoseconds; ``queue`` and the
three ``compute_*`` durations are per successful request; ``inference_count`` counts batch items;
``execution_count`` counts model executions; ``batch_stats`` is per execution, keyed by its batch size. Requests
refused by validation are not counted, as in Triton. ``latency`` is edged's own: successful requests' end-to-end
durations in fixed buckets, from which the metrics history takes each second's percentiles.

``refused`` and ``UnroutedErrors`` are edged's own too, and never reach the statistics extension or ``nv_*``: the
requests answered with an error that Triton's counters leave out (Triton 2.51, measured: a missing or unknown input,
a wrong datatype or shape, an unknown model or version count nowhere), so that the metrics history, and the
console's error figures from it, show every error a client saw. Written and read on the event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum


class FailureReason(StrEnum):
    """Why a request failed, as Triton labels ``nv_inference_request_failure``."""

    REJECTED = "REJECTED"  # refused by the scheduler: queue full, timed out in the queue
    CANCELED = "CANCELED"  # the client cancelled it
    BACKEND = "BACKEND"  # the model answered with an error
    OTHER = "OTHER"


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns


@dataclass(slots=True)
class BatchStatistics:
    batch_size: int
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class ExecutionTiming:
    """What a backend reports of one execution: nanoseconds to prepare inputs, run the model, and take outputs."""

    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0


# Buckets of ``ModelStatistics.latency``, log-linear in microseconds: one per microsecond below 16 µs, then eight to
# an octave (so a bucket is at most 1/8 of its lower bound wide), up to about 134 s; the last one takes anything
# longer. Cumulative counts, never reset: whoever wants an interval's distribution subtracts two readings.
LATENCY_BUCKETS = 200


def latency_bucket_bounds(index: int) -> tuple[int, int]:
    """The bucket's [lower, upper) bound in microseconds (the inverse of the index record_success computes)."""
    if index < 16:
        return index, index + 1
    shift = (index >> 3) - 1
    top = (index & 7) + 8
    return top << shift, (top + 1) << shift


# (statistics, end-to-end and queue nanoseconds, execution timing) of one successful request.
RequestObserver = Callable[["ModelStatistics", int, int, ExecutionTiming], None]


@dataclass(slots=True)
class ModelStatistics:
    name: str
    version: int
    # Milliseconds since the epoch of the last request's completion; 0 before the first.
    last_inference: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batch_stats: dict[int, BatchStatistics] = field(default_factory=dict)
    # Failed requests by reason (their sum is ``fail.count``).
    failures: dict[FailureReason, int] = field(default_factory=dict)
    # Requests the scheduler holds that no instance has started yet (Triton's pending request count).
    pending: int = 0
    # Requests answered with an error that neither ``success`` nor ``fail`` counts: refused before a scheduler
    # queued them (a bad input, an undecodable body, a full queue, a sequence without its correlation ID).
    refused: int = 0
    # Requests ``success`` counts whose client was answered an error all the same: the model answered with an error
    # (Triton counts that a success), or the answer failed after the model succeeded (a requested output missing,
    # a response that cannot be encoded). Errors, not more requests, for the history.
    answered_errors: int = 0
    # The version answers from the response cache (its config enables it and the device has one): the metrics
    # then list its nv_cache_* counters, as Triton lists them for such a model only.
    cache_enabled: bool = False
    # Successful requests by end-to-end duration (LATENCY_BUCKETS, cumulative).
    latency: list[int] = field(default_factory=lambda: [0] * LATENCY_BUCKETS, repr=False, compare=False)
    # Told of every successful request when the metrics keep per-request observations (latency summaries, the
    # first-response histogram); None while they do not, so that the common case costs one test. Given by whoever
    # builds the statistics (the repository manager, from the daemon's metrics).
    observer: RequestObserver | None = field(default=None, repr=False, compare=False)

    def record_execution(self, batch_size: int, timing: ExecutionTiming) -> None:
        self.execution_count += 1
        stats = self.batch_stats.get(batch_size)
        if stats is None:
            stats = self.batch_stats[batch_size] = BatchStatistics(batch_size)
        stats.compute_input.add(timing.input_ns)
        stats.compute_infer.add(timing.infer_ns)
        stats.compute_output.add(timing.output_ns)

    def record_success(self, batch_size: int, request_ns: int, queue_ns: int, timing: ExecutionTiming) -> None:
        self.inference_count += batch_size
        self.success.add(request_ns)
        self.queue.add(queue_ns)
        self.compute_input.add(timing.input_ns)
        self.compute_infer.add(timing.infer_ns)
        self.compute_output.add(timing.output_ns)
        self.last_inference = time.time_ns() // 1_000_000
        self._count_latency(request_ns)

        if self.observer is not None:
            self.observer(self, request_ns, queue_ns, timing)

    def record_cache_hit(self, request_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """A request answered from the response cache, as Triton counts it: a success with its duration and queue
        time, and a cache hit; no inference, no execution, no compute time. ``last_inference`` stays, as Triton 2.51
        leaves it on a hit (measured)."""
        self.success.add(request_ns)
        self.queue.add(queue_ns)
        self.cache_hit.add(lookup_ns)
        self._count_latency(request_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """A successful request the cache did not hold: its lookup and insertion time, which Triton adds to the
        request's duration too."""
        self.cache_miss.add(miss_ns)
        self.success.ns += miss_ns

    def _count_latency(self, request_ns: int) -> None:
        # The bucket by bit arithmetic rather than a search: a handful of integer operations per request.
        us = request_ns // 1000
        if us >= 16:
            shift = us.bit_length() - 4
            index = (shift << 3) + (us >> shift)
            if index >= LATENCY_BUCKETS:
                index = LATENCY_BUCKETS - 1
        else:
            index = us if us > 0 else 0
        self.latency[index] += 1

    def record_failure(self, request_ns: int, reason: FailureReason = FailureReason.BACKEND) -> None:
        self.fail.add(request_ns)
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_inference = time.time_ns() // 1_000_000

    def record_refusal(self) -> None:
        """A request answered with an error that success and fail do not count (see ``refused``). Triton's
        ``last_inference`` stays: Triton does not move it for such a request either."""
        self.refused += 1

    def record_answered_error(self) -> None:
        """A request counted as a success whose client was answered an error (see ``answered_errors``)."""
        self.answered_errors += 1


@dataclass(slots=True)
class UnroutedErrors:
    """Inference requests answered with an error before any model version took them: the model or version is
    unknown or not ready. One device-wide count, as clients name models freely: a count per name asked for would
    grow without bound."""

    count: int = 0
