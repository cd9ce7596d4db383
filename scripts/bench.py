"""Measures how close edged comes to running ONNX Runtime in-process, and to Triton on the same machine.

For each model and concurrency it measures, one after the other so they never compete for cores:

1. in-process: threads calling ``InferenceSession.run`` on one session in a closed loop (the ceiling);
2. edged: the real daemon driven over HTTP with binary tensors by Triton's ``perf_analyzer``;
3. Triton: Triton Inference Server serving the same model.onnx through a Python-backend model that runs
   onnxruntime (the reference build has no ONNX Runtime backend).

Run it through ``scripts/bench``, which sets up the checkout first::

    scripts/bench                 # add_sub and resnet50 at concurrency 1, 8, 16 (about 5 minutes on 2 cores)
    scripts/bench --quick         # add_sub only, short windows (about 1 minute)
    scripts/bench --skip-triton   # edged and in-process only

Generated models, server logs and the results (bench-results.json) go to bench-models/, which git ignores.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
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
CONCURRENCIES: Final = (1, 8, 16)
SERVER_START_TIMEOUT_S: Final = 180.0
# Share of the CPU used by other processes above which the figures are flagged as disturbed.
BUSY_WARNING: Final = 0.15
# perf_analyzer -v --percentile 50: "  Pass [3] throughput: 7177.38 infer/sec. p50 latency: 1903 usec"
PASS_LINE: Final = re.compile(r"Pass \[\d+\] throughput: ([0-9.]+) infer/sec\. p50 latency: ([0-9.]+) usec")
Array = npt.NDArray[Any]

# Triton's reference build has no ONNX Runtime backend, so it serves each model.onnx through this
# Python-backend model: one InferenceSession with the options edged gives a model without parameters
# (pool threads that do not spin), as the in-process loop uses too.
TRITON_MODEL_PY: Final = '''\
"""Runs model.onnx with onnxruntime inside Triton's Python backend (written by scripts/bench.py)."""

