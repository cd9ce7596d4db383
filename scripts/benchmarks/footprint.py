"""``--footprint``: what edged costs a device in memory, start time and disk. Six figures:

- **idle memory** serving the bundled repository (``model_repository/``), a few seconds after READY: Rss, Pss and
  USS (Private_Clean + Private_Dirty) of the daemon and of every process under it, from /proc/PID/smaps_rollup,
  their threads, and the daemon's largest mappings by Pss (from /proc/PID/smaps). Median of a few starts;
- **cold start**: from spawning ``python -m edged serve`` to the "edged ready" log line and to
  ``GET /v2/health/ready`` answering 200;
- **CLI start**: ``python -m edged version`` and ``edged --help``;
- **a Python-backend instance**: one identity model with one instance, written for the run, against an empty
  repository: the stub process's memory and what the daemon grows by;
- **installed size** of the virtualenv per distribution, marking what edged needs at run time (its requirements
  without extras, followed recursively), what only the ``sync`` extra needs, and what only tests and tools need;
- **the .deb**: packaging/build-deb's package of this checkout, its Installed-Size, and the idle memory and cold
  start again with the daemon running from the package's unpacked tree (its interpreter, its libraries, its
  bytecode), which is what a device runs: shared pages and imported modules differ from the virtualenv's.

Each daemon gets its own ports and a fresh state directory; nothing else runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .common import BUNDLED_REPO, ROOT, Phase, say
from .installed import measure_installed
from .memory import Memory, Process, mappings, tree
from .results import print_saved, run_header, save_results
from .servers import Started, edged_daemon, free_ports

# The allocator, the metrics history and the model-load threads settle within a few seconds of READY.
SETTLE_S: Final = 3.0
# How often a cold start looks at the log and the health endpoint: the resolution of its figures.
POLL_S: Final = 0.005
TOP_MAPPINGS: Final = 12
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
"""INPUT0 comes back as OUTPUT0 (written by scripts/bench --footprint)."""

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


# --------------------------------------------------------------------------------------------------------
# the daemon


@dataclass(frozen=True)
class Install:
    """Where edged runs from: this checkout on the development virtualenv, or an installed package's tree."""

    python: str = sys.executable
    cwd: Path = ROOT
    installed: bool = False

    def environment(self) -> dict[str, str]:
        if not self.installed:
            return _environment()
        # The package's own edged and nothing of the checkout; its tree is read-only on a device, so nothing
        # compiles bytecode into it.
        return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONDONTWRITEBYTECODE": "1"}


CHECKOUT: Final = Install()


@contextmanager
def _daemon(repository: Path, install: Install = CHECKOUT) -> Iterator[Started]:
    """edged serving ``repository`` (every model loaded), its own ports and a fresh state directory; timed to the
    resolution of POLL_S."""
    with tempfile.TemporaryDirectory(prefix="edged-bench-footprint-") as scratch:
        state = Path(scratch) / "state"
        state.mkdir()
        ports = free_ports()
        with edged_daemon(
            "edged-footprint",
            repository,
            state,
            ports,
            env=install.environment(),
            poll_s=POLL_S,
            python=install.python,
            cwd=install.cwd,
        ) as started:
            yield started


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


def _idle(repository: Path, install: Install = CHECKOUT) -> Idle:
    with _daemon(repository, install) as started:
        time.sleep(SETTLE_S)
        return Idle(tree(started.pid), mappings(started.pid))


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


def _measure_idle(starts: int, install: Install = CHECKOUT) -> dict[str, Any]:
    samples = [_idle(BUNDLED_REPO, install) for _ in range(starts)]
    totals = _totals(samples)
    shown = _median_idle(samples)
    models = ", ".join(sorted(p.name for p in BUNDLED_REPO.iterdir()))
    where = "the installed package" if install.installed else "the development virtualenv"
    print()
    print(
        f"idle, {where}, serving {BUNDLED_REPO.relative_to(ROOT)}/ ({models}), "
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


def _measure_cold_start(starts: int, install: Install = CHECKOUT) -> dict[str, Any]:
    log_s: list[float] = []
    http_s: list[float] = []
    for _ in range(starts):
        with _daemon(BUNDLED_REPO, install) as started:
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
        f"cold start of `python -m edged serve` ({'installed package' if install.installed else 'virtualenv'}) "
        f"on the bundled repository (median of {starts}): "
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


@contextmanager
def _installed_package() -> Iterator[tuple[Path, Install]]:
    """packaging/build-deb's .deb of this checkout (uncompressed: xz changes nothing installed), unpacked."""
    with tempfile.TemporaryDirectory(prefix="edged-bench-footprint-deb-") as scratch:
        say("footprint: building the .deb (packaging/build-deb)")
        env = os.environ | {"EDGED_DEB_COMPRESSION": "none"}
        built = subprocess.run(
            [str(ROOT / "packaging" / "build-deb"), "--output", scratch],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        deb = Path(built.stdout.strip().splitlines()[-1])
        tree = Path(scratch) / "tree"
        subprocess.run(["dpkg-deb", "--extract", str(deb), str(tree)], check=True)
        yield deb, Install(str(tree / "opt" / "edged" / "bin" / "python"), Path(scratch), installed=True)


def _measure_package(idle_starts: int, cold_starts: int) -> dict[str, Any]:
    """The .deb: its installed size, and the daemon's idle memory and cold start running from its tree."""
    with _installed_package() as (deb, install):
        fields = subprocess.run(["dpkg-deb", "--field", str(deb), "Installed-Size"], check=True, capture_output=True)
        installed_kib = int(fields.stdout)
        print()
        print(
            f"the .deb (packaging/build-deb): Installed-Size {installed_kib:,} KiB ({installed_kib / MIB:.1f} MiB, "
            f"{installed_kib * 1024 / 1e6:.1f} MB), {deb.stat().st_size / 1e6:.1f} MB uncompressed"
        )
        return {
            "installed_size_kib": installed_kib,
            "idle": _measure_idle(idle_starts, install),
            "cold_start": _measure_cold_start(cold_starts, install),
        }


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    began = time.monotonic()
    quick = args.quick
    idle_starts = 1 if quick else 3
    cold_starts = 2 if quick else 5
    cli_runs = 4 if quick else 10
    python_starts = 1 if quick else 3
    say(f"footprint: {idle_starts} idle start(s), {cold_starts} cold starts, {cli_runs} CLI runs")
    summary: dict[str, Any] = {
        **run_header(argv),
        "cpus": os.cpu_count(),
        "quick": quick,
        "idle": _measure_idle(idle_starts),
        "cold_start": _measure_cold_start(cold_starts),
        "cli": _measure_cli(cli_runs),
        "python_backend": _measure_python_backend(python_starts),
        "installed": measure_installed(),
        "package": _measure_package(idle_starts, cold_starts),
    }
    save_results("footprint", summary)
    print()
    print_saved(began, "footprint")
    return 0


PHASE: Final = Phase(
    "--footprint",
    "only the footprint: idle memory by process and mapping, cold start, CLI start, a Python-backend "
    "instance's cost and the virtualenv's size by distribution",
    run,
)
