"""The alert rules and their evaluation: a plain state machine fed with what the daemon observes (model events,
sync runs, readiness, disk space, temperatures) that answers with the alerts to fire. No I/O and no clock of its
own, so each rule is tested by feeding it (tests/unit/test_alerts.py).

Events (a model UNAVAILABLE, a probation rollback) fire each time. Gauges fire once when their condition begins, per
subject (each disk, each sensor), and again only after it ended: a disk that stays full is one alert, not one a
second. Changing a rule re-arms it, so a new threshold is judged afresh.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from edged.core.alerts.bounds import MESSAGE_MAX

if TYPE_CHECKING:
    from edged.core.device_conditions import DeviceConditions


class AlertError(ValueError):
    """A rule or webhook refused: the message says why, for the admin who entered it."""


class RuleKind(enum.StrEnum):
    NOT_READY = "not-ready"
    MODEL_UNAVAILABLE = "model-unavailable"
    PROBATION_ROLLBACK = "probation-rollback"
    SYNC_FAILING = "sync-failing"
    DISK_LOW = "disk-low"
    TEMPERATURE = "temperature"


# The kind of the alert an admin sends to check the webhook; no rule.
TEST_KIND: Final = "test"


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """What a rule watches, and its threshold's unit and range (None: the rule has no threshold)."""

    kind: RuleKind
    title: str
    unit: str | None = None
    low: float = 0.0
    high: float = 0.0
    default: float | None = None
    whole: bool = False  # the threshold is a whole number

    def describe(self, threshold: float | None) -> str:
        if self.unit is None or threshold is None:
            return self.title
        return f"{self.title}: {number(threshold)} {self.unit}"


SPECS: Final = {
    spec.kind: spec
    for spec in (
        RuleSpec(RuleKind.NOT_READY, "The device is not ready for", "s", 1, 86_400, 60, whole=True),
        RuleSpec(RuleKind.MODEL_UNAVAILABLE, "A model is UNAVAILABLE (a load failed)"),
        RuleSpec(RuleKind.PROBATION_ROLLBACK, "A probation rolled an upload or a synced update back"),
        RuleSpec(RuleKind.SYNC_FAILING, "A sync fails this many times in a row", "runs", 1, 1000, 3, whole=True),
        RuleSpec(RuleKind.DISK_LOW, "Free disk space below", "%", 0.1, 100, 10),
        RuleSpec(RuleKind.TEMPERATURE, "A temperature above", "°C", 0, 250, 85),
    )
}


