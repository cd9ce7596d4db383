"""Request headers forwarded to the model as request parameters: Triton's ``--http-header-forward-pattern`` and
``--grpc-header-forward-pattern``.

A header whose name the pattern finds (a search anywhere in the name, not a full match) becomes a string parameter
of the request, after the parameters the request carries, so that it wins over one of the same name, as in Triton's
Python backend. The pattern ignores case unless it starts with ``(?-i)``, as Triton builds it. Over HTTP the names
are lower case (as every HTTP/2 and ASGI header name is), over gRPC the metadata keys always were.

Names edged reads as fields of the request rather than as the model's parameters (the sequence flags, priority,
timeout, the reply's binary form, Triton's reserved ``triton_`` keys) are never forwarded: a header must not start
a sequence or change how a reply is sent. As in Triton, a request with such a header that the pattern finds is
refused (INVALID_ARG) rather than served without it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edged.core.request.inference import ParameterValue

_CASE_SENSITIVE: Final = "(?-i)"
_NOT_FORWARDED: Final = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output"}
)


def header_pattern(text: str) -> re.Pattern[str]:
    """The compiled pattern of a forwarding option; ValueError in words an option's check can give."""
    sensitive = text.startswith(_CASE_SENSITIVE)
    try:
        return re.compile(text[len(_CASE_SENSITIVE) :] if sensitive else text, 0 if sensitive else re.IGNORECASE)
    except re.error as error:
        raise ValueError(f"not a regular expression ({error}): '{text}'") from None


def forward_pattern(text: str | None) -> re.Pattern[str] | None:
    """The pattern of a forwarding option as the settings give it; None when the option is not set."""
    return None if not text else header_pattern(text)


def forward_headers(
    pattern: re.Pattern[str], headers: Iterable[tuple[str, str]], parameters: dict[str, ParameterValue]
) -> None:
    """Add each header ``pattern`` finds to ``parameters``, as a string; INVALID_ARG for a reserved name."""
    for name, value in headers:
        if not pattern.search(name):
            continue
        if name in _NOT_FORWARDED or name.startswith("triton_"):
            raise EdgedError(
                ErrorCode.INVALID_ARG, f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
            )
        parameters[name] = value
