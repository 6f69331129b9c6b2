"""Every bound on what a client may send, and on what an error message may echo back.

One place for the numbers (docs/coordinator.md, "Limits"): the request validation
(``coordinator/convert.py``, ``coordinator/service.py``) checks fields against them, and the
status mapping (``coordinator/grpc_errors.py``) bounds every error message with them.

Why messages are bounded in bytes: a status message travels as the ``grpc-message`` header,
percent-encoded (up to 3 bytes per byte), and a client refuses headers beyond its
``grpc.max_metadata_size`` (8 KiB by default). An unbounded message that echoes a 64 KiB
field breaks that header: the client never sees the status, waits until its deadline, and the
connection's other calls fail with it. 1 KiB stays far below the limit for any text.
"""

from __future__ import annotations

from snapflow.errors import InvalidArgumentError

MAX_ERROR_MESSAGE_BYTES = 1024
"""A status message (and an ``AckOutcome.error_message``), UTF-8 bytes; longer ones are cut."""
MAX_LOGGED_VALUE_CHARS = 4096
"""The full text of a cut error message goes to the log, itself cut to this many characters."""
ECHO_CHARS = 80
"""Characters of a rejected value that a message quotes."""

MAX_ID_CHARS = 200
"""Vertex and operator ids: ``A-Z a-z 0-9 _ . : -``."""
MAX_NAME_CHARS = 256
"""Job, vertex and operator names, operator and state handle kinds, key fields (a Kubernetes
object name is at most 253 characters; Flink shortens operator names in metrics to 80)."""
MAX_VERTEX_NAME_CHARS = 4096
"""A vertex name: the Spark bridge names a vertex after its chained operators, joined."""
MAX_OPERATORS_PER_VERTEX = 1000
"""Operators chained in one vertex."""
MAX_VERTICES = 1000
MAX_EDGES = 10_000
MAX_INPUTS_PER_VERTEX = 64
"""Logical inputs of one vertex (``JobEdge.target_input``): connect and joins use 2, a
multiple-input operator a few more."""
MAX_PARALLELISM = 32_768
"""Flink's upper bound of max parallelism (key groups)."""

MAX_PATH_BYTES = 4096
"""A local path or ``file://`` URI (Linux ``PATH_MAX``)."""
MAX_PATH_SEGMENT_BYTES = 255
"""One segment of a local path (``NAME_MAX`` of ext4, XFS and most file systems)."""
MAX_OBJECT_KEY_BYTES = 1024
"""The key part of an ``s3://bucket/key`` location (S3's limit for object keys)."""
MAX_ADDRESS_CHARS = 260
"""``host:port`` of an agent (a DNS name is at most 253 characters)."""
MAX_FAILURE_CHARS = 16 * 1024
"""A task failure or decline message is kept (stored, shown, logged) cut to this length: a
failure is always accepted, a huge traceback is not kept whole."""

MIN_INTERVAL_MS = 10
"""Flink's minimum checkpoint interval and timeout (``snapflow.checkpoint_config``)."""
MAX_DURATION_MS = 2**31 - 1
"""Checkpoint interval, timeout, minimum pause and aligned timeout (about 24.8 days: the int32
range of Kubernetes' duration fields and of JavaScript timers; a longer interval is periodic
checkpointing off in practice, which is interval 0)."""
MAX_CONCURRENT_CHECKPOINTS = 1000
MAX_RETAINED_CHECKPOINTS = 1000
"""Each retained checkpoint is a Redis record and a directory kept on storage."""
DEFAULT_INLINE_STATE_THRESHOLD_BYTES = 20 * 1024
MAX_INLINE_STATE_THRESHOLD_BYTES = 1 << 20
"""A subtask's snapshot up to the threshold goes inline (its bytes in the acknowledgement, the
Redis record and ``_metadata``): Flink's ``state.storage.fs.memory-threshold``, whose default
is 20 KB and whose maximum is 1 MB, so that the records of a wide job stay small."""

