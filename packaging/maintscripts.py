"""Writes the .deb's maintainer scripts from the templates in packaging/debian/.

postinst creates the edged user with systemd-sysusers and its directories with systemd-tmpfiles, as the snippets
dh_installsysusers and dh_installtmpfiles generate do. Where those tools are missing (a container, a minimal root
without systemd) it runs the same entries translated here, at build time, into adduser and install -d commands,
so the snippets in systemd/ stay the only place that says what the user and the directories are.

    python3 packaging/maintscripts.py --sysusers F --tmpfiles F --templates DIR --output DIR
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

SCRIPTS = ("postinst", "prerm", "postrm")
NOLOGIN = "/usr/sbin/nologin"


class SnippetError(Exception):
    """An entry that the adduser / install -d fallback cannot reproduce."""


def entries(path: Path) -> list[tuple[int, list[str]]]:
    """Lines of a sysusers.d / tmpfiles.d file split as systemd splits them (C-style quotes), without comments."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            out.append((number, shlex.split(line)))
    return out


def field(fields: list[str], index: int) -> str | None:
    """A field, or None when it is absent or "-" (systemd's "the default")."""
    value = fields[index] if index < len(fields) else "-"
    return None if value == "-" else value


def sysusers_fallback(path: Path) -> list[str]:
    commands = []
    for number, fields in entries(path):
        where = f"{path.name}:{number}"
        kind, name = fields[0], fields[1]
        if "%" in " ".join(fields):
            raise SnippetError(f"{where}: specifiers (%) have no adduser equivalent")
        ident = field(fields, 2)  # for "m", the group
        if kind in ("u", "g") and ident is not None and not ident.isdigit():
            raise SnippetError(f"{where}: only a numeric id or '-' has an adduser equivalent, not {ident!r}")
        if kind == "u":
            command = ["adduser", "--system", "--group", "--quiet"]
            command += ["--uid", ident] if ident else []
            command += ["--home", field(fields, 4) or "/", "--no-create-home"]
            command += ["--shell", field(fields, 5) or NOLOGIN]
            gecos = field(fields, 3)
            command += ["--gecos", gecos] if gecos else []
            commands.append(shlex.join([*command, name]))
        elif kind == "g":
            commands.append(shlex.join(["addgroup", "--system", "--quiet", *(["--gid", ident] if ident else []), name]))
        elif kind == "m":
            commands.append(shlex.join(["adduser", "--quiet", name, fields[2]]))
        elif kind != "r":  # r: an id range for other entries; adduser picks ids itself
            raise SnippetError(f"{where}: sysusers type {kind!r} has no adduser equivalent")
    if not commands:
        raise SnippetError(f"{path}: no users or groups")
    return commands


def tmpfiles_fallback(path: Path) -> list[str]:
    commands = []
    for number, fields in entries(path):
        where = f"{path.name}:{number}"
        kind, target = re.sub(r"[!\-=~^+]", "", fields[0]), fields[1]
        if "%" in target:
            raise SnippetError(f"{where}: specifiers (%) need systemd-tmpfiles")
        mode = (field(fields, 2) or "").lstrip("~:")
        user, group = field(fields, 3), field(fields, 4)
        options = (["-m", mode] if mode else []) + (["-o", user] if user else []) + (["-g", group] if group else [])
        if kind in ("d", "D", "v", "q", "Q"):
            commands.append(shlex.join(["install", "-d", *(options or ["-m", "0755"]), target]))
        elif kind in ("z", "Z"):
            recursive = ["-R"] if kind == "Z" else []
            owner = f"{user or ''}:{group or ''}" if user or group else None
            adjust = [shlex.join(["chmod", *recursive, mode, target])] if mode else []
            adjust += [shlex.join(["chown", *recursive, owner, target])] if owner else []
            commands += [f"if [ -e {shlex.quote(target)} ]; then {'; '.join(adjust)}; fi"] if adjust else []
        else:
            raise SnippetError(f"{where}: tmpfiles type {fields[0]!r} needs systemd-tmpfiles")
    return commands


def fill(template: str, placeholders: dict[str, list[str]]) -> str:
    """Replaces each line holding only #NAME# by the commands, indented as the placeholder was."""
    out = []
    for line in template.splitlines():
        name = line.strip()
        if name in placeholders:
            indent = line[: len(line) - len(line.lstrip())]
            out += [indent + command for command in placeholders.pop(name)]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sysusers", type=Path, required=True)
    parser.add_argument("--tmpfiles", type=Path, required=True)
    parser.add_argument("--templates", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    try:
        placeholders = {
            "#SYSUSERS_FALLBACK#": sysusers_fallback(args.sysusers),
            "#TMPFILES_FALLBACK#": tmpfiles_fallback(args.tmpfiles) or [":"],
        }
    except SnippetError as error:
        print(f"maintscripts: {error}", file=sys.stderr)
        return 1
    for script in SCRIPTS:
        target = args.output / script
        target.write_text(fill((args.templates / script).read_text(), placeholders))
        target.chmod(0o755)
    if placeholders:
        print(f"maintscripts: placeholders not in any template: {', '.join(placeholders)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
