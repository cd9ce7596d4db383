"""Model control: explicit and poll modes, the repository API with overrides, swaps without downtime, the
history kept in SQLite, and a daemon that comes back serving what it served. Real daemon, real SQLite file, real
tritonclient; clients keep sending requests while models change, and none of their requests may fail."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import modelgen
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import PYTHON_MODELS
from server import (
    ADD_SUB_INPUT0,
    ADD_SUB_INPUT1,
    Server,
    add_sub_inputs,
    api_token,
    bearer,
    post_json,
    request,
    run_server,
)
from tritonclient.utils import InferenceServerException

WAIT_S: Final = 30.0


def _wait(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _index(client: httpclient.InferenceServerClient) -> dict[tuple[str, str], dict[str, str]]:
    return {(e["name"], e.get("version", "")): e for e in client.get_model_repository_index()}


def _statistics(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
    return stats


def _history(server: Server, model: str, **query: int) -> dict[str, Any]:
    path = f"/v2/edged/models/{model}/history"
    if query:
        path += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    reply = request(server.http_url, "GET", path)
    assert reply.status == 200, reply.body
    document: dict[str, Any] = json.loads(reply.body)
    return document


def _add_sub(repo: Path, name: str, versions: tuple[int, ...] = (1,), policy: str = "") -> Path:
    model = repo / name
    modelgen.write_add_sub(model, max_batch_size=8)
    for version in versions:
        if version != 1:
            shutil.copytree(model / "1", model / str(version))
    if versions and 1 not in versions:
        shutil.rmtree(model / "1")
    config = model / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace('name: "add_sub"', f'name: "{name}"')
    config.write_text(text + policy, encoding="utf-8")
    return model


class ClosedLoop:
    """Clients that send add_sub requests one after another, and keep every failure."""

    def __init__(self, server: Server, model: str, clients: int = 2, parameters: dict[str, Any] | None = None) -> None:
        self._server = server
        self._model = model
        self._parameters = parameters
        self._stop = threading.Event()
        self.sent = 0
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> ClosedLoop:
        for thread in self._threads:
            thread.start()
        _wait(lambda: self.sent > 20, "the clients to run")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self._server.http_url)
        while not self._stop.is_set():
            try:
                result = client.infer(self._model, add_sub_inputs(), parameters=self._parameters)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
            except Exception as exc:  # every failure is the test's business
                self.failures.append(repr(exc))
            self.sent += 1
        client.close()


# --- explicit mode --------------------------------------------------------------------------------------------


# auto_complete_config must give back the config it completed; this one forgets to.
NO_RETURN_MODEL: Final = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(0)

    def execute(self, requests):
        return []
"""


@pytest.fixture
def explicit(tmp_path: Path) -> Iterator[tuple[Server, Path, Path]]:
    repo = tmp_path / "repo"
    state = tmp_path / "state"
    repo.mkdir()
    _add_sub(repo, "served")
    _add_sub(repo, "waiting")
    shutil.copytree(PYTHON_MODELS / "init_fails", repo / "init_fails")
    (repo / "no_return" / "1").mkdir(parents=True)
    (repo / "no_return" / "1" / "model.py").write_text(NO_RETURN_MODEL, encoding="utf-8")
    slow = repo / "slow"
    shutil.copytree(PYTHON_MODELS / "add_sub_python", slow)
    config = slow / "config.pbtxt"
    config.write_text(config.read_text(encoding="utf-8").replace('"add_sub_python"', '"slow"'), encoding="utf-8")
    with run_server(
        [repo], "--model-control-mode=explicit", "--load-model=served", "--load-model=slow", f"--state-dir={state}"
    ) as server:
        yield server, repo, state


