"""Model uploads against the real daemon: ``POST /v2/edged/models/{model}/upload`` and ``edged upload``, with
archives built here from modelgen's add_sub, inferred on with tritonclient afterwards; every unsafe archive of class
14 refused with nothing written anywhere; the size limit; the access policy (an upload brings code the daemon runs:
it needs a token, from loopback too, so every upload here sends an operator's unless it says otherwise)."""

from __future__ import annotations

import io
import json
import stat
import subprocess
import sys
import tarfile
import time
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import modelgen  # type: ignore[import-not-found, unused-ignore]
import numpy as np
import pytest
import tritonclient.http as httpclient
from archives import zip_folder
from server import (
    ADD_SUB_INPUT0,
    ADD_SUB_INPUT1,
    REPO_ROOT,
    Reply,
    Server,
    add_sub_inputs,
    api_token,
    bearer,
    request,
    run_server,
)
from tritonclient.utils import InferenceServerException

# Small limits, so that the tests of them move kilobytes, not gigabytes.
MAX_UPLOAD: Final = 2 * 1024 * 1024
MAX_EXTRACTED: Final = 128 * 1024


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where add_sub folders to be archived are written (never served from here)."""
    return tmp_path_factory.mktemp("upload-sources")


@pytest.fixture(scope="module")
def source(sources: Path) -> Path:
    return add_sub(sources, "resident")


def add_sub(sources: Path, name: str) -> Path:
    """add_sub's folder as model ``name`` (its config names it so, as Triton requires)."""
    if not (sources / name).exists():
        modelgen.write_add_sub(sources / name, max_batch_size=8, dims=16, dtype="FP32")
    return sources / name


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the repository and the state directory live: nothing else may appear in it."""
    return tmp_path_factory.mktemp("upload-scratch")


@pytest.fixture(scope="module")
def tokens(scratch: Path) -> dict[str, str]:
    made = {}
    for name, role in (("technician", "operator"), ("dashboard", "viewer")):
        result = _edged("token", "--state-dir", str(scratch / "state"), "create", "--name", name, "--role", role)
        assert result.returncode == 0, result.stderr
        made[role] = result.stdout.strip()
    return made


@pytest.fixture(scope="module")
def server(scratch: Path, source: Path, tokens: dict[str, str]) -> Iterator[Server]:
    del tokens  # made first, in the same state database
    repository = scratch / "repository"
    repository.mkdir()
    # A model that is there from the start, for the new-version tests.
    modelgen.write_add_sub(repository / "resident", max_batch_size=8, dims=16, dtype="FP32")
    with run_server(
        [repository],
        "--model-control-mode=explicit",
        "--load-model=resident",
        f"--state-dir={scratch / 'state'}",
        f"--upload-max-bytes={MAX_UPLOAD}",
        f"--upload-max-extracted-bytes={MAX_EXTRACTED}",
    ) as running:
        yield running


# --- archives -----------------------------------------------------------------------------------------------


def tar_folder(folder: Path, prefix: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(folder.rglob("*")):
            archive.add(path, prefix + path.relative_to(folder).as_posix(), recursive=False)
    return buffer.getvalue()


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT) as archive:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    return info


def zip_of(*members: tuple[str | zipfile.ZipInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate names some attacks hold
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in members:
                archive.writestr(name, data)
    return buffer.getvalue()


def zip_symlink() -> bytes:
    info = zipfile.ZipInfo("1/model.onnx")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return zip_of((info, b"/etc/passwd"))


def zip_lying_about_size() -> bytes:
    """A member that declares 100 bytes and inflates to 64 KiB: both headers patched."""
    data = bytearray(zip_of(("1/model.onnx", b"\0" * 65536)))
    local = data.find(b"PK\x03\x04")
    central = data.find(b"PK\x01\x02")
    data[local + 22 : local + 26] = (100).to_bytes(4, "little")
    data[central + 24 : central + 28] = (100).to_bytes(4, "little")
    return bytes(data)


ATTACKS: Final[dict[str, tuple[bytes, str]]] = {
    "tar slip": (tar_of((member("../../../evil-slip.txt"), b"owned")), "'..'"),
    "tar slip inside a folder": (tar_of((member("1/../../evil-slip2.txt"), b"owned")), "'..'"),
    "absolute path": (tar_of((member("/tmp/evil-absolute.txt"), b"owned")), "absolute path"),
    "symbolic link": (tar_of((member("1/model.onnx", tarfile.SYMTYPE, "/etc/passwd"), b"")), "symbolic link"),
    "hard link": (tar_of((member("1/model.onnx", tarfile.LNKTYPE, "/etc/passwd"), b"")), "hard link"),
    "device file": (tar_of((member("1/model.onnx", tarfile.CHRTYPE), b"")), "device file"),
    "FIFO": (tar_of((member("1/model.onnx", tarfile.FIFOTYPE), b"")), "FIFO"),
    "zip slip": (zip_of(("../evil-zip.txt", b"owned")), "'..'"),
    "zip symbolic link": (zip_symlink(), "symbolic link"),
    "control character": (tar_of((member("1/model\x01.onnx"), b"x")), "control character"),
    "backslash": (zip_of(("1\\..\\..\\evil.txt", b"owned")), "backslash"),
    "duplicate member": (zip_of(("config.pbtxt", b"a"), ("config.pbtxt", b"b"), ("1/m", b"")), "more than once"),
    "file and folder of one name": (zip_of(("1", b"a"), ("1/model.onnx", b"b")), "not a folder"),
    "zip bomb by declared size": (zip_of(("1/model.onnx", b"\0" * (MAX_EXTRACTED + 1))), "once extracted"),
    "tar bomb by declared size": (tar_of((member("1/model.onnx"), b"\0" * (MAX_EXTRACTED + 1))), "once extracted"),
    "zip bomb by actual size": (zip_lying_about_size(), "model.onnx"),
    "too many members": (zip_of(*((f"1/f{i}", b"") for i in range(10_001))), "members"),
    "not an archive": (b"PK\x03\x04 this is no zip at all" * 10, "zip"),
}


# --- helpers ------------------------------------------------------------------------------------------------


def upload(server: Server, model: str, body: bytes, *, activate: bool = False, **headers: str) -> Reply:
    """Sent with an operator's token unless ``headers`` hold an Authorization of their own."""
    query = "?activate=true" if activate else ""
    kind = "application/zip" if body.startswith(b"PK") else "application/gzip"
    credential = {} if "Authorization" in headers else bearer(api_token(server))
    return request(
        server.http_url,
        "POST",
        f"/v2/edged/models/{model}/upload{query}",
        body,
        {"Content-Type": kind, **credential, **headers},
    )


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_size for p in sorted(root.rglob("*"))}


