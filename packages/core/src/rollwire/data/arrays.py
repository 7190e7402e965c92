"""NumPy-backed token arrays for pydantic models, serialized compactly (packed bytes, base64).

A token array never appears in JSON as a list of numbers: it is ``{"dtype", "shape", "b64"}`` with
little-endian packed bytes, so a 8k-token prompt costs ~43 KB of JSON instead of ~50 KB of digits
and parses with one ``np.frombuffer``.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

__all__ = [
    "Float32Array",
    "Int8Array",
    "Int16Array",
    "Int32Array",
    "OptionalInt16Array",
    "as_array",
    "common_prefix_len",
    "decode_array",
    "encode_array",
]


def encode_array(arr: np.ndarray) -> dict[str, Any]:
    """Pack an array as ``{"dtype", "shape", "b64"}`` (little-endian bytes, base64)."""
    le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return {
        "dtype": le.dtype.str,
        "shape": list(arr.shape),
        "b64": base64.b64encode(np.ascontiguousarray(le).tobytes()).decode("ascii"),
    }


def decode_array(obj: dict[str, Any]) -> np.ndarray:
    """Inverse of :func:`encode_array`."""
    try:
        raw = base64.b64decode(obj["b64"])
        arr = np.frombuffer(raw, dtype=np.dtype(obj["dtype"]))
        return arr.reshape(obj["shape"])
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(
            f"not a packed array (expected {{'dtype', 'shape', 'b64'}}): {str(obj)[:80]!r}"
        ) from exc


def as_array(value: Any, dtype: np.dtype[Any] | type, ndim: int | None = None) -> np.ndarray:
    """Coerce a list, ndarray or packed dict to a contiguous array of ``dtype``."""
    if isinstance(value, dict):
        value = decode_array(value)
    target = np.dtype(dtype)
    raw = np.asarray(value)
    if raw.dtype != target and raw.size:
        if target.kind in "iu" and raw.dtype.kind not in "iub":
            raise ValueError(f"expected integer token ids ({target}), got {raw.dtype} values")
        if target.kind in "iu" and raw.dtype.kind in "iu":
            info = np.iinfo(target)
            if int(raw.min()) < info.min or int(raw.max()) > info.max:
                raise ValueError(
                    f"values out of range for {target}: min {int(raw.min())}, max {int(raw.max())}"
                )
    arr = raw.astype(target, copy=False) if raw.dtype != target else raw
    if ndim is not None and arr.ndim != ndim:
        if arr.size == 0 and ndim == 1:
            arr = arr.reshape(0)
        else:
            raise ValueError(f"expected a {ndim}-d array, got shape {arr.shape}")
    return arr


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-d arrays (vectorised)."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _serialize(arr: np.ndarray) -> dict[str, Any]:
    return encode_array(arr)


def _array_type(dtype: type, ndim: int | None) -> Any:
    schema = {
        "type": "object",
        "properties": {
            "dtype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "b64": {"type": "string"},
        },
    }
    return Annotated[
        np.ndarray,
        BeforeValidator(lambda v: as_array(v, dtype, ndim)),
        PlainSerializer(_serialize, when_used="json"),
        WithJsonSchema(schema),
    ]


Int32Array = _array_type(np.int32, 1)
Float32Array = _array_type(np.float32, 1)
Int8Array = _array_type(np.int8, 1)
Int16Array = _array_type(np.int16, None)
OptionalInt16Array = Int16Array | None
