"""The codec: pickle 5 with arrays out of band, cloudpickle only for code."""

from __future__ import annotations

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