def test_explicit_mode_loads_what_it_is_asked(explicit: tuple[Server, Path, Path]) -> None:
    server, _, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    index = _index(client)
    assert index[("served", "1")]["state"] == "READY"
    assert index[("waiting", "")] == {"name": "waiting"}  # in the repository, never loaded
    client.load_model("waiting")
    assert client.is_model_ready("waiting")
    client.unload_model("waiting")
    assert _index(client)[("waiting", "1")] == {
        "name": "waiting",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }
    assert not client.is_model_ready("waiting")
    # An unloaded model is not one that should be served: the server stays ready (strict readiness).
    assert client.is_server_ready()
    # Unknown models: a load fails as in Triton, an unload is no error.
    with pytest.raises(InferenceServerException) as info:
        client.load_model("nosuch")
    assert info.value.message() == "failed to load 'nosuch', failed to poll from model repository"
    client.unload_model("nosuch")
    # A model that fails says why, with Triton's words.
    with pytest.raises(InferenceServerException) as info:
        client.load_model("init_fails")
    assert info.value.status() == "400"
    assert info.value.message().startswith("load failed for model 'init_fails': version 1 is at UNAVAILABLE state: ")
    assert "weights file is missing" in info.value.message()
    # A model that should be served and is not: the server is not ready, until it is unloaded.
    assert not client.is_server_ready()
    client.unload_model("init_fails")
    assert client.is_server_ready()


def test_an_auto_complete_that_returns_nothing_fails_the_load(explicit: tuple[Server, Path, Path]) -> None:
    server, _, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("no_return")
    assert (
        "auto_complete_config function in model 'no_return' must return a valid pb.ModelConfig object."
        in caught.value.message()
    )
    assert client.is_server_live() and client.is_model_ready("served")


def test_the_load_api_over_grpc(explicit: tuple[Server, Path, Path]) -> None:
    server, _, _ = explicit
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.load_model("waiting")
    assert client.is_model_ready("waiting")
    client.unload_model("waiting")
    assert not client.is_model_ready("waiting")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("nosuch")
    assert info.value.status() == "StatusCode.INTERNAL"


@pytest.mark.parametrize("model", ["served", "slow"])
def test_swaps_under_load_lose_no_request(explicit: tuple[Server, Path, Path], model: str) -> None:
    server, repo, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    # The Python model answers in 50 ms (echo_args): requests are in flight whenever a version changes.
    parameters = {"echo_args": True} if model == "slow" else None
    with ClosedLoop(server, model, clients=3, parameters=parameters) as loop:
        # A new version: it loads beside version 1 and replaces it (the default policy serves the latest).
        shutil.copytree(repo / model / "1", repo / model / "2")
        client.load_model(model)
        _wait(lambda: _index(client)[(model, "1")].get("reason") == "unloaded", "version 1 to unload")
        # A changed config: reloaded beside the serving one.
        config = repo / model / "config.pbtxt"
        base = config.read_text(encoding="utf-8").replace("instance_group [ { count: 2 kind: KIND_CPU } ]", "")
        base += "dynamic_batching { }\n"
        config.write_text(base + "instance_group [ { count: 1 } ]\n", encoding="utf-8")
        client.load_model(model)
        # Only the instance count changes: instances are added in place, no reload (the statistics go on)...
        sent = loop.sent
        _wait(lambda: loop.sent > sent + 10, "requests before the count changes")
        served = _statistics(client, model)["inference_count"]
        for count in (2, 1, 2):  # ...and removed: the instance that goes finishes what it has first
            config.write_text(base + f"instance_group [ {{ count: {count} }} ]\n", encoding="utf-8")
            client.load_model(model)
            assert _statistics(client, model)["inference_count"] >= served
        sent = loop.sent
        _wait(lambda: loop.sent > sent + 20, "requests after the last change")
    assert loop.failures == []
    assert "dynamic_batching" in client.get_model_config(model)
    assert client.get_model_config(model)["instance_group"][0]["count"] == 2
    index = _index(client)
    assert index[(model, "2")]["state"] == "READY"
    resized = [e for e in _history(server, model)["events"] if e["reason"].startswith("instances changed in place")]
    assert len(resized) == 3


