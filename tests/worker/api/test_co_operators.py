"""Operators of two connected inputs: CoProcessFunction, KeyedCoProcessFunction (keyed state and
timers shared by both inputs), CoBatchFunction and KeyedCoBatchFunction (bulk state, timers as
one batch); exact outputs, side outputs, snapshot and restore of the shared keyed state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from snapflow.errors import InvalidArgumentError
from snapflow.worker.api.co_functions import (
    CoBatchContext,
    CoBatchFunction,
    CoContext,
    CoProcessFunction,
    KeyedCoBatchContext,
    KeyedCoBatchFunction,
    KeyedCoContext,
    KeyedCoProcessFunction,
)
from snapflow.worker.api.co_operators import (
    CoBatchProcess,
    CoProcess,
    KeyedCoBatchProcess,
    KeyedCoProcess,
)
from snapflow.worker.api.functions import RuntimeContext
from snapflow.worker.runtime.chain import Chain, run_steps
from snapflow.worker.runtime.operator import OperatorContext, OutputTag
from snapflow.worker.state.keyed_backend import KeyedStateBackend

LATE = OutputTag("unmatched")


def rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    return [r for b in batches for r in b.to_pylist()]


def batch(rows_: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows_)


def keyed_ctx(
    backend: KeyedStateBackend | None = None, key_fields: tuple[str | None, ...] = ("id", "uid")
) -> OperatorContext:
    return OperatorContext(
        vertex_id="v2-connect",
        operator_id="v2.0-co",
        max_parallelism=128,
        keyed_state=backend or KeyedStateBackend(128, (0, 127)),
        key_field=key_fields[0],
        input_key_fields=key_fields,
    )


# ---------------------------------------------------------------------------------------------
# CoProcessFunction: not keyed, record at a time
# ---------------------------------------------------------------------------------------------


class Tagger(CoProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.subtask = ctx.subtask_index

    def process_element1(self, row: dict[str, Any], ctx: CoContext) -> Any:
        return [{"side": "a", "x": row["x"], "wm": ctx.current_watermark}]

    def process_element2(self, row: dict[str, Any], ctx: CoContext) -> Any:
        if row["y"] < 0:
            ctx.output(LATE, {"y": row["y"]})
            return None
        return [{"side": "b", "x": row["y"] * 10, "wm": ctx.current_watermark}]


def test_co_process_routes_each_input_to_its_method_in_arrival_order() -> None:
    op = CoProcess(Tagger())
    ctx = OperatorContext()
    chain = Chain([op])
    chain.open(ctx)
    assert rows(chain.process_batch(batch([{"x": 2}, {"x": 1}]))) == [
        {"side": "a", "x": 2, "wm": -(2**63)},
        {"side": "a", "x": 1, "wm": -(2**63)},
    ]
    assert chain.process_watermark(500) == []
    out = chain.process_batch(batch([{"y": 3}, {"y": -1}, {"y": 4}]), input_index=1)
    assert rows(out) == [{"side": "b", "x": 30, "wm": 500}, {"side": "b", "x": 40, "wm": 500}]
    # the side output of the same call, as one batch
    assert [(tag, b.to_pylist()) for tag, b in ctx.side_outputs] == [("unmatched", [{"y": -1}])]
    with pytest.raises(InvalidArgumentError, match="two inputs"):
        op.process_input(2, batch([{"x": 1}]))
    with pytest.raises(InvalidArgumentError, match="CoProcessFunction"):
        CoProcess(lambda r, c: None)  # type: ignore[arg-type]


def test_co_process_in_steps_yields_between_rows() -> None:
    op = CoProcess(Tagger())
    op.open(OperatorContext())
    steps = op.process_input_steps(1, batch([{"y": i} for i in range(5000)]))
    assert len(run_steps(steps)) == 1  # one output batch of every row
    n = 0
    gen = op.process_input_steps(1, batch([{"y": i} for i in range(5000)]))
    try:
        while True:
            next(gen)
            n += 1
    except StopIteration as done:
        assert len(rows(done.value)) == 5000
    assert n == 2  # a step per 2048 rows


# ---------------------------------------------------------------------------------------------
# KeyedCoProcessFunction: enrichment with shared keyed state and timers
# ---------------------------------------------------------------------------------------------


class Enrich(KeyedCoProcessFunction):
    """Input 0: orders (id, amount, ts); input 1: users (uid, name). An order waits for its
    user until 100 ms after its time; then it goes out unmatched (side output)."""

    def open(self, ctx: RuntimeContext) -> None:
        self.name = ctx.get_value_state("name")
        self.waiting = ctx.get_list_state("waiting")

    def process_element1(self, row: dict[str, Any], ctx: KeyedCoContext) -> Any:
        name = self.name.value()
        if name is not None:
            yield {"id": ctx.current_key, "amount": row["amount"], "name": name}
            return
        self.waiting.add(row)
        ctx.register_event_time_timer(row["ts"] + 100)

    def process_element2(self, row: dict[str, Any], ctx: KeyedCoContext) -> Any:
        self.name.update(row["name"])
        for order in self.waiting.get():
            yield {"id": ctx.current_key, "amount": order["amount"], "name": row["name"]}
        self.waiting.clear()

    def on_timer(self, timestamp: int, ctx: KeyedCoContext) -> Any:
        for order in self.waiting.get():
            ctx.output(LATE, {"id": ctx.current_key, "amount": order["amount"], "at": timestamp})
        self.waiting.clear()
        return None


def test_keyed_co_process_shares_state_and_timers_between_inputs(tmp_path: Path) -> None:
    op = KeyedCoProcess(("id", "uid"), Enrich())
    ctx = keyed_ctx()
    op.open(ctx)
    orders = batch(
        [
            {"id": 1, "amount": 10, "ts": 0},
            {"id": 2, "amount": 20, "ts": 5},
            {"id": 1, "amount": 11, "ts": 7},
        ]
    )
    assert op.process_batch(orders) == []
    users = batch([{"uid": 1, "name": "ann"}, {"uid": 3, "name": "cy"}])
    assert rows(op.process_input(1, users)) == [
        {"id": 1, "amount": 10, "name": "ann"},
        {"id": 1, "amount": 11, "name": "ann"},
    ]
    # key 1 now enriches at once
    assert rows(op.process_input(0, batch([{"id": 1, "amount": 12, "ts": 9}]))) == [
        {"id": 1, "amount": 12, "name": "ann"}
    ]
    # key 2's order timed out (its timer at 105); key 1's timers find nothing waiting
    assert op.process_watermark(106) == []
    assert [(t, b.to_pylist()) for t, b in ctx.side_outputs] == [
        ("unmatched", [{"id": 2, "amount": 20, "at": 105}])
    ]
    # snapshot and restore the shared keyed state (value, list, timers) into a new subtask
    assert rows(op.process_input(0, batch([{"id": 3, "amount": 30, "ts": 200}]))) == [
        {"id": 3, "amount": 30, "name": "cy"}
    ]
    assert op.process_input(0, batch([{"id": 4, "amount": 40, "ts": 200}])) == []  # waits
    backend = ctx.keyed_state
    assert backend is not None
    handles = backend.snapshot(1).write(tmp_path)
    restored = KeyedStateBackend(128, (0, 127))
    restored.restore(handles)
    copy = cloudpickle.loads(cloudpickle.dumps(KeyedCoProcess(("id", "uid"), Enrich())))
    ctx2 = keyed_ctx(restored)
    copy.open(ctx2)
    assert rows(copy.process_input(1, batch([{"uid": 4, "name": "dee"}]))) == [
        {"id": 4, "amount": 40, "name": "dee"}
    ]
    copy.process_input(0, batch([{"id": 5, "amount": 50, "ts": 300}]))
    assert copy.end_input() == []  # every remaining timer fires
    assert [(t, b.to_pylist()) for t, b in ctx2.side_outputs] == [
        ("unmatched", [{"id": 5, "amount": 50, "at": 400}])
    ]


def test_keyed_co_process_refuses_wrong_inputs() -> None:
    with pytest.raises(InvalidArgumentError, match="KeyedCoProcessFunction"):
        KeyedCoProcess(("id", "uid"), Tagger())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="key field of each input"):
        KeyedCoProcess(("id",), Enrich())  # type: ignore[arg-type]
    op = KeyedCoProcess(("id", "uid"), Enrich())
    with pytest.raises(InvalidArgumentError, match="keyed by"):
        op.open(keyed_ctx(key_fields=("id", "other")))
    with pytest.raises(InvalidArgumentError, match="keyed state"):
        KeyedCoProcess(("id", "uid"), Enrich()).open(OperatorContext())


# ---------------------------------------------------------------------------------------------
# Vectorised
# ---------------------------------------------------------------------------------------------


class Concat(CoBatchFunction):
    def process_batch1(self, b: pa.RecordBatch, ctx: CoBatchContext) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"v": b.column("a"), "src": ["a"] * b.num_rows})

    def process_batch2(self, b: pa.RecordBatch, ctx: CoBatchContext) -> list[pa.RecordBatch]:
        ctx.output(LATE, b)
        return [pa.RecordBatch.from_pydict({"v": b.column("b"), "src": ["b"] * b.num_rows})]


def test_co_batch_process_calls_the_method_of_each_input() -> None:
    op = CoBatchProcess(Concat())
    ctx = OperatorContext()
    op.open(ctx)
    assert rows(op.process_batch(batch([{"a": 1}]))) == [{"v": 1, "src": "a"}]
    assert rows(run_steps(op.process_input_steps(1, batch([{"b": 2}])))) == [{"v": 2, "src": "b"}]
    assert [(t, b.to_pylist()) for t, b in ctx.side_outputs] == [("unmatched", [{"b": 2}])]
    with pytest.raises(InvalidArgumentError, match="CoBatchFunction"):
        CoBatchProcess(Tagger())  # type: ignore[arg-type]


class Balance(KeyedCoBatchFunction):
    """Input 0: deposits (acct, amt); input 1: withdrawals (who, amt); one balance per key,
    shared; a timer per touched key at ts + 10 emits the balance."""

    def _apply(self, b: pa.RecordBatch, ctx: KeyedCoBatchContext, sign: int) -> pa.RecordBatch:
        state = ctx.get_value_state("balance", 0)
        keys = ctx.keys.to_pylist()
        amounts = b.column("amt").to_pylist()
        totals: dict[Any, int] = {}
        for k, old in zip(keys, state.get_many(ctx.keys, ctx.key_groups), strict=True):
            totals.setdefault(k, old or 0)
        for k, a in zip(keys, amounts, strict=True):
            totals[k] += sign * a
        state.update_many(list(totals), list(totals.values()))
        ctx.register_event_time_timers(keys, [t + 10 for t in b.column("ts").to_pylist()])
        return pa.RecordBatch.from_pydict({"key": list(totals), "balance": list(totals.values())})

    def process_batch1(self, b: pa.RecordBatch, ctx: KeyedCoBatchContext) -> pa.RecordBatch:
        return self._apply(b, ctx, 1)

    def process_batch2(self, b: pa.RecordBatch, ctx: KeyedCoBatchContext) -> pa.RecordBatch:
        return self._apply(b, ctx, -1)

    def on_timers(self, timers: pa.RecordBatch, ctx: KeyedCoBatchContext) -> pa.RecordBatch:
        balances = ctx.get_value_state("balance", 0).get_many(ctx.keys, ctx.key_groups)
        return pa.RecordBatch.from_pydict(
            {"key": timers.column("key"), "at": timers.column("timestamp"), "final": balances}
        )


def test_keyed_co_batch_process_bulk_state_and_timers_of_both_inputs(tmp_path: Path) -> None:
    op = KeyedCoBatchProcess(("acct", "who"), Balance())
    ctx = keyed_ctx(key_fields=("acct", "who"))
    op.open(ctx)
    deposits = batch(
        [
            {"acct": "x", "amt": 5, "ts": 1},
            {"acct": "y", "amt": 7, "ts": 2},
            {"acct": "x", "amt": 1, "ts": 3},
        ]
    )
    assert rows(op.process_batch(deposits)) == [
        {"key": "x", "balance": 6},
        {"key": "y", "balance": 7},
    ]
    assert rows(op.process_input(1, batch([{"who": "x", "amt": 4, "ts": 4}]))) == [
        {"key": "x", "balance": 2}
    ]
    assert rows(op.process_watermark(12)) == [
        {"key": "x", "at": 11, "final": 2},
        {"key": "y", "at": 12, "final": 7},
    ]
    backend = ctx.keyed_state
    assert backend is not None
    restored = KeyedStateBackend(128, (0, 127))
    restored.restore(backend.snapshot(1).write(tmp_path))
    copy = KeyedCoBatchProcess(("acct", "who"), Balance())
    copy.open(keyed_ctx(restored, ("acct", "who")))
    assert rows(copy.end_input()) == [
        {"key": "x", "at": 13, "final": 2},
        {"key": "x", "at": 14, "final": 2},
    ]
    assert copy.end_input() == []
    with pytest.raises(InvalidArgumentError, match="KeyedCoBatchFunction"):
        KeyedCoBatchProcess(("a", "b"), Concat())  # type: ignore[arg-type]
