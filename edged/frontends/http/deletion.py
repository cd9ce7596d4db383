"""``DELETE /v2/edged/models/{model}`` and ``DELETE /v2/edged/models/{model}/versions/{version}``: a model's folder,
or one version folder, taken out of the model repository (edged.core.repository.deletion). Model-repository access,
as the rest of /v2/edged/models.

Both answer 200 with ``{"model", "version", "deleted": true}`` (``version`` null for a whole model); 404 for no such
model or version on disk (or a version that is not digits: no route), 409 for what cannot be deleted now (a version
that serves, a model with one, a synced model), 400 for a name that cannot be a model's. Neither takes a body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import MediaType, Request, Response, delete
from litestar.exceptions import NotFoundException

from edged.errors import EdgedError, ErrorCode
from edged.frontends.http.codec import encode, error_body, url_version
from edged.frontends.statuses import status_for

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from edged.core.repository.deletion import ModelDeletion
    from edged.core.service import InferenceService


def _deletion(request: Request[Any, Any, Any]) -> ModelDeletion:
    service: InferenceService = request.app.state.service
    if service.uploads is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, "this server changes no model repository")
    return service.uploads.deletion


async def _answer(done: Awaitable[None], model: str, version: int | None) -> Response[bytes]:
    try:
        await done
    except EdgedError as error:
        status = 409 if error.code is ErrorCode.ALREADY_EXISTS else status_for(error)
        return Response(error_body(error.message), status_code=status, media_type=MediaType.JSON)
    return Response(encode({"model": model, "version": version, "deleted": True}), media_type=MediaType.JSON)


@delete("/v2/edged/models/{model:str}", status_code=200)
async def model_delete(request: Request[Any, Any, Any], model: str) -> Response[bytes]:
    """Delete the model's folder; refused while any version of it serves."""
    return await _answer(_deletion(request).delete_model(model), model, None)


@delete("/v2/edged/models/{model:str}/versions/{version:str}", status_code=200)
async def version_delete(request: Request[Any, Any, Any], model: str, version: str) -> Response[bytes]:
    """Delete one version folder of the model; refused while that version serves."""
    if not (version.isascii() and version.isdigit()):
        raise NotFoundException()
    number = url_version(version)
    return await _answer(_deletion(request).delete_version(model, number), model, number)