def infer(server: Server, model: str, version: str = "") -> dict[str, Any]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer(model, add_sub_inputs(), model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)
        index: list[dict[str, Any]] = client.get_model_repository_index()
    return {f"{entry['name']}/{entry.get('version', '')}": entry.get("state") for entry in index}


def history(server: Server, model: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = request(server.http_url, "GET", f"/v2/edged/models/{model}/history").json()["events"]
    return events


# --- tests --------------------------------------------------------------------------------------------------


def test_a_new_model_uploaded_and_activated_serves(server: Server, sources: Path, tokens: dict[str, str]) -> None:
    archive = zip_folder(add_sub(sources, "fresh"), "fresh/")
    reply = upload(server, "fresh", archive, activate=True, Authorization=f"Bearer {tokens['operator']}")
    assert reply.status == 200, reply.body
    assert reply.json() == {
        "model": "fresh",
        "version": 1,
        "created": True,
        "loaded": True,
        "problems": [],
        "probation_s": 60.0,
    }
    states = infer(server, "fresh")
    assert states["fresh/1"] == "READY"
    uploaded = [event for event in history(server, "fresh") if event["state"] == "UPLOADED"]
    assert uploaded and uploaded[0]["source"] == "upload" and uploaded[0]["actor"] == "token:technician"


def test_a_new_version_is_installed_next_and_activated(server: Server, source: Path) -> None:
    repository = server_repository(server)
    # The files of one version, as a .tar.gz.
    reply = upload(server, "resident", tar_folder(source / "1"), activate=True)
    assert reply.status == 200, reply.body
    assert reply.json() == {
        "model": "resident",
        "version": 2,
        "created": False,
        "loaded": True,
        "problems": [],
        "probation_s": 60.0,
    }
    assert (repository / "resident" / "2" / "model.onnx").is_file()
    states = infer(server, "resident", "2")
    assert states["resident/2"] == "READY"
    # A model folder holding one version and the model's own config is a new version too (numbered next).
    reply = upload(server, "resident", zip_of(("config.pbtxt", _config(repository)), *_version_files(source, "7")))
    assert reply.status == 200, reply.body
    assert reply.json()["version"] == 3 and reply.json()["loaded"] is False
    assert (repository / "resident" / "3" / "model.onnx").is_file()
    assert not (repository / "resident" / "7").exists()
    infer(server, "resident", "2")  # still the one serving


def test_a_version_with_another_config_or_several_versions_is_refused(server: Server, source: Path) -> None:
    repository = server_repository(server)
    before = tree(repository)
    other = _config(repository).replace(b"max_batch_size: 8", b"max_batch_size: 4")
    for body, expected in (
        (zip_of(("config.pbtxt", other), *_version_files(source, "1")), "differs"),
        (zip_of(*_version_files(source, "1"), *_version_files(source, "2")), "1, 2"),
    ):
        reply = upload(server, "resident", body)
        assert reply.status == 400 and expected in reply.error(), reply.body
    assert tree(repository) == before


def test_a_broken_config_is_refused_with_its_line_and_nothing_changes(server: Server, source: Path) -> None:
    repository = server_repository(server)
    before = tree(repository)
    broken = b'name: "broken"\nmax_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_NOPE dims: [ 16 ] } ]\n'
    reply = upload(server, "broken", zip_of(("config.pbtxt", broken), *_version_files(source, "1")), activate=True)
    assert reply.status == 400, reply.body
    body = reply.json()
    assert body["problems"] and body["problems"][0].startswith("broken/config.pbtxt:3:"), body
    assert "TYPE_NOPE" in body["error"]
    assert tree(repository) == before
    # The log keeps the reason too, for whoever looks at the device later.
    assert f"upload of model 'broken' refused: {body['problems'][0]}" in server.log_file.read_text()
    assert not (scratch_of(server) / "state" / "uploads").exists() or not any(
        (scratch_of(server) / "state" / "uploads").iterdir()
    )


def test_a_model_that_fails_to_load_is_removed_again(server: Server, source: Path) -> None:
    repository = server_repository(server)
    before = tree(repository)
    # A valid config whose model file is not an ONNX model: the config reads, the load fails. Not activated, the
    # trial load (as check-repo's) refuses it.
    trial = upload(server, "resident", zip_of(("1/model.onnx", b"not onnx")))
    assert trial.status == 400, trial.body
    assert trial.json()["problems"][0].startswith("version 4: ") and trial.json()["version"] == 4, trial.body
    assert tree(repository) == before
    reply = upload(server, "resident", zip_of(("1/model.onnx", b"not onnx")), activate=True)
    assert reply.status == 400, reply.body
    assert "failed to load" in reply.error()
    assert tree(repository) == before
    infer(server, "resident", "2")  # the version serving before serves on
    assert any(event["state"] == "UPLOAD_REMOVED" for event in history(server, "resident"))


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_unsafe_archives_are_refused_and_nothing_is_written(server: Server, attack: str) -> None:
    body, expected = ATTACKS[attack]
    scratch = scratch_of(server)
    before = tree(scratch / "repository")
    reply = upload(server, "resident", body)
    assert reply.status == 400, reply.body
    message = reply.error()
    assert expected in message, message
    assert str(scratch) not in message and "/state" not in message  # no path of the machine in the answer
    assert tree(scratch / "repository") == before
    uploads = scratch / "state" / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())
    assert not any(path.name.startswith("evil") for path in scratch.rglob("*"))
    assert not list(Path("/tmp").glob("evil-*"))


