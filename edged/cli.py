"""The `edged` command: argument parsing only; the work happens in edged.daemon and edged.core.

Each command imports what it uses when it runs, so a command pays only for itself: `edged version` imports nothing
of edged's but this module, the commands that talk to a running edged no SQLAlchemy, only `serve` the daemon.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from edged import __version__

__all__ = ["build_parser", "main"]


def build_parser(*, typed: bool = True) -> argparse.ArgumentParser:
    """The ``edged`` command line. ``typed``: ``serve``'s values are converted and defaulted while parsing, so
    ``Settings.from_args`` takes the namespace (the command line alone); ``main`` parses with ``typed=False`` and
    lets edged.config layer the flags over the file and the environment."""
    from edged.config import add_serve_options

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

    _add_token_commands(commands)
    _add_admin_commands(commands)
    _add_sync_commands(commands)
    _add_upload_command(commands)
    _add_fleet_commands(commands)
    _add_publish_commands(commands)
    commands.add_parser("devices", help="print the devices model instances can run on (CPUs, GPUs, plug-ins' NPUs)")
    commands.add_parser("version", help="print the version")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["version"], ["--version"]):
        # Answered before the parser is built: building it imports the serve options (edged.config), which would
        # be most of this command's time.
        print(f"edged {__version__}")
        return 0
    args = build_parser(typed=False).parse_args(argv)
    if args.command == "version":
        print(f"edged {__version__}")
        return 0
    if args.command == "devices":
        from edged.core.devices import DeviceInventory

        print(DeviceInventory.discover().describe())
        return 0
    if args.command == "check-repo":
        problems = _check_offline(list(args.repository), auto_complete=not args.disable_auto_complete_config)
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    if args.command == "token":
        return _token(args)
    if args.command == "admin":
        return _admin(args)
    if args.command == "sync":
        return _sync(args)
    if args.command == "upload":
        return _upload(args)
    if args.command == "fleet":
        return _fleet(args)
    if args.command in ("keygen", "publish"):
        return _publish(args)
    from edged.config import ConfigError, load, render, settings_from, template

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


# --- edged sync -------------------------------------------------------------------------------------------------


def _add_sync_commands(commands: Any) -> None:
    sync = commands.add_parser(
        "sync",
        help="show, run, pause or resume the sync of a running edged's s3://, gs:// and as:// repositories",
        description="Talks to a running edged over its HTTP API (/v2/edged/sync). Guarded like the repository API: "
        "on the device itself loopback is trusted by default; elsewhere pass an operator token.",
    )
    sync.add_argument("action", choices=["status", "now", "pause", "resume", "history"])
    sync.add_argument("--url", default="http://127.0.0.1:8000", help="edged's HTTP endpoint (%(default)s)")
    sync.add_argument("--token", default=os.environ.get("EDGED_TOKEN"), help="an API token (default: $EDGED_TOKEN)")
    sync.add_argument("--json", action="store_true", help="print the API's JSON answer")
    sync.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for an answer (%(default)s)")


def _sync(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.request

    path, method = {
        "status": ("/v2/edged/sync", "GET"),
        "now": ("/v2/edged/sync/now", "POST"),
        "pause": ("/v2/edged/sync/pause", "POST"),
        "resume": ("/v2/edged/sync/resume", "POST"),
        "history": ("/v2/edged/sync/history", "GET"),
    }[args.action]
    request = urllib.request.Request(args.url.rstrip("/") + path, method=method, data=b"" if method == "POST" else None)
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        try:
            message = json.loads(error.read()).get("error", error.reason)
        except ValueError:
            message = error.reason
        print(f"edged: {args.url}: HTTP {error.code}: {message}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        print(f"edged: {args.url} cannot be reached: {getattr(error, 'reason', error)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.action in {"now", "history"}:
        for run in answer["runs"]:
            print(_run_line(run))
    else:
        print(_sync_status(answer), end="")
    failed = args.action == "now" and any(run["outcome"] == "failed" for run in answer["runs"])
    return 1 if failed else 0


# --- edged upload -----------------------------------------------------------------------------------------------


def _add_upload_command(commands: Any) -> None:
    upload = commands.add_parser(
        "upload",
        help="upload a model, or a new version of one, to a running edged (a .zip or .tar.gz archive)",
        description="Sends ARCHIVE to a running edged (POST /v2/edged/models/NAME/upload), which checks it and "
        "installs it as model NAME (a model folder: config.pbtxt and numbered version folders) or as the next "
        "version of NAME (the files of one version). An upload brings code the server runs, so it needs an "
        "operator's token from every address, the device's own loopback too (make one with edged token create).",
    )
    upload.add_argument("archive", type=Path, help="a .zip or .tar.gz archive")
    upload.add_argument("--model", required=True, help="the model's name")
    upload.add_argument("--activate", action="store_true", help="load the model once installed")
    upload.add_argument("--url", default="http://127.0.0.1:8000", help="edged's HTTP endpoint (%(default)s)")
    upload.add_argument("--token", default=os.environ.get("EDGED_TOKEN"), help="an API token (default: $EDGED_TOKEN)")
    upload.add_argument("--json", action="store_true", help="print the API's JSON answer")
    upload.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for an answer (%(default)s)")


def _upload(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    archive: Path = args.archive
    try:
        size = archive.stat().st_size
        body = archive.open("rb")
    except OSError as error:
        print(f"edged: {archive}: {error.strerror or error}", file=sys.stderr)
        return 1
    zipped = body.read(4).startswith(b"PK")
    body.seek(0)
    path = f"/v2/edged/models/{urllib.parse.quote(args.model, safe='')}/upload"
    url = args.url.rstrip("/") + path + ("?activate=true" if args.activate else "")
    # A file object with a Content-Length: urllib sends it in blocks as it reads it, never whole.
    request = urllib.request.Request(url, method="POST", data=body)
    request.add_header("Content-Type", "application/zip" if zipped else "application/gzip")
    request.add_header("Content-Length", str(size))
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        with body, urllib.request.urlopen(request, timeout=args.timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as error:
        try:
            refusal = json.loads(error.read())
        except ValueError:
            refusal = {}
        problems = refusal.get("problems") or [refusal.get("error", error.reason)]
        print(f"edged: {args.url}: HTTP {error.code}: {problems[0]}", file=sys.stderr)
        for problem in problems[1:]:
            print(f"  {problem}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as error:
        print(f"edged: {args.url} cannot be reached: {getattr(error, 'reason', error)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        what = "new model" if answer["created"] else "new version"
        state = "loaded" if answer["loaded"] else "not loaded"
        print(f"model '{answer['model']}' version {answer['version']} installed ({what}, {state})")
    return 0


def _run_line(run: dict[str, Any]) -> str:
    text = f"{run['at']}  {run['source']}  {run['outcome']}  revision {run['revision'] or '-'}"
    if run["bytes"]:
        text += f"  {run['bytes']} bytes"
    return text + (f"  {run['message']}" if run["message"] else "")


def _sync_status(status: dict[str, Any]) -> str:
    lines = [
        f"sync {'paused' if status['paused'] else 'active'}; device {status['device_id']}, "
        f"channel {status['channel'] or '-'}, every {status['interval_s']:g} s"
    ]
    for source in status["sources"]:
        lines.append(f"{source['url']} ({'signed' if source['signed'] else 'unsigned'})")
        lines.append(f"  phase       {source['phase']}")
        good = source["good_revision"] or "none yet"
        lines.append(f"  revision    {source['revision'] or '(none yet)'} (last known good: {good})")
        if source["held_back"]:
            lines.append(f"  held back   {', '.join(source['held_back'])}")
        lines.append(f"  last sync   {source['last_success_at'] or 'never'}")
        if source["last_error"]:
            lines.append(f"  last error  {source['last_error']}")
        if source["progress"]:
            progress = source["progress"]
            lines.append(f"  progress    {progress['done_bytes']} of {progress['total_bytes']} bytes")
        if source["next_run_in_s"] is not None:
            lines.append(f"  next run in {source['next_run_in_s']:.0f} s")
    return "\n".join(lines) + "\n"


# --- edged fleet -----------------------------------------------------------------------------------------------


def _add_fleet_commands(commands: Any) -> None:
    fleet = commands.add_parser(
        "fleet",
        help="the devices that sync from a bucket, as their status objects there say",
        description="Devices that report write BASE/.edged/devices/<device id>.json after each sync run; these "
        "commands read them back. Credentials come from the environment, as for `edged serve` (AWS_*, "
        "GOOGLE_APPLICATION_CREDENTIALS, STORAGE_EMULATOR_HOST).",
    )
    actions = fleet.add_subparsers(dest="action", required=True)
    status = actions.add_parser("status", help="print every device of a bucket in a table")
    status.add_argument(
        "url", metavar="URL", help="the base repository (s3://..., gs://... or as://...), without a channel"
    )
    status.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    status.add_argument(
        "--stale-after", default="1h", metavar="DURATION", help="mark reports older than this stale (default: 1h)"
    )


def _fleet(args: argparse.Namespace) -> int:
    import asyncio
    import json

    # Imported here: the sync clients are an extra, and no other command needs them.
    from edged.sync import SyncError, open_repository
    from edged.sync.fleet import fleet, format_table, parse_duration, to_json

    try:
        stale_after = parse_duration(args.stale_after)
    except ValueError as error:
        print(f"edged: --stale-after: {error}", file=sys.stderr)
        return 2

    async def read() -> list[Any]:
        base = open_repository(args.url, os.environ)
        try:
            return list(await fleet(base))
        finally:
            await base.close()

    try:
        # base.close() waits out the S3 client's runtime threads, so the process can exit right after.
        reports = asyncio.run(read())
    except SyncError as error:
        print(f"edged: {error}", file=sys.stderr)
        return 1
    now = datetime.now(UTC)
    if args.json:
        print(json.dumps(to_json(reports, now, stale_after), indent=2))
    else:
        print(format_table(reports, now, stale_after))
    return 0


# --- edged token ------------------------------------------------------------------------------------------------


def _add_state_dir_arguments(parser: argparse.ArgumentParser) -> None:
    """The commands that open the state database themselves find it as ``edged serve`` does, or as told."""
    parser.add_argument("--state-dir", type=Path, help="the state directory (default: as edged serve finds it)")
    parser.add_argument("--config", help="the configuration file to read state_dir from")


def _add_token_commands(commands: Any) -> None:
    from edged.core.access import Role

    token = commands.add_parser(
        "token",
        help="create, list and revoke API tokens (kept in the state database)",
        description="API tokens let clients call guarded APIs: send 'Authorization: Bearer <token>' over HTTP, or "
        "the 'authorization' metadata over gRPC (tritonclient's headers= argument). Roles: viewer (read-only APIs), "
        "operator (also model-repository, shared-memory, logging, trace), admin (also token management).",
    )
    _add_state_dir_arguments(token)
    actions = token.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a token and print it (the only time it is shown)")
    create.add_argument("--name", required=True, help="a unique name, recorded as who made each change")
    create.add_argument("--role", required=True, choices=[role.value for role in Role])
    create.add_argument("--expires", metavar="DURATION", help="lifetime, e.g. 90d, 12h or 30m (default: none)")
    actions.add_parser("list", help="list the tokens (never their secrets)")
    revoke = actions.add_parser("revoke", help="revoke a token by name (within 2 s for a running edged)")
    revoke.add_argument("name")


def _token(args: argparse.Namespace) -> int:
    from edged.config import ConfigError
    from edged.core.access import Role, new_token
    from edged.core.accounts import AuditEntry
    from edged.core.audit import AuditLog
    from edged.state.records import StateError
    from edged.state.store import StateStore

    try:
        state_dir = _state_dir(args)
        expires = _expiry(args.expires) if args.action == "create" else None
        with StateStore.open(state_dir) as store:
            audit_log = AuditLog(store)
            if args.action == "create":
                made = new_token(args.name, Role(args.role), expires)
                store.add_token(made.record)
                audit_log.record(AuditEntry("cli", "token-create", args.name, "done", f"role {args.role}"), "cli")
                audit_log.close()
                print(made.secret)
                print(f"edged: token '{args.name}' ({args.role}) created; it is not shown again", file=sys.stderr)
            elif args.action == "list":
                now = datetime.now(UTC)
                print(f"{'NAME':24} {'ROLE':9} {'STATE':8} {'CREATED':26} EXPIRES")
                for record in store.tokens():
                    state = "revoked" if record.revoked_at else "active"
                    if state == "active" and record.expires_at is not None and record.expires_at <= now:
                        state = "expired"
                    expires_text = record.expires_at.isoformat(timespec="seconds") if record.expires_at else "never"
                    created = record.created_at.isoformat(timespec="seconds")
                    print(f"{record.name:24} {record.role:9} {state:8} {created:26} {expires_text}")
            elif not store.revoke_token(args.name):
                print(f"edged: no active token named '{args.name}'", file=sys.stderr)
                return 1
            else:
                audit_log.record(AuditEntry("cli", "token-revoke", args.name, "done"), "cli")
                audit_log.close()
    except (ConfigError, StateError, ValueError) as error:
        print(f"edged: {error}", file=sys.stderr)
        return 1
    return 0


# --- edged admin ------------------------------------------------------------------------------------------------


def _add_admin_commands(commands: Any) -> None:
    from edged.core.access import Role

    admin = commands.add_parser(
        "admin",
        help="create, list and disable the web console's users, and set their passwords",
        description="Console users log in with a name and password (hashed with argon2id in the state database). "
        "Roles, as for API tokens: viewer (sees everything), operator (also loads, unloads and uploads models), "
        "admin (also manages users and tokens). A password has 12 to 1024 printable characters and does not contain "
        "the user name.",
    )
    _add_state_dir_arguments(admin)
    actions = admin.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a user (the password is asked for twice)")
    create.add_argument("--name", required=True, help="letters, digits and . _ @ -, up to 64")
    create.add_argument("--role", required=True, choices=[role.value for role in Role])
    create.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    actions.add_parser("list", help="list the users (never their password hashes)")
    disable = actions.add_parser("disable", help="disable a user and end its sessions")
    disable.add_argument("name")
    passwd = actions.add_parser("passwd", help="set a user's password and end its sessions")
    passwd.add_argument("name")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from standard input")


# What each command of edged admin that changes a user is called in the audit history.
_ADMIN_ACTIONS: dict[str, Literal["user-create", "user-disable", "password-set"]] = {
    "create": "user-create",
    "disable": "user-disable",
    "passwd": "password-set",
}


def _admin(args: argparse.Namespace) -> int:
    from edged.config import ConfigError
    from edged.core.access import Role
    from edged.core.accounts import AccountError, Accounts, AuditEntry
    from edged.core.audit import AuditLog
    from edged.state.records import StateError
    from edged.state.store import StateStore

    try:
        password = _new_password(args) if args.action in ("create", "passwd") else ""
        with StateStore.open(_state_dir(args)) as store:
            accounts, audit_log = Accounts(store), AuditLog(store)
            try:
                if args.action == "create":
                    user, audit = accounts.create_user(args.name, Role(args.role), password, actor="cli")
                    audit_log.record(audit, "cli")
                    print(f"edged: user '{user.name}' ({user.role.value}) created", file=sys.stderr)
                elif args.action == "list":
                    print(f"{'NAME':24} {'ROLE':9} {'STATE':9} {'CREATED':26} PASSWORD SET")
                    for user in accounts.users():
                        state = "disabled" if user.disabled_at else "active"
                        created = user.created_at.isoformat(timespec="seconds")
                        changed = user.password_changed_at.isoformat(timespec="seconds")
                        print(f"{user.name:24} {user.role.value:9} {state:9} {created:26} {changed}")
                elif args.action == "disable":
                    audit = accounts.disable_user(args.name, actor="cli")
                    audit_log.record(audit, "cli")
                    print(f"edged: user '{args.name}' disabled; {audit.detail}", file=sys.stderr)
                else:
                    audit = accounts.set_password(args.name, password, actor="cli")
                    audit_log.record(audit, "cli")
                    print(f"edged: password of '{args.name}' set; {audit.detail}", file=sys.stderr)
            except AccountError as error:
                # A refused action is history too (the message names the rule, never the password).
                action = _ADMIN_ACTIONS[args.action]
                audit_log.record(AuditEntry("cli", action, args.name, "refused", str(error)), "cli")
                raise
            finally:
                audit_log.close()  # the queued actions are written before the store closes
    except (AccountError, ConfigError, StateError, ValueError) as error:
        print(f"edged: {error}", file=sys.stderr)
        return 1
    except (EOFError, KeyboardInterrupt):
        print("edged: no password given", file=sys.stderr)
        return 1
    return 0


def _new_password(args: argparse.Namespace) -> str:
    """The password from standard input (its first line), or asked for twice on the terminal."""
    if args.password_stdin:
        line = sys.stdin.readline()
        if not line:
            raise ValueError("--password-stdin: standard input is empty")
        return line.rstrip("\r\n")
    import getpass

    password = getpass.getpass("Password: ")
    if getpass.getpass("Password again: ") != password:
        raise ValueError("the two passwords differ")
    return password


# --- edged keygen, edged publish ---------------------------------------------------------------------------------


def _add_publish_commands(commands: Any) -> None:
    keygen = commands.add_parser(
        "keygen",
        help="make the signing keys of a published repository (root.pem, online.pem)",
        description="Writes two new ed25519 private keys (PEM, mode 0600) into DIR: root.pem signs the root "
        "metadata that devices trust (the first publish, and re-signing the root to change the online key): keep it "
        "offline. online.pem signs every publish. Existing keys are never overwritten.",
    )
    keygen.add_argument("directory", type=Path, metavar="DIR")
    publish = commands.add_parser(
        "publish",
        help="sign a model repository and upload it to s3://, gs:// or as:// (The Update Framework)",
        description="Validates LOCAL_REPO (as check-repo does), uploads the files that changed since the last "
        "publish, then signed metadata under URL/.edged/metadata/ (targets with every file's length and sha256, "
        "snapshot, timestamp), and deletes the objects the repository no longer has. Devices syncing URL with the "
        "printed root.json as their trusted root refuse tampered files, other keys, rolled-back, expired or mixed "
        "metadata. Each publish is revision vN. Run it again (even without changes) before --expires runs out. "
        "Credentials come from the environment, as for sync (AWS_*, GOOGLE_APPLICATION_CREDENTIALS, ...).",
    )
    publish.add_argument("repository", type=Path, metavar="LOCAL_REPO")
    publish.add_argument(
        "url", metavar="URL", help="s3://[host:port/]bucket/prefix, gs://bucket/prefix or as://account/container/prefix"
    )
    publish.add_argument("--key", type=Path, required=True, metavar="ONLINE_KEY", help="the online key (online.pem)")
    publish.add_argument(
        "--root-key",
        type=Path,
        metavar="ROOT_KEY",
        help="the root key (root.pem): needed on the first publish; given later, the root is re-signed as its next "
        "version with --key as the online key (a rotation) and --root-expires",
    )
    publish.add_argument("--expires", default="30d", metavar="DURATION", help="metadata lifetime (default: 30d)")
    publish.add_argument("--root-expires", default="365d", metavar="DURATION", help="root lifetime (default: 365d)")
    publish.add_argument(
        "--root-out", type=Path, metavar="PATH", help="where to write root.json (default: beside ONLINE_KEY)"
    )


def _publish(args: argparse.Namespace) -> int:
    from edged.sync.publish import keygen_command, publish_command

    if args.command == "keygen":
        return keygen_command(args.directory)
    try:
        expires, root_expires = _expiry(args.expires), _expiry(args.root_expires)
    except ValueError as error:
        print(f"edged: {error}", file=sys.stderr)
        return 1
    return publish_command(
        args.repository, args.url, args.key, args.root_key, expires, root_expires, args.root_out, _check_one
    )


def _check_one(repository: Path) -> list[str]:
    return _check_offline([repository])


def _check_offline(repositories: list[Path], *, auto_complete: bool = True) -> list[str]:
    """Every problem that would keep a model of ``repositories`` from loading: what ``edged check-repo`` prints."""
    import logging

    from edged.backends import BackendRegistry
    from edged.core.repository.check import check_repositories

    # The problems are the output; the loaders' own log lines would only repeat them.
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        return check_repositories(repositories, BackendRegistry({}), auto_complete=auto_complete)
    finally:
        logging.disable(previous)


def _state_dir(args: argparse.Namespace) -> Path:
    from edged.config import load
    from edged.state.directory import default_state_dir

    if args.state_dir is not None:
        return Path(args.state_dir).resolve()
    layered = load(["--config", args.config] if args.config else [], os.environ)
    configured = layered.values.get("state_dir")
    return Path(configured).resolve() if configured else default_state_dir(os.environ)


def _expiry(text: str | None) -> datetime | None:
    if text is None:
        return None
    units = {"d": 86400, "h": 3600, "m": 60}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.isdigit() or int(number) == 0:
        raise ValueError(f"--expires: expected a duration such as 90d, 12h or 30m, got '{text}'")
    return datetime.now(UTC) + timedelta(seconds=int(number) * units[unit])
