"""Arrow array helpers shared by windows, sources and workloads: :data:`arange`, ``0 .. n-1``
without building it anew per batch."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


class _Arange:
    """``0 .. n-1`` as an int64 array, sliced from a cached array grown on demand."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = pa.array(range(1024), pa.int64())

    def __call__(self, n: int) -> pa.Array:
        values = self._values
        if len(values) < n:
            with self._lock:
                values = self._values
                while len(values) < n:
                    values = pa.concat_arrays(
                        [values, pc.add(values, pa.scalar(len(values), pa.int64()))]
                    )
                self._values = values
        return values.slice(0, n)

    def __reduce__(self) -> str | tuple[Any, ...]:
        return (_Arange, ())


arange = _Arange()
