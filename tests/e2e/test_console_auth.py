"""The console's front door against the real daemon: the first-run setup with the code from the log, login and
logout in Chromium, wrong passwords throttled, CSRF and cross-site refusals, the session cookie's flags, the
security headers, the console off with one option and over TLS; the overview page's accessibility and screenshots.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

import pytest
import trustme
from browser import PHONE, assert_accessible, open_page, screenshot
from console_session import PASSWORD, HttpSession, browser_login, console_server, http_login, raw
from playwright.sync_api import Browser, Page, expect
from server import REPO_ROOT, Server, run_server

from edged.core.accounts import MAX_ADDRESS_FAILURES, MAX_FAILURES

pytest_plugins = ("console_fixtures",)

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
SETUP_CODE = re.compile(r"setup code ([A-Z0-9]{4}(?:-[A-Z0-9]{4}){3})")


@pytest.fixture(scope="module")
def console(bundled_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with console_server([bundled_repository], tmp_path_factory.mktemp("console-auth") / "state") as server:
        yield server


def _form(
    port: int, path: str, fields: dict[str, str], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    return raw(port, "POST", path, urlencode(fields).encode(), {**FORM, **(headers or {})})


def _form_from(address: str, port: int, path: str, fields: dict[str, str]) -> int:
    """A form posted from another loopback address (all of 127.0.0.0/8 is this machine): another client's."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(address, 0))
    try:
        connection.request("POST", path, body=urlencode(fields).encode(), headers=FORM)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


# --- first run -----------------------------------------------------------------------------------------------


def test_first_run_setup_with_the_code_from_the_log(bundled_repository: Path, tmp_path: Path, browser: Browser) -> None:
    # Unchecked for console errors: the refused setup answers 401, which Chromium logs; the rest is checked below.
    with (
        # Started from a terminal (not a systemd unit, whatever runs the tests).
        run_server(
            [bundled_repository], "--state-dir", str(tmp_path / "state"), environment={"INVOCATION_ID": None}
        ) as server,
        open_page(browser, check=False) as watched,
    ):
        page = watched.page
        found = SETUP_CODE.search(server.log())
        assert found is not None, server.log()
        base = server.console_url
        # Every page leads to the setup while no user exists, which says where the code is for how edged started.
        page.goto(f"{base}/")
        page.wait_for_url(f"{base}/setup")
        expect(page.locator("#code-where")).to_have_text(
            "The code is in the terminal edged was started from, among its first lines."
        )
        assert_accessible(page)
        screenshot(page, "console-setup")
        # Every problem at once, and what was typed kept.
        page.get_by_label("Setup code").fill("AAAA-BBBB-CCCC-DDDD")
        page.get_by_label("Administrator's user name").fill("root user")
        page.get_by_label("Password", exact=False).first.fill("short")
        page.get_by_label("Password again").fill("shorter")
        page.locator("form.stack").evaluate("form => form.noValidate = true")  # past the browser's own checks
        page.get_by_role("button", name="Create the administrator").click()
        problems = page.get_by_role("alert").locator("li")
        expect(problems).to_have_text(
            [
                "a user name is 1 to 64 characters among letters, digits and . _ @ -",
                "a password needs at least 12 characters",
                "the two passwords differ",
            ]
        )
        expect(page.get_by_label("Setup code")).to_have_value("AAAA-BBBB-CCCC-DDDD")
        expect(page.get_by_label("Administrator's user name")).to_have_value("root user")
        page.get_by_label("Setup code").fill("AAAA-BBBB-CCCC-DDDD")
        page.get_by_label("Administrator's user name").fill("root")
        page.get_by_label("Password", exact=False).first.fill(PASSWORD)
        page.get_by_label("Password again").fill(PASSWORD)
        with page.expect_response(f"{base}/setup") as refused:
            page.get_by_role("button", name="Create the administrator").click()
        assert refused.value.status == 401
        expect(page.get_by_role("alert")).to_contain_text("setup code is wrong")
        expect(page.get_by_label("Setup code")).to_have_value("AAAA-BBBB-CCCC-DDDD")  # to correct, not retype

        page.get_by_label("Setup code").fill(found.group(1).lower())  # typed as read: case does not matter
        page.get_by_label("Password", exact=False).first.fill(PASSWORD)
        page.get_by_label("Password again").fill(PASSWORD)
        page.get_by_role("button", name="Create the administrator").click()
        page.wait_for_url(f"{base}/")
        expect(page.locator(".whoami")).to_contain_text("root")
        assert not watched.problems.csp_violations and not watched.problems.page_errors
        # Once: the code is spent and a user exists, so the setup page sends to the login.
        status, headers, _ = raw(server.console_port, "GET", "/setup")
        assert status in (302, 303) and headers["location"].endswith("/login")
        status, _, _ = _form(
            server.console_port,
            "/setup",
            {"code": found.group(1), "name": "second", "password": PASSWORD, "password_again": PASSWORD},
        )
        assert status == 401


