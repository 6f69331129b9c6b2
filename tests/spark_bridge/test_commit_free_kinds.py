"""The coordinator's list of operator kinds that commit nothing (``COMMIT_FREE_OPERATOR_KINDS``,
which lets a job without sinks finish without a final checkpoint) names exactly the kinds the
builder gives its built-in operators: a sink's kind, and a custom operator's (its class name),
are never in it."""

from __future__ import annotations

from typing import Any

from snapflow import (
    AggregateFunction,
    CollectSink,
    GeneratorSource,
    KeyedBatchFunction,
    KeyedProcessFunction,
    Operator,
    Pipeline,
    TumblingEventTimeWindows,
)
from snapflow.jobgraph import COMMIT_FREE_OPERATOR_KINDS


def _same(x: Any, *_: Any) -> Any:
    return x


class MyCommittingOperator(Operator):
    """A user's operator (``Stream.transform``): it may commit on a completed checkpoint."""


def test_the_builders_kinds_match_the_commit_free_list() -> None:
    p = Pipeline("every-operator")
    stream = (
        p.source(GeneratorSource(total_records=10), name="gen")
        .map(_same)
        .filter(_same)
        .flat_map(_same)
        .map_batches(_same)
        .filter_batches(_same)
        .flat_map_batches(_same)
        .map_pandas(_same)
    )
    stream = stream.key_by("key").count().key_by("key").reduce("value")
    stream = stream.key_by("key").window(TumblingEventTimeWindows(10), "ts", "value")
    stream = (
        stream.key_by("key").process(_same).key_by("key").process_function(KeyedProcessFunction())
    )
    stream = stream.key_by("key").process_batches(KeyedBatchFunction())
    agg = AggregateFunction.of(lambda: 0, lambda v, a: a + v, _same)
    stream = stream.key_by("key").aggregate(agg, value_field="value")
    stream.transform(MyCommittingOperator()).sink(CollectSink())
    kinds = {op.kind for v in p.job_graph().vertices for op in v.operators}
    assert kinds - COMMIT_FREE_OPERATOR_KINDS == {"sink", "MyCommittingOperator"}
    assert kinds >= COMMIT_FREE_OPERATOR_KINDS  # no stale entry
