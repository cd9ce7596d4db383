"""The daemon's settings, as the command line gives them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from edged.metrics.config import MetricsConfig, parse_metrics_config
from edged.state.directory import default_state_dir


@dataclass(frozen=True, slots=True)
class Settings:
    model_repositories: list[Path]
    server_id: str = "edged"
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    # A safety limit on every gRPC message, both ways: Triton allows INT32_MAX, more than a device should buffer.
    grpc_max_message_size: int = 64 * 1024 * 1024
    allow_client_shm: bool = False
    allow_metrics: bool = True
    metrics_address: str | None = None
    metrics_port: int = 8002
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_interval_ms: int = 2000
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    exit_on_error: bool = False
    strict_readiness: bool = True
    auto_complete_config: bool = True
    model_load_thread_count: int = 4
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    load_models: tuple[str, ...] = ()
    state_dir: Path | None = None
    default_max_batch_size: int = 4
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    log_verbose: int = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        backend_config = parse_backend_config(args.backend_config)
        default_max_batch_size = 4
        raw = backend_config.get("", {}).get("default-max-batch-size")
        if raw is not None:
            if not raw.isdigit():
                raise ValueError(f"--backend-config default-max-batch-size must be a non-negative integer: {raw}")
            default_max_batch_size = int(raw)
        for repository in args.model_repository:
            if not repository.is_dir():
                raise ValueError(f"model repository '{repository}' is not a readable directory")
        return cls(
            model_repositories=[p.resolve() for p in args.model_repository],
            server_id=args.server_id,
            http_address=args.http_address,
            http_port=args.http_port,
            http_max_input_size=args.http_max_input_size,
            allow_grpc=args.allow_grpc,
            grpc_address=args.grpc_address,
            grpc_port=args.grpc_port,
            grpc_max_message_size=args.grpc_max_message_size,
            allow_client_shm=args.allow_client_shm,
            allow_metrics=args.allow_metrics,
            metrics_address=args.metrics_address,
            metrics_port=args.metrics_port,
            allow_cpu_metrics=args.allow_cpu_metrics,
            allow_gpu_metrics=args.allow_gpu_metrics,
            metrics_interval_ms=args.metrics_interval_ms,
            metrics_config=parse_metrics_config(args.metrics_config),
            exit_on_error=args.exit_on_error,
            strict_readiness=args.strict_readiness,
            auto_complete_config=not args.disable_auto_complete_config,
            model_load_thread_count=args.model_load_thread_count,
            model_control_mode=args.model_control_mode,
            repository_poll_secs=args.repository_poll_secs,
            load_models=tuple(args.load_model),
            state_dir=args.state_dir.resolve() if args.state_dir is not None else default_state_dir(),
            default_max_batch_size=default_max_batch_size,
            backend_config=backend_config,
            log_verbose=args.log_verbose,
        )


def parse_backend_config(values: list[str]) -> dict[str, dict[str, str]]:
    """``backend,key=value`` or ``key=value`` (global, under the key "") as Triton's --backend-config."""
    out: dict[str, dict[str, str]] = {}
    for value in values:
        backend, _, setting = value.rpartition(",")
        key, sep, item = setting.partition("=")
        if not sep or not key:
            raise ValueError(f"--backend-config expects [BACKEND,]KEY=VALUE, got '{value}'")
        out.setdefault(backend, {})[key] = item
    return out
