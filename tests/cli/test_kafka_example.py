"""``snapflow run examples/kafka_to_kafka.py`` against the session's broker, bounded, brokers
given by ``$SNAPFLOW_KAFKA_BOOTSTRAP``: every user's total committed once it is reached, and
the committed totals of a user only rise (no record counted twice)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kit.kafka_broker import KafkaBroker
from kit.kafka_log import committed_records

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 500


@pytest.mark.spark
def test_kafka_to_kafka_example(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    orders, totals = f"{kafka_topic_name}-orders", f"{kafka_topic_name}-totals"
    kafka.create_topic(orders, partitions=2)
    kafka.create_topic(totals, partitions=2)
    # one record a batch: the bounded source stops at Tansu's high watermark (docs/kafka.md)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "batch.num.messages": 1})
    expected: Counter[str] = Counter()
    for i in range(RECORDS):
        user, amount = f"user-{i % 7}", i % 13
        expected[user] += amount
        producer.produce(orders, json.dumps({"user": user, "amount": amount}).encode())
    assert producer.flush(30) == 0
    run = [sys.executable, "-m", "snapflow.cli", "run", "--spark-master", "local[2]", "-p", "2"]
    result = subprocess.run(
        [*run, "examples/kafka_to_kafka.py", "--input", orders, "--output", totals, "--bounded"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "SNAPFLOW_KAFKA_BOOTSTRAP": kafka.bootstrap_servers},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"Job [0-9a-f]{32} \(kafka-to-kafka\) FINISHED", result.stdout)
    seen: dict[str, list[int]] = {}
    for record in committed_records(kafka.bootstrap_servers, totals, 2):
        row = json.loads(record.value or b"")
        assert record.key == row["user"].encode()
        seen.setdefault(row["user"], []).append(row["amount"])
    for user, running in seen.items():
        assert running == sorted(running), f"{user}: {running}"
    assert {user: running[-1] for user, running in seen.items()} == dict(expected)
