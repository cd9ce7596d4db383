"""A model name is one folder name, decided by edged.core.names: the load, unload and history routes refuse any
other before anything touches the disk, and the private copies' file operations stay inside the state directory
whatever their caller passes. End to end with the real clients, a canary directory beside the state directory
checked before and after each attack; property tests for the rule itself."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import modelgen
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import given
from hypothesis import strategies as st
from server import Server, api_token, assert_still_serving, bearer, post_json, request, run_server
from tritonclient.utils import InferenceServerException

from edged.core.confined import PathOutsideRoot, inside, remove_tree
from edged.core.names import MAX_NAME_BYTES, model_name_problem
from edged.core.repository.private_copies import PrivateCopies

POLL_FAILURE: Final = "failed to poll from model repository"
# A control character in a folder name: such a folder is not served (and says so), the others are.
ODD_FOLDER: Final = "odd\x01name"


def _snapshot(root: Path) -> dict[str, tuple[bool, int]]:
    """Every path under ``root`` (links not followed), with whether it is a folder and its size."""
    found: dict[str, tuple[bool, int]] = {}
    for path in root.rglob("*"):
        info = path.lstat()
        found[str(path.relative_to(root))] = (path.is_dir() and not path.is_symlink(), info.st_size)
    return found


def _state_snapshot(state: Path) -> dict[str, tuple[bool, int]]:
    # The database and its write-ahead log change with every history event; everything else must not.
    return {k: v for k, v in _snapshot(state).items() if not k.startswith("edged.db")}


class Site:
    """The daemon's surroundings: its repository, its state directory and canaries beside them."""

    def __init__(self, root: Path, server: Server) -> None:
        self.root = root
        self.server = server
        self.state = root / "state"
        self.canary = root / "canary"

    def outside(self) -> dict[str, tuple[bool, int]]:
        """Everything but the state directory and the daemon's own scratch."""
        return {k: v for k, v in _snapshot(self.root).items() if not (k == "state" or k.startswith("state/"))}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("names")
    repo = root / "repo"
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
    shutil.copytree(repo / "add_sub", repo / ODD_FOLDER)
    for name in ("a", "b"):
        (root / "canary" / name).mkdir(parents=True)
        (root / "canary" / name / "keep.txt").write_text("canary\n", encoding="utf-8")
    state = root / "state"
    with run_server([repo], "--model-control-mode=explicit", "--load-model=add_sub", f"--state-dir={state}") as server:
        yield Site(root, server)


@pytest.fixture
def private_copy(site: Site) -> Iterator[Path]:
    """add_sub loaded from a private copy (a config override): what a restart would load again."""
    client = httpclient.InferenceServerClient(site.server.http_url)
    config = client.get_model_config("add_sub")
    config["max_batch_size"] = 4
    client.load_model("add_sub", config=json.dumps(config), headers=bearer(api_token(site.server)))
    copies = list((site.state / "overrides" / "add_sub").glob("[0-9]*"))
    assert len(copies) == 1
    yield copies[0]
    # From the repository again, the private copy gone (a plain load alone would keep the override, as Triton's).
    client.unload_model("add_sub")
    client.load_model("add_sub")
    client.close()


GRPC_LOAD_NAMES: Final = (
    "../../canary",
    "../canary",
    "..",
    ".",
    "",
    "a/b",
    "a\\b",
    "a\0b",
    "x" * 300,
    "bad\nname",
    "/tmp",
    " ..",
    " \t ",
)


