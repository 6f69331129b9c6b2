"""Kafka client settings the Kafka connectors share: the brokers, librdkafka properties checked
when a connector is built, the lazy import of ``confluent_kafka`` (the ``snapflow[kafka]``
extra), and bounded retries of the first broker calls.

``confluent_kafka`` is imported only when a connector is built or opened, so ``import snapflow``
and the CLI never load librdkafka.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from snapflow.errors import InvalidArgumentError, UnavailableError

__all__ = ["KafkaClientSettings", "confluent_kafka", "retry_broker_call"]

T = TypeVar("T")

PropertyValue = str | int | float | bool | Callable[..., Any]
"""A librdkafka property's value; callables are its client callbacks (``error_cb``,
``stats_cb``, ``oauth_cb``, ``logger``)."""


def confluent_kafka() -> ModuleType:
    """The ``confluent_kafka`` module, or an error saying which extra to install."""
    try:
        import confluent_kafka as module
    except ImportError as exc:  # pragma: no cover - the extra is installed in development
        raise InvalidArgumentError(
            "the Kafka connectors need confluent-kafka: install snapflow[kafka]"
        ) from exc
    return module


# librdkafka's global properties that say how to reach and authenticate to the brokers: what a
# connector's helper client (another role than its own) takes from the user's properties.
CONNECTION_PREFIXES = (
    "security.",
    "sasl.",
    "ssl.",
    "ssl_",
    "enable.ssl.",
    "socket.",
    "client.",
    "broker.address.",
    "reconnect.",
    "oauthbearer_",
    "resolve_cb",
    "oauth_cb",
)


@dataclass(frozen=True)
class KafkaClientSettings:
    """Where the brokers are and the librdkafka properties of a connector's clients.

    ``properties`` are librdkafka's (``security.protocol``, ``sasl.*``, ``fetch.max.bytes``,
    ...); each connector refuses those it sets itself (``reserved``). They are checked by
    librdkafka itself on construction (a client built without brokers, so nothing connects),
    so a misspelt name or a bad value is refused before the job is submitted."""

    bootstrap_servers: str
    properties: Mapping[str, PropertyValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        servers = self.bootstrap_servers
        if not isinstance(servers, str) or not servers.strip():
            raise InvalidArgumentError(
                f"bootstrap_servers must be 'host:port[,host:port...]', got {servers!r}"
            )
        if not isinstance(self.properties, Mapping):
            raise InvalidArgumentError(
                f"properties must be a mapping of librdkafka property names to values, got "
                f"{type(self.properties).__name__}"
            )
        for name, value in self.properties.items():
            if not isinstance(name, str) or not (
                isinstance(value, str | int | float | bool) or callable(value)
            ):
                raise InvalidArgumentError(
                    f"Kafka property {name!r}: names are strings and values str, int, float, "
                    f"bool or a callback, got {value!r:.80}"
                )
            if name == "bootstrap.servers":
                raise InvalidArgumentError(
                    "give the brokers as bootstrap_servers, not as the property bootstrap.servers"
                )
        object.__setattr__(self, "properties", dict(self.properties))

    def refuse(self, reserved: Mapping[str, str]) -> None:
        """Refuse the properties a connector sets itself; ``reserved`` maps each to why."""
        for name, why in reserved.items():
            if name in self.properties:
                raise InvalidArgumentError(f"Kafka property {name!r} cannot be set: {why}")

    def check_consumer(self, extra: Mapping[str, PropertyValue]) -> None:
        """Let librdkafka check the consumer's properties, without brokers (nothing connects)."""
        ck = confluent_kafka()
        self._check("consumer", ck.Consumer, {"group.id": "snapflow-check", **extra}, close=True)

    def check_producer(self, extra: Mapping[str, PropertyValue]) -> None:
        """Let librdkafka check the producer's properties, without brokers (nothing connects)."""
        self._check("producer", confluent_kafka().Producer, extra, close=False)

    def _check(
        self,
        kind: str,
        client: Callable[[dict[str, Any]], Any],
        extra: Mapping[str, Any],
        *,
        close: bool,
    ) -> None:
        ck = confluent_kafka()
        conf: dict[str, Any] = {**self.properties, **extra}
        conf["log_level"] = 0  # no "no bootstrap.servers" warning for this check
        try:
            built = client(conf)
        except (ck.KafkaException, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"bad Kafka {kind} settings: {_reason(exc)}") from exc
        if close:
            built.close()

    def connection_config(self, extra: Mapping[str, PropertyValue]) -> dict[str, Any]:
        """A helper client's configuration (another role than the connector's own client):
        the brokers and only the user's connection properties (security, SASL, SSL, socket,
        client id), not those of the connector's role."""
        kept = {k: v for k, v in self.properties.items() if k.startswith(CONNECTION_PREFIXES)}
        return {"bootstrap.servers": self.bootstrap_servers, **kept, **extra}

    def config(self, extra: Mapping[str, PropertyValue]) -> dict[str, Any]:
        """A client's configuration: the brokers, the user's properties, the connector's."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.properties, **extra}


def _reason(exc: BaseException) -> str:
    args = exc.args
    if args and hasattr(args[0], "str"):
        return str(args[0].str()).strip()
    return str(exc).strip()


def retry_broker_call(
    call: Callable[[], T],
    what: str,
    *,
    bootstrap_servers: str,
    attempts: int,
    backoff_s: float,
    max_backoff_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` (one broker round trip with its own timeout), tried ``attempts`` times while
    the brokers cannot be reached, pausing ``backoff_s`` between tries (doubled after each
    try up to ``max_backoff_s``, when given); then an :class:`UnavailableError` naming the
    brokers and what was asked."""
    ck = confluent_kafka()
    last: BaseException | None = None
    for attempt in range(attempts):
        if attempt:
            sleep(
                backoff_s
                if max_backoff_s is None
                else min(backoff_s * 2 ** (attempt - 1), max_backoff_s)
            )
        try:
            return call()
        except ck.KafkaException as exc:
            last = exc
    raise UnavailableError(
        f"Kafka brokers {bootstrap_servers} did not answer ({what}) in {attempts} attempts: "
        f"{_reason(last) if last is not None else 'no attempt'}; check bootstrap_servers and "
        f"that the brokers are up"
    ) from last
