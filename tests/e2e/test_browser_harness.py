"""The browser harness (browser.py, console_fixtures.py) against pages served here, without the console.

Every page is sent with the console's kind of strict Content-Security-Policy, so these tests show that axe-core
runs under it and that what the policy blocks is caught.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
from browser import (
    CSP_PREFIX,
    DEFAULT_ARTIFACTS,
    PHONE,
    REPO_ROOT,
    artifacts_dir,
    assert_accessible,
    axe_violations,
    open_page,
    screenshot,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytest_plugins = ("console_fixtures",)

CSP: Final = "default-src 'self'; script-src 'self'"
PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"


def _html(title: str, body: str) -> bytes:
    return f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>{title}</title></head>
<body>{body}</body>
</html>""".encode()


PAGES: Final[dict[str, tuple[str, bytes]]] = {
    # Two critical violations: an image with no text alternative, an input with no label.
    "/inaccessible.html": (
        "text/html",
        _html("Inaccessible", '<main><h1>Models</h1><img src="/pixel.svg"><input type="text" name="q"></main>'),
    ),
    "/clean.html": (
        "text/html",
        _html(
            "Clean",
            '<main><h1>Models</h1><img src="/pixel.svg" alt="status: serving">'
            '<label for="q">Search</label><input id="q" type="text" name="q">'
            '<p id="script">script did not run</p></main><script src="/app.js"></script>',
        ),
    ),
    # The inline script is what the policy forbids; were it run, the title would change.
    "/inline.html": (
        "text/html",
        _html("Inline", "<main><h1>Inline</h1><script>document.title = 'inline script ran';</script></main>"),
    ),
    "/errors.html": (
        "text/html",
        _html(
            "Errors",
            '<main><h1>Errors</h1><img src="/missing.png" alt="gone"></main><script src="/throws.js"></script>',
        ),
    ),
    "/app.js": ("text/javascript", b"document.getElementById('script').textContent = 'script ran';\n"),
    "/throws.js": (
        "text/javascript",
        b"console.error('logged by the page');\nthrow new Error('thrown by the page');\n",
    ),
    "/pixel.svg": (
        "image/svg+xml",
        b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" height="8" fill="green"/></svg>',
    ),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        content_type, body = PAGES.get(self.path, ("text/plain", b""))
        self.send_response(200 if self.path in PAGES else 404)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the tests' output stays readable


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_axe_reports_missing_alt_and_label(page: Page, site: str) -> None:
    page.goto(f"{site}/inaccessible.html")
    violations = {violation["id"]: violation for violation in axe_violations(page)}
    assert set(violations) >= {"image-alt", "label"}, violations.keys()
    assert violations["image-alt"]["impact"] == "critical"
    assert [node["target"] for node in violations["image-alt"]["nodes"]] == [["img"]]
    assert [node["target"] for node in violations["label"]["nodes"]] == [["input"]]

    with pytest.raises(AssertionError) as failure:
        assert_accessible(page)
    message = str(failure.value)
    assert f"on {site}/inaccessible.html" in message
    assert "image-alt (critical): Images must have alternative text" in message
    assert "label (critical): Form elements must have labels" in message
    assert 'at "img"' in message
    assert 'at "input"' in message


def test_clean_page_passes_under_its_csp(page: Page, site: str) -> None:
    page.goto(f"{site}/clean.html")
    # The policy allows the page's own script: a strict CSP does not break a well-made page.
    assert page.text_content("#script") == "script ran"
    assert_accessible(page)
    assert axe_violations(page, impact=("minor", "moderate", "serious", "critical")) == []
    # Run twice on one document: axe is injected once and stays usable.
    assert_accessible(page)
    # The fixture's teardown then finds no error and no violation, injecting axe included.


def test_phone_page_is_phone_width(phone_page: Page, site: str) -> None:
    phone_page.goto(f"{site}/clean.html")
    assert phone_page.viewport_size == PHONE
    assert phone_page.evaluate("() => window.innerWidth") == PHONE["width"]
    assert_accessible(phone_page)


def test_screenshot_is_written(page: Page, site: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGED_TEST_ARTIFACTS", str(tmp_path))
    page.goto(f"{site}/clean.html")
    path = screenshot(page, "harness/clean page")
    assert path == tmp_path / "screenshots" / "harness-clean-page.png"
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 1000


def test_screenshots_render_text(page: Page, site: str) -> None:
    # Without a font installed Chromium draws no glyphs: the heading would look the same with its text hidden.
    page.goto(f"{site}/clean.html")
    heading = page.locator("h1")
    with_text = heading.screenshot()
    heading.evaluate("element => { element.style.color = 'transparent'; }")
    assert heading.screenshot() != with_text


def test_artifacts_default_to_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGED_TEST_ARTIFACTS", raising=False)
    assert artifacts_dir() == DEFAULT_ARTIFACTS == REPO_ROOT / "test-artifacts"


def test_inline_script_is_reported_as_csp_violation(browser: Browser, site: str) -> None:
    with open_page(browser, check=False) as watched:
        page = watched.page
        # The violation event is delivered as a task of its own: wait for its report, not for a while.
        with page.expect_console_message(lambda message: message.text.startswith(CSP_PREFIX)):
            page.goto(f"{site}/inline.html")
        assert page.title() == "Inline", "the policy did not block the inline script"
        problems = watched.problems
        assert any("script-src-elem blocked inline" in entry for entry in problems.csp_violations), problems
        assert problems.console_errors == []
        assert problems.page_errors == []
        assert "CSP violations:" in problems.report()


def test_csp_violation_fails_the_page_at_exit(browser: Browser, site: str) -> None:
    with (
        pytest.raises(AssertionError, match="CSP violations:"),
        open_page(browser) as watched,
        watched.page.expect_console_message(lambda message: message.text.startswith(CSP_PREFIX)),
    ):
        watched.page.goto(f"{site}/inline.html")


def test_script_errors_and_failed_loads_are_recorded(browser: Browser, site: str) -> None:
    with open_page(browser, check=False) as watched:
        with watched.page.expect_event("pageerror"):
            watched.page.goto(f"{site}/errors.html")
        problems = watched.problems
        assert problems.csp_violations == []
        assert len(problems.page_errors) == 1
        assert "thrown by the page" in problems.page_errors[0]
        assert any(entry.startswith("logged by the page") for entry in problems.console_errors), problems
        assert any(f"{site}/missing.png" in entry for entry in problems.console_errors), problems
    with (
        pytest.raises(AssertionError, match="JavaScript errors:"),
        open_page(browser) as watched,
        watched.page.expect_event("pageerror"),
    ):
        watched.page.goto(f"{site}/errors.html")
