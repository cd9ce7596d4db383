"""``POST /v2/edged/models/{model}/upload[?activate=true]``: a model archive as the raw body, streamed to a file
under the state directory (never held whole in memory) within ``--upload-max-bytes``, then installed by the core
(edged.core.repository.uploads).

Answers ``{"model", "version", "created", "loaded", "problems"}``: 200 when installed; 400 with the problems for an
archive or model that is refused (``error`` holds the first); 409 for a model that cannot be uploaded to (synced);
413 past the size limit (the connection protocol answers a declared Content-Length over it before the body is
read); 415 for a body that is not a zip or tar archive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import MediaType, Request, Response, post

from edged.core.repository.uploads import UploadInvalid
from edged.errors import EdgedError, ErrorCode
from edged.frontends.bodies import (
    BodyTooLarge,
    activate_flag,
    archive_kind,
    archive_type_refusal,
    declared_too_large,
    receive_archive,
)
from edged.frontends.http.codec import encode, error_body
from edged.frontends.statuses import status_for

if TYPE_CHECKING:
    from edged.core.repository.uploads import ModelUploads
    from edged.core.service import InferenceService
    from edged.frontends.http.infer import HttpOptions


def _uploads(request: Request[Any, Any, Any]) -> ModelUploads:
    service: InferenceService = request.app.state.service
    if service.uploads is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, "this server takes no model uploads")
    return service.uploads


def _answer(status: int, value: Any) -> Response[bytes]:
    return Response(encode(value), status_code=status, media_type=MediaType.JSON)


@post("/v2/edged/models/{model:str}/upload", status_code=200, request_max_body_size=None)
async def model_upload(request: Request[Any, Any, Any], model: str) -> Response[bytes]:
    """Install the archive in the body as model ``model`` or as its next version; ``?activate=true`` loads it."""
    uploads = _uploads(request)
    options: HttpOptions = request.app.state.options
    refusal = archive_type_refusal(request.headers)
    if refusal is not None:
        return Response(error_body(refusal), status_code=415, media_type=MediaType.JSON)
    activate = activate_flag(request.query_params.get("activate", "false"))
    limit = options.max_upload_size
    try:
        too_large = declared_too_large(request.headers.get("content-length"), limit, "upload")
        if too_large is not None:
            raise too_large
        # Refused before the body is read: a name that cannot be a model's, a synced model.
        await uploads.precheck(model, activate=activate)
        async with uploads.receiving() as path:
            await receive_archive(request, path, limit)
            result = await uploads.install(model, path, archive_kind(path), activate=activate)
    except BodyTooLarge as error:
        return Response(error_body(str(error)), status_code=413, media_type=MediaType.JSON)
    except UploadInvalid as error:
        body = {
            "error": error.message,
            "model": error.model,
            "version": error.version,
            "loaded": False,
            "problems": error.problems,
        }
        return _answer(400, body)
    except EdgedError as error:
        status = 409 if error.code is ErrorCode.ALREADY_EXISTS else status_for(error)
        return Response(error_body(error.message), status_code=status, media_type=MediaType.JSON)
    return _answer(200, result.to_json())
