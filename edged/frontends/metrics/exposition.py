"""Metric families and the Prometheus text format (version 0.0.4) they are served in, as Triton writes it.

Written here rather than with prometheus_client, whose text output renames counters (``_total``) and orders labels
its own way: Triton's names are ``nv_inference_request_success``, and its labels are sorted by name with ``le`` or
``quantile`` last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Iterable

MetricType = Literal["counter", "gauge", "histogram", "summary"]
Labels = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class Sample:
    name: str
    labels: Labels
    value: float


@dataclass(slots=True)
class Family:
    name: str
    help: str
    type: MetricType
    samples: list[Sample] = field(default_factory=list)

    def add(self, labels: Labels, value: float, suffix: str = "") -> None:
        self.samples.append(Sample(self.name + suffix, labels, value))

    def add_histogram(
        self, labels: Labels, count: float, total: float, bounds: Iterable[float], counts: Iterable[float]
    ) -> None:
        """One histogram's samples: ``_count``, ``_sum`` and the cumulative ``_bucket`` per upper bound (``counts``
        per bucket, the last one for ``+Inf``)."""
        self.add(labels, count, "_count")
        self.add(labels, total, "_sum")
        cumulative = 0.0
        for bound, bucket in zip((*bounds, float("inf")), counts, strict=True):
            cumulative += bucket
            self.add((*labels, ("le", format_value(bound))), cumulative, "_bucket")


# What Triton sends with its metrics (the 0.0.4 text format).
CONTENT_TYPE = "text/plain; charset=utf-8"


def render(families: Iterable[Family]) -> bytes:
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            if sample.labels:
                labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels)
                lines.append(f"{sample.name}{{{labels}}} {format_value(sample.value)}")
            else:
                lines.append(f"{sample.name} {format_value(sample.value)}")
    lines.append("")
    return "\n".join(lines).encode()


def format_value(value: float) -> str:
    """As Prometheus' own clients write numbers: ``3`` for whole values, ``+Inf``, ``NaN``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
