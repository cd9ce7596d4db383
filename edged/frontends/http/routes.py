"""KServe v2 over HTTP (Litestar on uvicorn), with Triton's extensions and Triton's status codes.

The infer endpoint is a plain ASGI handler in front of the app (edged.frontends.http.infer); the other endpoints
are the ordinary Litestar handlers here.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from typing import TYPE_CHECKING, Any

from litestar import Litestar, MediaType, Request, Response, get, post, route
from litestar.exceptions import InternalServerException, MethodNotAllowedException, NotFoundException

from edged.core.access import ACTOR, AccessDenied, AccessPolicy, Category, load_brings_code
from edged.core.config.model_config import model_config_to_json
from edged.errors import EdgedError, ErrorCode
from edged.frontends import kserve
from edged.frontends.access import check_code, refusal_parts
from edged.frontends.bodies import no_fields
from edged.frontends.http.audit import record as _audit
from edged.frontends.http.codec import (
    decode_json,
    encode,
    error_body,
    url_version,
)
from edged.frontends.http.deletion import model_delete, version_delete
from edged.frontends.http.infer import HttpOptions, InferRoute
from edged.frontends.http.openapi import openapi_route
from edged.frontends.http.tokens import token_create, token_list, token_revoke
from edged.frontends.http.uploads import model_upload
from edged.frontends.http.versions import version_activate, version_rollback
from edged.frontends.statuses import status_for
from edged.frontends.trace_settings import http_update
from edged.frontends.trace_settings import trace_setting as trace_setting_of

if TYPE_CHECKING:
    from edged.core.audit import AuditLog
    from edged.core.service import InferenceService
    from edged.core.sync_control import SyncControl

log = logging.getLogger(__name__)

# What Litestar's request.body() raises (as InternalServerException) when the client is gone.
_CLIENT_GONE = "client disconnected prematurely"


def _error_response(error: EdgedError) -> Response[bytes]:
    return Response(error_body(error.message), status_code=status_for(error), media_type=MediaType.JSON)


def _json(value: Any) -> Response[bytes]:
    return Response(encode(value), status_code=200, media_type=MediaType.JSON)


def _service(request: Request[Any, Any, Any]) -> InferenceService:
    service: InferenceService = request.app.state.service
    return service


def _decode(request: Request[Any, Any, Any], body: bytes) -> Any:
    """A JSON body, within --http-max-json-depth as the infer route is."""
    options: HttpOptions = request.app.state.options
    return decode_json(body, options.max_json_depth)


def _version(text: str | None) -> int:
    """URL versions must be digits; anything else is an unknown path, as in Triton's router."""
    if text is not None and not (text.isascii() and text.isdigit()):
        raise NotFoundException()
    return url_version(text)


# --- health and metadata --------------------------------------------------------------------------------


@get("/v2/health/live", sync_to_thread=False)
def health_live(request: Request[Any, Any, Any]) -> Response[bytes]:
    return Response(b"", status_code=200 if _service(request).is_live() else 400)


@get("/v2/health/ready", sync_to_thread=False)
def health_ready(request: Request[Any, Any, Any]) -> Response[bytes]:
    return Response(b"", status_code=200 if _service(request).is_ready() else 400)


