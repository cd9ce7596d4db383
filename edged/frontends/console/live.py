"""The live metrics page: charts of the short metrics history (edged.core.metrics_history) of every model or of
one, and of the device. ``/metrics`` is the page (with a table of the values for a browser without JavaScript);
``/metrics/data`` is the history as JSON, which charts.js polls for the points after the last it has.

``range`` (a plain form field, so that it works without JavaScript) picks how much of the history the page shows:
the charts' time span, and the span the table averages over.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from litestar import Request, Response, get
from litestar.exceptions import NotFoundException
from litestar.params import Parameter
from litestar.response import Template

from edged.core.metrics_history import BATCH_BUCKETS, HISTORY_POINTS, PERCENTILES, SAMPLE_INTERVAL_S
from edged.errors import EdgedError, ErrorCode
from edged.frontends.console.pages import console, render

if TYPE_CHECKING:
    from edged.core.service import InferenceService

# The spans the range picker offers (seconds; None: every point the daemon keeps), the first the default: a
# minute is recent enough for the table's means to say how things are now, and long enough not to jump with
# every batch as one second would.
RANGES: dict[str, float | None] = {"1m": 60.0, "5m": 300.0, "all": None}
DEFAULT_RANGE = "1m"
# How often charts.js asks for new points (milliseconds); the history takes one a second.
POLL_MS = 1500


@dataclass(frozen=True, slots=True)
class ModelLatest:
    """One model's latest values (None: no request in the window)."""

    name: str
    request_rate: float
    error_rate: float
    rejected_rate: float
    failed_rate: float
    latency_ms: dict[str, float | None]
    queue_ms: float | None
    compute_ms: float | None
    batch_size_mean: float | None
    executions: list[tuple[str, float]]  # executions a second by batch-size bucket, those with any


@dataclass(frozen=True, slots=True)
class GpuLatest:
    uuid: str
    utilization: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True, slots=True)
class DeviceLatest:
    cpu_utilization: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    gpus: list[GpuLatest]


def bucket_labels() -> list[str]:
    """The batch-size buckets as people read them: ``1``, ``2``, ``3-4``, ``5-8`` ..., the last open-ended."""
    labels: list[str] = []
    lower = 1
    for index, upper in enumerate(BATCH_BUCKETS):
        if index == len(BATCH_BUCKETS) - 1:
            labels.append(f"{lower}+")
        else:
            labels.append(str(upper) if lower == upper else f"{lower}-{upper}")
        lower = upper + 1
    return labels


def range_choices(kept_s: float) -> list[tuple[str, str, str, float | None]]:
    """The range picker's options as (value, label, what the table's heading says of it, seconds or None for
    all); the last names how long the daemon keeps points."""
    kept = f"{kept_s / 60:.0f} minutes" if kept_s >= 120 else f"{kept_s:.0f} seconds"
    phrases = {
        "1m": ("Last minute", "the last minute"),
        "5m": ("Last 5 minutes", "the last 5 minutes"),
        "all": (f"All it keeps ({kept})", f"all it keeps, {kept}"),
    }
    return [(value, *phrases[value], seconds) for value, seconds in RANGES.items()]


@get("/metrics")
async def metrics_page(
    request: Request[Any, Any, Any],
    model: str = "",
    chosen: Annotated[str, Parameter(query="range")] = DEFAULT_RANGE,
) -> Template:
    service = console(request).service
    names = _model_names(service)
    selected = model or None
    if selected is not None and selected not in names:
        raise NotFoundException(f"there is no model '{selected}' to show")
    if chosen not in RANGES:
        choices = ", ".join(f"'{value}'" for value in RANGES)
        raise EdgedError(ErrorCode.INVALID_ARG, f"'range' must be one of {choices}")
    span = RANGES[chosen]
    history = _history(service, selected, time.time() - span if span is not None else None)
    kept_s = history.get("capacity", HISTORY_POINTS) * history.get("interval_s", SAMPLE_INTERVAL_S)
    return render(
        request,
        "metrics.html",
        names=names,
        selected=selected,
        models=_models_latest(history),
        device=_device_latest(history),
        poll_ms=POLL_MS,
        chosen_range=chosen,
        range_s=span,
        ranges=range_choices(kept_s),
        buckets=bucket_labels(),
        percentiles=[label for label, _ in PERCENTILES],
    )


@get("/metrics/data")
async def metrics_data(request: Request[Any, Any, Any], model: str = "", since: str = "") -> Response[Any]:
    """The history (of ``model``, or every model), the points after ``since`` only, as the API's
    /v2/edged/metrics/history answers it."""
    try:
        after = float(since) if since else None
    except ValueError:
        raise EdgedError(ErrorCode.INVALID_ARG, "'since' must be a number of seconds since the epoch") from None
    return Response(console(request).service.metrics_history(model or None, after))


def _model_names(service: InferenceService) -> list[str]:
    """The models of the repositories and those still in the history (one removed a moment ago)."""
    names = {summary.name for summary in service.model_summaries()}
    return sorted(names | set(_history(service, None, time.time()).get("models", {})))


def _history(service: InferenceService, model: str | None, since: float | None) -> dict[str, Any]:
    try:
        return service.metrics_history(model, since)
    except EdgedError:
        return {}  # a server that keeps no history: the page says there is nothing to show


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None and math.isfinite(v)]
    return sum(present) / len(present) if present else None


def _models_latest(history: dict[str, Any]) -> list[ModelLatest]:
    labels = bucket_labels()
    out: list[ModelLatest] = []
    for name, series in sorted(history.get("models", {}).items()):
        executions = [
            (labels[index], rate)
            for index, counts in enumerate(series["batch_executions"])
            if (rate := _mean([float(c) for c in counts]) or 0.0) > 0
        ]
        out.append(
            ModelLatest(
                name=name,
                request_rate=_mean(series["request_rate"]) or 0.0,
                error_rate=_mean(series["error_rate"]) or 0.0,
                rejected_rate=_mean(series["rejected_rate"]) or 0.0,
                failed_rate=_mean(series["failed_rate"]) or 0.0,
                latency_ms={label: _mean(values) for label, values in series["latency_ms"].items()},
                queue_ms=_mean(series["queue_ms"]),
                compute_ms=_mean(series["compute_ms"]),
                batch_size_mean=_mean(series["batch_size_mean"]),
                executions=executions,
            )
        )
    return out


def _last(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return present[-1] if present else None


def _device_latest(history: dict[str, Any]) -> DeviceLatest:
    device = history.get("device", {})
    gpus = [
        GpuLatest(uuid, _mean(gpu["utilization"]), _last(gpu["memory_used_bytes"]), gpu["memory_total_bytes"])
        for uuid, gpu in device.get("gpus", {}).items()
    ]
    return DeviceLatest(
        _mean(device.get("cpu_utilization", [])),
        _last(device.get("memory_used_bytes", [])),
        device.get("memory_total_bytes"),
        gpus,
    )


ROUTES = [metrics_page, metrics_data]
