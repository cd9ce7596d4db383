"""The console's users and API tokens pages (admin) and one's own account page, in a real browser against the real
daemon: a user made in the browser logs in, a disabled user's session stops working, passwords set by an admin and
changed by their owner, a token shown once and then used by tritonclient until it is revoked; operators and viewers
refused the pages and the same forms sent by hand. Each page is checked with axe-core and screenshotted."""

from __future__ import annotations

import http.client
import itertools
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final
from urllib.parse import urlencode

import pytest
import tritonclient.http as httpclient
from browser import assert_accessible, open_page, screenshot
from console_session import PASSWORD, HttpSession, browser_login, console_server, http_login
from playwright.sync_api import expect
from server import REPO_ROOT, Server
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytest_plugins = ("console_fixtures",)

NEW_PASSWORD: Final = "a-brand-new-long-passphrase"
REFUSED_FORM: Final = re.compile(r"Failed to load resource: the server responded with a status of 40[03] ")
# Loopback addresses for the login checks, one each (all of 127.0.0.0/8 reaches this machine).
_ADDRESSES: Final = itertools.count(2)
FORM: Final = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("admin-repository")
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    state_dir = tmp_path_factory.mktemp("admin-state")
    # Loopback is not trusted: the model repository API then needs a token even from this machine.
    with console_server([repository], state_dir, "--trust-loopback", "false") as running:
        yield running


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """The harness's watched page, except that a refused form's answer (400, 403) may be logged by Chromium as a
    failed load: refusals are what these tests are about. Anything else logged, thrown or blocked still fails."""
    with open_page(browser, check=False) as watched:
        yield watched.page
    problems = watched.problems
    assert not problems.csp_violations and not problems.page_errors, problems.report()
    unexpected = [error for error in problems.console_errors if not REFUSED_FORM.match(error)]
    assert not unexpected, problems.report()


