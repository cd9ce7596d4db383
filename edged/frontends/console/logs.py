"""The log page (admin): the last lines of edged's own log, newest first, filtered by level and by model with a plain
GET form; ``?part=lines`` is the list alone, which htmx reloads every few seconds with the same filters.

Under systemd the lines come from the unit's journal (edged.log_journal), earlier runs included; elsewhere, or when
the journal cannot be read, from the ring edged.logs keeps in memory (edged.log_ring). What one page holds is
bounded whatever the query asks: at most ``MAX_PAGE_LINES`` lines, filters of at most ``FILTER_MAX`` characters.
Messages are shown as text (the templates escape them): a model's name or a client's input quoted in a line is
never markup.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import urlencode

from litestar import Request, get
from litestar.response import Template

from edged import log_journal, logs
from edged.frontends.console import auth
from edged.frontends.console.pages import console, render
from edged.log_ring import LEVELS, MAX_BYTES, MAX_LINES, LineFilter, LogLine, newest

# Lines on one page at most, and by default.
MAX_PAGE_LINES: Final = 2_000
DEFAULT_PAGE_LINES: Final = 200
# A model's name is at most 255 bytes: a longer filter names nothing.
FILTER_MAX: Final = 256
# How often htmx reloads the list.
REFRESH_S: Final = 5

log = logging.getLogger("edged.console")


@get("/admin/logs", guards=[auth.admin])
async def logs_page(
    request: Request[Any, Any, Any], level: str = "", model: str = "", lines: int = DEFAULT_PAGE_LINES, part: str = ""
) -> Template:
    level = level.strip().lower()[:FILTER_MAX]
    level = level if level in LEVELS else ""
    model = model.strip()[:FILTER_MAX]
    limit = min(max(1, lines), MAX_PAGE_LINES)
    keep = LineFilter(LEVELS.get(level, 0), model)
    found, source, note = await _newest(keep, limit)
    query = urlencode({key: value for key, value in (("level", level), ("model", model)) if value} | {"lines": limit})
    template = "admin_logs_lines.html" if part == "lines" else "admin_logs.html"
    return render(
        request,
        template,
        lines=found,
        source=source,
        note=note,
        level=level,
        levels=list(LEVELS),
        model=model,
        limit=limit,
        max_lines=MAX_PAGE_LINES,
        filter_max=FILTER_MAX,
        filtered=bool(level or model),
        query=query,
        refresh_s=REFRESH_S,
        models=sorted(summary.name for summary in console(request).service.model_summaries()),
        stamp=stamp,
    )


async def _newest(keep: LineFilter, limit: int) -> tuple[list[LogLine], str, str | None]:
    """(the lines, newest first; where they come from; why not from the journal, when it is in use but unread)."""
    note = None
    if logs.journal_in_use():
        match = log_journal.own_match()
        if match is not None:
            try:
                return await log_journal.read(match, keep, limit), f"the journal of {match.unit}", None
            except log_journal.JournalUnreadable as exc:
                note = str(exc)
        else:
            note = "the journal is in use, but this process belongs to no systemd unit it could name"
        log.debug("console: log page from memory: %s", note)
    ring = logs.ring()
    found = newest(ring.lines(), keep, limit) if ring is not None else []
    source = f"edged's memory: the last {MAX_LINES:,} lines or {MAX_BYTES // (1024 * 1024)} MiB logged since it started"
    return found, source, note


def stamp(line: LogLine) -> tuple[str, str]:
    """The line's time in UTC: (ISO 8601 for the datetime attribute, as shown)."""
    at = datetime.fromtimestamp(line.at, UTC)
    return at.isoformat(timespec="milliseconds"), at.strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d}"


ROUTES = [logs_page]
