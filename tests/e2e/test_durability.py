"""Acknowledged means durable: a load or unload that was answered survives the daemon being killed (SIGKILL) the
moment the answer arrives. The desired state is committed to the state database (WAL, synchronous=FULL) before the
answer goes out, and so is the history of the action. Each step: restart on the same state directory, check that
exactly the acknowledged models are READY, change one thing through the API, kill -9 at once."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path
from typing import Final

import modelgen
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, api_token, bearer, run_server

MODELS: Final = ("m0", "m1")
# (operation, model, protocol): loads, unloads and a config override, each over both protocols where it can be.
STEPS: Final = (
    ("load", "m0", "http"),
    ("load", "m1", "grpc"),
    ("unload", "m0", "grpc"),
    ("override", "m0", "http"),
    ("unload", "m1", "http"),
    ("load", "m1", "grpc"),
)


def _repository(root: Path) -> Path:
    repo = root / "repo"
    for name in MODELS:
        modelgen.write_add_sub(repo / name, max_batch_size=8)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text(encoding="utf-8").replace('name: "add_sub"', f'name: "{name}"'))
    return repo


def _ready(server: Server) -> set[str]:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return {entry["name"] for entry in client.get_model_repository_index() if entry.get("state") == "READY"}
    finally:
        client.close()


def _kill(server: Server) -> None:
    server.killed = True
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(10)


def _act(server: Server, operation: str, model: str, protocol: str) -> None:
    client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient
    if protocol == "http":
        client = httpclient.InferenceServerClient(server.http_url)
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
    if operation == "load":
        client.load_model(model)
    elif operation == "override":
        # From a private copy with another batch size: the copy and its CURRENT pointer must survive too.
        config = {"name": model, "platform": "onnxruntime_onnx", "max_batch_size": 2}
        client.load_model(model, config=json.dumps(config), headers=bearer(api_token(server)))
    else:
        client.unload_model(model)


def test_acknowledged_loads_and_unloads_survive_kill_9(tmp_path: Path) -> None:
    repo, state = _repository(tmp_path), tmp_path / "state"
    expected: set[str] = set()
    overridden: set[str] = set()
    for operation, model, protocol in STEPS:
        with run_server([repo], "--model-control-mode=explicit", f"--state-dir={state}") as server:
            assert _ready(server) == expected, (operation, model)
            for name in expected:
                batch = httpclient.InferenceServerClient(server.http_url).get_model_config(name)["max_batch_size"]
                assert batch == (2 if name in overridden else 8), name
            _act(server, operation, model, protocol)
            _kill(server)
        if operation == "unload":
            expected.discard(model)
            overridden.discard(model)
        else:
            expected.add(model)
            if operation == "override":
                overridden.add(model)
            else:
                overridden.discard(model)
    with run_server([repo], "--model-control-mode=explicit", f"--state-dir={state}") as server:
        assert _ready(server) == expected == {"m0", "m1"}
    # The history of each acknowledged action was committed with it: every load's READY, every unload's UNLOADED.
    with sqlite3.connect(state / "edged.db") as db:
        states = [row[0] for row in db.execute("SELECT state FROM transitions WHERE version IS NOT NULL")]
    loads = sum(1 for operation, _, _ in STEPS if operation != "unload")
    unloads = sum(1 for operation, _, _ in STEPS if operation == "unload")
    assert states.count("READY") >= loads
    assert states.count("UNLOADED") >= unloads