def test_past_the_size_limit_is_413_and_the_daemon_serves_on(server: Server) -> None:
    body = b"PK\x03\x04" + b"\0" * MAX_UPLOAD
    declared = upload(server, "resident", body)
    assert declared.status == 413, declared.body
    assert declared.error() == (
        f"model archive of {len(body)} bytes exceeds the maximum allowed size of {MAX_UPLOAD} bytes. Use "
        "--upload-max-bytes to increase the limit."
    )
    # Without a Content-Length: chunked, refused once the limit is passed.
    chunked = request(
        server.http_url,
        "POST",
        "/v2/edged/models/resident/upload",
        _chunked(body),
        {"Content-Type": "application/zip", "Transfer-Encoding": "chunked", **bearer(api_token(server))},
    )
    assert chunked.status == 413, chunked.body
    assert "exceeds the maximum allowed size of" in chunked.error()
    infer(server, "resident", "2")
    uploads = scratch_of(server) / "state" / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())


def test_other_refusals(server: Server, source: Path, tokens: dict[str, str]) -> None:
    archive = zip_folder(source)
    viewer = upload(server, "viewers-model", archive, Authorization=f"Bearer {tokens['viewer']}")
    assert viewer.status == 403, viewer.body
    wrong_type = request(
        server.http_url,
        "POST",
        "/v2/edged/models/x/upload",
        archive,
        {"Content-Type": "application/json", **bearer(tokens["operator"])},
    )
    assert wrong_type.status == 415
    assert upload(server, "a\x01b".replace("\x01", "%01"), archive).status == 400
    assert upload(server, "no-such-model", tar_folder(source / "1")).status == 400
    assert not (server_repository(server) / "viewers-model").exists()


