"""The alert rules' evaluation, the webhook's URL check, signature and retries against a real receiver on
127.0.0.1, and every bound of edged.core.alerts.bounds pushed past: a receiver that never answers or answers a byte
at a time, a flood of alerts, more alerts than the state database keeps."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from webhook_receiver import Receiver, receiver

from edged.core.alerts import bounds
from edged.core.alerts.engine import ABANDONED, NO_WEBHOOK, Alerts, Gauges
from edged.core.alerts.rules import AlertError, Evaluator, Rule, RuleKind, parse_threshold
from edged.core.alerts.webhook import Delivery, DeliveryLimits, WebhookSender, check_url, signature
from edged.core.device_conditions import DeviceConditions, DiskSpace
from edged.core.sensors import Temperature
from edged.state.alerts import FiredAlertRecord
from edged.state.store import StateStore

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _evaluator(*rules: Rule) -> Evaluator:
    evaluator = Evaluator(lambda: AT)
    evaluator.set_rules(rules)
    return evaluator


# --- the rules -----------------------------------------------------------------------------------------------


def test_a_model_unavailable_fires_each_time_only_while_the_rule_is_on() -> None:
    evaluator = _evaluator()
    assert evaluator.model_event("broken", 1, "UNAVAILABLE", "api", "dims must be > 0") == []
    evaluator.set_rules([Rule(RuleKind.MODEL_UNAVAILABLE, True)])
    [alert] = evaluator.model_event("broken", 1, "UNAVAILABLE", "api", "dims must be > 0")
    assert (alert.kind, alert.subject, alert.at) == ("model-unavailable", "broken", AT)
    assert alert.message == "model 'broken' version 1 is UNAVAILABLE: dims must be > 0"
    assert (
        len(evaluator.model_event("broken", None, "UNAVAILABLE", "poll", "x" * 5000)[0].message) == bounds.MESSAGE_MAX
    )
    assert evaluator.model_event("broken", 1, "READY", "api", "") == []
    assert evaluator.model_event("broken", 1, "UNLOADED", "api", "unloaded") == []


def test_a_probation_rollback_fires_for_an_upload_removed_by_its_probation_and_a_synced_rollback() -> None:
    evaluator = _evaluator(Rule(RuleKind.PROBATION_ROLLBACK, True))
    [alert] = evaluator.model_event("m", 2, "UPLOAD_REMOVED", "probation", "it failed its probation: errors")
    assert alert.kind == "probation-rollback" and "failed its probation" in alert.message
    # Removed by someone (the API's delete), not by a probation: no alert.
    assert evaluator.model_event("m", 2, "UPLOAD_REMOVED", "api", "deleted") == []
    [synced] = evaluator.sync_rollback("s3://bucket/repo", "m", "r7", "failed its probation: warmup failed")
    assert synced.subject == "m"
    assert synced.message == (
        "model 'm' was rolled back: revision r7 synced from s3://bucket/repo failed its probation: warmup failed"
    )
    evaluator.set_rules([Rule(RuleKind.PROBATION_ROLLBACK, False)])
    assert evaluator.sync_rollback("s3://bucket/repo", "m", "r7", "failed its probation: warmup failed") == []


def test_a_sync_failing_fires_once_per_streak_of_n() -> None:
    evaluator = _evaluator(Rule(RuleKind.SYNC_FAILING, True, 3))
    source = "s3://bucket/repo"
    assert evaluator.sync_run(source, "failed", "unreachable") == []
    assert evaluator.sync_run(source, "failed", "unreachable") == []
    [alert] = evaluator.sync_run(source, "failed", "unreachable")
    assert alert.value == 3 and alert.threshold == 3 and "3 times in a row" in alert.message
    assert evaluator.sync_run(source, "failed", "unreachable") == []  # the same streak
    assert evaluator.sync_run("gs://other/repo", "failed", None) == []  # counted per source
    assert evaluator.sync_run(source, "unchanged", None) == []  # the streak ends
    assert [evaluator.sync_run(source, "failed", "denied") for _ in range(3)][-1] != []


def test_a_sync_rule_turned_on_during_a_streak_sees_it_whole() -> None:
    evaluator = _evaluator()
    for _ in range(4):
        assert evaluator.sync_run("s3://b/r", "failed", "timeout") == []
    evaluator.set_rules([Rule(RuleKind.SYNC_FAILING, True, 2)])
    [alert] = evaluator.sync_run("s3://b/r", "failed", "timeout")
    assert alert.value == 5


def test_not_ready_fires_once_after_n_seconds_and_again_only_after_being_ready() -> None:
    evaluator = _evaluator(Rule(RuleKind.NOT_READY, True, 2))
    asked: list[int] = []

    def unready() -> list[str]:
        asked.append(1)
        return ["model 'broken' is UNAVAILABLE"]

    assert evaluator.readiness(False, 100.0, unready) == []
    assert evaluator.readiness(False, 101.9, unready) == []
    [alert] = evaluator.readiness(False, 102.0, unready)
    assert alert.message == "the device has not been ready for 2 s: model 'broken' is UNAVAILABLE"
    assert evaluator.readiness(False, 500.0, unready) == []
    assert len(asked) == 1  # asked only when it fires
    assert evaluator.readiness(True, 501.0, unready) == []
    assert evaluator.readiness(False, 502.0, unready) == []
    assert len(evaluator.readiness(False, 504.0, unready)) == 1
    # A new threshold re-arms the rule: judged afresh against the same unready spell.
    evaluator.set_rules([Rule(RuleKind.NOT_READY, True, 1)])
    assert len(evaluator.readiness(False, 505.0, unready)) == 1


def test_disk_and_temperature_fire_when_their_condition_begins_per_subject() -> None:
    evaluator = _evaluator(Rule(RuleKind.DISK_LOW, True, 10), Rule(RuleKind.TEMPERATURE, True, 80))
    assert evaluator.watches_conditions()

    def found(state_free: int, repo_free: int, celsius: float) -> DeviceConditions:
        disks = (
            DiskSpace("state directory", "/var/lib/edged", state_free, 100),
            DiskSpace("model repository", "/models", repo_free, 100),
            DiskSpace("model repository", "/gone", None, None),  # unreadable: never an alert
        )
        return DeviceConditions(disks, (Temperature("thermal_zone0", "cpu-thermal", celsius),))

    alerts = evaluator.conditions(found(5, 50, 90.5))
    assert sorted((a.kind, a.subject) for a in alerts) == [
        ("disk-low", "/var/lib/edged"),
        ("temperature", "thermal_zone0"),
    ]
    assert "5.0% free on the disk of the state directory /var/lib/edged, below 10%" in alerts[0].message
    assert evaluator.conditions(found(5, 50, 90.5)) == []  # still so: no second alert
    [repo] = evaluator.conditions(found(5, 9, 70))
    assert repo.subject == "/models"
    assert evaluator.conditions(found(50, 50, 70)) == []  # all well again: re-armed
    assert len(evaluator.conditions(found(5, 50, 81))) == 2
    # 100%: any disk that is not empty is below it.
    evaluator.set_rules([Rule(RuleKind.DISK_LOW, True, 100), Rule(RuleKind.TEMPERATURE, False, 80)])
    assert {a.subject for a in evaluator.conditions(found(99, 99, 200))} == {"/var/lib/edged", "/models"}


@pytest.mark.parametrize(
    ("kind", "text", "problem"),
    [
        (RuleKind.NOT_READY, "abc", "a whole number from 1 to 86400"),
        (RuleKind.NOT_READY, "1.5", "not 1.5"),
        (RuleKind.NOT_READY, "0", "not 0"),
        (RuleKind.DISK_LOW, "nan", "not nan"),
        (RuleKind.DISK_LOW, "inf", "not inf"),
        (RuleKind.DISK_LOW, "100.5", "not 100.5"),
        (RuleKind.TEMPERATURE, "", "a number from 0 to 250"),
        (RuleKind.SYNC_FAILING, "1e9", "not 1e9"),
    ],
)
def test_thresholds_out_of_range_are_refused(kind: RuleKind, text: str, problem: str) -> None:
    with pytest.raises(AlertError, match=problem):
        parse_threshold(kind, text)


def test_thresholds_in_range_are_taken() -> None:
    assert parse_threshold(RuleKind.DISK_LOW, " 12.5 ") == 12.5
    assert parse_threshold(RuleKind.NOT_READY, "1") == 1
    assert parse_threshold(RuleKind.MODEL_UNAVAILABLE, "anything") is None


# --- the webhook ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("", "empty"),
        ("ftp://example.net/hook", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("javascript:alert(1)", "http:// or https://"),
        ("example.net/hook", "http:// or https://"),
        ("http:///hook", "no host"),
        ("https://user:pw@example.net/hook", "user name or password"),
        ("https://example.net/hook#x", "fragment"),
        ("https://example.net:99999/", "cannot be read"),
        ("https://example.net/a b", "space or a control character"),
        ("https://example.net/\r\nX-Injected: 1", "space or a control character"),
        ("https://example.net/" + "a" * bounds.URL_MAX, f"longer than {bounds.URL_MAX}"),
    ],
)
def test_webhook_urls_other_than_http_and_https_are_refused(url: str, problem: str) -> None:
    with pytest.raises(AlertError, match=problem):
        check_url(url)


def test_webhook_urls_that_are_http_or_https_are_taken() -> None:
    assert check_url(" https://alerts.example.net/edged?key=abc ") == "https://alerts.example.net/edged?key=abc"
    assert check_url("HTTP://127.0.0.1:9000/") == "HTTP://127.0.0.1:9000/"


def _deliver(sender: WebhookSender, url: str, body: bytes = b'{"id":1}') -> Delivery:
    return asyncio.run(sender.deliver(url, "s3cret", "1", body))


def _no_wait(limits: DeliveryLimits) -> WebhookSender:
    async def sleep(_: float) -> None:
        pass

    return WebhookSender(limits, sleep=sleep)


def test_a_delivery_is_signed_and_retried_after_a_500() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    with receiver() as received:
        received.statuses = [500, 503]
        outcome = _deliver(WebhookSender(sleep=sleep), received.url)
        first, second, third = received.wait_for(3)
    assert outcome == Delivery(True, 3, "HTTP 200 after 3 tries")
    assert waits == list(bounds.BACKOFF_S[:2])
    for request in (first, second, third):
        assert request.path == "/hook?team=edge" and request.body == b'{"id":1}'
        assert request.signed_by("s3cret") and not request.signed_by("another")
        assert request.headers["x-edged-delivery"] == "1"
        assert request.headers["content-type"] == "application/json"
    assert signature("s3cret", first.headers["x-edged-timestamp"], first.body) == first.headers["x-edged-signature"]


def test_a_refusal_is_not_retried() -> None:
    with receiver() as received:
        received.statuses = [404]
        outcome = _deliver(_no_wait(DeliveryLimits()), received.url)
        assert len(received.wait_for(1)) == 1
    assert outcome == Delivery(False, 1, "HTTP 404, not retried: the receiver refused it")


def test_a_receiver_that_is_gone_is_tried_the_bounded_number_of_times() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens on it once closed
    outcome = _deliver(_no_wait(DeliveryLimits()), f"http://127.0.0.1:{port}/hook")
    assert outcome == Delivery(False, bounds.TRIES, f"connection refused ({bounds.TRIES} tries)")


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket], threading.Event]]:
    """Accepts connections and says nothing, or a byte now and then when told to drip: a receiver that never
    finishes answering."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    drip = threading.Event()
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])
            if drip.is_set():
                for connection in accepted:
                    # Never a whole status line: each byte keeps a plain socket timeout from ever firing.
                    with contextlib.suppress(OSError):
                        connection.send(b"H")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook", accepted, drip
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        listener.close()


