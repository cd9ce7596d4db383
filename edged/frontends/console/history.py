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
        who=who,
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


def who(event: Event) -> str:
    """Who did it, spelled as everywhere else (the model pages, the CSV export, the actor filter): ``user:ada``,
    ``token:ci``, ``cli``, or ``edged`` for edged itself."""
    return actor_of(event.actor)


ROUTES = [history_page, history_csv]
