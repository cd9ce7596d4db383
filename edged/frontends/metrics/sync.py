"""Repository sync's metrics (edged_sync_*), fed by the sync through edged.core.sync_control.SyncObserver."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class SyncMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._runs = Counter(
            "edged_sync_runs", "Repository sync runs, by outcome", ["source", "outcome"], registry=registry
        )
        self._failures = Counter(
            "edged_sync_failures", "Failed repository sync runs, by problem", ["source", "problem"], registry=registry
        )
        self._bytes = Counter("edged_sync_bytes", "Bytes downloaded by repository sync", ["source"], registry=registry)
        self._rate = Gauge(
            "edged_sync_download_rate_bytes",
            "Download rate of the latest sync run that downloaded, in bytes a second",
            ["source"],
            registry=registry,
        )
        self._last_success = Gauge(
            "edged_sync_last_success_timestamp_seconds",
            "When a sync run last succeeded (seconds since the epoch)",
            ["source"],
            registry=registry,
        )
        self._revision = Gauge(
            "edged_sync_revision_info",
            "The revision each source serves (value 1)",
            ["source", "revision"],
            registry=registry,
        )
        self._rollbacks = Counter(
            "edged_sync_rollbacks",
            "Models rolled back after a failed probation",
            ["source", "model"],
            registry=registry,
        )
        self._shown: dict[str, str] = {}

    def run(self, source: str, outcome: str, problem: str | None, transferred: int, seconds: float) -> None:
        self._runs.labels(source, outcome).inc()
        if outcome == "failed":
            self._failures.labels(source, problem or "other").inc()
            return
        self._last_success.labels(source).set(time.time())
        if transferred:
            self._bytes.labels(source).inc(transferred)
            self._rate.labels(source).set(transferred / max(seconds, 1e-6))

    def revision(self, source: str, revision: str) -> None:
        shown = self._shown.get(source)
        if shown is not None and shown != revision:
            with contextlib.suppress(KeyError):
                self._revision.remove(source, shown)
        self._revision.labels(source, revision).set(1)
        self._shown[source] = revision

    def rollback(self, source: str, model: str, revision: str, why: str) -> None:
        self._rollbacks.labels(source, model).inc()