@dataclass(frozen=True, slots=True)
class Rule:
    kind: RuleKind
    enabled: bool = False
    threshold: float | None = None

    @property
    def spec(self) -> RuleSpec:
        return SPECS[self.kind]


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert fired: which rule (or TEST_KIND), about what (a model, a disk's path, a sensor, a sync source),
    in words, with the value seen and the rule's threshold where it has them."""

    kind: str
    subject: str
    message: str
    at: datetime  # tz-aware, UTC
    value: float | None = None
    threshold: float | None = None


def parse_threshold(kind: RuleKind, text: str) -> float | None:
    """The threshold typed for ``kind``, checked against its range; None for a kind without one."""
    spec = SPECS[kind]
    if spec.unit is None:
        return None
    text = text.strip()
    wanted = f"{'a whole number' if spec.whole else 'a number'} from {number(spec.low)} to {number(spec.high)}"
    try:
        value = float(text)
    except ValueError:
        raise AlertError(f"{spec.title}: the threshold is {wanted} ({spec.unit})") from None
    if not math.isfinite(value) or not spec.low <= value <= spec.high or (spec.whole and not value.is_integer()):
        raise AlertError(f"{spec.title}: the threshold is {wanted} ({spec.unit}), not {text}")
    return value


def number(value: float) -> str:
    """12 rather than 12.0; 12.5 as it is."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 1] + "…"


class Evaluator:
    """The rules' state: which are on, the sync failure streaks, since when the device is unready, which gauge
    conditions fired already. Every method returns the alerts to fire (often none)."""

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock
        self._rules: dict[RuleKind, Rule] = {kind: Rule(kind) for kind in RuleKind}
        self._streaks: dict[str, int] = {}  # sync source -> failed runs in a row
        self._streak_fired: set[str] = set()
        self._unready_since: float | None = None
        self._unready_fired = False
        self._gauges_fired: dict[RuleKind, set[str]] = {RuleKind.DISK_LOW: set(), RuleKind.TEMPERATURE: set()}

    # --- the rules ------------------------------------------------------------------------------------------

    def rules(self) -> list[Rule]:
        return [self._rules[kind] for kind in RuleKind]

    def rule(self, kind: RuleKind) -> Rule:
        return self._rules[kind]

    def set_rules(self, rules: Iterable[Rule]) -> None:
        """Takes these rules; each one that changed is re-armed (judged afresh from the next observation)."""
        for rule in rules:
            if self._rules[rule.kind] == rule:
                continue
            self._rules[rule.kind] = rule
            if rule.kind is RuleKind.NOT_READY:
                self._unready_fired = False
            elif rule.kind is RuleKind.SYNC_FAILING:
                self._streak_fired.clear()
            elif rule.kind in self._gauges_fired:
                self._gauges_fired[rule.kind].clear()

    def watches_conditions(self) -> bool:
        """Whether disk space or temperatures need reading."""
        return self._on(RuleKind.DISK_LOW) is not None or self._on(RuleKind.TEMPERATURE) is not None

    def _on(self, kind: RuleKind) -> Rule | None:
        rule = self._rules[kind]
        return rule if rule.enabled else None

    def _alert(self, rule: Rule, subject: str, message: str, value: float | None = None) -> Alert:
        return Alert(rule.kind.value, subject, _clip(message), self._clock(), value, rule.threshold)

    # --- events ---------------------------------------------------------------------------------------------

    def model_event(self, name: str, version: int | None, state: str, source: str, reason: str) -> list[Alert]:
        """A model's history event (edged.core.repository.control): a failed load is UNAVAILABLE; an upload that
        failed its probation is removed again (UPLOAD_REMOVED, by the probation)."""
        what = f"model '{name}'" if version is None else f"model '{name}' version {version}"
        if state == "UNAVAILABLE" and (rule := self._on(RuleKind.MODEL_UNAVAILABLE)) is not None:
            return [self._alert(rule, name, f"{what} is UNAVAILABLE: {reason or 'no reason given'}")]
        if (
            state == "UPLOAD_REMOVED"
            and source == "probation"
            and (rule := self._on(RuleKind.PROBATION_ROLLBACK)) is not None
        ):
            return [self._alert(rule, name, f"{what}: {reason}")]
        return []

    def sync_run(self, source: str, outcome: str, problem: str | None) -> list[Alert]:
        """A sync run of ``source`` ended; failed runs in a row are counted whether the rule is on or not, so that
        a rule turned on during a streak sees it whole."""
        if outcome != "failed":
            self._streaks.pop(source, None)
            self._streak_fired.discard(source)
            return []
        count = self._streaks[source] = self._streaks.get(source, 0) + 1
        rule = self._on(RuleKind.SYNC_FAILING)
        if rule is None or rule.threshold is None or count < rule.threshold or source in self._streak_fired:
            return []
        self._streak_fired.add(source)
        why = f" (the last: {problem})" if problem else ""
        return [self._alert(rule, source, f"the sync of {source} failed {count} times in a row{why}", count)]

    def sync_rollback(self, source: str, model: str, revision: str, why: str) -> list[Alert]:
        """A synced update of ``model`` (in ``revision``) failed its probation and was rolled back, or was refused
        before the switch; ``why`` says which, with the model's error."""
        rule = self._on(RuleKind.PROBATION_ROLLBACK)
        if rule is None:
            return []
        message = f"model '{model}' was rolled back: revision {revision} synced from {source} {why}"
        return [self._alert(rule, model, message)]

    # --- gauges ---------------------------------------------------------------------------------------------

    def readiness(self, ready: bool, monotonic: float, unready: Callable[[], list[str]]) -> list[Alert]:
        """The device's readiness now (``monotonic``: a steady clock, in seconds); ``unready``: what keeps it so,
        asked only when the alert fires."""
        if ready:
            self._unready_since, self._unready_fired = None, False
            return []
        if self._unready_since is None:
            self._unready_since = monotonic
        rule = self._on(RuleKind.NOT_READY)
        if rule is None or rule.threshold is None or self._unready_fired:
            return []
        seconds = monotonic - self._unready_since
        if seconds < rule.threshold:
            return []
        self._unready_fired = True
        reasons = unready()
        why = f": {'; '.join(reasons)}" if reasons else ""
        return [
            self._alert(rule, "device", f"the device has not been ready for {number(round(seconds))} s{why}", seconds)
        ]

    def conditions(self, found: DeviceConditions) -> list[Alert]:
        """Disk space and temperatures as read now."""
        alerts: list[Alert] = []
        if (rule := self._on(RuleKind.DISK_LOW)) is not None and rule.threshold is not None:
            low: dict[str, tuple[float, str]] = {}
            for disk in found.disks:
                if disk.free_bytes is not None and disk.total_bytes:
                    percent = 100 * disk.free_bytes / disk.total_bytes
                    if percent < rule.threshold:
                        low[disk.path] = (percent, disk.role)
            alerts += self._edges(
                rule,
                {
                    path: (
                        percent,
                        f"{percent:.1f}% free on the disk of the {role} {path}, below {number(rule.threshold)}%",
                    )
                    for path, (percent, role) in low.items()
                },
            )
        if (rule := self._on(RuleKind.TEMPERATURE)) is not None and rule.threshold is not None:
            hot = {
                sensor.source: (
                    sensor.celsius,
                    f"{sensor.name} ({sensor.source}) is at {sensor.celsius:.1f} °C, above {number(rule.threshold)} °C",
                )
                for sensor in found.temperatures
                if sensor.celsius > rule.threshold
            }
            alerts += self._edges(rule, hot)
        return alerts

    def _edges(self, rule: Rule, bad: dict[str, tuple[float, str]]) -> list[Alert]:
        """Alerts for the subjects whose condition began; those whose condition ended are re-armed."""
        fired = self._gauges_fired[rule.kind]
        fired.intersection_update(bad)
        alerts = [
            self._alert(rule, subject, message, value)
            for subject, (value, message) in sorted(bad.items())
            if subject not in fired
        ]
        fired.update(bad)
        return alerts
