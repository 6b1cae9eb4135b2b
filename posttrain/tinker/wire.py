"""The Tinker SDK's protobuf messages, read and written by hand.

The SDK sends ``forward_backward`` as a protobuf ``ForwardBackwardRequest`` and asks for
``ForwardBackwardOutput`` and ``SampleResponse`` results in protobuf (``Accept:
application/x-protobuf``); everything else is JSON. Three messages do not justify a generated
module and a protobuf runtime pin: the wire format is tags, varints and length-delimited bytes,
decoded here against the field numbers of the SDK's ``tinker_public.proto`` (tinker 0.38).

Decoding is bounded by the body (every length is checked against what is left), so a malformed
body is a `WireError` (a 400), never an over-read or a hang.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<i8"), 3: np.dtype("<i4")}
"""The proto ``DType`` enum: float32, int64, int32 (bfloat16 is never sent by the SDK)."""
DTYPE_CODE = {"float32": 1, "int64": 2}
STOP_REASON = {"stop": 0, "length": 1}


class WireError(ValueError):
    """A body that is not the protobuf message it claims to be."""


# ------------------------------------------------------------------------------ decoding

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes) -> dict[int, list]:
    """Field number -> values in order: an int (varint), bytes (length-delimited) or raw 4/8 bytes."""
    out: dict[int, list] = {}
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, pos = _varint(buf, pos)
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            if pos + size > len(buf):
                raise WireError(f"field {number}: truncated fixed-width value")
            value, pos = buf[pos:pos + size], pos + size
        elif kind == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise WireError(f"field {number}: length {size} runs past the end of the message")
            value, pos = buf[pos:pos + size], pos + size
        else:
            raise WireError(f"field {number}: unsupported wire type {kind}")
        out.setdefault(number, []).append(value)
    return out


def _one(f: dict, number: int, default=None):
    values = f.get(number)
    return values[-1] if values else default  # proto3: the last occurrence wins


def _text(f: dict, number: int) -> str:
    raw = _one(f, number, b"")
    if not isinstance(raw, bytes):
        raise WireError(f"field {number}: expected a string")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"field {number}: not UTF-8") from None


def _ints(f: dict, number: int) -> list[int]:
    """A repeated integer field, packed (one bytes value) or not (one varint per element)."""
    out: list[int] = []
    for value in f.get(number, []):
        if isinstance(value, int):
            out.append(value)
            continue
        pos = 0
        while pos < len(value):
            v, pos = _varint(value, pos)
            out.append(v)
    return out


def _double(raw) -> float:
    if not isinstance(raw, bytes) or len(raw) != 8:
        raise WireError("expected a double")
    return struct.unpack("<d", raw)[0]


@dataclass
class Datum:
    tokens: list[int]
    inputs: dict[str, np.ndarray]


@dataclass
class ForwardBackwardRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    forward_only: bool
    data: list[Datum]
    config: dict[str, float | str] = field(default_factory=dict)


def _tensor(buf: bytes, name: str) -> np.ndarray:
    f = fields(buf)
    dtype = DTYPES.get(_one(f, 3, 0))
    if dtype is None:
        raise WireError(f"loss_fn_inputs[{name}]: unsupported dtype code {_one(f, 3, 0)}")
    shape = _ints(f, 4)
    if 2 in f:
        return _sparse(fields(_one(f, 2)), dtype, shape, name)
    raw = _one(f, 1, b"")
    if len(raw) % dtype.itemsize:
        raise WireError(f"loss_fn_inputs[{name}]: {len(raw)} bytes is not a whole number of {dtype} values")
    arr = np.frombuffer(raw, dtype=dtype)
    if shape and int(np.prod(shape)) != arr.size:
        raise WireError(f"loss_fn_inputs[{name}]: shape {shape} does not hold {arr.size} values")
    return arr.reshape(shape) if shape else arr


def _sparse(f: dict, dtype, shape: list[int], name: str) -> np.ndarray:
    """A CSR tensor made dense (zeros where nothing is listed), as the SDK's pad value is 0 here."""
    if len(shape) != 2:
        raise WireError(f"loss_fn_inputs[{name}]: a sparse tensor needs a 2-d shape, got {shape}")
    values = np.frombuffer(_one(f, 1, b""), dtype=dtype)
    crow = np.frombuffer(_one(f, 2, b""), dtype="<i8")
    col = np.frombuffer(_one(f, 3, b""), dtype="<i8")
    rows, cols = shape
    if len(crow) != rows + 1 or len(col) != len(values) or (len(col) and (col.min() < 0 or col.max() >= cols)):
        raise WireError(f"loss_fn_inputs[{name}]: inconsistent sparse CSR layout")
    dense = np.zeros(shape, dtype=dtype)
    for r in range(rows):
        lo, hi = int(crow[r]), int(crow[r + 1])
        if not 0 <= lo <= hi <= len(values):
            raise WireError(f"loss_fn_inputs[{name}]: bad CSR row pointers")
        dense[r, col[lo:hi]] = values[lo:hi]
    return dense


def _datum(buf: bytes) -> Datum:
    f = fields(buf)
    tokens: list[int] = []
    for chunk in f.get(1, []):
        cf = fields(chunk)
        if 1 not in cf:
            raise WireError("model_input: only encoded text chunks are supported (no image or audio chunks)")
        raw = _one(fields(_one(cf, 1)), 1, b"")
        if len(raw) % 4:
            raise WireError("model_input: token bytes are not whole int32 values")
        tokens.extend(np.frombuffer(raw, dtype="<i4").tolist())
    inputs = {}
    for entry in f.get(2, []):
        ef = fields(entry)
        name = _text(ef, 1)
        inputs[name] = _tensor(_one(ef, 2, b""), name)
    return Datum(tokens=tokens, inputs=inputs)


