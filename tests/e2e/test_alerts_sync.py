"""The sync's alert rules against the real daemon syncing from moto's real S3 server, through a TCP proxy that can
cut the link, with a webhook receiver on 127.0.0.1 started here. An admin sets the webhook in the console (its
secret read from the answer that shows it once) and turns a rule on there, as the browser's forms would; the runs
are started with ``edged sync now``, scheduled ones being paused so that each run counted is one the test made.

- "A sync fails this many times in a row" (2): the link goes down, the first failed run sends nothing, the second
  sends one signed alert naming the source and why, further failures send no more; the page lists it. A run that
  succeeds ends the streak: one failure after it sends nothing, the second a new alert counting from 1 again.
- "A probation rolled ... back": an update whose model's warmup fails is rolled back, and the alert names the model
  and the source it came from.

That nothing more was sent is made certain, not waited for: alerts are delivered one at a time in the order they
fired, and a run's alert fires before the run answers, so a test alert sent afterwards arrives right after every
alert that fired before it. Every wait is on a condition, never on a clock."""

from __future__ import annotations

import html
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pytest
from console_session import USERS, HttpSession, create_user, http_login
from objectstores import FaultProxy, S3Bucket, moto_server, write_repository
from server import REPO_ROOT, Server, request, run_server
from webhook_receiver import Received, Receiver, receiver

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
# Long enough for a delivery's tries and a run's timeouts on a loaded machine; the waits end as soon as it's done.
WAIT_S: Final = 120.0
STREAK: Final = 2
_SECRET = re.compile(r'id="secret"[^>]* value="([^"]+)"')
_buckets = itertools.count()

# A config that reads well: only loading it runs the warmup, which fails on the file it names.
WARMUP_FROM_A_MISSING_FILE: Final = b"""
model_warmup [
  {
    name: "from_file"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "missing.bin" } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
  }
]
"""


@dataclass
class Device:
    server: Server
    s3: S3Bucket
    proxy: FaultProxy
    published: dict[str, bytes]
    source: str  # the synced URL, through the proxy: what the alerts name
    admin: HttpSession
    secret: str


def wait_until(what: str, check: Any, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.1)


def sync_status(server: Server) -> dict[str, Any]:
    reply = request(server.http_url, "GET", "/v2/edged/sync")
    assert reply.status == 200, reply.body
    (source,) = reply.json()["sources"]
    assert isinstance(source, dict)
    return source


def committed(server: Server) -> bool:
    source = sync_status(server)
    return bool(source["phase"] == "idle" and source["revision"] and source["revision"] == source["good_revision"])


def sync_now(server: Server) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "edged", "sync", "now", "--url", f"http://{server.http_url}", "--json"],
        capture_output=True, text=True, timeout=WAIT_S, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert isinstance(run, dict)
    return run


def set_link(proxy: FaultProxy, up: bool) -> None:
    """Takes the link to the bucket down (every connection cut, new ones refused) or brings it back, and waits until
    the proxy's own thread has done so."""
    budget = None if up else 0
    proxy.set_budget(budget)
    wait_until("the link is " + ("up" if up else "down"), lambda: proxy.budget == budget)


def set_rule(admin: HttpSession, form: dict[str, str]) -> None:
    """Saves the rules form with only the rule in ``form`` on (the others off), as the page's button does."""
    status, headers, text = admin.request("POST", "/alerts/rules", {"csrf_token": admin.csrf_token, **form})
    assert status == 303 and headers["location"] == "/alerts?done=saved", (status, text[:2000])


def alerts_page(admin: HttpSession) -> str:
    status, _, text = admin.request("GET", "/alerts")
    assert status == 200, text[:2000]
    return html.unescape(text)


