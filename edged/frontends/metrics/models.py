"""Per-model metric families under Triton's names, derived at scrape time from each loaded version's
ModelStatistics: the statistics extension reads the same record, so the two can never disagree.

The counters need nothing more than those sums and counts. The optional summaries and the first-response
histogram (``--metrics-config``) need each request's durations: a ``LatencyRecorder`` keeps them, and its
``observer`` (None while those families are off, the default) is what the daemon gives the repository manager for
every model's statistics to call with each successful request. Everything here runs on the event loop.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily

from edged.core.stats import FailureReason
from edged.errors import EdgedError
from edged.frontends.metrics.exposition import Family, Labels, format_value

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edged.core.response_cache import ResponseCache
    from edged.core.service import InferenceService
    from edged.core.stats import ExecutionTiming, ModelStatistics, RequestObserver
    from edged.frontends.metrics.config import MetricsConfig
    from edged.proto.model_config_pb2 import ModelConfig

FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
# Triton's default buckets of the first-response histogram, in milliseconds; model_metrics may override them.
DEFAULT_FIRST_RESPONSE_BUCKETS_MS: tuple[float, ...] = (100.0, 500.0, 2000.0, 5000.0)
# Summary quantiles are over the last minute, as prometheus-cpp's summaries (max age 60 s), and over at most this
# many of its observations, so that a busy model's window stays small.
SUMMARY_WINDOW_S = 60.0
SUMMARY_WINDOW_MAX = 4096

# (name, help) of the counters, in Triton's order.
_COUNTS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)"),
)
# Triton's per-model cache counters, listed for a version whose response cache is on (with the latency counters).
_CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model"),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds"),
)
_DURATIONS = (
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
)
_SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
)
_PENDING = (
    "nv_inference_pending_request_count",
    "Instantaneous number of pending requests awaiting execution per-model.",
)
_FIRST_RESPONSE_HELP = "Duration from request to first response in milliseconds"
# The order in which Triton lists the failure reasons.
_REASONS = (FailureReason.REJECTED, FailureReason.CANCELED, FailureReason.BACKEND, FailureReason.OTHER)

_Key = tuple[str, int]


class _Summary:
    __slots__ = ("_window", "count", "sum")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self._window: deque[tuple[float, float]] = deque(maxlen=SUMMARY_WINDOW_MAX)

    def observe(self, value: float, now: float) -> None:
        self.count += 1
        self.sum += value
        self._window.append((now, value))

    def quantiles(self, quantiles: tuple[tuple[float, float], ...], now: float) -> list[float]:
        while self._window and self._window[0][0] < now - SUMMARY_WINDOW_S:
            self._window.popleft()
        values = sorted(v for _, v in self._window)
        if not values:
            return [float("nan")] * len(quantiles)
        # The nearest-rank quantile of the window.
        return [values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] for q, _ in quantiles]


class _Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        self.counts[bisect.bisect_left(self.bounds, value)] += 1


class LatencyRecorder:
    """Each request's durations for the summary and first-response histogram families, by model version."""

    def __init__(self, config: MetricsConfig | None = None) -> None:
        self.summaries = False
        self.histograms = False
        self._summaries: dict[_Key, tuple[_Summary, ...]] = {}
        self._histograms: dict[_Key, _Histogram] = {}
        if config is not None:
            self.configure(config)

    def configure(self, config: MetricsConfig) -> None:
        self.summaries = config.summary_latencies
        self.histograms = config.histogram_latencies
        self._summaries.clear()
        self._histograms.clear()

    @property
    def observer(self) -> RequestObserver | None:
        """What model statistics call with every successful request, or None while no family needs them."""
        return self._observed if (self.summaries or self.histograms) else None

    def _observed(self, stats: ModelStatistics, request_ns: int, queue_ns: int, timing: ExecutionTiming) -> None:
        self.observe_request(stats, request_ns, queue_ns, timing)
        # A request with one response (every model but a decoupled one) has it when it completes.
        self.observe_first_response(stats, request_ns)

    def observe_request(self, stats: ModelStatistics, request_ns: int, queue_ns: int, timing: ExecutionTiming) -> None:
        if not self.summaries:
            return
        key = (stats.name, stats.version)
        summaries = self._summaries.get(key)
        if summaries is None:
            summaries = self._summaries[key] = tuple(_Summary() for _ in _SUMMARIES)
        now = time.monotonic()
        for summary, ns in zip(
            summaries, (request_ns, queue_ns, timing.input_ns, timing.infer_ns, timing.output_ns), strict=True
        ):
            summary.observe(ns / 1000, now)

    def observe_first_response(self, stats: ModelStatistics, first_response_ns: int) -> None:
        if not self.histograms:
            return
        key = (stats.name, stats.version)
        histogram = self._histograms.get(key)
        if histogram is None:
            histogram = self._histograms[key] = _Histogram(DEFAULT_FIRST_RESPONSE_BUCKETS_MS)
        histogram.observe(first_response_ns / 1_000_000)

    def summaries_of(self, key: _Key) -> tuple[_Summary, ...]:
        summaries = self._summaries.get(key)
        if summaries is None:
            summaries = self._summaries[key] = tuple(_Summary() for _ in _SUMMARIES)
        return summaries

    def histogram_of(self, key: _Key, bounds: tuple[float, ...]) -> _Histogram:
        """The version's histogram with these bounds (its model_metrics'); one observed under other bounds (before
        the first scrape saw the model's configuration) starts again."""
        histogram = self._histograms.get(key)
        if histogram is None or histogram.bounds != bounds:
            histogram = self._histograms[key] = _Histogram(bounds)
        return histogram


