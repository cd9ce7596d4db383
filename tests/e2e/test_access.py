"""Access control against the real daemon: the secure default (guarded categories need a token from any address
but loopback), API tokens and their roles made with `edged token`, Triton's restricted APIs with Triton's own
answers, who asked recorded in the model history, and every refusal logged and counted.

A client that is not on loopback is this machine reached at one of its other addresses: the daemon then sees that
address as the peer. Where the machine has none, the test gives it one on a dummy interface (tests run as root).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import modelgen  # type: ignore[import-not-found, unused-ignore]
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, REPO_ROOT, Server, add_sub_inputs, post_json, request, run_server
from tritonclient.utils import InferenceServerException

from edged.core.access import Role, new_token
from edged.state.store import StateStore

DUMMY_INTERFACE: Final = "edged-test0"
DUMMY_ADDRESS: Final = "198.51.100.7"


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args], capture_output=True, text=True, cwd=REPO_ROOT, check=False, timeout=60
    )


@pytest.fixture(scope="module")
def outside_address() -> Iterator[str]:
    """An address of this machine that is not loopback."""
    shown = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=True
    )
    for line in shown.stdout.splitlines():
        address = line.split()[3].split("/")[0]
        if not ipaddress.ip_address(address).is_loopback:
            yield address
            return
    subprocess.run(["ip", "link", "add", DUMMY_INTERFACE, "type", "dummy"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{DUMMY_ADDRESS}/32", "dev", DUMMY_INTERFACE], check=True)
        subprocess.run(["ip", "link", "set", DUMMY_INTERFACE, "up"], check=True)
        yield DUMMY_ADDRESS
    finally:
        subprocess.run(["ip", "link", "del", DUMMY_INTERFACE], check=False)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("access-repository")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_add_sub(repo / "spare", max_batch_size=8, dims=16, dtype="FP32")
    return repo


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("access-state")


@pytest.fixture(scope="module")
def tokens(state_dir: Path) -> dict[str, str]:
    """An operator's and a viewer's token, made with `edged token create` before the daemon starts."""
    made = {}
    for name, role in (("ci-bot", "operator"), ("dashboard", "viewer"), ("old-laptop", "operator"), ("root", "admin")):
        result = _edged("token", "--state-dir", str(state_dir), "create", "--name", name, "--role", role)
        assert result.returncode == 0, result.stderr
        made[name] = result.stdout.strip()
        assert "not shown again" in result.stderr
    return made


@pytest.fixture(scope="module")
def guarded(repository: Path, state_dir: Path, tokens: dict[str, str], outside_address: str) -> Iterator[Server]:
    del tokens  # made first, in the same state database
    with run_server(
        [repository],
        "--http-address=0.0.0.0",
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--allow-client-shm=true",
        f"--state-dir={state_dir}",
    ) as running:
        yield running


def _newest_event(server: Server, model: str) -> int:
    events = request(server.http_url, "GET", f"/v2/edged/models/{model}/history?limit=1").json()["events"]
    return int(events[0]["id"]) if events else 0


def _grpc_inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in (("INPUT0", ADD_SUB_INPUT0), ("INPUT1", ADD_SUB_INPUT1)):
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _grpc_error(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), info.value.message()


# --- the secure default --------------------------------------------------------------------------------------


STATE_CHANGING: Final = (
    ("POST", "/v2/repository/models/spare/load", "model-repository"),
    ("POST", "/v2/repository/models/spare/unload", "model-repository"),
    ("POST", "/v2/repository/index", "model-repository"),
    ("POST", "/v2/logging", "logging"),
    ("GET", "/v2/logging", "logging"),
    ("POST", "/v2/systemsharedmemory/region/r/register", "shared-memory"),
    ("GET", "/v2/systemsharedmemory/status", "shared-memory"),
    ("POST", "/v2/trace/setting", "trace"),
    ("GET", "/v2/edged/models/add_sub/history", "model-repository"),
    ("POST", "/v2/edged/sync/now", "model-repository"),
    ("POST", "/v2/edged/sync/pause", "model-repository"),
    ("GET", "/v2/edged/sync", "model-repository"),
    # Spellings the router may accept for the same routes are guarded the same.
    ("POST", "/v2/repository/models/spare/load/", "model-repository"),
    ("POST", "//v2//repository//index", "model-repository"),
)


@pytest.mark.parametrize(("method", "path", "api"), STATE_CHANGING)
def test_guarded_apis_need_a_token_from_another_address(
    guarded: Server, outside_address: str, method: str, path: str, api: str
) -> None:
    remote = f"{outside_address}:{guarded.http_port}"
    reply = request(remote, method, path, "{}")
    assert reply.status == 401, reply.body
    assert json.loads(reply.body) == {
        "error": f"the {api} API needs an API token from this address: send 'Authorization: Bearer <token>' "
        "(edged token create)"
    }
    assert reply.header("www-authenticate") == 'Bearer realm="edged"'


def test_open_apis_stay_open_and_loopback_is_trusted(guarded: Server, outside_address: str) -> None:
    remote = httpclient.InferenceServerClient(f"{outside_address}:{guarded.http_port}")
    assert remote.is_server_live() and remote.is_server_ready() and remote.is_model_ready("add_sub")
    assert remote.get_model_metadata("add_sub")["name"] == "add_sub"
    assert remote.get_model_config("add_sub")["name"] == "add_sub"
    assert remote.get_inference_statistics("add_sub")["model_stats"]
    result = remote.infer("add_sub", add_sub_inputs())
    assert result.as_numpy("OUTPUT0") is not None
    grpc_remote = grpcclient.InferenceServerClient(f"{outside_address}:{guarded.grpc_port}")
    assert grpc_remote.is_server_ready() and grpc_remote.get_model_metadata("add_sub").name == "add_sub"
    grpc_remote.infer("add_sub", _grpc_inputs())
    # Tools on the device itself need no token.
    local = httpclient.InferenceServerClient(guarded.http_url)
    local.load_model("spare")
    local.unload_model("spare")
    assert local.get_log_settings()
    grpcclient.InferenceServerClient(guarded.grpc_url).get_model_repository_index()


def test_grpc_guards_every_state_changing_rpc(guarded: Server, outside_address: str) -> None:
    client = grpcclient.InferenceServerClient(f"{outside_address}:{guarded.grpc_port}")
    calls = {
        "model-repository": (
            lambda: client.load_model("spare"),
            lambda: client.unload_model("spare"),
            client.get_model_repository_index,
        ),
        "logging": (client.get_log_settings, lambda: client.update_log_settings({"log_verbose_level": 1})),
        "shared-memory": (client.get_system_shared_memory_status, client.unregister_system_shared_memory),
        "trace": (client.get_trace_settings,),
    }
    for api, group in calls.items():
        for call in group:
            code, message = _grpc_error(call)
            assert code == "StatusCode.UNAUTHENTICATED", (api, message)
            assert message.startswith(f"the {api} API needs an API token from this address")


# --- tokens and roles ----------------------------------------------------------------------------------------


def test_an_operator_token_works_over_both_wires_and_is_recorded(
    guarded: Server, outside_address: str, tokens: dict[str, str]
) -> None:
    headers = _bearer(tokens["ci-bot"])
    before = _newest_event(guarded, "spare")
    http = httpclient.InferenceServerClient(f"{outside_address}:{guarded.http_port}")
    http.load_model("spare", headers=headers)
    assert http.is_model_ready("spare")
    http.unload_model("spare", headers=headers)
    grpc = grpcclient.InferenceServerClient(f"{outside_address}:{guarded.grpc_port}")
    # gRPC metadata keys are lower case; tritonclient passes headers= as metadata.
    grpc.load_model("spare", headers={"authorization": f"Bearer {tokens['ci-bot']}"})
    assert grpc.get_log_settings(headers={"authorization": f"Bearer {tokens['ci-bot']}"})
    http.update_log_settings({"log_verbose_level": 0}, headers=headers)
    assert "log settings changed over HTTP by token:ci-bot: log_verbose_level=0" in guarded.log()
    # Loopback, for comparison.
    httpclient.InferenceServerClient(guarded.http_url).unload_model("spare")
    history = request(guarded.http_url, "GET", "/v2/edged/models/spare/history?limit=1000").json()["events"]
    events = [event for event in history if event["id"] > before]
    loads = [e["actor"] for e in events if e["state"] == "LOADING" and e["version"] is None]
    assert loads == ["token:ci-bot", "token:ci-bot"]  # over gRPC, then over HTTP (newest first)
    assert events[0]["state"] == "UNLOADED" and events[0]["actor"] == "loopback"
    startup = request(guarded.http_url, "GET", "/v2/edged/models/add_sub/history").json()["events"]
    assert {e["actor"] for e in startup} == {None}  # the daemon's own changes


def test_a_viewer_token_reads_but_changes_nothing(
    guarded: Server, outside_address: str, tokens: dict[str, str]
) -> None:
    remote = f"{outside_address}:{guarded.http_port}"
    reply = post_json(remote, "/v2/repository/models/spare/load", {}, _bearer(tokens["dashboard"]))
    assert (reply.status, reply.json()) == (403, {"error": "the viewer role does not grant the model-repository API"})
    grpc = grpcclient.InferenceServerClient(f"{outside_address}:{guarded.grpc_port}")
    code, message = _grpc_error(
        lambda: grpc.load_model("spare", headers={"authorization": f"Bearer {tokens['dashboard']}"})
    )
    assert (code, message) == (
        "StatusCode.PERMISSION_DENIED",
        "the viewer role does not grant the model-repository API",
    )
    # What a viewer may do, it may do with its token too.
    assert request(remote, "GET", "/v2/models/add_sub", headers=_bearer(tokens["dashboard"])).status == 200


def test_bad_revoked_and_expired_tokens_are_refused(
    guarded: Server, outside_address: str, tokens: dict[str, str], state_dir: Path
) -> None:
    remote = f"{outside_address}:{guarded.http_port}"
    valid = tokens["old-laptop"]
    token_id = valid.split("_")[1]
    bad = (
        "edged_0000000000000000_nothing",  # no such id
        f"edged_{token_id}_{'x' * 43}",  # the right id, the wrong secret
        valid[:-1],  # one character short
        "not-an-edged-token",
    )
    for token in bad:
        for address in (remote, guarded.http_url):  # a token presented must be valid, even on loopback
            reply = request(address, "POST", "/v2/repository/index", "{}", _bearer(token))
            assert reply.status == 401, token
            assert reply.json() == {"error": "the API token is not valid (unknown, revoked or expired)"}
    assert request(remote, "POST", "/v2/repository/index", "{}", _bearer(valid)).status == 200
    revoked = _edged("token", "--state-dir", str(state_dir), "revoke", "old-laptop")
    assert revoked.returncode == 0, revoked.stderr
    deadline = time.monotonic() + 10
    while request(remote, "POST", "/v2/repository/index", "{}", _bearer(valid)).status == 200:
        assert time.monotonic() < deadline, "a revoked token kept working"
        time.sleep(0.2)
    assert request(remote, "POST", "/v2/repository/index", "{}", _bearer(valid)).status == 401
    # An expired token, written as `edged token create --expires` would have, a minute ago.
    expired = new_token("expired", Role.ADMIN, datetime.now(UTC) - timedelta(minutes=1))
    with StateStore.open(state_dir) as store:
        store.add_token(expired.record)
    assert request(remote, "POST", "/v2/repository/index", "{}", _bearer(expired.secret)).status == 401


def test_refusals_are_logged_with_the_address_and_counted(guarded: Server, outside_address: str) -> None:
    remote = f"{outside_address}:{guarded.http_port}"
    before = _refused(guarded)
    assert request(remote, "POST", "/v2/repository/index", "{}", _bearer("edged_1_2")).status == 401
    after = _refused(guarded)
    key = 'edged_access_refused_total{api="model-repository",endpoint="http",reason="unauthenticated"}'
    assert after.get(key, 0) == before.get(key, 0) + 1
    assert f"refused http request (model-repository) from {outside_address}" in guarded.log()
    # Secrets never reach the log.
    assert "edged_1_2" not in guarded.log()


def _refused(server: Server) -> dict[str, float]:
    text = request(server.metrics_url, "GET", "/metrics").body.decode()
    return {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("edged_access_refused_total{")
    }


def test_tokens_are_stored_as_hashes_and_listed_without_secrets(state_dir: Path, tokens: dict[str, str]) -> None:
    listed = _edged("token", "--state-dir", str(state_dir), "list")
    assert listed.returncode == 0
    for name, token in tokens.items():
        assert name in listed.stdout
        assert token.split("_", 2)[2] not in listed.stdout
    data = b"".join(path.read_bytes() for path in state_dir.iterdir() if path.is_file())
    for token in tokens.values():
        assert token.split("_", 2)[2].encode() not in data
    taken = _edged("token", "--state-dir", str(state_dir), "create", "--name", "ci-bot", "--role", "viewer")
    assert (taken.returncode, taken.stderr.strip()) == (1, "edged: a token named 'ci-bot' exists already")
    missing = _edged("token", "--state-dir", str(state_dir), "revoke", "nobody")
    assert (missing.returncode, missing.stderr.strip()) == (1, "edged: no active token named 'nobody'")
    bad = _edged("token", "--state-dir", str(state_dir), "create", "--name", "x", "--role", "viewer", "--expires", "1y")
    assert bad.returncode == 1 and "--expires" in bad.stderr


def test_an_admin_manages_tokens_over_http(guarded: Server, outside_address: str, tokens: dict[str, str]) -> None:
    remote = f"{outside_address}:{guarded.http_port}"
    admin, operator = _bearer(tokens["root"]), _bearer(tokens["ci-bot"])
    # Only an admin's token, from any address: loopback is no credential for token management.
    assert request(remote, "GET", "/v2/edged/tokens").status == 401
    assert request(guarded.http_url, "GET", "/v2/edged/tokens").status == 401
    reply = request(remote, "GET", "/v2/edged/tokens", headers=operator)
    assert (reply.status, reply.json()) == (403, {"error": "the operator role does not grant the tokens API"})
    made = post_json(remote, "/v2/edged/tokens", {"name": "camera-3", "role": "operator", "expires_in_s": 3600}, admin)
    assert made.status == 200, made.body
    secret = made.json()["token"]
    assert made.json()["state"] == "active" and made.json()["expires_at"]
    listed = request(remote, "GET", "/v2/edged/tokens", headers=admin).json()["tokens"]
    assert {"camera-3", "ci-bot", "root"} <= {token["name"] for token in listed}
    assert secret not in json.dumps(listed) and all("token" not in token for token in listed)
    assert request(remote, "POST", "/v2/repository/index", "{}", _bearer(secret)).status == 200
    taken = post_json(remote, "/v2/edged/tokens", {"name": "camera-3", "role": "admin"}, admin)
    assert (taken.status, taken.json()) == (400, {"error": "a token named 'camera-3' exists already"})
    for bad in (
        {"name": "x"},
        {"name": "x", "role": "root"},
        {"name": "", "role": "viewer"},
        {"role": "viewer"},
        {"name": "x", "role": "viewer", "expires_in_s": 2**90},  # a lifetime no date holds: 400, not a crash
    ):
        assert post_json(remote, "/v2/edged/tokens", bad, admin).status == 400, bad
    # A field the API does not know is refused by name, never dropped: this token would never have expired.
    misspelt = post_json(remote, "/v2/edged/tokens", {"name": "t", "role": "viewer", "expires": "1d"}, admin)
    assert (misspelt.status, misspelt.json()) == (
        400,
        {"error": "unknown field 'expires' in the token request (known: name, role, expires_in_s)"},
    )
    assert "t" not in {
        token["name"] for token in request(remote, "GET", "/v2/edged/tokens", headers=admin).json()["tokens"]
    }
    # Revoked through the API: refused by this daemon at once.
    assert request(remote, "DELETE", "/v2/edged/tokens/camera-3", headers=admin).status == 200
    assert request(remote, "POST", "/v2/repository/index", "{}", _bearer(secret)).status == 401
    gone = request(remote, "DELETE", "/v2/edged/tokens/camera-3", headers=admin)
    assert (gone.status, gone.json()) == (404, {"error": "no active token named 'camera-3'"})
    assert "API token 'camera-3' (operator) created by token:root" in guarded.log()


# --- Triton's restricted APIs, and everything guarded -----------------------------------------------------------


def test_tritons_restricted_apis_answer_as_triton(repository: Path, tmp_path: Path, outside_address: str) -> None:
    with run_server(
        [repository],
        "--http-address=0.0.0.0",
        "--model-control-mode=explicit",
        "--load-model=add_sub",
        "--http-restricted-api=model-repository,logging:admin-key=s3cret",
        "--grpc-restricted-protocol=model-repository,health:admin-key=s3cret",
        f"--state-dir={tmp_path / 'state'}",
    ) as server:
        for address in (server.http_url, f"{outside_address}:{server.http_port}"):
            for headers in ({}, {"admin-key": "wrong"}):
                reply = request(address, "POST", "/v2/repository/index", "{}", headers)
                assert (reply.status, reply.json()) == (
                    403,
                    {"error": "This API is restricted, expecting header 'admin-key'"},
                )
            assert request(address, "GET", "/v2/logging").status == 403
            # The header is all it takes, from any address (as in Triton): no token needed.
            reply = request(address, "POST", "/v2/repository/models/spare/load", "{}", {"admin-key": "s3cret"})
            assert reply.status == 200
            assert request(address, "GET", "/v2/health/ready").status == 200  # restricted over gRPC only
        grpc = grpcclient.InferenceServerClient(f"{outside_address}:{server.grpc_port}")
        expected = (
            "StatusCode.UNAVAILABLE",
            "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'",
        )
        assert _grpc_error(grpc.is_server_live) == expected
        assert _grpc_error(grpc.get_model_repository_index) == expected
        assert grpc.get_model_metadata("add_sub").name == "add_sub"  # metadata is not restricted
        granted = {"triton-grpc-protocol-admin-key": "s3cret"}
        assert grpc.is_server_live(headers=granted)
        grpc.unload_model("spare", headers=granted)
        # edged's history is a model-repository route: restricted with it.
        history = request(server.http_url, "GET", "/v2/edged/models/spare/history", headers={"admin-key": "s3cret"})
        assert "restricted-header" in {event["actor"] for event in history.json()["events"]}


def test_everything_guarded_and_loopback_not_trusted(repository: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    viewer = _edged(
        "token", "--state-dir", str(state), "create", "--name", "scraper", "--role", "viewer"
    ).stdout.strip()
    with run_server([repository], "--guarded-apis=all", "--trust-loopback=false", f"--state-dir={state}") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        # Inference too: the protocol's own inference path steps aside so that the policy sees every request.
        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", add_sub_inputs())
        assert info.value.status() == "401"
        result = client.infer("add_sub", add_sub_inputs(), headers=_bearer(viewer))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
        assert request(server.http_url, "GET", "/v2/health/live").status == 401
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert _grpc_error(grpc.is_server_live)[0] == "StatusCode.UNAUTHENTICATED"
        assert grpc.is_server_live(headers={"authorization": f"Bearer {viewer}"})
        # The metrics port too, for a scraper with a viewer's token.
        assert request(server.metrics_url, "GET", "/metrics").status == 401
        assert request(server.metrics_url, "GET", "/metrics", headers=_bearer(viewer)).status == 200
        # The health of the daemon's own start (systemd, the tests) does not depend on the API: it logged ready.
        assert "edged ready" in server.log()


def test_access_options_are_checked_at_start(repository: Path) -> None:
    for flag, message in (
        ("--guarded-apis=model-repository,everything", "unknown API 'everything'"),
        ("--http-restricted-api=model-repository", "expected <apis>:<key>=<value>"),
        ("--http-restricted-api=metrics:k=v", "unknown API 'metrics'"),
    ):
        result = _edged("serve", "--model-repository", str(repository), flag)
        assert result.returncode == 1 and message in result.stderr, (flag, result.stderr)
    twice = _edged(
        "serve",
        "--model-repository",
        str(repository),
        "--http-restricted-api=logging:a=1",
        "--http-restricted-api=logging,trace:b=2",
    )
    assert twice.returncode != 0 and "logging is in more than one restricted group" in twice.stderr


def test_nothing_guarded_records_anonymous_callers(repository: Path, tmp_path: Path, outside_address: str) -> None:
    with run_server(
        [repository], "--http-address=0.0.0.0", "--model-control-mode=explicit", "--guarded-apis=none",
        f"--state-dir={tmp_path / 'state'}",
    ) as server:  # fmt: skip
        httpclient.InferenceServerClient(f"{outside_address}:{server.http_port}").load_model("spare")
        grpcclient.InferenceServerClient(f"{outside_address}:{server.grpc_port}").unload_model("spare")
        httpclient.InferenceServerClient(server.http_url).load_model("spare")
        events = request(server.http_url, "GET", "/v2/edged/models/spare/history?limit=1000").json()["events"]
        asked = [(e["state"], e["actor"]) for e in reversed(events) if e["source"] == "api"]
        assert ("LOADING", "anonymous") in asked and ("UNLOADED", "anonymous") in asked
        assert asked[-1] == ("READY", "loopback")
