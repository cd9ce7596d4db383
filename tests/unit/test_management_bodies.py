"""edged's management request bodies (edged.frontends.bodies.management_fields): empty or a JSON object of known
fields, every unknown one named in a 400, however many or however long."""

from __future__ import annotations

import pytest

from edged.errors import EdgedError, ErrorCode
from edged.frontends.bodies import management_fields, unknown_fields

KNOWN = ("name", "role", "expires_in_s")


def _refusal(body: bytes, known: tuple[str, ...] = KNOWN) -> str:
    with pytest.raises(EdgedError) as refused:
        management_fields(body, "token", known, 32)
    assert refused.value.code is ErrorCode.INVALID_ARG  # 400, the client's mistake
    return refused.value.message


def test_known_fields_pass_and_no_body_is_no_fields() -> None:
    assert management_fields(b'{"name": "t", "role": "viewer"}', "token", KNOWN, 32) == {"name": "t", "role": "viewer"}
    assert management_fields(b"", "sync", (), 32) == {} == management_fields(b" {} ", "sync", (), 32)


def test_unknown_fields_are_named() -> None:
    assert _refusal(b'{"name": "t", "role": "viewer", "expires": "1d"}') == (
        "unknown field 'expires' in the token request (known: name, role, expires_in_s)"
    )
    assert _refusal(b'{"b": 1, "a": 2}', ()) == "unknown fields 'a', 'b' in the token request (it takes none)"
    # A name a terminal would interpret is escaped, a long one cut, and a flood of them counted, not listed.
    message = _refusal(b'{"\\u001b[31m": 1}')
    assert "'\\x1b[31m'" in message and "\x1b" not in message
    assert "characters" in _refusal(('{"' + "x" * 1000 + '": 1}').encode())
    many = "{" + ", ".join(f'"f{i:02d}": 1' for i in range(25)) + "}"
    assert "'f09' and 15 more" in _refusal(many.encode())


@pytest.mark.parametrize("body", [b"[1]", b'"text"', b"null", b"{x", b"\xff"])
def test_a_body_that_is_no_object_is_a_400(body: bytes) -> None:
    _refusal(body)


def test_unknown_fields_of_a_form() -> None:
    assert unknown_fields(["csrf_token", "name"], "token form", ("name", "csrf_token")) is None
    problem = unknown_fields(["x"], "sync form", ("csrf_token",))
    assert problem == "unknown field 'x' in the sync form (known: csrf_token)"
