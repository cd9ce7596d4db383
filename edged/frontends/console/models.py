"""The models and their versions: a table of every model with its figures now, and a page per model with its state,
config, versions and history, and the operator's actions on it (load or reload, unload, activate a version, roll
back to the previous one). Only actions that can work are offered: a load or an activation of versions on disk, a
rollback when there is something to roll back to, still on disk.

An action answers an htmx request with the model's live part re-rendered and a result line; a plain form gets a
303 back to the model page, which shows the result once (kept per session here, never carried in the URL, so no
link can make the console show a message it did not produce).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

from litestar import Request, Response, get, post
from litestar.exceptions import NotFoundException
from litestar.response import Redirect, Template

from edged.core.audit import transition_event
from edged.core.names import printable
from edged.errors import EdgedError, ErrorCode
from edged.frontends.console import auth
from edged.frontends.console.examples import TryResult, signature, try_model
from edged.frontends.console.figures import NO_TRAFFIC, model_figures
from edged.frontends.console.history import page_rows, table
from edged.frontends.console.pages import acting, console, is_htmx, render, session_of
from edged.frontends.statuses import status_for

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from edged.core.accounts import Session
    from edged.core.repository.deletion import ModelDeletion
    from edged.core.repository.summary import InstanceSummary, ModelSummary
    from edged.core.service import InferenceService

# Events on a page of a model's history (twice as many are read: history.page_rows): an action is a few of them (an
# activation six), folded into its row.
HISTORY_PAGE: Final = 30
# One-shot results kept for plain-form actions: one per session and model, the oldest dropped past this many.
_RESULTS_KEPT: Final = 256
EXPLICIT: Final = "explicit"


@dataclass(frozen=True, slots=True)
class Result:
    """What an action ended in, as the page shows it: ``ok`` or refused, and the line to read."""

    ok: bool
    text: str


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One line of the models table."""

    model: ModelSummary
    serving: str
    on_disk: str
    instances: str
    request_rate: float
    error_rate: float
    p50_ms: float | None
    p99_ms: float | None


# --- pages ----------------------------------------------------------------------------------------------------


@get("/models")
async def models_page(request: Request[Any, Any, Any], part: str = "") -> Template:
    """The table; ``?part=table`` is its live part alone, which htmx reloads (a path under /models/ could be a
    model's name)."""
    template = "models_table.html" if part == "table" else "models.html"
    return render(request, template, **_table(console(request).service))


@get("/models/{name:str}")
async def model_page(request: Request[Any, Any, Any], name: str, offset: int = 0) -> Template:
    return await _model_page(request, name, offset)


async def _model_page(
    request: Request[Any, Any, Any], name: str, offset: int = 0, tried: TryResult | None = None
) -> Template:
    context = console(request)
    service = context.service
    model = _model(service, name)
    result = _take_result(request, session_of(request), name)
    values = await _live(service, model, offset) | {"result": result, "tried": tried}
    host = request.url.hostname or "localhost"
    example = signature(service, name, host, context.http_port, context.grpc_port)
    return render(
        request,
        "model.html",
        config_text=service.model_config_text(name),
        example=example,
        model_memory=service.model_memory(name),
        **values,
    )


@post("/models/{name:str}/try", guards=[auth.csrf], status_code=200)
async def try_it(request: Request[Any, Any, Any], name: str) -> Template:
    """A test request with sample inputs, which any signed-in user may send (it changes nothing): the result part
    for htmx, the whole page with the result otherwise."""
    service = console(request).service
    model = _model(service, name)
    with acting(session_of(request)):
        tried = await try_model(service, name)
    if is_htmx(request):
        return render(request, "model_try_result.html", model=model, tried=tried)
    return await _model_page(request, name, tried=tried)


@get("/models/{name:str}/live")
async def model_live(request: Request[Any, Any, Any], name: str, offset: int = 0) -> Template:
    service = console(request).service
    return render(request, "model_live.html", **await _live(service, _model(service, name), offset))


# --- actions --------------------------------------------------------------------------------------------------

_OPERATOR = [auth.operator, auth.csrf]


