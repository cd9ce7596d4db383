"""The console at a phone's width and in the theme a person picks, in a real browser against the real daemon: no
page is wider than the screen and no table is cut (each fits or scrolls in its card), measured in the page; the
light/dark choice beside the system's is kept per browser and works without JavaScript."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
from browser import PHONE, assert_accessible, clipped, open_page, screenshot
from console_session import browser_login, console_server, http_login
from playwright.sync_api import expect
from server import REPO_ROOT, Server

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

pytest_plugins = ("console_fixtures",)

# Every page a person reaches from the navigation, and a model's page (the widest tables).
PAGES: Final = (
    "/",
    "/models",
    "/models/a_model_with_a_rather_long_name_for_a_phone",
    "/upload",
    "/metrics",
    "/sync",
    "/history",
    "/account",
    "/admin/users",
    "/admin/tokens",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("fit-repository")
    name = "a_model_with_a_rather_long_name_for_a_phone"
    modelgen.write_add_sub(repository / name, max_batch_size=8, dims=16, dtype="FP32")
    config = repository / name / "config.pbtxt"
    config.write_text(config.read_text(encoding="utf-8").replace('name: "add_sub"', f'name: "{name}"'))
    with console_server([repository], tmp_path_factory.mktemp("fit-state")) as running:
        # Some history, so that its tables have rows.
        operator = http_login(running.console_port, "otto")
        for action in ("unload", "load"):
            operator.request("POST", f"/models/{name}/{action}", {"csrf_token": operator.csrf_token})
        yield running


def test_no_page_is_cut_at_a_phones_width(server: Server, phone_page: Page) -> None:
    browser_login(phone_page, server.console_url, "ada")
    for path in PAGES:
        phone_page.goto(server.console_url + path)
        expect(phone_page.locator("main h1")).to_be_visible()
        problems = clipped(phone_page)
        assert problems == [], (path, problems)
    assert PHONE["width"] == 390
    screenshot(phone_page, "console-admin-tokens-phone")


def test_the_theme_a_person_picks_is_kept(server: Server, browser: Browser, tmp_path: Path) -> None:
    del tmp_path
    for javascript in (True, False):
        with open_page(browser, color_scheme="light", javascript=javascript) as watched:
            page = watched.page
            browser_login(page, server.console_url, "vera")
            html = page.locator("html")
            assert html.get_attribute("data-theme") is None  # the system's choice, until a person picks one
            page.get_by_role("button", name="Theme: follows the system").click()
            expect(html).to_have_attribute("data-theme", "dark")
            background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(17, 20, 24)", background
            page.goto(f"{server.console_url}/models")
            expect(html).to_have_attribute("data-theme", "dark")  # kept from page to page
            if javascript:
                assert_accessible(page)
            page.get_by_role("button", name="Theme: dark").click()
            expect(html).to_have_attribute("data-theme", "light")
            page.get_by_role("button", name="Theme: light").click()
            expect(html).not_to_have_attribute("data-theme", "light")
            assert html.get_attribute("data-theme") is None