def test_a_sequence_model_whose_instance_count_changes_keeps_its_sequences(
    explicit: tuple[Server, Path, Path],
) -> None:
    # As Triton: instances are added and removed in place, so a sequence begun before the change goes on after it
    # (a reload would have lost it), and the instance that goes waits for the sequences that live on it.
    server, repo, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    config = repo / "served" / "config.pbtxt"
    base = config.read_text(encoding="utf-8") + "sequence_batching { max_sequence_idle_microseconds: 60000000 }\n"

    def infer(**flags: Any) -> None:
        result = client.infer("served", add_sub_inputs(), sequence_id=7, **flags)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)

    for count, flags in ((1, {"sequence_start": True}), (3, {}), (1, {"sequence_end": True})):
        config.write_text(base + f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n", encoding="utf-8")
        client.load_model("served")
        assert client.get_model_config("served")["instance_group"][0]["count"] == count
        infer(**flags)
    resized = [e for e in _history(server, "served")["events"] if e["reason"].startswith("instances changed in place")]
    assert len(resized) == 2


def test_a_broken_new_version_leaves_the_old_one_serving(explicit: tuple[Server, Path, Path]) -> None:
    server, repo, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    with ClosedLoop(server, "served") as loop:
        broken = repo / "served" / "3"
        broken.mkdir()
        (broken / "model.onnx").write_bytes(b"this is not an onnx model")
        with pytest.raises(InferenceServerException) as info:
            client.load_model("served")
        assert "load failed for model 'served': version 3 is at UNAVAILABLE state" in info.value.message()
        sent = loop.sent
        _wait(lambda: loop.sent > sent + 20, "requests after the failed load")
    assert loop.failures == []
    index = _index(client)
    assert index[("served", "1")]["state"] == "READY"
    assert index[("served", "3")]["state"] == "UNAVAILABLE"
    events = _history(server, "served")["events"]
    failed = [e for e in events if e["version"] == 3 and e["state"] == "UNAVAILABLE"]
    assert failed and failed[0]["source"] == "api"
    assert "onnx" in failed[0]["reason"].lower()


def test_load_with_a_config_override_and_files(explicit: tuple[Server, Path, Path], tmp_path: Path) -> None:
    server, _, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    # Overrides bring what the daemon runs: an operator's token, from loopback too.
    operator = bearer(api_token(server))
    config = client.get_model_config("served")
    config["max_batch_size"] = 4
    client.load_model("served", config=json.dumps(config), headers=operator)
    assert client.get_model_config("served")["max_batch_size"] == 4
    # A model that is not in the repository at all: its config and model file come with the request.
    staged = tmp_path / "staged"
    _add_sub(staged, "uploaded")
    files = {"file:1/model.onnx": (staged / "uploaded" / "1" / "model.onnx").read_bytes()}
    uploaded_config = json.dumps({"name": "uploaded", "platform": "onnxruntime_onnx", "max_batch_size": 8})
    client.load_model("uploaded", config=uploaded_config, files=files, headers=operator)
    result = client.infer("uploaded", add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)
    # A file beside the version folders, where a config's label_filename is looked for (as Triton writes it).
    labelled = json.loads(json.dumps(client.get_model_config("uploaded")))
    labelled["output"][0]["label_filename"] = "labels.txt"
    labels = "".join(f"label-{index}\n" for index in range(16)).encode()
    client.load_model(
        "uploaded", config=json.dumps(labelled), files={**files, "file:labels.txt": labels}, headers=operator
    )
    top = httpclient.InferRequestedOutput("OUTPUT0", class_count=1)
    result = client.infer("uploaded", add_sub_inputs(), outputs=[top])
    assert result.as_numpy("OUTPUT0").tolist() == [
        [f"{(ADD_SUB_INPUT0 + ADD_SUB_INPUT1)[0].max():f}:15:label-15".encode()]
    ]
    # Over gRPC the files travel as bytes.
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.load_model("uploaded", config=uploaded_config, files=files, headers=operator)
    assert grpc.is_model_ready("uploaded")


def test_a_plain_load_keeps_a_config_override_while_the_folder_is_unchanged(
    explicit: tuple[Server, Path, Path],
) -> None:
    # As Triton: a load without overrides after a config override keeps serving the override, until the model's
    # folder changes; a file: override is always undone by it.
    server, repo, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    operator = bearer(api_token(server))
    config = client.get_model_config("served")
    before = config["instance_group"][0]["count"]
    config["instance_group"][0]["count"] = before + 1
    client.load_model("served", config=json.dumps(config), headers=operator)
    # Only the count changed: the serving version takes one more instance, it is not loaded again.
    events = _history(server, "served")["events"]
    assert events[0]["reason"].startswith("instances changed in place"), events[0]
    client.load_model("served")
    assert client.get_model_config("served")["instance_group"][0]["count"] == before + 1
    assert not any(e["state"] == "LOADING" and e["version"] == 1 for e in _history(server, "served")["events"][:2])
    # The folder changes (its config is written again, the same text): the repository's config serves again.
    folder_config = repo / "served" / "config.pbtxt"
    folder_config.write_text(folder_config.read_text(encoding="utf-8"), encoding="utf-8")
    client.load_model("served")
    assert client.get_model_config("served")["instance_group"][0]["count"] == before
    # A file: override: undone by the next plain load although the folder did not change.
    model_file = (repo / "served" / "1" / "model.onnx").read_bytes()
    client.load_model("served", config=json.dumps(config), files={"file:1/model.onnx": model_file}, headers=operator)
    assert client.get_model_config("served")["instance_group"][0]["count"] == before + 1
    client.load_model("served")
    assert client.get_model_config("served")["instance_group"][0]["count"] == before
    # After an unload, a plain load reads the repository.
    client.load_model("served", config=json.dumps(config), headers=operator)
    client.unload_model("served")
    client.load_model("served")
    assert client.get_model_config("served")["instance_group"][0]["count"] == before
    np.testing.assert_array_equal(
        client.infer("served", add_sub_inputs()).as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1
    )


TRAVERSALS: Final = (
    "../escaped",
    "1/../../escaped",
    "/tmp/escaped",
    "1/./model.onnx",
    "1//model.onnx",
    "1/a\0b",
    "1\\..\\escaped",
    "config.pbtxt",
    "",
)


def test_override_paths_that_leave_the_model_are_refused(explicit: tuple[Server, Path, Path], tmp_path: Path) -> None:
    # Every key against one daemon (a daemon each would cost the suite some 20 s for the same checks).
    server, _, state = explicit
    operator = bearer(api_token(server))
    for key in TRAVERSALS:
        before = {p for p in tmp_path.rglob("*")}
        body = {
            "parameters": {
                "config": json.dumps({"name": "intruder", "backend": "python"}),
                f"file:{key}": base64.b64encode(b"import os\n").decode(),
            }
        }
        reply = post_json(server.http_url, "/v2/repository/models/intruder/load", body, operator)
        assert reply.status == 400, (key, reply.body)
        assert "is refused" in json.loads(reply.body)["error"], key
        # Nothing was written anywhere: not outside, not even a private copy.
        after = {p for p in tmp_path.rglob("*") if "edged.db" not in p.name}
        assert after - before <= {p for p in after if p.is_relative_to(state) and p.is_dir()}, key
    # Names no file system holds (one component over 255 bytes): the load fails as Triton's does when it cannot
    # write the files it was given, over both wires; nothing is left behind.
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for key in ("1/" + "a" * 256, "1/" + "\u00e9" * 128, "1/" + "b" * 300 + "/model.py", "c" * 256):
        before = {p for p in tmp_path.rglob("*")}
        config = json.dumps({"name": "intruder", "backend": "python"})
        body = {"parameters": {"config": config, f"file:{key}": base64.b64encode(b"x").decode()}}
        reply = post_json(server.http_url, "/v2/repository/models/intruder/load", body, operator)
        error = json.loads(reply.body)["error"]
        assert reply.status == 500, (key, error)
        assert error.startswith("failed to load 'intruder', failed to poll from model repository: override file")
        assert "a part of its path is longer than 255 bytes" in error and str(state) not in error
        with pytest.raises(InferenceServerException) as info:
            grpc.load_model("intruder", config=config, files={f"file:{key}": b"x"}, headers=operator)
        assert (info.value.status(), info.value.message()) == ("StatusCode.INTERNAL", error)
        after = {p for p in tmp_path.rglob("*") if "edged.db" not in p.name}
        assert after - before <= {p for p in after if p.is_relative_to(state) and p.is_dir()}, key
    assert httpclient.InferenceServerClient(server.http_url).is_model_ready("served")


def test_an_override_does_not_follow_links_out_of_the_model(
    explicit: tuple[Server, Path, Path], tmp_path: Path
) -> None:
    server, repo, _ = explicit
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, repo / "waiting" / "1" / "elsewhere")
    client = httpclient.InferenceServerClient(server.http_url)
    operator = bearer(api_token(server))
    config = {"name": "waiting", "platform": "onnxruntime_onnx", "max_batch_size": 8}
    # A config override copies the folder: the link is not carried over, so nothing can be written through it.
    client.load_model("waiting", config=json.dumps(config), headers=operator)
    assert client.is_model_ready("waiting")
    model = (repo / "waiting" / "1" / "model.onnx").read_bytes()
    files = {"file:1/model.onnx": model, "file:1/elsewhere/x": b"data"}
    client.load_model("waiting", config=json.dumps(config), files=files, headers=operator)
    assert list(outside.iterdir()) == []


