"""The pipeline builder refuses, before submitting, a job whose checkpointing an exactly-once
Kafka sink cannot work with (``Operator.check_job``), each refusal saying what to set."""

from __future__ import annotations

from typing import Any

import pytest

from snapflow.errors import InvalidArgumentError
from snapflow.spark_bridge import Pipeline
from snapflow.worker.connectors.kafka_sink import KafkaSink
from snapflow.worker.connectors.split_sources import GeneratorSource


def _pipeline(**sink_options: Any) -> Pipeline:
    p = Pipeline("kafka-out", parallelism=1)
    p.source(GeneratorSource(total_records=10), name="events").sink(
        KafkaSink(
            "127.0.0.1:9092",
            "out",
            guarantee="exactly_once",
            transactional_id_prefix="kafka-out",
            **sink_options,
        )
    )
    return p


def test_a_transaction_timeout_that_a_checkpoint_cannot_fit_is_refused() -> None:
    p = _pipeline(transaction_timeout_ms=60_000)
    p.checkpointing(interval_ms=5_000, timeout_ms=120_000)
    with pytest.raises(
        InvalidArgumentError,
        match=r"transaction_timeout_ms=60000 is shorter.*= 125000; set "
        r"transaction_timeout_ms=125000 or more",
    ):
        p.job_graph()
    p.checkpointing(interval_ms=5_000, timeout_ms=55_000)  # 60 s fits 5 s + 55 s
    assert len(p.job_graph().vertices) == 1
    p.checkpointing(interval_ms=5_000, timeout_ms=50_000, min_pause_ms=20_000)
    with pytest.raises(InvalidArgumentError, match="= 70000"):
        p.validate()


def test_the_defaults_fit() -> None:
    p = _pipeline()  # 15 min; the pipeline's default: 1 s interval, 10 min timeout
    p.validate()


@pytest.mark.parametrize(
    ("checkpointing", "message"),
    [
        ({"interval_ms": 0}, r"needs periodic checkpoints.*interval_ms"),
        ({"mode": "at_least_once"}, r"mode='aligned' or 'unaligned'"),
        ({"max_concurrent": 3}, r"set max_pending_transactions=4"),
    ],
)
def test_checkpointing_the_sink_cannot_bound_is_refused(
    checkpointing: dict[str, Any], message: str
) -> None:
    p = _pipeline()
    p.checkpointing(**checkpointing)
    with pytest.raises(InvalidArgumentError, match=message):
        p.job_graph()


def test_at_least_once_accepts_any_checkpointing() -> None:
    p = Pipeline("kafka-alo", parallelism=1)
    p.source(GeneratorSource(total_records=10), name="events").sink(
        KafkaSink("127.0.0.1:9092", "out")
    )
    p.checkpointing(interval_ms=0, mode="at_least_once")
    p.validate()
