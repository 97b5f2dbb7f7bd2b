"""Our hand-encoded bytes equal what MindSpore's own protobuf module produces."""

import os
import shutil

import numpy as np
import pytest
from mindspore.train import anf_ir_pb2, summary_pb2

from msmon_nb.events import build_schema, schema, wire
from msmon_nb.events._descriptor import SERIALIZED
from msmon_nb.events.histogram import histogram


def ms_event(step, wall):
    ev = summary_pb2.Event()
    ev.wall_time = wall
    ev.step = step
    return ev


@pytest.mark.parametrize("step", [0, 1, 127, 128, 300, 2**40, -1])
def test_scalar_event_bytes_equal_mindspore(step):
    items = [("train/loss", 0.25), ("train/grad_norm", 3.5e6), ("x", float("nan"))]
    ev = ms_event(step, 1234.5)
    for tag, val in items:
        v = ev.summary.value.add()
        v.tag = tag
        v.scalar_value = val
    assert wire.scalar_event(step, 1234.5, items) == ev.SerializeToString()


def test_version_event_bytes_equal_mindspore():
    ev = summary_pb2.Event()
    ev.wall_time = 42.0
    ev.version = "MindSpore.Event:1"
    assert wire.version_event(42.0) == ev.SerializeToString()


def test_scalar_overflow_becomes_inf():
    payload = wire.scalar_event(1, 1.0, [("a", 1e300), ("b", -1e300)])
    ev = summary_pb2.Event.FromString(payload)
    assert [v.scalar_value for v in ev.summary.value] == [np.inf, -np.inf]


@pytest.mark.parametrize(
    "arr",
    [
        np.random.default_rng(0).normal(size=1000).astype(np.float32),
        np.array([1.0, np.nan, np.inf, -np.inf, 2.0], dtype=np.float32),
        np.array([np.nan, np.nan], dtype=np.float32),
        np.arange(12, dtype=np.int32).reshape(3, 4),
        np.full(7, 3.0),
    ],
)
def test_histogram_value_bytes_equal_mindspore(arr):
    from mindspore.train.summary._summary_adapter import _fill_histogram_summary

    ev = ms_event(5, 10.0)
    v = ev.summary.value.add()
    v.tag = "w"
    _fill_histogram_summary("w", arr, v.histogram)
    ours = wire.summary_event(5, 10.0, [wire.histogram_value("w", histogram(arr))])
    assert ours == ev.SerializeToString()


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([[1, 2], [3, 4]], dtype=np.int64),
        np.array(7.5, dtype=np.float64),
    ],
)
def test_tensor_value_bytes_equal_mindspore(arr):
    from mindspore.train.summary._summary_adapter import _fill_tensor_summary

    ev = ms_event(3, 1.0)
    v = ev.summary.value.add()
    v.tag = "t"
    _fill_tensor_summary("t", arr, v.tensor)
    ours = wire.summary_event(3, 1.0, [wire.tensor_value("t", arr)])
    assert ours == ev.SerializeToString()


def test_image_value_parses_in_mindspore():
    from msmon_nb.events.png import decode_png, encode_png

    img = (np.arange(4 * 5 * 3) % 256).astype(np.uint8).reshape(4, 5, 3)
    h, w, c, png = encode_png(img)
    payload = wire.summary_event(1, 2.0, [wire.image_value("img", h, w, c, png)])
    ev = summary_pb2.Event.FromString(payload)
    image = ev.summary.value[0].image
    assert (image.height, image.width, image.colorspace) == (4, 5, 3)
    assert np.array_equal(decode_png(image.encoded_image), img)


def _fields(desc):
    return {
        f.number: (f.name, f.type, f.is_repeated, f.is_required, f.is_packed) for f in desc.fields
    }


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("Event", summary_pb2.Event.DESCRIPTOR),
        ("Summary", summary_pb2.Summary.DESCRIPTOR),
        ("Summary.Value", summary_pb2.Summary.Value.DESCRIPTOR),
        ("Summary.Histogram", summary_pb2.Summary.Histogram.DESCRIPTOR),
        ("Summary.Histogram.bucket", summary_pb2.Summary.Histogram.bucket.DESCRIPTOR),
        ("Summary.Image", summary_pb2.Summary.Image.DESCRIPTOR),
        ("TensorProto", anf_ir_pb2.TensorProto.DESCRIPTOR),
    ],
)
def test_schema_matches_mindspore_field_by_field(ours, theirs):
    assert _fields(schema.message_class(ours).DESCRIPTOR) == _fields(theirs)


def test_datatype_enum_matches_mindspore():
    theirs = {v.number: v.name for v in anf_ir_pb2.DataType.DESCRIPTOR.values}
    assert schema.datatype_names() == theirs
    for name, code in wire.DTYPE_CODES.items():
        assert theirs[code] == f"DT_{name.upper()}"


def test_committed_descriptor_is_generated_from_proto():
    if shutil.which("protoc") is None:
        if os.environ.get("CI"):
            pytest.fail("protoc is missing in CI; .ci/run installs protobuf-compiler")
        pytest.skip("protoc not installed (apt-get install protobuf-compiler)")
    assert build_schema.compile_descriptor() == SERIALIZED
    assert build_schema.render(SERIALIZED).strip()


def test_schema_usable_without_mindspore(python):
    code = (
        "import sys; from msmon_nb.events import schema, runs, reader, writer; "
        "assert 'mindspore' not in sys.modules, 'events must not import mindspore'; "
        "print(schema.event_class().DESCRIPTOR.full_name)"
    )
    assert python(code).stdout.strip() == "msmon.irpb.Event"
