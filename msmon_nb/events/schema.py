"""Protobuf message classes for the MindSpore summary schema, built from our descriptor.

Used for the general decoding path (histograms, tensors, images and anything MindSpore
writes); the hot write path and the scalar fast path encode and decode the wire format
directly (see ``wire.py``), because ``import mindspore`` forces protobuf's pure-Python
implementation, which is about 7x slower.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool

from msmon_nb.events._descriptor import SERIALIZED

PACKAGE = "msmon.irpb"


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(SERIALIZED))
    return pool


def message_class(name: str) -> Any:
    """The message class for ``name`` (e.g. ``"Event"``, ``"Summary.Histogram"``)."""
    desc = _pool().FindMessageTypeByName(f"{PACKAGE}.{name}")
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf < 4.22
        from google.protobuf.message_factory import MessageFactory

        return MessageFactory(_pool()).GetPrototype(desc)
    return GetMessageClass(desc)


def event_class() -> Any:
    """``Event``: the message framed in every summary record."""
    return message_class("Event")


def datatype_names() -> dict[int, str]:
    """Enum number -> name of ``DataType`` (e.g. 11 -> ``"DT_FLOAT32"``)."""
    enum = _pool().FindEnumTypeByName(f"{PACKAGE}.DataType")
    return {v.number: v.name for v in enum.values}
