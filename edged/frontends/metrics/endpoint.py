"""The /metrics endpoint: one scrape's families in Triton's order, then edged's own registry, as one ASGI app."""

from __future__ import annotations

from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import CollectorRegistry

from edged.frontends.metrics.exposition import CONTENT_TYPE, Family, render
from edged.frontends.metrics.models import cache_families

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import Any

    from edged.core.backend_api import CustomMetricFamily
    from edged.core.response_cache import ResponseCache
    from edged.frontends.metrics.models import ModelMetrics
    from edged.frontends.metrics.system import SystemMetrics

    Receive = Callable[[], Awaitable[dict[str, Any]]]
    Send = Callable[[dict[str, Any]], Awaitable[None]]


def edged_registry() -> CollectorRegistry:
    """The registry of the metrics edged adds beyond Triton's (``edged_*``): Prometheus' own conventions and writer,
    served after Triton's families on the same /metrics. (Triton's ``nv_*`` families stay hand-written:
    prometheus-client's writer would append ``_total`` to every counter, and Triton's names have none.)"""
    # Each counter would otherwise export a ``_created`` gauge per label set: noise for a scraper.
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    return CollectorRegistry()


class MetricsCollector:
    """Everything one scrape lists: Triton's order (model families, system gauges, then models' own), then
    edged's own (``registry``)."""

    def __init__(
        self,
        models: ModelMetrics | None = None,
        system: SystemMetrics | None = None,
        custom: Callable[[], list[CustomMetricFamily]] | None = None,
        registry: CollectorRegistry | None = None,
        cache: ResponseCache | None = None,
    ) -> None:
        """``cache``: the response cache, whose device-wide gauges follow the system's, when the device has one."""
        self._models = models
        self._system = system
        self._custom = custom
        self._registry = registry
        self._cache = cache

    def render(self) -> bytes:
        text = render(self.collect())
        if self._registry is not None:
            text += prometheus_client.generate_latest(self._registry)
        return text

    def collect(self) -> list[Family]:
        families: list[Family] = []
        if self._models is not None:
            families += self._models.collect()
        if self._system is not None:
            families += self._system.collect()
        if self._cache is not None:
            families += cache_families(self._cache)
        if self._custom is not None:
            families += [custom_family(family) for family in self._custom()]
        return families


def custom_family(family: CustomMetricFamily) -> Family:
    """A model's own family as Triton exports it: its labels only, sorted; a histogram's count, sum, then its
    cumulative buckets."""
    out = Family(family.name, family.description, family.kind)
    for metric in family.metrics:
        labels = tuple(sorted(metric.labels.items()))
        if family.kind != "histogram":
            out.add(labels, metric.value)
            continue
        out.add_histogram(labels, metric.count, metric.value, metric.buckets, metric.bucket_counts)
    return out


def create_metrics_app(collector: MetricsCollector) -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"].rstrip("/")
        content_type = "text/plain; charset=utf-8"
        if path != "/metrics":
            # Triton answers 200 with nothing on every path; a typo in a scrape config deserves to be seen.
            status, body = 404, b"Not Found: metrics are served at /metrics\n"
        elif scope["method"] not in ("GET", "HEAD"):
            status, body = 405, b"Method Not Allowed\n"
        else:
            status, body, content_type = 200, collector.render(), CONTENT_TYPE
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        if scope["method"] == "HEAD":
            body = b""
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app
