"""The .debs: ``packaging/build-deb`` builds edged's and edged-sync's, and they install into a throwaway Debian root
and run there.

Both slow parts are cached between runs, so a warm run takes about a minute: the wheels the virtualenv is made of
(``/var/tmp/edged-wheelhouse``, filled from PyPI on the first build) and a minimal Debian root made by debootstrap
(``/var/tmp/edged-debroot-<release>``, made from the Debian mirror on the first run; each run installs into a copy).
The package is packed uncompressed here: xz takes minutes on a small machine and changes nothing that is tested.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from console_session import PASSWORD, http_login
from objectstores import S3Bucket, moto_server, write_repository
from server import REPO_ROOT

import edged

pytestmark = pytest.mark.slow

CACHE: Final = Path(os.environ.get("EDGED_TEST_CACHE", "/var/tmp"))
MIRROR: Final = os.environ.get("EDGED_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BUILD_TIMEOUT_S: Final = 1800  # a cold wheelhouse downloads ~70 MB and compiles systemd-python
DEBOOTSTRAP_TIMEOUT_S: Final = 1200
COMMAND_TIMEOUT_S: Final = 300
# Only the build directory's name holds this, so finding it in the package means a build path leaked in.
BUILD_TMP_MARKER: Final = "edged-packaging-test-tmp"
PREFIX: Final = "/opt/edged"
CONFFILE: Final = "/etc/edged/edged.toml"
# A builder's shell may have these for an edged of its own; build-deb must build the same package despite them.
BUILDER_EDGED_SETTINGS: Final = {
    "EDGED_ALLOW_CONSOLE": "false",
    "EDGED_HTTP_PORT": "1",
    "EDGED_CONFIG": "/nonexistent/edged.toml",
}
# What the package ships from this checkout, byte for byte: checkout path -> installed path.
SHIPPED: Final = {
    "systemd/edged.service": "/lib/systemd/system/edged.service",
    "systemd/sysusers.d/edged.conf": "/usr/lib/sysusers.d/edged.conf",
    "systemd/tmpfiles.d/edged.conf": "/usr/lib/tmpfiles.d/edged.conf",
    "packaging/edged.toml": CONFFILE,
}


@dataclass(frozen=True)
class Deb:
    path: Path
    members: dict[str, tarfile.TarInfo]  # "/usr/bin/edged" -> its entry in the data archive
    tree: Path  # the data archive extracted
    leaked: list[str]  # members that name the build directory
    sync_path: Path  # edged-sync's package, built with it

    def read(self, name: str) -> bytes:
        return (self.tree / name.lstrip("/")).read_bytes()


def _run(
    *command: str, timeout: float = COMMAND_TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL, check=False
    )


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _python_minor() -> str:
    """The minor version of Debian's python3, which the package's virtualenv is bound to."""
    return _ok(_run("/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])")).strip()


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deb]:
    tmp = tmp_path_factory.mktemp(BUILD_TMP_MARKER)
    env = _build_env(tmp)
    build = _run(
        str(REPO_ROOT / "packaging/build-deb"), "--output", str(tmp / "dist"), timeout=BUILD_TIMEOUT_S, env=env
    )
    path, sync_path = map(Path, _ok(build).strip().splitlines()[-2:])
    arch = _ok(_run("dpkg", "--print-architecture")).strip()
    assert path == tmp / "dist" / f"edged_{edged.__version__}_{arch}.deb"
    assert sync_path == tmp / "dist" / f"edged-sync_{edged.__version__}_{arch}.deb"

    members: dict[str, tarfile.TarInfo] = {}
    leaked: list[str] = []
    marker = BUILD_TMP_MARKER.encode()
    with (
        subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(path)], stdout=subprocess.PIPE) as dpkg,
        tarfile.open(fileobj=dpkg.stdout, mode="r|") as archive,
    ):
        for member in archive:
            members[member.name.removeprefix(".")] = member
            data = archive.extractfile(member) if member.isfile() else None
            if marker in member.linkname.encode() or (data is not None and marker in data.read()):
                leaked.append(member.name)
    assert dpkg.returncode == 0
    tree = tmp / "tree"
    _ok(_run("dpkg-deb", "--extract", str(path), str(tree)))
    yield Deb(path, members, tree, leaked, sync_path)
    shutil.rmtree(tmp, ignore_errors=True)


def _build_env(tmp: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        # The builder's own edged settings reach neither the build nor its survey of what edged imports, which runs
        # the daemon with the packaged configuration (a console turned off there used to fail the build).
        **BUILDER_EDGED_SETTINGS,
        "TMPDIR": str(tmp),
        "EDGED_WHEELHOUSE": os.environ.get("EDGED_WHEELHOUSE", str(CACHE / "edged-wheelhouse")),
        "EDGED_DEB_COMPRESSION": "none",
        **extra,
    }


def test_a_build_over_the_budget_fails_and_names_the_largest_parts(deb: Deb, tmp_path: Path) -> None:
    installed_kib = int(_ok(_run("dpkg-deb", "--field", str(deb.path), "Installed-Size")))
    default = re.search(r"EDGED_DEB_BUDGET_KIB:-(\d+)", (REPO_ROOT / "packaging/build-deb").read_text())
    assert default is not None, "build-deb names no default budget"
    budget = int(default[1])
    assert installed_kib <= budget
    # Half the package: over it before the bytecode is compiled, so the build stops before its slow steps.
    env = _build_env(tmp_path, EDGED_DEB_BUDGET_KIB=str(installed_kib // 2))
    build = _run(
        str(REPO_ROOT / "packaging/build-deb"), "--output", str(tmp_path / "dist"), timeout=BUILD_TIMEOUT_S, env=env
    )
    assert build.returncode != 0
    assert f"over its budget of {installed_kib // 2 // 1024} MiB" in build.stderr, build.stderr
    assert "edged stopped" not in build.stderr  # the survey of what edged imports (it runs the daemon) never ran
    assert "site-packages/onnxruntime" in build.stderr
    assert not list((tmp_path / "dist").glob("*.deb"))


def test_control_fields(deb: Deb) -> None:
    def field(name: str) -> str:
        return _ok(_run("dpkg-deb", "--field", str(deb.path), name)).strip()

    assert field("Package") == "edged"
    assert field("Version") == edged.__version__
    assert field("Architecture") == _ok(_run("dpkg", "--print-architecture")).strip()
    depends = [alternatives.strip() for alternatives in field("Depends").split(",")]
    # The venv runs /usr/bin/python3.X with lib/python3.X: bound to that minor version, not to "python3".
    assert f"python{_python_minor()}" in depends
    # The compiled modules' system libraries, as dpkg-shlibdeps finds them: onnxruntime's C++ runtime, and
    # libsystemd for systemd-python (built from source, so no wheel brings a copy).
    names = {alternatives.split()[0] for alternatives in depends}
    assert {"libc6", "libstdc++6"} <= names, depends
    frozen = deb.read("/usr/share/doc/edged/requirements.txt").decode().lower().splitlines()
    if any(line.startswith("systemd-python==") for line in frozen):
        assert "libsystemd0" in names, depends
    assert "adduser | systemd-sysusers" in depends


def test_the_sync_package(deb: Deb) -> None:
    """edged-sync holds the sync extra's packages for the same /opt/edged, and nothing edged's package holds."""

    def field(name: str) -> str:
        return _ok(_run("dpkg-deb", "--field", str(deb.sync_path), name)).strip()

    assert field("Package") == "edged-sync"
    assert field("Version") == edged.__version__
    depends = [alternatives.strip() for alternatives in field("Depends").split(",")]
    assert depends[0] == f"edged (= {edged.__version__})", depends
    assert "ca-certificates" in depends  # the S3 client does not start without them
    files = [
        line.split(maxsplit=5)[5].removeprefix(".").split(" -> ")[0]
        for line in _ok(_run("dpkg-deb", "--contents", str(deb.sync_path))).splitlines()
        if not line.startswith("d")
    ]
    assert files, "edged-sync holds no files"
    site = f"{PREFIX}/lib/python{_python_minor()}/site-packages/"
    for module in ("obstore/", "gcloud/aio/storage/", "tuf/ngclient/", "securesystemslib/", "cryptography/"):
        assert any(name.startswith(site + module) for name in files), module
    assert [name for name in files if name in deb.members] == []
    outside = [name for name in files if not name.startswith((f"{PREFIX}/", "/usr/share/doc/edged-sync/"))]
    assert outside == []
    # Its modules are compiled: they are loaded only where a sync runs, and /opt/edged is not the edged user's.
    minor = _python_minor().replace(".", "")
    assert f"{site}tuf/ngclient/__pycache__/updater.cpython-{minor}.pyc" in files
    # edged's own requirements.txt lists none of them.
    frozen = deb.read("/usr/share/doc/edged/requirements.txt").decode().lower()
    assert "obstore==" not in frozen and "tuf==" not in frozen


def test_conffiles_and_maintainer_scripts(deb: Deb, tmp_path: Path) -> None:
    control = tmp_path / "control"
    _ok(_run("dpkg-deb", "--control", str(deb.path), str(control)))
    assert (control / "conffiles").read_text().split() == [CONFFILE]
    for script in ("postinst", "prerm", "postrm"):
        path = control / script
        assert path.stat().st_mode & 0o111 == 0o111, f"{script} is not executable"
        _ok(_run("sh", "-n", str(path)))
        text = path.read_text()
        assert "#SYSUSERS_FALLBACK#" not in text and "#TMPFILES_FALLBACK#" not in text, f"{script}: placeholder left"
    postinst = (control / "postinst").read_text()
    # The sysusers.d and tmpfiles.d entries, translated for systems without systemd.
    assert "systemd-sysusers" in postinst
    assert "adduser --system --group" in postinst
    assert "install -d" in postinst
    assert "deb-systemd-helper enable edged.service" in postinst
    assert "deb-systemd-invoke start edged.service" in postinst  # only after an upgrade stopped it
    assert "rm -rf" in (control / "postrm").read_text()
    md5sums = (control / "md5sums").read_text()
    assert f"  {PREFIX.lstrip('/')}/bin/edged\n" in md5sums
    assert CONFFILE.lstrip("/") not in md5sums  # dpkg keeps conffiles' sums itself


def test_files(deb: Deb) -> None:
    members = deb.members
    minor = _python_minor()
    edged_link = members["/usr/bin/edged"]
    assert edged_link.issym() and edged_link.linkname == f"{PREFIX}/bin/edged"
    interpreter = members[f"{PREFIX}/bin/python{minor}"]
    assert interpreter.issym() and interpreter.linkname == f"/usr/bin/python{minor}"
    for source, installed in SHIPPED.items():
        assert deb.read(installed) == (REPO_ROOT / source).read_bytes(), installed
    repository = REPO_ROOT / "model_repository"
    expected = {f"/usr/share/edged/model_repository/{p.relative_to(repository)}" for p in repository.rglob("*")}
    shipped = {name for name in members if name.startswith("/usr/share/edged/model_repository/")}
    assert shipped == expected
    assert all(m.uname == "root" and m.gname == "root" for m in members.values())
    assert (
        f"{PREFIX}/lib/python{minor}/site-packages/edged/__pycache__/cli.cpython-{minor.replace('.', '')}.pyc"
        in members
    )
    assert b"home = /usr/bin\n" in deb.read(f"{PREFIX}/pyvenv.cfg")
    # Extension modules come without debugging information, but numpy's (auditwheel patched them: see build-deb).
    site = f"{PREFIX}/lib/python{minor}/site-packages/"
    with_debug = [
        name
        for name, member in members.items()
        if member.isfile()
        and ".so" in name
        and not name.startswith(f"{site}numpy")
        and b".debug_info" in deb.read(name)
    ]
    assert with_debug == []
    web = f"{PREFIX}/lib/python{minor}/site-packages/edged/web"
    for name in _shipped_web_files():
        assert deb.read(f"{web}/{name}") == (REPO_ROOT / "web" / name).read_bytes(), name


def _shipped_web_files() -> list[str]:
    """The console's vendored files (relative to web/) as their manifest lists them, the manifest included."""
    manifest = json.loads((REPO_ROOT / "web/static/vendor/MANIFEST.json").read_text(encoding="utf-8"))
    files = ["static/vendor/MANIFEST.json"]
    for entry in manifest["packages"]:
        files += [f"static/vendor/{entry['directory']}/{name}" for name in entry["files"]]
    return files