def test_the_setup_page_says_where_the_code_is(bundled_repository: Path, tmp_path: Path) -> None:
    # Logging to a file: the page names the file and the command that finds the code in it.
    log_file = tmp_path / "edged.log"
    with run_server([bundled_repository], "--state-dir", str(tmp_path / "state"), f"--log-file={log_file}") as s:
        status, _, text = raw(s.console_port, "GET", "/setup")
    assert status == 200
    assert f"The code is in edged&#39;s log file, {log_file}: <code>grep &#34;setup code&#34; {log_file}" in text
    assert "setup code" in log_file.read_text(encoding="utf-8")


def test_no_setup_code_is_logged_once_a_user_exists(console: Server) -> None:
    assert SETUP_CODE.search(console.log()) is None


# --- login and logout -------------------------------------------------------------------------------------------


def test_login_and_logout_in_the_browser(console: Server, page: Page) -> None:
    base = console.console_url
    page.goto(f"{base}/overview/live")
    page.wait_for_url(re.compile(re.escape(f"{base}/login") + r"\?next=%2Foverview%2Flive"))
    assert_accessible(page)
    screenshot(page, "console-login")
    page.get_by_label("User name").fill("vera")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    # Back where the login interrupted.
    page.wait_for_url(f"{base}/overview/live")
    page.goto(f"{base}/")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{base}/login")
    page.goto(f"{base}/")
    page.wait_for_url(re.compile(re.escape(f"{base}/login")))


def test_the_session_cookie_is_httponly_and_strict(console: Server) -> None:
    fields = {"name": "vera", "password": PASSWORD, "next": "/"}
    status, headers, _ = _form(console.console_port, "/login", fields)
    assert status == 303
    cookie = SimpleCookie(headers["set-cookie"])
    morsel = cookie["edged_session"]
    assert morsel["httponly"] and morsel["samesite"].lower() == "strict" and morsel["path"] == "/"
    assert not morsel["secure"]  # plain HTTP: a Secure cookie would never come back


def test_a_logged_out_session_stops_working(console: Server) -> None:
    session = http_login(console.console_port, "vera")
    status, _, _ = session.request("POST", "/logout", {"csrf_token": session.csrf_token})
    assert status == 303
    status, headers, _ = session.request("GET", "/")
    assert status == 303 and "/login" in headers["location"]


def test_wrong_passwords_are_throttled(bundled_repository: Path, tmp_path: Path, browser: Browser) -> None:
    # A daemon of its own: throttling counts per address too, and the other tests connect from 127.0.0.1.
    with console_server([bundled_repository], tmp_path / "state") as console:
        _throttled(console, browser)


def _throttled(console: Server, browser: Browser) -> None:
    port = console.console_port
    statuses = [_form(port, "/login", {"name": "otto", "password": "not the password at all"})[0] for _ in range(5)]
    assert statuses == [401] * 5
    status, headers, text = _form(port, "/login", {"name": "otto", "password": PASSWORD})
    # Even the right password waits now: the lockout is what stops guessing.
    assert status == 429 and int(headers["retry-after"]) > 0
    assert "too many failed logins" in text
    # The browser shows it as a message on the form (its 429 is no defect of the page, so the page is unchecked).
    with open_page(browser, check=False) as watched:
        page = watched.page
        page.goto(f"{console.console_url}/login")
        page.get_by_label("User name").fill("otto")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("alert")).to_be_visible()
        screenshot(page, "console-login-throttled")
    # Whoever sent those cannot keep otto out: from another address, his password works at once.
    assert _form_from("127.0.0.2", port, "/login", {"name": "otto", "password": PASSWORD}) == 303
    # Nor another user from the same address, until the address's own count (across names) is reached too.
    assert _form(port, "/login", {"name": "ada", "password": PASSWORD})[0] == 303
    for attempt in range(MAX_ADDRESS_FAILURES - MAX_FAILURES):
        assert _form(port, "/login", {"name": f"guess{attempt}", "password": "not the password at all"})[0] == 401
    status, _, _ = _form(port, "/login", {"name": "ada", "password": PASSWORD})
    assert status == 429
    assert _form_from("127.0.0.3", port, "/login", {"name": "ada", "password": PASSWORD}) == 303


