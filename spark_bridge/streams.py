"""The streams of the pipeline builder (:class:`Stream`, :class:`KeyedStream`, and the
streams of several inputs: ``union``, ``connect``, broadcast, side outputs).

* ``map``/``filter``/``flat_map`` (row functions over ``dict`` rows),
  ``map_batches``/``filter_batches``/``flat_map_batches`` (functions over
  ``pyarrow.RecordBatch``), ``transform`` (any operator) and ``sink`` are chained into the
  current vertex (Flink's operator chaining: FORWARD, same task).
* ``key_by(field)`` starts a new vertex behind a HASH edge on ``field`` (by key group); the
  :class:`KeyedStream` it returns offers the keyed operations (``count``, ``reduce``,
  ``window``, ``process``, ``aggregate``), which are the head of that vertex.
  ``rebalance()`` starts a new vertex behind a round-robin edge.
* ``union(*others)`` makes one stream of several (one logical input fed by several edges);
  ``side_output(tag)`` is what the operators emitted to a side output. Both are a vertex
  waiting for its first operator: ``key_by``/``rebalance`` on them re-partition the edges
  into it instead of adding a hop.
* ``keyed.window(assigner)`` gives a :class:`WindowedStream` (``aggregate``, ``process``,
  ``allowed_lateness``, ``side_output_late_data``); ``join(other)`` and ``co_group(other)``
  a window join or co-group of two streams (:class:`JoinedStreams`,
  :class:`CoGroupedStreams`) on a keyed two-input vertex.
* ``connect(other)`` gives an operator two inputs (``ConnectedStreams``);
  ``keyed.connect(other_keyed)`` keys both into one keyed vertex
  (``KeyedConnectedStreams``), ``keyed.connect(stream.broadcast())`` adds a broadcast input.

A stream is consumed once: after ``s.map(f)``, ``s`` itself cannot be used again (branching
inside a chain is not supported); several ``key_by``/``rebalance``/``union``/``connect`` edges
may leave the same stream, though (fan-out to several vertices).

Schemas: a stream knows its rows' schema when its source declares one (``output_schema``)
and its operators keep it or declare theirs; ``union`` and the key checks of ``connect``
compare known schemas at build time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Self, overload

import pyarrow as pa

from snapflow.errors import InvalidArgumentError
from snapflow.jobgraph import PartitionerKind
from snapflow.spark_bridge.stream_graph import (
    EdgeNode,
    OpNode,
    StreamGraph,
    VertexNode,
    check_fn,
    check_name,
    schema_mismatch,
    slug,
)
from snapflow.worker.api.broadcast_functions import (
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
)
from snapflow.worker.api.co_functions import (
    CoBatchFunction,
    CoProcessFunction,
    KeyedCoBatchFunction,
    KeyedCoProcessFunction,
)
from snapflow.worker.api.functions import (
    AggregateFunction,
    KeyedBatchFunction,
    KeyedProcessFunction,
)
from snapflow.worker.api.interval_join import IntervalJoinOperator
from snapflow.worker.api.join_functions import BatchJoinFunction, ProcessJoinFunction
from snapflow.worker.api.join_output import (
    BatchPairs,
    PairEmitter,
    PerPair,
    SelectPairs,
    joined_schema,
)
from snapflow.worker.api.keyed_operators import (
    Aggregate,
    KeyedBatchProcess,
    KeyedCount,
    KeyedProcess,
    KeyedReduce,
    RowsFn,
    TimerFn,
    keyed_process_function,
)
from snapflow.worker.api.operators import (
    Filter,
    FilterBatches,
    FlatMap,
    FlatMapBatches,
    Map,
    MapBatches,
)
from snapflow.worker.api.pandas_batches import from_pandas, to_pandas
from snapflow.worker.api.regular_join import RegularJoinOperator
from snapflow.worker.api.two_input_operators import Connection, two_input_operator
from snapflow.worker.api.window_assigners import WindowAssigner
from snapflow.worker.api.window_contents import (
    AggregateContents,
    BuiltinAggContents,
    RowsContents,
    WindowContents,
)
from snapflow.worker.api.window_emitters import (
    ProcessWindow,
    ResultRows,
    WindowEmitter,
    joined_columns,
)
from snapflow.worker.api.window_functions import (
    CoGroupFunction,
    JoinFunction,
    ProcessWindowFunction,
)
from snapflow.worker.api.window_join import window_co_group, window_join
from snapflow.worker.api.window_operator import WindowAggregate, WindowOperator
from snapflow.worker.runtime.operator import Operator, OutputTag, SourceOperator

__all__ = [
    "BroadcastStream",
    "CoGroupedStreams",
    "ConnectedStreams",
    "IntervalJoin",
    "IntervalJoined",
    "JoinedStreams",
    "KeyedConnectedStreams",
    "KeyedStream",
    "Stream",
    "WindowedStream",
]


class Stream:
    """The output of the last operator of a vertex's chain. Chain more operators onto it,
    start a new vertex behind an edge (``key_by``, ``rebalance``), or end it with ``sink``."""

    def __init__(
        self,
        graph: StreamGraph,
        vertex: VertexNode,
        position: int,
        schema: pa.Schema | None = None,
    ) -> None:
        self._graph = graph
        self._vertex = vertex
        self._position = position
        self.schema = schema
        """The rows' schema when the pipeline knows it (a source that declares it, operators
        that keep it or say theirs), else None; checked by ``union`` and the joins."""

    def __repr__(self) -> str:
        ops = " -> ".join(o.name for o in self._vertex.operators[: self._position])
        return f"Stream({self._vertex.vertex_id}: {ops})"

    @property
    def parallelism(self) -> int:
        return self._vertex.parallelism

    # --- chaining -------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        v = self._vertex
        if v.merged_into:
            raise InvalidArgumentError(
                f"{what}: this keyed stream was connected into vertex {v.merged_into!r}; a "
                f"stream is consumed once"
            )
        if v.sunk:
            raise InvalidArgumentError(f"{what}: {v.describe()} already ends in a sink")
        if self._position != len(v.operators):
            raise InvalidArgumentError(
                f"{what}: this stream was already consumed by "
                f"{v.operators[self._position].name!r}; a stream is consumed once (branching "
                f"inside a chain is not supported: use key_by() or rebalance() to fan out)"
            )

    def _chain(
        self,
        operator: Operator,
        kind: str,
        name: str | None,
        schema: pa.Schema | None = None,
    ) -> Stream:
        """Chain ``operator``; ``schema``: its output's, when known."""
        self._check_open(kind)
        if v_edges := self._vertex.out_edges:
            raise InvalidArgumentError(
                f"{kind}: {self._vertex.describe()} already feeds {v_edges} edge(s); operators "
                f"cannot be chained after key_by()/rebalance() left it"
            )
        label = check_name("name", name) if name is not None else kind
        v = self._vertex
        index = len(v.operators)
        v.operators.append(OpNode(f"{v.vertex_id}.{index}-{slug(kind)}", label, kind, operator))
        return Stream(self._graph, v, index + 1, schema)

    def map(
        self,
        fn: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """``fn(row: dict) -> dict`` for every row."""
        check_fn("map", fn)
        return self._chain(Map(fn, output_schema), "map", name, output_schema)

    def filter(self, fn: Callable[[dict[str, Any]], Any], *, name: str | None = None) -> Stream:
        """Keep the rows for which ``fn(row: dict)`` is truthy."""
        check_fn("filter", fn)
        return self._chain(Filter(fn), "filter", name, self.schema)

    def flat_map(
        self,
        fn: Callable[[dict[str, Any]], Iterable[dict[str, Any]] | None],
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """``fn(row: dict) -> iterable of dicts`` (None: nothing)."""
        check_fn("flat_map", fn)
        return self._chain(FlatMap(fn, output_schema), "flat_map", name, output_schema)

    def map_batches(
        self, fn: Callable[[pa.RecordBatch], pa.RecordBatch], *, name: str | None = None
    ) -> Stream:
        """``fn(batch: pyarrow.RecordBatch) -> RecordBatch`` (vectorised; a Table is accepted)."""
        check_fn("map_batches", fn)
        return self._chain(MapBatches(fn), "map_batches", name)

    def filter_batches(
        self, fn: Callable[[pa.RecordBatch], Any], *, name: str | None = None
    ) -> Stream:
        """Keep the rows where ``fn(batch)`` (a boolean array) is true."""
        check_fn("filter_batches", fn)
        return self._chain(FilterBatches(fn), "filter_batches", name, self.schema)

    def flat_map_batches(
        self,
        fn: Callable[[pa.RecordBatch], Iterable[pa.RecordBatch] | None],
        *,
        name: str | None = None,
    ) -> Stream:
        """``fn(batch) -> iterable of RecordBatch``."""
        check_fn("flat_map_batches", fn)
        return self._chain(FlatMapBatches(fn), "flat_map_batches", name)

    def map_pandas(
        self,
        fn: Callable[[Any], Any],
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """``fn(df: pandas.DataFrame) -> DataFrame`` per batch (needs pandas, an optional
        extra: ``pip install 'snapflow[pandas]'``). ``output_schema`` fixes the output types
        (recommended: pandas infers them per batch)."""
        check_fn("map_pandas", fn)
        return self._chain(
            MapBatches(_PandasFn(fn, output_schema)), "map_pandas", name, output_schema
        )

    def transform(self, operator: Operator, *, name: str | None = None) -> Stream:
        """Chain any :class:`snapflow.worker.runtime.operator.Operator` (Flink's ``transform``)."""
        if not isinstance(operator, Operator) or isinstance(operator, SourceOperator):
            raise InvalidArgumentError(
                f"transform needs a snapflow.worker.runtime.operator.Operator that is not a source, got {operator!r:.100}"
            )
        return self._chain(operator, type(operator).__name__, name)

    def sink(self, operator: Operator, *, name: str | None = None) -> None:
        """End the stream in ``operator`` (e.g. :class:`snapflow.worker.connectors.file_sink.TransactionalFileSink`),
        chained into this vertex: the end of this stream."""
        if not isinstance(operator, Operator) or isinstance(operator, SourceOperator):
            raise InvalidArgumentError(
                f"sink needs a snapflow.worker.runtime.operator.Operator (e.g. TransactionalFileSink), got {operator!r:.100}"
            )
        self._chain(operator, "sink", name or type(operator).__name__)
        self._vertex.sunk = True

    # --- new vertices ---------------------------------------------------------------------

    def _edge(
        self, what: str, partitioner: PartitionerKind, key_field: str, parallelism: int | None
    ) -> VertexNode:
        self._check_open(what)
        graph = self._graph
        par = graph.check_parallelism(parallelism)
        label = f"{what}({key_field})" if key_field else what
        v = self._vertex
        if v.pending:
            # A union or a side output not yet consumed: re-partition the edges into it
            # instead of adding a hop behind it.
            v.label, v.parallelism, v.key_field, v.pending = label, par, key_field or None, False
            for e in graph.in_edges(v):
                e.partitioner, e.key_field = partitioner, key_field
            return v
        follow = (
            "a keyed operation (count, reduce, window, process, aggregate, connect)"
            if key_field
            else "an operator or a sink"
        )
        target = graph.new_vertex(
            label, par, is_source=False, key_field=key_field or None, follow=follow
        )
        graph.add_edge(v, EdgeNode(v.vertex_id, target.vertex_id, partitioner, key_field))
        return target

    def key_by(self, key_field: str, *, parallelism: int | None = None) -> KeyedStream:
        """Partition by ``key_field`` (a HASH edge by key group) into a new, keyed vertex."""
        check_name("key_by field", key_field)
        _check_field(self.schema, key_field, "key_by")
        target = self._edge("key_by", PartitionerKind.HASH, key_field, parallelism)
        return KeyedStream(self._graph, target, key_field, self.schema)

    def rebalance(self, *, parallelism: int | None = None) -> Stream:
        """Round-robin into a new vertex (e.g. to change the parallelism)."""
        target = self._edge("rebalance", PartitionerKind.REBALANCE, "", parallelism)
        return Stream(self._graph, target, 0, self.schema)

    # --- several streams ------------------------------------------------------------------

    def union(self, *others: Stream, parallelism: int | None = None) -> Stream:
        """One stream of this stream's rows and the rows of ``others`` (Flink's ``union``):
        all must have the same schema. Chain onto it, ``key_by`` it (the edges from every
        member are then hash-partitioned, with no extra hop) or sink it."""
        members = [self, *others]
        for i, m in enumerate(members):
            if not isinstance(m, Stream):
                raise InvalidArgumentError(f"union needs Streams, argument {i} is {m!r:.80}")
        if len({id(m._vertex) for m in members}) != len(members):
            raise InvalidArgumentError("union: the same stream appears twice")
        why = schema_mismatch([m.schema for m in members], lambda i: f"union member {i}")
        if why:
            raise InvalidArgumentError(
                f"union needs streams of one schema: {why}; map them to one schema first "
                f"(map(..., output_schema=...) or map_batches)"
            )
        graph = self._graph
        par = graph.check_parallelism(parallelism)
        target = graph.new_vertex("union", par, is_source=False, key_field=None)
        target.pending = True
        for m in members:
            m._check_open("union")
            kind = (
                PartitionerKind.FORWARD
                if m._vertex.parallelism == par
                else PartitionerKind.REBALANCE
            )
            graph.add_edge(m._vertex, EdgeNode(m._vertex.vertex_id, target.vertex_id, kind))
        return Stream(self._graph, target, 0, members[0].schema)

    def side_output(self, tag: OutputTag, *, schema: pa.Schema | None = None) -> Stream:
        """The rows this stream's operators emitted to ``tag`` (``ctx.output(tag, batch)``;
        windows send late rows to theirs): a new stream, on a vertex of this one's parallelism
        (Flink's ``getSideOutput``). ``schema``: the rows' schema, when known."""
        if not isinstance(tag, OutputTag):
            raise InvalidArgumentError(f"side_output needs an OutputTag, got {tag!r:.80}")
        v = self._vertex
        if any(e.output_tag == tag.name for e in self._graph.edges if e.source == v.vertex_id):
            raise InvalidArgumentError(
                f"side_output({tag.name!r}) of {v.describe()} is already taken; take it once "
                f"and fan it out with key_by() or rebalance()"
            )
        graph = self._graph
        target = graph.new_vertex(
            f"side-output({tag.name})", v.parallelism, is_source=False, key_field=None
        )
        target.pending = True
        graph.edges.append(
            EdgeNode(v.vertex_id, target.vertex_id, PartitionerKind.FORWARD, output_tag=tag.name)
        )
        return Stream(self._graph, target, 0, schema)

    def connect(self, other: Stream | KeyedStream | BroadcastStream) -> ConnectedStreams:
        """Two streams into one operator with two inputs (Flink's ``connect``): this one is
        input 0, ``other`` input 1; their schemas may differ. Process them with a
        ``CoProcessFunction`` (``.process``) or key both (``.key_by``); a
        :meth:`broadcast` stream gives broadcast state."""
        if isinstance(other, KeyedStream):
            raise InvalidArgumentError(
                "connect: this stream is not keyed but the other is; key both "
                "(keyed.connect(other_keyed)) or connect first and key both with "
                "connect(other).key_by(first_key, second_key)"
            )
        if not isinstance(other, Stream | BroadcastStream):
            raise InvalidArgumentError(
                f"connect needs a Stream, KeyedStream or BroadcastStream, got {other!r:.80}"
            )
        return ConnectedStreams(self, other)

    def broadcast(self) -> BroadcastStream:
        """This stream sent whole to every subtask of the operator it is connected to
        (Flink's ``broadcast``): the side that writes broadcast state."""
        return BroadcastStream(self)

    # --- window join and co-group (Flink's join / coGroup) ----------------------------------

    def join(self, other: Stream) -> JoinedStreams:
        """A window join with ``other`` (Flink's ``join``):
        ``a.join(b).where(k0).equal_to(k1).window(assigner, time_field).apply(fn)``; every pair
        of rows with equal keys in one window. ``apply()`` without a function emits the pairs'
        columns side by side."""
        return JoinedStreams(self, other, "join")

    def co_group(self, other: Stream) -> CoGroupedStreams:
        """A window co-group with ``other`` (Flink's ``coGroup``): as :meth:`join`, but
        ``apply(fn)`` gets each window's rows of both inputs at once."""
        return CoGroupedStreams(self, other, "co_group")


class BroadcastStream:
    """A stream to broadcast into a connected operator (``Stream.broadcast``): every subtask
    of that operator gets all of its rows, on input 1."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def __repr__(self) -> str:
        return f"BroadcastStream({self.stream!r})"


class ConnectedStreams:
    """Two connected streams (``Stream.connect``), neither keyed: input 0 and input 1 of one
    operator."""

    def __init__(self, first: Stream, second: Stream | BroadcastStream) -> None:
        self.first = first
        self.second = second

    def __repr__(self) -> str:
        return f"ConnectedStreams({self.first!r}, {self.second!r})"

    @property
    def is_broadcast(self) -> bool:
        return isinstance(self.second, BroadcastStream)

    def key_by(
        self, first_key: str, second_key: str, *, parallelism: int | None = None
    ) -> KeyedConnectedStreams:
        """Key both inputs (``first_key`` of input 0, ``second_key`` of input 1): records of
        either input with equal keys meet in one subtask and share its keyed state and
        timers (Flink's ``ConnectedStreams.keyBy``). The key types must be equal."""
        if isinstance(self.second, BroadcastStream):
            raise InvalidArgumentError(
                "key_by: a broadcast input cannot be keyed; key the other stream before "
                "connect: stream.key_by(k).connect(other.broadcast())"
            )
        first = self.first.key_by(first_key, parallelism=parallelism)
        second = self.second.key_by(second_key, parallelism=first.parallelism)
        return first.connect(second)

    def transform(
        self, operator: Operator, *, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """Any two-input :class:`snapflow.worker.runtime.operator.Operator` (it overrides
        ``process_input``) as the head of a new vertex: each input forwarded at equal
        parallelism, else round-robin; a broadcast input to every subtask."""
        check_operator("connect", operator)
        return self._head(operator, type(operator).__name__, name, parallelism)

    def _head(
        self,
        operator: Operator,
        op_kind: str,
        name: str | None,
        parallelism: int | None,
        schema: pa.Schema | None = None,
    ) -> Stream:
        """``operator`` (of kind ``op_kind``) as the head of a new vertex fed by both inputs."""
        first = self.first
        second = self.second.stream if isinstance(self.second, BroadcastStream) else self.second
        if first._vertex is second._vertex:
            raise InvalidArgumentError("connect: a stream cannot be connected to itself")
        first._check_open("connect")
        second._check_open("connect")
        graph = first._graph
        par = graph.check_parallelism(parallelism)
        target = graph.new_vertex("connect", par, is_source=False, key_field=None)
        for index, stream in enumerate((first, second)):
            if index == 1 and self.is_broadcast:
                kind = PartitionerKind.BROADCAST
            elif stream._vertex.parallelism == par:
                kind = PartitionerKind.FORWARD
            else:
                kind = PartitionerKind.REBALANCE
            graph.add_edge(
                stream._vertex,
                EdgeNode(stream._vertex.vertex_id, target.vertex_id, kind, target_input=index),
            )
        return Stream(first._graph, target, 0)._chain(operator, op_kind, name, schema)

    @property
    def _connection(self) -> Connection:
        return Connection.BROADCAST if self.is_broadcast else Connection.CONNECTED

    def process(
        self,
        function: CoProcessFunction | BroadcastProcessFunction,
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Record at a time over both inputs: a :class:`snapflow.worker.api.co_functions.CoProcessFunction`
        (``process_element1``/``process_element2``), or on ``connect(other.broadcast())`` a
        :class:`snapflow.worker.api.broadcast_functions.BroadcastProcessFunction` (broadcast
        state). A function of another kind is refused here, naming the one that fits."""
        op = two_input_operator(function, self._connection, output_schema=output_schema)
        return self._head(op, "process", name, parallelism, output_schema)

    def process_batches(
        self,
        function: CoBatchFunction,
        *,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Vectorised over both inputs: a :class:`snapflow.worker.api.co_functions.CoBatchFunction`
        (``process_batch1``/``process_batch2``)."""
        op = two_input_operator(function, self._connection, vectorised=True)
        return self._head(op, "process_batches", name, parallelism)


class KeyedConnectedStreams:
    """Two inputs of one keyed vertex (``keyed.connect(other_keyed)``, or a keyed input 0 and
    a broadcast input 1: ``keyed.connect(stream.broadcast())``). The operator to run on them
    is the head of that vertex."""

    def __init__(
        self,
        keyed: KeyedStream,
        second_key: str | None,
        second_schema: pa.Schema | None,
    ) -> None:
        self._stream = keyed._stream
        self.first_key = keyed.key_field
        self.second_key = second_key
        """Input 1's key field; None: input 1 is broadcast."""
        self.schemas = (keyed._stream.schema, second_schema)

    def __repr__(self) -> str:
        second = "broadcast" if self.second_key is None else f"by {self.second_key!r}"
        return f"KeyedConnectedStreams({self._stream._vertex.vertex_id}: by {self.first_key!r}, {second})"

    @property
    def is_broadcast(self) -> bool:
        return self.second_key is None

    @property
    def parallelism(self) -> int:
        return self._stream.parallelism

    def transform(self, operator: Operator, *, name: str | None = None) -> Stream:
        """Any keyed two-input operator as the head of the keyed vertex."""
        check_operator("connect", operator)
        return self._stream._chain(operator, type(operator).__name__, name)

    @property
    def _connection(self) -> Connection:
        return Connection.KEYED_BROADCAST if self.is_broadcast else Connection.KEYED

    def process(
        self,
        function: KeyedCoProcessFunction | KeyedBroadcastProcessFunction,
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """Record at a time with keyed state and event-time timers shared by both inputs: a
        :class:`snapflow.worker.api.co_functions.KeyedCoProcessFunction`, or with a broadcast
        input a :class:`snapflow.worker.api.broadcast_functions.KeyedBroadcastProcessFunction`.
        A function of another kind is refused here, naming the one that fits."""
        op = two_input_operator(
            function,
            self._connection,
            (self.first_key, self.second_key),
            output_schema=output_schema,
        )
        return self._stream._chain(op, "process", name, output_schema)

    def process_batches(self, function: KeyedCoBatchFunction, *, name: str | None = None) -> Stream:
        """Vectorised with the bulk state API: a
        :class:`snapflow.worker.api.co_functions.KeyedCoBatchFunction` (``process_batch1``/
        ``process_batch2``, ``on_timers``)."""
        op = two_input_operator(
            function, self._connection, (self.first_key, self.second_key), vectorised=True
        )
        return self._stream._chain(op, "process_batches", name)


def check_operator(what: str, operator: object) -> None:
    if not isinstance(operator, Operator) or isinstance(operator, SourceOperator):
        raise InvalidArgumentError(
            f"{what} needs a snapflow Operator that is not a source, got {operator!r:.100}"
        )


def _field_type(schema: pa.Schema | None, name: str) -> pa.DataType | None:
    return schema.field(name).type if schema is not None else None


def _check_field(schema: pa.Schema | None, field_name: str, what: str) -> None:
    if schema is not None and schema.get_field_index(field_name) < 0:
        raise InvalidArgumentError(
            f"{what}: no field {field_name!r} in the stream's schema ({', '.join(schema.names)})"
        )


class KeyedStream:
    """A stream partitioned by ``key_field``: the keyed operation to run on it is the head of
    the keyed vertex. Every keyed operation keeps its state per key (in key groups) and
    returns a :class:`Stream` (chain more operators onto it, or sink it)."""

    def __init__(
        self,
        graph: StreamGraph,
        vertex: VertexNode,
        key_field: str,
        schema: pa.Schema | None = None,
    ) -> None:
        self._stream = Stream(graph, vertex, 0, schema)
        self.key_field = key_field

    @property
    def parallelism(self) -> int:
        return self._stream.parallelism

    def connect(self, other: KeyedStream | BroadcastStream) -> KeyedConnectedStreams:
        """``keyed.connect(other_keyed)``: one keyed vertex with this stream as input 0 and
        ``other`` as input 1, both hash-partitioned by their keys into one key-group space
        (records with equal keys meet; key types must be equal).
        ``keyed.connect(stream.broadcast())``: input 1 goes to every subtask (broadcast
        state)."""
        v = self._stream._vertex
        graph = self._stream._graph
        if v.operators or any(e.target_input for e in graph.in_edges(v)):
            raise InvalidArgumentError(
                f"connect: key_by({self.key_field!r}) was already consumed; key the stream "
                f"again for another operation"
            )
        if isinstance(other, BroadcastStream):
            source = other.stream
            source._check_open("connect")
            graph.add_edge(
                source._vertex,
                EdgeNode(
                    source._vertex.vertex_id,
                    v.vertex_id,
                    PartitionerKind.BROADCAST,
                    target_input=1,
                ),
            )
            v.label = f"{v.label}+broadcast"
            return KeyedConnectedStreams(self, None, source.schema)
        if not isinstance(other, KeyedStream):
            raise InvalidArgumentError(
                f"a KeyedStream connects to a KeyedStream or a BroadcastStream, got {other!r:.80}"
            )
        w = other._stream._vertex
        if w is v or w.operators or any(e.target_input for e in graph.in_edges(w)):
            raise InvalidArgumentError(
                "connect: the other keyed stream was already consumed (or is this one)"
            )
        t0 = _field_type(self._stream.schema, self.key_field)
        t1 = _field_type(other._stream.schema, other.key_field)
        if t0 is not None and t1 is not None and not t0.equals(t1):
            raise InvalidArgumentError(
                f"the keys of connected streams must have one type: input 0's "
                f"{self.key_field!r} is {t0}, input 1's {other.key_field!r} is {t1}; cast one "
                f"(map(..., output_schema=...)) so that equal keys meet"
            )
        # The other keyed vertex is still empty: its edges move to input 1 of this one.
        for e in graph.in_edges(w):
            e.target, e.target_input = v.vertex_id, 1
        graph.vertices.remove(w)
        w.merged_into = v.vertex_id
        v.label = f"connect({self.key_field},{other.key_field})"
        return KeyedConnectedStreams(self, other.key_field, other._stream.schema)

    def __repr__(self) -> str:
        return f"KeyedStream({self._stream._vertex.vertex_id}, key_field={self.key_field!r})"

    def count(
        self, *, count_field: str = "count", output: str = "updates", name: str | None = None
    ) -> Stream:
        """A running count per key: rows ``(key, count_field)`` with the new totals of the keys
        each batch updated (``output="final"``: the totals once, at the end of the input)."""
        check_name("count_field", count_field)
        return self._stream._chain(KeyedCount(self.key_field, output, count_field), "count", name)

    def reduce(
        self,
        value_field: str,
        agg: str | Callable[[Any, Any], Any] = "sum",
        *,
        name: str | None = None,
    ) -> Stream:
        """A running reduction of ``value_field`` per key: ``"sum"``, ``"min"``, ``"max"`` or
        ``fn(a, b) -> c``; rows ``(key, value_field)``."""
        check_name("value_field", value_field)
        return self._stream._chain(KeyedReduce(self.key_field, value_field, agg), "reduce", name)

    @overload
    def window(
        self,
        assigner: WindowAssigner,
        time_field: str | None = None,
        *,
        allowed_lateness_ms: int = 0,
    ) -> WindowedStream: ...

    @overload
    def window(
        self,
        assigner: WindowAssigner,
        time_field: str | None,
        value_field: str | None,
        agg: str = "sum",
        *,
        allowed_lateness_ms: int = 0,
        output_field: str = "value",
        name: str | None = None,
    ) -> Stream: ...

    @overload
    def window(
        self,
        assigner: WindowAssigner,
        time_field: str | None = None,
        value_field: str | None = None,
        *,
        agg: str,
        allowed_lateness_ms: int = 0,
        output_field: str = "value",
        name: str | None = None,
    ) -> Stream: ...

    def window(
        self,
        assigner: WindowAssigner,
        time_field: str | None = None,
        value_field: str | None = None,
        agg: str | None = None,
        *,
        allowed_lateness_ms: int = 0,
        output_field: str = "value",
        name: str | None = None,
    ) -> Stream | WindowedStream:
        """Windows per key from ``assigner`` (event time from ``time_field``, int ms or a
        timestamp; processing-time assigners need none).

        With ``value_field`` or ``agg`` (``"sum"``, ``"count"``, ``"min"``, ``"max"``): that
        aggregation, rows ``(key, window_start, window_end, output_field)`` when a window
        fires. Without: a :class:`WindowedStream` (Flink's ``window(assigner)``) to finish with
        ``.aggregate(...)`` or ``.process(...)``."""
        if time_field is not None:
            check_name("time_field", time_field)
            _check_field(self._stream.schema, time_field, "window")
        if value_field is None and agg is None:
            if output_field != "value" or name is not None:
                raise InvalidArgumentError(
                    "window(assigner, time_field) without an aggregation gives a "
                    "WindowedStream: pass output_field and name to its aggregate() or process()"
                )
            return WindowedStream(self, assigner, time_field, allowed_lateness_ms)
        op = WindowAggregate(
            self.key_field,
            time_field,
            value_field,
            assigner,
            agg or "sum",
            allowed_lateness_ms=allowed_lateness_ms,
            output_field=output_field,
        )
        return self._stream._chain(op, "window", name)

    def process(
        self,
        fn: RowsFn,
        *,
        on_timer: TimerFn | None = None,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """Flink's ``KeyedProcessFunction``: ``fn(key, rows, ctx)`` per distinct key of a batch,
        with keyed state and event-time timers on ``ctx`` (:class:`snapflow.worker.api.functions.KeyedContext`)."""
        check_fn("process", fn)
        if on_timer is not None:
            check_fn("process on_timer", on_timer)
        op = KeyedProcess(self.key_field, fn, on_timer, output_schema)
        return self._stream._chain(op, "process", name)

    def process_function(
        self,
        function: KeyedProcessFunction,
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """Record at a time with a :class:`snapflow.worker.api.functions.KeyedProcessFunction`
        (Flink's ``process(KeyedProcessFunction)``): ``process_element(row, ctx)`` per row,
        ``on_timer(timestamp, ctx)`` per fired event-time timer, ``open(ctx)``/``close()``."""
        if not isinstance(function, KeyedProcessFunction):
            raise InvalidArgumentError(
                f"process_function needs a snapflow.worker.api.functions.KeyedProcessFunction, got {function!r:.100}"
            )
        op = keyed_process_function(self.key_field, function, output_schema)
        return self._stream._chain(op, "process", name)

    def process_batches(self, function: KeyedBatchFunction, *, name: str | None = None) -> Stream:
        """Vectorised keyed processing with a :class:`snapflow.worker.api.functions.KeyedBatchFunction`:
        ``process_batch(batch, ctx)`` per input batch with the bulk state API
        (``get_many``/``update_many``), ``on_timers(timers, ctx)`` with the due timers as one batch."""
        if not isinstance(function, KeyedBatchFunction):
            raise InvalidArgumentError(
                f"process_batches needs a snapflow.worker.api.functions.KeyedBatchFunction, got {function!r:.100}"
            )
        return self._stream._chain(
            KeyedBatchProcess(self.key_field, function), "process_batches", name
        )

    def aggregate(
        self,
        function: AggregateFunction,
        *,
        value_field: str | None = None,
        output_field: str = "result",
        result_type: pa.DataType | None = None,
        name: str | None = None,
    ) -> Stream:
        """A running aggregation per key with an :class:`snapflow.worker.api.functions.AggregateFunction`."""
        op = Aggregate(self.key_field, function, value_field, output_field, result_type)
        return self._stream._chain(op, "aggregate", name)

    def interval_join(self, other: KeyedStream) -> IntervalJoin:
        """Join with ``other`` on equal keys and event times within a range (Flink's
        ``intervalJoin``): ``.between(lower_ms, upper_ms, left_time=..., right_time=...)``,
        then ``.select()`` (the joined rows), ``.process(ProcessJoinFunction)`` or
        ``.process_batches(BatchJoinFunction)``. Both streams are keyed, their key types equal."""
        if not isinstance(other, KeyedStream):
            raise InvalidArgumentError(
                f"interval_join needs a KeyedStream (other.key_by(field)), got {other!r:.80}"
            )
        return IntervalJoin(self, other)

    def join(
        self,
        other: KeyedStream,
        *,
        ttl_ms: int | None = None,
        how: str = "inner",
        left_prefix: str = "left_",
        right_prefix: str = "right_",
        name: str | None = None,
    ) -> Stream:
        """The regular (unbounded) inner join with ``other`` on equal keys: every pair once,
        when its second row arrives (append-only). ``ttl_ms``: a row is kept that long after
        it arrived (processing time), else forever. Outer joins are refused: Flink's retract
        rows, and Snapflow's streams are append-only."""
        if how != "inner":
            raise InvalidArgumentError(
                f"join(how={how!r}): only the inner join is offered. Flink's regular outer "
                f"joins emit a padded row and retract it when a match arrives; Snapflow's "
                f"streams are append-only, so an outer join could not be exact (an interval "
                f"join bounds when a match can arrive)"
            )
        if not isinstance(other, KeyedStream):
            raise InvalidArgumentError(
                f"join needs a KeyedStream (other.key_by(field)), got {other!r:.80}"
            )
        emitter = SelectPairs(self.key_field, other.key_field, left_prefix, right_prefix)
        op = RegularJoinOperator(self.key_field, other.key_field, ttl_ms=ttl_ms, emitter=emitter)
        schema = _joined_or_none(self, other, left_prefix, right_prefix)
        return _join_into(self, other, op, name, schema)


class _PandasFn:
    """A pandas function as a batch function: the conversions at the edge."""

    def __init__(self, fn: Callable[[Any], Any], schema: pa.Schema | None) -> None:
        self.fn = fn
        self.schema = schema

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        out = self.fn(to_pandas(batch))
        return None if out is None else from_pandas(out, self.schema)


# ---------------------------------------------------------------------------------------------
# Joins of two keyed streams (interval join builder)
# ---------------------------------------------------------------------------------------------


def _joined_or_none(
    left: KeyedStream, right: KeyedStream, left_prefix: str, right_prefix: str
) -> pa.Schema | None:
    """The joined rows' schema when both inputs' are known (a name clash refused here)."""
    for what, prefix in (("left_prefix", left_prefix), ("right_prefix", right_prefix)):
        if not isinstance(prefix, str):
            raise InvalidArgumentError(f"{what} must be a string, got {prefix!r:.80}")
    ls, rs = left._stream.schema, right._stream.schema
    if ls is None or rs is None:
        return None
    return joined_schema(ls, rs, left.key_field, right.key_field, left_prefix, right_prefix)


def _join_into(
    left: KeyedStream,
    right: KeyedStream,
    operator: Operator,
    name: str | None,
    schema: pa.Schema | None,
) -> Stream:
    """``left.connect(right)`` (one keyed vertex, key types checked) headed by ``operator``."""
    out = left.connect(right).transform(operator, name=name)
    out.schema = schema
    return out


class IntervalJoin:
    """``left.interval_join(right)``: say the time range with :meth:`between`."""

    def __init__(self, left: KeyedStream, right: KeyedStream) -> None:
        self.left = left
        self.right = right

    def __repr__(self) -> str:
        return f"IntervalJoin({self.left!r}, {self.right!r})"

    def between(
        self, lower_ms: int, upper_ms: int, *, left_time: str, right_time: str | None = None
    ) -> IntervalJoined:
        """Right rows with ``left.ts + lower_ms <= right.ts <= left.ts + upper_ms`` join
        (Flink's ``between``; bounds inclusive until ``lower_bound_exclusive()`` /
        ``upper_bound_exclusive()``). ``left_time``/``right_time`` (default: ``left_time``):
        the event-time fields (integer ms or timestamps)."""
        right_time = left_time if right_time is None else right_time
        for what, stream, field in (
            ("left_time", self.left, left_time),
            ("right_time", self.right, right_time),
        ):
            check_name(what, field)
            _check_field(stream._stream.schema, field, f"interval_join {what}")
        for what, value in (("lower_ms", lower_ms), ("upper_ms", upper_ms)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgumentError(
                    f"between: {what} must be an integer (ms), got {value!r}"
                )
        if lower_ms > upper_ms:
            raise InvalidArgumentError(
                f"between({lower_ms}, {upper_ms}): the lower bound must not exceed the upper one"
            )
        return IntervalJoined(self.left, self.right, lower_ms, upper_ms, left_time, right_time)


class IntervalJoined:
    """An interval join with its range (Flink's ``IntervalJoined``): options, then
    :meth:`select`, :meth:`process` or :meth:`process_batches`."""

    def __init__(
        self,
        left: KeyedStream,
        right: KeyedStream,
        lower_ms: int,
        upper_ms: int,
        left_time: str,
        right_time: str,
    ) -> None:
        self.left = left
        self.right = right
        self.lower_ms = lower_ms
        self.upper_ms = upper_ms
        self.left_time = left_time
        self.right_time = right_time
        self.lower_inclusive = True
        self.upper_inclusive = True
        self.left_late: OutputTag | None = None
        self.right_late: OutputTag | None = None

    def __repr__(self) -> str:
        lo = "[" if self.lower_inclusive else "("
        hi = "]" if self.upper_inclusive else ")"
        return f"IntervalJoined({lo}{self.lower_ms}, {self.upper_ms}{hi})"

    def lower_bound_exclusive(self) -> IntervalJoined:
        self.lower_inclusive = False
        return self

    def upper_bound_exclusive(self) -> IntervalJoined:
        self.upper_inclusive = False
        return self

    def side_output_left_late_data(self, tag: OutputTag) -> IntervalJoined:
        """Late left rows (before the watermark) to ``tag`` instead of dropped (read them
        with ``Stream.side_output(tag)`` on the join's output)."""
        self.left_late = _tag(tag)
        return self

    def side_output_right_late_data(self, tag: OutputTag) -> IntervalJoined:
        self.right_late = _tag(tag)
        return self

    def _build(self, emitter: PairEmitter, name: str | None, schema: pa.Schema | None) -> Stream:
        op = IntervalJoinOperator(
            self.left.key_field,
            self.right.key_field,
            self.left_time,
            self.right_time,
            self.lower_ms,
            self.upper_ms,
            lower_inclusive=self.lower_inclusive,
            upper_inclusive=self.upper_inclusive,
            emitter=emitter,
            left_late=self.left_late,
            right_late=self.right_late,
        )
        return _join_into(self.left, self.right, op, name, schema)

    def select(
        self, *, left_prefix: str = "left_", right_prefix: str = "right_", name: str | None = None
    ) -> Stream:
        """The joined rows: the left's columns, then the right's (its key once when both key
        fields have one name); a name both have is prefixed on each side."""
        schema = _joined_or_none(self.left, self.right, left_prefix, right_prefix)
        emitter = SelectPairs(self.left.key_field, self.right.key_field, left_prefix, right_prefix)
        return self._build(emitter, name, schema)

    def process(
        self,
        function: ProcessJoinFunction,
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """A :class:`snapflow.worker.api.join_functions.ProcessJoinFunction` per pair
        (Python per pair; ``process_batches`` is the vectorised form)."""
        return self._build(PerPair(function, output_schema), name, output_schema)

    def process_batches(self, function: BatchJoinFunction, *, name: str | None = None) -> Stream:
        """A :class:`snapflow.worker.api.join_functions.BatchJoinFunction` per batch of pairs."""
        return self._build(BatchPairs(function), name, None)


def _tag(tag: OutputTag) -> OutputTag:
    if not isinstance(tag, OutputTag):
        raise InvalidArgumentError(f"a side output needs an OutputTag, got {tag!r:.80}")
    return tag


# Windows: the windowed stream of one keyed input, window join and co-group of two
# ---------------------------------------------------------------------------------------------


class WindowedStream:
    """Windows of a keyed stream (``keyed.window(assigner)``; Flink's ``WindowedStream``):
    set ``allowed_lateness`` and ``side_output_late_data``, then finish it with
    :meth:`aggregate` or :meth:`process`, which return the windows' output stream."""

    def __init__(
        self,
        keyed: KeyedStream,
        assigner: WindowAssigner,
        time_field: str | None,
        allowed_lateness_ms: int = 0,
    ) -> None:
        if not isinstance(assigner, WindowAssigner):
            raise InvalidArgumentError(f"window needs a window assigner, got {assigner!r:.80}")
        if assigner.is_event_time and time_field is None:
            raise InvalidArgumentError(
                f"{assigner!r} windows event time: pass the time field, "
                f"window(assigner, time_field)"
            )
        self._keyed = keyed
        self.assigner = assigner
        self.time_field = time_field
        self.allowed_lateness_ms = allowed_lateness_ms
        self.late_data_tag: OutputTag | None = None

    def __repr__(self) -> str:
        return f"WindowedStream({self._keyed!r}, {self.assigner!r})"

    def allowed_lateness(self, ms: int) -> WindowedStream:
        """Keep each window's state ``ms`` past its end; late rows within it fire the window
        again (Flink's ``allowedLateness``; event time only)."""
        self.allowed_lateness_ms = ms
        return self

    def side_output_late_data(self, tag: OutputTag) -> WindowedStream:
        """Rows later than the watermark plus the allowed lateness go to ``tag`` instead of
        being dropped; read them with ``side_output(tag)`` on the windows' output stream
        (Flink's ``sideOutputLateData``)."""
        if not isinstance(tag, OutputTag):
            raise InvalidArgumentError(f"side_output_late_data needs an OutputTag, got {tag!r:.80}")
        self.late_data_tag = tag
        return self

    def _chain(self, op: WindowOperator, name: str | None) -> Stream:
        return self._keyed._stream._chain(op, "window", name)

    def aggregate(
        self,
        function: str | AggregateFunction,
        window_function: ProcessWindowFunction | Callable[..., Any] | None = None,
        *,
        value_field: str | None = None,
        output_field: str = "value",
        result_type: pa.DataType | None = None,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """Aggregate each window incrementally: a built-in (``"sum"``, ``"count"``, ``"min"``,
        ``"max"`` of ``value_field``, vectorised) or an :class:`AggregateFunction` (of
        ``value_field``, or of the row as a dict; sessions need its ``merge``). Without
        ``window_function``: rows ``(key, window_start, window_end, output_field)``; with one,
        ``window_function.process(key, window, [result], ctx)`` per fired window (Flink's
        ``aggregate(AggregateFunction, ProcessWindowFunction)``)."""
        keyed = self._keyed
        if value_field is not None:
            _check_field(keyed._stream.schema, value_field, "aggregate")
        contents: WindowContents = (
            BuiltinAggContents(function, value_field)
            if isinstance(function, str)
            else AggregateContents(function, value_field, result_type)
        )
        emitter: WindowEmitter = (
            ResultRows(keyed.key_field, output_field)
            if window_function is None
            else ProcessWindow(window_function, output_schema, single_result=True)
        )
        return self._chain(self._operator(contents, emitter), name)

    def process(
        self,
        function: ProcessWindowFunction | Callable[..., Any],
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
    ) -> Stream:
        """``function.process(key, window, rows, ctx)`` once per fired window with every row
        of it as one ``pyarrow.RecordBatch`` (Flink's ``process(ProcessWindowFunction)``; the
        rows are kept in list state)."""
        emitter = ProcessWindow(function, output_schema, single_result=False)
        return self._chain(self._operator(RowsContents(), emitter), name)

    def _operator(self, contents: WindowContents, emitter: WindowEmitter) -> WindowOperator:
        return WindowOperator(
            (self._keyed.key_field,),
            (self.time_field,),
            self.assigner,
            (contents,),
            emitter,
            allowed_lateness_ms=self.allowed_lateness_ms,
            late_data_tag=self.late_data_tag,
        )


class _TwoWindowedInputs:
    """What a window join and co-group share: the keys of both inputs, the windows."""

    def __init__(self, first: Stream, second: Stream, kind: str) -> None:
        for i, s in enumerate((first, second)):
            if not isinstance(s, Stream):
                raise InvalidArgumentError(f"{kind} needs two Streams, input {i} is {s!r:.80}")
        self.first = first
        self.second = second
        self.kind = kind
        self.first_key: str | None = None
        self.second_key: str | None = None
        self.assigner: WindowAssigner | None = None
        self.time_fields: tuple[str | None, str | None] = (None, None)
        self.allowed_lateness_ms = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.first!r}, {self.second!r})"

    def where(self, key_field: str) -> Self:
        """The key field of the first input."""
        check_name(f"{self.kind} where", key_field)
        _check_field(self.first.schema, key_field, f"{self.kind} where")
        self.first_key = key_field
        return self

    def equal_to(self, key_field: str) -> Self:
        """The key field of the second input (of the first's type)."""
        check_name(f"{self.kind} equal_to", key_field)
        _check_field(self.second.schema, key_field, f"{self.kind} equal_to")
        self.second_key = key_field
        return self

    def window(
        self,
        assigner: WindowAssigner,
        time_field: str | None = None,
        second_time_field: str | None = None,
    ) -> Self:
        """Windows from ``assigner``: tumbling, sliding or sessions (merged across both
        inputs); event time from ``time_field`` (``second_time_field`` of the second input
        when it is named otherwise)."""
        if self.first_key is None or self.second_key is None:
            raise InvalidArgumentError(
                f"{self.kind}: name the keys first, .where(first_key).equal_to(second_key)"
            )
        if not isinstance(assigner, WindowAssigner):
            raise InvalidArgumentError(f"window needs a window assigner, got {assigner!r:.80}")
        second = second_time_field if second_time_field is not None else time_field
        if assigner.is_event_time and (time_field is None or second is None):
            raise InvalidArgumentError(
                f"{assigner!r} windows event time: pass the time field, "
                f".window(assigner, time_field[, second_time_field])"
            )
        if time_field is not None:
            _check_field(self.first.schema, time_field, f"{self.kind} window")
        if second is not None:
            _check_field(self.second.schema, second, f"{self.kind} window")
        self.assigner = assigner
        self.time_fields = (time_field, second)
        return self

    def allowed_lateness(self, ms: int) -> Self:
        self.allowed_lateness_ms = ms
        return self

    def _build(self, op: WindowOperator, name: str | None, parallelism: int | None) -> Stream:
        assert self.first_key is not None and self.second_key is not None
        connected = self.first.connect(self.second).key_by(
            self.first_key, self.second_key, parallelism=parallelism
        )
        return connected.transform(op, name=name or self.kind)

    def _keys_and_window(self) -> tuple[tuple[str, str], WindowAssigner]:
        if self.first_key is None or self.second_key is None or self.assigner is None:
            raise InvalidArgumentError(
                f"{self.kind}: .where(first_key).equal_to(second_key).window(assigner, "
                f"time_field) come before apply"
            )
        return (self.first_key, self.second_key), self.assigner


class JoinedStreams(_TwoWindowedInputs):
    """``a.join(b)`` (Flink's ``JoinedStreams``): ``.where(k0).equal_to(k1)
    .window(assigner, time_field).apply(fn)``."""

    def apply(
        self,
        function: JoinFunction | Callable[[dict[str, Any], dict[str, Any]], Any] | None = None,
        *,
        output_schema: pa.Schema | None = None,
        prefixes: tuple[str, str] = ("left_", "right_"),
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """``function(first_row, second_row)`` (or a :class:`JoinFunction`) per pair of rows
        of one key in one window, returning a row, rows or None. Without a function: the
        pairs as batches with the columns of both inputs, a name both have prefixed
        (``prefixes``)."""
        keys, assigner = self._keys_and_window()
        op = window_join(
            keys,
            self.time_fields,
            assigner,
            function,
            output_schema=output_schema,
            prefixes=prefixes,
            allowed_lateness_ms=self.allowed_lateness_ms,
        )
        out = self._build(op, name, parallelism)
        a, b = self.first.schema, self.second.schema
        if function is None and a is not None and b is not None:
            names0, names1 = joined_columns(a.names, b.names, prefixes)
            out.schema = pa.schema(
                [f.with_name(n) for f, n in zip(list(a) + list(b), names0 + names1, strict=True)]
            )
        elif output_schema is not None:
            out.schema = output_schema
        return out


class CoGroupedStreams(_TwoWindowedInputs):
    """``a.co_group(b)`` (Flink's ``CoGroupedStreams``): ``.where(k0).equal_to(k1)
    .window(assigner, time_field).apply(fn)`` with ``fn(first, second, ctx)`` per window."""

    def apply(
        self,
        function: CoGroupFunction | Callable[..., Any],
        *,
        output_schema: pa.Schema | None = None,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """``function(first, second, ctx)`` (or a :class:`CoGroupFunction`'s ``co_group``) once
        per window of a key that either input reached: each input's rows of it as a batch
        (one may have no rows), ``ctx.key`` and ``ctx.window`` set."""
        keys, assigner = self._keys_and_window()
        op = window_co_group(
            keys,
            self.time_fields,
            assigner,
            function,
            output_schema=output_schema,
            allowed_lateness_ms=self.allowed_lateness_ms,
        )
        out = self._build(op, name, parallelism)
        out.schema = output_schema
        return out
