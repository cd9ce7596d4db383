"""The console's history page in a real browser against the real daemon: logins and model events with who did
them, filters by model, user and source (a plain GET form, so also without JavaScript), pages, and the CSV export
with the same filters; the console's admin actions recorded. Each view is checked with axe-core and screenshotted.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
import tritonclient.http as httpclient
from browser import assert_accessible, open_page, screenshot
from console_session import PASSWORD, browser_login, console_server, http_login, raw
from server import REPO_ROOT, Server

from edged.core.audit import CSV_HEADER

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytest_plugins = ("console_fixtures",)

# Load and unload cycles of the spare model: each is several transitions, more than a page (50) in all.
CYCLES: Final = 15
TOKEN_SECRET: Final = re.compile(r'id="secret"[^>]* value="(edged_[^"]+)"')
SHOWN: Final = re.compile(r"Events (\d+)\u2013(\d+) of (\d+)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("history-repository")
    for name in ("add_sub", "spare"):
        modelgen.write_add_sub(repository / name, max_batch_size=8, dims=16, dtype="FP32")
    with console_server([repository], tmp_path_factory.mktemp("history-state")) as running:
        _make_history(running)
        yield running


def _make_history(server: Server) -> None:
    """An API token made in the console, then the spare model loaded and unloaded with it over HTTP; add_sub
    unloaded and loaded again in the console by otto."""
    admin = http_login(server.console_port, "ada")
    form = {"csrf_token": admin.csrf_token, "name": "ops", "role": "operator", "days": ""}
    status, _, page = admin.request("POST", "/admin/tokens", form)
    assert status == 200, page[:500]
    found = TOKEN_SECRET.search(page)
    assert found is not None
    headers = {"Authorization": f"Bearer {found.group(1)}"}
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(CYCLES):
        client.unload_model("spare", headers=headers)
        client.load_model("spare", headers=headers)
    # And once through the console's model page, by an operator.
    operator = http_login(server.console_port, "otto")
    for action in ("unload", "load"):
        status, _, text = operator.request("POST", f"/models/add_sub/{action}", {"csrf_token": operator.csrf_token})
        assert status in (200, 303), text[:500]


def _rows(page: Page) -> list[dict[str, str]]:
    """The history table as the page shows it: one dict per row, keyed by the column headers."""
    table = page.locator("table.history")
    names = [name.strip() for name in table.locator("thead th").all_inner_texts()]
    return [
        dict(zip(names, (cell.strip() for cell in row.locator("td").all_inner_texts()), strict=True))
        for row in table.locator("tbody tr").all()
    ]


def _shown(page: Page) -> tuple[int, int, int]:
    found = SHOWN.search(page.get_by_role("heading", level=2, name=re.compile("^Events")).inner_text())
    assert found is not None
    first, last, total = (int(group) for group in found.groups())
    return first, last, total


def test_the_history_lists_logins_and_model_events_with_who_did_them(server: Server, page: Page) -> None:
    browser_login(page, server.console_url, "ada")
    page.get_by_role("link", name="History").click()
    page.wait_for_url(f"{server.console_url}/history")
    rows = _rows(page)
    # Newest first: ada's login through this browser is the latest event.
    assert rows[0]["Source"] == "console" and rows[0]["By"] == "user:ada"
    assert rows[0]["Action"].split() == ["login", "done"] and rows[0]["Model"] == "\u2013"
    assert rows[0]["Detail"].startswith("ada") and "from 127.0.0.1" in rows[0]["Detail"]
    # Each actor spelled one way, as the model pages and the CSV export spell it; the console's clicks are the
    # console's, not the API's it calls through.
    by_otto = [row for row in rows if row["By"] == "user:otto" and row["Model"].startswith("add_sub")]
    # One row per action: otto's unload and his load, each with its steps folded under it.
    assert [row["Action"] for row in by_otto] == ["ready", "unloaded"], by_otto
    assert {row["Source"] for row in by_otto} == {"console"}, by_otto
    load = page.locator("table.history tbody tr", has_text="user:otto").first
    load.locator("summary").click()
    steps = load.locator("details.steps li").all_inner_texts()
    assert any(step.endswith("model loading") for step in steps) and any("v1 ready" in step for step in steps), steps
    token_events = [row for row in rows if row["By"] == "token:ops"]
    assert token_events and all(row["Model"].startswith("spare") and row["Source"] == "api" for row in token_events)
    assert_accessible(page)
    screenshot(page, "console-history")


def test_filters_work_without_javascript(server: Server, browser: Browser) -> None:
    with open_page(browser, javascript=False) as watched:
        page = watched.page
        browser_login(page, server.console_url, "vera")
        page.goto(f"{server.console_url}/history")

        page.get_by_label("Model").fill("add_sub")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(re.compile(r"/history\?model=add_sub&user=&source=$"))
        rows = _rows(page)
        assert rows and all(row["Model"].split()[0] == "add_sub" for row in rows)
        # Loaded at start by the daemon itself, then unloaded and loaded again by otto in the console.
        assert {row["By"] for row in rows} == {"edged", "user:otto"}
        assert rows[-1]["By"] == "edged" and rows[0]["By"] == "user:otto"
        assert page.get_by_label("Model").input_value() == "add_sub"  # the form keeps what it filters by

        page.get_by_label("Model").fill("")
        page.get_by_label("User").fill("ada")
        page.get_by_label("Source").select_option("console")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(re.compile(r"/history\?model=&user=ada&source=console$"))
        rows = _rows(page)
        assert rows and all(row["By"] == "user:ada" and row["Source"] == "console" for row in rows)
        assert {"login done", "token-create done"} <= {row["Action"] for row in rows}
        screenshot(page, "console-history-filtered")  # axe-core needs JavaScript: it checks the others

        # The console's model actions are found by its source too, not only its account actions.
        page.get_by_label("User").fill("")
        page.get_by_label("Model").fill("add_sub")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(re.compile(r"/history\?model=add_sub&user=&source=console$"))
        rows = _rows(page)
        # Folded: the unload and the load, each one row (their loading and unloading steps under them).
        assert [row["Action"] for row in rows] == ["ready", "unloaded"], rows
        assert all(row["Detail"].endswith("steps") for row in rows), rows
        assert {row["By"] for row in rows} == {"user:otto"}, rows
        page.get_by_label("Model").fill("")

        # edged's own changes (the start-up loads) are found by the name they are shown with.
        page.get_by_label("User").fill("edged")
        page.get_by_label("Source").select_option("startup")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(re.compile(r"/history\?model=&user=edged&source=startup$"))
        rows = _rows(page)
        assert rows and {row["By"] for row in rows} == {"edged"}, rows

        page.get_by_label("User").fill("token:ops")
        page.get_by_label("Source").select_option("")
        page.get_by_role("button", name="Filter").click()
        rows = _rows(page)
        assert rows and {row["By"] for row in rows} == {"token:ops"}

        page.get_by_label("User").fill("nobody")
        page.get_by_role("button", name="Filter").click()
        assert page.get_by_text("No event matches these filters.").is_visible()
        page.get_by_role("link", name="Clear").click()
        page.wait_for_url(f"{server.console_url}/history")
        # A page holds 50 events, fewer rows once an action's steps are folded under it.
        assert _shown(page)[:2] == (1, 50) and 0 < len(_rows(page)) < 50


def test_pages_of_the_history(server: Server, page: Page) -> None:
    browser_login(page, server.console_url, "otto")
    page.goto(f"{server.console_url}/history?model=spare")
    first, last, total = _shown(page)
    assert (first, last) == (1, 50) and total > 50
    assert_accessible(page)
    newest = _rows(page)
    pager = page.get_by_role("navigation", name="Pages of the history")
    assert pager.get_by_role("link", name="Newer").count() == 0
    pager.get_by_role("link", name="Older").click()
    page.wait_for_url(re.compile(r"/history\?model=spare&page=2$"))  # the filter kept
    assert _shown(page) == (51, min(100, total), total)
    older = _rows(page)
    assert older and all(row["Model"].startswith("spare") for row in older)
    assert older[0]["When (UTC)"] <= newest[-1]["When (UTC)"]
    page.get_by_role("navigation", name="Pages of the history").get_by_role("link", name="Newer").click()
    page.wait_for_url(re.compile(r"/history\?model=spare&page=1$"))
    assert _rows(page) == newest
    # Past the end: an empty page, not an error.
    page.goto(f"{server.console_url}/history?page=999")
    assert page.locator("table.history").count() == 0
    assert page.get_by_text("There are fewer events than that.").is_visible()
    page.get_by_role("link", name="the newest").click()
    assert _shown(page)[0] == 1


def test_the_csv_export_has_the_filtered_rows(server: Server, page: Page, tmp_path: Path) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/history?model=spare&source=api")
    total = _shown(page)[2]
    with page.expect_download() as download:
        page.get_by_role("link", name="Export CSV").click()
    assert re.fullmatch(r"edged-history-\d{8}T\d{6}Z\.csv", download.value.suggested_filename)
    saved = tmp_path / "history.csv"
    download.value.save_as(saved)
    rows = list(csv.reader(io.StringIO(saved.read_text(encoding="utf-8"), newline="")))
    assert tuple(rows[0]) == CSV_HEADER
    body = [dict(zip(CSV_HEADER, row, strict=True)) for row in rows[1:]]
    assert len(body) == total
    assert {row["target"] for row in body} == {"spare"}
    assert {row["source"] for row in body} == {"api"}
    assert {row["actor"] for row in body} == {"token:ops"}
    assert body == sorted(body, key=lambda row: row["time"], reverse=True)

    # Over plain HTTP: an attachment; a login is needed.
    viewer = http_login(server.console_port, "vera")
    status, headers, text = viewer.request("GET", "/history.csv?user=ada&source=console")
    assert status == 200
    assert headers["content-type"].startswith("text/csv")
    assert headers["content-disposition"].startswith('attachment; filename="edged-history-')
    exported = list(csv.DictReader(io.StringIO(text, newline="")))
    assert exported and {row["actor"] for row in exported} == {"user:ada"}
    assert "login" in {row["action"] for row in exported}
    status, headers, _ = raw(server.console_port, "GET", "/history.csv")
    assert status == 303 and headers["location"].startswith("/login")


def test_the_consoles_admin_actions_are_in_the_history(server: Server) -> None:
    admin = http_login(server.console_port, "ada")
    form = {"csrf_token": admin.csrf_token, "name": "kim", "role": "viewer"}
    form |= {"password": PASSWORD, "password_again": PASSWORD + "?"}
    assert admin.request("POST", "/admin/users", form)[0] == 400  # refused: the passwords differ
    form["password_again"] = PASSWORD
    assert admin.request("POST", "/admin/users", form)[0] == 303
    assert admin.request("POST", "/admin/users/kim/disable", {"csrf_token": admin.csrf_token})[0] == 303
    assert admin.request("POST", "/admin/tokens/revoke", {"csrf_token": admin.csrf_token, "name": "ops"})[0] == 303

    status, _, text = admin.request("GET", "/history.csv?user=ada&source=console")
    assert status == 200
    actions = [(row["action"], row["target"], row["outcome"]) for row in csv.DictReader(io.StringIO(text))]
    assert actions[:4] == [
        ("token-revoke", "ops", "done"),
        ("user-disable", "kim", "done"),
        ("user-create", "kim", "done"),
        ("user-create", "kim", "refused"),
    ]


def test_dark_and_phone(server: Server, browser: Browser, phone_page: Page) -> None:
    with open_page(browser, color_scheme="dark") as watched:
        browser_login(watched.page, server.console_url, "ada")
        watched.page.goto(f"{server.console_url}/history")
        assert_accessible(watched.page)
        screenshot(watched.page, "console-history-dark")
    browser_login(phone_page, server.console_url, "ada")
    phone_page.goto(f"{server.console_url}/history")
    assert_accessible(phone_page)
    screenshot(phone_page, "console-history-phone")


def test_token_actions_through_the_api_and_the_command_line_are_in_the_history(server: Server) -> None:
    """Every door records what it does to tokens: the HTTP API (source api, as the caller) and edged token (cli)."""
    import json
    import subprocess

    state = next(arg for arg in server.args if arg.startswith("/") and arg.endswith("history-state0"))
    made = subprocess.run(
        [sys.executable, "-m", "edged", "token", "--state-dir", state, "create", "--name", "from-cli", "--role",
         "admin"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=True,
    )  # fmt: skip
    assert made.stdout.startswith("edged_")
    # Over the HTTP API with the admin's token the command line made (loopback alone manages no tokens).
    admin_token = {"Authorization": f"Bearer {made.stdout.strip()}"}
    body = json.dumps({"name": "from-api", "role": "viewer"}).encode()
    headers = {"Content-Type": "application/json", **admin_token}
    status, _, text = raw(server.http_port, "POST", "/v2/edged/tokens", body, headers)
    assert status == 200, text
    status, _, text = raw(server.http_port, "DELETE", "/v2/edged/tokens/from-api", None, admin_token)
    assert status == 200, text
    admin = http_login(server.console_port, "ada")
    status, _, csv_text = admin.request("GET", "/history.csv?model=&user=&source=")
    assert status == 200
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    seen = {(row["source"], row["action"], row["target"]) for row in rows if row.get("kind") != "model"}
    assert ("cli", "token-create", "from-cli") in seen, seen
    assert ("api", "token-create", "from-api") in seen and ("api", "token-revoke", "from-api") in seen, seen
