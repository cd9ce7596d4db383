"""The console's log page (admin), in a real browser against the real daemon: a model whose config.pbtxt does not
parse fails to load, and an admin finds why by filtering the log by that model and by level, with htmx and without
JavaScript; new lines come in without a reload; a model name made of markup is shown as text; the page's size is
bounded whatever the query asks; operators and viewers are refused. Each page is checked with axe-core and
screenshotted. (The daemon runs outside systemd here, so the lines come from its memory: tests/unit/test_log_ring.py
reads a journal.)"""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final
from urllib.parse import quote, urlencode

import pytest
from browser import assert_accessible, open_page, screenshot
from console_session import browser_login, console_server, http_login
from playwright.sync_api import expect
from server import REPO_ROOT, Server, api_token, bearer, post_json

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

if TYPE_CHECKING:
    from pathlib import Path

    from playwright.sync_api import Browser, Dialog, Page

pytest_plugins = ("console_fixtures",)

BROKEN: Final = "broken"
# A model name that is markup: allowed (no '/', no control character), and quoted in the lines about it.
MARKUP: Final = "<script>alert(1)<img src=x onerror=alert(2)>"
NOT_A_CONFIG: Final = 'name: "broken"\nbackend: "onnxruntime"\nmax_batch_size: {{ eight }}\n'
# Long enough for the htmx refresh (every 5 s) to come a few times; the tests wait on what they expect to see.
WAIT_MS: Final = 30_000


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("logs-repo")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    for name in (BROKEN, MARKUP):
        (repo / name).mkdir()
        (repo / name / "config.pbtxt").write_text(NOT_A_CONFIG, encoding="utf-8")
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with console_server([repository], tmp_path_factory.mktemp("logs-state")) as started:
        yield started


def _rows(page: Page) -> list[list[str]]:
    """The log table's rows: (time, level, message with its logger) each."""
    return [row.locator("td").all_inner_texts() for row in page.locator("table.log tbody tr").all()]


def test_an_admin_finds_why_a_model_failed(server: Server, page: Page) -> None:
    browser_login(page, server.console_url, "ada")
    page.get_by_role("link", name="Users & tokens").click()
    page.get_by_role("navigation", name="Administration").get_by_role("link", name="Log").click()
    page.wait_for_url(f"{server.console_url}/admin/logs")
    expect(page.get_by_role("heading", level=2, name=re.compile("newest first"))).to_be_visible()
    assert "edged's memory" in page.locator("#log-live").inner_text()

    page.get_by_label("Level").select_option("error")
    page.get_by_label("Model").fill(BROKEN)
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"/admin/logs\?level=error&model=broken&lines=200$"))
    rows = _rows(page)
    assert rows, "no line about the broken model"
    assert {row[1] for row in rows} <= {"error", "critical"}, rows
    messages = [row[2] for row in rows]
    assert all("'broken'" in message for message in messages), messages
    failure = next(message for message in messages if "failed to load model 'broken'" in message)
    # The reason is the parser's, naming the file and what it could not read.
    assert "config.pbtxt" in failure, failure
    for time_cell in page.locator("table.log time").all():
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", time_cell.get_attribute("datetime") or "")
    assert_accessible(page)
    screenshot(page, "console-admin-logs")

    # A new failure comes in by htmx, at the top (newest first), without a reload.
    before = len(rows)
    token = api_token(server, "operator")
    reply = post_json(server.http_url, f"/v2/repository/models/{BROKEN}/load", {}, bearer(token))
    assert reply.status == 400, reply.body
    expect(page.locator("table.log tbody tr")).to_have_count(before + 1, timeout=WAIT_MS)
    newest_first = page.locator("table.log time").evaluate_all("(times) => times.map((t) => t.dateTime)")
    assert newest_first == sorted(newest_first, reverse=True)
    assert "failed to load model 'broken'" in _rows(page)[0][2]
    assert page.url.endswith("?level=error&model=broken&lines=200")

    # Warnings and worse: the error lines are still there, no info line is.
    page.get_by_label("Level").select_option("warning")
    page.get_by_label("Model").fill("")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"\?level=warning&model=&lines=200$"))
    levels = {row[1] for row in _rows(page)}
    assert "error" in levels and not levels & {"info", "debug"}, levels


