"""systemd integration and the daemon's life cycle, seen from outside as systemd sees them.

The daemon runs with ``NOTIFY_SOCKET`` pointing at a datagram socket this test owns, so every sd_notify message
(READY, STATUS, WATCHDOG, RELOADING, STOPPING) arrives here in order. The unit file and its sysusers.d and
tmpfiles.d snippets are checked with systemd's own tools.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import pytest
import tritonclient.http as httpclient
from server import REPO_ROOT, STARTUP_TIMEOUT_S, TRACEBACK_MARKER, Reply, free_ports, post_json

from edged.daemon.systemd import ServiceNotifier, watchdog_interval

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

SYSTEMD_DIR: Final = REPO_ROOT / "systemd"
# Small, so that heartbeats come every 0.1 s and a test sees many of them at once.
WATCHDOG_USEC: Final = 200_000
STOP_TIMEOUT_S: Final = 30.0

# A Python model that sleeps as long as its request says, and leaves marker files: "started" once an execution
# began, "finalized" when finalize() ran.
SLOW_CONFIG: Final = """name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "marker_dir" value: { string_value: "MARKERS" } }
"""
SLOW_MODEL: Final = """import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.markers = json.loads(args["model_config"])["parameters"]["marker_dir"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()[0])
            open(os.path.join(self.markers, "started"), "w").close()
            time.sleep(seconds)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([seconds], np.float32))]))
        return responses

    def finalize(self):
        open(os.path.join(self.markers, "finalized"), "w").close()
"""


# ------------------------------------------------------------------------------------------------------------
# the service manager's end of the notify socket


class Listener:
    """The socket systemd would own: every datagram the daemon sends, in order, with when it arrived.

    A thread reads it all the time, as systemd does: sd_notify blocks once a datagram socket's small queue is full
    (net.unix.max_dgram_qlen), and a test that stopped reading would freeze the daemon it watches."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        self.sock = sock
        self.path = path
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._seen = 0  # messages handed to the test so far
        self._arrived = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        self.sock.settimeout(0.05)
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            message = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
            with self._arrived:
                self.messages.append((time.monotonic(), message))
                self._arrived.notify_all()

    def close(self) -> None:
        self._closed = True
        self._reader.join()

    def receive(self, timeout: float) -> dict[str, str] | None:
        """The next message not yet received, waiting up to ``timeout`` seconds for it."""
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.messages) > self._seen, timeout)
            if len(self.messages) == self._seen:
                return None
            self._seen += 1
            return self.messages[self._seen - 1][1]

    def wait_for(self, wanted: Callable[[dict[str, str]], bool], timeout: float, what: str) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.receive(max(0.01, deadline - time.monotonic()))
            if message is not None and wanted(message):
                return message
        pytest.fail(f"no {what} within {timeout:.0f} s; received: {self.non_heartbeats()}")

    def drain(self) -> list[dict[str, str]]:
        """What has arrived and was not received yet, after a moment for datagrams in the socket to be read."""
        out: list[dict[str, str]] = []
        while (message := self.receive(0.1)) is not None:
            out.append(message)
        return out

    def non_heartbeats(self) -> list[dict[str, str]]:
        with self._arrived:
            return [message for _, message in self.messages if message != {"WATCHDOG": "1"}]

    def heartbeats(self) -> int:
        with self._arrived:
            return sum(1 for _, message in self.messages if message == {"WATCHDOG": "1"})


@contextlib.contextmanager
def notify_socket() -> Iterator[Listener]:
    # A short directory of its own: a socket path must fit in 108 bytes.
    directory = tempfile.mkdtemp(prefix="edged-notify-")
    path = os.path.join(directory, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
        listener = Listener(sock, path)
        try:
            yield listener
        finally:
            listener.close()
    finally:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)


def is_ready(message: dict[str, str]) -> bool:
    return message.get("READY") == "1"


