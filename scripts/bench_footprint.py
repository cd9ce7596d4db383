"""``scripts/bench --footprint``: what edged costs a device in memory, start time and disk. Five figures:

- **idle memory** serving the bundled repository (``model_repository/``), a few seconds after READY: Rss, Pss and
  USS (Private_Clean + Private_Dirty) of the daemon and of every process under it, from /proc/PID/smaps_rollup,
  their threads, and the daemon's largest mappings by Pss (from /proc/PID/smaps). Median of a few starts;
- **cold start**: from spawning ``python -m edged serve`` to the "edged ready" log line and to
  ``GET /v2/health/ready`` answering 200;
- **CLI start**: ``python -m edged version`` and ``edged --help``;
- **a Python-backend instance**: one identity model with one instance, written for the run, against an empty
  repository: the stub process's memory and what the daemon grows by;
- **installed size** of the virtualenv per distribution, marking what edged needs at run time (its requirements
  without extras, followed recursively), what only the ``sync`` extra needs, and what only tests and tools need.

Each daemon gets its own ports and a fresh state directory; nothing else runs.
"""

from __future__ import annotations

import http.client
import importlib.metadata
import os
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT: Final = Path(__file__).resolve().parent.parent
REPOSITORY: Final = ROOT / "model_repository"
START_TIMEOUT_S: Final = 60.0
# The allocator, the metrics history and the model-load threads settle within a few seconds of READY.
SETTLE_S: Final = 3.0
# How often a cold start looks at the log and the health endpoint: the resolution of its figures.
POLL_S: Final = 0.005
TOP_MAPPINGS: Final = 12
TOP_DISTRIBUTIONS: Final = 25
MIB: Final = 1024.0