# The rocksdb state backend's sizing in a job's checkpoint config
# (snapflow.state_backend_options): wide enough for any real machine, narrow enough that a typo
# cannot ask for an absurd instance.
MIN_STATE_MEMORY_BUDGET_BYTES = 1 << 20
MAX_STATE_MEMORY_BUDGET_BYTES = 1 << 40
"""One instance's memtables and block cache: 1 MiB to 1 TiB."""
MAX_STATE_CACHE_ENTRIES = 100_000_000
"""Decoded values one instance caches (each a Python object on the worker's heap)."""
MAX_COMPACTION_TRIGGER = 1000
"""Sorted runs before a compaction (at least 2)."""
MAX_SIZE_AMPLIFICATION_PERCENT = 100_000
"""Universal compaction's space bound (at least 1)."""
MAX_UPLOAD_THREADS = 64
"""SST files one subtask uploads at once (at least 1)."""


def cut(text: str, limit_bytes: int = MAX_ERROR_MESSAGE_BYTES) -> str:
    """``text`` cut to ``limit_bytes`` UTF-8 bytes (at a character boundary), with a note of
    how much was left out; unchanged when it fits."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit_bytes:
        return text
    note = f"... ({len(data)} bytes, cut)"
    kept = data[: max(0, limit_bytes - len(note))].decode("utf-8", "ignore")
    return kept + note


def cut_chars(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with a note; unchanged when it fits."""
    if len(text) <= limit:
        return text
    note = f"... ({len(text)} characters, cut)"
    return text[: max(0, limit - len(note))] + note


def echo(value: str) -> str:
    """A value quoted in an error message: its repr, at most :data:`ECHO_CHARS` characters of it."""
    if len(value) <= ECHO_CHARS:
        return repr(value)
    return f"{value[:ECHO_CHARS]!r}... ({len(value)} characters)"


def check_length(value: str, limit: int, field: str) -> str:
    """``value`` if it has at most ``limit`` characters, else INVALID_ARGUMENT naming the field."""
    if len(value) > limit:
        raise InvalidArgumentError(
            f"{field} has {len(value)} characters; at most {limit} are allowed"
        )
    return value


def check_location(value: str, field: str) -> str:
    """A path, ``file://`` URI or ``s3://bucket/key`` within the size limits, else
    INVALID_ARGUMENT: a location too long for any file system or object store would fail
    later as an I/O error that looks worth retrying."""
    size = len(value.encode("utf-8", "replace"))
    if value.startswith("s3://"):
        _, _, key = value[len("s3://") :].partition("/")
        key_bytes = len(key.encode("utf-8", "replace"))
        if key_bytes > MAX_OBJECT_KEY_BYTES:
            raise InvalidArgumentError(
                f"{field} has an object key of {key_bytes} bytes; S3 allows at most "
                f"{MAX_OBJECT_KEY_BYTES}"
            )
        if size > MAX_PATH_BYTES:
            raise InvalidArgumentError(
                f"{field} is {size} bytes long; at most {MAX_PATH_BYTES} are allowed"
            )
        return value
    if size > MAX_PATH_BYTES:
        raise InvalidArgumentError(
            f"{field} is {size} bytes long; a path has at most {MAX_PATH_BYTES} (PATH_MAX)"
        )
    for segment in value.split("/"):
        segment_bytes = len(segment.encode("utf-8", "replace"))
        if segment_bytes > MAX_PATH_SEGMENT_BYTES:
            raise InvalidArgumentError(
                f"{field} has a path segment of {segment_bytes} bytes ({echo(segment)}); a "
                f"file name has at most {MAX_PATH_SEGMENT_BYTES} (NAME_MAX)"
            )
    return value


def check_duration_ms(value: int, field: str) -> int:
    if value > MAX_DURATION_MS:
        raise InvalidArgumentError(
            f"{field} {value} is above the maximum of {MAX_DURATION_MS} ms (about 24.8 days)"
        )
    return value
