"""Archive inspection and extraction (edged.core.repository.archives) and the upload rules of
edged.core.repository.uploads, in process: member names, links, devices, sizes, layouts, and where uploads go."""

from __future__ import annotations

import asyncio
import io
import stat
import sys
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

import pytest

from edged.backends import BackendRegistry
from edged.config.options import OPTIONS
from edged.config.settings import Settings
from edged.core.repository.archives import ArchiveLimits, ArchiveRefused, Member, extract, inspect, member_path
from edged.core.repository.control import ModelController
from edged.core.repository.manager import ManagerOptions, ModelRepositoryManager
from edged.core.repository.modes import ControlMode, ControlOptions
from edged.core.repository.scan import ModelSource
from edged.core.repository.uploads import ModelUploads, UploadInvalid, UploadOptions, _plan
from edged.daemon.sync import mirrors
from edged.errors import EdgedError, ErrorCode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import modelgen  # type: ignore[import-not-found, unused-ignore]


def write_zip(path: Path, *members: tuple[str | zipfile.ZipInfo, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return path


def write_tar(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as archive:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def tar_member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


# --- member names -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../x", "'..'"),
        ("1/../../x", "'..'"),
        ("/etc/passwd", "absolute"),
        ("1\\x", "backslash"),
        ("1/a\0b", "NUL"),
        ("1/a\x1bb", "control character"),
        ("1/" + "a" * 256, "bytes long"),
        ("/".join(["d"] * 40), "deep"),
    ],
)
def test_unsafe_member_names_are_refused(name: str, why: str) -> None:
    with pytest.raises(ArchiveRefused) as refused:
        member_path(name)
    assert why in refused.value.message


def test_member_names_are_normalised() -> None:
    assert member_path("./1/model.onnx") == PurePosixPath("1/model.onnx")
    assert member_path("add_sub//config.pbtxt") == PurePosixPath("add_sub/config.pbtxt")
    assert member_path("./") is None and member_path(".") is None


# --- inspection ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (tar_member("1/m", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link"),
        (tar_member("1/m", tarfile.LNKTYPE, "config.pbtxt"), "hard link"),
        (tar_member("1/m", tarfile.CHRTYPE), "device file"),
        (tar_member("1/m", tarfile.BLKTYPE), "device file"),
        (tar_member("1/m", tarfile.FIFOTYPE), "FIFO"),
        (tar_member("../../m"), "'..'"),
    ],
)
def test_unsafe_tar_members_are_refused(tmp_path: Path, member: tarfile.TarInfo, why: str) -> None:
    archive = write_tar(tmp_path / "a.tar.gz", (tar_member("config.pbtxt"), b""), (member, b""))
    with pytest.raises(ArchiveRefused) as refused:
        inspect(archive, "tar", ArchiveLimits())
    assert why in refused.value.message


def test_unsafe_zip_members_are_refused(tmp_path: Path) -> None:
    link = zipfile.ZipInfo("1/m")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    device = zipfile.ZipInfo("1/d")
    device.external_attr = (stat.S_IFCHR | 0o600) << 16
    for member, why in ((link, "symbolic link"), (device, "device file"), ("../m", "'..'")):
        archive = write_zip(tmp_path / "a.zip", (member, b"x"))
        with pytest.raises(ArchiveRefused) as refused:
            inspect(archive, "zip", ArchiveLimits())
        assert why in refused.value.message


def test_limits_are_checked_on_declared_sizes_and_counts(tmp_path: Path) -> None:
    small = ArchiveLimits(max_members=3, max_extracted_bytes=1000)
    many = write_zip(tmp_path / "many.zip", *((f"1/{i}", b"") for i in range(4)))
    with pytest.raises(ArchiveRefused, match="4 members"):
        inspect(many, "zip", small)
    many_tar = write_tar(tmp_path / "many.tar.gz", *((tar_member(f"1/{i}"), b"") for i in range(4)))
    with pytest.raises(ArchiveRefused, match="members"):
        inspect(many_tar, "tar", small)
    big = write_zip(tmp_path / "big.zip", ("1/a", b"\0" * 600), ("1/b", b"\0" * 600))
    with pytest.raises(ArchiveRefused, match="more than 1000 bytes"):
        inspect(big, "zip", small)
    assert [m.size for m in inspect(big, "zip", ArchiveLimits())] == [600, 600]


