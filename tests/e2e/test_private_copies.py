"""Where the copies of models loaded with overrides live: ``<state dir>/overrides``, apart from every repository.

The package keeps its repository in ``/var/lib/edged/models``, beside the state in ``/var/lib/edged``: a load through
the API once settled the model's private copies in that very folder and removed the repository's model. These
tests run that layout (the repository in ``<state dir>/models``) with real daemons and check the folders on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import modelgen
import tritonclient.http as httpclient
from server import REPO_ROOT, api_token, bearer, run_server

TIMEOUT_S = 120


def _files(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def test_the_packaged_layout_keeps_its_repository_through_loads(tmp_path: Path) -> None:
    state = tmp_path / "state"
    repo = state / "models"
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
    before = _files(repo)
    args = ("--model-control-mode=explicit", "--load-model=*", f"--state-dir={state}")
    with run_server([repo], *args) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        client.load_model("add_sub")
        assert _files(repo) == before
        # With an override the model serves from a private copy, which lands apart from the repository ...
        config = client.get_model_config("add_sub")
        config["max_batch_size"] = 4
        client.load_model("add_sub", config=json.dumps(config), headers=bearer(api_token(server)))
        assert client.get_model_config("add_sub")["max_batch_size"] == 4
        assert len(list((state / "overrides" / "add_sub").glob("[0-9]*"))) == 1
        assert _files(repo) == before
        # ... and goes once the model serves from its repository folder again (unloaded and loaded: a plain load
        # keeps a config override, as Triton's), which stays.
        client.unload_model("add_sub")
        client.load_model("add_sub")
        assert not (state / "overrides" / "add_sub").exists()
        assert _files(repo) == before
        client.close()
    with run_server([repo], *args) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("add_sub")
        client.close()


def test_copies_an_earlier_release_kept_move_to_their_own_folder(tmp_path: Path) -> None:
    state = tmp_path / "state"
    repo = tmp_path / "repo"
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
    # An earlier release's copy of add_sub with max_batch_size 4, the one it served: <state>/models/add_sub/<gen>.
    copy = state / "models" / "add_sub" / "1700000000000000000"
    shutil.copytree(repo / "add_sub", copy)
    config = (copy / "config.pbtxt").read_text(encoding="utf-8").replace("max_batch_size: 8", "max_batch_size: 4")
    (copy / "config.pbtxt").write_text(config, encoding="utf-8")
    (state / "models" / "add_sub" / "CURRENT").write_text(copy.name, encoding="utf-8")
    with run_server([repo], "--model-control-mode=explicit", "--load-model=*", f"--state-dir={state}") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.get_model_config("add_sub")["max_batch_size"] == 4
        client.close()
    assert not (state / "models").exists()
    assert (state / "overrides" / "add_sub" / copy.name / "config.pbtxt").is_file()


def test_a_repository_in_the_copies_folder_is_refused_at_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    repo = state / "overrides" / "repo"
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
    before = _files(repo)
    args = [sys.executable, "-m", "edged", "serve", "--model-repository", str(repo), f"--state-dir={state}"]
    args += ["--http-port=0", "--grpc-port=0", "--metrics-port=0", "--console-port=0"]
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"model repository '{repo}' lies in '{state / 'overrides'}'" in output, output
    assert "Traceback" not in output
    assert _files(repo) == before