def test_the_filters_work_without_javascript(server: Server, browser: Browser) -> None:
    with open_page(browser, javascript=False) as watched:
        page = watched.page
        browser_login(page, server.console_url, "ada")
        page.goto(f"{server.console_url}/admin/logs")
        page.get_by_label("Level").select_option("error")
        page.get_by_label("Model").fill(BROKEN)
        page.get_by_label("Lines", exact=True).fill("1")
        page.get_by_role("button", name="Show").click()
        page.wait_for_url(re.compile(r"\?level=error&model=broken&lines=1$"))
        rows = _rows(page)
        assert len(rows) == 1 and "'broken'" in rows[0][2], rows
        assert page.locator("#log-lines-h").inner_text() == "The last line that matches, newest first"
        page.get_by_role("link", name="Clear").click()
        page.wait_for_url(f"{server.console_url}/admin/logs")
        assert page.get_by_label("Model").input_value() == ""


def test_markup_in_a_model_name_and_a_filter_is_text(server: Server, page: Page) -> None:
    dialogs: list[str] = []

    def dismiss(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    browser_login(page, server.console_url, "ada")
    page.goto(f"{server.console_url}/admin/logs?{urlencode({'model': MARKUP, 'level': 'error'})}")
    messages = [row[2] for row in _rows(page)]
    assert any(f"failed to load model '{MARKUP}'" in message for message in messages), messages
    assert page.get_by_label("Model").input_value() == MARKUP
    # Shown, not run: no element the name spells, no alert.
    assert page.locator("main script, main img, #log-live script").count() == 0
    assert dialogs == []
    assert_accessible(page)
    screenshot(page, "console-admin-logs-markup")

    admin = http_login(server.console_port, "ada")
    for part in ("", "&part=lines"):
        status, _, text = admin.request("GET", f"/admin/logs?model={quote(MARKUP)}{part}")
        assert status == 200
        assert "<script>alert(1)" not in text and "<img src=x" not in text
        assert html.escape(MARKUP) in text


def test_what_a_query_may_ask_is_bounded(server: Server) -> None:
    admin = http_login(server.console_port, "ada")
    status, _, text = admin.request("GET", "/admin/logs?lines=1000000000&model=" + "m" * 4_000)
    assert status == 200
    assert 'name="lines" type="number" min="1" max="2000" inputmode="numeric" value="2000"' in text
    # The filter is cut to the longest name a model can have (and a bit).
    shown = re.search(r'id="log-model" name="model"[^>]* value="(m*)"', text)
    assert shown is not None and len(shown.group(1)) == 256
    status, _, text = admin.request("GET", "/admin/logs?lines=-5&level=nonsense&part=lines")
    assert status == 200
    assert text.count("<tr class=") <= 1
    status, _, text = admin.request("GET", "/admin/logs?lines=many")
    assert status == 400


@pytest.mark.parametrize("name", ["otto", "vera"])
def test_operators_and_viewers_are_refused_the_log(server: Server, name: str) -> None:
    session = http_login(server.console_port, name)
    for path in ("/admin/logs", "/admin/logs?part=lines&model=broken", "/admin/logs?level=error"):
        status, _, text = session.request("GET", path)
        assert status == 403, path
        assert "this needs the admin role" in text
        assert "failed to load model" not in text
    status, _, _ = session.request("GET", "/admin/logs?part=lines", headers={"HX-Request": "true"})
    assert status == 403


def test_dark_and_phone_screenshots(server: Server, browser: Browser, phone_page: Page) -> None:
    path = f"/admin/logs?{urlencode({'model': BROKEN})}"
    with open_page(browser, color_scheme="dark") as watched:
        browser_login(watched.page, server.console_url, "ada")
        watched.page.goto(f"{server.console_url}{path}")
        assert_accessible(watched.page)
        screenshot(watched.page, "console-admin-logs-dark")
    browser_login(phone_page, server.console_url, "ada")
    phone_page.goto(f"{server.console_url}{path}")
    assert_accessible(phone_page)
    screenshot(phone_page, "console-admin-logs-phone")
