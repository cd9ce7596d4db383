"""Alerts in the daemon: the rules' state (edged.core.alerts.rules) fed by what the daemon observes, the alerts
fired recorded in the state database and delivered to the webhook (edged.core.alerts.webhook).

Nothing here blocks serving. Events come in on the event loop as plain calls (model control's history events, the
sync's runs) and are judged at once, in memory. Gauges (readiness, disk space, temperatures) are looked at by a task
each GAUGE_PERIOD_S; disk and sensors are read in a thread. An alert fired joins a bounded queue (PENDING_MAX; past
it, alerts are dropped and counted), and one task takes them in order: written to the state database in a thread of
its own, then delivered, then its outcome written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, TypeVar

from edged import __version__
from edged.core.alerts.bounds import CONDITIONS_PERIOD_S, FIRED_KEPT, GAUGE_PERIOD_S, PENDING_MAX, RECENT_SHOWN
from edged.core.alerts.rules import SPECS, TEST_KIND, Alert, AlertError, Evaluator, Rule, RuleKind
from edged.core.alerts.webhook import Delivery, WebhookSender, check_url, new_secret
from edged.state.alerts import AlertRuleRecord, AlertWebhookRecord, FiredAlertRecord

if TYPE_CHECKING:
    from edged.core.device_conditions import DeviceConditions
    from edged.state.store import StateStore

log = logging.getLogger("edged.alerts")

_T = TypeVar("_T")
# What a delivery that a stop cut short is recorded as, at the next start.
ABANDONED: Final = "edged stopped before it was delivered"
NO_WEBHOOK: Final = "no webhook was set"


@dataclass(frozen=True, slots=True)
class Gauges:
    """What the gauges read: the service's readiness (and whether the daemon finished starting: a device still
    loading its models is not "not ready" yet), the models that keep it unready, the device's conditions (a
    blocking read: called in a thread)."""

    started: Callable[[], bool]
    ready: Callable[[], bool]
    unready: Callable[[], list[str]]
    conditions: Callable[[], DeviceConditions] | None = None


@dataclass(frozen=True, slots=True)
class WebhookView:
    """The webhook as the console shows it: never its secret."""

    url: str
    set_at: datetime


class Alerts:
    """The alerts of one daemon, over its state database. ``load`` reads the rules and the webhook (at build, before
    any model loads, so that a model failing at start is judged); ``start`` begins the gauges and deliveries."""

    def __init__(
        self,
        store: StateStore,
        *,
        device: str,
        sender: WebhookSender | None = None,
        pending_max: int = PENDING_MAX,
        kept: int = FIRED_KEPT,
        gauge_period_s: float = GAUGE_PERIOD_S,
        conditions_period_s: float = CONDITIONS_PERIOD_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if pending_max < 1 or kept < 1:
            raise ValueError(f"alerts need pending_max >= 1 and kept >= 1, got {pending_max} and {kept}")
        self._store = store
        self._device = device
        self._sender = sender if sender is not None else WebhookSender()
        self._pending_max = pending_max
        self._kept = kept
        self._gauge_period_s = gauge_period_s
        self._conditions_period_s = conditions_period_s
        self._clock = clock
        self._monotonic = monotonic
        self._evaluator = Evaluator(clock)
        self._webhook: AlertWebhookRecord | None = None
        self._gauges: Gauges | None = None
        # Alerts fired and not yet delivered: a deque, not an asyncio.Queue, so that it can be filled before the
        # loop runs the task that empties it (model loads at start) and its length is the bound checked.
        self._pending: deque[Alert] = deque()
        self._wake = asyncio.Event()
        self.dropped = 0
        self._tasks: list[asyncio.Task[None]] = []
        # The state database's writes and reads for alerts, in order, off the event loop.
        self._state = ThreadPoolExecutor(1, thread_name_prefix="edged-alerts")

    # --- life cycle -----------------------------------------------------------------------------------------

    def load(self) -> None:
        """Reads the rules and the webhook; deliveries a stop cut short are recorded as failed. Blocking."""
        kinds = {kind.value: kind for kind in RuleKind}
        self._evaluator.set_rules(
            Rule(kinds[record.kind], record.enabled, record.threshold)
            for record in self._store.alert_rules()
            if record.kind in kinds  # a kind a newer edged knows is left as it is
        )
        self._webhook = self._store.alert_webhook()
        abandoned = self._store.abandon_pending_alerts(ABANDONED)
        if abandoned:
            log.warning("%d alert(s) were not delivered before edged stopped", abandoned)

    def watch(self, gauges: Gauges) -> None:
        self._gauges = gauges

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._deliver_forever(), name="edged-alerts-deliveries")]
        if self._gauges is not None:
            self._tasks.append(asyncio.create_task(self._gauges_forever(self._gauges), name="edged-alerts-gauges"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._sender.close()
        self._state.shutdown(wait=True)
        if self._pending:
            log.warning(
                "%d alert(s) fired were neither recorded nor delivered before edged stopped", len(self._pending)
            )

    @property
    def pending(self) -> int:
        return len(self._pending)

    # --- what the daemon observes (on the event loop; never blocks, never raises) ---------------------------

    def model_event(self, name: str, version: int | None, state: str, source: str, reason: str) -> None:
        """Model control's observer: every history event of a model."""
        self._fire(self._evaluator.model_event(name, version, state, source, reason))

    def run(self, source: str, outcome: str, problem: str | None, transferred: int, seconds: float) -> None:
        """The sync's observer (edged.core.sync_control.SyncObserver): a run ended."""
        self._fire(self._evaluator.sync_run(source, outcome, problem))

    def revision(self, source: str, revision: str) -> None:
        """The sync's observer: nothing to judge in a new revision."""

    def rollback(self, source: str, model: str, revision: str, why: str) -> None:
        """The sync's observer: a synced update failed its probation and was rolled back, or was refused."""
        self._fire(self._evaluator.sync_rollback(source, model, revision, why))

    def _fire(self, alerts: list[Alert]) -> None:
        for alert in alerts:
            if len(self._pending) >= self._pending_max:
                self.dropped += 1
                # Once per overflow, not once per alert: a flood must not flood the log too.
                if (self.dropped - 1) % self._pending_max == 0:
                    log.warning(
                        "alert dropped: %d deliveries are pending already (%d dropped since start): %s",
                        len(self._pending),
                        self.dropped,
                        alert.message,
                    )
                continue
            log.warning("alert: %s", alert.message)
            self._pending.append(alert)
            self._wake.set()

    # --- the console's calls --------------------------------------------------------------------------------

    def rules(self) -> list[Rule]:
        return self._evaluator.rules()

    async def set_rules(self, changes: dict[RuleKind, tuple[bool, float | None]]) -> list[Rule]:
        """Sets these rules (on or off, and their thresholds), stored first; the rules that changed."""
        changed = [
            Rule(kind, enabled, threshold if threshold is not None else self._evaluator.rule(kind).threshold)
            for kind, (enabled, threshold) in changes.items()
        ]
        for rule in changed:
            if rule.enabled and rule.spec.unit is not None and rule.threshold is None:
                raise AlertError(f"{rule.spec.title}: a rule turned on needs its threshold")
        changed = [rule for rule in changed if rule != self._evaluator.rule(rule.kind)]
        if changed:
            now = self._clock()
            records = [AlertRuleRecord(rule.kind.value, rule.enabled, rule.threshold, now) for rule in changed]
            await self._in_state(self._store.set_alert_rules, records)
            self._evaluator.set_rules(changed)
        return changed

    def webhook(self) -> WebhookView | None:
        found = self._webhook
        return None if found is None else WebhookView(found.url, found.set_at)

    async def set_webhook(self, url: str) -> str:
        """Sets the webhook to ``url`` (AlertError when it cannot be one) with a new secret, which is returned: the
        one time it is shown."""
        record = AlertWebhookRecord(check_url(url), new_secret(), self._clock())
        await self._in_state(self._store.set_alert_webhook, record)
        self._webhook = record
        return record.secret

    async def remove_webhook(self) -> bool:
        """False when none was set."""
        if self._webhook is None:
            return False
        await self._in_state(self._store.set_alert_webhook, None)
        self._webhook = None
        return True

    def send_test(self, user: str) -> None:
        """An alert of no rule, to check the webhook and its signature."""
        self._fire([Alert(TEST_KIND, "webhook", f"a test alert, sent by {user} from the console", self._clock())])

    async def recent(self, limit: int = RECENT_SHOWN) -> list[FiredAlertRecord]:
        found: list[FiredAlertRecord] = await self._in_state(self._store.fired_alerts, limit)
        return found

    # --- the tasks ------------------------------------------------------------------------------------------

    async def _deliver_forever(self) -> None:
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            alert = self._pending[0]
            try:
                await self._record_and_deliver(alert)
            except Exception:
                log.exception("alert %r could not be recorded or delivered", alert.message)
            finally:
                # Taken off only now: until its outcome is known, it counts against PENDING_MAX.
                self._pending.popleft()

    async def _record_and_deliver(self, alert: Alert) -> None:
        webhook = self._webhook
        record = FiredAlertRecord(
            alert.at,
            alert.kind,
            alert.subject,
            alert.message,
            "pending" if webhook is not None else "unsent",
            "" if webhook is not None else NO_WEBHOOK,
            0,
        )
        alert_id: int = await self._in_state(self._store.add_fired_alert, record, self._kept)
        if webhook is None:
            return
        body = self.payload(alert, alert_id)
        outcome: Delivery = await self._sender.deliver(webhook.url, webhook.secret, str(alert_id), body)
        if outcome.delivered:
            log.info("alert %d delivered to the webhook: %s", alert_id, outcome.detail)
        else:
            log.warning("alert %d not delivered to the webhook: %s", alert_id, outcome.detail)
        delivery = "delivered" if outcome.delivered else "failed"
        await self._in_state(self._store.set_alert_delivery, alert_id, delivery, outcome.detail, outcome.tries)

    def payload(self, alert: Alert, alert_id: int) -> bytes:
        """The JSON body of a delivery: compact, keys sorted, so the signed bytes are the same however built."""
        spec = SPECS[RuleKind(alert.kind)] if alert.kind != TEST_KIND else None
        document: dict[str, Any] = {
            "id": alert_id,
            "rule": alert.kind,
            "title": spec.title if spec is not None else "Test alert",
            "subject": alert.subject,
            "message": alert.message,
            "value": alert.value,
            "threshold": alert.threshold,
            "unit": spec.unit if spec is not None else None,
            "at": alert.at.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "device": self._device,
            "edged_version": __version__,
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    async def _gauges_forever(self, gauges: Gauges) -> None:
        last_conditions = -float("inf")
        while True:
            await asyncio.sleep(self._gauge_period_s)
            try:
                if not gauges.started():
                    continue
                self._fire(self._evaluator.readiness(gauges.ready(), self._monotonic(), gauges.unready))
                now = self._monotonic()
                if (
                    gauges.conditions is not None
                    and self._evaluator.watches_conditions()
                    and now - last_conditions >= self._conditions_period_s
                ):
                    last_conditions = now
                    found = await asyncio.to_thread(gauges.conditions)
                    self._fire(self._evaluator.conditions(found))
            except Exception:
                log.exception("the alert rules could not be evaluated")

    async def _in_state(self, call: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._state, call, *args)
