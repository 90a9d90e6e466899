"""Objects to frames and back: pickle protocol 5 with out-of-band buffers.

``dumps`` returns a list of buffers — a small header, the pickle stream, then
each array's raw memory — which a ring sender writes straight into the ring,
so an array's bytes are copied once (into the ring), never into the pickle
stream. ``loads`` rebuilds the arrays as views of the received frame.

Torch tensors (on CPU) cross as numpy arrays and come back as tensors; this
module never imports torch itself. ``code=True`` uses cloudpickle, for the
rare payload that carries a function; nothing from the network is ever
unpickled.

Frame layout: a message without out-of-band buffers is its bare pickle
stream (it starts with the PROTO opcode, 0x80). Otherwise::

    u8 version | u8 reserved | u16 buffer count | u32 pickle length | u64 each buffer's length
    pickle stream, then each buffer, every piece starting on an 8-byte boundary
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
from typing import Any

import cloudpickle

VERSION = 1
_PROTO = pickle.PROTO[0]
_HEAD = struct.Struct("<BBHI")
_PAD = bytes(8)


def _rebuild_tensor(raw: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    return torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)


def _reduce_tensor(tensor: Any) -> Any:
    import torch

    if tensor.device.type != "cpu":
        return tensor.__reduce_ex__(5)
    # As raw bytes, so that dtypes numpy lacks (bfloat16) cross too.
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return _rebuild_tensor, (raw, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


def _pickle(obj: Any, buffers: list[pickle.PickleBuffer]) -> bytes:
    torch = sys.modules.get("torch")
    if torch is None:  # the fast path: nothing can be a tensor
        return pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    # A dispatch table costs a dict lookup per non-atomic object, in C;
    # reducer_override would cost a Python call per object.
    stream = io.BytesIO()
    pickler = pickle.Pickler(stream, protocol=5, buffer_callback=buffers.append)
    pickler.dispatch_table = {torch.Tensor: _reduce_tensor}
    pickler.dump(obj)
    return stream.getvalue()


def dumps(obj: Any, *, code: bool = False) -> bytes | list[bytes | memoryview]:
    """Serialize ``obj`` for ``RingSender.send``: one ``bytes`` when it holds no
    array (the common, fast case), else a list of buffers to write in turn."""
    buffers: list[pickle.PickleBuffer] = []
    if code:
        body = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    else:
        body = _pickle(obj, buffers)
    if not buffers:
        return body
    raws = [buf.raw() for buf in buffers]
    sizes = [raw.nbytes for raw in raws]
    head = _HEAD.pack(VERSION, 0, len(raws), len(body)) + struct.pack(f"<{len(sizes)}Q", *sizes)
    out: list[bytes | memoryview] = [head, body]
    pad = -(len(head) + len(body)) % 8
    for raw in raws:
        if pad:
            out.append(_PAD[:pad])
        out.append(raw)
        pad = -raw.nbytes % 8
    return out


def loads(data: bytes | bytearray | memoryview) -> Any:
    """Rebuild the object; arrays are views of ``data`` (writable if it is)."""
    if data[0] == _PROTO:
        return pickle.loads(data)
    version, _, count, body_len = _HEAD.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"codec version {version} in frame, this rt reads {VERSION}")
    view = memoryview(data)
    sizes = struct.unpack_from(f"<{count}Q", view, _HEAD.size)
    pos = _HEAD.size + 8 * count
    body = view[pos : pos + body_len]
    pos += body_len
    buffers = []
    for size in sizes:
        pos += -pos % 8
        buffers.append(view[pos : pos + size])
        pos += size
    return pickle.loads(body, buffers=buffers)
