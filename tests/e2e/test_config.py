"""Layered configuration: defaults < config file < ``EDGED_*`` environment < flags, ``edged config``, the packaged
``edged.toml``, and a daemon configured by its file alone."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from server import REPO_ROOT, STARTUP_TIMEOUT_S, TRACEBACK_MARKER, free_ports, request

import edged.config
from edged.config import ConfigError, load, resolve, template
from edged.config.options import BY_KEY, OPTIONS
from edged.config.settings import DERIVED, Settings
from edged.state.directory import default_state_dir

TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def _no_system_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The in-process tests must not read an /etc/edged/edged.toml that this machine may have.
    monkeypatch.setattr(edged.config, "DEFAULT_CONFIG_FILE", tmp_path / "etc" / "edged.toml")


def _repos(tmp_path: Path, *names: str) -> list[Path]:
    paths = [tmp_path / name for name in names]
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
    return paths


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- precedence ---------------------------------------------------------------------------------------------


def test_defaults_match_the_settings_dataclass(tmp_path: Path) -> None:
    [repo] = _repos(tmp_path, "repo")
    environ = {"HOME": str(tmp_path)}
    settings = resolve(["--model-repository", str(repo)], environ)
    bare = Settings.defaults([repo], environ)
    assert settings == bare
    assert settings.state_dir == default_state_dir(environ)
    assert settings.http_port == 8000 and settings.grpc_max_connections == 1024
    assert settings.exit_timeout_secs == 30.0
    assert settings.config_file is None


# (option key, Settings attribute, TOML literal in the file, the value it gives, env text, its value, flags, value)
PRECEDENCE: list[tuple[str, str, str, Any, str, Any, list[str], Any]] = [
    ("http_port", "http_port", "9000", 9000, "9100", 9100, ["--http-port", "9200"], 9200),
    ("allow_grpc", "allow_grpc", "false", False, "on", True, ["--allow-grpc=0"], False),
    ("allow_client_shm", "allow_client_shm", '"on"', True, "false", False, ["--allow-client-shm"], True),
    ("exit_timeout_secs", "exit_timeout_secs", "5", 5.0, "2.5", 2.5, ["--exit-timeout-secs", "0"], 0.0),
    ("id", "server_id", '"from-file"', "from-file", "from-env", "from-env", ["--id", "from-flag"], "from-flag"),
    ("model_control_mode", "model_control_mode", '"poll"', "poll", "explicit", "explicit", [], "explicit"),
    ("load_model", "load_models", '["a"]', ("a",), "b:c", ("b", "c"), ["--load-model", "d", "--load-model", "e"],
     ("d", "e")),
]  # fmt: skip


@pytest.mark.parametrize(("key", "attribute", "literal", "in_file", "env", "in_env", "flags", "in_flags"), PRECEDENCE)
def test_each_layer_overrides_the_one_below(
    tmp_path: Path,
    key: str,
    attribute: str,
    literal: str,
    in_file: Any,
    env: str,
    in_env: Any,
    flags: list[str],
    in_flags: Any,
) -> None:
    [repo] = _repos(tmp_path, "repo")
    option = BY_KEY[key]
    base = ["--model-repository", str(repo)]
    default = getattr(resolve(base, {}), attribute)
    assert default == (tuple(option.default) if option.repeatable else option.default)
    config = _write(tmp_path / "edged.toml", f"{key} = {literal}\n")
    environ = {"EDGED_CONFIG": str(config)}
    from_file = resolve(base, environ)
    assert getattr(from_file, attribute) == in_file != default
    assert from_file.config_file == config
    environ[option.env] = env
    assert getattr(resolve(base, environ), attribute) == in_env != in_file
    if flags:
        assert getattr(resolve([*base, *flags], environ), attribute) == in_flags != in_env


def test_the_deprecated_strict_flag_warns_as_triton_does(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (repo,) = _repos(tmp_path, "repo")
    with caplog.at_level(logging.WARNING, logger="edged.config.settings"):
        resolve(["--model-store", str(repo), "--disable-auto-complete-config", "--strict-model-config=false"], {})
    assert caplog.messages == [
        "Warning: '--strict-model-config' has been deprecated! Please use '--disable-auto-complete-config' instead.",
        "Warning: Overriding deprecated '--strict-model-config' from False to True in favor of "
        "'--disable-auto-complete-config'!",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edged.config.settings"):
        resolve(["--model-store", str(repo), "--disable-auto-complete-config"], {})
    assert caplog.messages == []


def test_model_repositories_and_relative_paths_per_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc = tmp_path / "etc"
    a, b, c, d = _repos(tmp_path, "etc/models", "b", "c", "d")
    # Paths in the file are relative to the file; in the environment and on the command line, to the cwd.
    config = _write(etc / "edged.toml", 'model_repository = ["models"]\nstate_dir = "state"\n')
    monkeypatch.chdir(tmp_path)
    environ = {"EDGED_CONFIG": str(config)}
    settings = resolve([], environ)
    assert settings.model_repositories == [a.resolve()]
    assert settings.state_dir == (etc / "state").resolve()
    environ |= {"EDGED_MODEL_REPOSITORY": f"b:{c}", "EDGED_STATE_DIR": "env-state"}
    settings = resolve([], environ)
    assert settings.model_repositories == [b.resolve(), c.resolve()]
    assert settings.state_dir == (tmp_path / "env-state").resolve()
    # A list on a higher layer replaces the one below, as a scalar does: it is not appended to.
    settings = resolve(["--model-store", "d", "--state-dir", str(tmp_path / "flag-state")], environ)
    assert settings.model_repositories == [d.resolve()]
    assert settings.state_dir == (tmp_path / "flag-state").resolve()
    # The same folder twice, however spelt, is one repository (Triton's own tests pass one twice).
    assert resolve(["--model-repository", "d", "--model-repository", str(d)], environ).model_repositories == [
        d.resolve()
    ]
    # Triton's older name of --disable-auto-complete-config, which its tests still pass; the new flag wins.
    assert resolve(["--model-store", "d", "--strict-model-config=true"], environ).auto_complete_config is False
    assert resolve(["--model-store", "d", "--strict-model-config=false"], environ).auto_complete_config is True
    for both in (
        ["--model-store", "d", "--disable-auto-complete-config", "--strict-model-config=false"],
        ["--model-store", "d", "--strict-model-config=false", "--disable-auto-complete-config"],
    ):
        assert resolve(both, environ).auto_complete_config is False


def test_the_default_file_is_read_when_it_exists(tmp_path: Path) -> None:
    [repo] = _repos(tmp_path, "repo")
    default_file = edged.config.DEFAULT_CONFIG_FILE
    assert resolve(["--model-repository", str(repo)], {}).http_port == 8000
    default_file.parent.mkdir(parents=True)
    _write(default_file, f'model_repository = ["{repo}"]\nhttp_port = 1234\n')
    settings = resolve([], {})
    assert (settings.http_port, settings.config_file) == (1234, default_file)
    # EDGED_CONFIG names another file instead, and --config beats both.
    other = _write(tmp_path / "other.toml", f'model_repository = ["{repo}"]\nhttp_port = 2345\n')
    third = _write(tmp_path / "third.toml", f'model_repository = ["{repo}"]\nhttp_port = 3456\n')
    assert resolve([], {"EDGED_CONFIG": str(other)}).http_port == 2345
    assert resolve(["--config", str(third)], {"EDGED_CONFIG": str(other)}).http_port == 3456
    assert resolve(["serve", "--config", str(third)], {}).http_port == 3456


def test_env_lists(tmp_path: Path) -> None:
    [repo] = _repos(tmp_path, "repo")
    base = ["--model-repository", str(repo)]

    def backend_config(text: str) -> dict[str, dict[str, str]]:
        return resolve(base, {"EDGED_BACKEND_CONFIG": text}).backend_config

    def load_models(text: str) -> tuple[str, ...]:
        return resolve(base, {"EDGED_LOAD_MODEL": text}).load_models

    assert load_models("a") == ("a",)
    assert load_models("a:b::c:") == ("a", "b", "c")
    assert load_models('["x:1", "y"]') == ("x:1", "y")
    assert backend_config("python,stub-timeout-seconds=7:default-max-batch-size=8") == {
        "python": {"stub-timeout-seconds": "7"},
        "": {"default-max-batch-size": "8"},
    }
    quantiles = resolve(base, {"EDGED_METRICS_CONFIG": '["summary_quantiles=0.5:0.05,0.9:0.01"]'})
    assert quantiles.metrics_config.summary_quantiles == ((0.5, 0.05), (0.9, 0.01))
    # An empty variable is unset: the layer below shows through.
    assert load_models("") == ()
    assert resolve(base, {"EDGED_HTTP_PORT": ""}).http_port == 8000


@pytest.mark.parametrize(
    ("toml", "env", "flag", "expected"),
    [
        ("true", "1", "--strict-readiness=yes", True),
        ('"off"', "OFF", "--strict-readiness=0", False),
        ('"1"', "on", "--strict-readiness", True),
    ],
)
def test_triton_booleans_everywhere(tmp_path: Path, toml: str, env: str, flag: str, expected: bool) -> None:
    [repo] = _repos(tmp_path, "repo")
    config = _write(tmp_path / "edged.toml", f'model_repository = ["{repo}"]\nstrict_readiness = {toml}\n')
    assert resolve(["--config", str(config)], {}).strict_readiness is expected
    assert resolve(["--model-repository", str(repo)], {"EDGED_STRICT_READINESS": env}).strict_readiness is expected
    assert resolve(["--model-repository", str(repo), flag], {}).strict_readiness is expected


def test_sources_are_recorded(tmp_path: Path) -> None:
    [repo] = _repos(tmp_path, "repo")
    config = _write(tmp_path / "edged.toml", f'model_repository = ["{repo}"]\nhttp_port = 9000\ngrpc_port = 9001\n')
    layered = load(["--grpc-port", "9101"], {"EDGED_CONFIG": str(config), "EDGED_ALLOW_GRPC": "false"})
    assert layered.sources["model_repository"] == str(config)
    assert layered.sources["http_port"] == str(config)
    assert layered.sources["grpc_port"] == "--grpc-port"
    assert layered.sources["allow_grpc"] == "EDGED_ALLOW_GRPC"
    assert layered.sources["metrics_port"] == "default"


def test_resolve_raises_instead_of_exiting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        resolve([], {})
    assert missing.value.status == 2
    with pytest.raises(ConfigError, match=r"^--http-port: 70000 is outside 0-65535$") as bad:
        resolve(["--model-repository", str(tmp_path), "--http-port", "70000"], {})
    assert bad.value.status == 1
    with pytest.raises(ConfigError, match="unrecognized arguments: --no-such-flag"):
        resolve(["--model-repository", str(tmp_path), "--no-such-flag"], {})


def test_the_settings_fields_are_the_options() -> None:
    """One field per option, of the same name, unless the option is derived into another (settings.DERIVED)."""
    # remote_repositories: the s3:// and gs:// values of model_repository, whose local mirrors it lists.
    fields = {item.name for item in dataclasses.fields(Settings)} - {
        "config_file",
        "default_max_batch_size",
        "remote_repositories",
    }
    assert fields == {DERIVED.get(option.key, option.key) for option in OPTIONS}


def test_every_option_reaches_the_settings(tmp_path: Path) -> None:
    """A key that is parsed but never read would be a setting that silently does nothing."""
    [repo] = _repos(tmp_path, "repo")
    base = Settings.from_options(
        {option.key: option.default_value() for option in OPTIONS} | {"model_repository": [repo]}, {}
    )
    changed: dict[str, Any] = {
        "model_repository": [tmp_path],
        "metrics_config": ["summary_latencies=true"],
        "load_model": ["m"],
        "state_dir": tmp_path / "s",
        "backend_config": ["python,k=v"],
        "metrics_address": "127.0.0.2",
        "model_control_mode": "poll",
        "http_restricted_api": ["logging:k=v"],
        "grpc_restricted_protocol": ["logging:k=v"],
        "guarded_apis": "none",
        "client_certificate_role": ["camera=viewer"],
        "sync_max_rate": "2M",
        "sync_channel": "canary",
        "device_id": "kiosk-1",
        "cache_config": ["local,size=1024"],
        "rate_limit": "execution_count",
        "rate_limit_resource": ["R:1"],
    }
    for option in OPTIONS:
        value = changed.get(option.key)
        if value is None and option.kind in ("int", "float"):
            value = option.default + 1
        elif value is None:
            value = not option.default if option.kind == "bool" else f"{option.default}-x"
        values = {o.key: o.default_value() for o in OPTIONS} | {"model_repository": [repo], option.key: value}
        assert Settings.from_options(values, {}) != base, option.key


def test_a_remote_repository_is_served_from_its_mirror(tmp_path: Path) -> None:
    [repo] = _repos(tmp_path, "repo")
    values = {option.key: option.default_value() for option in OPTIONS} | {
        "model_repository": ["s3://127.0.0.1:9000/bucket/models", repo],
        "state_dir": tmp_path / "state",
        "sync_channel": "canary",
        "sync_max_rate": "1.5M",
    }
    settings = Settings.from_options(values, {})
    assert settings.remote_repositories == ("s3://127.0.0.1:9000/bucket/models",)
    mirror, local = settings.model_repositories
    assert local == repo.resolve()
    assert mirror.parent.parent.parent == tmp_path / "state" / "sync" and mirror.parts[-2:] == ("current", "repo")
    assert settings.sync_max_rate == 1_500_000 and settings.device_id
    for bad, problem in (("s3://", "names no bucket"), ("ftp://x/y", "not a readable directory")):
        done = _run(["config", "--model-repository", bad], tmp_path)
        assert done.returncode != 0 and problem in done.stderr, done.stderr
    done = _run(["config", "--model-repository", str(repo), "--sync-channel", "../up"], tmp_path)
    assert done.returncode != 0 and "channel" in done.stderr, done.stderr


# --- errors: one line, exit status 1 ------------------------------------------------------------------------


def _run(args: list[str], home: Path, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EDGED_")}
    return subprocess.run(
        [sys.executable, "-m", "edged", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        env={**clean, "HOME": str(home), "PYTHONUNBUFFERED": "1", **(env or {})},
        check=False,
    )


# (command, config file text or None, environment, flags, what the one line holds besides "edged: ")
ERRORS: list[tuple[str, str | None, dict[str, str], list[str], list[str]]] = [
    ("serve", "http_prot = 8000\n", {}, [], ["{config}", "unknown key 'http_prot'", "did you mean 'http_port'"]),
    ("serve", "[http]\nport = 8000\n", {}, [], ["{config}", "unknown key 'http'"]),
    ("serve", 'http_port = "8000"\n', {}, [], ["{config}", "key http_port", "expected an integer"]),
    ("serve", "http_port = 70000\n", {}, [], ["{config}", "key http_port", "70000 is outside 0-65535"]),
    ("config", "allow_grpc = 3\n", {}, [], ["{config}", "key allow_grpc", "expected a boolean"]),
    ("serve", 'allow_grpc = "maybe"\n', {}, [], ["{config}", "key allow_grpc", "'maybe'"]),
    ("serve", 'model_control_mode = "sometimes"\n', {}, [], ["{config}", "key model_control_mode", "'sometimes'"]),
    ("serve", 'model_repository = ["/nonexistent/repo"]\n', {}, [], ["{config}", "key model_repository",
                                                                     "/nonexistent/repo"]),
    ("serve", 'backend_config = ["python"]\n', {}, [], ["{config}", "key backend_config", "KEY=VALUE"]),
    ("config", "http_port = \n", {}, [], ["{config}", "not valid TOML", "line 1"]),
    ("serve", None, {"EDGED_ALLOW_GRPC": "maybe"}, [], ["environment variable EDGED_ALLOW_GRPC", "'maybe'"]),
    ("serve", None, {"EDGED_GRPC_PORT": "-1"}, [], ["EDGED_GRPC_PORT", "-1 is outside 0-65535"]),
    ("serve", None, {"EDGED_MODEL_REPOSITORY": "{repo}:/nonexistent/two"}, [], ["EDGED_MODEL_REPOSITORY",
                                                                                 "/nonexistent/two"]),
    ("serve", None, {"EDGED_METRICS_CONFIG": "summary_quantiles=0.5:0.05"}, [], ["EDGED_METRICS_CONFIG",
                                                                                 "write a TOML array"]),
    ("config", None, {"EDGED_EXIT_TIMEOUT_SECS": "soon"}, [], ["EDGED_EXIT_TIMEOUT_SECS", "expected a number"]),
    ("serve", None, {}, ["--http-port", "70000"], ["--http-port: 70000 is outside 0-65535"]),
    ("serve", None, {}, ["--exit-timeout-secs", "-1"], ["--exit-timeout-secs", "-1"]),
    ("serve", None, {}, ["--allow-metrics=perhaps"], ["--allow-metrics", "'perhaps'"]),
    ("config", None, {}, ["--model-load-thread-count", "0"], ["--model-load-thread-count", "at least 1"]),
    ("serve", None, {}, ["--config", "{missing}"], ["{missing}", "--config", "No such file"]),
    ("config", None, {"EDGED_CONFIG": "{missing}"}, [], ["{missing}", "EDGED_CONFIG", "No such file"]),
]  # fmt: skip


@pytest.mark.parametrize(("command", "file_text", "env", "flags", "expected"), ERRORS)
def test_a_bad_value_exits_1_with_one_line(
    tmp_path: Path,
    command: str,
    file_text: str | None,
    env: dict[str, str],
    flags: list[str],
    expected: list[str],
) -> None:
    [repo] = _repos(tmp_path, "repo")
    names = {"repo": str(repo), "missing": str(tmp_path / "missing.toml"), "config": str(tmp_path / "edged.toml")}
    args = [command, "--model-repository", str(repo), *(flag.format(**names) for flag in flags)]
    if file_text is not None:
        _write(tmp_path / "edged.toml", file_text)
        args += ["--config", names["config"]]
        if "model_repository" in file_text:
            args = [arg for arg in args if arg not in ("--model-repository", str(repo))]
    result = _run(args, tmp_path, {k: v.format(**names) for k, v in env.items()})
    output = result.stdout + result.stderr
    assert TRACEBACK_MARKER not in output
    assert result.returncode == 1, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("edged: "), lines
    for part in expected:
        assert part.format(**names) in lines[0], (part, lines[0])


def test_no_repository_anywhere_is_a_usage_error(tmp_path: Path) -> None:
    result = _run(["serve"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "edged: no model repository: give --model-repository PATH, model_repository in the config file or "
        "EDGED_MODEL_REPOSITORY"
    ]


# --- edged config -------------------------------------------------------------------------------------------


def test_edged_config_prints_each_value_with_its_source(tmp_path: Path) -> None:
    [repo] = _repos(tmp_path, "repo")
    config = _write(
        tmp_path / "edged.toml",
        f'model_repository = ["{repo}"]\nhttp_port = 9000\ngrpc_port = 9001\nload_model = ["a", "b"]\n',
    )
    env = {"EDGED_CONFIG": str(config), "EDGED_GRPC_PORT": "9101", "EDGED_ALLOW_GRPC": "off"}
    result = _run(["config", "--grpc-port", "9201", "--backend-config", "python,k=v"], tmp_path, env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()

    def line(key: str) -> tuple[str, str]:
        [found] = [entry for entry in lines if entry.startswith(f"{key} = ")]
        setting, _, source = found.partition("  # ")
        return setting.rstrip(), source

    assert line("model_repository") == (f'model_repository = ["{repo}"]', str(config))
    assert line("http_port") == ("http_port = 9000", str(config))
    assert line("grpc_port") == ("grpc_port = 9201", "--grpc-port")
    assert line("allow_grpc") == ("allow_grpc = false", "EDGED_ALLOW_GRPC")
    assert line("load_model") == ('load_model = ["a", "b"]', str(config))
    assert line("backend_config") == ('backend_config = ["python,k=v"]', "--backend-config")
    assert line("exit_timeout_secs") == ("exit_timeout_secs = 30.0", "default")
    assert line("metrics_address")[1] == "default (unset: the HTTP address)"
    assert f"# config file: {config}" in lines
    # Every option has its line, in the table's order.
    keys = [entry.split(" = ")[0] for entry in lines if not entry.startswith("#")]
    assert keys == [option.key for option in OPTIONS]

    # The output is itself a config file that gives the same configuration.
    printed = tomllib.loads(result.stdout)
    assert printed["grpc_port"] == 9201 and printed["allow_grpc"] is False
    again = _write(tmp_path / "printed.toml", result.stdout)
    environ = {"HOME": str(tmp_path)}
    from_printed = resolve(["--config", str(again)], environ)
    from_layers = resolve(["--grpc-port", "9201", "--backend-config", "python,k=v"], {**environ, **env})
    assert replace(from_printed, config_file=None) == replace(from_layers, config_file=None)


def test_edged_config_without_a_repository_still_prints(tmp_path: Path) -> None:
    result = _run(["config", "--http-port", "1"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "model_repository = []" in result.stdout
    assert "http_port = 1 " in result.stdout


# --- the packaged edged.toml --------------------------------------------------------------------------------


def test_packaged_config_file_is_the_generated_template(tmp_path: Path) -> None:
    packaged = (REPO_ROOT / "packaging" / "edged.toml").read_text(encoding="utf-8")
    assert packaged == template(), "regenerate it: edged config --template > packaging/edged.toml"
    result = _run(["config", "--template"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == packaged


def test_template_lists_every_key_with_its_default() -> None:
    text = template()
    assert max(len(line) for line in text.splitlines()) <= 120
    # The service's own values: its repository, and explicit model control with every model loaded at start (as
    # scripts/run serves), so that an upload is activated without a restart.
    # The state directory is named so that `edged token` and `edged admin` find the service's database.
    packaged = {
        "model_repository": ["/var/lib/edged/models"],
        "model_control_mode": "explicit",
        "load_model": ["*"],
        "state_dir": "/var/lib/edged",
    }
    assert tomllib.loads(text) == packaged
    uncommented = "\n".join(line.removeprefix("#") for line in text.splitlines() if not line.startswith("# "))
    values = tomllib.loads(uncommented)
    assert list(values) == [option.key for option in OPTIONS]
    for option in OPTIONS:
        if option.key not in packaged:
            expected = "" if option.default is None else option.default
            assert values[option.key] == expected, option.key
        else:  # the command line's default, which the set value replaces, is named above it
            default = "unset" if option.default is None else option.literal(option.default)
            assert f"# (edged serve's default: {default})\n{option.key} = " in text
        assert option.env in text and option.flag in text


# --- a daemon configured by its file alone ------------------------------------------------------------------


def test_daemon_runs_from_a_config_file_alone(tmp_path: Path, bundled_repository: Path) -> None:
    http_port, metrics_port, grpc_port = free_ports(3)
    config = _write(
        tmp_path / "edged.toml",
        "\n".join(
            [
                f'model_repository = ["{bundled_repository}"]',
                'id = "configured-by-file"',
                'http_address = "127.0.0.1"',
                f"http_port = {http_port}",
                'grpc_address = "127.0.0.1"',
                f"grpc_port = {grpc_port}",
                f"metrics_port = {metrics_port}",
                'state_dir = "state"',
                "exit_timeout_secs = 5",
                "",
            ]
        ),
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EDGED_")}
    log_path = tmp_path / "edged.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "edged", "serve"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            env={**clean, "HOME": str(tmp_path), "EDGED_CONFIG": str(config), "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert process.poll() is None, log_path.read_text(errors="replace")
            try:
                if request(f"127.0.0.1:{http_port}", "GET", "/v2/health/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)
        assert request(f"127.0.0.1:{http_port}", "GET", "/v2").json()["name"] == "configured-by-file"
        assert (tmp_path / "state" / "edged.db").is_file()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    output = log_path.read_text(errors="replace")
    assert process.returncode == 0, output
    assert TRACEBACK_MARKER not in output