def test_invalid_load_bodies(explicit: tuple[Server, Path, Path]) -> None:
    server, _, _ = explicit
    path, operator = "/v2/repository/models/waiting/load", bearer(api_token(server))
    reply = post_json(server.http_url, path, {"parameters": {"config": 7}}, operator)
    assert (reply.status, json.loads(reply.body)) == (500, {"error": "attempt to access JSON non-string as string"})
    reply = post_json(server.http_url, path, {"parameters": {"config": "{", "file:1/m": "!!"}}, operator)
    assert reply.status == 400
    assert json.loads(reply.body)["error"] == "failed to load 'waiting': 'file:1/m' is not valid base64"
    reply = post_json(server.http_url, path, {"parameters": {"config": "{bad"}}, operator)
    assert reply.status == 400
    assert "the 'config' override is not a model config" in json.loads(reply.body)["error"]
    reply = request(server.http_url, "POST", "/v2/repository/models/waiting/load", "notjson")
    assert reply.status == 500
    # Files without a config override: refused in Triton's words (the folder's config would describe other files).
    files = {"file:1/model.onnx": base64.b64encode(b"x").decode()}
    reply = post_json(server.http_url, path, {"parameters": files}, operator)
    assert reply.status == 500
    assert json.loads(reply.body)["error"] == (
        "failed to load 'waiting', failed to poll from model repository: override files need a 'config' override "
        "with them"
    )


