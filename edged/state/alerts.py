"""The state database's side of alerts (edged.core.alerts): the rules an admin set, the webhook, the alerts fired
(tables in edged.state.schema)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy import delete, insert, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from edged.state import schema
from edged.state.records import Records, inserted_id

_RULES: Final = schema.alert_rules
_WEBHOOK: Final = schema.alert_webhook
_FIRED: Final = schema.alerts_fired
# The one webhook row's id (a CHECK holds it so).
_WEBHOOK_ID: Final = 1


@dataclass(frozen=True, slots=True)
class AlertRuleRecord:
    kind: str
    enabled: bool
    threshold: float | None
    changed_at: datetime  # tz-aware, UTC


@dataclass(frozen=True, slots=True)
class AlertWebhookRecord:
    url: str
    secret: str
    set_at: datetime  # tz-aware, UTC


@dataclass(frozen=True, slots=True)
class FiredAlertRecord:
    """An alert as the console lists it (``id`` 0 before it is stored)."""

    at: datetime  # tz-aware, UTC
    kind: str
    subject: str
    message: str
    delivery: str  # pending, delivered, failed, unsent
    detail: str
    tries: int
    id: int = 0


_FIRED_COLUMNS: Final = (
    _FIRED.c.at,
    _FIRED.c.kind,
    _FIRED.c.subject,
    _FIRED.c.message,
    _FIRED.c.delivery,
    _FIRED.c.detail,
    _FIRED.c.tries,
    _FIRED.c.id,
)


class AlertRecords(Records):
    """Alert rules, the webhook and the alerts fired; mixed into edged.state.store.StateStore."""

    def alert_rules(self) -> list[AlertRuleRecord]:
        with self._transaction(write=False) as connection:
            rows = connection.execute(select(_RULES).order_by(_RULES.c.kind)).mappings()
            return [AlertRuleRecord(**row) for row in rows]

    def set_alert_rules(self, rules: list[AlertRuleRecord]) -> None:
        """Replaces the rules of these kinds, all in one transaction (a form saves them together)."""
        with self._transaction(write=True) as connection:
            for rule in rules:
                upsert = sqlite_insert(_RULES).values(
                    kind=rule.kind, enabled=rule.enabled, threshold=rule.threshold, changed_at=rule.changed_at
                )
                connection.execute(
                    upsert.on_conflict_do_update(
                        index_elements=[_RULES.c.kind],
                        set_={
                            "enabled": upsert.excluded.enabled,
                            "threshold": upsert.excluded.threshold,
                            "changed_at": upsert.excluded.changed_at,
                        },
                    )
                )

    def alert_webhook(self) -> AlertWebhookRecord | None:
        with self._transaction(write=False) as connection:
            row = (
                connection.execute(
                    select(_WEBHOOK.c.url, _WEBHOOK.c.secret, _WEBHOOK.c.set_at).where(_WEBHOOK.c.id == _WEBHOOK_ID)
                )
                .mappings()
                .first()
            )
            return None if row is None else AlertWebhookRecord(**row)

    def set_alert_webhook(self, webhook: AlertWebhookRecord | None) -> None:
        """Sets the webhook (its URL and a new secret), or removes it (None)."""
        with self._transaction(write=True) as connection:
            connection.execute(delete(_WEBHOOK))
            if webhook is not None:
                connection.execute(
                    insert(_WEBHOOK).values(
                        id=_WEBHOOK_ID, url=webhook.url, secret=webhook.secret, set_at=webhook.set_at
                    )
                )

    def add_fired_alert(self, alert: FiredAlertRecord, keep: int) -> int:
        """Stores an alert and drops those older than the newest ``keep``; returns its id."""
        if keep < 1:
            raise ValueError(f"at least one fired alert must be kept, got {keep}")
        with self._transaction(write=True) as connection:
            alert_id = inserted_id(
                connection.execute(
                    insert(_FIRED).values(
                        at=alert.at,
                        kind=alert.kind,
                        subject=alert.subject,
                        message=alert.message,
                        delivery=alert.delivery,
                        detail=alert.detail,
                        tries=alert.tries,
                    )
                )
            )
            # Ids only grow (AUTOINCREMENT): one range delete on the primary key, on every insert, keeps the table
            # at ``keep`` rows whatever fired before.
            connection.execute(delete(_FIRED).where(_FIRED.c.id <= alert_id - keep))
            return alert_id

    def set_alert_delivery(self, alert_id: int, delivery: str, detail: str, tries: int) -> None:
        """What became of an alert's delivery (a row pruned meanwhile is left gone)."""
        with self._transaction(write=True) as connection:
            connection.execute(
                update(_FIRED).where(_FIRED.c.id == alert_id).values(delivery=delivery, detail=detail, tries=tries)
            )

    def abandon_pending_alerts(self, detail: str) -> int:
        """Marks the alerts still pending as failed with ``detail`` (a daemon that stopped before it delivered
        them); returns how many."""
        with self._transaction(write=True) as connection:
            result = connection.execute(
                update(_FIRED).where(_FIRED.c.delivery == "pending").values(delivery="failed", detail=detail)
            )
            return result.rowcount

    def fired_alerts(self, limit: int) -> list[FiredAlertRecord]:
        """The newest ``limit`` alerts, newest first."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        with self._transaction(write=False) as connection:
            rows = connection.execute(select(*_FIRED_COLUMNS).order_by(_FIRED.c.id.desc()).limit(limit)).mappings()
            return [FiredAlertRecord(**row) for row in rows]
