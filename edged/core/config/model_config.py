"""Reading and writing ModelConfig: the ``config.pbtxt`` text form and the JSON form Triton serves.

The JSON form is what HTTP ``/config`` returns, what the Python backend gets as ``args["model_config"]`` and
what a load request may send as a config override. It is protobuf JSON with the proto field names, every
field without presence printed (``"optional": false``, ``"dims": []``), enums by name, and 64-bit integers
as JSON numbers: protobuf prints those as strings, Triton does not, and clients treat e.g. ``dims`` as
numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from edged.errors import EdgedError, ErrorCode
from edged.proto.model_config_pb2 import ModelConfig

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def parse_model_config(text: str, source: str) -> ModelConfig:
    """Parse ``config.pbtxt`` text. ``source`` names the file in errors and must not be an absolute path."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise EdgedError(ErrorCode.INVALID_ARG, _describe_parse_error(exc, text, source)) from None
    except ValueError as exc:
        # protobuf checks an enum field's number only when it sets it, and raises ValueError, not ParseError
        # (e.g. "data_type: 99999999999").
        raise EdgedError(ErrorCode.INVALID_ARG, f"{source}: {exc}") from None
    return config


def _describe_parse_error(exc: text_format.ParseError, text: str, source: str) -> str:
    line, column = exc.GetLine(), exc.GetColumn()
    detail = str(exc)
    # protobuf puts "line:column : " in front of the message and often quotes the offending line after it;
    # both are dropped so the message reads like a compiler's "file:line:column: problem".
    if line is None:
        return f"{source}: {detail}"
    location = f"{line}" if column is None else f"{line}:{column}"
    detail = detail.removeprefix(f"{location} : ")
    lines = text.split("\n")
    current = lines[line - 1] if 0 < line <= len(lines) else ""
    # At the end of the text the quoted line is empty rather than the line the error points at.
    for quoted in (current, ""):
        prefix = f"'{quoted}': "
        if detail.startswith(prefix):
            detail = detail[len(prefix) :]
            break
    return f"{source}:{location}: {detail}"


def model_config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """The JSON form as Python objects, with 64-bit integers as ints."""
    data: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _int64_to_numbers(config.DESCRIPTOR, data)


def model_config_to_json(config: ModelConfig) -> bytes:
    """The compact JSON form, as UTF-8."""
    return msgspec.json.encode(model_config_to_dict(config))


def model_config_from_json(text: str | bytes) -> ModelConfig:
    """Parse the JSON form; 64-bit integers may be numbers or strings."""
    config = ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, UnicodeDecodeError) as exc:
        # protobuf follows an unknown field with a line listing every field by its camelCase name: noise here.
        detail = str(exc).split("\n", 1)[0]
        message = f"failed to parse model configuration JSON: {detail}"
        raise EdgedError(ErrorCode.INVALID_ARG, message) from None
    return config


def _int64_to_numbers(descriptor: Descriptor, data: dict[str, Any]) -> dict[str, Any]:
    """Turn protobuf JSON's 64-bit integer strings back into ints through every nested message, and order the keys
    as the message declares its fields (as Triton prints them, rather than set fields first)."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if _is_map(field):
                # Map keys are always strings in JSON; only the values change.
                value_field = field.message_type.fields_by_name["value"]
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    value = {k: _int64_to_numbers(value_field.message_type, v) for k, v in value.items()}
                elif value_field.type in _INT64_TYPES:
                    value = {k: int(v) for k, v in value.items()}
            elif field.is_repeated:
                value = [_int64_to_numbers(field.message_type, item) for item in value]
            else:
                value = _int64_to_numbers(field.message_type, value)
        elif field.type in _INT64_TYPES:
            value = [int(item) for item in value] if field.is_repeated else int(value)
        out[field.name] = value
    return out


def _is_map(field: FieldDescriptor) -> bool:
    return bool(field.message_type.GetOptions().map_entry)
