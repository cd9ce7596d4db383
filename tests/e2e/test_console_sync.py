"""The console's sync page against a daemon syncing from moto's real S3 server: the source and its runs, "Sync now"
as an operator (a new run appears), pause and resume, a viewer without buttons whose POSTs are refused, the page of
a server that syncs nothing; light, dark and phone width, and axe-core on each."""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
from browser import DESKTOP, assert_accessible, screenshot, watch
from console_session import USERS, browser_login, console_server, create_user, http_login
from objectstores import S3Bucket, moto_server, write_repository
from playwright.sync_api import expect
from server import REPO_ROOT, Server, request, run_server

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, ViewportSize

pytest_plugins = ("console_fixtures",)

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
WAIT_S: Final = 60.0
_buckets = itertools.count()


class Bucket:
    """A bucket of moto's server with a repository under its ``repo/`` prefix."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.s3 = S3Bucket(f"127.0.0.1:{port}", f"console-{os.getpid()}-{next(_buckets)}", CREDENTIALS)

    @property
    def url(self) -> str:
        return f"s3://127.0.0.1:{self.port}/{self.s3.name}/repo"

    def put(self, key: str, data: bytes) -> None:
        self.s3.put(f"repo/{key}", data)


def wait_until(what: str, check: Any, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.1)


def status(server: Server) -> dict[str, Any]:
    reply = request(server.http_url, "GET", "/v2/edged/sync")
    assert reply.status == 200, reply.body
    document: dict[str, Any] = reply.json()
    return document


def committed(server: Server) -> bool:
    (source,) = status(server)["sources"]
    return bool(source["phase"] == "idle" and source["revision"] and source["revision"] == source["good_revision"])


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Bucket, dict[str, bytes]]]:
    """A daemon syncing a bucket of moto's server (add_sub and add_sub_int32), its first revision committed."""
    with pytest.MonkeyPatch.context() as patch, moto_server() as port:
        for name, value in CREDENTIALS.items():
            patch.setenv(name, value)  # the daemon's client reads them from its environment
        bucket = Bucket(port)
        published = write_repository(tmp_path_factory.mktemp("published"))
        for key, data in published.items():
            bucket.put(key, data)
        state = tmp_path_factory.mktemp("state")
        for name, role in USERS.items():
            create_user(state, name, role)
        flags = ("--sync-interval-secs", "3600", "--sync-probation-secs", "1", "--sync-timeout-secs", "5")
        with run_server([bucket.url], "--state-dir", str(state), *flags) as server:
            wait_until("the first revision is committed", lambda: committed(server))
            yield server, bucket, published


@contextlib.contextmanager
def other_page(browser: Browser, viewport: ViewportSize = DESKTOP, **options: Any) -> Iterator[Page]:
    """A watched page in a context of its own (dark ...): fails on a JS error or CSP violation."""
    context = browser.new_context(viewport=viewport, **options)
    problems = watch(context)
    try:
        yield context.new_page()
    finally:
        context.close()
    assert not problems, problems.report()


def run_ids(page: Page) -> list[int]:
    return [int(i) for i in page.locator("table.runs tbody tr").evaluate_all("rows => rows.map(r => r.dataset.runId)")]


def test_the_page_shows_the_source_and_its_runs(page: Page, synced: tuple[Server, Bucket, dict[str, bytes]]) -> None:
    server, bucket, _ = synced
    browser_login(page, server.console_url, "otto")
    page.goto(f"{server.console_url}/sync")
    (source,) = status(server)["sources"]
    card = page.locator("section.source")
    expect(card.get_by_role("heading")).to_have_text(bucket.url)
    expect(card).to_contain_text("not signed")
    expect(card).to_contain_text(source["revision"])
    expect(card.locator("dd").filter(has_text="idle")).to_be_visible()
    outcomes = page.locator("table.runs tbody tr td:nth-child(2)").all_inner_texts()
    assert outcomes[:2] == ["committed", "updated"], outcomes
    expect(page.locator("table.runs")).to_contain_text("files downloaded")
    for name in ("Sync now", "Pause"):
        expect(page.get_by_role("button", name=name)).to_be_visible()
    screenshot(page, "console-sync")
    assert_accessible(page)


