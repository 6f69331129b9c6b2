"""What the Kafka source and sink share (``kafka_config``): the client settings, librdkafka's
own check of them, and bounded retries of the first broker calls."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from snapflow.errors import InvalidArgumentError, UnavailableError
from snapflow.worker.connectors.kafka_config import (
    KafkaClientSettings,
    PropertyValue,
    retry_broker_call,
)


def test_callbacks_are_properties_and_bootstrap_servers_is_not() -> None:
    settings = KafkaClientSettings("b:9092", {"error_cb": print, "linger.ms": 5})
    settings.check_producer({"acks": "all"})
    assert settings.config({"acks": "all"}) == {
        "bootstrap.servers": "b:9092",
        "error_cb": print,
        "linger.ms": 5,
        "acks": "all",
    }
    with pytest.raises(InvalidArgumentError, match="as bootstrap_servers"):
        KafkaClientSettings("b:9092", {"bootstrap.servers": "c:9092"})
    with pytest.raises(InvalidArgumentError, match="or a callback"):
        KafkaClientSettings("b:9092", {"linger.ms": [5]})  # type: ignore[dict-item]


def test_a_helper_client_gets_the_connection_properties_only() -> None:
    properties: dict[str, PropertyValue] = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "client.id": "c",
        "linger.ms": 5,
        "compression.type": "zstd",
    }
    settings = KafkaClientSettings("b:9092", properties)
    config = settings.connection_config({"group.id": "g"})
    assert config == {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "client.id": "c",
        "group.id": "g",
    }
    settings.check_consumer(settings.connection_config({}))  # all of them a consumer's too


@pytest.mark.parametrize("kind", ["producer", "consumer"])
def test_librdkafka_checks_the_properties_without_brokers(kind: str) -> None:
    settings = KafkaClientSettings("b:9092", {"no.such.property": 1})
    check = settings.check_producer if kind == "producer" else settings.check_consumer
    with pytest.raises(InvalidArgumentError, match=f"bad Kafka {kind} settings: No such"):
        check({})


def test_a_connector_refuses_the_properties_it_sets_itself() -> None:
    settings = KafkaClientSettings("b:9092", {"acks": "1"})
    with pytest.raises(InvalidArgumentError, match="'acks' cannot be set: the sink uses"):
        settings.refuse({"acks": "the sink uses acks=all"})


def test_retries_are_bounded_and_back_off() -> None:
    pauses: list[float] = []
    calls: list[int] = []

    def down() -> Any:
        calls.append(1)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))

    with pytest.raises(
        UnavailableError, match=r"brokers h:1 did not answer \(probe\) in 5 attempts"
    ):
        retry_broker_call(
            down,
            "probe",
            bootstrap_servers="h:1",
            attempts=5,
            backoff_s=0.2,
            max_backoff_s=0.5,
            sleep=pauses.append,
        )
    assert len(calls) == 5 and pauses == [0.2, 0.4, 0.5, 0.5]
    pauses.clear()
    answers = iter([KafkaException(KafkaError(KafkaError._TRANSPORT, "down")), None])

    def flaky() -> str:
        error = next(answers)
        if error is not None:
            raise error
        return "ok"

    assert (
        retry_broker_call(
            flaky, "probe", bootstrap_servers="h:1", attempts=3, backoff_s=1.0, sleep=pauses.append
        )
        == "ok"
    )
    assert pauses == [1.0]
