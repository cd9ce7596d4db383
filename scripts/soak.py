"""Soak (not a test): the real daemon under steady mixed load for a while, watched for anything that keeps growing.

It builds a scratch repository: ``add_sub`` (ONNX), ``add_sub_python`` (Python backend, two stub processes),
``identity_python`` (Python backend), the ensemble ``add_sub_chain`` (add_sub, then add_sub_python) and two models
that are unloaded and loaded again through the repository API every ``--reload-seconds`` (``cycled_python`` and
``cycled_onnx``, so stubs start and stop all along). It starts ``python -m edged serve`` on it in explicit model
control mode and drives, each from its own thread in a closed loop:

- ``http-binary``: tritonclient HTTP infer on add_sub with binary tensors;
- ``grpc-stream``: tritonclient gRPC streaming infer on add_sub, one request in flight on one long-lived stream;
- ``python``: HTTP infer on add_sub_python;
- ``python-large``: HTTP infer on identity_python (Python backend) with tensors of 64 KiB to 1 MiB, which travel
  through the stub's shared memory rather than inside its packets;
- ``ensemble``: gRPC infer on add_sub_chain;
- ``reload``: unload and load of the cycled models, each checked with one inference once loaded;
- ``attack``, with ``--attack`` only: the hostile HTTP/2 clients of ``scripts/h2floods.py`` (its ``ATTACKS``: header
  block of size updates, SETTINGS of many entries, SETTINGS and PING floods, rapid reset, empty CONTINUATION and DATA
  frames) against the gRPC port, one after another in turn with a pause of 0.2 s between them, each on a new
  connection that the daemon must end with GOAWAY ENHANCE_YOUR_CALM; anything else fails that request. Memory,
  descriptors and threads must stay flat under them too, and the other workloads keep succeeding.

Every answer is checked against numpy. Every ``--sample-seconds`` it records the daemon's and its Python stubs' RSS,
open file descriptors and threads, the stubs' count, the shared memory segments they hold (the Python backend's
memfd rings, and /dev/shm/edged-* objects) and the state database's size (its used pages; its WAL file apart)
into a CSV, then draws the series (matplotlib when installed, ``pip install '.[soak]'``; a text chart otherwise).

At the end it prints, for each series, whether it stayed flat after warm-up: the slope of a least-squares line over
the second half of the run, times that half's duration, relative to the series' mean there, against
``--threshold``. And the requests per workload with their failures. It exits non-zero if a series grew, a request
failed or the daemon logged a traceback.

Run it through ``scripts/soak``::

    scripts/soak --minutes N [--csv PATH] [--plot PATH] [--sample-seconds S] [--reload-seconds S]
                 [--workdir DIR] [--attack]
    scripts/soak --minutes 3 --csv soak.csv --plot soak.png
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import http.client
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
PYTHON_MODEL: Final = REPO_ROOT / "tests" / "testdata" / "python_models" / "add_sub_python"
IDENTITY_MODEL: Final = REPO_ROOT / "tests" / "testdata" / "python_models" / "identity_python"
IDENTITY_CONFIG: Final = """name: "identity_python"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT_FP32" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT_FP32" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
# Elements of the large tensors, in turn: 64 KiB to 1 MiB of FP32, past what travels inside a stub's packet, so they
# go through its shared memory rings and make them grow.
LARGE_SIZES: Final = (16_384, 65_536, 262_144)
TRACEBACK_MARKER: Final = "Traceback (most recent call last)"
READY_MARKER: Final = "edged ready"
STARTUP_TIMEOUT_S: Final = 120.0
# Between two attacks of --attack: the ping flood alone sends about 25 MB, and back to back they would take a core.
ATTACK_PAUSE_S: Final = 0.2
SPARKS: Final = "▁▂▃▄▅▆▇█"

ENSEMBLE_CONFIG: Final = """name: "add_sub_chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1 input_map [ { key: "INPUT0" value: "X" }, { key: "INPUT1" value: "X" } ]
    output_map { key: "OUTPUT0" value: "sum" } },
  { model_name: "add_sub_python" model_version: -1
    input_map [ { key: "INPUT0" value: "sum" }, { key: "INPUT1" value: "X" } ]
    output_map { key: "OUTPUT0" value: "Y" } }
] }
"""
CYCLED: Final = ("cycled_python", "cycled_onnx")

