"""Two-input jobs on local Spark, each with a task failure after a checkpoint, into the
transactional file sink, the committed output checked record by record:

* a keyed co-process enrichment: orders (a GeneratorSource) keyed by user meet the users (a
  SequenceSource mapped to names) in one keyed vertex; an order waits in keyed list state
  until its user arrived;
* a broadcast rules job: events keyed by key, a rules source broadcast to every subtask; the
  events wait in keyed state until all rules arrived, then the broadcast side releases them
  through ``apply_to_keyed_state``; later events are decided at once from the broadcast state.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow.spark_bridge import FixedDelay, JobStatus, Pipeline
from snapflow.spark_bridge.streams import Stream
from snapflow.worker.api.broadcast_functions import (
    KeyedBroadcastContext,
    KeyedBroadcastProcessFunction,
    MapStateDescriptor,
    ReadOnlyKeyedBroadcastContext,
)
from snapflow.worker.api.co_functions import KeyedCoContext, KeyedCoProcessFunction
from snapflow.worker.api.fault_injection import FailAt
from snapflow.worker.api.functions import KeyedContext, RuntimeContext
from snapflow.worker.connectors.file_sink import TransactionalFileSink, read_committed
from snapflow.worker.connectors.split_sources import GeneratorSource, SequenceSource

cloudpickle.register_pickle_by_value(sys.modules[__name__])

RUN_TIMEOUT_S = 120.0
USERS = 40
ORDERS = 8000
ENRICHED = pa.schema(
    [("key", pa.int64()), ("value", pa.int64()), ("ts", pa.int64()), ("name", pa.string())]
)
USER_SCHEMA = pa.schema([("uid", pa.int64()), ("name", pa.string())])


def _orders() -> GeneratorSource:
    return GeneratorSource(
        total_records=ORDERS, rate_per_s=4000, num_keys=USERS, batch_size=200, seed=7
    )


def _all_orders(source: GeneratorSource, splits: int) -> list[dict[str, int]]:
    assert source.total_records is not None
    base, rest = divmod(source.total_records, splits)
    return [
        source.record(s, i) for s in range(splits) for i in range(base + (1 if s < rest else 0))
    ]


def _orders_failing_once(p: Pipeline) -> Stream:
    """The orders as a source of ``p``, failing its subtask 0 once, after a checkpoint."""
    return p.source(_orders(), name="orders").transform(
        FailAt(how="raise", after_records=3000, after_checkpoints=1), name="crash-once"
    )


def _run_into_sink(
    spark: Any, p: Pipeline, out: Stream, tmp_path: Path
) -> Counter[tuple[Any, ...]]:
    """Run ``p`` with ``out`` sunk into a transactional file sink: it finishes after one
    restart; the committed rows."""
    out.sink(TransactionalFileSink(str(tmp_path / "out")))
    p.checkpointing(interval_ms=150, storage=tmp_path / "cp")
    p.restart_strategy(FixedDelay(attempts=2, delay_s=0.2))
    result = p.run(spark, timeout_s=RUN_TIMEOUT_S)
    assert result.state is JobStatus.FINISHED
    assert result.restarts == 1 and result.checkpoints_completed >= 1
    table = read_committed(tmp_path / "out")
    return Counter(tuple(r.values()) for r in table.to_pylist())


class Enrich(KeyedCoProcessFunction):
    """Input 0: orders (key = user id); input 1: users. An order goes out with its user's name,
    at once when the user is known, else when the user arrives."""

    def open(self, ctx: RuntimeContext) -> None:
        self.name = ctx.get_value_state("name")
        self.waiting = ctx.get_list_state("waiting")

    def process_element1(self, row: dict[str, Any], ctx: KeyedCoContext) -> Any:
        name = self.name.value()
        if name is None:
            self.waiting.add(row)
            return None
        return [{**row, "name": name}]

    def process_element2(self, row: dict[str, Any], ctx: KeyedCoContext) -> Any:
        self.name.update(row["name"])
        out = [{**order, "name": row["name"]} for order in self.waiting.get()]
        self.waiting.clear()
        return out


@pytest.mark.spark
def test_keyed_co_process_enrichment_is_exactly_once(spark: Any, tmp_path: Path) -> None:
    p = Pipeline("enrich", parallelism=2, max_parallelism=64)
    orders = _orders_failing_once(p)
    users = p.source(SequenceSource(0, USERS, batch_size=4, rate_per_s=20), name="users").map(
        lambda r: {"uid": r["value"], "name": f"user-{r['value']}"}, output_schema=USER_SCHEMA
    )
    enriched = (
        orders.key_by("key").connect(users.key_by("uid")).process(Enrich(), output_schema=ENRICHED)
    )
    committed = _run_into_sink(spark, p, enriched, tmp_path)
    expected = Counter(
        (o["key"], o["value"], o["ts"], f"user-{o['key']}") for o in _all_orders(_orders(), 2)
    )
    assert committed == expected


RULES = MapStateDescriptor("blocked")
BLOCKED = list(range(0, USERS, 3))
DECIDED = pa.schema([("key", pa.int64()), ("value", pa.int64()), ("ts", pa.int64())])


class Gate(KeyedBroadcastProcessFunction):
    """Drops the events of blocked keys. Until every rule arrived, events wait in keyed list
    state; the broadcast row that completes the rules releases them for every key."""

    def open(self, ctx: RuntimeContext) -> None:
        self.pending = ctx.get_list_state("pending")

    def process_element(self, row: dict[str, Any], ctx: ReadOnlyKeyedBroadcastContext) -> Any:
        blocked = ctx.get_broadcast_state(RULES)
        if len(blocked) < len(BLOCKED):
            self.pending.add(row)
            return None
        return None if blocked.contains(row["key"]) else [row]

    def process_broadcast_element(self, row: dict[str, Any], ctx: KeyedBroadcastContext) -> Any:
        blocked = ctx.get_broadcast_state(RULES)
        blocked.put(row["blocked"], True)
        if len(blocked) < len(BLOCKED):
            return None
        released: list[dict[str, Any]] = []

        def release(key: Any, kctx: KeyedContext) -> None:
            pending = kctx.get_list_state("pending")
            if not blocked.contains(key):
                released.extend(pending.get())
            pending.clear()

        ctx.apply_to_keyed_state("pending", release)
        return released


@pytest.mark.spark
def test_keyed_broadcast_rules_job_is_exactly_once(spark: Any, tmp_path: Path) -> None:
    p = Pipeline("rules", parallelism=2, max_parallelism=64)
    events = _orders_failing_once(p)
    rules = p.source(
        SequenceSource(0, len(BLOCKED), batch_size=1, rate_per_s=10), name="rules", parallelism=1
    ).map(lambda r: {"blocked": r["value"] * 3})
    decided = events.key_by("key").connect(rules.broadcast()).process(Gate(), output_schema=DECIDED)
    committed = _run_into_sink(spark, p, decided, tmp_path)
    expected = Counter(
        (o["key"], o["value"], o["ts"])
        for o in _all_orders(_orders(), 2)
        if o["key"] not in BLOCKED
    )
    assert committed == expected
