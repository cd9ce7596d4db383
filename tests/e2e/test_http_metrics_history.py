"""The metrics history of a real daemon: a client sends requests for a few seconds, the history shows them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.http as httpclient
from server import REPO_ROOT, Server, add_sub_inputs, request, run_server


@pytest.fixture(scope="module")
def daemon() -> Iterator[Server]:
    # The bundled repository: add_sub takes the requests, digits stays idle.
    with run_server([REPO_ROOT / "model_repository"]) as running:
        yield running


def _history(server: Server, query: str = "") -> dict[str, Any]:
    reply = request(server.http_url, "GET", f"/v2/edged/metrics/history{query}")
    assert reply.status == 200, reply.body
    assert (reply.header("content-type") or "").startswith("application/json")
    document: dict[str, Any] = reply.json()
    return document


def _wait_for_points(server: Server, since: float, count: int = 1, after: float | None = None) -> dict[str, Any]:
    """The history since ``since`` once it has ``count`` points, and one taken after the wall-clock time ``after``
    when given (points come once a second: a minute is a bound, never a measurement)."""
    deadline = time.monotonic() + 60
    while True:
        document = _history(server, f"?since={since!r}")
        times = document["time"]
        if len(times) >= count and (after is None or (times and times[-1] > after)):
            return document
        assert time.monotonic() < deadline, f"no such points in a minute: {document}"
        time.sleep(0.2)


def test_requests_show_in_the_history_and_an_idle_model_shows_none(daemon: Server) -> None:
    start = _wait_for_points(daemon, 0.0, 1)  # the first point comes a second after the start
    assert set(start["models"]) == {"add_sub", "digits"}
    since = start["last"]
    sent = 0
    with httpclient.InferenceServerClient(daemon.http_url) as client:
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            client.infer("add_sub", add_sub_inputs())
            sent += 1
    # Every request completed before now: the points up to the first one taken after now count them all.
    document = _wait_for_points(daemon, since, after=time.time())
    busy, idle = document["models"]["add_sub"], document["models"]["digits"]
    # Every request is counted once, in whichever point's interval it completed (a rate over the time since the
    # point before, which a busy machine may stretch past the nominal second); an idle model counts none.
    times = [since, *document["time"]]
    total = sum(
        rate * (end - begin)
        for rate, begin, end in zip(busy["request_rate"], times[:-1], times[1:], strict=True)
        if rate is not None
    )
    assert total == pytest.approx(sent, rel=0.05)
    assert max(busy["request_rate"]) > 0
    assert any(p99 is not None and p99 > 0 for p99 in busy["latency_ms"]["p99"])
    assert any(q is not None and q >= 0 for q in busy["queue_ms"])
    assert all(rate == 0 for rate in busy["error_rate"])
    assert sum(sum(bucket) for bucket in busy["batch_executions"]) == pytest.approx(sent, rel=0.05)
    assert all(rate == 0 for rate in idle["request_rate"])
    assert all(p50 is None for p50 in idle["latency_ms"]["p50"])
    assert any(cpu is not None for cpu in document["device"]["cpu_utilization"])
    assert document["device"]["memory_total_bytes"] > 0


def test_since_returns_only_new_points_of_the_model_asked_for(daemon: Server) -> None:
    _wait_for_points(daemon, 0.0, 1)
    first = _history(daemon, "?model=add_sub")
    assert list(first["models"]) == ["add_sub"]
    last = first["last"]
    assert last is not None and last == first["time"][-1]
    newer = _wait_for_points(daemon, last, 1)
    assert newer["time"] and all(t > last for t in newer["time"])
    assert len(newer["models"]["add_sub"]["request_rate"]) == len(newer["time"])
    # Polled again with its own newest point: only what came after.
    again = _history(daemon, f"?model=add_sub&since={newer['last']!r}")
    assert all(t > newer["last"] for t in again["time"])


@pytest.mark.parametrize("query", ["?since=soon", "?since=nan", "?model=..", "?since=inf"])
def test_bad_queries_are_refused(daemon: Server, query: str) -> None:
    reply = request(daemon.http_url, "GET", f"/v2/edged/metrics/history{query}")
    assert reply.status == 400
    assert reply.error()
