"""Coverage-guided fuzzing (atheris, libFuzzer) of the parsers of bytes a client or a model folder hands edged.

Targets:

- ``http-body``: an HTTP infer body, its Inference-Header-Content-Length (the first input byte picks one: none, the
  JSON's true length, or one of the fuzzer's choosing), then the request validated against a model with inputs of
  several types, where every binary blob meets its shape and BYTES prefixes are split;
- ``bytes``: a BYTES tensor's length-prefixed elements, with and without an element limit;
- ``config``: config.pbtxt text as the repository reads it (UTF-8), parsed, given its defaults, validated and
  compiled into the signature requests are checked against.

A target passes an input when it parses, or is refused with EdgedError carrying a code a client may be given;
any other exception, a hang (``--timeout`` seconds on one input) or running out of memory is a finding. Each target
runs in its own process for ``--seconds``; libFuzzer stops a target at its first finding and writes the input to
``<out>/<target>/crash-*`` (or ``timeout-*``, ``oom-*``), which ``--target NAME --replay FILE`` runs again.

Run it through ``scripts/fuzz``, which installs atheris (the ``fuzz`` extra) on first use::

    scripts/fuzz                          # every target, 60 s each
    scripts/fuzz --seconds 10 --target bytes
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from edged.core.request.validation import ModelSignature

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
DEFAULT_OUT: Final = REPO_ROOT / "fuzz-findings"

# JSON structure errors carry Triton's INTERNAL code (HTTP 500) on purpose; everything else a client sends wrong is
# INVALID_ARG, or UNSUPPORTED for what edged does not offer.
CLIENT_CODES: Final = frozenset({"INVALID_ARG", "INTERNAL", "UNSUPPORTED"})
_EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_ARTIFACT = re.compile(r"^(crash|timeout|oom|leak|slow-unit)-[0-9a-f]+$")


# --- the targets (run inside the fuzzing process) ----------------------------------------------------------


def _http_body(data: bytes) -> None:
    from edged.core.request.validation import validate_request
    from edged.frontends.http.codec import decode_infer_request, parse_header_length

    if not data:
        return
    mode, body = data[0], data[1:]
    claimed: str | None
    if mode % 3 == 0:
        claimed = None
    elif mode % 3 == 1:
        # The JSON's own length, so the fuzzer reaches the binary blobs behind a header it has made valid.
        end = body.find(b"}\n")
        claimed = str(end + 1 if end >= 0 else len(body))
    else:
        claimed = str(int.from_bytes(body[:2], "little")) if len(body) >= 2 else body.decode("latin-1")
        body = body[2:]
    header_length = parse_header_length(claimed, len(body))
    request, _ = decode_infer_request("m", -1, body, header_length)
    for tensor in request.inputs:
        if isinstance(tensor.raw, memoryview) and tensor.raw.obj is not body:
            raise AssertionError("a binary input is not a view over the body")
    validate_request(_signature(), request)


def _bytes(data: bytes) -> None:
    import numpy as np

    from edged.core.request.tensors import deserialize_bytes_tensor, serialize_bytes_tensor

    if not data:
        return
    limit = None if data[0] == 0xFF else data[0] % 16
    view = memoryview(data)[1:]
    elements = deserialize_bytes_tensor(view, "X", limit)
    array = np.empty(len(elements), dtype=np.object_)
    array[:] = elements
    consumed = serialize_bytes_tensor(array)
    if not bytes(view).startswith(consumed) or (limit is None and len(consumed) != len(view)):
        raise AssertionError("the elements read are not the buffer they were read from")


def _config(data: bytes) -> None:
    from edged.core.config.defaults import normalize_model_config
    from edged.core.config.model_config import parse_model_config
    from edged.core.config.validation import validate_model_config
    from edged.core.request.validation import ModelSignature

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # the repository refuses such a file before parsing it
    config = parse_model_config(text, "m/config.pbtxt")
    normalize_model_config(config, ())
    validate_model_config(config)
    ModelSignature.from_config(config)


@functools.cache
def _signature() -> ModelSignature:
    """A batching model with inputs of several types, one of them optional."""
    from edged.core.request.validation import ModelSignature, TensorSpec

    inputs = {
        "F": TensorSpec("F", "FP32", (-1,)),
        "I": TensorSpec("I", "INT64", (2, -1)),
        "B": TensorSpec("B", "BYTES", (-1,)),
        "O": TensorSpec("O", "BOOL", (1,), optional=True),
    }
    return ModelSignature("m", 4, inputs, {"OUT": TensorSpec("OUT", "FP32", (-1,))}, ("F",))


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]


def _http_seeds() -> list[bytes]:
    import msgspec
    import numpy as np

    from edged.core.request.tensors import array_to_binary

    floats = np.arange(4, dtype=np.float32)
    texts = np.array([b"edge", b"", b"\xff"], dtype=np.object_)
    header = {
        "id": "1",
        "inputs": [
            {"name": "F", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
            {"name": "B", "datatype": "BYTES", "shape": [1, 3], "parameters": {"binary_data_size": 17}},
        ],
        "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}],
    }
    binary = msgspec.json.encode(header) + b"\n" + bytes(array_to_binary(floats, "FP32"))
    binary += bytes(array_to_binary(texts, "BYTES"))
    json_only = msgspec.json.encode(
        {
            "inputs": [
                {"name": "F", "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2]},
                {"name": "I", "datatype": "INT64", "shape": [1, 2, 1], "data": [[[1], [2]]]},
                {"name": "O", "datatype": "BOOL", "shape": [1, 1], "data": [True]},
            ],
            "parameters": {"sequence_start": True, "binary_data_output": False},
        }
    )
    return [b"\x01" + binary, b"\x00" + json_only, b"\x02\x05\x00" + json_only]


def _bytes_seeds() -> list[bytes]:
    return [b"\xff\x04\x00\x00\x00edge\x00\x00\x00\x00", b"\x01\x01\x00\x00\x00a\x02\x00\x00\x00bc"]


def _config_seeds() -> list[bytes]:
    seeds = [path.read_bytes() for path in sorted((REPO_ROOT / "model_repository").glob("*/config.pbtxt"))]
    python_models = REPO_ROOT / "tests" / "testdata" / "python_models"
    seeds += [path.read_bytes() for path in sorted(python_models.glob("*/config.pbtxt"))]
    return seeds


TARGETS: Final[dict[str, Target]] = {
    "http-body": Target("http-body", _http_body, _http_seeds),
    "bytes": Target("bytes", _bytes, _bytes_seeds),
    "config": Target("config", _config, _config_seeds),
}


def _checked(run: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """The target, with every refusal that is not a client's error turned into a finding."""
    from edged.errors import EdgedError

    def one_input(data: bytes) -> None:
        try:
            run(data)
        except EdgedError as exc:
            if exc.code.name not in CLIENT_CODES:
                raise AssertionError(f"refused with a code no client should see: {exc!r}") from exc

    return one_input


