"""The daemon serving an s3:// repository (moto's real S3 server): local-first start, updates through
``edged sync now`` with only the changed models reloaded, probation with per-model rollback, held-back revisions,
a kill -9 during a probation, closed-loop load across an update, the sync API, history and metrics."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest
import tritonclient.http as httpclient
from objectstores import FaultProxy, S3Bucket, gcs_emulator, gcs_upload, moto_server, write_repository
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, REPO_ROOT, Server, add_sub_inputs, request, run_server

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
PYTHON_MODEL: Final = REPO_ROOT / "tests" / "testdata" / "python_models" / "add_sub_python"
WAIT_S: Final = 60.0
_buckets = itertools.count()


class Bucket:
    """A bucket of moto's server and the repository under its ``repo/`` prefix."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.s3 = S3Bucket(f"127.0.0.1:{port}", f"fleet-{os.getpid()}-{next(_buckets)}", CREDENTIALS)

    def url(self, endpoint: str | None = None) -> str:
        return f"s3://{endpoint or f'127.0.0.1:{self.port}'}/{self.s3.name}/repo"

    def put(self, key: str, data: bytes) -> None:
        self.s3.put(f"repo/{key}", data)

    def delete(self, key: str) -> None:
        self.s3.delete(f"repo/{key}")

    def put_tree(self, files: dict[str, bytes]) -> None:
        for key, data in files.items():
            self.put(key, data)


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    with moto_server() as port:
        yield port


@pytest.fixture
def bucket(moto_port: int, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return Bucket(moto_port)


@pytest.fixture
def published(bucket: Bucket, tmp_path: Path) -> dict[str, bytes]:
    """add_sub and add_sub_int32 (ONNX) and add_sub_python, uploaded."""
    files = write_repository(tmp_path / "published")
    shutil.copytree(PYTHON_MODEL, tmp_path / "published" / "add_sub_python")
    files |= {
        f"add_sub_python/{path.relative_to(PYTHON_MODEL)}": path.read_bytes()
        for path in PYTHON_MODEL.rglob("*")
        if path.is_file()
    }
    bucket.put_tree(files)
    return files


def sync_flags(*extra: str) -> tuple[str, ...]:
    return ("--sync-interval-secs", "3600", "--sync-probation-secs", "2", "--sync-timeout-secs", "5", *extra)


def wait_until(what: str, check: Any, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.1)


def ready(server: Server, model: str) -> bool:
    return request(server.http_url, "GET", f"/v2/models/{model}/ready").status == 200


def status(server: Server) -> dict[str, Any]:
    reply = request(server.http_url, "GET", "/v2/edged/sync")
    assert reply.status == 200, reply.body
    document: dict[str, Any] = reply.json()
    return document


def edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, check=False
    )


def sync_now(server: Server) -> list[dict[str, Any]]:
    done = edged("sync", "now", "--url", f"http://{server.http_url}", "--json")
    assert done.returncode in (0, 1), done.stderr
    runs: list[dict[str, Any]] = json.loads(done.stdout)["runs"]
    return runs


def committed(server: Server) -> bool:
    (source,) = status(server)["sources"]
    return bool(source["phase"] == "idle" and source["revision"] == source["good_revision"])


