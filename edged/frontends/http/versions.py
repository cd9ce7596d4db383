"""``POST /v2/edged/models/{model}/versions/{version}/activate`` and ``POST /v2/edged/models/{model}/rollback``:
which versions of a model serve, chosen by an operator (edged.core.repository.versions). Model-repository access,
as the rest of /v2/edged/models.

Both answer 200 with ``{"model", "versions", "previous"}`` (the versions serving now, those that served before);
errors as every route's: 400 (no such version, nothing to roll back to, a version that fails to load), 404 (no
such model, or a version that is not digits: no route, as Triton's router has it), 503 (control mode not explicit).
Neither takes fields: a body is empty or ``{}`` (400 naming any field).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import MediaType, Request, Response, post
from litestar.exceptions import NotFoundException

from edged.frontends.bodies import no_fields
from edged.frontends.http.codec import encode, url_version

if TYPE_CHECKING:
    from edged.core.repository.versions import ServedVersions
    from edged.core.service import InferenceService


def _service(request: Request[Any, Any, Any]) -> InferenceService:
    service: InferenceService = request.app.state.service
    return service


def _answer(served: ServedVersions) -> Response[bytes]:
    return Response(encode(served.to_json()), status_code=200, media_type=MediaType.JSON)


@post("/v2/edged/models/{model:str}/versions/{version:str}/activate", status_code=200)
async def version_activate(request: Request[Any, Any, Any], model: str, version: str) -> Response[bytes]:
    """Serve exactly this version of the model, swapped in beside the one serving."""
    if not (version.isascii() and version.isdigit()):
        raise NotFoundException()
    await no_fields(request, "activation")
    return _answer(await _service(request).activate_version(model, url_version(version)))


@post("/v2/edged/models/{model:str}/rollback", status_code=200)
async def version_rollback(request: Request[Any, Any, Any], model: str) -> Response[bytes]:
    """Serve again the versions that served before the model's last change of served versions."""
    await no_fields(request, "rollback")
    return _answer(await _service(request).rollback_version(model))
