"""The state database's side of the audit history: account actions as stored (table ``audit_events`` in
edged.state.schema), and the history's one read over them and the model transitions together.

A page of the history is one SQL query, a UNION ALL of both tables, so that filters, order and paging hold
across both: page 3 of "everything alice did" is the same rows whichever table they came from. Its total is
counted table by table in the same read transaction, so it is of the same snapshot. The order is by time (``at``),
the one thing both tables share: if the clock steps back, events are shown in the order of their times, not of
their writing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Final, Literal

from sqlalchemy import (
    Float,
    Integer,
    String,
    cast,
    delete,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    tuple_,
    union_all,
)

from edged.state.records import Records, inserted_id
from edged.state.schema import audit_events, models, transitions

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, RowMapping, Select

# Account actions kept: the newest this many (a flood of refused logins must not fill the device's disk).
AUDIT_EVENTS_KEPT: Final = 100_000
# Pruning runs on one write in this many, so that its cost is spread thin (as the transitions').
_PRUNE_EVERY: Final = 256
# Which table an event came from, as the order's tie-break: two events of the same microsecond keep one order.
# Written into the SQL as constants, not parameters: then SQLite reads both arms in the order of their ``at``
# indexes and merges them (a page costs its own rows, not a sort of the whole history).
_TRANSITION: Final = 0
_AUDIT: Final = 1
# How the history names edged itself, the actor of its own changes (start-up, poll, sync, a probation's verdict),
# which are stored without one (NULL): shown so, exported so, and found so by the actor filter.
DAEMON: Final = "edged"


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """An account action as stored (``id`` 0 before it is stored)."""

    at: datetime  # tz-aware, UTC
    actor: str  # "user:<name>", "anonymous", "setup-code", "cli", "token:<name>", ... (one spelling everywhere)
    action: str  # login, logout, setup, user-create, user-disable, password-set, ...
    target: str  # what it was done to: a user name, a model name
    outcome: Literal["done", "refused"]
    detail: str
    peer: str | None  # the client address, when it came over the network
    source: str  # how it came: console, api, cli
    id: int = 0


@dataclass(frozen=True, slots=True)
class EventKey:
    """Where an event stands in the history's order (newest first): a cursor that stays right while new events
    arrive, where an offset would shift by one with each."""

    at: datetime
    rank: int
    id: int


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the history: a model's state transition or an account action, in the fields both have.

    For a transition: ``action`` is the new state (READY, UNAVAILABLE, ...), ``target`` the model, ``detail`` the
    reason, ``outcome`` None. For an account action: ``version``, ``previous`` and ``duration_s`` are None.
    """

    kind: Literal["transition", "audit"]
    id: int  # unique within its kind
    at: datetime  # tz-aware, UTC
    source: str  # transitions: startup, poll, api, upload, sync, probation, console; account actions: console, api, cli
    actor: str | None  # None for the daemon's own transitions
    action: str
    target: str
    version: int | None
    previous: str | None
    outcome: str | None
    detail: str
    peer: str | None
    duration_s: float | None

    @property
    def key(self) -> EventKey:
        return EventKey(self.at, _TRANSITION if self.kind == "transition" else _AUDIT, self.id)


