"""A sync failure quotes what the bucket holds: a key with control characters reaches the sync API, its history and
the daemon's log escaped (``\\x1b``), never as the raw bytes a terminal or a log reader would act on. The daemon
syncs from moto's real S3 server."""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Iterator
from typing import Any, Final

import pytest
from objectstores import S3Bucket, moto_server
from server import Server, request, run_server

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
WAIT_S: Final = 60.0
# An ANSI colour, a carriage return that would overwrite the log line, BEL, and the C1 CSI: each one a byte a
# terminal acts on. (moto's server cannot store a key with a line feed.)
HOSTILE_KEY: Final = "add_sub/1/\x1b[31mred\rforged line\x07\x9b"
# C0, DEL and C1, as edged.core.names counts them; the log's own line ends are its only line feeds.
CONTROL: Final = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
_buckets = itertools.count()


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    with moto_server() as port:
        yield port


def _status(server: Server) -> dict[str, Any]:
    reply = request(server.http_url, "GET", "/v2/edged/sync")
    assert reply.status == 200, reply.body
    document: dict[str, Any] = reply.json()
    return document


def test_a_hostile_key_is_escaped_in_the_sync_api_and_the_log(moto_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = S3Bucket(f"127.0.0.1:{moto_port}", f"escape-{os.getpid()}-{next(_buckets)}", CREDENTIALS)
    bucket.put("repo/add_sub/config.pbtxt", b'name: "add_sub"\n')
    bucket.put(f"repo/{HOSTILE_KEY}", b"x")
    url = f"s3://127.0.0.1:{moto_port}/{bucket.name}/repo"
    with run_server([url], "--sync-interval-secs", "3600", "--sync-timeout-secs", "5") as server:
        deadline = time.monotonic() + WAIT_S
        while (error := _status(server)["sources"][0]["last_error"]) is None:
            assert time.monotonic() < deadline, "the failed sync run was never reported"
            time.sleep(0.1)
        assert not CONTROL.search(error), repr(error)
        assert "\\x1b[31mred" in error, error
        history = request(server.http_url, "GET", "/v2/edged/sync/history").json()
        failed = [run for run in history["runs"] if run["outcome"] == "failed"]
        assert failed, history
        for run in failed:
            assert not CONTROL.search(run["message"]), repr(run["message"])
        # The journal: the failure is logged once the run ends, which is before the API reports it.
        log = server.log()
        assert "\\x1b[31mred" in log, log
        assert not CONTROL.search(log), repr([line for line in log.splitlines() if CONTROL.search(line)])
