"""The sync plan: which remote keys may become local paths, and the delta between a listing and a snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edged.core.confined import inside
from edged.sync import LocalEntry, RemoteEntry, SourceProblem, SyncError, check_listing, key_problem, plan_delta
from edged.sync.plan import MAX_KEY_DEPTH, ListingRefused, revision_of
from edged.sync.sources import parse_repository_url


def remote(path: str, size: int = 10, digest: str = "md5:aa") -> RemoteEntry:
    return RemoteEntry(path, size, digest)


def local(path: str, size: int = 10, digest: str = "md5:aa") -> LocalEntry:
    return LocalEntry(path, size, digest, "sha")


@pytest.mark.parametrize(
    "key", ["add_sub/config.pbtxt", "add_sub/1/model.onnx", "labels.txt", "m/1/..x", "m/.hidden", "m/sp ace/%41"]
)
def test_keys_a_repository_holds_are_accepted(key: str) -> None:
    assert key_problem(key) is None


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("", "empty"),
        ("../evil", "'..'"),
        ("m/../../evil", "'..'"),
        ("m/./x", "'.'"),
        ("/etc/passwd", "absolute"),
        ("m//x", "empty"),
        ("m/x/", "empty"),
        ("m\\..\\evil", "'\\'"),
        ("m/x\0y", "NUL"),
        ("m/x\x01", "control"),
        ("m/x\x85", "control"),
        ("m/\ud800", "Unicode"),
        ("m/" + "x" * 256, "the 255 a folder name"),
        ("/".join(["d"] * (MAX_KEY_DEPTH + 1)), "deep"),
        ("/".join(["x" * 200] * 21), "4096"),
    ],
)
def test_keys_that_could_escape_or_mislead_are_refused(key: str, why: str) -> None:
    problem = key_problem(key)
    assert problem is not None and why in problem, problem


@given(st.text(max_size=40))
def test_an_accepted_key_stays_inside_the_snapshot(key: str) -> None:
    if key_problem(key) is None:
        root = Path("/state/sync/snapshot/repo")
        assert inside(root, root / key).is_relative_to(root)


def test_one_bad_key_refuses_the_whole_listing() -> None:
    with pytest.raises(ListingRefused, match=r"\.\."):
        check_listing([remote("m/config.pbtxt"), remote("m/../../evil")])


def test_folder_markers_are_dropped_and_a_file_that_is_a_folder_is_refused() -> None:
    listing = check_listing([remote("m/1/model.onnx"), remote("m/1", size=0), remote("m", size=0), remote("a")])
    assert [e.path for e in listing] == ["a", "m/1/model.onnx"]
    with pytest.raises(ListingRefused, match="both a file and a folder"):
        check_listing([remote("m/1/model.onnx"), remote("m/1", size=5)])
    with pytest.raises(ListingRefused, match="twice"):
        check_listing([remote("a"), remote("a")])


def test_the_delta_is_by_digest_and_size() -> None:
    current = {
        "same": local("same"),
        "new_digest": local("new_digest"),
        "new_size": local("new_size"),
        "gone": local("gone"),
    }
    listing = [
        remote("added"),
        remote("new_digest", digest="md5:bb"),
        remote("new_size", size=11),
        remote("same"),
    ]
    plan = plan_delta(listing, current)
    assert [e.path for e in plan.download] == ["added", "new_digest", "new_size"]
    assert [e.path for e in plan.keep] == ["same"]
    assert plan.remove == ("gone",)
    assert plan.changed and plan.download_bytes == 31


def test_an_unchanged_listing_plans_nothing() -> None:
    plan = plan_delta([remote("a"), remote("b")], {"a": local("a"), "b": local("b")})
    assert not plan.changed and plan.download == () and plan.remove == ()


def test_a_revision_names_the_content() -> None:
    listing = [remote("a"), remote("b", digest="md5:bb")]
    assert revision_of(listing) == revision_of(reversed(listing))
    assert revision_of(listing) != revision_of([remote("a"), remote("b", digest="md5:bc")])
    assert revision_of(listing) != revision_of([remote("a"), remote("b", size=11, digest="md5:bb")])
    assert revision_of(listing) != revision_of([remote("a"), remote("c", digest="md5:bb")])


@pytest.mark.parametrize(
    ("url", "bucket", "prefix", "endpoint"),
    [
        ("s3://models/repo", "models", "repo", None),
        ("s3://models", "models", "", None),
        ("s3://models/a/b/", "models", "a/b", None),
        ("s3://minio.local:9000/models/repo", "models", "repo", "http://minio.local:9000"),
        ("s3://https://minio.local:9000/models/repo", "models", "repo", "https://minio.local:9000"),
        ("gs://models/repo", "models", "repo", None),
    ],
)
def test_triton_repository_urls(url: str, bucket: str, prefix: str, endpoint: str | None) -> None:
    parsed = parse_repository_url(url)
    assert (parsed.bucket, parsed.prefix, parsed.endpoint) == (bucket, prefix, endpoint)
    assert parse_repository_url(str(parsed)) == parsed


@pytest.mark.parametrize(
    "url", ["/models", "http://host/models", "s3://", "gs:///repo", "s3://models/a//b", "as://x/y"]
)
def test_urls_that_name_no_repository_are_refused(url: str) -> None:
    with pytest.raises(SyncError) as refused:
        parse_repository_url(url)
    assert refused.value.problem is SourceProblem.BAD_URL


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("<Error><Code>InvalidAccessKeyId</Code></Error>", SourceProblem.DENIED),
        ("<Error><Code>SignatureDoesNotMatch</Code></Error>", SourceProblem.DENIED),
        (
            "<Error><Code>AuthorizationHeaderMalformed</Code><Region>eu-west-1</Region></Error>",
            SourceProblem.WRONG_REGION,
        ),
        ("<Error><Code>PermanentRedirect</Code></Error>", SourceProblem.WRONG_REGION),
        ("<Error><Code>NoSuchBucket</Code></Error>", SourceProblem.NOT_FOUND),
    ],
)
def test_s3_errors_say_what_the_operator_has_to_fix(body: str, problem: SourceProblem) -> None:
    """The error texts obstore raises for S3's answers: the first line from the client, the XML body after it."""
    from obstore.exceptions import GenericError

    from edged.sync.s3 import _s3_error

    error = GenericError(
        "Generic S3 error: Error performing list http://s3/models?list-type=2 in 30ms - Server returned non-2xx "
        f"status code: 400 Bad Request: \n{body}"
    )
    assert _s3_error(error, "s3://models").problem is problem


def test_an_unreachable_s3_endpoint_is_told_apart() -> None:
    from obstore.exceptions import GenericError

    from edged.sync.s3 import _s3_error

    error = GenericError(
        "Generic S3 error: Error performing list ... after 2 retries - HTTP error: error sending request"
    )
    assert _s3_error(error, "s3://models").problem is SourceProblem.UNREACHABLE