def test_wheel_holds_the_web_assets(tmp_path: Path) -> None:
    """The console's files travel in edged's wheel as package data, where importlib.resources finds them."""
    # Built from a copy of what git sees, as build-deb does, so the checkout gets no build/ or egg-info.
    source = tmp_path / "src"
    listed = _ok(_run("git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"))
    for name in filter(None, listed.split("\0")):
        path = REPO_ROOT / name
        if path.is_symlink() or path.is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name, follow_symlinks=False)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _ok(_run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(tmp_path), str(source)))
    (wheel,) = tmp_path.glob("edged-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name in _shipped_web_files():
            assert archive.read(f"edged/web/{name}") == (REPO_ROOT / "web" / name).read_bytes(), name
        assert not any(name.startswith("edged/web/") and "/." in name for name in names)  # no dotfiles
        assert not any("axe" in name for name in names), "the tests' axe-core must not ship"
        archive.extractall(tmp_path / "site")
    # Installed, a wheel of pure Python is that tree on sys.path: the way the console finds its files. -S and -P
    # keep the virtualenv's edged and the working directory out of the path.
    find = "import importlib.resources as r; print(r.files('edged') / 'web' / 'static' / 'vendor' / 'MANIFEST.json')"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path / "site")}
    found = Path(_ok(_run(sys.executable, "-S", "-P", "-c", find, env=env)).strip())
    assert found == tmp_path / "site/edged/web/static/vendor/MANIFEST.json"
    assert found.read_bytes() == (REPO_ROOT / "web/static/vendor/MANIFEST.json").read_bytes()