def test_history_pages(explicit: tuple[Server, Path, Path]) -> None:
    server, _, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(3):
        client.load_model("waiting")
        client.unload_model("waiting")
    everything = _history(server, "waiting", limit=1000)
    total = everything["total"]
    assert total == len(everything["events"]) >= 12
    states = [e["state"] for e in reversed(everything["events"])]
    assert states[:2] == ["LOADING", "LOADING"]  # the model, then its version
    assert "READY" in states and "UNLOADED" in states
    page = _history(server, "waiting", offset=2, limit=3)
    assert page["total"] == total
    assert [e["id"] for e in page["events"]] == [e["id"] for e in everything["events"][2:5]]
    assert all(e["source"] == "api" for e in everything["events"])
    startup = _history(server, "served")["events"]
    assert startup[-1]["source"] == "startup"
    assert request(server.http_url, "GET", "/v2/edged/models/waiting/history?limit=0").status == 400


# A Python model whose initialize waits until a file "release" is in its folder, and logs that it waits: a load of it
# is under way for as long as the test wants.
WAITING_LOAD_MODEL: Final = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        release = os.path.join(args["model_repository"], "release")
        pb_utils.Logger.log_info(f"initialize waits until {release} exists")
        deadline = time.monotonic() + 60  # only ends a test that failed
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""
WAITING_LOAD_CONFIG: Final = """name: "waiting_load"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def test_restart_serves_what_was_served(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    state = tmp_path / "state"
    repo.mkdir()
    _add_sub(repo, "a")
    _add_sub(repo, "b")
    (repo / "waiting_load" / "1").mkdir(parents=True)
    (repo / "waiting_load" / "1" / "model.py").write_text(WAITING_LOAD_MODEL, encoding="utf-8")
    (repo / "waiting_load" / "config.pbtxt").write_text(WAITING_LOAD_CONFIG, encoding="utf-8")
    args = ("--model-control-mode=explicit", f"--state-dir={state}")
    with run_server([repo], *args, "--load-model=a") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        client.load_model("b")
        client.unload_model("a")
        config = client.get_model_config("b")
        config["max_batch_size"] = 2
        client.load_model("b", config=json.dumps(config), headers=bearer(api_token(server)))
        events = _history(server, "b")["total"]
        # Killed in the middle of another load (its model's initialize waits): what was served before is what comes
        # back.
        loading = threading.Thread(target=_load_quietly, args=(server, "waiting_load"), daemon=True)
        loading.start()
        _wait(lambda: "initialize waits until" in server.log(), "the load to be under way")
        server.killed = True
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(10)
        loading.join(10)
    # Whatever still waited for it may go now.
    (repo / "waiting_load" / "release").touch()
    with run_server([repo], *args) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("b")
        assert client.get_model_config("b")["max_batch_size"] == 2  # its override too
        assert not client.is_model_ready("a")
        assert _history(server, "b")["total"] >= events
    database = sqlite3.connect(state / "edged.db")
    assert database.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    database.close()


def _load_quietly(server: Server, model: str) -> None:
    with contextlib.suppress(OSError):  # the daemon is killed while it loads
        post_json(server.http_url, f"/v2/repository/models/{model}/load", {})


def test_load_is_refused_outside_explicit_mode(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _add_sub(repo, "a")
    with run_server([repo], f"--state-dir={tmp_path / 'state'}") as server:
        reply = post_json(server.http_url, "/v2/repository/models/a/load", {})
        assert reply.status == 503
        assert json.loads(reply.body) == {"error": "explicit model load / unload is not allowed if polling is enabled"}


# --- poll mode ------------------------------------------------------------------------------------------------


def test_poll_mode_follows_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _add_sub(repo, "polled", versions=(1,), policy="version_policy { all { } }\n")
    with run_server(
        [repo], "--model-control-mode=poll", "--repository-poll-secs=0.3", f"--state-dir={tmp_path / 'state'}"
    ) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        with ClosedLoop(server, "polled") as loop:
            shutil.copytree(repo / "polled" / "1", repo / "polled" / "2")
            _wait(lambda: client.is_model_ready("polled", "2"), "version 2 to load")
            shutil.rmtree(repo / "polled" / "1")
            _wait(lambda: _index(client)[("polled", "1")].get("reason") == "unloaded", "version 1 to unload")
        assert loop.failures == []
        assert client.is_model_ready("polled", "2")
        # A model folder still being written is left alone until it settles. Each piece written is stamped an hour
        # ahead, as if it had just been written, however long the test takes between two pieces: the folder cannot
        # settle meanwhile on any machine. The polls that come while it is written (one each 0.3 s) leave it alone.
        staged = tmp_path / "staged"
        _add_sub(staged, "late")
        onnx = (staged / "late" / "1" / "model.onnx").read_bytes()
        late = repo / "late"
        (late / "1").mkdir(parents=True)
        shutil.copy(staged / "late" / "config.pbtxt", late / "config.pbtxt")
        written = late / "1" / "model.onnx"
        just_now = time.time() + 3600
        with written.open("wb") as handle:
            for start in range(0, len(onnx), max(1, len(onnx) // 5)):
                handle.write(onnx[start : start + max(1, len(onnx) // 5)])
                handle.flush()
                os.utime(written, (just_now, just_now))
                time.sleep(0.3)  # polls come meanwhile; whether they do or not, nothing may load the folder
                assert ("late", "1") not in _index(client), "a folder being written was loaded"
        os.utime(written)  # written whole, now: it settles
        _wait(lambda: client.is_model_ready("late"), "the written model to load")
        assert [e["state"] for e in _history(server, "late")["events"]].count("UNAVAILABLE") == 0
        # A removed model is unloaded; put back as it was (a copy that keeps its files' times), it loads again.
        shutil.move(late, tmp_path / "late-aside")
        _wait(lambda: not client.is_model_ready("late"), "the removed model to unload")
        shutil.copytree(tmp_path / "late-aside", late)
        _wait(lambda: client.is_model_ready("late"), "the model put back to load")


# --- models that manage models (pb_utils.load_model / unload_model) -------------------------------------------

MANAGER_MODEL: Final = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            op = pb_utils.get_input_tensor_by_name(request, "OP").as_numpy()[0].decode()
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0].decode()
            blob = pb_utils.get_input_tensor_by_name(request, "BLOB")
            error = ""
            try:
                if op == "load":
                    pb_utils.load_model(target)
                elif op == "load_files":
                    config = json.dumps({"name": target, "platform": "onnxruntime_onnx", "max_batch_size": 8})
                    pb_utils.load_model(target, config=config, files={"file:1/model.onnx": blob.as_numpy()[0]})
                elif op == "unload":
                    pb_utils.unload_model(target)
            except pb_utils.TritonModelException as exc:
                error = exc.message()
            ready = np.array([pb_utils.is_model_ready(target)])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("READY", ready)], parameters={"error": error}))
        return responses
"""
MANAGER_CONFIG: Final = """name: "manager"
backend: "python"
max_batch_size: 0
input [
  { name: "OP" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "TARGET" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "BLOB" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [ { name: "READY" data_type: TYPE_BOOL dims: [ 1 ] } ]
"""


