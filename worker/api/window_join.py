"""Window join and co-group of two inputs keyed alike (Flink's
``a.join(b).where(k0).equalTo(k1).window(assigner).apply(fn)`` and ``coGroup``).

Both are the keyed window operator over two inputs: each input's rows of a window are kept
(``ListState`` of Arrow batches under ``(key, window)``, one state per input), windows are
shared by the inputs (sessions merge across both, as in Flink, where the two inputs are one
tagged union), and the watermark (the minimum of both inputs') fires them. A co-group calls its
function once per window either input reached; a join pairs every row of input 0 with every
row of input 1 of the window (Flink's nested loop), so a window with rows of one input only
emits nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from snapflow.worker.api.window_assigners import WindowAssigner
from snapflow.worker.api.window_contents import RowsContents
from snapflow.worker.api.window_emitters import CoGroupWindow, JoinWindow
from snapflow.worker.api.window_functions import CoGroupFunction, JoinFunction
from snapflow.worker.api.window_operator import WindowOperator
from snapflow.worker.runtime.operator import OutputTag

__all__ = ["window_co_group", "window_join"]


def window_join(
    key_fields: tuple[str, str],
    time_fields: tuple[str | None, str | None],
    assigner: WindowAssigner,
    function: JoinFunction | Callable[[dict[str, Any], dict[str, Any]], Any] | None = None,
    *,
    output_schema: pa.Schema | None = None,
    prefixes: tuple[str, str] = ("left_", "right_"),
    allowed_lateness_ms: int = 0,
    late_data_tag: OutputTag | None = None,
    clock: Callable[[], int] | None = None,
) -> WindowOperator:
    """The window join operator: ``function(first_row, second_row)`` per pair, or (None) the
    pairs' columns side by side, a name both inputs have prefixed with its input's prefix."""
    return WindowOperator(
        key_fields,
        time_fields,
        assigner,
        (RowsContents(), RowsContents()),
        JoinWindow(function, output_schema, prefixes),
        allowed_lateness_ms=allowed_lateness_ms,
        late_data_tag=late_data_tag,
        clock=clock,
    )


def window_co_group(
    key_fields: tuple[str, str],
    time_fields: tuple[str | None, str | None],
    assigner: WindowAssigner,
    function: CoGroupFunction | Callable[..., Any],
    *,
    output_schema: pa.Schema | None = None,
    allowed_lateness_ms: int = 0,
    late_data_tag: OutputTag | None = None,
    clock: Callable[[], int] | None = None,
) -> WindowOperator:
    """The window co-group operator: ``function(first, second, ctx)`` per window."""
    return WindowOperator(
        key_fields,
        time_fields,
        assigner,
        (RowsContents(), RowsContents()),
        CoGroupWindow(function, output_schema),
        allowed_lateness_ms=allowed_lateness_ms,
        late_data_tag=late_data_tag,
        clock=clock,
    )
