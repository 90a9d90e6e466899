"""The codec: pickle 5 with arrays out of band, cloudpickle only for code."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch

from rt.shm import codec


def joined(buffers: bytes | list[bytes | memoryview]) -> bytearray:
    if isinstance(buffers, bytes):
        return bytearray(buffers)
    return bytearray(b"".join(bytes(b) for b in buffers))


def test_a_message_without_arrays_is_one_buffer() -> None:
    encoded = codec.dumps({"rid": "a" * 32, "input_ids": list(range(20))})
    assert isinstance(encoded, bytes)
    assert codec.loads(encoded) == {"rid": "a" * 32, "input_ids": list(range(20))}


def test_arrays_travel_out_of_band() -> None:
    ids = np.arange(100_000, dtype=np.int64)
    buffers = codec.dumps({"rid": "a" * 32, "ids": ids})
    assert isinstance(buffers, list)
    pickle_stream = buffers[1]
    assert len(pickle_stream) < 1000, "the array's bytes were copied into the pickle stream"
    assert any(memoryview(b).nbytes == ids.nbytes for b in buffers), "the array is its own buffer"
    out = codec.loads(joined(buffers))
    assert out["rid"] == "a" * 32
    np.testing.assert_array_equal(out["ids"], ids)


def test_decoded_arrays_are_views_of_the_frame() -> None:
    frame = joined(codec.dumps(np.arange(16, dtype=np.int32)))
    arr = codec.loads(frame)
    arr[0] = 99  # writable, because the frame is
    assert codec.loads(frame)[0] == 99


def test_torch_tensors_round_trip_as_tensors() -> None:
    tensors = [torch.arange(10), torch.randn(3, 4)[:, 1], torch.ones(2, dtype=torch.bfloat16)]
    out = codec.loads(joined(codec.dumps(tensors)))
    for got, want in zip(out, tensors, strict=True):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


def test_odd_sized_buffers_keep_alignment() -> None:
    obj = [np.ones(3, dtype=np.uint8), np.arange(5, dtype=np.float64), b"xyz"]
    frame = joined(codec.dumps(obj))
    out = codec.loads(frame)
    base = np.frombuffer(frame, dtype=np.uint8).ctypes.data
    assert (out[1].ctypes.data - base) % 8 == 0, "an array after an odd-sized one lost alignment"
    np.testing.assert_array_equal(out[0], obj[0])
    np.testing.assert_array_equal(out[1], obj[1])
    assert out[2] == b"xyz"


def test_code_payloads_need_cloudpickle() -> None:
    def scale(x: int) -> int:
        return 3 * x

    with pytest.raises(AttributeError):
        codec.dumps(scale)  # a local function: plain pickle refuses
    assert codec.loads(joined(codec.dumps(scale, code=True)))(2) == 6


def test_a_frame_from_another_version_is_refused() -> None:
    frame = joined(codec.dumps(np.arange(3)))
    frame[0] = 99
    with pytest.raises(ValueError, match="version 99"):
        codec.loads(frame)


def test_arrays_numpy_cannot_share_still_round_trip() -> None:
    strided = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]  # not contiguous
    objects = np.array([{"a": 1}, None], dtype=object)
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    out = codec.loads(joined(codec.dumps([strided, objects, fortran])))
    np.testing.assert_array_equal(out[0], strided)
    assert out[1].tolist() == [{"a": 1}, None]
    np.testing.assert_array_equal(out[2], fortran)


def test_each_thread_encodes_on_its_own() -> None:
    import threading

    results: dict[int, object] = {}

    def work(k: int) -> None:
        for i in range(500):
            obj = {"k": k, "i": i, "ids": np.full(50, k, dtype=np.int32)}
            back = codec.loads(joined(codec.dumps(obj)))
            if back["k"] != k or back["i"] != i or not (back["ids"] == k).all():
                results[k] = back
                return
        results[k] = "ok"

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == dict.fromkeys(range(4), "ok")


class Sample(msgspec.Struct, frozen=True, array_like=True, tag=True):
    rid: str
    ids: np.ndarray
    scores: np.ndarray | None = None
    extra: object = None


codec.register(Sample)


def test_a_registered_message_travels_as_messagepack_with_its_arrays() -> None:
    msg = Sample("a" * 32, np.arange(20, dtype=np.int32), np.ones((2, 3), dtype=np.float32))
    encoded = codec.dumps(msg)
    assert isinstance(encoded, bytes)
    assert 0x90 <= encoded[0] <= 0x9F, "not a MessagePack array"
    frame = bytes(encoded)  # a small frame arrives read-only
    out = codec.loads(frame)
    assert type(out) is Sample and out.rid == msg.rid
    np.testing.assert_array_equal(out.ids, msg.ids)
    assert out.ids.dtype == np.int32
    assert out.scores is not None and out.scores.shape == (2, 3)
    out.ids[0] = 99  # writable, and a copy: the frame is untouched
    assert codec.loads(frame).ids[0] == 0


def test_arrays_of_every_shape_and_dtype_cross_inside_a_message() -> None:
    arrays = [
        np.array(7, dtype=np.int64),  # 0-d
        np.zeros(0, dtype=np.int32),
        np.array([True, False]),
        np.arange(6, dtype=np.float16).reshape(2, 3),
        np.arange(24, dtype=">i4").reshape(2, 3, 4),  # big-endian stays big-endian
        np.arange(10, dtype=np.uint8)[::2],  # not contiguous: tobytes makes it so
    ]
    for array in arrays:
        out = codec.loads(codec.dumps(Sample("r", array, array)))
        for got in (out.ids, out.scores):
            assert got.dtype == array.dtype and got.shape == array.shape, array
            np.testing.assert_array_equal(got, array)


def test_a_message_msgpack_cannot_carry_falls_back_to_pickle() -> None:
    structured = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")])
    for extra in (torch.arange(4), 2**70, np.int64(3), structured, np.array([None, 1])):
        msg = Sample("r", np.arange(3), extra=extra)
        out = codec.loads(joined(codec.dumps(msg)))
        assert type(out) is Sample
        np.testing.assert_array_equal(out.ids, np.arange(3))
        if isinstance(extra, torch.Tensor):
            assert torch.equal(out.extra, extra)
        elif isinstance(extra, np.ndarray):
            assert out.extra.dtype == extra.dtype and (out.extra == extra).all()
        else:
            assert out.extra == extra and type(out.extra) is type(extra)


def test_untyped_fields_carry_messagepack_values() -> None:
    # A field typed ``object`` comes back as MessagePack has it: a tuple or a
    # set as a list. rt's messages type their fields, so theirs come back exact.
    out = codec.loads(codec.dumps(Sample("r", np.arange(1), extra=(1, {2, 3}))))
    assert out.extra == [1, [2, 3]]


def test_only_tagged_array_like_structs_with_distinct_tags_register() -> None:
    class Untagged(msgspec.Struct, array_like=True):
        x: int

    class AsMap(msgspec.Struct, tag=True):
        x: int

    class Clash(msgspec.Struct, array_like=True, tag="Sample"):
        x: int

    for cls in (Untagged, AsMap):
        with pytest.raises(TypeError, match="array_like=True, tag=True"):
            codec.register(cls)
    with pytest.raises(TypeError, match="share a tag"):
        codec.register(Clash)


def test_arrays_out_of_band_are_writable_even_from_a_read_only_frame() -> None:
    frame = bytes(joined(codec.dumps({"ids": np.arange(8, dtype=np.int64)})))
    out = codec.loads(frame)
    out["ids"][0] = 7
    assert out["ids"][0] == 7
