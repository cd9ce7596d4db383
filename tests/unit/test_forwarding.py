"""The header-forwarding patterns as Triton builds them: a search in the name, any case unless (?-i) leads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from edged.errors import EdgedError
from edged.frontends.forwarding import forward_headers, header_pattern

if TYPE_CHECKING:
    from edged.core.request.inference import ParameterValue


def _forwarded(pattern: str, *names: str) -> dict[str, ParameterValue]:
    found: dict[str, ParameterValue] = {}
    forward_headers(header_pattern(pattern), [(name, "v") for name in names], found)
    return found


def test_a_pattern_is_a_search_that_ignores_case() -> None:
    assert sorted(_forwarded("HEADER", "my_header", "x-header-2", "other")) == ["my_header", "x-header-2"]


def test_a_leading_case_flag_makes_it_case_sensitive() -> None:
    assert _forwarded("(?-i)MY_HEADER", "my_header") == {}
    assert _forwarded("(?-i)MY_HEADER", "MY_HEADER_1") == {"MY_HEADER_1": "v"}


@pytest.mark.parametrize(
    "name",
    [
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "triton_x",
        "binary_data_output",
    ],
)
def test_request_fields_are_never_forwarded(name: str) -> None:
    # As Triton: a reserved name the pattern finds refuses the request.
    with pytest.raises(EdgedError, match=f"^Header '{name}' is reserved for Triton usage and cannot be forwarded.$"):
        _forwarded(".*", "my_header", name)
    assert _forwarded("my_", "my_header", name) == {"my_header": "v"}


def test_a_broken_pattern_is_refused_in_words() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        header_pattern("my_header(")
