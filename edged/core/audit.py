"""The audit history: every account action recorded (who did what to whom, from where, through which door), read
back with the model transitions as one history, paged, filtered, and exported as CSV.

Threads: the state database is written and read on one thread of the log's own, in order, so the event loop
never waits for the disk. ``record`` queues without waiting (a failed write is logged, never raised: an action
that happened is not undone because its line could not be written); ``written`` waits for what was queued.

CSV export guards against formula injection (OWASP's "CSV Injection"): a cell that a spreadsheet would read as a
formula (one starting with = + - @, a tab or a carriage return) gets a leading apostrophe, so that a user name
or a model name chosen by someone else is shown as text, never run.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, TextIO

from edged.core.repository.modes import Origin
from edged.state.audit import DAEMON, AuditRecord, Event, EventKey

if TYPE_CHECKING:
    from edged.core.accounts import AuditEntry
    from edged.state.store import HistoryEvent, StateStore

__all__ = [
    "CSV_HEADER",
    "DAEMON",
    "SOURCES",
    "AuditLog",
    "Event",
    "Source",
    "actor_of",
    "csv_cell",
    "csv_rows",
    "transition_event",
    "write_csv",
]

log = logging.getLogger("edged.core.audit")

Source = Literal["console", "api", "cli"]
# Every source an event of the history may have: what caused a model transition (model control's origins), and
# the door an account action came through.
SOURCES: Final = tuple(dict.fromkeys([*(origin.value for origin in Origin), "console", "api", "cli"]))

CSV_HEADER: Final = (
    "time",
    "kind",
    "source",
    "actor",
    "action",
    "target",
    "version",
    "previous",
    "outcome",
    "detail",
    "peer",
    "duration_s",
)
# What a spreadsheet takes for the start of a formula (OWASP's list).
_FORMULA_STARTS: Final = ("=", "+", "-", "@", "\t", "\r")
# Rows read from the database at once while exporting: a page's worth of memory, however long the history.
EXPORT_BATCH: Final = 500


def _utcnow() -> datetime:
    return datetime.now(UTC)


class AuditLog:
    """The audit history over the state database; without a store (no state directory) nothing is kept and the
    history is empty. ``clock`` stamps each action when it is recorded, not when the thread writes it."""

    def __init__(self, store: StateStore | None, clock: Callable[[], datetime] = _utcnow) -> None:
        self._store = store
        self._clock = clock
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edged-audit")

    @property
    def enabled(self) -> bool:
        return self._store is not None

    def record(self, entry: AuditEntry, source: Source) -> None:
        """Queues ``entry`` (as it came through ``source``) for the history; returns at once."""
        if self._store is None:
            return
        record = AuditRecord(
            self._clock(), entry.actor, entry.action, entry.target, entry.outcome, entry.detail, entry.peer, source
        )
        self._pool.submit(self._store.add_audit, record).add_done_callback(_log_failure)

    async def written(self) -> None:
        """Waits for every action queued so far (the thread writes them in order)."""
        if self._store is not None:
            await self._run(lambda: None)

    async def events(
        self,
        *,
        model: str | None = None,
        actor: str | None = None,
        source: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[list[Event], int]:
        """A page of every event (model transitions and account actions), newest first, and how many match in
        all. ``model``: a model's name (or an action's target); ``actor``: a user's name, or an actor as stored
        ("token:ci", "cli"), or DAEMON; ``source``: one of SOURCES."""
        if self._store is None:
            if offset < 0 or limit < 1:
                raise ValueError(f"history needs offset >= 0 and limit >= 1, got offset {offset} and limit {limit}")
            return [], 0
        store = self._store
        result: tuple[list[Event], int] = await self._run(
            lambda: store.events(model=model, actor=actor, source=source, offset=offset, limit=limit)
        )
        return result

    async def csv_chunks(
        self, *, model: str | None = None, actor: str | None = None, source: str | None = None
    ) -> AsyncIterator[str]:
        """The whole filtered history as CSV text for a streamed download: the header and the first EXPORT_BATCH
        rows, then EXPORT_BATCH rows a chunk. It is the history as it stood at the first read: each batch is read
        with a cursor (the events older than the last one read), not an offset, so that events arriving meanwhile
        neither appear nor repeat a row nor push one out."""
        header = True
        after: EventKey | None = None
        while True:
            batch: list[Event] = []
            if self._store is not None:
                read = partial(
                    self._store.events, model=model, actor=actor, source=source, limit=EXPORT_BATCH, after=after
                )
                batch = (await self._run(read))[0]
            if batch or header:
                yield _csv_text(csv_rows(batch, header=header))
            if len(batch) < EXPORT_BATCH:
                return
            header, after = False, batch[-1].key

    def close(self) -> None:
        """Waits for the queued actions to be written; the store is its owner's to close."""
        self._pool.shutdown(wait=True)

    async def _run(self, call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)


def actor_of(actor: str | None) -> str:
    """Who did it, spelled as stored and everywhere alike ("user:ada", "token:ci", "cli"): edged's own changes,
    stored without an actor, are DAEMON's."""
    return DAEMON if actor is None else actor


def transition_event(transition: HistoryEvent) -> Event:
    """A model's state transition as the history reads it (``edged.state.audit``'s union gives it these fields), so
    that the pages that list only transitions (a model's, the overview) show them as the history page does."""
    return Event(
        "transition",
        transition.id,
        transition.at,
        transition.source,
        transition.actor,
        transition.state,
        transition.model,
        transition.version,
        transition.previous,
        None,
        transition.reason,
        None,
        transition.duration_s,
    )


def csv_cell(value: object) -> str:
    """One cell's text: None empty, times in ISO 8601 UTC, and text a spreadsheet would run as a formula
    defused with a leading apostrophe."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def csv_rows(events: Iterable[Event], *, header: bool = True) -> Iterator[list[str]]:
    """The CSV rows of ``events`` (CSV_HEADER's columns), each cell through ``csv_cell``."""
    if header:
        yield list(CSV_HEADER)
    for event in events:
        yield [
            csv_cell(cell)
            for cell in (
                event.at,
                event.kind,
                event.source,
                actor_of(event.actor),
                event.action,
                event.target,
                event.version,
                event.previous,
                event.outcome,
                event.detail,
                event.peer,
                event.duration_s,
            )
        ]


def write_csv(events: Iterable[Event], out: TextIO) -> None:
    """Writes ``events`` as CSV with its header to ``out`` (open it with ``newline=""``, as the csv module asks)."""
    csv.writer(out).writerows(csv_rows(events))


def _csv_text(rows: Iterable[list[str]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    return buffer.getvalue()


def _log_failure(future: Future[Any]) -> None:
    exc = future.exception()
    if exc is not None:
        log.error("writing the audit history failed: %s", exc)
