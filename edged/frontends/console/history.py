"""The history page: every event (model transitions, uploads, sync, account actions), newest first, filtered by
model, user and source, paged, and exported as CSV; and ``record``, where the console's own actions go to the log
and the audit history."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from litestar import Request

    from edged.core.accounts import AuditEntry

log = logging.getLogger("edged.console")


def record(request: Request[Any, Any, Any], entry: AuditEntry) -> None:
    """Logs an account action done through the console."""
    log.info(
        "console: %s %s %s (%s)%s",
        entry.actor,
        entry.action,
        entry.target,
        entry.outcome,
        f": {entry.detail}" if entry.detail else "",
    )
