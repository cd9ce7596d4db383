"""Rejected apart from failed, against the real daemon: a request with a wrong shape is refused at validation
(answered 400 before the model runs) and a request that makes a Python model raise fails while it runs; each is
counted under its own name in /v2/edged/metrics/history (their sum stays ``error_rate``), drawn as its own series
of the console's Errors chart, and shown in its own column of the table a browser without JavaScript gets."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pytest
import tritonclient.http as httpclient
from browser import assert_accessible, screenshot
from console_session import browser_login, console_server
from playwright.sync_api import expect
from server import Server, request
from tritonclient.utils import InferenceServerException

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytest_plugins = ("console_fixtures",)

TESTDATA: Final = Path(__file__).resolve().parents[1] / "testdata" / "python_models"
# Does what its MODE input says: "raise" raises in execute, "ok" answers.
MODEL: Final = "misbehave"
REJECTED: Final = 3
FAILED: Final = 2
WAIT_S: Final = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("live-errors")
    shutil.copytree(TESTDATA / MODEL, repo / MODEL)
    with console_server([repo], tmp_path_factory.mktemp("live-errors-state")) as running:
        yield running


def _mode(values: list[bytes]) -> httpclient.InferInput:
    tensor = httpclient.InferInput("MODE", [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_))
    return tensor


def _history(server: Server, since: float) -> dict[str, Any]:
    reply = request(server.http_url, "GET", f"/v2/edged/metrics/history?model={MODEL}&since={since!r}")
    assert reply.status == 200, reply.body
    document: dict[str, Any] = reply.json()
    return document


def _counted(document: dict[str, Any], since: float, series: list[float | None]) -> int:
    """How many events a rate series holds: each point's rate over the time since the point before it."""
    times: list[float] = [since, *document["time"]]
    return round(sum((rate or 0.0) * (times[i + 1] - times[i]) for i, rate in enumerate(series)))


def _counts(server: Server, since: float, expected: dict[str, int]) -> dict[str, int]:
    """Polls the history after ``since`` until its counts reach ``expected`` (or WAIT_S passed); the counts then."""
    deadline = time.monotonic() + WAIT_S
    while True:
        document = _history(server, since)
        series = document["models"].get(MODEL)
        counts = {key: _counted(document, since, series[key]) if series else 0 for key in expected}
        if all(counts[key] >= value for key, value in expected.items()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


def _quiet_point(server: Server) -> float:
    """The time of a history point taken after now: whatever completes later is counted after it."""
    after = time.time()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        last = _history(server, after)["last"]
        if last is not None and last > after:
            return float(last)
        time.sleep(0.1)
    pytest.fail(f"the metrics history took no point in {WAIT_S:.0f} s")


def _send_bad_requests(server: Server) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        for _ in range(REJECTED):
            # MODE is [1]: two elements is a wrong shape, refused before the model sees it.
            with pytest.raises(InferenceServerException) as caught:
                client.infer(MODEL, [_mode([b"ok", b"ok"])])
            assert caught.value.status() == "400", caught.value
        for _ in range(FAILED):
            with pytest.raises(InferenceServerException) as caught:
                client.infer(MODEL, [_mode([b"raise"])])
            assert caught.value.status() == "500", caught.value
            assert "the model refused this request" in (caught.value.message() or ""), caught.value


def test_rejected_and_failed_are_counted_apart(server: Server, page: Page, browser: Browser) -> None:
    since = _quiet_point(server)
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/metrics?model={MODEL}&range=all")
    page.wait_for_function("() => !!(window.edgedCharts && window.edgedCharts.errors)", timeout=WAIT_S * 1000)
    _send_bad_requests(server)

    expected = {"rejected_rate": REJECTED, "failed_rate": FAILED, "error_rate": REJECTED + FAILED}
    counts = _counts(server, since, {**expected, "request_rate": REJECTED + FAILED})
    assert counts == {**expected, "request_rate": REJECTED + FAILED}, counts

    # The Errors chart: a series of each, above zero.
    page.wait_for_function(
        "() => { const c = window.edgedCharts.errors; return c.labels.join() === 'rejected,failed'"
        " && c.plot.data.slice(1).every((s) => s.some((v) => v > 0)); }",
        timeout=WAIT_S * 1000,
    )
    legend = page.locator("#chart-errors .u-legend .u-series")
    expect(legend.nth(1).locator(".u-label")).to_have_text("rejected")
    expect(legend.nth(2).locator(".u-label")).to_have_text("failed")
    summary = page.locator("#chart-errors-summary")
    expect(summary).to_contain_text("rejected")
    expect(summary).to_contain_text("failed")
    screenshot(page, "console-metrics-errors")
    assert_accessible(page)

    # Without JavaScript: the table's Rejected and Failed columns, over all the daemon keeps.
    context = browser.new_context(java_script_enabled=False)
    try:
        plain = context.new_page()
        browser_login(plain, server.console_url, "vera")
        plain.goto(f"{server.console_url}/metrics?range=all")
        headers = plain.locator("table.latest thead th").all_inner_texts()
        row = plain.locator("table.latest tbody tr", has_text=MODEL).locator("td")
        cells = dict(zip(headers[1:], row.all_inner_texts(), strict=False))
        for column in ("Errors", "Rejected", "Failed"):
            assert cells[column].endswith("/s") and cells[column] != "0/s", cells
    finally:
        context.close()
