"""The alerts page against the real daemon and a webhook receiver on 127.0.0.1 started here: an admin sets the
webhook and turns rules on in Chromium, the conditions happen for real (every disk below 100% free, a model that
fails to load, the device unready because of it for 1 s), and the receiver gets each alert as signed JSON (the
signature recomputed here), a delivery answered 500 is tried again, and the page lists each alert and its
delivery. A receiver that never answers leaves the daemon serving. Operators and viewers are refused the page and
its forms; a webhook that is not http or https is refused. axe-core checks the page.

Every wait is on a condition (the receiver's requests, the page's text), never on a clock."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import tritonclient.http as httpclient
from browser import assert_accessible, clipped, screenshot
from console_session import browser_login, console_server, http_login
from playwright.sync_api import expect
from server import REPO_ROOT, Server, request
from webhook_receiver import Received, Receiver, receiver

from edged.core.alerts import bounds

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytest_plugins = ("console_fixtures",)

# Each rule's check box and threshold field, by their labels on the page.
UNAVAILABLE = "A model is UNAVAILABLE (a load failed)"
NOT_READY = "The device is not ready for: threshold in s"
DISK = "Free disk space below: threshold in %"
# Long enough for a delivery's tries and the page's refresh on a loaded machine; the waits end as soon as it's done.
WAIT_S = 120.0


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("alerts-repository")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    return repo


@pytest.fixture(scope="module")
def hook() -> Iterator[Receiver]:
    with receiver() as started:
        yield started


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with console_server([repository], tmp_path_factory.mktemp("alerts-state")) as started:
        yield started


@pytest.fixture(scope="module")
def secret(server: Server, hook: Receiver, browser: Browser) -> str:
    """The webhook set in the browser by an admin: its secret, read from the page that shows it once."""
    context = browser.new_context()
    page = context.new_page()
    try:
        browser_login(page, server.console_url, "ada")
        page.get_by_role("link", name="Users & tokens").click()
        page.get_by_role("navigation", name="Administration").get_by_role("link", name="Alerts").click()
        page.wait_for_url(f"{server.console_url}/alerts")
        page.get_by_label("URL", exact=True).fill(hook.url)
        page.get_by_role("button", name="Set webhook").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Webhook set")
        shown = page.get_by_label("Signing secret", exact=True).input_value()
        assert len(shown) >= 40
        page.get_by_role("link", name="Back to the alerts").click()
        expect(page.get_by_text(f"Alerts are sent to {hook.url}")).to_be_visible()
        return shown
    finally:
        context.close()


def _deliveries(hook: Receiver, secret: str, rules: set[str]) -> list[Received]:
    """The receiver's requests, once the alerts of ``rules`` came, each checked: signed with ``secret``, JSON."""
    seen: set[str] = set()
    count = 0
    while not rules <= seen:
        count += 1
        request_ = hook.wait_for(count, WAIT_S)[-1]
        assert request_.signed_by(secret), request_.headers
        seen.add(request_.json()["rule"])
    return hook.wait_for(count, 0)


def test_alerts_fire_and_reach_the_webhook_signed_and_retried(
    server: Server, hook: Receiver, secret: str, page: Page, repository: Path
) -> None:
    # The first delivery is answered 500: it must be tried again, signed anew, under the same delivery id.
    hook.statuses = [500]
    browser_login(page, server.console_url, "ada")
    page.goto(f"{server.console_url}/alerts")
    assert_accessible(page)
    page.get_by_label(UNAVAILABLE, exact=True).check()
    page.get_by_label("The device is not ready for", exact=True).check()
    page.get_by_label(NOT_READY).fill("1")
    page.get_by_label("Free disk space below", exact=True).check()
    # 100%: every disk that holds anything is below it, so the rule fires for the state directory and the repository.
    page.get_by_label(DISK).fill("100")
    page.get_by_role("button", name="Save rules").click()
    expect(page.get_by_role("status")).to_have_text("Rules saved.")
    expect(page.get_by_label(UNAVAILABLE, exact=True)).to_be_checked()
    expect(page.get_by_label(NOT_READY)).to_have_value("1")

    # A model that fails to load: UNAVAILABLE, and under strict readiness the device unready because of it.
    modelgen.write_identity(repository / "broken", "FP32", max_batch_size=8, dims=[-1])
    config = repository / "broken" / "config.pbtxt"
    config.write_text(config.read_text(encoding="utf-8").replace("dims: [ -1 ]", "dims: [ 0 ]", 1))
    reply = request(server.http_url, "POST", "/v2/repository/models/broken/load")
    assert reply.status == 400, reply.body

    received = _deliveries(hook, secret, {"disk-low", "model-unavailable", "not-ready"})
    documents = [r.json() for r in received]
    by_rule = {document["rule"]: document for document in documents}
    assert by_rule["model-unavailable"]["subject"] == "broken"
    assert "model 'broken'" in by_rule["model-unavailable"]["message"]
    assert by_rule["not-ready"]["threshold"] == 1 and "model 'broken'" in by_rule["not-ready"]["message"]
    assert by_rule["disk-low"]["threshold"] == 100 and by_rule["disk-low"]["unit"] == "%"
    for document in documents:
        assert document["device"] and document["edged_version"] and document["at"].endswith("Z")
    # The first one was answered 500 and came again: same id, same body, its own timestamp's signature.
    first, again = received[0], received[1]
    assert again.headers["x-edged-delivery"] == first.headers["x-edged-delivery"] == str(first.json()["id"])
    assert again.body == first.body

    # The page lists them, with their deliveries (it refreshes itself).
    fired = page.locator("#alerts-live")
    expect(fired).to_contain_text("model 'broken'", timeout=WAIT_S * 1000)
    expect(fired).to_contain_text("the device has not been ready for", timeout=WAIT_S * 1000)
    expect(fired).to_contain_text("HTTP 200 after 2 tries", timeout=WAIT_S * 1000)
    expect(fired.get_by_role("row", name=re.compile("not been ready")).get_by_text("delivered")).to_be_visible(
        timeout=WAIT_S * 1000
    )
    assert_accessible(page)
    screenshot(page, "console-alerts")


