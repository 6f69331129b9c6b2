"""Which operator runs a two-input function, chosen by how the inputs are connected; a
function of the wrong kind for the connection is refused when the pipeline is built, with an
error naming the function that fits and the connection the given function needs.

Connections (what ``Pipeline`` streams build) and their functions:

============================  =================================  ==========================
connection                    ``process``                        ``process_batches``
============================  =================================  ==========================
``a.connect(b)``              :class:`CoProcessFunction`         :class:`CoBatchFunction`
keyed both                    :class:`KeyedCoProcessFunction`    :class:`KeyedCoBatchFunction`
``a.connect(b.broadcast())``  :class:`BroadcastProcessFunction`  (none)
keyed, broadcast              :class:`KeyedBroadcastProcess...`  (none)
============================  =================================  ==========================
"""

from __future__ import annotations

import enum
from typing import Any

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.broadcast_functions import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
)
from snapflow.worker.api.broadcast_operators import BroadcastProcess, KeyedBroadcastProcess
from snapflow.worker.api.co_functions import (
    CoBatchFunction,
    CoProcessFunction,
    KeyedCoBatchFunction,
    KeyedCoProcessFunction,
)
from snapflow.worker.api.co_operators import (
    CoBatchProcess,
    CoProcess,
    KeyedCoBatchProcess,
    KeyedCoProcess,
)
from snapflow.worker.runtime.operator import Operator

__all__ = ["Connection", "two_input_operator"]


class Connection(enum.Enum):
    """How two inputs are connected; the value is how a pipeline builds it."""

    CONNECTED = "a.connect(b)"
    KEYED = "a.key_by(k1).connect(b.key_by(k2)) (or a.connect(b).key_by(k1, k2))"
    BROADCAST = "a.connect(b.broadcast())"
    KEYED_BROADCAST = "a.key_by(k).connect(b.broadcast())"


_RECORD: dict[Connection, type] = {
    Connection.CONNECTED: CoProcessFunction,
    Connection.KEYED: KeyedCoProcessFunction,
    Connection.BROADCAST: BroadcastProcessFunction,
    Connection.KEYED_BROADCAST: KeyedBroadcastProcessFunction,
}
_BATCH: dict[Connection, type] = {
    Connection.CONNECTED: CoBatchFunction,
    Connection.KEYED: KeyedCoBatchFunction,
}


def _refuse(function: Any, connection: Connection, vectorised: bool) -> InvalidArgumentError:
    method = "process_batches" if vectorised else "process"
    fits = (_BATCH if vectorised else _RECORD).get(connection)
    if fits is None:
        return InvalidArgumentError(
            f"{method}: streams connected as {connection.value} have no vectorised function; "
            f"use process() with a {_RECORD[connection].__name__}"
        )
    want = f"{method} on {connection.value} needs a {fits.__name__}"
    for table, its_method in ((_RECORD, "process"), (_BATCH, "process_batches")):
        for other, kind in table.items():
            if isinstance(function, kind):
                return InvalidArgumentError(
                    f"{want}, got a {kind.__name__}, which runs with {its_method}() on "
                    f"{other.value}: use a {fits.__name__}, or connect the streams that way"
                )
    return InvalidArgumentError(f"{want} (subclass it), got {function!r:.100}")


def two_input_operator(
    function: Any,
    connection: Connection,
    key_fields: tuple[str | None, str | None] = (None, None),
    *,
    vectorised: bool = False,
    output_schema: pa.Schema | None = None,
) -> Operator:
    """The operator that runs ``function`` on inputs connected as ``connection`` (keyed:
    ``key_fields`` of input 0 and input 1; a broadcast input has None). ``vectorised``: called
    from ``process_batches``."""
    fits = (_BATCH if vectorised else _RECORD).get(connection)
    if fits is None or not issubclass(type(function), fits):
        raise _refuse(function, connection, vectorised)
    first, second = key_fields
    if connection is Connection.CONNECTED:
        if vectorised:
            return CoBatchProcess(function)
        return CoProcess(function, output_schema)
    if connection is Connection.BROADCAST:
        return BroadcastProcess(function, output_schema)
    if first is None:
        raise InvalidArgumentError(f"{connection.value}: input 0 needs a key field")
    if connection is Connection.KEYED_BROADCAST:
        return KeyedBroadcastProcess(first, function, output_schema)
    if second is None:
        raise InvalidArgumentError(f"{connection.value}: input 1 needs a key field")
    if vectorised:
        return KeyedCoBatchProcess((first, second), function)
    return KeyedCoProcess((first, second), function, output_schema)
