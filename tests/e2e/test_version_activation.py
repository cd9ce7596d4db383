"""Activating a version of a model and rolling back, against the real daemon: a model whose versions 1, 2 and 3
multiply by 1, 2 and 3, so that an answer says which version gave it; clients that name no version keep sending
requests while versions change, and none of their requests may fail; a restart keeps what was activated."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import modelgen
import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import _write_scaled_identity
from server import REPO_ROOT, Reply, Server, post_json, request, run_server

from edged.state.store import StateStore

MODEL: Final = "scaled"
ONES: Final = np.ones((1, 4), dtype=np.float32)
WAIT_S: Final = 30.0


def _write_scaled(repo: Path) -> None:
    """Model ``scaled``: version n answers INPUT0 * n (the default version policy serves version 3)."""
    modelgen.write_identity(repo / MODEL, "FP32", max_batch_size=8, dims=[-1])
    for version in (2, 3):
        _write_scaled_identity(repo / MODEL / str(version) / "model.onnx", float(version))


def _served_by(client: httpclient.InferenceServerClient, version: str = "") -> int:
    """Which version answered a request (naming ``version``, or none)."""
    inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(ONES)
    output = client.infer(MODEL, inputs, model_version=version).as_numpy("OUTPUT0")
    assert output is not None
    factor = int(output[0][0])
    np.testing.assert_array_equal(output, ONES * factor)
    return factor


def _ready(client: httpclient.InferenceServerClient, model: str = MODEL) -> list[int]:
    """The READY versions in the repository index."""
    index = client.get_model_repository_index()
    return sorted(int(e["version"]) for e in index if e["name"] == model and e.get("state") == "READY")


def _activate(server: Server, version: int | str, headers: dict[str, str] | None = None) -> Reply:
    return post_json(server.http_url, f"/v2/edged/models/{MODEL}/versions/{version}/activate", {}, headers)


def _rollback(server: Server, model: str = MODEL, headers: dict[str, str] | None = None) -> Reply:
    return post_json(server.http_url, f"/v2/edged/models/{model}/rollback", {}, headers)


def _changes(server: Server) -> list[tuple[str, str, str | None]]:
    """The model's changes of served versions, oldest first: (state, reason, actor)."""
    reply = request(server.http_url, "GET", f"/v2/edged/models/{MODEL}/history?limit=1000")
    assert reply.status == 200, reply.body
    events = reversed(reply.json()["events"])
    return [
        (e["state"], e["reason"], e["actor"])
        for e in events
        if e["version"] is None and e["state"] in {"ACTIVATED", "ROLLED_BACK", "SERVING"}
    ]


def _desired(state: Path) -> dict[str, list[int] | None]:
    with StateStore.open(state) as store:
        return store.desired()


class ClosedLoop:
    """Clients that send requests naming no version, one after another; every failure and every version seen kept."""

    def __init__(self, server: Server, clients: int = 2) -> None:
        self._server = server
        self._stop = threading.Event()
        self.sent = 0
        self.seen: set[int] = set()
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> ClosedLoop:
        for thread in self._threads:
            thread.start()
        self.wait_for(20)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def wait_for(self, requests: int) -> None:
        """Until ``requests`` more requests were sent."""
        target = self.sent + requests
        deadline = time.monotonic() + WAIT_S
        while self.sent < target:
            assert time.monotonic() < deadline, f"the clients sent {self.sent} requests, not {target}"
            time.sleep(0.02)

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self._server.http_url)
        while not self._stop.is_set():
            try:
                self.seen.add(_served_by(client))
            except Exception as exc:  # every failure is the test's business
                self.failures.append(repr(exc))
            self.sent += 1
        client.close()


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args], capture_output=True, text=True, cwd=REPO_ROOT, check=False, timeout=60
    )


# --- activate, roll back, restart ---------------------------------------------------------------------------


def test_activate_and_roll_back_under_load_and_across_a_restart(tmp_path: Path) -> None:
    repo, state = tmp_path / "repo", tmp_path / "state"
    _write_scaled(repo)
    args = ("--model-control-mode=explicit", f"--load-model={MODEL}", f"--state-dir={state}")
    with run_server([repo], *args) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert (_served_by(client), _ready(client)) == (3, [3])  # the version policy's: the latest
        with ClosedLoop(server) as loop:
            reply = _activate(server, 1)
            assert (reply.status, reply.json()) == (200, {"model": MODEL, "versions": [1], "previous": [3]})
            assert (_served_by(client), _ready(client)) == (1, [1])
            loop.wait_for(20)
            reply = _activate(server, 3)
            assert (reply.status, reply.json()) == (200, {"model": MODEL, "versions": [3], "previous": [1]})
            assert (_served_by(client), _ready(client)) == (3, [3])
            loop.wait_for(20)
            reply = _rollback(server)
            assert (reply.status, reply.json()) == (200, {"model": MODEL, "versions": [1], "previous": [3]})
            assert (_served_by(client), _ready(client)) == (1, [1])
            loop.wait_for(20)
        assert loop.failures == []
        assert loop.seen == {1, 3}
        # A version not activated is not served: naming it is refused as for any version that is not loaded.
        with pytest.raises(Exception, match="version 3 is not at ready state"):
            _served_by(client, "3")
        assert _changes(server) == [
            ("ACTIVATED", "version 1 activated (was 3)", "loopback"),
            ("ACTIVATED", "version 3 activated (was 1)", "loopback"),
            ("ROLLED_BACK", "rolled back to version 1 (was 3)", "loopback"),
        ]
        assert _desired(state) == {MODEL: [1]}

    # A restart serves the version activated, not the policy's; "previous" is read back from the history.
    with run_server([repo], *args) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert (_served_by(client), _ready(client)) == (1, [1])
        reply = _rollback(server)
        assert (reply.status, reply.json()) == (200, {"model": MODEL, "versions": [3], "previous": [1]})
        assert _served_by(client) == 3
        assert _activate(server, 2).json() == {"model": MODEL, "versions": [2], "previous": [3]}
        assert _desired(state) == {MODEL: [2]}
        # A plain load re-reads the repository, as Triton's: the version policy serves again.
        client.load_model(MODEL)
        assert (_served_by(client), _ready(client)) == (3, [3])
        assert _desired(state) == {MODEL: None}
        assert _changes(server)[-3:] == [
            ("ROLLED_BACK", "rolled back to version 3 (was 1)", "loopback"),
            ("ACTIVATED", "version 2 activated (was 3)", "loopback"),
            ("SERVING", "now serving version 3 (was 2)", "loopback"),
        ]
        # Which a rollback undoes like any other change of the served versions.
        assert _rollback(server).json() == {"model": MODEL, "versions": [2], "previous": [3]}


