"""How the CLI prints: enum names, times, sizes, tables that fit the terminal and JSON.

Tables fit the terminal (80 columns and up): ids, states and numbers are never cut or wrapped,
paths, names and failures wrap, and the least important columns are left out when they do not
fit (``--json`` has everything). ``--json`` prints the raw response with int64 fields as JSON
numbers, not the strings of the proto3 JSON mapping.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from snapflow import wire
from snapflow.checkpointing import CheckpointStatus
from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb

# Width of tables when stdout is not a terminal (and COLUMNS is not set): wide enough that a
# 32-character job id and a checkpoint path are never wrapped, so the output stays greppable.
PIPE_WIDTH = 200


def stdout_console() -> Console:
    """A console on the current ``sys.stdout`` (looked up per call, so redirection works)."""
    stdout = sys.stdout
    tty = bool(getattr(stdout, "isatty", lambda: False)())
    width = None if tty or "COLUMNS" in os.environ else PIPE_WIDTH
    # No markup or emoji codes: job names, paths and failure messages are printed verbatim.
    return Console(
        file=stdout, width=width, highlight=False, markup=False, emoji=False, soft_wrap=False
    )


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """``JOB_STATE_RUNNING`` -> ``RUNNING``; an unknown number prints as itself."""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return str(value)
    return name.removeprefix(prefix)


def job_state(value: int) -> str:
    return enum_name(pb.JobState, value, "JOB_STATE_")


def task_state(value: int) -> str:
    return enum_name(pb.TaskState, value, "TASK_STATE_")


def checkpoint_kind(value: int) -> str:
    return enum_name(pb.CheckpointKind, value, "CHECKPOINT_KIND_")


def checkpoint_status(value: int) -> str:
    return enum_name(pb.CheckpointStatus, value, "CHECKPOINT_STATUS_")


def checkpoint_mode(value: int) -> str:
    return enum_name(pb.CheckpointMode, value, "CHECKPOINT_MODE_")


def format_time(timestamp_ms: int) -> str:
    """Epoch milliseconds as ISO local time with the UTC offset; ``-`` for 0 (not set)."""
    if timestamp_ms <= 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000).astimezone()
    return moment.isoformat(timespec="milliseconds")


def format_bytes(size: float) -> str:
    """``1536`` -> ``1.5 KiB``; whole bytes below 1 KiB."""
    value = float(size)
    if abs(value) < 1024:
        return f"{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def format_ms(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def format_attempt(attempt: pb.TaskAttempt) -> str:
    return f"{attempt.vertex_id}#{attempt.subtask_index}@{attempt.attempt}"


_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _int64_as_numbers(message: Message, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (``MessageToDict`` of ``message``) with every 64-bit integer field as a JSON
    number. The proto3 JSON mapping writes them as strings (JavaScript's numbers lose
    precision above 2**53); Python's ``json`` and ``jq`` read big integers exactly, and ids,
    sizes and timestamps are numbers to a script."""
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value, nested = data[field.name], getattr(message, field.name)
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            for key in value:
                if value_field.message_type is not None:
                    _int64_as_numbers(nested[_map_key(entry, key)], value[key])
                elif value_field.type in _INT64_TYPES:
                    value[key] = int(value[key])
        elif entry is not None:
            if field.is_repeated:
                for item, item_data in zip(nested, value, strict=True):
                    _int64_as_numbers(item, item_data)
            else:
                _int64_as_numbers(nested, value)
        elif field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if field.is_repeated else int(value)
    return data


def _map_key(entry: Any, key: str) -> Any:
    """A JSON map key (always a string) as the map's key type."""
    key_type = entry.fields_by_name["key"].type
    if key_type == FieldDescriptor.TYPE_STRING:
        return key
    if key_type == FieldDescriptor.TYPE_BOOL:
        return key == "true"
    return int(key)


def to_dict(message: Message) -> dict[str, Any]:
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _int64_as_numbers(message, data)


def _to_json(message: Message) -> str:
    return json.dumps(to_dict(message), indent=2)