@post("/models/{name:str}/load", guards=_OPERATOR, status_code=200)
async def load(request: Request[Any, Any, Any], name: str) -> Template | Redirect | Response[bytes]:
    service = console(request).service

    async def call() -> str:
        before = service.model_summary(name)
        was_serving = before is not None and bool(before.serving)
        await service.load_model(name, None, {})
        after = service.model_summary(name)
        serving = _listed(after.serving) if after is not None else ""
        done = "reloaded" if was_serving else "loaded"
        return f"{done}: {_serve_line(serving)}"

    return await _act(request, name, call)


@post("/models/{name:str}/unload", guards=_OPERATOR, status_code=200)
async def unload(request: Request[Any, Any, Any], name: str) -> Template | Redirect | Response[bytes]:
    service = console(request).service

    async def call() -> str:
        await service.unload_model(name)
        return "unloaded: no version serves now"

    return await _act(request, name, call)


@post("/models/{name:str}/versions/{version:int}/activate", guards=_OPERATOR, status_code=200)
async def activate(request: Request[Any, Any, Any], name: str, version: int) -> Template | Redirect | Response[bytes]:
    service = console(request).service

    async def call() -> str:
        served = await service.activate_version(name, version)
        return f"activated: {_serve_line(_listed(served.versions))}{_was(served.previous)}"

    return await _act(request, name, call)


@post("/models/{name:str}/rollback", guards=_OPERATOR, status_code=200)
async def rollback(request: Request[Any, Any, Any], name: str) -> Template | Redirect | Response[bytes]:
    service = console(request).service

    async def call() -> str:
        served = await service.rollback_version(name)
        return f"rolled back: {_serve_line(_listed(served.versions))}{_was(served.previous)}"

    return await _act(request, name, call)


@post("/models/{name:str}/delete", guards=_OPERATOR, status_code=200)
async def delete_model(request: Request[Any, Any, Any], name: str) -> Template | Redirect | Response[bytes]:
    service = console(request).service

    async def call() -> str:
        await _deletion(service).delete_model(name)
        return "deleted: its folder is gone from the repository"

    return await _act(request, name, call)


@post("/models/{name:str}/versions/{version:int}/delete", guards=_OPERATOR, status_code=200)
async def delete_version(
    request: Request[Any, Any, Any], name: str, version: int
) -> Template | Redirect | Response[bytes]:
    service = console(request).service

    async def call() -> str:
        await _deletion(service).delete_version(name, version)
        return f"version {version} deleted: its folder is gone from the repository"

    return await _act(request, name, call)


def _deletion(service: InferenceService) -> ModelDeletion:
    if service.uploads is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, "this server changes no model repository")
    return service.uploads.deletion


async def _act(
    request: Request[Any, Any, Any], name: str, call: Callable[[], Awaitable[str]]
) -> Template | Redirect | Response[bytes]:
    """Runs the core call as the session's user and answers with its result: the live part for htmx, a 303 back
    to the model page otherwise. The core's refusals are results too, with the status the API would give. An
    unknown model is not found (404), as its page is."""
    session = session_of(request)
    service = console(request).service
    _model(service, name)
    try:
        with acting(session):
            result = Result(True, await call())
    except EdgedError as exc:
        # As the API answers the same call: what cannot be deleted now (a version that serves) is a conflict.
        status = 409 if exc.code is ErrorCode.ALREADY_EXISTS else status_for(exc)
        result = Result(False, f"refused ({status} {HTTPStatus(status).phrase}): {exc.message}")
    model = service.model_summary(name)
    if model is None:
        # Gone with the action (unloaded, and its folder removed meanwhile): its page is no more, the table is.
        if is_htmx(request):
            return Response(b"", status_code=200, headers={"HX-Redirect": "/models"})
        return Redirect("/models", status_code=303)
    if not is_htmx(request):
        _keep_result(request, session, name, result)
        return Redirect(f"/models/{quote(name, safe='')}", status_code=303)
    values = await _live(service, model, 0) | {"result": result, "result_oob": True}
    return render(request, "model_live.html", **values)


# --- what the pages show --------------------------------------------------------------------------------------


def _model(service: InferenceService, name: str) -> ModelSummary:
    model = service.model_summary(name)
    if model is None:
        raise NotFoundException(f"no model '{printable(name)}' in the model repository")
    return model


