"""How the disk backend lays its entries out in RocksDB: the key and value encoding, and the
key-group ranges that layout makes contiguous (scanned, and exported to an SST file).

Every entry's key starts with its key group, big-endian, so a key-group range is one contiguous
key range (scanned, exported to an SST file and ingested on restore and rescale)::

    key group (u16 BE) | name length (u16 BE) | state name (UTF-8) | key
    map state:           ... | key length (u32 BE) | key | user key
    timers (TIMER_STATE): ... | timestamp (u64 BE, offset by 2**63) | key length (u32 BE) | key
                          | namespace

Keys are encoded by type (``s`` + UTF-8 for ``str``, ``i`` + 8 bytes for an int64, ``b`` +
bytes, ``p`` + pickle otherwise); values are pickles. A list is one value (the whole list), a
map one entry per user key. An event-time timer is one entry with an empty value under the
reserved state name :data:`TIMER_STATE`; its key sorts by timestamp within its key group.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import rocksdict

from snapflow.errors import StateError
from snapflow.worker.state import arrow_pickling
from snapflow.worker.state.errors import CorruptStateError
from snapflow.worker.state.keygroups import KeyGroupRange
from snapflow.worker.state.rocksdb_tuning import RocksDBTuning

__all__ = [
    "KG",
    "LEN32",
    "LIST_KINDS",
    "MAP_KINDS",
    "TIMER_STATE",
    "decode_key",
    "decode_timer",
    "encode_key",
    "encode_timer",
    "encode_value",
    "export_key_groups",
    "key_group_bounds",
    "parse_entry",
    "prefix_end",
    "scan_range",
    "split_map_key",
    "state_tag",
    "timers_after",
]

KG = struct.Struct(">H")
"""A key group, and a state name's length, in a database key."""
LEN32 = struct.Struct(">I")
"""A map state's key length, in a database key."""
_I64 = struct.Struct(">q")
MAP_KINDS = {"map", "ttl-map"}
"""State kinds stored as one entry per user key."""
LIST_KINDS = {"list", "ttl-list"}
"""State kinds stored as one value per key (the whole list), outside the value cache."""
TIMER_STATE = "\x00timers"
"""The reserved state name the event-time timers are stored under (no state may take it)."""
_U64 = struct.Struct(">Q")
_TIMER_HEAD = struct.Struct(">QI")
_TS_OFFSET = 1 << 63


def encode_key(key: Any) -> bytes:
    """A key (or a map's user key) as the database key holds it."""
    t = type(key)
    if t is str:
        return b"s" + key.encode()
    if t is int and -(1 << 63) <= key < (1 << 63):
        return b"i" + _I64.pack(key)
    if t is bytes:
        return b"b" + key
    return b"p" + pickle.dumps(key, protocol=5)


def decode_key(data: bytes) -> Any:
    """The key :func:`encode_key` encoded as ``data``."""
    tag = data[:1]
    if tag == b"s":
        return data[1:].decode()
    if tag == b"i":
        return _I64.unpack(data[1:])[0]
    if tag == b"b":
        return bytes(data[1:])
    if tag == b"p":
        return pickle.loads(data[1:])
    raise CorruptStateError(f"unknown key encoding {tag!r} in the disk state backend")


def encode_timer(timestamp: int, key: bytes, namespace: bytes) -> bytes:
    """A timer's part of its database key (after its key group and :data:`TIMER_STATE`'s tag),
    from its timestamp and its encoded key and namespace (:func:`encode_key`)."""
    return _TIMER_HEAD.pack(timestamp + _TS_OFFSET, len(key)) + key + namespace


def timers_after(watermark: int) -> bytes | None:
    """The smallest timer part (:func:`encode_timer`) of a timer later than ``watermark``:
    timers up to ``watermark`` are the keys of their key group below it (``None``: every
    timer is up to ``watermark``)."""
    if watermark >= (1 << 63) - 1:
        return None
    return _U64.pack(max(watermark + 1 + _TS_OFFSET, 0))


def decode_timer(data: bytes, offset: int, namespaces: dict[bytes, Any]) -> tuple[int, Any, Any]:
    """``(timestamp, key, namespace)`` of the timer :func:`encode_timer` encoded in ``data``
    from ``offset`` on. ``namespaces``: namespaces decoded so far by their encoding (a window's
    recurs for many keys: it is unpickled once, and its timers share one object)."""
    ts, length = _TIMER_HEAD.unpack_from(data, offset)
    start = offset + 12
    end = start + length
    if length == 9 and data[start] == 0x69:  # b"i": an int64 key, the common case
        key = _I64.unpack_from(data, start + 1)[0]
    else:
        key = decode_key(data[start:end])
    encoded = data[end:]
    namespace = namespaces.get(encoded, namespaces)
    if namespace is namespaces:
        namespace = namespaces[encoded] = decode_key(encoded)
    return ts - _TS_OFFSET, key, namespace


def encode_value(value: Any) -> bytes:
    """A value as the database holds it (a pickle; Arrow data at its own size)."""
    return arrow_pickling.dumps(value)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\xff" * (len(prefix) + 1)
    return stripped[:-1] + bytes([stripped[-1] + 1])


def state_tag(name: str) -> bytes:
    """A state's part of its keys: the name's length and the name."""
    raw = name.encode()
    if len(raw) > 0xFFFF:
        raise StateError(f"state name too long ({len(raw)} bytes, at most 65535)")
    return KG.pack(len(raw)) + raw


def parse_entry(key: bytes) -> tuple[int, bytes, bytes]:
    """``(key group, state name bytes, rest)`` of a database key."""
    (length,) = KG.unpack_from(key, 2)
    return KG.unpack_from(key)[0], key[4 : 4 + length], key[4 + length :]


def split_map_key(rest: bytes) -> tuple[bytes, bytes]:
    """``(key, user key)``, both encoded, of a map entry's key after its state tag."""
    (length,) = LEN32.unpack_from(rest)
    return rest[4 : 4 + length], rest[4 + length :]


def key_group_bounds(first: int, last: int) -> tuple[bytes, bytes]:
    """``(lower, upper)``: the database keys of key groups ``first`` to ``last`` are those with
    ``lower <= key < upper``."""
    return KG.pack(first), KG.pack(last + 1)  # key groups are < 2**15


def scan_range(source: Any, lower: bytes, upper: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The entries of ``source`` (a database or snapshot) with ``lower <= key < upper``."""
    opts = rocksdict.ReadOptions()
    opts.set_iterate_lower_bound(lower)
    opts.set_iterate_upper_bound(upper)
    # The bounds live in ``opts``: RocksDB keeps pointers to them, so ``opts`` must outlive the
    # iteration (this generator holds it); the key check guards against a binding that drops
    # the bound.
    for key, value in source.items(from_key=lower, read_opt=opts):
        if key >= upper:
            break
        yield key, value


def export_key_groups(
    source: Any, key_groups: KeyGroupRange, path: str, tuning: RocksDBTuning
) -> int:
    """Every entry of ``key_groups`` in ``source`` (a database) into a new SST file at
    ``path``, written with ``tuning``'s options; returns the count (no file when 0)."""
    if not len(key_groups):
        return 0
    lower, upper = key_group_bounds(key_groups.start, key_groups.end)
    writer: Any = None
    count = 0
    try:
        for key, value in scan_range(source, lower, upper):
            if writer is None:
                writer = rocksdict.SstFileWriter(options=tuning.options())
                writer.open(path)
            writer[key] = value
            count += 1
        if writer is not None:
            writer.finish()
    except BaseException:
        with suppress(OSError):
            os.unlink(path)
        raise
    return count
