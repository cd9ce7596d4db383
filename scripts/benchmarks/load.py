"""The one place that drives a server: Triton's perf_analyzer, or a Python tritonclient loop where it is not
installed; and the choice between them for a phase."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np

from .common import PA_ROOT, PERF_ANALYZER, say
from .cuda import ensure_cuda_runtime
from .measurement import Measurement, Mode, SharedMemory, percentile_us

if TYPE_CHECKING:
    from .models import BenchModel
    from .servers import Ports

# perf_analyzer -v --percentile 50: "  Pass [3] throughput: 7177.38 infer/sec. p50 latency: 1903 usec"
PASS_LINE: Final = re.compile(r"Pass \[\d+\] throughput: ([0-9.]+) infer/sec\. p50 latency: ([0-9.]+) usec")


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
        if model.rows > 1:
            command += ["-b", str(model.rows)]
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

        feeds = {name: np.repeat(array, model.rows, axis=0) for name, array in model.make_inputs().items()}
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
        rate = len(latencies) * model.rows / elapsed
        return Measurement(rate, percentile_us(latencies, 50), percentile_us(latencies, 99))


def choose_load(modes: Sequence[Mode]) -> tuple[LoadGenerator, list[Mode], SharedMemory] | None:
    """perf_analyzer where it is installed (with the CUDA runtime it needs for shared memory), the Python client
    otherwise; returns it with the modes it can measure and whether shared memory can be measured, or None (having
    said so) when nothing is left to measure."""
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
        return None
    measured = [m.name for m in modes if not (m.shared_memory and shm.unavailable)]
    say(f"load generator: {load.description}; protocols: {', '.join(measured)}")
    return load, list(modes), shm
