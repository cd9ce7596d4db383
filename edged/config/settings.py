"""The daemon's settings, as edged.config layers them from defaults, a file, the environment and flags."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from edged.config.cache import cache_size
from edged.config.options import BY_KEY, OPTIONS
from edged.config.values import is_remote, parse_rate, parse_rate_limit_resource
from edged.core.access import (
    AccessOptions,
    parse_categories,
    parse_certificate_role,
    parse_restricted,
    restricted_by_category,
)
from edged.frontends.metrics.config import MetricsConfig, parse_metrics_config
from edged.state.directory import default_state_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Settings:
    """The daemon's settings: one field per option of edged.config.options.OPTIONS (same name, no default of its own:
    defaults, limits and help live in that table only), and the few fields derived from options (``_DERIVED``).
    Build it with ``from_options`` or ``defaults``."""

    model_repositories: list[Path]
    server_id: str
    http_address: str
    http_port: int
    http_max_input_size: int
    http_max_connections: int
    upload_max_bytes: int
    upload_max_extracted_bytes: int
    http_header_timeout_secs: float
    http_body_timeout_secs: float
    http_min_body_rate: int
    http_keepalive_timeout_secs: float
    http_max_json_depth: int
    http_max_chunks: int
    grpc_max_queued_stream_bytes: int
    frontend_workers: int
    allow_grpc: bool
    grpc_address: str
    grpc_port: int
    grpc_max_connections: int
    grpc_handshake_timeout_secs: float
    grpc_idle_timeout_secs: float
    grpc_body_timeout_secs: float
    grpc_min_body_rate: int
    grpc_max_buffered_bytes: int
    grpc_max_message_size: int
    access: AccessOptions
    grpc_use_ssl: bool
    grpc_use_ssl_mutual: bool
    grpc_server_cert: Path | None
    grpc_server_key: Path | None
    grpc_root_cert: Path | None
    http_use_ssl: bool
    http_use_ssl_mutual: bool
    http_server_cert: Path | None
    http_server_key: Path | None
    http_root_cert: Path | None
    metrics_use_ssl: bool
    allow_client_shm: bool
    http_header_forward_pattern: str | None
    grpc_header_forward_pattern: str | None
    grpc_max_response_pool_size: int
    allow_metrics: bool
    metrics_address: str | None
    metrics_port: int
    allow_console: bool
    console_address: str | None
    console_port: int
    console_use_ssl: bool
    allow_cpu_metrics: bool
    allow_gpu_metrics: bool
    metrics_interval_ms: int
    metrics_config: MetricsConfig
    exit_on_error: bool
    strict_readiness: bool
    auto_complete_config: bool
    model_load_thread_count: int
    backend_directory: Path | None
    model_load_retry_count: int
    model_config_name: str | None
    model_control_mode: str
    repository_poll_secs: float
    load_models: tuple[str, ...]
    state_dir: Path | None
    history_per_model: int
    # s3:// and gs:// repositories as given (their local mirrors are in model_repositories, in the same order).
    remote_repositories: tuple[str, ...]
    sync_interval_secs: float
    sync_max_rate: int | None
    sync_trusted_root: Path | None
    sync_channel: str | None
    device_id: str
    sync_report_status: bool
    sync_probation_secs: float
    sync_max_error_rate: float
    sync_sequence_wait_secs: float
    sync_timeout_secs: float
    default_max_batch_size: int
    backend_config: dict[str, dict[str, str]]
    # --rate-limit execution_count, and each --rate-limit-resource as (name, count, device; -1: every device).
    rate_limited: bool
    rate_limit_resources: tuple[tuple[str, int, int], ...]
    # The local response cache's size in bytes (--cache-config local,size=BYTES); None: no response cache.
    cache_size: int | None
    exit_timeout_secs: float
    log_verbose: int
    log_info: bool
    log_warning: bool
    log_error: bool
    log_format: str
    log_file: Path | None
    # --trace-config as given (edged.core.tracing.parse_trace_config reads it).
    trace_config: list[str]
    # The configuration file these settings were read from, if any (edged.config.resolve).
    config_file: Path | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        """From a namespace that holds every option, as ``build_parser()`` parses the command line alone."""
        return cls.from_options(vars(args), os.environ)

    @classmethod
    def defaults(cls, repositories: list[Path], environ: Mapping[str, str]) -> Settings:
        """Every option at its default, serving ``repositories``."""
        values = {option.key: option.default_value() for option in OPTIONS}
        return cls.from_options(values | {"model_repository": repositories}, environ)

    @classmethod
    def from_options(
        cls, values: Mapping[str, Any], environ: Mapping[str, str], config_file: Path | None = None
    ) -> Settings:
        """From every option's checked value, keyed as edged.config.options.OPTIONS names them (``http_port``).

        Raises ValueError with one line for a value that cannot be served (no repository, or one that is gone).
        """
        given = [str(p) for p in values["model_repository"]]
        if not given:
            raise ValueError("no model repository: give --model-repository PATH")
        state_dir = values["state_dir"]
        state = Path(state_dir).resolve() if state_dir is not None else default_state_dir(environ)
        # A repository given twice is one repository, as Triton counts them (Triton's own tests pass one twice).
        given = list(dict.fromkeys(url if is_remote(url) else str(Path(url).resolve()) for url in given))
        remote = tuple(url for url in given if is_remote(url))
        repositories: list[Path] = []
        if remote:
            # Only for remote repositories: a device that syncs nothing loads nothing of the sync.
            from edged.sync.paths import local_repository
        for repository in given:
            if is_remote(repository):
                repositories.append(local_repository(state, repository, values["sync_channel"]))
            elif not Path(repository).is_dir():
                raise ValueError(f"model repository '{repository}' is not a readable directory")
            else:
                repositories.append(Path(repository))
        backend_config = parse_backend_config(values["backend_config"])
        default_max_batch_size = 4
        raw = backend_config.get("", {}).get("default-max-batch-size")
        if raw is not None:
            if not raw.isdigit():
                raise ValueError(f"--backend-config default-max-batch-size must be a non-negative integer: {raw}")
            default_max_batch_size = int(raw)
        derived: dict[str, Any] = {
            "model_repositories": repositories,
            "remote_repositories": remote,
            "sync_max_rate": parse_rate(values["sync_max_rate"]),
            "device_id": values["device_id"] or socket.gethostname(),
            "server_id": values["id"],
            "metrics_config": parse_metrics_config(values["metrics_config"]),
            "auto_complete_config": auto_complete(
                values["disable_auto_complete_config"], values["strict_model_config"]
            ),
            "load_models": tuple(values["load_model"]),
            "state_dir": state,
            "default_max_batch_size": default_max_batch_size,
            "backend_config": backend_config,
            "rate_limited": str(values["rate_limit"]).lower() == "execution_count",
            "rate_limit_resources": tuple(parse_rate_limit_resource(text) for text in values["rate_limit_resource"]),
            "cache_size": cache_size(values["cache_config"]),
            "access": access_options(values),
            "config_file": config_file,
        }
        plain: dict[str, Any] = {
            name: float(values[name]) if BY_KEY[name].kind == "float" else values[name]
            for name in (item.name for item in dataclasses.fields(cls))
            if name not in derived
        }
        return cls(**plain, **derived)


# Options that reach the settings under another name or through a conversion, and the fields they make.
DERIVED: Final = {
    "model_repository": "model_repositories",
    "sync_max_rate": "sync_max_rate",
    "device_id": "device_id",
    "id": "server_id",
    "metrics_config": "metrics_config",
    "disable_auto_complete_config": "auto_complete_config",
    "strict_model_config": "auto_complete_config",
    "load_model": "load_models",
    "state_dir": "state_dir",
    "backend_config": "backend_config",
    "rate_limit": "rate_limited",
    "rate_limit_resource": "rate_limit_resources",
    "cache_config": "cache_size",
    "http_restricted_api": "access",
    "grpc_restricted_protocol": "access",
    "guarded_apis": "access",
    "trust_loopback": "access",
    "client_certificate_role": "access",
}


def auto_complete(disable: bool, strict: bool | None) -> bool:
    """Whether configs are completed from the models: Triton's rule for its two flags, with its warnings."""
    if strict is not None:
        log.warning(
            "Warning: '--strict-model-config' has been deprecated! Please use '--disable-auto-complete-config' instead."
        )
    if disable:
        if strict is False:
            log.warning(
                "Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
                "'--disable-auto-complete-config'!"
            )
        return False
    return not strict


def access_options(values: Mapping[str, Any]) -> AccessOptions:
    """The access policy's options; ValueError when a category is in two restricted groups of one wire."""
    options = AccessOptions(
        http_restricted=tuple(parse_restricted(text, grpc=False) for text in values["http_restricted_api"]),
        grpc_restricted=tuple(parse_restricted(text, grpc=True) for text in values["grpc_restricted_protocol"]),
        guarded=parse_categories(values["guarded_apis"]),
        trust_loopback=values["trust_loopback"],
        certificate_roles=dict(parse_certificate_role(text) for text in values["client_certificate_role"]),
    )
    for flag, groups in (
        ("--http-restricted-api", options.http_restricted),
        ("--grpc-restricted-protocol", options.grpc_restricted),
    ):
        try:
            restricted_by_category(groups)
        except ValueError as error:
            raise ValueError(f"{flag}: {error}") from None
    return options


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
