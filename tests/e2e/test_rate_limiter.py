"""Triton's rate limiter: --rate-limit execution_count runs an execution only when the resources its instance group
names are free, and serves the instances waiting for them by priority; --rate-limit off ignores them.

The models (tests/testdata/python_models/rate_gate.py) write their name to an order file as an execution begins and
hold their instance until a file the test creates exists; the daemon logs (at --log-verbose 1) each instance that
waits for its resources, so every step waits on what the daemon or the model did, never on time."""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import PYTHON_MODELS
from server import REPO_ROOT, Server, run_server
from tritonclient.utils import InferenceServerException

# How long a test waits for what must come (a generous bound, never a measurement).
WAIT_S: Final = 60.0
_files = itertools.count()


def _model(repo: Path, name: str, resources: str, priority: int = 0) -> None:
    folder = repo / name / "1"
    folder.mkdir(parents=True)
    shutil.copy(PYTHON_MODELS / "rate_gate.py", folder / "model.py")
    limiter = f"rate_limiter {{ resources [ {{ {resources} }} ] priority: {priority} }}" if resources else ""
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"instance_group [ {{ count: 1 kind: KIND_CPU {limiter} }} ]\n",
        encoding="utf-8",
    )


def _repository(tmp_path: Path, models: dict[str, tuple[str, int]]) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, (resources, priority) in models.items():
        _model(repo, name, resources, priority)
    return repo


def _until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


class Calls:
    """Requests sent at once; ``wait`` returns each one's answer."""

    def __init__(self, client: grpcclient.InferenceServerClient, order: Path) -> None:
        self._client = client
        self._order = order
        self._answers: queue.Queue[tuple[str, Any]] = queue.Queue()

    def send(self, model: str, hold: Path | None = None) -> None:
        tensor = grpcclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        parameters = {"order": str(self._order), **({"hold": str(hold)} if hold is not None else {})}
        self._client.async_infer(
            model, [tensor], lambda result, error: self._answers.put((model, error)), parameters=parameters
        )

    def wait(self, count: int) -> list[str]:
        answered = []
        for _ in range(count):
            model, error = self._answers.get(timeout=WAIT_S)
            assert error is None, error
            answered.append(model)
        return answered


def _started(order: Path) -> list[str]:
    return order.read_text(encoding="utf-8").split() if order.exists() else []


def _waits(server: Server, model: str) -> Callable[[], bool]:
    """Whether the daemon logged that an instance of ``model`` waits for its resources."""
    return lambda: any(
        f"model '{model}' instance group" in line and "waits for its rate limiter resources" in line
        for line in server.log().splitlines()
    )


def _scratch(tmp_path: Path) -> tuple[Path, Path]:
    n = next(_files)
    return tmp_path / f"order-{n}", tmp_path / f"release-{n}"


SHARED: Final = 'name: "R" count: 1'


@pytest.mark.parametrize("mode", ["execution_count", "off"])
def test_a_shared_resource_of_count_1_runs_one_execution_at_a_time(tmp_path: Path, mode: str) -> None:
    repo = _repository(tmp_path, {"first": (SHARED, 0), "second": (SHARED, 0)})
    with (
        run_server([repo], "--rate-limit", mode, "--log-verbose", "1") as server,
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client,
    ):
        order, release = _scratch(tmp_path)
        calls = Calls(client, order)
        calls.send("first", hold=release)
        _until("first starts", lambda: _started(order) == ["first"])
        calls.send("second", hold=release)
        if mode == "execution_count":
            # It has its instance but not R, which "first" holds: it waits, and does not start.
            _until("second waits for R", _waits(server, "second"))
            assert _started(order) == ["first"]
        else:
            _until("second starts beside first", lambda: _started(order) == ["first", "second"])
        release.touch()
        assert sorted(calls.wait(2)) == ["first", "second"]
        assert _started(order) == ["first", "second"]


