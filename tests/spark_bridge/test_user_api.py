"""The builder's user API: keyed process functions (per record and vectorised), pandas batch
functions, and checkpointing off, translated into the job graph (no Spark)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow import wire
from snapflow.errors import InvalidArgumentError
from snapflow.spark_bridge import Pipeline
from snapflow.worker.api.functions import KeyedBatchFunction, KeyedProcessFunction
from snapflow.worker.api.keyed_operators import KeyedBatchProcess, KeyedProcess
from snapflow.worker.api.operators import MapBatches
from snapflow.worker.connectors.debug_sinks import CollectSink
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.operator import OperatorContext


class Echo(KeyedProcessFunction):
    def process_element(self, row: dict[str, Any], ctx: Any) -> Any:
        return [row]


class Passthrough(KeyedBatchFunction):
    def process_batch(self, batch: pa.RecordBatch, ctx: Any) -> pa.RecordBatch:
        return batch


def test_keyed_functions_and_pandas_in_the_job_graph() -> None:
    p = Pipeline("api", parallelism=2)
    keyed = p.source(GeneratorSource(total_records=10), name="events").key_by("key")
    out = keyed.process_function(Echo(), name="echo").map_pandas(lambda df: df)
    out.sink(CollectSink())
    p.source(GeneratorSource(total_records=10), name="more").key_by("key").process_batches(
        Passthrough()
    ).sink(CollectSink())
    graph = p.job_graph()
    kinds = {v.vertex_id: [o.kind for o in v.operators] for v in graph.vertices}
    assert kinds["v1-key-by-key"] == ["process", "map_pandas", "sink"]
    assert kinds["v3-key-by-key"] == ["process_batches", "sink"]
    ops = {o.kind: cloudpickle.loads(o.payload) for v in graph.vertices for o in v.operators}
    assert isinstance(ops["process"], KeyedProcess)
    assert isinstance(ops["process_batches"], KeyedBatchProcess)
    assert isinstance(ops["map_pandas"], MapBatches)
    for bad, message in [
        (lambda: keyed.process_function(lambda r, c: None), "KeyedProcessFunction"),  # type: ignore[arg-type]
        (lambda: keyed.process_batches(Echo()), "KeyedBatchFunction"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            bad()


def test_map_pandas_converts_at_the_edge() -> None:
    pytest.importorskip("pandas")
    p = Pipeline("pandas")
    schema = pa.schema([("key", pa.int64()), ("double", pa.int64())])
    stream = p.source(GeneratorSource(total_records=10), name="events").map_pandas(
        lambda df: df.assign(double=df["key"] * 2)[["key", "double"]], output_schema=schema
    )
    op = stream._vertex.operators[-1].operator
    op.open(OperatorContext())
    out = op.process_batch(pa.RecordBatch.from_pylist([{"key": 1, "x": 0}, {"key": 4, "x": 0}]))
    assert out[0].schema == schema
    assert out[0].to_pylist() == [{"key": 1, "double": 2}, {"key": 4, "double": 8}]


def test_checkpointing_off_is_a_valid_setting() -> None:
    p = Pipeline("off").checkpointing(interval_ms=0)
    assert p.checkpoint_config.interval_ms == 0
    assert wire.checkpoint_config_to_pb(p.checkpoint_config).interval_ms == 0
    with pytest.raises(InvalidArgumentError, match=r"0 \(checkpointing off\) or >= 10"):
        Pipeline("x").checkpointing(interval_ms=5)