def infer_add_sub(client: httpclient.InferenceServerClient, model: str = "add_sub") -> None:
    result = client.infer(model, add_sub_inputs())
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def spinning_cpu_seconds(at_least: float) -> float:
    """Runs a process that only spins until it has had ``at_least`` seconds of CPU (however long that takes on a
    loaded machine), and returns the CPU seconds it had."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        wait_until(f"a spinning process gets {at_least} s of CPU", lambda: cpu_seconds(spinner.pid) >= at_least)
        return cpu_seconds(spinner.pid)
    finally:
        spinner.kill()
        spinner.wait()


def max_batch_size(server: Server, model: str) -> int:
    return int(request(server.http_url, "GET", f"/v2/models/{model}/config").json()["max_batch_size"])


def config_with_batch(files: dict[str, bytes], model: str, size: int) -> bytes:
    return files[f"{model}/config.pbtxt"].replace(b"max_batch_size: 8", f"max_batch_size: {size}".encode())


def test_a_synced_repository_is_served_and_only_changed_models_reload(
    bucket: Bucket, published: dict[str, bytes]
) -> None:
    with run_server([bucket.url()], *sync_flags()) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        wait_until(
            "the first sync serves every model",
            lambda: all(ready(server, m) for m in ("add_sub", "add_sub_int32", "add_sub_python")),
        )
        infer_add_sub(client)
        infer_add_sub(client, "add_sub_python")
        wait_until("the first revision is committed", lambda: committed(server))
        first = status(server)["sources"][0]
        assert first["signed"] is False and first["last_error"] is None

        bucket.put("add_sub/config.pbtxt", config_with_batch(published, "add_sub", 4))
        for key in [k for k in published if k.startswith("add_sub_int32/")]:
            bucket.delete(key)
        (run,) = sync_now(server)
        assert run["outcome"] == "updated" and run["files"] == 1 + 2, run
        # The changed models reload as the probation begins, just after the run's answer.
        wait_until("add_sub reloads with its new config", lambda: max_batch_size(server, "add_sub") == 4)
        wait_until("the removed model is unloaded", lambda: not ready(server, "add_sub_int32"))
        infer_add_sub(client)
        wait_until("the update is committed", lambda: committed(server))

        history = request(server.http_url, "GET", "/v2/edged/sync/history").json()
        outcomes = [run["outcome"] for run in history["runs"]]
        assert outcomes[:4] == ["committed", "updated", "committed", "updated"], outcomes
        events = request(server.http_url, "GET", "/v2/edged/models/add_sub/history").json()["events"]
        assert any(event["source"] == "sync" for event in events)
        # add_sub_python did not change: it was loaded once, at the first sync, and never again.
        python_events = request(server.http_url, "GET", "/v2/edged/models/add_sub_python/history").json()["events"]
        assert sum(1 for event in python_events if event["state"] == "READY" and event["version"] is None) <= 1

        (unchanged,) = sync_now(server)
        assert unchanged["outcome"] == "unchanged" and unchanged["bytes"] == 0

        metrics = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
        assert 'edged_sync_runs_total{outcome="updated"' in metrics
        assert "edged_sync_last_success_timestamp_seconds" in metrics
        assert "edged_sync_revision_info" in metrics


def test_an_unreachable_bucket_at_boot_serves_the_last_snapshot(
    bucket: Bucket, published: dict[str, bytes], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with FaultProxy(bucket.port).running() as proxy:
        url = bucket.url(proxy.url())
        with run_server([url], *sync_flags("--state-dir", str(state))) as server:
            wait_until("the first sync serves add_sub", lambda: ready(server, "add_sub"))
            wait_until("the first revision is committed", lambda: committed(server))
        # The link stops moving: a run waits on it for as long as its timeout (an hour here) lets it.
        proxy.set_budget(0, stall=True)
        with run_server([url], *sync_flags("--state-dir", str(state), "--sync-timeout-secs", "3600")) as server:
            # Up and serving the last snapshot while the first run still waits for the network: it is not waited
            # for.
            assert ready(server, "add_sub")
            infer_add_sub(httpclient.InferenceServerClient(server.http_url))
            wait_until("the first run waits on the link", lambda: status(server)["sources"][0]["phase"] == "syncing")
            assert status(server)["sources"][0]["last_error"] is None
            assert ready(server, "add_sub")
            proxy.set_budget(0)  # the link goes down: the waiting run fails
            wait_until("the failed run is reported", lambda: status(server)["sources"][0]["last_error"] is not None)
            (source,) = status(server)["sources"]
            assert "endpoint unreachable" in source["last_error"], source
            assert source["consecutive_failures"] >= 1
            done = edged("sync", "status", "--url", f"http://{server.http_url}")
            assert done.returncode == 0 and "last error" in done.stdout, done
            assert f"(last known good: {source['good_revision']})" in done.stdout, done
            # The log names what keeps serving: the last snapshot's revision.
            assert f"revision {source['revision']} keeps serving" in server.log_file.read_text(), source


def test_a_model_whose_new_config_is_refused_keeps_serving_and_its_revision_is_held_back(
    bucket: Bucket, published: dict[str, bytes]
) -> None:
    with run_server([bucket.url()], *sync_flags()) as server:
        wait_until("the first revision is committed", lambda: ready(server, "add_sub") and committed(server))
        # The new revision changes two models: add_sub well, add_sub_int32 with a config that cannot be served.
        bucket.put("add_sub/config.pbtxt", config_with_batch(published, "add_sub", 4))
        bucket.put("add_sub_int32/config.pbtxt", b'name: "add_sub_int32"\nbackend: "onnxruntime"\nmax_batch_size: -3\n')
        (run,) = sync_now(server)
        assert run["outcome"] == "updated" and "refused before the switch" in run["message"], run
        assert "add_sub_int32" in run["message"] and "max_batch_size" in run["message"], run
        wait_until("the probation ends", lambda: status(server)["sources"][0]["phase"] == "idle")
        (source,) = status(server)["sources"]
        bad = source["held_back"][0]
        assert source["held_back"] == [bad] and source["revision"] == f"{bad}~partial", source
        assert source["good_revision"] == source["revision"], source
        # The model that passed has its new files; the refused one never stopped serving its old ones.
        assert max_batch_size(server, "add_sub") == 4
        assert ready(server, "add_sub_int32") and max_batch_size(server, "add_sub_int32") == 8
        events = request(server.http_url, "GET", "/v2/edged/models/add_sub_int32/history").json()["events"]
        assert not any(event["source"] == "sync" and event["state"] == "UNLOADING" for event in events), events

        (again,) = sync_now(server)
        assert again["outcome"] == "held-back" and again["bytes"] == 0, again

        # A newer revision that fixes the model is taken.
        bucket.put("add_sub_int32/config.pbtxt", config_with_batch(published, "add_sub_int32", 2))
        (fixed,) = sync_now(server)
        assert fixed["outcome"] == "updated", fixed
        wait_until("the fix is committed", lambda: committed(server))
        assert max_batch_size(server, "add_sub_int32") == 2


CRASHING_MODEL: Final = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        os._exit(3)
"""


