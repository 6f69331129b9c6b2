"""Kafka to Kafka, exactly once: the running total amount per user.

    snapflow run -p 2 examples/kafka_to_kafka.py --bootstrap-servers 127.0.0.1:9092 \
        --input orders --output totals
    SNAPFLOW_KAFKA_BOOTSTRAP=127.0.0.1:9092 python examples/kafka_to_kafka.py --bounded

The input topic holds JSON records ``{"user": "...", "amount": 12}``; every checkpoint commits,
in one Kafka transaction per subtask, the new totals of the users it saw as records keyed by
user with the value ``{"user": "...", "amount": <total>}``. Read the output with
``isolation.level=read_committed``. ``--bounded`` stops at the input's end as it is when the
job starts (the job then finishes); without it the job runs until cancelled. Both topics must
exist (the sink never creates topics). Needs ``snapflow[kafka]``.
"""

from __future__ import annotations

import argparse
import os

import pyarrow as pa

from snapflow import KafkaSerializer, KafkaSink, KafkaSource, KafkaStop, KafkaValueFormat, Pipeline

ORDERS = pa.schema([("user", pa.string()), ("amount", pa.int64())])


def build(bootstrap_servers: str, input_topic: str, output_topic: str, bounded: bool) -> Pipeline:
    p = Pipeline("kafka-to-kafka")
    source = KafkaSource(
        bootstrap_servers,
        topics=[input_topic],
        group_id="kafka-to-kafka",  # offsets committed on checkpoints, for lag monitoring
        stop=KafkaStop.latest() if bounded else None,
        value_format=KafkaValueFormat.json(ORDERS),
        metadata=(),
    )
    sink = KafkaSink(
        bootstrap_servers,
        output_topic,
        key="user",
        value=KafkaSerializer.json(["user", "amount"]),
        guarantee="exactly_once",
        transactional_id_prefix=f"kafka-to-kafka-{output_topic}",  # unique per job
    )
    p.source(source, name="orders").key_by("user").reduce("amount", "sum").sink(sink, name="totals")
    p.checkpointing(interval_ms=1_000)
    return p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("SNAPFLOW_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        help="host:port[,...] (default: $SNAPFLOW_KAFKA_BOOTSTRAP or 127.0.0.1:9092)",
    )
    parser.add_argument("--input", default="orders", help="input topic (default orders)")
    parser.add_argument("--output", default="totals", help="output topic (default totals)")
    parser.add_argument("--bounded", action="store_true", help="stop at the input's end")
    args = parser.parse_args(argv)
    build(args.bootstrap_servers, args.input, args.output, args.bounded).execute()


if __name__ == "__main__":
    main()
