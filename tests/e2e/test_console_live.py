"""The console's live metrics page against the real daemon: charts that move while a tritonclient thread sends
requests, the JSON they poll, the one-model view, the table a browser without JavaScript gets, light, dark and
phone width, and axe-core on each; times in UTC, axis labels that never overlap (measured through uPlot at phone
and desktop widths), the latency chart's log scale, distinct colours with enough contrast in both themes, the
legend's current values and the range picker."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
import tritonclient.http as httpclient
from browser import DESKTOP, PHONE, assert_accessible, clipped, screenshot, watch
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
# Every chart is drawn as wide as its box (after a resize, once uPlot has redrawn).
SIZED = (
    "() => { const charts = Object.values(window.edgedCharts || {}); return charts.length === 8 && charts.every("
    "(c) => c.plot.width === Math.max(200, c.plot.root.parentElement.clientWidth) && c.plot.axes[0]._values); }"
)
# Each chart's axis labels as uPlot drew them: the ticks it chose (axis._splits), the text it drew for each
# (axis._values; null where its filter left a tick unlabelled), where each sits in the chart in CSS pixels, and
# how wide the text is in the axis' own font, measured with the canvas' measureText as uPlot draws it.
AXIS_LABELS = """() => Object.entries(window.edgedCharts).map(([id, chart]) => {
  const u = chart.plot;
  const context = document.createElement("canvas").getContext("2d");
  const ratio = window.devicePixelRatio || 1;
  const left = u.bbox.left / ratio, top = u.bbox.top / ratio;
  const axes = u.axes.map((axis, index) => {
    context.font = axis.font[0];  // [font at the device's pixel ratio, its pixels, its CSS pixels]
    const scale = index === 0 ? "x" : axis.scale;
    const labels = [];
    (axis._splits || []).forEach((value, k) => {
      const text = axis._values[k];
      if (text == null) return;
      const pos = u.valToPos(value, scale) + (index === 0 ? left : top);
      labels.push({ value, text: String(text), pos, width: context.measureText(String(text)).width / ratio });
    });
    return { size: axis._size, fontPx: axis.font[2], labels };
  });
  return { id, width: u.width, distr: u.scales.y.distr, axes };
})"""


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


def assert_axis_labels_fit(page: Page) -> None:
    """No two neighbouring labels of an axis overlap, none is cut at the chart's edge, and the time axis says
    HH:MM:SS in UTC: measured on every chart as drawn now."""
    page.wait_for_function(SIZED, timeout=WAIT_MS)
    for chart in page.evaluate(AXIS_LABELS):
        where = f"{chart['id']} at {chart['width']}px"
        times, values = chart["axes"]
        labels = sorted(times["labels"], key=lambda label: label["pos"])
        assert len(labels) >= 2, (where, labels)
        for label in labels:
            utc = datetime.fromtimestamp(label["value"], UTC).strftime("%H:%M:%S")
            assert re.fullmatch(r"\d\d:\d\d:\d\d", label["text"]) and label["text"] == utc, (where, label)
            assert label["pos"] - label["width"] / 2 >= 0, (where, "cut on the left", label)
            assert label["pos"] + label["width"] / 2 <= chart["width"], (where, "cut on the right", label)
        for before, after in itertools.pairwise(labels):
            gap = (after["pos"] - after["width"] / 2) - (before["pos"] + before["width"] / 2)
            assert gap >= 4, (where, "time labels overlap", before, after)
        # The value axis: labels one line high, stacked; each fits the axis' width.
        labels = sorted(values["labels"], key=lambda label: label["pos"])
        assert labels, where
        for label in labels:
            assert label["width"] <= values["size"], (where, "wider than its axis", label)
        for before, after in itertools.pairwise(labels):
            assert after["pos"] - before["pos"] >= values["fontPx"] + 2, (where, "value labels overlap", before, after)


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
        # The legend shows each series' current value while the pointer is elsewhere, and the time in UTC.
        legend = page.locator("#chart-requests .u-legend .u-series")
        expect(legend.nth(0)).to_contain_text("Time (UTC)")
        expect(legend.nth(0).locator(".u-value")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
        expect(legend.nth(1).locator(".u-value")).to_have_text(re.compile(r"^[0-9.]+/s$"))
        expect(page.locator("#chart-latency .u-legend .u-series").nth(1).locator(".u-value")).to_have_text(
            re.compile(r"^[0-9.]+ (ms|s)$")
        )
        assert_axis_labels_fit(page)
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
        page.wait_for_url("**/metrics?model=add_sub&range=1m")
        expect(page.get_by_role("heading", name="Live metrics: add_sub")).to_be_visible()
        page.wait_for_function(MOVING, timeout=WAIT_MS)
        page.wait_for_function(
            "() => window.edgedCharts.latency.plot.data.slice(1).some((s) => s.some((v) => v > 0))", timeout=WAIT_MS
        )
        assert page.evaluate("() => window.edgedCharts.latency.labels") == ["p50", "p90", "p99"]
        assert page.evaluate("() => window.edgedCharts.timing.labels") == ["queue", "compute"]
        # Batches ran (of one request each, without a client that batches).
        expect(page.locator("#chart-executions-summary")).to_contain_text("batch 1")
        assert page.evaluate("() => window.edgedCharts.errors.labels") == ["rejected", "failed"]

        # The log scale keeps p50 in sight of p99; its decades' labels do not overlap either.
        page.get_by_label("Log scale").check()
        page.wait_for_function("() => window.edgedCharts.latency.plot.scales.y.distr === 3", timeout=WAIT_MS)
        p50 = page.evaluate("() => window.edgedCharts.latency.plot.data[1].filter((v) => v != null)")
        low = page.evaluate("() => window.edgedCharts.latency.plot.scales.y.min")
        assert p50 and 0 < low <= min(p50), (low, p50)
        assert_axis_labels_fit(page)
        screenshot(page, "console-metrics-log")
        page.get_by_label("Log scale").uncheck()
        page.wait_for_function("() => window.edgedCharts.latency.plot.scales.y.distr === 1", timeout=WAIT_MS)


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
        # Errors, then the rejected and the failed apart: none, for good requests.
        assert [cells.nth(i).inner_text() for i in (1, 2, 3)] == ["0/s", "0/s", "0/s"]
        assert cells.nth(6).inner_text().endswith("ms"), cells.nth(6).inner_text()  # p99
        expect(page.locator("table.latest tbody tr", has_text="digits").locator("td").first).to_have_text("0/s")
        expect(page.locator("#charts")).to_be_hidden()
        expect(page.get_by_text("CPU", exact=True)).to_be_visible()
        expect(page.get_by_role("heading", name="Models (mean over the last minute)")).to_be_visible()
        # The log scale is the charts' alone: nothing of it shows without them.
        expect(page.get_by_label("Log scale")).to_be_hidden()
        # (axe-core needs JavaScript in the page: the table's accessibility is checked with the charts' page.)
        screenshot(page, "console-metrics-nojs")

        # The range picker is a plain form: the table averages over what it picks.
        page.get_by_label("Range").select_option("all")
        page.get_by_role("button", name="Show").click()
        page.wait_for_url("**/metrics?model=&range=all")
        expect(
            page.get_by_role("heading", name=re.compile(r"^Models \(mean over all it keeps, 10 minutes\)"))
        ).to_be_visible()
        expect(page.get_by_label("Range")).to_have_value("all")
        expect(page.locator("table.latest tbody tr", has_text="add_sub").locator("td").first).not_to_have_text("0/s")


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
    # Every point the daemon keeps, at a phone's width: the time axis takes fewer, wider steps.
    phone_page.goto(f"{server.console_url}/metrics?range=all")
    phone_page.wait_for_function(MOVING, timeout=WAIT_MS)
    assert_axis_labels_fit(phone_page)
    assert clipped(phone_page) == []

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
    page.wait_for_function(f"() => window.edgedCharts.memory.plot.width < {wide}", timeout=WAIT_MS)
    assert_axis_labels_fit(page)
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


# Each chart's series: colour and dash as drawn, and the chart card's background they are drawn on.
SERIES_COLOURS = """() => {
  const context = document.createElement("canvas").getContext("2d");
  const hex = (colour) => { context.fillStyle = "#000"; context.fillStyle = colour; return context.fillStyle; };
  return Object.entries(window.edgedCharts).map(([id, chart]) => ({
    id,
    card: hex(getComputedStyle(document.getElementById(`chart-${id}`)).backgroundColor),
    series: chart.plot.series.slice(1).map((s) => ({ stroke: hex(s.stroke()), dash: (s.dash || []).join(",") })),
  }));
}"""


def _luminance(colour: str) -> float:
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(one: str, other: str) -> float:
    """WCAG's contrast ratio of two #rrggbb colours."""
    light, dark = sorted((_luminance(one), _luminance(other)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_each_series_has_its_own_colour_with_contrast_in_both_themes(page: Page, server: Server) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/metrics?range=all")
    page.wait_for_function(MOVING, timeout=WAIT_MS)
    for theme, card in (("dark", "#1b2027"), ("light", "#ffffff")):
        # The console's own theme choice, as its cookie sets it: the charts redraw in that palette.
        page.evaluate(f"() => {{ document.documentElement.dataset.theme = {theme!r}; }}")
        page.wait_for_function(
            "() => { const c = window.edgedCharts.requests; const want = getComputedStyle("
            "document.getElementById('charts')).getPropertyValue('--chart-1').trim().toLowerCase();"
            " return !!c && c.plot.series[1].stroke().toLowerCase() === want; }",
            timeout=WAIT_MS,
        )
        charts = page.evaluate(SERIES_COLOURS)
        assert {chart["id"] for chart in charts} >= {"requests", "latency", "timing", "errors"}, charts
        latency = next(chart for chart in charts if chart["id"] == "latency")
        assert len(latency["series"]) == 6, latency  # two models' p50, p90 and p99
        for chart in charts:
            assert chart["card"] == card, (theme, chart)
            drawn = [(s["stroke"], s["dash"]) for s in chart["series"]]
            assert len(set(drawn)) == len(drawn), (theme, chart)  # no two series alike
            strokes = [s["stroke"] for s in chart["series"][:8]]
            assert len(set(strokes)) == len(strokes), (theme, chart)  # and each of the first eight its own colour
            for stroke in strokes:
                # WCAG's 3:1 for graphics that carry meaning, against the card the line is drawn on.
                assert contrast(stroke, chart["card"]) >= 3, (theme, chart["id"], stroke)
        screenshot(page, f"console-metrics-{theme}-theme")


def test_the_range_picker_applies_at_once_with_javascript(page: Page, server: Server) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/metrics")
    page.wait_for_function(SIZED, timeout=WAIT_MS)
    span = "() => { const x = window.edgedCharts.requests.plot.scales.x; return Math.round(x.max - x.min); }"
    assert page.evaluate(span) == 60  # the default: the last minute
    page.get_by_label("Range").select_option("5m")
    page.wait_for_function(f"() => ({span})() === 300", timeout=WAIT_MS)
    assert page.url.endswith("/metrics?range=5m"), page.url  # a reload keeps it
    assert_axis_labels_fit(page)
    page.set_viewport_size(PHONE)
    page.wait_for_function(SIZED, timeout=WAIT_MS)
    assert_axis_labels_fit(page)
    status, _, text = http_login(server.console_port, "vera").request("GET", "/metrics?range=forever")
    assert status == 400 and "range" in text, (status, text[:300])