@get("/v2", sync_to_thread=False)
def server_metadata(request: Request[Any, Any, Any]) -> Response[bytes]:
    meta = _service(request).server_metadata()
    return _json({"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)})


@get(
    ["/v2/models/{model:str}/ready", "/v2/models/{model:str}/versions/{version:str}/ready"],
    sync_to_thread=False,
)
def model_ready(request: Request[Any, Any, Any], model: str, version: str | None = None) -> Response[bytes]:
    if _service(request).model_ready(model, _version(version)):
        return Response(b"", status_code=200)
    return Response(error_body("Model version not ready"), status_code=400, media_type=MediaType.JSON)


@get(["/v2/models/{model:str}", "/v2/models/{model:str}/versions/{version:str}"], sync_to_thread=False)
def model_metadata(request: Request[Any, Any, Any], model: str, version: str | None = None) -> Response[bytes]:
    return _json(kserve.model_metadata(_service(request).model_metadata(model, _version(version))))


@get(
    ["/v2/models/{model:str}/config", "/v2/models/{model:str}/versions/{version:str}/config"],
    sync_to_thread=False,
)
def model_config(request: Request[Any, Any, Any], model: str, version: str | None = None) -> Response[bytes]:
    config = _service(request).model_config(model, _version(version))
    return Response(model_config_to_json(config), status_code=200, media_type=MediaType.JSON)


@get(
    ["/v2/models/stats", "/v2/models/{model:str}/stats", "/v2/models/{model:str}/versions/{version:str}/stats"],
    sync_to_thread=False,
)
def model_statistics(request: Request[Any, Any, Any], model: str = "", version: str | None = None) -> Response[bytes]:
    stats = _service(request).statistics(model, _version(version))
    return _json({"model_stats": kserve.model_statistics(stats)})


# --- trace and log settings ---------------------------------------------------------------------------


@route(["/v2/trace/setting", "/v2/models/{model:str}/trace/setting"], http_method=["GET", "POST"], status_code=200)
async def trace_setting(request: Request[Any, Any, Any], model: str = "") -> Response[bytes]:
    update = None
    if request.method == "POST":
        parsed = _decode(request, await request.body())
        # As Triton: a body that is JSON but not an object sets nothing.
        update = http_update(parsed if isinstance(parsed, dict) else {})
    return _json(trace_setting_of(_service(request), model, update, http=True))


@route("/v2/logging", http_method=["GET", "POST"], status_code=200)
async def logging_setting(request: Request[Any, Any, Any]) -> Response[bytes]:
    if request.method == "POST":
        body = await request.body()
        if not body.strip():
            raise EdgedError(ErrorCode.INTERNAL, "failed to parse the request JSON buffer: The document is empty. at 0")
        kserve.update_log_settings(_JsonLogSettings(_json_object(_decode(request, body), "logging settings")), "HTTP")
    return _json(kserve.log_settings())


class _JsonLogSettings:
    """A logging request's JSON object, with Triton's HTTP errors (and codes) for values of the wrong type. A null
    value sets nothing; a body that is not an object is refused (400), where Triton ignores it: a client that sends
    one has a bug to learn of."""

    def __init__(self, document: dict[str, Any]) -> None:
        self._document = document

    def sets(self, key: str) -> bool:
        return self._document.get(key) is not None

    def boolean(self, key: str) -> bool:
        value = self._document[key]
        if not isinstance(value, bool):
            raise EdgedError(ErrorCode.INTERNAL, "attempt to access JSON non-boolean as boolean")
        return value

    def unsigned(self, key: str) -> int:
        value = self._document[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
            raise EdgedError(ErrorCode.INTERNAL, "attempt to access JSON non-unsigned-integer as unsigned-integer")
        return value

    def string(self, key: str) -> str:
        value = self._document[key]
        if not isinstance(value, str):
            raise EdgedError(ErrorCode.INTERNAL, "attempt to access JSON non-string as string")
        return value

    def bad_format(self, text: str) -> EdgedError:
        # Triton's own code for this one, though it is the client's mistake.
        return EdgedError(ErrorCode.UNAVAILABLE, f"invalid argument for --log_format, got: {text}")


# --- shared memory ----------------------------------------------------------------------------------------


@get(["/v2/systemsharedmemory/status", "/v2/systemsharedmemory/region/{region:str}/status"], sync_to_thread=False)
def system_shm_status(request: Request[Any, Any, Any], region: str = "") -> Response[bytes]:
    regions = _service(request).shared_memory.system_status(region)
    return _json([{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions])


@post("/v2/systemsharedmemory/region/{region:str}/register", status_code=200)
async def system_shm_register(request: Request[Any, Any, Any], region: str) -> Response[bytes]:
    body = _decode(request, await request.body())
    if not isinstance(body, dict):
        raise EdgedError(
            ErrorCode.INTERNAL, "Unable to parse 'key': attempt to access non-existing object member 'key'"
        )
    key = _json_member(body, "key", str, "non-string as string")
    offset = _json_member(body, "offset", int, "non-unsigned-integer as unsigned-integer")
    byte_size = _json_member(body, "byte_size", int, "non-unsigned-integer as unsigned-integer")
    _service(request).shared_memory.register_system(region, key, offset, byte_size)
    return Response(b"", status_code=200)


@post(["/v2/systemsharedmemory/unregister", "/v2/systemsharedmemory/region/{region:str}/unregister"], status_code=200)
async def system_shm_unregister(request: Request[Any, Any, Any], region: str = "") -> Response[bytes]:
    _service(request).shared_memory.unregister_system(region)
    return Response(b"", status_code=200)


@get(["/v2/cudasharedmemory/status", "/v2/cudasharedmemory/region/{region:str}/status"], sync_to_thread=False)
def cuda_shm_status(request: Request[Any, Any, Any], region: str = "") -> Response[bytes]:
    return _json(_service(request).shared_memory.cuda_status(region))


@post("/v2/cudasharedmemory/region/{region:str}/register", status_code=200)
async def cuda_shm_register(request: Request[Any, Any, Any], region: str) -> Response[bytes]:
    _service(request).shared_memory.register_cuda(region)
    return Response(b"", status_code=200)


@post(["/v2/cudasharedmemory/unregister", "/v2/cudasharedmemory/region/{region:str}/unregister"], status_code=200)
async def cuda_shm_unregister(request: Request[Any, Any, Any], region: str = "") -> Response[bytes]:
    _service(request).shared_memory.unregister_cuda(region)
    return Response(b"", status_code=200)


def _json_member(body: dict[str, Any], key: str, kind: type, what: str) -> Any:
    # Triton reports malformed JSON members with its INTERNAL code (HTTP 500) and this wording.
    if key not in body:
        raise EdgedError(
            ErrorCode.INTERNAL, f"Unable to parse '{key}': attempt to access non-existing object member '{key}'"
        )
    value = body[key]
    negative = isinstance(value, int) and value < 0
    if not isinstance(value, kind) or isinstance(value, bool) or negative:
        raise EdgedError(ErrorCode.INTERNAL, f"Unable to parse '{key}': attempt to access JSON {what}")
    return value


_READY_CONTAINER = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


def _ready_not_boolean() -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, "Invalid value for 'ready': expected a boolean")


@post("/v2/repository/index", status_code=200)
async def repository_index(request: Request[Any, Any, Any]) -> Response[bytes]:
    body = await request.body()
    ready = False
    if body.strip():
        try:
            parsed = _decode(request, body)
        except EdgedError as exc:
            if exc.code is ErrorCode.INVALID_ARG and _READY_CONTAINER.match(body):
                # As Triton: a 'ready' nested too deep to read is first of all not a boolean.
                raise _ready_not_boolean() from None
            raise
        # The Python client sends the JSON string "" for "no options": anything but an object carries none.
        value = parsed.get("ready", False) if isinstance(parsed, dict) else False
        if not isinstance(value, bool):
            # Triton 2.51 answers 500 "attempt to access JSON non-boolean as boolean"; its tests now expect this.
            raise _ready_not_boolean()
        ready = value
    return _json(kserve.repository_index(_service(request).repository_index(ready)))


def _json_object(parsed: Any, what: str) -> dict[str, Any]:
    if not isinstance(parsed, dict):
        kind = (
            "null"
            if parsed is None
            else {list: "an array", str: "a string", bool: "a boolean"}.get(type(parsed), "a number")
        )
        raise EdgedError(ErrorCode.INVALID_ARG, f"the {what} request body must be a JSON object, got {kind}")
    return parsed


def _repository_parameters(request: Request[Any, Any, Any], body: bytes, what: str) -> dict[str, Any]:
    """The ``parameters`` object of a load or unload body (which may be empty); a body that is not an object is
    refused (Triton ignores it)."""
    if not body.strip():
        return {}
    parsed = _json_object(_decode(request, body), what)
    parameters = parsed.get("parameters", {})
    if not isinstance(parameters, dict):
        raise EdgedError(ErrorCode.INTERNAL, "attempt to access JSON non-object as object")
    return parameters


@post("/v2/repository/models/{model:str}/load", status_code=200)
async def repository_load(request: Request[Any, Any, Any], model: str) -> Response[bytes]:
    parameters = _repository_parameters(request, await request.body(), "load")
    # Overrides bring what the daemon would run: asked of the access policy now that the body tells (gRPC's guard
    # asks before its servicer, from the request).
    if load_brings_code(parameters):
        denied = check_code(request.scope, request.app.state.access, Category.MODEL_REPOSITORY)
        if denied is not None:
            return _refused(denied)
    config, files = kserve.load_overrides(_JsonLoadParameters(model, parameters))
    await _service(request).load_model(model, config, files)
    return Response(b"", status_code=200)


def _refused(denied: AccessDenied) -> Response[bytes]:
    status, headers, body = refusal_parts(denied)
    return Response(body, status_code=status, headers=headers, media_type=MediaType.JSON)


class _JsonLoadParameters:
    """A load request's JSON ``parameters``: every value a string (Triton reads them all as strings), the files'
    contents in base64."""

    def __init__(self, model: str, parameters: dict[str, Any]) -> None:
        for value in parameters.values():
            if not isinstance(value, str):
                raise EdgedError(ErrorCode.INTERNAL, "attempt to access JSON non-string as string")
        self._model = model
        self._parameters: dict[str, str] = parameters

    def names(self) -> list[str]:
        return list(self._parameters)

    def config(self, key: str) -> str:
        return self._parameters[key]

    def file(self, key: str) -> bytes:
        try:
            return base64.b64decode(self._parameters[key], validate=True)
        except binascii.Error:
            raise EdgedError(
                ErrorCode.INVALID_ARG, f"failed to load '{self._model}': '{key}' is not valid base64"
            ) from None


@post("/v2/repository/models/{model:str}/unload", status_code=200)
async def repository_unload(request: Request[Any, Any, Any], model: str) -> Response[bytes]:
    dependents = _repository_parameters(request, await request.body(), "unload").get("unload_dependents", False)
    await _service(request).unload_model(model, unload_dependents=dependents is True)
    return Response(b"", status_code=200)


@get(["/v2/edged/history", "/v2/edged/models/{model:str}/history"])
async def model_history(request: Request[Any, Any, Any], model: str | None = None) -> Response[bytes]:
    """What happened to a model (or to every model), newest first: ``?offset=&limit=`` pages through it."""
    try:
        offset = int(request.query_params.get("offset", "0"))
        limit = int(request.query_params.get("limit", "50"))
    except ValueError:
        raise EdgedError(ErrorCode.INVALID_ARG, "offset and limit must be integers") from None
    events, total = await _service(request).model_history(model, offset, limit)
    return _json(
        {
            "model": model,
            "offset": offset,
            "limit": limit,
            "total": total,
            "events": [
                {
                    "id": event.id,
                    "model": event.model,
                    "version": event.version,
                    "state": event.state,
                    "previous": event.previous,
                    "source": event.source,
                    "reason": event.reason,
                    "at": event.at.isoformat(),
                    "duration_s": event.duration_s,
                    "actor": event.actor,
                }
                for event in events
            ],
        }
    )


@get("/v2/edged/metrics/history", sync_to_thread=False)
def metrics_history(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The last minutes of metrics, a point a second: ``?model=`` one model's only, ``?since=`` (the ``time`` of the
    last point a poll received) only the points after it."""
    model = request.query_params.get("model") or None
    since_text = request.query_params.get("since")
    try:
        since = float(since_text) if since_text else None
    except ValueError:
        raise EdgedError(ErrorCode.INVALID_ARG, "'since' must be a number of seconds since the epoch") from None
    return _json(_service(request).metrics_history(model, since))


@post(
    [
        "/v2/repository/{repository:str}/index",
        "/v2/repository/{repository:str}/models/{model:str}/load",
        "/v2/repository/{repository:str}/models/{model:str}/unload",
    ],
    status_code=200,
)
async def named_repository(repository: str) -> Response[bytes]:
    del repository
    raise EdgedError(ErrorCode.UNSUPPORTED, "'repository_name' specification is not supported")


# --- inference ------------------------------------------------------------------------------------------


def _edged_error_handler(_: Request[Any, Any, Any], exc: EdgedError) -> Response[bytes]:
    return _error_response(exc)


def _not_found_handler(_: Request[Any, Any, Any], __: Exception) -> Response[bytes]:
    return Response(error_body("Not Found"), status_code=404, media_type=MediaType.JSON)


def _method_handler(_: Request[Any, Any, Any], __: Exception) -> Response[bytes]:
    return Response(error_body("Method Not Allowed"), status_code=405, media_type=MediaType.JSON)


def _internal_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    status = getattr(exc, "status_code", 500)
    if isinstance(exc, InternalServerException) and exc.detail == _CLIENT_GONE:
        # Litestar's word for a client that left (or was cut off for sending too slowly) mid-body; nobody reads this.
        log.debug("client of %s %s went away before its body was read", request.method, request.url.path)
        return Response(error_body("client disconnected"), status_code=400, media_type=MediaType.JSON)
    if status >= 500:
        log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
        return Response(error_body("internal error"), status_code=500, media_type=MediaType.JSON)
    detail = getattr(exc, "detail", "") or "Bad Request"
    return Response(error_body(str(detail)), status_code=status, media_type=MediaType.JSON)


# --- repository sync (operator) ------------------------------------------------------------------------------


def _sync(request: Request[Any, Any, Any]) -> SyncControl:
    sync = _service(request).sync
    if sync is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, "no model repository of this server is synced (s3:// or gs://)")
    return sync


@get("/v2/edged/sync")
async def sync_status(request: Request[Any, Any, Any]) -> Response[bytes]:
    return _json(_sync(request).status())


@post("/v2/edged/sync/now", status_code=200)
async def sync_now(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Sync every remote repository now; answers when the runs are done (the probation goes on after)."""
    await no_fields(request, "sync")
    sync = _sync(request)
    log.info("repository sync asked for by %s", ACTOR.get() or "anonymous")
    _audit(request, "sync-now", "repository", "")
    return _json({"runs": await sync.run_now()})


@post("/v2/edged/sync/pause", status_code=200)
async def sync_pause(request: Request[Any, Any, Any]) -> Response[bytes]:
    await no_fields(request, "sync")
    sync = _sync(request)
    sync.pause()
    log.info("repository sync paused by %s", ACTOR.get() or "anonymous")
    _audit(request, "sync-pause", "repository", "")
    return _json(sync.status())


@post("/v2/edged/sync/resume", status_code=200)
async def sync_resume(request: Request[Any, Any, Any]) -> Response[bytes]:
    await no_fields(request, "sync")
    sync = _sync(request)
    sync.resume()
    log.info("repository sync resumed by %s", ACTOR.get() or "anonymous")
    _audit(request, "sync-resume", "repository", "")
    return _json(sync.status())


@get("/v2/edged/sync/history")
async def sync_history(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The sync runs, newest first: ``?offset=&limit=`` pages through them."""
    try:
        offset = int(request.query_params.get("offset", "0"))
        limit = int(request.query_params.get("limit", "50"))
    except ValueError:
        raise EdgedError(ErrorCode.INVALID_ARG, "offset and limit must be integers") from None
    if not 0 <= offset < 2**63 or not 1 <= limit <= 1000:
        raise EdgedError(ErrorCode.INVALID_ARG, "history paging needs 0 <= offset < 2**63 and 1 <= limit <= 1000")
    runs, total = await _sync(request).history(offset, limit)
    return _json({"offset": offset, "limit": limit, "total": total, "runs": runs})


def create_http_app(
    service: InferenceService,
    options: HttpOptions,
    access: AccessPolicy | None = None,
    audit: AuditLog | None = None,
) -> InferRoute:
    app = Litestar(
        route_handlers=[
            health_live,
            health_ready,
            server_metadata,
            model_ready,
            model_metadata,
            model_config,
            model_statistics,
            repository_index,
            trace_setting,
            logging_setting,
            system_shm_status,
            system_shm_register,
            system_shm_unregister,
            cuda_shm_status,
            cuda_shm_register,
            cuda_shm_unregister,
            repository_load,
            repository_unload,
            model_history,
            metrics_history,
            model_upload,
            model_delete,
            version_delete,
            version_activate,
            version_rollback,
            sync_status,
            sync_now,
            sync_pause,
            sync_resume,
            sync_history,
            named_repository,
            openapi_route,
            token_list,
            token_create,
            token_revoke,
        ],
        exception_handlers={
            EdgedError: _edged_error_handler,
            NotFoundException: _not_found_handler,
            MethodNotAllowedException: _method_handler,
            Exception: _internal_handler,
        },
        request_max_body_size=options.max_input_size,
        openapi_config=None,
        logging_config=None,
    )
    app.state.service = service
    app.state.options = options
    app.state.access = access
    app.state.audit = audit
    return InferRoute(app, service, options)
