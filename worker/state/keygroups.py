"""Key groups: how keyed state is partitioned, exactly as Flink's ``KeyGroupRangeAssignment``.

A keyed vertex has ``max_parallelism`` key groups (0 .. max_parallelism - 1). Every key belongs
to one key group, and every subtask owns one contiguous range of key groups. The key group is
the unit of keyed-state redistribution: a snapshot stores keyed state per key group, so a job
restored with a different parallelism hands each key group, whole, to the subtask that now owns
it. ``max_parallelism`` therefore can never change for a job once it has state.

The math (identical to Flink's ``KeyGroupRangeAssignment``)::

    key_group(key)              = fmix64(key_hash(key)) % max_parallelism
    range of subtask i          = [ (i * maxP + p - 1) // p , ((i + 1) * maxP - 1) // p ]
    subtask of key group kg     = kg * p // maxP

``key_hash`` plays the role of Java's ``hashCode()`` and ``fmix64`` (MurmurHash3's 64-bit
finalizer) the role of Flink's ``MathUtils.murmurHash``. The hash is defined on a key's
canonical value, never on Python's per-process randomised ``hash()``, so every process, host and
Python version agrees on it:

* ``int`` (and ``bool``) in ``[-2**63, 2**64)``: the 64-bit two's complement pattern of the value
  (``key & (2**64 - 1)``); an ``int64`` and a ``uint64`` Arrow array hash their raw 64 bits.
  Integral ``float`` values hash as the equal ``int`` (``1.0 == 1`` are one dict key); other
  floats hash their IEEE-754 bits. Larger ints hash their signed little-endian bytes.
* ``str``: its UTF-8 bytes; ``bytes`` / ``bytearray`` / ``memoryview``: their bytes. A byte
  string ``b_0 .. b_{n-1}`` hashes as the polynomial (Horner form, all arithmetic mod 2**64)
  ``h = 0; for b in bytes: h = (h + b + 1) * P`` with ``P = 0x100000001B3`` (the 64-bit FNV
  prime). The ``+ 1`` makes leading zero bytes count. The polynomial form is what lets the
  vectorised path hash a whole Arrow string array with prefix sums (see
  :func:`key_hashes`).
* ``tuple`` (composite keys): ``h = 1; for e in key: h = h * P + key_hash(e)`` (mod 2**64).

:data:`KEY_HASH_VERSION` names this definition; snapshots record it, and a restore refuses
state written with a different key hash (the key groups would not match). Changing any of the
above is a snapshot-format break.

The vectorised functions (:func:`key_hashes`, :func:`key_groups`) take a pyarrow ``Array`` /
``ChunkedArray`` (or anything ``pyarrow.array`` accepts: a list, a numpy array) and run in
Arrow compute kernels (no numpy needed): integers take ~10 passes of 64-bit arithmetic, strings a
prefix sum over their bytes. Types without a kernel fall back to the scalar hash per element, so
the scalar and the vectorised functions always agree.
"""

from __future__ import annotations

import functools
import struct
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapflow.errors import InvalidArgumentError

#: Flink's upper bound for the max parallelism (``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM``).
UPPER_BOUND_MAX_PARALLELISM = 1 << 15
DEFAULT_MAX_PARALLELISM = 128

#: Identity of the key hash and key-group assignment defined in this module's docstring.
KEY_HASH_VERSION = "snapflow-fmix64-poly1b3-v1"

MASK64 = (1 << 64) - 1
_P = 0x100000001B3  # the 64-bit FNV prime (odd, so invertible mod 2**64)
_P_INV = pow(_P, -1, 1 << 64)
_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB93FE53EC4CE
_INT64_MIN = -(1 << 63)


# ---------------------------------------------------------------------------------------------
# Ranges and assignment
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """The inclusive range ``[start, end]`` of key groups; empty when ``end < start``."""

    start: int
    end: int

    @classmethod
    def empty(cls) -> KeyGroupRange:
        return cls(0, -1)

    def __len__(self) -> int:
        return max(0, self.end - self.start + 1)

    @property
    def number_of_key_groups(self) -> int:
        return len(self)

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.start <= key_group <= self.end

    def __iter__(self) -> Any:
        return iter(range(self.start, self.end + 1))

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else KeyGroupRange.empty()

    def overlaps(self, other: KeyGroupRange) -> bool:
        return len(self.intersection(other)) > 0

    def __str__(self) -> str:
        return f"[{self.start}..{self.end}]"