def test_unknown_user_and_wrong_password_answer_alike(console: Server) -> None:
    # A fresh name per run: throttling counts per name too.
    _, _, unknown = _form(console.console_port, "/login", {"name": "nobody-here", "password": "x" * 12})
    _, _, wrong = _form(console.console_port, "/login", {"name": "nobody-else", "password": "y" * 12})
    pick = re.compile(r'role="alert">([^<]*)<')
    assert pick.findall(unknown) == pick.findall(wrong) != []


# --- CSRF, origins, redirects --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def admin_session(console: Server) -> HttpSession:
    return http_login(console.console_port, "ada")


def test_a_post_without_the_csrf_token_is_refused(admin_session: HttpSession) -> None:
    status, _, text = admin_session.request("POST", "/logout", {})
    assert status == 403 and "security token" in text
    status, _, _ = admin_session.request("POST", "/logout", {"csrf_token": "forged"})
    assert status == 403
    # The session is still open: nothing was done.
    assert admin_session.request("GET", "/")[0] == 200


def test_a_management_form_with_an_unknown_field_is_refused(admin_session: HttpSession) -> None:
    # A script's misspelt field is named, never dropped: "expires" taken for nothing would make a token for ever.
    form = {"csrf_token": admin_session.csrf_token, "name": "kiosk", "role": "viewer", "expires": "1"}
    status, _, text = admin_session.request("POST", "/admin/tokens", form)
    assert status == 400 and "unknown field &#39;expires&#39; in the token form" in text, text[:2000]
    status, _, page = admin_session.request("GET", "/admin/tokens")
    assert status == 200 and "kiosk" not in page
    form = {"csrf_token": admin_session.csrf_token, "name": "eve", "role": "admin", "password": PASSWORD * 2}
    status, _, text = admin_session.request("POST", "/admin/users", {**form, "password_again": PASSWORD * 2, "x": "1"})
    assert status == 400 and "unknown field &#39;x&#39; in the user form" in text, text[:2000]


def test_a_cross_site_post_is_refused(admin_session: HttpSession, console: Server) -> None:
    status, _, text = admin_session.request(
        "POST", "/logout", {"csrf_token": admin_session.csrf_token}, {"Origin": "http://evil.example"}
    )
    assert status == 403 and "cross-site" in text
    status, _, _ = _form(
        console.console_port, "/login", {"name": "vera", "password": PASSWORD}, {"Origin": "http://evil.example"}
    )
    assert status == 403


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:x"])
def test_the_login_never_redirects_elsewhere(console: Server, target: str) -> None:
    status, headers, _ = _form(console.console_port, "/login", {"name": "vera", "password": PASSWORD, "next": target})
    assert status == 303 and headers["location"] == "/"


def test_htmx_requests_without_a_session_are_told_to_log_in(console: Server) -> None:
    status, headers, _ = raw(console.console_port, "GET", "/overview/live", None, {"HX-Request": "true"})
    assert status == 401 and headers["hx-redirect"] == "/login"


def test_every_answer_carries_the_security_headers(console: Server, admin_session: HttpSession) -> None:
    for status, headers, _ in (raw(console.console_port, "GET", "/login"), admin_session.request("GET", "/")):
        assert status == 200
        policy = headers["content-security-policy"]
        assert "script-src 'self'" in policy and "'unsafe-inline'" not in policy
        assert "frame-ancestors 'none'" in policy
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["cache-control"] == "no-store"
    status, headers, _ = raw(console.console_port, "GET", "/static/console.css")
    assert status == 200 and "no-store" not in headers.get("cache-control", "")