def decode_forward_backward(buf: bytes) -> ForwardBackwardRequest:
    f = fields(buf)
    config: dict[str, float | str] = {}
    for entry in f.get(5, []):
        ef = fields(entry)
        config[_text(ef, 1)] = _double(_one(ef, 2, b"\0" * 8))
    for entry in f.get(7, []):  # the v2 map wins where both are set, as the SDK's servers do
        ef = fields(entry)
        vf = fields(_one(ef, 2, b""))
        config[_text(ef, 1)] = _text(vf, 2) if 2 in vf else _double(_one(vf, 1, b"\0" * 8))
    seq = _one(f, 2, 0)
    return ForwardBackwardRequest(model_id=_text(f, 1), seq_id=seq - (1 << 64) if seq >= 1 << 63 else seq,
                                  loss_fn=_text(f, 4), forward_only=bool(_one(f, 6, 0)),
                                  data=[_datum(d) for d in f.get(3, [])], config=config)


# ------------------------------------------------------------------------------ encoding

def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _put_varint(number << 3 | 2) + _put_varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _put_varint(number << 3) + _put_varint(value) if value else b""


def _double_field(number: int, value: float) -> bytes:
    return _put_varint(number << 3 | 1) + struct.pack("<d", value)


def _packed(number: int, values: list[int]) -> bytes:
    return _len_field(number, b"".join(_put_varint(v) for v in values)) if values else b""


def _batched(arrays: list[np.ndarray], dtype: str) -> bytes:
    """Per-datum 1-d arrays as one ``BatchedTensor``: concatenated data and byte offsets."""
    np_dtype = DTYPES[DTYPE_CODE[dtype]]
    parts = [np.ascontiguousarray(a, dtype=np_dtype).reshape(-1) for a in arrays]
    offsets = np.zeros(len(parts) + 1, dtype="<i8")
    offsets[1:] = np.cumsum([p.nbytes for p in parts])
    return (_len_field(1, b"".join(p.tobytes() for p in parts)) + _len_field(2, offsets.tobytes())
            + _int_field(3, DTYPE_CODE[dtype]))


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """``ForwardBackwardOutput`` with one ``ArrayRecord`` of float32 per-token fields per datum."""
    names = sorted(outputs[0]) if outputs else []
    record = _len_field(1, b"ArrayRecord")
    for name in names:
        entry = _len_field(1, name.encode()) + _len_field(2, _batched([o[name] for o in outputs], "float32"))
        record += _len_field(2, entry)
    record += _int_field(3, len(outputs))
    out = _len_field(1, b"ArrayRecord") + _len_field(2, record)
    for key, value in metrics.items():
        out += _len_field(3, _len_field(1, key.encode()) + _double_field(2, float(value)))
    return out


TOPK_MASK = (0, -99999.0)
"""The SDK's filler of a top-k row with nothing in it (position 0, which has no context): it reads
such a row as None."""


def encode_sample_response(sequences: list[tuple[str, list[int], list[float]]],
                           prompt_logprobs: list[float] | None,
                           topk_prompt: tuple[np.ndarray, np.ndarray] | None = None) -> bytes:
    """``SampleResponse``: (stop reason, tokens, log-probs) per sequence; prompt log-probs with NaN
    at position 0, which has no context (the SDK reads NaN as None); ``topk_prompt``: the (L, k)
    token ids and log-probs of the top k at each prompt position (``TopkLogprobs``; row 0
    `TOPK_MASK`)."""
    out = b""
    for reason, tokens, logprobs in sequences:
        seq = (_int_field(1, STOP_REASON[reason]) + _len_field(2, np.asarray(tokens, dtype="<i4").tobytes())
               + _len_field(3, np.asarray(logprobs, dtype="<f4").tobytes()))
        out += _len_field(1, seq)
    if prompt_logprobs is not None:
        out += _len_field(2, np.asarray(prompt_logprobs, dtype="<f4").tobytes())
    if topk_prompt is not None:
        ids, logprobs = topk_prompt
        out += _len_field(3, _len_field(1, np.asarray(ids, dtype="<i4").tobytes())
                          + _len_field(2, np.asarray(logprobs, dtype="<f4").tobytes())
                          + _int_field(3, ids.shape[1]) + _int_field(4, ids.shape[0]))
    return out


def encode_tensor(arr: np.ndarray) -> bytes:
    """A dense ``Tensor`` (tests build SDK-shaped requests with it)."""
    code = DTYPE_CODE["int64" if arr.dtype.kind in "iu" else "float32"]
    return (_len_field(1, np.ascontiguousarray(arr, dtype=DTYPES[code]).tobytes()) + _int_field(3, code)
            + _packed(4, list(arr.shape)))


def encode_forward_backward(model_id: str, seq_id: int, loss_fn: str, data: list[tuple[list[int], dict]],
                            forward_only: bool = False) -> bytes:
    """A ``ForwardBackwardRequest`` as the SDK writes it (tests speak plain HTTP with it)."""
    out = _len_field(1, model_id.encode()) + _int_field(2, seq_id)
    for tokens, inputs in data:
        chunk = _len_field(1, _len_field(1, np.asarray(tokens, dtype="<i4").tobytes()))
        datum = _len_field(1, chunk)
        for name, arr in inputs.items():
            datum += _len_field(2, _len_field(1, name.encode()) + _len_field(2, encode_tensor(np.asarray(arr))))
        out += _len_field(3, datum)
    return out + _len_field(4, loss_fn.encode()) + _int_field(6, int(forward_only))
