"""sync_once against a real Azure Blob Storage endpoint: Azurite, reached as ``as://devstoreaccount1/container/prefix``
through AZURE_STORAGE_ENDPOINT, with the account's key as Triton takes it (AZURE_STORAGE_KEY or the credential
file's "as" entry)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import synccases
from objectstores import AZURITE_ACCOUNT, AZURITE_KEY, AzureContainer, FaultProxy, azurite, tree, write_repository
from test_sync_signed import first_publish

from edged.sync import SourceProblem, SyncError, open_repository, sync_once

CONTAINER: Final = "models"
_prefixes = itertools.count()


def azure_env(endpoint: str, key: str = AZURITE_KEY) -> dict[str, str]:
    return {"AZURE_STORAGE_ENDPOINT": f"http://{endpoint}/{AZURITE_ACCOUNT}", "AZURE_STORAGE_KEY": key}


@pytest.fixture(scope="module")
def azurite_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with azurite(tmp_path_factory.mktemp("azurite")) as port:
        yield port


@pytest.fixture(scope="module")
def container(azurite_port: int) -> AzureContainer:
    return AzureContainer(azurite_port, CONTAINER)


@pytest.fixture
def remote(azurite_port: int, container: AzureContainer) -> synccases.Remote:
    prefix = f"repository-{next(_prefixes)}"

    def locate(endpoint: str) -> tuple[str, dict[str, str]]:
        return f"as://{AZURITE_ACCOUNT}/{CONTAINER}/{prefix}", azure_env(endpoint)

    return synccases.Remote(container, prefix, locate, f"127.0.0.1:{azurite_port}")


@pytest.fixture
def proxy(azurite_port: int) -> Iterator[FaultProxy]:
    with FaultProxy(azurite_port).running() as running:
        yield running


def test_first_sync_then_one_change(remote: synccases.Remote, tmp_path: Path) -> None:
    synccases.first_sync_then_one_change(remote, tmp_path)


# No case of escaping keys: obstore refuses to write (and to list) keys with '..', empty components or control
# characters, and Azure stores a backslash as a '/'.


def test_interrupted_download_resumes(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.interrupted_download_resumes(remote, tmp_path, proxy)


def test_network_down_keeps_current(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.network_down_keeps_current(remote, tmp_path, proxy)


def test_killed_mid_download_resumes(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.killed_mid_download_resumes(remote, tmp_path, proxy)


def test_stalled_download_resumes(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.stalled_download_resumes(remote, tmp_path, proxy)


def test_repeatedly_cut_download_completes(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.repeatedly_cut_download_completes(remote, tmp_path, proxy)


def test_stalled_listing_keeps_current(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.stalled_listing_keeps_current(remote, tmp_path, proxy)


def test_idle_connection_dropped_between_runs(remote: synccases.Remote, tmp_path: Path, azurite_port: int) -> None:
    with FaultProxy(azurite_port, keep_alive=True).running() as keeping_alive:
        synccases.idle_connection_dropped_between_runs(remote, tmp_path, keeping_alive)


def _fails(url: str, env: dict[str, str], state: Path) -> SyncError:
    async def run() -> None:
        source = open_repository(url, env)
        try:
            await sync_once(source, state)
        finally:
            await source.close()

    with pytest.raises(SyncError) as failed:
        asyncio.run(run())
    return failed.value


def test_a_missing_container_is_told_apart(azurite_port: int, tmp_path: Path) -> None:
    env = azure_env(f"127.0.0.1:{azurite_port}")
    failed = _fails(f"as://{AZURITE_ACCOUNT}/no-such-container/repository", env, tmp_path / "state")
    assert failed.problem is SourceProblem.NOT_FOUND, failed


def test_a_wrong_key_is_denied(azurite_port: int, container: AzureContainer, tmp_path: Path) -> None:
    env = azure_env(f"127.0.0.1:{azurite_port}", base64.b64encode(b"not the account's key").decode())
    failed = _fails(f"as://{AZURITE_ACCOUNT}/{CONTAINER}/repository", env, tmp_path / "state")
    assert failed.problem is SourceProblem.DENIED, failed
    assert AZURITE_KEY not in str(failed)


def test_the_credential_file_entry_for_the_url_is_used(
    azurite_port: int, container: AzureContainer, tmp_path: Path
) -> None:
    """Triton's credential file: the longest "as" entry the URL starts with gives the key, and the variables are
    not read at all while the file is in use."""
    files = write_repository(tmp_path / "published")
    prefix = f"repository-{next(_prefixes)}"
    for key, data in files.items():
        container.put(f"{prefix}/{key}", data)
    url = f"as://{AZURITE_ACCOUNT}/{CONTAINER}/{prefix}"
    wrong = base64.b64encode(b"another key").decode()
    credentials = tmp_path / "credentials.json"
    credentials.write_text(
        json.dumps(
            {"as": {"": {"account_key": wrong}, f"as://{AZURITE_ACCOUNT}/{CONTAINER}": {"account_key": AZURITE_KEY}}}
        )
    )
    env = azure_env(f"127.0.0.1:{azurite_port}", wrong) | {"TRITON_CLOUD_CREDENTIAL_PATH": str(credentials)}
    remote = synccases.Remote(container, prefix, lambda _: (url, env), f"127.0.0.1:{azurite_port}")
    assert tree(remote.sync(tmp_path / "state").repository) == files

    credentials.write_text(json.dumps({"as": {"": {"account_key": wrong}}}))
    assert _fails(url, env, tmp_path / "state").problem is SourceProblem.DENIED


def test_the_emulator_switch_finds_azurite(azurite_port: int, container: AzureContainer, tmp_path: Path) -> None:
    """AZURE_STORAGE_USE_EMULATOR with AZURITE_BLOB_STORAGE_URL: Azurite's account, addressed by path, and its
    well-known key when none is given."""
    files = write_repository(tmp_path / "published")
    prefix = f"repository-{next(_prefixes)}"
    for key, data in files.items():
        container.put(f"{prefix}/{key}", data)
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{azurite_port}"}
    url = f"as://{AZURITE_ACCOUNT}/{CONTAINER}/{prefix}"
    remote = synccases.Remote(container, prefix, lambda _: (url, env), f"127.0.0.1:{azurite_port}")
    assert tree(remote.sync(tmp_path / "state").repository) == files


def test_publish_sync_and_a_tampered_file(azurite_port: int, container: AzureContainer, tmp_path: Path) -> None:
    """`edged publish` writes and deletes through the same client; the device verifies what it downloads against the
    signed sha256, which Azure's ETags cannot give."""
    prefix = f"signed-{next(_prefixes)}"
    url = f"as://{AZURITE_ACCOUNT}/{CONTAINER}/{prefix}"
    signed, first = first_publish(container, prefix, url, azure_env(f"127.0.0.1:{azurite_port}"), tmp_path)
    assert first.revision == "v1"
    assert any(name.startswith(f"{prefix}/.edged/metadata/") for name in container.names())
    config = "add_sub/config.pbtxt"
    signed.change(config, signed.files[config] + b"\n# retuned\n")
    assert signed.publish().uploaded == (config,)
    signed.put(config, bytes(len(signed.files[config])))
    signed.refused(SourceProblem.VERIFY_FAILED, config, "sha256")
    signed.put(config, signed.files[config])
    second = signed.sync()
    assert second.revision == "v2" and second.downloaded == (config,)
    assert tree(second.repository) == signed.files