def print_json(message: Message) -> None:
    print(_to_json(message))


# --- tables that fit -------------------------------------------------------------------------


class Column:
    """A table column. ``keep``: 0 for columns never left out (ids, states, paths); larger
    numbers are left out first when the table does not fit. ``wrap``: the content may wrap
    (names, paths, failures; folded at the width, never cut) in a column at least ``wrap``
    wide (less when the content is shorter); ``wrap=0``: never wrapped or cut (ids, states,
    numbers, times)."""

    def __init__(self, header: str, keep: int = 0, *, wrap: int = 0, justify: str = "left") -> None:
        self.header = header
        self.keep = keep
        self.wrap = wrap
        self.justify = justify


NAME_WIDTH = 12  # the narrowest a wrapped name gets before columns are left out
PATH_WIDTH = 34  # the narrowest a wrapped path gets: a checkpoint path in two or three lines


def fitted_table(
    console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]], **options: Any
) -> Table:
    """A table of ``rows`` that fits ``console.width``: columns are left out, highest ``keep``
    first, until the widths it needs (full width for unwrapped columns, their ``wrap`` width
    for wrapping ones, plus borders and padding) fit."""
    shown = list(range(len(columns)))

    def needed(index: int) -> int:
        column = columns[index]
        widest = max([cell_len(column.header), *(cell_len(r[index]) for r in rows)])
        return min(widest, column.wrap) if column.wrap else widest

    while True:
        # Default box: one border per column plus one, one space of padding on each side.
        width = sum(needed(i) + 3 for i in shown) + 1
        droppable = [i for i in shown if columns[i].keep > 0]
        if width <= console.width or not droppable:
            break
        shown.remove(max(droppable, key=lambda i: (columns[i].keep, i)))
    table = Table(**options)
    for i in shown:
        column = columns[i]
        table.add_column(
            column.header,
            no_wrap=not column.wrap,
            overflow="fold",
            justify=column.justify,  # type: ignore[arg-type]
            min_width=None if column.wrap else needed(i),
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def key_values(title: str | None, rows: Sequence[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, box=None, title_justify="left", pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


def summary_line(s: cpb.CheckpointSummary) -> str:
    """One line about a checkpoint: id, kind, status, time, duration, size and path or reason."""
    parts = [
        f"#{s.checkpoint_id} {checkpoint_kind(s.kind)} {status_text(s)}",
        f"triggered {format_time(s.trigger_timestamp_ms)}",
    ]
    if summary_status(s) is not CheckpointStatus.IN_PROGRESS:
        parts.append(f"{format_ms(s.end_to_end_duration_ms)} ms")
    parts.append(size_text(s))
    parts.append(f"{s.num_acknowledged}/{s.num_tasks} acked")
    if summary_status(s) is CheckpointStatus.FAILED:
        parts.append(failure_text(s))
    elif s.external_path:
        parts.append(s.external_path)
    return ", ".join(parts)


def summary_status(s: cpb.CheckpointSummary) -> CheckpointStatus | None:
    """The summary's status; None for a number this version does not know."""
    return wire.CHECKPOINT_STATUS.from_pb_or(s.status, None)


def size_text(s: cpb.CheckpointSummary) -> str:
    """The state size; with what this checkpoint wrote when it reused shared files (an
    incremental checkpoint)."""
    size = format_bytes(s.state_size_bytes)
    if s.shared_size_bytes:
        size += f" ({format_bytes(s.incremental_size_bytes)} new)"
    return size


def status_text(s: cpb.CheckpointSummary) -> str:
    """The status; a completed checkpoint whose files are gone (retention, disposal) shows as
    DISCARDED, as Flink's history marks it."""
    if summary_status(s) is CheckpointStatus.COMPLETED and s.discarded:
        return "DISCARDED"
    return checkpoint_status(s.status)


def failure_text(s: cpb.CheckpointSummary) -> str:
    if s.failure_reason and s.failure_message:
        return f"{s.failure_reason}: {s.failure_message}"
    return s.failure_reason or s.failure_message or "-"