@pytest.mark.parametrize("drip", [False, True], ids=["silent", "a byte at a time"])
def test_a_receiver_that_never_answers_is_cut_off_at_each_try_deadline(
    silent_server: tuple[str, list[socket.socket], threading.Event], drip: bool
) -> None:
    url, accepted, dripping = silent_server
    if drip:
        dripping.set()
    limits = DeliveryLimits(tries=3, backoff_s=(), try_timeout_s=0.3)
    outcome = _deliver(_no_wait(limits), url)
    # Returning at all is the bound: without the deadline, a dripping receiver would hold the try for ever.
    assert outcome == Delivery(False, 3, "no answer within 0.3 s (3 tries)")
    assert len(accepted) == 3


# --- the engine and its bounds --------------------------------------------------------------------------------


class _StuckSender(WebhookSender):
    """A receiver that does not answer until told to: every delivery waits on ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.bodies: list[bytes] = []

    async def deliver(self, url: str, secret: str, delivery_id: str, body: bytes) -> Delivery:
        self.bodies.append(body)
        await self.release.wait()
        return Delivery(True, 1, "HTTP 200 after 1 try")


def test_a_flood_of_alerts_stays_within_the_pending_bound_and_the_kept_bound(tmp_path: Path) -> None:
    async def flood() -> None:
        with StateStore.open(tmp_path) as store:
            sender = _StuckSender()
            alerts = Alerts(store, device="edge-1", sender=sender, pending_max=8, kept=5, clock=lambda: AT)
            alerts.load()
            await alerts.set_rules({RuleKind.MODEL_UNAVAILABLE: (True, None)})
            await alerts.set_webhook("http://127.0.0.1:9/hook")
            await alerts.start()
            fired = 10 * 8
            for n in range(fired):
                alerts.model_event(f"m{n}", 1, "UNAVAILABLE", "poll", "broken")
                assert alerts.pending <= 8
            assert (alerts.pending, alerts.dropped) == (8, fired - 8)
            # The event loop is not held: other work runs while every delivery waits.
            await asyncio.wait_for(asyncio.sleep(0), timeout=30)
            sender.release.set()
            while alerts.pending:
                await asyncio.sleep(0.01)
            recent = await alerts.recent(100)
            await alerts.stop()
        assert len(recent) == 5  # kept: the newest five of the eight recorded
        assert [alert.message for alert in recent] == [
            f"model 'm{n}' version 1 is UNAVAILABLE: broken" for n in range(7, 2, -1)
        ]
        assert {alert.delivery for alert in recent} == {"delivered"}
        assert len(sender.bodies) == 8

    asyncio.run(flood())


def test_alerts_without_a_webhook_are_recorded_unsent_and_a_stop_leaves_none_pending(tmp_path: Path) -> None:
    async def run() -> list[FiredAlertRecord]:
        with StateStore.open(tmp_path) as store:
            ready = threading.Event()
            alerts = Alerts(store, device="edge-1", gauge_period_s=0.01)
            alerts.load()
            await alerts.set_rules({RuleKind.NOT_READY: (True, 1.0)})
            alerts.watch(Gauges(started=lambda: True, ready=ready.is_set, unready=lambda: ["model 'a' is LOADING"]))
            await alerts.start()
            while not (found := await alerts.recent(10)):
                await asyncio.sleep(0.01)
            await alerts.stop()
            return found

    [alert] = asyncio.run(run())
    assert (alert.kind, alert.delivery, alert.detail) == ("not-ready", "unsent", NO_WEBHOOK)
    assert alert.message.startswith("the device has not been ready for ") and "model 'a' is LOADING" in alert.message


def test_deliveries_a_stop_cut_short_are_failed_at_the_next_start(tmp_path: Path) -> None:
    with StateStore.open(tmp_path) as store:
        store.add_fired_alert(FiredAlertRecord(AT, "test", "webhook", "cut short", "pending", "", 1), keep=10)
        Alerts(store, device="edge-1").load()
        [alert] = store.fired_alerts(10)
    assert (alert.delivery, alert.detail) == ("failed", ABANDONED)


def test_the_payload_is_compact_sorted_json(tmp_path: Path) -> None:
    import json

    from edged.core.alerts.rules import Alert

    with StateStore.open(tmp_path) as store:
        alerts = Alerts(store, device="edge-1")
        body = alerts.payload(Alert("disk-low", "/var", "1.0% free", AT, 1.0, 10.0), 7)
    document = json.loads(body)
    assert document == {
        "id": 7, "rule": "disk-low", "title": "Free disk space below", "subject": "/var", "message": "1.0% free",
        "value": 1.0, "threshold": 10.0, "unit": "%", "at": "2026-03-01T12:00:00Z", "device": "edge-1",
        "edged_version": document["edged_version"],
    }  # fmt: skip
    assert body == json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def test_a_rule_turned_on_needs_its_threshold(tmp_path: Path) -> None:
    async def run() -> None:
        with StateStore.open(tmp_path) as store:
            alerts = Alerts(store, device="edge-1")
            with pytest.raises(AlertError, match="needs its threshold"):
                await alerts.set_rules({RuleKind.DISK_LOW: (True, None)})
            assert await alerts.set_rules({RuleKind.DISK_LOW: (True, 5.0)}) == [Rule(RuleKind.DISK_LOW, True, 5.0)]
            assert await alerts.set_rules({RuleKind.DISK_LOW: (False, None)}) == [Rule(RuleKind.DISK_LOW, False, 5.0)]
            await alerts.stop()
            reloaded = Alerts(store, device="edge-1")
            reloaded.load()
            assert reloaded.rules()[list(RuleKind).index(RuleKind.DISK_LOW)] == Rule(RuleKind.DISK_LOW, False, 5.0)

    asyncio.run(run())


def test_the_test_receiver_holds_a_request_unanswered_when_told() -> None:
    # The e2e tests lean on the receiver: it must hold a request unanswered when told to.
    with receiver() as received:
        assert isinstance(received, Receiver)
        received.hang = True
        sender = _no_wait(DeliveryLimits(tries=1, backoff_s=(), try_timeout_s=0.2))
        assert _deliver(sender, received.url).detail == "no answer within 0.2 s (1 try)"
        assert len(received.wait_for(1)) == 1


def test_the_console_documentation_states_the_bounds() -> None:
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "console.md").read_text(encoding="utf-8").split())
    waits = ", ".join(f"{w:g}" for w in bounds.BACKOFF_S[:-1]) + f" and {bounds.BACKOFF_S[-1]:g} s apart"
    for stated in (
        f"tried at most {bounds.TRIES} times, {bounds.TRY_TIMEOUT_S:g} s each, {waits}",
        f"at most {bounds.PENDING_MAX} alerts wait for delivery",
        f"the last {bounds.FIRED_KEPT} are kept",
    ):
        assert stated in text, stated
