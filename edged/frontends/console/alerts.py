"""The alerts page (admins): the rules on or off with their thresholds, the webhook they are delivered to, and the
alerts fired lately with what became of each delivery.

Admins only, reading included: the webhook's URL often is a credential itself (chat services' incoming hooks are
secret URLs), and setting it decides where the daemon sends what it knows about the device, as an API token decides
who may ask. The webhook's signing secret is on the answer to the form that set it and nowhere else, as a new API
token's is. Every change, done or refused, goes to the audit history as the acting user's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

from litestar import Request, Response, get, post
from litestar.exceptions import ClientException
from litestar.response import Redirect, Template

from edged.core.accounts import AuditEntry
from edged.core.alerts.bounds import PENDING_MAX, RECENT_SHOWN, TRIES, TRY_TIMEOUT_S, URL_MAX
from edged.core.alerts.rules import SPECS, AlertError, RuleKind, number, parse_threshold
from edged.core.alerts.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER
from edged.frontends.console import auth
from edged.frontends.console.history import record
from edged.frontends.console.pages import console, render, session_of

if TYPE_CHECKING:
    from litestar.datastructures import FormMultiDict

    from edged.core.alerts.engine import Alerts

_Action = Literal["alert-rules-set", "alert-webhook-set", "alert-webhook-remove", "alert-test"]
# Form fields longer than this are no threshold or URL.
_FIELD_MAX: Final = URL_MAX + 1
UNAVAILABLE: Final = "alerts are kept in the state database: edged runs without one (--state-dir)"
_NOTICES: Final = {
    "saved": "Rules saved.",
    "removed": "Webhook removed: alerts are no longer sent.",
    "tested": "Test alert sent: its delivery is listed below once it is done.",
}


@get("/alerts", guards=[auth.admin])
async def alerts_page(request: Request[Any, Any, Any], done: str = "") -> Template:
    return await _page(request, notice=_NOTICES.get(done))


@get("/alerts/fired", guards=[auth.admin])
async def fired_part(request: Request[Any, Any, Any]) -> Template:
    """The recent alerts alone, which the page reloads every few seconds (htmx)."""
    alerts = _alerts(request)
    return render(
        request,
        "alerts_fired.html",
        fired=await alerts.recent(RECENT_SHOWN),
        pending=alerts.pending,
        dropped=alerts.dropped,
        bounds={"pending_max": PENDING_MAX},
        titles={kind.value: spec.title for kind, spec in SPECS.items()},
    )


@post("/alerts/rules", guards=[auth.admin, auth.csrf], status_code=303)
async def save_rules(request: Request[Any, Any, Any]) -> Response[Any]:
    form = await request.form()
    auth.known_fields(form, "rules", "on", *(f"threshold-{kind.value}" for kind in RuleKind))
    alerts = _alerts(request)
    turned_on = set(form.getall("on")) if "on" in form else set()
    typed = {kind: _field(form, f"threshold-{kind.value}") for kind in RuleKind}
    problems: list[str] = []
    changes: dict[RuleKind, tuple[bool, float | None]] = {}
    for kind in RuleKind:
        enabled = kind.value in turned_on
        text = typed[kind]
        try:
            # A threshold left empty on a rule turned off keeps the one it had.
            threshold = parse_threshold(kind, text) if text.strip() or enabled else None
        except AlertError as exc:
            problems.append(str(exc))
            continue
        changes[kind] = (enabled, threshold)
    unknown = turned_on - {kind.value for kind in RuleKind}
    if unknown:
        problems.append(f"no rule is called {', '.join(sorted(unknown))}")
    if not problems:
        try:
            changed = await alerts.set_rules(changes)
        except AlertError as exc:
            problems.append(str(exc))
        else:
            detail = "; ".join(
                f"{rule.spec.describe(rule.threshold)} {'on' if rule.enabled else 'off'}" for rule in changed
            )
            _record(request, "alert-rules-set", "rules", "done", detail or "nothing changed")
            return Redirect("/alerts", query_params={"done": "saved"}, status_code=303)
    _record(request, "alert-rules-set", "rules", "refused", "; ".join(problems))
    return await _page(request, status_code=400, message="\n".join(problems), typed=typed, turned_on=turned_on)


@post("/alerts/webhook", guards=[auth.admin, auth.csrf], status_code=200)
async def set_webhook(request: Request[Any, Any, Any]) -> Template:
    form = await request.form()
    auth.known_fields(form, "webhook", "url")
    url = _field(form, "url")
    try:
        secret = await _alerts(request).set_webhook(url)
    except AlertError as exc:
        _record(request, "alert-webhook-set", "webhook", "refused", str(exc))
        return await _page(request, status_code=400, webhook_message=str(exc), url=url)
    _record(request, "alert-webhook-set", "webhook", "done", url.strip())
    # The one time the secret is shown: this answer, never stored elsewhere and never cached (no console page is).
    return render(
        request,
        "alerts_webhook_set.html",
        url=url.strip(),
        secret=secret,
        signature_header=SIGNATURE_HEADER,
        timestamp_header=TIMESTAMP_HEADER,
    )


@post("/alerts/webhook/remove", guards=[auth.admin, auth.csrf], status_code=303)
async def remove_webhook(request: Request[Any, Any, Any]) -> Response[Any]:
    auth.known_fields(await request.form(), "remove")
    if not await _alerts(request).remove_webhook():
        _record(request, "alert-webhook-remove", "webhook", "refused", "no webhook is set")
        return await _page(request, status_code=400, webhook_message="no webhook is set")
    _record(request, "alert-webhook-remove", "webhook", "done", "")
    return Redirect("/alerts", query_params={"done": "removed"}, status_code=303)


@post("/alerts/test", guards=[auth.admin, auth.csrf], status_code=303)
async def send_test(request: Request[Any, Any, Any]) -> Response[Any]:
    auth.known_fields(await request.form(), "test")
    alerts = _alerts(request)
    if alerts.webhook() is None:
        _record(request, "alert-test", "webhook", "refused", "no webhook is set")
        return await _page(request, status_code=400, webhook_message="set a webhook first: a test alert goes to it")
    alerts.send_test(session_of(request).user)
    _record(request, "alert-test", "webhook", "done", "")
    return Redirect("/alerts", query_params={"done": "tested"}, status_code=303)


async def _page(
    request: Request[Any, Any, Any],
    *,
    status_code: int = 200,
    typed: dict[RuleKind, str] | None = None,
    turned_on: set[str] | None = None,
    **values: Any,
) -> Template:
    alerts = console(request).service.alerts
    values = {"message": None, "notice": None, "webhook_message": None, "url": ""} | values
    bounds = {"tries": TRIES, "timeout_s": number(TRY_TIMEOUT_S), "pending_max": PENDING_MAX, "url_max": URL_MAX}
    if alerts is None:
        return render(request, "alerts.html", status_code=status_code, unavailable=UNAVAILABLE, bounds=bounds, **values)
    rules = []
    for rule in alerts.rules():
        spec = rule.spec
        threshold = rule.threshold if rule.threshold is not None else spec.default
        rules.append(
            {
                "kind": rule.kind.value,
                "title": spec.title,
                "unit": spec.unit,
                "low": number(spec.low),
                "high": number(spec.high),
                "step": "1" if spec.whole else "any",
                "enabled": rule.kind.value in turned_on if turned_on is not None else rule.enabled,
                "threshold": typed[rule.kind]
                if typed is not None
                else ("" if threshold is None else number(threshold)),
            }
        )
    return render(
        request,
        "alerts.html",
        status_code=status_code,
        unavailable=None,
        rules=rules,
        webhook=alerts.webhook(),
        fired=await alerts.recent(RECENT_SHOWN),
        pending=alerts.pending,
        dropped=alerts.dropped,
        bounds=bounds,
        titles={kind.value: spec.title for kind, spec in SPECS.items()},
        **values,
    )


def _alerts(request: Request[Any, Any, Any]) -> Alerts:
    alerts = console(request).service.alerts
    if alerts is None:
        raise ClientException(UNAVAILABLE)
    return alerts


def _record(
    request: Request[Any, Any, Any], action: _Action, target: str, outcome: Literal["done", "refused"], detail: str
) -> None:
    peer = request.client.host if request.client is not None else None
    record(request, AuditEntry(f"user:{session_of(request).user}", action, target, outcome, detail, peer))


def _field(form: FormMultiDict, key: str) -> str:
    value = form.get(key)
    return value[:_FIELD_MAX] if isinstance(value, str) else ""


ROUTES = [alerts_page, fired_part, save_rules, set_webhook, remove_webhook, send_test]
