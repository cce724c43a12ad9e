"""JSON in, a request message out, with the spec's texts for what does not fit (edge.proto's rules).

Each message type is compiled once into a reader that knows its fields' options. Reading goes in
declaration order: a failure worded by serde (bae.common.serde) ends it at once, prefixed with the
nearest enclosing `context`; a failure with a text of its own in the proto is kept, the first one
only, and raised once everything else was read (serde deserializes, then the server validates).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from bae.common import serde
from bae.common.errors import echo
from bae.common.jsontext import JsonSyntaxError, dump, strict_load
from bae.common.protos import edge_pb2

CONTENT_TYPE_REJECTION = "Expected request with `Content-Type: application/json`"
JSON_VALUE = edge_pb2.JsonValue.DESCRIPTOR.full_name
_INT_RANGES = {
    FieldDescriptor.TYPE_INT64: ("i64", -(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: ("u64", 0, 2**64 - 1),
    FieldDescriptor.TYPE_INT32: ("i32", -(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: ("u32", 0, 2**32 - 1),
}
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "array": list, "object": dict, "boolean": bool, "number": (int, float)}


class Unreadable(Exception):
    """The JSON does not fit the message; the text is what the client is told."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _Reading:
    """One message's reading: the first failure with a text of its own, kept for the end."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: str | None = None

    def keep(self, text: str) -> None:
        if self.kept is None:
            self.kept = text


def is_json_content_type(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = mime.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def read_body(target: Message, body: bytes, content_type: str) -> None:
    """Fill `target` from a REST body; raises Unreadable."""
    if not is_json_content_type(content_type):
        raise Unreadable(CONTENT_TYPE_REJECTION)
    try:
        value = strict_load(body)
    except JsonSyntaxError as exc:
        raise Unreadable(f"Failed to parse the request body as JSON: {exc}") from None
    _read_whole(target, value, None)


def read_json_value(target: Message, body: bytes, content_type: str) -> None:
    """Fill a JsonValue from a REST body that may be any JSON value (a trigger's input): its compact
    text; raises Unreadable."""
    if not is_json_content_type(content_type):
        raise Unreadable(CONTENT_TYPE_REJECTION)
    try:
        value = strict_load(body)
    except JsonSyntaxError as exc:
        raise Unreadable(f"Failed to parse the request body as JSON: {exc}") from None
    target.json = dump(value)  # type: ignore[attr-defined]


def read_params(target: Message, params: Any) -> str:
    """Fill `target` from JSON-RPC params (absent or null: {}); returns "" or the text of why they
    do not fit (answered as "Invalid params: <text>")."""
    try:
        _read_whole(target, {} if params is None else params, "a map")
    except Unreadable as failure:
        target.Clear()
        return failure.text
    return ""


def _read_whole(target: Message, value: Any, expected: str | None) -> None:
    reading = _Reading()
    reader_of(target.DESCRIPTOR, "").read(value, target, reading, expected)
    if reading.kept is not None:
        raise Unreadable(reading.kept)


def _one_of(names: list[str]) -> str:
    """serde's list of what it expected."""
    quoted = [f"`{name}`" for name in names]
    if len(quoted) == 1:
        return f"expected {quoted[0]}"
    if len(quoted) == 2:
        return f"expected {quoted[0]} or {quoted[1]}"
    return "expected one of " + ", ".join(quoted)


def _unknown_variant(value: str, names: list[str]) -> str:
    return f"unknown variant `{echo(value)}`, {_one_of(names)}"


class MessageReader:
    """Reads a JSON object into one message type."""

    def __init__(self, descriptor: Descriptor, inherited_context: str) -> None:
        options = descriptor.GetOptions().Extensions[edge_pb2.json_message]
        self.name = descriptor.name
        self.expected = options.expected or f"struct {descriptor.name}"
        self.context = options.context or inherited_context
        self.tag = options.tag
        self.variants = [field.name for field in descriptor.fields] if self.tag else []
        self._descriptor = descriptor
        self._fields: list[FieldReader] | None = None  # compiled on first use: messages may nest

    @property
    def fields(self) -> list[FieldReader]:
        if self._fields is None:
            readers = [FieldReader(field, self.context) for field in self._descriptor.fields]
            # A forbidden key is checked before every other field.
            self._fields = sorted(readers, key=lambda reader: not reader.forbidden)
        return self._fields

    def read(self, value: Any, target: Message, reading: _Reading, expected: str | None = None) -> None:
        if not isinstance(value, dict):
            raise Unreadable(self.context + serde.invalid_type(value, expected or self.expected))
        if self.tag:
            self._read_variant(value, target, reading)
            return
        for field in self.fields:
            field.read(value, target, reading)

    def _read_variant(self, value: dict[str, Any], target: Message, reading: _Reading) -> None:
        """An internally tagged union: the tag names the oneof member whose fields sit beside it."""
        if self.tag not in value:
            raise Unreadable(f"{self.context}missing field `{self.tag}`")
        name = value[self.tag]
        if not isinstance(name, str):
            raise Unreadable(self.context + serde.invalid_type(name, "variant identifier"))
        if name not in self.variants:
            raise Unreadable(self.context + _unknown_variant(name, self.variants))
        variant = getattr(target, name)
        variant.SetInParent()
        reader_of(variant.DESCRIPTOR, self.context).read(value, variant, reading)


class FieldReader:
    """Reads one field of a JSON object, as its `json` option says."""

    def __init__(self, field: FieldDescriptor, context: str) -> None:
        self.options = field.GetOptions().Extensions[edge_pb2.json]
        self.name = field.name
        self.context = context
        self.field = field
        self.repeated = field.is_repeated
        self.forbidden = self.options.forbidden
        message = field.message_type
        self.json_value = message is not None and message.full_name == JSON_VALUE
        self.message = message if message is not None and not self.json_value else None
        self.required = self.options.required
        # Null reads as absent where serde's type is an Option or has a default that null may stand for.
        self.null_is_absent = not self.required and (field.has_presence or self.repeated)

    # Failures: a text of the field's own is kept for the end; serde's ends the reading now.

    def _own_or_serde(self, reading: _Reading, own: str, serde_text: str) -> None:
        if own:
            reading.keep(own)
            return
        raise Unreadable(self.context + serde_text)

    def _wrong_type(self, reading: _Reading, value: Any, expected: str) -> None:
        self._own_or_serde(reading, self.options.invalid, serde.invalid_type(value, self.options.expected or expected))

    def read(self, obj: dict[str, Any], target: Message, reading: _Reading) -> None:
        if self.forbidden:
            if self.name in obj:
                raise Unreadable(self.forbidden)
            return
        value = obj.get(self.name)
        if self.name not in obj or (value is None and self.null_is_absent):
            if self.required:
                self._own_or_serde(reading, self.options.missing, f"missing field `{self.name}`")
            return
        if self.repeated:
            self._read_list(value, target, reading)
        elif self.message is not None:
            self._read_message(value, getattr(target, self.name), reading)
        else:
            read = self._read_scalar(value, reading)
            if read is not _SKIP:
                if self.json_value:
                    getattr(target, self.name).json = read
                else:
                    setattr(target, self.name, read)

    def _read_message(self, value: Any, target: Message, reading: _Reading) -> None:
        reader = reader_of(self.message, self.context)
        if not isinstance(value, dict):
            # Inside the message's own deserializer: its context.
            expected = self.options.expected or reader.expected
            if self.options.invalid:
                reading.keep(self.options.invalid)
                return
            raise Unreadable(reader.context + serde.invalid_type(value, expected))
        target.SetInParent()
        reader.read(value, target, reading)

    def _read_list(self, value: Any, target: Message, reading: _Reading) -> None:
        if not isinstance(value, list):
            if not self.options.lenient:
                self._wrong_type(reading, value, "a sequence")
            return
        items = getattr(target, self.name)
        for index, item in enumerate(value):
            if self.message is not None:
                reader = reader_of(self.message, self.context)
                if not isinstance(item, dict):
                    self._item_failure(reading, index, serde.invalid_type(item, reader.expected))
                    return
                reader.read(item, items.add(), reading)
            else:
                read = self._read_scalar(item, reading, index)
                if read is _SKIP:
                    return
                items.append(read)

    def _item_failure(self, reading: _Reading, index: int, serde_text: str) -> None:
        own = self.options.item_invalid.replace("{index}", str(index))
        self._own_or_serde(reading, own, serde_text)

    def _read_scalar(self, value: Any, reading: _Reading, index: int | None = None) -> Any:
        """The value to set, or _SKIP when it did not fit (the failure is raised or kept)."""
        field_type = self.field.type
        expected, fits = self._scalar_type(value, field_type)
        if not fits:
            if self.options.lenient:
                return _SKIP
            if index is not None:
                self._item_failure(reading, index, serde.invalid_type(value, self.options.expected or expected))
            else:
                self._wrong_type(reading, value, expected)
            return _SKIP
        if self.json_value:
            return dump(value)
        if field_type in _INT_RANGES:
            name, low, high = _INT_RANGES[field_type]
            if not low <= value <= high:
                self._own_or_serde(reading, self.options.invalid, f"invalid value: integer `{echo(str(value))}`, expected {name}")
                return _SKIP
            if self.options.below_minimum and value < self.options.minimum:
                reading.keep(self.options.below_minimum.replace("{value}", echo(str(value))))
                return _SKIP
        if field_type == FieldDescriptor.TYPE_STRING:
            choices = list(self.options.choices)
            if choices and value not in choices:
                self._own_or_serde(reading, self.options.invalid, _unknown_variant(value, choices))
                return _SKIP
            if self.options.empty and not value.strip():
                reading.keep(self.options.empty)
                return _SKIP
        return value

    def _scalar_type(self, value: Any, field_type: int) -> tuple[str, bool]:
        """serde's name for the expected type, and whether `value` is of it."""
        if self.json_value:
            kinds = list(self.options.json_types)
            if not kinds:
                return "any value", True
            fits = any(isinstance(value, _JSON_TYPES[kind]) and not (kind == "number" and isinstance(value, bool))
                       for kind in kinds)
            return "a " + " or a ".join(kinds), fits
        if field_type == FieldDescriptor.TYPE_STRING:
            return "a string", isinstance(value, str)
        if field_type == FieldDescriptor.TYPE_BOOL:
            return "a boolean", isinstance(value, bool)
        if field_type in _INT_RANGES:
            return _INT_RANGES[field_type][0], isinstance(value, int) and not isinstance(value, bool)
        if field_type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return "f64", isinstance(value, (int, float)) and not isinstance(value, bool)
        raise TypeError(f"{self.name}: a field of this type cannot be read from JSON")


_SKIP = object()


@cache
def reader_of(descriptor: Descriptor, inherited_context: str) -> MessageReader:
    return MessageReader(descriptor, inherited_context)