def _login_status(server: Server, name: str, password: str) -> int:
    """The status of a login through the form, sent from a loopback address of its own: refused logins count
    against the address they come from, and the browser's (127.0.0.1) must not be throttled by these checks."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", server.console_port, timeout=30, source_address=(f"127.0.0.{next(_ADDRESSES)}", 0)
    )
    try:
        form = urlencode({"name": name, "password": password, "next": "/"})
        connection.request("POST", "/login", body=form, headers=FORM)
        return connection.getresponse().status
    finally:
        connection.close()


def _make_user(admin: HttpSession, name: str, role: str) -> None:
    form = {"csrf_token": admin.csrf_token, "name": name, "role": role}
    form |= {"password": PASSWORD, "password_again": PASSWORD}
    status, headers, text = admin.request("POST", "/admin/users", form)
    assert status == 303, text[:500]
    assert headers["location"].startswith("/admin/users")


def _accept_dialogs(page: Page) -> list[str]:
    """Accepts every confirmation the page asks for; returns their questions as they come."""
    asked: list[str] = []

    def accept(dialog: object) -> None:
        asked.append(dialog.message)  # type: ignore[attr-defined]
        dialog.accept()  # type: ignore[attr-defined]

    page.on("dialog", accept)
    return asked


def test_an_admin_creates_a_user_who_then_logs_in(server: Server, page: Page) -> None:
    browser_login(page, server.console_url, "ada")
    page.get_by_role("link", name="Users & tokens").click()
    page.wait_for_url(f"{server.console_url}/admin/users")
    users = page.get_by_role("table")
    for name in ("ada", "otto", "vera"):
        assert users.get_by_role("rowheader", name=re.compile(f"^{name}")).count() == 1
    assert_accessible(page)
    screenshot(page, "console-admin-users")

    # Two different passwords: refused, nothing made, the name kept in the form.
    page.get_by_label("Name", exact=True).fill("grace")
    page.get_by_label("Role").select_option("operator")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password again").fill(PASSWORD + "x")
    page.get_by_role("button", name="Create user").click()
    assert page.get_by_role("alert").inner_text() == "the two passwords differ"
    assert page.get_by_label("Name", exact=True).input_value() == "grace"
    assert users.get_by_role("rowheader", name="grace").count() == 0
    assert _login_status(server, "grace", PASSWORD) == 401

    # The policy's refusal is shown as the core words it.
    page.get_by_label("Password", exact=True).fill("short")
    page.get_by_label("Password again").fill("short")
    page.evaluate("() => document.querySelectorAll('input[minlength]').forEach((i) => i.removeAttribute('minlength'))")
    page.get_by_role("button", name="Create user").click()
    assert "at least 12 characters" in page.get_by_role("alert").inner_text()

    page.get_by_label("Role").select_option("operator")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password again").fill(PASSWORD)
    page.get_by_role("button", name="Create user").click()
    page.wait_for_url(re.compile(r"/admin/users\?created=grace$"))
    assert page.get_by_role("status").inner_text() == "User grace created."
    row = page.get_by_role("row", name=re.compile("^grace"))
    assert "operator" in row.inner_text() and "active" in row.inner_text()

    # A name taken: the core's refusal, shown.
    page.get_by_label("Name", exact=True).fill("grace")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password again").fill(PASSWORD)
    page.get_by_role("button", name="Create user").click()
    assert "grace" in page.get_by_role("alert").inner_text()

    page.get_by_role("button", name="Log out").click()
    browser_login(page, server.console_url, "grace")
    assert page.locator(".whoami").inner_text().split() == ["Signed", "in", "as", "grace", "operator", "Log", "out"]
    # An operator is offered no admin page.
    assert page.get_by_role("link", name="Users & tokens").count() == 0


def test_a_disabled_users_session_stops_working(server: Server, page: Page) -> None:
    admin = http_login(server.console_port, "ada")
    _make_user(admin, "henry", "viewer")
    henry = http_login(server.console_port, "henry")
    assert henry.request("GET", "/")[0] == 200

    browser_login(page, server.console_url, "ada")
    page.goto(f"{server.console_url}/admin/users")
    # No button to disable oneself, and why.
    own = page.get_by_role("row", name=re.compile("^ada"))
    assert own.get_by_role("button").count() == 0
    assert "You cannot disable yourself" in own.inner_text()
    asked = _accept_dialogs(page)
    page.get_by_role("button", name="Disable henry").click()
    page.wait_for_url(re.compile(r"\?disabled=henry$"))
    assert asked == ["Disable henry? They are logged out at once and can no longer log in."]
    assert "disabled" in page.get_by_role("row", name=re.compile("^henry")).inner_text()

    status, headers, _ = henry.request("GET", "/")
    assert status == 303 and headers["location"].startswith("/login")
    assert _login_status(server, "henry", PASSWORD) == 401

    # Sent by hand, disabling oneself is refused with the reason, and changes nothing.
    status, _, text = admin.request("POST", "/admin/users/ada/disable", {"csrf_token": admin.csrf_token})
    assert status == 400 and "you cannot disable your own account" in text
    assert admin.request("GET", "/")[0] == 200
    # An unknown user: the core's answer.
    status, _, text = admin.request("POST", "/admin/users/nobody/disable", {"csrf_token": admin.csrf_token})
    assert status == 400 and "no user named" in text


def test_an_admin_sets_a_users_password(server: Server, page: Page) -> None:
    admin = http_login(server.console_port, "ada")
    _make_user(admin, "iris", "viewer")
    iris = http_login(server.console_port, "iris")

    browser_login(page, server.console_url, "ada")
    page.goto(f"{server.console_url}/admin/users")
    page.get_by_role("link", name="Set password of iris").click()
    page.wait_for_url(f"{server.console_url}/admin/users/iris/password")
    assert_accessible(page)
    screenshot(page, "console-admin-password")
    page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password again").fill(NEW_PASSWORD + "!")
    page.get_by_role("button", name="Set password").click()
    assert page.get_by_role("alert").inner_text() == "the two passwords differ"
    page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password again").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Set password").click()
    page.wait_for_url(re.compile(r"/admin/users\?password=iris$"))
    assert "Password of iris set" in page.get_by_role("status").inner_text()

    assert iris.request("GET", "/")[0] == 303  # her session ended with the old password
    assert _login_status(server, "iris", PASSWORD) == 401
    assert _login_status(server, "iris", NEW_PASSWORD) == 303


def test_a_user_changes_their_own_password(server: Server, page: Page) -> None:
    admin = http_login(server.console_port, "ada")
    _make_user(admin, "jules", "viewer")
    other_session = http_login(server.console_port, "jules")

    browser_login(page, server.console_url, "jules")
    page.get_by_role("link", name="jules").click()
    page.wait_for_url(f"{server.console_url}/account")
    assert_accessible(page)
    screenshot(page, "console-account")

    page.get_by_label("Current password").fill("not-the-password-at-all")
    page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password again").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Change password").click()
    assert page.get_by_role("alert").inner_text() == "the current password is wrong"
    assert _login_status(server, "jules", PASSWORD) == 303  # unchanged

    page.get_by_label("Current password").fill(PASSWORD)
    page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password again").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Change password").click()
    page.wait_for_url(re.compile(r"/login\?next=(/|%2F)account$"))
    assert other_session.request("GET", "/")[0] == 303  # every session of the user ended
    browser_login_to(page, server, "jules", NEW_PASSWORD, "/account")
    assert _login_status(server, "jules", PASSWORD) == 401


def browser_login_to(page: Page, server: Server, name: str, password: str, target: str) -> None:
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{server.console_url}{target}")


def test_a_token_is_shown_once_works_and_stops_when_revoked(server: Server, page: Page) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException):
        client.get_model_repository_index()  # loopback is not trusted here

    browser_login(page, server.console_url, "ada")
    page.goto(f"{server.console_url}/admin/tokens")
    page.get_by_label("Name").fill("line-3-camera")
    page.get_by_label("Role").select_option("operator")
    page.get_by_label("Expires after (days)").fill("30")
    with page.expect_response(lambda r: r.url.endswith("/admin/tokens") and r.request.method == "POST") as answer:
        page.get_by_role("button", name="Create token").click()
    assert answer.value.status == 200
    assert answer.value.headers["cache-control"] == "no-store"
    assert page.get_by_role("heading", level=1).inner_text() == "Token line-3-camera created"
    secret = page.get_by_label(re.compile("^Token")).input_value()
    assert secret.startswith("edged_")
    assert secret not in page.url
    expect(page.get_by_role("button", name="Copy")).to_be_visible()  # shown by admin.js once it has run
    assert_accessible(page)
    screenshot(page, "console-admin-token-created")

    index = client.get_model_repository_index(headers={"Authorization": f"Bearer {secret}"})
    assert [model["name"] for model in index] == ["add_sub"]

    # Never shown again: not on the list, not on a reload of it.
    page.get_by_role("link", name="Back to the tokens").click()
    assert secret not in page.content()
    row = page.get_by_role("row", name=re.compile("^line-3-camera"))
    assert "operator" in row.inner_text() and "active" in row.inner_text()
    # Its use on the HTTP API just now is its last use, from this machine's address.
    last_use = row.locator("td").nth(3)
    expect(last_use.locator("time")).to_have_attribute("datetime", re.compile(r"^\d{4}-\d\d-\d\dT"))
    expect(last_use).to_contain_text("from 127.0.0.1")
    used = last_use.locator("time").get_attribute("datetime")
    assert used is not None
    client.get_model_repository_index(headers={"Authorization": f"Bearer {secret}"})
    page.reload()
    later = page.get_by_role("row", name=re.compile("^line-3-camera")).locator("td").nth(3).locator("time")
    assert (later.get_attribute("datetime") or "") > used  # every use moves it, whatever was written when
    assert_accessible(page)
    screenshot(page, "console-admin-tokens")

    asked = _accept_dialogs(page)
    page.get_by_role("button", name="Revoke line-3-camera").click()
    page.wait_for_url(re.compile(r"\?revoked=line-3-camera$"))
    assert asked and "line-3-camera" in asked[0]
    assert "revoked" in page.get_by_role("row", name=re.compile("^line-3-camera")).inner_text()
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_repository_index(headers={"Authorization": f"Bearer {secret}"})
    assert refused.value.status() == "401"

    # A name taken and a bad expiry: refused, with the reason.
    admin = http_login(server.console_port, "ada")
    base = {"csrf_token": admin.csrf_token, "name": "line-3-camera", "role": "viewer", "days": ""}
    status, _, text = admin.request("POST", "/admin/tokens", base)
    assert status == 400 and "line-3-camera" in text and "edged_" not in text
    status, _, text = admin.request("POST", "/admin/tokens", base | {"name": "other", "days": "-3"})
    assert status == 400 and "whole number of days" in text


@pytest.mark.parametrize("name", ["otto", "vera"])
def test_operators_and_viewers_are_refused_the_admin_pages_and_forms(server: Server, name: str) -> None:
    session = http_login(server.console_port, name)
    for path in ("/admin/users", "/admin/tokens", "/admin/users/ada/password"):
        status, _, text = session.request("GET", path)
        assert status == 403, path
        assert "this needs the admin role" in text
    csrf = session.csrf_token
    posts: dict[str, dict[str, str]] = {
        "/admin/users": {"name": f"{name}-friend", "role": "admin", "password": PASSWORD, "password_again": PASSWORD},
        "/admin/users/ada/disable": {},
        "/admin/users/ada/password": {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD},
        "/admin/tokens": {"name": f"{name}-token", "role": "admin", "days": ""},
        "/admin/tokens/revoke": {"name": "anything"},
    }
    for path, form in posts.items():
        status, _, _ = session.request("POST", path, {"csrf_token": csrf, **form})
        assert status == 403, path
    # Nothing changed: the admin still logs in with the old password, no user or token was made.
    assert _login_status(server, "ada", PASSWORD) == 303
    assert _login_status(server, f"{name}-friend", PASSWORD) == 401
    admin = http_login(server.console_port, "ada")
    assert f"{name}-token" not in admin.request("GET", "/admin/tokens")[2]
    # The account page is everyone's.
    assert session.request("GET", "/account")[0] == 200


def test_admin_forms_need_the_csrf_token(server: Server) -> None:
    admin = http_login(server.console_port, "ada")
    form = {"name": "mallory", "role": "admin", "password": PASSWORD, "password_again": PASSWORD}
    assert admin.request("POST", "/admin/users", form)[0] == 403
    assert admin.request("POST", "/admin/users", form | {"csrf_token": "forged"})[0] == 403
    assert admin.request("POST", "/admin/tokens", {"name": "t", "role": "admin"})[0] == 403
    assert _login_status(server, "mallory", PASSWORD) == 401


def test_dark_and_phone_screenshots(server: Server, browser: Browser, phone_page: Page) -> None:
    pages = (("/admin/users", "admin-users"), ("/admin/tokens", "admin-tokens"), ("/account", "account"))
    with open_page(browser, color_scheme="dark") as watched:
        dark = watched.page
        browser_login(dark, server.console_url, "ada")
        for path, name in pages:
            dark.goto(f"{server.console_url}{path}")
            assert_accessible(dark)
            screenshot(dark, f"console-{name}-dark")

    browser_login(phone_page, server.console_url, "ada")
    for path, name in pages:
        phone_page.goto(f"{server.console_url}{path}")
        assert_accessible(phone_page)
        screenshot(phone_page, f"console-{name}-phone")