def model_labels(stats: ModelStatistics, config: ModelConfig | None) -> Labels:
    """Triton's labels of a model version: ``model``, ``version`` and ``_<tag>`` for each ``metric_tags`` entry,
    sorted by name."""
    labels = {"model": stats.name, "version": str(stats.version)}
    if config is not None:
        labels.update({f"_{key}": value for key, value in config.metric_tags.items()})
    return tuple(sorted(labels.items()))


def first_response_buckets(config: ModelConfig | None) -> tuple[float, ...]:
    if config is not None:
        for control in config.model_metrics.metric_control:
            if (
                control.metric_identifier.family == FIRST_RESPONSE_HISTOGRAM
                and control.WhichOneof("metric_options") == "histogram_options"
            ):
                return tuple(sorted(b for b in control.histogram_options.buckets))
    return DEFAULT_FIRST_RESPONSE_BUCKETS_MS


class ModelMetrics:
    """The per-model families of every READY model version, built from its statistics at each scrape."""

    def __init__(self, service: InferenceService, config: MetricsConfig, recorder: LatencyRecorder) -> None:
        """``recorder``: the one whose ``observer`` the manager's statistics were given."""
        self._service = service
        self._config = config
        self._recorder = recorder

    def collect(self) -> list[Family]:
        versions: list[tuple[ModelStatistics, ModelConfig | None]] = []
        for stats in self._service.statistics("", -1):
            try:
                config: ModelConfig | None = self._service.model_config(stats.name, stats.version)
            except EdgedError:  # not READY any more
                continue
            versions.append((stats, config))
        success, failure, count, exec_count = (Family(name, text, "counter") for name, text in _COUNTS)
        durations = [Family(name, text, "counter") for name, text in _DURATIONS]
        cached = [Family(name, text, "counter") for name, text in _CACHE_COUNTERS]
        pending = Family(*_PENDING, "gauge")
        summaries = [Family(name, text, "summary") for name, text in _SUMMARIES]
        histogram = Family(FIRST_RESPONSE_HISTOGRAM, _FIRST_RESPONSE_HELP, "histogram")
        now = time.monotonic()
        for stats, config in versions:
            labels = model_labels(stats, config)
            success.add(labels, stats.success.count)
            for reason in _REASONS:
                failure.add(tuple(sorted((*labels, ("reason", reason.value)))), stats.failures.get(reason, 0))
            count.add(labels, stats.inference_count)
            exec_count.add(labels, stats.execution_count)
            # Triton adds only successful requests' durations; failed ones count in nv_inference_request_failure.
            totals = (stats.success, stats.queue, stats.compute_input, stats.compute_infer, stats.compute_output)
            for family, total in zip(durations, totals, strict=True):
                family.add(labels, total.ns // 1000)
            if stats.cache_enabled:
                for family, number in zip(
                    cached,
                    (
                        stats.cache_hit.count,
                        stats.cache_hit.ns // 1000,
                        stats.cache_miss.count,
                        stats.cache_miss.ns // 1000,
                    ),
                    strict=True,
                ):
                    family.add(labels, number)
            pending.add(labels, stats.pending)
            key = (stats.name, stats.version)
            if self._config.summary_latencies:
                for family, summary in zip(summaries, self._recorder.summaries_of(key), strict=True):
                    family.add(labels, summary.count, "_count")
                    family.add(labels, summary.sum, "_sum")
                    quantiles = self._config.summary_quantiles
                    for (q, _), value in zip(quantiles, summary.quantiles(quantiles, now), strict=True):
                        family.add((*labels, ("quantile", format_value(q))), value)
            if self._config.histogram_latencies:
                observed = self._recorder.histogram_of(key, first_response_buckets(config))
                histogram.add_histogram(labels, observed.count, observed.sum, observed.bounds, observed.counts)
        families = [success, failure, count, exec_count]
        if self._config.counter_latencies:
            families += durations
            families += [family for family in cached if family.samples]
        families.append(pending)
        if self._config.summary_latencies:
            families += summaries
        if self._config.histogram_latencies:
            families.append(histogram)
        return families


def cache_families(cache: ResponseCache) -> list[Family]:
    """Triton's device-wide gauges of its response cache (listed while the device has one). Triton refreshes them
    every few seconds; these are read at the scrape."""
    counts = cache.counts
    values: tuple[tuple[str, str, float], ...] = (
        ("nv_cache_util", "Cache utilization [0.0 - 1.0]", cache.bytes / cache.size),
        ("nv_cache_num_entries", "Number of responses stored in response cache", cache.entry_count),
        ("nv_cache_num_hits", "Number of cache hits in response cache", counts.hits),
        ("nv_cache_num_misses", "Number of cache misses in response cache", counts.misses),
        ("nv_cache_num_lookups", "Number of cache lookups in response cache", counts.hits + counts.misses),
        ("nv_cache_num_evictions", "Number of cache evictions in response cache", counts.evictions),
        (
            "nv_cache_lookup_duration",
            "Total cache lookup duration (hit and miss), in microseconds",
            counts.lookup_ns // 1000,
        ),
        ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds", counts.insertion_ns // 1000),
    )
    families = []
    for name, text, value in values:
        family = Family(name, text, "gauge")
        family.add((), value)
        families.append(family)
    return families


class ResponseCacheBytes:
    """``edged_response_cache_bytes`` and ``edged_response_cache_size_bytes``: a prometheus-client collector of what
    the response cache holds and may hold, in bytes (Triton has only the ratio, nv_cache_util)."""

    def __init__(self, cache: ResponseCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        used = GaugeMetricFamily(
            "edged_response_cache_bytes", "Bytes the response cache's entries take (never above its size)"
        )
        used.add_metric([], self._cache.bytes)
        yield used
        size = GaugeMetricFamily("edged_response_cache_size_bytes", "The response cache's size (--cache-config)")
        size.add_metric([], self._cache.size)
        yield size
