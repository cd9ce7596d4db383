"""The history page: every event (model transitions, uploads, sync, account actions), newest first, filtered by
model, user and source with a plain GET form, paged with links, and exported as CSV with the same filters; and
``record``, where the console's own account actions go to the log and the audit history.

The events come from the audit history (``edged.core.audit.AuditLog``), which reads the model transitions and the
account actions as one list, so the filters and the pages hold across both.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

from litestar import Request, get
from litestar.response import Stream, Template

from edged.core.audit import CSV_HEADER, SOURCES, actor_of
from edged.frontends.console.pages import console, render

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from edged.core.accounts import AuditEntry
    from edged.core.audit import Event

log = logging.getLogger("edged.console")

PER_PAGE: Final = 50
# Where events come from: the model transitions' origins, then the ways account actions come in.
# Filter values longer than this are no model's or user's name.
_FILTER_MAX: Final = 256


def record(request: Request[Any, Any, Any], entry: AuditEntry) -> None:
    """Logs an account action done through the console and records it in the audit history (queued: the page
    never waits for the disk)."""
    log.info(
        "console: %s %s %s (%s)%s",
        entry.actor,
        entry.action,
        entry.target,
        entry.outcome,
        f": {entry.detail}" if entry.detail else "",
    )
    audit = console(request).audit
    if audit is not None:
        audit.record(entry, "console")


@dataclass(frozen=True, slots=True)
class Filters:
    """What the history is narrowed to; empty: everything."""

    model: str = ""
    user: str = ""
    source: str = ""

    @classmethod
    def of(cls, model: str, user: str, source: str) -> Filters:
        return cls(model.strip()[:_FILTER_MAX], user.strip()[:_FILTER_MAX], source.strip()[:_FILTER_MAX])

    def query(self, **more: Any) -> str:
        """The query string of these filters (only those set) and ``more``, for links that keep them."""
        pairs = {"model": self.model, "user": self.user, "source": self.source} | more
        return urlencode({key: value for key, value in pairs.items() if value not in ("", None)})

    def arguments(self) -> dict[str, str | None]:
        return {"model": self.model or None, "actor": self.user or None, "source": self.source or None}


@get("/history")
async def history_page(
    request: Request[Any, Any, Any], model: str = "", user: str = "", source: str = "", page: int = 1
) -> Template:
    context = console(request)
    filters = Filters.of(model, user, source)
    page = max(1, page)
    events: list[Event] = []
    total = 0
    if context.audit is not None:
        events, total = await context.audit.events(offset=(page - 1) * PER_PAGE, limit=PER_PAGE, **filters.arguments())
    pages = max(1, -(-total // PER_PAGE))
    return render(
        request,
        "history.html",
        events=events,
        total=total,
        page=page,
        pages=pages,
        first=(page - 1) * PER_PAGE + 1,
        filters=filters,
        sources=SOURCES,
        models=sorted(summary.name for summary in context.service.model_summaries()),
        kept=context.audit is not None and context.audit.enabled,
        **table(fold(events)),
    )


@get("/history.csv")
async def history_csv(request: Request[Any, Any, Any], model: str = "", user: str = "", source: str = "") -> Stream:
    """The whole filtered history, streamed: a device's history can be long, and it is never all in memory."""
    context = console(request)
    filters = Filters.of(model, user, source)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = f"edged-history-{stamp}.csv"

    async def chunks() -> AsyncIterator[bytes]:
        if context.audit is None:
            yield (",".join(CSV_HEADER) + "\r\n").encode()
            return
        async for text in context.audit.csv_chunks(**filters.arguments()):
            yield text.encode()

    return Stream(
        chunks(),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


# Folding: the events one action made (an activation's loads and unloads, an upload and the load it led to) are one
# row, the action's, with its steps under it. Events fold together when they are of one model, by one actor through
# one source, each within FOLD_WINDOW_S of the one before, and no second action or new load begins among them.
FOLD_WINDOW_S: Final = 60.0
# The events that name an action, most telling first: a row shows the first of these it holds.
_HEADS: Final = ("ACTIVATED", "ROLLED_BACK", "UPLOADED", "UPLOAD_REMOVED", "DELETED", "PROBATION_ENDED", "SERVING")
_ACTIONS: Final = frozenset(_HEADS)
# The actions a person (or a probation) decided, each a row of its own; "now serving" is what a load ended in.
_DECIDED: Final = _ACTIONS - {"SERVING"}
# Then what a load or an unload ended in.
_OUTCOMES: Final = ("UNAVAILABLE", "READY", "UNLOADED")
# Plain words for the states and actions the history records (any other is lower case, '_' as a space).
_WORDS: Final = {"SERVING": "now serving", "UPLOAD_REMOVED": "upload removed", "PROBATION_ENDED": "probation ended"}


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the history: an event, and the events folded under it (its steps, oldest first; empty when it
    stands alone)."""

    head: Event
    steps: tuple[Event, ...] = ()


def fold(events: list[Event]) -> list[Row]:
    """The rows of ``events`` (newest first, as the page lists them), newest first (by each row's newest event).

    Each model has its own open row: the steps of actions on different models that ran at once (the loads of a
    start, which interleave) fold under their own models' rows rather than breaking each other's."""
    rows: list[tuple[int, Row]] = []  # (the position of the row's newest event, oldest first; the row)
    open_groups: dict[str, list[Event]] = {}
    newest: dict[str, int] = {}
    for position, event in enumerate(reversed(events)):  # oldest first: an action's steps in the order they happened
        if event.kind != "transition":
            rows.append((position, Row(event)))
            continue
        group = open_groups.get(event.target)
        if group is not None and _continues(group, event):
            group.append(event)
            newest[event.target] = position
            continue
        if group is not None:
            rows.append((newest[event.target], _row(group)))
        open_groups[event.target] = [event]
        newest[event.target] = position
    rows += [(newest[target], _row(group)) for target, group in open_groups.items()]
    rows.sort(key=lambda item: item[0], reverse=True)
    return [row for _, row in rows]


def page_rows(events: list[Event], size: int) -> tuple[list[Row], int]:
    """The newest rows of ``events`` that hold at most ``size`` of them (at least one row), and how many they hold.
    ``events`` (newest first) are read past the page, up to twice its size: an action that the page's end would cut
    in two folds whole with its older steps (where its rows begin depends on what is older) and goes to the next
    page, which begins where these rows end."""
    rows: list[Row] = []
    held = 0
    for row in fold(events):
        count = len(row.steps) or 1
        if rows and held + count > size:
            break
        rows.append(row)
        held += count
    return rows, held


def table(rows: list[Row]) -> dict[str, Any]:
    """What history_table.html shows ``rows`` with, as every page that lists the history does (the history page,
    a model's page, the overview); the including page sets ``labelled_by``, the id of the table's heading."""
    return {"rows": rows, "word": word, "who": who}


def _continues(group: list[Event], event: Event) -> bool:
    first, last = group[0], group[-1]
    if (event.target, event.actor, event.source) != (first.target, first.actor, first.source):
        return False
    if (event.at - last.at).total_seconds() > FOLD_WINDOW_S:
        return False
    decided = event.action in _DECIDED and any(step.action in _DECIDED for step in group)
    if decided or any(step.action == event.action for step in group if step.action in _ACTIONS):
        return False  # one action per row (a load's "now serving" belongs to the upload that led to it)
    if event.action in ("UPLOADED", "DELETED"):
        return False
    loads = any(step.action == "LOADING" and step.version is None for step in group)
    if event.action == "LOADING" and event.version is None:
        # A new load, unless it is the one an upload just led to.
        return all(step.action == "UPLOADED" for step in group)
    if event.action == "UNLOADING":
        if loads:
            # A load retires the versions it replaces; one it brought up itself is unloaded by a later action.
            return event.version not in {step.version for step in group if step.action == "READY"}
        return all(step.action in ("UNLOADING", "UNLOADED") for step in group)
    return True


def _row(group: list[Event]) -> Row:
    if len(group) == 1:
        return Row(group[0])
    ranked = [*_HEADS, *_OUTCOMES]
    newest_first = list(reversed(group))
    head = min(newest_first, key=lambda e: ranked.index(e.action) if e.action in ranked else len(ranked))
    return Row(head, tuple(group))


def word(action: str) -> str:
    """The plain word for a recorded state or action: ``rolled back``, ``upload removed``, ``now serving``."""
    return _WORDS.get(action, action.lower().replace("_", " "))


def who(event: Event) -> str:
    """Who did it, spelled as everywhere else (the model pages, the CSV export, the actor filter): ``user:ada``,
    ``token:ci``, ``cli``, or ``edged`` for edged itself."""
    return actor_of(event.actor)


ROUTES = [history_page, history_csv]
