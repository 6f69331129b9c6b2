"""What a ``read_committed`` reader of a real Kafka broker gets, read from the log itself.

Tansu 0.6 shows the records of aborted transactions to ``read_committed`` readers (it returns
no aborted-transaction list in its fetch answers), so a test reading through librdkafka cannot
tell an aborted copy from a duplicate. It does write the transaction markers (control records)
into the log, as Kafka does. This reader fetches the raw record batches (Fetch v4,
``read_uncommitted``) and resolves every transactional batch by its producer's next marker, as
a broker's last-stable-offset and aborted-transaction index do: records of a committed
transaction and non-transactional ones are kept, those of an aborted transaction, or of one
never ended (a transaction a restore's ``init_transactions`` dropped ends with no marker on
Tansu; a later batch of the producer with a newer epoch ends it too), are not.

Uncompressed record batches (magic 2) only: what librdkafka writes by default.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from typing import NamedTuple

_FETCH, _VERSION = 1, 4
_TRANSACTIONAL, _CONTROL, _COMPRESSION = 0x10, 0x20, 0x07
_COMMIT = 1
_EMPTY_ANSWERS_BELOW_HIGH = 40  # about 2 s of retries before the answer counts as the end


class LogRecord(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class _Open:
    epoch: int
    records: list[LogRecord] = field(default_factory=list)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def raw(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def string(self) -> str:
        return self.raw(self.take(">h")).decode()

    def varint(self) -> int:
        shift = result = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)  # zigzag
            shift += 7

    def nullable(self) -> bytes | None:
        n = self.varint()
        return None if n < 0 else self.raw(n)


def _fetch(sock: socket.socket, topic: str, partition: int, offset: int, correlation: int) -> bytes:
    client = b"snapflow-tests"
    body = struct.pack(">hhih", _FETCH, _VERSION, correlation, len(client)) + client
    body += struct.pack(">iiiib", -1, 100, 1, 8 << 20, 0)  # read_uncommitted: the whole log
    name = topic.encode()
    body += struct.pack(">ih", 1, len(name)) + name
    body += struct.pack(">iiqi", 1, partition, offset, 4 << 20)
    sock.sendall(struct.pack(">i", len(body)) + body)
    size = struct.unpack(">i", _recv(sock, 4))[0]
    return _recv(sock, size)


def _recv(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _batches(answer: bytes) -> tuple[int, bytes]:
    """The high watermark and the record bytes of a one-partition Fetch v4 answer."""
    r = _Reader(answer)
    r.take(">i")  # correlation id
    r.take(">i")  # throttle
    assert r.take(">i") == 1
    r.string()
    assert r.take(">i") == 1
    r.take(">i")  # partition
    error = r.take(">h")
    if error:
        raise RuntimeError(f"fetch failed with Kafka error code {error}")
    high = r.take(">q")
    r.take(">q")  # last stable offset
    aborted = r.take(">i")
    r.raw(max(aborted, 0) * 16)
    size = r.take(">i")
    return high, b"" if size < 0 else r.raw(size)


def committed_records(bootstrap_servers: str, topic: str, partitions: int) -> list[LogRecord]:
    """The records of ``topic`` a ``read_committed`` reader of a Kafka broker gets, per
    partition in offset order (see the module docstring)."""
    host, port = bootstrap_servers.split(",")[0].rsplit(":", 1)
    out: list[LogRecord] = []
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for partition in range(partitions):
            out.extend(_partition(sock, topic, partition))
    return out


def _partition(sock: socket.socket, topic: str, partition: int) -> list[LogRecord]:
    visible: list[LogRecord] = []
    open_txns: dict[int, _Open] = {}
    offset, correlation, empty = 0, 0, 0
    while True:
        correlation += 1
        high, data = _batches(_fetch(sock, topic, partition, offset, correlation))
        r = _Reader(data)
        progressed = False
        while len(data) - r.at >= 12:
            base = r.take(">q")
            length = r.take(">i")
            if len(data) - r.at < length:
                break  # a partial batch at the end of the answer: fetched again next
            end = r.at + length
            r.take(">i")  # partition leader epoch
            magic = r.take(">b")
            assert magic == 2, f"record batch magic {magic}"
            r.take(">I")  # crc
            attributes = r.take(">h")
            assert not attributes & _COMPRESSION, "compressed batches are not read here"
            last_delta = r.take(">i")
            r.raw(16)  # first and max timestamps
            pid = r.take(">q")
            epoch = r.take(">h")
            r.take(">i")  # base sequence
            records = []
            for _ in range(r.take(">i")):
                r.varint()  # length
                r.take(">b")  # attributes
                r.varint()  # timestamp delta
                delta = r.varint()
                key = r.nullable()
                value = r.nullable()
                for _ in range(r.varint()):  # headers
                    r.nullable()
                    r.nullable()
                records.append(LogRecord(partition, base + delta, key, value))
            r.at = end
            offset, progressed = base + last_delta + 1, True
            if attributes & _CONTROL:
                ended = open_txns.pop(pid, None)
                marker = records[0].key or b""
                if ended is not None and struct.unpack_from(">h", marker, 2)[0] == _COMMIT:
                    visible.extend(ended.records)
            elif attributes & _TRANSACTIONAL:
                current = open_txns.get(pid)
                if current is None or current.epoch != epoch:  # a newer epoch ends the old one
                    current = open_txns[pid] = _Open(epoch)
                current.records.extend(records)
            else:
                visible.extend(records)
        # Tansu's high watermark is not exact (the last batch's first offset + 1), so read
        # until nothing comes; an empty answer below it is retried (bounded), not the end.
        if not progressed:
            empty += 1
            if offset >= high or empty > _EMPTY_ANSWERS_BELOW_HIGH:
                break
            time.sleep(0.05)
        else:
            empty = 0
    return sorted(visible, key=lambda rec: rec.offset)
