"""``scripts/vendor-web``: the console's front-end assets, vendored from the npm registry at pinned versions.

Each package below is pinned by version, by the sha512 of its tarball and by its license. Fetching checks the
tarball against both the registry's ``dist.integrity`` and the pin here, so neither a changed registry entry nor a
changed tarball slips in; then only the named files and the licenses are extracted, into
``<destination>/<name>-<version>/``, and ``<destination>/MANIFEST.json`` records every file's sha256.

    scripts/vendor-web            fetch, verify and rewrite both destinations
    scripts/vendor-web --check    verify the committed files against the manifests and the pins (offline)

Two destinations: ``web/static/vendor`` ships in edged's package and is served by the console (htmx, uPlot);
``tests/vendor`` holds what only the tests use (axe-core, injected into pages by the accessibility checks), so the
devices never carry it.

To update a package: change its version, sha512 and (if it changed) license below, run the script, commit. The
sha512 is the registry's ``dist.integrity`` for that version (``npm view PACKAGE@VERSION dist.integrity``), which a
first run with the new version also prints when it refuses the old pin.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
REGISTRY: Final = "https://registry.npmjs.org"
SHIPPED: Final = "web/static/vendor"
TEST_ONLY: Final = "tests/vendor"
MANIFEST: Final = "MANIFEST.json"
MAX_TARBALL_BYTES: Final = 32 * 1024 * 1024  # axe-core's, the largest, is about 1 MB
TIMEOUT_S: Final = 60


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha512: str  # of the tarball, in the registry's SRI form ("sha512-<base64>")
    license: str  # SPDX id, as the package's metadata states it
    destination: str
    # Member of the tarball (below its "package/" folder) -> name in the vendored directory.
    files: dict[str, str]
    licenses: tuple[str, ...] = field(default=("LICENSE",))  # names in the vendored directory

    @property
    def directory(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def tarball(self) -> str:
        # The registry's layout for unscoped packages; the metadata must name the same URL.
        return f"{REGISTRY}/{self.name}/-/{self.name}-{self.version}.tgz"


PINS: Final = (
    Pin(
        name="htmx.org",
        version="2.0.11",
        sha512="sha512-Thx/WtpeOQqSrqBCw/A1cwGJGg4UrVa3+sW0GmrM3p4gJgO89ecH4qtbnyzDDWFvBTqjnIMCgELTNt636dtamA==",
        license="0BSD",
        destination=SHIPPED,
        files={"dist/htmx.min.js": "htmx.min.js", "LICENSE": "LICENSE"},
    ),
    Pin(
        name="uplot",
        version="1.6.32",
        sha512="sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==",
        license="MIT",
        destination=SHIPPED,
        files={
            "dist/uPlot.iife.min.js": "uPlot.iife.min.js",
            "dist/uPlot.min.css": "uPlot.min.css",
            "LICENSE": "LICENSE",
        },
    ),
    Pin(
        name="axe-core",
        version="4.14.1",
        sha512="sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ==",
        license="MPL-2.0",
        destination=TEST_ONLY,
        files={
            "axe.min.js": "axe.min.js",
            "LICENSE": "LICENSE",
            "LICENSE-3RD-PARTY.txt": "LICENSE-3RD-PARTY.txt",
        },
        licenses=("LICENSE", "LICENSE-3RD-PARTY.txt"),
    ),
)
DESTINATIONS: Final = (SHIPPED, TEST_ONLY)


class VendorError(Exception):
    """A package, a file or a manifest that does not match its pin; the message names it."""


# --- fetching ----------------------------------------------------------------------------------------------------


def _get(url: str, limit: int) -> bytes:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "https" or f"{parsed.scheme}://{parsed.netloc}" != REGISTRY:
        raise VendorError(f"{url}: not on {REGISTRY}")
    request = urllib.request.Request(url, headers={"Accept": "application/json, application/octet-stream"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        body: bytes = response.read(limit + 1)
    if len(body) > limit:
        raise VendorError(f"{url}: larger than {limit} bytes")
    return body


def _sri_sha512(integrity: str) -> set[str]:
    """The sha512 digests (base64) of an SRI string, which may list several hashes."""
    return {part.removeprefix("sha512-") for part in integrity.split() if part.startswith("sha512-")}


def _fetch(pin: Pin) -> bytes:
    """The package's tarball, checked against the registry's integrity and against the pin."""
    metadata: dict[str, Any] = json.loads(_get(f"{REGISTRY}/{pin.name}/{pin.version}", 1024 * 1024))
    if metadata.get("name") != pin.name or metadata.get("version") != pin.version:
        raise VendorError(
            f"{pin.name}@{pin.version}: the registry answered {metadata.get('name')}@{metadata.get('version')}"
        )
    if metadata.get("license") != pin.license:
        raise VendorError(f"{pin.name}@{pin.version}: license {metadata.get('license')!r}, pinned {pin.license!r}")
    dist = metadata.get("dist", {})
    if dist.get("tarball") != pin.tarball:
        raise VendorError(f"{pin.name}@{pin.version}: tarball {dist.get('tarball')}, expected {pin.tarball}")
    registry_digests = _sri_sha512(str(dist.get("integrity", "")))
    if not registry_digests:
        raise VendorError(f"{pin.name}@{pin.version}: the registry gives no sha512 integrity")
    tarball = _get(pin.tarball, MAX_TARBALL_BYTES)
    digest = base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    if digest not in registry_digests:
        raise VendorError(f"{pin.tarball}: sha512-{digest} is not the registry's integrity {dist['integrity']}")
    if digest not in _sri_sha512(pin.sha512):
        raise VendorError(f"{pin.tarball}: sha512-{digest} is not the pinned {pin.sha512}")
    return tarball


def _extract(pin: Pin, tarball: bytes, directory: Path) -> None:
    """Writes only the pinned members, as regular files with names of our choosing: nothing else is read out."""
    wanted = {f"package/{member}": name for member, name in pin.files.items()}
    directory.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        for member in archive:
            name = wanted.pop(member.name, None)
            if name is None:
                continue
            if not member.isfile():
                raise VendorError(f"{pin.tarball}: {member.name} is not a regular file")
            data = archive.extractfile(member)
            assert data is not None  # a regular file always has data
            (directory / name).write_bytes(data.read())
            (directory / name).chmod(0o644)
    if wanted:
        raise VendorError(f"{pin.tarball}: no {', '.join(sorted(wanted))}")


def _entry(pin: Pin, directory: Path) -> dict[str, Any]:
    files = {
        name: {
            "sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(),
            "size": (directory / name).stat().st_size,
        }
        for name in sorted(pin.files.values())
    }
    return {
        "name": pin.name,
        "version": pin.version,
        "license": pin.license,
        "licenses": list(pin.licenses),
        "source": pin.tarball,
        "integrity": pin.sha512,
        "directory": pin.directory,
        "files": files,
    }


def vendor(root: Path) -> None:
    """Fetches every pin and replaces each destination with exactly the pinned files and their manifest."""
    for destination in DESTINATIONS:
        target = root / destination
        target.parent.mkdir(parents=True, exist_ok=True)
        # Built beside the target and switched in only once every package of it is verified.
        staging = Path(tempfile.mkdtemp(prefix=".vendor-web-", dir=target.parent))
        try:
            entries = []
            for pin in (p for p in PINS if p.destination == destination):
                print(f"vendor-web: {pin.name}@{pin.version}", file=sys.stderr)
                _extract(pin, _fetch(pin), staging / pin.directory)
                entries.append(_entry(pin, staging / pin.directory))
            (staging / MANIFEST).write_text(json.dumps({"packages": entries}, indent=2) + "\n", encoding="utf-8")
            staging.chmod(0o755)
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            if target.exists():
                target.rename(old)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


# --- checking ----------------------------------------------------------------------------------------------------


def check(root: Path) -> list[str]:
    """What differs between the vendored files, their manifests and the pins; empty when everything matches."""
    problems: list[str] = []
    for destination in DESTINATIONS:
        target = root / destination
        manifest_path = target / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            entries = {entry["name"]: entry for entry in manifest["packages"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"{destination}/{MANIFEST}: unreadable ({exc})")
            continue
        pins = {pin.name: pin for pin in PINS if pin.destination == destination}
        for name in sorted(entries.keys() - pins.keys()):
            problems.append(f"{destination}/{MANIFEST}: {name} is not pinned in scripts/vendor_web.py")
        expected_entries: set[str] = {MANIFEST}
        for pin in pins.values():
            entry = entries.get(pin.name)
            if entry is None:
                problems.append(f"{destination}/{MANIFEST}: {pin.name} is pinned but missing")
                continue
            for key, pinned in (
                ("version", pin.version),
                ("license", pin.license),
                ("source", pin.tarball),
                ("integrity", pin.sha512),
                ("directory", pin.directory),
                ("licenses", list(pin.licenses)),
            ):
                if entry.get(key) != pinned:
                    problems.append(f"{destination}/{MANIFEST}: {pin.name} {key} {entry.get(key)!r}, pinned {pinned!r}")
            expected_entries.add(pin.directory)
            problems += _check_files(f"{destination}/{pin.directory}", target / pin.directory, pin, entry)
        if target.is_dir():
            for extra in sorted({p.name for p in target.iterdir()} - expected_entries):
                problems.append(f"{destination}/{extra}: not in {MANIFEST}")
    return problems


def _check_files(label: str, directory: Path, pin: Pin, entry: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    recorded: dict[str, Any] = entry.get("files", {})
    if set(recorded) != set(pin.files.values()):
        problems.append(f"{label}: the manifest lists {sorted(recorded)}, the pin {sorted(pin.files.values())}")
    for license_name in pin.licenses:
        path = directory / license_name
        if not path.is_file() or path.stat().st_size == 0:
            problems.append(f"{label}/{license_name}: license missing or empty")
    present = {p.name for p in directory.iterdir()} if directory.is_dir() else set()
    for extra in sorted(present - set(recorded)):
        problems.append(f"{label}/{extra}: not in {MANIFEST}")
    for name, facts in sorted(recorded.items()):
        path = directory / name
        if not path.is_file() or path.is_symlink():
            problems.append(f"{label}/{name}: missing")
            continue
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != facts.get("sha256") or len(data) != facts.get("size"):
            problems.append(f"{label}/{name}: sha256 or size does not match {MANIFEST}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/vendor-web", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--check", action="store_true", help="verify the committed files offline")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.root)
        for problem in problems:
            print(f"vendor-web: {problem}", file=sys.stderr)
        return 1 if problems else 0
    try:
        vendor(args.root)
    except (VendorError, OSError, tarfile.TarError) as exc:
        print(f"vendor-web: {exc}", file=sys.stderr)
        return 1
    problems = check(args.root)
    for problem in problems:
        print(f"vendor-web: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