def test_a_crashing_update_fails_its_probation(bucket: Bucket, published: dict[str, bytes], tmp_path: Path) -> None:
    state = tmp_path / "state"
    with run_server([bucket.url()], *sync_flags("--state-dir", str(state))) as server:
        wait_until("the first revision is committed", lambda: ready(server, "add_sub_python") and committed(server))
        last_run = status(server)["sources"][0]["last_run"]
    # The update's probation is one no test outlasts, on any machine: the crash ends it, whenever the first request
    # comes. (The daemon restarts with it, serving what the first one committed, and syncs that again at once.)
    flags = sync_flags("--state-dir", str(state), "--sync-probation-secs", "600")
    with run_server([bucket.url()], *flags) as server:

        def synced_again() -> bool:
            run = status(server)["sources"][0]["last_run"]
            return run is not None and run != last_run and committed(server)

        wait_until("the run at the start", synced_again)
        assert status(server)["sources"][0]["last_run"]["outcome"] == "unchanged"
        bucket.put("add_sub_python/1/model.py", CRASHING_MODEL.encode())
        (run,) = sync_now(server)
        assert run["outcome"] == "updated", run
        client = httpclient.InferenceServerClient(server.http_url)

        def rolled_back() -> bool:
            # Requests keep coming: the first one the new model gets kills its process.
            with contextlib.suppress(Exception):
                infer_add_sub(client, "add_sub_python")
            return bool(status(server)["sources"][0]["held_back"] == [run["revision"]])

        wait_until("the rollback", rolled_back)
        # Once the probation is over, the rollback is in the history too (it is written after held_back is set).
        wait_until("the probation ends", lambda: status(server)["sources"][0]["phase"] == "idle")
        wait_until("the old model serves", lambda: ready(server, "add_sub_python"))
        infer_add_sub(client, "add_sub_python")
        runs = request(server.http_url, "GET", "/v2/edged/sync/history").json()["runs"]
        assert runs[0]["outcome"] == "rolled-back" and "died" in runs[0]["message"], runs[0]
    server.killed = True  # the crashed stub's exit is logged; the daemon itself stopped cleanly


