"""edged's OpenAPI document held to the wire: requests generated from it (valid ones, and ones that break it) go to a
real daemon, and every answer must be one the document describes: a documented status, a body of the documented
schema and content type, errors as JSON ``{"error": ...}``, and never the answer to an unhandled exception. The
daemon must log no traceback (``run_server`` fails the test otherwise) and must still serve afterwards.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
import requests
import schemathesis
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from server import Server, assert_still_serving, post_json, request, run_server

from edged.frontends.http import HttpOptions, create_http_app
from edged.frontends.http.openapi import openapi_document

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import modelgen  # type: ignore[import-not-found, unused-ignore]

if TYPE_CHECKING:
    from schemathesis.checks import CheckContext

# Requests per operation and generation mode, and per operation for each model the repository holds: some 270
# requests in all, about 20 s on a small machine.
EXAMPLES: Final = 4
KNOWN_MODEL_EXAMPLES: Final = 4
MODELS: Final = ("add_sub", "identity_bytes")
# What edged answers for an unhandled exception; any other 500 is one of Triton's INTERNAL errors.
UNHANDLED: Final = "internal error"


def _document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(openapi_document())
    return document


def test_document_is_openapi_3_and_names_every_route() -> None:
    document = _document()
    assert document["openapi"].startswith("3.")
    paths = set(document["paths"])
    for path in (
        "/v2/health/live",
        "/v2/models/{model}/versions/{version}/infer",
        "/v2/models/{model}/config",
        "/v2/models/stats",
        "/v2/repository/models/{model}/load",
        "/v2/logging",
        "/v2/trace/setting",
        "/v2/systemsharedmemory/region/{region}/register",
        "/v2/edged/models/{model}/history",
    ):
        assert path in paths
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")) and not path.startswith("/v2/health/"):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, f"{method} {path} {status}"


@pytest.fixture(scope="module")
def fuzz_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("openapi-repository")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_identity(repo / "identity_bytes", "BYTES", max_batch_size=8, dims=[-1])
    return repo


@pytest.fixture(scope="module")
def fuzz_server(fuzz_repository: Path) -> Iterator[Server]:
    # Explicit model control, so that load and unload do what they would in the field; client shared memory on,
    # so registration is parsed rather than refused up front.
    with run_server([fuzz_repository], "--model-control-mode=explicit", "--load-model=*", "--allow-client-shm") as s:
        yield s


def errors_are_documented_json(ctx: CheckContext, response: schemathesis.Response, case: Case[Any]) -> None:
    """An error is ``{"error": "<message>"}`` (the health endpoints' bare 400 aside), never an unhandled exception."""
    del ctx
    if response.status_code < 400:
        return
    documented = case.operation.definition.raw["responses"].get(str(response.status_code), {})
    if "content" not in documented and response.status_code != 500:
        assert response.content == b"", f"{response.status_code} has a body where the document says none"
        return
    body = json.loads(response.content)
    assert isinstance(body, dict) and isinstance(body.get("error"), str), f"not an error body: {body!r}"
    assert body["error"] != UNHANDLED, f"an unhandled exception answered {case.method} {case.formatted_path}"


CHECKS: Final = [
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    errors_are_documented_json,
]


def _exercise(strategy: st.SearchStrategy[Case[Any]], base_url: str, examples: int) -> int:
    session = requests.Session()
    sent = 0

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Case[Any]) -> None:
        nonlocal sent
        response = case.call(base_url=base_url, session=session, timeout=30)
        sent += 1
        case.validate_response(response, checks=CHECKS)

    run()
    return sent


def _operations(schema: Any) -> list[Any]:
    operations = [result.ok() for result in schema.get_all_operations()]
    # Changing the log settings could turn off the error log this test reads for tracebacks: last, on its own.
    return sorted(operations, key=lambda operation: operation.label == "POST /v2/logging")


@pytest.mark.slow
def test_every_answer_is_documented(fuzz_server: Server) -> None:
    schema = schemathesis.openapi.from_dict(_document())
    base_url = f"http://{fuzz_server.http_url}"
    sent = 0
    for operation in _operations(schema):
        sent += _exercise(operation.as_strategy(generation_mode=GenerationMode.POSITIVE), base_url, EXAMPLES)
        with contextlib.suppress(Unsatisfiable):  # nothing to get wrong: no parameter and no body
            sent += _exercise(operation.as_strategy(generation_mode=GenerationMode.NEGATIVE), base_url, EXAMPLES)
        if "model" in {parameter.name for parameter in operation.path_parameters}:
            names = {parameter.name for parameter in operation.path_parameters}
            for model in MODELS:
                fixed = {"model": model, "version": "1"}
                strategy = operation.as_strategy(path_parameters={k: v for k, v in fixed.items() if k in names})
                sent += _exercise(strategy, base_url, KNOWN_MODEL_EXAMPLES)
    assert sent > 200, f"only {sent} requests were sent"
    print(f"{sent} requests")

    # Whatever the loads and unloads left, a plain load serves the repository's model again.
    for model in MODELS:
        assert post_json(fuzz_server.http_url, f"/v2/repository/models/{model}/load", {}).status == 200
    post_json(fuzz_server.http_url, "/v2/logging", {"log_info": True, "log_warning": True, "log_error": True})
    with httpclient.InferenceServerClient(fuzz_server.http_url) as client:
        assert_still_serving(client)


@pytest.mark.parametrize(
    "path", ["/v2/models/add_sub/infer", "/v2/logging", "/v2/repository/index", "/v2/repository/models/add_sub/load"]
)
def test_json_strings_that_are_not_utf8_are_refused(fuzz_server: Server, path: str) -> None:
    # Found by the property tests: the JSON decoder raised UnicodeDecodeError, answered as an unhandled exception.
    reply = request(fuzz_server.http_url, "POST", path, b'{"\x80": 1}', {"Content-Type": "application/json"})
    assert reply.status == 500
    assert "not valid UTF-8" in reply.error()


def test_history_paging_past_int64_is_refused(fuzz_server: Server) -> None:
    for query in (f"offset={2**63}", f"limit={2**64}", "offset=-1", "limit=0"):
        reply = request(fuzz_server.http_url, "GET", f"/v2/edged/history?{query}")
        assert reply.status == 400, reply.body
        assert "offset" in reply.error()


def test_the_daemon_serves_the_document_of_every_route(fuzz_server: Server) -> None:
    reply = request(fuzz_server.http_url, "GET", "/v2/openapi.json")
    assert (reply.status, reply.body) == (200, openapi_document())
    assert (reply.header("content-type") or "").startswith("application/json")
    routes = {route.path.replace(":str", "") for route in create_http_app(Any, HttpOptions())._app.routes}  # type: ignore[arg-type, attr-defined]
    assert routes - set(_document()["paths"]) == set(), "a route the document does not describe"