import json
import os

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

    def execute(self, requests):
        responses = []
        for request in requests:
            feeds = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
            results = self.session.run(self.outputs, feeds)
            tensors = [pb_utils.Tensor(name, array) for name, array in zip(self.outputs, results)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
'''


# --------------------------------------------------------------------------------------------------------
# what is measured


@dataclass(frozen=True)
class BenchModel:
    name: str
    # Closed-loop duration of each in-process measurement and perf_analyzer's measurement window.
    in_process_s: float
    window_ms: int
    # One request's inputs, batch 1.
    make_inputs: Callable[[], dict[str, Array]]


def _add_sub_inputs() -> dict[str, Array]:
    rng = np.random.default_rng(0)
    return {name: rng.random((1, 16), dtype=np.float32) for name in ("INPUT0", "INPUT1")}


def _resnet50_inputs() -> dict[str, Array]:
    return {"input": np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)}


def bench_models(quick: bool) -> list[BenchModel]:
    if quick:
        return [BenchModel("add_sub", 2.0, 1000, _add_sub_inputs)]
    return [
        BenchModel("add_sub", 5.0, 2000, _add_sub_inputs),
        BenchModel("resnet50", 15.0, 5000, _resnet50_inputs),
    ]


@dataclass
class Measurement:
    throughput: float | None = None  # inferences per second
    p50_us: float | None = None
    p99_us: float | None = None
    error: str | None = None
    # False when perf_analyzer found no three windows within 10% of each other: then the figures are the
    # mean of its last three windows, and p99 is unknown.
    stable: bool = True


@dataclass
class Row:
    model: str
    concurrency: int
    in_process: Measurement = field(default_factory=Measurement)
    edged: Measurement = field(default_factory=Measurement)
    triton: Measurement = field(default_factory=Measurement)


def say(message: str) -> None:
    print(f"bench: {message}", flush=True)


# --------------------------------------------------------------------------------------------------------
# model repositories


def prepare_models(models: Sequence[BenchModel]) -> None:
    """Generates the models once into bench-models/models/ and links this run's ones into edged's repository."""
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
        config = (source / modelgen.CONFIG_FILENAME).read_text(encoding="utf-8")
        config, count = re.subn(r'(?m)^platform: "onnxruntime_onnx"$', 'backend: "python"', config)
        if count != 1:
            raise RuntimeError(f"unexpected config.pbtxt layout in {source}")
        config += "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n"
        (target / modelgen.CONFIG_FILENAME).write_text(config, encoding="utf-8")
        (target / "1" / "model.py").write_text(TRITON_MODEL_PY, encoding="utf-8")
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


def run_in_process(models: Sequence[BenchModel], rows: dict[tuple[str, int], Row]) -> None:
    for model in models:
        path = MODEL_STORE / model.name / "1" / modelgen.MODEL_FILENAME
        # The session options and provider edged gives a model without parameters: the ceiling edged can reach.
        session = ort.InferenceSession(str(path), edged_session_options(), providers=["CPUExecutionProvider"])
        feeds = model.make_inputs()
        for _ in range(3):  # first runs allocate the arena and pick kernels
            session.run(None, feeds)
        for concurrency in CONCURRENCIES:
            result = measure_in_process(session, feeds, concurrency, model.in_process_s)
            rows[model.name, concurrency].in_process = result
            say(f"in-process {model.name} c={concurrency}: {_fmt_rate(result.throughput)} infer/s")


# --------------------------------------------------------------------------------------------------------
# servers


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running_server(name: str, command: list[str], http_port: int) -> Iterator[None]:
    """Starts a server, waits until it reports ready, and stops it (SIGTERM, then SIGKILL) afterwards."""
    log_path = BENCH_DIR / f"{name}.log"
    say(f"starting {name} (log: {log_path.relative_to(ROOT)})")
    with log_path.open("wb") as log:
        # A session of its own, so that stopping it also reaches the processes it starts (Triton's stubs).
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        began = time.monotonic()
        while not _ready(http_port):
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with status {process.returncode} before it was ready; see {log_path}"
                )
            if time.monotonic() - began > SERVER_START_TIMEOUT_S:
                raise RuntimeError(f"{name} was not ready after {SERVER_START_TIMEOUT_S:.0f} s; see {log_path}")
            time.sleep(0.25)
        say(f"{name} ready after {time.monotonic() - began:.1f} s")
        yield
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
# load generators


class LoadGenerator:
    description = ""

    def measure(self, model: BenchModel, port: int, concurrency: int, label: str) -> Measurement:
        raise NotImplementedError


class PerfAnalyzer(LoadGenerator):
    """Triton's perf_analyzer over HTTP with binary tensors (its default), one concurrency per run."""

    description = "perf_analyzer (HTTP, binary tensors, batch 1)"

    def __init__(self, tool: Path, quick: bool) -> None:
        self.tool = tool
        self.quick = quick

    def ensure(self) -> None:
        subprocess.run([str(self.tool), "--ensure"], check=True, stdout=subprocess.DEVNULL)

    def measure(self, model: BenchModel, port: int, concurrency: int, label: str) -> Measurement:
        csv_name = f"/tmp/edged-bench-{os.getpid()}-{label}-{model.name}-{concurrency}.csv"
        csv_host = PA_ROOT / csv_name.lstrip("/")
        csv_host.unlink(missing_ok=True)
        command = [
            str(self.tool),
            "-m", model.name,
            "-u", f"127.0.0.1:{port}",
            "-i", "http",
            "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-interval", str(model.window_ms),
            # Stable means three windows within 10% (its default) in throughput and p50 latency.
            "--percentile", "50",
            "--max-trials", "6" if self.quick else "8",
            "-v",  # prints every window, used when no three agree
            "-f", csv_name,
        ]  # fmt: skip
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


class PythonClient(LoadGenerator):
    """A closed loop of tritonclient.http clients, one per thread: used when perf_analyzer is not there.

    The client runs in this Python process, so at high rates it, not the server, may be the bottleneck.
    """

    description = "tritonclient.http threads (perf_analyzer not found), binary tensors, batch 1"

    def measure(self, model: BenchModel, port: int, concurrency: int, label: str) -> Measurement:
        import tritonclient.http as httpclient

        feeds = model.make_inputs()
        start = threading.Barrier(concurrency + 1)
        deadline = 0.0

        def worker() -> list[float]:
            client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
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
    http_port: int,
    models: Sequence[BenchModel],
    load: LoadGenerator,
    rows: dict[tuple[str, int], Row],
) -> None:
    try:
        with running_server(label, command, http_port):
            for model in models:
                for concurrency in CONCURRENCIES:
                    result = load.measure(model, http_port, concurrency, label)
                    setattr(rows[model.name, concurrency], label, result)
                    if result.error:
                        say(f"{label} {model.name} c={concurrency}: FAILED: {result.error}")
                    else:
                        p99 = "unknown" if result.p99_us is None else f"{_fmt_us(result.p99_us)} us"
                        unstable = "" if result.stable else " (unstable: mean of the last 3 windows)"
                        say(
                            f"{label} {model.name} c={concurrency}: {_fmt_rate(result.throughput)} infer/s, "
                            f"p50 {_fmt_us(result.p50_us)} us, p99 {p99}{unstable}"
                        )
    except RuntimeError as exc:
        say(f"{label}: FAILED: {exc}")
        for model in models:
            for concurrency in CONCURRENCIES:
                setattr(rows[model.name, concurrency], label, Measurement(error=str(exc)))


# --------------------------------------------------------------------------------------------------------
# report


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


TABLE_HEADER: Final = (
    "model",
    "conc",
    "in-process infer/s",
    "edged infer/s",
    "edged/in-process",
    "edged p50 us",
    "Triton infer/s",
    "edged/Triton",
    "Triton p50 us",
)


def table(rows: Sequence[Row]) -> str:
    body = [
        (
            row.model,
            str(row.concurrency),
            _fmt_rate(row.in_process.throughput),
            _fmt_rate(row.edged.throughput, row.edged.stable),
            _fmt_ratio(row.edged, row.in_process),
            _fmt_us(row.edged.p50_us, row.edged.stable),
            _fmt_rate(row.triton.throughput, row.triton.stable),
            _fmt_ratio(row.edged, row.triton),
            _fmt_us(row.triton.p50_us, row.triton.stable),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in (TABLE_HEADER, *body)) for i in range(len(TABLE_HEADER))]

    def line(cells: Sequence[str]) -> str:
        # Names left-aligned, figures right-aligned: the table is also valid Markdown.
        padded = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 2) if i < 2 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(TABLE_HEADER), rule, *(line(cells) for cells in body)])


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                return text.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


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
# main


def cpu_busy(seconds: float = 1.0) -> float:
    """The share of all CPUs that was not idle over the next ``seconds``, from /proc/stat (0.0 elsewhere)."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def check_idle(phase: str) -> float:
    """Every measurement assumes the machine is otherwise idle; says so when it is not."""
    share = cpu_busy()
    if share > BUSY_WARNING:
        say(f"warning: {share:.0%} of the CPU is busy with other processes before the {phase} measurements")
    return round(share, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="add_sub only, short measurements")
    parser.add_argument("--skip-triton", action="store_true", help="do not measure Triton")
    args = parser.parse_args(argv)

    began = time.monotonic()
    models = bench_models(args.quick)
    rows = {(m.name, c): Row(m.name, c) for m in models for c in CONCURRENCIES}
    machine = {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
    }
    say(f"{machine['cpus']} CPUs ({machine['cpu_model']}), onnxruntime {ort.__version__}")

    BENCH_DIR.mkdir(exist_ok=True)
    prepare_models(models)

    load: LoadGenerator
    if PERF_ANALYZER.is_file():
        analyzer = PerfAnalyzer(PERF_ANALYZER, args.quick)
        analyzer.ensure()
        load = analyzer
    else:
        say(f"{PERF_ANALYZER} not found: falling back to a Python tritonclient.http load generator")
        load = PythonClient()
    say(f"load generator: {load.description}")

    busy: dict[str, float] = {}
    busy["in-process"] = check_idle("in-process")
    say("measuring in-process onnxruntime")
    run_in_process(models, rows)

    http, grpc, metrics = free_ports(3)
    edged = [
        str(ROOT / ".venv" / "bin" / "edged"), "serve",
        "--model-repository", str(EDGED_REPO.relative_to(ROOT)),
        "--http-address", "127.0.0.1", "--http-port", str(http),
        "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
        "--metrics-port", str(metrics),
    ]  # fmt: skip
    busy["edged"] = check_idle("edged")
    measure_server("edged", edged, http, models, load, rows)

    triton_note = None
    if args.skip_triton:
        triton_note = "skipped (--skip-triton)"
    elif not TRITON_REFERENCE.is_file():
        triton_note = f"skipped ({TRITON_REFERENCE} not found)"
    else:
        prepare_triton_models(models)
        http, grpc, metrics = free_ports(3)
        triton = [
            str(TRITON_REFERENCE), str(TRITON_REPO.relative_to(ROOT)),
            "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
        ]  # fmt: skip
        busy["triton"] = check_idle("triton")
        measure_server("triton", triton, http, models, load, rows)
        version = _triton_ort_version()
        triton_note = (
            "Triton 2.51 (CPU build), Python backend running onnxruntime"
            + (f" {version}" if version else "")
            + ", instance_group count 1"
        )

    ordered = [rows[m.name, c] for m in models for c in CONCURRENCIES]
    print()
    print(table(ordered))
    print()
    print(f"machine: {machine['cpus']} CPUs, {machine['cpu_model']}; onnxruntime {ort.__version__}")
    print("in-process: one InferenceSession, edged's session options, N threads in a closed loop, batch 1")
    print(f"servers: {load.description}; concurrency = concurrent requests in flight")
    if triton_note:
        print(f"Triton: {triton_note}")
    if any(not m.stable for row in ordered for m in (row.edged, row.triton)):
        print("~: perf_analyzer found no three windows within 10%; mean of its last three windows, p99 unknown")
    if any(share > BUSY_WARNING for share in busy.values()):
        print(
            "warning: other processes used the CPU before "
            + ", ".join(f"{phase} ({share:.0%})" for phase, share in busy.items() if share > BUSY_WARNING)
            + "; those figures are likely low and noisy"
        )
    errors = [
        f"{row.model} c={row.concurrency} {label}: {m.error}"
        for row in ordered
        for label, m in (("edged", row.edged), ("triton", row.triton))
        if m.error
    ]
    for error in errors:
        print(f"failed: {error}")

    RESULTS_FILE.write_text(
        json.dumps(
            {
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": " ".join(["scripts/bench", *(argv if argv is not None else sys.argv[1:])]),
                "machine": machine,
                "load_generator": load.description,
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
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