def test_kill_9_during_probation_leaves_one_complete_revision(
    bucket: Bucket, published: dict[str, bytes], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    with run_server([bucket.url()], *sync_flags("--state-dir", str(state))) as server:
        wait_until("the first revision is committed", lambda: ready(server, "add_sub") and committed(server))
    bucket.put("add_sub/config.pbtxt", config_with_batch(published, "add_sub", 4))
    # A probation that lasts until the kill, however long the test takes to see it begin.
    with run_server([bucket.url()], *sync_flags("--state-dir", str(state), "--sync-probation-secs", "600")) as server:
        wait_until(
            "the update is in probation",
            lambda: max_batch_size(server, "add_sub") == 4 and status(server)["sources"][0]["phase"] == "probation",
        )
        server.killed = True
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
    flags = sync_flags("--state-dir", str(state), "--sync-probation-secs", "1")
    with run_server([bucket.url()], *flags) as server:
        assert max_batch_size(server, "add_sub") == 4
        wait_until("the revision is committed after the restart", lambda: committed(server))
        assert "holding its probation" in server.log()
    (root,) = (state / "sync").iterdir()
    manifest = json.loads((root / "current" / "manifest.json").read_text())
    served = {
        str(path.relative_to(root / "current" / "repo")): path.read_bytes()
        for path in (root / "current" / "repo").rglob("*")
        if path.is_file()
    }
    assert set(served) == set(manifest["files"]) == set(published)


def test_closed_loop_load_across_an_update_fails_no_request(bucket: Bucket, published: dict[str, bytes]) -> None:
    with run_server([bucket.url()], *sync_flags()) as server:
        wait_until("add_sub is committed", lambda: ready(server, "add_sub") and committed(server))
        failures: list[BaseException] = []
        done = threading.Event()
        count = [0]

        def load() -> None:
            client = httpclient.InferenceServerClient(server.http_url)
            while not done.is_set():
                try:
                    infer_add_sub(client)
                    count[0] += 1
                except BaseException as error:
                    failures.append(error)

        workers = [threading.Thread(target=load) for _ in range(4)]
        for worker in workers:
            worker.start()
        try:
            # Requests before, during and after the update, however fast they go.
            wait_until("the clients run", lambda: count[0] >= 20 or bool(failures))
            bucket.put("add_sub/config.pbtxt", config_with_batch(published, "add_sub", 4))
            (run,) = sync_now(server)
            assert run["outcome"] == "updated", run
            wait_until("the new config serves", lambda: max_batch_size(server, "add_sub") == 4)
            served = count[0]
            wait_until("requests to the new config", lambda: count[0] >= served + 20 or bool(failures))
        finally:
            done.set()
            for worker in workers:
                worker.join()
        assert failures == [] and count[0] > 0


def test_pause_resume_and_the_guarded_api(bucket: Bucket, published: dict[str, bytes]) -> None:
    # A one-second interval: paused, the runs it would start come due and must wait for a resume.
    with run_server([bucket.url()], *sync_flags(), "--sync-interval-secs", "1") as server:
        url = f"http://{server.http_url}"
        assert edged("sync", "pause", "--url", url).returncode == 0
        assert status(server)["paused"] is True
        # Paused, the loop waits for a resume: it does not spin. A busy loop would take a core's share of the CPU,
        # as much as a process that does nothing but spin beside it gets, however loaded the machine: the daemon's
        # CPU time is measured while such a process gets a second of CPU.
        before = cpu_seconds(server.process.pid)
        used = spinning_cpu_seconds(1.0)
        assert cpu_seconds(server.process.pid) - before < used / 2
        assert "sync paused" in edged("sync", "status", "--url", url).stdout
        assert edged("sync", "resume", "--url", url).returncode == 0
        assert status(server)["paused"] is False
    # Without a repository to sync, the API says so.
    with run_server([REPO_ROOT / "model_repository"]) as server:
        reply = request(server.http_url, "GET", "/v2/edged/sync")
        assert reply.status == 503 and "synced" in reply.error()


def test_a_device_on_a_channel_reports_its_status_to_the_fleet(bucket: Bucket, tmp_path: Path) -> None:
    files = write_repository(tmp_path / "published")
    bucket.put_tree({f"stable/{key}": data for key, data in files.items()})
    flags = sync_flags("--sync-channel", "stable", "--sync-report-status", "true", "--device-id", "kiosk-7")
    with run_server([bucket.url()], *flags) as server:
        wait_until("the channel's models serve", lambda: ready(server, "add_sub") and committed(server))
        (source,) = status(server)["sources"]
        assert source["url"] == f"{bucket.url()}/stable"
        done = edged("fleet", "status", bucket.url(), "--json")
        assert done.returncode == 0, done.stderr
        (device,) = json.loads(done.stdout)
        assert device["device"] == "kiosk-7" and device["channel"] == "stable", device
        assert device["revision"] == source["good_revision"] and device["last_error"] is None, device
        assert device["models"]["add_sub"]["state"] == "READY", device


def test_a_signed_repository_is_verified_and_a_tampered_file_refused(bucket: Bucket, tmp_path: Path) -> None:
    local = tmp_path / "published"
    write_repository(local)
    keys = tmp_path / "keys"
    assert edged("keygen", str(keys)).returncode == 0
    root = tmp_path / "root.json"
    first = edged(
        "publish",
        str(local),
        bucket.url(),
        "--key",
        str(keys / "online.pem"),
        "--root-key",
        str(keys / "root.pem"),
        "--root-out",
        str(root),
    )
    assert first.returncode == 0, first.stderr
    with run_server([bucket.url()], *sync_flags("--sync-trusted-root", str(root))) as server:
        wait_until("the signed revision is committed", lambda: ready(server, "add_sub") and committed(server))
        (source,) = status(server)["sources"]
        assert source["signed"] is True and source["revision"] == "v1", source

        # Bytes replaced in the bucket behind the metadata's back, with a new revision signed for another file.
        (local / "add_sub" / "config.pbtxt").write_bytes(config_with_batch(tree_of(local), "add_sub", 4))
        second = edged("publish", str(local), bucket.url(), "--key", str(keys / "online.pem"), "--root-out", str(root))
        assert second.returncode == 0, second.stderr
        signed = (local / "add_sub" / "config.pbtxt").read_bytes()
        bucket.put("add_sub/config.pbtxt", signed.replace(b"max_batch_size: 4", b"max_batch_size: 6"))
        (run,) = sync_now(server)
        assert run["outcome"] == "failed" and run["problem"] == "verify_failed", run
        assert max_batch_size(server, "add_sub") == 8  # v1 still serves, whole
        assert "verification failed" in status(server)["sources"][0]["last_error"]

        bucket.put("add_sub/config.pbtxt", signed)  # the signed bytes are back
        (run,) = sync_now(server)
        assert run["outcome"] == "updated" and run["revision"] == "v2", run
        # The changed model reloads as the probation begins, just after the run's answer.
        wait_until("v2 serves", lambda: max_batch_size(server, "add_sub") == 4)


def tree_of(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in root.rglob("*") if path.is_file()}


SEQUENCE_MODEL: Final = REPO_ROOT / "tests" / "testdata" / "python_models" / "simple_sequence"


def test_a_model_with_a_live_sequence_is_swapped_when_it_ends(bucket: Bucket) -> None:
    files = {
        f"simple_sequence/{path.relative_to(SEQUENCE_MODEL)}": path.read_bytes()
        for path in SEQUENCE_MODEL.rglob("*")
        if path.is_file()
    }
    # Idle limit and wait long enough that only the sequence's END ends them, however long the test takes.
    idle = b"max_sequence_idle_microseconds: 5000000"
    assert idle in files["simple_sequence/config.pbtxt"]
    files["simple_sequence/config.pbtxt"] = files["simple_sequence/config.pbtxt"].replace(
        idle, b"max_sequence_idle_microseconds: 600000000"
    )
    bucket.put_tree(files)
    with run_server([bucket.url()], *sync_flags("--sync-sequence-wait-secs", "600")) as server:
        wait_until("simple_sequence is committed", lambda: ready(server, "simple_sequence") and committed(server))
        client = httpclient.InferenceServerClient(server.http_url)

        def send(value: int, **flags: bool) -> None:
            tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            client.infer("simple_sequence", [tensor], sequence_id=42, **flags)

        send(1, sequence_start=True)
        config = files["simple_sequence/config.pbtxt"]
        bucket.put("simple_sequence/config.pbtxt", config.replace(b"max_batch_size: 8", b"max_batch_size: 4"))
        (run,) = sync_now(server)
        assert run["outcome"] == "updated", run
        # The sequence is live: the daemon waits for it to end, and the old version keeps serving it meanwhile.
        wait_until(
            "the swap waits for the sequence",
            lambda: "waiting up to 600 s for the live sequences of simple_sequence" in server.log(),
        )
        for value in (2, 3, 4):
            assert max_batch_size(server, "simple_sequence") == 8
            send(value)
        assert max_batch_size(server, "simple_sequence") == 8
        send(5, sequence_end=True)
        wait_until("the swap once the sequence ended", lambda: max_batch_size(server, "simple_sequence") == 4)


def test_a_gcs_repository_is_served_mixed_with_a_local_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = write_repository(tmp_path / "published")
    with gcs_emulator("fleet") as port:
        for key, data in files.items():
            if key.startswith("add_sub_int32/"):  # add_sub is the local repository's
                gcs_upload(port, "fleet", f"models/{key}", data)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        local = REPO_ROOT / "model_repository"
        with run_server(["gs://fleet/models", local], *sync_flags()) as server:
            wait_until("the GCS models serve", lambda: ready(server, "add_sub_int32") and committed(server))
            assert ready(server, "add_sub") and ready(server, "digits")  # the local repository's
            (source,) = status(server)["sources"]
            assert source["url"] == "gs://fleet/models" and source["last_error"] is None, source
            gcs_upload(port, "fleet", "models/add_sub_int32/config.pbtxt", config_with_batch(files, "add_sub_int32", 2))
            (run,) = sync_now(server)
            assert run["outcome"] == "updated" and run["files"] == 1, run
            # The changed model reloads as the probation begins, just after the run's answer.
            wait_until("the new config serves", lambda: max_batch_size(server, "add_sub_int32") == 2)


WARMUP_FROM_A_MISSING_FILE: Final = b"""
model_warmup [
  {
    name: "from_file"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "missing.bin" } }
    inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
  }
]
"""


def test_a_model_whose_warmup_fails_after_an_update_is_rolled_back(bucket: Bucket, published: dict[str, bytes]) -> None:
    with run_server([bucket.url()], *sync_flags()) as server:
        wait_until("the first revision is committed", lambda: ready(server, "add_sub") and committed(server))
        config = config_with_batch(published, "add_sub", 4) + WARMUP_FROM_A_MISSING_FILE
        bucket.put("add_sub/config.pbtxt", config)  # a config that reads well: only loading it runs the warmup
        (run,) = sync_now(server)
        assert run["outcome"] == "updated" and "refused" not in run["message"], run
        wait_until("the rollback", lambda: status(server)["sources"][0]["held_back"] == [run["revision"]])
        wait_until("the probation ends", lambda: status(server)["sources"][0]["phase"] == "idle")
        assert ready(server, "add_sub") and max_batch_size(server, "add_sub") == 8  # the old version serves on
        infer_add_sub(httpclient.InferenceServerClient(server.http_url))
        runs = request(server.http_url, "GET", "/v2/edged/sync/history").json()["runs"]
        assert runs[0]["outcome"] == "rolled-back" and "warmup" in runs[0]["message"], runs[0]