def test_duplicates_and_files_used_as_folders_are_refused(tmp_path: Path) -> None:
    duplicate = write_zip(tmp_path / "d.zip", ("1/a", b""), ("1/b", b""))
    # zipfile writes the second name as given: patch it into a duplicate of the first.
    duplicate.write_bytes(duplicate.read_bytes().replace(b"1/b", b"1/a"))
    with pytest.raises(ArchiveRefused, match="more than once"):
        inspect(duplicate, "zip", ArchiveLimits())
    shadow = write_tar(tmp_path / "s.tar.gz", (tar_member("1"), b"x"), (tar_member("1/a"), b"y"))
    with pytest.raises(ArchiveRefused, match="not a folder"):
        inspect(shadow, "tar", ArchiveLimits())


def test_macos_litter_is_dropped(tmp_path: Path) -> None:
    archive = write_zip(
        tmp_path / "m.zip", ("m/config.pbtxt", b""), ("__MACOSX/m/._config.pbtxt", b""), ("m/.DS_Store", b"")
    )
    assert [m.path for m in inspect(archive, "zip", ArchiveLimits())] == [PurePosixPath("m/config.pbtxt")]


# --- extraction ---------------------------------------------------------------------------------------------


def test_a_member_that_inflates_past_its_declared_size_is_refused(tmp_path: Path) -> None:
    data = bytearray(write_zip(tmp_path / "z.zip", ("1/m", b"\0" * 65536)).read_bytes())
    local, central = data.find(b"PK\x03\x04"), data.find(b"PK\x01\x02")
    data[local + 22 : local + 26] = (100).to_bytes(4, "little")
    data[central + 24 : central + 28] = (100).to_bytes(4, "little")
    (tmp_path / "z.zip").write_bytes(bytes(data))
    members = inspect(tmp_path / "z.zip", "zip", ArchiveLimits())
    assert members == [Member(PurePosixPath("1/m"), False, 100)]
    root = tmp_path / "out"
    root.mkdir()
    with pytest.raises(ArchiveRefused, match="1/m"):
        extract(tmp_path / "z.zip", "zip", {PurePosixPath("1/m"): PurePosixPath("1/m")}, [], root, ArchiveLimits())


def test_extraction_writes_only_what_is_mapped(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "a.tar.gz", (tar_member("a/config.pbtxt"), b"c"), (tar_member("a/1/m"), b"m"))
    root = tmp_path / "out"
    root.mkdir()
    written = extract(
        archive, "tar", {PurePosixPath("a/1/m"): PurePosixPath("7/m")}, [PurePosixPath("empty")], root, ArchiveLimits()
    )
    assert written == 1
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["7", "7/m", "empty"]


# --- layouts ------------------------------------------------------------------------------------------------


def members(*names: str) -> list[Member]:
    return [Member(PurePosixPath(name.rstrip("/")), name.endswith("/"), 1) for name in names]


EXISTING = ModelSource("m", Path("/nowhere/m"), Path("/nowhere"))


def test_a_model_folder_in_a_top_folder_is_a_new_model() -> None:
    plan = _plan("m", members("m/config.pbtxt", "m/1/model.onnx", "m/2/model.onnx", "m/labels.txt"), None)
    assert plan.versions == [1, 2] and plan.has_config
    assert plan.files[PurePosixPath("m/1/model.onnx")] == PurePosixPath("1/model.onnx")


