"""An activated upload's probation and a refused upload, against the real daemon over the HTTP API, with the model
folders checked on disk: an operator's unload during the probation ends it unjudged and keeps every version; a
probation that fails removes only what its upload added, as edged's own action; an upload refused when it loads
leaves the device as it was (ready, the index unchanged).

Being "within the probation window" is made certain, not raced: the window is 600 s, far longer than any test.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import modelgen  # type: ignore[import-not-found, unused-ignore]
import numpy as np
import pytest
import tritonclient.http as httpclient
from archives import zip_folder
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, REPO_ROOT, Reply, Server, add_sub_inputs, request, run_server
from tritonclient.utils import InferenceServerException

WINDOW_S: Final = 600
# How long a test waits for something the daemon does on its own (generous: the machine may be loaded).
DEADLINE_S: Final = 120.0

_ECHO: Final = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
"""
_BROKEN: Final = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("broken on purpose")) for _ in requests]
"""
_PYTHON_CONFIG: Final = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


# --- the daemon ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("probation")


@pytest.fixture(scope="module")
def token(scratch: Path) -> str:
    """An operator's API token, made before the daemon starts, in its state directory."""
    made = subprocess.run(
        [sys.executable, "-m", "edged", "token", "--state-dir", str(scratch / "state"), "create", "--name",
         "line-4", "--role", "operator"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=True,
    )  # fmt: skip
    return made.stdout.strip()


@pytest.fixture(scope="module")
def server(scratch: Path, token: str) -> Iterator[Server]:
    del token  # made first, in the same state database
    repository = scratch / "repository"
    modelgen.write_add_sub(repository / "resident", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_add_sub(repository / "idle", max_batch_size=8, dims=16, dtype="FP32")
    with run_server(
        [repository],
        "--model-control-mode=explicit",
        "--load-model=resident",
        f"--state-dir={scratch / 'state'}",
        f"--sync-probation-secs={WINDOW_S}",
    ) as running:
        yield running


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the folders to be archived are written (never served from here)."""
    return tmp_path_factory.mktemp("probation-sources")


# --- helpers -----------------------------------------------------------------------------------------------------


def add_sub(sources: Path, name: str) -> Path:
    if not (sources / name).exists():
        modelgen.write_add_sub(sources / name, max_batch_size=8, dims=16, dtype="FP32")
    return sources / name


def python_model(sources: Path, name: str, code: str) -> Path:
    """A Python model folder: its config, and version 1 running ``code``."""
    folder = sources / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(_PYTHON_CONFIG.format(name=name))
    (folder / "1" / "model.py").write_text(code)
    return folder


def upload(server: Server, token: str, model: str, body: bytes, *, activate: bool) -> Reply:
    query = "?activate=true" if activate else "?activate=false"
    headers = {"Content-Type": "application/zip", "Authorization": f"Bearer {token}"}
    return request(server.http_url, "POST", f"/v2/edged/models/{model}/upload{query}", body, headers)


def control(server: Server, token: str, model: str, action: str) -> Reply:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    return request(server.http_url, "POST", f"/v2/repository/models/{model}/{action}", "{}", headers)


def history(server: Server, model: str) -> list[dict[str, Any]]:
    reply = request(server.http_url, "GET", f"/v2/edged/models/{model}/history?limit=1000")
    assert reply.status == 200, reply.body
    events: list[dict[str, Any]] = reply.json()["events"]
    return events


def wait_for_event(server: Server, model: str, state: str) -> dict[str, Any]:
    """The newest event ``state`` of ``model``, once the history has one."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        found = [event for event in history(server, model) if event["state"] == state]
        if found:
            return found[0]
        time.sleep(0.1)
    pytest.fail(f"no {state} event for model '{model}' within {DEADLINE_S:.0f} s: {history(server, model)[:10]}")


def index(server: Server) -> list[tuple[str, str, str]]:
    reply = request(server.http_url, "POST", "/v2/repository/index", "{}", {"Content-Type": "application/json"})
    assert reply.status == 200, reply.body
    return sorted((e["name"], e.get("version", ""), e.get("state", "")) for e in reply.json())


def ready(server: Server) -> int:
    return request(server.http_url, "GET", "/v2/health/ready").status


def files(folder: Path) -> list[str]:
    """The files of a model folder (without the bytecode a Python model's run may leave)."""
    found = (path.relative_to(folder) for path in folder.rglob("*") if path.is_file())
    return sorted(path.as_posix() for path in found if "__pycache__" not in path.parts)


def infer_add_sub(server: Server, model: str, version: str = "") -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer(model, add_sub_inputs(), model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)


def echo(client: httpclient.InferenceServerClient, model: str) -> np.ndarray[Any, Any]:
    data = np.arange(4, dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(data)
    answer: np.ndarray[Any, Any] = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    return answer


def fail_until_removed(server: Server, model: str) -> dict[str, Any]:
    """Sends requests to ``model`` (whose served version fails each) until its probation removes the upload;
    returns the UPLOAD_REMOVED event."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            removed = [event for event in history(server, model) if event["state"] == "UPLOAD_REMOVED"]
            if removed:
                return removed[0]
            for _ in range(5):
                # Every request fails: that is what the probation counts.
                with contextlib.suppress(InferenceServerException):
                    echo(client, model)
        pytest.fail(f"the upload of '{model}' was not removed within {DEADLINE_S:.0f} s: {history(server, model)[:10]}")
    finally:
        client.close()


# --- an operator's unload during the probation ---------------------------------------------------------------------


def test_an_unload_during_the_probation_ends_it_unjudged_and_keeps_every_version(
    server: Server, token: str, sources: Path, scratch: Path
) -> None:
    folder = scratch / "repository" / "steady"
    created = upload(server, token, "steady", zip_folder(add_sub(sources, "steady")), activate=True)
    assert created.status == 200, created.body
    assert created.json()["loaded"] is True and created.json()["probation_s"] == WINDOW_S
    # A second version, never activated: never on probation.
    added = upload(server, token, "steady", zip_folder(add_sub(sources, "steady") / "1"), activate=False)
    assert added.status == 200, added.body
    assert added.json()["version"] == 2 and added.json()["loaded"] is False
    assert files(folder) == ["1/model.onnx", "2/model.onnx", "config.pbtxt"]

    unloaded = control(server, token, "steady", "unload")
    assert unloaded.status == 200, unloaded.body
    ended = wait_for_event(server, "steady", "PROBATION_ENDED")
    assert "unloaded" in ended["reason"] and "stays installed" in ended["reason"], ended
    # Recorded as edged's own, not as the operator's who unloaded.
    assert ended["source"] == "probation" and ended["actor"] is None, ended
    events = history(server, "steady")
    assert not [event for event in events if event["state"] == "UPLOAD_REMOVED"], events
    unloads = [event for event in events if event["state"] == "UNLOADING"]
    assert unloads and unloads[0]["actor"] == "token:line-4" and unloads[0]["source"] == "api", unloads
    assert files(folder) == ["1/model.onnx", "2/model.onnx", "config.pbtxt"]
    assert ready(server) == 200

    # Nothing was lost: the model loads again, its default policy serving the newest version.
    loaded = control(server, token, "steady", "load")
    assert loaded.status == 200, loaded.body
    infer_add_sub(server, "steady", "2")
    assert files(folder) == ["1/model.onnx", "2/model.onnx", "config.pbtxt"]


def test_a_load_during_the_probation_ends_it_too(server: Server, token: str, sources: Path, scratch: Path) -> None:
    created = upload(server, token, "reloaded", zip_folder(add_sub(sources, "reloaded")), activate=True)
    assert created.status == 200 and created.json()["probation_s"] == WINDOW_S, created.body
    assert control(server, token, "reloaded", "load").status == 200
    ended = wait_for_event(server, "reloaded", "PROBATION_ENDED")
    assert "loaded again" in ended["reason"] and ended["actor"] is None, ended
    infer_add_sub(server, "reloaded")
    assert files(scratch / "repository" / "reloaded") == ["1/model.onnx", "config.pbtxt"]


# --- a probation that fails --------------------------------------------------------------------------------------


def test_a_failed_probation_removes_only_what_its_upload_added(
    server: Server, token: str, sources: Path, scratch: Path
) -> None:
    folder = scratch / "repository" / "fickle"
    created = upload(server, token, "fickle", zip_folder(python_model(sources, "fickle", _BROKEN)), activate=True)
    assert created.status == 200 and created.json()["probation_s"] == WINDOW_S, created.body
    # A good version put beside it meanwhile, not activated: it is no part of the upload on probation.
    good = python_model(sources, "fickle-good", _ECHO)
    added = upload(server, token, "fickle", zip_folder(good / "1"), activate=False)
    assert added.status == 200 and added.json()["version"] == 2, added.body

    removed = fail_until_removed(server, "fickle")
    assert "failed its probation" in removed["reason"], removed
    # edged removed it, on its own: not whoever uploaded it.
    assert removed["source"] == "probation" and removed["actor"] is None, removed
    assert removed["version"] == 1
    assert files(folder) == ["2/model.py", "config.pbtxt"]
    assert ready(server) == 200
    # Nothing serves the model now (it was new: unloaded), and it loads from the version that stayed.
    assert control(server, token, "fickle", "load").status == 200
    with httpclient.InferenceServerClient(server.http_url) as client:
        np.testing.assert_array_equal(echo(client, "fickle"), np.arange(4, dtype=np.float32))


def test_a_new_model_that_fails_its_probation_is_gone_from_disk_and_index(
    server: Server, token: str, sources: Path, scratch: Path
) -> None:
    created = upload(server, token, "doomed", zip_folder(python_model(sources, "doomed", _BROKEN)), activate=True)
    assert created.status == 200, created.body
    removed = fail_until_removed(server, "doomed")
    assert removed["source"] == "probation" and removed["actor"] is None, removed
    assert not (scratch / "repository" / "doomed").exists()
    deadline = time.monotonic() + DEADLINE_S
    while any(name == "doomed" for name, _, _ in index(server)) and time.monotonic() < deadline:
        time.sleep(0.1)  # the unload finishes once the requests it had are answered
    assert not any(name == "doomed" for name, _, _ in index(server)), index(server)
    assert ready(server) == 200


# --- an upload refused when it loads ------------------------------------------------------------------------------


def _lacking_input(sources: Path, name: str) -> Path:
    """add_sub whose config names an input (INPUTX) its ONNX file does not have."""
    folder = sources / name
    if not folder.exists():
        modelgen.write_add_sub(folder, max_batch_size=8, dims=16, dtype="FP32")
        config = folder / "config.pbtxt"
        config.write_text(config.read_text().replace('"INPUT0"', '"INPUTX"'))
    return folder


def test_a_new_model_refused_when_it_loads_leaves_the_device_as_it_was(
    server: Server, token: str, sources: Path, scratch: Path
) -> None:
    assert ready(server) == 200
    before = index(server)
    refused = upload(server, token, "mismatch", zip_folder(_lacking_input(sources, "mismatch")), activate=True)
    assert refused.status == 400, refused.body
    assert "failed to load" in refused.json()["error"], refused.body
    assert not (scratch / "repository" / "mismatch").exists()
    assert ready(server) == 200
    assert index(server) == before
    infer_add_sub(server, "resident")


def test_a_version_refused_when_it_loads_leaves_the_model_serving_as_before(
    server: Server, token: str, sources: Path, scratch: Path
) -> None:
    # A version whose ONNX file lacks an input of the model's config: its graph takes INPUTX, not INPUT0.
    odd = sources / "odd"
    if not odd.exists():
        modelgen.write_add_sub(odd, max_batch_size=8, dims=16, dtype="FP32")
        onnx_file = odd / "1" / "model.onnx"
        onnx_file.write_bytes(onnx_file.read_bytes().replace(b"INPUT0", b"INPUTX"))
    repository = scratch / "repository"
    for model, loaded in (("resident", True), ("idle", False)):
        before, on_disk = index(server), files(repository / model)
        refused = upload(server, token, model, zip_folder(odd / "1"), activate=True)
        assert refused.status == 400, refused.body
        assert "failed to load" in refused.json()["error"], refused.body
        assert files(repository / model) == on_disk
        assert ready(server) == 200, model
        assert index(server) == before, model
        if loaded:
            infer_add_sub(server, model)


# --- an operator's day, across a restart ------------------------------------------------------------------------------


def test_an_upload_unloaded_loaded_again_and_the_device_restarted_is_still_served(
    sources: Path, tmp_path: Path
) -> None:
    """Upload with activation, unload during the probation, load again, restart the device: the model is on
    disk, served after the restart, and its history still says what happened before it."""
    repository = tmp_path / "repository"
    modelgen.write_add_sub(repository / "resident", max_batch_size=8, dims=16, dtype="FP32")
    scratch = tmp_path / "state"
    made = subprocess.run(
        [sys.executable, "-m", "edged", "token", "--state-dir", str(scratch), "create", "--name", "line-6",
         "--role", "operator"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=True,
    )  # fmt: skip
    secret = made.stdout.strip()
    arguments = ("--model-control-mode=explicit", "--load-model=*", f"--state-dir={scratch}",
                 f"--sync-probation-secs={WINDOW_S}")  # fmt: skip
    with run_server([repository], *arguments) as first:
        created = upload(first, secret, "daily", zip_folder(add_sub(sources, "daily")), activate=True)
        assert created.status == 200 and created.json()["probation_s"] == WINDOW_S, created.body
        assert control(first, secret, "daily", "unload").status == 200
        wait_for_event(first, "daily", "PROBATION_ENDED")
        assert control(first, secret, "daily", "load").status == 200
        infer_add_sub(first, "daily")
    assert files(repository / "daily") == ["1/model.onnx", "config.pbtxt"]

    with run_server([repository], *arguments) as second:
        infer_add_sub(second, "daily")
        assert ("daily", "1", "READY") in index(second)
        states = [event["state"] for event in history(second, "daily")]
        assert "UPLOAD_REMOVED" not in states and "PROBATION_ENDED" in states, states
        assert states[0] == "READY", states
    assert files(repository / "daily") == ["1/model.onnx", "config.pbtxt"]
