"""The upload page: a model archive (``.zip``, ``.tar.gz``, or a folder packed as a tar in the browser) dropped or
picked, sent by upload.js with its progress shown, installed as a new model or as the next version of one.

``POST /models/{name}/upload?activate=...`` takes the raw archive as its body, as the API's upload endpoint does
(edged.frontends.http.uploads, whose streaming and type checks it uses): written to a file under the state
directory as it arrives, never held in memory, then checked and installed by the core. It answers JSON for
upload.js, with the API's status codes: 200 installed, 400 refused for what it holds (``problems`` lists each),
409 a model that cannot be uploaded to, 411 no Content-Length, 413 past the upload size limit, 415 not an archive.

The size limit: the console's connection protocol answers 413 to a declared Content-Length over
``--upload-max-bytes`` before the body is read (edged.frontends.http.limits gives this path that limit), and this
route takes only bodies with a declared length, reading no more than it declares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from litestar import MediaType, Request, Response, get, post
from litestar.response import Template

from edged.core.repository.uploads import UploadInvalid
from edged.errors import EdgedError, ErrorCode
from edged.frontends.bodies import BodyTooLarge, activate_flag, archive_kind, archive_type_refusal, receive_archive
from edged.frontends.console import auth
from edged.frontends.console.pages import acting, console, render, session_of
from edged.frontends.statuses import status_for

if TYPE_CHECKING:
    from edged.core.repository.uploads import ModelUploads


@get("/upload", guards=[auth.operator])
async def upload_page(request: Request[Any, Any, Any]) -> Template:
    service = console(request).service
    names = sorted({model.name for model in service.model_summaries()})
    return render(request, "upload.html", models=names, takes_uploads=service.uploads is not None)


@post(
    "/models/{name:str}/upload",
    guards=[auth.operator, auth.csrf],
    status_code=200,
    # The size is bounded by the declared length, itself bounded by the connection protocol (see the docstring).
    request_max_body_size=None,
)
async def upload_model(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    """Install the archive in the body as model ``name`` or as its next version; ``?activate=true`` loads it."""
    refusal = archive_type_refusal(request.headers)
    if refusal is not None:
        return _refused(415, name, refusal)
    declared = request.headers.get("content-length", "")
    if not declared.isdigit():
        # A chunked body has no size to check before it is read: the browser always declares one.
        return _refused(411, name, "an upload declares its size (Content-Length): send the archive as one body")
    try:
        activate = activate_flag(request.query_params.get("activate", "false"))
        uploads = _uploads(request)
        with acting(session_of(request)):
            # Refused before the body is read: a name that cannot be a model's, a synced model.
            await uploads.precheck(name, activate=activate)
            async with uploads.receiving() as path:
                await receive_archive(request, path, int(declared))
                result = await uploads.install(name, path, archive_kind(path), activate=activate)
    except BodyTooLarge as error:
        return _refused(413, name, str(error))
    except UploadInvalid as error:
        return _answer(400, {**_empty(error.model), "version": error.version, "error": error.message,
                             "problems": error.problems})  # fmt: skip
    except EdgedError as error:
        status = 409 if error.code is ErrorCode.ALREADY_EXISTS else status_for(error)
        return _refused(status, name, error.message)
    return _answer(200, {**result.to_json(), "error": None})


def _uploads(request: Request[Any, Any, Any]) -> ModelUploads:
    uploads = console(request).service.uploads
    if uploads is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, "this server takes no model uploads")
    return uploads


def _empty(name: str) -> dict[str, Any]:
    return {"model": name, "version": None, "created": False, "loaded": False, "problems": [], "error": None}


def _refused(status: int, name: str, message: str) -> Response[bytes]:
    return _answer(status, {**_empty(name), "error": message})


def _answer(status: int, value: dict[str, Any]) -> Response[bytes]:
    return Response(msgspec.json.encode(value), status_code=status, media_type=MediaType.JSON)


ROUTES = [upload_page, upload_model]
