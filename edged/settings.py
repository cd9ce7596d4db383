"""The daemon's settings, as edged.config layers them from defaults, a file, the environment and flags."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.frontends.metrics.config import MetricsConfig, parse_metrics_config
from edged.state.directory import default_state_dir


@dataclass(frozen=True, slots=True)
class Settings:
    model_repositories: list[Path]
    server_id: str = "edged"
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    http_max_connections: int = 1024
    http_header_timeout_secs: float = 10.0
    http_body_timeout_secs: float = 30.0
    http_min_body_rate: int = 1024
    http_keepalive_timeout_secs: float = 30.0
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_max_connections: int = 1024
    grpc_handshake_timeout_secs: float = 10.0
    grpc_idle_timeout_secs: float = 600.0
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
    # On shutdown, how long in-flight requests may take to finish before the daemon exits anyway.
    exit_timeout_secs: float = 30.0
    log_verbose: int = 0
    # The configuration file these settings were read from, if any (edged.config.resolve).
    config_file: Path | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        """From a namespace that holds every option, as ``build_parser()`` parses the command line alone."""
        return cls.from_options(vars(args), os.environ)

    @classmethod
    def from_options(
        cls, values: Mapping[str, Any], environ: Mapping[str, str], config_file: Path | None = None
    ) -> Settings:
        """From every option's checked value, keyed as edged.options.OPTIONS names them (``http_port``).

        Raises ValueError with one line for a value that cannot be served (no repository, or one that is gone).
        """
        repositories = [Path(p) for p in values["model_repository"]]
        if not repositories:
            raise ValueError("no model repository: give --model-repository PATH")
        for repository in repositories:
            if not repository.is_dir():
                raise ValueError(f"model repository '{repository}' is not a readable directory")
        backend_config = parse_backend_config(values["backend_config"])
        default_max_batch_size = 4
        raw = backend_config.get("", {}).get("default-max-batch-size")
        if raw is not None:
            if not raw.isdigit():
                raise ValueError(f"--backend-config default-max-batch-size must be a non-negative integer: {raw}")
            default_max_batch_size = int(raw)
        state_dir = values["state_dir"]
        return cls(
            model_repositories=[p.resolve() for p in repositories],
            server_id=values["id"],
            http_address=values["http_address"],
            http_port=values["http_port"],
            http_max_input_size=values["http_max_input_size"],
            http_max_connections=values["http_max_connections"],
            http_header_timeout_secs=float(values["http_header_timeout_secs"]),
            http_body_timeout_secs=float(values["http_body_timeout_secs"]),
            http_min_body_rate=values["http_min_body_rate"],
            http_keepalive_timeout_secs=float(values["http_keepalive_timeout_secs"]),
            allow_grpc=values["allow_grpc"],
            grpc_address=values["grpc_address"],
            grpc_port=values["grpc_port"],
            grpc_max_connections=values["grpc_max_connections"],
            grpc_handshake_timeout_secs=float(values["grpc_handshake_timeout_secs"]),
            grpc_idle_timeout_secs=float(values["grpc_idle_timeout_secs"]),
            grpc_max_message_size=values["grpc_max_message_size"],
            allow_client_shm=values["allow_client_shm"],
            allow_metrics=values["allow_metrics"],
            metrics_address=values["metrics_address"],
            metrics_port=values["metrics_port"],
            allow_cpu_metrics=values["allow_cpu_metrics"],
            allow_gpu_metrics=values["allow_gpu_metrics"],
            metrics_interval_ms=values["metrics_interval_ms"],
            metrics_config=parse_metrics_config(values["metrics_config"]),
            exit_on_error=values["exit_on_error"],
            strict_readiness=values["strict_readiness"],
            auto_complete_config=not values["disable_auto_complete_config"],
            model_load_thread_count=values["model_load_thread_count"],
            model_control_mode=values["model_control_mode"],
            repository_poll_secs=float(values["repository_poll_secs"]),
            load_models=tuple(values["load_model"]),
            state_dir=Path(state_dir).resolve() if state_dir is not None else default_state_dir(environ),
            default_max_batch_size=default_max_batch_size,
            backend_config=backend_config,
            exit_timeout_secs=float(values["exit_timeout_secs"]),
            log_verbose=values["log_verbose"],
            config_file=config_file,
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
