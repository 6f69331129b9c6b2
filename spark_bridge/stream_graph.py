"""The job graph a pipeline builds (:class:`StreamGraph`): vertices (chains of operators),
edges (how records travel between them) and its translation to a ``snapflow.v1.JobGraph``.

Vertex and operator ids are derived from the program's structure: the creation order of
vertices, their labels and the position and kind of each chained operator (Flink's ``uid``,
implicit). The same program gives the same ids, so restoring a savepoint into it, at another
parallelism too, maps every operator's state back to its operator.

A vertex has one or more logical inputs (``EdgeNode.target_input``): a union feeds one input
from several edges; ``connect`` and the joins feed input 0 and input 1. An edge carries the
main output of its source vertex or one side output (``output_tag``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark import cloudpickle

from snapflow import limits, wire
from snapflow.errors import InvalidArgumentError
from snapflow.jobgraph import PartitionerKind
from snapflow.v1 import common_pb2 as pb
from snapflow.worker.runtime.operator import Operator

__all__ = ["EdgeNode", "OpNode", "StreamGraph", "VertexNode"]


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise InvalidArgumentError(f"{name} must be {bound}, got {value}")
    return value


def check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"{what} must be a non-empty string, got {value!r}")
    return value


def check_fn(what: str, fn: object) -> None:
    if not callable(fn):
        raise InvalidArgumentError(f"{what} needs a callable, got {fn!r:.100}")


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "op"


@dataclass
class OpNode:
    operator_id: str
    name: str
    kind: str
    operator: Operator


@dataclass
class VertexNode:
    vertex_id: str
    label: str
    parallelism: int
    is_source: bool
    key_field: str | None = None
    operators: list[OpNode] = field(default_factory=list)
    out_edges: int = 0
    sunk: bool = False
    follow: str = "an operator or a sink"
    """What must follow the vertex's creation (the build error of a vertex left empty)."""
    pending: bool = False
    """A union or side output with no operator yet: ``key_by``/``rebalance`` re-partition
    its in-edges instead of adding a vertex behind it."""
    merged_into: str = ""
    """An empty keyed vertex whose edges ``KeyedStream.connect`` moved into another one."""

    def describe(self) -> str:
        return f"vertex {self.vertex_id!r}"


@dataclass
class EdgeNode:
    source: str
    target: str
    partitioner: PartitionerKind
    key_field: str = ""
    target_input: int = 0
    output_tag: str = ""


class StreamGraph:
    """The vertices and edges of a pipeline under construction."""

    def __init__(self, name: str, parallelism: int, max_parallelism: int) -> None:
        self.name = name
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.vertices: list[VertexNode] = []
        self.edges: list[EdgeNode] = []

    def check_parallelism(self, parallelism: int | None) -> int:
        if parallelism is None:
            return self.parallelism
        return check_int("parallelism", parallelism, 1, self.max_parallelism)

    def new_vertex(
        self,
        label: str,
        parallelism: int,
        *,
        is_source: bool,
        key_field: str | None,
        follow: str = "an operator or a sink",
    ) -> VertexNode:
        vertex = VertexNode(
            vertex_id=f"v{len(self.vertices)}-{slug(label)}",
            label=label,
            parallelism=parallelism,
            is_source=is_source,
            key_field=key_field,
            follow=follow,
        )
        self.vertices.append(vertex)
        return vertex

    def add_edge(self, source: VertexNode, edge: EdgeNode) -> None:
        self.edges.append(edge)
        source.out_edges += 1

    def in_edges(self, vertex: VertexNode) -> list[EdgeNode]:
        return [e for e in self.edges if e.target == vertex.vertex_id]

    def validate(self) -> None:
        """Raise InvalidArgumentError unless the graph is a runnable job."""
        if not any(v.is_source for v in self.vertices):
            raise InvalidArgumentError(f"pipeline {self.name!r} has no source: call source() first")
        for v in self.vertices:
            if not v.operators:
                raise InvalidArgumentError(
                    f"{v.label} in pipeline {self.name!r} is not followed by {v.follow}"
                )
            if not v.sunk and not v.out_edges:
                last = v.operators[-1].name
                raise InvalidArgumentError(
                    f"the stream ending in {last!r} ({v.describe()}) has no sink: end it with .sink(...)"
                )

    def to_pb(self) -> pb.JobGraph:
        """The ``snapflow.v1.JobGraph`` (operators cloudpickled)."""
        self.validate()
        vertices = []
        for v in self.vertices:
            ops = []
            for o in v.operators:
                try:
                    payload = cloudpickle.dumps(o.operator)
                except Exception as e:
                    raise InvalidArgumentError(
                        f"operator {o.name!r} ({v.describe()}) cannot be pickled: {type(e).__name__}: {e}"
                    ) from e
                ops.append(
                    pb.OperatorSpec(
                        operator_id=o.operator_id, name=o.name, kind=o.kind, payload=payload
                    )
                )
            vertices.append(
                pb.JobVertex(
                    vertex_id=v.vertex_id,
                    name=" -> ".join(o.name for o in v.operators),
                    parallelism=v.parallelism,
                    max_parallelism=self.max_parallelism,
                    operators=ops,
                    is_source=v.is_source,
                )
            )
        edges = [
            pb.JobEdge(
                source_vertex_id=e.source,
                target_vertex_id=e.target,
                partitioner=wire.PARTITIONER_KIND.to_pb(e.partitioner),
                key_field=e.key_field,
                target_input=e.target_input,
                output_tag=e.output_tag,
            )
            for e in self.edges
        ]
        return pb.JobGraph(name=self.name, vertices=vertices, edges=edges)


def schema_mismatch(schemas: list[pa.Schema | None], describe: Callable[[int], str]) -> str | None:
    """Why streams of these (known) schemas cannot be one stream, or None (unknown schemas are
    not compared; their rows meet at run time)."""
    known = [(i, s) for i, s in enumerate(schemas) if s is not None]
    for i, s in known[1:]:
        first, ref = known[0]
        if not s.equals(ref):
            return (
                f"{describe(i)} has schema ({_fields(s)}) but {describe(first)} has "
                f"({_fields(ref)})"
            )
    return None


def _fields(schema: pa.Schema) -> str:
    text = ", ".join(f"{f.name}: {f.type}" for f in schema)
    return limits.echo(text) if len(text) > 200 else text