X: Final = np.arange(16, dtype=np.float32).reshape(1, 16)
Y: Final = np.full((1, 16), 0.5, dtype=np.float32)


# --- the repository and the daemon -------------------------------------------------------------------------


def build_repository(repo: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import modelgen

    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_add_sub(repo / "cycled_onnx", max_batch_size=8, dims=16, dtype="FP32")
    shutil.copytree(PYTHON_MODEL, repo / "add_sub_python")
    shutil.copytree(PYTHON_MODEL, repo / "cycled_python")
    config = repo / "cycled_python" / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace('name: "add_sub_python"', 'name: "cycled_python"')
    config.write_text(text.replace("count: 2", "count: 1"), encoding="utf-8")
    shutil.copytree(IDENTITY_MODEL, repo / "identity_python")
    (repo / "identity_python" / "config.pbtxt").write_text(IDENTITY_CONFIG, encoding="utf-8")
    (repo / "add_sub_chain" / "1").mkdir(parents=True)
    (repo / "add_sub_chain" / "config.pbtxt").write_text(ENSEMBLE_CONFIG, encoding="utf-8")


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_file: Path
    state_dir: Path

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_file.read_text(encoding="utf-8", errors="replace")


def _ready(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/v2/health/ready")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def run_daemon(repo: Path, workdir: Path) -> Iterator[Daemon]:
    http_port, grpc_port, metrics_port = free_ports(3)
    state_dir = workdir / "state"
    log_file = workdir / "edged.log"
    args = [
        sys.executable, "-m", "edged", "serve",
        "--model-repository", str(repo),
        "--model-control-mode=explicit",
        "--load-model=*",
        "--http-address", "127.0.0.1",
        "--http-port", str(http_port),
        "--grpc-port", str(grpc_port),
        "--metrics-port", str(metrics_port),
        "--state-dir", str(state_dir),
    ]  # fmt: skip
    with log_file.open("wb") as handle:
        process = subprocess.Popen(
            args,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    daemon = Daemon(process, http_port, grpc_port, log_file, state_dir)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while READY_MARKER not in daemon.log() or not _ready(http_port):
            if process.poll() is not None:
                raise SystemExit(f"soak: edged exited with status {process.returncode} while starting:\n{daemon.log()}")
            if time.monotonic() > deadline:
                raise SystemExit(f"soak: edged was not ready within {STARTUP_TIMEOUT_S:.0f} s:\n{daemon.log()}")
            time.sleep(0.1)
        yield daemon
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- load ------------------------------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    ok: int = 0
    failed: int = 0
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, started: float, error: str | None) -> None:
        with self.lock:
            if error is None:
                self.ok += 1
                self.latencies_s.append(time.monotonic() - started)
            else:
                self.failed += 1
                self.errors[error] = self.errors.get(error, 0) + 1


def _check(outputs: dict[str, np.ndarray[Any, Any]]) -> str | None:
    for name, expected in outputs.items():
        if name not in _EXPECTED:
            continue
        if not np.array_equal(expected, _EXPECTED[name]):
            return f"wrong {name}"
    return None


_EXPECTED: Final = {"OUTPUT0": X + Y, "OUTPUT1": X - Y, "Y": X + X + X}


def _http_infer(client: Any, model: str) -> str | None:
    import tritonclient.http as httpclient

    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(X, binary_data=True)
    inputs[1].set_data_from_numpy(Y, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer(model, inputs, outputs=outputs)
    return _check({n: result.as_numpy(n) for n in ("OUTPUT0", "OUTPUT1")})


def _grpc_inputs() -> list[Any]:
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(X)
    inputs[1].set_data_from_numpy(Y)
    return inputs


def http_binary_loop(daemon: Daemon, workload: Workload, stop: threading.Event) -> None:
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(daemon.http_url) as client:
        while not stop.is_set():
            _timed(workload, lambda: _http_infer(client, "add_sub"))


def python_loop(daemon: Daemon, workload: Workload, stop: threading.Event) -> None:
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(daemon.http_url) as client:
        while not stop.is_set():
            _timed(workload, lambda: _http_infer(client, "add_sub_python"))


def python_large_loop(daemon: Daemon, workload: Workload, stop: threading.Event) -> None:
    import tritonclient.http as httpclient

    arrays = [np.arange(size, dtype=np.float32).reshape(1, size) for size in LARGE_SIZES]
    with httpclient.InferenceServerClient(daemon.http_url) as client:
        turn = 0
        while not stop.is_set():
            array = arrays[turn % len(arrays)]
            turn += 1

            def once(array: np.ndarray[Any, Any] = array) -> str | None:
                tensor = httpclient.InferInput("INPUT_FP32", list(array.shape), "FP32")
                tensor.set_data_from_numpy(array, binary_data=True)
                output = httpclient.InferRequestedOutput("OUTPUT_FP32", binary_data=True)
                result = client.infer("identity_python", [tensor], outputs=[output])
                return None if np.array_equal(result.as_numpy("OUTPUT_FP32"), array) else "wrong OUTPUT_FP32"

            _timed(workload, once)


def ensemble_loop(daemon: Daemon, workload: Workload, stop: threading.Event) -> None:
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        x = grpcclient.InferInput("X", [1, 16], "FP32")
        x.set_data_from_numpy(X)

        def once() -> str | None:
            result = client.infer("add_sub_chain", [x])
            return _check({"Y": result.as_numpy("Y")})

        while not stop.is_set():
            _timed(workload, once)


def grpc_stream_loop(daemon: Daemon, workload: Workload, stop: threading.Event) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(daemon.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        inputs = _grpc_inputs()

        def once() -> str | None:
            client.async_stream_infer("add_sub", inputs)
            result, error = answers.get(timeout=30)
            if error is not None:
                return str(error)
            return _check({n: result.as_numpy(n) for n in ("OUTPUT0", "OUTPUT1")})

        try:
            while not stop.is_set():
                _timed(workload, once)
        finally:
            client.stop_stream()


def reload_loop(daemon: Daemon, workload: Workload, stop: threading.Event, period_s: float) -> None:
    import tritonclient.http as httpclient

    while not stop.wait(period_s):
        # A client (and connection) per cycle: one kept idle for the period would meet the daemon's keep-alive
        # timeout (30 s by default) just as it is used again, and tritonclient does not retry a request on a
        # kept-alive connection that the server has closed.
        with httpclient.InferenceServerClient(daemon.http_url, network_timeout=120) as client:
            for model in CYCLED:

                def cycle(model: str = model) -> str | None:
                    client.unload_model(model)
                    client.load_model(model)
                    return _http_infer(client, model)

                _timed(workload, cycle)


def attack_loop(daemon: Daemon, workload: Workload, stop: threading.Event) -> None:
    """scripts/h2floods.py's attacks against the gRPC port in turn, each one request: a failure unless the daemon
    ended its connection with GOAWAY ENHANCE_YOUR_CALM."""
    import h2floods  # from scripts/, on sys.path since build_repository

    attacks = list(h2floods.ATTACKS.items())
    turn = 0
    while not stop.is_set():
        name, attack = attacks[turn % len(attacks)]
        turn += 1

        def once(name: str = name, attack: Callable[[int], int | None] = attack) -> str | None:
            try:
                code = attack(daemon.grpc_port)
            except Exception as exc:
                return f"{name}: {type(exc).__name__}: {str(exc)[:160]}"
            if code == h2floods.ENHANCE_YOUR_CALM:
                return None
            return f"{name}: GOAWAY {code if code is None else hex(code)}"

        _timed(workload, once)
        stop.wait(ATTACK_PAUSE_S)


def _timed(workload: Workload, call: Callable[[], str | None]) -> None:
    started = time.monotonic()
    try:
        error = call()
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc)[:160]}"
    workload.record(started, error)


# --- sampling ---------------------------------------------------------------------------------------------------

SERIES: Final = (
    "daemon_rss_mb",
    "daemon_fds",
    "daemon_threads",
    "stubs",
    "stubs_rss_mb",
    "stubs_fds",
    "stubs_threads",
    "shm_segments",
    "state_db_kb",
    "state_wal_kb",
)
# Sampled and drawn, but not judged: the WAL file grows until SQLite's automatic checkpoint by design.
UNJUDGED: Final = frozenset({"state_wal_kb"})


def _status(pid: int) -> dict[str, str]:
    values: dict[str, str] = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            values[key] = value.strip()
    return values


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (the Python stubs, and anything they start)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: the fields after its closing one are fixed.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _fds(pid: int) -> tuple[int, set[str]]:
    """How many descriptors ``pid`` holds, and the shared memory objects it holds open or has mapped."""
    shared: set[str] = set()
    names = os.listdir(f"/proc/{pid}/fd")
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith(("/memfd:", "/dev/shm/")):
                shared.add(f"{os.stat(f'/proc/{pid}/fd/{name}').st_ino}")
    # The Python backend's tensors are memfd objects that stay mapped after their descriptor is closed.
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(("/memfd:", "/dev/shm/")):
                shared.add(fields[4])
    return len(names), shared


def _database_kb(state_dir: Path) -> tuple[float, float]:
    """The state database's contents (its used pages, WAL included, as a reader sees them) and its WAL file, in KiB.

    The file alone changes only at checkpoints, and the WAL grows until SQLite's automatic checkpoint (about 4 MB)
    and starts over: neither says whether the data grows."""
    path = state_dir / "edged.db"
    wal = path.with_name("edged.db-wal")
    wal_kb = wal.stat().st_size / 1024 if wal.exists() else 0.0
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        free = connection.execute("PRAGMA freelist_count").fetchone()[0]
        size = connection.execute("PRAGMA page_size").fetchone()[0]
    finally:
        connection.close()
    return (pages - free) * size / 1024, wal_kb


def sample(daemon: Daemon) -> dict[str, float]:
    pid = daemon.process.pid
    status = _status(pid)
    daemon_fds, shared = _fds(pid)
    stubs = rss_kb = fds = threads = 0
    for child in _children(pid):
        try:
            child_status = _status(child)
            child_fds, child_shared = _fds(child)
        except OSError:
            continue  # gone meanwhile (a cycled model's stub)
        stubs += 1
        rss_kb += int(child_status.get("VmRSS", "0 kB").split()[0])
        threads += int(child_status["Threads"])
        fds += child_fds
        shared |= child_shared
    with contextlib.suppress(OSError):
        shared |= {f"/dev/shm/{name}" for name in os.listdir("/dev/shm") if name.startswith("edged-")}
    db_kb, wal_kb = _database_kb(daemon.state_dir)
    return {
        "daemon_rss_mb": int(status["VmRSS"].split()[0]) / 1024,
        "daemon_fds": daemon_fds,
        "daemon_threads": int(status["Threads"]),
        "stubs": stubs,
        "stubs_rss_mb": rss_kb / 1024,
        "stubs_fds": fds,
        "stubs_threads": threads,
        "shm_segments": len(shared),
        "state_db_kb": db_kb,
        "state_wal_kb": wal_kb,
    }


# --- verdicts ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trend:
    series: str
    first_mean: float
    second_mean: float
    slope_per_min: float
    relative: float  # the fitted change over the second half, relative to its mean
    flat: bool


def trend(series: str, times_s: list[float], values: list[float], threshold: float) -> Trend:
    """Flat when the least-squares line over the second half changes by at most ``threshold`` of the mean there."""
    half = len(values) // 2
    t, v = np.array(times_s[half:]), np.array(values[half:], dtype=np.float64)
    first_mean = float(np.mean(values[:half])) if half else float("nan")
    mean = float(np.mean(v))
    if len(v) < 2 or float(np.ptp(t)) == 0.0:
        return Trend(series, first_mean, mean, 0.0, 0.0, True)
    slope = float(np.polyfit(t, v, 1)[0])
    change = slope * float(np.ptp(t))
    relative = change / abs(mean) if mean else (0.0 if change == 0 else float("inf"))
    # Only growth is a leak; a series that shrinks after warm-up (memory handed back) is fine.
    return Trend(series, first_mean, mean, slope * 60, relative, relative <= threshold)


def text_chart(times_s: list[float], rows: list[dict[str, float]], width: int = 60) -> str:
    """One sparkline per series over the run (each column the mean of its samples), with its range."""
    lines = [f"{'':<15} {times_s[0]:>6.0f} s {'':{width - 12}} {times_s[-1]:>6.0f} s"]
    for name in SERIES:
        values = np.array([row[name] for row in rows], dtype=np.float64)
        columns = np.array_split(values, min(width, len(values)))
        means = np.array([float(np.mean(c)) for c in columns])
        low, high = float(values.min()), float(values.max())
        span = high - low
        marks = "".join(SPARKS[0 if span == 0 else round((m - low) / span * (len(SPARKS) - 1))] for m in means)
        lines.append(f"{name:<15} {marks:<{width}} {low:.1f}..{high:.1f}")
    return "\n".join(lines)


def plot(path: Path, times_s: list[float], rows: list[dict[str, float]]) -> str:
    """Draws the series to ``path`` (PNG with matplotlib, else the text chart); says what was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        path.write_text(text_chart(times_s, rows) + "\n", encoding="utf-8")
        return f"{path} (text: matplotlib is not installed; pip install '.[soak]' for a PNG)"
    figure, axes = plt.subplots(len(SERIES), 1, figsize=(10, 2 * len(SERIES)), sharex=True)
    for axis, name in zip(axes, SERIES, strict=True):
        axis.plot(times_s, [row[name] for row in rows], linewidth=1)
        axis.set_ylabel(name, rotation=0, ha="right", fontsize=8)
        axis.axvline(times_s[len(times_s) // 2], color="grey", linestyle=":", linewidth=0.8)
    axes[-1].set_xlabel("seconds (dotted: start of the half the verdicts use)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return str(path)


# --- the run ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    # This checkout's edged, whatever the virtualenv's editable install points at.
    sys.path.insert(0, str(REPO_ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, required=True, help="how long the load runs")
    parser.add_argument("--csv", type=Path, help="where the samples go (default: the scratch folder)")
    parser.add_argument("--plot", type=Path, help="where the chart goes (default: the scratch folder)")
    parser.add_argument("--sample-seconds", type=float, default=5.0, help="seconds between samples (default 5)")
    parser.add_argument("--reload-seconds", type=float, default=30.0, help="seconds between reloads (default 30)")
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="growth over the second half, relative to its mean, that fails a series (default 0.05)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the repository, state and log here (default: a temporary folder)",
    )
    parser.add_argument(
        "--attack",
        action="store_true",
        help="also run scripts/h2floods.py's hostile HTTP/2 clients against the gRPC port, in turn (workload attack)",
    )
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="edged-soak-")))
        else:
            workdir = args.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        csv_path = args.csv or workdir / "soak.csv"
        plot_path = args.plot or workdir / "soak.png"
        repo = workdir / "repository"
        if repo.exists():
            shutil.rmtree(repo)
        build_repository(repo)
        daemon = stack.enter_context(run_daemon(repo, workdir))
        print(f"soak: edged pid {daemon.process.pid} ready (HTTP {daemon.http_url}, gRPC {daemon.grpc_url})")
        return soak(daemon, args, csv_path, plot_path)
    return 1


def soak(daemon: Daemon, args: argparse.Namespace, csv_path: Path, plot_path: Path) -> int:
    stop = threading.Event()
    loops: dict[str, Callable[[Daemon, Workload, threading.Event], None]] = {
        "http-binary": http_binary_loop,
        "grpc-stream": grpc_stream_loop,
        "python": python_loop,
        "python-large": python_large_loop,
        "ensemble": ensemble_loop,
        "reload": lambda d, w, s: reload_loop(d, w, s, args.reload_seconds),
    }
    if args.attack:
        loops["attack"] = attack_loop
    workloads = {name: Workload(name) for name in loops}
    threads = [
        threading.Thread(target=loop, args=(daemon, workloads[name], stop), name=name, daemon=True)
        for name, loop in loops.items()
    ]
    for thread in threads:
        thread.start()

    started = time.monotonic()
    duration_s = args.minutes * 60
    times_s: list[float] = []
    rows: list[dict[str, float]] = []
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["elapsed_s", *SERIES, *(f"{name}_ok" for name in loops), *(f"{name}_failed" for name in loops)]
        )
        next_sample = started
        while True:
            now = time.monotonic()
            if now >= next_sample:
                if daemon.process.poll() is not None:
                    print(f"soak: edged exited with status {daemon.process.returncode}")
                    break
                row = sample(daemon)
                elapsed = now - started
                times_s.append(elapsed)
                rows.append(row)
                counts = [w.ok for w in workloads.values()] + [w.failed for w in workloads.values()]
                writer.writerow([f"{elapsed:.1f}", *(f"{row[s]:.2f}" for s in SERIES), *counts])
                handle.flush()
                next_sample += args.sample_seconds
            if now - started >= duration_s:
                break
            time.sleep(min(0.5, max(0.0, next_sample - time.monotonic())))
    stop.set()
    for thread in threads:
        thread.join(timeout=150)

    return report(daemon, workloads, times_s, rows, args.threshold, csv_path, plot_path)


def report(
    daemon: Daemon,
    workloads: dict[str, Workload],
    times_s: list[float],
    rows: list[dict[str, float]],
    threshold: float,
    csv_path: Path,
    plot_path: Path,
) -> int:
    bad: list[str] = []
    elapsed = times_s[-1] if times_s else 0.0
    print(f"\nrequests over {elapsed:.0f} s:")
    print(f"{'workload':<13} {'ok':>8} {'failed':>7} {'per s':>7} {'p50 ms':>7} {'p99 ms':>7}")
    for workload in workloads.values():
        latencies = np.array(workload.latencies_s) * 1000 if workload.latencies_s else np.zeros(1)
        rate = workload.ok / elapsed if elapsed else 0.0
        print(
            f"{workload.name:<13} {workload.ok:>8} {workload.failed:>7} {rate:>7.1f} "
            f"{np.percentile(latencies, 50):>7.1f} {np.percentile(latencies, 99):>7.1f}"
        )
        for error, count in sorted(workload.errors.items(), key=lambda item: -item[1])[:3]:
            print(f"    {count} x {error}")
        if workload.failed:
            bad.append(f"{workload.name}: {workload.failed} failed")
        if workload.ok == 0:
            bad.append(f"{workload.name}: nothing succeeded")

    if len(rows) >= 4:
        print(
            f"\nafter warm-up (the second half of {len(rows)} samples; growth over it relative to its mean, "
            f"at most {threshold:.0%}):"
        )
        print(f"{'series':<15} {'1st half':>9} {'2nd half':>9} {'slope/min':>10} {'growth':>8}  verdict")
        for name in SERIES:
            result = trend(name, times_s, [row[name] for row in rows], threshold)
            verdict = "(not judged)" if name in UNJUDGED else "flat" if result.flat else "GROWING"
            print(
                f"{name:<15} {result.first_mean:>9.2f} {result.second_mean:>9.2f} {result.slope_per_min:>10.3f} "
                f"{result.relative:>8.1%}  {verdict}"
            )
            if not result.flat and name not in UNJUDGED:
                bad.append(f"{name} grew {result.relative:.1%}")
        print()
        print(text_chart(times_s, rows))
        print(f"\nsoak: samples in {csv_path}; chart in {plot(plot_path, times_s, rows)}")
    else:
        bad.append(f"only {len(rows)} samples: too short a run to judge")

    log = daemon.log()
    tracebacks = log.count(TRACEBACK_MARKER)
    if tracebacks:
        first = log.index(TRACEBACK_MARKER)
        print(f"\nedged logged {tracebacks} traceback(s); the first:\n{log[max(0, first - 300) : first + 3000]}")
        bad.append(f"edged logged {tracebacks} traceback(s)")
    if daemon.process.poll() is not None:
        bad.append(f"edged exited with status {daemon.process.returncode} during the run")
    if bad:
        print("soak: FAILED: " + "; ".join(bad))
        return 1
    print("soak: every series flat after warm-up, no failed request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