@pytest.mark.parametrize("name", GRPC_LOAD_NAMES)
def test_grpc_load_of_a_name_that_is_no_folder_name(site: Site, private_copy: Path, name: str) -> None:
    before, state_before = site.outside(), _state_snapshot(site.state)
    client = grpcclient.InferenceServerClient(site.server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(name)
    message = str(caught.value.message())
    if not name.strip():
        # Triton's checks of a name to load come first, in its words.
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert message == "Model name cannot be empty. Please enter a valid name to deploy."
    elif "/" in name or name.strip() == "..":
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert message.endswith("model name must not contain path traversal characters"), message
    else:
        assert caught.value.status() == "StatusCode.INTERNAL"
        assert POLL_FAILURE in message and "cannot be a model name" in message
    assert site.outside() == before
    assert _state_snapshot(site.state) == state_before
    assert private_copy.is_dir()
    client.close()
    assert_still_serving(httpclient.InferenceServerClient(site.server.http_url))


def test_grpc_load_with_files_writes_nothing_outside(site: Site, tmp_path: Path) -> None:
    before = site.outside()
    client = grpcclient.InferenceServerClient(site.server.grpc_url)
    config = json.dumps({"name": "x", "backend": "python"})
    files = {"file:1/model.py": b"import os\n", "file:1/evil.txt": b"written\n"}
    for name in ("../../canary/c", "../../canary2", str(site.canary / "d"), str(tmp_path / "abs")):
        with pytest.raises(InferenceServerException) as caught:
            client.load_model(name, config=config, files=files, headers=bearer(api_token(site.server)))
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT", name
        assert "path traversal characters" in str(caught.value.message())
    assert site.outside() == before
    assert not (site.root / "canary2").exists() and list(tmp_path.iterdir()) == []
    index = client.get_model_repository_index(as_json=True)["models"]
    assert not any(entry["name"].startswith(("..", "/")) for entry in index)
    client.close()


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/models/./load",
        "/v2/repository/models/../load",
        "/v2/repository/models/%2E%2E/load",
        "/v2/repository/models/%2E/load",
        "/v2/repository/models/a%5Cb/load",
        "/v2/repository/models/a%00b/load",
        "/v2/repository/models/a%0Ab/load",
        "/v2/repository/models/" + "y" * 256 + "/load",
    ],
)
def test_http_load_of_a_name_that_is_no_folder_name(site: Site, private_copy: Path, path: str) -> None:
    before, state_before = site.outside(), _state_snapshot(site.state)
    reply = request(site.server.http_url, "POST", path, "")
    if reply.status == 404:
        # The router normalised the path away from the load route: then nothing could be loaded either.
        assert path in ("/v2/repository/models/./load", "/v2/repository/models/../load")
    elif path in ("/v2/repository/models/%2E%2E/load", "/v2/repository/models/../load"):
        assert reply.status == 400, reply
        assert "model name must not contain path traversal characters" in reply.error()
    else:
        assert reply.status == 500, reply
        assert POLL_FAILURE in reply.error() and "cannot be a model name" in reply.error()
    assert site.outside() == before
    assert _state_snapshot(site.state) == state_before
    assert private_copy.is_dir()


def test_unload_and_history_refuse_such_names(site: Site) -> None:
    http = httpclient.InferenceServerClient(site.server.http_url)
    grpc = grpcclient.InferenceServerClient(site.server.grpc_url)
    before = site.outside()
    for name in ("..", "", "a\0b"):
        with pytest.raises(InferenceServerException) as caught:
            grpc.unload_model(name)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "cannot be a model name" in str(caught.value.message())
    reply = request(site.server.http_url, "POST", "/v2/repository/models/%2E%2E/unload", "")
    assert reply.status == 400 and "cannot be a model name" in reply.error()
    reply = request(site.server.http_url, "GET", "/v2/edged/models/a%5Cb/history")
    assert reply.status == 400 and "cannot be a model name" in reply.error()
    assert site.outside() == before
    assert http.is_model_ready("add_sub")
    grpc.close()
    http.close()


def test_odd_but_valid_names_are_just_unknown(site: Site) -> None:
    # Shell metacharacters and odd Unicode are allowed in a folder name: such a model is simply not there.
    before = site.outside()
    client = grpcclient.InferenceServerClient(site.server.grpc_url)
    for name in (";rm -rf $HOME", "a|b&c`d`", "$(reboot)", "名前", "\u202etxt.exe", "'\"*?~#!"):
        with pytest.raises(InferenceServerException) as caught:
            client.load_model(name)
        assert caught.value.message() == f"failed to load '{name}', failed to poll from model repository", name
    assert site.outside() == before
    client.close()


def test_a_folder_whose_name_cannot_be_a_model_name_is_not_served(site: Site) -> None:
    client = httpclient.InferenceServerClient(site.server.http_url)
    names = {entry["name"] for entry in client.get_model_repository_index()}
    assert "add_sub" in names and ODD_FOLDER not in names
    assert "is not served: its name cannot be a model name (it contains a control character)" in site.server.log()
    client.close()