def test_a_resource_of_count_2_runs_both(tmp_path: Path) -> None:
    repo = _repository(tmp_path, {"first": (SHARED, 0), "second": (SHARED, 0)})
    with (
        run_server([repo], "--rate-limit", "execution_count", "--rate-limit-resource", "R:2") as server,
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client,
    ):
        order, release = _scratch(tmp_path)
        calls = Calls(client, order)
        calls.send("first", hold=release)
        calls.send("second", hold=release)
        _until("both run at once", lambda: sorted(_started(order)) == ["first", "second"])
        release.touch()
        assert sorted(calls.wait(2)) == ["first", "second"]


def test_waiting_instances_are_served_by_priority(tmp_path: Path) -> None:
    models = {"holder": (SHARED, 1), "low": (SHARED, 3), "middle": (SHARED, 2), "high": (SHARED, 1)}
    repo = _repository(tmp_path, models)
    with (
        run_server([repo], "--rate-limit", "execution_count", "--log-verbose", "1") as server,
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client,
    ):
        order, release = _scratch(tmp_path)
        calls = Calls(client, order)
        # Triton weighs an instance's priority by the executions it had: each has one, so priority alone decides.
        for name in ("low", "middle", "high"):
            calls.send(name)
            assert calls.wait(1) == [name]
        order.unlink()
        calls.send("holder", hold=release)
        _until("holder starts", lambda: _started(order) == ["holder"])
        # Queued lowest priority first: arrival order alone would run them so.
        for name in ("low", "middle", "high"):
            calls.send(name)
            _until(f"{name} waits", _waits(server, name))
        release.touch()
        calls.wait(4)
        assert _started(order) == ["holder", "high", "middle", "low"]


def test_a_config_asking_for_more_than_there_is_fails_to_load(tmp_path: Path) -> None:
    repo = _repository(tmp_path, {"fits": (SHARED, 0), "greedy": ('name: "R" count: 3', 0), "other": ("", 0)})
    _model(repo, "unlisted", 'name: "S" count: 1')
    args = ["--rate-limit", "execution_count", "--rate-limit-resource", "R:2", "--model-control-mode", "explicit"]
    with (
        run_server([repo], *args) as server,
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client,
    ):
        client.load_model("fits")
        client.load_model("other")
        with pytest.raises(InferenceServerException) as greedy:
            client.load_model("greedy")
        assert (
            'Resource count for "R" is limited to 2 which will prevent scheduling of one or more model instances, '
            "the minimum required count is 3"
        ) in str(greedy.value)
        # Once resources are given, one they do not list has none.
        with pytest.raises(InferenceServerException) as unlisted:
            client.load_model("unlisted")
        assert 'Resource count for "S" is limited to 0' in str(unlisted.value)
        assert client.is_model_ready("fits") and not client.is_model_ready("greedy")
    # Without the limiter the same config loads: nothing is counted.
    with (
        run_server([repo], "--rate-limit-resource", "R:2", "--model-control-mode", "explicit") as server,
        grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client,
    ):
        client.load_model("greedy")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (
            "R",
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. "
            "Got R",
        ),
        (
            "R:1:0:2",
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. "
            "Got R:1:0:2",
        ),
        ("R:many", "Invalid option value. Got many"),
        ("R:1:gpu", "Invalid option value. Got gpu"),
    ],
)
def test_malformed_rate_limit_options_are_refused_with_tritons_words(tmp_path: Path, value: str, problem: str) -> None:
    repo = _repository(tmp_path, {})
    done = _serve(tmp_path, repo, "--rate-limit-resource", value)
    assert done.returncode != 0 and problem in done.stderr, done.stderr


def test_an_unknown_rate_limit_mode_is_refused(tmp_path: Path) -> None:
    repo = _repository(tmp_path, {})
    done = _serve(tmp_path, repo, "--rate-limit", "sometimes")
    assert done.returncode != 0 and "invalid argument for --rate-limit" in done.stderr, done.stderr


def _serve(tmp_path: Path, repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EDGED_")}
    return subprocess.run(
        [sys.executable, "-m", "edged", "serve", "--model-repository", str(repo), *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        env={**clean, "HOME": str(tmp_path)},
        check=False,
    )
