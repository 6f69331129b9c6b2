"""snapflow.malloc_tuning: which settings reach mallopt, when nothing is changed, and that on
this machine's glibc a tuned process keeps freed heap memory that an untuned one returns."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from snapflow.malloc_tuning import (
    M_MMAP_THRESHOLD,
    M_TOP_PAD,
    M_TRIM_THRESHOLD,
    MIB,
    MallocTuning,
    tune_malloc,
)


class RecordingLibc:
    """A stand-in C library for the pure decisions: records mallopt calls, refuses one."""

    def __init__(self, refuse: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if param == self.refuse else 1


def test_defaults_reach_mallopt_in_order() -> None:
    libc = RecordingLibc()
    outcome = tune_malloc(environ={}, libc=libc)
    assert outcome.applied and outcome.why == ""
    assert libc.calls == [
        (M_MMAP_THRESHOLD, 16 * MIB),
        (M_TRIM_THRESHOLD, 64 * MIB),
        (M_TOP_PAD, 16 * MIB),
    ]


def test_custom_settings() -> None:
    libc = RecordingLibc()
    tuning = MallocTuning(
        trim_threshold_bytes=8 * MIB, top_pad_bytes=MIB, mmap_threshold_bytes=2 * MIB
    )
    assert tune_malloc(tuning, environ={}, libc=libc).applied
    assert libc.calls == [
        (M_MMAP_THRESHOLD, 2 * MIB),
        (M_TRIM_THRESHOLD, 8 * MIB),
        (M_TOP_PAD, MIB),
    ]


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "MALLOC_TRIM_THRESHOLD_"),
        ({"MALLOC_TOP_PAD_": "0"}, "MALLOC_TOP_PAD_"),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, "MALLOC_MMAP_THRESHOLD_"),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "GLIBC_TUNABLES"),
    ],
)
def test_the_environment_wins(environ: dict[str, str], named: str) -> None:
    libc = RecordingLibc()
    outcome = tune_malloc(environ=environ, libc=libc)
    assert not outcome.applied
    assert named in outcome.why
    assert libc.calls == []


def test_other_tunables_and_empty_variables_do_not_count() -> None:
    libc = RecordingLibc()
    environ = {"GLIBC_TUNABLES": "glibc.pthread.rseq=0", "MALLOC_TOP_PAD_": ""}
    assert tune_malloc(environ=environ, libc=libc).applied
    assert len(libc.calls) == 3


def test_not_glibc_is_left_alone() -> None:
    outcome = tune_malloc(environ={}, libc_name="musl")
    assert not outcome.applied
    assert outcome.why == "the C library is musl, not glibc"


def test_a_refused_setting_is_reported_and_stops() -> None:
    libc = RecordingLibc(refuse=M_TRIM_THRESHOLD)
    outcome = tune_malloc(environ={}, libc=libc)
    assert not outcome.applied
    assert outcome.why == f"mallopt(M_TRIM_THRESHOLD, {64 * MIB}) was refused"
    assert len(libc.calls) == 2  # the top pad was not tried


@pytest.mark.parametrize("field", ["trim_threshold_bytes", "top_pad_bytes", "mmap_threshold_bytes"])
@pytest.mark.parametrize("value", [0, -1, 1 << 31, True, 1.5])
def test_bad_settings_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        MallocTuning(**{field: value})  # type: ignore[arg-type]


# The real effect, each in a fresh interpreter (malloc settings are per process): 48 MiB of
# 96 KiB blocks (from the heap either way: below glibc's default mmap threshold) freed again;
# an untuned glibc returns the heap's top to the kernel, a tuned one keeps it for the next
# allocations.
_PROBE = textwrap.dedent(
    """
    import ctypes, os, sys
    from snapflow.malloc_tuning import tune_malloc

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    if sys.argv[1] == "tuned":
        assert tune_malloc(environ={}).applied
    blocks = [bytearray(96 << 10) for _ in range(512)]
    peak = libc.mallinfo2().arena
    del blocks
    print(peak >> 20, libc.mallinfo2().arena >> 20)
    """
)


def _heap_mib(mode: str) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60, check=True
    )
    peak, after = done.stdout.split()
    return int(peak), int(after)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_tuned_heap_keeps_what_it_freed() -> None:
    peak, after = _heap_mib("untuned")
    assert peak >= 48 and after < 8, (peak, after)  # glibc trims the freed top
    peak, after = _heap_mib("tuned")
    assert peak >= 48 and after >= 48, (peak, after)  # kept for the next batch