def test_unknown_pages_are_404_pages(admin_session: HttpSession) -> None:
    status, _, text = admin_session.request("GET", "/no/such/page")
    assert status == 404 and "Not found" in text


# --- the overview -------------------------------------------------------------------------------------------------


def test_the_overview_shows_the_device(console: Server, page: Page, browser: Browser) -> None:
    browser_login(page, console.console_url, "vera")
    expect(page.get_by_role("heading", name="Health")).to_be_visible()
    expect(page.get_by_role("row", name=re.compile("CPU"))).to_contain_text("add_sub")
    expect(page.get_by_role("heading", name="Latest events")).to_be_visible()
    # A viewer has no upload or admin pages in the navigation.
    expect(page.get_by_role("link", name="Upload")).to_have_count(0)
    expect(page.get_by_role("link", name="Users & tokens")).to_have_count(0)
    assert_accessible(page)
    screenshot(page, "console-overview")
    # The live part reloads itself: the uptime moves without a navigation.
    uptime = page.locator("dt:has-text('Uptime') + dd")
    before = uptime.inner_text()
    expect(uptime).not_to_have_text(before, timeout=10_000)
    with open_page(browser, color_scheme="dark") as dark:
        browser_login(dark.page, console.console_url, "ada")
        assert_accessible(dark.page)
        screenshot(dark.page, "console-overview-dark")
    with open_page(browser, viewport=PHONE) as phone:
        browser_login(phone.page, console.console_url, "ada")
        assert_accessible(phone.page)
        screenshot(phone.page, "console-overview-phone")


# --- on and off, TLS ---------------------------------------------------------------------------------------------


def test_the_console_is_off_with_one_option(bundled_repository: Path) -> None:
    with run_server([bundled_repository], "--allow-console", "false") as server:
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", server.console_port)) != 0
        assert "console on" not in server.log() and SETUP_CODE.search(server.log()) is None


def test_the_console_over_tls(bundled_repository: Path, tmp_path: Path) -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    certificate.cert_chain_pems[0].write_to_path(cert)
    certificate.private_key_pem.write_to_path(key)
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(
        [sys.executable, "-m", "edged", "admin", "--state-dir", str(state), "create", "--name", "vera", "--role",
         "viewer", "--password-stdin"],
        input=PASSWORD, text=True, capture_output=True, check=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    args = ["--state-dir", str(state), "--console-use-ssl", "true"]
    args += ["--http-server-cert", str(cert), "--http-server-key", str(key)]
    with run_server([bundled_repository], *args) as server:
        context = ssl.create_default_context()
        authority.configure_trust(context)
        connection = http.client.HTTPSConnection("127.0.0.1", server.console_port, context=context, timeout=30)
        body = urlencode({"name": "vera", "password": PASSWORD}).encode()
        connection.request("POST", "/login", body=body, headers=FORM)
        response = connection.getresponse()
        response.read()
        assert response.status == 303
        cookie = SimpleCookie(response.getheader("set-cookie"))
        morsel = cookie["__Host-edged_session"]
        assert morsel["secure"] and morsel["httponly"]
        assert response.getheader("strict-transport-security", "").startswith("max-age=")
        connection.close()
        # Plain HTTP on the TLS port gets nowhere.
        status = _plain_http_status(server.console_port)
        assert status != 200


def _plain_http_status(port: int) -> int:
    try:
        return raw(port, "GET", "/login")[0]
    except (ConnectionError, OSError, Exception):
        return 0


def test_keyboard_and_phone_width(console: Server, browser: Browser) -> None:
    """The first Tab reaches the skip link, which takes the focus past the navigation; at phone width every page of
    the navigation fits the screen (wide tables scroll inside their card, never the page)."""
    with open_page(browser, viewport=PHONE) as watched:
        page = watched.page
        browser_login(page, console.console_url, "ada")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent.trim()") == "Skip to content"
        page.keyboard.press("Enter")
        # The jump is a same-page navigation the browser reports a moment later: waited for, not raced.
        page.wait_for_url(re.compile(r"#main$"), timeout=5000)
        assert page.url.endswith("#main")
        links = page.locator("nav a").evaluate_all("links => links.map(link => link.getAttribute('href'))")
        assert "/models" in links and "/history" in links
        for href in links:
            page.goto(f"{console.console_url}{href}")
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{href} is {overflow} px wider than a phone"
