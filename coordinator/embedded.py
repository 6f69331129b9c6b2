"""A coordinator embedded in this process: a ``redis-server`` child and the gRPC service.

:class:`EmbeddedCoordinator` starts a ``redis-server`` child process
(:class:`snapflow.redis_server.RedisServer`) and :class:`snapflow.coordinator.server.Coordinator`
on its own asyncio loop in a background thread, bound to 127.0.0.1 on a free port. The Spark
driver uses it when no coordinator address is given, as do ``snapflow demo`` and the tests. Only
processes on this machine can reach it; on a cluster, run ``snapflow coordinator``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from snapflow.coordinator.config import CoordinatorSettings
    from snapflow.coordinator.server import Coordinator
    from snapflow.redis_server import RedisServer


def local_settings(
    redis_url: str, storage_root: str, host: str = "127.0.0.1", **overrides: Any
) -> CoordinatorSettings:
    """Settings of a coordinator for this machine only: ``host`` (127.0.0.1), a free port, no
    metrics endpoint, a short shutdown grace, nothing read from the environment; ``overrides``
    win (e.g. ``port``, ``redis_namespace``)."""
    from snapflow.coordinator.config import load_settings

    return load_settings(
        overrides={
            "host": host,
            "port": 0,
            "metrics_port": -1,
            "redis_url": redis_url,
            "storage_root": storage_root,
            "shutdown_grace_s": 0.5,
            **overrides,
        },
        environ={},
    )


class EmbeddedCoordinator:
    """Redis + coordinator for one run, on an asyncio loop in a background thread.

    ``storage_root``: where checkpoints go when the job's settings name no storage (default: a
    temporary directory removed by :meth:`stop`). ``port``: the gRPC port (0: a free one).
    ``redis_data_dir``: where Redis keeps its files (default: its own temporary directory)."""

    def __init__(
        self,
        storage_root: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        redis_data_dir: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self._redis_data_dir = redis_data_dir
        self._storage_root = storage_root
        self._own_root: str | None = None
        self._redis: RedisServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._coordinator: Coordinator | None = None
        self.address = ""

    def start(self, timeout_s: float = 30.0) -> EmbeddedCoordinator:
        from snapflow.coordinator.server import Coordinator
        from snapflow.redis_server import RedisServer

        try:
            self._redis = RedisServer(data_dir=self._redis_data_dir).start()
            root = self._storage_root
            if root is None:
                root = self._own_root = tempfile.mkdtemp(prefix="snapflow-checkpoints-")
            settings = local_settings(self._redis.url, root, self.host, port=self.port)
            loop = self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=loop.run_forever, name="snapflow-embedded-coordinator", daemon=True
            )
            self._thread.start()

            async def start() -> Coordinator:
                coordinator = Coordinator(settings)
                await coordinator.start()
                return coordinator

            self._coordinator = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout_s)
            self.address = f"{self.host}:{self._coordinator.port}"
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def redis(self) -> RedisServer:
        """The running ``redis-server`` child (after :meth:`start`)."""
        if self._redis is None:
            raise RuntimeError("the embedded coordinator is not running")
        return self._redis

    @property
    def storage_root(self) -> str:
        """The default checkpoint storage (after :meth:`start`)."""
        if self._coordinator is None:
            raise RuntimeError("the embedded coordinator is not running")
        return str(self._coordinator.settings.storage_root)

    def stop(self, timeout_s: float = 30.0) -> None:
        loop, self._loop = self._loop, None
        coordinator, self._coordinator = self._coordinator, None
        try:
            if loop is not None and self._thread is not None:
                if coordinator is not None:
                    with contextlib.suppress(Exception):
                        asyncio.run_coroutine_threadsafe(coordinator.stop(), loop).result(timeout_s)

                async def drain() -> None:
                    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                    for t in tasks:
                        t.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    await loop.shutdown_asyncgens()
                    await loop.shutdown_default_executor()

                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout_s)
                loop.call_soon_threadsafe(loop.stop)
                self._thread.join(timeout_s)
                if not self._thread.is_alive():
                    loop.close()
            self._thread = None
        finally:
            redis, self._redis = self._redis, None
            if redis is not None:
                redis.stop()
            root, self._own_root = self._own_root, None
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> EmbeddedCoordinator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