def test_sync_now_pause_and_resume_as_operator(page: Page, synced: tuple[Server, Bucket, dict[str, bytes]]) -> None:
    server, bucket, published = synced
    browser_login(page, server.console_url, "otto")
    page.goto(f"{server.console_url}/sync")
    before = max(run_ids(page))
    bucket.put(
        "add_sub/config.pbtxt", published["add_sub/config.pbtxt"].replace(b"max_batch_size: 8", b"max_batch_size: 4")
    )
    page.get_by_role("button", name="Sync now").click()
    expect(page.get_by_role("status").filter(has_text="Sync finished: updated")).to_be_visible(timeout=30_000)
    newest = page.locator("table.runs tbody tr").first
    assert int(newest.get_attribute("data-run-id") or 0) > before
    expect(newest).to_contain_text("updated")
    expect(newest).to_contain_text("1 files downloaded")
    wait_until("the update is committed", lambda: committed(server))
    # The live part follows the source: its revision is the new one.
    expect(page.locator("section.source")).to_contain_text(status(server)["sources"][0]["revision"], timeout=10_000)

    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    assert status(server)["paused"] is True
    expect(page.locator("#sync-live")).to_contain_text("Scheduled runs are paused", timeout=10_000)
    expect(page.locator("section.source")).to_contain_text("when resumed")
    # Without JavaScript's help the same forms work: a reload shows the state the server keeps.
    page.reload()
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    page.get_by_role("button", name="Resume").click()
    expect(page.get_by_role("button", name="Pause")).to_be_visible()
    assert status(server)["paused"] is False
    expect(page.locator("#sync-live")).to_contain_text("Each source is synced every", timeout=10_000)


def test_plain_forms_redirect_back(synced: tuple[Server, Bucket, dict[str, bytes]]) -> None:
    server, _, _ = synced
    session = http_login(server.console_port, "otto")
    try:
        code, headers, text = session.request("POST", "/sync/pause", {"csrf_token": session.csrf_token})
        assert code == 303 and headers["location"] == "/sync", (code, text[:300])
        assert status(server)["paused"] is True
        code, _, text = session.request("GET", "/sync")
        assert code == 200 and "Resume" in text
    finally:
        code, _, _ = session.request("POST", "/sync/resume", {"csrf_token": session.csrf_token})
    assert code == 303 and status(server)["paused"] is False
    # Without the form's token the same POST is refused, and changes nothing.
    code, _, _ = session.request("POST", "/sync/pause", {"csrf_token": "not-the-token"})
    assert code == 403 and status(server)["paused"] is False
    # Both actions are in the audit history, as otto's, done in the console.
    code, _, text = session.request("GET", "/history.csv?user=otto&source=console")
    assert code == 200
    actions = {row["action"] for row in csv.DictReader(io.StringIO(text))}
    assert {"sync-pause", "sync-resume"} <= actions, actions


def test_a_viewer_sees_no_buttons_and_is_refused(page: Page, synced: tuple[Server, Bucket, dict[str, bytes]]) -> None:
    server, _, _ = synced
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/sync")
    expect(page.locator("section.source")).to_be_visible()
    # Only the frame's own: the theme and "Log out".
    expect(page.get_by_role("button")).to_have_count(2)
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    expect(page.get_by_role("button", name="Theme: follows the system")).to_be_visible()

    session = http_login(server.console_port, "vera")
    runs = len(request(server.http_url, "GET", "/v2/edged/sync/history").json()["runs"])
    for action in ("now", "pause", "resume"):
        code, _, text = session.request("POST", f"/sync/{action}", {"csrf_token": session.csrf_token})
        assert code == 403, (action, code, text[:300])
        code, _, _ = session.request(
            "POST", f"/sync/{action}", b"", {"X-CSRF-Token": session.csrf_token, "HX-Request": "true"}
        )
        assert code == 403, (action, code)
    assert status(server)["paused"] is False
    assert len(request(server.http_url, "GET", "/v2/edged/sync/history").json()["runs"]) == runs


def test_dark_and_phone(browser: Browser, phone_page: Page, synced: tuple[Server, Bucket, dict[str, bytes]]) -> None:
    server, _, _ = synced
    with other_page(browser, color_scheme="dark") as page:
        browser_login(page, server.console_url, "otto")
        page.goto(f"{server.console_url}/sync")
        expect(page.locator("section.source")).to_be_visible()
        screenshot(page, "console-sync-dark")
        assert_accessible(page)
    browser_login(phone_page, server.console_url, "otto")
    phone_page.goto(f"{server.console_url}/sync")
    expect(phone_page.locator("section.source")).to_be_visible()
    screenshot(phone_page, "console-sync-phone")
    assert_accessible(phone_page)


def test_a_server_that_syncs_nothing_says_how_to(page: Page, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    shutil.copytree(REPO_ROOT / "model_repository" / "add_sub", repository / "add_sub")
    with console_server([repository], tmp_path / "state") as server:
        browser_login(page, server.console_url, "otto")
        page.goto(f"{server.console_url}/sync")
        expect(page.get_by_role("heading", name="This device syncs nothing")).to_be_visible()
        expect(page.locator("main")).to_contain_text("--model-repository s3://BUCKET/PREFIX")
        expect(page.locator("main")).to_contain_text("gs://BUCKET/PREFIX")
        expect(page.get_by_role("button", name="Sync now")).to_have_count(0)
        assert_accessible(page)
        screenshot(page, "console-sync-off")
        # Nothing to run: the actions say so.
        session = http_login(server.console_port, "otto")
        code, _, text = session.request("POST", "/sync/now", {"csrf_token": session.csrf_token})
        assert code == 503 and "s3://" in text, (code, text[:300])
