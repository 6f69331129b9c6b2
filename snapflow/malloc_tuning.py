"""glibc's ``malloc`` kept from handing memory back to the kernel after every batch.

Why: glibc gives free memory at the top of its main heap back to the kernel (``brk``) once more
than ``M_TRIM_THRESHOLD`` lies free there, and the next allocations fault the same pages in
again. An agent allocates and frees hundreds of kilobytes per batch outside Arrow's own pool
(gRPC messages and their payloads, protobuf frames, Python objects above pymalloc's 512
bytes): on the dataplane benchmark (``bench/dataplane_bench.py``) an agent's loop thread called
``brk`` 124 times a second (240 with checkpoints every 100 ms), and its system time was 9-18 %
of its CPU. With the settings below no ``brk`` is left in a three-second ``strace -c`` of the
same loop, and the job ran 13-14 % faster with and without checkpoints (interleaved runs, peak
RSS unchanged at about 205 MB an agent; docs/worker.md, "glibc's heap").

What: three ``mallopt`` settings, once per agent process (``snapflow worker``, a Spark
executor's Python worker when it starts an agent): keep up to ``trim_threshold_bytes`` free at the
heap's top, grow it ``top_pad_bytes`` at a time, and serve allocations below
``mmap_threshold_bytes`` from the heap (setting any of them turns off glibc's own moving
threshold, which otherwise climbs to the largest block freed, so all three are set). The heap
only keeps what it once held: memory a process never needed is never taken. The threshold
holds per arena: a process whose threads allocate in arenas of their own (glibc makes up to
eight per core) may keep up to that much free in each.

Environment first: if ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_THRESHOLD_`` or a ``glibc.malloc`` entry of ``GLIBC_TUNABLES`` is set, the user
tuned malloc: nothing is changed (``MALLOC_TRIM_THRESHOLD_=131072``, glibc's initial
threshold, brings the trimming back). Other C libraries (musl, macOS) are left alone. Python's ``ctypes`` calls
``mallopt``; no package does this for us (``python -X`` options do not reach glibc)."""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["MallocTuning", "TuningOutcome", "tune_malloc"]

MIB = 1 << 20

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

ENVIRONMENT_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")
"""glibc's own malloc variables: any of them set means the environment tunes malloc."""


@dataclass(frozen=True)
class MallocTuning:
    """The ``mallopt`` settings (bytes)."""

    trim_threshold_bytes: int = 64 * MIB
    """Free memory kept at the top of the heap before any is returned (glibc: 128 KiB,
    climbing with the largest block freed)."""
    top_pad_bytes: int = 16 * MIB
    """Extra memory asked of the kernel whenever the heap grows (glibc: 128 KiB)."""
    mmap_threshold_bytes: int = 16 * MIB
    """Allocations at least this large get pages of their own (``mmap``), returned when freed;
    smaller ones come from the heap (glibc: 128 KiB, climbing up to 32 MiB)."""

    def __post_init__(self) -> None:
        for name in ("trim_threshold_bytes", "top_pad_bytes", "mmap_threshold_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 1 << 31:
                raise ValueError(
                    f"{name} must be an integer of 1 to 2**31 - 1 bytes, got {value!r}"
                )


@dataclass(frozen=True)
class TuningOutcome:
    """What ``tune_malloc`` did: ``applied`` or, if not, ``why``."""

    applied: bool
    why: str = ""


class _Libc(Protocol):
    def mallopt(self, param: int, value: int) -> int: ...


def _environment_tunes(environ: Mapping[str, str]) -> str:
    named = [v for v in ENVIRONMENT_VARIABLES if environ.get(v)]
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        named.append("GLIBC_TUNABLES")
    return ", ".join(named)


def tune_malloc(
    tuning: MallocTuning = MallocTuning(),
    *,
    environ: Mapping[str, str] | None = None,
    libc: _Libc | None = None,
    libc_name: str | None = None,
) -> TuningOutcome:
    """Apply ``tuning`` to this process's glibc malloc, unless the environment tunes it or the
    C library is not glibc. ``environ``, ``libc`` and ``libc_name`` (``platform.libc_ver``'s)
    default to this process's; tests pass their own. Never raises for a refused setting: the
    outcome says which one glibc refused."""
    env = os.environ if environ is None else environ
    named = _environment_tunes(env)
    if named:
        return TuningOutcome(False, f"the environment tunes malloc ({named})")
    if libc is None:
        name = platform.libc_ver()[0] if libc_name is None else libc_name
        if name != "glibc":
            return TuningOutcome(False, f"the C library is {name or 'unknown'}, not glibc")
        libc = ctypes.CDLL(None)
    for param, value, label in (
        (M_MMAP_THRESHOLD, tuning.mmap_threshold_bytes, "M_MMAP_THRESHOLD"),
        (M_TRIM_THRESHOLD, tuning.trim_threshold_bytes, "M_TRIM_THRESHOLD"),
        (M_TOP_PAD, tuning.top_pad_bytes, "M_TOP_PAD"),
    ):
        if libc.mallopt(param, value) != 1:  # glibc: 1 on success, 0 on error
            return TuningOutcome(False, f"mallopt({label}, {value}) was refused")
    return TuningOutcome(True)
