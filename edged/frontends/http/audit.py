"""The audit record of what the API's management calls did (tokens, sync control), as the console records its own
(edged.frontends.console.history), under the source "api"."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from edged.core.access import ACTOR
from edged.core.accounts import AuditEntry

if TYPE_CHECKING:
    from litestar import Request

    from edged.core.audit import AuditLog


def record(
    request: Request[Any, Any, Any],
    action: Literal["token-create", "token-revoke", "sync-now", "sync-pause", "sync-resume"],
    name: str,
    detail: str,
) -> None:
    """One action, done by whoever the access policy let in (``ACTOR``), into the audit history."""
    audit: AuditLog | None = request.app.state.audit
    if audit is not None:
        peer = request.client.host if request.client is not None else None
        audit.record(AuditEntry(ACTOR.get() or "anonymous", action, name, "done", detail, peer), "api")
