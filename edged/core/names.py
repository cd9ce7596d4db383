"""What a model name may be, decided in one place.

A model name is also the name of the model's folder in the repository and of its private copies under the state
directory, so it must be exactly one path component and nothing a file system, a shell or a log line could read as
more: not empty, not ``.`` or ``..``, no ``/``, ``\\`` or NUL, no control character (C0, DEL or C1), at most 255
bytes in UTF-8 (NAME_MAX of Linux file systems). Everything else a folder can be called is allowed, so every model
folder of a Triton repository keeps its name.

Every entry point that takes a model name from outside (HTTP, gRPC, and the model control they reach) calls
``model_name_problem`` before anything touches the disk; the file operations check again where they happen
(edged.core.repository.private_copies), so a later caller cannot bring the hole back.
"""

from __future__ import annotations

from typing import Final

# Linux's NAME_MAX: the longest name of one directory entry, in bytes.
MAX_NAME_BYTES: Final = 255


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model's name, or None when it can."""
    if not name:
        return "it is empty"
    if name in (".", ".."):
        return f"'{name}' is not a folder name"
    for char, what in (("/", "a '/'"), ("\\", "a '\\'"), ("\0", "a NUL character")):
        if char in name:
            return f"it contains {what}"
    if any(_is_control(char) for char in name):
        return "it contains a control character"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate (from a badly decoded URL or message) has no UTF-8 form and names no folder.
        return "it is not valid Unicode"
    if size > MAX_NAME_BYTES:
        return f"it is {size} bytes long, more than the {MAX_NAME_BYTES} a folder name may have"
    return None


def load_name_refusal(name: str) -> str | None:
    """Triton's own checks of a name to load (not to unload), newer releases', in its words; None when they pass."""
    trimmed = name.strip(" \t\n\r\f\v")
    if not trimmed:
        return "Model name cannot be empty. Please enter a valid name to deploy."
    if trimmed == ".." or "/" in trimmed:
        return f"invalid model name '{printable(name)}', model name must not contain path traversal characters"
    return None


def is_model_name(name: str) -> bool:
    return model_name_problem(name) is None


def printable(name: str, limit: int = 80) -> str:
    """``name`` as an error message may show it: control characters escaped, a long name shortened."""
    shown = escape_controls(name)
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(shown)} characters)"


def escape_controls(text: str) -> str:
    """``text`` with every control character (C0, DEL, C1) written ``\\xNN`` and anything UTF-8 cannot encode (a
    lone surrogate) backslash-escaped, whole: for messages that quote what a remote party chose, which must reach a
    log line or a JSON answer as one line that no terminal interprets. Escaping twice changes nothing more."""
    shown = "".join(f"\\x{ord(c):02x}" if _is_control(c) else c for c in text)
    return shown.encode("utf-8", "backslashreplace").decode("utf-8")


def _is_control(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F
