"""A step's routed experts as rLLM's ``Step.routing_matrices``, in the two forms rLLM reads.

- ``"verl"`` (the default; what rLLM's verl backend reads): a two-element list
  ``[header_json, base64_blob]``. ``header_json`` is ``{"shape": [layers, top_k], "dtype": "int16"}``;
  the blob is the little-endian bytes of the step's ``[T, layers, top_k]`` routing covering its
  prompt **and** response from the first prompt token — exactly what the backend returned (vLLM and
  SGLang give ``T = len(prompt) + len(completion) - 1``: every token fed through the model).
  rLLM's verl transform decodes it with ``reshape(-1, layers, top_k)`` and places it from the
  row's first prompt column, zeros elsewhere; any other length of list is silently ignored there.
- ``"tinker"`` (rLLM's Tinker / Fireworks path): one string per completion token, each a compact JSON
  ``[{"shape":[L,K],"dtype":"int16"},"<base64>"]`` of the ``[layers, top_k]`` experts of the forward
  pass that sampled that token.
"""

from __future__ import annotations

import base64
import json
from typing import Literal

import numpy as np

from rollwire.data.protocol import ModelCall

__all__ = [
    "ROUTING_FORMATS",
    "RoutingFormat",
    "decode_routing_matrix",
    "decode_verl_routing",
    "routing_matrices",
    "tinker_routing_matrices",
    "verl_routing_matrices",
]

RoutingFormat = Literal["verl", "tinker"]
ROUTING_FORMATS: tuple[str, ...] = ("verl", "tinker")


def _checked_experts(call: ModelCall) -> np.ndarray | None:
    experts = call.routed_experts
    p, n = call.prompt_ids.shape[0], call.completion_ids.shape[0]
    if experts is None or n == 0:
        return None
    if experts.ndim != 3 or experts.shape[0] != p + n - 1 or p == 0:
        raise ValueError(
            f"call {call.call_id}: routed experts have shape {tuple(experts.shape)}, expected "
            f"[len(prompt) + len(completion) - 1 = {p + n - 1}, layers, top_k]"
        )
    return experts


def _header(layers: int, top_k: int) -> str:
    return json.dumps({"shape": [layers, top_k], "dtype": "int16"}, separators=(",", ":"))


def verl_routing_matrices(call: ModelCall) -> list[str] | None:
    """``[header_json, base64_blob]`` of the call's whole routing (see the module docstring)."""
    experts = _checked_experts(call)
    if experts is None:
        return None
    block = np.ascontiguousarray(experts, dtype="<i2")
    blob = base64.b64encode(block.tobytes()).decode("ascii")
    return [_header(int(block.shape[1]), int(block.shape[2])), blob]


def decode_verl_routing(encoded: list[str]) -> np.ndarray:
    """Inverse of :func:`verl_routing_matrices`: the ``[T, layers, top_k]`` int16 array."""
    if not isinstance(encoded, list) or len(encoded) != 2:
        raise ValueError(
            f"verl routing must be [header_json, base64_blob], got a {type(encoded).__name__} "
            f"of length {len(encoded) if isinstance(encoded, list) else '?'}"
        )
    try:
        header = json.loads(encoded[0])
        layers, top_k = header["shape"]
        dtype = np.dtype(header["dtype"]).newbyteorder("<")
        arr = np.frombuffer(base64.b64decode(encoded[1]), dtype=dtype)
        return arr.reshape(-1, int(layers), int(top_k)).astype(np.int16)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a verl routing pair: {str(encoded)[:80]!r}") from exc


def tinker_routing_matrices(call: ModelCall) -> list[str] | None:
    """Per completion token, the ``[layers, top_k]`` experts of the forward pass that sampled it.

    Token j of the completion was produced by feeding position ``len(prompt) + j - 1``, so its
    matrix is ``routed_experts[len(prompt) + j - 1]``.
    """
    experts = _checked_experts(call)
    if experts is None:
        return None
    p, n = call.prompt_ids.shape[0], call.completion_ids.shape[0]
    block = np.ascontiguousarray(experts[p - 1 : p - 1 + n], dtype="<i2")
    header = _header(int(block.shape[1]), int(block.shape[2]))
    encoded = _b64_rows(block.reshape(n, -1).view(np.uint8))
    return np.char.add(np.char.add(f'[{header},"', encoded), '"]').tolist()


def routing_matrices(call: ModelCall, routing_format: RoutingFormat = "verl") -> list[str] | None:
    """The call's ``Step.routing_matrices`` in ``routing_format`` (None without routing)."""
    if routing_format == "verl":
        return verl_routing_matrices(call)
    if routing_format == "tinker":
        return tinker_routing_matrices(call)
    raise ValueError(f"routing_format must be one of {ROUTING_FORMATS}, got {routing_format!r}")


def _b64_rows(rows: np.ndarray) -> np.ndarray:
    """Standard base64 of each row of a ``[n, width]`` uint8 array, in one pass (no per-row loop)."""
    n, width = rows.shape
    pad = -width % 3
    if pad:
        rows = np.concatenate([rows, np.zeros((n, pad), np.uint8)], axis=1)
    # rows padded to whole 3-byte groups encode independently of each other
    chars = np.frombuffer(base64.b64encode(rows.tobytes()), dtype=np.uint8).reshape(n, -1).copy()
    if pad:
        chars[:, -pad:] = ord("=")
    return chars.view(f"S{chars.shape[1]}").ravel().astype(str)


def decode_routing_matrix(entry: str) -> np.ndarray:
    """Inverse of one :func:`tinker_routing_matrices` entry: the ``[layers, top_k]`` int16 array."""
    try:
        header, b64 = json.loads(entry)
        arr = np.frombuffer(
            base64.b64decode(b64), dtype=np.dtype(header["dtype"]).newbyteorder("<")
        )
        return arr.reshape(header["shape"]).astype(np.int16)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a rollwire routing matrix entry: {entry[:80]!r}") from exc