PYTHON_MODEL_CONFIG: Final = """\
name: "identity"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
PYTHON_MODEL_PY: Final = '''\
"""INPUT0 comes back as OUTPUT0 (written by scripts/bench_footprint.py)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
'''


def say(message: str) -> None:
    print(f"bench: {message}", flush=True)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# --------------------------------------------------------------------------------------------------------
# /proc


@dataclass
class Memory:
    """KiB."""

    rss: int = 0
    pss: int = 0
    uss: int = 0

    def add(self, other: Memory) -> None:
        self.rss += other.rss
        self.pss += other.pss
        self.uss += other.uss


def _fields(text: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, colon, rest = line.partition(":")
        parts = rest.split()
        if colon and parts and parts[0].isdigit():
            values[key] = int(parts[0])
    return values


def _memory(values: dict[str, int]) -> Memory:
    private = values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)
    return Memory(values.get("Rss", 0), values.get("Pss", 0), private)


@dataclass
class Process:
    pid: int
    name: str
    command: str
    threads: int
    memory: Memory


def _descendants(root: int) -> list[int]:
    """``root`` and every process under it, parents first, from /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        after = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        children.setdefault(int(after[1]), []).append(int(stat.parent.name))
    found = [root]
    for pid in found:
        found.extend(sorted(children.get(pid, [])))
    return found


def _process(pid: int) -> Process:
    status = Path(f"/proc/{pid}/status").read_text()
    name = next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Name:"))
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    command = " ".join(part.decode(errors="replace") for part in argv if part)
    return Process(
        pid, name, command, _fields(status)["Threads"], _memory(_fields(Path(f"/proc/{pid}/smaps_rollup").read_text()))
    )


def _tree(root: int) -> list[Process]:
    processes = []
    for pid in _descendants(root):
        try:
            processes.append(_process(pid))
        except (OSError, StopIteration, KeyError):  # gone meanwhile
            continue
    return processes


def _mappings(pid: int) -> list[dict[str, Any]]:
    """The process's mappings grouped by what they map (a file, ``[heap]``, ``[anon]``...), largest Pss first."""
    groups: dict[str, tuple[Memory, list[int]]] = {}
    current: Memory | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:
            # "start-end perms offset dev inode [pathname]" begins each mapping.
            name = head[5].strip() if len(head) == 6 else "[anon]"
            memory, count = groups.setdefault(name, (Memory(), [0]))
            count[0] += 1
            current = memory
            continue
        key, _, rest = line.partition(":")
        if current is None or not rest.split() or not rest.split()[0].isdigit():
            continue
        value = int(rest.split()[0])
        if key == "Rss":
            current.rss += value
        elif key == "Pss":
            current.pss += value
        elif key in ("Private_Clean", "Private_Dirty"):
            current.uss += value
    ordered = sorted(groups.items(), key=lambda item: item[1][0].pss, reverse=True)
    return [
        {"mapping": name, "mappings": count[0], "rss_kib": m.rss, "pss_kib": m.pss, "uss_kib": m.uss}
        for name, (m, count) in ordered
    ]


# --------------------------------------------------------------------------------------------------------
# the daemon


@dataclass
class Started:
    pid: int
    http_port: int
    # Seconds from spawning the process to the "edged ready" log line and to /v2/health/ready answering 200.
    ready_log_s: float = 0.0
    ready_http_s: float = 0.0
    log: Path = field(default_factory=Path)


def _health_ready(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@contextmanager
def _daemon(repository: Path) -> Iterator[Started]:
    """edged serving ``repository`` (every model loaded), its own ports and a fresh state directory; timed."""
    with tempfile.TemporaryDirectory(prefix="edged-bench-footprint-") as scratch:
        state = Path(scratch) / "state"
        state.mkdir()
        http_port, grpc_port, metrics_port, console_port = _free_ports(4)
        log = Path(scratch) / "edged.log"
        args = [sys.executable, "-m", "edged", "serve", "--model-repository", str(repository)]
        args += ["--http-address", "127.0.0.1", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
        args += ["--metrics-port", str(metrics_port), "--console-port", str(console_port), "--state-dir", str(state)]
        args += ["--model-control-mode", "explicit", "--load-model", "*"]
        with log.open("wb") as output:
            began = time.perf_counter()
            process = subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT, env=_environment())
        started = Started(process.pid, http_port, log=log)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not (started.ready_log_s and started.ready_http_s):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"edged did not start:\n{log.read_text(errors='replace')}")
                now = time.perf_counter() - began
                if not started.ready_log_s and "edged ready" in log.read_text(errors="replace"):
                    started.ready_log_s = now
                if not started.ready_http_s and _health_ready(http_port):
                    started.ready_http_s = now
                time.sleep(POLL_S)
            yield started
        finally:
            process.terminate()
            process.wait(timeout=30)


@dataclass
class Idle:
    processes: list[Process]
    mappings: list[dict[str, Any]]

    @property
    def total(self) -> Memory:
        total = Memory()
        for process in self.processes:
            total.add(process.memory)
        return total


def _idle(repository: Path) -> Idle:
    with _daemon(repository) as started:
        time.sleep(SETTLE_S)
        return Idle(_tree(started.pid), _mappings(started.pid))


def _median_idle(samples: list[Idle]) -> Idle:
    """The start whose total Pss is the median."""
    ordered = sorted(samples, key=lambda idle: idle.total.pss)
    return ordered[(len(ordered) - 1) // 2]


# --------------------------------------------------------------------------------------------------------
# the CLI


def _environment() -> dict[str, str]:
    """This checkout's edged first on the path, also for the console script, whichever checkout the virtualenv's
    editable install points to."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return os.environ | {"PYTHONPATH": path}


def _wall(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=_environment())
    return time.perf_counter() - began


# --------------------------------------------------------------------------------------------------------
# the virtualenv


def _runtime_names(extras: tuple[str, ...]) -> set[str]:
    """edged's requirements with ``extras`` (none: only the run-time ones), followed recursively with each
    requirement's own extras, as canonical distribution names."""
    environment = {"extra": ""}
    wanted: list[tuple[str, tuple[str, ...]]] = [("edged", extras)]
    seen: set[tuple[str, str]] = set()
    names: set[str] = set()
    while wanted:
        name, with_extras = wanted.pop()
        for extra in ("", *with_extras):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            names.add(name)
            try:
                requires = importlib.metadata.requires(name) or []
            except importlib.metadata.PackageNotFoundError:
                continue
            for text in requires:
                requirement = Requirement(text)
                if requirement.marker is None or requirement.marker.evaluate(environment | {"extra": extra}):
                    wanted.append((canonicalize_name(requirement.name), tuple(sorted(requirement.extras))))
    return names


def _files(dist: importlib.metadata.Distribution) -> Iterator[Path]:
    """The files the distribution's RECORD lists, and the bytecode Python wrote beside its modules since (which
    RECORD does not list when the installer did not compile them)."""
    tag = sys.implementation.cache_tag
    for file in dist.files or []:
        path = Path(str(dist.locate_file(file)))
        yield path
        if path.suffix == ".py":
            for optimization in ("", ".opt-1", ".opt-2"):
                yield path.parent / "__pycache__" / f"{path.stem}.{tag}{optimization}.pyc"


def _installed() -> list[dict[str, Any]]:
    """Every distribution in this interpreter's site-packages with the size of its files (bytecode included)."""
    site = Path(sysconfig.get_paths()["purelib"])
    runtime = _runtime_names(())
    sync = _runtime_names(("sync",)) - runtime
    rows: list[dict[str, Any]] = []
    counted: set[Path] = set()
    for dist in importlib.metadata.distributions(path=[str(site)]):
        size = 0
        for path in _files(dist):
            if path in counted:
                continue
            counted.add(path)
            try:
                size += path.lstat().st_size
            except OSError:  # listed but not there (the .pyc of a file never imported, say)
                continue
        name = canonicalize_name(dist.metadata["Name"])
        use = "run time" if name in runtime else "sync" if name in sync else "tests/tools"
        rows.append({"distribution": name, "version": dist.version, "bytes": size, "use": use})
    rows.sort(key=lambda row: int(row["bytes"]), reverse=True)
    return rows


# --------------------------------------------------------------------------------------------------------
# the report


def _mib(kib: float) -> str:
    return f"{kib / MIB:.1f}"


def _print_processes(title: str, processes: list[Process]) -> None:
    print(title)
    print(f"  {'pid':>8}  {'process':<16}{'threads':>8}{'Rss MiB':>9}{'Pss MiB':>9}{'USS MiB':>9}  command")
    total = Memory()
    for process in processes:
        m = process.memory
        total.add(m)
        command = process.command if len(process.command) <= 60 else process.command[:57] + "..."
        print(
            f"  {process.pid:>8}  {process.name:<16}{process.threads:>8}"
            f"{_mib(m.rss):>9}{_mib(m.pss):>9}{_mib(m.uss):>9}  {command}"
        )
    threads = sum(process.threads for process in processes)
    print(f"  {'':>8}  {'total':<16}{threads:>8}{_mib(total.rss):>9}{_mib(total.pss):>9}{_mib(total.uss):>9}")


def _process_dict(process: Process) -> dict[str, Any]:
    m = process.memory
    return {
        "pid": process.pid,
        "name": process.name,
        "command": process.command,
        "threads": process.threads,
        "rss_kib": m.rss,
        "pss_kib": m.pss,
        "uss_kib": m.uss,
    }


def _totals(samples: list[Idle]) -> dict[str, float]:
    """Medians over the starts of the whole tree's and the daemon's figures, in KiB."""
    return {
        "rss_kib": statistics.median(s.total.rss for s in samples),
        "pss_kib": statistics.median(s.total.pss for s in samples),
        "uss_kib": statistics.median(s.total.uss for s in samples),
        "daemon_rss_kib": statistics.median(s.processes[0].memory.rss for s in samples),
        "daemon_pss_kib": statistics.median(s.processes[0].memory.pss for s in samples),
        "daemon_uss_kib": statistics.median(s.processes[0].memory.uss for s in samples),
        "processes": statistics.median(len(s.processes) for s in samples),
        "threads": statistics.median(sum(p.threads for p in s.processes) for s in samples),
    }


def _measure_idle(starts: int) -> dict[str, Any]:
    samples = [_idle(REPOSITORY) for _ in range(starts)]
    totals = _totals(samples)
    shown = _median_idle(samples)
    print()
    print(
        f"idle, serving {REPOSITORY.relative_to(ROOT)}/ ({', '.join(sorted(p.name for p in REPOSITORY.iterdir()))}), "
        f"{SETTLE_S:.0f} s after READY; median of {starts} starts:"
    )
    print(
        f"  daemon and children: Rss {_mib(totals['rss_kib'])} MiB, Pss {_mib(totals['pss_kib'])} MiB, "
        f"USS {_mib(totals['uss_kib'])} MiB, {totals['processes']:.0f} process(es), {totals['threads']:.0f} threads"
    )
    _print_processes("  the median start, by process:", shown.processes)
    print(f"  the daemon's {TOP_MAPPINGS} largest mappings by Pss (of {len(shown.mappings)}):")
    print(f"    {'Pss MiB':>8}{'Rss MiB':>9}{'USS MiB':>9}{'maps':>6}  mapping")
    for row in shown.mappings[:TOP_MAPPINGS]:
        print(
            f"    {_mib(row['pss_kib']):>8}{_mib(row['rss_kib']):>9}{_mib(row['uss_kib']):>9}{row['mappings']:>6}  "
            f"{_short_path(row['mapping'])}"
        )
    return {
        "starts": starts,
        "settle_s": SETTLE_S,
        "median": totals,
        "per_start": [_totals([s]) for s in samples],
        "processes": [_process_dict(p) for p in shown.processes],
        "mappings": shown.mappings[:TOP_MAPPINGS],
        "mapping_count": len(shown.mappings),
    }


def _short_path(path: str) -> str:
    """A mapped file's path from its site-packages (or the checkout) on, which is what tells what it is."""
    for marker in ("site-packages/", f"{ROOT}/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _measure_cold_start(starts: int) -> dict[str, Any]:
    log_s: list[float] = []
    http_s: list[float] = []
    for _ in range(starts):
        with _daemon(REPOSITORY) as started:
            log_s.append(started.ready_log_s)
            http_s.append(started.ready_http_s)
    result: dict[str, Any] = {
        "starts": starts,
        "ready_log_s_median": statistics.median(log_s),
        "ready_http_s_median": statistics.median(http_s),
        "ready_log_s": log_s,
        "ready_http_s": http_s,
    }
    print()
    print(
        f"cold start of `python -m edged serve` on the bundled repository (median of {starts}): "
        f"'edged ready' logged after {result['ready_log_s_median']:.2f} s, /v2/health/ready 200 after "
        f"{result['ready_http_s_median']:.2f} s (min {min(http_s):.2f}, max {max(http_s):.2f})"
    )
    return result


def _measure_cli(runs: int) -> dict[str, Any]:
    version = [_wall([sys.executable, "-m", "edged", "version"]) for _ in range(runs)]
    console_script = str(Path(sys.executable).parent / "edged")
    help_runs = max(3, runs // 2)
    helps = [_wall([console_script, "--help"]) for _ in range(help_runs)]
    result: dict[str, Any] = {
        "version_runs": runs,
        "version_s_median": statistics.median(version),
        "version_s": version,
        "help_runs": help_runs,
        "help_s_median": statistics.median(helps),
        "help_s": helps,
    }
    print()
    print(
        f"CLI: `python -m edged version` {result['version_s_median'] * 1000:.0f} ms (median of {runs}), "
        f"`edged --help` {result['help_s_median'] * 1000:.0f} ms (median of {help_runs})"
    )
    return result


def _measure_python_backend(starts: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="edged-bench-footprint-repo-") as scratch:
        empty = Path(scratch) / "empty"
        empty.mkdir()
        python = Path(scratch) / "python"
        (python / "identity" / "1").mkdir(parents=True)
        (python / "identity" / "config.pbtxt").write_text(PYTHON_MODEL_CONFIG)
        (python / "identity" / "1" / "model.py").write_text(PYTHON_MODEL_PY)
        without: list[Idle] = []
        with_model: list[Idle] = []
        for _ in range(starts):
            without.append(_idle(empty))
            with_model.append(_idle(python))
    if any(len(s.processes) < 2 for s in with_model):
        raise RuntimeError("the Python-backend model's daemon showed no stub process")
    base = _totals(without)
    served = _totals(with_model)
    stubs = [s.processes[1:] for s in with_model]
    stub = {
        "rss_kib": statistics.median(sum(p.memory.rss for p in procs) for procs in stubs),
        "pss_kib": statistics.median(sum(p.memory.pss for p in procs) for procs in stubs),
        "uss_kib": statistics.median(sum(p.memory.uss for p in procs) for procs in stubs),
        "threads": statistics.median(sum(p.threads for p in procs) for procs in stubs),
    }
    daemon_growth = {key: served[f"daemon_{key}"] - base[f"daemon_{key}"] for key in ("rss_kib", "pss_kib", "uss_kib")}
    total_growth = {key: served[key] - base[key] for key in ("rss_kib", "pss_kib", "uss_kib")}
    print()
    print(f"a Python-backend instance (one identity model, instance_group count 1; median of {starts} starts each):")
    print(
        f"  empty repository: daemon Rss {_mib(base['daemon_rss_kib'])} MiB, Pss {_mib(base['daemon_pss_kib'])} MiB, "
        f"USS {_mib(base['daemon_uss_kib'])} MiB, {base['threads']:.0f} threads"
    )
    print(
        f"  the stub process(es): Rss {_mib(stub['rss_kib'])} MiB, Pss {_mib(stub['pss_kib'])} MiB, "
        f"USS {_mib(stub['uss_kib'])} MiB, {stub['threads']:.0f} threads"
    )
    print(
        f"  the daemon grows by Rss {_mib(daemon_growth['rss_kib'])} MiB, Pss {_mib(daemon_growth['pss_kib'])} MiB, "
        f"USS {_mib(daemon_growth['uss_kib'])} MiB; daemon and stub together by Pss {_mib(total_growth['pss_kib'])} "
        f"MiB (Rss {_mib(total_growth['rss_kib'])} MiB)"
    )
    _print_processes("  the median start with the model, by process:", _median_idle(with_model).processes)
    return {
        "starts": starts,
        "empty_repository": base,
        "with_python_model": served,
        "stub": stub,
        "daemon_growth": daemon_growth,
        "total_growth": total_growth,
    }


def _measure_installed() -> dict[str, Any]:
    rows = _installed()
    total = sum(int(row["bytes"]) for row in rows)
    by_use: dict[str, int] = {}
    for row in rows:
        by_use[row["use"]] = by_use.get(row["use"], 0) + int(row["bytes"])
    print()
    print(
        f"installed in {Path(sysconfig.get_paths()['purelib'])} ({len(rows)} distributions, the files their RECORDs "
        f"list, with their bytecode): {total / 1e6:.1f} MB; "
        + ", ".join(f"{use} {size / 1e6:.1f} MB" for use, size in sorted(by_use.items(), key=lambda kv: -kv[1]))
    )
    print("  run time: edged's requirements without extras, recursively; sync: what only the sync extra adds")
    print(f"  {'MB':>7}  {'use':<12}distribution")
    for row in rows[:TOP_DISTRIBUTIONS]:
        print(f"  {int(row['bytes']) / 1e6:>7.1f}  {row['use']:<12}{row['distribution']} {row['version']}")
    for use in ("run time", "sync"):
        # What each run-time dependency costs, however far down the whole list it is.
        mine = [row for row in rows if row["use"] == use]
        large = [row for row in mine if int(row["bytes"]) >= 500_000]
        rest = sum(int(row["bytes"]) for row in mine[len(large) :])
        listed = ", ".join(f"{row['distribution']} {int(row['bytes']) / 1e6:.1f}" for row in large)
        print(f"  {use}, MB each: {listed}; {len(mine) - len(large)} more under 0.5 MB: {rest / 1e6:.1f}")
    return {
        "site_packages": str(Path(sysconfig.get_paths()["purelib"])),
        "total_bytes": total,
        "bytes_by_use": by_use,
        "distributions": rows,
    }


def run_footprint(quick: bool, argv: list[str] | None, save: Callable[[str, dict[str, Any]], None]) -> int:
    began = time.monotonic()
    idle_starts = 1 if quick else 3
    cold_starts = 2 if quick else 5
    cli_runs = 4 if quick else 10
    python_starts = 1 if quick else 3
    say(f"footprint: {idle_starts} idle start(s), {cold_starts} cold starts, {cli_runs} CLI runs")
    summary: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["scripts/bench", *(argv if argv is not None else sys.argv[1:])]),
        "cpus": os.cpu_count(),
        "quick": quick,
        "idle": _measure_idle(idle_starts),
        "cold_start": _measure_cold_start(cold_starts),
        "cli": _measure_cli(cli_runs),
        "python_backend": _measure_python_backend(python_starts),
        "installed": _measure_installed(),
    }
    save("footprint", summary)
    print()
    print(f"results: bench-models/bench-results.json, key footprint ({time.monotonic() - began:.0f} s)")
    return 0