def _manage(client: httpclient.InferenceServerClient, op: str, target: str, blob: bytes = b"") -> tuple[bool, str]:
    inputs = []
    for name, value in (("OP", op.encode()), ("TARGET", target.encode()), ("BLOB", blob)):
        if name == "BLOB" and not blob:
            continue
        tensor = httpclient.InferInput(name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value], dtype=np.object_))
        inputs.append(tensor)
    result = client.infer("manager", inputs)
    return bool(result.as_numpy("READY")[0]), str(result.get_response()["parameters"]["error"])


def test_a_python_model_loads_and_unloads_models(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "manager" / "1").mkdir(parents=True)
    (repo / "manager" / "1" / "model.py").write_text(MANAGER_MODEL, encoding="utf-8")
    (repo / "manager" / "config.pbtxt").write_text(MANAGER_CONFIG, encoding="utf-8")
    _add_sub(repo, "target")
    staged = tmp_path / "staged"
    _add_sub(staged, "fresh")
    onnx = (staged / "fresh" / "1" / "model.onnx").read_bytes()
    with run_server([repo], "--model-control-mode=explicit", "--load-model=manager") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert _manage(client, "status", "target") == (False, "")
        assert _manage(client, "load", "target") == (True, "")
        assert client.is_model_ready("target")
        assert _manage(client, "unload", "target") == (False, "")
        ready, error = _manage(client, "load", "nowhere")
        assert (ready, error) == (False, "failed to load 'nowhere', failed to poll from model repository")
        # A model made of files the calling model hands over (through shared memory, not the message).
        assert _manage(client, "load_files", "fresh", onnx) == (True, "")
        result = client.infer("fresh", add_sub_inputs())
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
        events = _history(server, "fresh")["events"]
        assert events[0]["state"] == "READY"


