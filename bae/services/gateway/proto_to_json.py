"""A reply message out as the JSON the client reads (edge.proto's rules), in bae.common.jsontext's form.

Keys in field order; an unset `optional` or message field is null unless `omit_unset`; maps with
sorted keys; a JsonValue spliced as its text (a stored event's payload is never parsed here).
Each message type is compiled once into a list of field writers: every GET and every turn frame
goes through here.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Callable

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

import orjson

from bae.common.jsontext import dump
from bae.common.protos import edge_pb2

JSON_VALUE = edge_pb2.JsonValue.DESCRIPTOR.full_name

Render = Callable[[Any], str]


def to_json(message: Message) -> str:
    return writer_of(message.DESCRIPTOR)(message)


def _string(value: str) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # a lone surrogate, which orjson refuses: the standard library writes it
        return dump(value)


def _scalar_render(field: FieldDescriptor) -> Render:
    if field.type == FieldDescriptor.TYPE_BOOL:
        return lambda value: "true" if value else "false"
    if field.type == FieldDescriptor.TYPE_STRING:
        return _string
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return dump
    if field.cpp_type in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64,
                          FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64):
        return str
    raise TypeError(f"{field.full_name}: a field of this type is not written as JSON")


def _value_render(field: FieldDescriptor) -> Render:
    """How one value of the field (an item, for a repeated one) is written."""
    message = field.message_type
    if message is None:
        return _scalar_render(field)
    if message.full_name == JSON_VALUE:
        return lambda value: value.json
    return lambda value: writer_of(message)(value)


def _field_writer(field: FieldDescriptor) -> Callable[[Message], str | None]:
    """The field's `"key":value`, or None when it is left out."""
    name = field.name
    key = _string(name) + ":"
    omit_unset = field.GetOptions().Extensions[edge_pb2.json].omit_unset
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        render_value = _value_render(field.message_type.fields_by_name["value"])

        def write_map(message: Message) -> str:
            entries = getattr(message, name)
            return key + "{" + ",".join(_string(k) + ":" + render_value(entries[k]) for k in sorted(entries)) + "}"

        return write_map
    render = _value_render(field)
    if field.is_repeated:
        return lambda message: key + "[" + ",".join(render(item) for item in getattr(message, name)) + "]"
    if field.has_presence:
        unset = None if omit_unset else key + "null"
        return lambda message: key + render(getattr(message, name)) if message.HasField(name) else unset
    return lambda message: key + render(getattr(message, name))


@cache
def writer_of(descriptor: Descriptor) -> Callable[[Message], str]:
    writers = [_field_writer(field) for field in descriptor.fields]
    if any(field.GetOptions().Extensions[edge_pb2.json].omit_unset for field in descriptor.fields):
        def write_some(message: Message) -> str:
            return "{" + ",".join([part for writer in writers if (part := writer(message)) is not None]) + "}"

        return write_some

    def write(message: Message) -> str:
        return "{" + ",".join([writer(message) for writer in writers]) + "}"  # type: ignore[misc]

    return write