def test_the_page_fits_a_phone(server: Server, secret: str, phone_page: Page) -> None:
    browser_login(phone_page, server.console_url, "ada")
    phone_page.goto(f"{server.console_url}/alerts")
    expect(phone_page.locator("#alerts-live")).to_contain_text("delivered")
    assert clipped(phone_page) == []
    assert_accessible(phone_page)
    screenshot(phone_page, "console-alerts-phone")


def test_a_receiver_that_never_answers_leaves_the_daemon_serving(
    server: Server, hook: Receiver, secret: str, page: Page
) -> None:
    before = len(hook.requests)
    hook.hang = True
    browser_login(page, server.console_url, "ada")
    page.goto(f"{server.console_url}/alerts")
    page.get_by_role("button", name="Send a test alert").click()
    expect(page.get_by_role("status")).to_contain_text("Test alert sent")
    held = hook.wait_for(before + 1, WAIT_S)[-1]
    assert held.json()["rule"] == "test" and held.signed_by(secret)
    # While that delivery waits on the receiver: inference, health and the console all answer.
    assert request(server.http_url, "GET", "/v2/health/live").status == 200
    triton = httpclient.InferenceServerClient(server.http_url)
    try:
        inputs = [httpclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        result = triton.infer("add_sub", inputs)
        assert result.as_numpy("OUTPUT0") is not None
    finally:
        triton.close()
    page.reload()
    expect(page.locator("#alerts-live")).to_contain_text("a test alert, sent by ada")
    # Answering again: the try cut off at its deadline is followed by one that is answered.
    hook.hang = False
    again = hook.wait_for(before + 2, WAIT_S)[-1]
    assert again.headers["x-edged-delivery"] == held.headers["x-edged-delivery"]
    assert bounds.TRY_TIMEOUT_S < WAIT_S
    row = page.locator("#alerts-live").get_by_role("row", name=re.compile("a test alert"))
    expect(row).to_contain_text("HTTP 200 after 2 tries", timeout=WAIT_S * 1000)


def test_other_roles_are_refused_and_webhooks_that_are_not_http_too(server: Server, secret: str) -> None:
    for name in ("otto", "vera"):
        session = http_login(server.console_port, name)
        assert session.request("GET", "/alerts")[0] == 403
        form = {"csrf_token": session.csrf_token, "url": "http://127.0.0.1:9/steal"}
        assert session.request("POST", "/alerts/webhook", form)[0] == 403
        assert session.request("POST", "/alerts/rules", {"csrf_token": session.csrf_token, "on": "disk-low"})[0] == 403
    admin = http_login(server.console_port, "ada")
    for url, problem in (
        ("ftp://127.0.0.1/hook", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("https://user:pw@example.net/", "user name or password"),
    ):
        status, _, text = admin.request("POST", "/alerts/webhook", {"csrf_token": admin.csrf_token, "url": url})
        assert status == 400 and problem in text, text[:2000]
    # Refused, so the webhook set before stays.
    status, _, text = admin.request("GET", "/alerts")
    assert status == 200 and "/hook?team=edge" in text
    status, _, text = admin.request(
        "POST", "/alerts/rules", {"csrf_token": admin.csrf_token, "on": "temperature", "threshold-temperature": "999"}
    )
    assert status == 400 and "not 999" in text
    # Without the CSRF token: refused.
    assert admin.request("POST", "/alerts/test", {})[0] == 403
