"""Azure Blob Storage repositories as Triton names them: the as:// URL forms, the credentials (AZURE_STORAGE_*
variables, the credential file's "as" entries, systemd's credential), the endpoint variables, and the message of a
device without the sync clients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from edged.config.values import is_remote
from edged.sync import SourceProblem, SyncError, parse_repository_url
from edged.sync.azure import EMULATOR_URL, endpoint_for
from edged.sync.credentials import AzureCredentials, azure_credentials, with_systemd_credentials
from edged.sync.errors import INSTALL_HINT

KEY: Final = "c2VjcmV0IGtleSBvZiB0aGUgYWNjb3VudA=="


@pytest.mark.parametrize(
    ("url", "account", "container", "prefix"),
    [
        ("as://account1/models", "account1", "models", ""),
        ("as://account1/models/", "account1", "models", ""),
        ("as://account1/models/fleet/a", "account1", "models", "fleet/a"),
        ("as://account1.blob.core.windows.net/models/repo", "account1", "models", "repo"),
    ],
)
def test_triton_azure_urls(url: str, account: str, container: str, prefix: str) -> None:
    parsed = parse_repository_url(url)
    assert (parsed.account, parsed.bucket, parsed.prefix) == (account, container, prefix)
    assert parse_repository_url(str(parsed)) == parsed
    assert is_remote(url)


@pytest.mark.parametrize(
    "url",
    [
        "as://",
        "as://account1",
        "as://account1/",
        "as://Account1/models",
        "as://ab/models",
        "as://account1/Models",
        "as://account1/a--b",
        "as://account1/models/a//b",
        "as://account1/models/repo?sv=2024&sig=x",
    ],
)
def test_azure_urls_that_name_no_container_are_refused(url: str) -> None:
    with pytest.raises(SyncError) as refused:
        parse_repository_url(url)
    assert refused.value.problem is SourceProblem.BAD_URL


def test_credentials_from_the_variables_as_triton_reads_them() -> None:
    assert azure_credentials("as://account1/models", {}) == AzureCredentials()
    env = {
        "AZURE_STORAGE_ACCOUNT": "other1",
        "AZURE_STORAGE_KEY": KEY,
        "AZURE_STORAGE_AUTH_TYPE": "managed_identity",
        "AZURE_STORAGE_CLIENT_ID": "1234",
    }
    found = azure_credentials("as://account1/models", env)
    assert found == AzureCredentials("other1", "managed_identity", KEY, "1234")
    assert KEY not in repr(found)


def test_the_longest_as_entry_of_the_credential_file_wins(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text(
        json.dumps(
            {
                "as": {
                    "": {"account_str": "default1", "account_key": KEY},
                    "as://account1/models": {"auth_type": "default"},
                }
            }
        )
    )
    env = {"TRITON_CLOUD_CREDENTIAL_PATH": str(path), "AZURE_STORAGE_KEY": KEY}
    assert azure_credentials("as://account1/models/repo", env) == AzureCredentials(auth_type="default")
    assert azure_credentials("as://account2/models", env) == AzureCredentials("default1", "key", KEY)


@pytest.mark.parametrize(
    "entry",
    [{"auth_type": "sas"}, {"account_key": "not base64!"}, {"account_key": 5}, "a key"],
    ids=["auth-type", "key", "not-string", "not-object"],
)
def test_malformed_as_entries_are_credential_problems(tmp_path: Path, entry: object) -> None:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"as": {"": entry}}))
    with pytest.raises(SyncError) as refused:
        azure_credentials("as://account1/models", {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)})
    assert refused.value.problem is SourceProblem.CREDENTIALS
    assert "not base64!" not in str(refused.value)


def test_the_key_from_a_systemd_credential(tmp_path: Path) -> None:
    (tmp_path / "azure-storage-key").write_text(KEY + "\n")
    env = with_systemd_credentials({"CREDENTIALS_DIRECTORY": str(tmp_path), "AZURE_STORAGE_KEY": "old"})
    assert azure_credentials("as://account1/models", env).account_key == KEY


def test_endpoints_for_azure_azurite_and_a_private_one() -> None:
    assert endpoint_for("account1", {}) == ("https://account1.blob.core.windows.net", False)
    emulated = {"AZURE_STORAGE_USE_EMULATOR": "true"}
    assert endpoint_for("devstoreaccount1", emulated) == (f"{EMULATOR_URL}/devstoreaccount1", True)
    private = {"AZURE_STORAGE_ENDPOINT": "https://blobs.example:8443/account1/"} | emulated
    assert endpoint_for("account1", private) == ("https://blobs.example:8443/account1", False)
    with pytest.raises(SyncError) as refused:
        endpoint_for("account1", {"AZURE_ENDPOINT": "blobs.example"})
    assert refused.value.problem is SourceProblem.BAD_URL


def test_without_the_clients_as_urls_say_what_to_install() -> None:
    # A process where obstore cannot be imported, as on a device without the edged-sync package.
    script = (
        "import sys\n"
        "sys.modules['obstore'] = None\n"
        "from edged.sync.errors import SyncError\n"
        "from edged.sync.sources import open_repository\n"
        "try:\n"
        "    open_repository('as://account1/models/repo', {})\n"
        "except SyncError as error:\n"
        "    print(error.problem.name, error)\n"
    )
    said = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert said.startswith("MISSING_CLIENT ") and INSTALL_HINT in said, said
