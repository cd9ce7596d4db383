"""The sync page: each remote repository's source (signed or not, phase, revisions, last success and error, next
run), the current run's progress (``/sync/live``, which htmx reloads every few seconds), the past runs paged (what
changed, rollbacks and why), and "Sync now", "Pause" and "Resume" for operators. A server whose repositories are
all local folders gets a page that says how to sync one."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from edged.core.accounts import AuditEntry
from edged.errors import EdgedError, ErrorCode
from edged.frontends.console import auth, history
from edged.frontends.console.pages import acting, console, is_htmx, render, session_of

if TYPE_CHECKING:
    from edged.core.sync_control import SyncControl

log = logging.getLogger("edged.console")

# Runs a page of the history shows.
RUNS_PER_PAGE = 20
# Far past any history (it keeps a bounded number of runs), and far from overflowing the database's offset.
MAX_PAGE = 1_000_000
# htmx reloads the live part this often (seconds): a run's progress moves at about this pace.
LIVE_EVERY_S = 2


def _sync(request: Request[Any, Any, Any]) -> SyncControl:
    sync = console(request).service.sync
    if sync is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, "no model repository of this server is synced (s3://, gs:// or as://)")
    return sync


@get("/sync")
async def sync_page(request: Request[Any, Any, Any], page: int = 1) -> Template:
    sync = console(request).service.sync
    if sync is None:
        return render(request, "sync_off.html")
    return render(request, "sync.html", live_every_s=LIVE_EVERY_S, **_live(sync), **await _runs(sync, page))


@get("/sync/live")
async def sync_live(request: Request[Any, Any, Any]) -> Template:
    return render(request, "sync_live.html", **_live(_sync(request)))


@get("/sync/runs")
async def sync_runs(request: Request[Any, Any, Any], page: int = 1) -> Template:
    return render(request, "sync_runs.html", **await _runs(_sync(request), page))


@post("/sync/now", guards=[auth.operator, auth.csrf], status_code=303)
async def sync_now(request: Request[Any, Any, Any]) -> Response[Any]:
    """Runs every source now and answers when the runs are done (a probation goes on after them)."""
    auth.known_fields(await request.form(), "sync")
    sync = _sync(request)
    session = session_of(request)
    _record(request, "sync-now")
    with acting(session):
        runs = await sync.run_now()
    if is_htmx(request):
        return render(request, "sync_runs.html", ran=runs, **await _runs(sync, 1))
    return Redirect("/sync", status_code=303)


@post("/sync/pause", guards=[auth.operator, auth.csrf], status_code=303)
async def sync_pause(request: Request[Any, Any, Any]) -> Response[Any]:
    auth.known_fields(await request.form(), "sync")
    sync = _sync(request)
    session = session_of(request)
    with acting(session):
        sync.pause()
    _record(request, "sync-pause")
    return _changed(request, sync)


@post("/sync/resume", guards=[auth.operator, auth.csrf], status_code=303)
async def sync_resume(request: Request[Any, Any, Any]) -> Response[Any]:
    auth.known_fields(await request.form(), "sync")
    sync = _sync(request)
    session = session_of(request)
    with acting(session):
        sync.resume()
    _record(request, "sync-resume")
    return _changed(request, sync)


def _record(request: Request[Any, Any, Any], action: Literal["sync-now", "sync-pause", "sync-resume"]) -> None:
    """Into the log and the audit history, with the user's name."""
    session = session_of(request)
    peer = request.client.host if request.client is not None else None
    history.record(request, AuditEntry(f"user:{session.user}", action, "repository", "done", peer=peer))


def _changed(request: Request[Any, Any, Any], sync: SyncControl) -> Response[Any]:
    """htmx: the controls as they are now, and the live part told to reload; a plain form: back to the page."""
    if is_htmx(request):
        page = render(request, "sync_controls.html", paused=sync.paused)
        page.headers["HX-Trigger"] = "sync-changed"
        return page
    return Redirect("/sync", status_code=303)


def _live(sync: SyncControl) -> dict[str, Any]:
    status = sync.status()
    return {"status": status, "paused": bool(status.get("paused")), "sources": status.get("sources", [])}


async def _runs(sync: SyncControl, page: int) -> dict[str, Any]:
    page = min(max(1, page), MAX_PAGE)
    runs, total = await sync.history((page - 1) * RUNS_PER_PAGE, RUNS_PER_PAGE)
    pages = max(1, -(-total // RUNS_PER_PAGE))
    # The source is named only when the runs shown come from more than one.
    several = len({run["source"] for run in runs}) > 1
    return {"runs": runs, "total": total, "page": page, "pages": pages, "several": several}


ROUTES = [sync_page, sync_live, sync_runs, sync_now, sync_pause, sync_resume]