def _table(service: InferenceService) -> dict[str, Any]:
    figures = model_figures(service)
    rows = []
    for model in service.model_summaries():
        now = figures.get(model.name, NO_TRAFFIC)
        rows.append(
            ModelRow(
                model=model,
                serving=_listed(model.serving),
                on_disk=_listed(model.on_disk),
                instances=_instances(model.instances) if model.serving else "",
                request_rate=now.request_rate,
                error_rate=now.error_rate,
                p50_ms=now.p50_ms,
                p99_ms=now.p99_ms,
            )
        )
    # What needs a person comes first: failures, then models on their way in or out, then the rest by name.
    rows.sort(key=lambda row: (_urgency(row.model), row.model.name))
    return {"rows": rows, **_control(service)}


def _urgency(model: ModelSummary) -> int:
    if model.failed:
        return 0
    return 1 if model.state in ("LOADING", "UNLOADING") else 2


async def _live(service: InferenceService, model: ModelSummary, offset: int) -> dict[str, Any]:
    offset = max(0, offset)
    history, total = await service.model_history(model.name, offset, 2 * HISTORY_PAGE)
    # The next page begins after the last action shown: paging never cuts an action's row in two.
    rows, shown = page_rows([transition_event(event) for event in history], HISTORY_PAGE)
    previous = await service.rollback_versions(model.name)
    return {
        "model": model,
        "model_url": f"/models/{quote(model.name, safe='')}",
        "serving": _listed(model.serving),
        "instances": _instances(model.instances) if model.serving else "",
        # What a rollback would serve, offered only when every one of them is still on disk.
        "rollback_to": _listed(previous) if previous and set(previous) <= set(model.on_disk) else "",
        "rollback_why_not": _no_rollback(previous, model.on_disk),
        **table(rows),
        "total": total,
        "offset": offset,
        "shown": shown,
        "page_size": HISTORY_PAGE,
        "result": None,
        "result_oob": False,
        **_control(service),
    }


def _no_rollback(previous: list[int], on_disk: list[int]) -> str:
    """Why there is nothing to roll back to (shown beside the disabled button)."""
    if not previous:
        return "Nothing to roll back to: what serves has not replaced other versions."
    gone = sorted(set(previous) - set(on_disk))
    if gone:
        return f"Cannot roll back: version{'s' if len(gone) > 1 else ''} {_listed(gone)} no longer on disk."
    return ""


def _control(service: InferenceService) -> dict[str, Any]:
    mode = service.control_mode
    return {"control_mode": mode, "controls_off": mode != EXPLICIT}


def _instances(instances: tuple[InstanceSummary, ...]) -> str:
    """``3: CPU \u00d72, GPU 0`` (a multiplication sign): how many, and where."""
    if not instances:
        return ""
    where = Counter(instance.device for instance in instances)
    placed = ", ".join(device if count == 1 else f"{device} \u00d7{count}" for device, count in sorted(where.items()))
    return f"{len(instances)}: {placed}"


def _listed(numbers: list[int]) -> str:
    return ", ".join(str(number) for number in sorted(numbers))


def _serve_line(versions: str) -> str:
    if not versions:
        return "no version serves now"
    return f"version{'s' if ',' in versions else ''} {versions} {'serve' if ',' in versions else 'serves'} now"


def _was(previous: list[int]) -> str:
    return f" (was {_listed(previous)})" if previous else ""


# --- one-shot results of plain-form actions -------------------------------------------------------------------


def _results(request: Request[Any, Any, Any]) -> OrderedDict[tuple[str, str], Result]:
    # Kept with the app (one per console), so a result reaches only the session that acted.
    state = request.app.state
    found: OrderedDict[tuple[str, str], Result] | None = state.get("model_results")
    if found is None:
        found = state["model_results"] = OrderedDict()
    return found


def _keep_result(request: Request[Any, Any, Any], session: Session, name: str, result: Result) -> None:
    results = _results(request)
    results[(session.id, name)] = result
    results.move_to_end((session.id, name))
    while len(results) > _RESULTS_KEPT:
        results.popitem(last=False)


def _take_result(request: Request[Any, Any, Any], session: Session, name: str) -> Result | None:
    return _results(request).pop((session.id, name), None)


ROUTES = [models_page, model_page, model_live, load, unload, activate, rollback, delete_model, delete_version, try_it]