def test_a_load_override_lands_in_the_state_directory_only(site: Site) -> None:
    client = httpclient.InferenceServerClient(site.server.http_url)
    before = site.outside()
    model = (site.root / "repo" / "add_sub" / "1" / "model.onnx").read_bytes()
    config = json.dumps({"name": "uploaded", "platform": "onnxruntime_onnx", "max_batch_size": 8})
    files = {"file:1/model.onnx": model}
    client.load_model("uploaded", config=config, files=files, headers=bearer(api_token(site.server)))
    assert client.is_model_ready("uploaded")
    assert site.outside() == before
    assert list((site.state / "overrides").iterdir()) == [site.state / "overrides" / "uploaded"]
    client.unload_model("uploaded")
    client.close()


def test_a_body_that_is_not_an_object_is_refused(site: Site) -> None:
    for route in ("load", "unload"):
        reply = request(site.server.http_url, "POST", f"/v2/repository/models/add_sub/{route}", "[1,2]")
        assert reply.status == 400, reply
        assert reply.error() == f"the {route} request body must be a JSON object, got an array"
    reply = post_json(site.server.http_url, "/v2/repository/models/add_sub/unload", {"parameters": {}})
    assert reply.status == 200
    httpclient.InferenceServerClient(site.server.http_url).load_model("add_sub")


# --- the rule, as properties ----------------------------------------------------------------------------------

_FORBIDDEN: Final = ["/", "\\", "\0", *map(chr, range(0x20)), "\x7f", "\x85", "\x9f"]


@given(st.text(min_size=1, max_size=80))
def test_an_accepted_name_is_exactly_one_folder_inside_its_parent(name: str) -> None:
    if model_name_problem(name) is not None:
        return
    assert name not in (".", "..") and not any(char in name for char in _FORBIDDEN)
    root = Path("/srv/models")
    joined = os.path.normpath(os.path.join(root, name))
    assert os.path.dirname(joined) == str(root) and os.path.basename(joined) == name


@given(st.text(max_size=40), st.sampled_from(_FORBIDDEN), st.text(max_size=40))
def test_a_name_with_a_separator_nul_or_control_character_is_refused(head: str, bad: str, tail: str) -> None:
    assert model_name_problem(head + bad + tail) is not None


@given(st.integers(min_value=1, max_value=400), st.sampled_from(["a", "é", "名", "🙂"]))
def test_the_byte_length_limit(count: int, char: str) -> None:
    name = char * count
    fits = len(name.encode()) <= MAX_NAME_BYTES
    assert (model_name_problem(name) is None) == fits


def test_the_dot_names_empty_and_lone_surrogates_are_refused() -> None:
    for name in ("", ".", "..", "\udcff"):
        assert model_name_problem(name) is not None, repr(name)
    for name in ("...", ".hidden", "a.b", "add_sub", "v1 (copy)", "名前"):
        assert model_name_problem(name) is None, name


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=60))
def test_every_accepted_name_can_be_made_as_a_folder(name: str) -> None:
    if model_name_problem(name) is not None:
        return
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / name).mkdir()
        assert os.listdir(scratch) == [name]


# --- the file operations themselves ----------------------------------------------------------------------------


def test_private_copies_refuse_what_is_not_a_model_name(tmp_path: Path) -> None:
    root = tmp_path / "models"
    copies = PrivateCopies(root)
    for name in ("..", "../x", "", "a/b", "/etc"):
        with pytest.raises(PathOutsideRoot):
            copies.base(name)
        assert copies.current(name) is None
    assert not root.exists()


def test_settle_never_follows_a_link_out_of_the_state_directory(tmp_path: Path) -> None:
    root, victim = tmp_path / "models", tmp_path / "victim"
    (victim / "123").mkdir(parents=True)
    (root / "m").mkdir(parents=True)
    os.symlink(victim, root / "m" / "456")  # a link where a generation would be
    os.symlink(victim, root / "linked")  # a model folder that is a link
    copies = PrivateCopies(root)
    copies.settle("m", None, None)
    copies.settle("linked", None, None)
    assert (victim / "123").is_dir()
    assert not (root / "m" / "456").exists()  # the link itself went, not what it points at


def test_inside_refuses_escapes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    os.symlink(tmp_path, root / "up")
    for path in (root / ".." / "x", root / "up" / "x", tmp_path / "x", root, root / "sub" / ".."):
        with pytest.raises(PathOutsideRoot):
            inside(root, path)
    assert inside(root, root / "sub" / "x") == root.resolve() / "sub" / "x"
    with pytest.raises(PathOutsideRoot):
        remove_tree(root, root / "up" / "sub")
    assert tmp_path.is_dir()