class AuditRecords(Records):
    """Account actions, and the history of everything; mixed into edged.state.store.StateStore."""

    audit_kept: int = AUDIT_EVENTS_KEPT

    def add_audit(self, record: AuditRecord) -> AuditRecord:
        """Stores an account action; returns it with its id. Keeps the newest ``audit_kept``."""
        if record.at.tzinfo is None:
            raise ValueError(f"the time of audit event '{record.action}' must be tz-aware")
        with self._transaction(write=True) as connection:
            added = connection.execute(
                insert(audit_events).values(
                    at=record.at,
                    actor=record.actor,
                    action=record.action,
                    target=record.target,
                    outcome=record.outcome,
                    detail=record.detail,
                    peer=record.peer,
                    source=record.source,
                )
            )
            event_id = inserted_id(added)
            if event_id % _PRUNE_EVERY == 0:
                oldest_kept = connection.scalar(
                    select(audit_events.c.id).order_by(audit_events.c.id.desc()).offset(self.audit_kept - 1).limit(1)
                )
                if oldest_kept is not None:
                    connection.execute(delete(audit_events).where(audit_events.c.id < oldest_kept))
            return replace(record, id=event_id)

    def events(
        self,
        *,
        model: str | None = None,
        actor: str | None = None,
        source: str | None = None,
        offset: int = 0,
        limit: int = 50,
        after: EventKey | None = None,
    ) -> tuple[list[Event], int]:
        """A page of the history, newest first, and how many events match in all.

        ``model``: a transition's model, or an account action's target. ``actor``: a plain name matches the user
        of that name ("user:<name>") and an actor of exactly that name ("cli"); a name with a colon
        ("token:ci", "user:alice") matches only itself; DAEMON ("edged") also matches edged's own transitions
        (stored without an actor). ``source``: exactly. ``after``: only events older than
        that one (a cursor for reading all of it, as an export does; ``offset`` counts from there). The total
        ignores ``after``.
        """
        if offset < 0 or limit < 1:
            raise ValueError(f"history needs offset >= 0 and limit >= 1, got offset {offset} and limit {limit}")
        actors = None if actor is None else [actor] if ":" in actor else [f"user:{actor}", actor]
        # Each filter goes into both arms, before the union, where SQLite can use the tables' indexes.
        in_transitions: list[ColumnElement[bool]] = []
        in_audits: list[ColumnElement[bool]] = []
        if model is not None:
            model_id = select(models.c.id).where(models.c.name == model).scalar_subquery()
            in_transitions.append(transitions.c.model_id == model_id)
            in_audits.append(audit_events.c.target == model)
        if actors is not None:
            by_actor = transitions.c.actor.in_(actors)
            in_transitions.append(or_(by_actor, transitions.c.actor.is_(None)) if actor == DAEMON else by_actor)
            in_audits.append(audit_events.c.actor.in_(actors))
        if source is not None:
            in_transitions.append(transitions.c.source == source)
            in_audits.append(audit_events.c.source == source)
        # Each column has one type (SQLite's affinity) in both arms, NULLs cast to it: only then does SQLite
        # merge the two arms in the order of their indexes instead of sorting the whole history for each page.
        of_transitions = (
            select(
                literal_column(str(_TRANSITION), Integer).label("rank"),
                transitions.c.id.label("id"),
                transitions.c.at.label("at"),
                transitions.c.source.label("source"),
                transitions.c.actor.label("actor"),
                transitions.c.state.label("action"),
                models.c.name.label("target"),
                transitions.c.version.label("version"),
                transitions.c.previous.label("previous"),
                cast(null(), String).label("outcome"),
                transitions.c.reason.label("detail"),
                cast(null(), String).label("peer"),
                transitions.c.duration_s.label("duration_s"),
            )
            .join(models, models.c.id == transitions.c.model_id)
            .where(*in_transitions)
        )
        of_audits = select(
            literal_column(str(_AUDIT), Integer),
            audit_events.c.id,
            audit_events.c.at,
            audit_events.c.source,
            audit_events.c.actor,
            audit_events.c.action,
            audit_events.c.target,
            cast(null(), Integer),
            cast(null(), String),
            audit_events.c.outcome,
            audit_events.c.detail,
            audit_events.c.peer,
            cast(null(), Float),
        ).where(*in_audits)
        history = union_all(of_transitions, of_audits).subquery("history")
        page: Select[tuple[object, ...]] = select(history)
        if after is not None:
            page = page.where(
                tuple_(history.c.at, history.c.rank, history.c.id)
                < tuple_(literal(after.at, history.c.at.type), after.rank, after.id)
            )
        page = (
            page.order_by(history.c.at.desc(), history.c.rank.desc(), history.c.id.desc()).offset(offset).limit(limit)
        )
        with self._transaction(write=False) as connection:
            # Counted apart, without the join to the models: a count of each table's rows, not of the union's.
            total = (connection.scalar(select(func.count()).select_from(transitions).where(*in_transitions)) or 0) + (
                connection.scalar(select(func.count()).select_from(audit_events).where(*in_audits)) or 0
            )
            rows = connection.execute(page)
            return [_history_event(row._mapping) for row in rows], total

    def audit_count(self) -> int:
        """How many account actions are kept."""
        with self._transaction(write=False) as connection:
            return connection.scalar(select(func.count()).select_from(audit_events)) or 0


def _history_event(row: RowMapping) -> Event:
    return Event(
        kind="transition" if row["rank"] == _TRANSITION else "audit",
        id=row["id"],
        at=row["at"],
        source=row["source"],
        actor=row["actor"],
        action=row["action"],
        target=row["target"],
        version=row["version"],
        previous=row["previous"],
        outcome=row["outcome"],
        detail=row["detail"],
        peer=row["peer"],
        duration_s=row["duration_s"],
    )
