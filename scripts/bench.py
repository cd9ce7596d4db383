"""Measures how close edged comes to running ONNX Runtime in-process, and to Triton on the same machine.

For each model, protocol and concurrency it measures, one after the other so they never compete for cores:

1. in-process: threads calling ``InferenceSession.run`` on one session in a closed loop (the ceiling);
2. edged: the real daemon driven by Triton's ``perf_analyzer`` over each protocol:

   - ``http``: HTTP/REST with binary tensors;
   - ``grpc``: gRPC ``ModelInfer`` calls, one in flight per concurrent client;
   - ``grpc stream``: gRPC ``ModelStreamInfer``, one stream per concurrent client;
   - ``http shm`` and ``grpc shm``: inputs and outputs in system shared memory regions that perf_analyzer
     registers (``--shared-memory system``), so no tensor bytes travel over the socket;

3. Triton: Triton Inference Server serving the same model.onnx through a Python-backend model that runs
   onnxruntime (the reference build has no ONNX Runtime backend), with the same perf_analyzer commands.

With ``--batching`` it measures dynamic batching instead, on the ResNet-50-shaped model only:

1. in-process: one thread running ``InferenceSession.run`` on batches of 1, 2, 4, 8 and 16 images back to back;
   the best images per second is the ceiling every ratio divides by;
2. edged and Triton, each serving four models over the same model.onnx: without batching and with
   ``dynamic_batching``, each with one and with two instances, driven by perf_analyzer at concurrency 1, 4, 8 and
   16 with batch-1 requests (HTTP unless ``--protocols`` says otherwise). The servers' statistics give the mean
   batch they executed.

With ``--python`` it measures what a Python-backend model costs: the repository's add_sub_python
(tests/testdata/python_models/add_sub_python, Triton's add_sub example as model.py, two instances) against the
ONNX add_sub with as many instances, both on edged (each Python request crosses to a stub process and back), and
against Triton's own Python backend serving the same model.py (where it passes response parameters, it does
so only when there are some, as Triton 2.51 requires) and config.pbtxt. perf_analyzer drives each at
concurrency 1, 8 and 16 with batch-1 requests (HTTP unless ``--protocols`` says otherwise). Its results go under
the ``python`` key of bench-results.json, beside what other runs left there.

With ``--sync`` it measures repository sync instead: edged's ``sync_once`` against ``aws s3 sync`` on the same
moto S3 server, full downloads of a ~300 MB repository and of a 1,000-file one, then one changed file; see
scripts/bench_sync.py. Its results go under the ``sync`` key of bench-results.json.

With ``--tls`` it measures what TLS costs: add_sub on edged over plaintext and over TLS (a certificate made for
the run by trustme, RSA 2048, TLS 1.3), one daemon after the other in the same run, over HTTP and gRPC unary
calls at concurrency 1, 8 and 16. Its results go under the ``tls`` key of bench-results.json.

Run it through ``scripts/bench``, which sets up the checkout first::

    scripts/bench                       # add_sub and resnet50, every protocol, concurrency 1, 8, 16
    scripts/bench --quick               # add_sub only, short windows
    scripts/bench --protocols grpc      # only the gRPC rows (unary, streaming, shared memory)
    scripts/bench --skip-triton         # edged and in-process only
    scripts/bench --skip-shm            # no shared-memory rows
    scripts/bench --batching            # dynamic batching and instance counts on resnet50 (about 10 minutes)
    scripts/bench --batching --quick    # the same at concurrency 1 and 8, short windows
    scripts/bench --python              # Python-backend add_sub against the ONNX one and Triton (a few minutes)
    scripts/bench --python --quick      # the same with short windows
    scripts/bench --tls                 # add_sub over TLS against plaintext, HTTP and gRPC (a few minutes)
    scripts/bench --tls --quick         # the same at concurrency 1 and 8, short windows
    scripts/bench --sync                # repository sync against aws s3 sync on moto (a few minutes)
    scripts/bench --sync --quick        # the same with a ~60 MB repository and fewer runs
    scripts/bench --console             # the web console's memory and server time per page
    scripts/bench --footprint           # idle memory, start times, a Python instance's cost, installed size

perf_analyzer 2.60 loads the CUDA runtime (libcudart) whenever it runs with shared memory, even system shared
memory, and stops when it cannot. Loading the library needs no GPU, so before the first shared-memory run the
benchmark puts libcudart from NVIDIA's CUDA runtime wheel into perf_analyzer's root (``$PA_ROOT``, never into
../shared); when that is not possible it says why and leaves the shared-memory rows out.

The measurements assume an otherwise idle machine. Each phase first waits a while for other processes to leave
the CPU, and every measurement records how much CPU they used meanwhile (everything but this process, the load
generator and the server under test). A measurement they disturbed is taken again once when the CPU is quiet
(within a time budget); a figure still marked ``!`` in the table was disturbed and is worth measuring again.

With ``--footprint`` it measures what edged costs the device: idle memory of the daemon and its children by
process and by mapping, cold start to READY, the CLI's start, a Python-backend instance's cost and the
virtualenv's size by distribution; see scripts/bench_footprint.py. Its results go under the ``footprint`` key.

Generated models, server logs and the results (bench-results.json) go to bench-models/, which git ignores.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import os
import platform
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import modelgen
import numpy as np
import numpy.typing as npt
import onnxruntime as ort

ROOT: Final = Path(__file__).resolve().parent.parent
BENCH_DIR: Final = ROOT / "bench-models"
MODEL_STORE: Final = BENCH_DIR / "models"
EDGED_REPO: Final = BENCH_DIR / "edged"
TRITON_REPO: Final = BENCH_DIR / "triton"
RESULTS_FILE: Final = BENCH_DIR / "bench-results.json"
TOOLS: Final = ROOT.parent / "shared" / "tools"
PERF_ANALYZER: Final = TOOLS / "perf-analyzer"
TRITON_REFERENCE: Final = TOOLS / "triton-reference"
# perf_analyzer runs in a chroot; the files it writes are found under this root on the host.
PA_ROOT: Final = Path(os.environ.get("PA_ROOT", "/var/tmp/perf-analyzer-root"))
# Where ../shared/tools/perf-analyzer unpacks the perf_analyzer binary inside that root.
PA_BINARY: Final = "opt/pa/perf_analyzer/bin/perf_analyzer"
# Inside the root: on the loader's default path (Debian's /etc/ld.so.conf.d/libc.conf).
PA_LIBRARY_DIR: Final = "usr/local/lib"
CONCURRENCIES: Final = (1, 8, 16)
PROTOCOLS: Final = ("http", "grpc")
SERVER_START_TIMEOUT_S: Final = 180.0
# Share of the CPU used by other processes above which the figures are flagged as disturbed.
BUSY_WARNING: Final = 0.15
# How long a phase waits for other processes to leave the CPU before it starts anyway.
QUIET_WAIT_S: Final = 30.0
# Disturbed measurements are taken again, once each, within this much time in all (--quick: a quarter).
RETRY_BUDGET_S: Final = 120.0
# perf_analyzer -v --percentile 50: "  Pass [3] throughput: 7177.38 infer/sec. p50 latency: 1903 usec"
PASS_LINE: Final = re.compile(r"Pass \[\d+\] throughput: ([0-9.]+) infer/sec\. p50 latency: ([0-9.]+) usec")
# The names under which perf_analyzer dlopens the CUDA runtime, as they appear in its binary.
CUDART_NAME: Final = re.compile(rb"libcudart\.so(?:\.[0-9]+)*")
# What perf_analyzer prints when it cannot load the CUDA runtime.
CUDA_RUNTIME_FAILURE: Final = re.compile(r"Cannot open CUDA runtime library|Failed to load one or more CUDA functions")
Array = npt.NDArray[Any]

# Triton's reference build has no ONNX Runtime backend, so it serves each model.onnx through this
# Python-backend model: one InferenceSession with the options edged gives a model without parameters
# (pool threads that do not spin), as the in-process loop uses too. Requests that Triton's dynamic batcher
# hands over together run as one batch, as edged's onnxruntime backend runs them.
TRITON_MODEL_PY: Final = '''\
"""Runs model.onnx with onnxruntime inside Triton's Python backend (written by scripts/bench.py)."""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]
        self.batching = config.get("max_batch_size", 0) > 0

    def execute(self, requests):
        feeds = [
            {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            for request in requests
        ]
        if len(requests) == 1 or not self.batching:
            return [self._response(self.session.run(self.outputs, request_feeds)) for request_feeds in feeds]
        # A batch from the dynamic batcher: one run over the requests' inputs concatenated along the batch
        # dimension (the batcher only groups requests of equal shapes), its outputs split back per request.
        batch = {name: np.concatenate([request_feeds[name] for request_feeds in feeds]) for name in self.inputs}
        results = self.session.run(self.outputs, batch)
        responses = []
        start = 0
        for request_feeds in feeds:
            end = start + len(request_feeds[self.inputs[0]])
            responses.append(self._response([array[start:end] for array in results]))
            start = end
        return responses

    def _response(self, results):
        tensors = [pb_utils.Tensor(name, array) for name, array in zip(self.outputs, results)]
        return pb_utils.InferenceResponse(output_tensors=tensors)
'''


# --------------------------------------------------------------------------------------------------------
# what is measured


@dataclass(frozen=True)
class BenchModel:
    name: str
    # Closed-loop duration of each in-process measurement and perf_analyzer's measurement window.
    in_process_s: float
    window_ms: int
    # The bytes of the largest output at batch 1: perf_analyzer's --output-shared-memory-size.
    output_bytes: int
    # One request's inputs, batch 1.
    make_inputs: Callable[[], dict[str, Array]]


def _add_sub_inputs() -> dict[str, Array]:
    rng = np.random.default_rng(0)
    return {name: rng.random((1, 16), dtype=np.float32) for name in ("INPUT0", "INPUT1")}


def _resnet50_inputs() -> dict[str, Array]:
    return {"input": np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)}


def bench_models(quick: bool) -> list[BenchModel]:
    add_sub_bytes = 16 * 4  # OUTPUT0 and OUTPUT1: FP32 [16]
    resnet50_bytes = 1000 * 4  # output: FP32 [1000]
    if quick:
        return [BenchModel("add_sub", 2.0, 1000, add_sub_bytes, _add_sub_inputs)]
    return [
        BenchModel("add_sub", 5.0, 1500, add_sub_bytes, _add_sub_inputs),
        BenchModel("resnet50", 10.0, 3000, resnet50_bytes, _resnet50_inputs),
    ]


@dataclass(frozen=True)
class Mode:
    """How perf_analyzer talks to a server."""

    name: str  # as printed in the protocol column
    protocol: str  # "http" or "grpc"
    streaming: bool = False
    shared_memory: bool = False
    tls: bool = False


MODES: Final = (
    Mode("http", "http"),
    Mode("grpc", "grpc"),
    Mode("grpc stream", "grpc", streaming=True),
    Mode("http shm", "http", shared_memory=True),
    Mode("grpc shm", "grpc", shared_memory=True),
)
# --tls: each protocol over plaintext and over TLS, unary calls.
TLS_MODES: Final = (
    Mode("http", "http"),
    Mode("http tls", "http", tls=True),
    Mode("grpc", "grpc"),
    Mode("grpc tls", "grpc", tls=True),
)


@dataclass
class Measurement:
    throughput: float | None = None  # inferences per second
    p50_us: float | None = None
    p99_us: float | None = None
    error: str | None = None
    # False when perf_analyzer found no three windows within 10% of each other: then the figures are the
    # mean of its last three windows, and p99 is unknown.
    stable: bool = True
    # The share of all CPUs that other processes used while this was measured (None where unknown).
    others_cpu: float | None = None
    seconds: float | None = None  # how long the measurement took
    # Inferences per model execution on the server during the measurement, from its statistics (--batching).
    batch: float | None = None

    @property
    def disturbed(self) -> bool:
        return self.others_cpu is not None and self.others_cpu > BUSY_WARNING


@dataclass
class Row:
    model: str
    concurrency: int
    protocol: str
    in_process: Measurement = field(default_factory=Measurement)
    edged: Measurement = field(default_factory=Measurement)
    triton: Measurement = field(default_factory=Measurement)


@dataclass
class SharedMemory:
    """Whether perf_analyzer can run with --shared-memory system on this machine; why not when it cannot."""

    unavailable: str | None = None


def say(message: str) -> None:
    print(f"bench: {message}", flush=True)


# --------------------------------------------------------------------------------------------------------
# CPU used by other processes


def _process_ticks(stat: str) -> tuple[int, int]:
    """The session id and the CPU ticks (its own and those of children it waited for) of one /proc/PID/stat."""
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[3]), sum(int(value) for value in fields[11:15])  # session; utime stime cutime cstime


class CpuMeter:
    """The share of all CPUs used by other processes between ``start`` and ``stop``.

    "Ours" is this process with the children it has waited for (perf_analyzer among them) and every process in
    the session of the server under test (Triton's Python-backend stubs included). Interrupt and softirq time
    counts as busy: the kernel also charges it to the process it interrupted (loopback traffic, mostly).
    """

    def __init__(self, server_session: int | None = None) -> None:
        self.server_session = server_session
        self.begin: tuple[int, int, int] | None = None

    def _sample(self) -> tuple[int, int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
        busy = values[0] + values[1] + values[2] + values[5] + values[6]  # user nice system irq softirq
        ours = _process_ticks(Path("/proc/self/stat").read_text())[1]
        if self.server_session is not None:
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    with contextlib.suppress(OSError, ValueError, IndexError):  # processes come and go
                        session, ticks = _process_ticks(Path(entry.path, "stat").read_text())
                        if session == self.server_session:
                            ours += ticks
        return total, busy, ours

    def start(self) -> None:
        try:
            self.begin = self._sample()
        except (OSError, ValueError, IndexError):
            self.begin = None

    def stop(self) -> float | None:
        if self.begin is None:
            return None
        try:
            total, busy, ours = self._sample()
        except (OSError, ValueError, IndexError):
            return None
        total0, busy0, ours0 = self.begin
        others = (busy - busy0) - (ours - ours0)
        return round(max(0.0, others / max(1, total - total0)), 3)


def others_busy(seconds: float = 1.0) -> float:
    """The share of all CPUs that other processes use over the next ``seconds`` (0.0 where unknown)."""
    meter = CpuMeter()
    meter.start()
    time.sleep(seconds)
    return meter.stop() or 0.0


def wait_for_quiet(limit_s: float) -> float:
    """Waits up to ``limit_s`` for other processes to leave the CPU; returns the share they used last."""
    deadline = time.monotonic() + limit_s
    share = others_busy()
    while share > BUSY_WARNING and time.monotonic() < deadline:
        share = others_busy()
    return share


def check_idle(phase: str) -> float:
    """Every measurement assumes the machine is otherwise idle: waits a while for that, and says when it is not."""
    share = others_busy()
    if share > BUSY_WARNING:
        say(f"{share:.0%} of the CPU is busy with other processes; waiting up to {QUIET_WAIT_S:.0f} s for it to quiet")
        share = wait_for_quiet(QUIET_WAIT_S)
        if share > BUSY_WARNING:
            say(f"warning: {share:.0%} of the CPU is busy with other processes before the {phase} measurements")
    return share


def metered(measure: Callable[[], Measurement], server_session: int | None) -> Measurement:
    """Runs one measurement and records how long it took and how much CPU other processes used meanwhile."""
    meter = CpuMeter(server_session)
    meter.start()
    began = time.monotonic()
    result = measure()
    result.seconds = round(time.monotonic() - began, 1)
    result.others_cpu = meter.stop()
    return result


class Retries:
    """Takes a measurement that other processes disturbed again, once, after the CPU has quieted down.

    A time budget for the whole run keeps a machine that is busy throughout from doubling the run; the result
    kept is the less disturbed of the two.
    """

    def __init__(self, budget_s: float) -> None:
        self.left_s = budget_s

    def measure(self, where: str, measure: Callable[[], Measurement], server_session: int | None) -> Measurement:
        first = metered(measure, server_session)
        if not first.disturbed or first.error or self.left_s <= 0:
            return first
        began = time.monotonic()
        say(f"{where}: other processes used {first.others_cpu:.0%} of the CPU meanwhile; measuring it again")
        wait_for_quiet(min(30.0, self.left_s))
        second = metered(measure, server_session)
        self.left_s -= time.monotonic() - began
        if second.error or (second.others_cpu or 0.0) > (first.others_cpu or 0.0):
            return first
        return second


# --------------------------------------------------------------------------------------------------------
# model repositories


def generate_models(models: Sequence[BenchModel]) -> None:
    """Generates the models once into bench-models/models/."""
    MODEL_STORE.mkdir(parents=True, exist_ok=True)
    for model in models:
        if model.name == "add_sub":  # cheap and deterministic: always rewritten
            modelgen.write_add_sub(MODEL_STORE / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
        elif not (MODEL_STORE / model.name / "1" / modelgen.MODEL_FILENAME).is_file():
            say(f"generating {model.name} (once; about 100 MB)")
            # Written beside the store and renamed in, so an interrupted run never leaves half a model.
            with tempfile.TemporaryDirectory(dir=BENCH_DIR) as tmp:
                staged = Path(tmp) / model.name
                modelgen.write_resnet50(staged, max_batch_size=16)
                shutil.rmtree(MODEL_STORE / model.name, ignore_errors=True)
                staged.rename(MODEL_STORE / model.name)


def prepare_models(models: Sequence[BenchModel]) -> None:
    """Generates the models once into bench-models/models/ and links this run's ones into edged's repository."""
    generate_models(models)
    # edged serves only this run's models, so a quick run does not wait for resnet50 to load.
    shutil.rmtree(EDGED_REPO, ignore_errors=True)
    EDGED_REPO.mkdir()
    for model in models:
        (EDGED_REPO / model.name).symlink_to(Path("..") / MODEL_STORE.name / model.name)


def prepare_triton_models(models: Sequence[BenchModel]) -> None:
    shutil.rmtree(TRITON_REPO, ignore_errors=True)
    for model in models:
        source = MODEL_STORE / model.name
        target = TRITON_REPO / model.name
        (target / "1").mkdir(parents=True)
        config = _python_backend(source, (source / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8"))
        config += _instance_group(1)
        (target / modelgen.CONFIG_FILENAME).write_text(config, encoding="utf-8")
        (target / "1" / "model.py").write_text(TRITON_MODEL_PY, encoding="utf-8")
        _link_model_file(source, target)


def _python_backend(source: Path, config: str) -> str:
    """An onnxruntime model's config.pbtxt turned into one for the Python-backend wrapper (TRITON_MODEL_PY)."""
    config, count = re.subn(r'(?m)^platform: "onnxruntime_onnx"$', 'backend: "python"', config)
    if count != 1:
        raise RuntimeError(f"unexpected config.pbtxt layout in {source}")
    return config


def _instance_group(count: int) -> str:
    return f"instance_group [\n  {{\n    count: {count}\n    kind: KIND_CPU\n  }}\n]\n"


def _link_model_file(source: Path, target: Path) -> None:
    """Links the generated model.onnx into version 1 of a model folder of a server's repository."""
    (target / "1" / modelgen.MODEL_FILENAME).symlink_to(
        os.path.relpath(source / "1" / modelgen.MODEL_FILENAME, target / "1")
    )


# --------------------------------------------------------------------------------------------------------
# in-process onnxruntime


def _percentile_us(latencies_s: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies_s), q) * 1e6)


def measure_in_process(
    session: ort.InferenceSession, feeds: dict[str, Array], concurrency: int, seconds: float
) -> Measurement:
    """``concurrency`` threads, each running one request after another on the shared session."""
    start = threading.Barrier(concurrency + 1)
    deadline = 0.0

    def worker() -> list[float]:
        latencies: list[float] = []
        start.wait()
        now = time.perf_counter()
        while now < deadline:
            session.run(None, feeds)
            done = time.perf_counter()
            latencies.append(done - now)
            now = done
        return latencies

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(worker) for _ in range(concurrency)]
        began = time.perf_counter()
        deadline = began + seconds
        start.wait()
        latencies = [lat for future in futures for lat in future.result()]
        elapsed = time.perf_counter() - began
    return Measurement(len(latencies) / elapsed, _percentile_us(latencies, 50), _percentile_us(latencies, 99))


def edged_session_options() -> ort.SessionOptions:
    """What edged's onnxruntime backend sets for a model whose config has no parameters."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options


def run_in_process(models: Sequence[BenchModel], retries: Retries) -> dict[tuple[str, int], Measurement]:
    results: dict[tuple[str, int], Measurement] = {}
    for model in models:
        path = MODEL_STORE / model.name / "1" / modelgen.MODEL_FILENAME
        # The session options and provider edged gives a model without parameters: the ceiling edged can reach.
        session = ort.InferenceSession(str(path), edged_session_options(), providers=["CPUExecutionProvider"])
        feeds = model.make_inputs()
        for _ in range(3):  # first runs allocate the arena and pick kernels
            session.run(None, feeds)
        for concurrency in CONCURRENCIES:
            measure = functools.partial(measure_in_process, session, feeds, concurrency, model.in_process_s)
            result = retries.measure(f"in-process {model.name} c={concurrency}", measure, None)
            results[model.name, concurrency] = result
            say(f"in-process {model.name} c={concurrency}: {_fmt_rate(result.throughput)} infer/s{_busy_note(result)}")
    return results


# --------------------------------------------------------------------------------------------------------
# servers


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    def of(self, mode: Mode) -> int:
        return self.grpc if mode.protocol == "grpc" else self.http


def free_ports() -> Ports:
    sockets = []
    try:
        for _ in range(3):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        http, grpc, metrics = (s.getsockname()[1] for s in sockets)
        return Ports(http, grpc, metrics)
    finally:
        for s in sockets:
            s.close()


def _ready(port: int, tls: ssl.SSLContext | None = None) -> bool:
    scheme = "https" if tls is not None else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/v2/health/ready", timeout=2, context=tls) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running_server(name: str, command: list[str], http_port: int, tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """Starts a server, waits until it reports ready (over TLS with ``tls``, a client context), and stops it
    (SIGTERM, then SIGKILL) afterwards.

    Yields the id of the session the server runs in (its own process id).
    """
    log_path = BENCH_DIR / f"{name}.log"
    say(f"starting {name} (log: {log_path.relative_to(ROOT)})")
    with log_path.open("wb") as log:
        # A session of its own, so that stopping it also reaches the processes it starts (Triton's stubs).
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        began = time.monotonic()
        while not _ready(http_port, tls):
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with status {process.returncode} before it was ready; see {log_path}"
                )
            if time.monotonic() - began > SERVER_START_TIMEOUT_S:
                raise RuntimeError(f"{name} was not ready after {SERVER_START_TIMEOUT_S:.0f} s; see {log_path}")
            time.sleep(0.25)
        say(f"{name} ready after {time.monotonic() - began:.1f} s")
        yield process.pid
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # what systemctl stop sends: a graceful shutdown
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    # Whatever is left of the session it started (the server itself, or children it left behind) is ended.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# --------------------------------------------------------------------------------------------------------
# the CUDA runtime perf_analyzer loads for shared memory


def _cuda_runtime_package(names: Sequence[str]) -> str:
    """The wheel with the CUDA runtime under these names: the major version's, or CUDA 12's for libcudart.so."""
    majors = {int(name.split(".")[2]) for name in names if name.count(".") >= 2}
    major = max(majors) if majors else 12
    return f"nvidia-cuda-runtime-cu{major}" if major <= 12 else f"nvidia-cuda-runtime=={major}.*"


def _loadable_in_root(name: str) -> bool:
    """Whether the dynamic loader cache inside perf_analyzer's root has a library called ``name``."""
    done = subprocess.run(["chroot", str(PA_ROOT), "ldconfig", "-p"], capture_output=True, text=True, check=False)
    return done.returncode == 0 and any(line.strip().startswith(f"{name} (") for line in done.stdout.splitlines())


def ensure_cuda_runtime() -> str | None:
    """Makes the CUDA runtime loadable inside perf_analyzer's root; returns why that failed, or None.

    perf_analyzer 2.60 dlopens libcudart as soon as a run uses shared memory, system shared memory included, and
    aborts with "Cannot open CUDA runtime library" without it. It calls into it only for CUDA shared memory, and
    loading the library needs neither a GPU nor a driver, so the runtime from NVIDIA's wheel on PyPI is enough.
    It goes into the root's /usr/local/lib and the root's loader cache: the root is a cache this machine builds
    for ../shared/tools/perf-analyzer; ../shared itself is never changed.
    """
    binary = PA_ROOT / PA_BINARY
    try:
        names = sorted({match.decode() for match in CUDART_NAME.findall(binary.read_bytes())})
    except OSError as exc:
        return f"cannot read {binary}: {exc.strerror}"
    if not names:
        return None  # this perf_analyzer does not load the CUDA runtime
    if os.geteuid() != 0:
        return f"perf_analyzer loads {', '.join(names)}, and putting it into {PA_ROOT} needs root"
    missing = [name for name in names if not _loadable_in_root(name)]
    if not missing:
        say(f"shared memory: {', '.join(names)} (loaded by perf_analyzer) is already in {PA_ROOT}")
        return None
    package = _cuda_runtime_package(names)
    target = PA_ROOT / PA_LIBRARY_DIR
    say(
        f"shared memory: perf_analyzer dlopens {', '.join(missing)} even for --shared-memory system and stops "
        f"without it; installing the CUDA runtime from the {package} wheel (PyPI) into {target} and running "
        "ldconfig in that root (perf_analyzer's root only; loading the library needs no GPU)"
    )
    with tempfile.TemporaryDirectory(prefix="edged-bench-cudart-") as tmp:
        download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp]
        try:
            done = subprocess.run([*download, package], capture_output=True, text=True, check=False, timeout=600)
        except subprocess.TimeoutExpired:
            return f"downloading {package} took more than 10 minutes"
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
            return f"could not download {package}: {lines[-1] if lines else f'pip exited {done.returncode}'}"
        installed: list[str] = []
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.namelist():
                library = re.fullmatch(r"(?:.*/)?lib/(libcudart\.so\.[0-9.]+)", member)
                if not library:
                    continue
                target.mkdir(parents=True, exist_ok=True)
                staged = target / f".{library[1]}.tmp"
                staged.write_bytes(wheel.read(member))
                staged.chmod(0o755)
                staged.replace(target / library[1])
                installed.append(library[1])
    if not installed:
        return f"{wheels[0].name} has no libcudart.so.*"
    # ldconfig links the versioned names; a name without a version (libcudart.so) needs a link of its own.
    for name in missing:
        if name not in installed and not (target / name).exists():
            (target / name).unlink(missing_ok=True)  # a dangling link
            (target / name).symlink_to(installed[0])
    done = subprocess.run(["chroot", str(PA_ROOT), "ldconfig"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"ldconfig in {PA_ROOT} failed: {(done.stdout + done.stderr).strip()}"
    still = [name for name in missing if not _loadable_in_root(name)]
    if still:
        return f"{', '.join(still)} is still not in the loader cache of {PA_ROOT} after ldconfig"
    say(f"shared memory: {', '.join(installed)} installed into {target}")
    return None


# --------------------------------------------------------------------------------------------------------
# load generators


class LoadGenerator:
    description = ""
    # The CA that signed the server's certificate, for the modes over TLS (run_tls).
    tls_ca: Path | None = None

    def supports(self, mode: Mode) -> bool:
        raise NotImplementedError

    def measure(self, model: BenchModel, mode: Mode, ports: Ports, concurrency: int, label: str) -> Measurement:
        raise NotImplementedError


class PerfAnalyzer(LoadGenerator):
    """Triton's perf_analyzer with binary tensors (its default), one concurrency per run."""

    description = "perf_analyzer 2.60, binary tensors, batch 1"

    def __init__(self, tool: Path) -> None:
        self.tool = tool

    def ensure(self) -> None:
        subprocess.run([str(self.tool), "--ensure"], check=True, stdout=subprocess.DEVNULL)

    def supports(self, mode: Mode) -> bool:
        return True

    def measure(self, model: BenchModel, mode: Mode, ports: Ports, concurrency: int, label: str) -> Measurement:
        slug = mode.name.replace(" ", "-")
        csv_name = f"/tmp/edged-bench-{os.getpid()}-{label}-{model.name}-{slug}-{concurrency}.csv"
        csv_host = PA_ROOT / csv_name.lstrip("/")
        csv_host.unlink(missing_ok=True)
        command = [
            str(self.tool),
            "-m", model.name,
            "-u", f"127.0.0.1:{ports.of(mode)}",
            "-i", mode.protocol,
            "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-interval", str(model.window_ms),
            # Stable means three windows within 10% (its default) in throughput and p50 latency.
            "--percentile", "50",
            "--max-trials", "6",
            "-v",  # prints every window, used when no three agree
            "-f", csv_name,
        ]  # fmt: skip
        if mode.streaming:
            command.append("--streaming")
        if mode.tls:
            command += self._tls_options(mode)
            if mode.protocol == "http":
                # Over HTTP the scheme in the URL is what turns TLS on.
                command[command.index("-u") + 1] = f"https://127.0.0.1:{ports.http}"
        if mode.shared_memory:
            command += ["--shared-memory", "system", "--output-shared-memory-size", str(model.output_bytes)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        try:
            if done.returncode == 0 and csv_host.is_file():
                with csv_host.open(newline="") as f:
                    record = next(csv.DictReader(f))
                return Measurement(
                    throughput=float(record["Inferences/Second"]),
                    p50_us=float(record["p50 latency"]),
                    p99_us=float(record["p99 latency"]),
                )
        finally:
            csv_host.unlink(missing_ok=True)
        output = done.stdout + done.stderr
        windows = [(float(rate), float(p50)) for rate, p50 in PASS_LINE.findall(output)]
        if "stable measurement" in output and len(windows) >= 3:
            # Two cores shared by client and server, and few requests per window for a slow model, can keep
            # windows more than 10% apart; their mean is still a fair figure, and it is marked as such.
            last = windows[-3:]
            return Measurement(
                throughput=sum(rate for rate, _ in last) / 3, p50_us=sum(p50 for _, p50 in last) / 3, stable=False
            )
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        return Measurement(error=f"perf_analyzer exited {done.returncode}: {' | '.join(lines[-2:])}")

    def _tls_options(self, mode: Mode) -> list[str]:
        # Files are read inside perf_analyzer's root: the CA goes to its /tmp.
        assert self.tls_ca is not None
        inside = f"/tmp/edged-bench-{os.getpid()}-ca.pem"
        (PA_ROOT / inside.lstrip("/")).write_bytes(self.tls_ca.read_bytes())
        if mode.protocol == "grpc":
            return ["--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", inside]
        return [
            "--ssl-https-verify-peer", "1",
            "--ssl-https-verify-host", "2",
            "--ssl-https-ca-certificates-file", inside,
        ]  # fmt: skip


class PythonClient(LoadGenerator):
    """A closed loop of tritonclient.http clients, one per thread: used when perf_analyzer is not there.

    The client runs in this Python process, so at high rates it, not the server, may be the bottleneck.
    """

    description = "tritonclient.http threads (perf_analyzer not found), binary tensors, batch 1"

    def supports(self, mode: Mode) -> bool:
        return mode.protocol == "http" and not mode.streaming and not mode.shared_memory

    def measure(self, model: BenchModel, mode: Mode, ports: Ports, concurrency: int, label: str) -> Measurement:
        import tritonclient.http as httpclient

        feeds = model.make_inputs()
        start = threading.Barrier(concurrency + 1)
        deadline = 0.0

        def worker() -> list[float]:
            if mode.tls:
                assert self.tls_ca is not None
                client = httpclient.InferenceServerClient(
                    f"127.0.0.1:{ports.http}", ssl=True, ssl_options={"ca_certs": str(self.tls_ca)}
                )
            else:
                client = httpclient.InferenceServerClient(f"127.0.0.1:{ports.http}")
            inputs = []
            for name, array in feeds.items():
                tensor = httpclient.InferInput(name, list(array.shape), "FP32")
                tensor.set_data_from_numpy(array, binary_data=True)
                inputs.append(tensor)
            client.infer(model.name, inputs)  # connect and warm up outside the measurement
            latencies: list[float] = []
            start.wait()
            now = time.perf_counter()
            while now < deadline:
                client.infer(model.name, inputs)
                done = time.perf_counter()
                latencies.append(done - now)
                now = done
            client.close()
            return latencies

        try:
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                futures = [pool.submit(worker) for _ in range(concurrency)]
                began = time.perf_counter()
                deadline = began + model.in_process_s + 1.0
                start.wait(timeout=60)
                latencies = [lat for future in futures for lat in future.result()]
                elapsed = time.perf_counter() - began
        except Exception as exc:  # any client failure becomes this cell's error
            return Measurement(error=f"{type(exc).__name__}: {exc}")
        return Measurement(len(latencies) / elapsed, _percentile_us(latencies, 50), _percentile_us(latencies, 99))


def measure_server(
    label: str,
    command: list[str],
    ports: Ports,
    models: Sequence[BenchModel],
    modes: Sequence[Mode],
    load: LoadGenerator,
    rows: dict[tuple[str, str, int], Row],
    shm: SharedMemory,
    retries: Retries,
    concurrencies: Sequence[int] = CONCURRENCIES,
    count_batches: bool = False,
    tls: ssl.SSLContext | None = None,
    name: str | None = None,
) -> None:
    """Measures each model, mode and concurrency on one server; ``count_batches`` also records the mean batch
    the server executed, from its statistics. ``tls``: the server serves HTTP over TLS, and this client context
    trusts it; ``name``: the server's, for its log and messages (the label by default)."""
    try:
        with running_server(name or label, command, ports.http, tls) as session:
            for model in models:
                for mode in modes:
                    for concurrency in concurrencies:
                        if mode.shared_memory and shm.unavailable:
                            continue
                        where = f"{name or label} {model.name} {mode.name} c={concurrency}"
                        measure = functools.partial(load.measure, model, mode, ports, concurrency, label)
                        if count_batches:
                            measure = functools.partial(_batches_counted, measure, ports.http, model.name)
                        result = retries.measure(where, measure, session)
                        if mode.shared_memory and result.error and CUDA_RUNTIME_FAILURE.search(result.error):
                            shm.unavailable = f"perf_analyzer cannot run with --shared-memory system: {result.error}"
                            say(f"{where}: {shm.unavailable}; leaving the shared-memory rows out")
                            continue
                        setattr(rows[model.name, mode.name, concurrency], label, result)
                        if result.error:
                            say(f"{where}: FAILED: {result.error}")
                        else:
                            p99 = "unknown" if result.p99_us is None else f"{_fmt_us(result.p99_us)} us"
                            unstable = "" if result.stable else " (unstable: mean of the last 3 windows)"
                            batch = "" if result.batch is None else f", mean batch {result.batch:.2f}"
                            say(
                                f"{where}: {_fmt_rate(result.throughput)} infer/s, p50 {_fmt_us(result.p50_us)} us, "
                                f"p99 {p99}{batch}{unstable} [{result.seconds:.0f} s]{_busy_note(result)}"
                            )
    except RuntimeError as exc:
        say(f"{name or label}: FAILED: {exc}")
        names = {mode.name for mode in modes}
        for row in rows.values():
            if row.protocol in names:
                setattr(row, label, Measurement(error=str(exc)))


def _execution_counts(http_port: int, model: str) -> tuple[int, int] | None:
    """The model's inference and execution counts from the statistics extension (Triton's and edged's alike)."""
    try:
        url = f"http://127.0.0.1:{http_port}/v2/models/{model}/stats"
        with urllib.request.urlopen(url, timeout=5) as reply:
            stats = json.load(reply)["model_stats"]
        return sum(s["inference_count"] for s in stats), sum(s["execution_count"] for s in stats)
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return None


def _batches_counted(measure: Callable[[], Measurement], http_port: int, model: str) -> Measurement:
    """Runs ``measure`` and adds the mean batch the server executed meanwhile (perf_analyzer's warm-up included)."""
    before = _execution_counts(http_port, model)
    result = measure()
    after = _execution_counts(http_port, model)
    if before and after and after[1] > before[1]:
        result.batch = round((after[0] - before[0]) / (after[1] - before[1]), 2)
    return result


# --------------------------------------------------------------------------------------------------------
# report


def _busy_note(result: Measurement) -> str:
    if not result.disturbed:
        return ""
    return f" (disturbed: other processes used {result.others_cpu:.0%} of the CPU meanwhile)"


def _fmt_rate(value: float | None, stable: bool = True) -> str:
    if value is None:
        return "-"
    text = f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"
    return text if stable else f"~{text}"


def _fmt_us(value: float | None, stable: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if stable else f"~{value:,.0f}"


def _fmt_ratio(a: Measurement, b: Measurement) -> str:
    if a.throughput is None or not b.throughput:
        return "-"
    ratio = f"{a.throughput / b.throughput:.2f}"
    return ratio if a.stable and b.stable else f"~{ratio}"


def _fmt_measured(m: Measurement) -> str:
    """Throughput, with ~ when perf_analyzer found no stable windows and ! when other processes disturbed it."""
    text = _fmt_rate(m.throughput, m.stable)
    return f"{text}!" if m.disturbed and m.throughput is not None else text


TABLE_HEADER: Final = (
    "model",
    "conc",
    "protocol",
    "in-process infer/s",
    "edged infer/s",
    "edged/in-process",
    "edged p50 us",
    "Triton infer/s",
    "edged/Triton",
    "Triton p50 us",
)
TEXT_COLUMNS: Final = 3  # left-aligned; the others hold figures


def table(rows: Sequence[Row]) -> str:
    body: list[tuple[str, ...]] = [
        (
            row.model,
            str(row.concurrency),
            row.protocol,
            _fmt_measured(row.in_process),
            _fmt_measured(row.edged),
            _fmt_ratio(row.edged, row.in_process),
            _fmt_us(row.edged.p50_us, row.edged.stable),
            _fmt_measured(row.triton),
            _fmt_ratio(row.edged, row.triton),
            _fmt_us(row.triton.p50_us, row.triton.stable),
        )
        for row in rows
    ]
    return _markdown(TABLE_HEADER, body, TEXT_COLUMNS)


def _markdown(header: Sequence[str], body: Sequence[Sequence[str]], text_columns: int) -> str:
    """Names (the first ``text_columns``) left-aligned, figures right-aligned: also valid Markdown."""
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i < text_columns else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|" + "|".join("-" * (w + 2) if i < text_columns else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    )
    return "\n".join([line(header), rule, *(line(cells) for cells in body)])


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                return text.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _edged_revision() -> str | None:
    """The commit edged runs from, and whether its package has changes not committed yet."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # only reads: never refreshes git's index

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False)

    with contextlib.suppress(OSError):
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode == 0:
            dirty = git("diff", "--quiet", "HEAD", "--", "edged").returncode != 0
            untracked = bool(git("ls-files", "--others", "--exclude-standard", "--", "edged").stdout.strip())
            changed = " with uncommitted changes under edged/" if dirty or untracked else ""
            return f"commit {head.stdout.strip()}{changed}"
    return None


def _triton_ort_version() -> str | None:
    venv = Path(os.environ.get("TRITON_REF_VENV", "/var/tmp/triton-reference-venv"))
    python = venv / "bin" / "python"
    if not python.is_file():
        return None
    done = subprocess.run(
        [str(python), "-c", "import onnxruntime; print(onnxruntime.__version__)"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or None


# --------------------------------------------------------------------------------------------------------
# dynamic batching (--batching)

# The in-process ceiling: one session running batches of these sizes back to back; 16 is max_batch_size.
BATCH_SIZES: Final = (1, 2, 4, 8, 16)
BATCHING_CONCURRENCIES: Final = (1, 4, 8, 16)
BATCHING_QUICK_CONCURRENCIES: Final = (1, 8)
# How long a batch waits for more requests after its oldest one arrived. It matters only when an instance is idle:
# while every instance runs, the next batch gathers in the queue anyway. 2 ms lets the requests of clients that
# were answered together (one batch) arrive and be parsed, yet costs a lone request (concurrency 1, about 40 ms a
# run on 2 cores) only 5%. No preferred_batch_size: onnxruntime on this CPU gains little from any one batch size,
# so a batch goes when the delay has passed or it is full.
BATCHING_QUEUE_DELAY_US: Final = 2000


@dataclass(frozen=True)
class Variant:
    """One way to serve the ResNet-50-shaped model: a model of its own in each server's repository."""

    name: str
    dynamic_batching: bool
    instances: int

    @property
    def label(self) -> str:
        batching = "dynamic batching" if self.dynamic_batching else "no batching"
        return f"{batching}, {self.instances} instance{'s' if self.instances > 1 else ''}"

    def config(self, base: str, source: Path) -> str:
        """``base`` (the generated config.pbtxt) renamed, with this variant's instances and batching."""
        config, count = re.subn(r'(?m)^name: "[^"]*"$', f'name: "{self.name}"', base)
        if count != 1:
            raise RuntimeError(f"unexpected config.pbtxt layout in {source}")
        config += _instance_group(self.instances)
        if self.dynamic_batching:
            config += f"dynamic_batching {{\n  max_queue_delay_microseconds: {BATCHING_QUEUE_DELAY_US}\n}}\n"
        return config


VARIANTS: Final = (
    Variant("resnet50_1", dynamic_batching=False, instances=1),
    Variant("resnet50_2", dynamic_batching=False, instances=2),
    Variant("resnet50_batching_1", dynamic_batching=True, instances=1),
    Variant("resnet50_batching_2", dynamic_batching=True, instances=2),
)


def batching_model(quick: bool) -> BenchModel:
    # Windows of 3 s hold 5 or more batches of 16 (about 0.6 s each on 2 cores), enough for a steady rate.
    return BenchModel("resnet50", 3.0 if quick else 8.0, 1500 if quick else 3000, 1000 * 4, _resnet50_inputs)


def prepare_batching_models(model: BenchModel) -> list[BenchModel]:
    """Writes one model per variant, all over the same model.onnx, into edged's and Triton's repositories."""
    generate_models([model])
    source = MODEL_STORE / model.name
    base = (source / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8")
    for repo in (EDGED_REPO, TRITON_REPO):
        shutil.rmtree(repo, ignore_errors=True)
        for variant in VARIANTS:
            target = repo / variant.name
            (target / "1").mkdir(parents=True)
            config = variant.config(base, source)
            if repo == TRITON_REPO:
                config = _python_backend(source, config)
                (target / "1" / "model.py").write_text(TRITON_MODEL_PY, encoding="utf-8")
            (target / modelgen.CONFIG_FILENAME).write_text(config, encoding="utf-8")
            _link_model_file(source, target)
    return [
        BenchModel(v.name, model.in_process_s, model.window_ms, model.output_bytes, model.make_inputs) for v in VARIANTS
    ]


def run_in_process_batches(model: BenchModel, retries: Retries) -> dict[int, Measurement]:
    """One thread running batches of each size back to back on one session; throughput in images per second."""
    path = MODEL_STORE / model.name / "1" / modelgen.MODEL_FILENAME
    session = ort.InferenceSession(str(path), edged_session_options(), providers=["CPUExecutionProvider"])
    image = model.make_inputs()
    results: dict[int, Measurement] = {}
    for size in BATCH_SIZES:
        feeds = {name: np.repeat(array, size, axis=0) for name, array in image.items()}
        for _ in range(2):  # first runs of a new shape allocate the arena
            session.run(None, feeds)
        measure = functools.partial(measure_in_process, session, feeds, 1, model.in_process_s)
        result = retries.measure(f"in-process {model.name} batch {size}", measure, None)
        if result.throughput is not None:
            result.throughput *= size
        result.batch = size
        results[size] = result
        say(
            f"in-process {model.name} batch {size}: {_fmt_rate(result.throughput)} images/s, "
            f"p50 {_fmt_us(result.p50_us)} us a batch{_busy_note(result)}"
        )
    return results


BATCHING_HEADER: Final = (
    "variant",
    "conc",
    "protocol",
    "edged infer/s",
    "edged/in-process best",
    "edged p50 us",
    "edged batch",
    "Triton infer/s",
    "Triton/in-process best",
    "Triton p50 us",
    "Triton batch",
)


def batching_table(rows: Sequence[Row]) -> str:
    labels = {variant.name: variant.label for variant in VARIANTS}

    def batch(m: Measurement) -> str:
        return "-" if m.batch is None else f"{m.batch:.1f}"

    body = [
        (
            labels.get(row.model, row.model),
            str(row.concurrency),
            row.protocol,
            _fmt_measured(row.edged),
            _fmt_ratio(row.edged, row.in_process),
            _fmt_us(row.edged.p50_us, row.edged.stable),
            batch(row.edged),
            _fmt_measured(row.triton),
            _fmt_ratio(row.triton, row.in_process),
            _fmt_us(row.triton.p50_us, row.triton.stable),
            batch(row.triton),
        )
        for row in rows
    ]
    return _markdown(BATCHING_HEADER, body, TEXT_COLUMNS)


def in_process_table(results: dict[int, Measurement]) -> str:
    body = [(str(size), _fmt_measured(m), _fmt_us(m.p50_us)) for size, m in sorted(results.items())]
    return _markdown(("batch", "in-process images/s", "p50 us a batch"), body, 0)


# --------------------------------------------------------------------------------------------------------
# the Python backend (--python)

# The repository's Python add_sub model (Triton's add_sub example as model.py), copied unchanged into both servers'
# repositories: what edged's stub hop costs against the ONNX add_sub, and against Triton's own Python backend.
PYTHON_MODEL_SOURCE: Final = ROOT / "tests" / "testdata" / "python_models" / "add_sub_python"
PYTHON_MODEL: Final = PYTHON_MODEL_SOURCE.name
ONNX_MODEL: Final = "add_sub"


def python_models(quick: bool) -> list[BenchModel]:
    """add_sub_python and the ONNX add_sub: the same contract (FP32 [16] in and out, max_batch_size 8)."""
    add_sub_bytes = 16 * 4  # OUTPUT0 and OUTPUT1: FP32 [16]
    seconds, window_ms = (2.0, 1000) if quick else (5.0, 3000)
    return [BenchModel(name, seconds, window_ms, add_sub_bytes, _add_sub_inputs) for name in (PYTHON_MODEL, ONNX_MODEL)]


def prepare_python_models(onnx: BenchModel) -> int:
    """Copies add_sub_python into edged's and Triton's repositories and writes the ONNX add_sub into edged's, with
    as many instances as add_sub_python's config gives; returns that count."""
    config = (PYTHON_MODEL_SOURCE / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8")
    counts = re.findall(r"\bcount:\s*(\d+)", config)
    if len(counts) != 1:
        raise RuntimeError(f"expected one instance_group count in {PYTHON_MODEL_SOURCE / modelgen.CONFIG_FILENAME}")
    instances = int(counts[0])
    generate_models([onnx])
    for repo in (EDGED_REPO, TRITON_REPO):
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(PYTHON_MODEL_SOURCE, repo / PYTHON_MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    source = MODEL_STORE / onnx.name
    target = EDGED_REPO / onnx.name
    (target / "1").mkdir(parents=True)
    onnx_config = (source / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8") + _instance_group(instances)
    (target / modelgen.CONFIG_FILENAME).write_text(onnx_config, encoding="utf-8")
    _link_model_file(source, target)
    return instances


PYTHON_HEADER: Final = (
    "conc",
    "protocol",
    "edged Python infer/s",
    "edged Python p50 us",
    "Triton Python infer/s",
    "Triton Python p50 us",
    "edged ONNX infer/s",
    "edged ONNX p50 us",
    "edged Python/Triton Python",
    "edged Python/edged ONNX",
    "stub hop p50 us",
)
PYTHON_TEXT_COLUMNS: Final = 2


def _p50_difference(a: Measurement, b: Measurement) -> str:
    """How much longer ``a``'s median request takes than ``b``'s."""
    if a.p50_us is None or b.p50_us is None:
        return "-"
    difference = f"{a.p50_us - b.p50_us:+,.0f}"
    return difference if a.stable and b.stable else f"~{difference}"


def python_table(rows: Sequence[tuple[Row, Row]]) -> str:
    """One line per concurrency and protocol from pairs of rows: add_sub_python (edged and Triton), ONNX add_sub."""
    body = [
        (
            str(python.concurrency),
            python.protocol,
            _fmt_measured(python.edged),
            _fmt_us(python.edged.p50_us, python.edged.stable),
            _fmt_measured(python.triton),
            _fmt_us(python.triton.p50_us, python.triton.stable),
            _fmt_measured(onnx.edged),
            _fmt_us(onnx.edged.p50_us, onnx.edged.stable),
            _fmt_ratio(python.edged, python.triton),
            _fmt_ratio(python.edged, onnx.edged),
            _p50_difference(python.edged, onnx.edged),
        )
        for python, onnx in rows
    ]
    return _markdown(PYTHON_HEADER, body, PYTHON_TEXT_COLUMNS)


def _run_info(argv: list[str] | None, machine: dict[str, Any], load: LoadGenerator) -> dict[str, Any]:
    """What every phase's results begin with: when, the command, the machine and the load generator."""
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["scripts/bench", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine,
        "load_generator": load.description,
    }


def save_results(key: str, value: dict[str, Any]) -> None:
    """Puts ``value`` under ``key`` in bench-results.json and keeps the file's other keys (other phases' results)."""
    results: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        existing = json.loads(RESULTS_FILE.read_text(encoding="utf-8"))
        if isinstance(existing, dict):
            results = existing
    results[key] = value
    staged = RESULTS_FILE.with_name(f".{RESULTS_FILE.name}.tmp")
    staged.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    staged.replace(RESULTS_FILE)


# --------------------------------------------------------------------------------------------------------
# main


def print_caveats(
    served: Sequence[Measurement],
    measured: Sequence[Measurement],
    busy: dict[str, float],
    labelled: Sequence[tuple[Row, str, Measurement]],
) -> bool:
    """What the figures of a table need said: unstable (``~``, among the servers' ``served``) and disturbed (``!``,
    among all ``measured``) figures, a busy machine before a phase, and the measurements that failed (True when
    any did)."""
    if any(not m.stable for m in served):
        print("~: perf_analyzer found no three windows within 10%; mean of its last three windows, p99 unknown")
    disturbed = [m for m in measured if m.disturbed]
    if disturbed:
        print(
            f"!: other processes used more than {BUSY_WARNING:.0%} of the CPU during that measurement "
            f"({len(disturbed)} of them); those figures are likely low: measure them again"
        )
    if any(share > BUSY_WARNING for share in busy.values()):
        print(
            "warning: other processes used the CPU before "
            + ", ".join(f"{phase} ({share:.0%})" for phase, share in busy.items() if share > BUSY_WARNING)
        )
    failures = [
        f"{row.model} {row.protocol} c={row.concurrency} {label}: {m.error}" for row, label, m in labelled if m.error
    ]
    for failure in failures:
        print(f"failed: {failure}")
    return bool(failures)


def _served(rows: Sequence[Row]) -> list[tuple[Row, str, Measurement]]:
    return [(row, label, m) for row in rows for label, m in (("edged", row.edged), ("triton", row.triton))]


def _protocols(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in PROTOCOLS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(PROTOCOLS)}, got {text!r}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short measurements (by default: add_sub only)")
    phase = parser.add_mutually_exclusive_group()
    phase.add_argument(
        "--batching",
        action="store_true",
        help="only the dynamic-batching comparison on resnet50 (HTTP unless --protocols says otherwise)",
    )
    phase.add_argument(
        "--tls",
        action="store_true",
        help="only the TLS comparison: add_sub on edged over TLS against plaintext (HTTP and gRPC unless "
        "--protocols says otherwise)",
    )
    phase.add_argument(
        "--python",
        action="store_true",
        help="only the Python-backend comparison: add_sub_python against the ONNX add_sub and Triton's Python "
        "backend (HTTP unless --protocols says otherwise)",
    )
    phase.add_argument(
        "--sync",
        action="store_true",
        help="only the repository-sync comparison: edged's sync against `aws s3 sync` on a moto S3 server "
        "(full download of a large and of a 1,000-file repository, then one changed file)",
    )
    phase.add_argument(
        "--console",
        action="store_true",
        help="only the web console's cost: idle memory with and without it, and the server time of each page",
    )
    phase.add_argument(
        "--footprint",
        action="store_true",
        help="only the footprint: idle memory by process and mapping, cold start, CLI start, a Python-backend "
        "instance's cost and the virtualenv's size by distribution",
    )
    parser.add_argument("--skip-triton", action="store_true", help="do not measure Triton")
    parser.add_argument(
        "--protocols",
        type=_protocols,
        default=None,
        metavar="http,grpc",
        help="the protocols to measure (default: both; --batching and --python: http); grpc includes streaming",
    )
    parser.add_argument("--skip-shm", action="store_true", help="do not measure with system shared memory")
    args = parser.parse_args(argv)
    # Stopped with SIGTERM (timeout, kill), it unwinds as for Ctrl-C, so the server it started is stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.sync:
        # No model, server or load generator: the sync phase brings its own S3 endpoint and client.
        BENCH_DIR.mkdir(exist_ok=True)
        from bench_sync import run_sync

        return run_sync(args.quick, argv, save_results)
    if args.console:
        BENCH_DIR.mkdir(exist_ok=True)
        from bench_console import run_console

        return run_console(args.quick, argv, save_results)
    if args.footprint:
        BENCH_DIR.mkdir(exist_ok=True)
        from bench_footprint import run_footprint

        return run_footprint(args.quick, argv, save_results)

    began = time.monotonic()
    models = bench_models(args.quick)
    if args.tls:
        modes = [m for m in TLS_MODES if m.protocol in (args.protocols or PROTOCOLS)]
    elif args.batching or args.python:
        # Unary calls without shared memory: these phases are about the server, not about how tensors travel.
        protocols = args.protocols or ("http",)
        modes = [m for m in MODES if m.protocol in protocols and not m.streaming and not m.shared_memory]
    else:
        protocols = args.protocols or PROTOCOLS
        modes = [m for m in MODES if m.protocol in protocols and not (args.skip_shm and m.shared_memory)]
    machine = {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "edged": _edged_revision(),
    }
    say(f"{machine['cpus']} CPUs ({machine['cpu_model']}), onnxruntime {ort.__version__}")

    BENCH_DIR.mkdir(exist_ok=True)
    if not (args.batching or args.python):
        models = [m for m in models if m.name == "add_sub"] if args.tls else models
        prepare_models(models)

    load: LoadGenerator
    shm = SharedMemory()
    if PERF_ANALYZER.is_file():
        analyzer = PerfAnalyzer(PERF_ANALYZER)
        analyzer.ensure()
        load = analyzer
        if any(m.shared_memory for m in modes):
            shm.unavailable = ensure_cuda_runtime()
            if shm.unavailable:
                say(f"shared memory: not measured: {shm.unavailable}")
    else:
        say(f"{PERF_ANALYZER} not found: falling back to a Python tritonclient.http load generator")
        load = PythonClient()
        left_out = [m.name for m in modes if not load.supports(m)]
        if left_out:
            say(f"without perf_analyzer, leaving out: {', '.join(left_out)}")
        modes = [m for m in modes if load.supports(m)]
    if not modes:
        say("nothing to measure with these options")
        return 2
    measured = [m.name for m in modes if not (m.shared_memory and shm.unavailable)]
    say(f"load generator: {load.description}; protocols: {', '.join(measured)}")
    if args.batching:
        return run_batching(args.quick, args.skip_triton, modes, load, machine, argv, began)
    if args.python:
        return run_python(args.quick, args.skip_triton, modes, load, machine, argv, began)
    if args.tls:
        return run_tls(args.quick, models, modes, load, machine, argv, began)
    rows = {(m.name, p.name, c): Row(m.name, c, p.name) for m in models for p in modes for c in CONCURRENCIES}

    retries = Retries(RETRY_BUDGET_S / 4 if args.quick else RETRY_BUDGET_S)
    busy: dict[str, float] = {}
    busy["in-process"] = check_idle("in-process")
    say("measuring in-process onnxruntime")
    in_process = run_in_process(models, retries)
    for row in rows.values():
        row.in_process = in_process[row.model, row.concurrency]

    ports = free_ports()
    edged = edged_command(ports)
    client_shm = any(m.shared_memory for m in modes) and not shm.unavailable
    if client_shm:
        edged.append("--allow-client-shm=true")  # off by default, as in Triton
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged, ports, models, modes, load, rows, shm, retries)

    triton_note = None
    if args.skip_triton:
        triton_note = "skipped (--skip-triton)"
    elif not TRITON_REFERENCE.is_file():
        triton_note = f"skipped ({TRITON_REFERENCE} not found)"
    else:
        prepare_triton_models(models)
        ports = free_ports()
        busy["triton"] = check_idle("triton")
        measure_server("triton", triton_command(ports), ports, models, modes, load, rows, shm, retries)
        triton_note = _triton_description() + ", instance_group count 1"

    shown = [m for m in modes if not (m.shared_memory and shm.unavailable)]
    ordered = [rows[m.name, p.name, c] for m in models for c in CONCURRENCIES for p in shown]
    print()
    print(table(ordered))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print("in-process: one InferenceSession, edged's session options, N threads in a closed loop, batch 1")
    print(f"servers: {load.description}; conc = requests in flight (perf_analyzer --concurrency-range)")
    notes = [
        (any(m.name == "http" for m in shown), "http: HTTP/REST with the binary tensor extension"),
        (any(m.name == "grpc" for m in shown), "grpc: ModelInfer, one call in flight per concurrent client"),
        (any(m.streaming for m in shown), "grpc stream: ModelStreamInfer (--streaming), one stream per client"),
        (
            any(m.shared_memory for m in shown),
            "shm: inputs and outputs in system shared memory regions perf_analyzer registers "
            "(--shared-memory system), unary calls",
        ),
    ]
    for shown_here, note in notes:
        if shown_here:
            print(f"  {note}")
    edged_notes = [str(machine["edged"])] if machine["edged"] else []
    if client_shm:
        edged_notes.append("started with --allow-client-shm=true (client shared memory is off by default)")
    if edged_notes:
        print(f"edged: {'; '.join(edged_notes)}")
    if shm.unavailable:
        print(f"shared memory: not measured: {shm.unavailable}")
    if triton_note:
        print(f"Triton: {triton_note}")
    served = [m for _, _, m in _served(ordered)]
    failed = print_caveats(served, [*served, *(row.in_process for row in ordered)], busy, _served(ordered))

    RESULTS_FILE.write_text(
        json.dumps(
            {
                **_run_info(argv, machine, load),
                "protocols": [m.name for m in shown],
                "shared_memory": shm.unavailable or ("measured" if client_shm else "not asked for"),
                "triton": triton_note,
                "cpu_busy_before": busy,
                "rows": [asdict(row) for row in ordered],
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"results: {RESULTS_FILE.relative_to(ROOT)} ({time.monotonic() - began:.0f} s)")
    return 1 if failed else 0


def edged_command(ports: Ports) -> list[str]:
    return [
        str(ROOT / ".venv" / "bin" / "edged"), "serve",
        "--model-repository", str(EDGED_REPO.relative_to(ROOT)),
        "--http-address", "127.0.0.1", "--http-port", str(ports.http),
        "--grpc-address", "127.0.0.1", "--grpc-port", str(ports.grpc),
        "--metrics-port", str(ports.metrics),
        # A state database of its own: the user's may belong to another edged revision.
        "--state-dir", str((BENCH_DIR / "state").relative_to(ROOT)),
    ]  # fmt: skip


def triton_command(ports: Ports) -> list[str]:
    return [
        str(TRITON_REFERENCE), str(TRITON_REPO.relative_to(ROOT)),
        "--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics),
    ]  # fmt: skip


def _triton_description() -> str:
    version = _triton_ort_version()
    return "Triton 2.51 (CPU build), Python backend running onnxruntime" + (f" {version}" if version else "")


def run_batching(
    quick: bool,
    skip_triton: bool,
    modes: Sequence[Mode],
    load: LoadGenerator,
    machine: dict[str, Any],
    argv: list[str] | None,
    began: float,
) -> int:
    """The dynamic-batching phase: edged and Triton serving the ResNet-50-shaped model with and without dynamic
    batching, one and two instances, against the best batch throughput of in-process onnxruntime."""
    model = batching_model(quick)
    concurrencies = BATCHING_QUICK_CONCURRENCIES if quick else BATCHING_CONCURRENCIES
    variants = prepare_batching_models(model)
    retries = Retries(RETRY_BUDGET_S / 4 if quick else RETRY_BUDGET_S)
    busy: dict[str, float] = {}
    busy["in-process"] = check_idle("in-process")
    say(f"measuring in-process onnxruntime at batch {', '.join(map(str, BATCH_SIZES))}")
    in_process = run_in_process_batches(model, retries)
    best_size = max(BATCH_SIZES, key=lambda size: in_process[size].throughput or 0.0)
    best = in_process[best_size]
    say(f"in-process best: {_fmt_rate(best.throughput)} images/s at batch {best_size}")
    rows = {
        (v.name, m.name, c): Row(v.name, c, m.name, in_process=best)
        for v in variants
        for m in modes
        for c in concurrencies
    }
    shm = SharedMemory()  # not used: batching rows send tensors over the socket

    ports = free_ports()
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged_command(ports), ports, variants, modes, load, rows, shm, retries, concurrencies, True)
    triton_note = None
    if skip_triton:
        triton_note = "skipped (--skip-triton)"
    elif not TRITON_REFERENCE.is_file():
        triton_note = f"skipped ({TRITON_REFERENCE} not found)"
    else:
        ports = free_ports()
        busy["triton"] = check_idle("triton")
        measure_server(
            "triton", triton_command(ports), ports, variants, modes, load, rows, shm, retries, concurrencies, True
        )
        triton_note = _triton_description() + "; model.py runs each batch as one session.run"

    ordered = [rows[v.name, m.name, c] for v in variants for m in modes for c in concurrencies]
    print()
    print(in_process_table(in_process))
    print()
    print(batching_table(ordered))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print(
        f"in-process best: {_fmt_rate(best.throughput)} images/s at batch {best_size} (one InferenceSession, edged's "
        "session options, one thread running batches back to back); every ratio divides by it"
    )
    print(f"servers: {load.description}; conc = requests in flight (perf_analyzer --concurrency-range)")
    print(
        f"dynamic batching: max_batch_size 16, max_queue_delay_microseconds {BATCHING_QUEUE_DELAY_US}, "
        "no preferred_batch_size; instances: instance_group count, KIND_CPU"
    )
    print("batch: inferences per model execution on the server during the measurement (its statistics)")
    if machine["edged"]:
        print(f"edged: {machine['edged']}")
    if triton_note:
        print(f"Triton: {triton_note}")
    served = [m for _, _, m in _served(ordered)]
    failed = print_caveats(served, [*served, *in_process.values()], busy, _served(ordered))

    RESULTS_FILE.write_text(
        json.dumps(
            {
                **_run_info(argv, machine, load),
                "protocols": [m.name for m in modes],
                "triton": triton_note,
                "cpu_busy_before": busy,
                "batching": {
                    "max_queue_delay_microseconds": BATCHING_QUEUE_DELAY_US,
                    "variants": {v.name: asdict(v) | {"label": v.label} for v in VARIANTS},
                    "in_process": {str(size): asdict(m) for size, m in in_process.items()},
                    "in_process_best_batch": best_size,
                    "rows": [asdict(row) for row in ordered],
                },
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"results: {RESULTS_FILE.relative_to(ROOT)} ({time.monotonic() - began:.0f} s)")
    return 1 if failed else 0


def run_python(
    quick: bool,
    skip_triton: bool,
    modes: Sequence[Mode],
    load: LoadGenerator,
    machine: dict[str, Any],
    argv: list[str] | None,
    began: float,
) -> int:
    """The Python-backend phase: add_sub_python against the ONNX add_sub on edged (the cost of the stub hop), and
    against Triton's Python backend serving the same model.py and config.pbtxt."""
    models = python_models(quick)
    python, onnx = models
    instances = prepare_python_models(onnx)
    retries = Retries(RETRY_BUDGET_S / 4 if quick else RETRY_BUDGET_S)
    rows = {(m.name, mode.name, c): Row(m.name, c, mode.name) for m in models for mode in modes for c in CONCURRENCIES}
    shm = SharedMemory()  # not used: these rows send tensors over the socket

    busy: dict[str, float] = {}
    ports = free_ports()
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged_command(ports), ports, models, modes, load, rows, shm, retries)
    triton_note = None
    if skip_triton:
        triton_note = "skipped (--skip-triton)"
    elif not TRITON_REFERENCE.is_file():
        triton_note = f"skipped ({TRITON_REFERENCE} not found)"
    else:
        ports = free_ports()
        busy["triton"] = check_idle("triton")
        measure_server("triton", triton_command(ports), ports, [python], modes, load, rows, shm, retries)
        triton_note = "Triton 2.51 (CPU build), Python backend, the same model.py and config.pbtxt as edged's"

    pairs = [(rows[python.name, mode.name, c], rows[onnx.name, mode.name, c]) for c in CONCURRENCIES for mode in modes]
    measured = [m for python_row, onnx_row in pairs for m in (python_row.edged, python_row.triton, onnx_row.edged)]
    print()
    print(python_table(pairs))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print(f"servers: {load.description}; conc = requests in flight (perf_analyzer --concurrency-range)")
    print(
        f"models: {python.name} ({PYTHON_MODEL_SOURCE.relative_to(ROOT)}: Triton's add_sub example as model.py) and "
        f"the ONNX {onnx.name} (scripts/modelgen.py); FP32 [1,16] inputs, max_batch_size 8, no dynamic batching, "
        f"instance_group count {instances} (KIND_CPU) each"
    )
    print("stub hop p50 us: edged Python p50 minus edged ONNX p50")
    if machine["edged"]:
        print(f"edged: {machine['edged']}")
    if triton_note:
        print(f"Triton: {triton_note}")
    labelled = [
        (row, label, m)
        for python_row, onnx_row in pairs
        for row, label, m in (
            (python_row, "edged", python_row.edged),
            (python_row, "triton", python_row.triton),
            (onnx_row, "edged", onnx_row.edged),
        )
    ]
    failed = print_caveats(measured, measured, busy, labelled)

    save_results(
        "python",
        {
            **_run_info(argv, machine, load),
            "protocols": [m.name for m in modes],
            "triton": triton_note,
            "instances": instances,
            "cpu_busy_before": busy,
            "rows": [
                {
                    "concurrency": python_row.concurrency,
                    "protocol": python_row.protocol,
                    "edged_python": asdict(python_row.edged),
                    "triton_python": asdict(python_row.triton),
                    "edged_onnx": asdict(onnx_row.edged),
                }
                for python_row, onnx_row in pairs
            ],
        },
    )
    print(f"results: {RESULTS_FILE.relative_to(ROOT)}, key python ({time.monotonic() - began:.0f} s)")
    return 1 if failed else 0


# --------------------------------------------------------------------------------------------------------
# --tls

TLS_HEADER: Final = (
    "conc",
    "protocol",
    "plaintext infer/s",
    "plaintext p50 us",
    "TLS infer/s",
    "TLS p50 us",
    "TLS/plaintext",
    "TLS - plaintext p50 us",
)
TLS_TEXT_COLUMNS: Final = 2


def tls_table(pairs: Sequence[tuple[Row, Row]]) -> str:
    """One line per concurrency and protocol from pairs of rows: (plaintext, TLS)."""
    body = [
        (
            str(plain.concurrency),
            plain.protocol,
            _fmt_measured(plain.edged),
            _fmt_us(plain.edged.p50_us, plain.edged.stable),
            _fmt_measured(tls.edged),
            _fmt_us(tls.edged.p50_us, tls.edged.stable),
            _fmt_ratio(tls.edged, plain.edged),
            _p50_difference(tls.edged, plain.edged),
        )
        for plain, tls in pairs
    ]
    return _markdown(TLS_HEADER, body, TLS_TEXT_COLUMNS)


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate it signed for 127.0.0.1, made for this run: (CA, certificate, key)."""
    import trustme  # a test dependency, which scripts/setup installs

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    files = (directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files[0].write_bytes(ca.cert_pem.bytes())
    files[1].write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    files[2].write_bytes(leaf.private_key_pem.bytes())
    return files


def run_tls(
    quick: bool,
    models: Sequence[BenchModel],
    modes: Sequence[Mode],
    load: LoadGenerator,
    machine: dict[str, Any],
    argv: list[str] | None,
    began: float,
) -> int:
    """The TLS phase: the same model and load on edged over plaintext, then on edged over TLS."""
    concurrencies = (1, 8) if quick else CONCURRENCIES
    retries = Retries(RETRY_BUDGET_S / 4 if quick else RETRY_BUDGET_S)
    rows = {(m.name, mode.name, c): Row(m.name, c, mode.name) for m in models for mode in modes for c in concurrencies}
    shm = SharedMemory()  # not used: these rows send tensors over the socket
    ca, cert, key = make_certificates(BENCH_DIR / "tls")
    load.tls_ca = ca
    client = ssl.create_default_context(cafile=ca)

    busy: dict[str, float] = {}
    plain_modes = [m for m in modes if not m.tls]
    ports = free_ports()
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged_command(ports), ports, models, plain_modes, load, rows, shm, retries, concurrencies)
    ports = free_ports()
    tls_flags = [
        f"--{wire}-{flag}" for wire in ("http", "grpc") for flag in (f"server-cert={cert}", f"server-key={key}")
    ]
    command = [*edged_command(ports), "--http-use-ssl", "--grpc-use-ssl", *tls_flags]
    busy["edged tls"] = check_idle("edged tls")
    tls_modes = [m for m in modes if m.tls]
    measure_server(
        "edged",
        command,
        ports,
        models,
        tls_modes,
        load,
        rows,
        shm,
        retries,
        concurrencies,
        tls=client,
        name="edged-tls",
    )

    pairs = [
        (rows[m.name, mode.name, c], rows[m.name, f"{mode.name} tls", c])
        for m in models
        for c in concurrencies
        for mode in plain_modes
    ]
    measured = [row.edged for pair in pairs for row in pair]
    print()
    print(tls_table(pairs))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print(f"servers: {load.description}; conc = requests in flight (perf_analyzer --concurrency-range)")
    print(
        "model: add_sub (FP32 [1,16]); TLS: a certificate made for the run (trustme: RSA 2048), the client "
        "verifies it; connections are kept open, so the handshake is paid once per client"
    )
    if machine["edged"]:
        print(f"edged: {machine['edged']}")
    labelled = [(row, "edged", row.edged) for pair in pairs for row in pair]
    failed = print_caveats(measured, measured, busy, labelled)

    save_results(
        "tls",
        {
            **_run_info(argv, machine, load),
            "protocols": [m.name for m in modes],
            "cpu_busy_before": busy,
            "rows": [
                {
                    "concurrency": plain.concurrency,
                    "protocol": plain.protocol,
                    "plaintext": asdict(plain.edged),
                    "tls": asdict(tls.edged),
                }
                for plain, tls in pairs
            ],
        },
    )
    print(f"results: {RESULTS_FILE.relative_to(ROOT)}, key tls ({time.monotonic() - began:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
