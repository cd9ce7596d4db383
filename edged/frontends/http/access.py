"""Which API category (edged.core.access.Category) each HTTP route belongs to, as Triton groups its routes for
``--http-restricted-api``. Every path edged serves has one; any other path counts as model-repository, the most
guarded, so that no route can be reached around the policy by a spelling the router accepts and this does not."""

from __future__ import annotations

from typing import Final

from edged.core.access import Category

_TOP: Final = {
    "health": Category.HEALTH,
    "systemsharedmemory": Category.SHARED_MEMORY,
    "cudasharedmemory": Category.SHARED_MEMORY,
    "repository": Category.MODEL_REPOSITORY,
    "trace": Category.TRACE,
    "logging": Category.LOGGING,
    # edged's own: the model history, and the document of this API.
    "edged": Category.MODEL_REPOSITORY,
    "openapi.json": Category.METADATA,
}
_MODEL: Final = {
    (): Category.METADATA,
    ("ready",): Category.HEALTH,
    ("infer",): Category.INFERENCE,
    ("generate",): Category.INFERENCE,
    ("generate_stream",): Category.INFERENCE,
    ("config",): Category.MODEL_CONFIG,
    ("stats",): Category.STATISTICS,
    ("trace", "setting"): Category.TRACE,
}


def http_category(method: str, path: str) -> Category:
    del method  # a category holds every method of its routes, as in Triton
    parts = [part for part in path.split("/") if part]
    if parts[:1] != ["v2"]:
        return Category.MODEL_REPOSITORY
    if len(parts) == 1:
        return Category.METADATA  # GET /v2
    if parts[1:3] == ["edged", "tokens"]:
        return Category.TOKENS
    if parts[1:4] == ["edged", "metrics", "history"]:
        return Category.STATISTICS  # read-only, as the statistics extension it is drawn from
    if parts[1] != "models":
        return _TOP.get(parts[1], Category.MODEL_REPOSITORY)
    if parts[2:] == ["stats"]:
        return Category.STATISTICS  # every model's statistics
    rest = parts[3:]
    if rest[:1] == ["versions"]:
        rest = rest[2:]
    return _MODEL.get(tuple(rest), Category.MODEL_REPOSITORY)


def http_brings_code(method: str, path: str) -> bool:
    """Whether the request brings code for the daemon to run whatever its body holds: a model upload (a model's
    files, from which a load, or the upload's own check, runs whatever the backend runs). Decided from the path, so
    that the body is never read for a caller who may not send it. A load's overrides are in its body: its handler
    asks (edged.core.access.load_brings_code)."""
    del method  # the route takes POST only; any other method is refused as the same request
    parts = [part for part in path.split("/") if part]
    return parts[:3] == ["v2", "edged", "models"] and len(parts) > 3 and parts[-1] == "upload"