def listed(admin: HttpSession, message: str, delivery: str, detail: str) -> bool:
    """Whether the page's recent alerts have a row for ``message`` with this delivery and detail."""
    row = re.compile(
        re.escape(f"<td>{message}</td>")
        + r"\s*<td><span class=\"state[^\"]*\">"
        + re.escape(f'{delivery}</span><br><span class="muted">{detail}</span>')
    )
    return row.search(alerts_page(admin)) is not None


def after_a_test_alert(hook: Receiver, admin: HttpSession, secret: str, before: int) -> list[Received]:
    """Every delivery since the receiver's first ``before`` requests, up to a test alert sent now, which comes after
    every alert fired before it; each checked as a receiver would: signed with ``secret``, delivered once."""
    status, _, text = admin.request("POST", "/alerts/test", {"csrf_token": admin.csrf_token})
    assert status == 303, text[:2000]
    count = before
    while True:
        count += 1
        received = hook.wait_for(count, WAIT_S)[before:]
        if received[-1].json()["rule"] == "test":
            break
    for delivery in received:
        assert delivery.signed_by(secret), delivery.headers
        assert delivery.headers["x-edged-delivery"] == str(delivery.json()["id"])
    return received[:-1]


def only(received: list[Received], rule: str) -> dict[str, Any]:
    """The one alert of ``received``, of ``rule``."""
    documents = [delivery.json() for delivery in received]
    assert [document["rule"] for document in documents] == [rule], documents
    document: dict[str, Any] = documents[0]
    return document


@pytest.fixture(scope="module")
def hook() -> Iterator[Receiver]:
    with receiver() as started:
        yield started


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory, hook: Receiver) -> Iterator[Device]:
    """A daemon syncing a bucket through the proxy, its first revision committed, its scheduled runs paused, and the
    webhook set by an admin in the console."""
    with pytest.MonkeyPatch.context() as patch, moto_server() as port, FaultProxy(port).running() as proxy:
        for name, value in CREDENTIALS.items():
            patch.setenv(name, value)  # the daemon's client reads them from its environment
        s3 = S3Bucket(f"127.0.0.1:{port}", f"alerts-{os.getpid()}-{next(_buckets)}", CREDENTIALS)
        published = write_repository(tmp_path_factory.mktemp("published"))
        for key, data in published.items():
            s3.put(f"repo/{key}", data)
        source = f"s3://{proxy.url()}/{s3.name}/repo"
        state = tmp_path_factory.mktemp("state")
        for name, role in USERS.items():
            create_user(state, name, role)
        flags = ("--sync-interval-secs", "3600", "--sync-probation-secs", "2", "--sync-timeout-secs", "5")
        with run_server([source], "--state-dir", str(state), *flags) as server:
            wait_until("the first revision is committed", lambda: committed(server))
            # A failed run schedules the next within seconds: paused, only the runs asked for happen, so that the
            # streak counted is the test's.
            operator = http_login(server.console_port, "otto")
            status, _, text = operator.request("POST", "/sync/pause", {"csrf_token": operator.csrf_token})
            assert status == 303, text[:2000]
            admin = http_login(server.console_port, "ada")
            status, _, text = admin.request(
                "POST", "/alerts/webhook", {"csrf_token": admin.csrf_token, "url": hook.url}
            )
            assert status == 200 and "Webhook set" in text, text[:2000]
            found = _SECRET.search(text)
            assert found is not None, text[:4000]
            yield Device(server, s3, proxy, published, source, admin, html.unescape(found.group(1)))


