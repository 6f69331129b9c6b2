"""The session's Kafka broker works for what the Kafka connectors rely on: produce and fetch,
consumer-group offsets, and a transaction with ``send_offsets_to_transaction``."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from kit.kafka_broker import KafkaBroker


def test_produce_fetch_commit_and_a_transaction(kafka: KafkaBroker, kafka_topic_name: str) -> None:
    kafka.create_topic(kafka_topic_name, partitions=2)
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": uuid.uuid4().hex}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(
            kafka_topic_name, key=str(i).encode(), value=str(i).encode(), partition=i % 2
        )
    group = f"g-{uuid.uuid4().hex[:8]}"
    marker = [TopicPartition(kafka_topic_name, 0, 5)]
    meta = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    producer.send_offsets_to_transaction(marker, meta.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    meta.close()

    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        committed = consumer.committed([TopicPartition(kafka_topic_name, 0)], timeout=30)
        assert committed[0].offset == 5  # the offset committed inside the transaction
        consumer.assign([TopicPartition(kafka_topic_name, p, 0) for p in (0, 1)])
        values: list[int] = []
        for _ in range(200):
            if len(values) == 10:
                break
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                values.append(int(msg.value() or b"-1"))
        assert sorted(values) == list(range(10))
    finally:
        consumer.close()