def check_max_parallelism(max_parallelism: int) -> None:
    if (
        not isinstance(max_parallelism, int)
        or isinstance(max_parallelism, bool)
        or not 1 <= max_parallelism <= UPPER_BOUND_MAX_PARALLELISM
    ):
        raise InvalidArgumentError(
            f"max parallelism must be an integer in [1, {UPPER_BOUND_MAX_PARALLELISM}], "
            f"got {max_parallelism!r}"
        )


def _check_parallelism(max_parallelism: int, parallelism: int) -> None:
    check_max_parallelism(max_parallelism)
    if (
        not isinstance(parallelism, int)
        or isinstance(parallelism, bool)
        or not 1 <= parallelism <= max_parallelism
    ):
        raise InvalidArgumentError(
            f"parallelism must be an integer in [1, max parallelism {max_parallelism}], "
            f"got {parallelism!r}"
        )


def key_group_range_for_subtask(
    max_parallelism: int, parallelism: int, index: int
) -> KeyGroupRange:
    """The key groups subtask ``index`` owns (Flink's ``computeKeyGroupRangeForOperatorIndex``)."""
    _check_parallelism(max_parallelism, parallelism)
    if not isinstance(index, int) or not 0 <= index < parallelism:
        raise InvalidArgumentError(f"subtask index must be in [0, {parallelism}), got {index!r}")
    start = (index * max_parallelism + parallelism - 1) // parallelism
    end = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask that owns ``key_group`` (Flink's ``computeOperatorIndexForKeyGroup``)."""
    _check_parallelism(max_parallelism, parallelism)
    if not isinstance(key_group, int) or not 0 <= key_group < max_parallelism:
        raise InvalidArgumentError(
            f"key group must be in [0, {max_parallelism}), got {key_group!r}"
        )
    return key_group * parallelism // max_parallelism


# ---------------------------------------------------------------------------------------------
# Scalar hash
# ---------------------------------------------------------------------------------------------


def fmix64(h: int) -> int:
    """MurmurHash3's 64-bit finalizer: a bijection on 64-bit values that mixes every bit."""
    h &= MASK64
    h ^= h >> 33
    h = (h * _C1) & MASK64
    h ^= h >> 33
    h = (h * _C2) & MASK64
    return h ^ (h >> 33)


def bytes_hash(data: bytes | bytearray | memoryview) -> int:
    """The 64-bit polynomial hash of a byte string (see the module docstring)."""
    h = 0
    for b in bytes(data):
        h = ((h + b + 1) * _P) & MASK64
    return h


@functools.lru_cache(maxsize=1 << 16)
def _str_hash(key: str) -> int:
    return bytes_hash(key.encode("utf-8"))


def key_hash(key: object) -> int:
    """The stable 64-bit hash code of ``key`` (the module docstring defines it per type)."""
    if isinstance(key, str):
        return _str_hash(key)
    if isinstance(key, int):  # includes bool
        k = int(key)
        if _INT64_MIN <= k <= MASK64:
            return k & MASK64
        n = (k.bit_length() + 8) // 8
        return bytes_hash(k.to_bytes(n, "little", signed=True))
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes_hash(key)
    if isinstance(key, float):
        if key.is_integer() and _INT64_MIN <= key <= MASK64:
            return int(key) & MASK64
        return struct.unpack("<Q", struct.pack("<d", key))[0]
    if isinstance(key, tuple):
        h = 1
        for element in key:
            h = (h * _P + key_hash(element)) & MASK64
        return h
    if key is None:
        raise InvalidArgumentError("null keys are not supported (a key must not be None)")
    raise InvalidArgumentError(
        f"unsupported key type {type(key).__name__}: keys must be int, str, bytes, float, bool "
        "or tuples of these"
    )


def key_group_for_hash(h: int, max_parallelism: int) -> int:
    """The key group of hash code ``h``: ``fmix64(h) % max_parallelism`` (Flink's
    ``computeKeyGroupForKeyHash``, with fmix64 for ``murmurHash``)."""
    return fmix64(h) % max_parallelism


def key_group_for_key(key: object, max_parallelism: int) -> int:
    """The key group of ``key`` (Flink's ``assignToKeyGroup``)."""
    # Inlined fast paths for the common key types: this runs once per record.
    if type(key) is int and _INT64_MIN <= key <= MASK64:
        h = key & MASK64
    elif type(key) is str:
        h = _str_hash(key)
    else:
        h = key_hash(key)
    h ^= h >> 33
    h = (h * _C1) & MASK64
    h ^= h >> 33
    h = (h * _C2) & MASK64
    return (h ^ (h >> 33)) % max_parallelism


def subtask_for_key(key: object, max_parallelism: int, parallelism: int) -> int:
    """The subtask that owns ``key`` (Flink's ``assignKeyToParallelOperator``)."""
    return operator_index_for_key_group(
        max_parallelism, parallelism, key_group_for_key(key, max_parallelism)
    )


# ---------------------------------------------------------------------------------------------
# Vectorised hash (Arrow compute kernels)
# ---------------------------------------------------------------------------------------------

_U64 = pa.uint64()
_S33 = pa.scalar(33, _U64)
_SC1 = pa.scalar(_C1, _U64)
_SC2 = pa.scalar(_C2, _U64)
_ONE = pa.scalar(1, _U64)

# Bytes of a string array hashed per kernel pass: bounds the power tables below (2 x 8 MiB).
# Longer arrays are hashed in row slices, longer single rows in pieces.
_STRING_SLICE_BYTES = (1 << 20) - 1


class _PowerTables:
    """``P**i`` and ``P**-i`` (mod 2**64) for ``i < len``, grown on demand, shared by threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.powers = pa.array([1], _U64)
        self.inverse_powers = pa.array([1], _U64)

    def get(self, n: int) -> tuple[pa.UInt64Array, pa.UInt64Array]:
        powers, inverse = self.powers, self.inverse_powers
        if len(powers) >= n:
            return powers, inverse
        with self._lock:
            powers, inverse = self.powers, self.inverse_powers
            while len(powers) < n:
                size = len(powers)
                powers = pa.concat_arrays(
                    [powers, pc.multiply(powers, pa.scalar(pow(_P, size, 1 << 64), _U64))]
                )
                inverse = pa.concat_arrays(
                    [inverse, pc.multiply(inverse, pa.scalar(pow(_P_INV, size, 1 << 64), _U64))]
                )
            self.powers, self.inverse_powers = powers, inverse
            return powers, inverse


_TABLES = _PowerTables()


def fmix64_array(h: pa.Array) -> pa.Array:
    """Vectorised :func:`fmix64` over a uint64 array (Arrow kernels, wrapping multiply)."""
    h = pc.bit_wise_xor(h, pc.shift_right(h, _S33))
    h = pc.multiply(h, _SC1)
    h = pc.bit_wise_xor(h, pc.shift_right(h, _S33))
    h = pc.multiply(h, _SC2)
    return pc.bit_wise_xor(h, pc.shift_right(h, _S33))


def _u64_view(arr: pa.Array) -> pa.Array:
    """The raw 64 bits of an int64/uint64 array as uint64 (zero copy)."""
    return pa.Array.from_buffers(_U64, len(arr), [None, arr.buffers()[1]], offset=arr.offset)


def _binary_hashes(arr: pa.Array) -> pa.Array:
    """Polynomial hashes of a (large_)string/(large_)binary array without nulls.

    With ``w_i = (b_i + 1) * P**-i`` over the array's data bytes and ``S`` its exclusive prefix
    sum, the row spanning bytes ``[a, e)`` hashes to ``P**e * (S[e] - S[a])`` = the Horner
    polynomial of the module docstring (positions relative to the first row; mod 2**64).
    """
    n = len(arr)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    offsets = pa.Array.from_buffers(
        pa.int64() if large else pa.int32(), n + 1, [None, bufs[1]], offset=arr.offset
    )
    base = offsets[0].as_py()
    total = offsets[n].as_py() - base
    if total == 0:  # only empty strings: the empty polynomial
        return pa.nulls(n, _U64).fill_null(0)
    if total > _STRING_SLICE_BYTES:
        if n == 1:
            return pa.array([_long_row_hash(bufs[2], base, total)], _U64)
        rows = max(1, n * _STRING_SLICE_BYTES // total)
        return pa.concat_arrays([_binary_hashes(arr.slice(i, rows)) for i in range(0, n, rows)])
    powers, inverse = _TABLES.get(total + 1)
    data = pa.Array.from_buffers(pa.uint8(), total, [None, bufs[2]], offset=base)
    weighted = pc.multiply(pc.add(pc.cast(data, _U64), _ONE), inverse.slice(0, total))
    prefix = pa.concat_arrays([pa.array([0], _U64), pc.cumulative_sum(weighted)])
    rel = pc.subtract(pc.cast(offsets, pa.int64()), pa.scalar(base, pa.int64()))
    starts, ends = rel.slice(0, n), rel.slice(1, n)
    diff = pc.subtract(pc.take(prefix, ends), pc.take(prefix, starts))
    return pc.multiply(diff, pc.take(powers, ends))


def _long_row_hash(data: pa.Buffer, base: int, total: int) -> int:
    """The hash of one row longer than a pass: its pieces hashed together, then combined with
    the Horner identity ``H(a + b) = H(a) * P**len(b) + H(b)``."""
    size = _STRING_SLICE_BYTES
    bounds = [*range(base, base + total, size), base + total]
    pieces = pa.Array.from_buffers(
        pa.large_binary(), len(bounds) - 1, [None, pa.array(bounds, pa.int64()).buffers()[1], data]
    )
    h = 0
    for piece_hash, begin, end in zip(
        _binary_hashes(pieces).to_pylist(), bounds, bounds[1:], strict=False
    ):
        h = (h * pow(_P, end - begin, 1 << 64) + piece_hash) & MASK64
    return h


def _array_hashes(arr: pa.Array) -> pa.Array:
    if arr.null_count:
        raise InvalidArgumentError(
            f"null keys are not supported ({arr.null_count} of {len(arr)} keys are null)"
        )
    t = arr.type
    if len(arr) == 0:
        return pa.array([], _U64)
    if pa.types.is_int64(t) or pa.types.is_uint64(t):
        return _u64_view(arr)
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return _u64_view(pc.cast(arr, pa.int64()))
    if (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    ):
        return _binary_hashes(arr)
    if pa.types.is_string_view(t):
        return _binary_hashes(pc.cast(arr, pa.large_string()))
    if pa.types.is_binary_view(t):
        return _binary_hashes(pc.cast(arr, pa.large_binary()))
    if pa.types.is_dictionary(t):
        return pc.take(_array_hashes(arr.dictionary), arr.indices)
    # No kernel for this type: the scalar hash per element (always agrees, slower).
    return pa.array([key_hash(k) for k in arr.to_pylist()], _U64)


def key_hashes(keys: Any) -> pa.UInt64Array:
    """Vectorised :func:`key_hash`: the 64-bit hash codes of ``keys`` as a uint64 array."""
    if isinstance(keys, pa.ChunkedArray):
        if keys.num_chunks == 0:
            return pa.array([], _U64)
        return pa.concat_arrays([_array_hashes(c) for c in keys.chunks])
    if isinstance(keys, pa.Array):
        return _array_hashes(keys)
    values = keys if hasattr(keys, "__len__") else list(keys)
    try:
        arr = pa.array(values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        arr = None
    if arr is not None and (_has_kernel(arr.type) or not isinstance(values, list | tuple)):
        return _array_hashes(arr)
    # Mixed, composite or float keys: the scalar hash of the original objects.
    return pa.array([key_hash(k) for k in values], _U64)


def _has_kernel(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


def key_groups_for_hashes(hashes: pa.Array, max_parallelism: int) -> pa.Int32Array:
    """Vectorised :func:`key_group_for_hash` over a uint64 array of hash codes."""
    check_max_parallelism(max_parallelism)
    mixed = fmix64_array(hashes)
    if max_parallelism & (max_parallelism - 1) == 0:
        groups = pc.bit_wise_and(mixed, pa.scalar(max_parallelism - 1, _U64))
    else:
        m = pa.scalar(max_parallelism, _U64)
        groups = pc.subtract(mixed, pc.multiply(pc.divide(mixed, m), m))
    return pc.cast(groups, pa.int32())


def key_groups(keys: Any, max_parallelism: int) -> pa.Int32Array:
    """Vectorised :func:`key_group_for_key`: the key group of every key, as an int32 array.

    ``keys``: a pyarrow Array/ChunkedArray (int*, uint*, bool, (large_)string, (large_)binary,
    string/binary views, dictionary of these; other types use the scalar hash per element), or a
    list / numpy array (converted with ``pyarrow.array``). Null keys are refused.
    """
    return key_groups_for_hashes(key_hashes(keys), max_parallelism)