# ------------------------------------------------------------------------------------------------------------
# the daemon under a pretend systemd


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    notify: Listener
    http_port: int
    grpc_port: int
    metrics_port: int
    console_port: int
    log_file: Path

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_file.read_text(encoding="utf-8", errors="replace")

    def status_line(self, ready: int, total: int) -> str:
        return (
            f"{ready}/{total} models ready; HTTP :{self.http_port}, gRPC :{self.grpc_port}, "
            f"metrics :{self.metrics_port}, console :{self.console_port}"
        )

    def wait_ready(self) -> dict[str, str]:
        return self.notify.wait_for(is_ready, STARTUP_TIMEOUT_S, "READY=1")

    def wait_exit(self) -> int:
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"edged did not exit within {STOP_TIMEOUT_S:.0f} s:\n{self.log()}")


@contextlib.contextmanager
def notified_daemon(repository: Path, *args: str, wait_ready: bool = True) -> Iterator[Daemon]:
    """``edged serve`` on the repository with NOTIFY_SOCKET and WATCHDOG_USEC set, as systemd starts it; yields
    once READY=1 arrived. Fails the test if the daemon logged a traceback."""
    http_port, grpc_port, metrics_port, console_port = free_ports(4)
    with notify_socket() as listener, tempfile.TemporaryDirectory(prefix="edged-test-") as scratch:
        log_file = Path(scratch) / "edged.log"
        command = [
            sys.executable,
            "-m",
            "edged",
            "serve",
            "--model-repository",
            str(repository),
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--grpc-address",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
            "--console-port",
            str(console_port),
            "--state-dir",
            str(Path(scratch) / "state"),
            *args,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1", NOTIFY_SOCKET=listener.path, WATCHDOG_USEC=str(WATCHDOG_USEC))
        with log_file.open("wb") as handle:
            process = subprocess.Popen(
                command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT, env=env
            )
        daemon = Daemon(process, listener, http_port, grpc_port, metrics_port, console_port, log_file)
        try:
            if wait_ready:
                daemon.wait_ready()
            yield daemon
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a test that failed while the daemon was stopped
                process.kill()
                process.wait()
        assert TRACEBACK_MARKER not in daemon.log(), daemon.log()


def infer_slow(url: str, seconds: float) -> Reply:
    document = {"inputs": [{"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    return post_json(url, "/v2/models/slow/infer", document)


def slow_repository(root: Path) -> tuple[Path, Path]:
    """A repository holding the slow model, and the folder it leaves its markers in."""
    repository, markers = root / "repository", root / "markers"
    (repository / "slow" / "1").mkdir(parents=True)
    markers.mkdir()
    (repository / "slow" / "config.pbtxt").write_text(SLOW_CONFIG.replace("MARKERS", str(markers)), "utf-8")
    (repository / "slow" / "1" / "model.py").write_text(SLOW_MODEL, "utf-8")
    return repository, markers


def wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout:.0f} s"
        time.sleep(0.02)


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat: R, S, T (stopped), Z, ..."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    return stat.rsplit(")", 1)[1].split()[0]


# ------------------------------------------------------------------------------------------------------------
# the notify sequence


def test_ready_status_watchdog_and_stopping_in_order(small_repository: Path) -> None:
    with notified_daemon(small_repository, wait_ready=False) as daemon:
        ready = daemon.wait_ready()
        # READY=1 means serving: the endpoints answer at once.
        assert httpclient.InferenceServerClient(daemon.http_url).is_server_live()
        assert accepts_connections(daemon.grpc_port)
        assert accepts_connections(daemon.metrics_port)
        # add_sub and auto_complete load; broken_syntax counts as a model that should be served but is not.
        assert ready["STATUS"] == daemon.status_line(2, 3)
        before = daemon.notify.non_heartbeats()[:-1]
        assert {"STATUS": "loading models"} in before
        assert not any("STOPPING" in message or "READY" in message for message in before)
        while daemon.notify.heartbeats() < 5:
            daemon.notify.wait_for(lambda m: m == {"WATCHDOG": "1"}, 10, "WATCHDOG=1")
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.wait_exit() == 0
        daemon.notify.drain()
        after_ready = daemon.notify.non_heartbeats()
        after_ready = after_ready[after_ready.index(ready) + 1 :]
        assert after_ready == [{"STOPPING": "1", "STATUS": "stopping"}], after_ready


def test_status_follows_models_as_they_load_and_unload(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    modelgen.write_add_sub(repository / "a", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_add_sub(repository / "b", max_batch_size=8, dims=16, dtype="FP32")
    with notified_daemon(repository, "--model-control-mode=explicit", "--load-model=a") as daemon:
        assert daemon.notify.non_heartbeats()[-1]["STATUS"] == daemon.status_line(1, 1)
        client = httpclient.InferenceServerClient(daemon.http_url)
        client.load_model("b")
        daemon.notify.wait_for(lambda m: m.get("STATUS") == daemon.status_line(2, 2), 10, "a status with b")
        client.unload_model("a")
        daemon.notify.wait_for(lambda m: m.get("STATUS") == daemon.status_line(1, 1), 10, "a status without a")
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.wait_exit() == 0


def test_heartbeats_stop_while_the_daemon_is_frozen_and_resume_after(small_repository: Path) -> None:
    with notified_daemon(small_repository) as daemon:
        daemon.notify.wait_for(lambda m: m == {"WATCHDOG": "1"}, 10, "a first WATCHDOG=1")
        daemon.process.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while process_state(daemon.process.pid) != "T":
            assert time.monotonic() < deadline, "the daemon did not stop"
            time.sleep(0.01)
        daemon.notify.drain()  # what was sent before it stopped
        # Ten heartbeat intervals: a heartbeat from anywhere but the frozen process would show here.
        assert daemon.notify.receive(10 * WATCHDOG_USEC / 2 / 1e6) is None
        daemon.process.send_signal(signal.SIGCONT)
        daemon.notify.wait_for(lambda m: m == {"WATCHDOG": "1"}, 10, "WATCHDOG=1 after SIGCONT")
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.wait_exit() == 0


def test_the_watchdog_is_fed_by_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop that is blocked sends no heartbeat, whatever the rest of the process does."""
    interval_usec = 40_000
    with notify_socket() as listener:
        monkeypatch.setenv("NOTIFY_SOCKET", listener.path)
        notifier = ServiceNotifier({"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": str(interval_usec)})
        assert notifier.interval == interval_usec / 2 / 1e6

        async def block_the_loop() -> tuple[float, float]:
            task = notifier.start_watchdog()
            assert task is not None
            await asyncio.sleep(0.3)
            blocked_at = time.monotonic()
            time.sleep(1.0)  # the loop is stuck here, as in a model that blocks it
            unblocked_at = time.monotonic()
            await asyncio.sleep(0.3)
            task.cancel()
            return blocked_at, unblocked_at

        blocked_at, unblocked_at = asyncio.run(block_the_loop())
        listener.drain()
        arrivals = [t for t, message in listener.messages if message == {"WATCHDOG": "1"}]
    # The one sent just before the loop blocked may arrive a moment later; none is sent while it is blocked.
    assert not [t for t in arrivals if blocked_at + 0.1 < t < unblocked_at], (blocked_at, unblocked_at, arrivals)
    assert any(t < blocked_at for t in arrivals)
    assert any(t >= unblocked_at for t in arrivals)


def test_watchdog_settings_as_systemd_gives_them() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    # Meant for another process (the daemon's parent, say): not this one's to feed.
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({}) is None
    # Without a notify socket nothing is sent, and no heartbeat task starts.
    quiet = ServiceNotifier({"WATCHDOG_USEC": "30000000"})
    assert not quiet.enabled
    assert quiet.interval is None


# ------------------------------------------------------------------------------------------------------------
# stopping


def test_sigterm_finishes_the_request_in_flight_then_exits_0(tmp_path: Path) -> None:
    repository, markers = slow_repository(tmp_path)
    with notified_daemon(repository) as daemon, concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(infer_slow, daemon.http_url, 5.0)
        wait_for_file(markers / "started", 30)
        daemon.process.send_signal(signal.SIGTERM)
        daemon.notify.wait_for(lambda m: m.get("STOPPING") == "1", 10, "STOPPING=1")
        # New connections are refused while the request in flight still runs.
        deadline = time.monotonic() + 10
        while accepts_connections(daemon.http_port):
            assert time.monotonic() < deadline, "edged still accepts connections after SIGTERM"
            time.sleep(0.05)
        assert not answer.done()
        reply = answer.result(timeout=30)
        assert reply.status == 200, reply.body
        assert reply.json()["outputs"][0]["data"] == [5.0]
        assert daemon.wait_exit() == 0
        # The Python model was finalized, after its request was answered.
        assert (markers / "finalized").exists()
        assert "edged stopped" in daemon.log()


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    repository, markers = slow_repository(tmp_path)
    with notified_daemon(repository) as daemon, concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(infer_slow, daemon.http_url, 60.0)
        wait_for_file(markers / "started", 30)
        daemon.process.send_signal(signal.SIGTERM)
        daemon.notify.wait_for(lambda m: m.get("STOPPING") == "1", 10, "STOPPING=1")
        daemon.process.send_signal(signal.SIGINT)
        # Well before the 60 s request or the 30 s exit timeout could end the drain.
        assert daemon.process.wait(20) == 1
        assert "SIGINT received again: exiting at once" in daemon.log()
        assert not (markers / "finalized").exists()
        with pytest.raises(OSError):
            answer.result(timeout=30)


# ------------------------------------------------------------------------------------------------------------
# reloading


def _add_settled_model(repository: Path, name: str) -> None:
    """A model copied in completely: its files are older than poll mode's settle time."""
    modelgen.write_add_sub(repository / name, max_batch_size=8, dims=16, dtype="FP32")
    past = time.time() - 60
    for path in [repository / name, *(repository / name).rglob("*")]:
        os.utime(path, (past, past))


@pytest.mark.parametrize("mode", ["none", "poll", "explicit"])
def test_sighup_reloads_and_rescans_the_repository(tmp_path: Path, mode: str) -> None:
    repository = tmp_path / "repository"
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    args = [f"--model-control-mode={mode}", "--repository-poll-secs=86400"]
    if mode == "explicit":
        args.append("--load-model=*")
    with notified_daemon(repository, *args) as daemon:
        client = httpclient.InferenceServerClient(daemon.http_url)
        assert not client.is_model_ready("added")
        _add_settled_model(repository, "added")
        daemon.process.send_signal(signal.SIGHUP)
        reloading = daemon.notify.wait_for(lambda m: m.get("RELOADING") == "1", 10, "RELOADING=1")
        assert int(reloading["MONOTONIC_USEC"]) > 0
        done = daemon.notify.wait_for(is_ready, 60, "READY=1 after the reload")
        if mode == "explicit":
            # The repository API alone loads models in explicit mode: a rescan changes nothing.
            assert done["STATUS"] == daemon.status_line(1, 1)
            assert not client.is_model_ready("added")
        else:
            assert done["STATUS"] == daemon.status_line(2, 2)
            assert client.is_model_ready("added")
            a = np.arange(16, dtype=np.float32).reshape(1, 16)
            inputs = [httpclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(a)
            np.testing.assert_array_equal(client.infer("added", inputs).as_numpy("OUTPUT0"), a + a)
        # Between RELOADING=1 and READY=1 nothing else but the status of the reload.
        messages = daemon.notify.non_heartbeats()
        between = messages[messages.index(reloading) + 1 : messages.index(done)]
        assert all(set(message) == {"STATUS"} for message in between), between
        assert "reload done" in daemon.log()
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.wait_exit() == 0


def test_sighup_rereads_the_config_file_and_keeps_serving_when_it_is_broken(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    config = tmp_path / "edged.toml"
    config.write_text("http_max_input_size = 1000000\n", encoding="utf-8")
    with notified_daemon(repository, f"--config={config}") as daemon:
        config.write_text("http_max_input_size = 2000000\n", encoding="utf-8")
        daemon.process.send_signal(signal.SIGHUP)
        daemon.notify.wait_for(lambda m: m.get("RELOADING") == "1", 10, "RELOADING=1")
        daemon.notify.wait_for(is_ready, 60, "READY=1 after the reload")
        assert "reload: http_max_input_size changed from 1000000 to 2000000; restart edged to apply it" in daemon.log()
        # A file that no longer parses: the reload says so, ends with READY=1, and the daemon serves as before.
        config.write_text("http_max_input_size = \n", encoding="utf-8")
        daemon.process.send_signal(signal.SIGHUP)
        daemon.notify.wait_for(lambda m: m.get("RELOADING") == "1", 10, "RELOADING=1")
        done = daemon.notify.wait_for(is_ready, 60, "READY=1 after the failed reload")
        assert done["STATUS"] == daemon.status_line(1, 1)
        assert "the configuration was not re-read" in daemon.log()
        assert httpclient.InferenceServerClient(daemon.http_url).is_model_ready("add_sub")
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.wait_exit() == 0


# ------------------------------------------------------------------------------------------------------------
# start-up failures: status 1, one line, no READY


def _failed_start(listener: Listener, *args: str) -> tuple[int, list[str]]:
    """Runs ``edged serve`` to its end; its exit status and the lines that report an error."""
    env = dict(os.environ, NOTIFY_SOCKET=listener.path)
    result = subprocess.run(
        [sys.executable, "-m", "edged", "serve", "--http-address", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        env=env,
        check=False,
    )
    output = result.stdout + result.stderr
    assert TRACEBACK_MARKER not in output, output
    assert "edged ready" not in output, output
    listener.drain()
    assert not any(is_ready(message) for _, message in listener.messages), listener.messages
    errors = [line for line in output.splitlines() if re.match(r"E\d{4} ", line) or line.startswith("edged:")]
    return result.returncode, errors


@pytest.mark.parametrize("endpoint", ["http", "metrics", "console"])
def test_a_port_in_use_stops_the_start(small_repository: Path, tmp_path: Path, endpoint: str) -> None:
    http_port, grpc_port, metrics_port, console_port = free_ports(4)
    taken = {"http": http_port, "metrics": metrics_port, "console": console_port}[endpoint]
    with socket.socket() as holder, notify_socket() as listener:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        status, errors = _failed_start(
            listener,
            f"--model-repository={small_repository}",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
            f"--console-port={console_port}",
            f"--state-dir={tmp_path / 'state'}",
        )
    assert status == 1
    assert len(errors) == 1, errors
    assert f"127.0.0.1:{taken}" in errors[0] and "in use" in errors[0], errors


def _ports() -> list[str]:
    http_port, grpc_port, metrics_port = free_ports(3)
    return [f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}"]


def test_a_repository_that_is_not_a_directory_stops_the_start(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "repository"
    not_a_directory.write_text("a file", encoding="utf-8")
    with notify_socket() as listener:
        status, errors = _failed_start(
            listener, f"--model-repository={not_a_directory}", f"--state-dir={tmp_path / 'state'}", *_ports()
        )
    assert status == 1
    assert len(errors) == 1 and str(not_a_directory) in errors[0], errors


def test_an_unreadable_repository_stops_the_start(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any directory whatever its mode")
    repository = tmp_path / "repository"
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    repository.chmod(0)
    try:
        with notify_socket() as listener:
            status, errors = _failed_start(
                listener, f"--model-repository={repository}", f"--state-dir={tmp_path / 'state'}", *_ports()
            )
    finally:
        repository.chmod(0o755)
    assert status == 1
    assert len(errors) == 1 and str(repository) in errors[0], errors


@pytest.mark.parametrize("how", ["under_a_file", "read_only"])
def test_an_unwritable_state_directory_stops_the_start(small_repository: Path, tmp_path: Path, how: str) -> None:
    if how == "under_a_file":
        (tmp_path / "file").write_text("not a directory", encoding="utf-8")
        state = tmp_path / "file" / "state"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into any directory whatever its mode")
        state = tmp_path / "state"
        state.mkdir()
        state.chmod(0o500)
    with notify_socket() as listener:
        status, errors = _failed_start(
            listener, f"--model-repository={small_repository}", f"--state-dir={state}", *_ports()
        )
    assert status == 1
    assert len(errors) == 1 and str(state) in errors[0], errors


# ------------------------------------------------------------------------------------------------------------
# the unit and its snippets


def _systemd_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = _systemd_tool("systemd-analyze")
    unit = (SYSTEMD_DIR / "edged.service").read_text(encoding="utf-8")
    assert "ExecStart=/usr/bin/edged serve --config /etc/edged/edged.toml" in unit
    # verify insists that the binary exists: the same unit, pointing at a stand-in.
    binary = tmp_path / "edged"
    binary.write_text("#!/bin/sh\n", encoding="utf-8")
    binary.chmod(0o755)
    copy = tmp_path / "edged.service"
    copy.write_text(unit.replace("/usr/bin/edged", str(binary)), encoding="utf-8")
    result = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, check=False)
    # verify exits 0 even for unknown keys and bad values, which it only reports: its output must be empty too.
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == ""


def test_every_flag_the_unit_and_the_packaging_name_is_one_edged_serve_accepts() -> None:
    """The unit's comments, the packaged configuration, the container's command and scripts/run tell operators of
    `edged serve` flags: each one named must be a flag that `edged serve --help` lists."""
    help_text = subprocess.run(
        [sys.executable, "-m", "edged", "serve", "--help"], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    ).stdout
    flag = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    accepted = set(flag.findall(help_text))
    assert {"--model-control-mode", "--load-model", "--backend-config"} <= accepted
    dockerfile = (REPO_ROOT / "packaging/Dockerfile").read_text(encoding="utf-8").splitlines()
    texts = {
        "systemd/edged.service": (SYSTEMD_DIR / "edged.service").read_text(encoding="utf-8"),
        "packaging/edged.toml": (REPO_ROOT / "packaging/edged.toml").read_text(encoding="utf-8"),
        # Only its command: the rest names docker's flags.
        "packaging/Dockerfile": "\n".join(line for line in dockerfile if line.startswith('CMD ["serve"')),
        "scripts/run": (REPO_ROOT / "scripts/run").read_text(encoding="utf-8"),
    }
    for name, text in texts.items():
        named = set(flag.findall(text))
        assert named, f"{name} names no flag: the check would be blind"
        assert named <= accepted, f"{name} names flags edged serve refuses: {sorted(named - accepted)}"


def test_the_unit_verify_check_sees_mistakes(tmp_path: Path) -> None:
    """The check above is not blind: a misspelt key and a bad value are reported."""
    analyze = _systemd_tool("systemd-analyze")
    binary = tmp_path / "edged"
    binary.write_text("#!/bin/sh\n", encoding="utf-8")
    binary.chmod(0o755)
    unit = (SYSTEMD_DIR / "edged.service").read_text(encoding="utf-8").replace("/usr/bin/edged", str(binary))
    copy = tmp_path / "edged.service"
    copy.write_text(unit.replace("KillMode=mixed", "KilMode=mixed").replace("ProtectHome=yes", "ProtectHome=yess"))
    result = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, check=False)
    assert "KilMode" in result.stderr and "yess" in result.stderr, result.stderr


def test_sysusers_and_tmpfiles_create_the_user_and_the_directories(tmp_path: Path) -> None:
    sysusers, tmpfiles = _systemd_tool("systemd-sysusers"), _systemd_tool("systemd-tmpfiles")
    root = tmp_path / "root"
    for kind in ("sysusers.d", "tmpfiles.d"):
        (root / "usr/lib" / kind).mkdir(parents=True)
        shutil.copy(SYSTEMD_DIR / kind / "edged.conf", root / "usr/lib" / kind / "edged.conf")
    (root / "etc").mkdir()
    subprocess.run([sysusers, f"--root={root}"], capture_output=True, text=True, check=True)
    passwd = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    assert "edged" in passwd, passwd
    _, _, uid, gid, _, home, shell = passwd["edged"]
    assert (home, shell) == ("/var/lib/edged", "/usr/sbin/nologin")
    groups = {line.split(":")[0]: line.strip().split(":")[3] for line in (root / "etc/group").read_text().splitlines()}
    assert "edged" in groups["render"].split(","), groups  # Intel NPUs' and GPUs' device nodes
    subprocess.run([tmpfiles, f"--root={root}", "--create"], capture_output=True, text=True, check=True)
    for directory in (root / "var/lib/edged", root / "var/lib/edged/models"):
        info = directory.stat()
        assert (info.st_uid, info.st_gid) == (int(uid), int(gid)), directory
        assert info.st_mode & 0o777 == 0o750, directory