def test_a_sync_failing_twice_in_a_row_sends_one_alert_until_a_sync_succeeds(device: Device, hook: Receiver) -> None:
    server, admin, proxy = device.server, device.admin, device.proxy
    set_rule(admin, {"on": "sync-failing", "threshold-sync-failing": str(STREAK)})
    page = alerts_page(admin)
    assert re.search(r'id="on-sync-failing"[^>]* checked', page), page
    assert re.search(rf'id="threshold-sync-failing"[^>]* value="{STREAK}"', page), page
    before = len(hook.requests)

    set_link(proxy, up=False)
    try:
        for count in range(1, STREAK + 2):
            run = sync_now(server)
            assert run["outcome"] == "failed" and run["problem"] == "unreachable", run
            assert sync_status(server)["consecutive_failures"] == count
        # Three failed runs: one alert, at the second.
        document = only(after_a_test_alert(hook, admin, device.secret, before), "sync-failing")
        assert document["subject"] == device.source, document
        failed = f"the sync of {device.source} failed {STREAK} times in a row"
        assert document["message"] == f"{failed} (the last: unreachable)", document
        assert (document["value"], document["threshold"], document["unit"]) == (STREAK, STREAK, "runs"), document
        assert document["title"] == "A sync fails this many times in a row"
        assert document["device"] and document["at"].endswith("Z"), document
        # The page lists it, and its delivery once its outcome is written (just after the receiver answered).
        wait_until(
            "the console lists the alert as delivered",
            lambda: listed(admin, document["message"], "delivered", "HTTP 200 after 1 try"),
        )
    finally:
        set_link(proxy, up=True)

    # The link is back: a run succeeds, which ends the streak (edged sends no "resolved" alert: nothing comes).
    before = len(hook.requests)
    run = sync_now(server)
    assert run["outcome"] == "unchanged", run
    assert sync_status(server)["last_error"] is None
    assert after_a_test_alert(hook, admin, device.secret, before) == []

    # A new streak is counted from the start: its first failure sends nothing, its second a new alert.
    set_link(proxy, up=False)
    try:
        before = len(hook.requests)
        assert sync_now(server)["outcome"] == "failed"
        assert after_a_test_alert(hook, admin, device.secret, before) == []
        before = len(hook.requests)
        assert sync_now(server)["outcome"] == "failed"
        again = only(after_a_test_alert(hook, admin, device.secret, before), "sync-failing")
        assert again["message"] == document["message"] and again["id"] != document["id"], again
    finally:
        set_link(proxy, up=True)
    assert sync_now(server)["outcome"] == "unchanged"


def test_a_synced_update_rolled_back_by_its_probation_sends_an_alert(device: Device, hook: Receiver) -> None:
    server, admin = device.server, device.admin
    set_rule(admin, {"on": "probation-rollback"})
    assert re.search(r'id="on-probation-rollback"[^>]* checked', alerts_page(admin))
    assert not re.search(r'id="on-sync-failing"[^>]* checked', alerts_page(admin))
    wait_until("the last revision is committed", lambda: committed(server))
    before = len(hook.requests)

    config = device.published["add_sub/config.pbtxt"].replace(b"max_batch_size: 8", b"max_batch_size: 4")
    device.s3.put("repo/add_sub/config.pbtxt", config + WARMUP_FROM_A_MISSING_FILE)
    run = sync_now(server)
    assert run["outcome"] == "updated" and "refused" not in run["message"], run
    # The alert fires as the rollback begins, before the revision is held back.
    wait_until("the rollback", lambda: sync_status(server)["held_back"] == [run["revision"]])
    wait_until("the probation ends", lambda: sync_status(server)["phase"] == "idle")

    document = only(after_a_test_alert(hook, admin, device.secret, before), "probation-rollback")
    assert document["subject"] == "add_sub", document
    # It names the revision and the model's own error, as the sync's history does.
    assert document["message"].startswith(
        f"model 'add_sub' was rolled back: revision {run['revision']} synced from {device.source} failed its"
        " probation: "
    ), document
    assert "warmup" in document["message"], document
    assert document["title"] == "A probation rolled an upload or a synced update back"
    assert document["value"] is None and document["threshold"] is None, document
    wait_until(
        "the console lists the alert",
        lambda: listed(admin, document["message"], "delivered", "HTTP 200 after 1 try"),
    )
    # The old config serves on.
    reply = request(server.http_url, "GET", "/v2/models/add_sub/config")
    assert reply.status == 200 and reply.json()["max_batch_size"] == 8, reply.body