def test_the_files_of_a_version_are_the_next_version_of_an_existing_model() -> None:
    plan = _plan("m", members("model.onnx", "extra/weights.bin"), EXISTING)
    assert plan.files == {
        PurePosixPath("model.onnx"): PurePosixPath("_version/model.onnx"),
        PurePosixPath("extra/weights.bin"): PurePosixPath("_version/extra/weights.bin"),
    }
    # A single folder that is not a model folder is a version's content (a SavedModel), never dropped.
    saved = _plan("m", members("model.savedmodel/saved_model.pb"), EXISTING)
    assert PurePosixPath("_version/model.savedmodel/saved_model.pb") in saved.files.values()
    numbered = _plan("m", members("3/model.onnx"), EXISTING)
    assert numbered.files == {PurePosixPath("3/model.onnx"): PurePosixPath("_version/model.onnx")}


@pytest.mark.parametrize(
    ("names", "existing", "why"),
    [
        (("model.onnx",), None, "does not exist"),
        (("config.pbtxt",), None, "no version folder"),
        (("1/a", "2/a"), EXISTING, "1, 2"),
        (("config.pbtxt", "1/a", "labels.txt"), EXISTING, "labels.txt"),
        (("1/",), EXISTING, "no files"),
    ],
)
def test_layouts_that_are_refused(names: tuple[str, ...], existing: ModelSource | None, why: str) -> None:
    with pytest.raises(UploadInvalid) as refused:
        _plan("m", members(*names), existing)
    assert why in refused.value.message


# --- where uploads go ---------------------------------------------------------------------------------------


def uploads_for(tmp_path: Path, repositories: list[Path], synced: frozenset[Path]) -> ModelUploads:
    manager = ModelRepositoryManager(ManagerOptions(repositories), ThreadPoolExecutor(1), BackendRegistry({}))
    controller = ModelController(manager, ControlOptions(mode=ControlMode.EXPLICIT, state_dir=tmp_path), None)
    return ModelUploads(controller, manager, UploadOptions(tmp_path / "state", synced=synced))


def test_synced_models_are_refused_and_new_models_go_to_the_first_local_repository(tmp_path: Path) -> None:
    mirror, local = tmp_path / "mirror", tmp_path / "local"
    modelgen.write_add_sub(mirror / "from_bucket", max_batch_size=8, dims=16, dtype="FP32")
    local.mkdir()
    uploads = uploads_for(tmp_path, [mirror, local], frozenset({mirror}))
    with pytest.raises(EdgedError) as refused:
        asyncio.run(uploads.precheck("from_bucket", activate=False))
    assert refused.value.code is ErrorCode.ALREADY_EXISTS and "synced" in refused.value.message
    with pytest.raises(EdgedError) as bad_name:
        asyncio.run(uploads.precheck("..", activate=False))
    assert bad_name.value.code is ErrorCode.INVALID_ARG

    source = tmp_path / "src"
    modelgen.write_add_sub(source / "fresh", max_batch_size=8, dims=16, dtype="FP32")

    async def upload() -> None:
        async with uploads.receiving() as path:
            write_zip(
                path, *((p.relative_to(source).as_posix(), p.read_bytes()) for p in source.rglob("*") if p.is_file())
            )
            result = await uploads.install("fresh", path, "zip", activate=False)
            assert result.created and result.version == 1 and not result.loaded

    asyncio.run(upload())
    assert (local / "fresh" / "1" / "model.onnx").is_file() and not (mirror / "fresh").exists()
    assert not any((tmp_path / "state" / "uploads").iterdir())
    all_synced = uploads_for(tmp_path, [mirror], frozenset({mirror}))
    with pytest.raises(EdgedError, match="every model repository"):
        asyncio.run(all_synced.precheck("another", activate=False))


def test_the_daemon_knows_which_repositories_are_synced_mirrors(tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    values = {option.key: option.default_value() for option in OPTIONS}
    values |= {"model_repository": [str(local), "s3://bucket/models"], "state_dir": str(tmp_path / "state")}
    settings = Settings.from_options(values, {})
    assert mirrors(settings) == frozenset({settings.model_repositories[1]})
    assert settings.model_repositories[0] == local.resolve()
