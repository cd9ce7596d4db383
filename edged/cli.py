"""The `edged` command: argument parsing only; the work happens in edged.daemon and edged.core."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edged import __version__
from edged.settings import Settings

_TRUE = {"true", "on", "1", "yes"}
_FALSE = {"false", "off", "0", "no"}


def parse_bool(text: str) -> bool:
    """Triton's boolean flag values: true/false/on/off/1/0, any case."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/on/off/1/0), got '{text}'")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got '{text}'") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is outside 0-65535")
    return value


def _poll_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got '{text}'") from None
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"expected between 0.1 and 86400 seconds, got '{text}'")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def _message_size(text: str) -> int:
    # gRPC keeps message sizes in a signed 32-bit int.
    value = _positive(text)
    if value > 2**31 - 1:
        raise argparse.ArgumentTypeError(f"a gRPC message size is at most 2147483647 bytes, got '{text}'")
    return value


def _bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help_text: str) -> None:
    # `--flag` alone means true, `--flag=false` turns it off, as Triton's flags read.
    parser.add_argument(
        name,
        type=parse_bool,
        nargs="?",
        const=True,
        default=default,
        metavar="BOOL",
        help=f"{help_text} (default: {str(default).lower()})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edged", description="Inference server for edge appliances.")
    parser.add_argument("--version", action="version", version=f"edged {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve model repositories over HTTP and gRPC (KServe v2)")
    serve.add_argument(
        "--model-repository",
        "--model-store",
        dest="model_repository",
        action="append",
        type=Path,
        required=True,
        metavar="PATH",
        help="a model repository (repeatable)",
    )
    serve.add_argument("--id", dest="server_id", default="edged", help="server name in GET /v2")
    serve.add_argument("--http-address", default="0.0.0.0", help="address the HTTP endpoint binds")
    serve.add_argument("--http-port", type=_port, default=8000)
    serve.add_argument(
        "--http-max-input-size",
        type=_positive,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="largest request body accepted",
    )
    _bool_flag(serve, "--allow-grpc", True, "serve KServe v2 over gRPC")
    serve.add_argument("--grpc-address", default="0.0.0.0", help="address the gRPC endpoint binds")
    serve.add_argument("--grpc-port", type=_port, default=8001)
    serve.add_argument(
        "--grpc-max-message-size",
        type=_message_size,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="largest gRPC message received or sent, a safety limit (Triton allows 2147483647)",
    )
    _bool_flag(
        serve,
        "--allow-client-shm",
        False,
        "let clients register system shared memory regions for tensors (the shared memory extension)",
    )
    _bool_flag(serve, "--allow-metrics", True, "serve Prometheus metrics")
    serve.add_argument("--metrics-address", default=None, help="defaults to the HTTP address")
    serve.add_argument("--metrics-port", type=_port, default=8002)
    _bool_flag(serve, "--allow-cpu-metrics", True, "report CPU utilization and memory")
    _bool_flag(serve, "--allow-gpu-metrics", True, "report NVIDIA GPU utilization, memory and power (when present)")
    serve.add_argument(
        "--metrics-interval-ms",
        type=_positive,
        default=2000,
        metavar="MS",
        help="how often the CPU and GPU metrics are refreshed",
    )
    serve.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="counter_latencies, histogram_latencies, summary_latencies (true/false), summary_quantiles (q:e,...)",
    )
    _bool_flag(serve, "--exit-on-error", False, "exit when a model fails to load at start-up")
    _bool_flag(serve, "--strict-readiness", True, "ready only when every model is ready")
    serve.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="require complete config.pbtxt files instead of reading missing fields from models",
    )
    serve.add_argument("--model-load-thread-count", type=_positive, default=4)
    serve.add_argument(
        "--model-control-mode",
        choices=("none", "poll", "explicit"),
        default="none",
        help="none: load every model at start; poll: also follow changes; explicit: the load/unload API decides",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=_poll_seconds,
        default=15.0,
        metavar="SECONDS",
        help="how often poll mode scans the repositories",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="explicit mode: a model to load at start (repeatable; '*' loads every model)",
    )
    serve.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where the state database and private model copies live (default: $EDGED_STATE_DIR, "
        "/var/lib/edged under systemd, ~/.local/state/edged otherwise)",
    )
    serve.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[BACKEND,]KEY=VALUE",
        help="backend settings, e.g. default-max-batch-size=8",
    )
    serve.add_argument("--log-verbose", type=int, default=0, metavar="LEVEL")

    check = commands.add_parser("check-repo", help="validate a model repository offline")
    check.add_argument("repository", type=Path, nargs="+")
    check.add_argument("--disable-auto-complete-config", action="store_true")

    commands.add_parser("devices", help="print the devices model instances can run on (CPUs, GPUs, plug-ins' NPUs)")
    commands.add_parser("version", help="print the version")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"edged {__version__}")
        return 0
    if args.command == "devices":
        from edged.core.devices import DeviceInventory

        print(DeviceInventory.discover().describe())
        return 0
    if args.command == "check-repo":
        import logging

        from edged.core.repository_manager import check_repositories

        # The problems are the output; the loaders' own log lines would only repeat them.
        logging.disable(logging.CRITICAL)

        problems = check_repositories(list(args.repository), auto_complete=not args.disable_auto_complete_config)
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    try:
        settings = Settings.from_args(args)
    except ValueError as exc:
        print(f"edged: {exc}", file=sys.stderr)
        return 1
    from edged.daemon import run

    return run(settings)
