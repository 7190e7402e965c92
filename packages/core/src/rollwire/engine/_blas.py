"""Run the BLAS library NumPy uses single-threaded while an engine runs (no extra dependency).

The seeded model's matrices are tiny (128 x 1400 at most): with OpenBLAS' default thread pool,
thread hand-off costs far more than the arithmetic (a ``[16, 128] @ [128, 1378]`` matmul measured
5 ms with two threads vs 0.1 ms with one on a 2-core box), and it kills batching gains. A real
model's decode (SmolLM2-135M) is memory-bound: a second thread helps on an idle box (about 34 vs
23 tok/s on 2 cores) but collapses when the cores are shared (3 vs 17 tok/s with a load average of
6, a trainer beside it being the usual case), so every model runs single-threaded.

The thread count is process-wide, so it is reference-counted: the first engine to start saves each
library's setting and pins it to one thread; the last engine to stop restores the saved values, so
a host process (a trainer, a notebook) gets its BLAS threads back.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["acquire_single_thread_blas", "blas_threads", "release_single_thread_blas"]

# (setter, getter) pairs of the BLAS builds NumPy ships or links.
_API = (
    ("openblas_set_num_threads", "openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),
    ("bli_thread_set_num_threads", "bli_thread_get_num_threads"),
)

_lock = threading.Lock()
_holders = 0
_saved: list[tuple[Any, int]] = []


def _loaded_blas_libraries() -> list[str]:
    maps = Path("/proc/self/maps")
    if not sys.platform.startswith("linux") or not maps.exists():
        return []
    found: set[str] = set()
    for line in maps.read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        name = path.rsplit("/", 1)[-1].lower()
        if path.startswith("/") and any(k in name for k in ("blas", "mkl_rt", "blis")):
            found.add(path)
    return sorted(found)


def _controls() -> list[tuple[Any, Any]]:
    """(setter, getter) of every loaded BLAS we can find."""
    import numpy  # noqa: F401  (make sure NumPy's BLAS is loaded)

    out = []
    for path in _loaded_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _API:
            setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setter is not None and getter is not None:
                getter.restype = ctypes.c_int
                out.append((setter, getter))
                break
    return out


def blas_threads() -> list[int]:
    """The current thread count of every loaded BLAS we can find."""
    return [int(get()) for _, get in _controls()]


def acquire_single_thread_blas() -> None:
    """Pin BLAS to one thread; the first holder saves the previous settings."""
    global _holders
    with _lock:
        if _holders == 0:
            _saved.clear()
            for setter, getter in _controls():
                _saved.append((setter, int(getter())))
                setter(ctypes.c_int(1))
        _holders += 1


def release_single_thread_blas() -> None:
    """Drop one hold; the last holder restores the settings saved by the first."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            for setter, previous in _saved:
                setter(ctypes.c_int(previous))
            _saved.clear()