def test_edged_upload_command(server: Server, sources: Path, scratch: Path, tokens: dict[str, str]) -> None:
    archive = scratch / "from-cli.tar.gz"
    archive.write_bytes(tar_folder(add_sub(sources, "from-cli"), "from-cli/"))
    url = f"http://{server.http_url}"
    # Without a token, even here on loopback: an upload brings code the daemon runs.
    anonymous = _edged("upload", str(archive), "--model", "from-cli", "--activate", "--url", url)
    assert anonymous.returncode == 1 and "HTTP 401" in anonymous.stderr, anonymous.stderr
    assert "needs an API token, from this machine too" in anonymous.stderr
    operator = ("--token", tokens["operator"])
    done = _edged("upload", str(archive), "--model", "from-cli", "--activate", "--url", url, *operator)
    assert done.returncode == 0, done.stderr
    assert "model 'from-cli' version 1 installed (new model, loaded)" in done.stdout
    infer(server, "from-cli")
    refused = _edged("upload", str(archive), "--model", "from-cli", "--url", url, "--token", tokens["viewer"])
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr
    broken = scratch / "broken.zip"
    broken.write_bytes(zip_of(("config.pbtxt", b"name: 'cli-broken'\nmax_batch_size: -x\n"), ("1/model.onnx", b"")))
    refused = _edged("upload", str(broken), "--model", "cli-broken", "--url", url, *operator)
    assert refused.returncode == 1 and "HTTP 400" in refused.stderr and "cli-broken/config.pbtxt:2" in refused.stderr
    # The same model folder again: its config is the model's, so its one version becomes the next.
    added = _edged("upload", str(archive), "--model", "from-cli", "--url", url, "--json", *operator)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["version"] == 2


# --- more helpers -----------------------------------------------------------------------------------------


def scratch_of(server: Server) -> Path:
    return Path(next(arg for arg in server.args if arg.startswith("--state-dir=")).split("=", 1)[1]).parent


def server_repository(server: Server) -> Path:
    return scratch_of(server) / "repository"


def _config(repository: Path) -> bytes:
    return (repository / "resident" / "config.pbtxt").read_bytes()


def _version_files(source: Path, number: str) -> list[tuple[str, bytes]]:
    return [(f"{number}/{p.name}", p.read_bytes()) for p in sorted((source / "1").iterdir())]


def _chunked(body: bytes) -> bytes:
    size = 64 * 1024
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


# --- probation ------------------------------------------------------------------------------------------------

_ECHO = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
"""
_BROKEN = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("broken on purpose")) for _ in requests]
"""
_ECHO_CONFIG = """name: "flaky"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _echo(client: httpclient.InferenceServerClient) -> np.ndarray[Any, Any]:
    data = np.arange(4, dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(data)
    result: np.ndarray[Any, Any] = client.infer("flaky", [tensor]).as_numpy("OUTPUT0")
    return result


def test_an_activated_upload_that_fails_its_probation_is_removed(tmp_path: Path, sources: Path) -> None:
    repository = tmp_path / "repository"
    (repository / "flaky" / "1").mkdir(parents=True)
    (repository / "flaky" / "config.pbtxt").write_text(_ECHO_CONFIG)
    (repository / "flaky" / "1" / "model.py").write_text(_ECHO)
    broken = sources / "broken-version"
    broken.mkdir(exist_ok=True)
    (broken / "model.py").write_text(_BROKEN)
    with run_server(
        [repository], "--model-control-mode=explicit", "--load-model=flaky", "--sync-probation-secs=60"
    ) as server:
        reply = upload(server, "flaky", zip_folder(broken), activate=True)
        assert reply.status == 200, reply.body
        assert reply.json()["version"] == 2 and reply.json()["loaded"] is True
        assert reply.json()["probation_s"] == 60.0
        client = httpclient.InferenceServerClient(server.http_url)
        failures = 0
        deadline = time.monotonic() + 60
        # Version 2 serves and fails every request; once it failed enough of them, it is removed and version 1
        # serves again, long before the window ends.
        while time.monotonic() < deadline:
            try:
                np.testing.assert_array_equal(_echo(client), np.arange(4, dtype=np.float32))
                break
            except InferenceServerException:
                failures += 1
                time.sleep(0.05)
        else:
            pytest.fail(f"version 2 still serves after {failures} failed requests")
        assert failures >= 10
        assert not (repository / "flaky" / "2").exists()
        removed = [e for e in history(server, "flaky") if e["state"] == "UPLOAD_REMOVED"]
        assert removed and "failed its probation" in removed[0]["reason"], removed