# --- refusals -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("activation-state")


@pytest.fixture(scope="module")
def tokens(state_dir: Path) -> dict[str, str]:
    made = {}
    for name, role in (("dashboard", "viewer"), ("ci-bot", "operator")):
        result = _edged("token", "--state-dir", str(state_dir), "create", "--name", name, "--role", role)
        assert result.returncode == 0, result.stderr
        made[role] = result.stdout.strip()
    return made


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, state_dir: Path, tokens: dict[str, str]) -> Iterator[Server]:
    del tokens  # made first, in the same state database
    repo = tmp_path_factory.mktemp("activation-repository")
    _write_scaled(repo)
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    loads = (f"--load-model={MODEL}", "--load-model=add_sub")
    with run_server([repo], "--model-control-mode=explicit", *loads, f"--state-dir={state_dir}") as server:
        yield server


def _error(reply: Reply) -> tuple[int, str]:
    return reply.status, reply.error()


def test_unknown_versions_and_models_are_refused(site: Server) -> None:
    client = httpclient.InferenceServerClient(site.http_url)
    assert _error(_activate(site, 7)) == (
        400,
        f"failed to activate version 7 of '{MODEL}': it has no version 7 (its versions: 1, 2, 3)",
    )
    assert _error(_activate(site, 0))[0] == 400
    assert _error(post_json(site.http_url, "/v2/edged/models/nosuch/versions/1/activate", {})) == (
        404,
        "failed to activate version 1 of 'nosuch': there is no model 'nosuch' in the model repository",
    )
    assert _error(_rollback(site, "nosuch")) == (
        404,
        "failed to roll back 'nosuch': there is no model 'nosuch' in the model repository",
    )
    # A version that is not digits is no route, as for every versioned path.
    assert _activate(site, "latest").status == 404
    assert "cannot be a model name" in _error(_rollback(site, "x" * 300))[1]
    # Nothing was changed by any of it.
    assert (_served_by(client), _ready(client)) == (3, [3])


def test_nothing_to_roll_back_to(site: Server) -> None:
    status, message = _error(_rollback(site, "add_sub"))
    assert status == 400
    assert message.startswith("failed to roll back 'add_sub': there is nothing to roll back to")
    # Activating the version that serves is no change either.
    assert _activate(site, 3).json() == {"model": MODEL, "versions": [3], "previous": [3]}
    assert _error(_rollback(site))[0] == 400


def test_a_viewer_token_is_refused_and_an_operator_token_recorded(site: Server, tokens: dict[str, str]) -> None:
    client = httpclient.InferenceServerClient(site.http_url)
    viewer = {"Authorization": f"Bearer {tokens['viewer']}"}
    refused = "the viewer role does not grant the model-repository API"
    assert _error(_activate(site, 1, viewer)) == (403, refused)
    assert _error(_rollback(site, headers=viewer)) == (403, refused)
    assert _served_by(client) == 3
    operator = {"Authorization": f"Bearer {tokens['operator']}"}
    assert _activate(site, 2, operator).json() == {"model": MODEL, "versions": [2], "previous": [3]}
    assert _rollback(site, headers=operator).json() == {"model": MODEL, "versions": [3], "previous": [2]}
    assert _changes(site)[-2:] == [
        ("ACTIVATED", "version 2 activated (was 3)", "token:ci-bot"),
        ("ROLLED_BACK", "rolled back to version 3 (was 2)", "token:ci-bot"),
    ]


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_refused_unless_model_control_is_explicit(tmp_path: Path, mode: str) -> None:
    _write_scaled(tmp_path)
    with run_server([tmp_path], f"--model-control-mode={mode}") as server:
        expected = (503, "explicit model load / unload is not allowed if polling is enabled")
        assert _error(_activate(server, 1)) == expected
        assert _error(_rollback(server)) == expected
        client = httpclient.InferenceServerClient(server.http_url)
        assert (_served_by(client), _ready(client)) == (3, [3])