def test_the_import_survey_ignores_the_builders_edged_settings() -> None:
    """packaging/runtime_modules.py, the step of build-deb that runs edged to find what to precompile, serves the
    bundled repository on the packaged configuration whatever EDGED_* settings its caller has; this checkout's
    virtualenv stands in for the package's."""
    survey = _run(
        sys.executable,
        str(REPO_ROOT / "packaging/runtime_modules.py"),
        sys.prefix,
        str(REPO_ROOT / "model_repository"),
        str(REPO_ROOT / "packaging/edged.toml"),
        env={**os.environ, **BUILDER_EDGED_SETTINGS},
    )
    imported = _ok(survey).splitlines()
    # Jinja2 renders the console's login page: the console ran although the caller's setting turns it off.
    assert any("/site-packages/jinja2/" in name for name in imported), imported


def test_no_build_path_in_the_package(deb: Deb) -> None:
    assert deb.leaked == []
    assert deb.read(f"{PREFIX}/bin/edged").startswith(f"#!{PREFIX}/bin/python".encode())


# --- installed into a Debian root --------------------------------------------------------------------------------


def _release() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.partition("=")[2].strip('"')
    pytest.fail("/etc/os-release names no VERSION_CODENAME; the package installs into a root of this Debian release")


def _cached_root() -> Path:
    """A debootstrap minbase root of this machine's release with what the packages depend on beyond minbase (the
    tests install them with dpkg, which fetches nothing): ca-certificates is edged-sync's."""
    release = _release()
    include = f"python{_python_minor()},adduser,ca-certificates"
    root = CACHE / f"edged-debroot-{release}"
    stamp = f"{release} {include} {MIRROR}\n"
    with (CACHE / f"edged-debroot-{release}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # test runs at once make it once
        if (root / ".edged-root").is_file() and (root / ".edged-root").read_text() == stamp:
            return root
        shutil.rmtree(root, ignore_errors=True)
        partial = CACHE / f"edged-debroot-{release}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        command = ["debootstrap", "--variant=minbase", f"--include={include}", release, str(partial), MIRROR]
        _ok(_run(*command, timeout=DEBOOTSTRAP_TIMEOUT_S))
        (partial / ".edged-root").write_text(stamp)
        partial.rename(root)
    return root


@pytest.fixture
def debian_root(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("installing the .deb into a Debian root needs root (debootstrap, chroot); run the suite as root")
    for tool in ("debootstrap", "chroot", "unshare"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (apt-get install debootstrap)")
    root = tmp_path / "root"
    _ok(_run("cp", "-a", str(_cached_root()), str(root)))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _in_root(root: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """Runs a command chrooted in root, in its own mount and pid namespaces with a /proc of its own."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive"}
    unshare = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={root}/proc"]
    return _run(*unshare, "chroot", str(root), *command, env=env)


def test_installs_runs_and_purges_in_a_debian_root(deb: Deb, debian_root: Path) -> None:
    root = debian_root
    shutil.copy(deb.path, root / "tmp/edged.deb")
    _ok(_in_root(root, "dpkg", "--install", "/tmp/edged.deb"))

    (root / "tmp/before-run").touch()
    assert _ok(_in_root(root, "edged", "--version")) == f"edged {edged.__version__}\n"
    _ok(_in_root(root, "edged", "check-repo", "/usr/share/edged/model_repository"))
    broken = root / "tmp/repository/broken"
    broken.mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: eight\n')
    result = _in_root(root, "edged", "check-repo", "/tmp/repository")
    assert result.returncode == 1 and "broken" in result.stdout + result.stderr, result
    # The packaged configuration is read by default and names directories postinst made.
    assert CONFFILE in _ok(_in_root(root, "edged", "config"))
    prefix = _ok(_in_root(root, f"{PREFIX}/bin/python", "-c", "import sys; print(sys.prefix, sys.base_prefix)"))
    assert prefix.split() == [PREFIX, "/usr"]
    find = "import importlib.resources as r; print(r.files('edged') / 'web/static/vendor/MANIFEST.json')"
    manifest = _ok(_in_root(root, f"{PREFIX}/bin/python", "-c", find)).strip()
    assert manifest == f"{PREFIX}/lib/python{_python_minor()}/site-packages/edged/web/static/vendor/MANIFEST.json"
    # What the package leaves out is not needed: the daemon, both web apps and the command line import, the
    # bundled models load in ONNX Runtime (check-repo above), and the parts left out are gone.
    imports = (
        "import edged.daemon.server, edged.cli, edged.backends.onnxruntime, onnxruntime, numpy;"
        "from edged.frontends.console import create_console_app;"
        "from edged.frontends.http import create_http_app;"
        "import importlib.util as u;"
        "print(sorted(m for m in ('faker', 'polyfactory', 'rich', 'pygments', 'httpx', 'pip', 'setuptools',"
        " 'rich_click', 'numpy.f2py', 'sqlalchemy.testing', 'onnxruntime.transformers', 'onnxruntime.quantization',"
        " 'numpy._core.tests') if u.find_spec(m)))"
    )
    assert _ok(_in_root(root, f"{PREFIX}/bin/python", "-c", imports)).strip() == "[]"
    _serve_in_root(root)
    # Every .pyc shipped was valid where it lies, and every module the command line and the daemon imported had
    # one (the package compiles only what runs): running edged as root compiled nothing new.
    written = _ok(_in_root(root, "find", PREFIX, "-newer", "/tmp/before-run"))
    assert written == ""
    _serve_packaged_in_root(root)
    _sync_in_root(root, deb)

    # postinst: the user and directories of the sysusers.d / tmpfiles.d snippets (here through adduser and
    # install -d: the root has no systemd), and the unit enabled through deb-systemd-helper.
    user = _ok(_in_root(root, "getent", "passwd", "edged")).split(":")
    assert user[0] == "edged" and user[6].strip() == "/usr/sbin/nologin", user
    # In the render group, which owns Intel NPUs' and GPUs' device nodes.
    assert "render" in _ok(_in_root(root, "id", "-nG", "edged")).split()
    for line in (REPO_ROOT / "systemd/tmpfiles.d/edged.conf").read_text().splitlines():
        fields = line.split()
        if fields and fields[0].rstrip("!-") in ("d", "D"):
            owner = _ok(_in_root(root, "stat", "-c", "%U:%G %a", fields[1])).strip()
            mode = fields[2].lstrip("0") if fields[2] != "-" else "755"
            expected_owner = f"{_or_root(fields[3])}:{_or_root(fields[4])}"
            assert owner == f"{expected_owner} {mode}", f"{fields[1]}: {owner}"
    wanted_by = [
        line.partition("=")[2].strip()
        for line in (REPO_ROOT / "systemd/edged.service").read_text().splitlines()
        if line.startswith("WantedBy=")
    ]
    assert wanted_by, "edged.service has no WantedBy="
    for target in " ".join(wanted_by).split():
        assert (root / f"etc/systemd/system/{target}.wants/edged.service").is_symlink(), target

    # edged-sync goes first (dpkg keeps edged while a package depends on it), and leaves edged whole.
    refused = _in_root(root, "dpkg", "--remove", "edged")
    assert refused.returncode != 0 and "edged-sync depends on edged" in refused.stderr, refused
    _ok(_in_root(root, "dpkg", "--remove", "edged-sync"))
    assert not (root / f"{PREFIX.lstrip('/')}/lib/python{_python_minor()}/site-packages/obstore").exists()
    assert _ok(_in_root(root, "edged", "--version")) == f"edged {edged.__version__}\n"

    # remove keeps the configuration and the state; purge removes both.
    (root / "var/lib/edged/edged.db").write_text("state")
    _ok(_in_root(root, "dpkg", "--remove", "edged"))
    assert not (root / PREFIX.lstrip("/")).exists()
    assert not (root / "usr/bin/edged").is_symlink()
    assert (root / CONFFILE.lstrip("/")).is_file()
    assert (root / "var/lib/edged/edged.db").is_file()
    _ok(_in_root(root, "dpkg", "--purge", "edged"))
    assert not (root / "etc/edged").exists()
    assert not (root / "var/lib/edged").exists()
    for target in " ".join(wanted_by).split():
        assert not (root / f"etc/systemd/system/{target}.wants/edged.service").is_symlink(), target


def _serve_in_root(root: Path) -> None:
    """The installed daemon serves the bundled repository: an inference over HTTP is answered right."""
    http, grpc, metrics, console = (_free_port() for _ in range(4))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    # --kill-child: should unshare be killed, the daemon (the namespace's first process) is sent SIGTERM.
    command = ["unshare", "--mount", "--pid", "--fork", "--kill-child=SIGTERM", f"--mount-proc={root}/proc"]
    command += ["chroot", str(root), "edged", "serve", "--model-repository=/usr/share/edged/model_repository"]
    command += ["--state-dir=/tmp/state", "--model-control-mode=explicit"]
    command += ["--load-model=*", f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"]
    command += [f"--console-port={console}"]
    body = {
        "inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16} for n in ("INPUT0", "INPUT1")]
    }
    log_path = root / "tmp/edged-serve.log"
    with log_path.open("wb") as log_file:
        unshare = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    try:
        deadline = time.monotonic() + 60
        while _status(f"http://127.0.0.1:{http}/v2/health/ready") != 200:
            assert unshare.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.2)
        request = urllib.request.Request(
            f"http://127.0.0.1:{http}/v2/models/add_sub/infer", data=json.dumps(body).encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                outputs = {output["name"]: output["data"] for output in json.load(reply)["outputs"]}
        except urllib.error.HTTPError as exc:
            pytest.fail(f"inference answered {exc.code} {exc.read()!r}:\n{log_path.read_text(errors='replace')}")
        assert outputs == {"OUTPUT0": [4.0] * 16, "OUTPUT1": [0.0] * 16}
    finally:
        _stop_in_root(unshare)
    assert _status(f"http://127.0.0.1:{http}/v2/health/live") == 0, log_path.read_text(errors="replace")
    assert unshare.returncode == 0, log_path.read_text(errors="replace")


def _serve_packaged_in_root(root: Path) -> None:
    """The daemon as the unit starts it (its ExecStart, as the edged user, with systemd's $STATE_DIRECTORY) on the
    packaged configuration, which the environment changes only in its ports (as a drop-in's Environment= would): it
    loads the repository's models at start, and a model uploaded through the console (its form's request: a login,
    the CSRF token, ?activate=true) is serving at once, without a restart."""
    unit = (REPO_ROOT / "systemd/edged.service").read_text(encoding="utf-8").splitlines()
    exec_start = next(line.partition("=")[2] for line in unit if line.startswith("ExecStart=")).split()
    repository = root / "var/lib/edged/models"
    shutil.copytree(root / "usr/share/edged/model_repository/add_sub", repository / "add_sub")
    (root / "tmp/password").write_text(f"{PASSWORD}\n")
    as_edged = ["setpriv", "--reuid=edged", "--regid=edged", "--init-groups", "env", "STATE_DIRECTORY=/var/lib/edged"]
    _ok(_in_root(root, "chown", "-R", "edged:edged", "/var/lib/edged/models"))
    create = "edged admin create --name otto --role operator --password-stdin </tmp/password"
    _ok(_in_root(root, *as_edged, "sh", "-c", create))

    http, grpc, metrics, console = (_free_port() for _ in range(4))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/var/lib/edged"}
    env |= {"EDGED_HTTP_PORT": str(http), "EDGED_GRPC_PORT": str(grpc), "EDGED_METRICS_PORT": str(metrics)}
    env["EDGED_CONSOLE_PORT"] = str(console)
    command = ["unshare", "--mount", "--pid", "--fork", "--kill-child=SIGTERM", f"--mount-proc={root}/proc"]
    command += ["chroot", str(root), *as_edged, *exec_start]
    log_path = root / "tmp/edged-packaged.log"
    with log_path.open("wb") as log_file:
        unshare = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file)
    try:
        deadline = time.monotonic() + 60
        while _status(f"http://127.0.0.1:{http}/v2/health/ready") != 200:
            assert unshare.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.2)
        assert _status(f"http://127.0.0.1:{http}/v2/models/add_sub/ready") == 200  # loaded at start

        config = (REPO_ROOT / "model_repository/add_sub/config.pbtxt").read_text()
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as folder:
            folder.writestr("uploaded/config.pbtxt", config.replace('name: "add_sub"', 'name: "uploaded"'))
            folder.write(REPO_ROOT / "model_repository/add_sub/1/model.onnx", "uploaded/1/model.onnx")
        session = http_login(console, "otto")
        headers = {"Content-Type": "application/zip", "X-CSRF-Token": session.csrf_token}
        status, _, text = session.request("POST", "/models/uploaded/upload?activate=true", archive.getvalue(), headers)
        assert status == 200, f"{text}\n{log_path.read_text(errors='replace')}"
        answer = json.loads(text)
        assert (answer["version"], answer["loaded"], answer["error"]) == (1, True, None), answer
        # In the repository, where a restart finds it: the packaged repository lies in the state directory, beside
        # edged's own folders there, and activating the upload must not take its folder away.
        found = "\n".join(sorted(str(path.relative_to(repository)) for path in repository.rglob("*")))
        assert (repository / "uploaded/1/model.onnx").is_file(), f"the repository holds:\n{found}"
        body = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "FP32", "data": [3.0] * 16} for n in ("INPUT0", "INPUT1")
            ]
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{http}/v2/models/uploaded/infer", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            outputs = {output["name"]: output["data"] for output in json.load(reply)["outputs"]}
        assert outputs == {"OUTPUT0": [6.0] * 16, "OUTPUT1": [0.0] * 16}
        assert unshare.poll() is None, "the daemon stopped"
    finally:
        _stop_in_root(unshare)
    assert unshare.returncode == 0, log_path.read_text(errors="replace")


def _sync_in_root(root: Path, deb: Deb) -> None:
    """A repository in S3 (moto's real server, reached from the root over loopback): without edged-sync the daemon
    refuses to start and names the package to install; with it, it syncs the bucket and serves its models, having
    compiled nothing new (edged-sync's bytecode is valid where it lies)."""
    credentials = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
    with moto_server() as port:
        bucket = S3Bucket(f"127.0.0.1:{port}", "device-models", credentials)
        for key, data in write_repository(root / "tmp/published").items():
            bucket.put(f"repo/{key}", data)
        command = ["edged", "serve", f"--model-repository=s3://127.0.0.1:{port}/device-models/repo"]
        command += ["--state-dir=/tmp/sync-state", "--sync-interval-secs=3600"]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", **credentials}
        refused = _in_root(root, "env", *(f"{name}={value}" for name, value in env.items()), *command)
        assert refused.returncode != 0, refused
        assert "needs obstore: install the edged-sync package" in refused.stdout + refused.stderr, refused

        shutil.copy(deb.sync_path, root / "tmp/edged-sync.deb")
        _ok(_in_root(root, "dpkg", "--install", "/tmp/edged-sync.deb"))
        (root / "tmp/before-sync").touch()
        http = _free_port()
        command += [f"--http-port={http}", f"--grpc-port={_free_port()}", f"--metrics-port={_free_port()}"]
        command += [f"--console-port={_free_port()}"]
        unshare = ["unshare", "--mount", "--pid", "--fork", "--kill-child=SIGTERM", f"--mount-proc={root}/proc"]
        log_path = root / "tmp/edged-sync.log"
        with log_path.open("wb") as log_file:
            daemon = subprocess.Popen(
                [*unshare, "chroot", str(root), *command], env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=log_file,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while _status(f"http://127.0.0.1:{http}/v2/models/add_sub_int32/ready") != 200:
                assert daemon.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")
                time.sleep(0.2)
            assert _status(f"http://127.0.0.1:{http}/v2/models/add_sub/ready") == 200
        finally:
            _stop_in_root(daemon)
        assert daemon.returncode == 0, log_path.read_text(errors="replace")
    assert _ok(_in_root(root, "find", PREFIX, "-newer", "/tmp/before-sync")) == ""


def _stop_in_root(unshare: subprocess.Popen[bytes]) -> None:
    """Stops the daemon as systemd would, with SIGTERM to the daemon itself: ``unshare --fork`` blocks SIGTERM while
    it waits for its child. If the daemon does not stop in time, unshare is killed, and the daemon with it."""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
    with contextlib.suppress(OSError):
        for pid in children.read_text().split():
            os.kill(int(pid), signal.SIGTERM)
    try:
        unshare.wait(timeout=30)
    except subprocess.TimeoutExpired:
        unshare.kill()
        unshare.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status(url: str) -> int:
    """The HTTP status url answers, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _or_root(value: str) -> str:
    return "root" if value == "-" else value
