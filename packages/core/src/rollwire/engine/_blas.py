"""Pin the BLAS library NumPy uses to one thread (best effort, no extra dependency).

The engine's matrices are tiny (128 x 1400 at most): with OpenBLAS' default thread pool, thread
hand-off costs far more than the arithmetic (a ``[16, 128] @ [128, 1378]`` matmul measured 5 ms with
two threads vs 0.1 ms with one on a 2-core box), and it kills batching gains.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "MKL_Set_Num_Threads",
    "bli_thread_set_num_threads",
)


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


def limit_blas_threads(n: int = 1) -> bool:
    """Set the thread count of every loaded BLAS we can find; True if one was set."""
    import numpy  # noqa: F401  (make sure NumPy's BLAS is loaded)

    done = False
    for path in _loaded_blas_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(n))
                done = True
                break
    return done
