"""The console's live metrics page against the real daemon: charts that move while a tritonclient thread sends
requests, the JSON they poll, the one-model view, the table a browser without JavaScript gets, light, dark and
phone width, and axe-core on each."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import tritonclient.http as httpclient
from browser import DESKTOP, PHONE, assert_accessible, screenshot, watch
from console_session import browser_login, console_server, http_login, raw
from playwright.sync_api import expect
from server import REPO_ROOT, Server, add_sub_inputs

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, ViewportSize

pytest_plugins = ("console_fixtures",)

WAIT_MS = 20_000
# The request-rate chart has a point above zero (any model's series).
MOVING = (
    "() => { const c = window.edgedCharts && window.edgedCharts.requests;"
    " return !!c && c.plot.data.slice(1).some((s) => s.some((v) => v > 0)); }"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # The bundled repository: add_sub takes the requests, digits stays idle.
    with console_server([REPO_ROOT / "model_repository"], tmp_path_factory.mktemp("state")) as running:
        yield running


@contextlib.contextmanager
def load(server: Server) -> Iterator[list[int]]:
    """A thread sending add_sub requests back to back until the block ends; yields [requests answered]."""
    stop = threading.Event()
    sent = [0]
    failures: list[BaseException] = []

    def send() -> None:
        try:
            with httpclient.InferenceServerClient(server.http_url) as client:
                while not stop.is_set():
                    client.infer("add_sub", add_sub_inputs())
                    sent[0] += 1
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=send, name="load", daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not failures, failures


@contextlib.contextmanager
def other_page(browser: Browser, viewport: ViewportSize = DESKTOP, **options: Any) -> Iterator[Page]:
    """A watched page in a context of its own (dark, no JavaScript ...): fails on a JS error or CSP violation."""
    context = browser.new_context(viewport=viewport, **options)
    problems = watch(context)
    try:
        yield context.new_page()
    finally:
        context.close()
    assert not problems, problems.report()


def test_charts_move_while_load_runs(page: Page, server: Server) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/metrics")
    expect(page.get_by_role("heading", name="Live metrics")).to_be_visible()
    with load(server) as sent:
        page.wait_for_function(MOVING, timeout=WAIT_MS)
        points = page.evaluate("() => window.edgedCharts.requests.plot.data[0].length")
        # More points arrive while the page stays open: it polls and appends.
        page.wait_for_function(f"() => window.edgedCharts.requests.plot.data[0].length > {points}", timeout=WAIT_MS)
        labels = page.evaluate("() => window.edgedCharts.requests.labels")
        assert labels == ["add_sub", "digits"], labels
        summary = page.locator("#chart-requests-summary")
        expect(summary).to_contain_text("add_sub")
        expect(page.locator("#chart-latency-summary")).to_contain_text("add_sub p99")
        expect(page.locator("#chart-utilization-summary")).to_contain_text("CPU")
        # Every chart is a figure named by its caption.
        for name in ("Request rate", "Latency percentiles", "Queue time and compute time", "Batch size (mean",
                     "Executions by batch size", "Errors", "Device utilization", "Device memory"):  # fmt: skip
            expect(page.get_by_role("figure", name=name)).to_be_visible()
        screenshot(page, "console-metrics")
        assert_accessible(page)

        # The JSON the charts poll shows the same requests.
        session = http_login(server.console_port, "vera")
        status, headers, text = session.request("GET", "/metrics/data?model=add_sub")
        assert status == 200 and headers["content-type"].startswith("application/json"), (status, text[:300])
        document = json.loads(text)
        assert set(document["models"]) == {"add_sub"}
        busy = document["models"]["add_sub"]
        assert any(rate is not None and rate > 0 for rate in busy["request_rate"]), busy["request_rate"]
        assert len(busy["request_rate"]) == len(document["time"])
        later = json.loads(session.request("GET", f"/metrics/data?since={document['last']!r}")[2])
        assert all(t > document["last"] for t in later["time"])
    assert sent[0] > 0


def test_one_model_shows_its_percentiles(page: Page, server: Server) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/metrics")
    with load(server):
        page.get_by_label("Model").select_option("add_sub")
        page.get_by_role("button", name="Show").click()
        page.wait_for_url("**/metrics?model=add_sub")
        expect(page.get_by_role("heading", name="Live metrics: add_sub")).to_be_visible()
        page.wait_for_function(MOVING, timeout=WAIT_MS)
        page.wait_for_function(
            "() => window.edgedCharts.latency.plot.data.slice(1).some((s) => s.some((v) => v > 0))", timeout=WAIT_MS
        )
        assert page.evaluate("() => window.edgedCharts.latency.labels") == ["p50", "p90", "p99"]
        assert page.evaluate("() => window.edgedCharts.timing.labels") == ["queue", "compute"]
        # Batches ran (of one request each, without a client that batches).
        expect(page.locator("#chart-executions-summary")).to_contain_text("batch 1")


def test_without_javascript_a_table_shows_the_latest_values(browser: Browser, server: Server) -> None:
    with other_page(browser, java_script_enabled=False) as page:
        browser_login(page, server.console_url, "vera")
        with load(server) as sent:
            page.goto(f"{server.console_url}/metrics")
            rate = page.locator("table.latest tbody tr", has_text="add_sub").locator("td")
            for _ in range(20):  # the table is as of the page's load: reload until a second with requests is in it
                if rate.count() and rate.first.inner_text().strip() != "0/s":
                    break
                page.wait_for_timeout(1000)
                page.reload()
        assert sent[0] > 0
        cells = page.locator("table.latest tbody tr", has_text="add_sub").locator("td")
        assert cells.nth(0).inner_text().endswith("/s") and cells.nth(0).inner_text() != "0/s"
        assert cells.nth(4).inner_text().endswith("ms"), cells.nth(4).inner_text()  # p99
        expect(page.locator("table.latest tbody tr", has_text="digits").locator("td").first).to_have_text("0/s")
        expect(page.locator("#charts")).to_be_hidden()
        expect(page.get_by_text("CPU", exact=True)).to_be_visible()
        # (axe-core needs JavaScript in the page: the table's accessibility is checked with the charts' page.)
        screenshot(page, "console-metrics-nojs")


def test_dark_and_phone(browser: Browser, phone_page: Page, server: Server) -> None:
    with other_page(browser, color_scheme="dark") as page:
        browser_login(page, server.console_url, "vera")
        with load(server):
            page.goto(f"{server.console_url}/metrics")
            page.wait_for_function(MOVING, timeout=WAIT_MS)
            # The lines take the dark palette of charts.css.
            stroke = page.evaluate("() => window.edgedCharts.requests.plot.series[1].stroke()")
            assert stroke.lower() == "#6cb2ff", stroke
            screenshot(page, "console-metrics-dark")
            assert_accessible(page)

    browser_login(phone_page, server.console_url, "vera")
    phone_page.goto(f"{server.console_url}/metrics")
    phone_page.wait_for_function("() => !!(window.edgedCharts && window.edgedCharts.requests)", timeout=WAIT_MS)
    # The charts fit the phone's width: nothing scrolls sideways.
    width = phone_page.evaluate("() => window.edgedCharts.requests.plot.width")
    assert width <= PHONE["width"] - 30, width
    assert phone_page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(phone_page, "console-metrics-phone")
    assert_accessible(phone_page)


def test_charts_follow_the_window_width(page: Page, server: Server) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/metrics")
    page.wait_for_function("() => !!(window.edgedCharts && window.edgedCharts.memory)", timeout=WAIT_MS)
    wide = page.evaluate("() => window.edgedCharts.memory.plot.width")
    page.set_viewport_size({"width": 480, "height": 800})
    page.wait_for_timeout(1000)
    sizes = page.evaluate(
        "() => [window.edgedCharts.memory.plot.width, document.querySelector('#chart-memory .plot').clientWidth]"
    )
    assert sizes[0] < wide and sizes[0] <= 480, (wide, sizes)


def test_bad_requests_and_no_login(server: Server) -> None:
    session = http_login(server.console_port, "vera")
    status, _, text = session.request("GET", "/metrics?model=no_such_model")
    assert status == 404 and "no_such_model" in text, (status, text[:300])
    status, _, text = session.request("GET", "/metrics/data?since=yesterday")
    assert status == 400, (status, text[:300])
    status, headers, _ = raw(server.console_port, "GET", "/metrics/data")
    assert status == 303 and headers["location"].startswith("/login"), (status, headers)