def test_a_state_database_that_cannot_be_used_stops_the_start(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _add_sub(repo, "a")
    state = tmp_path / "state"
    state.mkdir()
    (state / "edged.db").write_bytes(b"this is not a database" * 100)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "edged",
            "serve",
            "--model-repository",
            str(repo),
            f"--state-dir={state}",
            "--http-port=0",
            "--grpc-port=0",
            "--metrics-port=0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 1
    assert "Traceback" not in completed.stderr
    errors = [line for line in completed.stderr.splitlines() if re.match(r"E\d{4} ", line)]
    assert len(errors) == 1 and str(state / "edged.db") in errors[0], completed.stderr


def test_a_repository_given_twice_is_one_repository(tmp_path: Path) -> None:
    """Triton's own tests start it with the same --model-repository twice: its models are not "in more than one
    model repository", and a load with a config override works."""
    repo = tmp_path / "repo"
    modelgen.write_add_sub(repo / "twice", max_batch_size=8)
    again = tmp_path / "." / "repo"
    with run_server([repo, again], "--model-control-mode=explicit", "--load-model=twice") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("twice")
        config = client.get_model_config("twice")
        config["max_batch_size"] = 2
        client.load_model("twice", config=json.dumps(config), headers=bearer(api_token(server)))
        assert client.get_model_config("twice")["max_batch_size"] == 2


def test_a_named_configuration_is_read_where_a_model_has_one(tmp_path: Path) -> None:
    """Triton's --model-config-name: configs/<name>.pbtxt in a model's folder replaces its config.pbtxt while it is
    there; poll mode follows it coming and going, and a model without one reads its config.pbtxt. Other folders that
    are not versions are ignored with a warning."""
    repo = tmp_path / "repo"
    repo.mkdir()
    model = _add_sub(repo, "named", versions=(1, 2, 3), policy="version_policy { specific { versions: [1, 3] } }\n")
    plain = _add_sub(repo, "plain")
    # Folders that are not versions are ignored, each said once (in Triton's words) however often poll mode looks.
    shutil.copytree(plain / "1", plain / "003")
    (plain / "abc").mkdir()
    custom = (model / "config.pbtxt").read_text(encoding="utf-8").replace("versions: [1, 3]", "versions: [2]")
    (model / "configs").mkdir()
    with run_server(
        [repo],
        "--model-control-mode=poll",
        "--repository-poll-secs=0.3",
        "--model-config-name=custom",
        f"--state-dir={tmp_path / 'state'}",
    ) as server:
        client = httpclient.InferenceServerClient(server.http_url)

        def ready() -> list[bool]:
            return [client.is_model_ready("named", str(v)) for v in (1, 2, 3)]

        assert ready() == [True, False, True]
        assert client.is_model_ready("plain")
        (model / "configs" / "custom.pbtxt").write_text(custom, encoding="utf-8")
        _wait(lambda: ready() == [False, True, False], "the named configuration to be loaded")
        assert client.get_model_config("named")["version_policy"] == {"specific": {"versions": [2]}}
        (model / "configs" / "custom.pbtxt").unlink()
        _wait(lambda: ready() == [True, False, True], "config.pbtxt to be loaded again")
        assert client.is_model_ready("plain")
        assert [e["version"] for e in client.get_model_repository_index() if e["name"] == "plain"] == ["1"]
        log = server.log()
        assert log.count("ignore version directory '003' which contains leading zeros in its directory name") == 1
        assert log.count("ignore version directory 'abc' which fails to convert to integral number") == 1
        assert "ignore version directory 'configs'" not in log
        # Triton's line for each load that succeeded: 'named' loaded three times, 'plain' once.
        assert log.count("successfully loaded 'named' in ") == 3
        assert log.count("successfully loaded 'plain' in ") == 1


RETRIED_MODEL: Final = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Fails its first load, as a model whose device is not up yet: the file it leaves tells the next load.
        tried = os.path.join(args["model_repository"], args["model_version"], "tried")
        if not os.path.exists(tried):
            open(tried, "x").close()
            raise pb_utils.TritonModelException("the device is not up yet")

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""


def test_a_failed_load_is_retried_as_often_as_asked(tmp_path: Path) -> None:
    """Triton's --model-load-retry-count: without it a version that fails to load stays unavailable; with it the
    load is tried again and the model serves."""
    repo = tmp_path / "repo"
    (repo / "retried" / "1").mkdir(parents=True)
    (repo / "retried" / "1" / "model.py").write_text(RETRIED_MODEL, encoding="utf-8")
    (repo / "retried" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n',
        encoding="utf-8",
    )
    with run_server([repo], f"--state-dir={tmp_path / 'once'}", "--strict-readiness=false") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert not client.is_model_ready("retried")
        assert "the device is not up yet" in _index(client)[("retried", "1")]["reason"]
    (repo / "retried" / "1" / "tried").unlink()
    with run_server([repo], f"--state-dir={tmp_path / 'twice'}", "--model-load-retry-count=1") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("retried")
        data = np.array([1.5, 2.5], dtype=np.float32)
        tensor = httpclient.InferInput("IN", [2], "FP32")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("retried", [tensor]).as_numpy("OUT"), data)
        assert "loading 'retried' version 1 again (retry 1 of 1)" in server.log()


def test_a_model_in_two_repositories_is_refused_and_what_serves_goes_on(tmp_path: Path) -> None:
    """As Triton: a name two repositories hold cannot load (Triton's words), and a version already serving under
    that name keeps serving."""
    first, second = tmp_path / "first", tmp_path / "second"
    _add_sub(first, "twice")
    _add_sub(first, "both")
    _add_sub(second, "both")
    second.mkdir(exist_ok=True)
    with run_server(
        [first, second], "--model-control-mode=explicit", "--load-model=*", "--strict-readiness=false"
    ) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert _index(client)[("both", "")]["reason"] == "model appears in two or more repositories"
        assert client.is_model_ready("twice")
        shutil.copytree(first / "twice", second / "twice")
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("twice")
        assert refused.value.message() == "failed to load 'twice': model appears in two or more repositories"
        assert client.is_model_ready("twice")
        result = client.infer("twice", add_sub_inputs())
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
