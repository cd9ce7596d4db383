"""Prints the Python source files that edged imports when it runs, one per line: the ones the .deb precompiles.

Usage: ``python packaging/runtime_modules.py VENV REPOSITORY [CONFIG]``

The package's virtualenv holds about twice as much bytecode as edged ever loads (whole libraries of which it
imports a few modules), and every megabyte is paid on the device. So the build precompiles what a run imports,
found by running it: the command line, then the daemon serving the bundled repository with its HTTP, gRPC,
metrics and console endpoints, answering an inference, a scrape and the console's login page. Each run writes
its bytecode under a PYTHONPYCACHEPREFIX of its own, so the files found there are exactly the modules imported.
A module that only a rarer path imports (a database upgrade, a sync client) still works without its .pyc: Python
compiles it in memory when it is first imported.

Every run reads CONFIG (the packaged edged.toml; none when it is not given) and none of the builder's own: the
``EDGED_*`` variables of the caller's environment are dropped, and $EDGED_CONFIG names CONFIG (or an empty file),
so that neither a builder's shell (EDGED_ALLOW_CONSOLE=false, say) nor an /etc/edged/edged.toml on the build
machine changes what runs, or stops the survey.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, data: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(url, data=data, timeout=10) as reply:
            reply.read()
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _run(edged: list[str], args: list[str], env: dict[str, str]) -> None:
    subprocess.run([*edged, *args], env=env, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def _serve(edged: list[str], repository: str, state: Path, env: dict[str, str]) -> None:
    http, grpc, metrics, console = (_free_port() for _ in range(4))
    command = [
        *edged,
        "serve",
        f"--model-repository={repository}",
        f"--state-dir={state}",
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        f"--console-port={console}",
    ]
    daemon = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while _get(f"http://127.0.0.1:{http}/v2/health/ready") != 200:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"runtime_modules: edged did not get ready (exit status {daemon.returncode})")
            time.sleep(0.2)
        inputs = [
            {"name": name, "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16} for name in ("INPUT0", "INPUT1")
        ]
        body = json.dumps({"inputs": inputs}).encode()
        for url, data in (
            (f"http://127.0.0.1:{http}/v2/models/add_sub/infer", body),
            (f"http://127.0.0.1:{metrics}/metrics", None),
            (f"http://127.0.0.1:{console}/login", None),
        ):
            if _get(url, data) != 200:
                raise SystemExit(f"runtime_modules: {url} did not answer 200")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)


def survey_config(packaged: str, repository: str) -> str:
    """The packaged configuration with ``repository`` in place of the device's (which the build machine need not
    have: the file's repository is checked even where a flag replaces it)."""
    # A JSON string is a TOML basic string for any path.
    line = f"model_repository = [{json.dumps(str(Path(repository).absolute()))}]"
    text, count = re.subn(r"^model_repository = .*$", lambda _: line, packaged, flags=re.MULTILINE)
    if count != 1:
        raise SystemExit("runtime_modules: the configuration sets no model_repository")
    return text


def survey_environment(environ: dict[str, str], config: Path, pycache_prefix: Path) -> dict[str, str]:
    """The environment the survey runs edged in: the caller's without its EDGED_* settings, reading ``config``."""
    env = {
        key: value
        for key, value in environ.items()
        if not key.startswith("EDGED_") and key != "PYTHONDONTWRITEBYTECODE"
    }
    env["EDGED_CONFIG"] = str(config)
    env["PYTHONPYCACHEPREFIX"] = str(pycache_prefix)
    return env


def main() -> int:
    venv, repository = sys.argv[1:3]
    edged = [f"{venv}/bin/python", "-m", "edged"]
    with tempfile.TemporaryDirectory(prefix="edged-runtime-modules-") as tmp:
        prefix = Path(tmp, "pycache")
        config = Path(tmp, "edged.toml")
        packaged = Path(sys.argv[3]).read_text(encoding="utf-8") if len(sys.argv) > 3 else ""
        config.write_text(survey_config(packaged, repository) if packaged else "", encoding="utf-8")
        env = survey_environment(dict(os.environ), config, prefix)
        for args in (["version"], ["--help"], ["config"], ["check-repo", repository]):
            _run(edged, args, env)
        _run(edged, ["token", "--state-dir", f"{tmp}/state", "list"], env)
        _serve(edged, repository, Path(tmp, "state"), env)
        # PYTHONPYCACHEPREFIX mirrors each source's absolute directory: <prefix>/<dir>/<name>.cpython-3X.pyc.
        tag = sys.implementation.cache_tag
        for pyc in sorted(prefix.rglob(f"*.{tag}.pyc")):
            source = Path("/", pyc.parent.relative_to(prefix), pyc.name.removesuffix(f".{tag}.pyc") + ".py")
            if source.is_relative_to(venv) and source.is_file():
                print(source)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
