"""pytest fixtures for tests in a real browser (see browser.py): a Chromium per test module and a watched page per test.

A test module uses them by naming this module as a plugin, then asking for the fixtures by name::

    pytest_plugins = ("console_fixtures",)

    def test_home(page: Page) -> None: ...

``page`` is 1280x800 and ``phone_page`` 390x844, each in a browser context of its own. Either fails the test at
teardown when the page logged a console error, threw, or violated its Content-Security-Policy; when the test itself
failed, a screenshot of the page at that moment is saved as ``<artifacts>/screenshots/failed-<test>.png``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import pytest
from browser import DESKTOP, PHONE, launch, open_page, screenshot

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, ViewportSize

_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Keeps each phase's report on the test, so a fixture's teardown can tell whether the test failed.
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # One per test module, not per session: while Playwright's sync API is started, the main thread has a running
    # event loop, and every later test that calls asyncio.run() (grpc.aio clients, the sync tests) would fail.
    with launch() as started:
        yield started


def _watched_page(browser: Browser, request: pytest.FixtureRequest, viewport: ViewportSize) -> Iterator[Page]:
    with open_page(browser, viewport=viewport) as watched:
        yield watched.page
        call = request.node.stash.get(_REPORTS, {}).get("call")
        if call is not None and call.failed:
            screenshot(watched.page, f"failed-{request.node.nodeid}")


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    yield from _watched_page(browser, request, DESKTOP)


@pytest.fixture
def phone_page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    yield from _watched_page(browser, request, PHONE)
