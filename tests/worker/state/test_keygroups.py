"""Key-group math (Flink's KeyGroupRangeAssignment) and the stable key hash, scalar and vectorised."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pyarrow as pa
import pytest

from snapflow.errors import InvalidArgumentError
from snapflow.worker.state import keygroups
from snapflow.worker.state.keygroups import (
    MASK64,
    UPPER_BOUND_MAX_PARALLELISM,
    KeyGroupRange,
    fmix64,
    key_group_for_hash,
    key_group_for_key,
    key_group_range_for_subtask,
    key_groups,
    key_hash,
    key_hashes,
    operator_index_for_key_group,
    subtask_for_key,
)

# ---------------------------------------------------------------------------------------------
# Ranges and assignment
# ---------------------------------------------------------------------------------------------


def test_ranges_match_flink_for_128_over_3() -> None:
    ranges = [key_group_range_for_subtask(128, 3, i) for i in range(3)]
    assert ranges == [KeyGroupRange(0, 42), KeyGroupRange(43, 85), KeyGroupRange(86, 127)]
    assert [len(r) for r in ranges] == [43, 43, 42]


def test_ranges_hand_computed_examples() -> None:
    # start = (i * maxP + p - 1) // p, end = ((i + 1) * maxP - 1) // p
    assert [key_group_range_for_subtask(10, 3, i) for i in range(3)] == [
        KeyGroupRange(0, 3),
        KeyGroupRange(4, 6),
        KeyGroupRange(7, 9),
    ]
    assert [key_group_range_for_subtask(128, 2, i) for i in range(2)] == [
        KeyGroupRange(0, 63),
        KeyGroupRange(64, 127),
    ]
    assert key_group_range_for_subtask(128, 1, 0) == KeyGroupRange(0, 127)
    assert key_group_range_for_subtask(4, 4, 3) == KeyGroupRange(3, 3)
    # kg * p // maxP
    assert operator_index_for_key_group(128, 3, 42) == 0
    assert operator_index_for_key_group(128, 3, 43) == 1
    assert operator_index_for_key_group(128, 3, 85) == 1
    assert operator_index_for_key_group(128, 3, 86) == 2
    assert operator_index_for_key_group(128, 3, 127) == 2


@pytest.mark.parametrize("max_p", [1, 7, 10, 128, 1000, 4096])
def test_ranges_partition_key_groups_and_agree_with_operator_index(max_p: int) -> None:
    parallelisms = sorted(
        {p for p in (1, 2, 3, 5, max_p // 2, max_p - 1, max_p) if 1 <= p <= max_p}
    )
    for p in parallelisms:
        expected_start = 0
        for i in range(p):
            r = key_group_range_for_subtask(max_p, p, i)
            assert r.start == expected_start
            assert len(r) >= 1
            expected_start = r.end + 1
            for kg in (r.start, r.end, (r.start + r.end) // 2):
                assert operator_index_for_key_group(max_p, p, kg) == i
        assert expected_start == max_p


def test_invalid_parameters_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        key_group_range_for_subtask(0, 1, 0)
    with pytest.raises(InvalidArgumentError):
        key_group_range_for_subtask(UPPER_BOUND_MAX_PARALLELISM + 1, 1, 0)
    with pytest.raises(InvalidArgumentError):
        key_group_range_for_subtask(128, 129, 0)  # parallelism > max parallelism
    with pytest.raises(InvalidArgumentError):
        key_group_range_for_subtask(128, 3, 3)
    with pytest.raises(InvalidArgumentError):
        operator_index_for_key_group(128, 3, 128)
    with pytest.raises(InvalidArgumentError):
        key_groups(pa.array([1, 2]), 0)


def test_key_group_range_helpers() -> None:
    r = KeyGroupRange(10, 20)
    assert 10 in r and 20 in r and 9 not in r and 21 not in r
    assert list(KeyGroupRange(3, 5)) == [3, 4, 5]
    assert r.intersection(KeyGroupRange(15, 30)) == KeyGroupRange(15, 20)
    assert len(r.intersection(KeyGroupRange(21, 30))) == 0
    assert not r.overlaps(KeyGroupRange(21, 30))
    assert len(KeyGroupRange.empty()) == 0


# ---------------------------------------------------------------------------------------------
# Scalar hash
# ---------------------------------------------------------------------------------------------


def _reference_fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) % 2**64
    h ^= h >> 33
    h = (h * 0xC4CEB93FE53EC4CE) % 2**64
    h ^= h >> 33
    return h


def _reference_bytes_hash(data: bytes) -> int:
    h = 0
    for b in data:
        h = (h + b + 1) * 0x100000001B3 % 2**64
    return h


def test_hash_follows_its_documented_definition() -> None:
    assert key_hash(42) == 42
    assert key_hash(-1) == MASK64
    assert key_hash(True) == 1
    assert key_hash(3.0) == 3  # integral floats hash like the equal int
    assert key_hash("hello") == _reference_bytes_hash(b"hello") == key_hash(b"hello")
    assert key_hash("é") == _reference_bytes_hash("é".encode())
    assert key_hash("\x00a") != key_hash("a")  # leading zero bytes count
    p = 0x100000001B3
    assert key_hash((1, "a")) == ((1 * p + 1) * p + key_hash("a")) % 2**64
    for h in (0, 1, 2**63, MASK64, 0x123456789ABCDEF):
        assert fmix64(h) == _reference_fmix64(h)
        assert key_group_for_hash(h, 128) == _reference_fmix64(h) % 128


def test_golden_key_groups_never_change() -> None:
    """These values are baked into every snapshot: changing them breaks restores."""
    golden = {
        0: (0, 0),
        1: (52, 9908),
        -1: (89, 3673),
        42: (33, 18209),
        2**63 - 1: (11, 32395),
        "hello": (65, 12609),
        "": (0, 0),
        "é": (106, 17386),
        b"hello": (65, 12609),
        (1, "a"): (91, 18267),
    }
    for key, (kg128, kg32768) in golden.items():
        assert key_group_for_key(key, 128) == kg128, key
        assert key_group_for_key(key, 32768) == kg32768, key


def test_hash_is_stable_across_processes() -> None:
    keys = ["alpha", "βeta", "", "x" * 100]
    code = f"from snapflow.worker.state.keygroups import key_group_for_key as k;print([k(x, 4096) for x in {keys!r}])"
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(out.stdout.strip())
    assert outputs == {str([key_group_for_key(x, 4096) for x in keys])}


def test_unsupported_and_null_keys_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="null"):
        key_hash(None)
    with pytest.raises(InvalidArgumentError, match="unsupported key type"):
        key_hash(object())
    with pytest.raises(InvalidArgumentError, match="null"):
        key_groups(pa.array([1, None]), 128)
    with pytest.raises(InvalidArgumentError):
        key_groups([1, None], 128)


def test_key_groups_spread_evenly() -> None:
    groups = key_groups(pa.array(range(128_000), pa.int64()), 128).to_pylist()
    counts = [0] * 128
    for g in groups:
        counts[g] += 1
    assert min(counts) > 800 and max(counts) < 1200  # 1000 expected per group


def test_subtask_for_key() -> None:
    for key in ("a", 7, b"z"):
        kg = key_group_for_key(key, 128)
        assert subtask_for_key(key, 128, 3) == operator_index_for_key_group(128, 3, kg)


# ---------------------------------------------------------------------------------------------
# Vectorised == scalar
# ---------------------------------------------------------------------------------------------

_RNG = random.Random(1234)
_INTS = [_RNG.randrange(-(2**63), 2**63) for _ in range(5000)] + [
    0,
    1,
    -1,
    2**63 - 1,
    -(2**63),
    *range(-50, 50),
]
_STRS = [
    "",
    "a",
    "\x00a",
    "a\x00",
    "é",
    "日本語",
    "x" * 300,
    *(str(_RNG.randrange(10**15)) for _ in range(3000)),
    *(
        "".join(chr(_RNG.randrange(32, 0x2FFF)) for _ in range(_RNG.randrange(0, 20)))
        for _ in range(2000)
    ),
]


@pytest.mark.parametrize("max_p", [1, 3, 128, 1000, 32768])
def test_vectorised_int64_agrees_with_scalar(max_p: int) -> None:
    expected = [key_group_for_key(k, max_p) for k in _INTS]
    assert key_groups(pa.array(_INTS, pa.int64()), max_p).to_pylist() == expected
    assert key_groups(_INTS, max_p).to_pylist() == expected  # Python list input


@pytest.mark.parametrize("max_p", [128, 1000])
def test_vectorised_strings_agree_with_scalar(max_p: int) -> None:
    expected = [key_group_for_key(s, max_p) for s in _STRS]
    for typ in (pa.string(), pa.large_string()):
        assert key_groups(pa.array(_STRS, typ), max_p).to_pylist() == expected
    assert key_groups(_STRS, max_p).to_pylist() == expected
    as_bytes = [s.encode() for s in _STRS]
    for typ in (pa.binary(), pa.large_binary()):
        assert key_groups(pa.array(as_bytes, typ), max_p).to_pylist() == expected


def test_vectorised_other_layouts_agree_with_scalar() -> None:
    arr = pa.array(_STRS)
    # slices (non-zero offsets), chunked arrays, dictionary encoding, string views
    assert key_groups(arr.slice(7, 500), 128).to_pylist() == [
        key_group_for_key(s, 128) for s in _STRS[7:507]
    ]
    chunked = pa.chunked_array([arr.slice(0, 100), arr.slice(100, 0), arr.slice(100)])
    assert key_groups(chunked, 128).to_pylist() == [key_group_for_key(s, 128) for s in _STRS]
    assert key_groups(arr.dictionary_encode(), 128).to_pylist() == [
        key_group_for_key(s, 128) for s in _STRS
    ]
    assert key_groups(pa.array(_STRS, pa.string_view()), 128).to_pylist() == [
        key_group_for_key(s, 128) for s in _STRS
    ]
    assert key_groups(pa.array(["", ""]), 128).to_pylist() == [0, 0]
    assert key_groups(pa.array([], pa.string()), 128).to_pylist() == []
    # narrower and unsigned integers, booleans
    small = [-5, 0, 7, 127, -128]
    assert key_groups(pa.array(small, pa.int8()), 100).to_pylist() == [
        key_group_for_key(k, 100) for k in small
    ]
    big = [0, 2**63, 2**64 - 1, 12345]
    assert key_groups(pa.array(big, pa.uint64()), 100).to_pylist() == [
        key_group_for_key(k, 100) for k in big
    ]
    assert key_groups(pa.array([True, False]), 100).to_pylist() == [
        key_group_for_key(True, 100),
        key_group_for_key(False, 100),
    ]
    # types without a kernel fall back to the scalar hash (floats, mixed, tuples)
    mixed = [1.5, 2.0, -0.0]
    assert key_groups(pa.array(mixed), 100).to_pylist() == [
        key_group_for_key(k, 100) for k in mixed
    ]
    odd: list[object] = [(1, "a"), "b", 3, 2.5]
    assert key_groups(odd, 100).to_pylist() == [key_group_for_key(k, 100) for k in odd]


def test_long_string_arrays_are_hashed_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    # Over the per-pass byte budget: hashed in row slices, same result.
    monkeypatch.setattr(keygroups, "_STRING_SLICE_BYTES", 1000)
    rows = ["k" * (i % 70) + str(i) for i in range(500)]  # ~18 kB
    rows.append("".join(chr(97 + i % 26) for i in range(5000)))  # one row longer than a pass
    assert key_hashes(pa.array(rows)).to_pylist() == [key_hash(r) for r in rows]
    assert key_hashes(pa.array(rows[::-1])).to_pylist() == [key_hash(r) for r in rows[::-1]]
