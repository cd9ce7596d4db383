"""``--metrics-config <key>=<value>``: which latency families the metrics endpoint reports, as Triton's flag.

``counter_latencies`` (default true): the cumulative ``nv_inference_*_duration_us`` counters;
``summary_latencies`` (default false): the ``nv_inference_*_summary_us`` summaries, with ``summary_quantiles``
(``<quantile>:<error>,...``); ``histogram_latencies`` (default false): ``nv_inference_first_response_histogram_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Triton's default quantiles (quantile, allowed error), those of prometheus-cpp's summaries.
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)

_TRUE = {"true", "on", "1", "yes"}
_FALSE = {"false", "off", "0", "no"}


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES


def parse_metrics_config(values: list[str]) -> MetricsConfig:
    """The ``--metrics-config`` values, in order (a later one wins); ValueError with one line for a bad one."""
    settings: dict[str, object] = {}
    for value in values:
        key, sep, item = value.partition("=")
        key, item = key.strip(), item.strip().strip('"')
        if not sep or not key:
            raise ValueError(f"--metrics-config expects KEY=VALUE, got '{value}'")
        if key in ("counter_latencies", "histogram_latencies", "summary_latencies"):
            settings[key] = _bool(key, item)
        elif key == "summary_quantiles":
            settings[key] = _quantiles(item)
        else:
            raise ValueError(
                f"--metrics-config: unknown setting '{key}' (expected counter_latencies, histogram_latencies, "
                "summary_latencies or summary_quantiles)"
            )
    return MetricsConfig(**settings)  # type: ignore[arg-type]


def _bool(key: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"--metrics-config {key} expects true or false, got '{text}'")


def _quantiles(text: str) -> tuple[tuple[float, float], ...]:
    pairs: list[tuple[float, float]] = []
    for pair in text.replace(" ", ",").split(","):
        if not pair:
            continue
        quantile, sep, error = pair.partition(":")
        try:
            q, e = float(quantile), float(error)
        except ValueError:
            q = e = -1.0
        if not sep or not 0.0 <= q <= 1.0 or not 0.0 <= e <= 1.0:
            raise ValueError(f"--metrics-config summary_quantiles expects <quantile>:<error>,..., got '{pair}'")
        pairs.append((q, e))
    if not pairs:
        raise ValueError("--metrics-config summary_quantiles names no quantile")
    return tuple(pairs)
