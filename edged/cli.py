"""The `edged` command: argument parsing only; the work happens in edged.daemon and edged.core."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from edged import __version__
from edged.config import ConfigError, add_serve_options, load, render, settings_from, template
from edged.config.options import parse_bool

__all__ = ["build_parser", "main", "parse_bool"]


def build_parser(*, typed: bool = True) -> argparse.ArgumentParser:
    """The ``edged`` command line. ``typed``: ``serve``'s values are converted and defaulted while parsing, so
    ``Settings.from_args`` takes the namespace (the command line alone); ``main`` parses with ``typed=False`` and
    lets edged.config layer the flags over the file and the environment."""
    parser = argparse.ArgumentParser(prog="edged", description="Inference server for edge appliances.")
    parser.add_argument("--version", action="version", version=f"edged {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve model repositories over HTTP and gRPC (KServe v2)")
    add_serve_options(serve, typed=typed)

    config = commands.add_parser(
        "config",
        help="print the effective configuration of `edged serve`, with where each value came from",
        description="Prints the configuration `edged serve` would run with, given the same file, environment and "
        "flags, as a config file whose comments name each value's source.",
    )
    config.add_argument(
        "--template", action="store_true", help="print the commented default config file instead (edged.toml)"
    )
    add_serve_options(config, typed=typed)

    check = commands.add_parser("check-repo", help="validate a model repository offline")
    check.add_argument("repository", type=Path, nargs="+")
    check.add_argument("--disable-auto-complete-config", action="store_true")

    commands.add_parser("devices", help="print the devices model instances can run on (CPUs, GPUs, plug-ins' NPUs)")
    commands.add_parser("version", help="print the version")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(typed=False).parse_args(argv)
    if args.command == "version":
        print(f"edged {__version__}")
        return 0
    if args.command == "devices":
        from edged.core.devices import DeviceInventory

        print(DeviceInventory.discover().describe())
        return 0
    if args.command == "check-repo":
        import logging

        from edged.backends import BackendRegistry
        from edged.core.repository.manager import check_repositories

        # The problems are the output; the loaders' own log lines would only repeat them.
        logging.disable(logging.CRITICAL)

        problems = check_repositories(
            list(args.repository), BackendRegistry({}), auto_complete=not args.disable_auto_complete_config
        )
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    if args.command == "config" and args.template:
        print(template(), end="")
        return 0
    try:
        # The subcommand is the first argument: the top-level options that may come before it (--help, --version)
        # exit. `config` takes serve's flags and --template, which is not given here.
        layered = load(argv[1:], os.environ)
        if args.command == "config":
            print(render(layered), end="")
            return 0
        settings = settings_from(layered, os.environ)
    except ConfigError as error:
        print(f"edged: {error}", file=sys.stderr)
        return error.status
    from edged.daemon import run

    return run(settings)
