"""What loopback's trust grants, against the real daemon from 127.0.0.1: the guarded APIs for models as the
repository holds them, but neither token management nor anything that brings code for the daemon to run (an upload,
a load with a config or file: override), which need a credential from every address. A credential presented on
loopback is what the request is judged by. And edged's management bodies refuse fields they do not know, naming
them, where Triton's own bodies keep Triton's leniency.

The code a refused request carries is a Python model that leaves a marker file when it is imported or initialized:
the marker is looked for after every refusal, and a credentialed request shows that it would have appeared.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import modelgen  # type: ignore[import-not-found, unused-ignore]
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import REPO_ROOT, Reply, Server, api_token, bearer, post_json, request, run_server, state_dir_of
from tritonclient.utils import InferenceServerException

# A Python model that marks its import and its initialization on disk: code the daemon ran.
_MODEL: Final = """import pathlib

pathlib.Path({marker!r}).write_text("imported")

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pathlib.Path({marker!r} + ".initialized").write_text("initialized")

    def execute(self, requests):
        tensors = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]) for data in tensors]
"""
_CONFIG: Final = {
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
}
_CONFIG_PBTXT: Final = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
NEEDS_A_TOKEN: Final = "needs an API token, from this machine too"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loopback-trust")


@pytest.fixture(scope="module")
def server(scratch: Path) -> Iterator[Server]:
    repository = scratch / "repository"
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_add_sub(repository / "spare", max_batch_size=8, dims=16, dtype="FP32")
    with run_server(
        [repository],
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--allow-console=false",
        f"--state-dir={scratch / 'state'}",
    ) as running:
        yield running


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args], capture_output=True, text=True, cwd=REPO_ROOT, check=False, timeout=60
    )


def _markers(scratch: Path, name: str) -> tuple[Path, Path]:
    marker = scratch / "markers" / name
    marker.parent.mkdir(exist_ok=True)
    return marker, Path(f"{marker}.initialized")


def _model_zip(name: str, marker: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{name}/config.pbtxt", _CONFIG_PBTXT.format(name=name))
        archive.writestr(f"{name}/1/model.py", _MODEL.format(marker=str(marker)))
    return buffer.getvalue()


def _upload(server: Server, name: str, body: bytes, headers: dict[str, str], *, activate: bool = False) -> Reply:
    query = "?activate=true" if activate else ""
    path = f"/v2/edged/models/{name}/upload{query}"
    return request(server.http_url, "POST", path, body, {"Content-Type": "application/zip", **headers})


def _grpc_refusal(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), str(info.value.message())


# --- token management -----------------------------------------------------------------------------------------


def test_token_management_needs_a_credential_on_loopback(server: Server) -> None:
    for method, path, body in (
        ("POST", "/v2/edged/tokens", json.dumps({"name": "minted", "role": "admin"})),
        ("GET", "/v2/edged/tokens", None),
        ("DELETE", "/v2/edged/tokens/anything", None),
    ):
        reply = request(server.http_url, method, path, body, {"Content-Type": "application/json"})
        assert reply.status == 401, (method, reply.body)
        assert reply.error().startswith(f"token management {NEEDS_A_TOKEN}"), reply.error()
        assert reply.header("www-authenticate") == 'Bearer realm="edged"'
    # An operator's token is no admin's, on loopback as anywhere.
    reply = post_json(
        server.http_url, "/v2/edged/tokens", {"name": "minted", "role": "admin"}, bearer(api_token(server))
    )
    assert (reply.status, reply.error()) == (403, "the operator role does not grant the tokens API")
    # The command line, which needs the state directory's permissions, makes the first one; with it, the API.
    state = str(state_dir_of(server))
    made = _edged("token", "--state-dir", state, "create", "--name", "first-admin", "--role", "admin")
    assert made.returncode == 0, made.stderr
    admin = bearer(made.stdout.strip())
    reply = post_json(server.http_url, "/v2/edged/tokens", {"name": "minted", "role": "viewer"}, admin)
    assert reply.status == 200, reply.body
    minted = reply.json()["token"]
    listed = request(server.http_url, "GET", "/v2/edged/tokens", headers=admin).json()["tokens"]
    assert {"first-admin", "minted"} <= {token["name"] for token in listed}
    # What it made works as what it is: a viewer, here on loopback too.
    assert request(server.http_url, "GET", "/v2/models/add_sub", headers=bearer(minted)).status == 200
    assert post_json(server.http_url, "/v2/repository/models/spare/load", {}, bearer(minted)).status == 403
    assert request(server.http_url, "DELETE", "/v2/edged/tokens/minted", headers=admin).status == 200


# --- code --------------------------------------------------------------------------------------------------------


def test_an_upload_from_loopback_needs_a_credential_and_its_code_never_runs(server: Server, scratch: Path) -> None:
    marker, initialized = _markers(scratch, "uploaded")
    body = _model_zip("uploaded", marker)
    for activate in (False, True):
        reply = _upload(server, "uploaded", body, {}, activate=activate)
        assert reply.status == 401, reply.body
        assert reply.error().startswith(f"sending a model's files or config {NEEDS_A_TOKEN}"), reply.error()
    viewer = api_token(server, "viewer")
    assert _upload(server, "uploaded", body, bearer(viewer)).status == 403
    assert not marker.exists() and not initialized.exists()
    assert not (scratch / "repository" / "uploaded").exists()
    uploads = scratch / "state" / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())
    # With an operator's token the same archive is taken, and its check (a trial load) runs the code: the marker
    # is what the refusals above would have left.
    reply = _upload(server, "uploaded", body, bearer(api_token(server)))
    assert reply.status == 200, reply.body
    assert marker.read_text() == "imported" and initialized.read_text() == "initialized"
    assert (scratch / "repository" / "uploaded" / "1" / "model.py").is_file()
    events = request(server.http_url, "GET", "/v2/edged/models/uploaded/history").json()["events"]
    uploaded = [str(e["actor"]) for e in events if e["state"] == "UPLOADED"]
    assert len(uploaded) == 1 and uploaded[0].startswith("token:test-operator-"), uploaded


def test_a_load_with_overrides_from_loopback_needs_a_credential(server: Server, scratch: Path) -> None:
    marker, initialized = _markers(scratch, "overridden")
    source = _MODEL.format(marker=str(marker)).encode()
    config = json.dumps({"name": "overridden", **_CONFIG})
    body = {"parameters": {"config": config, "file:1/model.py": base64.b64encode(source).decode()}}
    path = "/v2/repository/models/overridden/load"
    reply = post_json(server.http_url, path, body)
    assert reply.status == 401 and reply.error().startswith(f"sending a model's files or config {NEEDS_A_TOKEN}")
    assert reply.header("www-authenticate") == 'Bearer realm="edged"'
    # A config override alone may name what runs too (another backend, a Python environment to execute).
    alone = post_json(server.http_url, "/v2/repository/models/spare/load", {"parameters": {"config": "{}"}})
    assert alone.status == 401, alone.body
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    files = {"file:1/model.py": source}
    code, message = _grpc_refusal(lambda: grpc.load_model("overridden", config=config, files=files))
    assert code == "StatusCode.UNAUTHENTICATED" and message.startswith("sending a model's files or config")
    viewer = bearer(api_token(server, "viewer"))
    code, _ = _grpc_refusal(lambda: grpc.load_model("overridden", config=config, files=files, headers=viewer))
    assert code == "StatusCode.PERMISSION_DENIED"
    assert post_json(server.http_url, path, body, viewer).status == 403
    assert not marker.exists() and not initialized.exists()
    # The models the repository holds are loopback's to load and unload, as before.
    client = httpclient.InferenceServerClient(server.http_url)
    client.load_model("spare")
    client.unload_model("spare")
    grpc.load_model("spare")
    # With an operator's token the override loads, and its code runs.
    reply = post_json(server.http_url, path, body, bearer(api_token(server)))
    assert reply.status == 200, reply.body
    assert initialized.read_text() == "initialized"
    client.unload_model("overridden")


# --- a credential on loopback is what counts ------------------------------------------------------------------------


def test_a_credential_on_loopback_is_judged_as_presented(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    viewer = bearer(api_token(server, "viewer"))
    # Without one, loopback is trusted; with a viewer's, the request is a viewer's.
    client.load_model("spare")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("spare", headers=viewer)
    assert info.value.status() == "403"
    with pytest.raises(InferenceServerException) as info:
        client.get_log_settings(headers=viewer)
    assert info.value.status() == "403"
    assert client.get_model_metadata("add_sub", headers=viewer)["name"] == "add_sub"
    assert client.get_inference_statistics("add_sub", headers=viewer)["model_stats"]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    code, _ = _grpc_refusal(lambda: grpc.unload_model("spare", headers=viewer))
    assert code == "StatusCode.PERMISSION_DENIED"
    # A token that is no valid one is refused, not overlooked for the address.
    reply = post_json(server.http_url, "/v2/repository/models/spare/load", {}, bearer("edged_0123_nothing"))
    assert (reply.status, reply.error()) == (401, "the API token is not valid (unknown, revoked or expired)")
    client.unload_model("spare")


# --- management bodies ------------------------------------------------------------------------------------------


def test_management_bodies_refuse_unknown_fields_and_tritons_keep_their_leniency(server: Server) -> None:
    admin = bearer(api_token(server, "admin"))
    reply = post_json(server.http_url, "/v2/edged/tokens", {"name": "t", "role": "viewer", "expires": "1d"}, admin)
    assert (reply.status, reply.error()) == (
        400,
        "unknown field 'expires' in the token request (known: name, role, expires_in_s)",
    )
    listed = request(server.http_url, "GET", "/v2/edged/tokens", headers=admin).json()["tokens"]
    assert "t" not in {token["name"] for token in listed}
    for path, document, error in (
        ("/v2/edged/sync/now", {"now": True}, "unknown field 'now' in the sync request (it takes none)"),
        ("/v2/edged/sync/pause", {"for_s": 60, "why": "x"}, "unknown fields 'for_s', 'why' in the sync request"),
        ("/v2/edged/models/add_sub/rollback", {"version": 1}, "unknown field 'version' in the rollback request"),
        ("/v2/edged/models/add_sub/versions/1/activate", {"x": 1}, "unknown field 'x' in the activation request"),
    ):
        reply = post_json(server.http_url, path, document)
        assert reply.status == 400 and reply.error().startswith(error), (path, reply.body)
    assert request(server.http_url, "POST", "/v2/edged/sync/now", b"[1]").status == 400
    # No fields at all is no refusal of fields: here, no synced repository to act on (503).
    assert post_json(server.http_url, "/v2/edged/sync/now", {}).status == 503
    # Triton's repository bodies ignore what they do not know, as Triton's do.
    assert post_json(server.http_url, "/v2/repository/models/spare/load", {"parameters": {}, "extra": 1}).status == 200
    assert post_json(server.http_url, "/v2/repository/models/spare/unload", {"extra": 1}).status == 200