def fuzz_in_this_process(name: str, libfuzzer_args: list[str]) -> None:
    """Runs one target under libFuzzer; returns only through libFuzzer's exit."""
    import atheris

    # Instrumented for coverage: edged, and protobuf's text parser (config.pbtxt is read by it).
    with atheris.instrument_imports(include=["edged", "google.protobuf.text_format"]):
        import edged.core.config.defaults
        import edged.core.config.model_config
        import edged.core.config.validation
        import edged.core.request.tensors
        import edged.core.request.validation
        import edged.frontends.http.codec  # noqa: F401

    atheris.Setup([sys.argv[0], *libfuzzer_args], _checked(TARGETS[name].run))
    atheris.Fuzz()


# --- the driver -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    target: str
    seconds: float
    executions: int
    findings: list[Path]
    status: int


def run_target(name: str, seconds: int, timeout_s: int, out: Path) -> Outcome:
    findings_dir = out / name
    findings_dir.mkdir(parents=True, exist_ok=True)
    before = {path.name for path in findings_dir.iterdir()}
    with tempfile.TemporaryDirectory(prefix=f"edged-fuzz-{name}-") as scratch:
        corpus = Path(scratch) / "corpus"
        corpus.mkdir()
        for index, seed in enumerate(TARGETS[name].seeds()):
            (corpus / f"seed-{index}").write_bytes(seed)
        args = [
            f"-max_total_time={seconds}",
            f"-timeout={timeout_s}",
            "-rss_limit_mb=2048",
            "-print_final_stats=1",
            f"-artifact_prefix={findings_dir}/",
            str(corpus),
        ]
        started = time.monotonic()
        process = subprocess.run(
            [sys.executable, __file__, "--in-process", name, "--", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
        )
        elapsed = time.monotonic() - started
    log = process.stdout + process.stderr
    (findings_dir / "last-run.log").write_text(log, encoding="utf-8")
    executed = [int(n) for n in _EXECUTED.findall(log)]
    new = sorted(p for p in findings_dir.iterdir() if p.name not in before and _ARTIFACT.match(p.name))
    return Outcome(name, elapsed, executed[-1] if executed else 0, new, process.returncode)


def replay(name: str, path: Path) -> int:
    """Runs one input through a target without the fuzzer, so its traceback shows where it fails."""
    _checked(TARGETS[name].run)(path.read_bytes())
    print(f"fuzz: {name}: {path} passes")
    return 0


def main(argv: list[str] | None = None) -> int:
    # This checkout's edged, whatever the virtualenv's editable install points at.
    sys.path.insert(0, str(REPO_ROOT))
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--in-process"]:
        separator = args_in.index("--")
        fuzz_in_this_process(args_in[1], args_in[separator + 1 :])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=60, help="how long each target runs (default 60)")
    parser.add_argument("--target", choices=sorted(TARGETS), action="append", help="only this target (repeatable)")
    parser.add_argument("--timeout", type=int, default=5, help="seconds one input may take before it is a hang")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where findings go (default fuzz-findings/)")
    parser.add_argument("--replay", type=Path, help="run this one input through --target instead of fuzzing")
    args = parser.parse_args(args_in)
    names = args.target or list(TARGETS)
    if args.replay is not None:
        if len(names) != 1:
            parser.error("--replay needs exactly one --target")
        return replay(names[0], args.replay)

    if importlib.util.find_spec("atheris") is None:
        print("fuzz: atheris is not installed: run scripts/fuzz, which installs the 'fuzz' extra", file=sys.stderr)
        return 2
    failed = False
    print(f"{'target':<10} {'seconds':>8} {'executions':>11} {'exec/s':>8}  findings")
    for name in names:
        outcome = run_target(name, args.seconds, args.timeout, args.out)
        rate = outcome.executions / outcome.seconds if outcome.seconds else 0.0
        found = ", ".join(
            str(p.relative_to(Path.cwd()) if p.is_relative_to(Path.cwd()) else p) for p in outcome.findings
        )
        print(f"{name:<10} {outcome.seconds:8.1f} {outcome.executions:11d} {rate:8.0f}  {found or 'none'}", flush=True)
        if outcome.findings or outcome.status != 0:
            failed = True
            if not outcome.findings:
                print(f"fuzz: {name} exited with status {outcome.status}; see {args.out / name / 'last-run.log'}")
    if failed:
        print(f"fuzz: FINDINGS; replay one with: scripts/fuzz --target NAME --replay FILE (logs in {args.out}/)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
