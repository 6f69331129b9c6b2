"""A second `snapflow coordinator` started on a busy port exits with `coordinator.failed`
before it takes the fencing epoch; the first one keeps serving and stays unfenced."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import redis
from kit.coordinator import is_serving, submit
from kit.polling import wait_until
from kit.processes import CoordinatorProcess

from snapflow.redis_server import RedisServer
from snapflow.security import PLAINTEXT
from snapflow.tls import aio_channel
from snapflow.v1 import coordinator_pb2_grpc as cgrpc


def _epoch(url: str, namespace: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.get(f"{namespace}:coordinator:epoch") or 0)
    finally:
        client.close()


async def _submit(address: str) -> str:
    channel = aio_channel(address, PLAINTEXT)
    try:
        return await submit(cgrpc.CoordinatorServiceStub(channel))
    finally:
        await channel.close()


def test_second_coordinator_on_a_busy_port_fails_and_the_first_keeps_serving(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    namespace = f"busy-{uuid.uuid4().hex[:8]}"
    first = CoordinatorProcess.start(
        redis_server.url, namespace, tmp_path / "cp", tmp_path / "first.log"
    )
    second: CoordinatorProcess | None = None
    try:
        wait_until(
            lambda: is_serving(first.address),
            "the first coordinator SERVING",
            timeout_s=30,
            interval_s=0.1,
            procs=[first.proc],
        )
        epoch = _epoch(redis_server.url, namespace)
        assert epoch >= 1
        second = CoordinatorProcess.start(
            redis_server.url, namespace, tmp_path / "cp", tmp_path / "second.log", port=first.port
        )
        code = second.proc.wait(timeout=30)
        assert code != 0
        failed = [e for e in second.events() if e["event"] == "coordinator.failed"]
        assert failed, second.log_path.read_text()[-2000:]
        assert f"127.0.0.1:{first.port}" in failed[0]["error"]
        assert "in use" in failed[0]["error"]
        assert "Traceback" not in second.log_path.read_text()
        # The epoch was not taken and nothing was recovered by the second one.
        assert _epoch(redis_server.url, namespace) == epoch
        assert not [e for e in second.events() if e["event"] == "coordinator.epoch_acquired"]
        # The first still serves and is not fenced: a mutating call succeeds.
        assert is_serving(first.address)
        assert asyncio.run(_submit(first.address))
        assert first.proc.poll() is None
    finally:
        if second is not None:
            second.kill()
        assert first.stop() == 0
