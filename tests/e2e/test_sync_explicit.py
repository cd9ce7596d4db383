"""A synced repository under explicit model control, as the packaged configuration serves it (explicit mode with
``--load-model '*'``). A device starts before its first sync, with nothing to load: the models a sync brings that
``--load-model`` asks for (a name, or '*' for every model) load as they arrive, as they would have at the start;
one it does not name waits for the repository API, as in Triton. The daemon syncs from moto's real S3 server."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest
from objectstores import S3Bucket, moto_server, write_repository
from server import REPO_ROOT, Server, request, run_server

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
WAIT_S: Final = 120.0
_buckets = itertools.count()


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    with moto_server() as port:
        yield port


def _ready(server: Server, model: str) -> bool:
    return request(server.http_url, "GET", f"/v2/models/{model}/ready").status == 200


def _sync_now(server: Server) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edged", "sync", "now", "--url", f"http://{server.http_url}", "--json"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert run["outcome"] == "updated", run


def _committed(server: Server) -> bool:
    (source,) = request(server.http_url, "GET", "/v2/edged/sync").json()["sources"]
    return bool(source["phase"] == "idle" and source["revision"] == source["good_revision"])


def _wait(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


@pytest.mark.parametrize(("load_model", "loads_new"), [("*", True), ("add_sub", False)])
def test_a_model_a_sync_adds(
    moto_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load_model: str, loads_new: bool
) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = S3Bucket(f"127.0.0.1:{moto_port}", f"explicit-{os.getpid()}-{next(_buckets)}", CREDENTIALS)
    files = write_repository(tmp_path / "published")
    for key, data in files.items():
        if key.startswith("add_sub/"):
            bucket.put(f"repo/{key}", data)
    flags = ("--sync-interval-secs=3600", "--sync-probation-secs=1", "--sync-timeout-secs=30")
    control = ("--model-control-mode=explicit", f"--load-model={load_model}", f"--state-dir={tmp_path / 'state'}")
    url = f"s3://127.0.0.1:{moto_port}/{bucket.name}/repo"
    with run_server([url], *control, *flags) as server:
        _wait("add_sub serves", lambda: _ready(server, "add_sub"))
        for key, data in files.items():
            if key.startswith("add_sub_int32/"):
                bucket.put(f"repo/{key}", data)
        _sync_now(server)
        _wait("the new revision is committed", lambda: _committed(server))
        assert _ready(server, "add_sub_int32") is loads_new
        index = request(server.http_url, "POST", "/v2/repository/index", b"{}").json()
        assert {entry["name"] for entry in index} == {"add_sub", "add_sub_int32"}
        assert _ready(server, "add_sub")
