"""Protocol-neutral errors with Triton's codes; each frontend maps the code to its own status."""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """The TRITONSERVER_Error_Code values, by name."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


# How Triton's Status::AsString names each code; model load failure reasons are reported in this form.
CODE_TEXT: dict[ErrorCode, str] = {
    ErrorCode.UNKNOWN: "Unknown",
    ErrorCode.INTERNAL: "Internal",
    ErrorCode.NOT_FOUND: "Not found",
    ErrorCode.INVALID_ARG: "Invalid argument",
    ErrorCode.UNAVAILABLE: "Unavailable",
    ErrorCode.UNSUPPORTED: "Unsupported",
    ErrorCode.ALREADY_EXISTS: "Already exists",
    ErrorCode.CANCELLED: "Cancelled",
}


class EdgedError(Exception):
    """An error a client may see. ``message`` must never hold a stack trace or an internal path."""

    __slots__ = ("code", "message")

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def describe(self) -> str:
        """The message with its code in front, e.g. "Invalid argument: ..."."""
        return f"{CODE_TEXT[self.code]}: {self.message}"

    def __repr__(self) -> str:
        return f"EdgedError({self.code.name}, {self.message!r})"


class AnsweredError(EdgedError):
    """An error a model answered a request with (a response that carries an error), as opposed to an execution
    that failed. Triton counts such a request a success (its execution ended and the model answered), and the
    statistics do the same; the metrics history counts it among the errors its client saw."""

    __slots__ = ()


def invalid_arg(message: str) -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, message)


def not_found(message: str) -> EdgedError:
    return EdgedError(ErrorCode.NOT_FOUND, message)


def unavailable(message: str) -> EdgedError:
    return EdgedError(ErrorCode.UNAVAILABLE, message)


def unsupported(message: str) -> EdgedError:
    return EdgedError(ErrorCode.UNSUPPORTED, message)


def internal(message: str) -> EdgedError:
    return EdgedError(ErrorCode.INTERNAL, message)
