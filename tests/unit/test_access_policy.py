"""The access policy in-process: every route and RPC has its category, the order of the checks, the parsers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from edged.core.access import (
    AccessDenied,
    AccessOptions,
    AccessPolicy,
    Caller,
    Category,
    Refusal,
    Role,
    TokenVerifier,
    bearer,
    is_loopback,
    load_brings_code,
    new_token,
    parse_categories,
    parse_certificate_role,
    parse_restricted,
)
from edged.frontends.grpc.access import HEALTH_SERVICE, INFERENCE_SERVICE, peer_address
from edged.frontends.http import HttpOptions, create_http_app
from edged.frontends.http.access import http_brings_code, http_category
from edged.proto import grpc_service_pb2, health_pb2

if TYPE_CHECKING:
    from edged.state.store import TokenRecord


def test_every_http_route_has_its_tritons_category() -> None:
    expected = {
        "/v2/health/live": Category.HEALTH,
        "/v2/health/ready": Category.HEALTH,
        "/v2": Category.METADATA,
        "/v2/models/{model}/ready": Category.HEALTH,
        "/v2/models/{model}/versions/{version}/ready": Category.HEALTH,
        "/v2/models/{model}": Category.METADATA,
        "/v2/models/{model}/versions/{version}": Category.METADATA,
        "/v2/models/{model}/config": Category.MODEL_CONFIG,
        "/v2/models/{model}/versions/{version}/config": Category.MODEL_CONFIG,
        "/v2/models/stats": Category.STATISTICS,
        "/v2/models/{model}/stats": Category.STATISTICS,
        "/v2/models/{model}/versions/{version}/stats": Category.STATISTICS,
        "/v2/models/{model}/infer": Category.INFERENCE,
        "/v2/models/{model}/versions/{version}/infer": Category.INFERENCE,
        "/v2/trace/setting": Category.TRACE,
        "/v2/models/{model}/trace/setting": Category.TRACE,
        "/v2/logging": Category.LOGGING,
        "/v2/systemsharedmemory/status": Category.SHARED_MEMORY,
        "/v2/systemsharedmemory/region/{region}/status": Category.SHARED_MEMORY,
        "/v2/systemsharedmemory/region/{region}/register": Category.SHARED_MEMORY,
        "/v2/systemsharedmemory/unregister": Category.SHARED_MEMORY,
        "/v2/systemsharedmemory/region/{region}/unregister": Category.SHARED_MEMORY,
        "/v2/cudasharedmemory/status": Category.SHARED_MEMORY,
        "/v2/cudasharedmemory/region/{region}/status": Category.SHARED_MEMORY,
        "/v2/cudasharedmemory/region/{region}/register": Category.SHARED_MEMORY,
        "/v2/cudasharedmemory/unregister": Category.SHARED_MEMORY,
        "/v2/cudasharedmemory/region/{region}/unregister": Category.SHARED_MEMORY,
        "/v2/repository/index": Category.MODEL_REPOSITORY,
        "/v2/repository/models/{model}/load": Category.MODEL_REPOSITORY,
        "/v2/repository/models/{model}/unload": Category.MODEL_REPOSITORY,
        "/v2/repository/{repository}/index": Category.MODEL_REPOSITORY,
        "/v2/repository/{repository}/models/{model}/load": Category.MODEL_REPOSITORY,
        "/v2/repository/{repository}/models/{model}/unload": Category.MODEL_REPOSITORY,
        "/v2/edged/history": Category.MODEL_REPOSITORY,
        "/v2/edged/models/{model}/history": Category.MODEL_REPOSITORY,
        "/v2/edged/models/{model}/upload": Category.MODEL_REPOSITORY,
        "/v2/edged/models/{model}/versions/{version}/activate": Category.MODEL_REPOSITORY,
        "/v2/edged/models/{model}/rollback": Category.MODEL_REPOSITORY,
        "/v2/edged/models/{model}": Category.MODEL_REPOSITORY,
        "/v2/edged/models/{model}/versions/{version}": Category.MODEL_REPOSITORY,
        "/v2/openapi.json": Category.METADATA,
        "/v2/edged/sync": Category.MODEL_REPOSITORY,
        "/v2/edged/sync/now": Category.MODEL_REPOSITORY,
        "/v2/edged/sync/pause": Category.MODEL_REPOSITORY,
        "/v2/edged/sync/resume": Category.MODEL_REPOSITORY,
        "/v2/edged/sync/history": Category.MODEL_REPOSITORY,
        "/v2/edged/tokens": Category.TOKENS,
        "/v2/edged/metrics/history": Category.STATISTICS,
        "/v2/edged/tokens/{name}": Category.TOKENS,
    }
    # Every route the app serves is listed above: a new route must be given its category.
    served = {
        route.path.replace(":str", "")
        for route in create_http_app(Any, HttpOptions())._app.routes  # type: ignore[arg-type, attr-defined]
    }
    assert served - set(expected) == set()
    for template, category in expected.items():
        # (A model named "stats" has no metadata route: /v2/models/stats is every model's statistics, as in Triton.)
        for model in ("add_sub", "versions", "ready", "config", "infer"):
            path = template.format(model=model, version="3", region="r", repository="x", name="ci-bot")
            assert http_category("POST", path) is category, path
            assert http_category("GET", path + "/") is category, path + "/"
    # Unknown paths count as the most guarded category.
    for path in ("/", "/v2/unknown", "/v2/models/m/unknown", "/metrics", "/v3/models/m/infer"):
        assert http_category("GET", path) is Category.MODEL_REPOSITORY, path


def test_every_rpc_has_its_category() -> None:
    service = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert set(INFERENCE_SERVICE) == {method.name for method in service.methods}
    health = health_pb2.DESCRIPTOR.services_by_name["Health"]
    assert set(HEALTH_SERVICE) == {method.name for method in health.methods}
    assert peer_address("ipv4:10.1.2.3:5000") == "10.1.2.3"
    assert peer_address("ipv6:[::1]:5000") == "::1"
    assert peer_address("unix:/run/edged.sock") is None


class _Store:
    def __init__(self, *records: TokenRecord) -> None:
        self.records = {record.token_id: record for record in records}
        self.lookups = 0
        self.touches: list[tuple[str, datetime, str | None]] = []

    def find_token(self, token_id: str) -> TokenRecord | None:
        self.lookups += 1
        return self.records.get(token_id)

    def add_token(self, token: TokenRecord) -> None:
        self.records[token.token_id] = token

    def tokens(self) -> list[TokenRecord]:
        return list(self.records.values())

    def revoke_token(self, name: str) -> bool:
        return False

    def touch_token(self, token_id: str, at: datetime, peer: str | None) -> None:
        self.touches.append((token_id, at, peer))


def _caller(peer: str, **headers: str) -> Caller:
    return Caller("http", peer, headers)


def test_checks_in_order_restricted_then_guarded_then_open() -> None:
    operator = new_token("op", Role.OPERATOR, None)
    viewer = new_token("view", Role.VIEWER, None)
    store = _Store(operator.record, viewer.record)
    refused: list[tuple[str, Category, Refusal]] = []
    options = AccessOptions(http_restricted=(parse_restricted("logging:admin-key=s3cret", grpc=False),))
    policy = AccessPolicy(options, TokenVerifier(store), lambda *args: refused.append(args))
    outside = "192.0.2.9"
    # Restricted: the header, from anywhere; a token is no substitute.
    assert policy.check(Category.LOGGING, _caller(outside, **{"admin-key": "s3cret"})) == "restricted-header"
    for caller in (_caller("127.0.0.1"), _caller(outside, authorization=f"Bearer {operator.secret}")):
        with pytest.raises(AccessDenied) as denied:
            policy.check(Category.LOGGING, caller)
        assert denied.value.refusal is Refusal.RESTRICTED
        assert denied.value.message == "This API is restricted, expecting header 'admin-key'"
    # Guarded: a token with the role, or loopback.
    assert policy.check(Category.MODEL_REPOSITORY, _caller(outside, authorization=f"Bearer {operator.secret}")) == (
        "token:op"
    )
    assert policy.check(Category.MODEL_REPOSITORY, _caller("::1")) == "loopback"
    assert policy.check(Category.MODEL_REPOSITORY, _caller("::ffff:127.0.0.1")) == "loopback"
    with pytest.raises(AccessDenied) as denied:
        policy.check(Category.MODEL_REPOSITORY, _caller(outside, authorization=f"bearer {viewer.secret}"))
    assert denied.value.refusal is Refusal.FORBIDDEN
    with pytest.raises(AccessDenied) as denied:
        policy.check(Category.SHARED_MEMORY, _caller(outside))
    assert denied.value.refusal is Refusal.UNAUTHENTICATED
    # Open: nobody asked for anything, no token looked up.
    lookups = store.lookups
    assert policy.check(Category.INFERENCE, _caller(outside, authorization="Bearer garbage")) == "anonymous"
    assert store.lookups == lookups
    assert [(wire, category, why) for wire, category, why in refused] == [
        ("http", Category.LOGGING, Refusal.RESTRICTED),
        ("http", Category.LOGGING, Refusal.RESTRICTED),
        ("http", Category.MODEL_REPOSITORY, Refusal.FORBIDDEN),
        ("http", Category.SHARED_MEMORY, Refusal.UNAUTHENTICATED),
    ]
    assert not policy.is_open(Category.LOGGING, "http") and policy.is_open(Category.LOGGING, "grpc") is False
    assert policy.is_open(Category.INFERENCE, "http") and policy.is_open(Category.HEALTH, "grpc")
    # Token management is guarded whatever --guarded-apis says, and only an admin's token grants it.
    nothing_guarded = AccessPolicy(AccessOptions(guarded=frozenset()), TokenVerifier(store))
    assert not nothing_guarded.is_open(Category.TOKENS, "http")
    with pytest.raises(AccessDenied) as denied:
        nothing_guarded.check(Category.TOKENS, _caller(outside, authorization=f"Bearer {operator.secret}"))
    assert denied.value.refusal is Refusal.FORBIDDEN


def test_loopback_is_trusted_short_of_tokens_and_code() -> None:
    admin = new_token("root", Role.ADMIN, None)
    operator = new_token("op", Role.OPERATOR, None)
    viewer = new_token("view", Role.VIEWER, None)
    policy = AccessPolicy(AccessOptions(), TokenVerifier(_Store(admin.record, operator.record, viewer.record)))
    loopback = _caller("127.0.0.1")
    assert policy.check(Category.MODEL_REPOSITORY, loopback) == "loopback"
    # Token management, and a request that brings code: a credential, from loopback too.
    for category, code, what in (
        (Category.TOKENS, False, "token management"),
        (Category.MODEL_REPOSITORY, True, "sending a model's files or config"),
    ):
        for peer in ("127.0.0.1", "::1", "::ffff:127.0.0.2"):
            with pytest.raises(AccessDenied) as denied:
                policy.check(category, _caller(peer), code=code)
            assert denied.value.refusal is Refusal.UNAUTHENTICATED
            assert denied.value.message.startswith(f"{what} needs an API token, from this machine too")
    assert policy.check(Category.TOKENS, _caller("127.0.0.1", authorization=f"Bearer {admin.secret}")) == "token:root"
    with_operator = _caller("127.0.0.1", authorization=f"Bearer {operator.secret}")
    assert policy.check(Category.MODEL_REPOSITORY, with_operator, code=True) == "token:op"
    # A credential presented on loopback is what the request is judged by: a viewer is a viewer there too.
    with_viewer = _caller("127.0.0.1", authorization=f"Bearer {viewer.secret}")
    for code in (False, True):
        with pytest.raises(AccessDenied) as denied:
            policy.check(Category.MODEL_REPOSITORY, with_viewer, code=code)
        assert denied.value.refusal is Refusal.FORBIDDEN
    # From elsewhere the answer is the usual one.
    with pytest.raises(AccessDenied) as denied:
        policy.check(Category.MODEL_REPOSITORY, _caller("192.0.2.9"), code=True)
    assert denied.value.message.startswith("the model-repository API needs an API token from this address")
    # Code in a category the configuration opens is open: the operator chose Triton's exposure for it.
    nothing_guarded = AccessPolicy(AccessOptions(guarded=frozenset()), TokenVerifier(None))
    assert nothing_guarded.check(Category.MODEL_REPOSITORY, _caller("192.0.2.9"), code=True) == "anonymous"
    # And Triton's restricted-API header is a credential.
    restricted = AccessPolicy(
        AccessOptions(http_restricted=(parse_restricted("model-repository:admin-key=s3cret", grpc=False),)),
        TokenVerifier(None),
    )
    caller = _caller("127.0.0.1", **{"admin-key": "s3cret"})
    assert restricted.check(Category.MODEL_REPOSITORY, caller, code=True) == "restricted-header"


def test_what_brings_code() -> None:
    assert load_brings_code({"config": "{}"}) and load_brings_code(["file:1/model.py"])
    assert not load_brings_code({}) and not load_brings_code(["unload_dependents", "files", "configuration"])
    for path in ("/v2/edged/models/m/upload", "//v2//edged/models/m/upload/", "/v2/edged/models/a/b/upload"):
        assert http_brings_code("POST", path), path
    for path in ("/v2/edged/models/m/history", "/v2/repository/models/m/load", "/v2/models/upload/infer"):
        assert not http_brings_code("POST", path), path


def test_tokens_are_looked_up_at_most_every_two_seconds_and_expire() -> None:
    now = [100.0]
    current = new_token("a", Role.ADMIN, datetime.now(UTC) + timedelta(hours=1))
    expired = new_token("b", Role.ADMIN, datetime.now(UTC) - timedelta(seconds=1))
    store = _Store(current.record, expired.record)
    verifier = TokenVerifier(store, clock=lambda: now[0])
    assert verifier.verify(current.secret) == current.record
    assert verifier.verify(current.secret) == current.record
    assert store.lookups == 1
    now[0] += 2.5
    assert verifier.verify(current.secret) is not None and store.lookups == 2
    assert verifier.verify(expired.secret) is None
    assert verifier.verify(current.secret[:-2]) is None  # the secret is checked, not just the id
    assert verifier.verify("edged__") is None and verifier.verify("bearer") is None


def test_a_tokens_last_use_is_written_at_most_once_a_minute_and_shown_at_once() -> None:
    now = [100.0]
    wall = [datetime(2026, 12, 1, 12, 0, tzinfo=UTC)]
    token = new_token("ci", Role.OPERATOR, None)
    store = _Store(token.record)
    verifier = TokenVerifier(store, clock=lambda: now[0], wall=lambda: wall[0], run_write=lambda write: write())
    assert verifier.list()[0].last_used_at is None
    assert verifier.verify(token.secret, "192.0.2.7") is not None
    assert store.touches == [(token.record.token_id, wall[0], "192.0.2.7")]  # the first use is written at once
    for _ in range(1000):  # a busy client: one use after another, none written
        now[0] += 0.001
        wall[0] += timedelta(milliseconds=1)
        assert verifier.verify(token.secret, "192.0.2.8") is not None
    assert len(store.touches) == 1
    # The list shows the newest use from memory, newer than the stored one.
    [view] = verifier.list()
    assert (view.last_used_at, view.last_used_peer) == (wall[0], "192.0.2.8")
    # A minute after the last write, the next use is written.
    now[0] += 60.0
    wall[0] += timedelta(minutes=1)
    verifier.verify(token.secret, "192.0.2.9")
    assert len(store.touches) == 2 and store.touches[-1] == (token.record.token_id, wall[0], "192.0.2.9")
    # Invalid tokens record nothing.
    assert verifier.verify(token.secret[:-2], "192.0.2.10") is None
    assert len(store.touches) == 2 and verifier.list()[0].last_used_peer == "192.0.2.9"


def test_a_failed_write_of_a_last_use_fails_no_request() -> None:
    class Failing(_Store):
        def touch_token(self, token_id: str, at: datetime, peer: str | None) -> None:
            raise OSError("disk full")

    token = new_token("ci", Role.ADMIN, None)
    verifier = TokenVerifier(Failing(token.record), run_write=lambda write: write())
    assert verifier.verify(token.secret, "192.0.2.1") == token.record


def test_parsers() -> None:
    group = parse_restricted("model-repository, logging:Admin-Key=a=b", grpc=True)
    assert group.categories == {Category.MODEL_REPOSITORY, Category.LOGGING}
    assert (group.key, group.value) == ("triton-grpc-protocol-admin-key", "a=b")
    for bad in ("logging", "logging:key", ":k=v", "nothing:k=v", "metrics:k=v"):
        with pytest.raises(ValueError):
            parse_restricted(bad, grpc=False)
    assert parse_categories("none") == frozenset()
    assert parse_categories("all") == frozenset(Category)
    assert parse_categories("inference, metrics") == {Category.INFERENCE, Category.METRICS}
    assert bearer({"authorization": "Bearer  abc "}) == "abc"
    assert bearer({"authorization": "Basic abc"}) is None and bearer({}) is None
    assert is_loopback("127.0.0.5") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("192.0.2.1") and not is_loopback(None) and not is_loopback("not an address")


def test_a_client_certificate_stands_for_its_mapped_role() -> None:
    assert parse_certificate_role("camera-17.plant.example = operator") == ("camera-17.plant.example", Role.OPERATOR)
    for bad in ("camera", "=viewer", "camera=root"):
        with pytest.raises(ValueError):
            parse_certificate_role(bad)
    options = AccessOptions(certificate_roles={"camera": Role.OPERATOR, "screen": Role.VIEWER})
    policy = AccessPolicy(options, TokenVerifier(None))
    outside = "192.0.2.9"
    assert policy.check(Category.LOGGING, Caller("grpc", outside, {}, "camera")) == "certificate:camera"
    with pytest.raises(AccessDenied) as denied:
        policy.check(Category.LOGGING, Caller("http", outside, {}, "screen"))
    assert denied.value.refusal is Refusal.FORBIDDEN
    # A certificate mapped to no role counts for nothing.
    with pytest.raises(AccessDenied) as denied:
        policy.check(Category.LOGGING, Caller("http", outside, {}, "laptop"))
    assert denied.value.refusal is Refusal.UNAUTHENTICATED
