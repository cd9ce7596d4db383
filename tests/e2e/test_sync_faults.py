"""Real faults under sync_once: a TCP proxy that stalls, cuts or drops idle connections (S3 through moto's server,
GCS through the emulator), and sync processes killed with SIGKILL at every phase of a run (S3)."""

from __future__ import annotations

import itertools
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import boto3
import pytest
import synccases
from objectstores import FaultProxy, gcs_emulator, gcs_upload, moto_server

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
GCS_BUCKET: Final = "models"
_names = itertools.count()


class S3Bucket:
    def __init__(self, port: int, name: str) -> None:
        self.name = name
        self.client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        self.client.create_bucket(Bucket=name)

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)


class GCSBucket:
    def __init__(self, port: int) -> None:
        self.port = port

    def put(self, key: str, data: bytes) -> None:
        gcs_upload(self.port, GCS_BUCKET, key, data)

    def delete(self, key: str) -> None:
        name = urllib.parse.quote(key, safe="")
        url = f"http://127.0.0.1:{self.port}/storage/v1/b/{GCS_BUCKET}/o/{name}"
        urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=10).close()


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    with moto_server() as port:
        yield port


@pytest.fixture(scope="module")
def emulator_port() -> Iterator[int]:
    with gcs_emulator(GCS_BUCKET) as port:
        yield port


def s3_remote(port: int) -> synccases.Remote:
    bucket = S3Bucket(port, f"faults-{next(_names)}")

    def locate(endpoint: str) -> tuple[str, dict[str, str]]:
        return f"s3://{endpoint}/{bucket.name}/repository", dict(CREDENTIALS)

    return synccases.Remote(bucket, "repository", locate, f"127.0.0.1:{port}")


def gcs_remote(port: int) -> synccases.Remote:
    prefix = f"faults-{next(_names)}"

    def locate(endpoint: str) -> tuple[str, dict[str, str]]:
        return f"gs://{GCS_BUCKET}/{prefix}", {"STORAGE_EMULATOR_HOST": f"http://{endpoint}"}

    return synccases.Remote(GCSBucket(port), prefix, locate, f"127.0.0.1:{port}")


@pytest.fixture(params=["s3", "gcs"])
def store(request: pytest.FixtureRequest) -> Iterator[tuple[synccases.Remote, FaultProxy]]:
    """A fresh repository on one kind of store, and a proxy in front of that store's endpoint."""
    if request.param == "s3":
        port: int = request.getfixturevalue("moto_port")
        remote = s3_remote(port)
    else:
        port = request.getfixturevalue("emulator_port")
        remote = gcs_remote(port)
    with FaultProxy(port).running() as proxy:
        yield remote, proxy


def test_stalled_download_resumes(store: tuple[synccases.Remote, FaultProxy], tmp_path: Path) -> None:
    synccases.stalled_download_resumes(store[0], tmp_path, store[1])


def test_repeatedly_cut_download_completes(store: tuple[synccases.Remote, FaultProxy], tmp_path: Path) -> None:
    synccases.repeatedly_cut_download_completes(store[0], tmp_path, store[1])


def test_stalled_listing_keeps_current(store: tuple[synccases.Remote, FaultProxy], tmp_path: Path) -> None:
    synccases.stalled_listing_keeps_current(store[0], tmp_path, store[1])


def test_idle_connection_dropped_between_runs(store: tuple[synccases.Remote, FaultProxy], tmp_path: Path) -> None:
    synccases.idle_connection_dropped_between_runs(store[0], tmp_path, store[1])
