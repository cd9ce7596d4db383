"""Triton's checksum repository agent, run by edged at load (a good digest loads, a wrong one fails the load with
the agent's message while the loaded version keeps serving, a file outside the model's folder is refused), and the
config fields edged reads but does not act on: each logged when the model loads and listed on its console page."""

from __future__ import annotations

import hashlib
import html
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import modelgen
import numpy as np
import pytest
import tritonclient.http as httpclient
from console_session import console_server, http_login
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, add_sub_inputs
from tritonclient.utils import InferenceServerException

SUMMED: Final = "summed"
NOTED: Final = "noted"
WRONG: Final = "0" * 32
NOTED_FIELDS: Final = (
    "optimization {\n  priority: PRIORITY_MAX\n  cuda { graphs: true }\n}\n"
    'instance_group [ { name: "fast" count: 1 kind: KIND_CPU rate_limiter { priority: 2 } host_policy: "numa0" } ]\n'
    'model_repository_agents { agents [ { name: "relocation" } ] }\n'
)


def _checksum_agent(key: str, value: str) -> str:
    agent = f'{{ name: "checksum", parameters {{ key: "{key}" value: "{value}" }} }}'
    return f"model_repository_agents {{ agents [ {agent} ] }}\n"


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("agents-repo")
    for name in (SUMMED, NOTED):
        modelgen.write_add_sub(repo / name, max_batch_size=8)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text(encoding="utf-8").replace('name: "add_sub"', f'name: "{name}"'))
    config = repo / SUMMED / "config.pbtxt"
    good = _md5(repo / SUMMED / "1" / "model.onnx")
    config.write_text(config.read_text(encoding="utf-8") + _checksum_agent("MD5:1/model.onnx", good))
    noted = repo / NOTED / "config.pbtxt"
    noted.write_text(noted.read_text(encoding="utf-8") + NOTED_FIELDS)
    (tmp_path_factory.getbasetemp() / "outside.bin").write_bytes(b"outside the model's folder")
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with console_server([repository], tmp_path_factory.mktemp("agents-state")) as started:
        yield started


@pytest.fixture
def client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(server.http_url)
    yield triton
    triton.close()


@pytest.fixture
def summed_config(repository: Path, client: httpclient.InferenceServerClient) -> Iterator[Path]:
    """The checksummed model's config, put back as it was (and loaded again) after the test."""
    config = repository / SUMMED / "config.pbtxt"
    text = config.read_text(encoding="utf-8")
    yield config
    config.write_text(text, encoding="utf-8")
    client.load_model(SUMMED)


def _serves(client: httpclient.InferenceServerClient, name: str) -> None:
    result = client.infer(name, add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)


def test_a_good_checksum_loads(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready(SUMMED)
    _serves(client, SUMMED)


def test_a_wrong_checksum_fails_the_load_and_the_loaded_version_keeps_serving(
    repository: Path, summed_config: Path, client: httpclient.InferenceServerClient
) -> None:
    text = summed_config.read_text(encoding="utf-8")
    good = _md5(repository / SUMMED / "1" / "model.onnx")
    summed_config.write_text(text.replace(good, WRONG), encoding="utf-8")
    with pytest.raises(InferenceServerException) as failed:
        client.load_model(SUMMED)
    # The agent's words, after the load's.
    assert failed.value.message() == (
        f"load failed for model '{SUMMED}': Mismatched MD5 hash for file 1/model.onnx, expect: {WRONG}, got: {good}"
    )
    assert client.is_model_ready(SUMMED)
    _serves(client, SUMMED)


@pytest.mark.parametrize("path", ["../noted/1/model.onnx", "/etc/hostname", "1/../../noted/config.pbtxt", "link"])
def test_a_file_outside_the_model_folder_is_refused(
    repository: Path, summed_config: Path, client: httpclient.InferenceServerClient, path: str
) -> None:
    link = repository / SUMMED / "link"
    link.unlink(missing_ok=True)
    link.symlink_to(repository.parent / "outside.bin")
    text = summed_config.read_text(encoding="utf-8")
    summed_config.write_text(text.replace("MD5:1/model.onnx", f"MD5:{path}"), encoding="utf-8")
    try:
        with pytest.raises(InferenceServerException) as failed:
            client.load_model(SUMMED)
    finally:
        link.unlink()
    assert failed.value.message() == (
        f"load failed for model '{SUMMED}': checksum agent of model '{SUMMED}': file '{path}' must be a path inside "
        "the model's folder"
    )
    assert client.is_model_ready(SUMMED)


def test_fields_not_acted_upon_are_logged_once_and_shown(
    server: Server, client: httpclient.InferenceServerClient
) -> None:
    _serves(client, NOTED)
    log = server.log()
    expected = {
        "optimization.cuda": "edged captures no CUDA graphs",
        "optimization.priority": "edged runs every model's instances at the same priority",
        "instance_group.host_policy": "edged has no host policies (instance group fast)",
        "model_repository_agents": "edged runs only the checksum repository agent, not 'relocation'",
    }
    for field, why in expected.items():
        line = f"model '{NOTED}': {field} is not acted upon: {why}"
        assert log.count(line) == 1, (line, log[-3000:])
    # The checksum agent and the rate limiter are acted upon: never a note.
    assert "instance_group.rate_limiter" not in log
    assert f"model '{SUMMED}': model_repository_agents" not in log
    session = http_login(server.console_port, "vera")
    status, _, page = session.request("GET", f"/models/{NOTED}")
    assert status == 200
    notes = html.unescape(page.split('id="notes-h"', 1)[1].split("</ul>", 1)[0])
    for field, why in expected.items():
        assert f"<li>{field}: {why}" in notes, notes
